//! Two-thread ping-pong: a driver thread adds chains (1 descriptor unless configured
//! otherwise), a device thread pops them and returns them used, the driver reclaims them. The
//! threads are pinned to two CPUs.
//!
//! Two ways of waiting:
//! - [`Mode::Poll`]: both sides spin, notifications disabled, with a used batch of 1..64. The
//!   driver asks for a kick decision once per burst of adds, as a polling driver would.
//! - [`Mode::Sleep`]: both sides sleep on eventfds (kick, call) when they run out of work, with
//!   event idx on or off. Done as Linux and vhost do it: notifications are disabled while
//!   working, and enabled, then the ring re-checked, before blocking. The driver asks for a kick
//!   decision after every add, like tools/virtio/virtio_test, so suppression shows in the counts.
//!   While it is finding work the device paces its looks at the ring with [`PollPace`], as the
//!   backend's worker does, whichever engine it drives.
//!
//! And two of virtio_test's switches: indirect descriptors (INDIRECT_DESC negotiated, so a chain
//! of more than one descriptor takes one ring descriptor), and delayed interrupts (a sleeping
//! driver re-arms with `enable_cb_delayed`, woken once 3/4 of what is in flight is used,
//! instead of `enable_cb`, woken at the next used entry).

use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde::Serialize;
use vring::{DriverQueue, Features, PollPace};

use super::{ChainBufs, ChainShape, DeviceCounts, RingDevice, RingMemory};
use crate::notify::Notifier;
use crate::{pin, BenchError};

/// How both sides wait for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// Busy polling on both sides, event idx negotiated, `used_batch` used entries per
    /// `used.idx` store.
    Poll { used_batch: u16 },
    /// Sleeping on eventfds when out of work.
    Sleep { event_idx: bool },
}

impl Mode {
    /// The features the ring negotiates in this mode.
    pub fn features(self) -> Features {
        match self {
            Mode::Poll { .. } | Mode::Sleep { event_idx: true } => Features::RING_EVENT_IDX,
            Mode::Sleep { event_idx: false } => Features::EMPTY,
        }
    }

    /// A short label for tables.
    pub fn label(self) -> String {
        match self {
            Mode::Poll { used_batch } => format!("poll, used batch {used_batch}"),
            Mode::Sleep { event_idx: true } => "sleep, event idx".into(),
            Mode::Sleep { event_idx: false } => "sleep, flags (no event idx)".into(),
        }
    }
}

/// One ping-pong run.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub mode: Mode,
    /// Chains to complete, at most.
    pub ops: u64,
    /// Stop adding chains once this long has passed (checked every 4096 chains), so a run on
    /// a loaded machine stays short; the run then reports the chains it completed.
    pub deadline: Option<Duration>,
    /// CPUs for the driver and device threads.
    pub driver_cpu: usize,
    pub device_cpu: usize,
    /// The chains the driver adds.
    pub shape: ChainShape,
    /// INDIRECT_DESC negotiated: a chain of more than one descriptor is added as an indirect
    /// table (virtio_test's default; `--no-indirect` turns it off).
    pub indirect: bool,
    /// A sleeping driver re-arms its interrupt with `enable_cb_delayed` rather than
    /// `enable_cb` (virtio_test's `--delayed-interrupt`).
    pub delayed_interrupts: bool,
    /// In [`Mode::Sleep`], how long a device that runs out of work polls the ring before it
    /// enables notifications and sleeps, as `virtnet backend --busy-poll` does (zero: at
    /// once, as vhost_net does by default).
    pub device_poll: Duration,
}

impl Config {
    /// 1-descriptor chains, no indirect, no delayed interrupts.
    pub fn new(mode: Mode, ops: u64) -> Config {
        Config {
            mode,
            ops,
            deadline: None,
            driver_cpu: 0,
            device_cpu: 1,
            shape: ChainShape::ONE,
            indirect: false,
            delayed_interrupts: false,
            device_poll: Duration::ZERO,
        }
    }

    /// The features the ring must negotiate for this run.
    pub fn features(&self) -> Features {
        if self.indirect {
            self.mode.features() | Features::RING_INDIRECT_DESC
        } else {
            self.mode.features()
        }
    }
}

