//! A real Linux guest on `virtnet backend`: QEMU (TCG) boots the Debian kernel with the busybox
//! initramfs of the guest harness, with `virtio-net-pci` on our backend over vhost-user, and the
//! backend's TAP in a network namespace of the test's own (the backend runs inside it).
//!
//! - [`linux_guest_traffic_through_virtnet_backend`]: ping, iperf3 both ways, sockperf; the
//!   guest's, the backend's and the TAP's counters agree; event index suppressed notifications.
//! - [`linux_guest_traffic_with_busy_polling`]: the same with busy polling set live through
//!   `virtnet ctl set-busy-poll`.
//! - [`frontend_reconnects_to_running_backend`]: QEMU is killed mid-traffic, a second QEMU
//!   connects to the same backend process, and traffic passes.
//! - [`guest_survives_backend_restart`]: QEMU with `reconnect=1`; the backend process is killed
//!   mid-traffic and restarted, and the guest's traffic resumes.
//! - [`multi_queue_guest_uses_both_pairs`]: `--queues 2`, two vCPUs, traffic on both pairs.
//! - [`guest_keeps_its_network_across_a_client_mode_backend_restart`]: QEMU listens
//!   (`server=on`), the backend connects (`--client`); the backend is killed and restarted,
//!   connects again, and the guest's network comes back.
//! - [`jumbo_mtu_guest_pings_the_host_with_8000_byte_packets`]: `host_mtu=9000`; QEMU's
//!   NET_SET_MTU sets the TAP's MTU, and 8000-byte pings pass whole, none lost.
//! - [`migrate`]: memory hotplug, and live migration to another backend and on again.
//! - [`figures_backend_vs_qemu_tap`] (ignored): TCG-bound figures, ours beside QEMU's own TAP
//!   backend, A/B interleaved, medians (docs/PERFORMANCE.md).
//!
//! Needs root; installs missing packages itself and skips with a printed reason when it cannot
//! (`VIRTNET_GUEST_REQUIRE=1` turns a skip into a failure). The tests of this file run one at a
//! time (a lock), since each guest wants a CPU. Recipe and pitfalls: docs/GUEST.md.
//!
//! The helpers are split by what they stand for: [`host`] is the host side (namespace, TAP,
//! servers, the backend process and `virtnet ctl`), [`stats`] parses `virtnet ctl stats`, and
//! [`traffic`] is the guest's traffic script and the checks every traffic run must pass.

mod host;
mod migrate;
mod stats;
mod traffic;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use testkit::guest::{GuestImage, Netdev, GUEST_REQUIREMENTS};
use testkit::netns::TapSpec;
use testkit::packages::{self, Requirement};
use testkit::report;

use host::{Host, IPERF_PORT, IPERF_PORT_2};
use stats::tap_delta;
use traffic::{
    assert_traffic, check_counters, check_notifications_suppressed, traffic_env, TRAFFIC,
};

/// Guests share two CPUs with everything else: one test of this file at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Root and the packages, or the reason to skip.
fn prerequisites(test: &str) -> Option<&'static GuestImage> {
    if !packages::is_root() {
        packages::skip(
            test,
            "needs root (apt-get, network namespaces, TAP devices)",
        );
        return None;
    }
    let requirements: Vec<Requirement> = GUEST_REQUIREMENTS
        .iter()
        .copied()
        .chain([Requirement::command("ip", "iproute2")])
        .collect();
    if let Err(reason) = packages::ensure(&requirements) {
        packages::skip(test, &reason);
        return None;
    }
    Some(GuestImage::get().expect("guest image"))
}

#[test]
fn linux_guest_traffic_through_virtnet_backend() {
    const TEST: &str = "guest_backend";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("backend", &[]);
    let backend = host.traffic_round(image, 5, IPERF_PORT, 3);
    // No frame read from the TAP is lost for lack of rx buffers: a 64 KiB GSO frame that does
    // not fit waits in the backend until the guest posts more (as in vhost_net).
    assert_eq!(backend.sum("rx", "dropped"), 0, "rx frames dropped");
    check_notifications_suppressed(&backend);
    // QEMU negotiated the STATUS protocol feature and set the device status through it.
    let sets = host.stats().status_sets;
    report(&format!("SET_STATUS requests from QEMU: {sets}"));
    assert!(sets > 0, "QEMU never sent SET_STATUS");
}

