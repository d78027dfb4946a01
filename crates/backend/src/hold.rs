//! Host-side interrupt coalescing when it pays: a queue holds the call the driver asked for a
//! few microseconds while the driver is busy, so that one interrupt covers more completions,
//! and signals at once when the queue is quiet or when holding gathered nothing.
//!
//! The rule, with its reasons in docs/ARCHITECTURE.md ("Holding calls"):
//! - **Busy:** the last call went out less than [`BUSY_GAP`] ago: the driver takes calls at
//!   more than 20,000 a second, each one an interrupt and a wake-up of the guest's NAPI.
//!   A quiet queue (a ping, an idle link) is signalled at once: holding would only add latency.
//! - **Hold:** up to [`HOLD`] or [`HOLD_PACKETS`] completions, whichever comes first.
//! - **It pays** when the completions of the held call grew while it was held. Over the last
//!   [`HISTORY`] holds at least half must have: a request-response load, where the driver
//!   waits for the one completion it is signalled for, gathers nothing and stops holding.
//!   After that it probes one hold every 64 busy calls, the interval doubling to 1024 while
//!   probes gather nothing, so a load that changes is found again at a bounded cost.
//! - The driver's own NOTF_COAL settings win: with them set, this rule is not used.

use std::time::{Duration, Instant};

/// Calls closer together than this mean the driver is busy.
pub const BUSY_GAP: Duration = Duration::from_micros(50);
/// How long a call is held at most.
pub const HOLD: Duration = Duration::from_micros(10);
/// Completions that end a hold at once.
pub const HOLD_PACKETS: u64 = 32;
/// Holds remembered.
pub const HISTORY: u32 = 16;
/// Holds made before the history decides.
const WARM_UP: u32 = 4;
const PROBE_FIRST: u32 = 64;
const PROBE_MAX: u32 = 1024;

/// The call-holding state of one queue.
#[derive(Clone, Debug)]
pub struct CallHold {
    last_call: Option<Instant>,
    /// One bit per recent hold, newest lowest: 1 if it gathered more completions.
    paid: u16,
    holds: u32,
    /// Busy calls signalled at once since the last hold, and when to probe again.
    skipped: u32,
    probe_every: u32,
}

impl Default for CallHold {
    fn default() -> Self {
        CallHold {
            last_call: None,
            paid: 0,
            holds: 0,
            skipped: 0,
            probe_every: PROBE_FIRST,
        }
    }
}

impl CallHold {
    /// Whether to hold the call the driver asked for now.
    pub fn should_hold(&mut self, now: Instant) -> bool {
        let busy = self
            .last_call
            .is_some_and(|t| now.saturating_duration_since(t) < BUSY_GAP);
        if !busy {
            return false;
        }
        if self.pays() {
            return true;
        }
        self.skipped += 1;
        if self.skipped >= self.probe_every {
            self.skipped = 0;
            self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
            return true;
        }
        false
    }

    /// Whether recent holds gathered more completions, at least half the time.
    pub fn pays(&self) -> bool {
        let n = self.holds.min(HISTORY);
        n < WARM_UP || 2 * (self.paid & history_mask(n)).count_ones() >= n
    }

    /// A call went out; `gathered`: if it had been held, the completions added meanwhile.
    pub fn called(&mut self, now: Instant, gathered: Option<u64>) {
        self.last_call = Some(now);
        if let Some(g) = gathered {
            self.paid = (self.paid << 1) | (g > 0) as u16;
            self.holds = self.holds.saturating_add(1);
            if g > 0 {
                self.probe_every = PROBE_FIRST;
            }
        }
    }
}

fn history_mask(n: u32) -> u16 {
    if n >= 16 {
        u16::MAX
    } else {
        (1u16 << n) - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn a_quiet_queue_is_signalled_at_once() {
        let t = Instant::now();
        let mut h = CallHold::default();
        assert!(
            !h.should_hold(t),
            "no call yet: nothing says the driver is busy"
        );
        h.called(t, None);
        assert!(!h.should_hold(t + us(500)), "the last call was long ago");
        assert!(h.should_hold(t + us(20)), "calls 20 us apart: busy");
    }

    #[test]
    fn holds_that_gather_nothing_stop_and_are_probed_ever_more_rarely() {
        let mut t = Instant::now();
        let mut h = CallHold::default();
        h.called(t, None);
        // Request-response: each held call covers only the one completion it was for.
        let mut held = 0;
        for _ in 0..WARM_UP {
            t += us(10);
            assert!(h.should_hold(t));
            held += 1;
            h.called(t, Some(0));
        }
        assert!(!h.pays());
        let mut probes = Vec::new();
        for i in 0..4000u32 {
            t += us(10);
            if h.should_hold(t) {
                probes.push(i);
                h.called(t, Some(0));
            } else {
                h.called(t, None);
            }
        }
        assert_eq!(held, WARM_UP);
        let gaps: Vec<u32> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(probes.len() < 10, "{} probes in 4000 calls", probes.len());
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "probe gaps {gaps:?}");
        assert_eq!(*gaps.last().unwrap(), PROBE_MAX);
    }

    #[test]
    fn holding_resumes_when_a_probe_gathers_completions() {
        let mut t = Instant::now();
        let mut h = CallHold::default();
        h.called(t, None);
        for _ in 0..HISTORY {
            t += us(10);
            h.called(t, Some(0));
        }
        assert!(!h.pays());
        // The load turns into a stream: each hold now gathers more.
        let mut holds = 0;
        for _ in 0..2000 {
            t += us(10);
            if h.should_hold(t) {
                holds += 1;
                h.called(t, Some(8));
            } else {
                h.called(t, None);
            }
            if h.pays() {
                break;
            }
        }
        assert!(h.pays(), "after {holds} paying holds");
        assert!(h.should_hold(t + us(10)));
    }

    #[test]
    fn half_the_holds_paying_is_enough() {
        let mut t = Instant::now();
        let mut h = CallHold::default();
        h.called(t, None);
        for i in 0..HISTORY as u64 {
            t += us(10);
            h.called(t, Some(i % 2));
        }
        assert!(h.pays());
        t += us(10);
        h.called(t, Some(0));
        t += us(10);
        h.called(t, Some(0));
        assert!(!h.pays(), "7 of 16");
    }
}
