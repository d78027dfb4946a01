//! Experiment 7, busy polling across loads: the backend's busy polling off, fixed at 10, 50 or
//! 100 us, or auto, under five loads, to see where each setting pays and what it costs, and
//! whether auto keeps the gains of the best fixed timeout without the costs:
//!
//! - idle: our driver connected (its rx buffers posted), no traffic: the device's CPU;
//! - rr: request-response through echo io (`gen rr`, 64 B, one in flight, the driver sleeping
//!   on interrupts), as experiment 3: transactions/s, p50, p99;
//! - stream: `gen txonly`, 1500 B, into null io, the driver sleeping on interrupts: Gbit/s;
//! - contended: two backends whose workers are pinned to one CPU, two rr loads at once, as
//!   experiment 3b: aggregate transactions/s;
//! - bursty: rr in bursts, [`ON_OFF`] (2 ms of round trips, 8 ms of silence, `gen --on-off
//!   2:8`): transactions/s, p99.
//!
//! Device CPU, for every load: the CPU time of the threads that live through the run but the
//! measuring one, which are the device's (its workers, its vhost-user and control threads, the
//! peer-fd watchdog), read from /proc/self/task/*/schedstat to the nanosecond. The driver's
//! threads have exited by then and their time with them: this is experiment 3's "process CPU
//! minus the driver's threads", without its 10 ms clock ticks and the bench's own time. Per
//! frame, it is divided by the frames the device moved (tx and rx).

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use virtnet_driver::gen::{GenReport, Mode, OnOff};
use virtnet_driver::{DriverConfig, NetDriver};

use super::common::{gen_config, join_gen, run_gen_on, spawn_gen, spread, LocalBackend};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 7,
    name: "poll-loads",
    summary: "busy polling off, fixed 10/50/100 us and auto across loads: idle, rr, stream, contended, bursty",
    run,
};

pub const SETTINGS: [BusyPoll; 5] = [
    BusyPoll::Off,
    BusyPoll::Fixed(10),
    BusyPoll::Fixed(50),
    BusyPoll::Fixed(100),
    BusyPoll::Auto,
];

/// The bursty load's schedule.
pub const ON_OFF: OnOff = OnOff {
    on: Duration::from_millis(2),
    off: Duration::from_millis(8),
};
/// Stream frames, in bytes.
pub const STREAM_FRAME: usize = 1500;
/// The CPU the contended load's two workers share, and the one its two drivers share (with
/// two CPUs or more): as the seed pins each VM's vCPU away from the vhost threads' CPU.
pub const CONTENDED_CPU: usize = 0;
pub const CONTENDED_DRIVERS_CPU: usize = 1;
/// Fresh comparisons alternate auto and the other setting this many times per repeat, in
/// runs this many times shorter than the sweep's (a quarter of a second): more alternations
/// in the same time, so the machine's drift (its rates here move between levels every few
/// seconds, whichever setting runs) falls more often between two rounds than inside one, and
/// the median of the rounds' ratios has enough of them to resolve 5% (bursty's paired ratios
/// spread by about 13% a round on AMD EPYC family 26: the median of 24 has a standard error
/// of about 3%, of 6 about 7%).
pub const FRESH_ROUNDS_PER_REPEAT: u32 = 8;

/// A kind of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    Idle,
    Rr,
    Stream,
    Contended,
    Bursty,
}

pub const LOADS: [Load; 5] = [
    Load::Idle,
    Load::Rr,
    Load::Stream,
    Load::Contended,
    Load::Bursty,
];

impl Load {
    /// The figure the load is judged by, and whether more of it is better.
    pub fn main_figure(self) -> (&'static str, bool) {
        match self {
            Load::Idle => ("device_cpu_pct", false),
            Load::Rr | Load::Bursty => ("transactions_per_s", true),
            Load::Stream => ("gbps", true),
            Load::Contended => ("aggregate_transactions_per_s", true),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Load::Idle => "idle (device CPU %)",
            Load::Rr => "rr (transactions/s)",
            Load::Stream => "stream (Gbit/s)",
            Load::Contended => "contended (aggregate transactions/s)",
            Load::Bursty => "bursty 2/8 ms (transactions/s)",
        }
    }

    fn precision(self) -> usize {
        match self {
            Load::Idle => 3,
            Load::Stream => 2,
            _ => 0,
        }
    }

    /// Whether the load has round trips to time.
    fn has_latency(self) -> bool {
        matches!(self, Load::Rr | Load::Bursty)
    }
}

