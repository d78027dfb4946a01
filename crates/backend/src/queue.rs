//! A running virtqueue as a worker holds it: the engine's `DeviceQueue`, its notification
//! fds (kick, call, err), its counters and tunables, and notification coalescing: the driver's
//! (NOTF_COAL, VIRTIO 1.2 5.1.6.5.6), or ours while the driver is busy ([`super::hold`]).
//!
//! The queue's life on a worker: [`install_queue`] when the frontend starts it,
//! [`notify`] after each turn that used buffers, [`break_queue`] when the guest (or the host)
//! makes it unusable, [`retire_queue`] when the frontend stops it.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_sys::PeerEventFd;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vring::{
    AvailMark, Chain, DeviceQueue, DeviceStats, Error as RingError, Features, GuestMemory,
    RingPosition, Segment,
};

use super::error::Error;
use super::hold::{self, CallHold};
use super::metrics::{QueueCounters, QueueTunables};

/// A running queue handed to a worker, with its notification fds, counters and tunables. A
/// worker uses it through what it does (pop, complete, notify, break), never through the
/// engine's queue or the ring's indices.
#[derive(Debug)]
pub struct QueueRuntime {
    id: QueueId,
    queue: DeviceQueue,
    kick: PeerEventFd,
    /// Dropped if writing it blocked (see `virtnet_sys::peer_fd`).
    call: Option<PeerEventFd>,
    err: Option<PeerEventFd>,
    counters: Arc<QueueCounters>,
    tunables: Arc<QueueTunables>,
    /// Notification coalescing: a call the driver asked for but we hold back (by the
    /// driver's NOTF_COAL, or by [`CallHold`] when the driver set none), and the used count
    /// at the last call.
    held: Option<Held>,
    used_at_last_call: u64,
    hold: CallHold,
    /// The engine's used-index store count already added to the counters.
    stores_reported: u64,
}

impl QueueRuntime {
    pub fn id(&self) -> QueueId {
        self.id
    }

    /// What the queue observed (counters, broken state), shared with the reports.
    pub fn counters(&self) -> &Arc<QueueCounters> {
        &self.counters
    }

    /// What the queue is told to do (busy polling, coalescing).
    pub fn tunables(&self) -> &Arc<QueueTunables> {
        &self.tunables
    }

    /// The features negotiated for the queue.
    pub fn features(&self) -> Features {
        self.queue.config().features()
    }

    /// The virtio-net header length its features give.
    pub fn hdr_len(&self) -> usize {
        vnet::hdr_len(self.features())
    }

    /// Chains the ring holds.
    pub fn size(&self) -> u16 {
        self.queue.config().size()
    }

    /// The guest memory its buffers are in.
    pub fn memory(&self) -> &Arc<GuestMemory> {
        self.queue.memory()
    }

    /// The engine's own counts (chains used, used-index stores).
    pub fn engine_stats(&self) -> DeviceStats {
        self.queue.stats()
    }

    /// Why the engine broke the queue, if it did (the guest's error).
    pub fn ring_broken(&self) -> Option<&RingError> {
        self.queue.broken()
    }

    /// Pops the next chain the driver made available into `chain`; false when none is. A
    /// malformed chain is an error, which breaks the queue in the engine.
    #[inline]
    pub fn pop_into(&mut self, chain: &mut Chain) -> Result<bool, RingError> {
        self.queue.pop_into(chain)
    }

    /// Asks for the descriptors of the next `n` available chains ([`vring::DeviceQueue::prefetch_avail`]).
    #[inline]
    pub fn prefetch_avail(&self, n: usize) {
        self.queue.prefetch_avail(n.min(u16::MAX as usize) as u16)
    }

    /// Asks for the used ring's lines of the next `n` used elements, for writing
    /// ([`vring::DeviceQueue::prefetch_used`]).
    #[inline]
    pub fn prefetch_used(&self, n: usize) {
        self.queue.prefetch_used(n.min(u16::MAX as usize) as u16)
    }

    /// Hands back the last `count` chains popped and not used, to be popped again.
    #[inline]
    pub fn undo_pop(&mut self, count: u16) {
        self.queue.undo_pop(count)
    }

