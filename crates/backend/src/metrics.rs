//! Per-queue, lock-free counters of the backend, and their JSON and Prometheus renderings.
//!
//! Workers bump them with Relaxed atomics (each counter has one writer); readers (the ctl
//! socket, /metrics, tests) take a snapshot.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde::Serialize;

use vnet::ctrl::Coalesce;

/// Why a busy poll ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollExit {
    /// Work showed up on a polled ring or the TAP.
    Hit,
    /// The timeout expired.
    Timeout,
    /// Another request for this worker is pending (a control message, a queue change).
    OtherWork,
    /// The scheduler took the CPU from us for another task: someone else wants it.
    Yield,
    Shutdown,
}

macro_rules! counters {
    ($(#[$m:meta])* $name:ident / $snap:ident { $($(#[$fm:meta])* $f:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Default)]
        pub struct $name { $($(#[$fm])* pub $f: AtomicU64,)* }
        /// A point-in-time copy of the counters.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct $snap { $(pub $f: u64,)* }
        impl $name {
            pub fn snapshot(&self) -> $snap {
                $snap { $($f: self.$f.load(Relaxed),)* }
            }
        }
        impl $snap {
            /// (name, value) pairs, for Prometheus.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f),)*]
            }
        }
    };
}

counters!(
    /// Counters of one virtqueue.
    QueueCounters / CountersSnapshot {
        /// Frames moved (tx: guest to host; rx: host to guest) and their bytes, headers excluded.
        packets,
        bytes,
        /// Frames dropped: a TAP write failed, or a frame did not fit the posted buffers.
        dropped,
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
        busy_poll_entries,
        busy_poll_hits,
        busy_poll_timeouts,
        busy_poll_exit_other_work,
        busy_poll_exit_yield,
        busy_poll_exit_shutdown,
        /// Turns that stopped at the packet or byte weight, leaving the other queues a turn.
        weight_exhausted,
        /// Calls held back by notification coalescing, then sent when the packet count or the
        /// time bound was reached.
        calls_coalesced,
        /// Frames the receive filter (promisc off, MAC) dropped.
        filtered,
        /// Control commands handled, and those refused (ack ERR).
        ctrl_commands,
        ctrl_errors,
    }
);

/// One queue's metrics: counters, the broken state, and its tunables.
#[derive(Debug, Default)]
pub struct QueueMetrics {
    pub counters: QueueCounters,
    broken: AtomicBool,
    broken_reason: Mutex<Option<String>>,
    /// Busy-poll timeout in microseconds (0 = off), changeable at run time.
    pub busy_poll_us: AtomicU32,
    /// Notification coalescing (NOTF_COAL / VQ_NOTF_COAL), set by the control queue.
    pub coalesce_max_packets: AtomicU32,
    pub coalesce_max_usecs: AtomicU32,
}

impl QueueMetrics {
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

    /// Adds to a counter of this queue. Each counter has one writer (the queue's worker), so
    /// a plain load and store suffices: a locked add would stall on the data path's pending
    /// stores to shared memory.
    pub fn add(&self, c: &AtomicU64, n: u64) {
        c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
    }

    pub fn poll_exit(&self, why: PollExit) {
        let c = &self.counters;
        let f = match why {
            PollExit::Hit => &c.busy_poll_hits,
            PollExit::Timeout => &c.busy_poll_timeouts,
            PollExit::OtherWork => &c.busy_poll_exit_other_work,
            PollExit::Yield => &c.busy_poll_exit_yield,
            PollExit::Shutdown => &c.busy_poll_exit_shutdown,
        };
        self.add(f, 1);
    }

    /// Records that the queue broke. Returns true the first time, so the caller logs once.
    pub fn set_broken(&self, reason: String) -> bool {
        let first = !self.broken.swap(true, Relaxed);
        if first {
            if let Ok(mut r) = self.broken_reason.lock() {
                *r = Some(reason);
            }
        }
        first
    }

    /// Clears the broken state (the frontend reset the queue).
    pub fn clear_broken(&self) {
        self.broken.store(false, Relaxed);
        if let Ok(mut r) = self.broken_reason.lock() {
            *r = None;
        }
    }

    pub fn is_broken(&self) -> bool {
        self.broken.load(Relaxed)
    }

    pub fn broken_reason(&self) -> Option<String> {
        self.broken_reason.lock().ok().and_then(|r| r.clone())
    }
}

/// A snapshot of one queue, as `virtnet ctl stats` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct QueueReport {
    pub index: u16,
    /// "rx", "tx" or "ctrl".
    pub kind: &'static str,
    pub busy_poll_us: u32,
    pub coalesce_max_packets: u32,
    pub coalesce_max_usecs: u32,
    pub broken: Option<String>,
    #[serde(flatten)]
    pub counters: CountersSnapshot,
}

impl QueueReport {
    pub fn new(index: u16, kind: &'static str, m: &QueueMetrics) -> QueueReport {
        QueueReport {
            index,
            kind,
            busy_poll_us: m.busy_poll_us.load(Relaxed),
            coalesce_max_packets: m.coalesce_max_packets.load(Relaxed),
            coalesce_max_usecs: m.coalesce_max_usecs.load(Relaxed),
            broken: m.is_broken().then(|| m.broken_reason().unwrap_or_default()),
            counters: m.counters.snapshot(),
        }
    }
}

/// Renders queue reports in the Prometheus text exposition format.
pub fn prometheus(queues: &[QueueReport]) -> String {
    let mut out = String::new();
    let Some(first) = queues.first() else {
        return out;
    };
    for (name, _) in first.counters.fields() {
        let _ = writeln!(out, "# TYPE virtnet_queue_{name}_total counter");
        for q in queues {
            let v = q
                .counters
                .fields()
                .into_iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, v)| v);
            let _ = writeln!(
                out,
                "virtnet_queue_{name}_total{{queue=\"{}\",kind=\"{}\"}} {v}",
                q.index, q.kind
            );
        }
    }
    let _ = writeln!(out, "# TYPE virtnet_queue_broken gauge");
    for q in queues {
        let _ = writeln!(
            out,
            "virtnet_queue_broken{{queue=\"{}\",kind=\"{}\"}} {}",
            q.index,
            q.kind,
            q.broken.is_some() as u8
        );
    }
    let _ = writeln!(out, "# TYPE virtnet_queue_busy_poll_us gauge");
    for q in queues {
        let _ = writeln!(
            out,
            "virtnet_queue_busy_poll_us{{queue=\"{}\",kind=\"{}\"}} {}",
            q.index, q.kind, q.busy_poll_us
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_is_reported_once_with_its_reason() {
        let m = QueueMetrics::default();
        assert!(m.set_broken("head 9 out of range".into()));
        assert!(!m.set_broken("later".into()));
        let r = QueueReport::new(1, "tx", &m);
        assert_eq!(r.broken.as_deref(), Some("head 9 out of range"));
        m.clear_broken();
        assert!(QueueReport::new(1, "tx", &m).broken.is_none());
    }

    #[test]
    fn prometheus_lists_every_counter_per_queue() {
        let m = QueueMetrics::default();
        m.add(&m.counters.packets, 5);
        let text = prometheus(&[QueueReport::new(0, "rx", &m), QueueReport::new(1, "tx", &m)]);
        assert!(text.contains("virtnet_queue_packets_total{queue=\"0\",kind=\"rx\"} 5"));
        assert!(text.contains("virtnet_queue_kicks_total{queue=\"1\",kind=\"tx\"} 0"));
        assert!(text.contains("virtnet_queue_broken{queue=\"1\",kind=\"tx\"} 0"));
    }
}
