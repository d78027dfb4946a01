//! `virtnet bench --quick --json` runs, its output parses, and its counts make sense. Counts
//! only, never times: times on a shared CI machine prove nothing.

mod common;

use common::{quick_experiments, u};
use serde_json::Value;

/// The ring experiment's results, from one `--quick --json` run.
fn ring_results() -> Value {
    let exps = quick_experiments("0");
    assert_eq!(exps[0]["name"], "ring");
    exps[0]["results"].clone()
}

/// Sums a count over the runs of one ping-pong mode.
fn sum(mode: &Value, path: &[&str]) -> u64 {
    mode["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| u(r, path))
        .sum()
}

fn find<'a>(pingpong: &'a [Value], label: &str) -> &'a Value {
    pingpong
        .iter()
        .find(|m| m["label"] == label)
        .unwrap_or_else(|| panic!("no mode {label}"))
}

#[test]
fn quick_json_parses_and_counts_make_sense() {
    let r = ring_results();
    let pingpong = r["pingpong"].as_array().expect("pingpong");
    assert_eq!(pingpong.len(), 5);

    // Every run of every mode: each chain added, popped, used and reclaimed exactly once, and
    // the engines' notification decisions match the eventfd writes made on them.
    for mode in pingpong {
        let runs = mode["runs"].as_array().expect("runs");
        assert!(!runs.is_empty());
        for run in runs {
            let ops = u(run, &["ops"]);
            assert!(ops > 0);
            for path in [
                &["driver", "added"][..],
                &["driver", "used"],
                &["device", "popped"],
                &["device", "used"],
            ] {
                assert_eq!(u(run, path), ops, "{path:?} in {run}");
            }
            assert_eq!(
                u(run, &["driver", "kicks"]),
                u(run, &["driver", "kick_writes"])
            );
            assert_eq!(
                u(run, &["device", "notifications"]),
                u(run, &["device", "call_writes"])
            );
            assert!(run["secs"].as_f64().expect("secs") > 0.0);
        }
        assert!(mode["mops"]["median"].as_f64().expect("mops") > 0.0);
    }

    // Polling: both sides have notifications off, so kicks and interrupts are rare (event
    // idx still passes its stale event index once per 2^15..2^16 chains).
    for label in [
        "poll, used batch 1",
        "poll, used batch 16",
        "poll, used batch 64",
    ] {
        let m = find(pingpong, label);
        let ops = sum(m, &["ops"]);
        let runs = m["runs"].as_array().unwrap().len() as u64;
        assert!(
            sum(m, &["driver", "kicks"]) <= runs * (2 + ops / 65536),
            "{label}"
        );
        assert!(
            sum(m, &["device", "notifications"]) <= runs * (2 + ops / 16384),
            "{label}"
        );
    }

    // Batched used publish: batch 1 stores used.idx once per chain; batch 64 far less often,
    // but at least once per 64 chains.
    let b1 = find(pingpong, "poll, used batch 1");
    assert_eq!(sum(b1, &["device", "used_idx_stores"]), sum(b1, &["ops"]));
    let b64 = find(pingpong, "poll, used batch 64");
    let (ops64, stores64) = (sum(b64, &["ops"]), sum(b64, &["device", "used_idx_stores"]));
    assert!(stores64 >= ops64 / 64);
    assert!(
        stores64 * sum(b1, &["ops"]) < sum(b1, &["device", "used_idx_stores"]) * ops64,
        "batch 64 must store used.idx less often per chain than batch 1"
    );

    // Event idx: fewer kicks per chain than the NO_NOTIFY flag, on the same sleeping workload.
    let ev = find(pingpong, "sleep, event idx");
    let fl = find(pingpong, "sleep, flags (no event idx)");
    let (ev_ops, fl_ops) = (sum(ev, &["ops"]), sum(fl, &["ops"]));
    let (ev_kicks, fl_kicks) = (sum(ev, &["driver", "kicks"]), sum(fl, &["driver", "kicks"]));
    assert!(
        ev_kicks > 0,
        "a sleeping device must be kicked at least once"
    );
    assert!(
        ev_kicks * fl_ops < fl_kicks * ev_ops,
        "event idx {ev_kicks} kicks / {ev_ops} vs flags {fl_kicks} / {fl_ops}"
    );

    // Device side, one thread: one used.idx store per round of 64 chains, every descriptor
    // of every chain walked.
    let ds = r["device_side"].as_array().expect("device_side");
    assert_eq!(ds.len(), 2);
    for shape in ds {
        let descs = u(shape, &["descriptors_per_chain"]);
        for run in shape["runs"].as_array().expect("runs") {
            let chains = u(run, &["chains"]);
            assert_eq!(chains % 64, 0);
            assert_eq!(u(run, &["descriptors"]), chains * descs);
            assert_eq!(u(run, &["device", "popped"]), chains);
            assert_eq!(u(run, &["device", "used_idx_stores"]), chains / 64);
            assert_eq!(
                u(run, &["rounds_kept"]) + u(run, &["rounds_interrupted"]),
                chains / 64
            );
        }
    }
}

#[test]
fn unknown_experiment_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_virtnet"))
        .args(["bench", "--quick", "--only", "99"])
        .output()
        .expect("run virtnet");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no experiment numbered 99"));
}
