//! The control virtqueue, driver side (spec 5.1.6.5), as Linux's virtio_net does it since
//! 2024: interrupt-driven and concurrent.
//!
//! - **Interrupt mode (the default).** Every command carries its own [`Completion`]. The
//!   submitting thread adds the command, kicks, and sleeps on that completion; a reaper
//!   thread owns the ctrl queue's call eventfd, takes used entries, and completes the
//!   command each belongs to. Many commands from many threads may be in flight at once, and
//!   each gets its own result. Nobody spins.
//! - **Polling mode**, kept to measure the difference: one command at a time (the old
//!   rtnl-serialised path), the submitter spinning on the used ring until its answer comes.
//!
//! Each command has a deadline. A command that times out returns [`CtrlError::Timeout`] but
//! stays in flight: its buffers belong to the device until it hands them back, so they are
//! not reused, and when its late answer comes it completes that command's (abandoned)
//! completion, never another's. The used id that brings it back is checked by the ring
//! engine against its own in-flight table before we see our token.
//!
//! A device that breaks the ring breaks the queue: every command in flight and every later
//! one fails with [`CtrlError::Broken`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet_sys::PeerEventFd;
use vring::{Buf, DriverQueue, GuestAddress, GuestMemory};

use crate::frontend::QueueSetup;
use vnet::ctrl::{Coalesce, Command, ERR, OK};

mod answer;

use answer::lock;
pub use answer::{Completion, CtrlError, Reply};

/// How a submitter waits for its command's answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CtrlMode {
    /// Sleep until the reaper, woken by the ctrl queue's call eventfd, completes it.
    #[default]
    Irq,
    /// Spin on the used ring, one command at a time.
    Poll,
}

impl std::str::FromStr for CtrlMode {
    type Err = String;
    fn from_str(s: &str) -> Result<CtrlMode, String> {
        match s {
            "irq" => Ok(CtrlMode::Irq),
            "poll" => Ok(CtrlMode::Poll),
            _ => Err(format!("unknown ctrl mode {s:?} (irq or poll)")),
        }
    }
}

vnet::counters! {
    /// Counters of the control queue; any thread may bump them.
    pub struct CtrlCounters / CtrlSnapshot of SharedCounter {
        submitted,
        completed,
        refused,
        no_ack,
        timeouts,
        /// Answers that came after their submitter stopped waiting (timed out or gave up).
        late_completions,
        kicks,
        /// Kick eventfd writes that failed (the device's fd is full or not an eventfd).
        kick_errors,
        /// Call eventfd reads by the reaper that found a notification.
        interrupts,
        /// Submitters that found no free slot or descriptor and waited for one.
        space_waits,
        /// Polling mode: used-ring checks made while spinning.
        poll_spins,
        /// The most commands in flight at once.
        max_in_flight,
    }
}

/// Shared-memory bytes per command slot: the command (class, command, data: at most 14
/// bytes) at 0, the reply (at most 8 bytes) at 16, the ack at 24.
const SLOT_BYTES: u64 = 32;
const CMD_MAX: usize = 16;
const REPLY_AT: u64 = 16;
const ACK_AT: u64 = 24;
/// Written into the ack byte before submission: neither OK nor ERR, so a device that hands
/// a command back without answering it is caught.
const ACK_POISON: u8 = 0xa5;

struct Inflight {
    cmd: Command,
    done: Arc<Completion>,
}

struct Ring {
    q: DriverQueue<u16>,
    free: Vec<u16>,
    /// Indexed by slot; a slot is in flight from `add` until the device hands it back.
    inflight: Vec<Option<Inflight>>,
    broken: Option<vring::Error>,
    closed: bool,
    space_waiters: usize,
}

