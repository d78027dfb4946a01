//! `virtnet switch` with a TAP uplink in a network namespace: the namespace's stack and a
//! guest (our driver) on a port talk through the switch. UDP datagrams from the stack reach the
//! guest byte for byte (to its port's MAC, learned as static), and the guest's datagrams reach
//! a socket of the stack; the uplink's counters agree.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, wait_tap_up, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode};
use vnet::NetHdr;

const TEST: &str = "switch_uplink";
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

fn receive(p: &mut Pair, want: usize, within: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    while got.len() < want && Instant::now() < deadline {
        p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
        if got.len() < want {
            p.rx.wait(10);
        }
    }
    got
}

#[test]
fn the_stack_behind_the_uplink_and_a_guest_exchange_datagrams() {
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("swup").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP");
    let mac = "52:54:00:12:34:56";
    ns.exec(&[
        "ip",
        "neigh",
        "add",
        "10.99.0.2",
        "lladdr",
        mac,
        "dev",
        &tap.name,
    ])
    .expect("neighbour entry");
    let s = ns
        .run(|| {
            Switch::start(SwitchConfig {
                workers: vec![None],
                uplink: Some(tap.name.clone()),
                fdb: FdbConfig::default(),
                device: BackendConfig {
                    io: IoMode::Echo,
                    ..BackendConfig::default()
                },
            })
        })
        .expect("switch");
    wait_tap_up(&ns, &tap.name);
    let dir = temp_dir("switch-uplink");
    let socket = dir.0.join("vm.sock");
    s.add_port(PortSpec {
        name: "vm".into(),
        socket: socket.clone(),
        mac: GUEST_MAC,
        queues: 1,
        client: false,
        spoof_check: true,
    })
    .unwrap();
    let mut p = connect_socket(&socket, WANTED, 2048);

    // Host to guest: 200 datagrams of 1 to 1472 bytes, each whole in the guest.
    let (udp, host) = ns.run(|| {
        let udp = UdpSocket::bind("10.99.0.1:9000").unwrap();
        let host = UdpSocket::bind("10.99.0.1:9001").unwrap();
        (udp, host)
    });
    let sizes = [1usize, 18, 100, 1000, 1472];
    let payload = |i: usize| -> Vec<u8> {
        (0..sizes[i % sizes.len()])
            .map(|k| (k * 7 + i) as u8)
            .collect()
    };
    for i in 0..200 {
        udp.send_to(&payload(i), "10.99.0.2:9000").unwrap();
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let got = receive(&mut p, 200, Duration::from_secs(5));
    let datagrams: Vec<&[u8]> = got
        .iter()
        .filter(|f| f.len() >= 42 && f[12..14] == [0x08, 0x00] && f[23] == 17)
        .map(|f| &f[42..])
        .collect();
    assert_eq!(datagrams.len(), 200, "datagrams in the guest");
    for (i, d) in datagrams.iter().enumerate() {
        assert_eq!(*d, &payload(i)[..], "datagram {i}");
    }

    // Guest to host: to the TAP's MAC, which the switch learned from the host's frames.
    let tap_mac = ns
        .exec(&["cat", &format!("/sys/class/net/{}/address", tap.name)])
        .unwrap();
    let tap_mac: Vec<u8> = tap_mac
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    let dst: [u8; 6] = tap_mac.try_into().unwrap();
    host.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    for i in 0..100 {
        let f = testkit::inproc::udp_to_tap(dst, GUEST_MAC, 9001, &payload(i));
        while !p.tx.send(&f, NetHdr::default()).unwrap() {
            p.tx.flush();
            p.tx.wait_wake(10).unwrap();
        }
    }
    p.tx.flush();
    let mut buf = [0u8; 2048];
    for i in 0..100 {
        let (n, from) = host.recv_from(&mut buf).expect("a datagram from the guest");
        assert_eq!(from.to_string(), "10.99.0.2:9000");
        assert_eq!(&buf[..n], &payload(i)[..], "datagram {i} at the host");
    }
    let (name, c) = s.uplink().unwrap();
    assert_eq!(name, tap.name);
    // A worker counts frames once its write into the TAP (or its delivery into the guest)
    // has returned, which may be after the other side has them: CI once read 99 here.
    let counted = || c.out.snapshot().packets >= 100 && c.into.snapshot().packets >= 200;
    assert!(
        testkit::eventually(Duration::from_secs(2), counted),
        "{:?} {:?}",
        c.out.snapshot(),
        c.into.snapshot()
    );
    s.shutdown();
}
