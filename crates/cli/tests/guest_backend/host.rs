//! The host side of a test: a network namespace with a TAP, the iperf3 and sockperf servers in
//! it, and `virtnet backend` running inside it, driven through `virtnet ctl`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::guest::{Guest, GuestConfig, GuestImage, GuestRun};
use testkit::netns::{NetNs, TapSpec};
use testkit::process::{run_checked, wait_for_path, Proc};
use testkit::{report, ScratchDir};

use crate::stats::{tap_delta, Stats};
use crate::traffic::{assert_traffic, check_counters, traffic_env, TRAFFIC};

const BIN: &str = env!("CARGO_BIN_EXE_virtnet");

/// Ports of the host-side servers in the namespace.
pub const IPERF_PORT: u16 = 5201;
/// A second iperf3 server, for a guest whose predecessor left the first one in a dead test.
pub const IPERF_PORT_2: u16 = 5202;
const SOCKPERF_PORT: u16 = 11111;

/// The host side of a test: a network namespace with a TAP, optionally `virtnet backend`
/// inside it, and the iperf3 and sockperf servers. Fields drop in order: processes first,
/// then the namespace, then the scratch directory.
pub struct Host {
    backend: Option<Proc>,
    servers: Vec<Proc>,
    ns: NetNs,
    tap: TapSpec,
    pub socket: PathBuf,
    ctl: PathBuf,
    backend_args: Vec<String>,
    backend_starts: u32,
    /// Run the backend as this uid and gid, with no capabilities (`setpriv`).
    run_as: Option<u32>,
    dir: ScratchDir,
}