struct Shared {
    vq: u16,
    mode: CtrlMode,
    mem: Arc<GuestMemory>,
    base: GuestAddress,
    kick: PeerEventFd,
    call: PeerEventFd,
    ring: Mutex<Ring>,
    space: Condvar,
    /// Polling mode serialises commands, as the rtnl lock did around Linux's old ctrl path.
    poll_gate: Mutex<()>,
    timeout: Duration,
    counters: CtrlCounters,
    reaper_cpu_ns: AtomicU64,
}

/// The driver's control queue. Share it as `Arc<CtrlQueue>`; dropping the last reference
/// stops the reaper and fails whatever is still waiting with [`CtrlError::Closed`].
pub struct CtrlQueue {
    shared: Arc<Shared>,
    stop: PeerEventFd,
    reaper: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CtrlQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CtrlQueue")
            .field("vq", &self.shared.vq)
            .field("mode", &self.shared.mode)
            .field("counters", &self.shared.counters.snapshot())
            .finish()
    }
}

/// A submitted command whose answer has not been collected yet.
#[derive(Debug)]
pub struct Pending {
    shared: Arc<Shared>,
    done: Arc<Completion>,
    cmd: Command,
    submitted: Instant,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("vq", &self.vq).finish()
    }
}

impl CtrlQueue {
    /// Shared-memory bytes the command buffers of a queue of `size` need.
    pub fn bytes_needed(size: u16) -> u64 {
        size as u64 * SLOT_BYTES
    }

    /// Starts the control queue at virtqueue `vq` (2 * max_virtqueue_pairs) over `setup`'s
    /// rings, with command buffers at `buffers` ([`CtrlQueue::bytes_needed`] bytes, 8-byte
    /// aligned). In interrupt mode a reaper thread starts; each command waits at most
    /// `timeout`.
    pub fn new(
        vq: u16,
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        buffers: GuestAddress,
        mode: CtrlMode,
        timeout: Duration,
    ) -> Result<CtrlQueue, CtrlError> {
        let size = setup.config.size();
        let setup_err = |e: &dyn std::fmt::Display| CtrlError::Setup(e.to_string());
        let mut q = DriverQueue::activate(&setup.config, mem.clone(), setup.indirect)
            .map_err(|e| setup_err(&e))?;
        if !mem.contains(buffers, Self::bytes_needed(size)) {
            return Err(CtrlError::Setup(format!(
                "command buffers at {:#x} are outside memory",
                buffers.0
            )));
        }
        if mode == CtrlMode::Poll {
            q.disable_cb();
        }
        let shared = Arc::new(Shared {
            vq,
            mode,
            mem: mem.clone(),
            base: buffers,
            kick: setup.kick.try_clone().map_err(|e| setup_err(&e))?,
            call: setup.call.try_clone().map_err(|e| setup_err(&e))?,
            ring: Mutex::new(Ring {
                q,
                free: (0..size).rev().collect(),
                inflight: (0..size).map(|_| None).collect(),
                broken: None,
                closed: false,
                space_waiters: 0,
            }),
            space: Condvar::new(),
            poll_gate: Mutex::new(()),
            timeout,
            counters: CtrlCounters::default(),
            reaper_cpu_ns: AtomicU64::new(0),
        });
        let stop = PeerEventFd::new().map_err(|e| setup_err(&e))?;
        let reaper = match mode {
            CtrlMode::Irq => {
                let s = shared.clone();
                let stop = stop.try_clone().map_err(|e| setup_err(&e))?;
                Some(
                    std::thread::Builder::new()
                        .name(format!("virtnet-ctrl{vq}"))
                        .spawn(move || s.reaper(stop))
                        .map_err(|e| setup_err(&e))?,
                )
            }
            CtrlMode::Poll => None,
        };
        Ok(CtrlQueue {
            shared,
            stop,
            reaper,
        })
    }

