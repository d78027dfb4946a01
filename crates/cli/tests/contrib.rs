//! contrib/ stays true to the binary: QEMU's vhost-user interop descriptor
//! (docs/interop/vhost-user.json, `VhostUserBackend`) has the schema's fields, the type that
//! `--print-capabilities` reports, and names a `virtnet-backend` that runs the backend; the
//! systemd units start the backend with options it has, by socket activation, with readiness.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_virtnet");

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(contrib(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `program ARGS`'s stdout, which must succeed.
fn stdout(program: &Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .expect("run virtnet");
    assert!(out.status.success(), "{program:?} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_vhost_user_descriptor_matches_the_schema_and_the_binary() {
    let doc: Value = serde_json::from_str(&read("qemu/50-virtnet-backend.json")).unwrap();
    let fields = doc.as_object().expect("one object");
    for key in fields.keys() {
        assert!(
            ["description", "type", "binary", "tags"].contains(&key.as_str()),
            "{key} is not a VhostUserBackend field"
        );
    }
    assert!(doc["description"].is_string());
    let binary = doc["binary"].as_str().expect("binary");
    assert!(binary.starts_with('/'), "binary must be absolute: {binary}");
    let caps: Value = serde_json::from_str(&stdout(
        Path::new(BIN),
        &["backend", "--print-capabilities"],
    ))
    .unwrap();
    assert_eq!(doc["type"], "net");
    assert_eq!(doc["type"], caps["type"], "--print-capabilities: {caps}");

    // What management software runs: the descriptor's binary, a link to `virtnet`, with the
    // vhost-user backend options and no subcommand.
    let name = Path::new(binary).file_name().unwrap();
    let dir = testkit::ScratchDir::new("descriptor").unwrap();
    let link = dir.path().join(name);
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let via_link: Value = serde_json::from_str(&stdout(&link, &["--print-capabilities"])).unwrap();
    assert_eq!(via_link, caps);
    let help = stdout(&link, &["--help"]);
    for option in ["--socket-path", "--fd", "--print-capabilities"] {
        assert!(help.contains(option), "{option} missing from:\n{help}");
    }
}

/// `key=value` lines of a unit file, in order (comments and sections left out).
fn settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn setting<'a>(all: &'a [(String, String)], key: &str) -> &'a str {
    all.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key}="))
}

#[test]
fn the_systemd_units_activate_the_backend_with_options_it_has() {
    let service = settings(&read("systemd/virtnet-backend@.service"));
    let socket = settings(&read("systemd/virtnet-backend@.socket"));
    assert_eq!(
        setting(&service, "Type"),
        "notify",
        "readiness is sd_notify"
    );
    assert_eq!(
        setting(&service, "Requires"),
        "virtnet-backend@%i.socket",
        "started by its socket"
    );
    assert_eq!(
        setting(&socket, "Accept"),
        "no",
        "one backend takes the socket"
    );
    assert!(setting(&socket, "ListenStream").starts_with('/'));

    let exec: Vec<&str> = setting(&service, "ExecStart").split_whitespace().collect();
    assert!(
        exec[0].ends_with("/virtnet") && exec[1] == "backend",
        "{exec:?}"
    );
    // No --socket-path or --fd: the socket comes from systemd.
    assert!(!exec.contains(&"--socket-path") && !exec.contains(&"--fd"));
    let help = stdout(Path::new(BIN), &["backend", "--help"]);
    for option in exec.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.contains(&format!("{option} ")),
            "ExecStart uses {option}, which `virtnet backend` lacks"
        );
    }
    // The control socket sits in the service's runtime directory.
    let ctl = exec[exec.iter().position(|a| *a == "--ctl").unwrap() + 1];
    let runtime = setting(&service, "RuntimeDirectory");
    assert!(
        ctl.starts_with(&format!("/run/{runtime}/")),
        "{ctl} outside /run/{runtime}"
    );
}

#[test]
fn the_switch_unit_starts_the_switch_with_options_it_has_and_its_example_parses() {
    let unit = read("systemd/virtnet-switch.service");
    let service = settings(&unit);
    assert_eq!(
        setting(&service, "Type"),
        "notify",
        "readiness is sd_notify"
    );
    let exec: Vec<&str> = setting(&service, "ExecStart").split_whitespace().collect();
    assert!(
        exec[0].ends_with("/virtnet") && exec[1] == "switch",
        "{exec:?}"
    );
    let help = stdout(Path::new(BIN), &["switch", "--help"]);
    // The options of ExecStart and of the drop-in example in the unit's comments.
    let example: String = unit
        .lines()
        .filter_map(|l| l.strip_prefix("#"))
        .skip_while(|l| !l.contains("ExecStart=/usr/local/bin/virtnet switch"))
        .take_while(|l| !l.trim().is_empty() && !l.contains("Ports can also"))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(example.contains("--port"), "the unit's example: {example}");
    for option in exec
        .iter()
        .copied()
        .chain(example.split_whitespace())
        .filter(|a| a.starts_with("--"))
    {
        assert!(
            help.contains(&format!("{option} ")),
            "the unit uses {option}, which `virtnet switch` lacks"
        );
    }
    let ctl = exec[exec.iter().position(|a| *a == "--ctl").unwrap() + 1];
    let runtime = setting(&service, "RuntimeDirectory");
    assert!(
        ctl.starts_with(&format!("/run/{runtime}/")),
        "{ctl} outside /run/{runtime}"
    );
}
