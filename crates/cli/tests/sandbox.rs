//! `virtnet backend` runs with least privilege: started as root it keeps only CAP_NET_ADMIN,
//! sets no_new_privs, and its worker threads run under the seccomp allow-list (the others do
//! not) while frames flow; `--sandbox off` keeps everything; and it runs as an unprivileged
//! user on a TAP that user owns (the README's recipe), frames reaching the TAP.
//!
//! The unprivileged case needs root to set up (a namespace, a TAP owned by nobody) and
//! `setpriv`; skips with a printed reason otherwise.

mod service;

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use service::{kill, BIN};
use testkit::inproc::{connect_socket, echo_round, frame, WANTED};
use testkit::netns::NetNs;
use testkit::{packages, ScratchDir};
use vnet::NetHdr;

const CAP_NET_ADMIN: u64 = 1 << 12;

/// Field `field` of /proc/PID/status, or of one of its threads.
fn status(path: &Path, field: &str) -> String {
    let s = std::fs::read_to_string(path.join("status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {}", path.display()))
        .trim()
        .to_string()
}

/// (thread name, Seccomp field) of every thread of `pid`.
fn threads(pid: u32) -> Vec<(String, String)> {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap();
            (comm.trim().to_string(), status(&t.path(), "Seccomp"))
        })
        .collect()
}

/// The backend process, killed if a test fails before stopping it (a backend left running
/// would hold the test's output pipe open).
struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Backend {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Backend {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

fn start(dir: &Path, extra: &[&str]) -> Backend {
    let socket = dir.join("vhost.sock");
    let child = Command::new(BIN)
        .args(["backend", "--io", "echo", "--queues", "2", "--socket-path"])
        .arg(&socket)
        .args(extra)
        .spawn()
        .expect("virtnet backend");
    let child = Backend(child);
    assert!(
        testkit::eventually(Duration::from_secs(10), || socket.exists()),
        "the backend never listened"
    );
    child
}

#[test]
fn the_backend_keeps_only_net_admin_and_its_workers_run_under_seccomp() {
    if !packages::is_root() {
        packages::skip("sandbox", "needs root (capabilities to drop)");
        return;
    }
    let dir = ScratchDir::new("sandbox").unwrap();
    // Pinned: each worker takes a slot on the board of pinned workers before its filter.
    let mut child = start(dir.path(), &["--worker-cpu", "0"]);
    let mut p = connect_socket(&dir.join("vhost.sock"), WANTED, 1536);
    assert_eq!(
        echo_round(&mut p, 64, 64).len(),
        64,
        "frames through the backend"
    );
    let proc = Path::new("/proc").join(child.id().to_string());
    let eff = u64::from_str_radix(&status(&proc, "CapEff"), 16).unwrap();
    assert_eq!(eff, CAP_NET_ADMIN, "effective capabilities {eff:#x}");
    for set in ["CapPrm", "CapBnd"] {
        let v = u64::from_str_radix(&status(&proc, set), 16).unwrap();
        assert_eq!(v, CAP_NET_ADMIN, "{set} {v:#x}");
    }
    assert_eq!(status(&proc, "NoNewPrivs"), "1");
    // Two pairs and the control queue, each filtered once it has run its setup (on a loaded
    // machine a worker that no frame needed yet may not have run at all).
    let workers_filtered = |t: &[(String, String)]| {
        let w: Vec<_> = t
            .iter()
            .filter(|(name, _)| name.starts_with("virtnet-pair") || name == "virtnet-ctrlq")
            .collect();
        w.len() == 3 && w.iter().all(|(_, s)| s == "2")
    };
    let pid = child.id();
    assert!(
        testkit::eventually(Duration::from_secs(10), || workers_filtered(&threads(pid))),
        "{:?}",
        threads(pid)
    );
    let t = threads(pid);
    let main = t.iter().find(|(name, _)| name == "virtnet").unwrap();
    assert_eq!(main.1, "0", "the protocol side is not filtered: {t:?}");
    // Both pairs' workers are on the board (/dev/shm/virtnet-workers-0) as pinned to CPU 0,
    // and its watcher, which opens other backends' schedstat files, is not filtered.
    let board = std::fs::read("/dev/shm/virtnet-workers-0").unwrap();
    let word = |r: &[u8], i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap());
    let slots: Vec<u32> = board
        .chunks_exact(16)
        .filter(|r| word(r, 0) == 1 && word(r, 4) == pid)
        .map(|r| word(r, 8))
        .collect();
    let pairs: Vec<String> = slots
        .iter()
        .map(|tid| std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).unwrap())
        .map(|name| name.trim().to_string())
        .collect();
    assert_eq!(pairs.len(), 2, "{pairs:?}");
    assert!(
        pairs.iter().all(|n| n.starts_with("virtnet-pair")),
        "{pairs:?}"
    );
    let watcher = t.iter().find(|(name, _)| name == "virtnet-board");
    assert_eq!(watcher.map(|w| w.1.as_str()), Some("0"), "{t:?}");
    drop(p);
    // A second connection through the filtered workers: queues stopped and started again.
    let mut p = connect_socket(&dir.join("vhost.sock"), WANTED, 1536);
    assert_eq!(echo_round(&mut p, 64, 1500).len(), 64);
    drop(p);
    kill(&child, "-TERM");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "the workers were killed? {exit}");

    // --sandbox off keeps root's capabilities and filters nothing.
    let mut child = start(dir.path(), &["--sandbox", "off"]);
    let proc = Path::new("/proc").join(child.id().to_string());
    let eff = u64::from_str_radix(&status(&proc, "CapEff"), 16).unwrap();
    assert!(eff & !CAP_NET_ADMIN != 0, "{eff:#x}");
    assert!(threads(child.id()).iter().all(|(_, s)| s == "0"));
    kill(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}