impl Host {
    /// The namespace with `tap` and the servers; no backend yet.
    pub fn new(tag: &str, tap: TapSpec) -> Host {
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
            run_as: tap.owner,
            ns,
            tap,
            dir,
        };
        host.start_servers();
        host
    }

    /// The namespace with the backend's TAP, the servers, and `virtnet backend` with
    /// `backend_args` on top of --socket-path, --tap and --ctl.
    pub fn with_backend(tag: &str, backend_args: &[&str]) -> Host {
        let mut host = Host::new(tag, TapSpec::for_backend());
        host.backend_args = backend_args.iter().map(|s| s.to_string()).collect();
        host.start_backend();
        host
    }

    /// As [`Host::with_backend`], the backend run as `uid` with no capability at all, on a
    /// TAP that `uid` owns (README, "Without root").
    pub fn with_unprivileged_backend(tag: &str, uid: u32) -> Host {
        let tap = TapSpec {
            owner: Some(uid),
            ..TapSpec::for_backend()
        };
        let mut host = Host::new(tag, tap);
        // The backend creates its sockets here.
        let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o1777);
        std::fs::set_permissions(host.dir.path(), mode).expect("chmod the scratch dir");
        host.start_backend();
        host
    }

    fn host_ip(&self) -> &str {
        self.tap.address.split('/').next().unwrap()
    }

    /// Whether the backend is in client mode (`--client`): QEMU owns the vhost-user socket.
    fn client_mode(&self) -> bool {
        self.backend_args.iter().any(|a| a == "--client")
    }

    /// Starts `virtnet backend` inside the namespace (so it opens the TAP there) and waits for
    /// its sockets (in client mode, only its control socket: the other is QEMU's).
    pub fn start_backend(&mut self) {
        assert!(self.backend.is_none(), "one backend at a time");
        // A killed predecessor leaves its socket files: wait for the new ones.
        let _ = std::fs::remove_file(&self.ctl);
        if !self.client_mode() {
            let _ = std::fs::remove_file(&self.socket);
        }
        let uid = self.run_as.map(|u| u.to_string());
        // The build directory may be closed to other users (a checkout under /root): another
        // user runs a copy from the scratch directory.
        let copy = self.dir.join("virtnet");
        let mut bin = BIN;
        let mut argv: Vec<&str> = Vec::new();
        if let Some(u) = &uid {
            if !copy.exists() {
                std::fs::copy(BIN, &copy).expect("a copy of the binary");
            }
            bin = copy.to_str().unwrap();
            argv.extend(["setpriv", "--reuid", u, "--regid", u, "--clear-groups"]);
            argv.extend(["--inh-caps", "-all", "--bounding-set", "-all"]);
        }
        argv.extend([
            bin,
            "backend",
            "--socket-path",
            self.socket.to_str().unwrap(),
            "--tap",
            &self.tap.name,
            "--ctl",
            self.ctl.to_str().unwrap(),
        ]);
        argv.extend(self.backend_args.iter().map(String::as_str));
        let log = self
            .dir
            .join(&format!("backend-{}.log", self.backend_starts));
        self.backend_starts += 1;
        let mut backend = self.ns.spawn(&argv, Some(&log)).expect("virtnet backend");
        wait_for_path(&mut backend, &self.ctl, Duration::from_secs(10)).expect("backend ctl");
        if !self.client_mode() {
            wait_for_path(&mut backend, &self.socket, Duration::from_secs(10))
                .expect("backend socket");
        }
        self.backend = Some(backend);
    }

    /// Another `virtnet backend` in the namespace, on the same (multi-queue) TAP, with its
    /// own sockets `NAME.sock` and `NAME-ctl.sock` and log `NAME.log`: a live migration's
    /// destination. Returns the process and its vhost-user socket.
    pub fn spawn_backend(&self, name: &str) -> (Proc, PathBuf) {
        let socket = self.dir.join(&format!("{name}.sock"));
        let ctl = self.dir.join(&format!("{name}-ctl.sock"));
        let _ = std::fs::remove_file(&socket);
        let _ = std::fs::remove_file(&ctl);
        let mut argv: Vec<&str> = vec![
            BIN,
            "backend",
            "--socket-path",
            socket.to_str().unwrap(),
            "--tap",
            &self.tap.name,
            "--ctl",
            ctl.to_str().unwrap(),
        ];
        argv.extend(self.backend_args.iter().map(String::as_str));
        let log = self.dir.join(&format!("{name}.log"));
        let mut backend = self.ns.spawn(&argv, Some(&log)).expect("virtnet backend");
        wait_for_path(&mut backend, &ctl, Duration::from_secs(10)).expect("backend ctl");
        wait_for_path(&mut backend, &socket, Duration::from_secs(10)).expect("backend socket");
        (backend, socket)
    }

    /// The scratch directory of this test (sockets, logs).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Kills the backend process (SIGKILL: no chance to clean up).
    pub fn kill_backend(&mut self) {
        let mut backend = self.backend.take().expect("a running backend");
        backend.kill();
    }

    pub fn backend(&mut self) -> &mut Proc {
        self.backend.as_mut().expect("a running backend")
    }

    /// The backend's log so far, for failure messages.
    pub fn backend_log(&self) -> String {
        self.backend
            .as_ref()
            .map(|b| b.out.tail(40))
            .unwrap_or_else(|| "(no backend)".to_string())
    }

    /// Waits for a line of the backend's log containing `text`, at line `from` or later.
    pub fn wait_backend_log(&self, from: usize, text: &str, limit: Duration) {
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
    pub fn ctl(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(BIN);
        cmd.arg("ctl").arg("--socket").arg(&self.ctl).args(args);
        run_checked("virtnet ctl", cmd, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", self.backend_log()))
    }

    pub fn stats(&self) -> Stats {
        Stats::parse(&self.ctl(&["stats"]))
    }

    /// Waits until the backend's tx queues have moved `packets` frames past `before`: the
    /// guest's traffic is flowing.
    pub fn wait_tx_traffic(&self, before: &Stats, packets: u64, limit: Duration) -> Stats {
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

    pub fn tap_stats(&self) -> BTreeMap<String, u64> {
        self.ns.stats(&self.tap.name).expect("TAP counters")
    }

    /// The TAP interface's MTU.
    pub fn tap_mtu(&self) -> u32 {
        let out = self
            .ns
            .exec(&["cat", &format!("/sys/class/net/{}/mtu", self.tap.name)])
            .expect("TAP MTU");
        out.trim().parse().expect("MTU")
    }

    /// The TAP's ifindex: the same number before and after proves it is the same device.
    pub fn tap_ifindex(&self) -> u64 {
        let out = self
            .ns
            .exec(&["cat", &format!("/sys/class/net/{}/ifindex", self.tap.name)])
            .expect("TAP ifindex");
        out.trim().parse().expect("ifindex")
    }

    /// A guest on this host's backend running `script`.
    pub fn guest_config(&self, script: &str) -> GuestConfig {
        GuestConfig::vhost_user(&self.socket, script)
    }

    /// A guest on QEMU's own TAP backend (vhost off), on this host's TAP.
    pub fn qemu_tap_guest_config(&self, script: &str) -> GuestConfig {
        GuestConfig::tap(self.ns.name(), &self.tap.name, script)
    }

    /// Boots a guest and runs it to the end; panics with the guest's and the backend's logs.
    pub fn run_guest(&self, image: &GuestImage, config: GuestConfig) -> GuestRun {
        Guest::start(image, config, self.dir.path())
            .and_then(Guest::finish)
            .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", self.backend_log()))
    }

    /// Like `run_guest`, but boots a second time if the first guest never reached its init
    /// (no marker at all on the console within the boot timeout). A 2-vCPU guest under TCG
    /// has stalled that way once in CI (nothing printed, no SET_FEATURES reached the backend)
    /// while the same test passes in 16 s alone; the first attempt is printed in full so a
    /// recurring stall stays visible. Failures after the guest started are never retried.
    pub fn run_guest_retrying_boot(&self, image: &GuestImage, config: GuestConfig) -> GuestRun {
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

    pub fn start_guest(&self, image: &GuestImage, config: GuestConfig) -> Guest {
        Guest::start(image, config, self.dir.path()).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Runs the traffic script in a guest (iperf3 `iperf_secs` each way on `iperf_port`,
    /// sockperf `sockperf_secs`) and checks what every traffic run must show: the backend
    /// still runs, the traffic passed, and guest, backend and TAP counters agree. Returns the
    /// backend's counters over the run.
    pub fn traffic_round(
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
