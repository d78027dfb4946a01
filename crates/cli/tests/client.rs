//! `virtnet backend --client`: the frontend listens (QEMU's `-chardev socket,server=on`) and
//! the backend connects to it, and connects again when the connection ends or while nothing
//! listens yet. The test is the listening frontend: our driver on the accepted stream.

mod service;

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use service::{exited, kill, BIN};
use testkit::inproc::{accept_backend, echo_round, WANTED};
use testkit::ScratchDir;

/// `virtnet backend --client` towards `socket`, echoing frames.
fn start_client(socket: &Path) -> Child {
    Command::new(BIN)
        .arg("backend")
        .arg("--socket-path")
        .arg(socket)
        .args(["--client", "--io", "echo"])
        .spawn()
        .expect("virtnet backend")
}

/// Accepts the backend within `within` and passes frames both ways through it.
fn accept_and_echo(listener: &UnixListener, within: Duration, what: &str) {
    let mut p = accept_backend(listener, WANTED, 1536, within)
        .unwrap_or_else(|| panic!("{what}: the backend did not connect within {within:?}"));
    assert_eq!(echo_round(&mut p, 32, 64).len(), 32, "{what}: frames");
}

/// SIGTERM: exit 0 within a second.
fn stop(mut child: Child) {
    kill(&child, "-TERM");
    let status = exited(&mut child, Duration::from_secs(1)).expect("still running after 1 s");
    assert!(status.success(), "{status}");
}

#[test]
fn the_backend_connects_to_a_listening_frontend_and_again_after_it_hangs_up() {
    let dir = ScratchDir::new("client").unwrap();
    let socket = dir.join("frontend.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let child = start_client(&socket);
    accept_and_echo(&listener, Duration::from_secs(10), "first connection");
    // The connection dropped (the pair went out of scope): the backend comes back, after its
    // first back-off step (100 ms), well within a second.
    let dropped = Instant::now();
    accept_and_echo(
        &listener,
        Duration::from_secs(2),
        "after the frontend hung up",
    );
    let back = dropped.elapsed();
    assert!(back < Duration::from_secs(2), "reconnected after {back:?}");
    accept_and_echo(&listener, Duration::from_secs(2), "a third time");
    stop(child);
    assert!(socket.exists(), "the frontend's socket file was removed");
}

#[test]
fn a_backend_started_before_its_frontend_connects_once_it_listens() {
    let dir = ScratchDir::new("early").unwrap();
    let socket = dir.join("frontend.sock");
    let child = start_client(&socket);
    // A few failed attempts (100, 200, 400 ms apart), then the frontend appears.
    std::thread::sleep(Duration::from_millis(800));
    let listener = UnixListener::bind(&socket).unwrap();
    // The next attempt is at most the back-off's current step (800 ms here) away.
    accept_and_echo(
        &listener,
        Duration::from_secs(5),
        "once the frontend listens",
    );
    stop(child);
}

#[test]
fn sigterm_stops_a_backend_waiting_for_its_frontend() {
    let dir = ScratchDir::new("waiting").unwrap();
    let child = start_client(&dir.join("nobody.sock"));
    std::thread::sleep(Duration::from_millis(300));
    stop(child);
}
