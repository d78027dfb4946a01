//! `virtnet gen --gso` as a user runs it against `virtnet backend --io null`: TSO super-frames
//! reported in Mpps, Gbit/s and segments; USO refused with the missing feature named while the
//! backend does not offer HOST_USO; options that make no super-frame refused.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use testkit::ScratchDir;
use vnet::feature;

struct Backend(Child);

impl Drop for Backend {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn backend(socket: &Path) -> Backend {
    let child = Command::new(env!("CARGO_BIN_EXE_virtnet"))
        .args(["backend", "--io", "null", "--socket-path"])
        .arg(socket)
        .spawn()
        .expect("virtnet backend");
    let b = Backend(child);
    assert!(
        testkit::eventually(Duration::from_secs(10), || socket.exists()),
        "the backend never listened"
    );
    b
}

fn gen(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_virtnet"))
        .args(["gen", "--duration", "1", "--socket"])
        .arg(socket)
        .args(args)
        .output()
        .expect("virtnet gen")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn gen_gso_sends_super_frames_and_names_what_the_device_lacks() {
    let dir = ScratchDir::new("gengso").unwrap();
    let socket = dir.join("vhost.sock");
    let _b = backend(&socket);

    let o = gen(&socket, &["--gso", "tcp", "--size", "65000"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains("gso tcp: 45 segments of 1448 B per frame (66 B of headers)"),
        "{out}"
    );
    let tx_line = out
        .lines()
        .find(|l| l.trim_start().starts_with("tx "))
        .unwrap_or_else(|| panic!("no summary tx line: {out}"));
    let gbps: f64 = tx_line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(gbps > 1.0, "{tx_line}");

    let o = gen(&socket, &["--gso", "udp", "--size", "65000"]);
    let (out, err) = text(&o);
    if virtnet_backend::device_features(1).contains(feature::HOST_USO) {
        assert!(o.status.success(), "{out}\n{err}");
        assert!(out.contains("gso udp: 45 segments of 1472 B"), "{out}");
    } else {
        assert!(!o.status.success(), "{out}");
        assert!(
            err.contains("the device lacks HOST_USO, needed for --gso udp"),
            "{err}"
        );
    }

    for (args, says) in [
        (&["--mss", "1000"][..], "--gso"),
        (&["--gso", "sctp"][..], "tcp or udp"),
        (&["--gso", "tcp", "--size", "1400"][..], "not a super-frame"),
        (&["--gso", "tcp", "--size", "70000"][..], "65549"),
        (&["--gso", "tcp", "--mode", "rr"][..], "txonly"),
    ] {
        let o = gen(&socket, args);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{args:?}: {out}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
