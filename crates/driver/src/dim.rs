//! Dynamic interrupt moderation for rx queues, modelled on Linux's lib/dim (net_dim), as
//! virtio_net uses it with VQ_NOTF_COAL (Linux's interrupt-driven control queue, 2024).
//!
//! Per rx queue, the data path hands [`Dim`] a sample (time, packets, bytes, interrupts) each
//! time a NAPI round completes. Once [`DIM_EVENTS`] interrupts have passed since the start of
//! a measurement, the rates per millisecond are compared with the previous measurement and
//! the coalescing profile moves one step (more or less coalescing) in the direction that
//! improved throughput, turning back when it stops improving, and parking when it has found
//! the top or is "tired" of stepping. A new profile is applied with a VQ_NOTF_COAL SET sent
//! asynchronously through the control queue ([`RxDim`]); no new measurement starts until the
//! device has answered.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::counters::QueueCounters;
use super::ctrl::{CtrlMode, CtrlQueue, Pending};
use vnet::ctrl::{Coalesce, Command};

/// Interrupts between two decisions.
pub const DIM_EVENTS: u64 = 64;

/// The rx coalescing profiles, from none to the most: (max_packets, max_usecs). Packet counts
/// stay well under a 256-entry ring, so that coalescing never leaves the device without
/// buffers.
pub const RX_PROFILES: [Coalesce; 5] = [
    Coalesce {
        max_packets: 1,
        max_usecs: 0,
    },
    Coalesce {
        max_packets: 8,
        max_usecs: 8,
    },
    Coalesce {
        max_packets: 16,
        max_usecs: 32,
    },
    Coalesce {
        max_packets: 32,
        max_usecs: 64,
    },
    Coalesce {
        max_packets: 64,
        max_usecs: 128,
    },
];

/// The profile a queue starts with.
pub const DEFAULT_PROFILE: usize = 1;

/// Cumulative counters of one queue at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DimSample {
    pub time_us: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Interrupts.
    pub events: u64,
}

/// Rates over one measurement, per millisecond.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Rates {
    ppms: u64,
    bpms: u64,
    epms: u64,
}