/// One run of one load at one setting.
#[derive(Debug, Default, Serialize)]
pub struct Run {
    /// The load's main figure ([`Load::main_figure`]).
    pub main: f64,
    /// Seconds of traffic (the generator's run; idle: the time measured).
    pub secs: f64,
    /// rr loads: answers received, requests that had none within the generator's loss
    /// timeout, and the answers' latency percentiles.
    pub transactions: u64,
    pub lost: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub tx_gbps: f64,
    /// Device CPU over the run (connection and drain included), in seconds and in percent of
    /// one CPU over the same wall time.
    pub device_cpu_s: f64,
    pub device_cpu_pct: f64,
    /// Frames the device moved (tx and rx), and its CPU per frame; none when it moved none.
    pub device_frames: u64,
    pub device_cpu_us_per_frame: Option<f64>,
    /// The device's busy polls (both queues, every backend of the load).
    pub busy_poll_entries: u64,
    pub busy_poll_hits: u64,
    pub busy_poll_timeouts: u64,
    /// Auto: idle turns slept through without polling, times polling stopped for
    /// contention, and the tx queue's last budget (us).
    pub busy_poll_skipped: u64,
    pub busy_poll_contended: u64,
    pub auto_budget_us: u32,
    /// The share of the machine's CPU time the hypervisor gave to others over the run
    /// (steal, from /proc/stat, over all CPUs), in percent; 0 where the kernel keeps none.
    /// On a shared VM every rate here follows it (docs/PERFORMANCE.md).
    pub steal_pct: f64,
}

#[derive(Debug, Serialize)]
pub struct SettingResult {
    #[serde(rename = "busy_poll_us")]
    pub busy_poll: BusyPoll,
    pub main: Summary,
    pub device_cpu_pct: Summary,
    pub device_cpu_us_per_frame: Option<Summary>,
    pub p50_us: Option<Summary>,
    pub p99_us: Option<Summary>,
    pub steal_pct: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct LoadResult {
    pub load: Load,
    /// What `main` is in this load's runs, and whether more is better (idle: device CPU,
    /// less is better).
    pub main_figure: &'static str,
    pub higher_is_better: bool,
    pub settings: Vec<SettingResult>,
    /// The fixed timeout with the best main figure (medians), and auto's main figure divided
    /// by that one's and by off's (none when that is 0). Above 1 is better for a figure where
    /// more is better, worse for idle's CPU.
    #[serde(rename = "best_fixed_us")]
    pub best_fixed: BusyPoll,
    pub auto_over_best_fixed: Option<f64>,
    pub auto_over_off: Option<f64>,
    /// Auto's main figure over the best fixed timeout's in each repeat (the two ran in the
    /// same repeat, minutes apart at most): the machine's drift between repeats cancels.
    pub auto_over_best_fixed_per_repeat: Option<Summary>,
    /// Auto against the best fixed timeout (and, contended, against off) on fresh runs.
    pub fresh: Vec<Fresh>,
}

/// Auto held against one setting on runs of their own, after the sweep chose that setting:
/// A/B alternated, the order reversed each round (auto first, then it first), so that
/// neither always follows the other.
#[derive(Debug, Serialize)]
pub struct Fresh {
    #[serde(rename = "against_us")]
    pub against: BusyPoll,
    pub auto: Summary,
    pub other: Summary,
    /// Auto's median over the other's, and auto over the other round by round.
    pub ratio_of_medians: Option<f64>,
    pub per_round: Option<Summary>,
    pub auto_runs: Vec<f64>,
    pub other_runs: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub secs_per_run: f64,
    pub repeats: u32,
    /// The fresh comparisons' rounds and run length: [`FRESH_ROUNDS_PER_REPEAT`] times as many
    /// rounds as repeats, each run as much shorter, so they take the sweep's time per pair.
    pub fresh_rounds: u32,
    pub fresh_secs_per_run: f64,
    /// Drivers on CPU 0, workers on CPU 1 (idle, rr, stream, bursty); contended: the two
    /// workers on `contended_cpu`, the two drivers on `contended_drivers_cpu`.
    pub pinned: bool,
    pub contended_cpu: usize,
    pub contended_drivers_cpu: usize,
    pub on_off: OnOff,
    pub loads: Vec<LoadResult>,
}

/// CPU time of each live thread of the process, by thread id, in nanoseconds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct ThreadTimes(HashMap<u64, u64>);

impl ThreadTimes {
    /// Every thread but the calling one, whose time goes on reading the others' (and on
    /// starting and joining the run's threads).
    fn now() -> ThreadTimes {
        let me = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok());
        let mut times = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                let tid = t.file_name().to_str().and_then(|s| s.parse().ok());
                if tid == me {
                    continue;
                }
                if let (Some(tid), Some(ns)) = (tid, thread_cpu_ns(&t.path())) {
                    times.insert(tid, ns);
                }
            }
        }
        ThreadTimes(times)
    }

    /// Seconds of CPU that the threads alive now used since `earlier`; all of its time for a
    /// thread born since. A thread that has ended since counts for nothing.
    fn since(&self, earlier: &ThreadTimes) -> f64 {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, &ns)| ns.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        ns as f64 / 1e9
    }
}

