//! The guest half of the traffic and what every traffic run must show: the script, its
//! variables, its figures, and the guest's, backend's and TAP's counters agreeing.

use std::collections::BTreeMap;

use testkit::guest::{GuestConfig, GuestRun};
use testkit::report;

use crate::host::Host;
use crate::stats::Stats;

/// The guest half of the traffic, as guest_tap.rs runs it on QEMU's TAP backend: ping, iperf3
/// up and down, sockperf ping-pong, each figure reported with `vn_result`. `sh -e` fails the
/// script if a tool fails. The last second lets the final completions and interrupts land, so
/// the guest's counters (printed after the script) are final.
pub const TRAFFIC: &str = r#"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
mbps() { awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
iperf3 -c "$VN_PEER" -p "$VN_IPERF_PORT" -t "$VN_IPERF_SECS" -f m > /tmp/up.txt
cat /tmp/up.txt
vn_result iperf_guest_tx_mbps "$(mbps /tmp/up.txt)"
iperf3 -c "$VN_PEER" -p "$VN_IPERF_PORT" -t "$VN_IPERF_SECS" -f m -R > /tmp/down.txt
cat /tmp/down.txt
vn_result iperf_guest_rx_mbps "$(mbps /tmp/down.txt)"
sockperf ping-pong -i "$VN_PEER" -p 11111 -t "$VN_SOCKPERF_SECS" > /tmp/sockperf.txt 2>&1
cat /tmp/sockperf.txt
vn_result sockperf_avg_us "$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' /tmp/sockperf.txt | head -n 1)"
vn_result sockperf_p50_us "$(sed -n 's/.*percentile 50.000 = *\([0-9.]*\).*/\1/p' /tmp/sockperf.txt)"
vn_result sockperf_p99_us "$(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' /tmp/sockperf.txt)"
sleep 1
"#;

/// The traffic script's variables: iperf3 seconds per direction and server port, sockperf
/// seconds.
pub fn traffic_env(
    mut config: GuestConfig,
    iperf_secs: u32,
    iperf_port: u16,
    sockperf_secs: u32,
) -> GuestConfig {
    config.env.extend(
        [
            ("vn_iperf_secs", iperf_secs.to_string()),
            ("vn_iperf_port", iperf_port.to_string()),
            ("vn_sockperf_secs", sockperf_secs.to_string()),
        ]
        .map(|(k, v)| (k.to_string(), v)),
    );
    config
}

/// Asserts the traffic script's figures: no ping loss, non-zero throughput both ways, a
/// sockperf latency.
pub fn assert_traffic(run: &GuestRun, host: &Host) {
    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    if run.script_rc != 0 || run.result("ping_loss") != Some("0") {
        report(&format!("backend log:\n{}", host.backend_log()));
    }
    run.assert_script_ok();
    assert_eq!(
        run.ready.get("driver").map(String::as_str),
        Some("virtio_net")
    );
    run.assert_traffic_ran();
}

/// Checks that the guest's interface counters, the backend's queue counters and the TAP's
/// counters agree over one guest's life (`backend` and `tap` are the deltas over it, read after
/// QEMU exited).
///
/// Guest transmit: every frame the guest's virtio_net sent is one chain on a tx queue, and the
/// backend writes each to the TAP (the TAP's rx). Guest receive: every frame the backend read
/// from the TAP (the TAP's tx) went into the guest's rx buffers, or was dropped or filtered by
/// the backend and counted so.
pub fn check_counters(run: &GuestRun, backend: &Stats, tap: &BTreeMap<String, u64>) {
    let guest = |name: &str| run.stat(name);
    report(&format!(
        "guest: tx {} pkts {} B, rx {} pkts {} B, rx_dropped {} tx_dropped {}",
        guest("tx_packets"),
        guest("tx_bytes"),
        guest("rx_packets"),
        guest("rx_bytes"),
        guest("rx_dropped"),
        guest("tx_dropped"),
    ));
    report(&format!(
        "TAP: rx {} pkts {} B, tx {} pkts {} B, rx_dropped {} tx_dropped {}",
        tap["rx_packets"],
        tap["rx_bytes"],
        tap["tx_packets"],
        tap["tx_bytes"],
        tap["rx_dropped"],
        tap["tx_dropped"],
    ));
    report(&format!("backend:\n{}", backend.summary()));
    assert!(
        backend.broken().is_empty(),
        "broken queues: {:?}",
        backend.broken()
    );

    let tx_packets = backend.sum("tx", "packets");
    let tx_bytes = backend.sum("tx", "bytes");
    let tx_dropped = backend.sum("tx", "dropped");
    let rx_packets = backend.sum("rx", "packets");
    let rx_bytes = backend.sum("rx", "bytes");
    let rx_dropped = backend.sum("rx", "dropped");
    let rx_filtered = backend.sum("rx", "filtered");

    // Guest → backend tx queue → TAP.
    assert_eq!(tx_packets, guest("tx_packets"), "backend tx vs guest tx");
    assert_eq!(
        tx_bytes,
        guest("tx_bytes"),
        "backend tx bytes vs guest tx bytes"
    );
    assert_eq!(tx_dropped, 0, "the backend failed TAP writes");
    assert_eq!(tap["rx_packets"], tx_packets, "TAP rx vs backend tx");
    assert_eq!(
        tap["rx_bytes"], tx_bytes,
        "TAP rx bytes vs backend tx bytes"
    );

    // TAP → backend rx queue → guest.
    assert_eq!(
        tap["tx_packets"],
        rx_packets + rx_dropped + rx_filtered,
        "TAP tx vs backend rx + dropped + filtered"
    );
    assert_eq!(rx_packets, guest("rx_packets"), "backend rx vs guest rx");
    assert_eq!(
        rx_bytes,
        guest("rx_bytes"),
        "backend rx bytes vs guest rx bytes"
    );
}

/// Event index at work under iperf3: the guest did not kick for every frame it sent, and the
/// backend did not call for every batch it published.
pub fn check_notifications_suppressed(backend: &Stats) {
    let kicks = backend.sum("tx", "kicks");
    let packets = backend.sum("tx", "packets");
    let suppressed = backend.sum("rx", "calls_suppressed") + backend.sum("tx", "calls_suppressed");
    report(&format!(
        "event idx: tx kicks {kicks} for {packets} frames; calls {} sent, {suppressed} suppressed",
        backend.sum("rx", "calls") + backend.sum("tx", "calls")
    ));
    assert!(
        suppressed > 0 || kicks < packets,
        "no notification was suppressed: {kicks} kicks for {packets} tx frames, \
         no call suppressed"
    );
}
