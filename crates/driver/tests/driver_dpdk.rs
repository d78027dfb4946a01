//! `virtnet gen` (its engine, [`virtnet_driver::gen::run`]) against DPDK's vhost PMD in testpmd:
//! our driver transmits while testpmd runs `rxonly`, then receives while testpmd runs
//! `txonly`. Both directions must move traffic, and the two sides' counters must agree
//! frame for frame.
//!
//! Needs root (apt-get for dpdk-dev, /var/run/dpdk); skips with a printed reason when it
//! cannot (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). testpmd's forwarding
//! lcore spins on a CPU, so the runs are kept to a couple of seconds.

use std::time::Duration;

use testkit::testpmd::Testpmd;
use testkit::{report, ScratchDir};
use virtnet_driver::gen::{self, GenConfig, Mode};
use virtnet_driver::{DriverConfig, NetDriver};

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