/// The driver side's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DriverCounts {
    pub added: u64,
    /// Chains added as an indirect table.
    pub added_indirect: u64,
    /// The most chains in flight at once: at most the queue size over the ring descriptors
    /// a chain takes.
    pub max_in_flight: u16,
    pub used: u64,
    /// `kick_prepare` answered "kick".
    pub kicks: u64,
    pub kicks_suppressed: u64,
    /// Kick eventfd writes: must equal `kicks`.
    pub kick_writes: u64,
    /// Times the driver slept on the call eventfd, and those that found nothing to reclaim.
    pub sleeps: u64,
    pub spurious_wakeups: u64,
    /// `enable_cb` calls whose re-check found used entries (a sleep avoided).
    pub enable_rechecks_hit: u64,
}

/// The device side's counts, beyond the engine's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceSideCounts {
    #[serde(flatten)]
    pub engine: DeviceCounts,
    /// Descriptors of the popped chains (an indirect table's entries, not the one ring
    /// descriptor pointing at it).
    pub descriptors: u64,
    /// Call eventfd writes: must equal `engine.notifications`.
    pub call_writes: u64,
    /// Times the device slept on the kick eventfd, and those that found nothing to pop.
    pub sleeps: u64,
    pub spurious_wakeups: u64,
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Run {
    pub mode: Mode,
    pub shape: ChainShape,
    pub indirect: bool,
    pub delayed_interrupts: bool,
    /// [`Config::device_poll`], in microseconds.
    pub device_poll_us: u64,
    pub engine: &'static str,
    /// Chains completed.
    pub ops: u64,
    pub secs: f64,
    /// Whether both threads were pinned to their CPUs.
    pub pinned: bool,
    pub driver: DriverCounts,
    pub device: DeviceSideCounts,
}

impl Run {
    /// Millions of chains completed per second.
    pub fn mops(&self) -> f64 {
        self.ops as f64 / self.secs / 1e6
    }
    pub fn kicks_per_op(&self) -> f64 {
        self.driver.kicks as f64 / self.ops as f64
    }
    pub fn interrupts_per_op(&self) -> f64 {
        self.device.engine.notifications as f64 / self.ops as f64
    }
    pub fn used_idx_stores_per_op(&self) -> f64 {
        self.device.engine.used_idx_stores as f64 / self.ops as f64
    }

    /// Checks that the counts agree with each other; a run that fails this measured nothing.
    fn check(&self) -> Result<(), BenchError> {
        let d = &self.driver;
        let e = &self.device.engine;
        let ok = d.added == self.ops
            && d.used == self.ops
            && e.popped == self.ops
            && e.used == self.ops
            && self.device.descriptors == self.ops * self.shape.descriptors() as u64
            && d.kick_writes == d.kicks
            && self.device.call_writes == e.notifications;
        if ok {
            Ok(())
        } else {
            Err(BenchError::Inconsistent(format!("{self:?}")))
        }
    }
}

