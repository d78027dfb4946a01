//! Logs written to a file, a pipe or journald carry no terminal colour codes: `virtnet
//! backend` colours them only when stderr is a terminal.

mod service;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use service::{exited, kill, BIN};
use testkit::ScratchDir;

#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let dir = ScratchDir::new("logpipe").unwrap();
    let mut child = Command::new(BIN)
        .arg("backend")
        .arg("--socket-path")
        .arg(dir.path().join("vhost.sock"))
        .args(["--io", "echo"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .spawn()
        .expect("virtnet backend");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &String| l.contains("virtnet backend ready"))
    {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => lines.push(line),
            Err(e) => panic!("no ready line ({e}); stderr so far: {lines:?}"),
        }
    }
    kill(&child, "-TERM");
    exited(&mut child, Duration::from_secs(5)).expect("still running after SIGTERM");
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    assert!(lines.iter().any(|l| l.contains("INFO")), "{lines:?}");
    let coloured: Vec<&String> = lines.iter().filter(|l| l.contains('\x1b')).collect();
    assert!(coloured.is_empty(), "escape codes in {coloured:?}");
}
