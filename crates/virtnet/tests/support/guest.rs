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

use super::cpio::{write_atomically, CpioWriter};
use super::packages::{find_command, Requirement};
use super::process::{run_checked, Proc, WaitError};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// Kernel modules the guest loads, in insmod order (Debian 6.1 builds virtio as modules).
const MODULES: [&str; 8] = [
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_pci_legacy_dev",
    "drivers/virtio/virtio_pci_modern_dev",
    "drivers/virtio/virtio_pci",
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
];

/// Programs copied into the image with their shared libraries, besides busybox.
const PROGRAMS: [&str; 2] = ["iperf3", "sockperf"];

const INIT_SH: &str = include_str!("guest_init.sh");
const LIB_SH: &str = include_str!("guest_lib.sh");

/// What the guest tests need on the host; `packages::ensure(GUEST_REQUIREMENTS)` installs it.
pub const GUEST_REQUIREMENTS: &[Requirement] = &[
    Requirement::command("qemu-system-x86_64", "qemu-system-x86"),
    Requirement::custom(
        "a kernel with virtio_net",
        "linux-image-amd64",
        kernel_present,
    ),
    Requirement::command("busybox", "busybox-static"),
    Requirement::command("iperf3", "iperf3"),
    Requirement::command("sockperf", "sockperf"),
    Requirement::command("ldd", "libc-bin"),
];

fn kernel_present() -> bool {
    Kernel::find().is_ok()
}

/// The host kernel the guest boots, with its modules.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub version: String,
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

impl Kernel {
    /// `VIRTNET_GUEST_KERNEL=VERSION` if set, else the newest /boot/vmlinuz-VERSION whose
    /// /lib/modules/VERSION has virtio_net (the running kernel may be a different one: here it
    /// is the host's own, without modules).
    pub fn find() -> Result<Kernel, String> {
        let wanted = std::env::var("VIRTNET_GUEST_KERNEL").ok();
        let mut found: Vec<Kernel> = std::fs::read_dir("/boot")
            .map_err(|e| format!("/boot: {e}"))?
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let version = name.strip_prefix("vmlinuz-")?.to_string();
                let modules = PathBuf::from("/lib/modules").join(&version);
                let kernel = Kernel {
                    vmlinuz: PathBuf::from("/boot").join(&name),
                    modules,
                    version,
                };
                let usable = std::fs::File::open(&kernel.vmlinuz).is_ok()
                    && kernel.module_file("drivers/net/virtio_net").is_some();
                usable.then_some(kernel)
            })
            .filter(|k| wanted.as_deref().is_none_or(|w| w == k.version))
            .collect();
        found.sort_by_key(|k| natural_key(&k.version));
        found.pop().ok_or_else(|| match wanted {
            Some(w) => {
                format!("VIRTNET_GUEST_KERNEL={w}: no readable /boot/vmlinuz-{w} with virtio_net")
            }
            None => "no readable /boot/vmlinuz-* with virtio_net in /lib/modules".to_string(),
        })
    }

    /// The module's file (.ko, or compressed), or `None` if absent.
    fn module_file(&self, module: &str) -> Option<PathBuf> {
        ["ko", "ko.xz", "ko.zst"]
            .iter()
            .map(|ext| self.modules.join("kernel").join(format!("{module}.{ext}")))
            .find(|p| p.is_file())
    }

    /// Whether the module is built into the kernel (so there is nothing to load).
    fn is_builtin(&self, module: &str) -> bool {
        std::fs::read_to_string(self.modules.join("modules.builtin"))
            .map(|list| list.lines().any(|l| l == format!("kernel/{module}.ko")))
            .unwrap_or(false)
    }

    /// The module, uncompressed (busybox insmod takes plain .ko files).
    fn module_bytes(&self, module: &str) -> Result<Option<Vec<u8>>, String> {
        let Some(path) = self.module_file(module) else {
            return if self.is_builtin(module) {
                Ok(None)
            } else {
                Err(format!(
                    "module {module} missing in {}",
                    self.modules.display()
                ))
            };
        };
        let name = path.to_string_lossy();
        let tool = if name.ends_with(".xz") {
            "xz"
        } else if name.ends_with(".zst") {
            "zstd"
        } else {
            return std::fs::read(&path)
                .map(Some)
                .map_err(|e| format!("{name}: {e}"));
        };
        let output = Command::new(tool)
            .args(["-dc", &name])
            .output()
            .map_err(|e| format!("{tool} -dc {name}: {e}"))?;
        if !output.status.success() {
            return Err(format!("{tool} -dc {name} failed"));
        }
        Ok(Some(output.stdout))
    }
}

