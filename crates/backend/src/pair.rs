//! One queue pair as its worker serves it: the guest's tx and rx paths and the host port
//! between them, and what the worker asks of a pair: a turn, whether it has work now, its
//! notifications and its port's fd armed for sleeping.

use std::sync::Arc;
use std::time::Instant;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vring::RingPosition;

use crate::host::Port;
use crate::queue::{break_queue, install_queue, retire_queue, QueueId, QueueRuntime};
use crate::rx::RxPath;
use crate::shared::Shared;
use crate::tx::TxPath;

/// What a pair's epoll registrations are about, in the low bits of their tag (the pair's slot
/// on its worker in the others).
pub(crate) const EV_RX_KICK: u64 = 1;
pub(crate) const EV_TX_KICK: u64 = 2;
pub(crate) const EV_HOST: u64 = 3;
const KIND_BITS: u32 = 3;

/// The epoll tag of event `kind` of the pair in `slot`.
pub(crate) fn tag(slot: u32, kind: u64) -> u64 {
    ((slot as u64) << KIND_BITS) | kind
}

/// The slot and kind an epoll tag names.
pub(crate) fn untag(tag: u64) -> (u32, u64) {
    ((tag >> KIND_BITS) as u32, tag & ((1 << KIND_BITS) - 1))
}

/// A queue pair of a device: its paths, its port, and the state of the port's fd in epoll.
pub struct Pair {
    shared: Arc<Shared>,
    /// The pair's number on its device.
    index: u16,
    port: Box<dyn Port>,
    /// The port's `poll_every` and `forwards`.
    poll_every: u32,
    forwards: bool,
    pub(crate) tx: TxPath,
    pub(crate) rx: RxPath,
    /// What epoll watches the host port's fd for: readable while rx has buffers to receive
    /// into, writable while tx waits for the port to take frames again.
    host_armed: EventSet,
    /// The host port's fd reports EPOLLERR or EPOLLHUP for good (a deleted TAP, a pipe with no
    /// reader; level-triggered epoll would wake the worker at once, forever): it is no longer
    /// watched. A socket's pending error, which reading SO_ERROR clears, is not that.
    host_gone: bool,
}

impl std::fmt::Debug for Pair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pair")
            .field("index", &self.index)
            .field("tx", &self.tx)
            .field("rx", &self.rx)
            .finish_non_exhaustive()
    }
}

impl Pair {
    /// Pair `index` of the device of `shared`, on host port `port`.
    pub fn new(index: u16, port: Box<dyn Port>, shared: Arc<Shared>) -> Pair {
        Pair {
            shared,
            index,
            poll_every: port.poll_every().max(1),
            forwards: port.forwards(),
            port,
            tx: TxPath::default(),
            rx: RxPath::default(),
            host_armed: EventSet::empty(),
            host_gone: false,
        }
    }

    pub fn index(&self) -> u16 {
        self.index
    }

    /// Whether this pair carries traffic (MQ VQ_PAIRS_SET may have disabled it).
    fn active(&self) -> bool {
        self.shared.pair_active(self.index)
    }

    /// One turn: tx up to the weight, rx up to the weight (or the port's own forwarding, up
    /// to the weight). Returns the frames moved.
    pub(crate) fn turn(&mut self) -> usize {
        let tx = self.tx.turn(&mut *self.port);
        let active = self.active();
        let rx = self.rx.turn(&mut *self.port, &self.shared, active);
        let forwarded = if self.forwards {
            self.port.forward(crate::turn::WEIGHT_PACKETS)
        } else {
            0
        };
        tx.frames + rx.frames + forwarded
    }

