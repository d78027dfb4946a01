//! Test scaffolding shared by the crates' tests (a dev-dependency only, never shipped).
//!
//! - [`pair`]: a driver queue and a device queue on one virtqueue in one memory, and guest
//!   memory in a file on /dev/shm: the crate `vring-testkit`, re-exported (vring's tests use
//!   it directly, so that they build neither the backend nor the driver);
//! - [`baseline`]: rust-vmm virtio-queue as a device engine for the bench harnesses;
//! - [`inproc`]: an in-process backend on a unix socket and our driver connected to it;
//! - [`raw`]: a frontend sending vhost-user requests one by one (memory regions, dirty
//!   logging, SEND_RARP), over memfds at addresses the test chooses;
//! - [`recovery`]: what a user sees after a hostile case (threads alive and idle, a fresh
//!   connection served, the process's descriptors and memory back), as one check;
//!
//! and the support for the tests that need real peers: a Linux guest under QEMU, DPDK's
//! testpmd, and network namespaces with TAP devices:
//!
//! - [`guest`]: build the guest initramfs, boot QEMU (TCG) with a virtio-net-pci device, run a
//!   shell script in the guest and parse its markers from the serial console.
//! - [`image`]: the guest's kernel and initramfs, cached under the target directory.
//! - [`netns`]: a network namespace with a TAP device, removed on drop.
//! - [`testpmd`]: `dpdk-testpmd` as a vhost-user backend, with its port counters.
//! - [`packages`]: install what a test needs with apt-get, or say why the test is skipped.
//! - [`process`]: child processes that die with the test, and their output, waited on with
//!   deadlines.
//!
//! The recipe, timings and pitfalls are in docs/GUEST.md.

#![deny(unsafe_code)]

pub mod baseline;
pub mod cpio;
pub mod guest;
pub mod image;
pub mod inproc;
pub mod netns;
pub mod packages;
// Child processes that die with the test: prctl in pre_exec.
#[allow(unsafe_code)]
pub mod process;
pub mod raw;
pub mod recovery;
pub mod testpmd;

pub use vring_testkit as pair;
pub use vring_testkit::{pair, Pair, DATA_BASE, INDIRECT_BASE, MEM_SIZE, RING_BASE};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Polls `f` every 5 ms for up to `within`; whether it came true.
pub fn eventually(within: std::time::Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    f()
}

/// The build's scratch directory, `target/tmp` (what cargo calls CARGO_TARGET_TMPDIR for
/// integration tests), found from the running test binary at `target/<profile>/deps/`; a
/// directory under /tmp when the binary runs from elsewhere. Cached guest images live there.
pub fn target_tmp() -> PathBuf {
    let exe = std::env::current_exe().ok();
    exe.as_deref()
        .and_then(|p| p.ancestors().find(|a| a.ends_with("deps")))
        .and_then(|deps| Some(deps.parent()?.parent()?.join("tmp")))
        .unwrap_or_else(|| std::env::temp_dir().join("virtnet-target-tmp"))
}

/// A scratch directory under /tmp, removed on drop.
///
/// It lives under /tmp rather than the target directory because unix socket paths are limited
/// to 107 bytes and a CI checkout may sit deep in the file system.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `/tmp/vnt-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> std::io::Result<ScratchDir> {
        reap_stale();
        let path = std::env::temp_dir().join(unique_name(tag));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(ScratchDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::env::var_os("VIRTNET_GUEST_KEEP").is_some() {
            report(&format!("keeping {}", self.path.display()));
            return;
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `vnt-<tag>-<pid>-<n>`: the name of a resource this test process owns (scratch directory,
/// network namespace, DPDK file prefix). The pid lets [`reap_stale`] find the leftovers of a
/// test process that was killed before its drop guards ran.
pub fn unique_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    assert!(
        !tag.is_empty() && tag.chars().all(|c| c.is_ascii_lowercase()),
        "tag {tag:?}: lowercase letters only"
    );
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("vnt-{tag}-{}-{n}", std::process::id())
}

/// The pid in a [`unique_name`], if `name` is one.
fn owner_pid(name: &str) -> Option<u32> {
    let mut parts = name.strip_prefix("vnt-")?.split('-');
    let (tag, pid, n) = (parts.next()?, parts.next()?, parts.next()?);
    let valid = parts.next().is_none()
        && !tag.is_empty()
        && tag.chars().all(|c| c.is_ascii_lowercase())
        && n.chars().all(|c| c.is_ascii_digit());
    valid.then(|| pid.parse().ok()).flatten()
}

/// Removes, once per process, what killed test processes left behind: scratch directories,
/// network namespaces (with their TAPs) and DPDK runtime directories named by
/// [`unique_name`] whose process is gone. Child processes need no reaping: they get SIGKILL
/// when the test dies (see [`process::Proc::spawn`]).
pub fn reap_stale() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dead = |name: &str| {
            owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        };
        for dir in [std::env::temp_dir(), PathBuf::from("/var/run/dpdk")] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if dead(&name) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/var/run/netns") {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if dead(&name) {
                    netns::delete(&name);
                }
            }
        }
    });
}

/// Writes a line to the test's real stderr.
///
/// libtest captures `println!`/`eprintln!` of passing tests; a skip reason or a timing must be
/// seen even when the test passes, so this writes to the stderr handle directly, which libtest
/// does not capture.
pub fn report(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "[virtnet-guest] {line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_only_for_our_names() {
        let name = unique_name("tap");
        assert_eq!(owner_pid(&name), Some(std::process::id()));
        assert_eq!(owner_pid("vnt-dpdk-123-0"), Some(123));
        assert_eq!(owner_pid("vnt-dpdk-123"), None);
        assert_eq!(owner_pid("vnt--123-0"), None);
        assert_eq!(owner_pid("vn-backend-123-0"), None);
        assert_eq!(owner_pid("vnt-a-b-123-0"), None);
    }
}
