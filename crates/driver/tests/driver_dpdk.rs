//! `virtnet gen` (its engine, [`virtnet_driver::gen::run`]) against DPDK's vhost PMD in testpmd:
//! our driver transmits while testpmd runs `rxonly`, then receives while testpmd runs
//! `txonly`. Both directions must move traffic, and the two sides' counters must agree
//! frame for frame. With VIRTIO_F_IN_ORDER negotiated (DPDK's vhost library offers it), and
//! testpmd in `io` forwarding, every frame our driver sends comes back to it byte for byte.
//!
//! Needs root (apt-get for dpdk-dev, /var/run/dpdk); skips with a printed reason when it
//! cannot (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). testpmd's forwarding
//! lcore spins on a CPU, so the runs are kept to a couple of seconds.

use std::time::Duration;

use std::time::Instant;

use testkit::inproc::frame;
use testkit::testpmd::Testpmd;
use testkit::{report, ScratchDir};
use virtnet_driver::gen::{self, GenConfig, Mode};
use virtnet_driver::{DriverConfig, Frames, NetDriver, PollMode};
use vnet::NetHdr;
use vring::Features;

const TEST: &str = "driver_dpdk";

fn ready() -> bool {
    testkit::testpmd::ready(TEST)
}

fn gen_config(socket: &std::path::Path, mode: Mode, secs: f64) -> GenConfig {
    GenConfig {
        socket: socket.to_path_buf(),
        mode,
        duration: Duration::from_secs_f64(secs),
        connect_wait: Duration::from_secs(10),
        ..Default::default()
    }
}

#[test]
fn gen_against_dpdk_vhost_both_directions_counters_agree() {
    if !ready() {
        return;
    }
    let dir = ScratchDir::new("drvdpdk").expect("scratch dir");
    let socket = dir.join("vhost.sock");

    // Our tx -> testpmd rxonly.
    let mut pmd = Testpmd::start_vhost(&socket, 1, "rxonly", Some(&dir.join("rxonly.log")))
        .expect("testpmd rxonly");
    let r = gen::run(&gen_config(&socket, Mode::TxOnly, 2.0), &mut |l| {
        report(&format!("gen txonly: {}", l.render()))
    });
    let r = match r {
        Ok(r) => r,
        Err(e) => panic!("gen txonly: {e}\n{}", pmd.output_tail(30)),
    };
    let stats = pmd.port_stats().expect("port stats");
    assert!(r.features.contains("IN_ORDER"), "{}", r.features);
    let sent = r.per_pair[0].tx.packets;
    report(&format!(
        "txonly: gen sent {sent} frames ({:.3} Mpps); testpmd RX-packets {} RX-missed {}",
        r.summary.tx_mpps, stats.rx_packets, stats.rx_missed
    ));
    assert!(r.summary.tx_mpps > 0.0 && sent > 0);
    // Every frame we handed over was completed (drained), i.e. dequeued by the vhost PMD.
    assert_eq!(r.per_pair[0].tx.completed, sent);
    assert_eq!(stats.rx_packets, sent, "testpmd received what we sent");
    assert_eq!(stats.rx_bytes, r.per_pair[0].tx.bytes);
    drop(pmd.quit());
    std::thread::sleep(Duration::from_millis(200));

    // testpmd txonly -> our rx. testpmd stops forwarding before gen stops polling, so gen
    // takes every frame testpmd managed to enqueue.
    let mut pmd = Testpmd::start_vhost(&socket, 1, "txonly", Some(&dir.join("txonly.log")))
        .expect("testpmd txonly");
    let cfg = gen_config(&socket, Mode::RxOnly, 3.0);
    let gen_thread = std::thread::spawn(move || gen::run(&cfg, &mut |_| {}));
    std::thread::sleep(Duration::from_millis(2200));
    pmd.command("stop").expect("stop forwarding");
    let r = match gen_thread.join().expect("gen thread") {
        Ok(r) => r,
        Err(e) => panic!("gen rxonly: {e}\n{}", pmd.output_tail(30)),
    };
    let stats = pmd.port_stats().expect("port stats");
    assert!(r.features.contains("IN_ORDER"), "{}", r.features);
    let got = r.per_pair[0].rx.packets;
    report(&format!(
        "rxonly: gen received {got} frames ({:.3} Mpps); testpmd TX-packets {}",
        r.summary.rx_mpps, stats.tx_packets
    ));
    assert!(r.summary.rx_mpps > 0.0 && got > 0);
    assert_eq!(got, stats.tx_packets, "we received what testpmd sent");
    assert_eq!(r.per_pair[0].rx.bytes, stats.tx_bytes);
    assert_eq!(r.per_pair[0].rx.dropped, 0);

    // Our driver negotiated the STATUS protocol feature with DPDK's vhost library, which
    // starts such a device only on DRIVER_OK: the traffic above shows it started, and the
    // library reports the status the driver set.
    let cfg = DriverConfig {
        connect_wait: Duration::from_secs(10),
        ..Default::default()
    };
    let mut d = NetDriver::connect(&socket, &cfg).expect("connect again");
    assert!(d.connection().has_status(), "DPDK offers STATUS");
    assert_eq!(
        d.connection_mut().get_status().expect("GET_STATUS"),
        Some(0xf)
    );
    drop(d);
    drop(pmd.quit());
}

