//! `virtnet gen --gso` and gen's TCP sink through our backend: gen's TSO and USO super-frames
//! reach a TAP whole, one each, none dropped (USO where this kernel's TAP has it); gen asks for
//! HOST_USO and stops, naming it, on a device without it (root-free, over null I/O); and the
//! TCP sink takes a host's TCP stream that the TAP hands over in super-frames spanning dozens
//! of mergeable buffers, every byte in order. What the kernel makes of gen's super-frames,
//! segment by segment, is `gso_tap.rs`.
//!
//! The TAP tests need root (network namespaces, TAP devices); they skip with a printed reason
//! otherwise (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::io;
use std::time::{Duration, Instant};

use testkit::inproc::{start_backend, tap_backend};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::gen::frames::Proto;
use virtnet_driver::gen::{self, GenConfig, GsoConfig, Mode};
use vnet::feature;

/// Byte `i` of every payload: not periodic in any segment size we use.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

#[test]
fn gen_sends_tso_and_uso_super_frames_through_our_backend_into_a_tap() {
    const TEST: &str = "gso_gen::gen_backend";
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("gsogen").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let b = tap_backend(&ns, "gso-gen", &tap.name);
    // USO where this kernel's TAP has it (Linux 6.2): the backend offers HOST_USO then.
    let mut protos = vec![(Proto::Tcp, 1448, 66)];
    if b.device.offered_features().contains(feature::HOST_USO) {
        protos.push((Proto::Udp, 1472, 42));
    } else {
        eprintln!("{TEST}: SKIPPED the USO part: this kernel's TAP has no UDP segmentation");
    }
    for (proto, mss, hdr_len) in protos {
        let before = ns.stats(&tap.name).unwrap();
        let tx_before = b.device.reports()[1].counters.clone();
        let cfg = GenConfig {
            socket: b.socket.clone(),
            mode: Mode::TxOnly,
            size: 65_000,
            gso: Some(GsoConfig {
                proto,
                mss: None,
                ipv6: false,
            }),
            duration: Duration::from_millis(1000),
            ..Default::default()
        };
        let started = Instant::now();
        let r = gen::run(&cfg, &mut |_| {}).unwrap();
        let g = r.gso.expect("a gso summary");
        assert_eq!(
            (g.mss, g.hdr_len, g.segments),
            (mss, hdr_len, 45),
            "{proto:?}"
        );
        let sent = r.per_pair[0].tx.packets;
        assert!(sent > 100, "{sent} super-frames in {:?}", started.elapsed());
        assert_eq!(r.per_pair[0].tx.bytes, sent * 65_000);
        assert_eq!(r.per_pair[0].tx.gso_offloaded, sent);
        assert!(r.summary.tx_gbps > 0.5, "{:?}", r.summary);
        let tx = b.device.reports()[1].counters.clone();
        assert_eq!(
            (tx.hdr_not_negotiated, tx.hdr_bad_gso, tx.hdr_bad_csum),
            (0, 0, 0),
            "the backend took every header: {tx:?}"
        );
        let after = ns.stats(&tap.name).unwrap();
        let frames = after["rx_packets"] - before["rx_packets"];
        let bytes = after["rx_bytes"] - before["rx_bytes"];
        // Lossless: a frame the TAP cannot take yet waits on the ring.
        assert_eq!(tx.dropped, tx_before.dropped, "{proto:?}: {tx:?}");
        assert_eq!(frames, sent, "{proto:?}: every super-frame at the TAP");
        assert_eq!(bytes, frames * 65_000, "the TAP counts whole super-frames");
        assert_eq!(after["rx_frame_errors"], before["rx_frame_errors"]);
    }
}

#[test]
fn gen_asks_for_uso_and_refuses_a_device_without_it() {
    // Root-free: our backend with null I/O. While it does not offer HOST_USO the run must stop
    // with the feature named; once it does, super-frames must flow.
    let b = start_backend(
        "gso-uso",
        BackendConfig {
            io: IoMode::Null { size: 64 },
            ..Default::default()
        },
    );
    let cfg = GenConfig {
        socket: b.socket.clone(),
        size: 65_000,
        gso: Some(GsoConfig {
            proto: Proto::Udp,
            mss: None,
            ipv6: false,
        }),
        duration: Duration::from_millis(300),
        ..Default::default()
    };
    let offered = virtnet_backend::device_features(1).contains(feature::HOST_USO);
    match gen::run(&cfg, &mut |_| {}) {
        Err(gen::GenError::Negotiation { feature, what }) if !offered => {
            assert_eq!((feature, what), ("HOST_USO", "--gso udp"));
            let msg = gen::GenError::Negotiation { feature, what }.to_string();
            assert_eq!(msg, "the device lacks HOST_USO, needed for --gso udp");
        }
        Ok(r) if offered => {
            assert!(r.per_pair[0].tx.gso_offloaded > 0);
            assert_eq!(r.gso.map(|g| (g.mss, g.segments)), Some((1472, 45)));
        }
        other => panic!("HOST_USO offered: {offered}; got {other:?}"),
    }
    // And TSO over IPv6, which it offers, runs; a wrong mode or size is refused.
    let tcp = GenConfig {
        gso: Some(GsoConfig {
            proto: Proto::Tcp,
            mss: Some(8000),
            ipv6: true,
        }),
        ..cfg.clone()
    };
    let r = gen::run(&tcp, &mut |_| {}).unwrap();
    assert_eq!(r.gso.map(|g| (g.hdr_len, g.segments)), Some((86, 9)));
    assert_eq!(r.per_pair[0].tx.bytes, r.per_pair[0].tx.packets * 65_000);
    for bad in [
        GenConfig {
            mode: Mode::Io,
            ..tcp.clone()
        },
        GenConfig {
            size: 65_590,
            ..tcp.clone()
        },
        GenConfig {
            size: 86 + 8000,
            ..tcp.clone()
        },
    ] {
        assert!(
            matches!(gen::run(&bad, &mut |_| {}), Err(gen::GenError::Options(_))),
            "{bad:?}"
        );
    }
}