/// One thread's CPU time from its /proc directory: schedstat's time on a CPU, or without
/// schedstats, stat's user and system clock ticks (of 10 ms).
fn thread_cpu_ns(dir: &Path) -> Option<u64> {
    let sched = std::fs::read_to_string(dir.join("schedstat")).ok();
    if let Some(ns) = sched.and_then(|s| s.split_whitespace().next()?.parse().ok()) {
        return Some(ns);
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((ticks(11)? + ticks(12)?) * 10_000_000)
}

/// The fixed timeout with the best of `main` (medians by setting), and auto's over it and
/// over off's; none for a ratio whose divisor is 0 or missing.
fn compare(
    main: &[(BusyPoll, f64)],
    higher_is_better: bool,
) -> (BusyPoll, Option<f64>, Option<f64>) {
    let of = |b: BusyPoll| main.iter().find(|(s, _)| *s == b).map(|&(_, m)| m);
    let better = |a: f64, b: f64| if higher_is_better { a > b } else { a < b };
    let best = main
        .iter()
        .filter(|(s, _)| matches!(s, BusyPoll::Fixed(_)))
        .fold(None, |best: Option<(BusyPoll, f64)>, &(s, m)| match best {
            Some((_, bm)) if !better(m, bm) => best,
            _ => Some((s, m)),
        });
    let ratio = |d: Option<f64>| match (of(BusyPoll::Auto), d) {
        (Some(a), Some(d)) if d != 0.0 => Some(a / d),
        _ => None,
    };
    let (best_fixed, best_main) = best.map_or((BusyPoll::Off, None), |(s, m)| (s, Some(m)));
    (best_fixed, ratio(best_main), ratio(of(BusyPoll::Off)))
}

fn backend(
    io: IoMode,
    busy_poll: BusyPoll,
    worker_cpu: Option<usize>,
) -> Result<LocalBackend, BenchError> {
    LocalBackend::start(
        "pollloads",
        BackendConfig {
            io,
            busy_poll,
            worker_cpu,
            ..Default::default()
        },
    )
}

/// Where a run's measurement starts: the threads' CPU times and the device counters.
struct Start {
    times: ThreadTimes,
    counts: Counts,
    steal: Option<Steal>,
    at: Instant,
}

impl Start {
    fn now(backends: &[LocalBackend]) -> Start {
        Start {
            times: ThreadTimes::now(),
            counts: Counts::of(backends),
            steal: Steal::now(),
            at: Instant::now(),
        }
    }
}

/// The steal time of all CPUs so far, in clock ticks (1/100 s), and how many CPUs there are.
#[derive(Clone, Copy, Debug)]
struct Steal {
    ticks: u64,
    cpus: u64,
}

impl Steal {
    fn now() -> Option<Steal> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let field = |l: &str| l.split_ascii_whitespace().nth(8)?.parse::<u64>().ok();
        let ticks = stat.lines().find(|l| l.starts_with("cpu "))?;
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count() as u64;
        Some(Steal {
            ticks: field(ticks)?,
            cpus: cpus.max(1),
        })
    }

    /// Percent of all CPUs' time over `wall` that was stolen since `self`.
    fn pct_since(&self, wall: Duration) -> Option<f64> {
        let now = Steal::now()?;
        let ticks = now.ticks.saturating_sub(self.ticks) as f64;
        Some(ticks / (wall.as_secs_f64().max(1e-9) * 100.0 * self.cpus as f64) * 100.0)
    }
}

/// The device counters a run reports, summed over the queues of its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    frames: u64,
    entries: u64,
    hits: u64,
    timeouts: u64,
    skipped: u64,
    contended: u64,
}

impl Counts {
    fn of(backends: &[LocalBackend]) -> Counts {
        let both = |f: fn(&virtnet_backend::metrics::CountersSnapshot) -> u64| -> u64 {
            backends
                .iter()
                .map(|b| b.counter("tx", f) + b.counter("rx", f))
                .sum()
        };
        Counts {
            frames: both(|c| c.packets),
            entries: both(|c| c.busy_poll_entries),
            hits: both(|c| c.busy_poll_hits),
            timeouts: both(|c| c.busy_poll_timeouts),
            skipped: both(|c| c.busy_poll_skipped),
            contended: both(|c| c.busy_poll_contended),
        }
    }
}

