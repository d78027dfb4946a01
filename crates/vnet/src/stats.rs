//! Counters, the one way both halves count: lock-free counter types, a broken state, and
//! [`counters!`](crate::counters), which declares a struct of counters together with its
//! point-in-time snapshot (serialised as JSON) and its field names (for Prometheus).
//!
//! Observations only: what a queue is told to do (busy-poll timeouts, coalescing) is kept
//! apart, by whoever owns it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// A counter with one writer and any number of readers. The writer's increment is a plain
/// load and store, not a locked read-modify-write: a locked add on the data path would wait
/// for the stores to shared memory before it to drain.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the owning thread may call it.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    /// Sets the value (a gauge). Only the owning thread may call it.
    #[inline]
    pub fn set(&self, n: u64) {
        self.0.store(n, Relaxed);
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A counter any thread may bump, with a locked add: for objects several threads drive (the
/// driver's control queue takes commands from many).
#[derive(Default)]
pub struct SharedCounter(AtomicU64);

impl SharedCounter {
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    /// Raises the value to `n` if it is below (a high-water mark).
    #[inline]
    pub fn max(&self, n: u64) {
        self.0.fetch_max(n, Relaxed);
    }
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

macro_rules! value_traits {
    ($t:ty) => {
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.get())
            }
        }
        impl PartialEq<u64> for $t {
            fn eq(&self, other: &u64) -> bool {
                self.get() == *other
            }
        }
        impl PartialEq<$t> for u64 {
            fn eq(&self, other: &$t) -> bool {
                *self == other.get()
            }
        }
    };
}
value_traits!(Counter);
value_traits!(SharedCounter);

