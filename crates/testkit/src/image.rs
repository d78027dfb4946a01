//! The guest's boot files: the host kernel (as an uncompressed vmlinux when it can be booted
//! through PVH) and the initramfs (busybox, the virtio-net modules, iperf3, sockperf and /init),
//! built once and cached under the target directory. docs/GUEST.md has the recipe.

use super::cpio::{write_atomically, CpioWriter};
use super::packages::{find_command, Requirement};
use super::process::run_checked;
use std::collections::BTreeSet;
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
        let dir = crate::target_tmp().join("virtnet-guest");
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

pub fn read(path: &Path) -> Result<Vec<u8>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_version_order() {
        let mut v = ["6.1.0-9-amd64", "6.1.0-10-amd64", "5.10.0-30-amd64"];
        v.sort_by_key(|s| natural_key(s));
        assert_eq!(v, ["5.10.0-30-amd64", "6.1.0-9-amd64", "6.1.0-10-amd64"]);
    }
}
