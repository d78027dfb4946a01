//! Experiment 6, tx completion handling (seed 002): our driver transmits 64 B frames as fast
//! as it can to our backend (null io), sleeping on the tx interrupt whenever the queue stops.
//! Seed 002 changed three things in virtio_net's transmit path, each a field of the driver's
//! [`virtnet_driver::TxTechniques`] (its `experiments` feature), fixed when the queue is built:
//!
//! - delayed callbacks (`delayed_callbacks`): tx interrupts are off while the queue runs,
//!   and a stopped queue asks for one once 3/4 of what is in flight has completed. Off: tx
//!   interrupts stay enabled, re-armed at the next completion on every burst, and the loop
//!   takes them after each burst, as the interrupt handler would;
//! - capacity stop/wake (`capacity_stop`): the queue stops while a worst-case packet still
//!   fits. Off: a frame finds the ring full, is not sent and is retried (NETDEV_TX_BUSY), and
//!   the queue restarts as soon as one frame fits;
//! - bounded reclaim (`bounded_reclaim`): a transmit call reclaims at most a budget of
//!   completions, and only when short of room. Off: every call reclaims all of them.
//!
//! The modes: all on (seed 002), each one off alone, all off (the driver before seed 002),
//! and all on with the delay adapted to the wake-up (ours, [`virtnet_driver::cb_delay`]: 3/4
//! until the device runs dry while the driver wakes, then sooner).

use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{DriverConfig, NetDriver, TxPolicy, TxTechniques};
use vnet::NetHdr;

use super::common::{count, spread, LocalBackend};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 6,
    name: "tx-completion",
    summary: "seed 002: tx delayed callbacks, capacity stop/wake, bounded reclaim on/off: tx interrupts per packet, Mpps",
    run,
};

pub const FRAME: usize = 64;
const BURST: usize = 32;

/// The driver's three seed-002 tx switches, and whether the delayed callback's delay adapts
/// to the wake-up (ours; off in the seed's modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Switches {
    pub delayed_callbacks: bool,
    pub adaptive_delay: bool,
    pub capacity_stop: bool,
    pub bounded_reclaim: bool,
}

const ON: Switches = Switches {
    delayed_callbacks: true,
    adaptive_delay: false,
    capacity_stop: true,
    bounded_reclaim: true,
};

/// The modes, in table order.
pub const MODES: [(&str, Switches); 6] = [
    ("all on (seed 002)", ON),
    (
        "delayed callbacks off",
        Switches {
            delayed_callbacks: false,
            ..ON
        },
    ),
    (
        "capacity stop/wake off",
        Switches {
            capacity_stop: false,
            ..ON
        },
    ),
    (
        "bounded reclaim off",
        Switches {
            bounded_reclaim: false,
            ..ON
        },
    ),
    (
        "all off (before seed 002)",
        Switches {
            delayed_callbacks: false,
            adaptive_delay: false,
            capacity_stop: false,
            bounded_reclaim: false,
        },
    ),
    (
        "all on, delay adapted (ours)",
        Switches {
            adaptive_delay: true,
            ..ON
        },
    ),
];

#[derive(Debug, Serialize)]
pub struct Run {
    pub secs: f64,
    pub packets: u64,
    /// Call eventfd reads that found a notification: the interrupts the driver took.
    pub interrupts: u64,
    /// Call eventfd writes by the device on the tx queue: the interrupts it raised (a read
    /// takes all the writes since the last one).
    pub device_calls: u64,
    /// Times the queue stopped: early (capacity stop/wake) or on a full ring.
    pub stops: u64,
    /// Frames that found the ring full and were retried (only with capacity stop/wake off).
    pub ring_full: u64,
    pub kicks: u64,
}

#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub label: &'static str,
    #[serde(flatten)]
    pub switches: Switches,
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