    pub fn mode(&self) -> CtrlMode {
        self.shared.mode
    }
    pub fn vq(&self) -> u16 {
        self.shared.vq
    }
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }
    pub fn counters(&self) -> CtrlSnapshot {
        self.shared.counters.snapshot()
    }
    /// CPU time the reaper thread has used so far (0 in polling mode), as of its last wake.
    pub fn reaper_cpu_ns(&self) -> u64 {
        self.shared.reaper_cpu_ns.load(Relaxed)
    }
    /// Why the device broke the queue, if it did.
    pub fn broken(&self) -> Option<vring::Error> {
        lock(&self.shared.ring).broken.clone()
    }

    /// Submits `cmd` without waiting for its answer. Waits (up to the queue's timeout) only
    /// if every slot or descriptor is in use.
    pub fn submit(&self, cmd: Command) -> Result<Pending, CtrlError> {
        self.shared
            .submit(cmd, Instant::now() + self.shared.timeout)
    }

    /// Runs `cmd` and returns its answer, waiting at most the queue's timeout.
    pub fn execute(&self, cmd: Command) -> Result<Reply, CtrlError> {
        self.execute_timeout(cmd, self.shared.timeout)
    }

    /// Runs `cmd`, waiting at most `timeout` for the answer.
    pub fn execute_timeout(&self, cmd: Command, timeout: Duration) -> Result<Reply, CtrlError> {
        match self.shared.mode {
            CtrlMode::Irq => self
                .shared
                .submit(cmd, Instant::now() + timeout)?
                .wait(timeout),
            CtrlMode::Poll => {
                let _gate = lock(&self.shared.poll_gate);
                self.shared
                    .submit(cmd, Instant::now() + timeout)?
                    .wait(timeout)
            }
        }
    }

    /// Runs a command that has no reply data.
    pub fn execute_ack(&self, cmd: Command) -> Result<(), CtrlError> {
        self.execute(cmd).map(|_| ())
    }

    /// VQ_NOTF_COAL GET for virtqueue `vqn`.
    pub fn vq_coalesce(&self, vqn: u16) -> Result<Coalesce, CtrlError> {
        match self.execute(Command::VqNotfCoalGet { vqn })? {
            Reply::Coalesce(c) => Ok(c),
            Reply::Ack => Err(CtrlError::NoAck {
                cmd: Command::VqNotfCoalGet { vqn },
                ack: OK,
            }),
        }
    }
}

impl Drop for CtrlQueue {
    fn drop(&mut self) {
        let orphans: Vec<_> = {
            let mut ring = lock(&self.shared.ring);
            ring.closed = true;
            ring.inflight.iter_mut().filter_map(Option::take).collect()
        };
        self.shared.space.notify_all();
        for i in orphans {
            i.done.complete(Err(CtrlError::Closed));
        }
        let _ = self.stop.signal();
        if let Some(t) = self.reaper.take() {
            let _ = t.join();
        }
    }
}

impl Pending {
    pub fn command(&self) -> &Command {
        &self.cmd
    }
    /// When it was submitted.
    pub fn submitted(&self) -> Instant {
        self.submitted
    }

    /// The answer if it has come, without blocking (in polling mode, reaps the ring first).
    pub fn try_result(&self) -> Option<Result<Reply, CtrlError>> {
        if self.shared.mode == CtrlMode::Poll && !self.done.is_done() {
            self.shared.reap_once();
        }
        self.done.try_take()
    }

    /// Whether the answer has come (it is still there for [`Pending::wait`]).
    pub fn is_done(&self) -> bool {
        if self.shared.mode == CtrlMode::Poll && !self.done.is_done() {
            self.shared.reap_once();
        }
        self.done.is_done()
    }

