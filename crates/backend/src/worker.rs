//! The data path's threads: a worker serves one or more queue pairs ([`Pair`]: the guest's tx
//! and rx paths and a host port), each in a slot of its own. A backend runs a worker per pair.
//!
//! The loop, per turn: each pair's tx up to the weight, then its rx up to the weight; after a
//! turn that moved a few frames, a pause of a few hundred nanoseconds at most before the next
//! ([`PollPace`]: looking again at once would take the ring's index lines from a driver that
//! is still adding). When every pair is idle: busy-poll (a fixed timeout, or as long as the
//! auto policy of [`super::poll`] decides, with the host side polled for rx from the same
//! loop), then enable notifications with a re-check, then sleep in epoll on the kicks, the
//! host ports' fds, the coalescing timer and the command eventfd. Used entries are published
//! in batches by the engine and always flushed before polling or sleeping.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_sys::SchedStat;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;
use vring::PollPace;

use super::config::BackendConfig;
use super::error::Error;
use super::poll::{AutoPoll, PollExit};
use super::queue::FaultWatch;
use super::siblings::Sibling;
use super::thread::{wait_events, Command, Inbox, WorkerHandle};

mod busy_poll;

use super::pair::{untag, Pair, EV_HOST, EV_RX_KICK, EV_TX_KICK};

/// The epoll tags of the worker's own events (a pair's tags hold its slot, far below these).
const EV_WAKE: u64 = u64::MAX;
const EV_TIMER: u64 = u64::MAX - 1;

/// How a data worker runs: on which CPU, among which siblings, under which restrictions.
#[derive(Clone, Debug, Default)]
pub struct WorkerConfig {
    /// Pinned to this CPU, if any.
    pub cpu: Option<usize>,
    /// The board of pinned workers (`crate::siblings`).
    pub board: Option<PathBuf>,
    /// The workers' seccomp filter installed.
    pub seccomp: bool,
    /// Busy polling also polls the host side for rx.
    pub poll_rx_from_tx: bool,
}

impl WorkerConfig {
    /// A worker of a device configured by `config`.
    pub fn of(config: &BackendConfig) -> WorkerConfig {
        WorkerConfig {
            cpu: config.worker_cpu,
            board: config.worker_board.clone(),
            seccomp: config.seccomp,
            poll_rx_from_tx: config.poll_rx_from_tx,
        }
    }
}