/// A queue's broken state: set once, with the first reason, when the peer broke the queue;
/// cleared when the queue is rebuilt.
#[derive(Debug, Default)]
pub struct Broken {
    flag: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Broken {
    /// Records that the queue broke. Returns true the first time, so the caller logs once.
    pub fn set(&self, reason: String) -> bool {
        let first = !self.flag.swap(true, Relaxed);
        if first {
            if let Ok(mut r) = self.reason.lock() {
                *r = Some(reason);
            }
        }
        first
    }

    /// Clears the state (the queue was rebuilt).
    pub fn clear(&self) {
        self.flag.store(false, Relaxed);
        if let Ok(mut r) = self.reason.lock() {
            *r = None;
        }
    }

    /// Whether the queue is broken: one relaxed load, cheap enough for every turn.
    #[inline]
    pub fn is_set(&self) -> bool {
        self.flag.load(Relaxed)
    }

    /// Why the queue broke, if it did.
    pub fn reason(&self) -> Option<String> {
        if !self.is_set() {
            return None;
        }
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}

/// Declares a struct of counters and its snapshot:
///
/// ```
/// vnet::counters! {
///     /// Counters of one queue.
///     pub struct Counts / CountsSnapshot {
///         /// Frames moved.
///         packets,
///         bytes,
///     }
/// }
/// let c = Counts::default();
/// c.packets.add(2);
/// assert_eq!(c.snapshot().packets, 2);
/// assert_eq!(c.snapshot().fields()[1], ("bytes", 0));
/// assert_eq!(CountsSnapshot::descriptions()[1], ("bytes", "Frames moved."));
/// ```
///
/// - The struct has one public [`Counter`] per field (`of SharedCounter` after the snapshot's
///   name picks that type), and `snapshot()`.
/// - The snapshot has one `u64` per field, `fields()` (name, value) in declaration order for
///   Prometheus, `since(&earlier)` and `accumulate(&other)`, and serialises as JSON.
/// - `descriptions()` gives each field's doc comment, Prometheus's HELP text. A doc comment
///   covers the undocumented fields after it (`packets, bytes` above share one).
/// - `with broken` after the names adds a [`Broken`] state: the struct gets `set_broken`,
///   `is_broken`, `broken_reason`, `clear_broken`, and the snapshot a `broken: Option<String>`.
#[macro_export]
macro_rules! counters {
    // The four spellings, normalised: the counter type, and the snapshot's derives (a snapshot
    // with a broken reason holds a String, so it is not Copy).
    (
        $(#[$m:meta])* $vis:vis struct $name:ident / $snap:ident of $cty:ident
        with $broken:ident { $($body:tt)* }
    ) => {
        $crate::counters!(@build [$(#[$m])*] [$vis] $name $snap $cty [$broken] [] { $($body)* });
    };
    (
        $(#[$m:meta])* $vis:vis struct $name:ident / $snap:ident of $cty:ident
        { $($body:tt)* }
    ) => {
        $crate::counters!(@build [$(#[$m])*] [$vis] $name $snap $cty [] [Copy] { $($body)* });
    };
    (
        $(#[$m:meta])* $vis:vis struct $name:ident / $snap:ident with $broken:ident
        { $($body:tt)* }
    ) => {
        $crate::counters!(
            @build [$(#[$m])*] [$vis] $name $snap Counter [$broken] [] { $($body)* }
        );
    };
    (
        $(#[$m:meta])* $vis:vis struct $name:ident / $snap:ident { $($body:tt)* }
    ) => {
        $crate::counters!(@build [$(#[$m])*] [$vis] $name $snap Counter [] [Copy] { $($body)* });
    };
    // A field's doc comment as one string: its `doc` attributes joined, others skipped.
    (@doc) => { "" };
    (@doc [doc = $line:literal] $($rest:tt)*) => {
        concat!($line, $crate::counters!(@doc $($rest)*))
    };
    (@doc [$($other:tt)*] $($rest:tt)*) => { $crate::counters!(@doc $($rest)*) };
    (
        @build [$($attr:tt)*] [$vis:vis] $name:ident $snap:ident $cty:ident
        [$($broken:ident)?] [$($copy:ident)?]
        { $($(#[$($fm:tt)*])* $f:ident),* $(,)? }
    ) => {
        $($attr)*
        #[derive(Debug, Default)]
        $vis struct $name {
            $($(#[$($fm)*])* pub $f: $crate::stats::$cty,)*
            $($broken: $crate::stats::Broken,)?
        }

        #[doc = concat!("A point-in-time copy of [`", stringify!($name), "`].")]
        #[derive(Clone, $($copy,)? Debug, Default, PartialEq, Eq, serde::Serialize)]
        $vis struct $snap {
            $(pub $f: u64,)*
            $(
                /// Why the queue broke, if it did.
                pub $broken: Option<String>,
            )?
        }

        impl $name {
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $($f: self.$f.get(),)*
                    $($broken: self.$broken.reason(),)?
                }
            }
            $(
                /// Records that the queue broke; returns true the first time (log once).
                pub fn set_broken(&self, reason: String) -> bool {
                    self.$broken.set(reason)
                }
                pub fn is_broken(&self) -> bool {
                    self.$broken.is_set()
                }
                pub fn broken_reason(&self) -> Option<String> {
                    self.$broken.reason()
                }
                /// Clears the broken state (the queue was rebuilt).
                pub fn clear_broken(&self) {
                    self.$broken.clear()
                }
            )?
        }

        impl $snap {
            /// (name, value) of every counter, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($f), self.$f),)*]
            }
            /// (name, doc comment) of every counter, in declaration order. A field without
            /// a doc comment has the one of the field before it (empty for none).
            pub fn descriptions() -> Vec<(&'static str, &'static str)> {
                let own = [$((stringify!($f), $crate::counters!(@doc $([$($fm)*])*)),)*];
                let mut last = "";
                own.into_iter()
                    .map(|(name, doc)| {
                        let doc = doc.trim();
                        if !doc.is_empty() {
                            last = doc;
                        }
                        (name, last)
                    })
                    .collect()
            }
            /// The counts accumulated since `earlier`.
            pub fn since(&self, earlier: &$snap) -> $snap {
                $snap {
                    $($f: self.$f.wrapping_sub(earlier.$f),)*
                    $($broken: self.$broken.clone(),)?
                }
            }
            /// Sums `other` into `self` (totals over queues).
            pub fn accumulate(&mut self, other: &$snap) {
                $(self.$f = self.$f.wrapping_add(other.$f);)*
                $(
                    if self.$broken.is_none() {
                        self.$broken = other.$broken.clone();
                    }
                )?
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::counters! {
        /// For the tests.
        pub struct Counts / CountsSnapshot with broken {
            /// Frames moved,
            /// and their bytes.
            packets,
            bytes,
        }
    }

    crate::counters! {
        pub struct Shared / SharedSnapshot of SharedCounter {
            #[allow(unused)]
            /// Other attributes are skipped.
            submitted,
        }
    }

    #[test]
    fn descriptions_are_doc_comments_and_cover_the_fields_after_them() {
        let both = "Frames moved, and their bytes.";
        assert_eq!(
            CountsSnapshot::descriptions(),
            [("packets", both), ("bytes", both)]
        );
        assert_eq!(
            SharedSnapshot::descriptions(),
            [("submitted", "Other attributes are skipped.")]
        );
    }

    #[test]
    fn snapshots_difference_and_totals() {
        let c = Counts::default();
        c.packets.add(3);
        c.bytes.add(300);
        let a = c.snapshot();
        c.packets.add(2);
        let b = c.snapshot();
        assert_eq!(b.since(&a).packets, 2);
        assert_eq!(b.since(&a).bytes, 0);
        assert_eq!(c.packets, 5);
        assert_eq!(5, c.packets);
        let mut t = CountsSnapshot::default();
        t.accumulate(&a);
        t.accumulate(&b);
        assert_eq!((t.packets, t.bytes), (8, 600));
        assert_eq!(b.fields(), [("packets", 5), ("bytes", 300)]);
    }

    #[test]
    fn broken_keeps_the_first_reason_until_cleared() {
        let c = Counts::default();
        assert!(!c.is_broken() && c.snapshot().broken.is_none());
        assert!(c.set_broken("first".into()));
        assert!(!c.set_broken("second".into()));
        assert_eq!(c.snapshot().broken.as_deref(), Some("first"));
        c.clear_broken();
        assert_eq!(c.broken_reason(), None);
        assert!(c.set_broken("again".into()));
    }

    #[test]
    fn shared_counters_take_adds_from_many_threads_and_a_high_water_mark() {
        let s = std::sync::Arc::new(Shared::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || (0..1000).for_each(|_| s.submitted.add(1)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let total = s.snapshot();
        assert_eq!(total.submitted, 4000);
        assert_eq!(
            total.since(&SharedSnapshot::default()).fields(),
            [("submitted", 4000)]
        );
        let mut sum = total;
        sum.accumulate(&total);
        assert_eq!(sum.submitted, 8000);
        let m = SharedCounter::default();
        m.max(3);
        m.max(2);
        assert_eq!(m.get(), 3);
        let g = Counter::default();
        g.set(7);
        assert_eq!(g.get(), 7);
    }
}
