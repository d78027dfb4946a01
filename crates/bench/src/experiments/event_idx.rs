//! Experiment 1, event index (seed 002): a virtio_test-like run of our ring engine alone, both
//! sides sleeping on eventfd notifications, queue 256, with virtio_test's three switches: event
//! idx negotiated or not (flags), delayed interrupts on or off, indirect descriptors on or off.
//!
//! Each buffer is a 2-descriptor chain (1 KiB as two 512-byte pieces). virtio_test adds each
//! buffer as one scatterlist entry, and Linux (like our driver) uses an indirect table only
//! for chains of more than one descriptor, so virtio_test's `--no-indirect` changes the
//! negotiated features and nothing else; with two descriptors, indirect on takes one ring
//! descriptor per buffer (256 buffers in flight) and off takes two (128). The ring does not
//! touch the buffers' bytes, so their size does not enter the figures.
//!
//! The seed's figures are virtio_test's defaults (indirect on, delayed interrupts off) with and
//! without `--no-event-idx`: those two rows are compared with them.

use serde::Serialize;

use super::common::{count, spread, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::ring::{pingpong, ChainShape, RingMemory, QUEUE_SIZE};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 1,
    name: "event-idx",
    summary: "seed 002: event index on/off, with and without delayed interrupts and indirect, both sides sleeping (virtio_test-like)",
    run,
};

/// virtio_test's run: 2^20 buffers.
pub const SEED_BUFFERS: u64 = 1 << 20;
/// Seed figures: wall time for 2^20 buffers and spurious wake-ups, event idx off -> on.
pub const SEED_SECS: (f64, f64) = (0.649, 0.169);
pub const SEED_SPURIOUS: (f64, f64) = (17.0, 7.0);

/// The chains of every run: a 1 KiB buffer in two 512-byte descriptors.
pub const SHAPE: ChainShape = ChainShape::TWO;

/// One of virtio_test's configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Switches {
    pub event_idx: bool,
    pub delayed_interrupts: bool,
    pub indirect: bool,
}

impl Switches {
    /// virtio_test's defaults: event idx and indirect on, delayed interrupts off.
    pub const DEFAULT: Switches = Switches {
        event_idx: true,
        delayed_interrupts: false,
        indirect: true,
    };

    /// virtio_test's command-line options for this configuration.
    pub fn options(self) -> String {
        let mut o = Vec::new();
        if !self.event_idx {
            o.push("--no-event-idx");
        }
        if self.delayed_interrupts {
            o.push("--delayed-interrupt");
        }
        if !self.indirect {
            o.push("--no-indirect");
        }
        if o.is_empty() {
            "(defaults)".into()
        } else {
            o.join(" ")
        }
    }
}

/// Every combination, in table order: flags then event idx for each of virtio_test's
/// defaults, `--delayed-interrupt`, `--no-indirect`, and both.
pub fn modes() -> Vec<Switches> {
    let mut v = Vec::new();
    for indirect in [true, false] {
        for delayed_interrupts in [false, true] {
            for event_idx in [false, true] {
                v.push(Switches {
                    event_idx,
                    delayed_interrupts,
                    indirect,
                });
            }
        }
    }
    v
}

#[derive(Debug, Serialize)]
pub struct ModeResult {
    #[serde(flatten)]
    pub switches: Switches,
    /// virtio_test's options for this mode.
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
    pub shape: ChainShape,
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
        (1 << 13, 200, 1)
    } else {
        (SEED_BUFFERS, 800, 3)
    };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let switches = modes();
    let mut runs: Vec<Vec<pingpong::Run>> = vec![Vec::new(); switches.len()];
    for rep in 1..=repeats {
        for (i, sw) in switches.iter().enumerate() {
            progress(&format!("[{rep}/{repeats}] virtio_test {}", sw.options()));
            let mut cfg = pingpong::Config::new(
                pingpong::Mode::Sleep {
                    event_idx: sw.event_idx,
                },
                buffers,
            );
            cfg.shape = SHAPE;
            cfg.indirect = sw.indirect;
            cfg.delayed_interrupts = sw.delayed_interrupts;
            cfg.deadline = Some(std::time::Duration::from_millis(limit_ms));
            let ring = RingMemory::new(cfg.features())?;
            let device = ring.vring_device()?;
            runs[i].push(pingpong::run(&ring, device, &cfg)?);
        }
    }
    let modes: Vec<ModeResult> = switches
        .iter()
        .zip(runs)
        .map(|(&switches, runs)| {
            let f =
                |g: &dyn Fn(&pingpong::Run) -> f64| sum(&runs.iter().map(g).collect::<Vec<_>>());
            let spurious =
                |r: &pingpong::Run| (r.driver.spurious_wakeups + r.device.spurious_wakeups) as f64;
            ModeResult {
                switches,
                label: switches.options(),
                secs_per_2_20: f(&|r| r.secs / r.ops as f64 * SEED_BUFFERS as f64),
                kicks_per_buffer: f(&pingpong::Run::kicks_per_op),
                interrupts_per_buffer: f(&pingpong::Run::interrupts_per_op),
                spurious_wakeups: f(&spurious),
                spurious_wakeups_per_buffer: f(&|r| spurious(r) / r.ops as f64),
                runs,
            }
        })
        .collect();
    // The seed ran virtio_test with its defaults, with and without --no-event-idx.
    let seed_mode = |event_idx: bool| {
        let sw = Switches {
            event_idx,
            ..Switches::DEFAULT
        };
        modes
            .iter()
            .find(|m| m.switches == sw)
            .expect("the defaults are among the modes")
    };
    let (before, after) = (seed_mode(false), seed_mode(true));
    let seed_time = SeedComparison::new(
        "wall s per 2^20 buffers",
        SEED_SECS,
        (before.secs_per_2_20.median, after.secs_per_2_20.median),
    );
    let seed_spurious = SeedComparison::new(
        "spurious wake-ups per run",
        SEED_SPURIOUS,
        (
            before.spurious_wakeups.median,
            after.spurious_wakeups.median,
        ),
    );
    Ok(Results {
        queue_size: QUEUE_SIZE,
        shape: SHAPE,
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
            "1. Event index (seed 002): ring alone, queue {}, both sides sleeping, up to {} buffers of {} descriptors per run",
            r.queue_size, r.buffers, r.shape.descriptors()
        ),
        &[
            "virtio_test options",
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
    t.note("each buffer is 2 descriptors, so that indirect has something to fold (virtio_test's 1-entry buffers never use an indirect table).");
    t.note("seed figures: virtio_test's defaults (indirect on, delayed interrupts off), compared with our rows \"--no-event-idx\" -> \"(defaults)\".");
    t.note(r.seed_time.note(3));
    t.note(r.seed_spurious.note(0));
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