    /// Completes chain `head` with `len` bytes written (published with the used batch).
    #[inline]
    pub fn add_used(&mut self, head: u16, len: u32) -> Result<(), RingError> {
        self.queue.add_used(head, len)
    }

    /// Completes chain `head`, which the device only read (a transmitted frame): with
    /// IN_ORDER, one used element per run of them ([`vring::DeviceQueue::add_used_read`]).
    #[inline]
    pub fn add_used_read(&mut self, head: u16) -> Result<(), RingError> {
        self.queue.add_used_read(head)
    }

    /// Completes `chain` with `len` bytes written into it, logged for a migration; `last`:
    /// the last buffer of a frame (a frame's buffers are published together).
    #[inline]
    pub fn add_used_written(
        &mut self,
        chain: &Chain,
        len: u32,
        last: bool,
    ) -> Result<(), RingError> {
        if last {
            self.queue.add_used_written(chain, len)
        } else {
            self.queue.add_used_written_part(chain, len)
        }
    }

    /// How many used entries are written before `used.idx` is published (1: every one).
    pub fn set_used_batch(&mut self, batch: u16) {
        self.queue.set_used_batch(batch)
    }

    /// Publishes the used entries written so far.
    #[inline]
    pub fn flush(&mut self) {
        self.queue.flush()
    }

    /// Marks `len` bytes written over `segs` in the dirty log, during a migration.
    pub fn log_write(&self, segs: &[Segment], len: u64) {
        self.queue.log_write(segs, len)
    }

    /// Whether the driver has made chains available (a ring error is returned).
    #[inline]
    pub fn try_avail_pending(&mut self) -> Result<bool, RingError> {
        self.queue.avail_pending()
    }

    /// What the driver had made available when the device last looked (see
    /// [`QueueRuntime::avail_moved`]).
    pub fn avail_mark(&self) -> AvailMark {
        self.queue.avail_mark()
    }

    /// Whether the driver has made more available since `mark`.
    pub fn avail_moved(&mut self, mark: AvailMark) -> Result<bool, RingError> {
        self.queue.avail_moved(mark)
    }

    /// Asks the driver for a kick when it adds chains, and re-checks: true if chains are
    /// available already.
    pub fn enable_notification(&mut self) -> Result<bool, RingError> {
        self.queue.enable_notification()
    }

    /// Tells the driver kicks are not needed (the worker is polling).
    pub fn disable_notification(&mut self) {
        self.queue.disable_notification()
    }

    /// The engine's queue, for tests that drive the ring directly.
    #[cfg(test)]
    pub(crate) fn engine(&mut self) -> &mut DeviceQueue {
        &mut self.queue
    }

    /// The call eventfd, for tests that play a frontend misusing it.
    #[cfg(test)]
    pub(crate) fn call_fd(&self) -> Option<&PeerEventFd> {
        self.call.as_ref()
    }

    /// The kick eventfd, for a worker's epoll set.
    pub fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// A queue the vhost-user layer starts (the control-queue fuzz target builds one through
    /// `fuzzing::queue_runtime`).
    pub(crate) fn new(
        id: QueueId,
        queue: DeviceQueue,
        kick: PeerEventFd,
        call: Option<PeerEventFd>,
        err: Option<PeerEventFd>,
        counters: Arc<QueueCounters>,
        tunables: Arc<QueueTunables>,
    ) -> QueueRuntime {
        let used_at_last_call = queue.stats().used;
        let stores_reported = queue.stats().used_idx_stores;
        QueueRuntime {
            id,
            queue,
            kick,
            call,
            err,
            counters,
            tunables,
            held: None,
            used_at_last_call,
            hold: CallHold::default(),
            stores_reported,
        }
    }

    /// Whether the queue still works: neither the engine nor [`break_queue`] has marked it
    /// broken.
    pub fn usable(&self) -> bool {
        self.queue.broken().is_none() && !self.counters.is_broken()
    }