/// Runs `cfg` with our driver on `ring` and `device` on the device side.
pub fn run<D: RingDevice + Send>(
    ring: &RingMemory,
    mut device: D,
    cfg: &Config,
) -> Result<Run, BenchError> {
    if ring.config().features() != cfg.features() {
        return Err(BenchError::Inconsistent(format!(
            "the ring negotiated {:?}, the run needs {:?}",
            ring.config().features(),
            cfg.features()
        )));
    }
    let mut driver = ring.driver()?;
    if let Mode::Poll { used_batch } = cfg.mode {
        device.set_used_batch(used_batch);
    }
    let kick = Notifier::new("device")?;
    let call = Notifier::new("driver")?;
    let abort = AtomicBool::new(false);
    let finished = AtomicBool::new(false);
    let start = Barrier::new(2);
    let bufs = ChainBufs::new(cfg.shape);
    let sides = Sides {
        delayed_interrupts: cfg.delayed_interrupts,
        device_poll: cfg.device_poll,
        kick: &kick,
        call: &call,
        abort: &abort,
        finished: &finished,
        ops: cfg.ops,
        deadline: cfg.deadline,
    };

    std::thread::scope(|s| {
        let device_thread = s.spawn(|| {
            let pinned = pin::to_cpu(cfg.device_cpu);
            start.wait();
            let r = match cfg.mode {
                Mode::Poll { .. } => sides.device_poll(&mut device),
                Mode::Sleep { .. } => sides.device_sleep(&mut device),
            };
            if r.is_err() {
                abort.store(true, Relaxed);
            }
            r.map(|counts| (counts, pinned))
        });
        // The driver gets a thread of its own too: pinning must not stick to the caller.
        let driver_thread = s.spawn(|| {
            let pinned = pin::to_cpu(cfg.driver_cpu);
            start.wait();
            let t0 = Instant::now();
            let r = match cfg.mode {
                Mode::Poll { .. } => sides.driver_poll(&mut driver, &bufs),
                Mode::Sleep { .. } => sides.driver_sleep(&mut driver, &bufs),
            };
            let secs = t0.elapsed().as_secs_f64();
            // Tells a device still waiting for more work that there is none.
            finished.store(true, Relaxed);
            if r.is_err() {
                abort.store(true, Relaxed);
            }
            r.map(|counts| (counts, pinned, secs))
        });
        let drv = driver_thread
            .join()
            .map_err(|_| BenchError::Inconsistent("the driver thread panicked".into()))?;
        let dev = device_thread
            .join()
            .map_err(|_| BenchError::Inconsistent("the device thread panicked".into()))?;
        // Report the first real failure, not the other side's reaction to it.
        let ((drv_counts, pinned, secs), (dev_counts, dev_pinned)) = match (drv, dev) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(BenchError::PeerFailed), Err(e)) | (Err(e), _) | (_, Err(e)) => return Err(e),
        };
        let run = Run {
            mode: cfg.mode,
            shape: cfg.shape,
            indirect: cfg.indirect,
            delayed_interrupts: cfg.delayed_interrupts,
            device_poll_us: cfg.device_poll.as_micros() as u64,
            engine: D::NAME,
            ops: drv_counts.used,
            secs,
            pinned: pinned && dev_pinned,
            driver: drv_counts,
            device: dev_counts,
        };
        run.check()?;
        Ok(run)
    })
}

/// How many chains the driver adds: `ops`, or fewer once the deadline has passed.
struct Limit {
    ops: u64,
    deadline: Option<Instant>,
}

impl Limit {
    fn new(ops: u64, deadline: Option<Duration>) -> Limit {
        Limit {
            ops,
            deadline: deadline.map(|d| Instant::now() + d),
        }
    }

    /// After `sent` chains: past the deadline, add no more.
    #[inline]
    fn check(&mut self, sent: u64) {
        if sent.is_multiple_of(4096) && self.deadline.is_some_and(|d| Instant::now() >= d) {
            self.ops = sent;
        }
    }
}

/// What both threads share.
#[derive(Clone, Copy)]
struct Sides<'a> {
    kick: &'a Notifier,
    call: &'a Notifier,
    abort: &'a AtomicBool,
    /// Set by the driver when it has reclaimed its last chain.
    finished: &'a AtomicBool,
    ops: u64,
    deadline: Option<Duration>,
    /// The driver re-arms with `enable_cb_delayed`.
    delayed_interrupts: bool,
    device_poll: Duration,
}

