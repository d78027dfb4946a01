//! Experiment 3, busy polling (seed 000): our backend with echo io answers request-response
//! traffic from our driver (`gen rr`, 64 B, one transaction in flight, the driver sleeping on
//! interrupts as a guest kernel would). The backend busy-polls for a fixed timeout after each
//! turn before sleeping, or as long as its auto policy decides (the `auto` row). Also the
//! seed's contended case: two backends whose workers are pinned to one CPU, two rr loads at
//! once, aggregate rate.

use std::time::Duration;

use serde::Serialize;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use virtnet_driver::gen::{GenReport, Mode};

use super::common::{
    gen_config, join_gen, process_cpu_s, run_gen_on, spawn_gen, spread, LocalBackend,
    SeedComparison,
};
use super::poll_loads::{CONTENDED_CPU, CONTENDED_DRIVERS_CPU};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 3,
    name: "busy-poll",
    summary: "seed 000: backend busy-poll timeout sweep, request-response rate, latency, device CPU; contended case",
    run,
};

pub const SWEEP: [BusyPoll; 6] = [
    BusyPoll::Off,
    BusyPoll::Fixed(10),
    BusyPoll::Fixed(20),
    BusyPoll::Fixed(50),
    BusyPoll::Fixed(100),
    BusyPoll::Auto,
];
pub const CONTENDED: [BusyPoll; 4] = [
    BusyPoll::Off,
    BusyPoll::Fixed(20),
    BusyPoll::Fixed(50),
    BusyPoll::Auto,
];
/// Seed: TCP_RR +8..16% (1 session, 64 B: +10%) at 50 us; contended, 50 us: 13966.76+13987.31
/// -> 15103.98+15103.73 transactions/s.
pub const SEED_RR: (f64, f64) = (1.0, 1.10);
pub const SEED_CONTENDED: (f64, f64) = (27954.07, 30207.71);

#[derive(Debug, Serialize)]
pub struct RrRun {
    pub secs: f64,
    pub transactions: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Process CPU time minus the generator threads', per transaction: the device's share
    /// (its workers and the vhost-user thread), in microseconds.
    pub device_cpu_us_per_transaction: f64,
    pub busy_poll_hits: u64,
    pub device_kicks: u64,
    /// Requests whose answer never came within the generator's loss timeout.
    pub lost: u64,
    /// Auto only: the poll budget it chose last (tx queue), the idle turns it slept through
    /// without polling, and the times it stopped polling for contention.
    pub auto_budget_us: u32,
    pub busy_poll_skipped: u64,
    pub busy_poll_contended: u64,
}

#[derive(Debug, Serialize)]
pub struct SweepResult {
    /// A timeout in microseconds (0 off), or "auto".
    #[serde(rename = "busy_poll_us")]
    pub busy_poll: BusyPoll,
    pub transactions_per_s: Summary,
    pub p50_us: Summary,
    pub p99_us: Summary,
    pub device_cpu_us_per_transaction: Summary,
    pub runs: Vec<RrRun>,
}

#[derive(Debug, Serialize)]
pub struct ContendedResult {
    #[serde(rename = "busy_poll_us")]
    pub busy_poll: BusyPoll,
    pub aggregate_transactions_per_s: Summary,
    pub runs: Vec<[f64; 2]>,
    /// Auto: times the two workers stopped polling for contention, per run.
    pub busy_poll_contended: Vec<u64>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub secs_per_run: f64,
    pub repeats: u32,
    /// Sweep: driver threads pinned to CPU 0, the backend worker to CPU 1; contended: the two
    /// drivers on `contended_drivers_cpu`.
    pub pinned: bool,
    pub sweep: Vec<SweepResult>,
    pub contended_cpu: usize,
    pub contended_drivers_cpu: usize,
    pub contended: Vec<ContendedResult>,
    pub seed_rr: SeedComparison,
    pub seed_contended: SeedComparison,
}

fn backend(busy_poll: BusyPoll, worker_cpu: Option<usize>) -> Result<LocalBackend, BenchError> {
    LocalBackend::start(
        "busypoll",
        BackendConfig {
            io: IoMode::Echo,
            busy_poll,
            worker_cpu,
            ..Default::default()
        },
    )
}

