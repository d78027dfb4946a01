//! Per-queue counters of the backend (`vnet::stats`: one writer each, the queue's worker;
//! readers take a snapshot), the tunables kept apart from them, and their JSON and Prometheus
//! renderings.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};

use serde::Serialize;

use vnet::ctrl::Coalesce;

use super::poll::{BusyPoll, PollExit};

vnet::counters! {
    /// Counters of one virtqueue, and its broken state.
    pub struct QueueCounters / CountersSnapshot with broken {
        /// Frames moved (tx: guest to host; rx: host to guest) and their bytes, headers excluded.
        packets,
        bytes,
        /// Frames dropped: a TAP write failed for another reason than a full send buffer, or
        /// a frame did not fit the posted buffers.
        dropped,
        /// tx frames the host port could not take yet (the TAP's send buffer was full): each
        /// stayed on the tx ring and went once the TAP took frames again.
        host_pushback,
        /// The host port's fd reported an error that reading it does not clear (a deleted
        /// TAP: EPOLLERR for good), counted on each running queue of the pair: the worker
        /// stops watching it until a queue starts again, tx frames written to it are dropped
        /// (`dropped`), and rx receives none. The queues are not broken: the guest did nothing
        /// wrong, and what it needs is another port, which only the operator can give.
        host_errors,
        /// tx: bursts of frames handed to the host port at once (`--tap-io uring`: one
        /// io_uring_enter each; the null port: each burst it drops), so that packets /
        /// host_batches is the frames per burst. 0 when the port takes frames one at a time.
        host_batches,
        /// rx frames a switch had for the guest when its ring had no room: dropped, never
        /// waited for (a NIC's rx_missed).
        rx_missed,
        /// rx frames read through the host port's own buffer and copied, because the guest
        /// had not posted buffers for the largest frame (the others go straight into guest
        /// memory).
        rx_bounced,
        /// Kick eventfd wake-ups received.
        kicks,
        /// Call eventfd writes, and notifications the driver's event index or flags suppressed.
        calls,
        calls_suppressed,
        /// Call or err eventfd writes that failed (the frontend's fd is full or not an
        /// eventfd): the notification is lost, so they are counted.
        call_errors,
        /// Used-index stores (one per published batch).
        batches_flushed,
        /// Busy polls entered, and why each ended: work found, the timeout, other work for
        /// the worker, the CPU wanted by another task, a pending signal, the worker's shutdown.
        busy_poll_entries,
        busy_poll_hits,
        busy_poll_timeouts,
        busy_poll_exit_other_work,
        busy_poll_exit_yield,
        busy_poll_exit_signal,
        busy_poll_exit_shutdown,
        /// Busy polling auto: idle turns it slept through without polling (hits too rare, or
        /// the CPU contended), and the times it found the CPU wanted by other tasks and
        /// stopped polling for a while.
        busy_poll_skipped,
        busy_poll_contended,
        /// Turns that stopped at the packet or byte weight, leaving the other queues a turn.
        weight_exhausted,
        /// Calls held back by notification coalescing, then sent when the packet count or the
        /// time bound was reached; of those, the ones we held while the driver was busy
        /// (`hold_calls`, when the driver set no coalescing of its own).
        calls_coalesced,
        calls_held,
        /// Frames the receive filter (promisc off, MAC) dropped.
        filtered,
        /// tx frames refused before the TAP for their virtio-net header, by reason: shorter
        /// than the header, flags a driver must not set, an offload not negotiated, a
        /// checksum outside the frame, a bad GSO type, size or header length.
        hdr_short,
        hdr_bad_flags,
        hdr_not_negotiated,
        hdr_bad_csum,
        hdr_bad_gso,
        hdr_too_long,
        /// Control commands handled, and those refused (ack ERR).
        ctrl_commands,
        ctrl_errors,
    }
}

impl QueueCounters {
    /// Counts a tx header refused, by reason.
    pub fn hdr_refused(&self, why: &vnet::TxHdrError) {
        use vnet::TxHdrError::*;
        let c = match why {
            Short => &self.hdr_short,
            Flags(_) => &self.hdr_bad_flags,
            NotNegotiated => &self.hdr_not_negotiated,
            Csum { .. } => &self.hdr_bad_csum,
            Gso { .. } => &self.hdr_bad_gso,
            TooLong { .. } => &self.hdr_too_long,
        };
        c.add(1);
    }

    /// Counts why a busy poll ended.
    pub fn poll_exit(&self, why: PollExit) {
        let f = match why {
            PollExit::Hit => &self.busy_poll_hits,
            PollExit::Timeout => &self.busy_poll_timeouts,
            PollExit::OtherWork => &self.busy_poll_exit_other_work,
            PollExit::Yield => &self.busy_poll_exit_yield,
            PollExit::Signal => &self.busy_poll_exit_signal,
            PollExit::Shutdown => &self.busy_poll_exit_shutdown,
        };
        f.add(1);
    }
}

