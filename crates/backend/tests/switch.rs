//! `virtnet switch` with our driver as its guests, in one process: frames go from one guest's
//! tx buffers into another's rx buffers byte for byte; a port sends only from its MAC; a
//! broadcast reaches every other port and not its sender; a guest that stops taking frames
//! costs its senders drops, never a stall, and the switch's other ports keep their traffic;
//! a removed port gets nothing, its MAC's entry goes and its frontend is disconnected; a
//! migrated guest's MAC moves to its new port at once on a RARP, its own or SEND_RARP's.
//!
//! Each case ends with the recovery check ([`recovery::assert_recovered`] on
//! [`SwitchPorts`]): the switch's threads alive (its workers under the seccomp filter) and
//! idle, two ports the case left alone exchanging frames on fresh connections within a
//! second, and the process's descriptors and memory back to what they were before the case.
//! Those are the process's, so the tests take [`recovery::exclusive`] first and run one at a
//! time.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, Pair, TempDir, WANTED};
use testkit::recovery::{self, Baseline, SwitchPorts};
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
/// `tag`; no guest yet.
fn three_ports(tag: &str) -> (TempDir, Arc<Switch>) {
    let dir = temp_dir(tag);
    let s = switch(1);
    for (k, n) in ["vm1", "vm2", "vm3"].iter().enumerate() {
        s.add_port(port(n, &sock(&dir, n), MAC[k])).unwrap();
    }
    (dir, s)
}

/// The socket of port `name` in `dir`.
fn sock(dir: &TempDir, name: &str) -> std::path::PathBuf {
    dir.0.join(format!("{name}.sock"))
}

/// Our driver on each of vm1, vm2 and vm3.
fn guests(dir: &TempDir) -> Vec<Pair> {
    ["vm1", "vm2", "vm3"]
        .iter()
        .map(|n| connect_socket(&sock(dir, n), WANTED, 2048))
        .collect()
}

#[test]
fn guests_exchange_frames_byte_for_byte_and_ports_send_only_from_their_mac() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-basic");
    let check = SwitchPorts::new(&s, "vm2", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);

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
    drop(g);
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

#[test]
fn a_guest_that_takes_no_frames_costs_its_senders_drops_not_a_stall() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-stall");
    let check = SwitchPorts::new(&s, "vm1", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);
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
    s.add_port(port("vm3", &sock(&dir, "vm3"), MAC[2])).unwrap();
    let mut g3 = connect_socket(&sock(&dir, "vm3"), WANTED, 2048);
    send_all(&mut g[0], &to3);
    assert_eq!(receive(&mut g3, 100, Duration::from_secs(5)), to3);
    drop((g, g3));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// Sends `frames` from `p` as [`send_all`] does, each with header `hdr`.
fn send_with(p: &mut Pair, frames: &[Vec<u8>], hdr: NetHdr) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for f in frames {
        while !p.tx.send(f, hdr).unwrap() {
            p.tx.flush();
            assert!(Instant::now() < deadline, "tx never had room");
            p.tx.wait_wake(10).unwrap();
        }
    }
    p.tx.flush();
}

/// vm2 and vm3 exchange 100 frames each way, byte for byte: the switch still serves them.
fn others_still_talk(g: &mut [Pair]) {
    let _ = receive(&mut g[1], usize::MAX, Duration::from_millis(200));
    let _ = receive(&mut g[2], usize::MAX, Duration::from_millis(200));
    let to3: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC[2], MAC[1], i, 200)).collect();
    send_all(&mut g[1], &to3);
    assert_eq!(receive(&mut g[2], 100, Duration::from_secs(5)), to3);
    let to2: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC[1], MAC[2], i, 200)).collect();
    send_all(&mut g[2], &to2);
    assert_eq!(receive(&mut g[1], 100, Duration::from_secs(5)), to2);
}

