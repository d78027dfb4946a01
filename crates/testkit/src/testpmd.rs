//! DPDK's `dpdk-testpmd` with the vhost PMD (`net_vhost0`) as a vhost-user backend: it
//! listens on a socket that QEMU connects to, and reports its port counters. Or with the
//! virtio-user PMD as the driver side, on our backend.
//!
//! testpmd runs interactively (`-i`) so that the test decides when counters are read:
//! `start` after launch, `show port stats 0` on demand, `quit` at the end. Without hugepages
//! (`--no-huge -m 1024`) it needs no setup. Its forwarding lcore busy-polls a whole CPU, so keep
//! runs short.

use super::packages::Requirement;
use super::process::{wait_for_path, Proc, WaitError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const TESTPMD_REQUIREMENTS: &[Requirement] = &[
    Requirement::command("dpdk-testpmd", "dpdk-dev"),
    // stdbuf: testpmd's stdout is a pipe here, and block-buffered output would hide the stats.
    Requirement::command("stdbuf", "coreutils"),
];

/// A running testpmd, killed on drop, its /var/run/dpdk/PREFIX removed.
#[derive(Debug)]
pub struct Testpmd {
    proc: Proc,
    prefix: String,
}

/// Port counters from `show port stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

impl Testpmd {
    /// Starts testpmd with a vhost-user port of `queues` queue pairs listening on `socket`,
    /// forwarding with `mode` (`io`, `mac`, `icmpecho`, `rxonly`, `txonly`, ...), and waits
    /// for the socket.
    ///
    /// `icmpecho` answers ARP requests and ICMP echo requests, so a guest can ping through it.
    /// Both lcores are pinned to the last CPU, leaving the first to QEMU.
    pub fn start_vhost(
        socket: &Path,
        queues: u16,
        mode: &str,
        log: Option<&Path>,
    ) -> Result<Testpmd, String> {
        let prefix = super::unique_name("testpmd");
        let cpu = std::thread::available_parallelism().map_or(1, |n| n.get()) - 1;
        let vdev = format!("net_vhost0,iface={},queues={queues}", socket.display());
        let mut cmd = command(&prefix, &format!("0@{cpu},1@{cpu}"), &vdev, mode);
        cmd.args([format!("--rxq={queues}"), format!("--txq={queues}")]);
        let _ = std::fs::remove_file(socket);
        let mut proc = Proc::spawn("dpdk-testpmd", cmd, log, true).map_err(|e| e.to_string())?;
        if let Err(e) = wait_for_path(&mut proc, socket, Duration::from_secs(30)) {
            proc.kill();
            remove_runtime_dir(&prefix);
            return Err(e);
        }
        let mut testpmd = Testpmd { proc, prefix };
        testpmd.command("start")?;
        Ok(testpmd)
    }

    /// Starts testpmd with DPDK's virtio-user PMD (`net_virtio_user0`, the driver side) on the
    /// vhost-user backend listening on `socket`, forwarding with `mode` and `size`-byte frames
    /// for `txonly`; its lcores on `lcores` (testpmd's `--lcores`). Forwarding starts after the
    /// port is up. virtio-user asks for VIRTIO_F_IN_ORDER when the backend offers it.
    pub fn start_virtio_user(
        socket: &Path,
        mode: &str,
        size: usize,
        lcores: &str,
    ) -> Result<Testpmd, String> {
        Testpmd::start_virtio_user_with(socket, "", mode, size, lcores)
    }

    /// As [`Testpmd::start_virtio_user`], with more arguments for the virtio-user device
    /// (`extra`, e.g. ",mac=52:54:00:00:00:01": its port's MAC, which txonly sends from).
    pub fn start_virtio_user_with(
        socket: &Path,
        extra: &str,
        mode: &str,
        size: usize,
        lcores: &str,
    ) -> Result<Testpmd, String> {
        let prefix = super::unique_name("vuser");
        let vdev = format!("net_virtio_user0,path={},queues=1{extra}", socket.display());
        let mut cmd = command(&prefix, lcores, &vdev, mode);
        cmd.arg(format!("--txpkts={size}"));
        let proc =
            Proc::spawn("testpmd-virtio-user", cmd, None, true).map_err(|e| e.to_string())?;
        let mut testpmd = Testpmd { proc, prefix };
        let deadline = Instant::now() + Duration::from_secs(30);
        if let Err(e) = testpmd.proc.out.wait_for(0, deadline, |l| {
            l.contains("testpmd>") || l.contains("Done")
        }) {
            return Err(format!(
                "virtio-user port not up ({e:?}):\n{}",
                testpmd.proc.out.tail(30)
            ));
        }
        testpmd.command("start")?;
        Ok(testpmd)
    }

    /// Sends one interactive command.
    pub fn command(&mut self, line: &str) -> Result<(), String> {
        self.proc
            .send_line(line)
            .map_err(|e| format!("testpmd {line:?}: {e}\n{}", self.proc.out.tail(30)))
    }

    /// Port 0's counters, as `show port stats 0` prints them now.
    pub fn port_stats(&mut self) -> Result<PortStats, String> {
        let from = self.proc.out.len();
        self.command("show port stats 0")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let header = self
            .proc
            .out
            .wait_for(from, deadline, |l| l.contains("NIC statistics for port 0"));
        let found = header.and_then(|(at, _)| {
            // The block ends with its "TX-packets" line (the throughput lines follow).
            self.proc
                .out
                .wait_for(at, deadline, |l| l.contains("TX-packets:"))
        });
        match found {
            Ok((end, _)) => Ok(parse_port_stats(
                &self.proc.out.lines_from(from)[..=end - from],
            )),
            Err(WaitError::Timeout) => Err(format!(
                "no port stats from testpmd:\n{}",
                self.proc.out.tail(30)
            )),
            Err(WaitError::Closed) => Err(format!("testpmd exited:\n{}", self.proc.out.tail(30))),
        }
    }

    /// Quits testpmd (bounded; killed if it hangs) and returns its whole output.
    pub fn quit(mut self) -> Vec<String> {
        let _ = self.command("quit");
        self.proc.close_stdin();
        if self
            .proc
            .wait_exit(Instant::now() + Duration::from_secs(15))
            .is_none()
        {
            self.proc.kill();
        }
        self.proc.out.lines()
    }

    pub fn output_tail(&self, lines: usize) -> String {
        self.proc.out.tail(lines)
    }

    pub fn runtime_dir(&self) -> PathBuf {
        Path::new("/var/run/dpdk").join(&self.prefix)
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.proc.kill();
        remove_runtime_dir(&self.prefix);
    }
}

/// Whether testpmd can run here (root, dpdk-dev installed or installable); prints why `test`
/// is skipped when not.
pub fn ready(test: &str) -> bool {
    if !super::packages::is_root() {
        super::packages::skip(
            test,
            "not root: cannot install dpdk-dev or use /var/run/dpdk",
        );
        return false;
    }
    if let Err(why) = super::packages::ensure(TESTPMD_REQUIREMENTS) {
        super::packages::skip(test, &why);
        return false;
    }
    true
}

/// An interactive testpmd without hugepages or PCI, line-buffered, with one `vdev`.
fn command(prefix: &str, lcores: &str, vdev: &str, mode: &str) -> Command {
    super::reap_stale();
    let mut cmd = Command::new("stdbuf");
    cmd.args(["-oL", "-eL", "dpdk-testpmd", "--lcores", lcores]);
    cmd.args([
        "--no-huge",
        "-m",
        "1024",
        "--no-pci",
        "--file-prefix",
        prefix,
    ]);
    cmd.args([
        "--vdev",
        vdev,
        "--",
        "-i",
        &format!("--forward-mode={mode}"),
    ]);
    cmd
}

/// DPDK leaves /var/run/dpdk/PREFIX (its config and fbarray files) behind.
fn remove_runtime_dir(prefix: &str) {
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(prefix));
}

