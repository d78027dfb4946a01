//! A network namespace of the test's own, with a TAP device and an address, deleted on drop.
//!
//! The TAP lives inside the namespace, so whatever attaches to it (our backend, QEMU's TAP
//! backend, iperf3's server) runs inside it too: `ns.command("virtnet")` is
//! `ip netns exec NAME virtnet`. A unix socket path is not namespaced, so a backend inside the
//! namespace still serves a QEMU outside it.

use super::process::{run_checked, Proc};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const IP_TIMEOUT: Duration = Duration::from_secs(20);

/// A network namespace, deleted (with its devices) on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

/// A TAP device to create in a namespace.
#[derive(Debug, Clone)]
pub struct TapSpec {
    pub name: String,
    /// Host-side address with prefix length, e.g. "10.99.0.1/24".
    pub address: String,
    /// IFF_MULTI_QUEUE. A persistent TAP only attaches with the same flags it was created with:
    /// on for `virtnet backend` (IFF_MULTI_QUEUE | IFF_VNET_HDR), off for QEMU's TAP backend
    /// with one queue.
    pub multi_queue: bool,
    /// IFF_VNET_HDR.
    pub vnet_hdr: bool,
    pub mtu: Option<u32>,
    /// The uid and gid that own the TAP (`ip tuntap ... user U group G`): that user may
    /// attach to it without CAP_NET_ADMIN.
    pub owner: Option<u32>,
}

impl TapSpec {
    /// "vntap0" at 10.99.0.1/24 (the guest's default peer), multi-queue with vnet headers, as
    /// `virtnet backend --tap` opens it.
    pub fn for_backend() -> TapSpec {
        TapSpec {
            name: "vntap0".to_string(),
            address: "10.99.0.1/24".to_string(),
            multi_queue: true,
            vnet_hdr: true,
            mtu: None,
            owner: None,
        }
    }

    /// As [`TapSpec::for_backend`] but single-queue, as QEMU's `-netdev tap` opens it.
    pub fn for_qemu() -> TapSpec {
        TapSpec {
            multi_queue: false,
            ..TapSpec::for_backend()
        }
    }
}

impl NetNs {
    /// Creates `vnt-<tag>-<pid>-<n>` with loopback up and IPv6 off (so counters see only the
    /// test's packets).
    pub fn create(tag: &str) -> Result<NetNs, String> {
        super::reap_stale();
        let name = super::unique_name(tag);
        ip(&["netns", "add", &name])?;
        let ns = NetNs { name };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])?;
        ns.exec(&["sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Moves the calling thread (only it) into the namespace, so that what it opens there (a
    /// TAP by name, as an in-process backend does) is the namespace's. Threads it starts from
    /// then on are in the namespace too.
    #[allow(unsafe_code)]
    pub fn enter_this_thread(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let path = format!("/run/netns/{}", self.name);
        let ns = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: setns takes a descriptor and a flag and touches no memory of ours.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Runs `f` on a thread of its own inside the namespace and returns what it returns:
    /// what `f` opens (sockets, a TAP by name, a backend and its threads) belongs to the
    /// namespace, and the caller's thread stays where it was. A panic in `f` is the caller's.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter_this_thread().expect("entering the namespace");
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Creates a persistent TAP in the namespace, with its address, and sets it up. Its carrier
    /// stays down until a process attaches to it.
    pub fn add_tap(&self, tap: &TapSpec) -> Result<(), String> {
        let mut args = vec!["tuntap", "add", "dev", &tap.name, "mode", "tap"];
        if tap.multi_queue {
            args.push("multi_queue");
        }
        if tap.vnet_hdr {
            args.push("vnet_hdr");
        }
        let owner = tap.owner.map(|u| u.to_string());
        if let Some(u) = &owner {
            args.extend(["user", u, "group", u]);
        }
        self.exec_ip(&args)?;
        if let Some(mtu) = tap.mtu {
            self.exec_ip(&["link", "set", &tap.name, "mtu", &mtu.to_string()])?;
        }
        self.exec_ip(&["addr", "add", &tap.address, "dev", &tap.name])?;
        self.exec_ip(&["link", "set", &tap.name, "up"])?;
        Ok(())
    }

    /// A command to run inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Starts a long-running program inside the namespace (a backend, a server), its output
    /// collected (and copied to `log`); killed when the returned `Proc` is dropped.
    pub fn spawn(&self, argv: &[&str], log: Option<&Path>) -> Result<Proc, String> {
        let mut cmd = self.command(argv[0]);
        cmd.args(&argv[1..]);
        Proc::spawn(argv[0], cmd, log, false).map_err(|e| e.to_string())
    }

    /// Runs a short command inside the namespace and returns its output.
    pub fn exec(&self, argv: &[&str]) -> Result<String, String> {
        let mut cmd = self.command(argv[0]);
        cmd.args(&argv[1..]);
        run_checked(argv[0], cmd, IP_TIMEOUT)
    }

    fn exec_ip(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", &self.name];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// How many queues of TAP `dev` are attached, and how many detached (`ip -d link`'s
    /// numqueues and numdisabled).
    pub fn tap_queues(&self, dev: &str) -> Result<(u32, u32), String> {
        let out = self.exec_ip(&["-d", "link", "show", dev])?;
        let words: Vec<&str> = out.split_whitespace().collect();
        let field = |name: &str| {
            let at = words.iter().position(|w| *w == name);
            at.and_then(|i| words.get(i + 1)?.parse().ok())
                .ok_or_else(|| format!("no {name} for {dev}: {out}"))
        };
        Ok((field("numqueues")?, field("numdisabled")?))
    }

    /// Waits up to 10 s for `n` queues of TAP `dev` to be attached. A frontend's connect
    /// returns once its requests are sent, before the backend has handled SET_VRING_ENABLE,
    /// which attaches an rx ring's TAP queue: a frame the kernel sends to a TAP with no queue
    /// attached is dropped (`tx_dropped`).
    pub fn wait_tap_attached(&self, dev: &str, n: u32) {
        let attached = || self.tap_queues(dev).is_ok_and(|(q, _)| q >= n);
        assert!(
            super::eventually(std::time::Duration::from_secs(10), attached),
            "{dev}: {:?} queues (attached, detached), not {n} attached",
            self.tap_queues(dev)
        );
    }

    /// The device's counters (/sys/class/net/DEV/statistics, as seen inside the namespace).
    /// For a TAP, `rx_*` counts frames written to it by its user (the guest's transmit) and
    /// `tx_*` frames the kernel handed to its user (the guest's receive).
    pub fn stats(&self, device: &str) -> Result<BTreeMap<String, u64>, String> {
        let script = format!(
            "cd /sys/class/net/{device}/statistics && for f in *; do echo \"$f $(cat $f)\"; done"
        );
        let out = self.exec(&["sh", "-c", &script])?;
        Ok(out
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect())
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        delete(&self.name);
    }
}

/// Deletes a namespace; the TAPs in it go with it.
pub fn delete(name: &str) {
    if let Err(e) = ip(&["netns", "del", name]) {
        super::report(&format!("cleanup: {e}"));
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run_checked("ip", cmd, IP_TIMEOUT)
}
