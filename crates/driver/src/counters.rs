//! Per-queue driver counters: lock-free, written by the one thread that owns the queue and
//! read at any time by others (`virtnet gen`'s rate lines, DIM's sampler, tests).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use serde::Serialize;

/// A counter with one writer and any number of readers. The writer's increment is a plain
/// load and store, not a locked read-modify-write: nobody else writes it.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning thread may call it.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

impl PartialEq<u64> for Counter {
    fn eq(&self, other: &u64) -> bool {
        self.get() == *other
    }
}

impl PartialEq<Counter> for u64 {
    fn eq(&self, other: &Counter) -> bool {
        *self == other.get()
    }
}

macro_rules! queue_counters {
    ($($(#[$m:meta])* $f:ident),* $(,)?) => {
        /// The counters of one driver queue (rx or tx).
        #[derive(Debug, Default)]
        pub struct QueueCounters {
            $($(#[$m])* pub $f: Counter,)*
            broken: AtomicBool,
            broken_reason: OnceLock<String>,
        }

        /// A point-in-time copy of [`QueueCounters`].
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct CountersSnapshot {
            $(pub $f: u64,)*
            /// Why the device broke the queue, if it did.
            pub broken: Option<String>,
        }

        impl QueueCounters {
            pub fn snapshot(&self) -> CountersSnapshot {
                CountersSnapshot {
                    $($f: self.$f.get(),)*
                    broken: self.broken_reason(),
                }
            }
        }

        impl CountersSnapshot {
            /// The counters accumulated since `earlier`.
            pub fn since(&self, earlier: &CountersSnapshot) -> CountersSnapshot {
                CountersSnapshot {
                    $($f: self.$f.wrapping_sub(earlier.$f),)*
                    broken: self.broken.clone(),
                }
            }
            /// Sums `other` into `self` (for totals over queues).
            pub fn accumulate(&mut self, other: &CountersSnapshot) {
                $(self.$f = self.$f.wrapping_add(other.$f);)*
                if self.broken.is_none() {
                    self.broken = other.broken.clone();
                }
            }
        }
    };
}

queue_counters!(
    /// Frames moved (tx: handed to the device; rx: received) and their bytes, header excluded.
    packets,
    bytes,
    /// Kicks written to the device's kick eventfd.
    kicks,
    /// Call eventfd reads that found a notification (interrupts).
    interrupts,
    /// tx: times the queue stopped for lack of descriptors or buffers, and restarts.
    stops,
    wakes,
    /// tx: frames that found the ring full and were not sent (the caller retries them); only
    /// with capacity stop/wake off, else the queue stops before the ring fills.
    ring_full,
    /// tx: completions reclaimed.
    completed,
    /// rx: frames dropped because the device described them badly (short, bad num_buffers).
    dropped,
    /// rx: NAPI rounds, and rounds whose re-check after enabling callbacks found more work.
    polls,
    rechecks,
    /// tx: frames sent with checksum offload (NEEDS_CSUM) and with segmentation offload (GSO).
    csum_offloaded,
    gso_offloaded,
);

impl QueueCounters {
    /// Records that the device broke the queue; the first reason is kept.
    pub fn set_broken(&self, reason: String) {
        let _ = self.broken_reason.set(reason);
        self.broken.store(true, Relaxed);
    }
    pub fn is_broken(&self) -> bool {
        self.broken.load(Relaxed)
    }
    pub fn broken_reason(&self) -> Option<String> {
        self.broken_reason.get().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_snapshot_and_difference() {
        let c = QueueCounters::default();
        c.packets.add(3);
        c.bytes.add(300);
        let a = c.snapshot();
        c.packets.add(2);
        let b = c.snapshot();
        assert_eq!(b.since(&a).packets, 2);
        assert_eq!(b.since(&a).bytes, 0);
        assert_eq!(c.packets, 5);
        assert_eq!(5, c.packets);
        let mut t = CountersSnapshot::default();
        t.accumulate(&a);
        t.accumulate(&b);
        assert_eq!(t.packets, 8);
        assert!(!c.is_broken());
        c.set_broken("first".into());
        c.set_broken("second".into());
        assert_eq!(c.snapshot().broken.as_deref(), Some("first"));
    }
}
