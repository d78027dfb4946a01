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
//! - [`figures_backend_vs_qemu_tap`] (ignored): TCG-bound figures, ours beside QEMU's own TAP
//!   backend, A/B interleaved, medians (docs/PERFORMANCE.md).
//!
//! Needs root; installs missing packages itself and skips with a printed reason when it cannot
//! (`VIRTNET_GUEST_REQUIRE=1` turns a skip into a failure). The tests of this file run one at a
//! time (a lock), since each guest wants a CPU. Recipe and pitfalls: docs/GUEST.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use testkit::guest::{Guest, GuestConfig, GuestImage, GuestRun, Netdev, GUEST_REQUIREMENTS};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages::{self, Requirement};
use testkit::process::{run_checked, wait_for_path, Proc};
use testkit::{report, ScratchDir};

const BIN: &str = env!("CARGO_BIN_EXE_virtnet");

/// Ports of the host-side servers in the namespace.
const IPERF_PORT: u16 = 5201;
/// A second iperf3 server, for a guest whose predecessor left the first one in a dead test.
const IPERF_PORT_2: u16 = 5202;
const SOCKPERF_PORT: u16 = 11111;

/// The guest half of the traffic, as guest_tap.rs runs it on QEMU's TAP backend: ping, iperf3
/// up and down, sockperf ping-pong, each figure reported with `vn_result`. `sh -e` fails the
/// script if a tool fails. The last second lets the final completions and interrupts land, so
/// the guest's counters (printed after the script) are final.
const TRAFFIC: &str = r#"
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

/// One queue of `virtnet ctl stats`.
#[derive(Debug, Clone, Default)]
struct QueueStats {
    kind: String,
    broken: Option<String>,
    busy_poll_us: u64,
    counters: BTreeMap<String, u64>,
}

/// `virtnet ctl stats`, per queue (rx0, tx0, rx1, tx1, ..., ctrl).
#[derive(Debug, Clone, Default)]
struct Stats {
    queues: Vec<QueueStats>,
    /// The device report's SET_STATUS count for the current connection.
    status_sets: u64,
}