impl Rates {
    fn between(start: &DimSample, end: &DimSample) -> Option<Rates> {
        let us = end.time_us.checked_sub(start.time_us).filter(|&d| d > 0)?;
        let per_ms = |n: u64| (n.wrapping_mul(1000)).div_ceil(us);
        Some(Rates {
            ppms: per_ms(end.packets.wrapping_sub(start.packets)),
            bpms: per_ms(end.bytes.wrapping_sub(start.bytes)),
            epms: per_ms(end.events.wrapping_sub(start.events)),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Better,
    Same,
    Worse,
}

/// More than 10% apart.
fn differs(now: u64, before: u64) -> bool {
    before != 0 && now.abs_diff(before) * 100 / before > 10
}

/// Throughput in bytes decides first, then packets; at equal throughput fewer interrupts is
/// better.
fn compare(now: &Rates, before: &Rates) -> Verdict {
    let higher_is_better = |n: u64, b: u64| -> Option<Verdict> {
        if b == 0 {
            return Some(if n > 0 {
                Verdict::Better
            } else {
                Verdict::Same
            });
        }
        differs(n, b).then_some(if n > b {
            Verdict::Better
        } else {
            Verdict::Worse
        })
    };
    if let Some(v) = higher_is_better(now.bpms, before.bpms) {
        return v;
    }
    if let Some(v) = higher_is_better(now.ppms, before.ppms) {
        return v;
    }
    if before.epms != 0 && differs(now.epms, before.epms) {
        return if now.epms < before.epms {
            Verdict::Better
        } else {
            Verdict::Worse
        };
    }
    Verdict::Same
}

/// Where the search is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Tune {
    /// Found the best profile; stay while the rates hold.
    ParkingOnTop,
    /// Stepped too often without settling; rest a while.
    ParkingTired,
    /// Towards more coalescing.
    GoingRight,
    /// Towards less.
    GoingLeft,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    StartMeasure,
    Measuring(DimSample),
    /// A new profile was chosen and is being applied; measuring resumes after `applied`.
    Applying,
}

/// The per-queue DIM state machine.
#[derive(Clone, Debug)]
pub struct Dim {
    phase: Phase,
    tune: Tune,
    profile: usize,
    profiles: usize,
    steps_left: u32,
    steps_right: u32,
    tired: u32,
    prev: Rates,
}

enum Step {
    Stepped,
    OnEdge,
    TooTired,
}

impl Dim {
    /// A state machine over `profiles` profiles (at least 2), starting at `start`.
    pub fn new(profiles: usize, start: usize) -> Dim {
        let profiles = profiles.max(2);
        Dim {
            phase: Phase::StartMeasure,
            tune: Tune::ParkingOnTop,
            profile: start.min(profiles - 1),
            profiles,
            steps_left: 0,
            steps_right: 0,
            tired: 0,
            prev: Rates::default(),
        }
    }

    pub fn profile(&self) -> usize {
        self.profile
    }
    pub fn tune(&self) -> Tune {
        self.tune
    }
    /// Whether a new profile is waiting to be applied.
    pub fn applying(&self) -> bool {
        self.phase == Phase::Applying
    }

    /// Feeds a sample. Returns the new profile when one should be applied; the caller then
    /// applies it and calls [`Dim::applied`].
    pub fn update(&mut self, sample: DimSample) -> Option<usize> {
        match self.phase {
            Phase::Applying => None,
            Phase::StartMeasure => {
                self.phase = Phase::Measuring(sample);
                None
            }
            Phase::Measuring(start) => {
                if sample.events.wrapping_sub(start.events) < DIM_EVENTS {
                    return None;
                }
                let rates = Rates::between(&start, &sample)?;
                if self.decide(rates) {
                    self.phase = Phase::Applying;
                    Some(self.profile)
                } else {
                    self.phase = Phase::Measuring(sample);
                    None
                }
            }
        }
    }

    /// The chosen profile has been applied (or given up on): start measuring again.
    pub fn applied(&mut self) {
        if self.phase == Phase::Applying {
            self.phase = Phase::StartMeasure;
        }
    }

    /// One decision; returns whether the profile changed.
    fn decide(&mut self, now: Rates) -> bool {
        let (tune_before, profile_before) = (self.tune, self.profile);
        match self.tune {
            Tune::ParkingOnTop => {
                if compare(&now, &self.prev) != Verdict::Same {
                    self.leave_parking();
                }
            }
            Tune::ParkingTired => {
                self.tired = self.tired.saturating_sub(1);
                if self.tired == 0 {
                    self.leave_parking();
                }
            }
            Tune::GoingRight | Tune::GoingLeft => {
                if compare(&now, &self.prev) != Verdict::Better {
                    self.turn();
                }
                if self.on_top() {
                    self.park_on_top();
                } else {
                    match self.step() {
                        Step::Stepped => {}
                        Step::OnEdge => self.park_on_top(),
                        Step::TooTired => self.park_tired(),
                    }
                }
            }
        }
        // While parked on top the reference stays the rates that put us there.
        if tune_before != Tune::ParkingOnTop || self.tune != Tune::ParkingOnTop {
            self.prev = now;
        }
        self.profile != profile_before
    }

    fn step(&mut self) -> Step {
        if self.tired as usize == 2 * self.profiles {
            return Step::TooTired;
        }
        match self.tune {
            Tune::ParkingOnTop | Tune::ParkingTired => {}
            Tune::GoingRight => {
                if self.profile == self.profiles - 1 {
                    return Step::OnEdge;
                }
                self.profile += 1;
                self.steps_right += 1;
            }
            Tune::GoingLeft => {
                if self.profile == 0 {
                    return Step::OnEdge;
                }
                self.profile -= 1;
                self.steps_left += 1;
            }
        }
        self.tired += 1;
        Step::Stepped
    }

    fn leave_parking(&mut self) {
        self.tune = if self.profile > 0 {
            Tune::GoingLeft
        } else {
            Tune::GoingRight
        };
        self.step();
    }

    /// Having just turned back after several steps one way and one step the other, we are
    /// at the top.
    fn on_top(&self) -> bool {
        match self.tune {
            Tune::ParkingOnTop | Tune::ParkingTired => true,
            Tune::GoingRight => self.steps_left > 1 && self.steps_right == 1,
            Tune::GoingLeft => self.steps_right > 1 && self.steps_left == 1,
        }
    }

    fn turn(&mut self) {
        match self.tune {
            Tune::GoingRight => {
                self.tune = Tune::GoingLeft;
                self.steps_left = 0;
            }
            Tune::GoingLeft => {
                self.tune = Tune::GoingRight;
                self.steps_right = 0;
            }
            Tune::ParkingOnTop | Tune::ParkingTired => {}
        }
    }

    fn park_on_top(&mut self) {
        self.steps_left = 0;
        self.steps_right = 0;
        self.tired = 0;
        self.tune = Tune::ParkingOnTop;
    }

    fn park_tired(&mut self) {
        self.steps_left = 0;
        self.steps_right = 0;
        self.tune = Tune::ParkingTired;
    }
}

vnet::counters! {
    /// Counters of one queue's DIM, readable from any thread.
    pub struct DimCounters / DimSnapshot {
        /// Profile changes decided, commands that succeeded, commands that failed.
        decisions,
        applied,
        failed,
        /// The profile in force on the device (a gauge).
        profile,
    }
}

/// How DIM's commands reach the device.
#[derive(Clone, Debug)]
pub enum DimDispatch {
    /// Submitted asynchronously from the rx path; the answer is collected at a later NAPI
    /// completion. Many queues' commands are in flight at once.
    Irq(Arc<CtrlQueue>),
    /// Handed to a worker thread that runs them one at a time through the polling control
    /// queue, as Linux's DIM work did before its control queue took interrupts.
    Poll(Arc<DimWorker>),
}

impl DimDispatch {
    /// The dispatch that suits `ctrl`'s mode.
    pub fn for_queue(ctrl: &Arc<CtrlQueue>) -> DimDispatch {
        match ctrl.mode() {
            CtrlMode::Irq => DimDispatch::Irq(ctrl.clone()),
            CtrlMode::Poll => DimDispatch::Poll(Arc::new(DimWorker::spawn(ctrl.clone()))),
        }
    }

    /// CPU time of the polling-mode worker thread (0 in interrupt mode: no thread).
    pub fn worker_cpu_ns(&self) -> u64 {
        match self {
            DimDispatch::Irq(_) => 0,
            DimDispatch::Poll(w) => w.cpu_ns(),
        }
    }

    fn send(&self, cmd: Command) -> Result<Ticket, String> {
        match self {
            DimDispatch::Irq(ctrl) => ctrl.submit(cmd).map(Ticket::Irq).map_err(|e| e.to_string()),
            DimDispatch::Poll(worker) => worker.send(cmd).map(Ticket::Poll),
        }
    }
}

/// An outstanding DIM command.
#[derive(Debug)]
enum Ticket {
    Irq(Pending),
    Poll(Arc<AtomicU8>),
}

const TICKET_PENDING: u8 = 0;
const TICKET_OK: u8 = 1;
const TICKET_FAILED: u8 = 2;

impl Ticket {
    /// None while in flight; then whether it succeeded.
    fn outcome(&self) -> Option<bool> {
        match self {
            Ticket::Irq(p) => p.try_result().map(|r| r.is_ok()),
            Ticket::Poll(state) => match state.load(Relaxed) {
                TICKET_PENDING => None,
                s => Some(s == TICKET_OK),
            },
        }
    }
}

/// A command for the polling-mode worker, and where its outcome goes.
type WorkItem = (Command, Arc<AtomicU8>);

/// The thread that runs DIM's commands in polling mode.
#[derive(Debug)]
pub struct DimWorker {
    tx: std::sync::Mutex<Option<mpsc::Sender<WorkItem>>>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
    cpu_ns: Arc<AtomicU64>,
}

impl DimWorker {
    pub fn spawn(ctrl: Arc<CtrlQueue>) -> DimWorker {
        let (tx, rx) = mpsc::channel::<WorkItem>();
        let cpu_ns = Arc::new(AtomicU64::new(0));
        let cpu = cpu_ns.clone();
        let thread = std::thread::Builder::new()
            .name("virtnet-dim".into())
            .spawn(move || {
                for (cmd, state) in rx {
                    let ok = ctrl.execute(cmd).is_ok();
                    state.store(if ok { TICKET_OK } else { TICKET_FAILED }, Relaxed);
                    cpu.store(virtnet_sys::thread_cpu_ns(), Relaxed);
                }
            })
            .ok();
        DimWorker {
            tx: std::sync::Mutex::new(Some(tx)),
            thread: std::sync::Mutex::new(thread),
            cpu_ns,
        }
    }

    fn send(&self, cmd: Command) -> Result<Arc<AtomicU8>, String> {
        let state = Arc::new(AtomicU8::new(TICKET_PENDING));
        let tx = self
            .tx
            .lock()
            .map_err(|_| "dim worker poisoned".to_string())?;
        tx.as_ref()
            .ok_or("dim worker stopped")?
            .send((cmd, state.clone()))
            .map_err(|_| "dim worker stopped".to_string())?;
        Ok(state)
    }

    /// CPU time the worker has used, as of its last command.
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns.load(Relaxed)
    }
}

impl Drop for DimWorker {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// DIM attached to one rx queue: samples at NAPI completion, applies profiles to virtqueue
/// `vqn` with VQ_NOTF_COAL SET.
#[derive(Debug)]
pub struct RxDim {
    dim: Dim,
    vqn: u16,
    dispatch: DimDispatch,
    inflight: Option<Ticket>,
    origin: Instant,
    pub counters: Arc<DimCounters>,
}

impl RxDim {
    /// DIM for rx virtqueue `vqn`, which the device currently runs with `RX_PROFILES[start]`.
    pub fn new(vqn: u16, dispatch: DimDispatch, start: usize) -> RxDim {
        let dim = Dim::new(RX_PROFILES.len(), start);
        let counters = Arc::new(DimCounters::default());
        counters.profile.set(dim.profile() as u64);
        RxDim {
            dim,
            vqn,
            dispatch,
            inflight: None,
            origin: Instant::now(),
            counters,
        }
    }