    fn fire(&mut self) {
        if let Some(call) = &self.call {
            if let Err(e) = call.signal() {
                self.counters.call_errors.add(1);
                if e.kind() == std::io::ErrorKind::Interrupted {
                    // The frontend made its call eventfd blocking and filled it: we stop
                    // using it, and the queue is of no more use to the driver.
                    self.call = None;
                    break_queue(self, &Error::peer_fd("writing the call eventfd")(e));
                }
            }
        }
        self.counters.calls.add(1);
        let used = self.queue.stats().used;
        let held = self.held.take();
        if held.is_some() {
            self.counters.calls_coalesced.add(1);
        }
        let gathered = held.filter(|h| h.by_us).map(|h| used - h.used);
        if gathered.is_some() {
            self.counters.calls_held.add(1);
        }
        self.hold.called(Instant::now(), gathered);
        self.used_at_last_call = used;
    }

    /// When the held call is due, if one is held.
    pub fn call_deadline(&self) -> Option<Instant> {
        let h = self.held?;
        Some(if h.by_us {
            h.since + hold::HOLD
        } else {
            h.since + Duration::from_micros(self.tunables.coalesce().max_usecs as u64)
        })
    }

    /// Sends the held call if its time has come.
    pub fn fire_if_due(&mut self, now: Instant) {
        if self.call_deadline().is_some_and(|d| now >= d) {
            self.fire();
        }
    }

    /// Whether the driver has made chains available; false on a queue that is not usable. A
    /// ring error breaks the queue (and reads as nothing available).
    pub fn avail_pending(&mut self) -> bool {
        if !self.usable() {
            return false;
        }
        match self.queue.avail_pending() {
            Ok(p) => p,
            Err(e) => {
                break_queue(self, &e.into());
                false
            }
        }
    }

    /// Consumes a kick: reads the kick eventfd (never blocking) and counts it. A read that
    /// fails breaks the queue. (An eventfd, the only kind of kick fd accepted, never reports
    /// EPOLLHUP, and EPOLLERR only at a count of 2^64 - 1, which no write can reach.)
    pub fn take_kick(&self) {
        match self.kick.take() {
            Ok(0) => {}
            Ok(_) => self.counters.kicks.add(1),
            Err(e) => break_queue(self, &Error::peer_fd("reading the kick eventfd")(e)),
        }
    }
}

/// Watches a started queue's kick under epoll tag `tag`, for the worker to install. A queue
/// whose kick cannot be watched would never run: it comes back broken, so the frontend hears
/// of it (err eventfd, NEEDS_RESET) instead of waiting.
pub fn install_queue(epoll: &Epoll, q: QueueRuntime, tag: u64) -> QueueRuntime {
    q.counters.clear_broken();
    let watched = epoll.ctl(
        ControlOperation::Add,
        q.kick.as_raw_fd(),
        // Edge-triggered: a kick in semaphore mode (EFD_SEMAPHORE) gives 1 per read and would
        // stay readable for 2^64 reads; each write of the frontend still wakes us once.
        EpollEvent::new(EventSet::IN | EventSet::EDGE_TRIGGERED, tag),
    );
    if let Err(e) = watched {
        break_queue(&q, &Error::host("watching the kick eventfd")(e));
    }
    q
}

/// Stops a queue: publishes its used batch, sends a call held back by coalescing, stops
/// watching its kick, and returns where it stands in its ring (what GET_VRING_BASE reports).
pub fn retire_queue(epoll: &Epoll, mut q: QueueRuntime) -> RingPosition {
    q.queue.flush();
    if q.held.is_some() {
        q.fire();
    }
    // The kick may not be watched (see install_queue): nothing to undo then.
    let _ = epoll.ctl(
        ControlOperation::Delete,
        q.kick.as_raw_fd(),
        EpollEvent::default(),
    );
    q.queue.position()
}

/// Marks a queue broken: logs once, counts, signals the frontend's error eventfd. The
/// engine refuses every later call on a queue the guest broke; a host failure is recorded
/// here, and the worker stops serving the queue from its counters' broken flag. On memory
/// that a fault replaced, whatever went wrong is put down to the fault.
pub fn break_queue(q: &QueueRuntime, e: &Error) {
    let faulted;
    let e = if q.queue.memory().faulted() {
        faulted = memory_faulted();
        &faulted
    } else {
        e
    };
    if q.counters.set_broken(e.to_string()) {
        tracing::error!(queue = %q.id, error = %e, "queue broken; it stays stopped until reset");
        // Written once per break; a write the watchdog had to interrupt is only counted.
        if let Some(err) = &q.err {
            if err.signal().is_err() {
                q.counters.call_errors.add(1);
            }
        }
    }
}