fn one(switches: Switches, secs: f64) -> Result<Run, BenchError> {
    let b = LocalBackend::start(
        "txcompl",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            ..Default::default()
        },
    )?;
    let tx = TxPolicy {
        techniques: TxTechniques {
            delayed_callbacks: switches.delayed_callbacks,
            adaptive_delay: switches.adaptive_delay,
            capacity_stop: switches.capacity_stop,
            bounded_reclaim: switches.bounded_reclaim,
        },
        ..TxPolicy::default()
    };
    let config = DriverConfig {
        tx,
        ..DriverConfig::default()
    };
    let mut d = NetDriver::connect(&b.socket, &config).map_err(engine)?;
    let mut pairs = d.take_pairs();
    let p = pairs.first_mut().ok_or_else(|| engine("no queue pair"))?;
    let frame = vec![0u8; FRAME];
    let c0 = p.tx.counters.snapshot();
    let calls = || b.counter("tx", |c| c.calls);
    let calls0 = calls();
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while start.elapsed() < limit {
        for _ in 0..BURST {
            while !p.tx.send(&frame, NetHdr::default()).map_err(engine)? {
                p.tx.flush();
                p.tx.wait_wake(10).map_err(engine)?;
            }
        }
        p.tx.flush();
        if !switches.delayed_callbacks {
            // Tx interrupts are left enabled: take the pending one, as the interrupt handler.
            p.tx.ack_interrupt();
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let device_calls = calls().wrapping_sub(calls0);
    p.tx.drain(Duration::from_secs(1)).map_err(engine)?;
    let c = p.tx.counters.snapshot().since(&c0);
    drop(pairs);
    drop(d);
    Ok(Run {
        secs,
        packets: c.packets,
        interrupts: c.interrupts,
        device_calls,
        stops: c.stops,
        ring_full: c.ring_full,
        kicks: c.kicks,
    })
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.2, 1) } else { (0.6, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let mut runs: Vec<Vec<Run>> = MODES.iter().map(|_| Vec::new()).collect();
    for rep in 1..=repeats {
        for (i, (label, switches)) in MODES.iter().enumerate() {
            progress(&format!("[{rep}/{repeats}] tx, {label}"));
            runs[i].push(one(*switches, secs)?);
        }
    }
    let modes = MODES
        .iter()
        .zip(runs)
        .map(|(&(label, switches), runs)| ModeResult {
            label,
            switches,
            mpps: Summary::of_runs(runs.iter().map(|r| r.packets as f64 / r.secs / 1e6)),
            interrupts_per_packet: Summary::of_runs(
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
            "mode",
            "tx Mpps",
            "tx interrupts/packet",
            "stops/packet",
            "ring full/packet",
        ],
    );
    for m in &r.modes {
        let per = |f: fn(&Run) -> u64| {
            let v = m.runs.iter().map(|x| f(x) as f64 / x.packets.max(1) as f64);
            count(Summary::of_runs(v).median)
        };
        t.row(vec![
            m.label.into(),
            m.mpps.display(2),
            count(m.interrupts_per_packet.median),
            per(|x| x.stops),
            per(|x| x.ring_full),
        ]);
    }
    t.note(format!(
        "{} of {:.2} s; per-packet counts: medians.",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note("ring full: frames that found the ring full and were sent again later (capacity stop/wake off: the queue stops only then).");
    t.note("seed: \"fixes TX interrupt storms\" (no figure published): fewer tx interrupts per packet.");
    let irqs = |label: &str| {
        r.modes
            .iter()
            .find(|m| m.label == label)
            .map_or(f64::NAN, |m| m.interrupts_per_packet.median)
    };
    let on = irqs(MODES[0].0);
    for (what, off_label) in [
        ("seed 002 against the driver before it", MODES[4].0),
        ("delayed callbacks alone", MODES[1].0),
    ] {
        let off = irqs(off_label);
        let verdict = if on < off * 0.97 {
            "fewer, the seed's direction"
        } else {
            "NOT FEWER: OUR DIRECTION DIFFERS FROM THE SEED'S (see docs/PERFORMANCE.md)"
        };
        t.note(format!(
            "ours, {what}: tx interrupts/packet {} -> {} (medians): {verdict}",
            count(off),
            count(on)
        ));
    }
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