fn transactions(r: &GenReport) -> u64 {
    (r.summary.rtt_per_s * r.elapsed_s).round() as u64
}

fn one(busy_poll: BusyPoll, secs: f64, pinned: bool) -> Result<RrRun, BenchError> {
    let b = backend(busy_poll, pinned.then_some(1))?;
    let cpu0 = process_cpu_s();
    let cfg = gen_config(&b.socket, Mode::Rr, secs);
    let r = run_gen_on(cfg, pinned.then_some(0))?;
    let cpu = process_cpu_s() - cpu0;
    let gen_cpu = r.cpu_pct / 100.0 * r.elapsed_s + r.ctrl_cpu_s;
    let n = transactions(&r);
    let lat = r.latency.unwrap_or_default();
    Ok(RrRun {
        secs: r.elapsed_s,
        transactions: n,
        p50_us: lat.p50_us,
        p99_us: lat.p99_us,
        device_cpu_us_per_transaction: (cpu - gen_cpu).max(0.0) * 1e6 / n.max(1) as f64,
        busy_poll_hits: b.counter("tx", |c| c.busy_poll_hits)
            + b.counter("rx", |c| c.busy_poll_hits),
        device_kicks: b.counter("tx", |c| c.kicks) + b.counter("rx", |c| c.kicks),
        lost: r.per_pair.iter().map(|p| p.lost).sum(),
        auto_budget_us: b
            .device
            .reports()
            .iter()
            .find(|q| q.kind == "tx")
            .map_or(0, |q| q.busy_poll_us),
        busy_poll_skipped: b.counter("tx", |c| c.busy_poll_skipped)
            + b.counter("rx", |c| c.busy_poll_skipped),
        busy_poll_contended: b.counter("tx", |c| c.busy_poll_contended)
            + b.counter("rx", |c| c.busy_poll_contended),
    })
}