#[cold]
fn break_faulted<'a>(queues: impl IntoIterator<Item = &'a QueueRuntime>) {
    for q in queues {
        if q.queue.memory().faulted() {
            break_queue(q, &memory_faulted());
        }
    }
}

fn memory_faulted() -> Error {
    let e = vring::Error::InvalidMemory {
        reason: "a memory file shrank under its mapping",
    };
    Error::protocol("guest memory")(e)
}

/// The faults in guest memory a worker has seen (`vring::memory::fault_count`): one load per
/// turn tells whether to look at its queues' memory.
#[derive(Debug, Default)]
pub struct FaultWatch(u64);

impl FaultWatch {
    /// Breaks every queue of `queues` whose memory a fault replaced (the frontend shrank a
    /// memory file under its mapping; see vring's `memory::fault`), once a new fault is seen.
    #[inline]
    pub fn check<'a>(&mut self, queues: impl IntoIterator<Item = &'a QueueRuntime>) {
        let seen = vring::memory::fault_count();
        if seen != self.0 {
            self.0 = seen;
            break_faulted(queues);
        }
    }
}

/// A call held back: since when, whether by [`CallHold`] (else by the driver's NOTF_COAL),
/// and the used count when it was first wanted.
#[derive(Clone, Copy, Debug)]
struct Held {
    since: Instant,
    by_us: bool,
    used: u64,
}

/// Publishes the used batch and sends the call if the driver asked for it, unless
/// coalescing holds it back: the driver's NOTF_COAL (the call goes once `max_packets`
/// completions accumulate or `max_usecs` pass, the worker's timer, whichever is first), or,
/// when the driver set none, [`CallHold`] while the driver is busy. A held call is never
/// dropped: with EVENT_IDX the driver will not ask again until it has been woken.
pub fn notify(q: &mut QueueRuntime) {
    let need = q.queue.needs_notification();
    // Every used.idx store, including those add_used made when a batch filled.
    let stores = q.queue.stats().used_idx_stores;
    q.counters.batches_flushed.add(stores - q.stores_reported);
    q.stores_reported = stores;
    let coal = q.tunables.coalesce();
    if need && q.held.is_none() {
        let now = Instant::now();
        let by_us = coal.is_off() && q.tunables.hold_calls() && q.hold.should_hold(now);
        if coal.is_off() && !by_us {
            q.fire();
            return;
        }
        q.held = Some(Held {
            since: now,
            by_us,
            used: q.queue.stats().used,
        });
    }
    let Some(held) = q.held else {
        q.counters.calls_suppressed.add(1);
        return;
    };
    let used = q.queue.stats().used - q.used_at_last_call;
    let max_packets = if held.by_us {
        hold::HOLD_PACKETS
    } else {
        coal.max_packets as u64
    };
    if (!held.by_us && coal.is_off()) || (max_packets > 0 && used >= max_packets) {
        q.fire();
    } else {
        q.fire_if_due(Instant::now());
    }
}

/// A device queue by its role (VIRTIO 1.2 5.1.2): receiveq and transmitq of each pair, then
/// the control queue. Decoded once from a virtqueue index, in the vhost-user layer; the
/// rest of the backend never does index arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueId {
    Rx(u16),
    Tx(u16),
    Ctrl,
}

impl QueueId {
    /// The role of device queue `index` on a device of `pairs` pairs: `2p` is rx of pair p,
    /// `2p + 1` its tx, `2 * pairs` the control queue. None past that.
    pub fn from_index(index: usize, pairs: u16) -> Option<QueueId> {
        let data = 2 * pairs as usize;
        let pair = (index / 2) as u16;
        match index {
            i if i < data && i % 2 == 0 => Some(QueueId::Rx(pair)),
            i if i < data => Some(QueueId::Tx(pair)),
            i if i == data => Some(QueueId::Ctrl),
            _ => None,
        }
    }