/// What one queue is told to do, changeable at run time: busy polling (`virtnet ctl
/// set-busy-poll`) and notification coalescing (NOTF_COAL / VQ_NOTF_COAL, set by the
/// control queue). And the poll budget auto chose last, to report it.
#[derive(Debug, Default)]
pub struct QueueTunables {
    /// [`BusyPoll::to_raw`].
    busy_poll: AtomicU32,
    auto_budget_us: AtomicU32,
    /// Hold calls while the driver is busy ([`super::hold`]); the device's `hold_calls`.
    hold_calls: AtomicBool,
    coalesce_max_packets: AtomicU32,
    coalesce_max_usecs: AtomicU32,
}

impl QueueTunables {
    pub fn busy_poll(&self) -> BusyPoll {
        BusyPoll::from_raw(self.busy_poll.load(Relaxed))
    }

    pub fn set_busy_poll(&self, b: BusyPoll) {
        self.busy_poll.store(b.to_raw(), Relaxed);
    }

    pub fn hold_calls(&self) -> bool {
        self.hold_calls.load(Relaxed)
    }

    pub fn set_hold_calls(&self, on: bool) {
        self.hold_calls.store(on, Relaxed);
    }

    /// What the worker's auto policy chose for its latest poll (reported, not obeyed).
    pub fn set_auto_budget(&self, us: u32) {
        if self.auto_budget_us.load(Relaxed) != us {
            self.auto_budget_us.store(us, Relaxed);
        }
    }

    /// How long a poll lasts now, in microseconds: the fixed timeout, or auto's budget.
    pub fn busy_poll_us(&self) -> u32 {
        match self.busy_poll() {
            BusyPoll::Off => 0,
            BusyPoll::Fixed(us) => us,
            BusyPoll::Auto => self.auto_budget_us.load(Relaxed),
        }
    }

    pub fn coalesce(&self) -> Coalesce {
        Coalesce {
            max_packets: self.coalesce_max_packets.load(Relaxed),
            max_usecs: self.coalesce_max_usecs.load(Relaxed),
        }
    }

    pub fn set_coalesce(&self, c: Coalesce) {
        self.coalesce_max_packets.store(c.max_packets, Relaxed);
        self.coalesce_max_usecs.store(c.max_usecs, Relaxed);
    }
}

/// A snapshot of one queue, as `virtnet ctl stats` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct QueueReport {
    pub index: u16,
    /// "rx", "tx" or "ctrl".
    pub kind: &'static str,
    /// The setting: `"auto"` or a timeout in microseconds (0 off).
    pub busy_poll: BusyPoll,
    /// How long a poll lasts now: the fixed timeout, or the budget auto chose last.
    pub busy_poll_us: u32,
    pub coalesce_max_packets: u32,
    pub coalesce_max_usecs: u32,
    /// The counters, and `broken`: why the queue broke, if it did.
    #[serde(flatten)]
    pub counters: CountersSnapshot,
}

impl QueueReport {
    pub fn new(index: u16, kind: &'static str, c: &QueueCounters, t: &QueueTunables) -> Self {
        let coal = t.coalesce();
        QueueReport {
            index,
            kind,
            busy_poll: t.busy_poll(),
            busy_poll_us: t.busy_poll_us(),
            coalesce_max_packets: coal.max_packets,
            coalesce_max_usecs: coal.max_usecs,
            counters: c.snapshot(),
        }
    }
}

/// Renders queue reports in the Prometheus text exposition format: per family a HELP line
/// (a counter's doc comment), a TYPE line, and one sample per queue.
pub fn prometheus(queues: &[QueueReport]) -> String {
    let mut out = String::new();
    let Some(first) = queues.first() else {
        return out;
    };
    let fields: Vec<_> = queues.iter().map(|q| q.counters.fields()).collect();
    let help = CountersSnapshot::descriptions();
    for (i, (name, _)) in first.counters.fields().into_iter().enumerate() {
        let text = help.get(i).map_or("", |&(_, doc)| doc);
        let samples = queues.iter().zip(&fields).map(|(q, f)| (q, f[i].1));
        family(
            &mut out,
            &format!("virtnet_queue_{name}_total"),
            "counter",
            text,
            samples,
        );
    }
    type Gauge = (&'static str, &'static str, fn(&QueueReport) -> u64);
    let gauges: [Gauge; 3] = [
        (
            "broken",
            "1 if the queue is broken (virtnet ctl stats says why).",
            |q| q.counters.broken.is_some().into(),
        ),
        (
            "busy_poll_us",
            "How long a busy poll lasts now, in microseconds: the fixed timeout, or the \
             budget auto chose last.",
            |q| q.busy_poll_us.into(),
        ),
        ("busy_poll_auto", "1 if busy polling is auto.", |q| {
            (q.busy_poll == BusyPoll::Auto).into()
        }),
    ];
    for (name, text, value) in gauges {
        let samples = queues.iter().map(|q| (q, value(q)));
        family(
            &mut out,
            &format!("virtnet_queue_{name}"),
            "gauge",
            text,
            samples,
        );
    }
    out
}

