//! Experiment 6, tx completion handling (seed 002's delayed callbacks): our driver transmits
//! 64 B frames as fast as it can to our backend (null io), sleeping on the tx interrupt whenever
//! the queue stops for lack of room. With delayed callbacks (seed 002) tx interrupts are off
//! while the queue runs, and a stopped queue asks for one once 3/4 of what is in flight has
//! completed. Without them (the driver before seed 002) every burst first reclaims all
//! completions, and tx interrupts stay enabled, re-armed at the next completion on every burst;
//! the loop takes them after each burst.
//! Capacity stop/wake and bounded reclaim have no off switch in the driver: not varied.

use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet::backend::{BackendConfig, IoMode};
use virtnet::driver::{DriverConfig, NetDriver};
use virtnet::net::NetHdr;

use super::common::{count, spread, LocalBackend};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 6,
    name: "tx-completion",
    summary: "seed 002: tx delayed completion callbacks on/off, tx interrupts per packet and Mpps",
    run,
};

pub const FRAME: usize = 64;
const BURST: usize = 32;

#[derive(Debug, Serialize)]
pub struct Run {
    pub secs: f64,
    pub packets: u64,
    pub interrupts: u64,
    pub stops: u64,
    pub kicks: u64,
}

#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub delayed_callbacks: bool,
    pub mpps: Summary,
    pub interrupts_per_packet: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub frame: usize,
    pub secs_per_run: f64,
    pub repeats: u32,
    pub modes: Vec<ModeResult>,
}

fn engine(e: impl std::fmt::Display) -> BenchError {
    BenchError::Engine {
        engine: "virtnet driver",
        reason: e.to_string(),
    }
}

fn one(delayed: bool, secs: f64) -> Result<Run, BenchError> {
    let b = LocalBackend::start(
        "txcompl",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            ..Default::default()
        },
    )?;
    let mut d = NetDriver::connect(&b.socket, &DriverConfig::default()).map_err(engine)?;
    let mut pairs = d.take_pairs();
    let p = pairs.first_mut().ok_or_else(|| engine("no queue pair"))?;
    p.tx.set_delayed_callbacks(delayed);
    let frame = vec![0u8; FRAME];
    let c0 = p.tx.counters.snapshot();
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while start.elapsed() < limit {
        for _ in 0..BURST {
            while !p.tx.send(&frame, NetHdr::default()).map_err(engine)? {
                p.tx.flush();
                p.tx.wait_wake(10).map_err(engine)?;
            }
        }
        if !delayed {
            // Before seed 002 every transmit freed all completed buffers first.
            p.tx.reclaim(usize::MAX).map_err(engine)?;
        }
        p.tx.flush();
        if !delayed {
            // Tx interrupts are left enabled: take the pending one, as the interrupt handler.
            p.tx.ack_interrupt();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    p.tx.drain(Duration::from_secs(1)).map_err(engine)?;
    let c = p.tx.counters.snapshot().since(&c0);
    drop(pairs);
    drop(d);
    Ok(Run {
        secs,
        packets: c.packets,
        interrupts: c.interrupts,
        stops: c.stops,
        kicks: c.kicks,
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
        for (i, delayed) in [false, true].into_iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] tx, delayed callbacks {}",
                if delayed { "on" } else { "off" }
            ));
            runs[i].push(one(delayed, secs)?);
        }
    }
    let modes = [false, true]
        .into_iter()
        .zip(runs)
        .map(|(delayed_callbacks, runs)| ModeResult {
            delayed_callbacks,
            mpps: summary(runs.iter().map(|r| r.packets as f64 / r.secs / 1e6)),
            interrupts_per_packet: summary(
                runs.iter()
                    .map(|r| r.interrupts as f64 / r.packets.max(1) as f64),
            ),
            runs,
        })
        .collect();
    Ok(Results {
        frame: FRAME,
        secs_per_run: secs,
        repeats,
        modes,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "6. Tx completion (seed 002): driver tx {} B to backend null io, sleeping when the queue stops",
            r.frame
        ),
        &[
            "delayed callbacks",
            "tx Mpps",
            "tx interrupts/packet",
            "stops/packet",
        ],
    );
    for m in &r.modes {
        let stops: Vec<f64> = m
            .runs
            .iter()
            .map(|x| x.stops as f64 / x.packets.max(1) as f64)
            .collect();
        t.row(vec![
            if m.delayed_callbacks { "on" } else { "off" }.into(),
            m.mpps.display(2),
            count(m.interrupts_per_packet.median),
            count(summary(stops.into_iter()).median),
        ]);
    }
    t.note(format!("{} of {:.2} s.", spread(r.repeats), r.secs_per_run));
    t.note("seed: \"fixes TX interrupt storms\" (no figure published): expect fewer tx interrupts per packet with delayed callbacks.");
    t.note("capacity stop/wake and bounded reclaim are always on (no switch): not varied.");
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
