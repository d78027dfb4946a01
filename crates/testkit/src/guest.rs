//! A Linux guest for tests: QEMU (TCG) boots the host's Debian kernel with a busybox initramfs
//! and one virtio-net-pci device, runs a shell script in the guest and reports what it printed.
//!
//! ```ignore
//! let image = GuestImage::get()?;               // built once, cached under the target dir
//! let config = GuestConfig::vhost_user(&socket, "ping -c 3 $VN_PEER");
//! let run = Guest::start(image, config, dir.path())?.finish()?;
//! assert_eq!(run.script_rc, 0, "{}", run.script_output.join("\n"));
//! let tx = run.stat("tx_packets");
//! ```
//!
//! The guest's /init (guest_init.sh) prints markers `@@VN:KIND payload@@` on the serial console:
//! INIT, READY (driver bound, link up), BEGIN, the script's output, END rc=N, RESULT k=v
//! (`vn_result`), MARK (`vn_mark`), STAT (every interface counter), DMESG-BEGIN/END, DONE,
//! and FAIL when the guest could not get ready. Recipe and pitfalls: docs/GUEST.md.

use super::cpio::CpioWriter;
use super::image::read;
pub use super::image::{GuestImage, GUEST_REQUIREMENTS};
use super::process::{Proc, WaitError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How the guest's virtio-net-pci device reaches the host.
#[derive(Debug, Clone)]
pub enum Netdev {
    /// A vhost-user backend listening on `socket` (QEMU connects as the client).
    VhostUser {
        socket: PathBuf,
        /// Queue pairs; above 1 the device gets `mq=on`, and the guest needs `cpus` >= pairs
        /// for Linux to use them all.
        queues: u16,
        /// `reconnect=N` on the chardev: QEMU retries a lost backend every N seconds.
        reconnect_secs: Option<u32>,
        /// `server=on` on the chardev: QEMU listens on `socket` and the backend connects
        /// (`virtnet backend --client`). QEMU waits for the first connection before it boots
        /// the guest, and for the next one after the backend goes. Not with `reconnect_secs`.
        server: bool,
    },
    /// QEMU's own TAP backend (vhost off) on an existing TAP in network namespace `netns`
    /// (QEMU runs inside the namespace). A reference point for the vhost-user backends.
    Tap { netns: String, ifname: String },
}

/// How to boot the guest and what to run in it.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    pub netdev: Netdev,
    /// Shell script run by busybox `sh -e` after the link is up; helpers in guest_lib.sh.
    pub script: String,
    /// The guest's address with prefix length, set on its interface.
    pub ip: String,
    /// More `vn_KEY=VALUE` kernel parameters, seen by the script as `$VN_KEY` (no spaces).
    pub env: Vec<(String, String)>,
    pub mac: Option<String>,
    /// The guest interface's MTU, set by /init (`ip link set DEV mtu N`).
    pub mtu: Option<u32>,
    /// `host_mtu=N` on the device: QEMU offers VIRTIO_NET_F_MTU with N in the config space
    /// (Linux then gives the interface that MTU) and sends a vhost-user backend NET_SET_MTU.
    pub host_mtu: Option<u16>,
    pub memory_mb: u32,
    pub cpus: u32,
    /// From QEMU's start until the guest reports READY.
    pub boot_timeout: Duration,
    /// For the script alone (enforced in the guest too, so the stats still come out).
    pub script_timeout: Duration,
    /// Print the guest's kernel log after the script even if it succeeded.
    pub dmesg: bool,
    /// Appended to the kernel command line.
    pub extra_append: String,
    /// Memory hotplug: DIMM slots and the most memory (MiB) they may bring the guest to
    /// (`-m SIZE,slots=N,maxmem=M`).
    pub hotplug: Option<(u32, u32)>,
    /// A human monitor on this unix socket (QEMU listens), for [`Monitor`]; else none.
    pub monitor: Option<PathBuf>,
    /// `-incoming URI`: this QEMU is a live migration's destination; it runs the guest only
    /// once the migration completes (nothing is booted, and no READY comes).
    pub incoming: Option<String>,
    /// `-S`: the guest does not run until the monitor's `cont` (with `incoming`: it stays
    /// paused after the migration, so that its memory can be compared with the source's).
    pub paused: bool,
    /// The guest will live-migrate: its memory is [`MIGRATION_PAD`] more than `memory_mb`, on
    /// the source and the destination alike.
    pub migratable: bool,
}