#[test]
fn gen_tcp_sink_takes_a_host_tcp_stream_in_super_frames_through_our_backend() {
    // Host → guest with offloads: a TCP sender in the TAP's namespace streams to gen's
    // address; its stack hands the TAP super-frames (GUEST_TSO4 is negotiated, so the backend
    // lets the TAP pass them whole) that span dozens of mergeable buffers each, more than the
    // backend's used batch, so every frame's buffers must be published together.
    const TEST: &str = "gso_gen::tcp_sink";
    const BYTES: usize = 48 << 20;
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("tcpsink").expect("network namespace");
    let tap = TapSpec {
        address: "198.18.0.2/24".into(),
        ..TapSpec::for_backend()
    };
    ns.add_tap(&tap).expect("TAP in the namespace");
    let sink_ip = std::net::Ipv4Addr::from(gen::tcp_sink::ADDR);
    // The sink answers from the device's address, and no ARP.
    let mac = BackendConfig::default()
        .mac
        .map(|b| format!("{b:02x}"))
        .join(":");
    ns.exec(&[
        "ip",
        "neigh",
        "add",
        &sink_ip.to_string(),
        "lladdr",
        &mac,
        "dev",
        &tap.name,
        "nud",
        "permanent",
    ])
    .expect("the sink's address resolves");
    let b = tap_backend(&ns, "tcp-sink", &tap.name);
    let cfg = GenConfig {
        socket: b.socket.clone(),
        mode: Mode::TcpSink,
        duration: Duration::from_secs(6),
        // Polling, the driver looks at the ring while the backend writes a frame into it.
        busy_poll: true,
        ..Default::default()
    };
    let (report, sent) = std::thread::scope(|s| {
        let gen = s.spawn(|| gen::run(&cfg, &mut |_| {}));
        let sender = s.spawn(|| -> io::Result<usize> {
            use std::io::{Read, Write};
            ns.enter_this_thread().map_err(io::Error::other)?;
            let to = std::net::SocketAddr::from((sink_ip, 5201));
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut c = loop {
                match std::net::TcpStream::connect_timeout(&to, Duration::from_millis(500)) {
                    Ok(c) => break c,
                    Err(e) if Instant::now() >= deadline => return Err(e),
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            };
            // A stream that stalls fails the test instead of waiting out TCP's retries.
            c.set_write_timeout(Some(Duration::from_secs(5)))?;
            let chunk: Vec<u8> = (0..1 << 20).map(pattern).collect();
            let mut sent = 0;
            while sent < BYTES {
                c.write_all(&chunk)?;
                sent += chunk.len();
            }
            // Our FIN, then theirs: the sink answers a FIN with FIN-ACK.
            c.shutdown(std::net::Shutdown::Write)?;
            c.set_read_timeout(Some(Duration::from_secs(2)))?;
            assert_eq!(c.read(&mut [0u8; 16])?, 0, "the sink closes its side");
            Ok(sent)
        });
        (gen.join().unwrap(), sender.join().unwrap())
    });
    let sent = sent.expect("the stream");
    let r = report.expect("gen tcp-sink");
    let p = &r.per_pair[0];
    let t = p.tcp;
    assert_eq!(t.connections, 1, "{t:?}");
    assert_eq!(t.bytes, sent as u64, "every byte, in order: {t:?}");
    assert_eq!(t.out_of_order, 0, "{t:?}");
    assert_eq!(p.rx.dropped, 0, "no frame cut short: {:?}", p.rx);
    // Super-frames, not MSS-sized segments: on average several segments' worth each.
    assert!(
        t.bytes / t.segments > 4 * 1460,
        "{} bytes in {} segments",
        t.bytes,
        t.segments
    );
    let rx = b.device.reports()[0].counters.clone();
    assert_eq!(rx.dropped, 0, "the backend dropped nothing: {rx:?}");
}
