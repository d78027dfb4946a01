//! The device side of one run of experiment 7: the CPU time of the threads that live through
//! it (the device's), read from /proc/self/task/*/schedstat; the steal over it, from
//! /proc/stat; and the busy-poll counters of its backends.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Run;
use crate::experiments::common::LocalBackend;

/// CPU time of each live thread of the process, by thread id, in nanoseconds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct ThreadTimes(HashMap<u64, u64>);

impl ThreadTimes {
    /// Every thread but the calling one, whose time goes on reading the others' (and on
    /// starting and joining the run's threads).
    fn now() -> ThreadTimes {
        let me = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok());
        let mut times = HashMap::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for t in tasks.flatten() {
                let tid = t.file_name().to_str().and_then(|s| s.parse().ok());
                if tid == me {
                    continue;
                }
                if let (Some(tid), Some(ns)) = (tid, thread_cpu_ns(&t.path())) {
                    times.insert(tid, ns);
                }
            }
        }
        ThreadTimes(times)
    }

    /// Seconds of CPU that the threads alive now used since `earlier`; all of its time for a
    /// thread born since. A thread that has ended since counts for nothing.
    fn since(&self, earlier: &ThreadTimes) -> f64 {
        let ns: u64 = self
            .0
            .iter()
            .map(|(tid, &ns)| ns.saturating_sub(earlier.0.get(tid).copied().unwrap_or(0)))
            .sum();
        ns as f64 / 1e9
    }
}

/// One thread's CPU time from its /proc directory: schedstat's time on a CPU, or without
/// schedstats, stat's user and system clock ticks (of 10 ms).
fn thread_cpu_ns(dir: &Path) -> Option<u64> {
    let sched = std::fs::read_to_string(dir.join("schedstat")).ok();
    if let Some(ns) = sched.and_then(|s| s.split_whitespace().next()?.parse().ok()) {
        return Some(ns);
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let f: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((ticks(11)? + ticks(12)?) * 10_000_000)
}

/// Where a run's measurement starts: the threads' CPU times and the device counters.
pub(super) struct Start {
    times: ThreadTimes,
    counts: Counts,
    steal: Option<Steal>,
    pub at: Instant,
}

impl Start {
    pub(super) fn now(backends: &[LocalBackend]) -> Start {
        Start {
            times: ThreadTimes::now(),
            counts: Counts::of(backends),
            steal: Steal::now(),
            at: Instant::now(),
        }
    }
}

/// The steal time of all CPUs so far, in clock ticks (1/100 s), and how many CPUs there are.
#[derive(Clone, Copy, Debug)]
struct Steal {
    ticks: u64,
    cpus: u64,
}

impl Steal {
    fn now() -> Option<Steal> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let field = |l: &str| l.split_ascii_whitespace().nth(8)?.parse::<u64>().ok();
        let ticks = stat.lines().find(|l| l.starts_with("cpu "))?;
        let cpus = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .count() as u64;
        Some(Steal {
            ticks: field(ticks)?,
            cpus: cpus.max(1),
        })
    }

    /// Percent of all CPUs' time over `wall` that was stolen since `self`.
    fn pct_since(&self, wall: Duration) -> Option<f64> {
        let now = Steal::now()?;
        let ticks = now.ticks.saturating_sub(self.ticks) as f64;
        Some(ticks / (wall.as_secs_f64().max(1e-9) * 100.0 * self.cpus as f64) * 100.0)
    }
}

/// The device counters a run reports, summed over the queues of its backends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    frames: u64,
    entries: u64,
    hits: u64,
    timeouts: u64,
    skipped: u64,
    contended: u64,
}

impl Counts {
    fn of(backends: &[LocalBackend]) -> Counts {
        let both = |f: fn(&virtnet_backend::metrics::CountersSnapshot) -> u64| -> u64 {
            backends
                .iter()
                .map(|b| b.counter("tx", f) + b.counter("rx", f))
                .sum()
        };
        Counts {
            frames: both(|c| c.packets),
            entries: both(|c| c.busy_poll_entries),
            hits: both(|c| c.busy_poll_hits),
            timeouts: both(|c| c.busy_poll_timeouts),
            skipped: both(|c| c.busy_poll_skipped),
            contended: both(|c| c.busy_poll_contended),
        }
    }
}

/// The device side of a run, once it is over: its CPU and counters since `start`.
pub(super) fn device(run: &mut Run, backends: &[LocalBackend], start: &Start) {
    let wall = start.at.elapsed();
    run.device_cpu_s = ThreadTimes::now().since(&start.times);
    run.device_cpu_pct = run.device_cpu_s / wall.as_secs_f64().max(1e-9) * 100.0;
    let (now, before) = (Counts::of(backends), start.counts);
    run.device_frames = now.frames - before.frames;
    run.device_cpu_us_per_frame =
        (run.device_frames > 0).then(|| run.device_cpu_s * 1e6 / run.device_frames as f64);
    run.busy_poll_entries = now.entries - before.entries;
    run.busy_poll_hits = now.hits - before.hits;
    run.busy_poll_timeouts = now.timeouts - before.timeouts;
    run.busy_poll_skipped = now.skipped - before.skipped;
    run.busy_poll_contended = now.contended - before.contended;
    run.steal_pct = start.steal.and_then(|s| s.pct_since(wall)).unwrap_or(0.0);
    run.auto_budget_us = backends
        .first()
        .and_then(|b| b.device.reports().into_iter().find(|q| q.kind == "tx"))
        .map_or(0, |q| q.busy_poll_us);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_times_count_the_living_threads_since_the_first_look() {
        let times = |v: &[(u64, u64)]| ThreadTimes(v.iter().copied().collect());
        let before = times(&[(1, 1_000), (2, 5_000), (3, 9_000)]);
        // 1 ran 2 us more, 2 ended, 4 was born and ran 3 us.
        let after = times(&[(1, 3_000), (3, 9_000), (4, 3_000)]);
        assert!((after.since(&before) - 5e-6).abs() < 1e-12);
        // The other threads are found, the calling one is not.
        let other = std::thread::spawn(|| std::thread::sleep(Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(20));
        let now = ThreadTimes::now();
        assert!(!now.0.is_empty());
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        let me: u64 = me.file_name().unwrap().to_str().unwrap().parse().unwrap();
        assert!(!now.0.contains_key(&me));
        other.join().unwrap();
    }
}
