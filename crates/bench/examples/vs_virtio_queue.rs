//! Our device side against rust-vmm's virtio-queue 0.18, on the same workloads, in one run:
//!
//! ```text
//! cargo run --release -p bench --example vs_virtio_queue [-- --quick] [-- --repeats N]
//! ```
//!
//! Both engines are fed by our driver side through a memfd mapped twice (ours through
//! `GuestMemory::from_sources`, virtio-queue's through vm-memory's `GuestMemoryMmap`). Each
//! repeat runs every workload once per engine, alternating which engine goes first (A/B, then
//! B/A), so slow phases of a shared machine hit both; ratios are the medians of the per-repeat
//! ratios.

#![forbid(unsafe_code)]

use std::time::Duration;

use bench::ring::{device_side, pingpong, ChainShape, RingMemory};
use bench::summary::Summary;
use bench::table::Table;
use bench::BenchError;
use testkit::baseline::VqDevice;

/// Which engine serves the device side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    Vring,
    VirtioQueue,
}

/// One comparison: a workload on each engine; the figure is a rate (higher is better).
struct Row {
    label: String,
    unit: &'static str,
    target: Option<f64>,
    ours: Vec<f64>,
    theirs: Vec<f64>,
    /// Per-op counts of the last runs: (kicks, interrupts, used.idx stores), ours then theirs.
    counts: Option<([f64; 3], [f64; 3])>,
}

impl Row {
    fn new(label: &str, unit: &'static str, target: Option<f64>) -> Row {
        Row {
            label: label.into(),
            unit,
            target,
            ours: vec![],
            theirs: vec![],
            counts: None,
        }
    }
}

fn pingpong_once(
    engine: Engine,
    mode: pingpong::Mode,
    device_poll: Duration,
    ops: u64,
) -> Result<pingpong::Run, BenchError> {
    let ring = RingMemory::new(mode.features())?;
    let mut cfg = pingpong::Config::new(mode, ops);
    cfg.device_poll = device_poll;
    match engine {
        Engine::Vring => pingpong::run(&ring, ring.vring_device()?, &cfg),
        Engine::VirtioQueue => {
            // The driver initialises the rings; virtio-queue reads them from then on.
            let device = VqDevice::new(&ring)?;
            pingpong::run(&ring, device, &cfg)
        }
    }
}

fn device_side_once(
    engine: Engine,
    shape: ChainShape,
    rounds: u64,
) -> Result<device_side::Run, BenchError> {
    let ring = RingMemory::new(device_side::FEATURES)?;
    let cfg = device_side::Config {
        shape,
        rounds,
        deadline: None,
    };
    match engine {
        Engine::Vring => device_side::run(&ring, ring.vring_device()?, &cfg),
        Engine::VirtioQueue => device_side::run(&ring, VqDevice::new(&ring)?, &cfg),
    }
}

fn per_op(r: &pingpong::Run) -> [f64; 3] {
    [
        r.kicks_per_op(),
        r.interrupts_per_op(),
        r.used_idx_stores_per_op(),
    ]
}

struct Args {
    repeats: u32,
    poll_ops: u64,
    sleep_ops: u64,
    rounds: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        repeats: 7,
        poll_ops: 1 << 20,
        sleep_ops: 1 << 19,
        rounds: 50_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => {
                args.repeats = 3;
                args.poll_ops = 1 << 18;
                args.sleep_ops = 1 << 15;
                args.rounds = 5_000;
            }
            "--repeats" => {
                args.repeats = it
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .unwrap_or_else(|| usage())
            }
            _ => usage(),
        }
    }
    args
}

fn usage() -> ! {
    eprintln!("usage: vs_virtio_queue [--quick] [--repeats N]");
    std::process::exit(2)
}

