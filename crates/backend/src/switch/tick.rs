//! Time as the switch's callers pass it in: the FDB never reads a clock, so tests set it.

use std::time::{Duration, Instant};

/// A point in time as the caller's monotonic clock reads it, in milliseconds from an origin of
/// its choosing: [`Tick::since`] an `Instant`, or any counter in tests. The FDB never reads a
/// clock itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(u64);

impl Tick {
    pub const fn from_millis(ms: u64) -> Tick {
        Tick(ms)
    }

    pub const fn millis(self) -> u64 {
        self.0
    }

    /// `now` as milliseconds since `epoch` (0 if `now` is earlier).
    pub fn since(epoch: Instant, now: Instant) -> Tick {
        Tick(millis(now.saturating_duration_since(epoch)))
    }

    /// `d` later.
    pub fn after(self, d: Duration) -> Tick {
        Tick(self.0.saturating_add(millis(d)))
    }

    /// Milliseconds from `earlier` to `self`; 0 if `earlier` is later (workers' clocks are
    /// read at slightly different times).
    pub(super) fn elapsed_since(self, earlier: u64) -> u64 {
        self.0.saturating_sub(earlier)
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_milliseconds_and_never_run_backwards() {
        let epoch = Instant::now();
        let t = Tick::since(epoch, epoch + Duration::from_millis(1_500));
        assert_eq!(t, Tick::from_millis(1_500));
        assert_eq!(
            Tick::since(epoch + Duration::from_secs(1), epoch),
            Tick::default()
        );
        assert_eq!(t.after(Duration::from_secs(2)).millis(), 3_500);
        assert_eq!(t.after(Duration::MAX).millis(), u64::MAX);
        assert_eq!((t.elapsed_since(500), t.elapsed_since(2_000)), (1_000, 0));
    }
}
