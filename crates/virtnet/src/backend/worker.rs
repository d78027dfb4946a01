//! The data path: one worker thread per queue pair, moving frames between the guest's rings
//! and the host (a TAP queue, or the `null` / `echo` generators).
//!
//! The loop, per turn: tx up to the weight, rx up to the weight, and when both are idle:
//! busy-poll (seed 000, with rx polled from the tx path, seed 003) if a timeout is set, then
//! enable notifications with a re-check, then sleep in epoll on the kicks, the TAP and the
//! command eventfd. Used entries are published in batches (seed 001) and always flushed
//! before polling or sleeping.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;
use vring::{Chain, DeviceQueue, Error as RingError, Features};

use super::metrics::{PollExit, QueueMetrics};
use super::Shared;
use crate::net::{self, NetHdr};
use crate::sys;
use crate::sys::tap::TapQueue;

/// vhost_net's VHOST_NET_PKT_WEIGHT and VHOST_NET_WEIGHT: a queue's share of one turn.
pub const WEIGHT_PACKETS: usize = 256;
pub const WEIGHT_BYTES: u64 = 512 * 1024;

/// The largest frame the rx path reads: a 64 KiB GSO frame and its header.
const MAX_RX_FRAME: usize = 65536 + net::HDR_LEN + 14 + 4;

/// Where guest frames go and host frames come from.
#[derive(Debug)]
pub enum Io {
    /// Forward to and from a TAP queue.
    Tap(TapQueue),
    /// Drop guest tx; fill guest rx with generated frames of `size` bytes.
    Null { size: usize },
    /// Loop guest tx back to guest rx.
    Echo,
}

/// A running queue handed to a worker, with its notification fds and metrics.
#[derive(Debug)]
pub struct QueueRuntime {
    pub index: u16,
    pub queue: DeviceQueue,
    pub kick: EventFd,
    pub call: Option<EventFd>,
    pub err: Option<EventFd>,
    pub metrics: Arc<QueueMetrics>,
    /// Notification coalescing: a call the driver asked for but we hold back, since when,
    /// and the used count at the last call.
    held_since: Option<Instant>,
    used_at_last_call: u64,
    /// The engine's used-index store count already added to the metrics.
    stores_reported: u64,
}

impl QueueRuntime {
    pub fn new(
        index: u16,
        queue: DeviceQueue,
        kick: EventFd,
        call: Option<EventFd>,
        err: Option<EventFd>,
        metrics: Arc<QueueMetrics>,
    ) -> QueueRuntime {
        let used_at_last_call = queue.stats().used;
        let stores_reported = queue.stats().used_idx_stores;
        QueueRuntime {
            index,
            queue,
            kick,
            call,
            err,
            metrics,
            held_since: None,
            used_at_last_call,
            stores_reported,
        }
    }

    fn fire(&mut self) {
        if let Some(call) = &self.call {
            let _ = call.write(1);
        }
        self.metrics.add(&self.metrics.counters.calls, 1);
        if self.held_since.take().is_some() {
            self.metrics.add(&self.metrics.counters.calls_coalesced, 1);
        }
        self.used_at_last_call = self.queue.stats().used;
    }

    /// When the held call is due, if one is held.
    fn call_deadline(&self) -> Option<Instant> {
        let since = self.held_since?;
        Some(since + Duration::from_micros(self.metrics.coalesce().max_usecs as u64))
    }

    /// Sends the held call if its time has come.
    fn fire_if_due(&mut self, now: Instant) {
        if self.call_deadline().is_some_and(|d| now >= d) {
            self.fire();
        }
    }
}

/// Requests from the protocol thread to a worker.
#[derive(Debug)]
pub enum Command {
    Start(Box<QueueRuntime>),
    /// Stop queue `index`, flushing its batch; the reply is its next avail index (None if it
    /// was not running).
    Stop {
        index: u16,
        reply: mpsc::Sender<Option<u16>>,
    },
    Shutdown,
}

