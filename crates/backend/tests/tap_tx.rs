//! Guest to host through a real TAP, each way the backend writes guest tx into it
//! (`TapIo::Uring`: bursts of writev through one io_uring_enter, unlinked without a send-buffer
//! limit and linked with one; `TapIo::Syscalls`: one writev per frame): UDP datagrams our
//! driver sends reach a UDP socket in the namespace whole, in order, none lost, and the
//! counters say which way they went.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, start_backend, Backend, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use virtnet_backend::{BackendConfig, IoMode, TapIo};
use vnet::NetHdr;

const TEST: &str = "tap_tx";
const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// The TAP's address (10.99.0.1/24), the guest's, and the port the namespace listens on.
const HOST_IP: [u8; 4] = [10, 99, 0, 1];
const PORT: u16 = 9100;
const FRAMES: usize = 2000;

fn setup(tag: &str) -> Option<(NetNs, TapSpec)> {
    if !packages::netns_ready(TEST) {
        return None;
    }
    let ns = NetNs::create(tag).expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    Some((ns, tap))
}

fn backend(tag: &str, ns: &NetNs, tap: &TapSpec, tap_io: TapIo, sndbuf: Option<i32>) -> Backend {
    ns.run(|| {
        start_backend(
            tag,
            BackendConfig {
                io: IoMode::Tap(tap.name.clone()),
                tap_io,
                tap_sndbuf: sndbuf,
                ..Default::default()
            },
        )
    })
}

/// A UDP socket bound in the namespace with a receive buffer for every datagram of the test.
fn listener(ns: &NetNs) -> UdpSocket {
    ns.run(|| {
        let u = UdpSocket::bind((std::net::Ipv4Addr::from(HOST_IP), PORT)).expect("UDP socket");
        let size: libc::c_int = 32 << 20;
        // SAFETY: SO_RCVBUFFORCE takes an int, and `size` is one, alive for the call.
        let r = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&u),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "SO_RCVBUFFORCE: {}", std::io::Error::last_os_error());
        u.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        u
    })
}

fn mac_of(ns: &NetNs, dev: &str) -> [u8; 6] {
    let s = ns
        .exec(&["cat", &format!("/sys/class/net/{dev}/address")])
        .expect("TAP address");
    let mut mac = [0u8; 6];
    for (b, h) in mac.iter_mut().zip(s.trim().split(':')) {
        *b = u8::from_str_radix(h, 16).unwrap();
    }
    mac
}

/// Datagram `i`'s payload: its number, then a pattern; 1 to 1400 bytes.
fn payload(i: usize) -> Vec<u8> {
    let len = 4 + (i * 37) % 1397;
    let mut p: Vec<u8> = (0..len).map(|k| (k * 13 + i) as u8).collect();
    p[..4].copy_from_slice(&(i as u32).to_be_bytes());
    p
}

/// Sends FRAMES datagrams through the backend in bursts and checks what the namespace's socket
/// receives; returns the tx counters.
fn datagrams_arrive_whole_and_in_order(
    tag: &str,
    tap_io: TapIo,
    sndbuf: Option<i32>,
) -> Option<virtnet_backend::metrics::CountersSnapshot> {
    let (ns, tap) = setup(tag)?;
    let b = backend(tag, &ns, &tap, tap_io, sndbuf);
    let mut p = connect(&b, WANTED);
    let udp = listener(&ns);
    let dst = mac_of(&ns, &tap.name);
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = vec![0u8; 2048];
        while got.len() < FRAMES && Instant::now() < deadline {
            if let Ok(n) = udp.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
        }
        got
    });
    let mut i = 0;
    while i < FRAMES {
        // Bursts of up to 200 frames, so that the worker takes full batches.
        let burst = (FRAMES - i).min(200);
        for k in i..i + burst {
            while !p
                .tx
                .send(
                    &testkit::inproc::udp_to_tap(dst, GUEST_MAC, PORT, &payload(k)),
                    NetHdr::default(),
                )
                .unwrap()
            {
                p.tx.flush();
                let _ = p.tx.reclaim(256);
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        p.tx.flush();
        i += burst;
        std::thread::sleep(Duration::from_millis(2));
    }
    let got = receiver.join().unwrap();
    assert_eq!(got.len(), FRAMES, "datagrams received");
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d, &payload(i), "datagram {i} (out of order or changed)");
    }
    // The worker counts a frame once its write into the TAP returns, which may be after the
    // socket received it.
    let counted = || b.device.reports()[1].counters.clone();
    testkit::eventually(Duration::from_secs(2), || {
        counted().packets >= FRAMES as u64
    });
    let tx = counted();
    assert_eq!((tx.packets, tx.dropped), (FRAMES as u64, 0), "{tx:?}");
    Some(tx)
}

#[test]
fn through_io_uring_unlinked_datagrams_arrive_whole_and_in_order() {
    let Some(tx) = datagrams_arrive_whole_and_in_order("taptxu", TapIo::Uring, None) else {
        return;
    };
    // Bursts went through io_uring, several frames an io_uring_enter.
    assert!(tx.host_batches > 0, "{tx:?}");
    assert!(tx.host_batches < tx.packets, "{tx:?}");
}

#[test]
fn through_io_uring_linked_datagrams_arrive_whole_and_in_order() {
    // A send-buffer limit: the TAP may push back, so the writes of a batch are linked.
    let sndbuf = Some(4 << 20);
    let Some(tx) = datagrams_arrive_whole_and_in_order("taptxl", TapIo::Uring, sndbuf) else {
        return;
    };
    assert!(tx.host_batches > 0, "{tx:?}");
    assert!(tx.host_batches < tx.packets, "{tx:?}");
}

#[test]
fn through_system_calls_datagrams_arrive_whole_and_in_order() {
    let Some(tx) = datagrams_arrive_whole_and_in_order("taptxs", TapIo::Syscalls, None) else {
        return;
    };
    assert_eq!(tx.host_batches, 0, "{tx:?}");
}