/// The backend run as nobody, with no capability, on a TAP nobody owns: the guest's traffic
/// runs as with root (README, "Without root").
#[test]
fn linux_guest_traffic_through_an_unprivileged_backend() {
    const TEST: &str = "guest_backend_unprivileged";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    if let Err(reason) = packages::ensure(&[Requirement::command("setpriv", "util-linux")]) {
        packages::skip(TEST, &reason);
        return;
    }
    let mut host = Host::with_unprivileged_backend("unpriv", 65534);
    let pid = host.backend().pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t65534")),
        "the backend runs as nobody"
    );
    assert!(status.lines().any(|l| l == "CapEff:\t0000000000000000"));
    let backend = host.traffic_round(image, 5, IPERF_PORT, 3);
    assert_eq!(backend.sum("rx", "dropped"), 0, "rx frames dropped");
}

/// Busy polling, set live through the control socket: the worker spins on the rings (and the
/// TAP) before sleeping, and finds work there.
#[test]
fn linux_guest_traffic_with_busy_polling() {
    const TEST: &str = "guest_backend_busy_poll";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("busypoll", &[]);
    host.ctl(&["set-busy-poll", "50"]);
    for (i, q) in host.stats().queues.iter().enumerate() {
        assert_eq!(q.busy_poll_us, 50, "queue {i} after set-busy-poll 50");
    }
    let backend = host.traffic_round(image, 3, IPERF_PORT, 3);
    let exits: Vec<String> = [
        "busy_poll_entries",
        "busy_poll_hits",
        "busy_poll_timeouts",
        "busy_poll_exit_other_work",
        "busy_poll_exit_yield",
    ]
    .iter()
    .map(|k| format!("{k}={}", backend.total(k)))
    .collect();
    report(&format!("busy poll: {}", exits.join(" ")));
    assert!(
        backend.total("busy_poll_entries") > 0,
        "busy polling never started"
    );
    assert!(
        backend.total("busy_poll_hits") > 0,
        "busy polling never found work"
    );
}