    /// The device queue index, the inverse of [`QueueId::from_index`].
    pub fn index(self, pairs: u16) -> usize {
        match self {
            QueueId::Rx(p) => 2 * p as usize,
            QueueId::Tx(p) => 2 * p as usize + 1,
            QueueId::Ctrl => 2 * pairs as usize,
        }
    }

    /// Every queue of a device with `pairs` pairs, in index order.
    pub fn all(pairs: u16) -> impl Iterator<Item = QueueId> {
        (0..=2 * pairs as usize).filter_map(move |i| QueueId::from_index(i, pairs))
    }

    /// The pair of a data queue.
    pub fn pair(self) -> Option<u16> {
        match self {
            QueueId::Rx(p) | QueueId::Tx(p) => Some(p),
            QueueId::Ctrl => None,
        }
    }

    /// "rx", "tx" or "ctrl", as reports name them.
    pub fn kind(self) -> &'static str {
        match self {
            QueueId::Rx(_) => "rx",
            QueueId::Tx(_) => "tx",
            QueueId::Ctrl => "ctrl",
        }
    }
}

impl std::fmt::Display for QueueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueueId::Rx(p) => write!(f, "rx{p}"),
            QueueId::Tx(p) => write!(f, "tx{p}"),
            QueueId::Ctrl => f.write_str("ctrl"),
        }
    }
}

#[cfg(test)]
mod tests {

    use vring::Features;

    use super::*;
    use crate::testing::{post_rx, setup};
    use std::os::fd::AsFd;
    use vnet::ctrl::Coalesce;

    /// The device uses one posted buffer and notifies; returns whether a call went out.
    fn use_one(q: &mut QueueRuntime) -> bool {
        let chain = q.queue.pop().unwrap().expect("a posted buffer");
        q.queue.add_used(chain.head(), 10).unwrap();
        let before = q.counters.calls.get();
        notify(q);
        q.counters.calls.get() > before
    }

    #[test]
    fn a_call_goes_out_when_the_driver_asks_and_coalescing_holds_it_to_max_packets() {
        let mut s = setup(QueueId::Rx(0), Features::VERSION_1);
        post_rx(&mut s.driver, 8, 64);
        let q = &mut s.runtime;
        assert!(
            use_one(q),
            "no coalescing: a call per notify the driver asked for"
        );
        q.tunables.set_coalesce(Coalesce {
            max_packets: 3,
            max_usecs: 1_000_000,
        });
        assert!(!use_one(q) && !use_one(q), "held back below max_packets");
        assert!(q.call_deadline().is_some());
        assert!(use_one(q), "sent at the third completion");
        assert_eq!(q.counters.calls_coalesced.get(), 1);
        assert!(q.call_deadline().is_none());
    }