/// The device side of a run, once it is over: its CPU and counters since `start`.
fn device(run: &mut Run, backends: &[LocalBackend], start: &Start) {
    let wall = start.at.elapsed();
    run.device_cpu_s = ThreadTimes::now().since(&start.times);
    run.device_cpu_pct = run.device_cpu_s / wall.as_secs_f64().max(1e-9) * 100.0;
    let (now, before) = (Counts::of(backends), start.counts);
    run.device_frames = now.frames - before.frames;
    run.device_cpu_us_per_frame =
        (run.device_frames > 0).then(|| run.device_cpu_s * 1e6 / run.device_frames as f64);
    run.busy_poll_entries = now.entries - before.entries;
    run.busy_poll_hits = now.hits - before.hits;
    run.busy_poll_timeouts = now.timeouts - before.timeouts;
    run.busy_poll_skipped = now.skipped - before.skipped;
    run.busy_poll_contended = now.contended - before.contended;
    run.steal_pct = start.steal.and_then(|s| s.pct_since(wall)).unwrap_or(0.0);
    run.auto_budget_us = backends
        .first()
        .and_then(|b| b.device.reports().into_iter().find(|q| q.kind == "tx"))
        .map_or(0, |q| q.busy_poll_us);
}

/// What an rr generator report says of its transactions.
fn rr_figures(run: &mut Run, r: &GenReport) {
    run.secs = r.elapsed_s;
    run.transactions = r.per_pair.iter().map(|p| p.round_trips).sum();
    run.lost = r.per_pair.iter().map(|p| p.lost).sum();
    let lat = r.latency.unwrap_or_default();
    run.p50_us = lat.p50_us;
    run.p99_us = lat.p99_us;
    run.main = run.transactions as f64 / r.elapsed_s.max(1e-9);
}

fn idle(busy_poll: BusyPoll, secs: f64, pinned: bool) -> Result<Run, BenchError> {
    let b = backend(IoMode::Echo, busy_poll, pinned.then_some(1))?;
    let config = DriverConfig {
        connect_wait: Duration::from_secs(5),
        ..Default::default()
    };
    let driver = NetDriver::connect(&b.socket, &config).map_err(|e| BenchError::Engine {
        engine: "virtnet driver",
        reason: e.to_string(),
    })?;
    // The connection's own work (the worker starting the queues, its turn on the posted
    // buffers and the poll after it) is not idling: let it finish first.
    std::thread::sleep(Duration::from_millis(20));
    let backends = std::slice::from_ref(&b);
    let start = Start::now(backends);
    std::thread::sleep(Duration::from_secs_f64(secs));
    let mut run = Run {
        secs: start.at.elapsed().as_secs_f64(),
        ..Run::default()
    };
    device(&mut run, backends, &start);
    run.main = run.device_cpu_pct;
    drop(driver);
    Ok(run)
}

fn rr(
    busy_poll: BusyPoll,
    secs: f64,
    pinned: bool,
    on_off: Option<OnOff>,
) -> Result<Run, BenchError> {
    let b = backend(IoMode::Echo, busy_poll, pinned.then_some(1))?;
    let mut cfg = gen_config(&b.socket, Mode::Rr, secs);
    cfg.on_off = on_off;
    let backends = std::slice::from_ref(&b);
    let start = Start::now(backends);
    let r = run_gen_on(cfg, pinned.then_some(0))?;
    let mut run = Run::default();
    rr_figures(&mut run, &r);
    device(&mut run, backends, &start);
    Ok(run)
}

fn stream(busy_poll: BusyPoll, secs: f64, pinned: bool) -> Result<Run, BenchError> {
    let null = IoMode::Null { size: STREAM_FRAME };
    let b = backend(null, busy_poll, pinned.then_some(1))?;
    let mut cfg = gen_config(&b.socket, Mode::TxOnly, secs);
    cfg.size = STREAM_FRAME;
    let backends = std::slice::from_ref(&b);
    let start = Start::now(backends);
    let r = run_gen_on(cfg, pinned.then_some(0))?;
    let mut run = Run {
        secs: r.elapsed_s,
        tx_gbps: r.summary.tx_gbps,
        main: r.summary.tx_gbps,
        ..Run::default()
    };
    device(&mut run, backends, &start);
    Ok(run)
}

fn contended(busy_poll: BusyPoll, secs: f64, pinned: bool) -> Result<Run, BenchError> {
    let b = [
        backend(IoMode::Echo, busy_poll, Some(CONTENDED_CPU))?,
        backend(IoMode::Echo, busy_poll, Some(CONTENDED_CPU))?,
    ];
    let start = Start::now(&b);
    let loads: Vec<_> = b
        .iter()
        .map(|b| {
            let cfg = gen_config(&b.socket, Mode::Rr, secs);
            spawn_gen(cfg, pinned.then_some(CONTENDED_DRIVERS_CPU))
        })
        .collect();
    let mut run = Run::default();
    for l in loads {
        let r = join_gen(l)?;
        let mut one = Run::default();
        rr_figures(&mut one, &r);
        run.main += one.main;
        run.transactions += one.transactions;
        run.lost += one.lost;
        run.secs = run.secs.max(one.secs);
    }
    device(&mut run, &b, &start);
    Ok(run)
}