/// What a guest that migrates gets on top of its `memory_mb`, so that its memory is not a
/// multiple of 256 KiB. QEMU before 9.0 (7.2 here) syncs the migration dirty bitmap of such
/// a RAM block page by page, resetting TCG's TLB for each page it cleared; its fast path for
/// blocks of 64-page words clears the bits without resetting the TLB, so the guest CPU's
/// later stores through that TLB are not logged and never sent (fixed by QEMU commit
/// 03bfc2188f, "physmem: Fix migration dirty bitmap coherency with TCG memory access"). In
/// the migration test this lost a busy guest's writes in 2 of 5 runs (34-37 pages, the
/// shell's loop counter among them, and once the guest's kernel with them); padded, 0 of 7.
pub const MIGRATION_PAD: u64 = 8 << 10;

impl GuestConfig {
    /// The guest's memory in bytes (what QEMU gets as `-m`).
    pub fn memory_bytes(&self) -> u64 {
        let pad = if self.migratable { MIGRATION_PAD } else { 0 };
        (u64::from(self.memory_mb) << 20) + pad
    }

    /// A guest at 10.99.0.2/24 on a vhost-user backend at `socket`, one queue pair; the script
    /// sees `$VN_PEER` = 10.99.0.1.
    pub fn vhost_user(socket: &Path, script: &str) -> GuestConfig {
        GuestConfig::new(
            Netdev::VhostUser {
                socket: socket.to_path_buf(),
                queues: 1,
                reconnect_secs: None,
                server: false,
            },
            script,
        )
    }

    /// A guest on QEMU's own TAP backend, on `ifname` in `netns`.
    pub fn tap(netns: &str, ifname: &str, script: &str) -> GuestConfig {
        GuestConfig::new(
            Netdev::Tap {
                netns: netns.to_string(),
                ifname: ifname.to_string(),
            },
            script,
        )
    }

    fn new(netdev: Netdev, script: &str) -> GuestConfig {
        GuestConfig {
            netdev,
            script: script.to_string(),
            ip: "10.99.0.2/24".to_string(),
            env: vec![("vn_peer".to_string(), "10.99.0.1".to_string())],
            mac: None,
            mtu: None,
            host_mtu: None,
            memory_mb: 512,
            cpus: 1,
            boot_timeout: Duration::from_secs(60),
            script_timeout: Duration::from_secs(120),
            dmesg: false,
            extra_append: String::new(),
            hotplug: None,
            monitor: None,
            incoming: None,
            paused: false,
            migratable: false,
        }
    }

    /// The kernel command line.
    pub fn append(&self) -> String {
        let mut args = vec![
            "console=ttyS0".to_string(),
            // A panic (init died) reboots at once, and -no-reboot turns that into QEMU's exit.
            "panic=-1".to_string(),
            "quiet".to_string(),
            // No IPv6 chatter (router solicitations, MLD), so packet counters are exact.
            "ipv6.disable=1".to_string(),
            format!("vn_ip={}", self.ip),
            format!("vn_timeout={}", self.script_timeout.as_secs().max(1)),
        ];
        if let Some(mtu) = self.mtu {
            args.push(format!("vn_mtu={mtu}"));
        }
        if self.dmesg {
            args.push("vn_dmesg=1".to_string());
        }
        for (key, value) in &self.env {
            assert!(
                key.starts_with("vn_"),
                "guest env keys start with vn_: {key}"
            );
            assert!(
                !value.contains(char::is_whitespace),
                "no spaces in {key}={value:?}"
            );
            args.push(format!("{key}={value}"));
        }
        if !self.extra_append.is_empty() {
            args.push(self.extra_append.clone());
        }
        args.join(" ")
    }