    #[test]
    fn a_held_call_is_sent_at_its_deadline_and_when_the_queue_is_retired() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        post_rx(&mut s.driver, 4, 64);
        let q = &mut s.runtime;
        q.tunables.set_coalesce(Coalesce {
            max_packets: 0,
            max_usecs: 50,
        });
        assert!(!use_one(q));
        let due = q.call_deadline().expect("held");
        q.fire_if_due(due - Duration::from_micros(1));
        assert!(q.call_deadline().is_some(), "not yet due");
        q.fire_if_due(due);
        assert!(q.call_deadline().is_none());
        assert_eq!(q.counters.calls.get(), 1);
        // Retiring sends what is still held, and reports where the device stopped.
        assert!(!use_one(q));
        let counters = q.counters.clone();
        let next = retire_queue(&Epoll::new().unwrap(), s.runtime);
        assert_eq!(counters.calls.get(), 2);
        assert_eq!(next, vring::RingPosition::split(2));
    }

    #[test]
    fn while_the_driver_is_busy_calls_are_held_only_as_long_as_holding_gathers_more() {
        let mut s = setup(QueueId::Rx(0), Features::VERSION_1);
        post_rx(&mut s.driver, 12, 64);
        let q = &mut s.runtime;
        q.tunables.set_hold_calls(true);
        assert!(
            use_one(q),
            "the first call: nothing says the driver is busy"
        );
        // A call just went out: busy. Held; the next completion joins it.
        assert!(!use_one(q) && !use_one(q), "held");
        let due = q.call_deadline().expect("held");
        assert!(due <= Instant::now() + hold::HOLD);
        q.fire_if_due(due);
        assert_eq!(
            (q.counters.calls.get(), q.counters.calls_held.get()),
            (2, 1)
        );
        // Holds that gather nothing (each call covers its one completion): once they are 3
        // of the first 4, calls go at once.
        for _ in 0..3 {
            assert!(!use_one(q));
            q.fire_if_due(q.call_deadline().expect("held"));
        }
        assert!(use_one(q), "holding stopped paying");
        assert_eq!(q.counters.calls_held.get(), 4);
        // The driver's own coalescing wins, and is not ours.
        q.tunables.set_coalesce(Coalesce {
            max_packets: 2,
            max_usecs: 1_000_000,
        });
        assert!(
            !use_one(q) && use_one(q),
            "held to the driver's max_packets"
        );
        assert_eq!(q.counters.calls_held.get(), 4);
    }

    #[test]
    fn a_call_the_frontend_cannot_take_is_counted() {
        let mut s = setup(QueueId::Rx(0), Features::VERSION_1);
        post_rx(&mut s.driver, 2, 64);
        let q = &mut s.runtime;
        // An eventfd one short of its limit refuses the next write (EAGAIN).
        let call = q.call.as_ref().unwrap().to_eventfd().unwrap();
        call.write(u64::MAX - 1).unwrap();
        assert!(use_one(q), "the call is still made and counted");
        assert_eq!(q.counters.call_errors.get(), 1);
        assert!(
            q.usable(),
            "a full counter only means the frontend has calls to read"
        );
    }

    #[test]
    fn a_call_fd_the_frontend_makes_block_is_interrupted_and_breaks_the_queue() {
        let mut s = setup(QueueId::Rx(0), Features::VERSION_1);
        post_rx(&mut s.driver, 2, 64);
        let q = &mut s.runtime;
        // The frontend clears O_NONBLOCK on the shared file description and fills the counter.
        let call = q.call.as_ref().unwrap().to_eventfd().unwrap();
        virtnet_sys::set_nonblocking(q.call.as_ref().unwrap().as_fd(), false).unwrap();
        call.write(u64::MAX - 1).unwrap();
        let started = Instant::now();
        use_one(q);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(q.call.is_none(), "the call fd is no longer written");
        assert!(!q.usable());
        assert!(q.counters.broken_reason().unwrap().contains("call eventfd"));
        assert_eq!(s.err.read().unwrap(), 1, "the frontend hears of it");
        // Later turns do not block again.
        let started = Instant::now();
        notify(q);
        assert!(started.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn breaking_a_queue_reports_once_and_it_is_no_longer_usable() {
        let s = setup(QueueId::Tx(1), Features::VERSION_1);
        let q = &s.runtime;
        assert!(q.usable());
        let e = Error::host("a test")(std::io::Error::from_raw_os_error(libc::EBADF));
        break_queue(q, &e);
        break_queue(q, &e);
        assert!(!q.usable());
        assert_eq!(s.err.read().unwrap(), 1, "one err eventfd signal");
        let reason = q.counters.broken_reason().unwrap();
        assert!(reason.starts_with("host: a test:"), "{reason}");
    }

    #[test]
    fn queue_ids_follow_the_spec_numbering_and_round_trip() {
        // VIRTIO 1.2 5.1.2: receiveq1 transmitq1 ... receiveqN transmitqN controlq.
        let ids: Vec<_> = QueueId::all(2).collect();
        use QueueId::*;
        assert_eq!(ids, [Rx(0), Tx(0), Rx(1), Tx(1), Ctrl]);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(QueueId::from_index(i, 2), Some(*id));
            assert_eq!(id.index(2), i);
        }
        assert_eq!(QueueId::from_index(5, 2), None);
        assert_eq!(QueueId::from_index(2, 1), Some(Ctrl));
        assert_eq!((Tx(3).pair(), Ctrl.pair()), (Some(3), None));
        assert_eq!(
            [Rx(0).kind(), Tx(0).kind(), Ctrl.kind()],
            ["rx", "tx", "ctrl"]
        );
        assert_eq!(Tx(1).to_string(), "tx1");
    }
}
