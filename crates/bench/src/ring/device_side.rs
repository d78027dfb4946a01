//! The device side alone, in one thread: the driver adds a batch of 64 chains, the device pops
//! them all, returns them used and decides on a notification, the driver reclaims them. Only
//! the device's part is timed, so the figure is the engine's device-side cost per descriptor
//! with everything hot in cache: no cross-core traffic, no waiting.
//!
//! Each round is timed on its own. On a shared machine a round is now and then interrupted by
//! the scheduler, which adds milliseconds to a round of a few microseconds; rounds longer than
//! [`OUTLIER_FACTOR`] times the median round are left out of the figure (and counted), so the
//! figure is the engine's cost, not the neighbours'. On a quiet machine none are left out.

use std::time::{Duration, Instant};

use serde::Serialize;
use vring::Features;

use super::{ChainBufs, ChainShape, DeviceCounts, RingDevice, RingMemory};
use crate::BenchError;

/// Chains per round: the used batch, and what the device pops between two driver turns.
pub const BATCH: u16 = 64;

/// A round longer than this many median rounds was interrupted (preempted, or the vCPU was
/// descheduled): no engine takes ten times its usual time for the same 64 chains.
pub const OUTLIER_FACTOR: u64 = 10;

/// One device-side run.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub shape: ChainShape,
    /// Rounds of [`BATCH`] chains, at most.
    pub rounds: u64,
    /// Stop once this long has passed (checked every 256 rounds).
    pub deadline: Option<Duration>,
}

/// What one run measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Run {
    pub engine: &'static str,
    pub shape: ChainShape,
    pub chains: u64,
    pub descriptors: u64,
    /// Time spent in the device's part of the loop, over the rounds kept.
    pub device_secs: f64,
    /// Rounds kept, and rounds left out as interrupted (see [`OUTLIER_FACTOR`]).
    pub rounds_kept: u64,
    pub rounds_interrupted: u64,
    /// Device time over every round, interrupted ones included.
    pub device_secs_all: f64,
    /// Time of the whole loop, driver included.
    pub total_secs: f64,
    pub device: DeviceCounts,
}

impl Run {
    /// Millions of descriptors popped and returned per second of device time (rounds kept).
    pub fn mdesc_per_sec(&self) -> f64 {
        let descs = self.descriptors as f64 * self.rounds_kept as f64 / self.rounds() as f64;
        descs / self.device_secs / 1e6
    }
    /// Nanoseconds of device time per chain (rounds kept).
    pub fn ns_per_chain(&self) -> f64 {
        self.device_secs * 1e9 / (self.rounds_kept * BATCH as u64) as f64
    }
    fn rounds(&self) -> u64 {
        self.rounds_kept + self.rounds_interrupted
    }
}

/// The features of the device-side workload: event idx on, direct chains.
pub const FEATURES: Features = Features::RING_EVENT_IDX;

/// Runs `cfg` with our driver on `ring` and `device` on the device side.
pub fn run<D: RingDevice>(
    ring: &RingMemory,
    mut device: D,
    cfg: &Config,
) -> Result<Run, BenchError> {
    let mut driver = ring.driver()?;
    device.set_used_batch(BATCH);
    // The driver polls for completions: no used_event store per reclaimed chain.
    driver.disable_cb();
    let bufs = ChainBufs::new(cfg.shape);
    let (mut chains, mut descriptors) = (0u64, 0u64);
    let mut round_ns: Vec<u64> = Vec::with_capacity(cfg.rounds as usize);
    let t0 = Instant::now();
    for round in 0..cfg.rounds {
        if round % 256 == 255 && cfg.deadline.is_some_and(|d| t0.elapsed() >= d) {
            break;
        }
        for i in 0..BATCH {
            let token = (round as u32).wrapping_mul(BATCH as u32) + i as u32;
            if !bufs.add(&mut driver, token)? {
                return Err(BenchError::Inconsistent("ring full at round start".into()));
            }
        }
        driver.kick_prepare();

        let t = Instant::now();
        let (n, descs) = device_round(&mut device)?;
        round_ns.push(t.elapsed().as_nanos() as u64);
        descriptors += descs;

        let mut got = 0u16;
        while driver.get_used()?.is_some() {
            got += 1;
        }
        if n != BATCH || got != BATCH {
            return Err(BenchError::Inconsistent(format!(
                "round {round}: popped {n}, reclaimed {got} of {BATCH}"
            )));
        }
        chains += BATCH as u64;
    }
    let total_secs = t0.elapsed().as_secs_f64();
    let (kept, interrupted) = split_interrupted(&mut round_ns);
    Ok(Run {
        engine: D::NAME,
        shape: cfg.shape,
        chains,
        descriptors,
        device_secs: kept.iter().sum::<u64>() as f64 / 1e9,
        rounds_kept: kept.len() as u64,
        rounds_interrupted: interrupted.len() as u64,
        device_secs_all: round_ns.iter().sum::<u64>() as f64 / 1e9,
        total_secs,
        device: device.counts(),
    })
}

/// Sorts the round times and splits them into the kept ones and the interrupted ones.
fn split_interrupted(round_ns: &mut [u64]) -> (&[u64], &[u64]) {
    round_ns.sort_unstable();
    let median = round_ns.get(round_ns.len() / 2).copied().unwrap_or(0);
    let cut = round_ns.partition_point(|&t| t <= median.max(1) * OUTLIER_FACTOR);
    round_ns.split_at(cut)
}

/// The device's part of one round: pop every chain, return it used, decide on a notification.
/// Returns the chains and descriptors handled. Never inlined, so that a profiler can count
/// exactly this (`valgrind --tool=callgrind --toggle-collect='*device_round*'`).
#[inline(never)]
pub fn device_round<D: RingDevice>(device: &mut D) -> Result<(u16, u64), BenchError> {
    let (mut chains, mut descriptors) = (0u16, 0u64);
    while let Some(p) = device.pop()? {
        device.add_used(p.head, p.writable)?;
        descriptors += p.descriptors as u64;
        chains += 1;
    }
    device.needs_notification()?;
    Ok((chains, descriptors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_far_above_the_median_are_left_out() {
        let mut t = vec![100, 90, 5_000_000, 110, 100, 1_001, 100];
        let (kept, out) = split_interrupted(&mut t);
        // Median 100: up to 1000 is kept.
        assert_eq!(kept, &[90, 100, 100, 100, 110]);
        assert_eq!(out, &[1_001, 5_000_000]);
    }

    #[test]
    fn one_used_idx_store_per_batch() {
        for shape in [ChainShape::ONE, ChainShape::FOUR] {
            let ring = RingMemory::new(FEATURES).unwrap();
            let device = ring.vring_device().unwrap();
            let cfg = Config {
                shape,
                rounds: 100,
                deadline: None,
            };
            let r = run(&ring, device, &cfg).unwrap();
            assert_eq!(r.chains, 6400);
            assert_eq!(r.descriptors, 6400 * shape.descriptors() as u64);
            assert_eq!(r.device.used_idx_stores, 100);
            assert_eq!(r.rounds_kept + r.rounds_interrupted, 100);
        }
    }
}