    pub fn dim(&self) -> &Dim {
        &self.dim
    }

    /// Called by the rx path when a NAPI round ends with callbacks re-enabled.
    pub fn on_napi_complete(&mut self, q: &QueueCounters) {
        if let Some(t) = &self.inflight {
            let Some(ok) = t.outcome() else {
                return;
            };
            self.inflight = None;
            if ok {
                self.counters.applied.add(1);
                self.counters.profile.set(self.dim.profile() as u64);
            } else {
                self.counters.failed.add(1);
            }
            self.dim.applied();
        }
        let sample = DimSample {
            time_us: self.origin.elapsed().as_micros() as u64,
            packets: q.packets.get(),
            bytes: q.bytes.get(),
            events: q.interrupts.get(),
        };
        if let Some(ix) = self.dim.update(sample) {
            self.counters.decisions.add(1);
            let cmd = Command::VqNotfCoalSet {
                vqn: self.vqn,
                coal: RX_PROFILES[ix],
            };
            match self.dispatch.send(cmd) {
                Ok(t) => self.inflight = Some(t),
                Err(e) => {
                    tracing::warn!(vqn = self.vqn, error = %e, "DIM could not send its command");
                    self.counters.failed.add(1);
                    self.dim.applied();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds one measurement of `events` interrupts over `ms` milliseconds at `pps` packets
    /// per millisecond, 64-byte frames; returns the decision.
    fn feed(d: &mut Dim, clock: &mut DimSample, ms: u64, ppms: u64, events: u64) -> Option<usize> {
        clock.time_us += ms * 1000;
        clock.packets += ppms * ms;
        clock.bytes += ppms * ms * 64;
        clock.events += events;
        d.update(*clock)
    }

    /// Starts a measurement and completes it; applies any decision at once.
    fn round(d: &mut Dim, clock: &mut DimSample, ppms: u64, events: u64) -> Option<usize> {
        assert_eq!(d.update(*clock), None, "measurement start");
        let r = feed(d, clock, 10, ppms, events);
        if r.is_some() {
            d.applied();
        }
        r
    }

    #[test]
    fn no_decision_before_enough_events() {
        let mut d = Dim::new(5, 1);
        let mut c = DimSample::default();
        assert_eq!(d.update(c), None);
        assert_eq!(feed(&mut d, &mut c, 10, 100, DIM_EVENTS - 1), None);
        assert_eq!(d.tune(), Tune::ParkingOnTop);
        // The 64th interrupt completes the measurement: the first one always moves.
        assert_eq!(feed(&mut d, &mut c, 1, 100, 1), Some(0));
    }

    #[test]
    fn no_decision_without_elapsed_time() {
        let mut d = Dim::new(5, 1);
        let mut c = DimSample::default();
        d.update(c);
        c.events += 100;
        assert_eq!(d.update(c), None);
    }

    #[test]
    fn first_measurement_leaves_parking_towards_less_coalescing() {
        let mut d = Dim::new(5, 2);
        let mut c = DimSample::default();
        assert_eq!(round(&mut d, &mut c, 100, 64), Some(1));
        assert_eq!(d.tune(), Tune::GoingLeft);
        let mut d = Dim::new(5, 0);
        assert_eq!(round(&mut d, &mut c, 100, 64), Some(1));
        assert_eq!(d.tune(), Tune::GoingRight);
    }

    #[test]
    fn climbs_while_throughput_improves_then_parks_on_top() {
        let mut d = Dim::new(5, 0);
        let mut c = DimSample::default();
        // Each step right brings 20% more throughput: keep going right.
        let mut ppms = 1000;
        assert_eq!(round(&mut d, &mut c, ppms, 64), Some(1));
        for want in [2, 3] {
            ppms = ppms * 12 / 10;
            assert_eq!(round(&mut d, &mut c, ppms, 64), Some(want));
            assert_eq!(d.tune(), Tune::GoingRight);
        }
        let best = ppms;
        // Worse at 3: turn back to 2 ...
        assert_eq!(round(&mut d, &mut c, best * 8 / 10, 64), Some(2));
        assert_eq!(d.tune(), Tune::GoingLeft);
        // ... where it is better again: one step back after several forward is the top.
        assert_eq!(round(&mut d, &mut c, best, 64), None);
        assert_eq!((d.tune(), d.profile()), (Tune::ParkingOnTop, 2));
        // Parked: the same rates keep it there.
        for _ in 0..5 {
            assert_eq!(round(&mut d, &mut c, best, 64), None);
        }
        assert_eq!(d.tune(), Tune::ParkingOnTop);
        // A significant change in traffic wakes it up.
        assert_eq!(round(&mut d, &mut c, best * 3, 64), Some(1));
        assert_eq!(d.tune(), Tune::GoingLeft);
    }

    #[test]
    fn right_edge_parks() {
        let mut d = Dim::new(3, 0);
        let mut c = DimSample::default();
        let mut ppms = 100;
        assert_eq!(round(&mut d, &mut c, ppms, 64), Some(1));
        ppms *= 2;
        assert_eq!(round(&mut d, &mut c, ppms, 64), Some(2));
        ppms *= 2;
        // Still better, but there is no profile further right.
        assert_eq!(round(&mut d, &mut c, ppms, 64), None);
        assert_eq!((d.tune(), d.profile()), (Tune::ParkingOnTop, 2));
    }

    #[test]
    fn fewer_interrupts_at_equal_throughput_counts_as_better() {
        let now = Rates {
            ppms: 100,
            bpms: 6400,
            epms: 5,
        };
        let before = Rates { epms: 10, ..now };
        assert_eq!(compare(&now, &before), Verdict::Better);
        assert_eq!(compare(&before, &now), Verdict::Worse);
        assert_eq!(compare(&now, &now), Verdict::Same);
        // Within 10%: the same.
        let close = Rates { bpms: 6900, ..now };
        assert_eq!(compare(&close, &now), Verdict::Same);
        assert_eq!(compare(&now, &Rates::default()), Verdict::Better);
    }

    #[test]
    fn steady_traffic_oscillates_until_tired_then_rests() {
        let mut d = Dim::new(5, 2);
        let mut c = DimSample::default();
        // The first measurement is better than nothing: leave parking, to the left.
        assert_eq!(round(&mut d, &mut c, 1000, 64), Some(1));
        // Then nothing is better: it turns at every decision, stepping between 2 and 1,
        // each step tiring it, until 2 * 5 steps.
        for i in 0..9 {
            let want = if i % 2 == 0 { 2 } else { 1 };
            assert_eq!(round(&mut d, &mut c, 1000, 64), Some(want), "round {i}");
        }
        assert_eq!(round(&mut d, &mut c, 1000, 64), None);
        assert_eq!((d.tune(), d.profile()), (Tune::ParkingTired, 2));
        // It rests for as many decisions, then moves again.
        for _ in 0..9 {
            assert_eq!(round(&mut d, &mut c, 1000, 64), None);
            assert_eq!(d.tune(), Tune::ParkingTired);
        }
        assert_eq!(round(&mut d, &mut c, 1000, 64), Some(1));
        assert_eq!(d.tune(), Tune::GoingLeft);
    }

    #[test]
    fn applying_blocks_new_measurements_until_applied() {
        let mut d = Dim::new(5, 1);
        let mut c = DimSample::default();
        d.update(c);
        assert_eq!(feed(&mut d, &mut c, 10, 100, 64), Some(0));
        assert!(d.applying());
        assert_eq!(feed(&mut d, &mut c, 10, 500, 640), None);
        d.applied();
        assert!(!d.applying());
        assert_eq!(d.update(c), None, "a new measurement starts");
    }

    #[test]
    fn profiles_are_ordered_and_fit_a_ring() {
        for w in RX_PROFILES.windows(2) {
            assert!(w[0].max_packets < w[1].max_packets);
            assert!(w[0].max_usecs < w[1].max_usecs);
        }
        assert!(RX_PROFILES[0].is_off());
        assert!(RX_PROFILES.iter().all(|p| p.max_packets <= 64));
    }
}