/// The protocol thread's end of a worker.
#[derive(Debug)]
pub struct WorkerHandle {
    tx: mpsc::Sender<Command>,
    wake: EventFd,
    pending: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    pub fn spawn(pair: u16, io: Io, shared: Arc<Shared>) -> std::io::Result<WorkerHandle> {
        let (tx, rx) = mpsc::channel();
        let wake = shared.wakes[pair as usize].try_clone()?;
        let pending = Arc::new(AtomicBool::new(false));
        let mut worker = Worker {
            shared,
            timer: TimerFd::new()?,
            pair,
            io,
            rx: None,
            tx: None,
            tap_armed: false,
            rx_pending: None,
            rx_blocked: None,
            commands: rx,
            wake: wake.try_clone()?,
            pending: pending.clone(),
            epoll: Epoll::new()?,
            chain: Chain::new(),
            rx_chains: Vec::new(),
            bounce: vec![0u8; MAX_RX_FRAME],
            null_frame: Vec::new(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("virtnet-pair{pair}"))
            .spawn(move || worker.run())?;
        Ok(WorkerHandle {
            tx,
            wake,
            pending,
            thread: Some(thread),
        })
    }

    /// The control queue's worker (see `ctrlq`).
    pub fn spawn_ctrl(shared: Arc<Shared>) -> std::io::Result<WorkerHandle> {
        let (tx, rx) = mpsc::channel();
        let wake = EventFd::new(libc::EFD_NONBLOCK)?;
        let pending = Arc::new(AtomicBool::new(false));
        let mut ctrl =
            super::ctrlq::CtrlWorker::new(shared, rx, wake.try_clone()?, pending.clone())?;
        let thread = std::thread::Builder::new()
            .name("virtnet-ctrlq".into())
            .spawn(move || ctrl.run())?;
        Ok(WorkerHandle {
            tx,
            wake,
            pending,
            thread: Some(thread),
        })
    }

    fn send(&self, cmd: Command) {
        // The worker only goes away at shutdown, after which nobody sends.
        let _ = self.tx.send(cmd);
        self.pending.store(true, SeqCst);
        let _ = self.wake.write(1);
    }

    pub fn start(&self, q: QueueRuntime) {
        self.send(Command::Start(Box::new(q)));
    }

    /// Stops queue `index` and returns its next avail index, waiting at most 5 s.
    pub fn stop(&self, index: u16) -> Option<u16> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::Stop { index, reply });
        answer.recv_timeout(Duration::from_secs(5)).ok().flatten()
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const EV_WAKE: u64 = 0;
const EV_RX_KICK: u64 = 1;
const EV_TX_KICK: u64 = 2;
const EV_TAP: u64 = 3;
const EV_TIMER: u64 = 4;

struct Worker {
    shared: Arc<Shared>,
    /// Fires when a call held back by coalescing is due.
    timer: TimerFd,
    pair: u16,
    io: Io,
    rx: Option<QueueRuntime>,
    tx: Option<QueueRuntime>,
    /// Whether epoll watches the TAP (only while rx has buffers to receive into).
    tap_armed: bool,
    /// A frame read from the TAP (its length in `bounce`) that did not fit the posted rx
    /// buffers: it goes first once the guest posts more, as vhost_net leaves it queued.
    rx_pending: Option<usize>,
    /// The avail index at which rx last lacked room (a pending TAP frame, or an echo): rx is
    /// not worth retrying until the guest moves it.
    rx_blocked: Option<u16>,
    commands: mpsc::Receiver<Command>,
    wake: EventFd,
    pending: Arc<AtomicBool>,
    epoll: Epoll,
    chain: Chain,
    rx_chains: Vec<Chain>,
    bounce: Vec<u8>,
    null_frame: Vec<u8>,
}

/// What one turn of a queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Turn {
    /// Frames moved.
    frames: usize,
    /// Stopped at the weight: more work is probably waiting.
    exhausted: bool,
}

/// Marks a queue broken: logs once, counts, signals the frontend's error eventfd.
/// Puts a started queue in `slot` and watches its kick; a queue it replaces is retired.
pub(super) fn install_queue(
    epoll: &Epoll,
    slot: &mut Option<QueueRuntime>,
    q: QueueRuntime,
    tag: u64,
) {
    let _ = epoll.ctl(
        ControlOperation::Add,
        q.kick.as_raw_fd(),
        EpollEvent::new(EventSet::IN, tag),
    );
    q.metrics.clear_broken();
    if let Some(old) = slot.replace(q) {
        retire_queue(epoll, old);
    }
}

