//! `virtnet gen --reconnect` across a backend restart: `virtnet backend --io null` killed with
//! SIGKILL in the middle of a run and started again on the same socket. gen sees the
//! connection close, connects again with back-off, renegotiates and resumes its traffic on
//! fresh rings: the new backend counts gen's frames, gen receives the new backend's, and the
//! report names the loss, its gap and its attempts. Without `--reconnect` the run ends with
//! the loss named.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::ScratchDir;

const BIN: &str = env!("CARGO_BIN_EXE_virtnet");

/// `virtnet backend --io null` on `socket` with its ctl socket `ctl`, once both listen.
fn backend(socket: &Path, ctl: &Path) -> Child {
    let child = Command::new(BIN)
        .args(["backend", "--io", "null", "--socket-path"])
        .arg(socket)
        .arg("--ctl")
        .arg(ctl)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("virtnet backend");
    assert!(
        testkit::eventually(Duration::from_secs(10), || socket.exists() && ctl.exists()),
        "the backend never listened"
    );
    child
}

/// The backend's (tx, rx) frame counts, summed over its queues (`virtnet ctl stats`).
fn backend_frames(ctl: &Path) -> (u64, u64) {
    let out = Command::new(BIN)
        .arg("ctl")
        .arg("--socket")
        .arg(ctl)
        .arg("stats")
        .output()
        .expect("virtnet ctl");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let sum = |kind: &str| {
        v["queues"].as_array().map_or(0, |qs| {
            qs.iter()
                .filter(|q| q["kind"] == kind)
                .filter_map(|q| q["packets"].as_u64())
                .sum()
        })
    };
    (sum("tx"), sum("rx"))
}

/// Waits up to `limit` for the backend at `ctl` to count at least one frame each way.
fn wait_for_traffic(ctl: &Path, limit: Duration) -> (u64, u64) {
    let deadline = Instant::now() + limit;
    loop {
        let (tx, rx) = backend_frames(ctl);
        if (tx > 0 && rx > 0) || Instant::now() >= deadline {
            return (tx, rx);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gen(socket: &Path, args: &[&str]) -> Child {
    Command::new(BIN)
        .args([
            "gen",
            "--mode",
            "io",
            "--json",
            "--connect-wait",
            "10",
            "--socket",
        ])
        .arg(socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("virtnet gen")
}

#[test]
fn gen_reconnects_after_the_backend_is_killed_and_resumes_both_ways() {
    let dir = ScratchDir::new("genreconnect").unwrap();
    let socket = dir.join("vhost.sock");
    let (ctl1, ctl2) = (dir.join("ctl1.sock"), dir.join("ctl2.sock"));
    let mut first = backend(&socket, &ctl1);
    let g = gen(&socket, &["--duration", "6", "--reconnect"]);
    let before = wait_for_traffic(&ctl1, Duration::from_secs(5));
    assert!(
        before.0 > 0 && before.1 > 0,
        "no traffic before the kill: {before:?}"
    );
    first.kill().expect("SIGKILL");
    first.wait().unwrap();
    // Down long enough for a few attempts to fail.
    std::thread::sleep(Duration::from_millis(600));
    let killed_for = Instant::now();
    let mut second = backend(&socket, &ctl2);
    let after = wait_for_traffic(&ctl2, Duration::from_secs(5));
    let waited = killed_for.elapsed();
    let out = g.wait_with_output().expect("gen");
    let _ = second.kill();
    let _ = second.wait();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    // The new backend counted gen's frames and gave it its own, after the restart.
    assert!(
        after.0 > 0 && after.1 > 0,
        "no traffic through the new backend within {waited:?}: {after:?}\n{stderr}"
    );
    let r: serde_json::Value = serde_json::from_str(&stdout).expect("the JSON report");
    let reconnects = r["reconnects"].as_array().expect("reconnects");
    assert_eq!(reconnects.len(), 1, "{stdout}");
    let rc = &reconnects[0];
    let gap = rc["gap_s"].as_f64().expect("back before the end");
    let attempts = rc["attempts"].as_u64().unwrap();
    assert!((0.5..5.0).contains(&gap), "gap {gap} s");
    assert!(
        attempts >= 2,
        "{attempts} attempts: the first ones found no backend"
    );
    // Only what was in flight on the old tx ring (256 entries) and never completed.
    let abandoned = rc["abandoned"].as_u64().unwrap();
    assert!(abandoned <= 256, "{abandoned} frames abandoned");
    let lost_at = rc["lost_at_s"].as_f64().unwrap();
    // The counters go on across the connections: more than the new backend saw alone.
    let (tx, rx) = (
        r["per_pair"][0]["tx"]["packets"].as_u64().unwrap(),
        r["per_pair"][0]["rx"]["packets"].as_u64().unwrap(),
    );
    assert!(
        tx > after.0 && rx > after.1,
        "gen {tx}/{rx}, new backend {after:?}"
    );
    // Seconds fully after the gap carry traffic both ways.
    let resumed: Vec<_> = r["seconds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["t_s"].as_f64().unwrap() > lost_at + gap + 1.0)
        .collect();
    assert!(!resumed.is_empty(), "{stdout}");
    for s in resumed {
        assert!(
            s["tx_mpps"].as_f64().unwrap() > 0.0 && s["rx_mpps"].as_f64().unwrap() > 0.0,
            "{s}"
        );
    }
}

#[test]
fn without_reconnect_a_killed_backend_ends_the_run_with_the_loss_named() {
    let dir = ScratchDir::new("genlost").unwrap();
    let socket = dir.join("vhost.sock");
    let ctl = dir.join("ctl.sock");
    let mut b = backend(&socket, &ctl);
    let g = gen(&socket, &["--duration", "30"]);
    let before = wait_for_traffic(&ctl, Duration::from_secs(5));
    assert!(before.0 > 0, "{before:?}");
    b.kill().expect("SIGKILL");
    b.wait().unwrap();
    let killed = Instant::now();
    let out = g.wait_with_output().expect("gen");
    assert!(killed.elapsed() < Duration::from_secs(5), "gen went on");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("the backend closed the connection"),
        "{stderr}"
    );
}