#[test]
fn in_order_with_dpdk_vhost_frames_come_back_byte_for_byte() {
    if !ready() {
        return;
    }
    let dir = ScratchDir::new("drvdpdkio").expect("scratch dir");
    let socket = dir.join("vhost.sock");
    // io forwarding on one port: what testpmd receives from us it sends back to us.
    let pmd = Testpmd::start_vhost(&socket, 1, "io", Some(&dir.join("io.log"))).expect("testpmd");
    for in_order in [true, false] {
        let mut features = virtnet_driver::DEFAULT_FEATURES;
        if !in_order {
            features = features.difference(Features::IN_ORDER);
        }
        let cfg = DriverConfig {
            features,
            connect_wait: Duration::from_secs(10),
            ..Default::default()
        };
        let mut d = match NetDriver::connect(&socket, &cfg) {
            Ok(d) => d,
            Err(e) => panic!("connect: {e}\n{}", pmd.output_tail(30)),
        };
        assert_eq!(d.features().contains(Features::IN_ORDER), in_order);
        let mut p = d.take_pairs().remove(0);
        assert_eq!(p.tx.ring().in_order(), in_order);
        assert_eq!(p.rx.ring().in_order(), in_order);
        // More frames than a ring holds, 60 to 1514 bytes, each numbered.
        let frames: Vec<_> = (0..4000u32)
            .map(|i| frame(i, 60 + (i as usize * 53) % 1455))
            .collect();
        let mut got: Vec<Vec<u8>> = Vec::new();
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < frames.len() && Instant::now() < deadline {
            // Never more in flight than our rx ring holds, so testpmd never finds it full.
            while sent < frames.len()
                && sent - got.len() < 128
                && p.tx.send(&frames[sent], NetHdr::default()).unwrap()
            {
                sent += 1;
            }
            p.tx.flush();
            let n =
                p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
                    .unwrap();
            if p.tx.is_stopped() {
                p.tx.wait_wake(1).unwrap();
            } else if n == 0 {
                p.rx.wait(1);
            }
        }
        assert_eq!(
            got.len(),
            frames.len(),
            "in_order {in_order}: frames lost\n{}",
            pmd.output_tail(20)
        );
        for (i, (g, f)) in got.iter().zip(&frames).enumerate() {
            assert!(g == f, "in_order {in_order}: frame {i} differs");
        }
        assert!(p.tx.drain(Duration::from_secs(5)).unwrap());
        let (tx, rx) = (p.tx.ring().stats(), p.rx.ring().stats());
        report(&format!(
            "io, in_order {in_order}: {} frames back; used elements inferred: tx {} of {}, rx {} of {}",
            got.len(),
            tx.used_inferred,
            tx.used,
            rx.used_inferred,
            rx.used
        ));
        assert!(!p.tx.counters.is_broken() && !p.rx.counters.is_broken());
        drop(p);
        drop(d);
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(pmd.quit());
}