/// Stops a queue: publishes its used batch, sends a call held back by coalescing, stops
/// watching its kick, and returns its next avail index (what GET_VRING_BASE reports).
pub(super) fn retire_queue(epoll: &Epoll, mut q: QueueRuntime) -> u16 {
    q.queue.flush();
    if q.held_since.is_some() {
        q.fire();
    }
    let _ = epoll.ctl(
        ControlOperation::Delete,
        q.kick.as_raw_fd(),
        EpollEvent::default(),
    );
    q.queue.next_avail()
}

pub(super) fn break_queue(q: &QueueRuntime, e: &RingError) {
    if q.metrics.set_broken(e.to_string()) {
        tracing::error!(queue = q.index, error = %e, "guest broke the queue; it stays stopped until reset");
        if let Some(err) = &q.err {
            let _ = err.write(1);
        }
    }
}

/// Publishes the used batch and sends the call if the driver asked for it, unless
/// coalescing holds it back: then it goes once `max_packets` completions accumulate or
/// `max_usecs` pass (the worker's timer), whichever is first. A held call is never dropped:
/// with EVENT_IDX the driver will not ask again until it has been woken.
pub(super) fn notify(q: &mut QueueRuntime) {
    let need = q.queue.needs_notification();
    // Every used.idx store, including those add_used made when a batch filled.
    let stores = q.queue.stats().used_idx_stores;
    q.metrics.add(
        &q.metrics.counters.batches_flushed,
        stores - q.stores_reported,
    );
    q.stores_reported = stores;
    let coal = q.metrics.coalesce();
    if need && coal.is_off() {
        q.fire();
        return;
    }
    if need && q.held_since.is_none() {
        q.held_since = Some(Instant::now());
    }
    if q.held_since.is_none() {
        q.metrics.add(&q.metrics.counters.calls_suppressed, 1);
        return;
    }
    let used = q.queue.stats().used - q.used_at_last_call;
    if coal.is_off() || (coal.max_packets > 0 && used >= coal.max_packets as u64) {
        q.fire();
    } else {
        q.fire_if_due(Instant::now());
    }
}

fn usable(q: &Option<QueueRuntime>) -> Option<&QueueRuntime> {
    q.as_ref().filter(|q| q.queue.broken().is_none())
}

/// Copies `data` into the writable segments of `chain`; returns the bytes written.
fn write_chain(
    mem: &vring::GuestMemory,
    chain: &Chain,
    mut data: &[u8],
) -> Result<usize, RingError> {
    let mut n = 0;
    for s in chain.writable() {
        if data.is_empty() {
            break;
        }
        let k = data.len().min(s.len as usize);
        mem.write(s.addr, &data[..k])?;
        data = &data[k..];
        n += k;
    }
    Ok(n)
}

/// Copies the readable part of `chain` into `buf`; returns the bytes copied.
fn read_chain(mem: &vring::GuestMemory, chain: &Chain, buf: &mut [u8]) -> Result<usize, RingError> {
    let mut n = 0;
    for s in chain.readable() {
        let k = (s.len as usize).min(buf.len() - n);
        mem.read(s.addr, &mut buf[n..n + k])?;
        n += k;
        if n == buf.len() {
            break;
        }
    }
    Ok(n)
}

impl Worker {
    fn run(&mut self) {
        if let Some(cpu) = self.shared.config.worker_cpu {
            if let Err(e) = sys::pin_thread(cpu) {
                tracing::warn!(cpu, error = %e, "cannot pin the worker");
            }
        }
        let _ = self.epoll.ctl(
            ControlOperation::Add,
            self.wake.as_raw_fd(),
            EpollEvent::new(EventSet::IN, EV_WAKE),
        );
        let _ = self.epoll.ctl(
            ControlOperation::Add,
            self.timer.as_raw_fd(),
            EpollEvent::new(EventSet::IN, EV_TIMER),
        );
        let mut events = vec![EpollEvent::default(); 8];
        loop {
            if self.pending.swap(false, SeqCst) && !self.handle_commands() {
                return;
            }
            self.fire_due_calls();
            let tx = self.handle_tx();
            let rx = self.handle_rx();
            if tx.exhausted || rx.exhausted || tx.frames + rx.frames > 0 {
                continue;
            }
            match self.busy_poll() {
                Some(PollExit::Hit) | Some(PollExit::OtherWork) => continue,
                Some(PollExit::Shutdown) => return,
                _ => {}
            }
            if self.arm_notifications() {
                self.disarm_notifications();
                continue;
            }
            self.arm_timer();
            let n = self.epoll.wait(-1, &mut events).unwrap_or(0);
            for ev in &events[..n] {
                match ev.data() {
                    EV_WAKE => {
                        let _ = self.wake.read();
                    }
                    EV_RX_KICK => Self::take_kick(&self.rx),
                    EV_TX_KICK => Self::take_kick(&self.tx),
                    EV_TIMER => {
                        let _ = self.timer.wait();
                    }
                    _ => {}
                }
            }
            self.disarm_notifications();
        }
    }