/// Sorts "6.1.0-10" after "6.1.0-9".
fn natural_key(s: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut chars = s.chars().peekable();
    while chars.peek().is_some() {
        let digits: String = std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_digit())).collect();
        let other: String = std::iter::from_fn(|| chars.next_if(|c| !c.is_ascii_digit())).collect();
        key.push((digits.parse().unwrap_or(0), other));
    }
    key
}

/// The base initramfs: busybox, modules, iperf3, sockperf and /init; a run appends /test.sh.
#[derive(Debug)]
pub struct GuestImage {
    pub kernel: Kernel,
    /// What QEMU's -kernel gets: the uncompressed vmlinux (booted through its PVH entry point)
    /// when it could be extracted, else the bzImage.
    pub boot_kernel: PathBuf,
    /// The cached uncompressed cpio archive.
    pub initramfs: PathBuf,
    /// How long building took in this process (zero when the cache was used).
    pub build_time: Duration,
}

impl GuestImage {
    /// Builds the image once per process, or reuses the one cached under the target directory
    /// for the same kernel and inputs.
    pub fn get() -> Result<&'static GuestImage, String> {
        static IMAGE: OnceLock<Result<GuestImage, String>> = OnceLock::new();
        IMAGE
            .get_or_init(GuestImage::build)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn build() -> Result<GuestImage, String> {
        let started = Instant::now();
        let kernel = Kernel::find()?;
        let busybox = find_command("busybox").ok_or("busybox not found")?;
        let mut programs = vec![busybox.clone()];
        for name in PROGRAMS {
            programs.push(find_command(name).ok_or(format!("{name} not found"))?);
        }
        let mut libraries = BTreeSet::new();
        for program in &programs {
            libraries.extend(shared_libraries(program)?);
        }

        // The cache key covers every input, so a changed init script, kernel or package
        // rebuilds the image.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (INIT_SH, LIB_SH, MODULES, &kernel.version).hash(&mut hasher);
        for path in programs.iter().chain(&libraries).chain([&kernel.vmlinuz]) {
            file_identity(path).hash(&mut hasher);
        }
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("virtnet-guest");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let initramfs = dir.join(format!(
            "initramfs-{}-{:016x}.cpio",
            kernel.version,
            hasher.finish()
        ));
        let boot_kernel = uncompressed_kernel(&kernel, &dir);
        if initramfs.is_file() {
            return Ok(GuestImage {
                kernel,
                boot_kernel,
                initramfs,
                build_time: Duration::ZERO,
            });
        }

        let mut image = ImageBuilder::default();
        for dir in [
            "bin",
            "sbin",
            "usr/bin",
            "usr/sbin",
            "lib",
            "lib64",
            "lib/modules",
        ] {
            image.dirs(dir);
        }
        for dir in ["dev", "proc", "sys", "tmp", "run", "root", "etc"] {
            image.dirs(dir);
        }
        // The kernel opens /dev/console for init before devtmpfs is mounted.
        image.cpio.char_dev("dev/console", 0o600, 5, 1);

        image.file("bin/busybox", 0o755, read(&busybox)?);
        let applets = run_checked(
            "busybox",
            {
                let mut c = Command::new(&busybox);
                c.arg("--list-full");
                c
            },
            Duration::from_secs(10),
        )?;
        for applet in applets.lines().map(str::trim) {
            // The list names busybox itself: a link there would replace the binary with a
            // link to itself (ELOOP when the kernel runs /init).
            if applet.is_empty() || applet.ends_with("/busybox") || applet == "busybox" {
                continue;
            }
            image.symlink(applet, "/bin/busybox");
        }
        for program in &programs[1..] {
            let name = program.file_name().unwrap().to_string_lossy();
            image.file(&format!("usr/bin/{name}"), 0o755, read(program)?);
        }
        for library in &libraries {
            image.file(&library.to_string_lossy(), 0o755, read(library)?);
        }

        let mut loaded = Vec::new();
        for module in MODULES {
            let name = module.rsplit('/').next().unwrap();
            if let Some(bytes) = kernel.module_bytes(module)? {
                image.file(&format!("lib/modules/{name}.ko"), 0o644, bytes);
                loaded.push(name);
            }
        }
        let init = INIT_SH.replace("@MODULES@", &loaded.join(" "));
        image.file("init", 0o755, init.into_bytes());
        image.file("lib/vn.sh", 0o644, LIB_SH.as_bytes().to_vec());

        let bytes = image.cpio.finish();
        write_atomically(&initramfs, &bytes)
            .map_err(|e| format!("{}: {e}", initramfs.display()))?;
        Ok(GuestImage {
            kernel,
            boot_kernel,
            initramfs,
            build_time: started.elapsed(),
        })
    }
}

