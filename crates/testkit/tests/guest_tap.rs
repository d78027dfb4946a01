//! A real Linux guest on QEMU's own TAP backend (vhost off), on a TAP in a network namespace of
//! the test's own: the reference the `virtnet backend` guest test mirrors, with the same
//! traffic (ping, iperf3 both ways, sockperf ping-pong) and the same counter checks.
//!
//! It proves the namespace/TAP helper and the traffic script before our backend exists, and
//! gives the TCG-bound figures our backend is compared with. Needs root; installs missing
//! packages itself and skips with a printed reason when it cannot.

use std::time::{Duration, Instant};
use testkit::guest::{Guest, GuestConfig, GuestImage, GUEST_REQUIREMENTS};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages::{self, Requirement};
use testkit::{report, ScratchDir};

const TEST: &str = "guest_tap";

/// The guest half of the traffic: ping, iperf3 up and down, sockperf ping-pong. Each figure is
/// reported with `vn_result`; `sh -e` fails the script if a tool fails.
const SCRIPT: &str = r#"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
mbps() { awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
iperf3 -c "$VN_PEER" -t "$VN_IPERF_SECS" -f m > /tmp/up.txt
cat /tmp/up.txt
vn_result iperf_guest_tx_mbps "$(mbps /tmp/up.txt)"
iperf3 -c "$VN_PEER" -t "$VN_IPERF_SECS" -f m -R > /tmp/down.txt
cat /tmp/down.txt
vn_result iperf_guest_rx_mbps "$(mbps /tmp/down.txt)"
sockperf ping-pong -i "$VN_PEER" -p 11111 -t 3 > /tmp/sockperf.txt 2>&1
cat /tmp/sockperf.txt
vn_result sockperf_avg_us "$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' /tmp/sockperf.txt | head -n 1)"
"#;

#[test]
fn linux_guest_traffic_through_qemu_tap_in_netns() {
    if !packages::is_root() {
        packages::skip(
            TEST,
            "needs root (apt-get, network namespaces, TAP devices)",
        );
        return;
    }
    let requirements: Vec<Requirement> = GUEST_REQUIREMENTS
        .iter()
        .copied()
        .chain([Requirement::command("ip", "iproute2")])
        .collect();
    if let Err(reason) = packages::ensure(&requirements) {
        packages::skip(TEST, &reason);
        return;
    }
    let image = GuestImage::get().expect("guest image");
    let dir = ScratchDir::new("tap").expect("scratch dir");

    let ns = NetNs::create("tap").expect("network namespace");
    let tap = TapSpec::for_qemu();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let host_ip = tap.address.split('/').next().unwrap();

    // Host-side peers, inside the namespace, killed on drop.
    // --forceflush: stdout is a pipe, and block buffering would hide "Server listening".
    let iperf = ns
        .spawn(
            &["iperf3", "-s", "-B", host_ip, "--forceflush"],
            Some(&dir.join("iperf3.log")),
        )
        .expect("iperf3 server");
    let sockperf = ns
        .spawn(
            &["sockperf", "server", "-i", host_ip, "-p", "11111"],
            Some(&dir.join("sockperf.log")),
        )
        .expect("sockperf server");
    let deadline = Instant::now() + Duration::from_secs(10);
    iperf
        .out
        .wait_for(0, deadline, |l| l.contains("Server listening"))
        .expect("iperf3 server listening");

    let mut config = GuestConfig::tap(ns.name(), &tap.name, SCRIPT);
    config
        .env
        .push(("vn_iperf_secs".to_string(), "3".to_string()));
    let run = Guest::start(image, config, dir.path())
        .and_then(Guest::finish)
        .unwrap_or_else(|e| panic!("{e}"));
    let tap_stats = ns.stats(&tap.name).expect("TAP counters");
    drop((iperf, sockperf));

    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    run.assert_script_ok();
    run.assert_traffic_ran();

    // The TAP's rx is what the guest sent, its tx what the guest received.
    let guest_tx = run.stat("tx_packets");
    let guest_rx = run.stat("rx_packets");
    report(&format!(
        "guest tx {guest_tx} rx {guest_rx}; TAP rx {} tx {} tx_dropped {}",
        tap_stats["rx_packets"], tap_stats["tx_packets"], tap_stats["tx_dropped"]
    ));
    assert!(
        guest_tx > 1000 && guest_rx > 1000,
        "iperf3 moved few packets"
    );
    assert_eq!(tap_stats["rx_packets"], guest_tx, "TAP rx vs guest tx");
    assert_eq!(tap_stats["tx_packets"], guest_rx, "TAP tx vs guest rx");
}