#[test]
fn an_unprivileged_user_runs_the_backend_on_a_tap_it_owns() {
    const TEST: &str = "sandbox::unprivileged";
    if !packages::is_root() {
        packages::skip(TEST, "needs root to create the namespace and the TAP");
        return;
    }
    if let Err(reason) = packages::ensure(&[
        packages::Requirement::command("ip", "iproute2"),
        packages::Requirement::command("setpriv", "util-linux"),
    ]) {
        packages::skip(TEST, &reason);
        return;
    }
    let ns = NetNs::create("unpriv").expect("network namespace");
    // The README's recipe: a persistent multi-queue TAP with vnet headers, owned by the user.
    let tap = "vnunpriv0";
    ns.exec(&[
        "ip",
        "tuntap",
        "add",
        "dev",
        tap,
        "mode",
        "tap",
        "multi_queue",
        "vnet_hdr",
        "user",
        "65534",
        "group",
        "65534",
    ])
    .unwrap();
    ns.exec(&["ip", "link", "set", tap, "up"]).unwrap();
    let dir = ScratchDir::new("unpriv").unwrap();
    // nobody must be able to create its socket there.
    Command::new("chmod")
        .args(["1777"])
        .arg(dir.path())
        .status()
        .unwrap();
    let socket = dir.join("vhost.sock");
    // The build directory may be closed to other users (a checkout under /root): nobody runs
    // a copy.
    let bin = dir.join("virtnet");
    std::fs::copy(BIN, &bin).unwrap();
    let mut child = Backend(
        ns.command("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
            .args(["--inh-caps", "-all", "--bounding-set", "-all"])
            .arg(&bin)
            .args(["backend", "--tap", tap, "--socket-path"])
            .arg(&socket)
            .spawn()
            .expect("setpriv virtnet backend"),
    );
    assert!(
        testkit::eventually(Duration::from_secs(10), || socket.exists()),
        "the backend never listened as nobody"
    );
    let proc = Path::new("/proc").join(child.id().to_string());
    assert_eq!(
        status(&proc, "Uid").split_whitespace().next(),
        Some("65534")
    );
    assert_eq!(status(&proc, "CapEff"), "0000000000000000");
    let before = ns.stats(tap).unwrap()["rx_packets"];
    let mut p = connect_socket(&socket, WANTED, 1536);
    for i in 0..50 {
        assert!(p.tx.send(&frame(i, 64), NetHdr::default()).unwrap());
    }
    p.tx.flush();
    assert!(
        testkit::eventually(Duration::from_secs(5), || {
            ns.stats(tap).unwrap()["rx_packets"] >= before + 50
        }),
        "frames from the guest did not reach the TAP"
    );
    drop(p);
    kill(&child, "-TERM");
    assert!(child.wait().unwrap().success());
}