/// The kernel's uncompressed ELF image, cached in `dir`, or the bzImage itself when that is not
/// possible.
///
/// Under TCG, the bzImage's own xz decompressor takes ~9 s of emulated time before the kernel
/// prints anything. A kernel with CONFIG_PVH has an ELF note that QEMU's -kernel uses to boot
/// the plain vmlinux directly (no real-mode setup, no decompression): boots take ~4 s instead
/// of ~13 s here. The vmlinux is found, as scripts/extract-vmlinux does, at the first
/// compressed-stream signature in the bzImage that decompresses to an ELF file.
fn uncompressed_kernel(kernel: &Kernel, dir: &Path) -> PathBuf {
    let config = kernel
        .vmlinuz
        .with_file_name(format!("config-{}", kernel.version));
    let pvh =
        std::fs::read_to_string(&config).is_ok_and(|c| c.lines().any(|l| l == "CONFIG_PVH=y"));
    if !pvh || std::env::var_os("VIRTNET_GUEST_BZIMAGE").is_some() {
        return kernel.vmlinuz.clone();
    }
    let identity = file_identity(&kernel.vmlinuz);
    let out = dir.join(format!(
        "vmlinux-{}-{}-{}",
        kernel.version, identity.1, identity.2
    ));
    if out.is_file() {
        return out;
    }
    match extract_vmlinux(&kernel.vmlinuz) {
        Ok(elf) => match write_atomically(&out, &elf) {
            Ok(()) => out,
            Err(_) => kernel.vmlinuz.clone(),
        },
        Err(reason) => {
            super::report(&format!(
                "booting the compressed {} ({reason}): expect ~9 s more per boot",
                kernel.vmlinuz.display()
            ));
            kernel.vmlinuz.clone()
        }
    }
}

