//! The driver ([`NetDriver`]) against our backend, in one process over a real vhost-user
//! socket: frames both ways on every pair, each control command with its effect checked in
//! the backend, the rx buffer layouts, offload headers, and a used ring with garbage in it.

use testkit::inproc;
use virtnet_driver::{Frames, PollMode};

use std::time::{Duration, Instant};

use inproc::*;
use std::sync::Arc;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::offload::{self, TxOffloads};
use virtnet_driver::{CtrlMode, DriverConfig, DriverError, NetDriver, QueuePair, RxLayout};
use vnet::ctrl::Coalesce;
use vnet::feature;
use vnet::{NetHdr, HDR_F_NEEDS_CSUM};
use vring::{Features, GuestAddress, GuestMemory};

fn driver(b: &Backend, pairs: u16, ctrl: Option<CtrlMode>) -> NetDriver {
    let cfg = DriverConfig {
        pairs,
        ctrl,
        ..Default::default()
    };
    NetDriver::connect(&b.socket, &cfg).expect("connect")
}

/// Sends `frames` on `p` and collects what comes back on the same pair, within a deadline.
fn echo(p: &mut QueuePair, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    echo_expect(p, frames, frames.len())
}

/// Like [`echo`] when only `expect` frames should come back: waits for those, then a little
/// longer for any that should not.
fn echo_expect(p: &mut QueuePair, frames: &[Vec<u8>], expect: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut grace: Option<Instant> = None;
    loop {
        while sent < frames.len() && p.tx.send(&frames[sent], NetHdr::default()).unwrap() {
            sent += 1;
        }
        p.tx.flush();
        p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
        let now = Instant::now();
        if got.len() >= frames.len() || now >= deadline || grace.is_some_and(|g| now >= g) {
            return got;
        }
        if got.len() >= expect && sent == frames.len() && grace.is_none() {
            grace = Some(now + Duration::from_millis(50));
        }
        if p.tx.is_stopped() {
            p.tx.wait_wake(5).unwrap();
        } else {
            p.rx.wait(5);
        }
    }
}

/// Polls `p`'s rx for `for_ms`, returning the frames received.
fn drain_rx(p: &mut QueuePair, for_ms: u64) -> usize {
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_millis(for_ms);
    while Instant::now() < deadline {
        n +=
            p.rx.poll(256, PollMode::Napi, Frames(|_: &[u8]| {}))
                .unwrap();
        p.rx.wait(2);
    }
    n
}

#[test]
fn the_driver_sets_the_device_status_through_set_status() {
    let b = echo_backend("drv-status");
    let mut d = driver(&b, 1, Some(CtrlMode::Irq));
    // ACKNOWLEDGE | DRIVER, then FEATURES_OK, then DRIVER_OK once the queues run: three
    // requests, and the backend reports what it took.
    assert!(d.connection().has_status(), "STATUS negotiated");
    assert_eq!(d.connection_mut().get_status().unwrap(), Some(0xf));
    let device = b.device.device_report();
    assert_eq!((device.status, device.status_sets), (0xf, 3));
    // The device works after it.
    let mut p = d.take_pairs().remove(0);
    assert_eq!(echo(&mut p, &[frame(1, 64)]).len(), 1);
}

