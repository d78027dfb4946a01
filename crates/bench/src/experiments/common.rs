//! Shared by experiments 1 to 5: an in-process backend on a temporary vhost-user socket, the
//! process CPU clock, and the "seed's figure beside ours" formatting.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use virtnet_backend::{BackendConfig, Device};
use virtnet_driver::gen::{self, GenConfig, GenReport};

use crate::BenchError;

/// A backend serving one socket in this process, stopped and removed on drop.
pub struct LocalBackend {
    pub device: Arc<Device>,
    pub socket: PathBuf,
    dir: PathBuf,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalBackend({})", self.socket.display())
    }
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl LocalBackend {
    pub fn start(tag: &str, config: BackendConfig) -> Result<LocalBackend, BenchError> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("virtnet-bench-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(BenchError::io("create a socket directory"))?;
        let socket = dir.join("vhost.sock");
        let listener = UnixListener::bind(&socket).map_err(BenchError::io("bind the socket"))?;
        let device = Device::new(config).map_err(BenchError::io("create the device"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (d, s) = (device.clone(), stop.clone());
        std::thread::spawn(move || virtnet_backend::serve(d, listener, s));
        Ok(LocalBackend {
            device,
            socket,
            dir,
            stop,
        })
    }

    /// Sums one backend counter over the queues of `kind` ("rx", "tx", "ctrl").
    pub fn counter(
        &self,
        kind: &str,
        f: fn(&virtnet_backend::metrics::CountersSnapshot) -> u64,
    ) -> u64 {
        self.device
            .reports()
            .iter()
            .filter(|q| q.kind == kind)
            .map(|q| f(&q.counters))
            .sum()
    }
}

impl Drop for LocalBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The accept loop checks the flag after each accept: a connection wakes it, and the
        // device and its workers go with it instead of living on, asleep, until the exit.
        let _ = std::os::unix::net::UnixStream::connect(&self.socket);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs our traffic generator against `socket`.
pub fn run_gen(config: GenConfig) -> Result<GenReport, BenchError> {
    gen::run(&config, &mut |_| {}).map_err(|e| BenchError::Engine {
        engine: "virtnet gen",
        reason: e.to_string(),
    })
}

/// Starts our traffic generator against `cfg`'s socket on a thread of its own, it and the
/// threads it starts (which inherit its CPU mask) pinned to `cpu` when one is named.
pub fn spawn_gen(
    cfg: GenConfig,
    cpu: Option<usize>,
) -> std::thread::JoinHandle<Result<GenReport, BenchError>> {
    std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            virtnet_sys::pin_thread(cpu).map_err(BenchError::io("pin the driver"))?;
        }
        run_gen(cfg)
    })
}

/// Runs our traffic generator as [`spawn_gen`] starts it, and waits for its report.
pub fn run_gen_on(cfg: GenConfig, cpu: Option<usize>) -> Result<GenReport, BenchError> {
    join_gen(spawn_gen(cfg, cpu))
}

/// Joins a generator [`spawn_gen`] started.
pub fn join_gen(
    g: std::thread::JoinHandle<Result<GenReport, BenchError>>,
) -> Result<GenReport, BenchError> {
    g.join().map_err(|_| BenchError::PeerFailed)?
}

/// A generator configuration for `socket` with our defaults.
pub fn gen_config(socket: &std::path::Path, mode: gen::Mode, secs: f64) -> GenConfig {
    GenConfig {
        socket: socket.to_path_buf(),
        mode,
        duration: Duration::from_secs_f64(secs),
        connect_wait: Duration::from_secs(5),
        ..Default::default()
    }
}

/// CPU time (user + system) of the whole process so far, in seconds, threads that have exited
/// included (from /proc/self/stat, in clock ticks of 10 ms).
pub fn process_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The seed's published before/after beside ours.
#[derive(Clone, Debug, Serialize)]
pub struct SeedComparison {
    pub metric: String,
    pub seed_before: f64,
    pub seed_after: f64,
    pub seed_ratio: f64,
    pub ours_before: f64,
    pub ours_after: f64,
    pub ours_ratio: f64,
    /// Whether our change goes the same way as the seed's (both up, both down, or both flat
    /// within 3%).
    pub same_direction: bool,
}

impl SeedComparison {
    pub fn new(metric: &str, seed: (f64, f64), ours: (f64, f64)) -> SeedComparison {
        let ratio = |(a, b): (f64, f64)| if a == 0.0 { f64::NAN } else { b / a };
        let dir = |r: f64| {
            if !r.is_finite() || (r - 1.0).abs() < 0.03 {
                0
            } else if r > 1.0 {
                1
            } else {
                -1
            }
        };
        let (sr, or) = (ratio(seed), ratio(ours));
        SeedComparison {
            metric: metric.to_string(),
            seed_before: seed.0,
            seed_after: seed.1,
            seed_ratio: sr,
            ours_before: ours.0,
            ours_after: ours.1,
            ours_ratio: or,
            same_direction: dir(sr) == dir(or),
        }
    }

    /// A note line for a table.
    pub fn note(&self, prec: usize) -> String {
        let verdict = if self.same_direction {
            "same direction as the seed".to_string()
        } else {
            "OUR DIRECTION DIFFERS FROM THE SEED'S (see docs/PERFORMANCE.md)".to_string()
        };
        format!(
            "seed: {}: {:.prec$} -> {:.prec$} ({:.2}x); ours (medians): {:.prec$} -> {:.prec$} ({:.2}x): {verdict}",
            self.metric,
            self.seed_before,
            self.seed_after,
            self.seed_ratio,
            self.ours_before,
            self.ours_after,
            self.ours_ratio
        )
    }
}

/// Per-op counts: a few significant digits, however small.
pub fn count(m: f64) -> String {
    if m == 0.0 {
        "0".into()
    } else if m >= 0.1 {
        format!("{m:.3}")
    } else {
        format!("{m:.5}")
    }
}

/// "median (min..max) of N interleaved runs" or "a single run".
pub fn spread(repeats: u32) -> String {
    if repeats > 1 {
        format!("median (min..max) of {repeats} interleaved runs")
    } else {
        "a single run".to_string()
    }
}
