//! `virtnet backend` as a service stops on SIGTERM or SIGINT: its queues stopped (used batches
//! published), the sockets it created removed, exit status 0, within a second; a second signal
//! exits at once.

mod service;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use service::{exited, kill, BIN};

use testkit::inproc::{connect_socket, echo_round, WANTED};
use testkit::ScratchDir;

/// `virtnet backend --io echo` with a vhost-user and a ctl socket in `dir`, once it listens.
fn start(dir: &Path) -> (Child, PathBuf, PathBuf) {
    let (socket, ctl) = (dir.join("vhost.sock"), dir.join("ctl.sock"));
    let child = Command::new(BIN)
        .arg("backend")
        .arg("--socket-path")
        .arg(&socket)
        .arg("--ctl")
        .arg(&ctl)
        .args(["--io", "echo"])
        .spawn()
        .expect("virtnet backend");
    assert!(
        testkit::eventually(Duration::from_secs(10), || socket.exists() && ctl.exists()),
        "the backend never listened"
    );
    (child, socket, ctl)
}

#[test]
fn sigterm_stops_the_queues_removes_the_sockets_and_exits_0_within_a_second() {
    let dir = ScratchDir::new("sigterm").unwrap();
    let (mut child, socket, ctl) = start(dir.path());
    let mut p = connect_socket(&socket, WANTED, 1536);
    assert_eq!(
        echo_round(&mut p, 32, 64).len(),
        32,
        "frames through the backend"
    );
    let started = Instant::now();
    kill(&child, "-TERM");
    let status = exited(&mut child, Duration::from_secs(1)).expect("still running after 1 s");
    assert!(status.success(), "{status}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        !socket.exists() && !ctl.exists(),
        "the sockets are left behind"
    );
}

#[test]
fn a_second_sigint_exits_at_once() {
    let dir = ScratchDir::new("sigint").unwrap();
    let (mut child, socket, _ctl) = start(dir.path());
    let mut p = connect_socket(&socket, WANTED, 1536);
    assert_eq!(echo_round(&mut p, 8, 64).len(), 8);
    kill(&child, "-INT");
    kill(&child, "-INT");
    let status = exited(&mut child, Duration::from_secs(1)).expect("still running after 1 s");
    // The first signal's clean exit (0) or the second's (128 + SIGINT), whichever came first.
    assert!(
        matches!(status.code(), Some(0) | Some(130)),
        "exit status {status}"
    );
}
