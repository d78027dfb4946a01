//! Criterion bench of the switch's forwarding step in one thread: guest A's tx path takes a
//! batch of 64-byte frames, `GuestPort::send` and `SwitchCore::forward` put them into guest
//! B's rx buffers (known unicast, mergeable buffers; with and without IN_ORDER), timed on the
//! device's part only (the two guests' drivers post and reap outside the timer). One
//! iteration is one frame.
//!
//! Everything is in this CPU's cache: what it measures is the switch's instructions per frame,
//! not the cross-CPU line transfers that `scripts/switch-compare.sh` also pays. It is the
//! steady figure to compare a change by on this noisy machine.
//!
//! `switch_scaling` asks whether the switch's shared state (the port table's and the FDB's read
//! locks, which every batch takes) lets two workers forward twice what one does (each pair has
//! its own ports and sinks here): two pairs of guests on one switch,
//! forwarded by one thread (each pair's frames in turn) or by two (a pair each, as two
//! workers would). There the time is the wall time of everything, the guests' drivers
//! included (each beside its worker), since on two CPUs there is no third for them.
//!
//! ```text
//! cargo bench -p bench --bench switch
//! ```

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use virtnet_backend::switch::core::{Out, SwitchCore};
use virtnet_backend::switch::fdb::FdbConfig;
use virtnet_backend::switch::guest::GuestPort;
use virtnet_backend::switch::mac::Mac;
use virtnet_backend::switch::sink::Sink;
use virtnet_backend::switch::{PortConfig, PortId};
use virtnet_backend::tx::TxPath;
use virtnet_backend::{fuzzing, BackendConfig, QueueId};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vnet::feature;
use vring::{Buf, DriverQueue, Features, GuestAddress, GuestMemory};

const SIZE: u16 = 256;
const TX_RING: u64 = 0;
const RX_RING: u64 = 0x4000;
const TX_DATA: u64 = 0x1_0000;
const RX_DATA: u64 = 0x10_0000;
const SLOT: u64 = 2048;
const MEM: usize = 0x20_0000;

fn eventfd() -> EventFd {
    EventFd::new(EFD_NONBLOCK).expect("an eventfd")
}

/// A guest of the switch: its memory, device state, tx path and port, rx driver.
struct Guest {
    mem: Arc<GuestMemory>,
    tx_driver: DriverQueue<u32>,
    rx_driver: DriverQueue<u32>,
    tx: TxPath,
    port: GuestPort,
    mac: [u8; 6],
}

fn mac(n: u8) -> [u8; 6] {
    [0x52, 0x54, 0, 0, 0x5e, n]
}

fn guest(core: &Arc<SwitchCore>, n: u8, features: Features) -> Guest {
    let id = PortId::new(n as usize).expect("a port number");
    let config = BackendConfig {
        mac: mac(n),
        ..BackendConfig::default()
    };
    let shared = Arc::new(fuzzing::shared(config).expect("device state"));
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM)]).expect("memory"));
    let sink = Arc::new(Sink::new(eventfd()));
    // No call eventfds: a notification would cost a system call the bench does not measure.
    let (rx_driver, rt) = fuzzing::queue_pair(
        &shared,
        &mem,
        QueueId::Rx(0),
        (RX_RING, SIZE),
        features,
        false,
    );
    assert!(sink.start(rt).is_none());
    let (tx_driver, rt) = fuzzing::queue_pair(
        &shared,
        &mem,
        QueueId::Tx(0),
        (TX_RING, SIZE),
        features,
        false,
    );
    let mut tx = TxPath::default();
    assert!(tx.start(rt).is_none());
    let port = GuestPort::new(id, core.clone(), sink.clone(), None);
    let out = Out::Guest {
        shared,
        sinks: vec![sink].into(),
    };
    core.add_port(id, PortConfig::guest(Mac::new(mac(n))), out)
        .expect("a port");
    Guest {
        mem,
        tx_driver,
        rx_driver,
        tx,
        port,
        mac: mac(n),
    }
}

