//! Experiment 0, the ring engine alone: the two-thread ping-pong in every mode and the
//! one-thread device-side loop, each repeated with the runs interleaved, medians reported.

use serde::Serialize;

use super::{Experiment, Options, Outcome, Progress};
use crate::ring::{device_side, pingpong, ChainShape, RingMemory, QUEUE_SIZE};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 0,
    name: "ring",
    summary: "split ring engine: two-thread ping-pong (poll, sleep) and one-thread device side",
    run,
};

/// The ping-pong modes, in table order.
pub const MODES: [pingpong::Mode; 5] = [
    pingpong::Mode::Poll { used_batch: 1 },
    pingpong::Mode::Poll { used_batch: 16 },
    pingpong::Mode::Poll { used_batch: 64 },
    pingpong::Mode::Sleep { event_idx: true },
    pingpong::Mode::Sleep { event_idx: false },
];

/// The device-side chain shapes, in table order.
pub const SHAPES: [ChainShape; 2] = [ChainShape::ONE, ChainShape::FOUR];

/// Run sizes: chains per ping-pong run, rounds of 64 chains per device-side run, each cut
/// short by a time limit so that a loaded machine does not stretch the whole bench.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sizes {
    pub repeats: u32,
    pub poll_ops: u64,
    pub sleep_ops: u64,
    pub device_side_rounds: u64,
    /// Time limit of one run, in milliseconds.
    pub run_limit_ms: u64,
}

impl Sizes {
    pub fn for_options(o: &Options) -> Sizes {
        let s = if o.quick {
            Sizes {
                repeats: 2,
                poll_ops: 1 << 16,
                sleep_ops: 1 << 15,
                device_side_rounds: 2_000,
                run_limit_ms: 300,
            }
        } else {
            Sizes {
                repeats: 5,
                poll_ops: 1 << 22,
                sleep_ops: 1 << 20,
                device_side_rounds: 100_000,
                run_limit_ms: 600,
            }
        };
        Sizes {
            repeats: o.repeats.unwrap_or(s.repeats).max(1),
            ..s
        }
    }

    fn run_limit(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.run_limit_ms)
    }

    fn ops(&self, mode: pingpong::Mode) -> u64 {
        match mode {
            // Publishing every used entry runs several times slower: a shorter run.
            pingpong::Mode::Poll { used_batch: 1 } => self.poll_ops / 4,
            pingpong::Mode::Poll { .. } => self.poll_ops,
            pingpong::Mode::Sleep { .. } => self.sleep_ops,
        }
    }
}

/// One ping-pong mode over all repeats.
#[derive(Debug, Serialize)]
pub struct PingPongResult {
    pub label: String,
    #[serde(flatten)]
    pub mode: pingpong::Mode,
    pub mops: Summary,
    pub kicks_per_op: Summary,
    pub interrupts_per_op: Summary,
    pub used_idx_stores_per_op: Summary,
    pub runs: Vec<pingpong::Run>,
}

/// One device-side shape over all repeats.
#[derive(Debug, Serialize)]
pub struct DeviceSideResult {
    pub descriptors_per_chain: u16,
    pub mdesc_per_sec: Summary,
    pub ns_per_chain: Summary,
    pub runs: Vec<device_side::Run>,
}

#[derive(Debug, Serialize)]
pub struct RingResults {
    pub queue_size: u16,
    pub sizes: Sizes,
    /// Whether every two-thread run had both threads pinned.
    pub pinned: bool,
    pub pingpong: Vec<PingPongResult>,
    pub device_side: Vec<DeviceSideResult>,
}

fn summary(runs: &[pingpong::Run], f: fn(&pingpong::Run) -> f64) -> Summary {
    let v: Vec<f64> = runs.iter().map(f).collect();
    Summary::of(&v).expect("at least one run")
}

