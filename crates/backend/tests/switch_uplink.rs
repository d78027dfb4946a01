//! `virtnet switch` with a TAP uplink in a network namespace: the namespace's stack and a
//! guest (our driver) on a port talk through the switch. UDP datagrams from the stack reach the
//! guest byte for byte (to its port's MAC, learned as static), and the guest's datagrams reach
//! a socket of the stack; the uplink's counters agree. And the uplink's TAP deleted under the
//! running switch, as an operator may: the guests go on switching, and the recovery check
//! holds.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). Each case takes
//! [`recovery::exclusive`]: the deletion case measures the process.

mod switch_common;

use std::net::UdpSocket;
use std::sync::Arc;
use std::time::Duration;

use switch_common::{frame, guests_on, port, receive, send_all, sock, MAC, NAMES};
use testkit::inproc::{connect_socket, temp_dir, wait_tap_up, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::recovery::{self, Baseline, SwitchPorts};
use virtnet_backend::switch::{FdbConfig, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use vnet::NetHdr;

const TEST: &str = "switch_uplink";
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

/// A namespace named after `tag` with a TAP, and a switch (one worker) whose uplink it is,
/// the TAP up; None (and a printed reason) without root or `ip`.
fn switch_on_a_tap(tag: &str) -> Option<(NetNs, TapSpec, Arc<Switch>)> {
    if !packages::netns_ready(TEST) {
        return None;
    }
    let ns = NetNs::create(tag).expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP");
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
    Some((ns, tap, s))
}

#[test]
fn the_stack_behind_the_uplink_and_a_guest_exchange_datagrams() {
    let _exclusive = recovery::exclusive();
    let Some((ns, tap, s)) = switch_on_a_tap("swup") else {
        return;
    };
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
    let dir = temp_dir("switch-uplink");
    let socket = dir.0.join("vm.sock");
    s.add_port(port("vm", &socket, GUEST_MAC)).unwrap();
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

/// The uplink's TAP deleted under a running switch (`ip link del` in its namespace): the
/// worker's queue of it reports an error for good, and the worker stops watching it, under
/// its seccomp filter. The guests go on switching: vm1's broadcasts reach vm2, their copies
/// for the uplink dropped and counted (its writes fail); and the recovery check holds: the
/// worker alive and idle (no spin on the dead descriptor), fresh connections to vm1 and vm2
/// moving frames within a second, descriptors and memory as before the deletion.
#[test]
fn the_uplinks_tap_deleted_under_a_running_switch_leaves_the_guests_switching() {
    let exclusive = recovery::exclusive();
    let Some((ns, tap, s)) = switch_on_a_tap("swdel") else {
        return;
    };
    let dir = temp_dir("switch-uplink-deleted");
    for (k, name) in NAMES[..2].iter().enumerate() {
        s.add_port(port(name, &sock(&dir, name), MAC[k])).unwrap();
    }
    let check = SwitchPorts::new(&s, "vm1", "vm2");
    let base = Baseline::take(&exclusive, &check);
    let (_, c) = s.uplink().unwrap();
    let mut g = guests_on(&dir, 2);
    let broadcasts = |from: u32| -> Vec<Vec<u8>> {
        (from..from + 16)
            .map(|i| frame([0xff; 6], MAC[0], i, 64))
            .collect()
    };

    // Before: a broadcast reaches vm2 and goes out of the uplink.
    let before = broadcasts(0);
    send_all(&mut g[0], &before);
    assert_eq!(receive(&mut g[1], 16, Duration::from_secs(5)), before);
    assert!(
        testkit::eventually(Duration::from_secs(2), || c.out.snapshot().packets >= 16),
        "out of the uplink: {:?}",
        c.out.snapshot()
    );

    ns.exec(&["ip", "link", "del", &tap.name])
        .expect("TAP deleted");
    let dropped = c.out.snapshot().dropped;
    let after = broadcasts(16);
    send_all(&mut g[0], &after);
    assert_eq!(
        receive(&mut g[1], 16, Duration::from_secs(5)),
        after,
        "vm2 after the uplink's TAP went"
    );
    assert!(
        testkit::eventually(Duration::from_secs(2), || {
            c.out.snapshot().dropped >= dropped + 16
        }),
        "the uplink's copies are dropped and counted: {:?}",
        c.out.snapshot()
    );
    drop(g);
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}
