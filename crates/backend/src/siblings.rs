//! The workers of this process pinned to each CPU, so that one worker's contention check can
//! tell the time its siblings (other workers, which busy-poll under the same policy and end a
//! poll as soon as another task wants the CPU) took its CPU from the time other tasks did.
//! Busy polling pays between siblings (experiment 3b: two workers on one CPU, 10× the
//! transactions of polling off on AMD EPYC); it must stop for anything else.
//!
//! Each worker opens its own /proc/thread-self/schedstat before seccomp forbids opening, and
//! puts it here; the others read it with `pread`, which the filter allows.

use std::sync::{Arc, Mutex, Weak};

use virtnet_sys::{Sched, SchedStat};

/// Every registered worker: its CPU and its schedstat, while it lives.
static PINNED: Mutex<Vec<(usize, Weak<SchedStat>)>> = Mutex::new(Vec::new());

/// One worker's place in the registry; it leaves when dropped.
#[derive(Debug)]
pub struct Sibling {
    cpu: Option<usize>,
    own: Arc<SchedStat>,
}

impl Sibling {
    /// Registers the calling thread's `own` schedstat, as pinned to `cpu` (None: not pinned,
    /// so no other worker is known to share its CPU, and it knows of none).
    pub fn join(cpu: Option<usize>, own: SchedStat) -> Sibling {
        let own = Arc::new(own);
        if let Some(cpu) = cpu {
            let mut all = PINNED.lock().unwrap_or_else(|e| e.into_inner());
            all.retain(|(_, w)| w.strong_count() > 0);
            all.push((cpu, Arc::downgrade(&own)));
        }
        Sibling { cpu, own }
    }

    /// This worker's figures, and the nanoseconds the other workers pinned to its CPU have
    /// run so far (a sum over those alive now: it drops when one leaves).
    pub fn sample(&self) -> Option<(Sched, u64)> {
        let own = self.own.sample()?;
        let Some(cpu) = self.cpu else {
            return Some((own, 0));
        };
        let all = PINNED.lock().unwrap_or_else(|e| e.into_inner());
        let siblings = all
            .iter()
            .filter(|(c, _)| *c == cpu)
            .filter_map(|(_, w)| w.upgrade())
            .filter(|s| !Arc::ptr_eq(s, &self.own))
            .filter_map(|s| s.sample())
            .map(|s| s.ran_ns)
            .sum();
        Some((own, siblings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until the calling thread has run `ms` milliseconds of CPU time.
    fn spin(ms: u64) {
        let t = virtnet_sys::thread_cpu_ns();
        while virtnet_sys::thread_cpu_ns() - t < ms * 1_000_000 {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_worker_sees_the_time_its_siblings_on_its_cpu_ran_and_not_the_others() {
        // Three threads: two "pinned to CPU 7" (only the registry's word: they run anywhere),
        // one to CPU 6. Each spins 50 ms of CPU time once registered, hands its registration
        // over, and lives on (a thread's schedstat reads only while it lives) until told to end.
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = [7, 7, 6]
            .into_iter()
            .enumerate()
            .map(|(i, cpu)| {
                let (tx, done) = (tx.clone(), done.clone());
                std::thread::spawn(move || {
                    let me = Sibling::join(Some(cpu), SchedStat::open().unwrap());
                    spin(50);
                    tx.send((i, me)).unwrap();
                    done.wait();
                })
            })
            .collect();
        let mut workers: Vec<(usize, Sibling)> = rx.iter().take(3).collect();
        workers.sort_by_key(|(i, _)| *i);
        let mut workers = workers.into_iter().map(|(_, w)| w);
        let (a, b, c) = (
            workers.next().unwrap(),
            workers.next().unwrap(),
            workers.next().unwrap(),
        );
        let (own, siblings) = a.sample().unwrap();
        let b_ran = b.own.sample().unwrap().ran_ns;
        assert!(own.ran_ns >= 40_000_000, "{own:?}");
        // b spins no more: its total is what a read just now sees, within a tick.
        assert!(siblings >= 40_000_000, "{siblings}");
        assert!(
            siblings.abs_diff(b_ran) < 5_000_000,
            "{siblings} against {b_ran}"
        );
        assert_eq!(c.sample().unwrap().1, 0, "alone on CPU 6");
        // One leaves: the other has no sibling any more.
        drop(b);
        assert_eq!(a.sample().unwrap().1, 0);
        // Not pinned: none known.
        let loose = Sibling::join(None, SchedStat::open().unwrap());
        assert_eq!(loose.sample().unwrap().1, 0);
        done.wait();
        threads.into_iter().for_each(|t| t.join().unwrap());
    }
}
