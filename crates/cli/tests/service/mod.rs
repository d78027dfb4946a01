//! Shared by the tests that run `virtnet backend` as a service: signals to it, its exit within
//! a deadline, and a listening socket handed to it as descriptor 3.
#![allow(dead_code)]

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_virtnet");

/// Sends `signal` ("-TERM", "-INT") to `child`.
pub fn kill(child: &Child, signal: &str) {
    let ok = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {signal}");
}

/// Waits up to `within` for `child` to exit; None (and the child killed) if it did not.
pub fn exited(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `virtnet ARGS` started by a shell that moves `listener` (handed to it as stdin) to
/// descriptor 3 and runs `setup` (shell commands, for example exports) before it execs the
/// binary, so that `$$` in `setup` is the backend's pid. No unsafe `pre_exec` needed: the
/// standard library puts the socket on stdin, the shell does the rest.
pub fn with_fd3(listener: UnixListener, setup: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("exec 3<&0 0</dev/null; {setup} exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .stdin(Stdio::from(OwnedFd::from(listener)));
    cmd
}