    /// Waits up to `timeout` for the answer: asleep in interrupt mode, spinning in polling
    /// mode. On timeout the command stays in flight (see the module docs).
    pub fn wait(self, timeout: Duration) -> Result<Reply, CtrlError> {
        let deadline = Instant::now() + timeout;
        let got = match self.shared.mode {
            CtrlMode::Irq => self.done.wait_until(deadline),
            CtrlMode::Poll => loop {
                if let Some(r) = self.done.try_take() {
                    break Some(r);
                }
                self.shared.reap_once();
                self.shared.counters.poll_spins.add(1);
                if let Some(r) = self.done.try_take() {
                    break Some(r);
                }
                if Instant::now() >= deadline {
                    break None;
                }
                std::hint::spin_loop();
            },
        };
        got.unwrap_or_else(|| {
            self.shared.counters.timeouts.add(1);
            Err(CtrlError::Timeout {
                cmd: self.cmd,
                after: timeout,
            })
        })
    }
}

impl Shared {
    fn slot_addr(&self, slot: u16, off: u64) -> GuestAddress {
        GuestAddress(self.base.0 + slot as u64 * SLOT_BYTES + off)
    }

    fn submit(self: &Arc<Self>, cmd: Command, deadline: Instant) -> Result<Pending, CtrlError> {
        let bytes = cmd.encode();
        let reply_len = cmd.reply_len();
        if bytes.len() > CMD_MAX || reply_len as u64 > ACK_AT - REPLY_AT {
            return Err(CtrlError::Setup(format!(
                "command {cmd:?} does not fit a slot"
            )));
        }
        let done = Arc::new(Completion::default());
        let started = Instant::now();
        let mut ring = lock(&self.ring);
        let bufs = if reply_len > 0 { 3 } else { 2 };
        let needed = if ring.q.uses_indirect(bufs) { 1 } else { bufs };
        let mut waited = false;
        loop {
            if ring.closed {
                return Err(CtrlError::Closed);
            }
            if let Some(reason) = &ring.broken {
                return Err(self.broken_error(reason));
            }
            if !ring.free.is_empty() && ring.q.num_free() as usize >= needed {
                break;
            }
            if !waited {
                waited = true;
                self.counters.space_waits.add(1);
            }
            if self.mode == CtrlMode::Poll {
                // Nobody else reaps in polling mode: free what the device has finished.
                let reaped = self.reap_locked(&mut ring);
                let any = !reaped.is_empty();
                drop(ring);
                self.deliver(reaped);
                ring = lock(&self.ring);
                if any {
                    continue;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                self.counters.timeouts.add(1);
                return Err(CtrlError::NoRoom {
                    cmd,
                    after: now - started,
                });
            }
            let wait = match self.mode {
                CtrlMode::Irq => deadline - now,
                CtrlMode::Poll => (deadline - now).min(Duration::from_micros(50)),
            };
            ring.space_waiters += 1;
            ring = match self.space.wait_timeout(ring, wait) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
            ring.space_waiters -= 1;
        }
        let Some(slot) = ring.free.pop() else {
            return Err(CtrlError::Closed);
        };
        let at = self.slot_addr(slot, 0);
        let reply_at = self.slot_addr(slot, REPLY_AT);
        let ack_at = self.slot_addr(slot, ACK_AT);
        let written = self
            .mem
            .write(at, &bytes)
            .and_then(|()| self.mem.write(reply_at, &[0u8; 8][..reply_len]))
            .and_then(|()| self.mem.write(ack_at, &[ACK_POISON]));
        let out = [Buf::new(at, bytes.len() as u32)];
        let reply = Buf::new(reply_at, reply_len as u32);
        let ack = Buf::new(ack_at, 1);
        let in_: &[Buf] = if reply_len > 0 { &[reply, ack] } else { &[ack] };
        if let Err(e) = written.and_then(|()| ring.q.add(&out, in_, slot)) {
            ring.free.push(slot);
            return Err(CtrlError::Setup(e.to_string()));
        }
        ring.inflight[slot as usize] = Some(Inflight {
            cmd: cmd.clone(),
            done: done.clone(),
        });
        self.counters.submitted.add(1);
        let in_flight = (ring.inflight.len() - ring.free.len()) as u64;
        self.counters.max_in_flight.max(in_flight);
        let kick = ring.q.kick_prepare();
        drop(ring);
        if kick {
            if self.kick.signal().is_err() {
                self.counters.kick_errors.add(1);
            }
            self.counters.kicks.add(1);
        }
        Ok(Pending {
            shared: self.clone(),
            done,
            cmd,
            submitted: Instant::now(),
        })
    }

    fn broken_error(&self, reason: &vring::Error) -> CtrlError {
        CtrlError::Broken {
            vq: self.vq,
            reason: reason.clone(),
        }
    }

    /// Takes every used entry, frees its slot and returns the completions to deliver. On a
    /// ring violation the queue is broken and every command in flight fails.
    fn reap_locked(&self, ring: &mut Ring) -> Vec<(Arc<Completion>, Result<Reply, CtrlError>)> {
        let mut out = Vec::new();
        if ring.broken.is_some() {
            return out;
        }
        loop {
            match ring.q.get_used() {
                Ok(Some((slot, _len))) => {
                    // The engine returned our own token for a chain it had in flight, so
                    // `slot` indexes our tables; its in-flight entry is there by construction.
                    let Some(inflight) = ring.inflight[slot as usize].take() else {
                        continue;
                    };
                    let result = self.read_answer(slot, inflight.cmd);
                    ring.free.push(slot);
                    out.push((inflight.done, result));
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(vq = self.vq, error = %e, "device broke the control queue");
                    let err = self.broken_error(&e);
                    ring.broken = Some(e);
                    for i in ring.inflight.iter_mut().filter_map(Option::take) {
                        out.push((i.done, Err(err.clone())));
                    }
                    break;
                }
            }
        }
        if !out.is_empty() && ring.space_waiters > 0 {
            self.space.notify_all();
        }
        out
    }

    fn read_answer(&self, slot: u16, cmd: Command) -> Result<Reply, CtrlError> {
        let mut ack = [ACK_POISON];
        let mut reply = [0u8; 8];
        let read = self
            .mem
            .read(self.slot_addr(slot, ACK_AT), &mut ack)
            .and_then(|()| self.mem.read(self.slot_addr(slot, REPLY_AT), &mut reply));
        if read.is_err() {
            return Err(CtrlError::NoAck { cmd, ack: ack[0] });
        }
        match ack[0] {
            OK if cmd.reply_len() > 0 => Ok(Reply::Coalesce(Command::decode_reply(&reply))),
            OK => Ok(Reply::Ack),
            ERR => Err(CtrlError::Refused { cmd }),
            other => Err(CtrlError::NoAck { cmd, ack: other }),
        }
    }

    /// Completes what `reap_locked` collected, outside the ring lock.
    fn deliver(&self, reaped: Vec<(Arc<Completion>, Result<Reply, CtrlError>)>) {
        let c = &self.counters;
        for (done, result) in reaped {
            c.completed.add(1);
            match &result {
                Err(CtrlError::Refused { .. }) => c.refused.add(1),
                Err(CtrlError::NoAck { .. }) => c.no_ack.add(1),
                _ => {}
            }
            // Only the in-flight table holds it: its submitter has stopped waiting.
            if Arc::strong_count(&done) == 1 {
                c.late_completions.add(1);
            }
            done.complete(result);
        }
    }

    fn reap_once(&self) {
        let reaped = self.reap_locked(&mut lock(&self.ring));
        self.deliver(reaped);
    }

    /// Interrupt mode: with callbacks off, reap until the ring is empty, then turn them on
    /// and re-check, so an answer that lands meanwhile is not left without an interrupt.
    fn reap_and_rearm(&self) {
        let mut ring = lock(&self.ring);
        ring.q.disable_cb();
        let mut reaped = Vec::new();
        loop {
            reaped.append(&mut self.reap_locked(&mut ring));
            if ring.broken.is_some() || !ring.q.enable_cb() {
                break;
            }
            ring.q.disable_cb();
        }
        drop(ring);
        self.deliver(reaped);
    }

    /// The reaper: sleeps on the call eventfd (and `stop`), completes what the device
    /// answered.
    fn reaper(self: Arc<Self>, stop: PeerEventFd) {
        use std::os::fd::AsRawFd;
        let fds = [self.call.as_raw_fd(), stop.as_raw_fd()];
        loop {
            let ready = virtnet_sys::poll_readable(&fds, -1);
            if ready & 2 != 0 {
                break;
            }
            if ready & 1 != 0 && self.call.take().is_ok_and(|n| n > 0) {
                self.counters.interrupts.add(1);
            }
            self.reap_and_rearm();
            self.reaper_cpu_ns
                .store(virtnet_sys::thread_cpu_ns(), Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use vring::{DeviceQueue, Features, QueueConfig, RingAddresses};

    const MEM: usize = 1 << 20;
    const RINGS: GuestAddress = GuestAddress(0x1000);
    const BUFFERS: GuestAddress = GuestAddress(0x8000);

    /// A ctrl queue of `size` with a device side we drive by hand.
    struct Rig {
        ctrl: Arc<CtrlQueue>,
        device: DeviceQueue,
        kick: PeerEventFd,
        call: PeerEventFd,
        mem: Arc<GuestMemory>,
    }

    fn rig(size: u16, features: Features, mode: CtrlMode, timeout: Duration) -> Rig {
        let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM)]).unwrap());
        let config = QueueConfig::new(
            size as u32,
            RingAddresses::contiguous(RINGS, size),
            features,
        )
        .unwrap();
        let kick = PeerEventFd::new().unwrap();
        let call = PeerEventFd::new().unwrap();
        let setup = QueueSetup {
            index: 8,
            config,
            indirect: Some(vring::IndirectArea {
                addr: GuestAddress(0x4_0000),
                max_chain: 16,
            }),
            kick: kick.try_clone().unwrap(),
            call: call.try_clone().unwrap(),
        };
        let ctrl = CtrlQueue::new(8, &setup, &mem, BUFFERS, mode, timeout).unwrap();
        let device =
            DeviceQueue::activate(&config, mem.clone(), vring::RingPosition::START).unwrap();
        Rig {
            ctrl: Arc::new(ctrl),
            device,
            kick,
            call,
            mem,
        }
    }

