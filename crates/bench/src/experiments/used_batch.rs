//! Experiment 2, batched used publish (seed 001): our backend with null io fills the rx ring
//! of our busy-polling driver (`gen rxonly`, 64 B frames); the backend publishes `used.idx`
//! after every used entry (batch 1) or every 64.

use serde::Serialize;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::gen::Mode;

use super::common::{count, gen_config, run_gen, spread, LocalBackend, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 2,
    name: "used-batch",
    summary: "seed 001: used.idx published per entry vs per 64, device -> driver Mpps at 64 B",
    run,
};

pub const SEED_MPPS: (f64, f64) = (3.05, 4.00);
pub const BATCHES: [u16; 2] = [1, 64];
pub const FRAME: usize = 64;

#[derive(Debug, Serialize)]
pub struct BatchRun {
    pub secs: f64,
    pub driver_rx_mpps: f64,
    pub device_packets: u64,
    /// Backend rx queue: used-index stores and call eventfd writes.
    pub used_idx_stores: u64,
    pub calls: u64,
}

#[derive(Debug, Serialize)]
pub struct BatchResult {
    pub used_batch: u16,
    pub mpps: Summary,
    pub used_idx_stores_per_packet: Summary,
    pub runs: Vec<BatchRun>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub frame: usize,
    pub secs_per_run: f64,
    pub repeats: u32,
    pub batches: Vec<BatchResult>,
    pub seed: SeedComparison,
}

fn one(used_batch: u16, secs: f64) -> Result<BatchRun, BenchError> {
    let b = LocalBackend::start(
        "usedbatch",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            used_batch,
            ..Default::default()
        },
    )?;
    let mut cfg = gen_config(&b.socket, Mode::RxOnly, secs);
    cfg.size = FRAME;
    cfg.busy_poll = true;
    cfg.avail_per_burst = true;
    let r = run_gen(cfg)?;
    Ok(BatchRun {
        secs: r.elapsed_s,
        driver_rx_mpps: r.summary.rx_mpps,
        device_packets: b.counter("rx", |c| c.packets),
        used_idx_stores: b.counter("rx", |c| c.batches_flushed),
        calls: b.counter("rx", |c| c.calls),
    })
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.25, 1) } else { (1.0, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let mut runs: Vec<Vec<BatchRun>> = BATCHES.iter().map(|_| Vec::new()).collect();
    for rep in 1..=repeats {
        for (i, &batch) in BATCHES.iter().enumerate() {
            progress(&format!("[{rep}/{repeats}] used batch {batch}"));
            runs[i].push(one(batch, secs)?);
        }
    }
    let batches: Vec<BatchResult> = BATCHES
        .iter()
        .zip(runs)
        .map(|(&used_batch, runs)| {
            let mpps: Vec<f64> = runs.iter().map(|r| r.driver_rx_mpps).collect();
            let st: Vec<f64> = runs
                .iter()
                .map(|r| r.used_idx_stores as f64 / r.device_packets.max(1) as f64)
                .collect();
            BatchResult {
                used_batch,
                mpps: Summary::of(&mpps).expect("runs"),
                used_idx_stores_per_packet: Summary::of(&st).expect("runs"),
                runs,
            }
        })
        .collect();
    let seed = SeedComparison::new(
        "device -> driver Mpps at 64 B",
        SEED_MPPS,
        (batches[0].mpps.median, batches[1].mpps.median),
    );
    Ok(Results {
        frame: FRAME,
        secs_per_run: secs,
        repeats,
        batches,
        seed,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "2. Batched used publish (seed 001): backend null io -> driver rxonly (busy polling), {} B frames",
            r.frame
        ),
        &["used batch", "driver rx Mpps", "used.idx stores/packet"],
    );
    for b in &r.batches {
        t.row(vec![
            b.used_batch.to_string(),
            b.mpps.display(2),
            count(b.used_idx_stores_per_packet.median),
        ]);
    }
    t.note(format!(
        "Mpps: {} of {:.2} s; one fresh backend per run.",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(r.seed.note(2));
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