impl Sides<'_> {
    fn driver_counts(driver: &DriverQueue<u32>, mut c: DriverCounts) -> DriverCounts {
        let s = driver.stats();
        c.added = s.added;
        c.added_indirect = s.added_indirect;
        c.used = s.used;
        c.kicks = s.kicks;
        c.kicks_suppressed = s.kicks_suppressed;
        c.enable_rechecks_hit = s.enable_rechecks_hit;
        c
    }

    /// Reclaims every used chain; returns how many.
    #[inline]
    fn reclaim(driver: &mut DriverQueue<u32>) -> Result<u64, BenchError> {
        let mut n = 0;
        while driver.get_used()?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    fn driver_poll(
        &self,
        driver: &mut DriverQueue<u32>,
        bufs: &ChainBufs,
    ) -> Result<DriverCounts, BenchError> {
        let mut c = DriverCounts::default();
        driver.disable_cb();
        let (mut sent, mut done) = (0u64, 0u64);
        let mut limit = Limit::new(self.ops, self.deadline);
        while done < limit.ops {
            let got = Self::reclaim(driver)?;
            done += got;
            while sent < limit.ops && bufs.add(driver, sent as u32)? {
                sent += 1;
                limit.check(sent);
            }
            c.max_in_flight = c.max_in_flight.max(driver.in_flight());
            // One kick decision per burst: the device polls, so it should say no.
            if driver.kick_prepare() {
                self.kick.notify()?;
                c.kick_writes += 1;
            }
            if got == 0 {
                if self.abort.load(Relaxed) {
                    return Err(BenchError::PeerFailed);
                }
                spin_loop();
            }
        }
        Ok(Self::driver_counts(driver, c))
    }

    fn driver_sleep(
        &self,
        driver: &mut DriverQueue<u32>,
        bufs: &ChainBufs,
    ) -> Result<DriverCounts, BenchError> {
        let mut c = DriverCounts::default();
        driver.disable_cb();
        let (mut sent, mut done) = (0u64, 0u64);
        let mut woke = false;
        let mut limit = Limit::new(self.ops, self.deadline);
        loop {
            let got = Self::reclaim(driver)?;
            done += got;
            if woke && got == 0 {
                c.spurious_wakeups += 1;
            }
            woke = false;
            let mut added = 0;
            while sent < limit.ops && bufs.add(driver, sent as u32)? {
                sent += 1;
                added += 1;
                limit.check(sent);
                if driver.kick_prepare() {
                    self.kick.notify()?;
                    c.kick_writes += 1;
                }
            }
            c.max_in_flight = c.max_in_flight.max(driver.in_flight());
            if done >= limit.ops {
                break;
            }
            if got + added > 0 {
                continue;
            }
            // Out of work: ask for a call, re-check, and only then sleep.
            let pending = if self.delayed_interrupts {
                driver.enable_cb_delayed()
            } else {
                driver.enable_cb()
            };
            if pending {
                driver.disable_cb();
                continue;
            }
            self.call.wait(self.abort, None)?;
            c.sleeps += 1;
            woke = true;
            driver.disable_cb();
        }
        Ok(Self::driver_counts(driver, c))
    }

    /// Asks the engine whether the driver wants a used-buffer notification, and sends it.
    #[inline]
    fn signal<D: RingDevice>(
        &self,
        device: &mut D,
        c: &mut DeviceSideCounts,
    ) -> Result<(), BenchError> {
        if device.needs_notification()? {
            self.call.notify()?;
            c.call_writes += 1;
        }
        Ok(())
    }

    /// Pops everything available and returns it used; returns how many chains. The driver is
    /// offered a notification after every published batch (an engine that batches its used
    /// publish), and at the end, before the device polls or sleeps again.
    #[inline]
    fn drain<D: RingDevice>(
        &self,
        device: &mut D,
        c: &mut DeviceSideCounts,
    ) -> Result<u64, BenchError> {
        let every = device.used_batch().unwrap_or(u16::MAX);
        let (mut n, mut since_signal) = (0, 0u16);
        while let Some(p) = device.pop()? {
            device.add_used(p.head, p.writable)?;
            c.descriptors += p.descriptors as u64;
            n += 1;
            since_signal += 1;
            if since_signal == every {
                self.signal(device, c)?;
                since_signal = 0;
            }
        }
        if since_signal > 0 {
            self.signal(device, c)?;
        }
        Ok(n)
    }

    fn device_poll<D: RingDevice>(&self, device: &mut D) -> Result<DeviceSideCounts, BenchError> {
        let mut c = DeviceSideCounts::default();
        device.disable_notification()?;
        let mut done = 0u64;
        while done < self.ops {
            // The driver polls too, so every notification decision should say no.
            let n = self.drain(device, &mut c)?;
            if n == 0 {
                if self.abort.load(Relaxed) {
                    return Err(BenchError::PeerFailed);
                }
                if self.finished.load(Relaxed) {
                    break;
                }
                spin_loop();
                continue;
            }
            done += n;
        }
        c.engine = device.counts();
        Ok(c)
    }

    /// Polls an empty ring for up to `device_poll`, notifications still off, draining what
    /// the driver makes available meanwhile: how many chains.
    fn poll_drain<D: RingDevice>(
        &self,
        device: &mut D,
        c: &mut DeviceSideCounts,
    ) -> Result<u64, BenchError> {
        if self.device_poll.is_zero() {
            return Ok(0);
        }
        let end = Instant::now() + self.device_poll;
        loop {
            for _ in 0..64 {
                let n = self.drain(device, c)?;
                if n > 0 {
                    return Ok(n);
                }
                spin_loop();
            }
            if Instant::now() >= end || self.finished.load(Relaxed) {
                return Ok(0);
            }
        }
    }

    fn device_sleep<D: RingDevice>(&self, device: &mut D) -> Result<DeviceSideCounts, BenchError> {
        let mut c = DeviceSideCounts::default();
        let mut done = 0u64;
        let mut woke = false;
        // The backend's worker paces its looks the same way (vring::pace).
        let mut pace = PollPace::new();
        loop {
            device.disable_notification()?;
            let n = self.drain(device, &mut c)?;
            done += n;
            if woke && n == 0 {
                c.spurious_wakeups += 1;
            }
            woke = false;
            if done >= self.ops {
                break;
            }
            if pace.found(n) {
                pace.wait();
                continue;
            }
            let n = self.poll_drain(device, &mut c)?;
            if n > 0 {
                done += n;
                continue;
            }
            // Out of work: ask for a kick, re-check, and only then sleep.
            if device.enable_notification()? {
                continue;
            }
            if !self.kick.wait(self.abort, Some(self.finished))? {
                break; // The driver stopped early (deadline) and has everything back.
            }
            c.sleeps += 1;
            woke = true;
        }
        c.engine = device.counts();
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::QUEUE_SIZE;

    fn run_mode(mode: Mode) -> Run {
        let ring = RingMemory::new(mode.features()).unwrap();
        let device = ring.vring_device().unwrap();
        run(&ring, device, &Config::new(mode, 20_000)).unwrap()
    }

    #[test]
    fn a_device_that_polls_before_sleeping_completes_with_consistent_counts() {
        let mode = Mode::Sleep { event_idx: false };
        let ring = RingMemory::new(mode.features()).unwrap();
        let device = ring.vring_device().unwrap();
        let mut cfg = Config::new(mode, 20_000);
        cfg.device_poll = Duration::from_micros(20);
        let r = run(&ring, device, &cfg).unwrap();
        r.check().unwrap();
        assert_eq!((r.ops, r.device_poll_us), (20_000, 20));
    }

    #[test]
    fn a_deadline_cuts_a_run_short_with_consistent_counts() {
        for mode in [
            Mode::Poll { used_batch: 64 },
            Mode::Sleep { event_idx: true },
        ] {
            let ring = RingMemory::new(mode.features()).unwrap();
            let device = ring.vring_device().unwrap();
            let mut cfg = Config::new(mode, u64::MAX / 2);
            cfg.deadline = Some(Duration::from_millis(20));
            let r = run(&ring, device, &cfg).unwrap();
            assert!(r.ops > 0 && r.ops.is_multiple_of(4096), "{r:?}");
        }
    }

    #[test]
    fn indirect_and_delayed_interrupts_complete_with_consistent_counts() {
        for event_idx in [false, true] {
            for indirect in [false, true] {
                for delayed_interrupts in [false, true] {
                    let mut cfg = Config::new(Mode::Sleep { event_idx }, 20_000);
                    cfg.shape = ChainShape::TWO;
                    cfg.indirect = indirect;
                    cfg.delayed_interrupts = delayed_interrupts;
                    let ring = RingMemory::new(cfg.features()).unwrap();
                    let r = run(&ring, ring.vring_device().unwrap(), &cfg).unwrap();
                    assert_eq!(r.device.descriptors, 40_000, "{cfg:?}");
                    // An indirect chain takes one ring descriptor, a direct one two.
                    if indirect {
                        assert_eq!(r.driver.added_indirect, 20_000, "{cfg:?}");
                    } else {
                        assert_eq!(r.driver.added_indirect, 0, "{cfg:?}");
                        assert!(r.driver.max_in_flight <= QUEUE_SIZE / 2, "{cfg:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_ring_without_the_run_features_is_refused() {
        let mut cfg = Config::new(Mode::Sleep { event_idx: true }, 10);
        cfg.indirect = true;
        let ring = RingMemory::new(Features::RING_EVENT_IDX).unwrap();
        let device = ring.vring_device().unwrap();
        assert!(matches!(
            run(&ring, device, &cfg),
            Err(BenchError::Inconsistent(_))
        ));
    }

    #[test]
    fn every_mode_completes_with_consistent_counts() {
        for mode in [
            Mode::Poll { used_batch: 1 },
            Mode::Poll { used_batch: 64 },
            Mode::Sleep { event_idx: true },
            Mode::Sleep { event_idx: false },
        ] {
            let r = run_mode(mode);
            assert_eq!(r.driver.used, 20_000, "{mode:?}");
            if let Mode::Poll { used_batch: 1 } = mode {
                assert_eq!(r.device.engine.used_idx_stores, 20_000);
            }
        }
    }
}
