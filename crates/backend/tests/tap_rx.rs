//! Host to guest through a real TAP: UDP datagrams sent by the namespace's stack reach our
//! driver's buffers byte for byte, read by the backend straight into them (no frame through
//! its bounce buffer) with mergeable buffers; and, where the kernel has UDP segmentation
//! (Linux 6.2), a UDP GSO super-frame (GUEST_USO4/6 negotiated, so the TAP hands it out
//! unsegmented) arrives whole over merged buffers, with its GSO header. A guest that breaks its
//! rx ring while the backend holds buffers for the next frame and the TAP has frames waiting
//! leaves the worker idle, not spinning.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, connect_rx, tap_backend, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use vnet::{feature, NetHdr};

const TEST: &str = "tap_rx";
/// The guest's address on the TAP's subnet (10.99.0.1/24 is the TAP's).
const GUEST: &str = "10.99.0.2:9000";
const GUEST_MAC: &str = "52:54:00:12:34:56";
/// Linux's UDP_SEGMENT socket option (SOL_UDP), the segment size of a UDP GSO send.
const UDP_SEGMENT: libc::c_int = 103;

fn setup() -> Option<(NetNs, TapSpec)> {
    if !packages::netns_ready(TEST) {
        return None;
    }
    let ns = NetNs::create("taprx").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    // The guest's neighbour entry, so that the stack sends without asking ARP.
    let ip = GUEST.split(':').next().unwrap();
    let neigh = ["neigh", "add", ip, "lladdr", GUEST_MAC, "dev", &tap.name];
    ns.exec(&[&["ip"][..], &neigh[..]].concat())
        .expect("neighbour entry");
    Some((ns, tap))
}

/// The backend on `tap`, its socket in a directory named after `tag` (one per test: they run
/// side by side).
fn backend(tag: &str, ns: &NetNs, tap: &TapSpec) -> Backend {
    tap_backend(ns, tag, &tap.name)
}

/// A UDP socket in the namespace, bound to the TAP's address.
fn sender(ns: &NetNs) -> UdpSocket {
    ns.run(|| UdpSocket::bind("10.99.0.1:0").expect("UDP socket"))
}

/// The UDP payload of an IPv4 frame (Ethernet header first).
fn udp_payload(frame: &[u8]) -> &[u8] {
    let ihl = (frame[14] & 0xf) as usize * 4;
    &frame[14 + ihl + 8..]
}

/// Frames received within `within`, with their headers, refilling the rx ring as it goes.
fn receive(p: &mut Pair, want: usize, within: Duration) -> Vec<(NetHdr, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + within;
    while got.len() < want && Instant::now() < deadline {
        let mut f = Vec::new();
        match p.rx.recv(&mut f).unwrap() {
            Some(h) => got.push((h, f)),
            None => {
                p.rx.refill().unwrap();
                p.rx.wait(10);
            }
        }
    }
    got
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k * 7 + i) as u8).collect()
}