    /// Whether rx is still waiting for the guest to post more buffers (see `rx_blocked`).
    fn rx_still_blocked(&mut self) -> bool {
        let (Some(at), Some(rx)) = (self.rx_blocked, self.rx.as_mut()) else {
            return false;
        };
        match rx.queue.avail_idx() {
            Ok(now) if now == at => true,
            _ => {
                self.rx_blocked = None;
                false
            }
        }
    }

    fn fire_due_calls(&mut self) {
        let now = Instant::now();
        for q in [self.tx.as_mut(), self.rx.as_mut()].into_iter().flatten() {
            q.fire_if_due(now);
        }
    }

    fn next_call_deadline(&self) -> Option<Instant> {
        [self.tx.as_ref(), self.rx.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|q| q.call_deadline())
            .min()
    }

    /// Arms the timer for the earliest held call, or disarms it.
    fn arm_timer(&mut self) {
        let r = match self.next_call_deadline() {
            // A zero duration would disarm the timer: wait at least a microsecond.
            Some(d) => self.timer.reset(
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_micros(1)),
                None,
            ),
            None => self.timer.clear(),
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "coalescing timer failed");
        }
    }

    fn take_kick(q: &Option<QueueRuntime>) {
        if let Some(q) = q {
            if q.kick.read().is_ok() {
                q.metrics.add(&q.metrics.counters.kicks, 1);
            }
        }
    }

    /// Applies pending commands; returns false on shutdown.
    fn handle_commands(&mut self) -> bool {
        while let Ok(cmd) = self.commands.try_recv() {
            match cmd {
                Command::Start(q) => {
                    let rx = q.index % 2 == 0;
                    let tag = if rx { EV_RX_KICK } else { EV_TX_KICK };
                    let slot = if rx { &mut self.rx } else { &mut self.tx };
                    install_queue(&self.epoll, slot, *q, tag);
                    if rx {
                        self.prepare_null_frame();
                    }
                }
                Command::Stop { index, reply } => {
                    if index % 2 == 0 && self.rx_pending.take().is_some() {
                        // The frame waiting for buffers goes with the queue's owner.
                        if let Some(q) = &self.rx {
                            q.metrics.add(&q.metrics.counters.dropped, 1);
                        }
                    }
                    if index % 2 == 0 {
                        self.rx_blocked = None;
                    }
                    let slot = if index % 2 == 0 {
                        &mut self.rx
                    } else {
                        &mut self.tx
                    };
                    let _ = reply.send(slot.take().map(|q| retire_queue(&self.epoll, q)));
                }
                Command::Shutdown => return false,
            }
        }
        true
    }

    fn prepare_null_frame(&mut self) {
        let Io::Null { size } = self.io else { return };
        let hdr_len = self
            .rx
            .as_ref()
            .map_or(net::HDR_LEN, |q| net::hdr_len(q.queue.config().features()));
        let mut f = vec![0u8; hdr_len + size.max(60)];
        let h = NetHdr {
            num_buffers: 1,
            ..NetHdr::default()
        }
        .to_bytes();
        f[..hdr_len].copy_from_slice(&h[..hdr_len]);
        let eth = &mut f[hdr_len..];
        eth[..6].copy_from_slice(&[0xff; 6]);
        eth[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, self.pair as u8]);
        eth[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // IEEE local experimental
        self.null_frame = f;
    }

    /// Guest transmit: pop, send, return used; up to the weight.
    fn handle_tx(&mut self) -> Turn {
        let mut turn = Turn::default();
        let Some(txq) = usable(&self.tx) else {
            return turn;
        };
        let hdr_len = net::hdr_len(txq.queue.config().features());
        let metrics = txq.metrics.clone();
        let c = &metrics.counters;
        let mut bytes = 0u64;
        let result: Result<(), RingError> = (|| {
            let tx = self.tx.as_mut().expect("checked by usable");
            loop {
                if turn.frames >= WEIGHT_PACKETS || bytes >= WEIGHT_BYTES {
                    turn.exhausted = true;
                    metrics.add(&c.weight_exhausted, 1);
                    return Ok(());
                }
                if matches!(self.io, Io::Echo) && usable(&self.rx).is_none() {
                    // Echo needs a working rx queue; without one, leave tx where it is.
                    return Ok(());
                }
                if !tx.queue.pop_into(&mut self.chain)? {
                    return Ok(());
                }
                let len = self.chain.readable_len();
                let frame = len.saturating_sub(hdr_len as u64);
                match &self.io {
                    Io::Tap(t) => match t.write_frame(tx.queue.memory(), self.chain.readable()) {
                        Ok(Ok(_)) => {}
                        Ok(Err(_)) => metrics.add(&c.dropped, 1),
                        // A legal chain that one writev cannot take: drop it whole rather than
                        // send a cut frame, and keep the queue running.
                        Err(RingError::TooManySegments { count, max }) => {
                            static LOGGED: AtomicBool = AtomicBool::new(false);
                            if !LOGGED.swap(true, Relaxed) {
                                tracing::debug!(
                                    queue = tx.index,
                                    count,
                                    max,
                                    "tx chain has too many segments; dropped (logged once)"
                                );
                            }
                            metrics.add(&c.dropped, 1);
                        }
                        Err(e) => return Err(e),
                    },
                    Io::Null { .. } => {}
                    Io::Echo => {
                        let rx = self.rx.as_mut().expect("checked above");
                        if !Self::echo_one(
                            &self.shared,
                            tx,
                            rx,
                            &self.chain,
                            &mut self.bounce,
                            &mut self.rx_chains,
                        )? {
                            // No room in rx: leave the frame on tx until the guest posts more.
                            tx.queue.undo_pop(1);
                            let rx = self.rx.as_mut().expect("checked above");
                            self.rx_blocked = rx.queue.avail_idx().ok();
                            return Ok(());
                        }
                    }
                }
                tx.queue.add_used(self.chain.head(), 0)?;
                turn.frames += 1;
                bytes += frame;
            }
        })();
        let tx = self.tx.as_mut().expect("checked by usable");
        metrics.add(&c.packets, turn.frames as u64);
        metrics.add(&c.bytes, bytes);
        match result {
            Ok(()) => {
                if turn.frames > 0 {
                    notify(tx);
                }
            }
            Err(e) => break_queue(tx, &e),
        }
        if let (Io::Echo, Some(rx)) = (&self.io, self.rx.as_mut()) {
            if turn.frames > 0 && rx.queue.broken().is_none() {
                notify(rx);
            }
        }
        turn
    }

    /// Copies one tx chain into rx buffers. Returns false when rx has no buffer (nothing
    /// consumed). Rx errors break the rx queue only.
    fn echo_one(
        shared: &Shared,
        tx: &mut QueueRuntime,
        rx: &mut QueueRuntime,
        chain: &Chain,
        bounce: &mut [u8],
        rx_chains: &mut Vec<Chain>,
    ) -> Result<bool, RingError> {
        let n = read_chain(tx.queue.memory(), chain, bounce)?;
        match deliver(shared, rx, &mut bounce[..n], rx_chains) {
            Ok(delivered) => {
                if delivered {
                    let hdr_len = net::hdr_len(rx.queue.config().features());
                    let c = &rx.metrics.counters;
                    rx.metrics.add(&c.packets, 1);
                    rx.metrics.add(&c.bytes, n.saturating_sub(hdr_len) as u64);
                }
                Ok(delivered)
            }
            Err(e) => {
                break_queue(rx, &e);
                Ok(true) // The tx chain is consumed and dropped.
            }
        }
    }

    /// Guest receive: host frames into posted buffers; up to the weight.
    fn handle_rx(&mut self) -> Turn {
        let mut turn = Turn::default();
        let Some(rxq) = usable(&self.rx) else {
            return turn;
        };
        if self.pair >= self.shared.active_pairs.load(Relaxed) {
            return turn; // Disabled by VQ_PAIRS_SET: this pair carries no traffic.
        }
        let hdr_len = net::hdr_len(rxq.queue.config().features());
        let metrics = rxq.metrics.clone();
        if self.rx_still_blocked() {
            return turn;
        }
        let c = &metrics.counters;
        let mut bytes = 0u64;
        let rx = self.rx.as_mut().expect("checked by usable");
        let result: Result<(), RingError> = (|| loop {
            if turn.frames >= WEIGHT_PACKETS || bytes >= WEIGHT_BYTES {
                turn.exhausted = true;
                metrics.add(&c.weight_exhausted, 1);
                return Ok(());
            }
            let n = match &self.io {
                Io::Echo => return Ok(()), // Driven from tx.
                Io::Null { .. } => {
                    let mut frame = std::mem::take(&mut self.null_frame);
                    let room = WEIGHT_PACKETS - turn.frames;
                    let burst =
                        deliver_burst(&self.shared, rx, &mut frame, &mut self.rx_chains, room);
                    let ok = match burst {
                        Ok(0) => deliver(&self.shared, rx, &mut frame, &mut self.rx_chains),
                        Ok(k) => {
                            turn.frames += k - 1; // The last one is counted below.
                            bytes += ((k - 1) * frame.len().saturating_sub(hdr_len)) as u64;
                            Ok(true)
                        }
                        Err(e) => Err(e),
                    };
                    let n = frame.len();
                    self.null_frame = frame;
                    if !ok? {
                        return Ok(());
                    }
                    n
                }
                Io::Tap(t) => {
                    let n = match self.rx_pending.take() {
                        Some(n) => n,
                        None => {
                            // Read the TAP only when the guest has posted buffers, so frames
                            // wait in the kernel instead of here.
                            if !rx.queue.avail_pending()? {
                                return Ok(());
                            }
                            let Ok(n) = t.read(&mut self.bounce) else {
                                return Ok(());
                            };
                            n
                        }
                    };
                    if !deliver(&self.shared, rx, &mut self.bounce[..n], &mut self.rx_chains)? {
                        // Too few buffers for this frame: keep it until the guest posts more.
                        self.rx_pending = Some(n);
                        self.rx_blocked = Some(rx.queue.avail_idx()?);
                        return Ok(());
                    }
                    n
                }
            };
            turn.frames += 1;
            bytes += n.saturating_sub(hdr_len) as u64;
        })();
        metrics.add(&c.packets, turn.frames as u64);
        metrics.add(&c.bytes, bytes);
        match result {
            Ok(()) => {
                if turn.frames > 0 {
                    notify(rx);
                }
            }
            Err(e) => break_queue(rx, &e),
        }
        turn
    }

    /// Spins with notifications off until work shows up, other work is pending, the CPU is
    /// wanted elsewhere, or the timeout expires. None when busy polling is off.
    fn busy_poll(&mut self) -> Option<PollExit> {
        let metrics = usable(&self.tx).or(usable(&self.rx))?.metrics.clone();
        let us = metrics.busy_poll_us.load(Relaxed);
        if us == 0 {
            return None;
        }
        metrics.add(&metrics.counters.busy_poll_entries, 1);
        self.disarm_notifications();
        let deadline = Instant::now() + Duration::from_micros(us as u64);
        let switches = sys::involuntary_switches();
        let tap_fd = match &self.io {
            Io::Tap(t) => Some(t.as_raw_fd()),
            _ => None,
        };
        let mut spins = 0u32;
        let exit = loop {
            if self.pending.load(Relaxed) {
                break PollExit::OtherWork;
            }
            if let Some(tx) = self.tx.as_mut().filter(|q| q.queue.broken().is_none()) {
                if tx.queue.avail_pending().unwrap_or(false) {
                    break PollExit::Hit;
                }
            }
            if let Some(rx) = self.rx.as_mut().filter(|q| q.queue.broken().is_none()) {
                // Seed 003: poll the host side for rx while waiting on tx, when the guest has
                // posted buffers to receive into.
                let active = self.pair < self.shared.active_pairs.load(Relaxed);
                // Blocked: waiting for the guest to post more buffers than the avail index
                // showed when rx last ran out of room.
                let blocked = self
                    .rx_blocked
                    .is_some_and(|at| rx.queue.avail_idx().map_or(true, |now| now == at));
                let host_ready = active
                    && !blocked
                    && self.shared.config.poll_rx_from_tx
                    && match (&self.io, tap_fd) {
                        (Io::Null { .. }, _) => true,
                        (Io::Tap(_), _) if self.rx_pending.is_some() => true,
                        (Io::Tap(_), Some(fd)) => spins.is_multiple_of(8) && sys::readable_now(fd),
                        _ => false,
                    };
                if host_ready && rx.queue.avail_pending().unwrap_or(false) {
                    break PollExit::Hit;
                }
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                let now = Instant::now();
                if now >= deadline {
                    break PollExit::Timeout;
                }
                if self.next_call_deadline().is_some_and(|d| now >= d) {
                    break PollExit::OtherWork; // A held call is due.
                }
                if sys::involuntary_switches() != switches {
                    break PollExit::Yield;
                }
            }
            std::hint::spin_loop();
        };
        metrics.poll_exit(exit);
        Some(exit)
    }

    /// Enables notifications on both queues; returns true if either re-check found work.
    fn arm_notifications(&mut self) -> bool {
        let mut pending = false;
        for q in [self.tx.as_mut(), self.rx.as_mut()].into_iter().flatten() {
            if q.queue.broken().is_some() {
                continue;
            }
            match q.queue.enable_notification() {
                Ok(p) => pending |= p,
                Err(e) => break_queue(q, &e),
            }
        }
        let runnable = pending && self.has_runnable_work();
        if !runnable {
            self.arm_tap();
        }
        runnable
    }

    /// Watches the TAP in epoll only while rx has buffers: a readable TAP with nowhere to put
    /// its frames must not wake us (level-triggered epoll would spin); the rx kick will.
    fn arm_tap(&mut self) {
        if !matches!(self.io, Io::Tap(_)) {
            return;
        }
        // With a frame already waiting for buffers, the TAP has nothing to tell us.
        let want = self.rx_pending.is_none()
            && !self.rx_still_blocked()
            && self.rx.as_mut().is_some_and(|q| {
                q.queue.broken().is_none() && q.queue.avail_pending().unwrap_or(false)
            });
        let Io::Tap(t) = &self.io else { return };
        if want == self.tap_armed {
            return;
        }
        let fd = t.as_raw_fd();
        let r = if want {
            self.epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, EV_TAP),
            )
        } else {
            self.epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default())
        };
        if r.is_ok() {
            self.tap_armed = want;
        }
    }

    /// Whether a queue has something to do right now, given the io mode.
    fn has_runnable_work(&mut self) -> bool {
        let tx = self.tx.as_mut().is_some_and(|q| {
            q.queue.broken().is_none() && q.queue.avail_pending().unwrap_or(false)
        });
        let active = self.pair < self.shared.active_pairs.load(Relaxed);
        let rx_bufs = active
            && !self.rx_still_blocked()
            && self.rx.as_mut().is_some_and(|q| {
                q.queue.broken().is_none() && q.queue.avail_pending().unwrap_or(false)
            });
        match &self.io {
            Io::Null { .. } => tx || rx_bufs,
            Io::Echo => tx && rx_bufs,
            Io::Tap(t) => {
                tx || (rx_bufs && (self.rx_pending.is_some() || sys::readable_now(t.as_raw_fd())))
            }
        }
    }

    fn disarm_notifications(&mut self) {
        for q in [self.tx.as_mut(), self.rx.as_mut()].into_iter().flatten() {
            q.queue.disable_notification();
        }
    }
}

