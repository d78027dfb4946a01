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
//!
//! The parts: how to boot the guest and the QEMU command for it ([`GuestConfig`], in `config`),
//! QEMU's human monitor ([`Monitor`], in `monitor`), and the markers and what a run printed
//! ([`GuestRun`], in `output`); [`Guest`], here, is QEMU running.

use super::cpio::CpioWriter;
use super::image::read;
pub use super::image::{GuestImage, GUEST_REQUIREMENTS};
use super::process::{Proc, WaitError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod config;
mod monitor;
mod output;

pub use config::{GuestConfig, Netdev, MIGRATION_PAD};
pub use monitor::Monitor;
pub use output::{marker, GuestRun};

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
