//! `virtnet switch` with our driver as its guests, in one process: frames go from one guest's
//! tx buffers into another's rx buffers byte for byte; a port sends only from its MAC; a
//! broadcast reaches every other port and not its sender; a guest that stops taking frames
//! costs its senders drops, never a stall, and the switch's other ports keep their traffic;
//! a removed port gets nothing and its MAC's entry goes; the workers run under the seccomp
//! filter and are idle once the traffic stops.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, thread_cpu_ticks, thread_seccomp, Pair, WANTED};
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode};
use vnet::NetHdr;

const MAC: [[u8; 6]; 3] = [
    [0x52, 0x54, 0, 0, 0, 1],
    [0x52, 0x54, 0, 0, 0, 2],
    [0x52, 0x54, 0, 0, 0, 3],
];

fn switch(workers: usize) -> Arc<Switch> {
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

fn port(name: &str, socket: &Path, mac: [u8; 6]) -> PortSpec {
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
fn frame(dst: [u8; 6], src: [u8; 6], i: u32, len: usize) -> Vec<u8> {
    let mut f = testkit::inproc::frame(i, len);
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f
}

/// Sends `frames` from `p`, waiting for room as a driver does.
fn send_all(p: &mut Pair, frames: &[Vec<u8>]) {
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
fn receive(p: &mut Pair, count: usize, within: Duration) -> Vec<Vec<u8>> {
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
/// `tag`, and our driver on each.
fn three_guests(tag: &str) -> (testkit::inproc::TempDir, Arc<Switch>, Vec<Pair>) {
    let dir = temp_dir(tag);
    let s = switch(1);
    let sock = |n: &str| dir.0.join(format!("{n}.sock"));
    for (k, n) in ["vm1", "vm2", "vm3"].iter().enumerate() {
        s.add_port(port(n, &sock(n), MAC[k])).unwrap();
    }
    let g = ["vm1", "vm2", "vm3"]
        .iter()
        .map(|n| connect_socket(&sock(n), WANTED, 2048))
        .collect();
    (dir, s, g)
}

#[test]
fn guests_exchange_frames_byte_for_byte_and_ports_send_only_from_their_mac() {
    let (_dir, s, mut g) = three_guests("switch-basic");

    // Unicast both ways, sizes from the smallest to a full MTU frame: byte for byte.
    let sizes = [60usize, 64, 65, 128, 1000, 1514];
    let to2: Vec<Vec<u8>> = (0..200)
        .map(|i| frame(MAC[1], MAC[0], i, sizes[i as usize % sizes.len()]))
        .collect();
    send_all(&mut g[0], &to2);
    assert_eq!(receive(&mut g[1], to2.len(), Duration::from_secs(5)), to2);
    let to1: Vec<Vec<u8>> = (0..200).map(|i| frame(MAC[0], MAC[1], i, 1514)).collect();
    send_all(&mut g[1], &to1);
    assert_eq!(receive(&mut g[0], to1.len(), Duration::from_secs(5)), to1);
    // Known unicast reached only its port: vm3 got none of it (vm2's MAC is static, and vm1's
    // too, so not even the first frames flooded).
    assert!(receive(&mut g[2], 1, Duration::from_millis(200)).is_empty());

    // A broadcast from vm3 reaches vm1 and vm2, and not vm3.
    let b = frame([0xff; 6], MAC[2], 7, 100);
    send_all(&mut g[2], std::slice::from_ref(&b));
    assert_eq!(
        receive(&mut g[0], 1, Duration::from_secs(5)),
        std::slice::from_ref(&b)
    );
    assert_eq!(
        receive(&mut g[1], 1, Duration::from_secs(5)),
        std::slice::from_ref(&b)
    );
    assert!(receive(&mut g[2], 1, Duration::from_millis(200)).is_empty());

    // Spoofed sources from vm1: dropped, counted on vm1's port, none delivered.
    let spoofed: Vec<Vec<u8>> = (0..50)
        .map(|i| frame([0xff; 6], [0x02, 0, 0, 0, 0, i as u8], i, 64))
        .collect();
    send_all(&mut g[0], &spoofed);
    assert!(receive(&mut g[1], 1, Duration::from_millis(300)).is_empty());
    assert!(receive(&mut g[2], 1, Duration::from_millis(100)).is_empty());
    let report = s
        .reports()
        .into_iter()
        .find(|r| r.spec.name == "vm1")
        .unwrap();
    let drops = serde_json::to_value(report.drops.unwrap()).unwrap();
    let spoof: u64 = drops
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.contains("spoof") || k.contains("source"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert_eq!(spoof, 50, "{drops}");
    // No spoofed MAC was learned.
    let fdb = serde_json::to_value(s.core().fdb_show()).unwrap();
    assert!(!fdb.to_string().contains("02:00:00:00:00"), "{fdb}");

    // The workers ran under the seccomp filter, and go idle once the traffic stops.
    assert_eq!(thread_seccomp("virtnet-switch0"), [2]);
    std::thread::sleep(Duration::from_millis(300));
    let ticks = thread_cpu_ticks("virtnet-switch0");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        thread_cpu_ticks("virtnet-switch0") <= ticks + 5,
        "an idle switch spun"
    );
    drop(g);
    s.shutdown();
}

#[test]
fn a_guest_that_takes_no_frames_costs_its_senders_drops_not_a_stall() {
    let (dir, s, mut g) = three_guests("switch-stall");
    let sock = |n: &str| dir.0.join(format!("{n}.sock"));
    // vm2 never polls its rx ring: after its 256 buffers fill, every frame for it is dropped.
    // vm1 sends 5000 to vm2, then 100 to vm3, which all arrive.
    let to2: Vec<Vec<u8>> = (0..5000).map(|i| frame(MAC[1], MAC[0], i, 64)).collect();
    let started = Instant::now();
    send_all(&mut g[0], &to2);
    let to3: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC[2], MAC[0], i, 64)).collect();
    send_all(&mut g[0], &to3);
    assert_eq!(receive(&mut g[2], 100, Duration::from_secs(5)), to3);
    assert!(started.elapsed() < Duration::from_secs(5));
    let vm2 = s
        .reports()
        .into_iter()
        .find(|r| r.spec.name == "vm2")
        .unwrap();
    let rx = serde_json::to_value(&vm2.queues[0]).unwrap();
    assert_eq!(rx["kind"], "rx", "{rx}");
    assert!(rx["packets"].as_u64().unwrap() <= 256, "{rx}");
    assert!(
        rx["packets"].as_u64().unwrap() + rx["rx_missed"].as_u64().unwrap() == 5000,
        "every frame for vm2 delivered or counted missed: {rx}"
    );
    // vm2 then takes what it has: the first frames, in order.
    let got = receive(&mut g[1], 256, Duration::from_secs(2));
    assert!(!got.is_empty() && got.iter().zip(&to2).all(|(a, b)| a == b));

    // Removing vm3: vm1's frames for it are dropped from then on, and its MAC is forgotten.
    s.remove_port("vm3").unwrap();
    send_all(&mut g[0], &to3);
    assert!(receive(&mut g[2], 1, Duration::from_millis(300)).is_empty());
    let fdb = serde_json::to_value(s.core().fdb_show())
        .unwrap()
        .to_string();
    assert!(!fdb.contains("52:54:00:00:00:03"), "{fdb}");
    // And added again, a fresh guest on it gets vm1's frames.
    drop(g.pop());
    s.add_port(port("vm3", &sock("vm3"), MAC[2])).unwrap();
    let mut g3 = connect_socket(&sock("vm3"), WANTED, 2048);
    send_all(&mut g[0], &to3);
    assert_eq!(receive(&mut g3, 100, Duration::from_secs(5)), to3);
    s.shutdown();
}
