//! The device's MTU on a real TAP: the backend takes the TAP's MTU when none is configured,
//! sets the configured one on the TAP's interface, and a frontend's NET_SET_MTU (QEMU's
//! `host_mtu`) changes the interface's MTU and the config space, so that a datagram the kernel
//! used to fragment reaches the guest as one jumbo frame. An MTU the TAP cannot take is
//! refused, and nothing changes.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, start_backend, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode};

const TEST: &str = "mtu";
/// The guest's address and MAC, as the host side's neighbour table knows them.
const GUEST_IP: &str = "10.99.0.2";
const GUEST_MAC: &str = "52:54:00:12:34:56";

/// A backend on the namespace's TAP with `mtu` configured (opened from a thread inside it, so
/// that its threads are in the namespace too).
fn backend_in(ns: &NetNs, tap: &TapSpec, mtu: Option<u16>) -> Backend {
    ns.run(|| {
        start_backend(
            TEST,
            BackendConfig {
                io: IoMode::Tap(tap.name.clone()),
                mtu,
                ..Default::default()
            },
        )
    })
}

/// The TAP interface's MTU, as the kernel has it.
fn interface_mtu(ns: &NetNs, tap: &TapSpec) -> u16 {
    let path = format!("/sys/class/net/{}/mtu", tap.name);
    ns.exec(&["cat", &path]).unwrap().trim().parse().unwrap()
}

/// The config space's `mtu` (VIRTIO 1.2 5.1.4: bytes 10 and 11, little-endian).
fn config_mtu(p: &mut Pair) -> u16 {
    let b = p.conn.get_config(10, 2).unwrap();
    u16::from_le_bytes([b[0], b[1]])
}

/// Sends one UDP datagram of `len` bytes from the host side of the TAP to the guest (the
/// kernel fragments it to the interface's MTU), and returns the lengths of the IPv4 frames
/// the guest receives within a second.
///
/// Only once the interface's operational state is up again: a backend that attaches its TAP
/// queue turns the carrier on, but the kernel starts the interface's queueing discipline from
/// its link-watch work, which it runs at most once a second, so a datagram sent within a
/// second of the last backend's detach can be dropped before it reaches the TAP.
fn datagram_to_guest(ns: &NetNs, tap: &TapSpec, p: &mut Pair, len: usize) -> Vec<usize> {
    let operstate = format!("/sys/class/net/{}/operstate", tap.name);
    let up = Instant::now() + Duration::from_secs(5);
    while ns.exec(&["cat", &operstate]).unwrap().trim() != "up" {
        assert!(Instant::now() < up, "{} never came up", tap.name);
        std::thread::sleep(Duration::from_millis(20));
    }
    ns.run(|| {
        let socket = UdpSocket::bind("10.99.0.1:0").expect("UDP socket on the TAP");
        socket
            .send_to(&vec![0x5a; len], (GUEST_IP, 9))
            .expect("sending the datagram");
    });
    let mut lengths = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        p.rx.poll(
            64,
            PollMode::Napi,
            Frames(|f: &[u8]| {
                if f.len() > 14 && f[12..14] == [0x08, 0x00] {
                    lengths.push(f.len());
                }
            }),
        )
        .unwrap();
        p.rx.wait(10);
    }
    lengths
}

#[test]
fn the_mtu_is_the_taps_and_net_set_mtu_changes_it() {
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create(TEST).expect("network namespace");
    let tap = TapSpec {
        mtu: Some(1400),
        ..TapSpec::for_backend()
    };
    ns.add_tap(&tap).expect("TAP in the namespace");
    // No ARP: the guest's frames come straight.
    ns.exec(&[
        "ip",
        "neigh",
        "add",
        GUEST_IP,
        "lladdr",
        GUEST_MAC,
        "dev",
        &tap.name,
        "nud",
        "permanent",
    ])
    .expect("a neighbour entry for the guest");

    // No MTU configured: the TAP's is the device's.
    let b = backend_in(&ns, &tap, None);
    assert_eq!(b.device.mtu(), 1400);
    let mut p = connect(&b, WANTED);
    assert_eq!(config_mtu(&mut p), 1400);
    drop(p);
    drop(b);

    // Configured: set on the TAP's interface.
    let b = backend_in(&ns, &tap, Some(1500));
    assert_eq!(interface_mtu(&ns, &tap), 1500);
    let mut p = connect(&b, WANTED);
    assert_eq!(config_mtu(&mut p), 1500);
    let fragments = datagram_to_guest(&ns, &tap, &mut p, 8000);
    assert!(
        fragments.len() >= 6 && fragments.iter().all(|&l| l <= 1514),
        "at MTU 1500 the datagram comes in fragments: {fragments:?}"
    );

    // The frontend's NET_SET_MTU: the interface, the config space, the data path.
    p.conn.set_mtu(9000).expect("NET_SET_MTU 9000");
    assert_eq!(interface_mtu(&ns, &tap), 9000);
    assert_eq!(config_mtu(&mut p), 9000);
    assert_eq!(b.device.device_report().mtu, 9000);
    let frames = datagram_to_guest(&ns, &tap, &mut p, 8000);
    assert_eq!(
        frames,
        [14 + 20 + 8 + 8000],
        "at MTU 9000 the datagram comes whole"
    );

    // More than a TAP carries: refused, nothing changed, the connection still served.
    let refused = p.conn.set_mtu(virtnet_backend::MAX_MTU);
    assert!(refused.is_err(), "MTU 65535 on a TAP: {refused:?}");
    assert_eq!(interface_mtu(&ns, &tap), 9000);
    assert_eq!(config_mtu(&mut p), 9000);
    assert!(b.is_serving());
}
