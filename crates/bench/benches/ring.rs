//! Criterion benches of the ring workloads, for both device-side engines: ours (vring) and
//! rust-vmm's virtio-queue 0.18, each fed by our driver side over a memfd mapped twice.
//!
//! ```text
//! cargo bench -p bench --bench ring                # everything (about a minute)
//! cargo bench -p bench --bench ring -- device_side # one group
//! ```
//!
//! `pingpong/*`: one iteration is one chain through the two-thread ping-pong (driver thread on
//! CPU 0, device thread on CPU 1). `device_side/*`: one iteration is a round of 64 chains in
//! one thread, timed on the device's part only; throughput is in descriptors.
//! For side-by-side ratios in one run, use `cargo run --release -p bench --example
//! vs_virtio_queue` instead.

#![forbid(unsafe_code)]

use std::time::Duration;

use bench::experiments::ring::{MODES, SHAPES};
use bench::ring::{device_side, pingpong, RingMemory};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use testkit::baseline::VqDevice;

fn pingpong_once(vq: bool, mode: pingpong::Mode, ops: u64) -> Duration {
    let ops = ops.max(1);
    let ring = RingMemory::new(mode.features()).expect("ring memory");
    let cfg = pingpong::Config::new(mode, ops);
    let run = if vq {
        let device = VqDevice::new(&ring).expect("virtio-queue device");
        pingpong::run(&ring, device, &cfg)
    } else {
        pingpong::run(&ring, ring.vring_device().expect("vring device"), &cfg)
    };
    Duration::from_secs_f64(run.expect("ping-pong run").secs)
}

fn pingpong_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong");
    g.throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for mode in MODES {
        g.bench_function(BenchmarkId::new("vring", mode.label()), |b| {
            b.iter_custom(|ops| pingpong_once(false, mode, ops))
        });
    }
    // virtio-queue has no used batch: one poll run stands for all batch sizes.
    for mode in [MODES[0], MODES[3], MODES[4]] {
        let label = match mode {
            pingpong::Mode::Poll { .. } => "poll".to_string(),
            m => m.label(),
        };
        g.bench_function(BenchmarkId::new("virtio-queue", label), |b| {
            b.iter_custom(|ops| pingpong_once(true, mode, ops))
        });
    }
    g.finish();
}

fn device_side_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("device_side");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for shape in SHAPES {
        let descs = shape.descriptors();
        g.throughput(Throughput::Elements(
            device_side::BATCH as u64 * descs as u64,
        ));
        for vq in [false, true] {
            let engine = if vq { "virtio-queue" } else { "vring" };
            g.bench_function(BenchmarkId::new(engine, format!("{descs}-desc")), |b| {
                b.iter_custom(|rounds| {
                    let ring = RingMemory::new(device_side::FEATURES).expect("ring memory");
                    let cfg = device_side::Config {
                        shape,
                        rounds: rounds.max(1),
                        deadline: None,
                    };
                    let run = if vq {
                        device_side::run(&ring, VqDevice::new(&ring).expect("vq"), &cfg)
                    } else {
                        device_side::run(&ring, ring.vring_device().expect("vring"), &cfg)
                    };
                    Duration::from_secs_f64(run.expect("device-side run").device_secs)
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, pingpong_benches, device_side_benches);
criterion_main!(benches);
