//! The data path of one queue pair: a worker thread moving frames between the guest's rings
//! and a host port ([`Port`]), through the pair's tx path ([`TxPath`]) and rx path
//! ([`RxPath`]).
//!
//! The loop, per turn: tx up to the weight, rx up to the weight; after a turn that moved a
//! few frames, a pause of a few hundred nanoseconds at most before the next ([`PollPace`]:
//! looking again at once would take the ring's index lines from a driver that is still
//! adding). When both are idle: busy-poll (a fixed timeout, or as long as the auto policy of
//! [`super::poll`] decides, with the host side polled for rx from the same loop), then enable
//! notifications with a re-check, then sleep in epoll on the kicks, the host port's fd and the
//! command eventfd. Used entries are published in batches by the engine and always flushed
//! before polling or sleeping.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_sys::SchedStat;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::timerfd::TimerFd;
use vring::PollPace;

use super::error::Error;
use super::host::Port;
use super::poll::AutoPoll;
use super::poll::PollExit;
use super::queue::{break_queue, install_queue, retire_queue, FaultWatch, QueueId, QueueRuntime};
use super::rx::RxPath;
use super::shared::Shared;
use super::siblings::Sibling;
use super::thread::{wait_events, Command, Inbox};
use super::tx::TxPath;

mod busy_poll;

const EV_WAKE: u64 = 0;
const EV_RX_KICK: u64 = 1;
const EV_TX_KICK: u64 = 2;
const EV_HOST: u64 = 3;
const EV_TIMER: u64 = 4;

/// One queue pair's worker.
pub struct Worker {
    shared: Arc<Shared>,
    pair: u16,
    port: Box<dyn Port>,
    tx: TxPath,
    rx: RxPath,
    inbox: Inbox,
    epoll: Epoll,
    /// Fires when a call held back by coalescing is due.
    timer: TimerFd,
    /// What epoll watches the host port's fd for: readable while rx has buffers to receive
    /// into, writable while tx waits for the port to take frames again.
    host_armed: EventSet,
    /// The host port's fd reports EPOLLERR or EPOLLHUP for good (a deleted TAP, a pipe with no
    /// reader; level-triggered epoll would wake us at once, forever): it is no longer watched.
    /// A socket's pending error, which reading SO_ERROR clears, is not that.
    host_gone: bool,
    faults: FaultWatch,
    /// Busy polling auto's policy; when the pair last went idle (the gap it measures); the
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
            .field("pair", &self.pair)
            .field("tx", &self.tx)
            .field("rx", &self.rx)
            .finish_non_exhaustive()
    }
}

impl Worker {
    pub fn new(
        pair: u16,
        port: Box<dyn Port>,
        shared: Arc<Shared>,
        inbox: Inbox,
    ) -> std::io::Result<Self> {
        Ok(Worker {
            shared,
            pair,
            port,
            tx: TxPath::default(),
            rx: RxPath::default(),
            inbox,
            epoll: Epoll::new()?,
            timer: TimerFd::new()?,
            host_armed: EventSet::empty(),
            host_gone: false,
            faults: FaultWatch::default(),
            auto: AutoPoll::new(Instant::now()),
            idle_since: None,
            sibling: None,
            pace: PollPace::new(),
        })
    }