    /// The full QEMU command (`ip netns exec NS qemu-system-x86_64 ...` for a TAP netdev).
    pub fn qemu_command(&self, kernel: &Path, initrd: &Path) -> Command {
        let mut cmd = match &self.netdev {
            Netdev::Tap { netns, .. } => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", netns, "qemu-system-x86_64"]);
                c
            }
            Netdev::VhostUser { .. } => Command::new("qemu-system-x86_64"),
        };
        let mem = format!("{}K", self.memory_bytes() >> 10);
        cmd.args(["-name", "virtnet-guest", "-nodefaults", "-no-user-config"]);
        // KVM here is a PVM variant that does not boot a stock kernel: software emulation.
        cmd.args(["-accel", "tcg", "-cpu", "max"]);
        let m = match self.hotplug {
            Some((slots, max)) => format!("{mem},slots={slots},maxmem={max}M"),
            None => mem.clone(),
        };
        cmd.args(["-smp", &self.cpus.to_string(), "-m", &m]);
        // vhost-user maps guest memory in the backend: it must be a shareable fd.
        cmd.args([
            "-object",
            &format!("memory-backend-memfd,id=mem,size={mem},share=on"),
            "-numa",
            "node,memdev=mem",
        ]);
        // vectors=0: QEMU 7.2 under TCG segfaults with MSI-X over vhost-user; romfile= skips
        // the iPXE option ROM.
        let mut device = "virtio-net-pci,netdev=n0,romfile=,vectors=0".to_string();
        match &self.netdev {
            Netdev::VhostUser {
                socket,
                queues,
                reconnect_secs,
                server,
            } => {
                let mut chardev = format!("socket,id=c0,path={}", socket.display());
                assert!(
                    !(*server && reconnect_secs.is_some()),
                    "reconnect is for a client chardev"
                );
                if *server {
                    chardev.push_str(",server=on");
                }
                if let Some(secs) = reconnect_secs {
                    chardev.push_str(&format!(",reconnect={secs}"));
                }
                cmd.args(["-chardev", &chardev]);
                cmd.args([
                    "-netdev",
                    &format!("vhost-user,id=n0,chardev=c0,queues={queues}"),
                ]);
                if *queues > 1 {
                    device.push_str(",mq=on");
                }
            }
            Netdev::Tap { ifname, .. } => {
                cmd.args([
                    "-netdev",
                    &format!("tap,id=n0,ifname={ifname},script=no,downscript=no,vhost=off"),
                ]);
            }
        }
        if let Some(mac) = &self.mac {
            device.push_str(&format!(",mac={mac}"));
        }
        if let Some(mtu) = self.host_mtu {
            device.push_str(&format!(",host_mtu={mtu}"));
        }
        cmd.args(["-device", &device]);
        let monitor = match &self.monitor {
            Some(path) => format!("unix:{},server=on,wait=off", path.display()),
            None => "none".to_string(),
        };
        cmd.args(["-display", "none", "-serial", "stdio", "-monitor", &monitor]);
        if let Some(uri) = &self.incoming {
            cmd.args(["-incoming", uri]);
        }
        if self.paused {
            cmd.arg("-S");
        }
        cmd.arg("-no-reboot");
        cmd.arg("-kernel").arg(kernel);
        cmd.arg("-initrd").arg(initrd);
        cmd.args(["-append", &self.append()]);
        cmd
    }
}

/// A booting or running guest. QEMU is killed when this is dropped.
#[derive(Debug)]
pub struct Guest {
    qemu: Proc,
    config: GuestConfig,
    started: Instant,
    ready: Option<(Instant, String)>,
    serial_log: PathBuf,
}

impl Guest {
    /// Writes this run's initrd (the image plus /test.sh) into `dir` and starts QEMU. The
    /// serial console and QEMU's stderr are also written to `dir`/serial.log.
    pub fn start(image: &GuestImage, config: GuestConfig, dir: &Path) -> Result<Guest, String> {
        let mut initrd = read(&image.initramfs)?;
        let mut script = CpioWriter::new();
        script.file("test.sh", 0o755, config.script.as_bytes());
        // A second archive after the first: the kernel unpacks both into the same rootfs.
        initrd.extend_from_slice(&script.finish());
        let initrd_path = dir.join("initrd.cpio");
        std::fs::write(&initrd_path, &initrd)
            .map_err(|e| format!("{}: {e}", initrd_path.display()))?;

        let cmd = config.qemu_command(&image.boot_kernel, &initrd_path);
        std::fs::write(dir.join("qemu.cmd"), format!("{cmd:?}\n")).ok();
        let serial_log = dir.join("serial.log");
        let qemu = Proc::spawn("qemu", cmd, Some(&serial_log), false).map_err(|e| e.to_string())?;
        Ok(Guest {
            qemu,
            config,
            started: Instant::now(),
            ready: None,
            serial_log,
        })
    }

