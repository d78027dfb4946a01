//! What the `switch*` tests share: a switch in this process (echo devices, one worker by
//! default) with ports vm1, vm2 and vm3, our driver as their guests, frames addressed between
//! them, and sending and receiving as a driver does.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, Pair, TempDir, WANTED};
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode};
use vnet::NetHdr;

pub const MAC: [[u8; 6]; 3] = [
    [0x52, 0x54, 0, 0, 0, 1],
    [0x52, 0x54, 0, 0, 0, 2],
    [0x52, 0x54, 0, 0, 0, 3],
];

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
    let dir = temp_dir(tag);
    let s = switch(1);
    for (k, n) in ["vm1", "vm2", "vm3"].iter().enumerate() {
        s.add_port(port(n, &sock(&dir, n), MAC[k])).unwrap();
    }
    (dir, s)
}

/// The socket of port `name` in `dir`.
pub fn sock(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.0.join(format!("{name}.sock"))
}

/// Our driver on each of vm1, vm2 and vm3.
pub fn guests(dir: &TempDir) -> Vec<Pair> {
    ["vm1", "vm2", "vm3"]
        .iter()
        .map(|n| connect_socket(&sock(dir, n), WANTED, 2048))
        .collect()
}