/// Reads the counters from lines such as
/// `  RX-packets: 14         RX-missed: 0          RX-bytes:  1048`.
pub fn parse_port_stats(lines: &[String]) -> PortStats {
    let mut stats = PortStats::default();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            let Ok(value) = pair[1].parse::<u64>() else {
                continue;
            };
            match pair[0] {
                "RX-packets:" => stats.rx_packets = value,
                "RX-bytes:" => stats.rx_bytes = value,
                "RX-missed:" => stats.rx_missed = value,
                "RX-errors:" => stats.rx_errors = value,
                "TX-packets:" => stats.tx_packets = value,
                "TX-bytes:" => stats.tx_bytes = value,
                "TX-errors:" => stats.tx_errors = value,
                _ => {}
            }
        }
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_show_port_stats() {
        let lines: Vec<String> = [
            "  ######################## NIC statistics for port 0  ########################",
            "  RX-packets: 14         RX-missed: 0          RX-bytes:  1048",
            "  RX-errors: 0",
            "  RX-nombuf:  0         ",
            "  TX-packets: 7          TX-errors: 0          TX-bytes:  462",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let stats = parse_port_stats(&lines);
        assert_eq!(stats.rx_packets, 14);
        assert_eq!(stats.rx_bytes, 1048);
        assert_eq!(stats.tx_packets, 7);
        assert_eq!(stats.tx_bytes, 462);
    }
}
