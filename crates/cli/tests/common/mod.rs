//! Shared by the bench tests: one `virtnet bench --quick --json` run, parsed.
#![allow(dead_code)]

use std::process::Command;

use serde_json::Value;

/// The experiments' documents of `virtnet bench --quick --json --only ONLY` (for example
/// "1,2"), in that order, after checking the document around them.
pub fn quick_experiments(only: &str) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_virtnet"))
        .args(["bench", "--quick", "--json", "--only", only])
        .output()
        .expect("run virtnet");
    assert!(
        out.status.success(),
        "virtnet bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(doc["tool"], "virtnet bench");
    assert_eq!(doc["quick"], true);
    let exps = doc["experiments"].as_array().expect("experiments").clone();
    let ids: Vec<String> = exps.iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids.join(","), only);
    exps
}

/// The count at `path` in `v`.
pub fn u(v: &Value, path: &[&str]) -> u64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_u64()
        .unwrap_or_else(|| panic!("{path:?} is not a count in {v}"))
}