/// Runs every mode and shape `sizes.repeats` times, interleaved (one of each per repeat).
pub fn measure(sizes: &Sizes, progress: Progress<'_>) -> Result<RingResults, BenchError> {
    let mut pp: Vec<Vec<pingpong::Run>> = vec![Vec::new(); MODES.len()];
    let mut ds: Vec<Vec<device_side::Run>> = vec![Vec::new(); SHAPES.len()];
    for rep in 1..=sizes.repeats {
        for (i, &mode) in MODES.iter().enumerate() {
            progress(&format!(
                "[{rep}/{}] ping-pong, {}",
                sizes.repeats,
                mode.label()
            ));
            let ring = RingMemory::new(mode.features())?;
            let device = ring.vring_device()?;
            let mut cfg = pingpong::Config::new(mode, sizes.ops(mode));
            cfg.deadline = Some(sizes.run_limit());
            pp[i].push(pingpong::run(&ring, device, &cfg)?);
        }
        for (i, &shape) in SHAPES.iter().enumerate() {
            progress(&format!(
                "[{rep}/{}] device side, {}-descriptor chains",
                sizes.repeats,
                shape.descriptors()
            ));
            let ring = RingMemory::new(device_side::FEATURES)?;
            let device = ring.vring_device()?;
            let cfg = device_side::Config {
                shape,
                rounds: sizes.device_side_rounds,
                deadline: Some(sizes.run_limit()),
            };
            ds[i].push(device_side::run(&ring, device, &cfg)?);
        }
    }
    let pinned = pp.iter().flatten().all(|r| r.pinned);
    let pingpong = MODES
        .iter()
        .zip(pp)
        .map(|(&mode, runs)| PingPongResult {
            label: mode.label(),
            mode,
            mops: summary(&runs, pingpong::Run::mops),
            kicks_per_op: summary(&runs, pingpong::Run::kicks_per_op),
            interrupts_per_op: summary(&runs, pingpong::Run::interrupts_per_op),
            used_idx_stores_per_op: summary(&runs, pingpong::Run::used_idx_stores_per_op),
            runs,
        })
        .collect();
    let device_side = SHAPES
        .iter()
        .zip(ds)
        .map(|(&shape, runs)| {
            let rate: Vec<f64> = runs.iter().map(device_side::Run::mdesc_per_sec).collect();
            let ns: Vec<f64> = runs.iter().map(device_side::Run::ns_per_chain).collect();
            DeviceSideResult {
                descriptors_per_chain: shape.descriptors(),
                mdesc_per_sec: Summary::of(&rate).expect("at least one run"),
                ns_per_chain: Summary::of(&ns).expect("at least one run"),
                runs,
            }
        })
        .collect();
    Ok(RingResults {
        queue_size: QUEUE_SIZE,
        sizes: *sizes,
        pinned,
        pingpong,
        device_side,
    })
}

/// Per-op counts: a few significant digits, however small.
fn per_op(s: &Summary) -> String {
    let m = s.median;
    if m == 0.0 {
        "0".into()
    } else if m >= 0.1 {
        format!("{m:.3}")
    } else {
        format!("{m:.5}")
    }
}

/// The tables `virtnet bench` prints for these results.
pub fn tables(r: &RingResults) -> Vec<Table> {
    let spread = if r.sizes.repeats > 1 {
        format!("median (min..max) of {} interleaved runs", r.sizes.repeats)
    } else {
        "a single run".to_string()
    };
    let pinning = if r.pinned {
        "driver thread pinned to CPU 0, device thread to CPU 1"
    } else {
        "threads NOT pinned (CPU 0 or 1 unavailable)"
    };
    let mut pp = Table::new(
        format!(
            "Ring ping-pong: two threads, queue {}, 1-descriptor chains",
            r.queue_size
        ),
        &[
            "mode",
            "Mops/s",
            "kicks/op",
            "interrupts/op",
            "used.idx stores/op",
        ],
    );
    for m in &r.pingpong {
        pp.row(vec![
            m.label.clone(),
            m.mops.display(2),
            per_op(&m.kicks_per_op),
            per_op(&m.interrupts_per_op),
            per_op(&m.used_idx_stores_per_op),
        ]);
    }
    pp.note(format!("Mops/s: {spread}; per-op counts: medians."));
    pp.note(pinning);
    pp.note("poll: event idx on, both sides spin; sleep: both sides sleep on eventfds.");

    let mut ds = Table::new(
        "Device side, one thread: driver and device interleaved, batches of 64 chains",
        &["chain", "Mdesc/s", "ns/chain"],
    );
    for s in &r.device_side {
        ds.row(vec![
            format!("{} descriptor(s)", s.descriptors_per_chain),
            s.mdesc_per_sec.display(1),
            s.ns_per_chain.display(1),
        ]);
    }
    ds.note(format!(
        "Device time only (pop, walk and validate, add_used, notify decision): {spread}."
    ));
    vec![pp, ds]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let results = measure(&Sizes::for_options(o), progress)?;
    Outcome::new(tables(&results), &results)
}