impl Stats {
    fn parse(json: &str) -> Stats {
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("ctl stats: {e}: {json}"));
        let queues = v["queues"]
            .as_array()
            .unwrap_or_else(|| panic!("no queues in {json}"))
            .iter()
            .map(|q| {
                let counters = q
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| !k.starts_with("coalesce") && *k != "index")
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect();
                QueueStats {
                    kind: q["kind"].as_str().unwrap_or_default().to_string(),
                    broken: q["broken"].as_str().map(str::to_string),
                    busy_poll_us: q["busy_poll_us"].as_u64().unwrap_or_default(),
                    counters,
                }
            })
            .collect();
        let status_sets = v["device"]["status_sets"].as_u64().unwrap_or_default();
        Stats {
            queues,
            status_sets,
        }
    }

    /// A counter of virtqueue `index`.
    fn get(&self, index: usize, name: &str) -> u64 {
        self.queues
            .get(index)
            .and_then(|q| q.counters.get(name))
            .copied()
            .unwrap_or_else(|| panic!("no counter {name} of queue {index} in {self:?}"))
    }

    /// A counter summed over the queues of one kind ("rx", "tx").
    fn sum(&self, kind: &str, name: &str) -> u64 {
        (0..self.queues.len())
            .filter(|&i| self.queues[i].kind == kind)
            .map(|i| self.get(i, name))
            .sum()
    }

    /// A counter summed over every queue.
    fn total(&self, name: &str) -> u64 {
        self.sum("rx", name) + self.sum("tx", name) + self.sum("ctrl", name)
    }

    /// The counters moved since `before` (queue states from `self`).
    fn since(&self, before: &Stats) -> Stats {
        let mut delta = self.clone();
        for (i, q) in delta.queues.iter_mut().enumerate() {
            for (name, value) in q.counters.iter_mut() {
                let old = before
                    .queues
                    .get(i)
                    .and_then(|b| b.counters.get(name))
                    .copied()
                    .unwrap_or(0);
                *value = value.saturating_sub(old);
            }
        }
        delta
    }

    fn broken(&self) -> Vec<String> {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| Some(format!("queue {i}: {}", q.broken.as_ref()?)))
            .collect()
    }

    /// One line per data queue with the counters that matter here, for the test log.
    fn summary(&self) -> String {
        let keys = [
            "packets",
            "bytes",
            "dropped",
            "filtered",
            "kicks",
            "calls",
            "calls_suppressed",
            "batches_flushed",
            "busy_poll_entries",
            "busy_poll_hits",
            "busy_poll_timeouts",
            "busy_poll_exit_yield",
            "weight_exhausted",
        ];
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.kind != "ctrl")
            .map(|(i, q)| {
                let fields: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{k}={}", q.counters.get(*k).copied().unwrap_or(0)))
                    .collect();
                format!("  {} {i}: {}", q.kind, fields.join(" "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn tap_delta(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}

/// The host side of a test: a network namespace with a TAP, optionally `virtnet backend`
/// inside it, and the iperf3 and sockperf servers. Fields drop in order: processes first,
/// then the namespace, then the scratch directory.
struct Host {
    backend: Option<Proc>,
    servers: Vec<Proc>,
    ns: NetNs,
    tap: TapSpec,
    socket: PathBuf,
    ctl: PathBuf,
    backend_args: Vec<String>,
    backend_starts: u32,
    dir: ScratchDir,
}

impl Host {
    /// The namespace with `tap` and the servers; no backend yet.
    fn new(tag: &str, tap: TapSpec) -> Host {
        let dir = ScratchDir::new(tag).expect("scratch dir");
        let ns = NetNs::create(tag).expect("network namespace");
        ns.add_tap(&tap).expect("TAP in the namespace");
        let mut host = Host {
            backend: None,
            servers: Vec::new(),
            socket: dir.join("vhost.sock"),
            ctl: dir.join("ctl.sock"),
            backend_args: Vec::new(),
            backend_starts: 0,
            ns,
            tap,
            dir,
        };
        host.start_servers();
        host
    }

    /// The namespace with the backend's TAP, the servers, and `virtnet backend` with
    /// `backend_args` on top of --socket-path, --tap and --ctl.
    fn with_backend(tag: &str, backend_args: &[&str]) -> Host {
        let mut host = Host::new(tag, TapSpec::for_backend());
        host.backend_args = backend_args.iter().map(|s| s.to_string()).collect();
        host.start_backend();
        host
    }

    fn host_ip(&self) -> &str {
        self.tap.address.split('/').next().unwrap()
    }

    /// Starts `virtnet backend` inside the namespace (so it opens the TAP there) and waits for
    /// its sockets.
    fn start_backend(&mut self) {
        assert!(self.backend.is_none(), "one backend at a time");
        // A killed predecessor leaves its socket files: wait for the new ones.
        let _ = std::fs::remove_file(&self.ctl);
        let _ = std::fs::remove_file(&self.socket);
        let mut argv: Vec<&str> = vec![
            BIN,
            "backend",
            "--socket-path",
            self.socket.to_str().unwrap(),
            "--tap",
            &self.tap.name,
            "--ctl",
            self.ctl.to_str().unwrap(),
        ];
        argv.extend(self.backend_args.iter().map(String::as_str));
        let log = self
            .dir
            .join(&format!("backend-{}.log", self.backend_starts));
        self.backend_starts += 1;
        let mut backend = self.ns.spawn(&argv, Some(&log)).expect("virtnet backend");
        wait_for_path(&mut backend, &self.ctl, Duration::from_secs(10)).expect("backend ctl");
        wait_for_path(&mut backend, &self.socket, Duration::from_secs(10)).expect("backend socket");
        self.backend = Some(backend);
    }

    /// Kills the backend process (SIGKILL: no chance to clean up).
    fn kill_backend(&mut self) {
        let mut backend = self.backend.take().expect("a running backend");
        backend.kill();
    }

    fn backend(&mut self) -> &mut Proc {
        self.backend.as_mut().expect("a running backend")
    }

    /// The backend's log so far, for failure messages.
    fn backend_log(&self) -> String {
        self.backend
            .as_ref()
            .map(|b| b.out.tail(40))
            .unwrap_or_else(|| "(no backend)".to_string())
    }

    /// Waits for a line of the backend's log containing `text`, at line `from` or later.
    fn wait_backend_log(&self, from: usize, text: &str, limit: Duration) {
        let backend = self.backend.as_ref().expect("a running backend");
        backend
            .out
            .wait_for(from, Instant::now() + limit, |l| l.contains(text))
            .unwrap_or_else(|e| {
                panic!(
                    "backend did not log {text:?} ({e:?}):\n{}",
                    self.backend_log()
                )
            });
    }

    fn start_servers(&mut self) {
        let ip = self.host_ip().to_string();
        for port in [IPERF_PORT, IPERF_PORT_2] {
            let port = port.to_string();
            // --forceflush: stdout is a pipe, and block buffering would hide "Server listening".
            let server = self
                .ns
                .spawn(
                    &["iperf3", "-s", "-B", &ip, "-p", &port, "--forceflush"],
                    Some(&self.dir.join(&format!("iperf3-{port}.log"))),
                )
                .expect("iperf3 server");
            server
                .out
                .wait_for(0, Instant::now() + Duration::from_secs(10), |l| {
                    l.contains("Server listening")
                })
                .expect("iperf3 server listening");
            self.servers.push(server);
        }
        let port = SOCKPERF_PORT.to_string();
        let sockperf = self
            .ns
            .spawn(
                &["sockperf", "server", "-i", &ip, "-p", &port],
                Some(&self.dir.join("sockperf.log")),
            )
            .expect("sockperf server");
        self.servers.push(sockperf);
    }

    /// `virtnet ctl ARGS` against the backend; its stdout.
    fn ctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(BIN);
        cmd.arg("ctl").arg("--socket").arg(&self.ctl).args(args);
        run_checked("virtnet ctl", cmd, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", self.backend_log()))
    }

    fn stats(&self) -> Stats {
        Stats::parse(&self.ctl(&["stats"]))
    }

    /// Waits until the backend's tx queues have moved `packets` frames past `before`: the
    /// guest's traffic is flowing.
    fn wait_tx_traffic(&self, before: &Stats, packets: u64, limit: Duration) -> Stats {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.stats();
            let moved = now.since(before).sum("tx", "packets");
            if moved >= packets {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "only {moved} tx frames within {limit:?}:\n{}",
                now.summary()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn tap_stats(&self) -> BTreeMap<String, u64> {
        self.ns.stats(&self.tap.name).expect("TAP counters")
    }

    /// The TAP's ifindex: the same number before and after proves it is the same device.
    fn tap_ifindex(&self) -> u64 {
        let out = self
            .ns
            .exec(&["cat", &format!("/sys/class/net/{}/ifindex", self.tap.name)])
            .expect("TAP ifindex");
        out.trim().parse().expect("ifindex")
    }

    /// A guest on this host's backend running `script`.
    fn guest_config(&self, script: &str) -> GuestConfig {
        GuestConfig::vhost_user(&self.socket, script)
    }

    /// A guest on QEMU's own TAP backend (vhost off), on this host's TAP.
    fn qemu_tap_guest_config(&self, script: &str) -> GuestConfig {
        GuestConfig::tap(self.ns.name(), &self.tap.name, script)
    }

    /// Boots a guest and runs it to the end; panics with the guest's and the backend's logs.
    fn run_guest(&self, image: &GuestImage, config: GuestConfig) -> GuestRun {
        Guest::start(image, config, self.dir.path())
            .and_then(Guest::finish)
            .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", self.backend_log()))
    }

    /// Like `run_guest`, but boots a second time if the first guest never reached its init
    /// (no marker at all on the console within the boot timeout). A 2-vCPU guest under TCG
    /// has stalled that way once in CI (nothing printed, no SET_FEATURES reached the backend)
    /// while the same test passes in 16 s alone; the first attempt is printed in full so a
    /// recurring stall stays visible. Failures after the guest started are never retried.
    fn run_guest_retrying_boot(&self, image: &GuestImage, config: GuestConfig) -> GuestRun {
        let mut guest = self.start_guest(image, config.clone());
        if let Err(e) = guest.wait_ready() {
            if e.contains("@@VN:") {
                panic!("{e}\nbackend:\n{}", self.backend_log());
            }
            report(&format!(
                "the guest never reached init; booting again. First attempt:\n{e}\nbackend:\n{}",
                self.backend_log()
            ));
            drop(guest);
            guest = self.start_guest(image, config);
        }
        guest
            .finish()
            .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", self.backend_log()))
    }

    fn start_guest(&self, image: &GuestImage, config: GuestConfig) -> Guest {
        Guest::start(image, config, self.dir.path()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the traffic script in a guest (iperf3 `iperf_secs` each way on `iperf_port`,
    /// sockperf `sockperf_secs`) and checks what every traffic run must show: the backend
    /// still runs, the traffic passed, and guest, backend and TAP counters agree. Returns the
    /// backend's counters over the run.
    fn traffic_round(
        &mut self,
        image: &GuestImage,
        iperf_secs: u32,
        iperf_port: u16,
        sockperf_secs: u32,
    ) -> Stats {
        let (stats0, tap0) = (self.stats(), self.tap_stats());
        let config = traffic_env(
            self.guest_config(TRAFFIC),
            iperf_secs,
            iperf_port,
            sockperf_secs,
        );
        let run = self.run_guest(image, config);
        let backend = self.stats().since(&stats0);
        let tap = tap_delta(&self.tap_stats(), &tap0);
        assert!(self.backend().try_wait().is_none(), "the backend exited");
        assert_traffic(&run, &*self);
        check_counters(&run, &backend, &tap);
        backend
    }
}

/// The traffic script's variables: iperf3 seconds per direction and server port, sockperf
/// seconds.
fn traffic_env(
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
fn assert_traffic(run: &GuestRun, host: &Host) {
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
    assert_eq!(
        run.result("ping_loss"),
        Some("0"),
        "ping lost packets:\n{}",
        run.script_output.join("\n")
    );
    for key in [
        "iperf_guest_tx_mbps",
        "iperf_guest_rx_mbps",
        "sockperf_avg_us",
    ] {
        let value: f64 = run
            .result(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {:?}", run.results));
        assert!(value > 0.0, "{key} = {value}");
    }
}

/// Checks that the guest's interface counters, the backend's queue counters and the TAP's
/// counters agree over one guest's life (`backend` and `tap` are the deltas over it, read after
/// QEMU exited).
///
/// Guest transmit: every frame the guest's virtio_net sent is one chain on a tx queue, and the
/// backend writes each to the TAP (the TAP's rx). Guest receive: every frame the backend read
/// from the TAP (the TAP's tx) went into the guest's rx buffers, or was dropped or filtered by
/// the backend and counted so.
fn check_counters(run: &GuestRun, backend: &Stats, tap: &BTreeMap<String, u64>) {
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
fn check_notifications_suppressed(backend: &Stats) {
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
