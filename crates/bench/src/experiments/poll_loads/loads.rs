//! The five loads of experiment 7 and one run of each at one busy-polling setting: idle, rr,
//! stream, contended and bursty, each on its own in-process backend, with the figures the
//! generator reports and the device's side measured around it.

use std::time::Duration;

use serde::Serialize;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use virtnet_driver::gen::{GenReport, Mode, OnOff};
use virtnet_driver::{DriverConfig, NetDriver};

use super::device_side::{device, Start};
use super::{CONTENDED_CPU, CONTENDED_DRIVERS_CPU, ON_OFF, STREAM_FRAME};
use crate::experiments::common::{gen_config, join_gen, run_gen_on, spawn_gen, LocalBackend};
use crate::BenchError;

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

    pub(super) fn label(self) -> &'static str {
        match self {
            Load::Idle => "idle (device CPU %)",
            Load::Rr => "rr (transactions/s)",
            Load::Stream => "stream (Gbit/s)",
            Load::Contended => "contended (aggregate transactions/s)",
            Load::Bursty => "bursty 2/8 ms (transactions/s)",
        }
    }

    pub(super) fn precision(self) -> usize {
        match self {
            Load::Idle => 3,
            Load::Stream => 2,
            _ => 0,
        }
    }

    /// Whether the load has round trips to time.
    pub(super) fn has_latency(self) -> bool {
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

pub(super) fn one(
    load: Load,
    busy_poll: BusyPoll,
    secs: f64,
    pinned: bool,
) -> Result<Run, BenchError> {
    match load {
        Load::Idle => idle(busy_poll, secs, pinned),
        Load::Rr => rr(busy_poll, secs, pinned, None),
        Load::Stream => stream(busy_poll, secs, pinned),
        Load::Contended => contended(busy_poll, secs, pinned),
        Load::Bursty => rr(busy_poll, secs, pinned, Some(ON_OFF)),
    }
}