/// The MAC table's entries on port `name`.
fn fdb_entries_on(s: &Switch, port: usize) -> usize {
    let fdb = serde_json::to_value(s.core().fdb_show()).unwrap();
    fdb["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["port"] == port)
        .count()
}

#[test]
fn a_mac_flooding_guest_is_held_to_its_learn_limit_and_evicts_nobody() {
    let exclusive = recovery::exclusive();
    let dir = temp_dir("switch-macflood");
    let s = switch(1);
    // vm1 may send from other sources (a guest that bridges): its learning is bounded.
    let mut flooder = port("vm1", &sock(&dir, "vm1"), MAC[0]);
    flooder.spoof_check = false;
    s.add_port(flooder).unwrap();
    s.add_port(port("vm2", &sock(&dir, "vm2"), MAC[1])).unwrap();
    s.add_port(port("vm3", &sock(&dir, "vm3"), MAC[2])).unwrap();
    let check = SwitchPorts::new(&s, "vm2", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);
    // 20,000 frames from as many random sources, to vm2.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let flood: Vec<Vec<u8>> = (0..20_000)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut src = x.to_le_bytes()[..6].try_into().unwrap();
            let src: &mut [u8; 6] = &mut src;
            src[0] = (src[0] & 0xfe) | 0x02; // unicast, locally administered
            frame(MAC[1], *src, i, 64)
        })
        .collect();
    let rss = |s: &str| {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| {
                l.strip_prefix(s)
                    .map(|v| v.trim().trim_end_matches(" kB").parse::<u64>().unwrap())
            })
            .unwrap()
    };
    let before = rss("VmRSS:");
    send_all(&mut g[0], &flood[..10_000]);
    let mid = rss("VmRSS:");
    send_all(&mut g[0], &flood[10_000..]);
    let after = rss("VmRSS:");
    // The flooder learned at most its limit; vm2's and vm3's own MACs are still theirs.
    let learned = fdb_entries_on(&s, 1);
    assert!((1..=257).contains(&learned), "vm1 holds {learned} entries");
    assert_eq!(fdb_entries_on(&s, 2), 1);
    assert_eq!(fdb_entries_on(&s, 3), 1);
    // The second 10,000 sources took no memory the first did not (the table is fixed).
    assert!(after <= mid + 1024, "RSS {before} -> {mid} -> {after} KiB");
    others_still_talk(&mut g);
    drop((g, flood));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

#[test]
fn a_broadcast_storm_malformed_headers_and_a_broken_ring_leave_the_others_talking() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-storm");
    let check = SwitchPorts::new(&s, "vm2", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);
    // A broadcast storm from vm1: vm2 and vm3 do not read meanwhile; their rings fill and the
    // rest is dropped on them.
    let storm: Vec<Vec<u8>> = (0..20_000)
        .map(|i| frame([0xff; 6], MAC[0], i, 64))
        .collect();
    send_all(&mut g[0], &storm);
    let missed = |name: &str| {
        let r = s
            .reports()
            .into_iter()
            .find(|r| r.spec.name == name)
            .unwrap();
        serde_json::to_value(&r.queues[0]).unwrap()["rx_missed"]
            .as_u64()
            .unwrap()
    };
    assert!(missed("vm2") > 10_000 && missed("vm3") > 10_000);
    others_still_talk(&mut g);

    // Headers a driver must not send (TSO without a segment size, a checksum start past the
    // frame): refused by vm1's tx path, counted, never delivered.
    let bad = [
        NetHdr {
            gso_type: vnet::HDR_GSO_TCPV4,
            gso_size: 0,
            flags: vnet::HDR_F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            hdr_len: 54,
            ..NetHdr::default()
        },
        NetHdr {
            flags: vnet::HDR_F_NEEDS_CSUM,
            csum_start: 4000,
            csum_offset: 6,
            ..NetHdr::default()
        },
    ];
    let f: Vec<Vec<u8>> = (0..10).map(|i| frame(MAC[1], MAC[0], i, 100)).collect();
    for h in bad {
        send_with(&mut g[0], &f, h);
    }
    assert!(receive(&mut g[1], 1, Duration::from_millis(300)).is_empty());
    let vm1 = s
        .reports()
        .into_iter()
        .find(|r| r.spec.name == "vm1")
        .unwrap();
    let tx = serde_json::to_value(&vm1.queues[1]).unwrap();
    let refused: u64 = tx
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("hdr_"))
        .map(|(_, v)| v.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(refused, 20, "{tx}");

    // vm1 breaks its tx ring (an avail head past the queue): its queue breaks, nobody else's.
    let rings = g[0].conn.queues[1].config.rings();
    let mem = &g[0].conn.mem;
    let idx = {
        let mut b = [0u8; 2];
        mem.read(vring::GuestAddress(rings.avail.0 + 2), &mut b)
            .unwrap();
        u16::from_le_bytes(b)
    };
    let slot = rings.avail.0 + 4 + 2 * (idx % 256) as u64;
    mem.write(vring::GuestAddress(slot), &999u16.to_le_bytes())
        .unwrap();
    mem.write(
        vring::GuestAddress(rings.avail.0 + 2),
        &idx.wrapping_add(1).to_le_bytes(),
    )
    .unwrap();
    g[0].conn.queues[1].kick.signal().unwrap();
    let broken = || {
        let r = s
            .reports()
            .into_iter()
            .find(|r| r.spec.name == "vm1")
            .unwrap();
        r.queues[1].counters.broken.clone()
    };
    assert!(testkit::eventually(Duration::from_secs(5), || broken().is_some()));
    others_still_talk(&mut g);
    drop((g, storm));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// Two guests sending to a third at full rate for a second, each from its own thread, the
/// third reading all the time: each gets a share of what the third received within 20% of
/// the other's (the worker turns every pair up to vhost_net's weight).
#[test]
fn two_senders_to_one_guest_share_it_fairly() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-fair");
    let check = SwitchPorts::new(&s, "vm1", "vm2");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir).into_iter();
    let (mut a, mut b, mut c) = (g.next().unwrap(), g.next().unwrap(), g.next().unwrap());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = |mut p: Pair, src: [u8; 6], stop: Arc<std::sync::atomic::AtomicBool>| {
        std::thread::spawn(move || {
            let f = frame(MAC[2], src, 0, 64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..32 {
                    if !p.tx.send(&f, NetHdr::default()).unwrap() {
                        break;
                    }
                }
                p.tx.flush();
                if p.tx.is_stopped() {
                    let _ = p.tx.wait_wake(1);
                }
            }
            p
        })
    };
    let ta = sender(a, MAC[0], stop.clone());
    let tb = sender(b, MAC[1], stop.clone());
    let mut from = [0u64; 2];
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        c.rx.poll(
            64,
            PollMode::Napi,
            Frames(|f: &[u8]| {
                if f[6..12] == MAC[0] {
                    from[0] += 1;
                } else if f[6..12] == MAC[1] {
                    from[1] += 1;
                }
            }),
        )
        .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (a, b) = (ta.join().unwrap(), tb.join().unwrap());
    let (lo, hi) = (from[0].min(from[1]) as f64, from[0].max(from[1]) as f64);
    println!("vm3 received {} from vm1, {} from vm2", from[0], from[1]);
    assert!(lo + hi > 10_000.0, "{from:?}");
    assert!(lo >= 0.8 * hi, "unfair: {from:?}");
    drop((a, b, c));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// The migrating guest's MAC in the RARP tests: neither port's own.