/// One metric family: HELP, TYPE, and a sample per queue.
fn family<'a>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: impl Iterator<Item = (&'a QueueReport, u64)>,
) {
    // HELP text escapes a backslash and a line feed (the exposition format's rule).
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (q, v) in samples {
        let _ = writeln!(
            out,
            "{name}{{queue=\"{}\",kind=\"{}\"}} {v}",
            q.index, q.kind
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_is_reported_once_with_its_reason() {
        let (m, t) = (QueueCounters::default(), QueueTunables::default());
        assert!(m.set_broken("head 9 out of range".into()));
        assert!(!m.set_broken("later".into()));
        let r = QueueReport::new(1, "tx", &m, &t);
        assert_eq!(r.counters.broken.as_deref(), Some("head 9 out of range"));
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["broken"], "head 9 out of range");
        m.clear_broken();
        assert!(QueueReport::new(1, "tx", &m, &t).counters.broken.is_none());
    }

    #[test]
    fn prometheus_lists_every_counter_per_queue() {
        let (m, t) = (QueueCounters::default(), QueueTunables::default());
        m.packets.add(5);
        let r = |i, kind| QueueReport::new(i, kind, &m, &t);
        let text = prometheus(&[r(0, "rx"), r(1, "tx")]);
        assert!(text.contains("virtnet_queue_packets_total{queue=\"0\",kind=\"rx\"} 5"));
        assert!(text.contains("virtnet_queue_kicks_total{queue=\"1\",kind=\"tx\"} 0"));
        assert!(text.contains("virtnet_queue_broken{queue=\"1\",kind=\"tx\"} 0"));
        assert!(text.contains("virtnet_queue_busy_poll_auto{queue=\"1\",kind=\"tx\"} 0"));
        t.set_busy_poll(BusyPoll::Auto);
        t.set_auto_budget(14);
        let text = prometheus(&[QueueReport::new(0, "rx", &m, &t)]);
        assert!(text.contains("virtnet_queue_busy_poll_auto{queue=\"0\",kind=\"rx\"} 1"));
        assert!(text.contains("virtnet_queue_busy_poll_us{queue=\"0\",kind=\"rx\"} 14"));
    }

    #[test]
    fn prometheus_gives_every_family_one_help_then_one_type_before_its_samples() {
        let (m, t) = (QueueCounters::default(), QueueTunables::default());
        let r = |i, kind| QueueReport::new(i, kind, &m, &t);
        let text = prometheus(&[r(0, "rx"), r(1, "tx"), r(2, "ctrl")]);
        // Per family: (HELP text, TYPE seen, samples), in the order met.
        let mut families: Vec<(String, String, bool, usize)> = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                assert!(
                    families.iter().all(|f| f.0 != name),
                    "a second HELP for {name}"
                );
                families.push((name.into(), help.into(), false, 0));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let last = families.last_mut().expect("TYPE before any HELP");
                assert_eq!(last.0, name, "TYPE of {name} without its HELP just before");
                assert!(
                    !last.2 && last.3 == 0,
                    "TYPE of {name} twice, or after samples"
                );
                assert!(["counter", "gauge"].contains(&kind), "{line}");
                last.2 = true;
            } else {
                let name = line.split('{').next().unwrap();
                let last = families.last_mut().expect("a sample before any HELP");
                assert!(
                    last.0 == name && last.2,
                    "{name}: sample outside its family"
                );
                last.3 += 1;
            }
        }
        let counters = CountersSnapshot::default().fields().len();
        assert_eq!(
            families.len(),
            counters + 3,
            "every counter and the 3 gauges"
        );
        for (name, help, _, samples) in &families {
            assert!(help.len() > 10, "{name} has HELP {help:?}");
            assert_eq!(*samples, 3, "{name}: one sample per queue");
        }
        let bytes = families.iter().find(|f| f.0 == "virtnet_queue_bytes_total");
        assert!(bytes.unwrap().1.starts_with("Frames moved"), "{bytes:?}");
    }
}
