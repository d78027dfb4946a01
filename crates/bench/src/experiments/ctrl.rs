//! Experiment 5, control queue: interrupt vs polling completion (seed 004). A slow device
//! (`ctrl_delay_us`) answers each control command late; 1 or 64 threads submit commands; we
//! measure the submitters' own CPU time (thread CPU clocks) and the command rate. In irq mode
//! the reaper thread's CPU time is reported beside it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{CtrlMode, DriverConfig, NetDriver};
use vnet::ctrl::{Coalesce, Command};

use super::common::{spread, LocalBackend, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 5,
    name: "ctrl-irq",
    summary: "seed 004: control queue completion by polling vs interrupt, slow device, 1 and 64 submitters",
    run,
};

/// Seed: submitter CPU, polling -> interrupt, in percent of a CPU.
pub const SEED_CPU_PCT: (f64, f64) = (100.0, 0.0);
pub const SUBMITTERS: [usize; 2] = [1, 64];
pub const MODES: [CtrlMode; 2] = [CtrlMode::Poll, CtrlMode::Irq];

#[derive(Debug, Serialize)]
pub struct CtrlRun {
    pub commands: u64,
    pub wall_s: f64,
    /// Sum of the submitter threads' CPU time.
    pub submitter_cpu_ns: u64,
    pub reaper_cpu_ns: u64,
}

#[derive(Debug, Serialize)]
pub struct CtrlResult {
    pub mode: String,
    pub submitters: usize,
    pub submitter_cpu_pct: Summary,
    pub commands_per_s: Summary,
    pub runs: Vec<CtrlRun>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub ctrl_delay_us: u32,
    pub repeats: u32,
    pub results: Vec<CtrlResult>,
    pub seed: SeedComparison,
}

fn mode_name(m: CtrlMode) -> String {
    match m {
        CtrlMode::Poll => "poll".into(),
        CtrlMode::Irq => "irq".into(),
    }
}

fn engine(e: impl std::fmt::Display) -> BenchError {
    BenchError::Engine {
        engine: "virtnet driver",
        reason: e.to_string(),
    }
}

fn one(
    b: &LocalBackend,
    mode: CtrlMode,
    submitters: usize,
    per_thread: usize,
) -> Result<CtrlRun, BenchError> {
    let cfg = DriverConfig {
        ctrl: Some(mode),
        ctrl_timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let d = NetDriver::connect(&b.socket, &cfg).map_err(engine)?;
    let ctrl = d
        .ctrl()
        .ok_or_else(|| engine("no control queue negotiated"))?
        .clone();
    let reaper0 = ctrl.reaper_cpu_ns();
    let started = Instant::now();
    let threads: Vec<_> = (0..submitters)
        .map(|t| {
            let ctrl = Arc::clone(&ctrl);
            std::thread::spawn(move || -> Result<u64, String> {
                let cpu0 = virtnet_sys::thread_cpu_ns();
                for i in 0..per_thread {
                    let coal = Coalesce {
                        max_packets: (t * 1000 + i) as u32,
                        max_usecs: 1,
                    };
                    ctrl.execute(Command::VqNotfCoalSet { vqn: 0, coal })
                        .map_err(|e| e.to_string())?;
                }
                Ok(virtnet_sys::thread_cpu_ns() - cpu0)
            })
        })
        .collect();
    let mut cpu = 0;
    for t in threads {
        cpu += t
            .join()
            .map_err(|_| engine("a submitter panicked"))?
            .map_err(engine)?;
    }
    let wall_s = started.elapsed().as_secs_f64();
    let reaper = ctrl.reaper_cpu_ns().saturating_sub(reaper0);
    drop(ctrl);
    drop(d);
    Ok(CtrlRun {
        commands: (submitters * per_thread) as u64,
        wall_s,
        submitter_cpu_ns: cpu,
        reaper_cpu_ns: reaper,
    })
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    // 1 submitter: `n1` commands in a row; 64 submitters: `n64` each (in flight together up
    // to the queue's capacity).
    let (delay_us, n1, n64, repeats) = if o.quick {
        (2_000, 10, 1, 1)
    } else {
        (2_000, 20, 1, 3)
    };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let b = LocalBackend::start(
        "ctrl",
        BackendConfig {
            io: IoMode::Echo,
            ctrl_delay_us: delay_us,
            ..Default::default()
        },
    )?;
    let combos: Vec<(CtrlMode, usize)> = SUBMITTERS
        .iter()
        .flat_map(|&s| MODES.iter().map(move |&m| (m, s)))
        .collect();
    let mut runs: Vec<Vec<CtrlRun>> = combos.iter().map(|_| Vec::new()).collect();
    for rep in 1..=repeats {
        for (i, &(mode, s)) in combos.iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] ctrl {}, {s} submitter(s)",
                mode_name(mode)
            ));
            let per = if s == 1 { n1 } else { n64 };
            runs[i].push(one(&b, mode, s, per)?);
        }
    }
    let results: Vec<CtrlResult> = combos
        .iter()
        .zip(runs)
        .map(|(&(mode, submitters), runs)| {
            let pct: Vec<f64> = runs
                .iter()
                .map(|r| r.submitter_cpu_ns as f64 / 1e9 / r.wall_s * 100.0)
                .collect();
            let rate: Vec<f64> = runs.iter().map(|r| r.commands as f64 / r.wall_s).collect();
            CtrlResult {
                mode: mode_name(mode),
                submitters,
                submitter_cpu_pct: Summary::of(&pct).expect("runs"),
                commands_per_s: Summary::of(&rate).expect("runs"),
                runs,
            }
        })
        .collect();
    let seed = SeedComparison::new(
        "submitter CPU %, 1 submitter",
        SEED_CPU_PCT,
        (
            results[0].submitter_cpu_pct.median,
            results[1].submitter_cpu_pct.median,
        ),
    );
    Ok(Results {
        ctrl_delay_us: delay_us,
        repeats,
        results,
        seed,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "5. Control queue (seed 004): device answers each command after {} us",
            r.ctrl_delay_us
        ),
        &[
            "completion",
            "submitters",
            "submitter CPU %",
            "commands/s",
            "reaper CPU ms",
        ],
    );
    for c in &r.results {
        let reaper: Vec<f64> = c
            .runs
            .iter()
            .map(|x| x.reaper_cpu_ns as f64 / 1e6)
            .collect();
        t.row(vec![
            c.mode.clone(),
            c.submitters.to_string(),
            c.submitter_cpu_pct.display(1),
            c.commands_per_s.display(0),
            format!("{:.2}", Summary::of(&reaper).expect("runs").median),
        ]);
    }
    t.note(format!(
        "{}; CPU % is the submitters' summed thread CPU time over the wall time (64 threads can exceed 100%).",
        spread(r.repeats)
    ));
    t.note("The seed's ~0% is the submitter sleeping; it does not count the interrupt path (our reaper thread, shown apart).");
    t.note(r.seed.note(1));
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