const MOVING: [u8; 6] = [0x52, 0x54, 0, 0xaa, 0xbb, 0xcc];

/// The port the MAC table has [`MOVING`] on, if any.
fn moving_on(s: &Switch) -> Option<u64> {
    let fdb = serde_json::to_value(s.core().fdb_show()).unwrap();
    fdb["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["mac"] == "52:54:00:aa:bb:cc")
        .map(|e| e["port"].as_u64().unwrap())
}

/// Three ports as [`three_ports`] makes them, but vm1 and vm3 may send from other MACs (the
/// migrating guest's, [`MOVING`], behind one and then the other).
fn migration_ports(tag: &str) -> (TempDir, Arc<Switch>) {
    let dir = temp_dir(tag);
    let s = switch(1);
    for (k, n) in ["vm1", "vm2", "vm3"].iter().enumerate() {
        let mut spec = port(n, &sock(&dir, n), MAC[k]);
        spec.spoof_check = k == 1;
        s.add_port(spec).unwrap();
    }
    (dir, s)
}

/// A guest that migrated announces its MAC with a RARP (as QEMU makes the backend do on
/// SEND_RARP, `rarp::frame`): the MAC moves to its new port at once, though it was seen on the
/// old one a moment before (no move hold for an announcement), and unicast to it follows.
#[test]
fn a_rarp_moves_a_mac_to_its_new_port_at_once() {
    let exclusive = recovery::exclusive();
    let (dir, s) = migration_ports("switch-rarp");
    let check = SwitchPorts::new(&s, "vm1", "vm2");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);
    // The guest behind vm1 sends from `MOVING`: learned there.
    send_all(&mut g[0], &[frame(MAC[1], MOVING, 0, 64)]);
    assert_eq!(receive(&mut g[1], 1, Duration::from_secs(5)).len(), 1);
    // Learned before the frame was delivered.
    assert_eq!(moving_on(&s), Some(1));
    // It migrates behind vm3 and announces itself there.
    let rarp = virtnet_backend::rarp::frame(MOVING).to_vec();
    send_all(&mut g[2], std::slice::from_ref(&rarp));
    // (The RARP floods to vm1 and vm2 once the worker has taken it.)
    assert_eq!(
        receive(&mut g[1], 1, Duration::from_secs(5)),
        std::slice::from_ref(&rarp)
    );
    // Learning follows the batch's deliveries: a moment after.
    assert!(
        testkit::eventually(Duration::from_secs(1), || moving_on(&s) == Some(3)),
        "the RARP moved the MAC at once: it is on port {:?}",
        moving_on(&s)
    );
    // vm2's unicast to it now reaches vm3, not vm1.
    let _ = receive(&mut g[0], usize::MAX, Duration::from_millis(200));
    let _ = receive(&mut g[2], usize::MAX, Duration::from_millis(200));
    let to = frame(MOVING, MAC[1], 1, 100);
    send_all(&mut g[1], std::slice::from_ref(&to));
    assert_eq!(
        receive(&mut g[2], 1, Duration::from_secs(5)),
        std::slice::from_ref(&to)
    );
    assert!(receive(&mut g[0], 1, Duration::from_millis(200)).is_empty());
    drop(g);
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// After a live migration, QEMU on the destination asks the backend to announce the guest
/// (VHOST_USER_SEND_RARP, with the guest's MAC): the switch forwards the announcement as if
/// the guest had sent it (`SwitchControl::announce`). By the time the request is acked the
/// MAC is on the new port, though the old one saw it a moment before; the RARP has flooded
/// to the other ports, and unicast to the MAC reaches the new port, not the old one.
#[test]
fn send_rarp_on_the_new_port_moves_the_mac_there_at_once() {
    use testkit::raw::RawFrontend;
    use vhost::vhost_user::message::FrontendReq;
    use vring::{Buf, Features, GuestAddress, RingAddresses};

    let exclusive = recovery::exclusive();
    let (dir, s) = migration_ports("switch-sendrarp");
    let check = SwitchPorts::new(&s, "vm1", "vm2");
    let base = Baseline::take(&exclusive, &check);
    let mut g: Vec<Pair> = ["vm1", "vm2"]
        .iter()
        .map(|n| connect_socket(&sock(&dir, n), WANTED, 2048))
        .collect();
    // The guest runs behind vm1: its MAC is learned there.
    send_all(&mut g[0], &[frame(MAC[1], MOVING, 0, 64)]);
    assert_eq!(receive(&mut g[1], 1, Duration::from_secs(5)).len(), 1);
    // Learned before the frame was delivered.
    assert_eq!(moving_on(&s), Some(1));

    // The destination's frontend on vm3, as QEMU sets it up: memory, then both queues
    // running, rx with buffers posted; then SEND_RARP, acked (REPLY_ACK) once handled.
    let ring = |q: u64| RingAddresses {
        desc: GuestAddress(0x1_0000 + q * 0x4000),
        avail: GuestAddress(0x1_1000 + q * 0x4000),
        used: GuestAddress(0x1_2000 + q * 0x4000),
    };
    let buf = |token: u32| GuestAddress(0x2_0000 + token as u64 * 2048);
    let features = Features::VERSION_1 | Features::RING_EVENT_IDX;
    let mut f = RawFrontend::connect(
        &sock(&dir, "vm3"),
        2,
        features,
        &[(GuestAddress(0), 1 << 20)],
    );
    f.set_mem_table();
    let mut rx = f.start_queue(0, 64, ring(0));
    let _tx = f.start_queue(1, 64, ring(1));
    for token in 0..16 {
        rx.driver
            .add(&[], &[Buf::new(buf(token), 2048)], token)
            .unwrap();
    }
    rx.kick.write(1).unwrap();
    let mut payload = [0u8; 8];
    payload[..6].copy_from_slice(&MOVING);
    let acked = f.send_raw(FrontendReq::SEND_RARP, &payload, true);
    assert_eq!(acked, Some(0), "the announcement was forwarded");
    // No waiting: the move was learned before the ack.
    assert_eq!(moving_on(&s), Some(3), "the MAC moved to vm3 at once");
    // The announcement flooded to vm1 and vm2, as sent from the guest's MAC.
    let rarp = virtnet_backend::rarp::frame(MOVING).to_vec();
    for p in g.iter_mut() {
        assert_eq!(
            receive(p, 1, Duration::from_secs(5)),
            std::slice::from_ref(&rarp)
        );
    }

    // vm2's unicast to the guest reaches vm3 byte for byte, and not vm1.
    let to = frame(MOVING, MAC[1], 1, 100);
    send_all(&mut g[1], std::slice::from_ref(&to));
    let mut used = None;
    let arrived = testkit::eventually(Duration::from_secs(5), || {
        used = rx.driver.get_used().unwrap();
        used.is_some()
    });
    assert!(arrived, "vm3 received nothing");
    let (token, len) = used.unwrap();
    let mut got = vec![0u8; len as usize];
    f.mem.read(buf(token), &mut got).unwrap();
    assert_eq!(&got[vnet::HDR_LEN..], &to[..]);
    assert!(receive(&mut g[0], 1, Duration::from_millis(200)).is_empty());
    drop((g, f, rx, _tx));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// `virtnet ctl port-remove` disconnects the port's frontend, as a device that went away:
/// removed under traffic (vm1 sending to it at full rate), its guest reads the end of its
/// socket within a second and the socket file is gone; `port-add` of the same name and
/// socket then serves a new guest, which gets vm1's traffic and sends back. A client port's
/// frontend is disconnected too (its listening socket is its own, and stays), and the switch
/// does not connect to it again.
#[test]
fn a_removed_ports_frontend_is_disconnected_and_the_port_serves_again_once_added() {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use virtnet_backend::switch::ctl;

    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-remove");
    let check = SwitchPorts::new(&s, "vm1", "vm2");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);
    let vm3 = sock(&dir, "vm3");
    let ok = |answer: String| assert_eq!(answer, r#"{"ok":true}"#);

    // vm1 sends to vm3 until told to stop (or the test fails), from a thread of its own.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let sender = {
        let (mut p, stop) = (g.remove(0), stop.0.clone());
        std::thread::spawn(move || {
            let mut i = 0;
            while !stop.load(Relaxed) {
                while p
                    .tx
                    .send(&frame(MAC[2], MAC[0], i, 64), NetHdr::default())
                    .unwrap()
                {
                    i += 1;
                }
                p.tx.flush();
                let _ = p.tx.wait_wake(1);
            }
            p
        })
    };
    let mut g3 = g.pop().unwrap();
    assert!(!receive(&mut g3, 100, Duration::from_secs(5)).is_empty());

    let removing = Instant::now();
    ok(ctl::answer(&s, r#"{"cmd":"port-remove","name":"vm3"}"#));
    assert!(
        g3.conn.wait_closed(Duration::from_secs(1)),
        "vm3's frontend still connected"
    );
    let took = removing.elapsed();
    assert!(took < Duration::from_secs(1), "disconnected after {took:?}");
    assert!(!vm3.exists(), "{} left behind", vm3.display());
    drop(g3);

    // Added again under the same name and socket, while vm1 still sends: a new guest there
    // gets vm1's frames, and its own reach vm1.
    let spec = format!("name=vm3,socket={},mac=52:54:00:00:00:03", vm3.display());
    let add = serde_json::json!({ "cmd": "port-add", "spec": spec }).to_string();
    ok(ctl::answer(&s, &add));
    let mut g3 = connect_socket(&vm3, WANTED, 2048);
    let got = receive(&mut g3, 100, Duration::from_secs(1));
    assert!(
        got.len() >= 100,
        "the port added again got {} frames",
        got.len()
    );
    assert!(got.iter().all(|f| f[..12] == [MAC[2], MAC[0]].concat()));
    drop(stop);
    let mut vm1 = sender.join().unwrap();
    let _ = receive(&mut vm1, usize::MAX, Duration::from_millis(200));
    let back: Vec<Vec<u8>> = (0..100).map(|i| frame(MAC[0], MAC[2], i, 300)).collect();
    send_all(&mut g3, &back);
    assert_eq!(receive(&mut vm1, 100, Duration::from_secs(5)), back);

    // A client port: the switch connects to a frontend listening at its socket.
    let listening = std::os::unix::net::UnixListener::bind(sock(&dir, "vm4")).unwrap();
    let mut spec = port("vm4", &sock(&dir, "vm4"), [0x52, 0x54, 0, 0, 0, 4]);
    spec.client = true;
    s.add_port(spec).unwrap();
    let g4 = testkit::inproc::accept_backend(&listening, WANTED, 2048, Duration::from_secs(5))
        .expect("the client port connected");
    let removing = Instant::now();
    s.remove_port("vm4").unwrap();
    assert!(g4.conn.wait_closed(Duration::from_secs(1)));
    assert!(removing.elapsed() < Duration::from_secs(1));
    drop(g4);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        listening.accept().is_err(),
        "the removed client port connected again"
    );
    assert!(
        sock(&dir, "vm4").exists(),
        "the frontend's socket is its own"
    );

    drop((g, g3, vm1, listening));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}