/// Two backends' workers on `cpu`, their two drivers on `drivers` when named.
fn contended(
    busy_poll: BusyPoll,
    cpu: usize,
    drivers: Option<usize>,
    secs: f64,
) -> Result<([f64; 2], u64), BenchError> {
    let b = [
        backend(busy_poll, Some(cpu))?,
        backend(busy_poll, Some(cpu))?,
    ];
    let loads: Vec<_> = b
        .iter()
        .map(|b| {
            let cfg = gen_config(&b.socket, Mode::Rr, secs);
            spawn_gen(cfg, drivers)
        })
        .collect();
    let mut rates = [0.0; 2];
    for (i, l) in loads.into_iter().enumerate() {
        let r = join_gen(l)?;
        rates[i] = r.summary.rtt_per_s;
    }
    let stopped = b
        .iter()
        .map(|b| {
            b.counter("tx", |c| c.busy_poll_contended) + b.counter("rx", |c| c.busy_poll_contended)
        })
        .sum();
    Ok((rates, stopped))
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.15, 1) } else { (0.8, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let (cpu, drivers_cpu) = (CONTENDED_CPU, CONTENDED_DRIVERS_CPU);
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut sweep: Vec<Vec<RrRun>> = SWEEP.iter().map(|_| Vec::new()).collect();
    let mut cont: Vec<Vec<([f64; 2], u64)>> = CONTENDED.iter().map(|_| Vec::new()).collect();
    for rep in 1..=repeats {
        for (i, &b) in SWEEP.iter().enumerate() {
            progress(&format!("[{rep}/{repeats}] rr, busy poll {b}"));
            sweep[i].push(one(b, secs, pinned)?);
        }
        for (i, &b) in CONTENDED.iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] contended rr, two devices on CPU {cpu}, busy poll {b}"
            ));
            cont[i].push(contended(b, cpu, pinned.then_some(drivers_cpu), secs)?);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let sweep: Vec<SweepResult> = SWEEP
        .iter()
        .zip(sweep)
        .map(|(&busy_poll, runs)| SweepResult {
            busy_poll,
            transactions_per_s: Summary::of_runs(
                runs.iter().map(|r| r.transactions as f64 / r.secs),
            ),
            p50_us: Summary::of_runs(runs.iter().map(|r| r.p50_us)),
            p99_us: Summary::of_runs(runs.iter().map(|r| r.p99_us)),
            device_cpu_us_per_transaction: Summary::of_runs(
                runs.iter().map(|r| r.device_cpu_us_per_transaction),
            ),
            runs,
        })
        .collect();
    let contended: Vec<ContendedResult> = CONTENDED
        .iter()
        .zip(cont)
        .map(|(&busy_poll, runs)| ContendedResult {
            busy_poll,
            aggregate_transactions_per_s: Summary::of_runs(runs.iter().map(|(r, _)| r[0] + r[1])),
            busy_poll_contended: runs.iter().map(|(_, c)| *c).collect(),
            runs: runs.into_iter().map(|(r, _)| r).collect(),
        })
        .collect();
    let at = |b: BusyPoll| {
        sweep
            .iter()
            .find(|s| s.busy_poll == b)
            .expect("timeout")
            .transactions_per_s
            .median
    };
    let seed_rr = SeedComparison::new(
        "rr transactions/s, busy poll 0 -> 50 us (seed: TCP_RR 64 B, +10%)",
        SEED_RR,
        (at(BusyPoll::Off), at(BusyPoll::Fixed(50))),
    );
    let cat = |b: BusyPoll| {
        contended
            .iter()
            .find(|s| s.busy_poll == b)
            .expect("timeout")
            .aggregate_transactions_per_s
            .median
    };
    let seed_contended = SeedComparison::new(
        "contended aggregate transactions/s, 0 -> 50 us",
        SEED_CONTENDED,
        (cat(BusyPoll::Off), cat(BusyPoll::Fixed(50))),
    );
    Ok(Results {
        secs_per_run: secs,
        repeats,
        pinned,
        sweep,
        contended_cpu: cpu,
        contended_drivers_cpu: drivers_cpu,
        contended,
        seed_rr,
        seed_contended,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        "3. Busy polling (seed 000): backend echo, driver rr (64 B, 1 in flight, driver sleeping on interrupts)",
        &[
            "busy poll us",
            "transactions/s",
            "p50 us",
            "p99 us",
            "device CPU us/transaction",
            "auto's last budget us",
        ],
    );
    for s in &r.sweep {
        let budget = match s.busy_poll {
            BusyPoll::Auto => {
                let mut b: Vec<u32> = s.runs.iter().map(|r| r.auto_budget_us).collect();
                b.sort_unstable();
                let stops: u64 = s.runs.iter().map(|r| r.busy_poll_contended).sum();
                format!("{} (contended {stops}x)", b[b.len() / 2])
            }
            _ => "-".into(),
        };
        t.row(vec![
            s.busy_poll.to_string(),
            s.transactions_per_s.display(0),
            s.p50_us.display(1),
            s.p99_us.display(1),
            s.device_cpu_us_per_transaction.display(1),
            budget,
        ]);
    }
    t.note(format!(
        "{} of {:.2} s; device CPU = process CPU (10 ms ticks) minus the driver threads' CPU time.",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(if r.pinned {
        "driver threads pinned to CPU 0, backend worker to CPU 1 (as the seed's vCPU and vhost thread: one CPU each)."
    } else {
        "NOT pinned (fewer than 2 CPUs)."
    });
    t.note(r.seed_rr.note(2));
    let mut c = Table::new(
        format!(
            "3b. Busy polling, contended: two backends' workers pinned to CPU {}, two rr loads at once",
            r.contended_cpu
        ),
        &[
            "busy poll us",
            "aggregate transactions/s",
            "auto stopped polling (times, per run)",
        ],
    );
    for s in &r.contended {
        let stops = match s.busy_poll {
            BusyPoll::Auto => format!("{:?}", s.busy_poll_contended),
            _ => "-".into(),
        };
        c.row(vec![
            s.busy_poll.to_string(),
            s.aggregate_transactions_per_s.display(0),
            stops,
        ]);
    }
    c.note(if r.pinned {
        format!(
            "{}; both drivers' threads on CPU {} (as the seed pins each VM's vCPU away from the \
             vhost threads' CPU; with 2 CPUs the drivers share one).",
            spread(r.repeats),
            r.contended_drivers_cpu
        )
    } else {
        format!("{}; NOT pinned (fewer than 2 CPUs).", spread(r.repeats))
    });
    c.note(r.seed_contended.note(0));
    vec![t, c]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