    /// Waits until the guest's interface is up (READY), up to the boot timeout.
    pub fn wait_ready(&mut self) -> Result<Duration, String> {
        if let Some((at, _)) = &self.ready {
            return Ok(*at - self.started);
        }
        let deadline = self.started + self.config.boot_timeout;
        let (_, line) = self.wait_marker_until(0, deadline, |kind, _| kind == "READY")?;
        let at = Instant::now();
        self.ready = Some((at, line));
        Ok(at - self.started)
    }

    /// Waits for `vn_mark TEXT` from the script, until `timeout` from now.
    pub fn wait_mark(&mut self, text: &str, timeout: Duration) -> Result<(), String> {
        self.wait_marker_until(0, Instant::now() + timeout, |kind, payload| {
            kind == "MARK" && payload == text
        })
        .map(|_| ())
    }

    /// Waits for a marker satisfying `pred(kind, payload)` at line `from` or later. A FAIL
    /// marker, QEMU's exit or the deadline end the wait with an error carrying the log tail.
    fn wait_marker_until(
        &mut self,
        from: usize,
        deadline: Instant,
        mut pred: impl FnMut(&str, &str) -> bool,
    ) -> Result<(usize, String), String> {
        let result = self
            .qemu
            .out
            .wait_for(from, deadline, |line| match marker(line) {
                Some(("FAIL", _)) => true,
                Some((kind, payload)) => pred(kind, payload),
                None => false,
            });
        match result {
            Ok((_, line)) if marker(&line).is_some_and(|(k, _)| k == "FAIL") => {
                // Let the kernel log after FAIL arrive before reporting.
                self.qemu
                    .wait_exit(Instant::now() + Duration::from_secs(10));
                Err(self.failure(&format!("guest failed: {line}")))
            }
            Ok(found) => Ok(found),
            Err(WaitError::Timeout) => Err(self.failure("timed out")),
            Err(WaitError::Closed) => Err(self.failure("QEMU exited")),
        }
    }

    /// Waits for the script to end and QEMU to exit, and parses what the guest printed.
    pub fn finish(mut self) -> Result<GuestRun, String> {
        self.wait_ready()?;
        let deadline = Instant::now() + self.config.script_timeout + Duration::from_secs(20);
        self.wait_marker_until(0, deadline, |kind, _| kind == "DONE")?;
        // poweroff -f follows DONE at once; QEMU exits when the guest powers off.
        let status = self
            .qemu
            .wait_exit(Instant::now() + Duration::from_secs(20));
        if status.is_none() {
            return Err(self.failure("QEMU still running 20 s after the guest's DONE"));
        }
        let wall_total = self.started.elapsed();
        let ready = self.ready.as_ref().map(|(at, _)| *at - self.started);
        let mut run = GuestRun::parse(&self.qemu.out.lines());
        run.wall_ready = ready.unwrap_or_default();
        run.wall_total = wall_total;
        Ok(run)
    }

    /// Kills QEMU now (for tests of a backend losing its frontend).
    pub fn kill(&mut self) {
        self.qemu.kill();
    }

    /// Everything QEMU printed so far (serial console and stderr).
    pub fn serial(&self) -> Vec<String> {
        self.qemu.out.lines()
    }

    fn failure(&self, what: &str) -> String {
        format!(
            "{what} after {:.1?}; log {}; last lines:\n{}",
            self.started.elapsed(),
            self.serial_log.display(),
            self.qemu.out.tail(60)
        )
    }
}

/// QEMU's human monitor on a unix socket ([`GuestConfig::monitor`]): one command at a time,
/// its output up to the next prompt.
#[derive(Debug)]
pub struct Monitor {
    stream: std::os::unix::net::UnixStream,
}

impl Monitor {
    /// Connects to the monitor at `path` (retrying while QEMU starts, up to `wait`) and reads
    /// its banner.
    pub fn connect(path: &Path, wait: Duration) -> Result<Monitor, String> {
        let deadline = Instant::now() + wait;
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("monitor {}: {e}", path.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let mut m = Monitor { stream };
        m.until_prompt()?;
        Ok(m)
    }

    fn until_prompt(&mut self) -> Result<String, String> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.ends_with(b"(qemu) ") {
            let n = self
                .stream
                .read(&mut buf)
                .map_err(|e| format!("monitor: {e}"))?;
            if n == 0 {
                return Err("monitor closed".to_string());
            }
            out.extend_from_slice(&buf[..n]);
        }
        out.truncate(out.len() - b"(qemu) ".len());
        // The monitor echoes the command with terminal escapes; keep the plain text.
        let text = String::from_utf8_lossy(&out)
            .replace('\r', "")
            .chars()
            .filter(|c| !c.is_control() || *c == '\n')
            .collect();
        Ok(text)
    }