fn main() -> Result<(), BenchError> {
    let args = parse_args();
    let poll64 = pingpong::Mode::Poll { used_batch: 64 };
    let mut rows = vec![
        Row::new("ping-pong, poll (vring used batch 64)", "Mops/s", Some(1.5)),
        Row::new("ping-pong, poll (vring used batch 1)", "Mops/s", None),
        Row::new("ping-pong, sleep, event idx", "Mops/s", None),
        Row::new("ping-pong, sleep, flags", "Mops/s", None),
        Row::new(
            "ping-pong, sleep, flags, device polls 5 us first",
            "Mops/s",
            Some(1.0),
        ),
        Row::new("device side, 1-descriptor chains", "Mdesc/s", Some(3.0)),
        Row::new("device side, 4-descriptor chains", "Mdesc/s", Some(3.0)),
    ];
    let (now, poll) = (Duration::ZERO, Duration::from_micros(5));
    let flags = pingpong::Mode::Sleep { event_idx: false };
    let pp_modes = [
        (poll64, now, args.poll_ops),
        (pingpong::Mode::Poll { used_batch: 1 }, now, args.poll_ops),
        (
            pingpong::Mode::Sleep { event_idx: true },
            now,
            args.sleep_ops,
        ),
        (flags, now, args.sleep_ops),
        (flags, poll, args.sleep_ops),
    ];
    let shapes = [ChainShape::ONE, ChainShape::FOUR];
    for rep in 0..args.repeats {
        eprint!("\rrepeat {}/{}", rep + 1, args.repeats);
        // A/B on even repeats, B/A on odd ones.
        let order = if rep % 2 == 0 {
            [Engine::Vring, Engine::VirtioQueue]
        } else {
            [Engine::VirtioQueue, Engine::Vring]
        };
        for (row, &(mode, device_poll, ops)) in rows.iter_mut().zip(&pp_modes) {
            let mut counts = ([0.0; 3], [0.0; 3]);
            for engine in order {
                // virtio-queue has no used batch: its poll run is the same in both poll rows.
                let r = pingpong_once(engine, mode, device_poll, ops)?;
                match engine {
                    Engine::Vring => {
                        row.ours.push(r.mops());
                        counts.0 = per_op(&r);
                    }
                    Engine::VirtioQueue => {
                        row.theirs.push(r.mops());
                        counts.1 = per_op(&r);
                    }
                }
            }
            row.counts = Some(counts);
        }
        for (row, &shape) in rows[5..].iter_mut().zip(&shapes) {
            for engine in order {
                let r = device_side_once(engine, shape, args.rounds)?;
                match engine {
                    Engine::Vring => row.ours.push(r.mdesc_per_sec()),
                    Engine::VirtioQueue => row.theirs.push(r.mdesc_per_sec()),
                }
            }
        }
    }
    eprintln!();

    let mut t = Table::new(
        format!(
            "vring vs rust-vmm virtio-queue 0.18 on the device side (our driver side for both); \
             {} interleaved repeats",
            args.repeats
        ),
        &[
            "workload",
            "unit",
            "vring",
            "virtio-queue",
            "ratio",
            "target",
        ],
    );
    for row in &rows {
        let ratios: Vec<f64> = row
            .ours
            .iter()
            .zip(&row.theirs)
            .map(|(a, b)| a / b)
            .collect();
        let ratio = Summary::of(&ratios).expect("repeats > 0");
        let verdict = match row.target {
            Some(x) if ratio.median >= x => format!(">= {x}x: met"),
            Some(x) => format!(">= {x}x: NOT met"),
            None => String::new(),
        };
        t.row(vec![
            row.label.clone(),
            row.unit.into(),
            Summary::of(&row.ours).expect("repeats > 0").display(2),
            Summary::of(&row.theirs).expect("repeats > 0").display(2),
            format!("{:.2}x ({:.2}..{:.2})", ratio.median, ratio.min, ratio.max),
            verdict,
        ]);
    }
    t.note("Figures: median (min..max); ratio: median (min..max) of the per-repeat ratios.");
    t.note("Ping-pong: driver thread on CPU 0, device thread on CPU 1, queue 256.");
    println!("{t}");

    let mut c = Table::new(
        "Per-op counts of the last repeat (ping-pong)",
        &[
            "workload",
            "kicks/op",
            "interrupts/op",
            "used.idx stores/op",
            "vq kicks/op",
            "vq interrupts/op",
            "vq used.idx stores/op",
        ],
    );
    for row in rows.iter().filter(|r| r.counts.is_some()) {
        let (a, b) = row.counts.expect("filtered");
        let mut cells = vec![row.label.clone()];
        cells.extend(a.iter().chain(&b).map(|x| format!("{x:.4}")));
        c.row(cells);
    }
    c.note("virtio-queue ignores VRING_AVAIL_F_NO_INTERRUPT without event idx, and stores");
    c.note("used.idx on every add_used.");
    println!("{c}");
    Ok(())
}