/// Starts a data worker, thread `name`, woken through `wake`: it serves the pairs added to it
/// ([`WorkerHandle::add_pair`]) until its last handle goes.
pub fn spawn(
    name: String,
    wake: EventFd,
    config: WorkerConfig,
) -> std::io::Result<Arc<WorkerHandle>> {
    let handle = WorkerHandle::spawn(name, wake, move |inbox| match Worker::new(config, inbox) {
        Ok(mut w) => {
            if let Err(e) = w.run() {
                tracing::error!(error = %e, "worker stopped; its queues no longer run");
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot start a worker"),
    })?;
    Ok(Arc::new(handle))
}

/// A data worker.
pub struct Worker {
    config: WorkerConfig,
    /// The pairs served, by slot.
    pairs: Vec<Option<Pair>>,
    inbox: Inbox,
    epoll: Epoll,
    /// Fires when a call held back by coalescing is due.
    timer: TimerFd,
    faults: FaultWatch,
    /// Busy polling auto's policy; when the worker last went idle (the gap it measures); the
    /// worker thread's schedstat and its siblings', for its contention check.
    auto: AutoPoll,
    idle_since: Option<Instant>,
    sibling: Option<Sibling>,
    /// How soon the next turn looks at the rings after one that moved frames.
    pace: PollPace,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("pairs", &self.pairs)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub fn new(config: WorkerConfig, inbox: Inbox) -> std::io::Result<Self> {
        Ok(Worker {
            config,
            pairs: Vec::new(),
            inbox,
            epoll: Epoll::new()?,
            timer: TimerFd::new()?,
            faults: FaultWatch::default(),
            auto: AutoPoll::new(Instant::now()),
            idle_since: None,
            sibling: None,
            pace: PollPace::new(),
        })
    }

    /// Runs until shut down. Returns early, with the error, if the worker's own epoll set
    /// cannot be built: then none of its pairs' queues can run.
    pub fn run(&mut self) -> Result<(), Error> {
        if let Some(cpu) = self.config.cpu {
            if let Err(e) = virtnet_sys::pin_thread(cpu) {
                tracing::warn!(cpu, error = %e, "cannot pin the worker");
            }
        }
        // Opened by this thread (the file is the opener's), before seccomp forbids opening.
        let (cpu, board) = (self.config.cpu, self.config.board.clone());
        self.sibling = SchedStat::open()
            .ok()
            .map(|s| Sibling::join(cpu, s, board.as_deref()));
        if self.config.seccomp {
            virtnet_sys::sandbox::restrict_thread()
                .map_err(Error::host("installing the worker's seccomp filter"))?;
        }
        for (fd, tag) in [
            (self.inbox.wake.as_raw_fd(), EV_WAKE),
            (self.timer.as_raw_fd(), EV_TIMER),
        ] {
            self.epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, tag),
                )
                .map_err(Error::host("building the worker's epoll set"))?;
        }
        let mut events = vec![EpollEvent::default(); 16];
        loop {
            if self.inbox.take_pending() && !self.handle_commands() {
                return Ok(());
            }
            self.fire_due_calls();
            // The gap ends when the turn starts, not after it: a hit's own work is no idle time.
            let turn_start = self.idle_since.map(|_| Instant::now());
            let mut frames = 0;
            for pair in self.pairs.iter_mut().flatten() {
                frames += pair.turn();
            }
            crate::ab::count(frames);
            self.faults
                .check(self.pairs.iter().flatten().flat_map(Pair::queues));
            if frames > 0 {
                if let (Some(t), Some(now)) = (self.idle_since.take(), turn_start) {
                    self.auto.record_gap(now - t, now);
                }
            }
            if self.pace.found(frames as u64) {
                self.pace.wait();
                continue;
            }
            self.idle_since.get_or_insert_with(Instant::now);
            match self.busy_poll() {
                Some(PollExit::Hit | PollExit::OtherWork | PollExit::Shutdown) => continue,
                // A signal: sleep now, and let the thread that takes signals have the CPU.
                Some(PollExit::Timeout | PollExit::Yield | PollExit::Signal) | None => {}
            }
            if self.arm_notifications() {
                self.disarm_notifications();
                continue;
            }
            self.arm_timer();
            let n = wait_events(&self.epoll, &mut events)?;
            for ev in &events[..n] {
                match ev.data() {
                    // A non-blocking eventfd or timerfd read fails only when nothing is
                    // pending: the wake-up was consumed already.
                    EV_WAKE => {
                        let _ = self.inbox.wake.read();
                    }
                    EV_TIMER => {
                        let _ = self.timer.wait();
                    }
                    tag => {
                        let (slot, kind) = untag(tag);
                        let Some(Some(pair)) = self.pairs.get_mut(slot as usize) else {
                            continue;
                        };
                        match kind {
                            EV_RX_KICK | EV_TX_KICK => pair.take_kick(kind),
                            EV_HOST => pair.host_event(&self.epoll, ev.event_set()),
                            _ => {}
                        }
                    }
                }
            }
            self.disarm_notifications();
        }
    }

    fn fire_due_calls(&mut self) {
        let now = Instant::now();
        self.pairs
            .iter_mut()
            .flatten()
            .for_each(|p| p.fire_due_calls(now));
    }

    fn next_call_deadline(&self) -> Option<Instant> {
        self.pairs
            .iter()
            .flatten()
            .filter_map(Pair::next_call_deadline)
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

    /// Applies pending commands; returns false on shutdown.
    fn handle_commands(&mut self) -> bool {
        while let Some(cmd) = self.inbox.next() {
            match cmd {
                Command::AddPair { slot, pair } => {
                    let i = slot as usize;
                    if self.pairs.len() <= i {
                        self.pairs.resize_with(i + 1, || None);
                    }
                    self.pairs[i] = Some(*pair);
                }
                Command::RemovePair { slot } => {
                    if let Some(mut pair) = self.pairs.get_mut(slot as usize).and_then(Option::take)
                    {
                        pair.retire(&self.epoll);
                    }
                }
                Command::Start { slot, queue } => match self.pairs.get_mut(slot as usize) {
                    Some(Some(pair)) => pair.start(&self.epoll, slot, *queue),
                    _ => tracing::error!(slot, "a queue started on a slot without a pair"),
                },
                Command::Stop { slot, queue, reply } => {
                    let at = match self.pairs.get_mut(slot as usize) {
                        Some(Some(pair)) => pair.stop(&self.epoll, queue),
                        _ => None,
                    };
                    let _ = reply.send(at);
                }
                Command::Shutdown => return false,
            }
        }
        true
    }

    /// Enables notifications on every pair's queues and arms their ports' fds; returns true if
    /// a re-check found work to do now.
    fn arm_notifications(&mut self) -> bool {
        let mut runnable = false;
        for (slot, pair) in self.pairs.iter_mut().enumerate() {
            if let Some(pair) = pair {
                runnable |= pair.arm(&self.epoll, slot as u32);
            }
        }
        runnable
    }

    fn disarm_notifications(&mut self) {
        self.pairs.iter_mut().flatten().for_each(Pair::disarm);
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;
    use std::os::fd::{AsFd, OwnedFd, RawFd};

    use vring::{Error as RingError, Features, Gather, GuestMemory};

    use super::*;
    use crate::host::{Port, Sent};
    use crate::poll::BusyPoll;
    use crate::queue::QueueId;
    use crate::shared::Shared;
    use crate::testing::{setup_sized, shared};
    use crate::thread::PairHandle;

    /// A host port that writes guest tx frames into a one-page pipe, as a TAP with a full send
    /// buffer pushes back: EAGAIN once the pipe is full, writable again once it is read.
    struct PipePort {
        pipe: File,
        /// Batched writes through io_uring, linked as for a TAP with a send-buffer limit.
        batch: Option<crate::host::batch::BatchWriter>,
    }

    impl PipePort {
        fn new(pipe: File, uring: bool) -> PipePort {
            let batch =
                uring.then(|| crate::host::batch::BatchWriter::new(pipe.as_fd(), true).unwrap());
            PipePort { pipe, batch }
        }
    }

    impl Port for PipePort {
        fn tx_batch(&self) -> usize {
            if self.batch.is_some() {
                vring::memory::MAX_URING_BATCH
            } else {
                1
            }
        }

        fn send(
            &mut self,
            mem: &GuestMemory,
            frames: &[Gather<'_>],
            sent: &mut Vec<Sent>,
        ) -> Result<(), RingError> {
            match self.batch.as_mut() {
                Some(b) => b.send(mem, frames, sent),
                None => crate::host::send_each(frames, sent, |f| {
                    mem.writev_gather(self.pipe.as_fd(), f)
                }),
            }
        }

        fn readable(&self) -> bool {
            false
        }

        fn writable(&self) -> bool {
            virtnet_sys::writable_now(self.pipe.as_raw_fd())
        }

        fn fd(&self) -> Option<RawFd> {
            Some(self.pipe.as_raw_fd())
        }
    }

    /// A worker, thread `name` under the workers' seccomp filter, serving one pair (pair 0 of
    /// `shared`) on `port`.
    fn on_worker(
        name: &str,
        wake: vmm_sys_util::eventfd::EventFd,
        port: PipePort,
        shared: Arc<Shared>,
    ) -> PairHandle {
        let config = WorkerConfig {
            seccomp: true,
            ..WorkerConfig::default()
        };
        let worker = spawn(name.to_string(), wake, config).unwrap();
        worker.add_pair(Pair::new(0, Box::new(port), shared))
    }

    /// A non-blocking pipe (64 KiB, the default): (read end, write end).
    fn pipe() -> (File, File) {
        let (rd, wr) = std::io::pipe().unwrap();
        for end in [rd.as_fd(), wr.as_fd()] {
            virtnet_sys::set_nonblocking(end, true).unwrap();
        }
        (OwnedFd::from(rd).into(), OwnedFd::from(wr).into())
    }

    /// Starts a worker polling an empty tx ring for a second and shuts it down mid-poll:
    /// how long the shutdown took, and the tx counters.
    fn shut_down_mid_poll() -> (Duration, crate::metrics::CountersSnapshot) {
        let (_rd, wr) = pipe();
        let shared = Arc::new(shared());
        let s = setup_sized(QueueId::Tx(0), Features::VERSION_1, 256);
        let counters = s.runtime.counters().clone();
        // A poll of a second: only the shutdown can end it sooner.
        s.runtime
            .tunables()
            .set_busy_poll(BusyPoll::Fixed(1_000_000));
        let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let worker = on_worker("t-poll-shutdown", wake, PipePort::new(wr, false), shared);
        worker.start(s.runtime);
        assert!(testkit::eventually(Duration::from_secs(5), || {
            counters.busy_poll_entries.get() > 0
        }));
        let t = Instant::now();
        drop(worker);
        (t.elapsed(), counters.snapshot())
    }

    #[test]
    fn a_poll_ends_when_the_worker_is_shut_down_and_says_so() {
        // A poll the scheduler preempts ends there (the worker then sleeps): on a busy
        // machine, try again.
        for _ in 0..50 {
            let (took, c) = shut_down_mid_poll();
            if c.busy_poll_exit_yield > 0 {
                continue;
            }
            assert!(
                took < Duration::from_millis(500),
                "the shutdown waited {took:?}"
            );
            assert_eq!((c.busy_poll_exit_shutdown, c.busy_poll_timeouts), (1, 0));
            return;
        }
        panic!("every poll was preempted before the shutdown");
    }

    #[test]
    fn a_frame_the_host_cannot_take_stays_on_the_ring_and_goes_when_it_can() {
        frames_wait_on_the_ring_while_the_host_pushes_back(false);
    }

    #[test]
    fn a_batch_the_host_cannot_take_stays_on_the_ring_in_order_and_goes_when_it_can() {
        frames_wait_on_the_ring_while_the_host_pushes_back(true);
    }

    /// 200 frames into a one-page pipe that the test drains slowly: written by system calls,
    /// or in io_uring batches (`uring`).
    fn frames_wait_on_the_ring_while_the_host_pushes_back(uring: bool) {
        const FRAMES: u32 = 200;
        const LEN: u32 = 2000;
        let (mut rd, wr) = pipe();
        let shared = Arc::new(shared());
        let s = setup_sized(QueueId::Tx(0), Features::VERSION_1, 256);
        let (mut driver, mem, counters) = (s.driver, s.mem, s.runtime.counters().clone());
        for i in 0..FRAMES {
            // Each frame: its number in every byte (after the 12-byte header, zero).
            let addr = testkit::Pair::buf(i as u64, LEN);
            let mut bytes = vec![i as u8; LEN as usize];
            bytes[..vnet::HDR_LEN].fill(0);
            mem.write(addr.addr, &bytes).unwrap();
            driver.add(&[addr], &[], i).unwrap();
        }
        let name = if uring { "t-pushback-u" } else { "t-pushback" };
        let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let worker = on_worker(name, wake, PipePort::new(wr, uring), shared);
        worker.start(s.runtime);
        // The pipe holds about 32 frames: the worker fills it, then waits, without spinning.
        assert!(testkit::eventually(Duration::from_secs(5), || {
            counters.host_pushback.get() > 0
        }));
        assert_eq!(
            testkit::inproc::thread_seccomp(name),
            [2],
            "under the filter"
        );
        let ticks = testkit::inproc::thread_cpu_ticks(name);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            testkit::inproc::thread_cpu_ticks(name) <= ticks + 3,
            "the worker spun while the host pushed back"
        );
        // Read slowly (a frame's worth, then a pause, so that the worker finds the pipe full
        // again and again): every frame arrives, in order, none dropped.
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < (FRAMES * LEN) as usize && Instant::now() < deadline {
            let mut buf = [0u8; LEN as usize];
            if let Ok(n) = rd.read(&mut buf) {
                got.extend_from_slice(&buf[..n]);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        assert_eq!(got.len(), (FRAMES * LEN) as usize, "frames lost");
        for (i, f) in got.chunks(LEN as usize).enumerate() {
            assert!(
                f[vnet::HDR_LEN..].iter().all(|&b| b == i as u8),
                "frame {i}"
            );
        }
        let c = counters.snapshot();
        assert_eq!((c.packets, c.dropped), (FRAMES as u64, 0));
        assert!(
            c.host_pushback >= 4,
            "pushed back {} times",
            c.host_pushback
        );
        drop(worker);
    }

    /// tx breaks while frames wait for the host (here the frontend made the call eventfd
    /// block: the worker's call after the frames it took is interrupted and breaks tx; a
    /// memory file shrunk under the ring breaks it the same way). Once the host drains, the
    /// worker must not go on waiting for it: the port's fd, writable and watched for that
    /// (level-triggered), woke it at once, for ever, and busy polling took it for work. And a
    /// stop still answers, with the frames left on the ring.
    #[test]
    fn tx_broken_while_frames_wait_for_the_host_does_not_spin_once_the_host_drains() {
        const FRAMES: u32 = 100;
        let (mut rd, wr) = pipe();
        let shared = Arc::new(shared());
        let s = setup_sized(QueueId::Tx(0), Features::VERSION_1, 256);
        let (mut driver, mem, counters) = (s.driver, s.mem, s.runtime.counters().clone());
        for i in 0..FRAMES {
            let addr = testkit::Pair::buf(i as u64, 2000);
            mem.write(addr.addr, &[0u8; vnet::HDR_LEN]).unwrap();
            driver.add(&[addr], &[], i).unwrap();
        }
        // The frontend clears O_NONBLOCK on the call eventfd it shares and fills the counter.
        let call = s.runtime.call_fd().unwrap();
        virtnet_sys::set_nonblocking(call.as_fd(), false).unwrap();
        call.to_eventfd().unwrap().write(u64::MAX - 1).unwrap();
        let name = "t-waits-broken";
        let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let worker = on_worker(name, wake, PipePort::new(wr, false), shared);
        worker.start(s.runtime);
        let broken = || counters.broken_reason().is_some();
        assert!(testkit::eventually(Duration::from_secs(5), broken));
        let reason = counters.broken_reason().unwrap();
        assert!(reason.contains("call eventfd"), "{reason}");
        let c = counters.snapshot();
        assert!(c.host_pushback > 0 && c.packets < FRAMES as u64, "{c:?}");
        // The host drains: its fd is writable from now on.
        let mut buf = vec![0u8; 1 << 16];
        while rd.read(&mut buf).is_ok_and(|n| n > 0) {}
        std::thread::sleep(Duration::from_millis(50));
        let ticks = testkit::inproc::thread_cpu_ticks(name);
        std::thread::sleep(Duration::from_millis(300));
        let spun = testkit::inproc::thread_cpu_ticks(name) - ticks;
        assert!(spun <= 3, "the worker spun on a broken tx ({spun} ticks)");
        // The frontend stops the queue: answered at once, the frames it never used left on
        // the ring for it (GET_VRING_BASE's index is past only those it used).
        let started = Instant::now();
        let next = worker.stop(QueueId::Tx(0)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            next,
            Some(vring::RingPosition::split(counters.packets.get() as u16))
        );
        drop(worker);
    }

    /// A host fd in error for good (here a pipe whose reader is gone, as a deleted TAP reports
    /// EPOLLERR and never EPOLLOUT again) while tx waits for it.
    #[test]
    fn a_host_fd_in_error_neither_spins_the_worker_nor_keeps_tx_for_good() {
        const FRAMES: u32 = 64;
        let (rd, wr) = pipe();
        let shared = Arc::new(shared());
        let s = setup_sized(QueueId::Tx(0), Features::VERSION_1, 256);
        let (mut driver, mem, counters) = (s.driver, s.mem, s.runtime.counters().clone());
        for i in 0..FRAMES {
            let addr = testkit::Pair::buf(i as u64, 2000);
            mem.write(addr.addr, &[0u8; vnet::HDR_LEN]).unwrap();
            driver.add(&[addr], &[], i).unwrap();
        }
        let name = "t-host-err";
        let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let worker = on_worker(name, wake, PipePort::new(wr, false), shared);
        worker.start(s.runtime);
        assert!(testkit::eventually(Duration::from_secs(5), || {
            counters.host_pushback.get() > 0
        }));
        drop(rd);
        std::thread::sleep(Duration::from_millis(50));
        let ticks = testkit::inproc::thread_cpu_ticks(name);
        std::thread::sleep(Duration::from_millis(300));
        let spun = testkit::inproc::thread_cpu_ticks(name) - ticks;
        let c = counters.snapshot();
        assert!(
            spun <= 3,
            "the worker spun on a host fd in error ({spun} ticks)"
        );
        assert_eq!(
            c.packets, FRAMES as u64,
            "tx frames kept on the ring for good"
        );
        assert_eq!(c.host_errors, 1, "the port's error counted once");
        drop(worker);
    }
}
