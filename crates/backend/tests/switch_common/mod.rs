//! What the `switch*` tests share: a switch in this process (echo devices, one worker by
//! default) with ports vm1, vm2, vm3 (and vm4 where a case needs it), our driver as their
//! guests, frames addressed between them, and sending and receiving as a driver does.
#![allow(dead_code)]

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, Pair, TempDir, WANTED};
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode, TxQueue};
use vnet::NetHdr;

pub const MAC: [[u8; 6]; 4] = [
    [0x52, 0x54, 0, 0, 0, 1],
    [0x52, 0x54, 0, 0, 0, 2],
    [0x52, 0x54, 0, 0, 0, 3],
    [0x52, 0x54, 0, 0, 0, 4],
];

/// The ports' names, in the order of `MAC`.
pub const NAMES: [&str; 4] = ["vm1", "vm2", "vm3", "vm4"];

pub fn switch(workers: usize) -> Arc<Switch> {
    Switch::start(SwitchConfig {
        workers: vec![None; workers],
        uplink: None,
        fdb: FdbConfig::default(),
        device: BackendConfig {
            io: IoMode::Echo,
            ..BackendConfig::default()
        },
    })
    .expect("switch")
}

pub fn port(name: &str, socket: &Path, mac: [u8; 6]) -> PortSpec {
    PortSpec {
        name: name.into(),
        socket: socket.into(),
        mac,
        queues: 1,
        client: false,
        spoof_check: true,
    }
}

/// A frame from `src` to `dst`, numbered `i`, `len` bytes.
pub fn frame(dst: [u8; 6], src: [u8; 6], i: u32, len: usize) -> Vec<u8> {
    let mut f = testkit::inproc::frame(i, len);
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f
}

/// Sends `frames` from `p`, waiting for room as a driver does.
pub fn send_all(p: &mut Pair, frames: &[Vec<u8>]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for f in frames {
        while !p.tx.send(f, NetHdr::default()).unwrap() {
            p.tx.flush();
            assert!(Instant::now() < deadline, "tx never had room");
            p.tx.wait_wake(10).unwrap();
        }
    }
    p.tx.flush();
}

/// Sends `frames[i]` from `txs[i]` at full rate until `stop`, from one thread: a burst of up
/// to 32 from each queue in turn (the first rotating), skipping a queue whose ring is full,
/// each frame from a buffer that already holds it. With frames long enough that the sender
/// outruns the switch, the rings stay full and what each queue sends is what the switch took
/// from it, not what the scheduler gave a sender thread of its own (with a thread each, the
/// shares followed whichever sender was left off its CPU). Gives back the queues and how many
/// frames each sent.
pub fn send_in_turn(
    mut txs: Vec<TxQueue>,
    frames: Vec<Vec<u8>>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<(Vec<TxQueue>, Vec<u64>)> {
    std::thread::spawn(move || {
        let n = txs.len();
        let (mut first, mut sent) = (0, vec![0u64; n]);
        while !stop.load(Relaxed) {
            let before: u64 = sent.iter().sum();
            for i in (0..n).map(|k| (first + k) % n) {
                let tx = &mut txs[i];
                if tx.is_stopped() && !tx.wait_wake(0).unwrap() {
                    continue;
                }
                for _ in 0..32 {
                    if !tx.send_tagged(&frames[i], NetHdr::default(), 1).unwrap() {
                        break;
                    }
                    sent[i] += 1;
                }
                tx.flush();
            }
            first = (first + 1) % n;
            if sent.iter().sum::<u64>() == before {
                std::thread::yield_now();
            }
        }
        (txs, sent)
    })
}

/// Whether the smallest of `counts` is within 20% of the largest.
pub fn within_a_fifth(counts: &[u64]) -> bool {
    let (min, max) = (counts.iter().min(), counts.iter().max());
    min.zip(max)
        .is_some_and(|(&min, &max)| min as f64 >= 0.8 * max as f64)
}

/// What `p` receives within `within`, stopping early once it has `count` frames.
pub fn receive(p: &mut Pair, count: usize, within: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    while got.len() < count && Instant::now() < deadline {
        p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
        if got.len() < count {
            p.rx.wait(10);
        }
    }
    got
}

/// A switch with ports vm1, vm2 and vm3 (MACs `MAC`), sockets in a directory named after
/// `tag`; no guest yet.
pub fn three_ports(tag: &str) -> (TempDir, Arc<Switch>) {
    ports(tag, 3)
}

/// A switch with the first `n` ports of `NAMES` (MACs `MAC`), as [`three_ports`].
pub fn ports(tag: &str, n: usize) -> (TempDir, Arc<Switch>) {
    let dir = temp_dir(tag);
    let s = switch(1);
    for (k, name) in NAMES[..n].iter().enumerate() {
        s.add_port(port(name, &sock(&dir, name), MAC[k])).unwrap();
    }
    (dir, s)
}

/// The socket of port `name` in `dir`.
pub fn sock(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.0.join(format!("{name}.sock"))
}

/// Our driver on each of vm1, vm2 and vm3.
pub fn guests(dir: &TempDir) -> Vec<Pair> {
    guests_on(dir, 3)
}

/// Our driver on each of the first `n` ports of `NAMES`.
pub fn guests_on(dir: &TempDir, n: usize) -> Vec<Pair> {
    NAMES[..n]
        .iter()
        .map(|name| connect_socket(&sock(dir, name), WANTED, 2048))
        .collect()
}