    /// Runs `command`; what the monitor printed before its next prompt.
    pub fn command(&mut self, command: &str) -> Result<String, String> {
        use std::io::Write;
        self.stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| format!("monitor: {e}"))?;
        self.until_prompt()
    }

    /// Polls `info migrate` until the migration's status is "completed", up to `limit`; the
    /// last output. A failed or cancelled migration is an error at once.
    pub fn wait_migrated(&mut self, limit: Duration) -> Result<String, String> {
        let done = |s: &str| matches!(s, "completed" | "failed" | "cancelled");
        let every = Duration::from_millis(200);
        let (status, out) = self
            .poll_until("info migrate", "Migration status:", done, every, limit)
            .map_err(|out| format!("migration not done in {limit:?}:\n{out}"))?;
        match status.as_str() {
            "completed" => Ok(out),
            _ => Err(format!("migration {status}:\n{out}")),
        }
    }

    /// On a migration's destination: polls `info status` until the guest is no longer in
    /// "inmigrate", that is until this QEMU has loaded all the source sent, up to `limit`; the
    /// last status. The source reports "completed" once it has sent the last pages, which the
    /// destination may still be reading.
    pub fn wait_incoming(&mut self, limit: Duration) -> Result<String, String> {
        let loaded = |s: &str| !s.is_empty() && !s.contains("inmigrate");
        let every = Duration::from_millis(50);
        self.poll_until("info status", "VM status:", loaded, every, limit)
            .map(|(status, _)| status)
            .map_err(|out| format!("incoming migration not loaded in {limit:?}:\n{out}"))
    }

    /// Runs `command` every `every` until `done` accepts the value of its `label` line, up to
    /// `limit`: (that value, the output). Past `limit`, the last output is the error; a monitor
    /// that fails is one too.
    fn poll_until(
        &mut self,
        command: &str,
        label: &str,
        done: impl Fn(&str) -> bool,
        every: Duration,
        limit: Duration,
    ) -> Result<(String, String), String> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.command(command)?;
            let status = out
                .lines()
                .find_map(|l| l.trim().strip_prefix(label))
                .map(str::trim)
                .unwrap_or("");
            if done(status) {
                return Ok((status.to_string(), out));
            }
            if Instant::now() >= deadline {
                return Err(out);
            }
            std::thread::sleep(every);
        }
    }
}

/// Splits `...@@VN:KIND payload@@...` into (KIND, payload).
pub fn marker(line: &str) -> Option<(&str, &str)> {
    let start = line.find("@@VN:")? + 5;
    let rest = &line[start..];
    let body = &rest[..rest.find("@@")?];
    Some(body.split_once(' ').unwrap_or((body, "")))
}

/// What a guest run printed, parsed.
#[derive(Debug, Clone, Default)]
pub struct GuestRun {
    /// Every line of the serial console and QEMU's stderr.
    pub serial: Vec<String>,
    /// The script's output (stdout and stderr), without marker lines.
    pub script_output: Vec<String>,
    /// The script's exit code (137 if the guest-side timeout killed it); -1 if never reported.
    pub script_rc: i32,
    /// `vn_result KEY VALUE` pairs.
    pub results: BTreeMap<String, String>,
    /// Interface → counter name → value, read after the script (sysfs statistics).
    pub stats: BTreeMap<String, BTreeMap<String, u64>>,
    /// The READY marker's fields: if, mac, driver, uptime.
    pub ready: BTreeMap<String, String>,
    /// Guest uptime (seconds) at /init's start, at READY and at DONE.
    pub uptime_init: f64,
    pub uptime_ready: f64,
    pub uptime_done: f64,
    /// Host wall time from QEMU's start to READY, and to QEMU's exit.
    pub wall_ready: Duration,
    pub wall_total: Duration,
    /// The guest kernel log, when printed.
    pub dmesg: Vec<String>,
}