fn extract_vmlinux(bzimage: &Path) -> Result<Vec<u8>, String> {
    let bytes = read(bzimage)?;
    let formats: [(&[u8], &str); 3] = [
        (b"\xfd7zXZ\x00", "xz"),
        (b"\x28\xb5\x2f\xfd", "zstd"),
        (b"\x1f\x8b\x08", "gzip"),
    ];
    for (magic, tool) in formats {
        let Some(at) = bytes.windows(magic.len()).position(|w| w == magic) else {
            continue;
        };
        let mut child = Command::new(tool)
            .args(["-dcq"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("{tool}: {e}"))?;
        let mut stdin = child.stdin.take().expect("piped");
        let input = bytes[at..].to_vec();
        // Feed on a thread: the output is ~60 MB, more than a pipe holds.
        let feeder = std::thread::spawn(move || {
            use std::io::Write;
            // The decompressor stops reading at the stream's end: a broken pipe is expected.
            let _ = stdin.write_all(&input);
        });
        // Trailing data after the stream makes the decompressor exit non-zero: judge the
        // output instead of the status.
        let output = child
            .wait_with_output()
            .map_err(|e| format!("{tool}: {e}"))?;
        let _ = feeder.join();
        if is_complete_elf(&output.stdout) {
            return Ok(output.stdout);
        }
    }
    Err("no compressed ELF kernel found in the bzImage".to_string())
}

/// An x86-64 ELF whose section header table lies within the data (so it was not truncated).
fn is_complete_elf(data: &[u8]) -> bool {
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| u64::from(u16::from_le_bytes([data[o], data[o + 1]]));
    let shoff = u64::from_le_bytes(data[40..48].try_into().unwrap());
    let end = shoff + u16_at(58) * u16_at(60);
    end <= data.len() as u64
}

/// A cpio writer that adds missing parent directories and skips duplicates.
#[derive(Debug, Default)]
struct ImageBuilder {
    cpio: CpioWriter,
    seen: BTreeSet<String>,
}

impl ImageBuilder {
    fn dirs(&mut self, path: &str) {
        let mut prefix = String::new();
        for part in path.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.seen.insert(prefix.clone()) {
                self.cpio.dir(&prefix);
            }
        }
    }

    fn parent_of(&mut self, path: &str) -> Option<String> {
        let path = path.trim_start_matches('/').to_string();
        if let Some((parent, _)) = path.rsplit_once('/') {
            self.dirs(parent);
        }
        self.seen.insert(path.clone()).then_some(path)
    }

    fn file(&mut self, path: &str, mode: u32, bytes: Vec<u8>) {
        if let Some(path) = self.parent_of(path) {
            self.cpio.file(&path, mode, &bytes);
        }
    }

    fn symlink(&mut self, path: &str, target: &str) {
        if let Some(path) = self.parent_of(path) {
            self.cpio.symlink(&path, target);
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn file_identity(path: &Path) -> (PathBuf, u64, u128) {
    let meta = std::fs::metadata(path).ok();
    let len = meta.as_ref().map_or(0, |m| m.len());
    let mtime = meta
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    (path.to_path_buf(), len, mtime)
}

/// The shared libraries `ldd` lists for `program` (none for a static binary), with the dynamic
/// loader, at the paths the program will look for them.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>, String> {
    let output = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|e| format!("ldd {}: {e}", program.display()))?;
    // ldd exits 1 with "not a dynamic executable" for busybox-static.
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

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
    pub mtu: Option<u32>,
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
}

impl GuestConfig {
    /// A guest at 10.99.0.2/24 on a vhost-user backend at `socket`, one queue pair; the script
    /// sees `$VN_PEER` = 10.99.0.1.
    pub fn vhost_user(socket: &Path, script: &str) -> GuestConfig {
        GuestConfig::new(
            Netdev::VhostUser {
                socket: socket.to_path_buf(),
                queues: 1,
                reconnect_secs: None,
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
            memory_mb: 512,
            cpus: 1,
            boot_timeout: Duration::from_secs(60),
            script_timeout: Duration::from_secs(120),
            dmesg: false,
            extra_append: String::new(),
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
        let mem = format!("{}M", self.memory_mb);
        cmd.args(["-name", "virtnet-guest", "-nodefaults", "-no-user-config"]);
        // KVM here is a PVM variant that does not boot a stock kernel: software emulation.
        cmd.args(["-accel", "tcg", "-cpu", "max"]);
        cmd.args(["-smp", &self.cpus.to_string(), "-m", &mem]);
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
            } => {
                let mut chardev = format!("socket,id=c0,path={}", socket.display());
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
        cmd.args(["-device", &device]);
        cmd.args(["-display", "none", "-serial", "stdio", "-monitor", "none"]);
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

    #[test]
    fn natural_version_order() {
        let mut v = ["6.1.0-9-amd64", "6.1.0-10-amd64", "5.10.0-30-amd64"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["5.10.0-30-amd64", "6.1.0-9-amd64", "6.1.0-10-amd64"]);
    }
}
