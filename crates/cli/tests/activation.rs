//! How a service manager starts `virtnet backend`: on a listening socket it inherited as
//! `--fd N`, or by systemd socket activation (LISTEN_PID, LISTEN_FDS: descriptor 3), with
//! readiness sent to NOTIFY_SOCKET (READY=1 once it serves, STOPPING=1 on SIGTERM). A frontend
//! is served through the inherited socket, which the backend leaves in place when it exits.

mod service;

use std::io::Read;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use service::{exited, kill, with_fd3};
use testkit::inproc::{connect_socket, echo_round, WANTED};
use testkit::ScratchDir;

/// A listening socket at `dir`/vhost.sock, as a service manager would make it.
fn listener(dir: &Path) -> (UnixListener, std::path::PathBuf) {
    let path = dir.join("vhost.sock");
    (UnixListener::bind(&path).expect("listening socket"), path)
}

/// Frames through the backend behind `socket`, then SIGTERM: exit 0 within a second, and the
/// socket file (the service manager's) still there.
fn serve_then_stop(mut child: Child, socket: &Path) {
    let mut p = connect_socket(socket, WANTED, 1536);
    assert_eq!(echo_round(&mut p, 32, 64).len(), 32, "frames through it");
    drop(p);
    kill(&child, "-TERM");
    let status = exited(&mut child, Duration::from_secs(1)).expect("still running after 1 s");
    assert!(status.success(), "{status}");
    assert!(socket.exists(), "the inherited socket's file was removed");
}

#[test]
fn an_inherited_listener_given_by_fd_serves_frontends() {
    let dir = ScratchDir::new("inherited").unwrap();
    let (l, socket) = listener(dir.path());
    let child = with_fd3(l, "", &["backend", "--fd", "3", "--io", "echo"])
        .spawn()
        .expect("virtnet backend");
    serve_then_stop(child, &socket);
}

#[test]
fn socket_activation_serves_the_passed_socket_and_notifies_readiness() {
    let dir = ScratchDir::new("activation").unwrap();
    let (l, socket) = listener(dir.path());
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let setup = "export LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=virtnet-backend@test.socket;";
    let mut child = with_fd3(l, setup, &["backend", "--io", "echo"])
        .env("NOTIFY_SOCKET", &notify_path)
        .spawn()
        .expect("virtnet backend");
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 10 s");
    assert_eq!(&buf[..n], b"READY=1");
    let mut p = connect_socket(&socket, WANTED, 1536);
    assert_eq!(echo_round(&mut p, 32, 64).len(), 32, "frames through it");
    drop(p);
    kill(&child, "-TERM");
    let n = notify.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let status = exited(&mut child, Duration::from_secs(1)).expect("still running after 1 s");
    assert!(status.success(), "{status}");
    assert!(socket.exists(), "systemd's socket file was removed");
}

/// Starts the backend with `setup` before it and descriptor 3 `fd3`, expecting it to refuse
/// to start; returns what it said.
fn refused(fd3: UnixListener, setup: &str) -> String {
    let mut child = with_fd3(fd3, setup, &["backend", "--io", "echo"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("virtnet backend");
    let status = exited(&mut child, Duration::from_secs(10)).expect("still running after 10 s");
    assert!(!status.success(), "it started: {status}");
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

#[test]
fn sockets_passed_to_another_process_or_not_listening_are_refused() {
    let dir = ScratchDir::new("refused").unwrap();
    // LISTEN_PID names another process (a parent's variables, inherited): not ours to take.
    let (l, _) = listener(dir.path());
    let err = refused(l, "export LISTEN_PID=1 LISTEN_FDS=1;");
    assert!(err.contains("--socket-path"), "{err}");
    // Ours, but descriptor 3 is not a listening socket.
    let unbound = dir.join("unbound.sock");
    let l = UnixListener::bind(&unbound).unwrap();
    let setup = "exec 3</dev/null; export LISTEN_PID=$$ LISTEN_FDS=1;";
    let err = refused(l, setup);
    assert!(
        err.contains("socket activation") && err.contains("not a listening unix stream socket"),
        "{err}"
    );
}

#[test]
fn listen_counts_of_none_garbage_or_too_many_are_refused_at_once() {
    let dir = ScratchDir::new("counts").unwrap();
    // None passed: nothing for us, and nothing else to serve on.
    let (l, _) = listener(dir.path());
    let err = refused(l, "export LISTEN_PID=$$ LISTEN_FDS=0;");
    assert!(err.contains("--socket-path"), "{err}");
    std::fs::remove_file(dir.join("vhost.sock")).unwrap();
    let (l, _) = listener(dir.path());
    let err = refused(l, "export LISTEN_PID=$$ LISTEN_FDS=many;");
    assert!(err.contains("LISTEN_FDS=\"many\""), "{err}");
    // The largest count a process can have: refused at descriptor 4, the first not open,
    // rather than after marking two billion descriptors close-on-exec.
    std::fs::remove_file(dir.join("vhost.sock")).unwrap();
    let (l, _) = listener(dir.path());
    let err = refused(l, "export LISTEN_PID=$$ LISTEN_FDS=2147483644;");
    assert!(err.contains("descriptor 4 is not open"), "{err}");
}