    /// The device's answer to one command: a GET returns max_packets = vqn * 10 + 1.
    fn answer(mem: &GuestMemory, chain: &vring::Chain) -> u32 {
        let r = chain.readable();
        let mut cmd = vec![0u8; r.iter().map(|s| s.len as usize).sum()];
        let mut at = 0;
        for s in r {
            mem.read(s.addr, &mut cmd[at..at + s.len as usize]).unwrap();
            at += s.len as usize;
        }
        let w = chain.writable();
        let ack = w.last().unwrap().addr;
        match Command::decode(&cmd) {
            Ok(Command::VqNotfCoalGet { vqn }) => {
                let c = Coalesce {
                    max_packets: vqn as u32 * 10 + 1,
                    max_usecs: vqn as u32,
                };
                mem.write(w[0].addr, &Command::encode_reply(c)).unwrap();
                mem.write(ack, &[OK]).unwrap();
                9
            }
            Ok(Command::RxPromisc(false)) => {
                mem.write(ack, &[ERR]).unwrap();
                1
            }
            Ok(_) => {
                mem.write(ack, &[OK]).unwrap();
                1
            }
            Err(_) => 0,
        }
    }

    /// Pops every pending command and answers them in reverse order, then calls.
    fn serve_batch(r: &mut Rig) -> usize {
        let mut chains = Vec::new();
        while let Some(c) = r.device.pop().unwrap() {
            chains.push(c);
        }
        for c in chains.iter().rev() {
            let len = answer(&r.mem, c);
            r.device.add_used(c.head(), len).unwrap();
        }
        r.device.flush();
        if r.device.needs_notification() {
            r.call.signal().unwrap();
        }
        chains.len()
    }