/// The frontend goes away in the middle of traffic and a new one connects to the same backend
/// process: QEMU #1 runs iperf3 and is killed; QEMU #2 boots on the same socket, and its
/// traffic passes. The backend and its TAP stay.
#[test]
fn frontend_reconnects_to_running_backend() {
    const TEST: &str = "guest_backend_reconnect";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("reconnect", &[]);
    let pid = host.backend().pid();
    let ifindex = host.tap_ifindex();
    let stats0 = host.stats();

    // QEMU #1: a long iperf3 that it will not finish.
    let script = r#"
ping -c 3 -i 0.2 -W 2 "$VN_PEER"
vn_mark traffic
iperf3 -c "$VN_PEER" -p 5201 -t 60 -f m
"#;
    let mut guest = host.start_guest(image, host.guest_config(script));
    guest.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    guest
        .wait_mark("traffic", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let log_mark = host.backend().out.len();
    let during = host.wait_tx_traffic(&stats0, 2000, Duration::from_secs(30));
    guest.kill();
    host.wait_backend_log(log_mark, "frontend disconnected", Duration::from_secs(10));
    drop(guest);
    let first = host.stats().since(&stats0);
    report(&format!(
        "QEMU #1 killed after {} tx frames:\n{}",
        during.since(&stats0).sum("tx", "packets"),
        first.summary()
    ));
    assert!(first.broken().is_empty(), "broken: {:?}", first.broken());

    // QEMU #2 on the same backend. The first iperf3 server still waits for its dead client.
    host.traffic_round(image, 2, IPERF_PORT_2, 1);
    assert_eq!(host.backend().pid(), pid, "the same backend process");
    assert_eq!(host.tap_ifindex(), ifindex, "the same TAP device");
}

/// The other direction: QEMU with `reconnect=1` keeps running while the backend process is
/// killed in the middle of iperf3 and started again on the same socket and TAP; the guest's
/// traffic resumes on the new process.
#[test]
fn guest_survives_backend_restart() {
    const TEST: &str = "guest_backend_restart";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("restart", &[]);
    let ifindex = host.tap_ifindex();
    let stats0 = host.stats();

    // iperf3 runs across the restart (TCP retransmits over the gap; `timeout` bounds it), then
    // ping until the path is back, then traffic on the new backend.
    let script = r#"
ping -c 3 -i 0.2 -W 2 "$VN_PEER"
vn_mark traffic
mbps() { awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
timeout 30 iperf3 -c "$VN_PEER" -p 5201 -t 6 -f m > /tmp/cut.txt 2>&1 || true
cat /tmp/cut.txt
vn_result iperf_across_restart_mbps "$(mbps /tmp/cut.txt)"
i=0
until ping -c 1 -W 1 "$VN_PEER" > /dev/null 2>&1; do i=$((i + 1)); [ $i -lt 30 ]; done
vn_result resume_tries "$i"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
iperf3 -c "$VN_PEER" -p 5202 -t 2 -f m > /tmp/up.txt
cat /tmp/up.txt
vn_result iperf_guest_tx_mbps "$(mbps /tmp/up.txt)"
iperf3 -c "$VN_PEER" -p 5202 -t 2 -f m -R > /tmp/down.txt
cat /tmp/down.txt
vn_result iperf_guest_rx_mbps "$(mbps /tmp/down.txt)"
"#;
    let mut config = host.guest_config(script);
    config.netdev = Netdev::VhostUser {
        socket: host.socket.clone(),
        queues: 1,
        reconnect_secs: Some(1),
        server: false,
    };
    config.dmesg = true;
    let mut guest = host.start_guest(image, config);
    guest.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    guest
        .wait_mark("traffic", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    host.wait_tx_traffic(&stats0, 2000, Duration::from_secs(30));
    let before_kill = host.stats().since(&stats0);
    host.kill_backend();
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    host.start_backend();
    report(&format!(
        "backend killed after {} tx frames, restarted after {:.1?}",
        before_kill.sum("tx", "packets"),
        killed.elapsed()
    ));
    host.wait_backend_log(0, "frontend connected", Duration::from_secs(20));
    let run = guest
        .finish()
        .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", host.backend_log()));
    let after = host.stats();

    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    let qemu_notes: Vec<&String> = run
        .serial
        .iter()
        .filter(|l| l.starts_with("qemu-system"))
        .collect();
    report(&format!("QEMU said: {qemu_notes:?}"));
    report(&format!("new backend:\n{}", after.summary()));
    run.assert_script_ok();
    assert_eq!(run.result("ping_loss"), Some("0"), "ping after the restart");
    for key in ["iperf_guest_tx_mbps", "iperf_guest_rx_mbps"] {
        let value: f64 = run.result(key).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        assert!(value > 0.0, "{key} after the restart: {:?}", run.results);
    }
    assert_eq!(host.tap_ifindex(), ifindex, "the same TAP device");
    assert!(after.broken().is_empty(), "broken: {:?}", after.broken());
    assert!(
        after.sum("tx", "packets") > 1000 && after.sum("rx", "packets") > 1000,
        "the new backend carried the traffic:\n{}",
        after.summary()
    );
}

/// Two queue pairs and two vCPUs: Linux maps each CPU's transmit to its own tx queue (XPS),
/// and the multi-queue TAP sends a flow's replies to the queue that flow came from, so iperf3
/// pinned to each CPU loads both pairs in both directions.
#[test]
fn multi_queue_guest_uses_both_pairs() {
    const TEST: &str = "guest_backend_mq";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("mq", &["--queues", "2"]);
    let (stats0, tap0) = (host.stats(), host.tap_stats());

    let script = r#"
vn_result queues "$(ls /sys/class/net/$VN_IF/queues | tr '\n' ,)"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
mbps() { awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
for cpu in 0 1; do
    iperf3 -c "$VN_PEER" -p 5201 -t 2 -A "$cpu" -f m > /tmp/up.txt
    cat /tmp/up.txt
    vn_result "iperf_cpu${cpu}_tx_mbps" "$(mbps /tmp/up.txt)"
    iperf3 -c "$VN_PEER" -p 5201 -t 2 -A "$cpu" -f m -R > /tmp/down.txt
    cat /tmp/down.txt
    vn_result "iperf_cpu${cpu}_rx_mbps" "$(mbps /tmp/down.txt)"
done
sleep 1
"#;
    let mut config = host.guest_config(script);
    config.netdev = Netdev::VhostUser {
        socket: host.socket.clone(),
        queues: 2,
        reconnect_secs: None,
        server: false,
    };
    config.cpus = 2;
    let run = host.run_guest_retrying_boot(image, config);
    let backend = host.stats().since(&stats0);
    let tap = tap_delta(&host.tap_stats(), &tap0);
    assert!(host.backend().try_wait().is_none(), "the backend exited");

    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    run.assert_script_ok();
    assert_eq!(run.result("queues"), Some("rx-0,rx-1,tx-0,tx-1,"));
    assert_eq!(run.result("ping_loss"), Some("0"), "ping lost packets");
    for key in [
        "iperf_cpu0_tx_mbps",
        "iperf_cpu0_rx_mbps",
        "iperf_cpu1_tx_mbps",
        "iperf_cpu1_rx_mbps",
    ] {
        let value: f64 = run.result(key).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        assert!(value > 0.0, "{key}: {:?}", run.results);
    }
    check_counters(&run, &backend, &tap);
    // Virtqueues: rx0 = 0, tx0 = 1, rx1 = 2, tx1 = 3.
    for (index, what) in [(1, "tx0"), (3, "tx1"), (0, "rx0"), (2, "rx1")] {
        assert!(
            backend.get(index, "packets") > 100,
            "{what} carried {} frames:\n{}",
            backend.get(index, "packets"),
            backend.summary()
        );
    }
}

/// Client mode, OVS-DPDK's way round: QEMU listens on the vhost-user socket (`server=on`) and
/// `virtnet backend --client` connects to it. The backend starts first and waits for QEMU's
/// socket; then it is killed (SIGKILL) while the guest pings, and started again: it connects
/// to the same QEMU, which sets the device up again, and the guest's network comes back.
#[test]
fn guest_keeps_its_network_across_a_client_mode_backend_restart() {
    const TEST: &str = "guest_backend_client";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("client", &["--client"]);
    let script = r#"
ping -c 3 -i 0.2 -W 2 "$VN_PEER" > /tmp/before.txt || true
cat /tmp/before.txt
vn_result ping_loss_before "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/before.txt)"
vn_mark restart
sleep 1
i=0
until ping -c 1 -W 1 "$VN_PEER" > /dev/null 2>&1; do i=$((i + 1)); [ $i -lt 30 ]; done
vn_result resume_tries "$i"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/after.txt || true
cat /tmp/after.txt
vn_result ping_loss_after "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/after.txt)"
"#;
    let mut config = host.guest_config(script);
    config.netdev = Netdev::VhostUser {
        socket: host.socket.clone(),
        queues: 1,
        reconnect_secs: None,
        server: true,
    };
    let mut guest = host.start_guest(image, config);
    guest.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    guest
        .wait_mark("restart", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    host.kill_backend();
    let killed = Instant::now();
    host.start_backend();
    host.wait_backend_log(0, "connected to the frontend", Duration::from_secs(20));
    report(&format!(
        "backend restarted and connected after {:.1?}",
        killed.elapsed()
    ));
    let run = guest
        .finish()
        .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", host.backend_log()));
    let after = host.stats();
    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    run.assert_script_ok();
    assert_eq!(
        run.result("ping_loss_before"),
        Some("0"),
        "before the restart"
    );
    assert_eq!(
        run.result("ping_loss_after"),
        Some("0"),
        "after the restart"
    );
    assert!(after.broken().is_empty(), "broken: {:?}", after.broken());
    assert!(
        after.sum("rx", "packets") >= 5 && after.sum("tx", "packets") >= 5,
        "the new backend carried the pings:\n{}",
        after.summary()
    );
}

/// QEMU's `host_mtu=9000`: QEMU offers VIRTIO_NET_F_MTU and, once the guest acknowledged it,
/// sends NET_SET_MTU (with REPLY_ACK) before it starts the queues; the backend sets its TAP's
/// interface to 9000, Linux gives the guest's interface the config space's 9000, and
/// 8000-byte pings pass both ways, each one frame (not six fragments), none lost.
#[test]
fn jumbo_mtu_guest_pings_the_host_with_8000_byte_packets() {
    const TEST: &str = "guest_backend_jumbo";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let host = Host::with_backend("jumbo", &[]);
    assert_eq!(host.tap_mtu(), 1500, "the TAP before the guest");
    let tap0 = host.tap_stats();
    let script = r#"
vn_result guest_mtu "$(cat /sys/class/net/$VN_IF/mtu)"
ping -c 5 -i 0.2 -W 2 -s 8000 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
"#;
    let mut config = host.guest_config(script);
    config.host_mtu = Some(9000);
    let run = host.run_guest(image, config);
    let tap = tap_delta(&host.tap_stats(), &tap0);
    report(&run.timing());
    report(&format!("results: {:?}; TAP moved {tap:?}", run.results));
    run.assert_script_ok();
    assert_eq!(run.result("guest_mtu"), Some("9000"), "the guest's MTU");
    assert_eq!(run.result("ping_loss"), Some("0"), "8000-byte pings lost");
    assert_eq!(host.tap_mtu(), 9000, "NET_SET_MTU did not reach the TAP");
    assert_eq!(host.stats().device_mtu, 9000, "the backend's MTU");
    // Five requests in, five replies out, give or take ARP: fragments would be 30 each way.
    for key in ["rx_packets", "tx_packets"] {
        let n = tap[key];
        assert!((5..=10).contains(&n), "TAP {key}: {n} frames for 5 pings");
    }
    assert!(
        tap["rx_bytes"] >= 5 * 8042,
        "TAP rx_bytes {}",
        tap["rx_bytes"]
    );
}

/// Figures for docs/PERFORMANCE.md: the traffic script on our backend (busy polling off, then
/// 50 us) beside QEMU's own TAP backend (vhost off), interleaved round by round on the same
/// machine, with the median of each. TCG bounds all of them. `VIRTNET_FIGURE_ROUNDS` (3) and
/// `VIRTNET_FIGURE_IPERF_SECS` (5) change the length.
#[test]
#[ignore = "figures for docs/PERFORMANCE.md, several minutes"]
fn figures_backend_vs_qemu_tap() {
    const TEST: &str = "guest_backend_figures";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let env_u32 = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = env_u32("VIRTNET_FIGURE_ROUNDS", 3);
    let iperf_secs = env_u32("VIRTNET_FIGURE_IPERF_SECS", 5);
    let ours = Host::with_backend("figours", &[]);
    let qemu = Host::new("figqemu", TapSpec::for_qemu());
    let setups = [
        "virtnet backend",
        "virtnet backend, busy poll 50 us",
        "QEMU tap, vhost=off",
    ];
    let keys = [
        "iperf_guest_tx_mbps",
        "iperf_guest_rx_mbps",
        "sockperf_avg_us",
        "sockperf_p50_us",
        "sockperf_p99_us",
    ];
    let mut figures: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); keys.len()]; setups.len()];
    for round in 0..rounds {
        for (s, setup) in setups.iter().enumerate() {
            let config = match s {
                0 | 1 => {
                    ours.ctl(&["set-busy-poll", if s == 1 { "50" } else { "0" }]);
                    ours.guest_config(TRAFFIC)
                }
                _ => qemu.qemu_tap_guest_config(TRAFFIC),
            };
            let host = if s < 2 { &ours } else { &qemu };
            let run = host.run_guest(image, traffic_env(config, iperf_secs, IPERF_PORT, 5));
            assert_traffic(&run, host);
            let values: Vec<f64> = keys
                .iter()
                .map(|k| {
                    run.result(k)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(f64::NAN)
                })
                .collect();
            report(&format!("round {round}, {setup}: {values:?}"));
            for (k, v) in values.into_iter().enumerate() {
                figures[s][k].push(v);
            }
        }
    }
    let mut table = vec![
        format!("| setup ({rounds} runs each, medians) | iperf3 guest→host Mbit/s | iperf3 host→guest Mbit/s | sockperf avg us | p50 us | p99 us |"),
        "|---|---|---|---|---|---|".to_string(),
    ];
    for (s, setup) in setups.iter().enumerate() {
        let cells: Vec<String> = figures[s]
            .iter()
            .map(|v| format!("{:.0}", median(v)))
            .collect();
        table.push(format!("| {setup} | {} |", cells.join(" | ")));
    }
    for line in &table {
        report(line);
    }
    for (s, setup) in setups.iter().enumerate() {
        report(&format!("all runs, {setup}: {:?}", figures[s]));
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
