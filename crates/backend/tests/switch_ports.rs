//! `virtnet switch` with ports that come and go, and guests that move between them (our
//! driver, in one process): a migrated guest's MAC moves to its new port at once on a RARP,
//! its own or one the switch sends for it on VHOST_USER_SEND_RARP; a removed port's frontend
//! is disconnected and its socket unlinked, and the port added again serves a new guest (a
//! client port's frontend is disconnected and not connected again).
//!
//! Each case ends with the recovery check ([`recovery::assert_recovered`] on
//! [`SwitchPorts`]): the switch's threads alive (its workers under the seccomp filter) and
//! idle, two ports the case left alone exchanging frames on fresh connections within a
//! second, and the process's descriptors and memory back to what they were before the case.
//! Those are the process's, so the tests take [`recovery::exclusive`] first and run one at a
//! time. The set-up they share with the other `switch*` tests is in `switch_common/`.

mod switch_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use switch_common::{frame, guests, port, receive, send_all, sock, switch, three_ports, MAC};
use testkit::inproc::{connect_socket, temp_dir, Pair, TempDir, WANTED};
use testkit::recovery::{self, Baseline, SwitchPorts};
use virtnet_backend::switch::Switch;
use vnet::NetHdr;

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
