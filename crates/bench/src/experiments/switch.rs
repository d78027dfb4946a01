//! Experiment 8, guest to guest on one host (issue 39): our driver as two guests, one sending
//! as fast as it can to the other's MAC (`virtnet gen --mode txonly --dst-mac`), the other
//! receiving (`--mode rxonly`), both on CPU 0:
//! - through `virtnet switch` in this process (one worker, on CPU 1; port security on, each
//!   guest sending from its port's MAC): one copy per frame from the sender's buffers into
//!   the receiver's;
//! - with root and `ip`, through two backends on TAPs (their workers on CPU 1) that are ports
//!   of a Linux bridge, as guests on one host talk without a userspace switch.
//!
//! The rate is what the receiving guest's device delivered into its buffers while the sender
//! ran: frames per second at 64 B, and Gbit/s of TSO super-frames of 65,000 B (both guests
//! negotiate TSO: the switch passes them whole, as the bridge does).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use virtnet_backend::switch::{FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{BackendConfig, Device, IoMode};
use virtnet_driver::gen::frames::Proto;
use virtnet_driver::gen::{self, GsoConfig};

use super::common::{gen_config, join_gen, spawn_gen, spread, LocalBackend};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 8,
    name: "switch",
    summary: "guest to guest: our driver as two guests through virtnet switch, and through two backends on a Linux bridge (root): Mpps at 64 B, Gbit/s with TSO",
    run,
};

const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0x0b, 1];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0x0b, 2];

/// What goes from one guest to the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Load {
    /// 64 B frames.
    Small,
    /// TSO super-frames of 65,000 B.
    Tso,
}

impl Load {
    fn label(self) -> &'static str {
        match self {
            Load::Small => "64 B frames",
            Load::Tso => "TSO 65,000 B",
        }
    }
}

/// One run: what the receiving guest got while the sender ran.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Run {
    pub secs: f64,
    pub frames: u64,
    pub bytes: u64,
}

impl Run {
    fn mpps(&self) -> f64 {
        self.frames as f64 / self.secs / 1e6
    }
    fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.secs / 1e9
    }
}

#[derive(Debug, Serialize)]
pub struct PathResult {
    pub path: &'static str,
    pub load: Load,
    pub mpps: Summary,
    pub gbps: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub secs_per_run: f64,
    pub repeats: u32,
    pub paths: Vec<PathResult>,
    /// Why the bridge was not measured, if it was not.
    pub bridge_skipped: Option<String>,
}

/// The two guests on sockets `a` and `b`: b receives, a sends for `secs`; what b's device
/// delivered meanwhile (read from `rx_of_b`: frames, bytes).
fn two_guests(
    a: &Path,
    b: &Path,
    load: Load,
    secs: f64,
    rx_of_b: &dyn Fn() -> (u64, u64),
) -> Result<Run, BenchError> {
    // With TSO both guests negotiate it: the sender's, and the receiver's GUEST_TSO4.
    let gso = (load == Load::Tso).then_some(GsoConfig {
        proto: Proto::Tcp,
        mss: None,
        ipv6: false,
    });
    let mut rx = gen_config(b, gen::Mode::RxOnly, secs + 1.5);
    rx.src_mac = Some(MAC_B);
    rx.gso = gso;
    let receiver = spawn_gen(rx, Some(0));
    std::thread::sleep(Duration::from_millis(500));
    let mut tx = gen_config(a, gen::Mode::TxOnly, secs);
    tx.dst_mac = Some(MAC_B);
    tx.src_mac = Some(MAC_A);
    tx.gso = gso;
    if gso.is_some() {
        tx.size = 65_000;
    }
    let before = rx_of_b();
    let start = Instant::now();
    join_gen(spawn_gen(tx, Some(0)))?;
    let secs = start.elapsed().as_secs_f64();
    let after = rx_of_b();
    join_gen(receiver)?;
    Ok(Run {
        secs,
        frames: after.0 - before.0,
        bytes: after.1 - before.1,
    })
}

/// The rx queues' delivered frames and bytes of `device`.
fn delivered(device: &Device) -> (u64, u64) {
    device
        .reports()
        .iter()
        .filter(|q| q.kind == "rx")
        .fold((0, 0), |(f, b), q| {
            (f + q.counters.packets, b + q.counters.bytes)
        })
}

