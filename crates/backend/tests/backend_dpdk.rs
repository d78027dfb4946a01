//! DPDK's virtio-user PMD (testpmd `net_virtio_user0`) as the driver of our backend (null io),
//! over a real vhost-user socket: testpmd receives what the generator makes (`rxonly`), then
//! transmits into the backend (`txonly`). Both directions must move traffic, and testpmd's port
//! counters must agree with the backend's, frame for frame. virtio-user negotiates
//! VIRTIO_F_IN_ORDER with us and its in-order receive path trusts the order of our used
//! entries, so this also checks that the backend uses buffers in order.
//!
//! Needs root (apt-get for dpdk-dev, /var/run/dpdk); skips with a printed reason when it
//! cannot (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::time::{Duration, Instant};
use testkit::inproc;

use inproc::start_backend;
use testkit::testpmd::Testpmd;
use virtnet_backend::{BackendConfig, IoMode};

const TEST: &str = "backend_dpdk";
const FRAME: usize = 64;

fn ready() -> bool {
    testkit::testpmd::ready(TEST)
}

#[test]
fn dpdk_virtio_user_on_our_backend_both_directions_counters_agree() {
    if !ready() {
        return;
    }
    for mode in ["rxonly", "txonly"] {
        let b = start_backend(
            &format!("dpdk-{mode}"),
            BackendConfig {
                io: IoMode::Null { size: FRAME },
                ..Default::default()
            },
        );
        let mut t = Testpmd::start_virtio_user(&b.socket, mode, FRAME, "0@0,1@1")
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        std::thread::sleep(Duration::from_secs(2));
        t.command("stop").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let s = t.port_stats().unwrap();
        let device = b.device.device_report();
        assert!(
            device.features.contains("IN_ORDER"),
            "negotiated {}",
            device.features
        );
        // virtio-user negotiated the STATUS protocol feature and set the status through it:
        // FEATURES_OK (8) and DRIVER_OK (4), while its port runs.
        assert_eq!(device.status & 0xc, 0xc, "status {:#x}", device.status);
        let tail = t.output_tail(20);
        let queue = if mode == "rxonly" { 0 } else { 1 };
        let deadline = Instant::now() + Duration::from_secs(5);
        let ours = loop {
            let c = b.device.reports()[queue].counters.clone();
            // Guest tx: the backend catches up with every frame testpmd sent.
            if mode == "rxonly" || c.packets >= s.tx_packets || Instant::now() > deadline {
                break c;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        drop(t.quit());
        println!("{mode}: testpmd {s:?}; backend queue {queue}: {ours:?}");
        assert!(b
            .device
            .reports()
            .iter()
            .all(|q| q.counters.broken.is_none()));
        if mode == "rxonly" {
            assert!(s.rx_packets > 1000, "testpmd received too little:\n{tail}");
            assert_eq!(s.rx_bytes, s.rx_packets * FRAME as u64);
            // Frames the generator put in buffers testpmd had not yet polled when it stopped:
            // at most one ring's worth.
            assert!(
                ours.packets >= s.rx_packets && ours.packets - s.rx_packets <= 4096,
                "backend made {}, testpmd received {}",
                ours.packets,
                s.rx_packets
            );
        } else {
            assert!(s.tx_packets > 1000, "testpmd sent too little:\n{tail}");
            assert_eq!(ours.packets, s.tx_packets);
            assert_eq!(ours.bytes, s.tx_bytes);
        }
    }
}