impl GuestRun {
    pub fn parse(lines: &[String]) -> GuestRun {
        let mut run = GuestRun {
            serial: lines.to_vec(),
            script_rc: -1,
            ..GuestRun::default()
        };
        let mut in_script = false;
        let mut in_dmesg = false;
        let uptime = |fields: &BTreeMap<String, String>| {
            fields
                .get("uptime")
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        for line in lines {
            let Some((kind, payload)) = marker(line) else {
                if in_script {
                    run.script_output.push(line.clone());
                } else if in_dmesg {
                    run.dmesg.push(line.clone());
                }
                continue;
            };
            let fields = key_values(payload);
            match kind {
                "INIT" => run.uptime_init = uptime(&fields),
                "READY" => {
                    run.uptime_ready = uptime(&fields);
                    run.ready = fields;
                }
                "BEGIN" => in_script = true,
                "END" => {
                    in_script = false;
                    run.script_rc = fields.get("rc").and_then(|v| v.parse().ok()).unwrap_or(-1);
                }
                "RESULT" => {
                    if let Some((k, v)) = payload.split_once('=') {
                        run.results.insert(k.to_string(), v.to_string());
                    }
                }
                "STAT" => {
                    let (iface, counters) = payload.split_once(' ').unwrap_or((payload, ""));
                    let counters = key_values(counters)
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
                        .collect();
                    run.stats.insert(iface.to_string(), counters);
                }
                "DMESG-BEGIN" => in_dmesg = true,
                "DMESG-END" => in_dmesg = false,
                "DONE" => run.uptime_done = uptime(&fields),
                _ => {}
            }
        }
        run
    }

    /// A counter of the guest's interface (the first non-loopback one), e.g. "rx_packets".
    pub fn stat(&self, counter: &str) -> u64 {
        let iface = self.ready.get("if").map(String::as_str).unwrap_or("eth0");
        self.stats
            .get(iface)
            .and_then(|c| c.get(counter))
            .copied()
            .unwrap_or_else(|| panic!("no counter {counter} for {iface} in {:?}", self.stats))
    }

    pub fn result(&self, key: &str) -> Option<&str> {
        self.results.get(key).map(String::as_str)
    }

    /// Panics with the script's output (and the kernel log) unless the script exited 0.
    pub fn assert_script_ok(&self) {
        assert_eq!(
            self.script_rc,
            0,
            "guest script failed; output:\n{}\nkernel log:\n{}",
            self.script_output.join("\n"),
            self.dmesg.join("\n")
        );
    }

    /// Panics unless the traffic script's ping lost nothing and iperf3 (both ways) and
    /// sockperf each reported a rate above zero.
    pub fn assert_traffic_ran(&self) {
        assert_eq!(
            self.result("ping_loss"),
            Some("0"),
            "ping lost packets:\n{}",
            self.script_output.join("\n")
        );
        for key in [
            "iperf_guest_tx_mbps",
            "iperf_guest_rx_mbps",
            "sockperf_avg_us",
        ] {
            let value: f64 = self
                .result(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {:?}", self.results));
            assert!(value > 0.0, "{key} = {value}");
        }
    }

    /// One line for the test log: boot and run times.
    pub fn timing(&self) -> String {
        format!(
            "guest uptime: init {:.2} s, ready {:.2} s, done {:.2} s; wall: ready {:.1?}, total {:.1?}",
            self.uptime_init, self.uptime_ready, self.uptime_done, self.wall_ready, self.wall_total
        )
    }
}

fn key_values(payload: &str) -> BTreeMap<String, String> {
    payload
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers_amid_kernel_noise() {
        let lines: Vec<String> = [
            "SeaBIOS",
            "@@VN:INIT uptime=1.50@@",
            "@@VN:READY uptime=3.25 if=eth0 mac=52:54:00:12:34:56 driver=virtio_net@@",
            "@@VN:BEGIN@@",
            "PING 10.99.0.1",
            "[    4.1] some kernel line @@VN:RESULT loss=0%@@",
            "@@VN:END rc=0@@",
            "@@VN:STAT eth0 rx_packets=7 tx_packets=14@@",
            "@@VN:DONE uptime=9.00@@",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let run = GuestRun::parse(&lines);
        assert_eq!(run.script_rc, 0);
        assert_eq!(run.script_output, vec!["PING 10.99.0.1".to_string()]);
        assert_eq!(run.result("loss"), Some("0%"));
        assert_eq!(run.stat("tx_packets"), 14);
        assert_eq!(run.stat("rx_packets"), 7);
        assert_eq!(run.ready["driver"], "virtio_net");
        assert!((run.uptime_ready - 3.25).abs() < 1e-9);
    }
}