fn through_switch(load: Load, secs: f64) -> Result<Run, BenchError> {
    let dir = std::env::temp_dir().join(format!("virtnet-bench-switch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(BenchError::io("create a socket directory"))?;
    let s = Switch::start(SwitchConfig {
        workers: vec![Some(1)],
        uplink: None,
        fdb: FdbConfig::default(),
        device: BackendConfig {
            io: IoMode::Echo,
            ..BackendConfig::default()
        },
    })
    .map_err(BenchError::io("start the switch"))?;
    let port = |name: &str, mac| PortSpec {
        name: name.into(),
        socket: dir.join(format!("{name}.sock")),
        mac,
        queues: 1,
        client: false,
        spoof_check: true,
    };
    s.add_port(port("a", MAC_A))
        .map_err(BenchError::io("add port a"))?;
    let b = s
        .add_port(port("b", MAC_B))
        .map_err(BenchError::io("add port b"))?;
    let r = two_guests(
        &dir.join("a.sock"),
        &dir.join("b.sock"),
        load,
        secs,
        &|| delivered(&b),
    );
    s.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// Runs `ip` with `args`; an error names the command.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why the bridge cannot be measured here, if it cannot.
fn bridge_unavailable() -> Option<String> {
    // /proc/self belongs to the process's effective user.
    let root = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata("/proc/self")
            .map_err(|e| e.to_string())
            .ok()?,
    ) == 0;
    if !root {
        return Some("needs root (TAP devices and a bridge)".into());
    }
    ip(&["-V"]).err().map(|e| format!("needs iproute2 ({e})"))
}

/// A Linux bridge and its TAPs, deleted on drop.
struct Bridge {
    names: Vec<String>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = ip(&["link", "del", n]);
        }
    }
}

fn through_bridge(load: Load, secs: f64) -> Result<Run, BenchError> {
    let id = std::process::id() % 100_000;
    let (br, ta, tb) = (format!("vnb{id}"), format!("vnba{id}"), format!("vnbb{id}"));
    let backend = |tap: &str, mac| {
        LocalBackend::start(
            "bridge",
            BackendConfig {
                io: IoMode::Tap(tap.into()),
                mac,
                worker_cpu: Some(1),
                ..BackendConfig::default()
            },
        )
    };
    let a = backend(&ta, MAC_A)?;
    let b = backend(&tb, MAC_B)?;
    let mut bridge = Bridge {
        names: vec![ta.clone(), tb.clone()],
    };
    let mut setup = || -> Result<(), String> {
        ip(&["link", "add", &br, "type", "bridge"])?;
        bridge.names.push(br.clone());
        for t in [&ta, &tb] {
            ip(&["link", "set", t, "master", &br])?;
            ip(&["link", "set", t, "up"])?;
        }
        ip(&["link", "set", &br, "up"])
    };
    setup().map_err(|reason| BenchError::Engine {
        engine: "Linux bridge",
        reason,
    })?;
    let r = two_guests(&a.socket, &b.socket, load, secs, &|| delivered(&b.device));
    drop(bridge);
    r
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.3, 1) } else { (1.5, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let bridge_skipped = bridge_unavailable();
    let mut paths: Vec<(&'static str, Load, Vec<Run>)> = Vec::new();
    for load in [Load::Small, Load::Tso] {
        paths.push(("virtnet switch", load, Vec::new()));
        if bridge_skipped.is_none() {
            paths.push(("two backends, Linux bridge", load, Vec::new()));
        }
    }
    for rep in 1..=repeats {
        for (path, load, runs) in paths.iter_mut() {
            progress(&format!("[{rep}/{repeats}] {path}, {}", load.label()));
            runs.push(match *path {
                "virtnet switch" => through_switch(*load, secs)?,
                _ => through_bridge(*load, secs)?,
            });
        }
    }
    Ok(Results {
        secs_per_run: secs,
        repeats,
        paths: paths
            .into_iter()
            .map(|(path, load, runs)| PathResult {
                path,
                load,
                mpps: Summary::of_runs(runs.iter().map(Run::mpps)),
                gbps: Summary::of_runs(runs.iter().map(Run::gbps)),
                runs,
            })
            .collect(),
        bridge_skipped,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        "8. Guest to guest: our driver as two guests (sender and receiver on CPU 0), one switch worker or the backends' workers on CPU 1",
        &["path", "load", "received Mpps", "received Gbit/s"],
    );
    for p in &r.paths {
        t.row(vec![
            p.path.into(),
            p.load.label().into(),
            p.mpps.display(3),
            p.gbps.display(2),
        ]);
    }
    t.note(format!("{} of {:.1} s.", spread(r.repeats), r.secs_per_run));
    t.note("received: frames the receiving guest's device put in its buffers while the sender ran (a TSO super-frame counts once).");
    for load in [Load::Small, Load::Tso] {
        let of = |path: &str| {
            r.paths
                .iter()
                .find(|p| p.path == path && p.load == load)
                .map(|p| p.gbps.median)
        };
        if let (Some(s), Some(b)) = (of("virtnet switch"), of("two backends, Linux bridge")) {
            t.note(format!(
                "{}: the switch {:.1}x the bridge (medians).",
                load.label(),
                s / b.max(f64::MIN_POSITIVE)
            ));
        }
    }
    if let Some(why) = &r.bridge_skipped {
        t.note(format!("the bridge was not measured: {why}."));
    }
    vec![t]
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