    /// A device thread answering until `stop`.
    fn serve_until(mut r: Rig, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Rig> {
        std::thread::spawn(move || {
            while !stop.load(Relaxed) {
                if serve_batch(&mut r) == 0 {
                    virtnet_sys::wait_readable(std::os::fd::AsRawFd::as_raw_fd(&r.kick), 1);
                    let _ = r.kick.take();
                }
            }
            r
        })
    }

    fn both_modes() -> [CtrlMode; 2] {
        [CtrlMode::Irq, CtrlMode::Poll]
    }

    #[test]
    fn commands_complete_with_their_own_results_in_both_modes() {
        for mode in both_modes() {
            for features in [Features::RING_EVENT_IDX, Features::RING_INDIRECT_DESC] {
                let r = rig(16, features, mode, Duration::from_secs(5));
                let ctrl = r.ctrl.clone();
                let stop = Arc::new(AtomicBool::new(false));
                let dev = serve_until(r, stop.clone());
                assert_eq!(ctrl.execute(Command::RxPromisc(true)), Ok(Reply::Ack));
                assert_eq!(
                    ctrl.execute(Command::RxPromisc(false)),
                    Err(CtrlError::Refused {
                        cmd: Command::RxPromisc(false)
                    })
                );
                for vqn in [0u16, 3, 7] {
                    assert_eq!(
                        ctrl.vq_coalesce(vqn),
                        Ok(Coalesce {
                            max_packets: vqn as u32 * 10 + 1,
                            max_usecs: vqn as u32
                        })
                    );
                }
                let c = ctrl.counters();
                assert_eq!((c.submitted, c.completed, c.refused), (5, 5, 1));
                if mode == CtrlMode::Irq {
                    assert!(c.interrupts >= 1, "{c:?}");
                    assert_eq!(c.poll_spins, 0);
                } else {
                    assert_eq!(c.interrupts, 0);
                }
                stop.store(true, Relaxed);
                dev.join().unwrap();
            }
        }
    }

    #[test]
    fn many_threads_many_commands_none_lost_or_swapped() {
        for mode in both_modes() {
            // A queue smaller than the number of submitters: some wait for space.
            let r = rig(8, Features::RING_EVENT_IDX, mode, Duration::from_secs(10));
            let ctrl = r.ctrl.clone();
            let stop = Arc::new(AtomicBool::new(false));
            let dev = serve_until(r, stop.clone());
            let threads: Vec<_> = (0..16u16)
                .map(|t| {
                    let ctrl = ctrl.clone();
                    std::thread::spawn(move || {
                        for i in 0..50u16 {
                            let vqn = t * 100 + i;
                            let c = ctrl.vq_coalesce(vqn).unwrap();
                            assert_eq!(c.max_packets, vqn as u32 * 10 + 1, "swapped");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let c = ctrl.counters();
            assert_eq!((c.submitted, c.completed), (800, 800), "{mode:?} {c:?}");
            stop.store(true, Relaxed);
            dev.join().unwrap();
        }
    }

    #[test]
    fn a_timed_out_command_is_not_mistaken_for_the_next_one() {
        for mode in both_modes() {
            let features = Features::RING_EVENT_IDX | Features::RING_INDIRECT_DESC;
            let mut r = rig(8, features, mode, Duration::from_millis(500));
            let ctrl = r.ctrl.clone();
            // Nobody answers: the command times out, clearly.
            let err = ctrl
                .execute_timeout(Command::VqNotfCoalGet { vqn: 1 }, Duration::from_millis(30))
                .unwrap_err();
            assert!(matches!(err, CtrlError::Timeout { .. }), "{err}");
            assert!(err.to_string().contains("no answer"));
            // A second command goes in behind it; the device now answers both, the late one
            // last (reverse order), and each answer reaches its own command.
            let p = ctrl.submit(Command::VqNotfCoalGet { vqn: 2 }).unwrap();
            assert_eq!(serve_batch(&mut r), 2);
            let got = p.wait(Duration::from_secs(5)).unwrap();
            assert_eq!(
                got,
                Reply::Coalesce(Coalesce {
                    max_packets: 21,
                    max_usecs: 2
                })
            );
            // The late answer is counted once it has been reaped.
            let deadline = Instant::now() + Duration::from_secs(5);
            while ctrl.counters().late_completions == 0 && Instant::now() < deadline {
                ctrl.shared.reap_once();
                std::thread::sleep(Duration::from_millis(1));
            }
            let c = ctrl.counters();
            assert_eq!((c.timeouts, c.late_completions, c.completed), (1, 1, 2));
            // Both slots are free again: a full queue's worth of commands still fits, and one
            // more finds no room until some are answered.
            let pending: Vec<_> = (0..8)
                .map(|i| ctrl.submit(Command::VqNotfCoalGet { vqn: i }).unwrap())
                .collect();
            assert!(matches!(
                ctrl.submit(Command::RxPromisc(true)),
                Err(CtrlError::NoRoom { .. })
            ));
            assert_eq!(serve_batch(&mut r), 8);
            for (i, p) in pending.into_iter().enumerate() {
                let Reply::Coalesce(c) = p.wait(Duration::from_secs(5)).unwrap() else {
                    panic!("no reply data");
                };
                assert_eq!(c.max_packets, i as u32 * 10 + 1);
            }
        }
    }

    #[test]
    fn garbage_in_the_used_ring_breaks_the_queue_and_fails_every_waiter() {
        for mode in both_modes() {
            let r = rig(8, Features::EMPTY, mode, Duration::from_secs(5));
            let ctrl = r.ctrl.clone();
            let p = ctrl.submit(Command::RxAllmulti(true)).unwrap();
            // The device writes a used element with an id outside the queue, and calls.
            let used = r.device.config().rings().used.0;
            let mut e = [0u8; 8];
            e[..4].copy_from_slice(&77u32.to_le_bytes());
            r.mem.write(GuestAddress(used + 4), &e).unwrap();
            r.mem
                .write(GuestAddress(used + 2), &1u16.to_le_bytes())
                .unwrap();
            r.call.signal().unwrap();
            let err = p.wait(Duration::from_secs(5)).unwrap_err();
            assert!(
                matches!(
                    err,
                    CtrlError::Broken {
                        vq: 8,
                        reason: vring::Error::UsedIdOutOfRange { id: 77, .. }
                    }
                ),
                "{err}"
            );
            assert!(ctrl.broken().is_some());
            assert!(matches!(
                ctrl.execute(Command::RxAllmulti(false)),
                Err(CtrlError::Broken { .. })
            ));
        }
    }

    #[test]
    fn a_device_that_returns_a_command_unanswered_gives_no_ack() {
        let mut r = rig(8, Features::EMPTY, CtrlMode::Irq, Duration::from_secs(5));
        let p = r.ctrl.submit(Command::RxAllmulti(true)).unwrap();
        let c = r.device.pop().unwrap().unwrap();
        r.device.add_used(c.head(), 0).unwrap();
        r.device.flush();
        r.call.signal().unwrap();
        assert_eq!(
            p.wait(Duration::from_secs(5)),
            Err(CtrlError::NoAck {
                cmd: Command::RxAllmulti(true),
                ack: ACK_POISON
            })
        );
    }

    #[test]
    fn dropping_the_queue_fails_waiters_with_closed() {
        let r = rig(8, Features::EMPTY, CtrlMode::Irq, Duration::from_secs(5));
        let p = r.ctrl.submit(Command::RxAllmulti(true)).unwrap();
        let Rig { ctrl, .. } = r;
        drop(ctrl);
        assert_eq!(p.wait(Duration::from_secs(1)), Err(CtrlError::Closed));
    }
}
