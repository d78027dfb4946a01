//! Experiment 1, event index (seed 002): a virtio_test-like run of our ring engine alone, both
//! sides sleeping on eventfd notifications, queue 256, event idx negotiated or not (flags).
//! The buffers are 1-descriptor chains; the ring does not touch their bytes, so their size
//! (1 KiB in virtio_test) does not enter the figures.

use serde::Serialize;

use super::common::{count, spread, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::ring::{pingpong, RingMemory, QUEUE_SIZE};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 1,
    name: "event-idx",
    summary:
        "seed 002: event index on/off, both sides sleeping on notifications (virtio_test-like)",
    run,
};

/// virtio_test's run: 2^20 buffers.
pub const SEED_BUFFERS: u64 = 1 << 20;
/// Seed figures: wall time for 2^20 buffers and spurious wake-ups, event idx off -> on.
pub const SEED_SECS: (f64, f64) = (0.649, 0.169);
pub const SEED_SPURIOUS: (f64, f64) = (17.0, 7.0);

const MODES: [bool; 2] = [false, true];

#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub event_idx: bool,
    pub label: String,
    /// Wall time for 2^20 buffers: measured when the run completed them, else projected from
    /// the rate of a run cut short by the time limit.
    pub secs_per_2_20: Summary,
    pub kicks_per_buffer: Summary,
    pub interrupts_per_buffer: Summary,
    /// Wake-ups (driver and device) that found nothing to do.
    pub spurious_wakeups: Summary,
    pub spurious_wakeups_per_buffer: Summary,
    pub runs: Vec<pingpong::Run>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub queue_size: u16,
    pub buffers: u64,
    pub run_limit_ms: u64,
    pub repeats: u32,
    pub modes: Vec<ModeResult>,
    pub seed_time: SeedComparison,
    pub seed_spurious: SeedComparison,
}

fn sum(v: &[f64]) -> Summary {
    Summary::of(v).expect("at least one run")
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (buffers, limit_ms, repeats) = if o.quick {
        (1 << 14, 300, 1)
    } else {
        (SEED_BUFFERS, 2_000, 3)
    };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let mut runs: Vec<Vec<pingpong::Run>> = vec![Vec::new(); MODES.len()];
    for rep in 1..=repeats {
        for (i, &event_idx) in MODES.iter().enumerate() {
            let mode = pingpong::Mode::Sleep { event_idx };
            progress(&format!("[{rep}/{repeats}] event idx: {}", mode.label()));
            let ring = RingMemory::new(mode.features())?;
            let device = ring.vring_device()?;
            let mut cfg = pingpong::Config::new(mode, buffers);
            cfg.deadline = Some(std::time::Duration::from_millis(limit_ms));
            runs[i].push(pingpong::run(&ring, device, &cfg)?);
        }
    }
    let modes: Vec<ModeResult> = MODES
        .iter()
        .zip(runs)
        .map(|(&event_idx, runs)| {
            let f =
                |g: &dyn Fn(&pingpong::Run) -> f64| sum(&runs.iter().map(g).collect::<Vec<_>>());
            let spurious =
                |r: &pingpong::Run| (r.driver.spurious_wakeups + r.device.spurious_wakeups) as f64;
            ModeResult {
                event_idx,
                label: pingpong::Mode::Sleep { event_idx }.label(),
                secs_per_2_20: f(&|r| r.secs / r.ops as f64 * SEED_BUFFERS as f64),
                kicks_per_buffer: f(&pingpong::Run::kicks_per_op),
                interrupts_per_buffer: f(&pingpong::Run::interrupts_per_op),
                spurious_wakeups: f(&spurious),
                spurious_wakeups_per_buffer: f(&|r| spurious(r) / r.ops as f64),
                runs,
            }
        })
        .collect();
    let seed_time = SeedComparison::new(
        "wall s per 2^20 buffers",
        SEED_SECS,
        (modes[0].secs_per_2_20.median, modes[1].secs_per_2_20.median),
    );
    let seed_spurious = SeedComparison::new(
        "spurious wake-ups per run",
        SEED_SPURIOUS,
        (
            modes[0].spurious_wakeups.median,
            modes[1].spurious_wakeups.median,
        ),
    );
    Ok(Results {
        queue_size: QUEUE_SIZE,
        buffers,
        run_limit_ms: limit_ms,
        repeats,
        modes,
        seed_time,
        seed_spurious,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "1. Event index (seed 002): ring alone, queue {}, both sides sleeping, up to {} buffers per run",
            r.queue_size, r.buffers
        ),
        &[
            "mode",
            "s per 2^20 buffers",
            "kicks/buffer",
            "interrupts/buffer",
            "spurious wake-ups",
            "buffers/run",
        ],
    );
    for m in &r.modes {
        let ops: Vec<f64> = m.runs.iter().map(|r| r.ops as f64).collect();
        t.row(vec![
            m.label.clone(),
            m.secs_per_2_20.display(3),
            count(m.kicks_per_buffer.median),
            count(m.interrupts_per_buffer.median),
            format!("{:.0}", m.spurious_wakeups.median),
            format!("{:.0}", sum(&ops).median),
        ]);
    }
    t.note(format!(
        "times: {}; runs stop after {} ms, and the time for 2^20 buffers is then projected from the rate.",
        spread(r.repeats),
        r.run_limit_ms
    ));
    t.note(r.seed_time.note(3));
    t.note(r.seed_spurious.note(0));
    t.note("delayed interrupts and indirect descriptors are not varied here (not implemented in this experiment).");
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