/// Frames per burst of [`deliver_burst`]: as many buffer fetches in flight as the CPU keeps.
const BURST: usize = 32;
/// Cache lines of rx buffers prefetched ahead of the copies: enough transfers in flight to
/// hide their latency, few enough for the CPU's miss buffers. Frames longer than half of this
/// are not prefetched: on AMD EPYC (Zen 4) vCPUs 1500 B guest rx ran 6% slower with the
/// prefetch (docs/PERFORMANCE.md), the copy's own streaming being enough there.
const PREFETCH_LINES: usize = 16;

/// Puts up to `max` copies of `frame` (header first) into the rx queue, as long as each fits
/// the first writable segment of one chain: the chains are popped, then the frames copied.
/// Short frames' buffers are prefetched for writing ahead of the copies, so that the
/// transfers of the cache lines the driver last touched overlap. Returns how many were
/// delivered; 0 leaves the next frame to [`deliver`] (no buffer, a buffer that is too small or
/// split, or the receive filter's verdict).
fn deliver_burst(
    shared: &Shared,
    rx: &mut QueueRuntime,
    frame: &mut [u8],
    chains: &mut Vec<Chain>,
    max: usize,
) -> Result<usize, RingError> {
    let features = rx.queue.config().features();
    let hdr_len = net::hdr_len(features);
    if !shared.accepts(frame.get(hdr_len..).unwrap_or(&[])) {
        return Ok(0);
    }
    if features.contains(Features::NET_MRG_RXBUF) && frame.len() >= net::HDR_LEN {
        // Each frame takes one buffer.
        frame[net::NUM_BUFFERS_OFFSET as usize..net::HDR_LEN].copy_from_slice(&1u16.to_le_bytes());
    }
    let max = max.min(BURST);
    if chains.len() < max {
        chains.resize_with(max, Chain::new);
    }
    if !rx.queue.avail_pending()? {
        return Ok(0);
    }
    let mut n = 0;
    while n < max {
        if !rx.queue.pop_into(&mut chains[n])? {
            break;
        }
        match chains[n].writable().first() {
            Some(s) if s.len as usize >= frame.len() => n += 1,
            _ => {
                rx.queue.undo_pop(1);
                break;
            }
        }
    }
    // Whole frames, as many ahead as keep about PREFETCH_LINES cache lines in flight.
    let lines = frame.len().div_ceil(64).max(1);
    let ahead = if 2 * lines <= PREFETCH_LINES {
        (PREFETCH_LINES / lines).min(BURST)
    } else {
        0
    };
    let prefetch =
        |q: &DeviceQueue, c: &Chain| q.memory().prefetch_write(c.writable()[0].addr, frame.len());
    for c in &chains[..n.min(ahead)] {
        prefetch(&rx.queue, c);
    }
    for i in 0..n {
        if ahead > 0 && i + ahead < n {
            prefetch(&rx.queue, &chains[i + ahead]);
        }
        let c = &chains[i];
        rx.queue.memory().write(c.writable()[0].addr, &frame[..])?;
        rx.queue.add_used(c.head(), frame.len() as u32)?;
    }
    Ok(n)
}

