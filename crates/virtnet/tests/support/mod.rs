//! Shared support for the integration tests that need real peers: a Linux guest under QEMU,
//! DPDK's testpmd, and network namespaces with TAP devices.
//!
//! A test file uses it with `mod support;`. Each test binary compiles the whole module but uses
//! only part of it, hence the `dead_code` allowance.
//!
//! - [`guest`]: build the guest initramfs, boot QEMU (TCG) with a virtio-net-pci device, run a
//!   shell script in the guest and parse its markers from the serial console.
//! - [`netns`]: a network namespace with a TAP device, removed on drop.
//! - [`testpmd`]: `dpdk-testpmd` as a vhost-user backend, with its port counters.
//! - [`packages`]: install what a test needs with apt-get, or say why the test is skipped.
//! - [`process`]: child processes that die with the test, and their output, waited on with
//!   deadlines.
//!
//! The recipe, timings and pitfalls are in docs/GUEST.md.

#![allow(dead_code)]

pub mod cpio;
pub mod guest;
pub mod netns;
pub mod packages;
pub mod process;
pub mod testpmd;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A scratch directory under /tmp, removed on drop.
///
/// It lives under /tmp rather than the target directory because unix socket paths are limited
/// to 107 bytes and a CI checkout may sit deep in the file system.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Creates `/tmp/vn-<tag>-<pid>-<n>`.
    pub fn new(tag: &str) -> std::io::Result<ScratchDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("vn-{tag}-{}-{n}", std::process::id()));
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