#[test]
fn frames_from_the_tap_land_straight_in_guest_buffers_byte_for_byte() {
    let Some((ns, tap)) = setup() else { return };
    let b = backend("taprx-mrg", &ns, &tap);
    let mut p = connect(&b, WANTED);
    let udp = sender(&ns);
    let sizes = [1, 18, 100, 500, 1000, 1472];
    let n = 300;
    for i in 0..n {
        let data = payload(i, sizes[i % sizes.len()]);
        udp.send_to(&data, GUEST).unwrap();
        if i % 32 == 31 {
            // Leave the guest time to take them: a TAP queue holds 1000 frames, the ring 256.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let got = receive(&mut p, n, Duration::from_secs(10));
    assert_eq!(got.len(), n, "frames received");
    for (i, (_, f)) in got.iter().enumerate() {
        let want = payload(i, sizes[i % sizes.len()]);
        assert_eq!(udp_payload(f), &want[..], "datagram {i}");
    }
    let rx = b.device.reports()[0].counters.clone();
    assert_eq!(rx.dropped, 0, "{rx:?}");
    assert_eq!(
        rx.rx_bounced, 0,
        "frames went through the bounce buffer: {rx:?}"
    );
    assert!(rx.packets >= n as u64, "{rx:?}");
}

#[test]
fn a_udp_gso_super_frame_arrives_whole_over_merged_buffers() {
    let Some((ns, tap)) = setup() else { return };
    let b = backend("taprx-uso", &ns, &tap);
    let uso = feature::GUEST_CSUM | feature::GUEST_USO4 | feature::GUEST_USO6;
    if !b.device.offered_features().contains(uso) {
        packages::skip(
            TEST,
            "this kernel's TAP has no UDP segmentation (Linux 6.2)",
        );
        return;
    }
    let mut p = connect(&b, WANTED | uso);
    let udp = sender(&ns);
    let seg: libc::c_int = 1000;
    // SAFETY: UDP_SEGMENT takes an int, and `seg` is one, alive for the call.
    let r = unsafe {
        libc::setsockopt(
            udp.as_raw_fd(),
            libc::SOL_UDP,
            UDP_SEGMENT,
            (&seg as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
    let data = payload(7, 20_000);
    udp.send_to(&data, GUEST).unwrap();
    let got = receive(&mut p, 1, Duration::from_secs(5));
    assert_eq!(got.len(), 1, "one super-frame");
    let (hdr, f) = &got[0];
    assert_eq!(hdr.gso_type, vnet::HDR_GSO_UDP_L4, "{hdr:?}");
    assert_eq!(hdr.gso_size, 1000, "{hdr:?}");
    assert!(hdr.num_buffers > 1, "merged over buffers: {hdr:?}");
    assert_eq!(udp_payload(f), &data[..]);
    // Whole, whichever way it was read (straight into the buffers, or through the bounce
    // buffer if the guest's buffers were not all visible yet on a loaded machine).
    let rx = b.device.reports()[0].counters.clone();
    assert_eq!(rx.dropped, 0, "{rx:?}");
}

/// A guest that breaks its rx ring while the backend keeps buffers posted for the next frame
/// and the TAP has frames waiting: rx is marked broken and the worker goes idle. It used to
/// spin at a whole CPU: the posted buffers counted as room, so every poll and every
/// level-triggered TAP wake-up found "work" that rx, broken, would not do.
#[test]
fn a_broken_rx_ring_with_buffers_posted_and_frames_waiting_leaves_the_worker_idle() {
    let Some((ns, tap)) = setup() else { return };
    let b = backend("taprx-broken", &ns, &tap);
    // Buffers of 512 bytes: the backend keeps three posted for a 1,514-byte frame, and a
    // small frame takes one of them.
    let mut p = connect_rx(&b, WANTED, 512);
    let udp = sender(&ns);
    udp.send_to(&payload(0, 100), GUEST).unwrap();
    assert_eq!(receive(&mut p, 1, Duration::from_secs(10)).len(), 1);
    // Every avail entry past the first 64 after the used index names a head out of range.
    // The backend holds a largest frame's worth of buffers (a few), so after some small
    // frames its pop for one more breaks rx with the others still posted.
    let rings = p.conn.queues[0].config.rings();
    let size = p.conn.queues[0].config.size();
    let mem = &p.conn.mem;
    let read16 = |addr: u64| {
        let mut v = [0u8; 2];
        mem.read(vring::GuestAddress(addr), &mut v).unwrap();
        u16::from_le_bytes(v)
    };
    let (used, avail) = (read16(rings.used.0 + 2), read16(rings.avail.0 + 2));
    assert!(
        avail.wrapping_sub(used) > 64,
        "the driver keeps the ring posted"
    );
    let mut i = used.wrapping_add(64);
    while i != avail {
        let slot = rings.avail.0 + 4 + 2 * (i % size) as u64;
        mem.write(vring::GuestAddress(slot), &999u16.to_le_bytes())
            .unwrap();
        i = i.wrapping_add(1);
    }
    // Frames until rx breaks; the TAP keeps the rest (it holds 1,000).
    let broken = || b.device.reports()[0].counters.broken.clone();
    for i in 0..400 {
        udp.send_to(&payload(i, 100), GUEST).unwrap();
        if broken().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    testkit::eventually(Duration::from_secs(10), || broken().is_some());
    let reason = broken().expect("rx marked broken");
    assert!(reason.contains("999"), "{reason}");
    for i in 0..32 {
        udp.send_to(&payload(i, 100), GUEST).unwrap();
    }
    testkit::recovery::assert_idle(&b);
}

/// A two-pair device whose frontend runs only pair 0 (its rings are the only ones enabled,
/// as with a guest that uses fewer pairs than the device has: QEMU disables the others'
/// rings): every flow from the host reaches pair 0. The TAP queue of the pair nobody runs is
/// detached, so the kernel steers nothing to it; attached, it swallowed the flows it was
/// given.
#[test]
fn flows_reach_the_only_pair_whose_rx_ring_is_enabled() {
    let Some((ns, tap)) = setup() else { return };
    let b = ns.run(|| {
        testkit::inproc::start_backend(
            "taprx-pairs",
            virtnet_backend::BackendConfig {
                io: virtnet_backend::IoMode::Tap(tap.name.clone()),
                pairs: 2,
                ..Default::default()
            },
        )
    });
    let mut p = connect(&b, WANTED);
    // Flows from many source ports, which the TAP spreads over its attached queues.
    let flows: Vec<UdpSocket> = (0..64).map(|_| sender(&ns)).collect();
    let n = 4 * flows.len();
    for i in 0..n {
        flows[i % flows.len()]
            .send_to(&payload(i, 100), GUEST)
            .unwrap();
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let got = receive(&mut p, n, Duration::from_secs(10));
    assert_eq!(got.len(), n, "frames received on pair 0");
    assert_eq!(b.device.reports()[2].counters.packets, 0, "pair 1 received");
}