/// Puts one frame (virtio-net header first, `frame[..hdr_len]`) into the rx queue, merging
/// buffers when MRG_RXBUF is negotiated. Returns false when there are not enough buffers
/// (nothing is consumed).
fn deliver(
    shared: &Shared,
    rx: &mut QueueRuntime,
    frame: &mut [u8],
    chains: &mut Vec<Chain>,
) -> Result<bool, RingError> {
    let features = rx.queue.config().features();
    let hdr_len = net::hdr_len(features);
    if !shared.accepts(frame.get(hdr_len..).unwrap_or(&[])) {
        rx.metrics.add(&rx.metrics.counters.filtered, 1);
        return Ok(true); // Consumed: dropped by the filter.
    }
    let mergeable = features.contains(Features::NET_MRG_RXBUF);
    let need = frame.len() as u64;
    let mut have = 0u64;
    let mut used = 0usize;
    while have < need {
        if chains.len() <= used {
            chains.push(Chain::new());
        }
        if !rx.queue.pop_into(&mut chains[used])? {
            rx.queue.undo_pop(used as u16);
            return Ok(false);
        }
        have += chains[used].writable_len();
        used += 1;
        if !mergeable && have < need {
            // Without mergeable buffers a frame must fit one chain: drop the frame and leave
            // the buffer for the next one.
            rx.queue.undo_pop(1);
            rx.metrics.add(&rx.metrics.counters.dropped, 1);
            return Ok(true);
        }
        if used > u16::MAX as usize / 2 {
            break;
        }
    }
    if mergeable && frame.len() >= net::HDR_LEN {
        frame[net::NUM_BUFFERS_OFFSET as usize..net::HDR_LEN]
            .copy_from_slice(&(used as u16).to_le_bytes());
    }
    // No Arc clone of the memory here: its locked refcount update would wait for this frame's
    // stores to shared memory to drain, once per frame (measured: most of the rx path's time).
    let mut rest: &[u8] = frame;
    for c in &chains[..used] {
        let n = write_chain(rx.queue.memory(), c, rest)?;
        rest = &rest[n..];
        rx.queue.add_used(c.head(), n as u32)?;
    }
    Ok(true)
}
