//! How soon a device that is finding work looks at the avail ring again.
//!
//! A device that drains the ring and looks again at once, while the driver is adding chains
//! one or two at a time, finds one or two chains per look. Each look reads `avail.idx` and
//! each drain writes `used.idx`: the cache lines the driver writes after every add and reads
//! before every kick decision. The two sides then trade those lines for every chain, and
//! both slow down (on AMD EPYC Zen 5, a ping-pong without EVENT_IDX ran at 0.85x of a
//! device that looks less often). A short pause between looks that keep finding little lets
//! the driver add a few chains undisturbed, and the next look takes them all.
//!
//! The rule, per look:
//! - **fewer than [`PollPace::FEW`]**, the look before also found some: double the pause,
//!   up to [`PollPace::MAX_PAUSES`] spin-loop hints (a few hundred nanoseconds);
//! - **[`PollPace::FEW`] or more**: halve the pause; a driver that adds in bursts never
//!   sees one;
//! - **none, right after a paced look**: the driver is likely mid-add. Look once more after
//!   the longest pause, before the caller polls or arms notifications: a sleep costs the
//!   driver a kick and the device a wake-up, microseconds against the pause's nanoseconds;
//! - **none otherwise**: no pause; the caller polls or sleeps.

use std::hint::spin_loop;

/// The pause a device takes between looks at a ring that keeps having a little work.
#[derive(Debug, Clone, Default)]
pub struct PollPace {
    pauses: u32,
    last_hit: bool,
}

impl PollPace {
    /// A look that finds this many chains or more is a burst: the pause shrinks.
    pub const FEW: u64 = 4;
    /// The longest pause, in spin-loop hints.
    pub const MAX_PAUSES: u32 = 16;

    /// No pause until looks have found a little work twice in a row.
    pub const fn new() -> Self {
        Self {
            pauses: 0,
            last_hit: false,
        }
    }

    /// Records what a look found, `n` chains (or frames), and says whether to [`wait`] and
    /// look again.
    ///
    /// [`wait`]: PollPace::wait
    #[inline]
    pub fn found(&mut self, n: u64) -> bool {
        if n == 0 {
            let linger = self.last_hit && self.pauses > 0;
            self.pauses = if linger { Self::MAX_PAUSES } else { 0 };
            self.last_hit = false;
            return linger;
        }
        if n >= Self::FEW {
            self.pauses /= 2;
        } else if self.last_hit {
            self.pauses = (self.pauses * 2).clamp(1, Self::MAX_PAUSES);
        }
        self.last_hit = true;
        true
    }

    /// Pauses before the next look, as long as the looks so far call for.
    #[inline]
    pub fn wait(&self) {
        for _ in 0..self.pauses {
            spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(looks: &[u64]) -> u32 {
        let mut p = PollPace::new();
        for &n in looks {
            assert_eq!(p.found(n), n > 0 || p.pauses > 0, "after {looks:?}");
        }
        p.pauses
    }

    #[test]
    fn the_pause_grows_while_looks_keep_finding_a_little() {
        assert_eq!(after(&[1]), 0, "one look is not a pattern");
        assert_eq!(after(&[1, 2]), 1);
        assert_eq!(after(&[1, 2, 1]), 2);
        assert_eq!(after(&[1, 2, 1, 3, 1]), 8);
    }

    #[test]
    fn the_pause_is_capped() {
        assert_eq!(after(&[1; 100]), PollPace::MAX_PAUSES);
    }

    #[test]
    fn an_empty_look_after_a_paced_one_lingers_once() {
        let mut p = PollPace::new();
        [1, 1, 1].into_iter().for_each(|n| assert!(p.found(n)));
        assert_eq!(p.pauses, 2);
        assert!(p.found(0), "look again");
        assert_eq!(p.pauses, PollPace::MAX_PAUSES, "after the longest pause");
        assert!(!p.found(0), "then stop");
        assert_eq!(p.pauses, 0);
        assert!(!p.found(0));
    }

    #[test]
    fn an_empty_look_without_a_pause_stops_at_once() {
        let mut p = PollPace::new();
        assert!(!p.found(0));
        assert!(p.found(1));
        assert!(!p.found(0), "one hit is not a pattern");
        assert!(p.found(32));
        assert!(!p.found(0), "a burst is not paced");
    }

    #[test]
    fn a_lingering_look_that_finds_work_keeps_the_pause() {
        assert_eq!(after(&[1, 1, 1, 0, 1]), PollPace::MAX_PAUSES);
        assert_eq!(after(&[1, 1, 1, 0, 1, 1]), PollPace::MAX_PAUSES);
        assert_eq!(
            after(&[1, 1, 1, 0, 0, 1, 1]),
            1,
            "after a stop it starts again"
        );
    }

    #[test]
    fn bursts_shrink_the_pause_and_never_start_one() {
        assert_eq!(after(&[32; 100]), 0);
        assert_eq!(after(&[1, 1, 1, 1, 1, 1]), 16);
        assert_eq!(after(&[1, 1, 1, 1, 1, 1, 4]), 8);
        assert_eq!(after(&[1, 1, 1, 1, 1, 1, 4, 64, 64, 64, 64]), 0);
        assert_eq!(after(&[4, 1]), 1, "a small hit right after a burst");
    }
}
