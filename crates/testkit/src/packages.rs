//! What a test needs from the machine: found, installed with apt-get when running as root, or a
//! clear reason to skip.

use super::process::run_with_timeout;
use super::report;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Something a test needs, and the Debian package that provides it.
#[derive(Debug, Clone, Copy)]
pub struct Requirement {
    /// What is missing, for the skip message.
    pub what: &'static str,
    pub package: &'static str,
    check: Check,
}

#[derive(Debug, Clone, Copy)]
enum Check {
    Command,
    Custom(fn() -> bool),
}

impl Requirement {
    /// An executable found in PATH (or /usr/sbin, /sbin).
    pub const fn command(name: &'static str, package: &'static str) -> Requirement {
        Requirement {
            what: name,
            package,
            check: Check::Command,
        }
    }

    /// Anything else, checked by `present`.
    pub const fn custom(
        what: &'static str,
        package: &'static str,
        present: fn() -> bool,
    ) -> Requirement {
        Requirement {
            what,
            package,
            check: Check::Custom(present),
        }
    }

    fn is_present(&self) -> bool {
        match self.check {
            Check::Command => command_present(self.what),
            Check::Custom(present) => present(),
        }
    }
}

/// Whether `name` is an executable in PATH, /usr/sbin or /sbin.
pub fn command_present(name: &str) -> bool {
    find_command(name).is_some()
}

pub fn find_command(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .filter(|dir| !dir.is_empty())
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| {
            use std::os::unix::fs::PermissionsExt;
            candidate
                .metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        });
    found
}

/// Whether the test process runs with effective uid 0.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Makes sure every requirement is present, installing the missing packages with apt-get
/// (`--no-install-recommends`) when running as root. `Err` carries the reason to skip.
pub fn ensure(requirements: &[Requirement]) -> Result<(), String> {
    // One installer at a time within this process; apt's own lock (waited on below) covers
    // other processes.
    static INSTALL: Mutex<()> = Mutex::new(());
    let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());

    let missing: Vec<&Requirement> = requirements.iter().filter(|r| !r.is_present()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut packages: Vec<&str> = missing.iter().map(|r| r.package).collect();
    packages.sort_unstable();
    packages.dedup();
    let whats: Vec<&str> = missing.iter().map(|r| r.what).collect();
    if !is_root() {
        return Err(format!(
            "missing {} and not root, so cannot apt-get install {}",
            whats.join(", "),
            packages.join(" ")
        ));
    }
    if !command_present("apt-get") {
        return Err(format!("missing {} and no apt-get", whats.join(", ")));
    }
    report(&format!(
        "installing {} (missing {})",
        packages.join(" "),
        whats.join(", ")
    ));
    let started = std::time::Instant::now();
    apt_get(&["update"])?;
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend(packages.iter().copied());
    apt_get(&install)?;
    report(&format!("installed in {:.0?}", started.elapsed()));

    let still: Vec<&str> = missing
        .iter()
        .filter(|r| !r.is_present())
        .map(|r| r.what)
        .collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "still missing after apt-get install: {}",
            still.join(", ")
        ))
    }
}

fn apt_get(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("apt-get");
    cmd.args(["-q", "-o", "DPkg::Lock::Timeout=600"])
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive");
    match run_with_timeout("apt-get", cmd, Duration::from_secs(900)) {
        Ok((true, _)) => Ok(()),
        Ok((false, out)) => {
            let tail: Vec<&str> = out.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            Err(format!(
                "apt-get {} failed (no network for apt?): {}",
                args.join(" "),
                tail.join(" | ")
            ))
        }
        Err(e) => Err(format!("apt-get {}: {e}", args.join(" "))),
    }
}

/// Reports that `test` is skipped, and why. With `VIRTNET_GUEST_REQUIRE=1` in the environment
/// (for CI, where the test must run), panics instead.
/// Whether `test` can make network namespaces and TAP devices here (root, and `ip`, installed
/// if missing); if not, it is skipped with the reason (see [`skip`]) and this is false.
pub fn netns_ready(test: &str) -> bool {
    if !is_root() {
        skip(test, "needs root (network namespaces, TAP devices)");
        return false;
    }
    if let Err(reason) = ensure(&[Requirement::command("ip", "iproute2")]) {
        skip(test, &reason);
        return false;
    }
    true
}

pub fn skip(test: &str, reason: &str) {
    if std::env::var("VIRTNET_GUEST_REQUIRE").is_ok_and(|v| v == "1") {
        panic!("{test}: cannot run and VIRTNET_GUEST_REQUIRE=1: {reason}");
    }
    report(&format!("SKIPPED {test}: {reason}"));
}
