//! Driver benchmarks, run by hand (they are `#[ignore]`d and take a minute or more each); the
//! runs go to docs/PERFORMANCE-HISTORY.md, and each path's latest figure to the table of
//! docs/PERFORMANCE.md:
//!
//! ```text
//! cargo test --release -p virtnet-driver --test driver_bench -- --ignored --nocapture --test-threads 1
//! ```
//!
//! `VIRTNET_BENCH_REPEATS=N` sets the rounds of the first, `VIRTNET_BENCH_SIZES=64` its frame
//! sizes, and `VIRTNET_BENCH_GEN_INTERRUPTS=1` runs our driver in its interrupt mode;
//! `VIRTNET_BENCH_GEN_AVAIL_PER_BURST=0|1` overrides whether it publishes the avail index per
//! burst (by default it does when it polls, and not in its interrupt mode);
//! `VIRTNET_BENCH_GEN_QUEUE_SIZE=N` sets its ring and `VIRTNET_BENCH_GEN_SPIN_US=N` how long
//! its interrupt mode polls before each sleep.
//!
//! - `driver_vs_dpdk_virtio_user`: our driver (`virtnet gen --busy-poll`) and DPDK's
//!   virtio-user PMD (testpmd) against the same DPDK vhost PMD, 64 B and 1500 B, both
//!   directions, interleaved in one run. Rates are read on the vhost side (testpmd's port
//!   counters), the same way for both drivers. The vhost PMD's two lcores run on CPU 1, the
//!   driver under test on CPU 0.
//! - `ctrl_queue_cpu_irq_vs_poll`: seed 004's experiment. The device answers each control
//!   command after 10 ms; 1 and 64 threads submit commands; the CPU time the submitting
//!   threads burn is compared between the interrupt and the polling control queue.
//! - `dim_on_vs_off`: `gen` io and rr load through our echo backend with DIM off and on.

use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::inproc;

use testkit::testpmd::Testpmd;
use testkit::{report, ScratchDir};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::gen::{self, GenConfig, GenReport, Mode};
use virtnet_driver::{CtrlMode, DriverConfig, NetDriver};
use vnet::ctrl::{Coalesce, Command};

/// The 1-minute load average: the machine is shared, and the figures move with it.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------
// Our driver against DPDK virtio-user, both on DPDK's vhost PMD.

const WARMUP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(4);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Ours,
    VirtioUser,
}

/// Which way frames go: from the driver to the vhost PMD (vhost `rxonly`) or back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    DriverTx,
    DriverRx,
}

/// One measurement: Mpps seen by the vhost PMD.
fn vhost_rate(size: usize, dir: Dir, peer: Peer, dir_path: &ScratchDir) -> f64 {
    let socket = dir_path.join("vhost.sock");
    let vhost_mode = match dir {
        Dir::DriverTx => "rxonly",
        Dir::DriverRx => "txonly",
    };
    let mut vhost = Testpmd::start_vhost(&socket, 1, vhost_mode, None).expect("testpmd vhost");
    if dir == Dir::DriverRx {
        vhost.command("stop").unwrap();
        vhost.command(&format!("set txpkts {size}")).unwrap();
        vhost.command("start").unwrap();
    }
    let total = WARMUP + MEASURE + Duration::from_secs(1);
    let (ours, mut theirs) = match peer {
        Peer::Ours => {
            let cfg = GenConfig {
                socket: socket.clone(),
                mode: match dir {
                    Dir::DriverTx => Mode::TxOnly,
                    Dir::DriverRx => Mode::RxOnly,
                },
                size,
                duration: total,
                // VIRTNET_BENCH_GEN_INTERRUPTS=1: gen in its default mode, sleeping for the
                // device's interrupts (the per-run lines give interrupts per packet).
                busy_poll: !gen_interrupts(),
                avail_per_burst: gen_avail_per_burst(),
                queue_size: env_or("VIRTNET_BENCH_GEN_QUEUE_SIZE", 256),
                spin: Duration::from_micros(env_or("VIRTNET_BENCH_GEN_SPIN_US", 0)),
                connect_wait: Duration::from_secs(10),
                ..Default::default()
            };
            let t = std::thread::spawn(move || {
                virtnet_sys::pin_thread(0).expect("pin to CPU 0");
                gen::run(&cfg, &mut |_| {})
            });
            (Some(t), None)
        }
        Peer::VirtioUser => {
            // DPDK's virtio-user PMD in testpmd, as the driver, pinned to CPU 0.
            let mode = match dir {
                Dir::DriverTx => "txonly",
                Dir::DriverRx => "rxonly",
            };
            let t = Testpmd::start_virtio_user(&socket, mode, size, "0@0,1@0");
            (None, Some(t.expect("testpmd virtio-user")))
        }
    };
    std::thread::sleep(WARMUP + Duration::from_millis(500));
    let packets = |s: testkit::testpmd::PortStats| match dir {
        Dir::DriverTx => s.rx_packets,
        Dir::DriverRx => s.tx_packets,
    };
    let a = packets(vhost.port_stats().expect("stats"));
    let t0 = Instant::now();
    std::thread::sleep(MEASURE);
    let b = packets(vhost.port_stats().expect("stats"));
    let secs = t0.elapsed().as_secs_f64();
    let mpps = (b - a) as f64 / secs / 1e6;
    if let Some(t) = ours {
        let r: GenReport = t.join().unwrap().expect("gen");
        report(&format!("    gen: {}", r.summary.render()));
    }
    if let Some(t) = theirs.take() {
        drop(t.quit());
    }
    drop(vhost.quit());
    let _ = std::fs::remove_file(&socket);
    std::thread::sleep(Duration::from_millis(300));
    mpps
}

