//! Experiment 7, busy polling across loads: the backend's busy polling off, fixed at 10, 50 or
//! 100 us, or auto, under five loads, to see where each setting pays and what it costs, and
//! whether auto keeps the gains of the best fixed timeout without the costs:
//!
//! - idle: our driver connected (its rx buffers posted), no traffic: the device's CPU;
//! - rr: request-response through echo io (`gen rr`, 64 B, one in flight, the driver sleeping
//!   on interrupts), as experiment 3: transactions/s, p50, p99;
//! - stream: `gen txonly`, 1500 B, into null io, the driver sleeping on interrupts: Gbit/s;
//! - contended: two backends whose workers are pinned to one CPU, two rr loads at once, as
//!   experiment 3b: aggregate transactions/s;
//! - bursty: rr in bursts, [`ON_OFF`] (2 ms of round trips, 8 ms of silence, `gen --on-off
//!   2:8`): transactions/s, p99.
//!
//! Device CPU, for every load: the CPU time of the threads that live through the run but the
//! measuring one, which are the device's (its workers, its vhost-user and control threads, the
//! peer-fd watchdog), read from /proc/self/task/*/schedstat to the nanosecond. The driver's
//! threads have exited by then and their time with them: this is experiment 3's "process CPU
//! minus the driver's threads", without its 10 ms clock ticks and the bench's own time. Per
//! frame, it is divided by the frames the device moved (tx and rx).
//!
//! The parts: the loads and one run of each (`loads`), the device's side of a run (its
//! threads' CPU, steal, the busy-poll counters: `device_side`), the sweep of every load at
//! every setting ([`measure`], in `sweep`), auto held against the sweep's best on fresh runs in
//! paired rounds (`fresh`), and the tables (`tables`).

use std::time::Duration;

use serde::Serialize;
use virtnet_backend::BusyPoll;
use virtnet_driver::gen::OnOff;

use super::{Experiment, Options, Outcome, Progress};
use crate::BenchError;

mod device_side;
mod fresh;
mod loads;
mod sweep;
mod tables;

pub use fresh::Fresh;
pub use loads::{Load, Run, LOADS};
pub use sweep::{measure, LoadResult, SettingResult};
pub use tables::tables;

pub const EXPERIMENT: Experiment = Experiment {
    id: 7,
    name: "poll-loads",
    summary: "busy polling off, fixed 10/50/100 us and auto across loads: idle, rr, stream, contended, bursty",
    run,
};

pub const SETTINGS: [BusyPoll; 5] = [
    BusyPoll::Off,
    BusyPoll::Fixed(10),
    BusyPoll::Fixed(50),
    BusyPoll::Fixed(100),
    BusyPoll::Auto,
];

/// The bursty load's schedule.
pub const ON_OFF: OnOff = OnOff {
    on: Duration::from_millis(2),
    off: Duration::from_millis(8),
};
/// Stream frames, in bytes.
pub const STREAM_FRAME: usize = 1500;
/// The CPU the contended load's two workers share, and the one its two drivers share (with
/// two CPUs or more): as the seed pins each VM's vCPU away from the vhost threads' CPU.
pub const CONTENDED_CPU: usize = 0;
pub const CONTENDED_DRIVERS_CPU: usize = 1;
/// Fresh comparisons alternate auto and the other setting this many times per repeat, in
/// runs this many times shorter than the sweep's (a quarter of a second): more alternations
/// in the same time, so the machine's drift (its rates here move between levels every few
/// seconds, whichever setting runs) falls more often between two rounds than inside one, and
/// the median of the rounds' ratios has enough of them to resolve 5% (bursty's paired ratios
/// spread by about 13% a round on AMD EPYC family 26: the median of 24 has a standard error
/// of about 3%, of 6 about 7%).
pub const FRESH_ROUNDS_PER_REPEAT: u32 = 8;

#[derive(Debug, Serialize)]
pub struct Results {
    pub secs_per_run: f64,
    pub repeats: u32,
    /// The fresh comparisons' rounds and run length: [`FRESH_ROUNDS_PER_REPEAT`] times as many
    /// rounds as repeats, each run as much shorter, so they take the sweep's time per pair.
    pub fresh_rounds: u32,
    pub fresh_secs_per_run: f64,
    /// Drivers on CPU 0, workers on CPU 1 (idle, rr, stream, bursty); contended: the two
    /// workers on `contended_cpu`, the two drivers on `contended_drivers_cpu`.
    pub pinned: bool,
    pub contended_cpu: usize,
    pub contended_drivers_cpu: usize,
    pub on_off: OnOff,
    pub loads: Vec<LoadResult>,
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}
