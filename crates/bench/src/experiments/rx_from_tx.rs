//! Experiment 4, rx polled from the tx path (seed 003): the backend busy-polls (50 us) its tx
//! ring; with `poll_rx_from_tx` it also moves host-side rx frames while it does. Null io makes
//! the host side an endless source of rx frames, so the traffic is bidirectional: our driver
//! (`gen io`, sleeping on interrupts) transmits 1500 B frames and receives 1500 B frames.

use serde::Serialize;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use virtnet_driver::gen::Mode;

use super::common::{count, gen_config, run_gen, spread, LocalBackend, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 4,
    name: "rx-from-tx",
    summary: "seed 003: backend polls rx from its tx busy-poll loop on/off, bidirectional Gbit/s",
    run,
};

/// Seed: bidirectional TCP stream, Gbit/s, off -> on.
pub const SEED_GBPS: (f64, f64) = (19.8, 37.4);
pub const FRAME: usize = 1500;
pub const BUSY_POLL_US: u32 = 50;

#[derive(Debug, Serialize)]
pub struct Run {
    pub secs: f64,
    pub tx_gbps: f64,
    pub rx_gbps: f64,
    pub interrupts_per_packet: f64,
    pub device_busy_poll_hits: u64,
    pub device_kicks: u64,
}

#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub poll_rx_from_tx: bool,
    pub total_gbps: Summary,
    pub tx_gbps: Summary,
    pub rx_gbps: Summary,
    pub interrupts_per_packet: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub frame: usize,
    pub busy_poll_us: u32,
    pub secs_per_run: f64,
    pub repeats: u32,
    pub modes: Vec<ModeResult>,
    pub seed: SeedComparison,
}

fn one(on: bool, secs: f64) -> Result<Run, BenchError> {
    let b = LocalBackend::start(
        "rxfromtx",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            busy_poll: BusyPoll::Fixed(BUSY_POLL_US),
            poll_rx_from_tx: on,
            ..Default::default()
        },
    )?;
    let mut cfg = gen_config(&b.socket, Mode::Io, secs);
    cfg.size = FRAME;
    let r = run_gen(cfg)?;
    Ok(Run {
        secs: r.elapsed_s,
        tx_gbps: r.summary.tx_gbps,
        rx_gbps: r.summary.rx_gbps,
        interrupts_per_packet: r.summary.interrupts_per_packet,
        device_busy_poll_hits: b.counter("tx", |c| c.busy_poll_hits)
            + b.counter("rx", |c| c.busy_poll_hits),
        device_kicks: b.counter("tx", |c| c.kicks) + b.counter("rx", |c| c.kicks),
    })
}

fn summary(v: impl Iterator<Item = f64>) -> Summary {
    Summary::of(&v.collect::<Vec<_>>()).expect("runs")
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.2, 1) } else { (1.0, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    for rep in 1..=repeats {
        for (i, on) in [false, true].into_iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] bidirectional, poll rx from tx {}",
                if on { "on" } else { "off" }
            ));
            runs[i].push(one(on, secs)?);
        }
    }
    let modes: Vec<ModeResult> = [false, true]
        .into_iter()
        .zip(runs)
        .map(|(on, runs)| ModeResult {
            poll_rx_from_tx: on,
            total_gbps: summary(runs.iter().map(|r| r.tx_gbps + r.rx_gbps)),
            tx_gbps: summary(runs.iter().map(|r| r.tx_gbps)),
            rx_gbps: summary(runs.iter().map(|r| r.rx_gbps)),
            interrupts_per_packet: summary(runs.iter().map(|r| r.interrupts_per_packet)),
            runs,
        })
        .collect();
    let seed = SeedComparison::new(
        "bidirectional Gbit/s",
        SEED_GBPS,
        (modes[0].total_gbps.median, modes[1].total_gbps.median),
    );
    Ok(Results {
        frame: FRAME,
        busy_poll_us: BUSY_POLL_US,
        secs_per_run: secs,
        repeats,
        modes,
        seed,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "4. Rx polled from the tx path (seed 003): backend null io, busy poll {} us; driver gen io, {} B both ways",
            r.busy_poll_us, r.frame
        ),
        &[
            "poll rx from tx",
            "total Gbit/s",
            "driver tx Gbit/s",
            "driver rx Gbit/s",
            "driver interrupts/packet",
        ],
    );
    for m in &r.modes {
        t.row(vec![
            if m.poll_rx_from_tx { "on" } else { "off" }.into(),
            m.total_gbps.display(2),
            m.tx_gbps.display(2),
            m.rx_gbps.display(2),
            count(m.interrupts_per_packet.median),
        ]);
    }
    t.note(format!(
        "{} of {:.2} s. No latency figure: a stream has no request to time (see experiment 3 for latency).",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(r.seed.note(1));
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