    /// The pair's running queues.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &QueueRuntime> {
        self.tx.queue().into_iter().chain(self.rx.queue())
    }

    pub(crate) fn queues_mut(&mut self) -> impl Iterator<Item = &mut QueueRuntime> {
        [self.tx.queue_mut(), self.rx.queue_mut()]
            .into_iter()
            .flatten()
    }

    /// Sends the held calls that are due.
    pub(crate) fn fire_due_calls(&mut self, now: Instant) {
        self.queues_mut().for_each(|q| q.fire_if_due(now));
        self.port.fire_due_calls(now);
    }

    /// When the earliest held call is due.
    pub(crate) fn next_call_deadline(&self) -> Option<Instant> {
        let port = self.port.next_call_deadline();
        self.queues()
            .filter_map(|q| q.call_deadline())
            .chain(port)
            .min()
    }

    /// Takes over a queue the frontend started, watching its kick under the pair's tags in
    /// `slot`; a queue it replaces is retired.
    pub(crate) fn start(&mut self, epoll: &Epoll, slot: u32, q: QueueRuntime) {
        // A port fd given up on is tried again with each queue start: a TAP queue detached
        // meanwhile (its pair disabled) reported an error until attached.
        self.host_gone = false;
        let old = if matches!(q.id(), QueueId::Rx(_)) {
            let q = install_queue(epoll, q, tag(slot, EV_RX_KICK));
            if self.port.adopts_rx() {
                self.port.adopt_rx(q)
            } else {
                self.rx.start(q)
            }
        } else {
            self.tx
                .start(install_queue(epoll, q, tag(slot, EV_TX_KICK)))
        };
        if let Some(old) = old {
            retire_queue(epoll, old);
        }
    }

    /// Stops queue `queue` and returns where it stood (None if it was not running).
    pub(crate) fn stop(&mut self, epoll: &Epoll, queue: QueueId) -> Option<RingPosition> {
        let q = if matches!(queue, QueueId::Rx(_)) {
            self.port.release_rx().or_else(|| self.rx.stop())
        } else {
            self.tx.stop()
        };
        self.port.queue_stopped();
        q.map(|q| retire_queue(epoll, q))
    }

    /// Stops both queues and stops watching the port's fd: the pair leaves its worker.
    pub(crate) fn retire(&mut self, epoll: &Epoll) {
        self.stop(epoll, QueueId::Tx(self.index));
        self.stop(epoll, QueueId::Rx(self.index));
        if let Some(fd) = self.port.fd().filter(|_| !self.host_armed.is_empty()) {
            let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        self.host_armed = EventSet::empty();
    }

    /// Consumes a kick of the queue `kind` names.
    pub(crate) fn take_kick(&self, kind: u64) {
        let q = match kind {
            EV_RX_KICK => self.rx.queue(),
            _ => self.tx.queue(),
        };
        if let Some(q) = q {
            q.take_kick();
        }
    }

    /// The port's fd reported `events` in epoll: one in error for good is no longer watched.
    pub(crate) fn host_event(&mut self, epoll: &Epoll, events: EventSet) {
        if events.intersects(EventSet::ERROR | EventSet::HANG_UP)
            && self.port.fd().is_some_and(virtnet_sys::error_persists)
        {
            self.unwatch_host(epoll);
        }
    }

    /// Whether busy polling finds work for the pair at spin `spins`: tx frames the port can
    /// take, a port that takes frames again, or (`poll_rx`) host frames for rx buffers the
    /// guest posted. The port is asked only every few spins when asking costs a system call.
    pub(crate) fn poll_hit(&mut self, spins: u32, poll_rx: bool) -> bool {
        if self.tx.pending() {
            return true;
        }
        let every = spins.is_multiple_of(self.poll_every);
        if self.forwards && every && self.port.readable() {
            return true;
        }
        if self.tx.waits_port() && every && self.port.writable() {
            return true;
        }
        // Poll the host side for rx while waiting on tx, when the guest has posted
        // buffers to receive into (and has posted more since rx last ran out of room).
        poll_rx
            && self.active()
            && !self.rx.still_blocked()
            && (self.rx.holds_frame() || (every && self.port.readable()))
            && self.rx.has_buffers()
    }

    /// Enables notifications on both queues (not on tx while it waits for the host: its kicks
    /// would tell nothing new); returns true if a re-check found work to do now. Otherwise
    /// watches the port's fd as the pair needs, for sleeping.
    pub(crate) fn arm(&mut self, epoll: &Epoll, slot: u32) -> bool {
        let mut pending = false;
        let tx_waits = self.tx.waits_port();
        let queues = [
            self.tx.queue_mut().filter(|_| !tx_waits),
            self.rx.queue_mut(),
        ];
        for q in queues.into_iter().flatten().filter(|q| q.usable()) {
            match q.enable_notification() {
                Ok(p) => pending |= p,
                Err(e) => break_queue(q, &e.into()),
            }
        }
        let runnable = pending && self.has_runnable_work();
        if !runnable {
            self.arm_host(epoll, slot);
        }
        runnable
    }

    pub(crate) fn disarm(&mut self) {
        self.queues_mut().for_each(|q| q.disable_notification());
    }

    /// Watches the host port's fd in epoll for reading only while rx has buffers: a readable
    /// TAP with nowhere to put its frames must not wake us (level-triggered epoll would spin);
    /// the rx kick will. And for writing only while tx waits for the host.
    fn arm_host(&mut self, epoll: &Epoll, slot: u32) {
        let Some(fd) = self.port.fd().filter(|_| !self.host_gone) else {
            return;
        };
        let mut want = EventSet::empty();
        // With a frame already waiting for buffers, the fd has nothing to tell us.
        // Nor while the pair is not in use: its TAP queue is detached, and reports an error.
        if self.forwards || (!self.rx.holds_frame() && self.rx_can_take()) {
            want |= EventSet::IN;
        }
        if self.tx.waits_port() {
            want |= EventSet::OUT;
        }
        if want == self.host_armed {
            return;
        }
        let op = match (self.host_armed.is_empty(), want.is_empty()) {
            (true, _) => ControlOperation::Add,
            (false, true) => ControlOperation::Delete,
            (false, false) => ControlOperation::Modify,
        };
        match epoll.ctl(op, fd, EpollEvent::new(want, tag(slot, EV_HOST))) {
            Ok(()) => self.host_armed = want,
            // Not watched: rx then runs on the guest's kicks and busy polling only.
            Err(e) => tracing::warn!(error = %e, "cannot watch the host port"),
        }
    }

    /// Stops watching the host port's fd, which reported an error: rx then runs on kicks and
    /// busy polling, and a tx frame waiting for the port is tried again (and dropped).
    #[cold]
    fn unwatch_host(&mut self, epoll: &Epoll) {
        tracing::warn!(
            pair = self.index,
            "the host port's fd reports an error; no longer watched"
        );
        self.queues().for_each(|q| q.counters().host_errors.add(1));
        if let Some(fd) = self.port.fd() {
            let _ = epoll.ctl(ControlOperation::Delete, fd, EpollEvent::default());
        }
        self.host_armed = EventSet::empty();
        self.host_gone = true;
    }

    /// Whether guest rx can take a frame now: it runs, its pair is active, and the guest has
    /// posted buffers since it last lacked room.
    fn rx_can_take(&mut self) -> bool {
        self.active() && !self.rx.still_blocked() && self.rx.has_buffers()
    }

    /// Whether a queue has something to do right now, given the host port.
    fn has_runnable_work(&mut self) -> bool {
        (self.forwards && self.port.readable())
            || self.tx.pending()
            || (self.tx.waits_port() && self.port.writable())
            || ((self.rx.holds_frame() || self.port.readable()) && self.rx_can_take())
    }
}
