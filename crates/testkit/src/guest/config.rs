//! How to boot a test guest and what to run in it ([`GuestConfig`]): the virtio-net-pci
//! device's backend ([`Netdev`]), the guest's address, memory and CPUs, its kernel command
//! line, and the QEMU command built from them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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
    /// A human monitor on this unix socket (QEMU listens), for [`Monitor`](super::Monitor);
    /// else none.
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
    /// More properties of the virtio-net-pci device, e.g. ",guest_tso4=off,guest_csum=off".
    pub device_extra: String,
    /// IPv6 on, as a distribution's kernel boots. Off unless asked: its router solicitations,
    /// MLD reports and duplicate address detection come at random times and spoil exact
    /// packet counts.
    pub ipv6: bool,
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
            device_extra: String::new(),
            ipv6: false,
        }
    }

    /// The kernel command line.
    pub fn append(&self) -> String {
        let mut args = vec![
            "console=ttyS0".to_string(),
            // A panic (init died) reboots at once, and -no-reboot turns that into QEMU's exit.
            "panic=-1".to_string(),
            "quiet".to_string(),
            format!("vn_ip={}", self.ip),
            format!("vn_timeout={}", self.script_timeout.as_secs().max(1)),
        ];
        if !self.ipv6 {
            // No IPv6 chatter (router solicitations, MLD), so packet counters are exact.
            args.push("ipv6.disable=1".to_string());
        }
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
        device.push_str(&self.device_extra);
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