fn gen_interrupts() -> bool {
    std::env::var_os("VIRTNET_BENCH_GEN_INTERRUPTS").is_some_and(|v| v == "1")
}

fn env_or<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn gen_avail_per_burst() -> bool {
    match std::env::var("VIRTNET_BENCH_GEN_AVAIL_PER_BURST").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => !gen_interrupts(),
    }
}

#[test]
#[ignore]
fn driver_vs_dpdk_virtio_user() {
    if !testkit::testpmd::ready("driver_vs_dpdk_virtio_user") {
        return;
    }
    let dir = ScratchDir::new("drvbench").unwrap();
    let repeats = std::env::var("VIRTNET_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut rows = Vec::new();
    let load_before = loadavg();
    // VIRTNET_BENCH_SIZES=64 (a comma-separated list) to run fewer rows.
    let sizes: Vec<usize> = std::env::var("VIRTNET_BENCH_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 1500]);
    println!(
        "gen {}, avail index published per {}",
        if gen_interrupts() {
            "in its interrupt mode (no --busy-poll)"
        } else {
            "polling (--busy-poll)"
        },
        if gen_avail_per_burst() {
            "burst (--avail-per-burst)"
        } else {
            "buffer"
        }
    );
    for size in sizes {
        for d in [Dir::DriverTx, Dir::DriverRx] {
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for rep in 0..repeats {
                // Alternate which goes first.
                let order = if rep % 2 == 0 {
                    [Peer::Ours, Peer::VirtioUser]
                } else {
                    [Peer::VirtioUser, Peer::Ours]
                };
                for peer in order {
                    let m = vhost_rate(size, d, peer, &dir);
                    report(&format!(
                        "{size} B {d:?} {peer:?}: {m:.3} Mpps (load {})",
                        loadavg()
                    ));
                    match peer {
                        Peer::Ours => ours.push(m),
                        Peer::VirtioUser => theirs.push(m),
                    }
                }
            }
            rows.push((size, d, median(ours), median(theirs)));
        }
    }
    println!(
        "\n{repeats} runs each, interleaved; medians. Load average {load_before} before, {} after.",
        loadavg()
    );
    println!("\n| frame | direction | virtnet driver Mpps | DPDK virtio-user Mpps | ratio |");
    println!("|---|---|---|---|---|");
    for (size, d, o, t) in rows {
        let dir = match d {
            Dir::DriverTx => "driver tx -> vhost rxonly",
            Dir::DriverRx => "vhost txonly -> driver rx",
        };
        println!(
            "| {size} B | {dir} | {o:.3} ({:.2} Gbit/s) | {t:.3} ({:.2} Gbit/s) | {:.2}x |",
            o * size as f64 * 8.0 / 1e3,
            t * size as f64 * 8.0 / 1e3,
            o / t
        );
    }
}

// ---------------------------------------------------------------------------------------
// Seed 004: submitter CPU, interrupt against polling control queue.

#[test]
#[ignore]
fn ctrl_queue_cpu_irq_vs_poll() {
    let delay_us = 10_000;
    let b = inproc::start_backend(
        "bench-ctrl",
        BackendConfig {
            io: IoMode::Echo,
            ctrl_delay_us: delay_us,
            ..Default::default()
        },
    );
    println!("\n| ctrl mode | submitters | commands | wall s | submitter CPU s | submitter CPU % | reaper CPU ms |");
    println!("|---|---|---|---|---|---|---|");
    for submitters in [1usize, 64] {
        for mode in [CtrlMode::Poll, CtrlMode::Irq] {
            let per_thread = if submitters == 1 { 50 } else { 2 };
            let cfg = DriverConfig {
                ctrl: Some(mode),
                ctrl_timeout: Duration::from_secs(60),
                ..Default::default()
            };
            let d = NetDriver::connect(&b.socket, &cfg).unwrap();
            let ctrl = d.ctrl().unwrap().clone();
            let reaper0 = ctrl.reaper_cpu_ns();
            let started = Instant::now();
            let threads: Vec<_> = (0..submitters)
                .map(|t| {
                    let ctrl = Arc::clone(&ctrl);
                    std::thread::spawn(move || {
                        let cpu0 = virtnet_sys::thread_cpu_ns();
                        for i in 0..per_thread {
                            let coal = Coalesce {
                                max_packets: (t * 1000 + i) as u32,
                                max_usecs: 1,
                            };
                            ctrl.execute(Command::VqNotfCoalSet { vqn: 0, coal })
                                .unwrap();
                        }
                        virtnet_sys::thread_cpu_ns() - cpu0
                    })
                })
                .collect();
            let cpu_ns: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
            let wall = started.elapsed().as_secs_f64();
            let cpu = cpu_ns as f64 / 1e9;
            let reaper_ms = ctrl.reaper_cpu_ns().saturating_sub(reaper0) as f64 / 1e6;
            println!(
                "| {mode:?} | {submitters} | {} | {wall:.2} | {cpu:.3} | {:.1}% | {reaper_ms:.2} |",
                submitters * per_thread,
                cpu / wall * 100.0
            );
            drop(ctrl);
            drop(d);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

// ---------------------------------------------------------------------------------------
// DIM on against off, and DIM through a polling against an interrupt control queue.

/// The device answers control commands after this long (seed 004's slow device).
const DIM_CTRL_DELAY_US: u32 = 1000;

#[test]
#[ignore]
fn dim_on_vs_off() {
    let pairs = 4;
    let null = inproc::start_backend(
        "bench-dim-null",
        BackendConfig {
            pairs,
            io: IoMode::Null { size: 64 },
            ctrl_delay_us: DIM_CTRL_DELAY_US,
            ..Default::default()
        },
    );
    let echo = inproc::start_backend(
        "bench-dim-echo",
        BackendConfig {
            pairs,
            io: IoMode::Echo,
            ctrl_delay_us: DIM_CTRL_DELAY_US,
            ..Default::default()
        },
    );
    let secs = 5;
    println!(
        "\n| load | DIM | ctrl | rx Mpps | interrupts/packet | gen CPU % | ctrl CPU ms | DIM changes | p50 us | p99 us |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let configs = [
        (false, CtrlMode::Irq),
        (true, CtrlMode::Poll),
        (true, CtrlMode::Irq),
    ];
    for (mode, b) in [(Mode::RxOnly, &null), (Mode::Rr, &echo)] {
        for rep in 0..2 {
            for (dim, ctrl) in configs {
                // Every run starts from no coalescing on the device.
                {
                    let d = NetDriver::connect(
                        &b.socket,
                        &DriverConfig {
                            pairs,
                            ctrl: Some(CtrlMode::Irq),
                            ..Default::default()
                        },
                    )
                    .unwrap();
                    d.set_rx_coalesce(Coalesce::default()).unwrap();
                    d.set_tx_coalesce(Coalesce::default()).unwrap();
                }
                std::thread::sleep(Duration::from_millis(100));
                let cfg = GenConfig {
                    socket: b.socket.clone(),
                    mode,
                    queues: pairs,
                    duration: Duration::from_secs(secs),
                    dim,
                    ctrl,
                    ..Default::default()
                };
                let r = gen::run(&cfg, &mut |_| {}).unwrap();
                let (p50, p99) = r
                    .latency
                    .map_or((f64::NAN, f64::NAN), |l| (l.p50_us, l.p99_us));
                let changes: u64 = r
                    .per_pair
                    .iter()
                    .filter_map(|p| p.dim)
                    .map(|d| d.applied)
                    .sum();
                println!(
                    "| {mode:?} x{pairs} (run {}) | {} | {} | {:.3} | {:.4} | {:.0}% | {:.1} | {} | {p50:.1} | {p99:.1} |",
                    rep + 1,
                    if dim { "on" } else { "off" },
                    if dim { format!("{ctrl:?}") } else { "-".into() },
                    r.summary.rx_mpps,
                    r.summary.interrupts_per_packet,
                    r.cpu_pct,
                    r.ctrl_cpu_s * 1e3,
                    changes,
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