    /// Runs until shut down. Returns early, with the error, if the worker's own epoll set
    /// cannot be built: then no queue of this pair can run.
    pub fn run(&mut self) -> Result<(), Error> {
        let config = self.shared.config();
        if let Some(cpu) = config.worker_cpu {
            if let Err(e) = virtnet_sys::pin_thread(cpu) {
                tracing::warn!(cpu, error = %e, "cannot pin the worker");
            }
        }
        // Opened by this thread (the file is the opener's), before seccomp forbids opening.
        self.sibling = SchedStat::open()
            .ok()
            .map(|s| Sibling::join(config.worker_cpu, s, config.worker_board.as_deref()));
        if config.seccomp {
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
        let mut events = vec![EpollEvent::default(); 8];
        loop {
            if self.inbox.take_pending() && !self.handle_commands() {
                return Ok(());
            }
            self.fire_due_calls();
            // The gap ends when the turn starts, not after it: a hit's own work is no idle time.
            let turn_start = self.idle_since.map(|_| Instant::now());
            let tx = self.tx.turn(&mut *self.port);
            let active = self.active();
            let rx = self.rx.turn(&mut *self.port, &self.shared, active);
            self.faults
                .check(self.tx.queue().into_iter().chain(self.rx.queue()));
            let frames = tx.frames + rx.frames;
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
                    EV_RX_KICK => self
                        .rx
                        .queue()
                        .into_iter()
                        .for_each(QueueRuntime::take_kick),
                    EV_TX_KICK => self
                        .tx
                        .queue()
                        .into_iter()
                        .for_each(QueueRuntime::take_kick),
                    EV_TIMER => {
                        let _ = self.timer.wait();
                    }
                    EV_HOST
                        if ev
                            .event_set()
                            .intersects(EventSet::ERROR | EventSet::HANG_UP)
                            && self.port.fd().is_some_and(virtnet_sys::error_persists) =>
                    {
                        self.unwatch_host();
                    }
                    _ => {}
                }
            }
            self.disarm_notifications();
        }
    }

    fn queues(&mut self) -> impl Iterator<Item = &mut QueueRuntime> {
        [self.tx.queue_mut(), self.rx.queue_mut()]
            .into_iter()
            .flatten()
    }

    fn fire_due_calls(&mut self) {
        let now = Instant::now();
        self.queues().for_each(|q| q.fire_if_due(now));
    }

    fn next_call_deadline(&self) -> Option<Instant> {
        [self.tx.queue(), self.rx.queue()]
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

    /// Applies pending commands; returns false on shutdown.
    fn handle_commands(&mut self) -> bool {
        while let Some(cmd) = self.inbox.next() {
            match cmd {
                Command::Start(q) => {
                    // A port fd given up on is tried again with each queue start: a TAP queue
                    // detached meanwhile (its pair disabled) reported an error until attached.
                    self.host_gone = false;
                    let old = if matches!(q.id(), QueueId::Rx(_)) {
                        self.rx.start(install_queue(&self.epoll, *q, EV_RX_KICK))
                    } else {
                        self.tx.start(install_queue(&self.epoll, *q, EV_TX_KICK))
                    };
                    if let Some(old) = old {
                        retire_queue(&self.epoll, old);
                    }
                }
                Command::Stop { queue, reply } => {
                    let q = if matches!(queue, QueueId::Rx(_)) {
                        self.rx.stop()
                    } else {
                        self.tx.stop()
                    };
                    self.port.queue_stopped();
                    let _ = reply.send(q.map(|q| retire_queue(&self.epoll, q)));
                }
                Command::Shutdown => return false,
            }
        }
        true
    }

    /// Whether this pair carries traffic (MQ VQ_PAIRS_SET may have disabled it).
    fn active(&self) -> bool {
        self.shared.pair_active(self.pair)
    }

    /// Enables notifications on both queues (not on tx while it waits for the host: its
    /// kicks would tell nothing new); returns true if either re-check found work.
    fn arm_notifications(&mut self) -> bool {
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
            self.arm_host();
        }
        runnable
    }

    /// Watches the host port's fd in epoll for reading only while rx has buffers: a readable
    /// TAP with nowhere to put its frames must not wake us (level-triggered epoll would spin);
    /// the rx kick will. And for writing only while tx waits for the host.
    fn arm_host(&mut self) {
        let Some(fd) = self.port.fd().filter(|_| !self.host_gone) else {
            return;
        };
        let mut want = EventSet::empty();
        // With a frame already waiting for buffers, the fd has nothing to tell us.
        // Nor while the pair is not in use: its TAP queue is detached, and reports an error.
        if !self.rx.holds_frame() && self.rx_can_take() {
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
        let r = self.epoll.ctl(op, fd, EpollEvent::new(want, EV_HOST));
        match r {
            Ok(()) => self.host_armed = want,
            // Not watched: rx then runs on the guest's kicks and busy polling only.
            Err(e) => tracing::warn!(error = %e, "cannot watch the host port"),
        }
    }

    /// Stops watching the host port's fd, which reported an error: rx then runs on kicks and
    /// busy polling, and a tx frame waiting for the port is tried again (and dropped).
    #[cold]
    fn unwatch_host(&mut self) {
        tracing::warn!(
            pair = self.pair,
            "the host port's fd reports an error; no longer watched"
        );
        self.queues().for_each(|q| q.counters().host_errors.add(1));
        if let Some(fd) = self.port.fd() {
            let _ = self
                .epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default());
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
        self.tx.pending()
            || (self.tx.waits_port() && self.port.writable())
            || ((self.rx.holds_frame() || self.port.readable()) && self.rx_can_take())
    }

    fn disarm_notifications(&mut self) {
        self.queues().for_each(|q| q.disable_notification());
    }
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::Read;
    use std::os::fd::{AsFd, OwnedFd, RawFd};

    use vring::{Error as RingError, Features, Gather, GuestMemory, Segment};

    use super::*;
    use crate::host::Sent;
    use crate::poll::BusyPoll;
    use crate::testing::{setup_sized, shared};
    use crate::thread::WorkerHandle;

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

        fn recv(
            &mut self,
            _: &GuestMemory,
            _: &[Segment],
            _: &mut [u8],
        ) -> Result<std::io::Result<usize>, RingError> {
            Ok(Err(std::io::ErrorKind::WouldBlock.into()))
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
        let worker = WorkerHandle::spawn("t-poll-shutdown".into(), wake, move |inbox| {
            let port = PipePort::new(wr, false);
            Worker::new(0, Box::new(port), shared, inbox)
                .unwrap()
                .run()
                .unwrap();
        })
        .unwrap();
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
        let worker = WorkerHandle::spawn(name.into(), wake, move |inbox| {
            let port = PipePort::new(wr, uring);
            Worker::new(0, Box::new(port), shared, inbox)
                .unwrap()
                .run()
                .unwrap();
        })
        .unwrap();
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
        let worker = WorkerHandle::spawn(name.into(), wake, move |inbox| {
            let port = PipePort::new(wr, false);
            Worker::new(0, Box::new(port), shared, inbox)
                .unwrap()
                .run()
                .unwrap();
        })
        .unwrap();
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
        let worker = WorkerHandle::spawn(name.into(), wake, move |inbox| {
            let port = PipePort::new(wr, false);
            Worker::new(0, Box::new(port), shared, inbox)
                .unwrap()
                .run()
                .unwrap();
        })
        .unwrap();
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
