//! A real Linux guest (QEMU under TCG, virtio_net) on DPDK's vhost PMD (testpmd), proving the
//! guest harness against a vhost-user backend that already exists.
//!
//! testpmd forwards in `icmpecho` mode: it answers the guest's ARP and ICMP echo requests, so
//! the guest's ping must get every reply, and the counters of both sides must agree packet for
//! packet.
//!
//! Needs root (apt-get, /var/run/dpdk); installs missing packages itself and skips with a
//! printed reason when it cannot (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use testkit::guest::{Guest, GuestConfig, GuestImage, GUEST_REQUIREMENTS};
use testkit::packages;
use testkit::testpmd::{Testpmd, TESTPMD_REQUIREMENTS};
use testkit::{report, ScratchDir};

const TEST: &str = "guest_dpdk";

/// ARP, then ping, then the interface counters.
const SCRIPT: &str = r#"
arping -c 2 -w 10 -I "$VN_IF" "$VN_PEER"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
"#;

#[test]
fn linux_guest_pings_through_dpdk_vhost_backend() {
    if !packages::is_root() {
        packages::skip(TEST, "needs root (apt-get installs, DPDK's /var/run/dpdk)");
        return;
    }
    let requirements: Vec<_> = GUEST_REQUIREMENTS
        .iter()
        .chain(TESTPMD_REQUIREMENTS)
        .copied()
        .collect();
    if let Err(reason) = packages::ensure(&requirements) {
        packages::skip(TEST, &reason);
        return;
    }

    let image = GuestImage::get().expect("guest image");
    report(&format!(
        "kernel {}, initramfs {} (built in {:.1?})",
        image.kernel.version,
        image.initramfs.display(),
        image.build_time
    ));
    let dir = ScratchDir::new("dpdk").expect("scratch dir");
    let socket = dir.join("vhost.sock");
    let mut testpmd = Testpmd::start_vhost(&socket, 1, "icmpecho", Some(&dir.join("testpmd.log")))
        .expect("testpmd");

    let config = GuestConfig::vhost_user(&socket, SCRIPT);
    let guest = Guest::start(image, config, dir.path()).expect("start QEMU");
    let run = match guest.finish() {
        Ok(run) => run,
        Err(e) => panic!("{e}\ntestpmd:\n{}", testpmd.output_tail(30)),
    };
    let port = testpmd.port_stats().expect("testpmd port stats");
    let runtime_dir = testpmd.runtime_dir();
    let testpmd_log = testpmd.quit();
    report(&run.timing());
    report(&format!("testpmd port 0: {port:?}"));

    run.assert_script_ok();
    assert_eq!(
        run.ready.get("driver").map(String::as_str),
        Some("virtio_net")
    );
    assert_eq!(
        run.result("ping_loss"),
        Some("0"),
        "ping through testpmd's icmpecho lost packets:\n{}",
        run.script_output.join("\n")
    );

    // 2 ARP probes, the ARP exchange before the first ping and 5 echo requests.
    let guest_tx = run.stat("tx_packets");
    let guest_rx = run.stat("rx_packets");
    assert!(guest_tx >= 8, "guest sent {guest_tx} packets");
    assert!(guest_rx >= 8, "guest received {guest_rx} packets");
    // No IPv6 in the guest and testpmd only answers: every packet is one of the test's, so
    // the two sides must agree exactly.
    assert_eq!(port.rx_packets, guest_tx, "testpmd RX vs guest TX");
    assert_eq!(port.tx_packets, guest_rx, "testpmd TX vs guest RX");
    assert_eq!(
        port.rx_bytes,
        run.stat("tx_bytes"),
        "testpmd RX vs guest TX bytes"
    );
    assert_eq!(
        port.tx_bytes,
        run.stat("rx_bytes"),
        "testpmd TX vs guest RX bytes"
    );
    assert!(
        testpmd_log.iter().any(|l| l.contains("Bye")),
        "testpmd did not exit cleanly:\n{}",
        testpmd_log.join("\n")
    );
    assert!(!runtime_dir.exists() || std::fs::remove_dir_all(&runtime_dir).is_ok());
}
