//! DPDK's virtio-user PMD (testpmd `net_virtio_user0`) as a guest on `virtnet switch`, our
//! driver as the other: testpmd transmits (`txonly`) and our driver receives every frame it
//! sent, byte for byte as testpmd built it, from the MAC of testpmd's port; then our driver
//! transmits and testpmd receives (`rxonly`) every frame and byte of it.
//!
//! Needs root (apt-get for dpdk-dev, /var/run/dpdk); skips with a printed reason when it
//! cannot (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::time::{Duration, Instant};

use testkit::inproc::{connect_socket, temp_dir, WANTED};
use testkit::testpmd::Testpmd;
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Frames, PollMode};
use vnet::NetHdr;

const TEST: &str = "switch_dpdk";
const DPDK_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xd, 1];
const OUR_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0xd, 2];

#[test]
fn dpdk_virtio_user_and_our_driver_exchange_frames_through_the_switch() {
    if !testkit::testpmd::ready(TEST) {
        return;
    }
    let dir = temp_dir("switch-dpdk");
    let s = Switch::start(SwitchConfig {
        workers: vec![None],
        uplink: None,
        fdb: FdbConfig::default(),
        device: BackendConfig {
            io: IoMode::Echo,
            ..BackendConfig::default()
        },
    })
    .unwrap();
    let port = |name: &str, mac| PortSpec {
        name: name.into(),
        socket: dir.0.join(format!("{name}.sock")),
        mac,
        queues: 1,
        client: false,
        spoof_check: true,
    };
    s.add_port(port("dpdk", DPDK_MAC)).unwrap();
    s.add_port(port("ours", OUR_MAC)).unwrap();
    let mut ours = connect_socket(&dir.0.join("ours.sock"), WANTED, 2048);

    // testpmd sends 64 B frames from its port's MAC (virtio-user's `mac=`, the switch port's:
    // port security is on) to an address nobody has: flooded to our driver, the only other
    // port.
    let mac = ",mac=52:54:00:00:0d:01";
    let mut t =
        Testpmd::start_virtio_user_with(&dir.0.join("dpdk.sock"), mac, "txonly", 64, "0@0,1@1")
            .expect("testpmd");
    let mut got: Vec<Vec<u8>> = Vec::new();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        ours.rx
            .poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
    }
    t.command("stop").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sent = t.port_stats().unwrap();
    // What was still in flight when testpmd stopped arrives now.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        ours.rx
            .poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
    }
    let report = s.reports();
    let missed: u64 = report
        .iter()
        .filter(|r| r.spec.name == "ours")
        .map(|r| r.queues[0].counters.rx_missed)
        .sum();
    let drops = report
        .iter()
        .find(|r| r.spec.name == "dpdk")
        .and_then(|r| r.drops);
    println!(
        "testpmd sent {}, our driver got {}, {} missed (ring full); dropped at testpmd's port: {drops:?}",
        sent.tx_packets,
        got.len(),
        missed
    );
    assert!(sent.tx_packets > 1000, "{}", t.output_tail(20));
    assert_eq!(got.len() as u64 + missed, sent.tx_packets);
    assert!(got.len() > 1000);
    // testpmd's txonly frames are all alike: the first's bytes are every frame's.
    assert_eq!(&got[0][6..12], &DPDK_MAC, "from testpmd's port's MAC");
    assert_eq!(got[0].len(), 64);
    assert!(
        got.iter().all(|f| *f == got[0]),
        "a frame changed on the way"
    );
    drop(t.quit());

    // The other way: our driver sends 5000 frames of its own to testpmd's MAC (rxonly).
    let mut t =
        Testpmd::start_virtio_user_with(&dir.0.join("dpdk.sock"), mac, "rxonly", 64, "0@0,1@1")
            .expect("testpmd");
    let frames: Vec<Vec<u8>> = (0..5000u32)
        .map(|i| {
            let mut f = testkit::inproc::frame(i, 60 + (i as usize % 1400));
            f[..6].copy_from_slice(&DPDK_MAC);
            f[6..12].copy_from_slice(&OUR_MAC);
            f
        })
        .collect();
    // testpmd forwards a moment after its `start`; then 64 frames a millisecond, which its
    // polling takes without a miss (a miss would be counted on its port, never waited for).
    std::thread::sleep(Duration::from_secs(1));
    for burst in frames.chunks(64) {
        for f in burst {
            while !ours.tx.send(f, NetHdr::default()).unwrap() {
                ours.tx.flush();
                ours.tx.wait_wake(10).unwrap();
            }
        }
        ours.tx.flush();
        std::thread::sleep(Duration::from_millis(1));
    }
    let want_bytes: u64 = frames.iter().map(|f| f.len() as u64).sum();
    let deadline = Instant::now() + Duration::from_secs(5);
    let got = loop {
        let st = t.port_stats().unwrap();
        if st.rx_packets >= 5000 || Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(t.quit());
    assert_eq!(
        (got.rx_packets, got.rx_bytes),
        (5000, want_bytes),
        "testpmd received every frame and byte"
    );
    s.shutdown();
}