/// One tx turn of `a`: the forwarding step measured. Never inlined, so that a profiler counts
/// it alone (callgrind's `--toggle-collect='*forward_batch*'`) whatever inlining LTO does.
#[inline(never)]
fn forward_batch(a: &mut Guest) {
    a.tx.turn(&mut a.port);
}

/// Forwards `frames` frames of `len` bytes from `a` to `b` in batches of `batch`; the time
/// of the tx turns alone.
fn run(a: &mut Guest, b: &mut Guest, len: usize, batch: u64, frames: u64) -> Duration {
    let mut frame = vec![0u8; vnet::HDR_LEN + len];
    frame[vnet::HDR_LEN..][..6].copy_from_slice(&b.mac);
    frame[vnet::HDR_LEN..][6..12].copy_from_slice(&a.mac);
    frame[vnet::HDR_LEN..][12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    for k in 0..SIZE as u64 {
        a.mem
            .write(GuestAddress(TX_DATA + k * SLOT), &frame)
            .expect("the tx area");
    }
    let mut took = Duration::ZERO;
    let mut done = 0;
    let mut slot = 0u64;
    while done < frames {
        let n = batch.min(frames - done);
        for _ in 0..n {
            let at = GuestAddress(TX_DATA + slot * SLOT);
            a.tx_driver
                .add(&[Buf::new(at, frame.len() as u32)], &[], 0)
                .expect("room on tx");
            let at = GuestAddress(RX_DATA + slot * SLOT);
            b.rx_driver
                .add(&[], &[Buf::new(at, SLOT as u32)], 0)
                .expect("room on rx");
            slot = (slot + 1) % SIZE as u64;
        }
        a.tx_driver.kick_prepare();
        b.rx_driver.kick_prepare();
        let t = Instant::now();
        forward_batch(a);
        took += t.elapsed();
        let mut got = 0;
        while a.tx_driver.get_used().expect("tx used").is_some() {}
        while b.rx_driver.get_used().expect("rx used").is_some() {
            got += 1;
        }
        assert_eq!(got, n, "frames forwarded");
        done += n;
    }
    took
}

fn forward_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("switch_forward");
    g.throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let core = Arc::new(SwitchCore::new(FdbConfig::default()).expect("a switch"));
    let plain = Features::VERSION_1 | feature::MRG_RXBUF;
    let mut a = guest(&core, 1, plain);
    let mut b = guest(&core, 2, plain);
    for (len, batch) in [(64, 32), (64, 8), (64, 1), (1500, 32)] {
        let id = BenchmarkId::new(format!("{len}B"), format!("batch{batch}"));
        g.bench_function(id, |bench| {
            bench.iter_custom(|frames| run(&mut a, &mut b, len, batch, frames))
        });
    }
    // As DPDK's virtio-user and our driver negotiate: one used element per transmitted run.
    let in_order = plain | Features::IN_ORDER;
    let mut a = guest(&core, 3, in_order);
    let mut b = guest(&core, 4, in_order);
    let id = BenchmarkId::new("64B-in_order", "batch32");
    g.bench_function(id, |bench| {
        bench.iter_custom(|frames| run(&mut a, &mut b, 64, 32, frames))
    });
    g.finish();
}

fn scaling_benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("switch_scaling");
    g.throughput(Throughput::Elements(1))
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let core = Arc::new(SwitchCore::new(FdbConfig::default()).expect("a switch"));
    let features = Features::VERSION_1 | feature::MRG_RXBUF;
    let mut pairs = [1, 3].map(|n| (guest(&core, n, features), guest(&core, n + 1, features)));
    g.bench_function("64B/1_worker", |bench| {
        bench.iter_custom(|frames| {
            let t = Instant::now();
            for (a, b) in pairs.iter_mut() {
                run(a, b, 64, 32, frames.div_ceil(2));
            }
            t.elapsed()
        })
    });
    g.bench_function("64B/2_workers", |bench| {
        bench.iter_custom(|frames| {
            let t = Instant::now();
            std::thread::scope(|s| {
                for (a, b) in pairs.iter_mut() {
                    s.spawn(move || run(a, b, 64, 32, frames.div_ceil(2)));
                }
            });
            t.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, forward_benches, scaling_benches);
criterion_main!(benches);