fn one(load: Load, busy_poll: BusyPoll, secs: f64, pinned: bool) -> Result<Run, BenchError> {
    match load {
        Load::Idle => idle(busy_poll, secs, pinned),
        Load::Rr => rr(busy_poll, secs, pinned, None),
        Load::Stream => stream(busy_poll, secs, pinned),
        Load::Contended => contended(busy_poll, secs, pinned),
        Load::Bursty => rr(busy_poll, secs, pinned, Some(ON_OFF)),
    }
}

fn summary(v: impl Iterator<Item = f64>) -> Summary {
    Summary::of(&v.collect::<Vec<_>>()).expect("runs")
}

fn setting_result(load: Load, busy_poll: BusyPoll, runs: Vec<Run>) -> SettingResult {
    let per_frame: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.device_cpu_us_per_frame)
        .collect();
    let latency = |f: fn(&Run) -> f64| load.has_latency().then(|| summary(runs.iter().map(f)));
    SettingResult {
        busy_poll,
        main: summary(runs.iter().map(|r| r.main)),
        device_cpu_pct: summary(runs.iter().map(|r| r.device_cpu_pct)),
        device_cpu_us_per_frame: Summary::of(&per_frame),
        p50_us: latency(|r| r.p50_us),
        p99_us: latency(|r| r.p99_us),
        steal_pct: summary(runs.iter().map(|r| r.steal_pct)),
        runs,
    }
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.15, 1) } else { (2.0, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut runs: Vec<Vec<Vec<Run>>> = LOADS
        .iter()
        .map(|_| SETTINGS.iter().map(|_| Vec::new()).collect())
        .collect();
    for rep in 1..=repeats {
        for (l, &load) in LOADS.iter().enumerate() {
            for s in rotated(SETTINGS.len(), rep as usize - 1) {
                let b = SETTINGS[s];
                progress(&format!("[{rep}/{repeats}] {:?}, busy poll {b}", load));
                runs[l][s].push(one(load, b, secs, pinned)?);
                // Let the previous backend's threads go before the next run's clock starts.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut loads: Vec<LoadResult> = LOADS
        .iter()
        .zip(runs)
        .map(|(&load, runs)| {
            let settings: Vec<SettingResult> = SETTINGS
                .iter()
                .zip(runs)
                .map(|(&b, runs)| setting_result(load, b, runs))
                .collect();
            let (main_figure, higher_is_better) = load.main_figure();
            let medians: Vec<(BusyPoll, f64)> = settings
                .iter()
                .map(|s| (s.busy_poll, s.main.median))
                .collect();
            let (best_fixed, auto_over_best_fixed, auto_over_off) =
                compare(&medians, higher_is_better);
            let runs_of = |b: BusyPoll| {
                let s = settings.iter().find(|s| s.busy_poll == b);
                s.map_or(&[][..], |s| &s.runs[..])
            };
            let auto_over_best_fixed_per_repeat =
                per_repeat(runs_of(BusyPoll::Auto), runs_of(best_fixed));
            LoadResult {
                load,
                main_figure,
                higher_is_better,
                settings,
                best_fixed,
                auto_over_best_fixed,
                auto_over_off,
                auto_over_best_fixed_per_repeat,
                fresh: Vec::new(),
            }
        })
        .collect();
    // The sweep's best fixed timeout is the best of three noisy medians, so on its own runs
    // it looks better than it is (the winner's curse): auto is held against it on new runs.
    let fresh_rounds = repeats * FRESH_ROUNDS_PER_REPEAT;
    let fresh_secs = secs / FRESH_ROUNDS_PER_REPEAT as f64;
    for l in &mut loads {
        let mut against = vec![l.best_fixed];
        if l.load == Load::Contended {
            against.push(BusyPoll::Off); // The target: never worse than off.
        }
        l.fresh = fresh(
            l.load,
            &against,
            fresh_rounds,
            fresh_secs,
            pinned,
            &mut *progress,
        )?;
    }
    Ok(Results {
        secs_per_run: secs,
        repeats,
        fresh_rounds,
        fresh_secs_per_run: fresh_secs,
        pinned,
        contended_cpu: CONTENDED_CPU,
        contended_drivers_cpu: CONTENDED_DRIVERS_CPU,
        on_off: ON_OFF,
        loads,
    })
}

/// The order of `n` settings in repeat `rep` (from 0): each repeat starts one later, so no
/// setting always runs after the same one, or first or last.
fn rotated(n: usize, rep: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + rep) % n)
}

/// Whether auto runs first in round `round` (from 0) of a fresh comparison: every other one.
fn auto_first(round: u32) -> bool {
    round.is_multiple_of(2)
}

/// `rounds` rounds of auto against each of `against`, one run of each a round.
fn fresh(
    load: Load,
    against: &[BusyPoll],
    rounds: u32,
    secs: f64,
    pinned: bool,
    progress: Progress<'_>,
) -> Result<Vec<Fresh>, BenchError> {
    let mut out = Vec::new();
    for &other in against {
        let (mut auto, mut them) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let order = if auto_first(round) {
                [BusyPoll::Auto, other]
            } else {
                [other, BusyPoll::Auto]
            };
            for b in order {
                progress(&format!(
                    "[fresh {}/{rounds}] {load:?}, auto against {other}: busy poll {b}",
                    round + 1
                ));
                let main = one(load, b, secs, pinned)?.main;
                if b == BusyPoll::Auto {
                    &mut auto
                } else {
                    &mut them
                }
                .push(main);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        out.push(fresh_result(other, auto, them));
    }
    Ok(out)
}

fn fresh_result(against: BusyPoll, auto: Vec<f64>, other: Vec<f64>) -> Fresh {
    let (a, o) = (
        summary(auto.iter().copied()),
        summary(other.iter().copied()),
    );
    Fresh {
        against,
        ratio_of_medians: (o.median != 0.0).then(|| a.median / o.median),
        per_round: paired_ratios(&auto, &other),
        auto: a,
        other: o,
        auto_runs: auto,
        other_runs: other,
    }
}

/// The ratios of `a`'s main figures over `b`'s, repeat by repeat; none without any.
fn per_repeat(a: &[Run], b: &[Run]) -> Option<Summary> {
    let main = |runs: &[Run]| runs.iter().map(|r| r.main).collect::<Vec<_>>();
    paired_ratios(&main(a), &main(b))
}

/// `a[i] / b[i]` for each pair whose `b` is not 0, summarised; none without any.
fn paired_ratios(a: &[f64], b: &[f64]) -> Option<Summary> {
    let ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, b)| **b != 0.0)
        .map(|(a, b)| a / b)
        .collect();
    Summary::of(&ratios)
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut header = vec!["load (main figure)".to_string()];
    header.extend(SETTINGS.iter().map(|b| match b {
        BusyPoll::Fixed(us) => format!("{us} us"),
        b => b.to_string(),
    }));
    header.extend(["best fixed", "auto/best fixed", "per repeat", "auto/off"].map(String::from));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "7. Busy polling across loads: each load's main figure (median) by setting",
        &header,
    );
    for l in &r.loads {
        let mut row = vec![l.load.label().to_string()];
        row.extend(
            l.settings
                .iter()
                .map(|s| format!("{:.*}", l.load.precision(), s.main.median)),
        );
        row.push(format!("{} us", l.best_fixed));
        row.push(ratio(l.auto_over_best_fixed));
        row.push(
            l.auto_over_best_fixed_per_repeat
                .map_or("-".into(), |s| s.display(2)),
        );
        row.push(ratio(l.auto_over_off));
        t.row(row);
    }
    t.note(format!(
        "{} of {:.2} s per cell. Ratios are of the main figure: above 1 is better, except for \
         idle's device CPU, where it is worse. Per repeat: auto over the best fixed timeout in \
         each repeat, median (min..max). Each repeat runs the settings in turn, starting one \
         later than the last.",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(if r.pinned {
        format!(
            "driver threads on CPU 0, backend worker on CPU 1; contended: both workers on CPU {}, \
             both drivers on CPU {}.",
            r.contended_cpu, r.contended_drivers_cpu
        )
    } else {
        "NOT pinned (fewer than 2 CPUs).".into()
    });
    let mut f = Table::new(
        "7. Auto on fresh runs, against the setting the sweep found best (and off, contended)",
        &[
            "load",
            "auto against",
            "auto",
            "that setting",
            "auto/that, medians",
            "per round",
            "target, this run",
        ],
    );
    for l in &r.loads {
        let auto_cpu = l
            .settings
            .iter()
            .find(|s| s.busy_poll == BusyPoll::Auto)
            .map(|s| s.device_cpu_pct.median);
        for c in &l.fresh {
            let prec = l.load.precision();
            f.row(vec![
                l.load.label().to_string(),
                match c.against {
                    BusyPoll::Fixed(us) => format!("{us} us"),
                    b => b.to_string(),
                },
                c.auto.display(prec),
                c.other.display(prec),
                ratio(c.ratio_of_medians),
                c.per_round.map_or("-".into(), |s| s.display(2)),
                verdict(l.load, c, auto_cpu).into(),
            ]);
        }
    }
    f.note(format!(
        "The sweep's best fixed timeout is the best of three noisy medians, which favours it on \
         its own runs; here each pair ran again, {} of one {:.2} s run each, auto first in \
         every other round. Targets, judged on the median of the per-round ratios (a round's two \
         runs see the same level of the machine; each side's median depends on how many of its \
         runs a slow stretch fell on): idle under 1% of a core (auto's device CPU in the sweep); \
         auto within 5% of the best fixed timeout (at least 0.95); contended, never worse than \
         off (at least 1.00).",
        match r.fresh_rounds {
            1 => "1 round".to_string(),
            n => format!("{n} rounds"),
        },
        r.fresh_secs_per_run
    ));
    let mut d = Table::new(
        "7. Busy polling across loads, every cell",
        &[
            "load",
            "busy poll us",
            "main figure",
            "p50 us",
            "p99 us",
            "device CPU %",
            "device CPU us/frame",
            "poll hits/entries",
            "auto skipped/contended",
            "steal %",
        ],
    );
    for l in &r.loads {
        for s in &l.settings {
            let total = |f: fn(&Run) -> u64| s.runs.iter().map(f).sum::<u64>();
            let opt = |v: &Option<Summary>, prec| v.map_or("-".into(), |v| v.display(prec));
            d.row(vec![
                format!("{:?}", l.load).to_lowercase(),
                s.busy_poll.to_string(),
                s.main.display(l.load.precision()),
                opt(&s.p50_us, 1),
                opt(&s.p99_us, 1),
                s.device_cpu_pct.display(2),
                opt(&s.device_cpu_us_per_frame, 2),
                format!(
                    "{}/{}",
                    total(|r| r.busy_poll_hits),
                    total(|r| r.busy_poll_entries)
                ),
                match s.busy_poll {
                    BusyPoll::Auto => format!(
                        "{}/{}",
                        total(|r| r.busy_poll_skipped),
                        total(|r| r.busy_poll_contended)
                    ),
                    _ => "-".into(),
                },
                s.steal_pct.display(0),
            ]);
        }
    }
    d.note(
        "device CPU: the threads living through the run (the device's), from schedstat, over the \
         run's wall time (connection and drain included); per frame: over the frames it moved, tx \
         and rx. Poll counts are summed over the runs. Steal: the share of all CPUs' time the \
         hypervisor gave to others during the runs; every rate here falls as it rises.",
    );
    d.note(format!(
        "bursty: rr for {} ms, then nothing for {} ms, over and over; its rate counts the silences.",
        r.on_off.on.as_millis(),
        r.on_off.off.as_millis()
    ));
    vec![t, f, d]
}

/// Whether a fresh comparison meets the target, in words. It goes by the median of
/// the rounds' paired ratios: the two runs of a round are back to back, so they see the same
/// level of the machine, where the medians of each side's runs depend on how many of them
/// the machine's slow stretches fell on (on a shared VM every load's rate moves between
/// levels every few seconds, whatever the setting; docs/PERFORMANCE.md).
fn verdict(load: Load, c: &Fresh, auto_cpu_pct: Option<f64>) -> &'static str {
    let met = |ok: bool, yes, no| if ok { yes } else { no };
    match (load, c.against, c.per_round.map(|s| s.median)) {
        (Load::Idle, ..) => met(
            auto_cpu_pct.is_some_and(|p| p < 1.0),
            "under 1% of a core: met",
            "1% of a core or more: NOT MET",
        ),
        (_, BusyPoll::Off, Some(r)) => met(
            r >= 1.0,
            "not worse than off: met",
            "worse than off: NOT MET",
        ),
        (_, _, Some(r)) => met(r >= 0.95, "within 5%: met", "not within 5%: NOT MET"),
        (_, _, None) => "-",
    }
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fixed_and_auto_ratios_follow_the_figure_direction() {
        let m = [
            (BusyPoll::Off, 100.0),
            (BusyPoll::Fixed(10), 120.0),
            (BusyPoll::Fixed(50), 150.0),
            (BusyPoll::Fixed(100), 140.0),
            (BusyPoll::Auto, 135.0),
        ];
        let (best, vs_best, vs_off) = compare(&m, true);
        assert_eq!(best, BusyPoll::Fixed(50));
        assert_eq!((vs_best, vs_off), (Some(0.9), Some(1.35)));
        // Less is better (idle CPU): the lowest fixed one; nothing to divide by 0.
        let idle = [
            (BusyPoll::Off, 0.0),
            (BusyPoll::Fixed(10), 0.5),
            (BusyPoll::Fixed(50), 0.25),
            (BusyPoll::Fixed(100), 1.0),
            (BusyPoll::Auto, 0.5),
        ];
        let (best, vs_best, vs_off) = compare(&idle, false);
        assert_eq!(best, BusyPoll::Fixed(50));
        assert_eq!((vs_best, vs_off), (Some(2.0), None));
    }

    #[test]
    fn per_repeat_ratios_pair_the_runs_of_one_repeat() {
        let runs = |v: &[f64]| -> Vec<Run> {
            v.iter()
                .map(|&main| Run {
                    main,
                    ..Run::default()
                })
                .collect()
        };
        // The machine ran twice as fast in the second repeat: paired, auto is 0.9 both times,
        // though its median (135) is above the fixed timeout's (100 and 200: 150).
        let s = per_repeat(&runs(&[90.0, 180.0]), &runs(&[100.0, 200.0])).unwrap();
        assert!((s.median - 0.9).abs() < 1e-9 && (s.max - 0.9).abs() < 1e-9);
        // A repeat whose divisor is 0 is left out; none left, no summary.
        let s = per_repeat(&runs(&[1.0, 3.0]), &runs(&[0.0, 2.0])).unwrap();
        assert_eq!((s.runs, s.median), (1, 1.5));
        assert!(per_repeat(&runs(&[1.0]), &runs(&[0.0])).is_none());
        assert!(per_repeat(&[], &runs(&[1.0])).is_none());
    }

    #[test]
    fn each_repeat_starts_one_setting_later_and_runs_them_all() {
        let orders: Vec<Vec<usize>> = (0..5).map(|rep| rotated(5, rep).collect()).collect();
        assert_eq!(orders[0], [0, 1, 2, 3, 4]);
        assert_eq!(orders[1], [1, 2, 3, 4, 0]);
        assert_eq!(orders[4], [4, 0, 1, 2, 3]);
        // Over five repeats each setting runs once in each position.
        for pos in 0..5 {
            let mut at: Vec<usize> = orders.iter().map(|o| o[pos]).collect();
            at.sort();
            assert_eq!(at, [0, 1, 2, 3, 4]);
        }
        assert!(auto_first(0) && !auto_first(1) && auto_first(2));
    }

    #[test]
    fn fresh_runs_give_both_ratios_and_the_verdict_follows_the_target() {
        // The machine slowed in the last round: the medians hide it, round by round auto
        // is 0.96 to 0.98.
        let c = fresh_result(
            BusyPoll::Fixed(50),
            vec![98.0, 96.0, 48.0],
            vec![100.0, 100.0, 50.0],
        );
        assert_eq!((c.auto.median, c.other.median), (96.0, 100.0));
        assert_eq!(c.ratio_of_medians, Some(0.96));
        let p = c.per_round.unwrap();
        assert!((p.median - 0.96).abs() < 1e-9 && (p.min - 0.96).abs() < 1e-9);
        assert!((p.max - 0.98).abs() < 1e-9);
        assert_eq!(verdict(Load::Rr, &c, None), "within 5%: met");
        let c = fresh_result(BusyPoll::Fixed(50), vec![94.0], vec![100.0]);
        assert_eq!(verdict(Load::Rr, &c, None), "not within 5%: NOT MET");
        // Against off, even 1% worse misses.
        let c = fresh_result(BusyPoll::Off, vec![99.0], vec![100.0]);
        assert_eq!(
            verdict(Load::Contended, &c, None),
            "worse than off: NOT MET"
        );
        // The machine's level moved between rounds: the medians compare runs at different
        // levels (0.1, or 9), the rounds do not, and the verdict goes by the rounds, either way.
        for (auto, other, medians, want) in [
            (
                [100.0, 10.0, 10.0],
                [100.0, 100.0, 10.0],
                0.1,
                "within 5%: met",
            ),
            (
                [90.0, 900.0, 900.0],
                [100.0, 1000.0, 100.0],
                9.0,
                "not within 5%: NOT MET",
            ),
        ] {
            let c = fresh_result(BusyPoll::Fixed(100), auto.to_vec(), other.to_vec());
            assert_eq!(c.ratio_of_medians, Some(medians));
            assert_eq!(verdict(Load::Contended, &c, None), want);
        }
        // Idle goes by auto's CPU, not by the ratio; a divisor of 0 gives no ratio.
        let c = fresh_result(BusyPoll::Fixed(10), vec![0.02], vec![0.0]);
        assert_eq!(c.ratio_of_medians, None);
        assert!(c.per_round.is_none());
        assert_eq!(
            verdict(Load::Idle, &c, Some(0.02)),
            "under 1% of a core: met"
        );
        assert_eq!(
            verdict(Load::Idle, &c, Some(3.0)),
            "1% of a core or more: NOT MET"
        );
        assert_eq!(verdict(Load::Rr, &c, None), "-");
    }

    #[test]
    fn thread_times_count_the_living_threads_since_the_first_look() {
        let times = |v: &[(u64, u64)]| ThreadTimes(v.iter().copied().collect());
        let before = times(&[(1, 1_000), (2, 5_000), (3, 9_000)]);
        // 1 ran 2 us more, 2 ended, 4 was born and ran 3 us.
        let after = times(&[(1, 3_000), (3, 9_000), (4, 3_000)]);
        assert!((after.since(&before) - 5e-6).abs() < 1e-12);
        // The other threads are found, the calling one is not.
        let other = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(20));
        let now = ThreadTimes::now();
        assert!(!now.0.is_empty());
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        let me: u64 = me.file_name().unwrap().to_str().unwrap().parse().unwrap();
        assert!(!now.0.contains_key(&me));
        other.join().unwrap();
    }
}