#[test]
fn a_backend_that_never_answers_fails_the_connect_in_time() {
    let dir = temp_dir("drv-silent");
    let socket = dir.0.join("vhost.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    // Accepts, reads whatever comes, never writes.
    std::thread::spawn(move || {
        use std::io::Read;
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 4096];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    let t0 = Instant::now();
    let err = NetDriver::connect(&socket, &DriverConfig::default()).unwrap_err();
    let waited = t0.elapsed();
    assert!(
        waited >= virtnet_driver::frontend::HANDSHAKE_TIMEOUT && waited < Duration::from_secs(30),
        "{waited:?}"
    );
    assert!(
        err.to_string()
            .contains("did not finish the vhost-user handshake"),
        "{err}"
    );
}

#[test]
fn frames_go_both_ways_on_every_pair_and_counters_agree() {
    let b = start_backend(
        "drv-mq",
        BackendConfig {
            pairs: 4,
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut d = driver(&b, 4, Some(CtrlMode::Irq));
    assert!(d.features().contains(feature::MQ | feature::CTRL_VQ));
    assert_eq!((d.max_pairs(), d.pairs(), d.active_pairs()), (4, 4, 4));
    assert_eq!(
        d.ctrl().unwrap().vq(),
        8,
        "ctrl vq at 2 * max_virtqueue_pairs"
    );
    assert_eq!(b.device.device_report().active_pairs, 4);
    let mut pairs = d.take_pairs();
    for p in pairs.iter_mut() {
        // Each pair's frames carry the pair number, to prove they come back on that pair.
        let frames: Vec<_> = (0..500)
            .map(|i| frame(i + 1000 * p.pair as u32, 200))
            .collect();
        let got = echo(p, &frames);
        assert_eq!(got.len(), frames.len(), "pair {}", p.pair);
        assert!(got == frames, "pair {} frames differ", p.pair);
    }
    let r = b.device.reports();
    for (i, (rx, tx)) in d.counters().iter().enumerate() {
        assert_eq!(rx.packets, 500);
        assert_eq!(tx.packets, 500);
        assert_eq!(r[2 * i].counters.packets, rx.packets.get());
        assert_eq!(r[2 * i + 1].counters.packets, tx.packets.get());
        assert_eq!(r[2 * i].counters.bytes, rx.bytes.get());
        assert_eq!(tx.bytes, 500 * 200);
        assert!(rx.broken_reason().is_none() && tx.broken_reason().is_none());
    }
    let c = d.ctrl().unwrap().counters();
    assert_eq!(
        (c.submitted, c.completed),
        (1, 1),
        "one VQ_PAIRS_SET at start"
    );
}

#[test]
fn after_vq_pairs_set_only_the_enabled_pairs_carry_traffic() {
    let b = start_backend(
        "drv-pairs",
        BackendConfig {
            pairs: 4,
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let mut d = driver(&b, 4, Some(CtrlMode::Irq));
    let mut pairs = d.take_pairs();
    d.set_queue_pairs(2).unwrap();
    assert_eq!(b.device.device_report().active_pairs, 2);
    assert_eq!(d.active_pairs(), 2);
    // Let whatever was in flight when the command landed arrive, then watch.
    for p in pairs.iter_mut() {
        drain_rx(p, 20);
    }
    let got: Vec<usize> = pairs.iter_mut().map(|p| drain_rx(p, 150)).collect();
    assert!(
        got[0] > 100 && got[1] > 100,
        "enabled pairs carry traffic: {got:?}"
    );
    assert_eq!(&got[2..], &[0, 0], "disabled pairs are silent: {got:?}");
    let r = b.device.reports();
    let before: Vec<u64> = (0..4).map(|p| r[2 * p].counters.packets).collect();
    std::thread::sleep(Duration::from_millis(50));
    let r = b.device.reports();
    assert_eq!(r[4].counters.packets, before[2]);
    assert_eq!(r[6].counters.packets, before[3]);
    // All four again.
    d.set_queue_pairs(4).unwrap();
    let got: Vec<usize> = pairs.iter_mut().map(|p| drain_rx(p, 150)).collect();
    assert!(got.iter().all(|&n| n > 100), "all pairs back: {got:?}");
    // More pairs than were set up is refused by the driver, not sent.
    assert!(matches!(
        d.set_queue_pairs(5),
        Err(DriverError::TooManyPairs { wanted: 5, max: 4 })
    ));
}

#[test]
fn coalescing_commands_show_in_the_backend_stats() {
    let b = start_backend(
        "drv-coal",
        BackendConfig {
            pairs: 2,
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let d = driver(&b, 2, Some(CtrlMode::Irq));
    let rx_all = Coalesce {
        max_packets: 32,
        max_usecs: 100,
    };
    let tx_all = Coalesce {
        max_packets: 8,
        max_usecs: 20,
    };
    d.set_rx_coalesce(rx_all).unwrap();
    d.set_tx_coalesce(tx_all).unwrap();
    let r = b.device.reports();
    for q in &r[..4] {
        let want = if q.index % 2 == 0 { rx_all } else { tx_all };
        assert_eq!(
            (q.coalesce_max_packets, q.coalesce_max_usecs),
            (want.max_packets, want.max_usecs),
            "queue {}",
            q.index
        );
    }
    let one = Coalesce {
        max_packets: 16,
        max_usecs: 50,
    };
    d.set_vq_coalesce(2, one).unwrap();
    let r = b.device.reports();
    assert_eq!(
        (r[2].coalesce_max_packets, r[2].coalesce_max_usecs),
        (16, 50)
    );
    assert_eq!(r[0].coalesce_max_packets, 32, "other queues untouched");
    assert_eq!(d.vq_coalesce(2).unwrap(), one);
    assert_eq!(d.vq_coalesce(1).unwrap(), tx_all);
    // A queue the device does not have: refused, with a clear error; the queue goes on.
    let err = d.set_vq_coalesce(99, one).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    assert_eq!(d.vq_coalesce(0).unwrap(), rx_all);
}

#[test]
fn promisc_off_and_the_mac_filter_drop_frames_to_other_macs() {
    let b = echo_backend("drv-filter");
    let mut d = driver(&b, 1, Some(CtrlMode::Irq));
    assert_eq!(
        d.mac(),
        Some(b.device.mac()),
        "MAC read from the config space"
    );
    let ours = [0x02, 0, 0, 0, 0, 0x42];
    let other = [0x02, 0, 0, 0, 0, 0x43];
    let multicast = [0x01, 0x00, 0x5e, 0, 0, 1];
    d.set_mac(ours).unwrap();
    d.set_promisc(false).unwrap();
    let mut p = d.take_pairs().remove(0);
    let to = |dst: [u8; 6], i: u32| {
        let mut f = frame(i, 64);
        f[..6].copy_from_slice(&dst);
        f
    };
    let got = echo_expect(&mut p, &[to(other, 1), to(ours, 2)], 1);
    assert_eq!(
        got,
        vec![to(ours, 2)],
        "only the frame to our MAC comes back"
    );
    assert_eq!(b.device.reports()[0].counters.filtered, 1);
    // Multicast: dropped without allmulti, delivered with it.
    assert_eq!(
        echo_expect(&mut p, &[to(multicast, 3), to(ours, 4)], 1),
        vec![to(ours, 4)]
    );
    d.set_allmulti(true).unwrap();
    assert_eq!(echo(&mut p, &[to(multicast, 5)]), vec![to(multicast, 5)]);
    // Promiscuous again: everything passes.
    d.set_promisc(true).unwrap();
    assert_eq!(echo(&mut p, &[to(other, 6)]), vec![to(other, 6)]);
    let dev = b.device.device_report();
    assert!(dev.promisc && dev.allmulti);
    assert_eq!(b.device.reports()[0].counters.filtered, 2);
}

#[test]
fn commands_without_their_feature_are_refused_by_the_driver() {
    let b = start_backend("drv-noctrl", BackendConfig::default());
    let d = driver(&b, 1, None);
    assert!(d.ctrl().is_none());
    let err = d.set_promisc(false).unwrap_err();
    assert!(matches!(err, DriverError::NotNegotiated { .. }), "{err}");
    assert!(err.to_string().contains("CTRL_RX"), "{err}");
}

#[test]
fn small_and_big_rx_buffers_without_mrg_rxbuf() {
    let b = echo_backend("drv-layouts");
    let base = Features::VERSION_1 | Features::RING_EVENT_IDX | Features::RING_INDIRECT_DESC;
    for (features, big) in [(base, false), (base | feature::GUEST_TSO4, true)] {
        let cfg = DriverConfig {
            features,
            tx_buf_len: 16384,
            ..Default::default()
        };
        let mut d = NetDriver::connect(&b.socket, &cfg).unwrap();
        assert!(!d.features().contains(feature::MRG_RXBUF));
        let mut p = d.take_pairs().remove(0);
        let layout = p.rx.layout();
        assert_eq!(matches!(layout, RxLayout::Big { .. }), big, "{layout:?}");
        let mut frames: Vec<_> = (0..300).map(|i| frame(i, 60 + i as usize * 4)).collect();
        if big {
            // Larger than any small buffer: spans several descriptors of a big buffer.
            frames.push(frame(7, 9000));
            frames.push(frame(8, 16000));
        }
        let got = echo(&mut p, &frames);
        assert_eq!(got.len(), frames.len(), "{layout:?}");
        assert!(got == frames, "{layout:?}: frames differ");
        assert_eq!(p.rx.counters.dropped, 0);
        drop(p);
        drop(d);
        // The backend takes the next connection.
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn checksum_and_tso_flags_travel_in_the_header() {
    let b = echo_backend("drv-offload");
    let cfg = DriverConfig {
        features: virtnet_driver::DEFAULT_FEATURES
            | feature::CSUM
            | feature::HOST_TSO4
            | feature::GUEST_CSUM,
        tx_buf_len: 16384,
        ..Default::default()
    };
    let mut d = NetDriver::connect(&b.socket, &cfg).unwrap();
    let mut p = d.take_pairs().remove(0);
    assert_eq!(
        p.tx.offloads(),
        TxOffloads {
            csum: true,
            tso4: true,
            tso6: false,
            uso: false,
        }
    );
    let tcp = |payload: usize| {
        let mut f = vec![0u8; 54 + payload];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((40 + payload) as u16).to_be_bytes());
        f[23] = 6;
        f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f[46] = 5 << 4;
        f
    };
    let mut small = tcp(100);
    assert!(p.tx.send_offloaded(&mut small, Some(1448)).unwrap());
    let mut big = tcp(8000);
    assert!(p.tx.send_offloaded(&mut big, Some(1448)).unwrap());
    p.tx.flush();
    // Echo hands the header back: the offload request arrives as sent.
    let mut out = Vec::new();
    let mut hdrs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while hdrs.len() < 2 && Instant::now() < deadline {
        match p.rx.recv(&mut out).unwrap() {
            Some(h) => hdrs.push((h, out.clone())),
            None => {
                p.rx.wait(5);
            }
        }
    }
    assert_eq!(hdrs.len(), 2);
    let (h, mut f) = hdrs.remove(0);
    assert_eq!(
        (h.flags, h.csum_start, h.csum_offset),
        (HDR_F_NEEDS_CSUM, 34, 16)
    );
    assert_eq!(h.gso_type, vnet::HDR_GSO_NONE);
    offload::complete_checksum(&mut f, &h);
    assert_ne!(&f[50..52], &[0, 0]);
    let (h, _) = hdrs.remove(0);
    assert_eq!(
        (h.gso_type, h.gso_size, h.hdr_len),
        (vnet::HDR_GSO_TCPV4, 1448, 54)
    );
    assert_eq!(p.tx.counters.csum_offloaded, 2);
    assert_eq!(p.tx.counters.gso_offloaded, 1);
}

/// A driver on `b` with one pair, IN_ORDER asked for or not.
fn driver_in_order(b: &Backend, in_order: bool) -> NetDriver {
    let mut features = virtnet_driver::DEFAULT_FEATURES;
    if !in_order {
        features = features.difference(Features::IN_ORDER);
    }
    let cfg = DriverConfig {
        features,
        ..Default::default()
    };
    NetDriver::connect(&b.socket, &cfg).expect("connect")
}

/// A driver on `b` (IN_ORDER or not) that echoed one frame and sent a second, which the
/// device has completed by the time this returns and the driver has not reclaimed; with the
/// driver's memory and the tx used ring's address.
fn second_frame_completed(
    b: &Backend,
    in_order: bool,
) -> (NetDriver, Arc<GuestMemory>, u64, QueuePair) {
    let mut d = driver_in_order(b, in_order);
    let mem = d.connection().mem.clone();
    let used = d.connection().queue(1).unwrap().config.rings().used.0;
    let mut p = d.take_pairs().remove(0);
    assert_eq!(echo(&mut p, &[frame(1, 64)]).len(), 1);
    assert!(p.tx.drain(Duration::from_secs(5)).unwrap());
    assert!(p.tx.send(&frame(2, 64), NetHdr::default()).unwrap());
    p.tx.flush();
    std::thread::sleep(Duration::from_millis(50));
    (d, mem, used, p)
}

#[test]
fn garbage_in_the_used_ring_breaks_that_queue_only() {
    let b = echo_backend("drv-garbage");
    // Without IN_ORDER the tx completion path reads each used element (with it, none:
    // see the next test).
    let (_d, mem, used, mut p) = second_frame_completed(&b, false);
    // Its used element is overwritten with an id the driver never handed out.
    let mut idx = [0u8; 2];
    mem.read(GuestAddress(used + 2), &mut idx).unwrap();
    let slot = u16::from_le_bytes(idx).wrapping_sub(1) as u64 % 256;
    let mut e = [0u8; 8];
    e[..4].copy_from_slice(&4000u32.to_le_bytes());
    mem.write(GuestAddress(used + 4 + 8 * slot), &e).unwrap();
    let err = p.tx.reclaim(usize::MAX).unwrap_err();
    assert!(
        matches!(
            err,
            DriverError::Broken {
                vq: 1,
                source: vring::Error::UsedIdOutOfRange { id: 4000, .. }
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("virtqueue 1 was broken by the device"),
        "{err}"
    );
    assert!(p.tx.counters.is_broken());
    // The queue stays broken: later calls say so instead of guessing.
    assert!(matches!(
        p.tx.send(&frame(3, 64), NetHdr::default()),
        Err(DriverError::Broken { vq: 1, .. })
    ));
    // rx is another queue: it still works.
    assert!(!p.rx.counters.is_broken());
    p.rx.poll(16, PollMode::Napi, Frames(|_: &[u8]| {}))
        .unwrap();
}

#[test]
fn with_in_order_tx_completions_read_no_used_element() {
    let b = echo_backend("drv-tx-unread");
    let (_d, mem, used, mut p) = second_frame_completed(&b, true);
    assert!(p.tx.ring().in_order());
    // Every tx used element overwritten with an id the driver never handed out: the used
    // index alone reclaims the frame.
    let mut e = [0u8; 8];
    e[..4].copy_from_slice(&4000u32.to_le_bytes());
    for slot in 0..256u64 {
        mem.write(GuestAddress(used + 4 + 8 * slot), &e).unwrap();
    }
    assert_eq!(p.tx.reclaim(usize::MAX).unwrap(), 1);
    assert!(!p.tx.counters.is_broken());
    let stats = p.tx.ring().stats();
    assert_eq!((stats.used, stats.used_inferred), (2, 2));
    // And the queue goes on working.
    assert_eq!(echo(&mut p, &[frame(3, 64)]).len(), 1);
}

#[test]
fn tagged_frames_skip_the_copy_but_never_send_stale_content() {
    let b = echo_backend("drv-tagged");
    let mut d = driver(&b, 1, None);
    let mut p = d.take_pairs().remove(0);
    // More frames than buffers, so buffers are reused; the content changes with the tag,
    // and an untagged send in between must not leave a stale tag behind.
    let plan: Vec<(u64, Vec<u8>)> = (0..1200u32)
        .map(|i| match i / 300 {
            0 => (1, frame(1, 80)),
            1 => (2, frame(2, 80)),
            2 => (0, frame(i, 80)),
            _ => (1, frame(1, 80)),
        })
        .collect();
    let mut got = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < plan.len() && Instant::now() < deadline {
        while sent < plan.len() {
            let (tag, f) = &plan[sent];
            let ok = if *tag == 0 {
                p.tx.send(f, NetHdr::default()).unwrap()
            } else {
                p.tx.send_tagged(f, NetHdr::default(), *tag).unwrap()
            };
            if !ok {
                break;
            }
            sent += 1;
        }
        p.tx.flush();
        p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
        if p.tx.is_stopped() {
            p.tx.wait_wake(5).unwrap();
        } else if got.len() < plan.len() {
            p.rx.wait(5);
        }
    }
    assert_eq!(got.len(), plan.len());
    for (i, (f, (_, want))) in got.iter().zip(&plan).enumerate() {
        assert!(f == want, "frame {i} carries stale content");
    }
}

#[test]
fn in_order_against_our_backend_frames_both_ways_every_used_element_the_next_in_order() {
    let b = echo_backend("drv-inorder");
    for in_order in [true, false] {
        let mut d = driver_in_order(&b, in_order);
        assert_eq!(d.features().contains(Features::IN_ORDER), in_order);
        let negotiated = b.device.device_report().features;
        assert_eq!(negotiated.contains("IN_ORDER"), in_order, "{negotiated}");
        let mut p = d.take_pairs().remove(0);
        assert_eq!(
            (p.tx.ring().in_order(), p.rx.ring().in_order()),
            (in_order, in_order)
        );
        // More frames than the rings hold, so both wrap many times; frames longer than a
        // mergeable rx buffer (1536 bytes) take two.
        let frames: Vec<_> = (0..3000u32)
            .map(|i| frame(i, 60 + (i as usize * 37) % 1940))
            .collect();
        let got = echo(&mut p, &frames);
        assert_eq!(got.len(), frames.len(), "in_order {in_order}");
        assert!(got == frames, "in_order {in_order}: frames differ");
        assert!(p.tx.drain(Duration::from_secs(5)).unwrap());
        let (tx, rx) = (p.tx.ring().stats(), p.rx.ring().stats());
        assert_eq!(tx.used, 3000);
        assert!(rx.used > 3000, "some frames took two buffers: {}", rx.used);
        // Our device writes one used element per chain, in order: with IN_ORDER every
        // element the rx side read was the next chain in avail order (an element out of
        // order would have been read as a batch, or broken the queue). The tx side reads
        // none with IN_ORDER: its completions need no length, the used index says them all.
        assert_eq!(rx.used_inferred, 0);
        assert_eq!(tx.used_inferred, if in_order { tx.used } else { 0 });
        assert!(!p.tx.counters.is_broken() && !p.rx.counters.is_broken());
        assert_eq!(p.rx.counters.dropped, 0);
        drop(p);
        drop(d);
        std::thread::sleep(Duration::from_millis(50));
    }
}
