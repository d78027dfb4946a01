//! Busy polling: what a queue is told ([`BusyPoll`]: off, a fixed timeout, or auto) and,
//! for auto, the policy that decides how long each poll of a pair's worker lasts
//! ([`AutoPoll`]), from what the worker measures.
//!
//! The rule, with its reasons in docs/ARCHITECTURE.md ("Adaptive busy polling"):
//! - **Idle gaps.** Each time a turn finds nothing to do, the worker is idle until the turn
//!   that next moves a frame: that gap is measured whether the worker polled it away or slept
//!   through it, so the policy sees what a longer poll would have caught, even while it does
//!   not poll.
//! - **Budget**, grown and shrunk as KVM's halt polling does (`halt_poll_ns`): a gap the poll
//!   caught changes nothing; a gap that outlasted the poll but ended within [`MAX_POLL_US`]
//!   (a near miss: a longer poll would have caught it) doubles the budget, from at least
//!   [`START_POLL_US`], up to [`MAX_POLL_US`]; a gap longer than that (nothing a poll could
//!   catch) halves it, unless it came alone (every other poll of the last [`OUTCOMES`] hit:
//!   a pause between bursts, or a peer stalled for a moment; the budget stays as it was),
//!   and below [`START_POLL_US`] it stops polling. So it polls about as
//!   long as a hit usually takes, stops when hits are rare (an idle or trickling queue), and
//!   starts again at the first near miss. A gap after a poll the scheduler cut short moves
//!   nothing: another task ran in it, and it would only grow polls on a shared CPU.
//! - **Rare hits.** When fewer than [`RARE_HITS`] of the last [`OUTCOMES`] polls hit, gaps
//!   are landing between the budget and the cap, and growing and halving would go on polling
//!   in vain (seen with a Linux guest under TCG: 1 hit in 50 polls): auto stops polling for
//!   [`QUIET`], then starts again at the next near miss.
//! - **Contention.** Every [`CHECK_EVERY`] while the pair is active, it looks at the time its
//!   thread waited runnable since the last look (`run_delay` of
//!   /proc/thread-self/schedstat). Waits that add up to over 1/[`RUN_DELAY_SHARE`] of the
//!   interval and average over [`SLICE_WAIT`] each time the thread got the CPU mean another
//!   task wants this CPU and gets it in slices, when two checks in a row find them (one
//!   alone is a short task: a `virtnet ctl` request, a process starting): polling stops
//!   for a back-off,
//!   10 ms doubling to 1 s while contention lasts, and resumes once a check that follows some
//!   polling finds none; contention back within [`BACKOFF_MEMORY`] of that resumes the
//!   back-off where it was, doubled (a worker that slept through its back-off may run ahead
//!   of a spinning thread for a while, so one clean check does not show the CPU free). (The
//!   average keeps out the wake-ups of a thread that sleeps often: in a VM each costs tens
//!   of microseconds of run delay, a halted vCPU being woken, with no other task involved.)
//!   Waits that the worker's siblings account for (the other workers of this process pinned
//!   to its CPU, `crate::siblings`: the time they ran is taken off the waits) are no
//!   contention: between workers polling pays (experiment 3b). A poll the scheduler cuts
//!   short ends at once (`PollExit::Yield`) but is no reason to stop polling either: the
//!   other task got the CPU when it wanted it.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use virtnet_sys::Sched;

/// Why a busy poll ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollExit {
    /// Work showed up on a polled ring or the TAP.
    Hit,
    /// The timeout expired.
    Timeout,
    /// Another request for this worker is pending (a control message, a queue change).
    OtherWork,
    /// The scheduler took the CPU from us for another task: someone else wants it.
    Yield,
    /// A signal is pending (SIGTERM or SIGINT on its way to the thread that takes them).
    Signal,
    /// The device is shutting the worker down.
    Shutdown,
}

/// How a queue busy-polls before it sleeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BusyPoll {
    Off,
    /// Poll this many microseconds after each idle turn (vhost_net's `busyloop_timeout`).
    Fixed(u32),
    /// Poll as long as [`AutoPoll`] decides.
    #[default]
    Auto,
}

/// The longest fixed timeout accepted: one second.
pub const MAX_FIXED_US: u32 = 1_000_000;

impl BusyPoll {
    const RAW_AUTO: u32 = u32::MAX;

    /// As one word, for an atomic: 0 off, `u32::MAX` auto, else the timeout.
    pub fn to_raw(self) -> u32 {
        match self {
            BusyPoll::Off => 0,
            BusyPoll::Fixed(us) => us.min(MAX_FIXED_US),
            BusyPoll::Auto => Self::RAW_AUTO,
        }
    }

    pub fn from_raw(raw: u32) -> BusyPoll {
        match raw {
            0 => BusyPoll::Off,
            Self::RAW_AUTO => BusyPoll::Auto,
            us => BusyPoll::Fixed(us),
        }
    }

    /// A fixed timeout, `0` meaning off.
    pub fn fixed(us: u32) -> BusyPoll {
        BusyPoll::from_raw(us.min(MAX_FIXED_US))
    }
}

impl FromStr for BusyPoll {
    type Err = String;
    fn from_str(s: &str) -> Result<BusyPoll, String> {
        match s {
            "auto" => Ok(BusyPoll::Auto),
            "off" => Ok(BusyPoll::Off),
            _ => match s.parse::<u32>() {
                Ok(us) if us <= MAX_FIXED_US => Ok(BusyPoll::fixed(us)),
                _ => Err(format!(
                    "busy poll {s:?}: auto, off, or a timeout of 0 to {MAX_FIXED_US} microseconds"
                )),
            },
        }
    }
}

impl fmt::Display for BusyPoll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusyPoll::Off => f.write_str("off"),
            BusyPoll::Fixed(us) => write!(f, "{us}"),
            BusyPoll::Auto => f.write_str("auto"),
        }
    }
}

/// In JSON: `"auto"`, or the timeout in microseconds (`0` off), as `virtnet ctl` sends it.
impl Serialize for BusyPoll {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            BusyPoll::Auto => s.serialize_str("auto"),
            BusyPoll::Off => s.serialize_u32(0),
            BusyPoll::Fixed(us) => s.serialize_u32(*us),
        }
    }
}

impl<'de> Deserialize<'de> for BusyPoll {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<BusyPoll, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Wire {
            Us(u32),
            Word(String),
        }
        let s = match Wire::deserialize(d)? {
            Wire::Us(us) => us.to_string(),
            Wire::Word(w) => w,
        };
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The longest poll auto makes, in microseconds: gaps longer than this shrink the budget.
pub const MAX_POLL_US: u32 = 200;
/// The budget a near miss starts polling with, in microseconds; halved below it, it is 0.
pub const START_POLL_US: u32 = 10;
/// Polls looked back on, and the fewest hits among them that keep polling worth it: below
/// that, auto stops polling for [`QUIET`].
pub const OUTCOMES: u32 = 16;
pub const RARE_HITS: u32 = 2;
pub const QUIET: Duration = Duration::from_millis(100);
/// How often, at most, the scheduling of the worker's thread is looked at.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);
/// Contended when the thread waited runnable for more than 1/this of an interval, ...
pub const RUN_DELAY_SHARE: u64 = 20;
/// ... and longer than this on average each time it got the CPU: another task's slice, not
/// a wake-up.
pub const SLICE_WAIT: Duration = Duration::from_micros(200);
const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Contention found again within this time after it cleared resumes the back-off where it
/// was (doubled), rather than from [`BACKOFF_MIN`].
pub const BACKOFF_MEMORY: Duration = Duration::from_millis(250);

/// What the policy concluded from one scheduling check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Nothing changed.
    Same,
    /// Contention began: polling stops (the worker counts it).
    Contended,
    /// Contention ended: polling may resume.
    Clear,
}

/// The auto policy of one pair's worker. Pure: the worker feeds it gaps, poll exits and
/// scheduling samples, with the time they were taken.
#[derive(Clone, Debug)]
pub struct AutoPoll {
    /// From the gaps alone.
    budget_us: u32,
    /// No polling before this (contention); `backoff` is zero when there is none.
    until: Instant,
    backoff: Duration,
    /// Whether any poll was made since the last check, and whether the last one was cut
    /// short by the scheduler.
    polled: bool,
    preempted: bool,
    /// The last [`OUTCOMES`] polls that ended in a hit or a timeout, newest lowest (1 a hit),
    /// how many of them there are, and no polling before `quiet_until` once hits were rare.
    outcomes: u16,
    outcomes_len: u32,
    quiet_until: Option<Instant>,
    last_check: Option<LastCheck>,
    /// When contention last cleared, and the back-off it had reached.
    cleared: Option<(Instant, Duration)>,
    /// Whether the last check found the waits of contention.
    strike: bool,
}

impl AutoPoll {
    pub fn new(now: Instant) -> AutoPoll {
        AutoPoll {
            // Until there are gaps to go by: poll, as a fixed timeout would.
            budget_us: 50,
            until: now,
            backoff: Duration::ZERO,
            polled: false,
            preempted: false,
            outcomes: 0,
            outcomes_len: 0,
            quiet_until: None,
            last_check: None,
            cleared: None,
            strike: false,
        }
    }

    /// How long the next poll may last, in microseconds; 0: sleep at once.
    pub fn budget(&self, now: Instant) -> u32 {
        if !self.backoff.is_zero() && now < self.until {
            return 0;
        }
        self.budget_us
    }

    /// Whether contention keeps polling off now.
    pub fn contended(&self, now: Instant) -> bool {
        !self.backoff.is_zero() && now < self.until
    }

    /// One idle gap: from a turn that found nothing to the start of the next turn that moved
    /// a frame, the poll before it having lasted up to [`AutoPoll::budget`] at `now`.
    pub fn record_gap(&mut self, gap: Duration, now: Instant) {
        // Not polling for another reason (contention), or a poll the scheduler cut short
        // (another task ran in the gap): the gap says nothing of the budget.
        // Taken whatever else holds: a cut-short poll says nothing of a later gap.
        let preempted = std::mem::take(&mut self.preempted);
        if self.contended(now) || preempted {
            return;
        }
        if self.quiet_until.is_some_and(|t| now < t) {
            return;
        }
        self.quiet_until = None;
        if self.outcomes_len >= OUTCOMES && self.outcomes.count_ones() < RARE_HITS {
            // Polls that almost never hit: gaps keep landing between the budget and the cap,
            // and growing and halving would go on polling in vain. Stop for a while.
            self.budget_us = 0;
            self.quiet_until = Some(now + QUIET);
            (self.outcomes, self.outcomes_len) = (0, 0);
            return;
        }
        let us = gap.as_micros().min(u32::MAX as u128) as u32;
        let b = self.budget_us;
        self.budget_us = if us <= b {
            b
        } else if us <= MAX_POLL_US {
            (b * 2).clamp(START_POLL_US, MAX_POLL_US)
        } else if self.long_gap_alone() {
            b
        } else if b / 2 < START_POLL_US {
            0
        } else {
            b / 2
        };
    }

    /// Whether a long gap came alone: every other poll of the last [`OUTCOMES`] hit (the one
    /// that timed out into this gap is among them). A pause between bursts, or a peer stalled
    /// for a moment (a vCPU the hypervisor took away), says nothing of the traffic around it:
    /// halving there would leave the polls short of the next burst's gaps, to grow back one
    /// near miss (one wake-up) at a time.
    fn long_gap_alone(&self) -> bool {
        self.outcomes_len >= OUTCOMES && self.outcomes.count_ones() >= OUTCOMES - 1
    }

    /// How a poll ended. Any poll counts: the contention checks after a back-off need one
    /// to end it. A poll the scheduler cut short (`Yield`) is no contention by itself: the
    /// other task got the CPU at once.
    pub fn record_exit(&mut self, exit: PollExit) {
        self.polled = true;
        self.preempted = exit == PollExit::Yield;
        if matches!(exit, PollExit::Hit | PollExit::Timeout) {
            self.outcomes = (self.outcomes << 1) | (exit == PollExit::Hit) as u16;
            self.outcomes_len = (self.outcomes_len + 1).min(OUTCOMES);
        }
    }

    /// Whether a scheduling check is due.
    pub fn check_due(&self, now: Instant) -> bool {
        self.last_check
            .is_none_or(|c| now.saturating_duration_since(c.at) >= CHECK_EVERY)
    }

    /// A scheduling check: `sched` is the worker thread's schedstat and the time its
    /// siblings on its CPU have run ([`crate::siblings::Sibling::sample`]), None when the
    /// kernel does not say.
    pub fn check(&mut self, now: Instant, sched: Option<(Sched, u64)>) -> Check {
        let sampled = sched.is_some();
        let (own, siblings) = sched.unwrap_or_default();
        let contended = match self.last_check {
            // After a check without a sample, the next starts afresh: against zeros, its
            // sample would read as the thread's whole life of waits.
            Some(last) if sampled && last.sampled => {
                let wall = now.saturating_duration_since(last.at).as_nanos() as u64;
                // Waits the siblings' runs account for are no contention (see siblings.rs).
                let waited = own.waited_ns.saturating_sub(last.waited_ns);
                let foreign = waited.saturating_sub(siblings.saturating_sub(last.siblings_ns));
                let per_slice = foreign / own.slices.saturating_sub(last.slices).max(1);
                foreign * RUN_DELAY_SHARE > wall && per_slice > SLICE_WAIT.as_nanos() as u64
            }
            _ => false,
        };
        let polled = std::mem::take(&mut self.polled);
        self.last_check = Some(LastCheck {
            at: now,
            sampled,
            waited_ns: own.waited_ns,
            slices: own.slices,
            siblings_ns: siblings,
        });
        let was = !self.backoff.is_zero();
        let first = !std::mem::replace(&mut self.strike, contended);
        let recent = self
            .cleared
            .is_some_and(|(t, _)| now.saturating_duration_since(t) < BACKOFF_MEMORY);
        if contended && first && !was && !recent {
            // One interval alone is a blip: a short task of this process or another (a
            // `virtnet ctl stats` request, a metrics scrape, a process starting) ran on this
            // CPU. Contention is another task that keeps wanting it: the next check says.
            return Check::Same;
        }
        if contended {
            self.backoff = match self.cleared {
                _ if was => self.backoff * 2,
                // Back soon after it cleared: the contention never went, the scheduler only
                // let the worker run for a while (on AMD EPYC family 26 under Linux 6.18 a
                // worker that slept through its back-off runs ahead of a spinning thread).
                Some((_, b)) if recent => b * 2,
                _ => BACKOFF_MIN,
            }
            .clamp(BACKOFF_MIN, BACKOFF_MAX);
            self.until = now + self.backoff;
            return if was { Check::Same } else { Check::Contended };
        }
        // Contention is over once polling was allowed again and caused none, or when the
        // budget has nothing to poll anyway (no probe would ever come to end it).
        if was && now >= self.until && (polled || self.budget_us == 0) {
            self.cleared = Some((now, self.backoff));
            self.backoff = Duration::ZERO;
            return Check::Clear;
        }
        Check::Same
    }
}

/// What a scheduling check read, for the next one.
#[derive(Clone, Copy, Debug)]
struct LastCheck {
    at: Instant,
    /// Whether the kernel gave a sample (the counts below are zeros if not).
    sampled: bool,
    waited_ns: u64,
    slices: u64,
    siblings_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn feed(p: &mut AutoPoll, now: Instant, gaps: impl IntoIterator<Item = u64>) {
        gaps.into_iter().for_each(|g| p.record_gap(us(g), now));
    }

    #[test]
    fn the_setting_parses_and_round_trips_through_json_and_its_raw_word() {
        for (s, want) in [
            ("auto", BusyPoll::Auto),
            ("off", BusyPoll::Off),
            ("0", BusyPoll::Off),
            ("50", BusyPoll::Fixed(50)),
        ] {
            let b: BusyPoll = s.parse().unwrap();
            assert_eq!(b, want, "{s}");
            assert_eq!(BusyPoll::from_raw(b.to_raw()), b);
            let json = serde_json::to_string(&b).unwrap();
            assert_eq!(serde_json::from_str::<BusyPoll>(&json).unwrap(), b);
        }
        assert!("2000000".parse::<BusyPoll>().is_err());
        assert!("fast".parse::<BusyPoll>().is_err());
        assert!(serde_json::from_str::<BusyPoll>(r#""sometimes""#).is_err());
        assert_eq!(serde_json::to_string(&BusyPoll::Auto).unwrap(), r#""auto""#);
    }

    #[test]
    fn near_misses_grow_the_budget_to_what_a_hit_takes_and_hits_keep_it() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        // Request-response: the next request comes 60 to 70 us after each answer.
        feed(&mut p, t, [65, 70, 60, 70]);
        assert_eq!(
            p.budget(t),
            100,
            "50 doubled once: every gap caught after that"
        );
        feed(&mut p, t, (0..100).map(|i| 60 + i % 11));
        assert_eq!(p.budget(t), 100, "hits change nothing");
        // Gaps of 150 us: doubled up to the cap, where they hit.
        feed(&mut p, t, [150; 4]);
        assert_eq!(p.budget(t), MAX_POLL_US);
    }

    #[test]
    fn long_gaps_halve_it_down_to_no_polling_and_a_near_miss_restarts_it() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        // A trickle: a frame every millisecond, out of any poll's reach.
        feed(&mut p, t, [1000]);
        assert_eq!(p.budget(t), 25);
        feed(&mut p, t, [1000]);
        assert_eq!(p.budget(t), 12);
        feed(&mut p, t, [1000]);
        assert_eq!(p.budget(t), 0, "below the start: no polling");
        // Idle periods far apart (a quiet queue woken now and then) keep it off.
        feed(&mut p, t, [200_000; 10]);
        assert_eq!(p.budget(t), 0);
        // Gaps are measured while sleeping too: one that a poll would have caught restarts
        // polling, and the next near misses grow it.
        feed(&mut p, t, [30]);
        assert_eq!(p.budget(t), START_POLL_US);
        feed(&mut p, t, [30, 30]);
        assert_eq!(p.budget(t), 40);
    }

    #[test]
    fn bursts_with_pauses_between_keep_a_budget_for_the_bursts() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        // Bursts of 50 round trips 20 us apart, a 10 ms pause after each.
        let mut polled = 0;
        for _ in 0..20 {
            for g in std::iter::repeat_n(20, 50).chain([10_000]) {
                polled += (p.budget(t) >= 20) as u32;
                p.record_gap(us(g), t);
            }
        }
        assert!(polled >= 20 * 48, "{polled} of {} gaps caught", 20 * 51);
        assert!(p.budget(t) >= START_POLL_US, "still polling after a pause");
    }

    /// One idle turn: a poll of the current budget, a hit when the gap fits in it.
    fn turn(p: &mut AutoPoll, t: Instant, gap: u64) -> PollExit {
        let exit = if gap <= p.budget(t) as u64 {
            PollExit::Hit
        } else {
            PollExit::Timeout
        };
        p.record_exit(exit);
        p.record_gap(us(gap), t);
        exit
    }

    #[test]
    fn a_long_gap_among_polls_that_hit_leaves_the_budget_alone() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        // rr: the next request 8 us after each answer; now and then the driver stalls for
        // 2 ms (its vCPU taken away by the hypervisor).
        for _ in 0..10 {
            (0..100).for_each(|_| assert_eq!(turn(&mut p, t, 8), PollExit::Hit));
            turn(&mut p, t, 2000);
            assert_eq!(p.budget(t), 50, "a stall alone");
        }
        // Bursts of 50 round trips 20 us apart, 8 ms of silence between: every round trip
        // of every burst is caught.
        for _ in 0..20 {
            (0..50).for_each(|_| assert_eq!(turn(&mut p, t, 20), PollExit::Hit));
            turn(&mut p, t, 8000);
        }
        assert_eq!(p.budget(t), 50);
        // Two long gaps within 16 polls: they are the traffic's own; halved.
        for _ in 0..5 {
            turn(&mut p, t, 8);
        }
        turn(&mut p, t, 2000);
        assert_eq!(p.budget(t), 25);
        turn(&mut p, t, 2000);
        assert_eq!(p.budget(t), 12);
    }

    #[test]
    fn polls_that_almost_never_hit_stop_for_a_while_then_start_again() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        // Gaps of 150 and 400 us in turn (a slow guest): each 150 doubles, each 400 halves,
        // and the polls time out.
        let mut polls = 0;
        for g in [150, 400].into_iter().cycle().take(64) {
            if p.budget(t) == 0 {
                break;
            }
            polls += 1;
            p.record_exit(if g <= p.budget(t) as u64 {
                PollExit::Hit
            } else {
                PollExit::Timeout
            });
            p.record_gap(us(g), t);
        }
        assert_eq!(p.budget(t), 0, "still polling after {polls} polls");
        assert!(polls <= OUTCOMES + 2, "{polls} polls");
        // Quiet: near misses do not restart it yet.
        feed(&mut p, t + QUIET / 2, [50; 4]);
        assert_eq!(p.budget(t + QUIET / 2), 0);
        // After the quiet time the next near miss does.
        feed(&mut p, t + QUIET, [50]);
        assert_eq!(p.budget(t + QUIET), START_POLL_US);
        // And polls that hit keep it going.
        for _ in 0..40 {
            p.record_exit(PollExit::Hit);
            p.record_gap(us(5), t + QUIET);
        }
        assert_eq!(p.budget(t + QUIET), START_POLL_US);
    }

    #[test]
    fn a_gap_after_a_preempted_poll_does_not_grow_the_budget() {
        let t = Instant::now();
        let mut p = AutoPoll::new(t);
        p.record_exit(PollExit::Yield);
        feed(&mut p, t, [150]);
        assert_eq!(p.budget(t), 50, "another task ran in that gap");
        p.record_exit(PollExit::Timeout);
        feed(&mut p, t, [150]);
        assert_eq!(p.budget(t), 100);
    }

    #[test]
    fn a_poll_cut_short_during_a_back_off_does_not_hide_the_first_gap_after_it() {
        let (mut p, t, _) = contended();
        p.record_exit(PollExit::Yield);
        feed(&mut p, t, [150]);
        // The first gap after the back-off, slept through without a poll of its own.
        let after = t + BACKOFF_MIN;
        feed(&mut p, after, [150]);
        assert_eq!(
            p.budget(after),
            100,
            "the near miss after the back-off counts"
        );
    }

    #[test]
    fn a_check_without_a_sample_is_no_strike_for_the_next() {
        let t0 = Instant::now();
        let mut p = AutoPoll::new(t0);
        // A thread that has waited 3 s over its life, sampled every 10 ms.
        let life = at(3_000_000_000, 1_000);
        assert_eq!(p.check(t0, life), Check::Same);
        assert_eq!(p.check(t0 + CHECK_EVERY, None), Check::Same);
        // A clean interval, then one with a short task's wait (5 ms in one slice): a blip,
        // not the second strike of contention.
        let t = t0 + 2 * CHECK_EVERY;
        assert_eq!(p.check(t, life), Check::Same);
        let blip = at(3_005_000_000, 1_001);
        assert_eq!(p.check(t + CHECK_EVERY, blip), Check::Same);
        assert!(!p.contended(t + CHECK_EVERY), "a blip stopped polling");
    }

    #[test]
    fn gaps_while_contention_keeps_it_from_polling_do_not_move_the_budget() {
        let (mut p, t, _) = contended();
        feed(&mut p, t, [100_000; 10]);
        assert_eq!(p.budget(t + BACKOFF_MIN), 50, "as before the back-off");
    }

    /// Sched samples over one interval each: `wait_ms` of run delay in one slice.
    fn waited(p: &mut AutoPoll, t: Instant, total: &mut (u64, u64), wait_ms: u64) -> Check {
        total.0 += wait_ms * 1_000_000;
        total.1 += 1;
        p.check(t, at(total.0, total.1))
    }

    /// A policy two scheduling checks into contention (5 ms waits in two intervals in a row),
    /// when it backs off; its clock and sched sample.
    fn contended() -> (AutoPoll, Instant, (u64, u64)) {
        let t0 = Instant::now();
        let mut p = AutoPoll::new(t0);
        let mut sched = (0, 0);
        waited(&mut p, t0, &mut sched, 0);
        waited(&mut p, t0 + CHECK_EVERY, &mut sched, 5);
        let t = t0 + 2 * CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 5), Check::Contended);
        (p, t, sched)
    }

    /// A sched sample of `waited_ns` in `slices`, no sibling.
    fn at(waited_ns: u64, slices: u64) -> Option<(Sched, u64)> {
        with_siblings(waited_ns, slices, 0)
    }

    /// A sched sample of `waited_ns` in `slices`, the siblings having run `siblings_ns`.
    fn with_siblings(waited_ns: u64, slices: u64, siblings_ns: u64) -> Option<(Sched, u64)> {
        let own = Sched {
            ran_ns: 0,
            waited_ns,
            slices,
        };
        Some((own, siblings_ns))
    }

    #[test]
    fn contention_stops_polling_with_a_growing_back_off_then_polling_resumes() {
        let t0 = Instant::now();
        let mut p = AutoPoll::new(t0);

        let mut sched = (0, 0);
        assert_eq!(waited(&mut p, t0, &mut sched, 0), Check::Same);
        // Polls the scheduler cut short are no contention by themselves: the other task got
        // the CPU at once.
        let mut t = t0 + CHECK_EVERY;
        (0..10).for_each(|_| p.record_exit(PollExit::Yield));
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Same);
        // A 2 ms wait for the CPU within 10 ms, once: a blip. Twice in a row: contended.
        t += CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 2), Check::Same);
        assert!(p.budget(t) > 0);
        t += CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 2), Check::Contended);
        assert_eq!(p.budget(t), 0);
        assert!(p.contended(t));
        assert!(p.budget(t + BACKOFF_MIN) > 0, "the back-off ends");
        // It polls again and waits again: a longer back-off.
        t += BACKOFF_MIN;
        p.record_exit(PollExit::Timeout);
        assert_eq!(waited(&mut p, t, &mut sched, 2), Check::Same);
        assert_eq!(p.budget(t + BACKOFF_MIN), 0, "doubled");
        assert!(p.budget(t + 2 * BACKOFF_MIN) > 0);
        // It polls after the back-off and waits no more: contention is over.
        t += 2 * BACKOFF_MIN;
        p.record_exit(PollExit::Hit);
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Clear);
        assert!(!p.contended(t) && p.budget(t) > 0);
    }

    #[test]
    fn long_waits_for_the_cpu_are_contention_and_many_short_wake_ups_are_not() {
        let t0 = Instant::now();
        let mut p = AutoPoll::new(t0);

        p.check(t0, at(1_000_000, 100));
        let wall = CHECK_EVERY.as_nanos() as u64;
        // 4% of the interval spent runnable, in 2 ms waits: not contended.
        let t1 = t0 + CHECK_EVERY;
        let (d1, n1) = (1_000_000 + wall / 25, 100 + 1);
        assert_eq!(p.check(t1, at(d1, n1)), Check::Same);
        // 30%, over 1000 wake-ups of 30 us each (a VM's halted vCPU woken): not contended.
        let t2 = t1 + CHECK_EVERY;
        let (d2, n2) = (d1 + 3 * wall / 10, n1 + 100);
        assert_eq!(p.check(t2, at(d2, n2)), Check::Same);
        // 10%, in 1 ms waits (another task's slices), in two intervals in a row: contended,
        // polls never preempted.
        let t3 = t2 + CHECK_EVERY;
        assert_eq!(p.check(t3, at(d2 + wall / 10, n2 + 1)), Check::Same);
        let t3 = t3 + CHECK_EVERY;
        let (d3, n3) = (d2 + wall / 5, n2 + 2);
        assert_eq!(p.check(t3, at(d3, n3)), Check::Contended);
        // While it does not poll, a clean check does not end it: only a probe that polled.
        let t4 = t3 + BACKOFF_MIN;
        assert_eq!(p.check(t4, at(d3, n3)), Check::Same);
        assert!(p.budget(t4) > 0, "the probe may poll");
        p.record_exit(PollExit::Timeout);
        assert_eq!(p.check(t4 + CHECK_EVERY, at(d3, n3)), Check::Clear);
    }

    #[test]
    fn a_short_task_now_and_then_is_no_contention() {
        let mut t = Instant::now();
        let mut p = AutoPoll::new(t);
        let mut sched = (0, 0);
        waited(&mut p, t, &mut sched, 0);
        // A `virtnet ctl stats` request a second, taking 2 ms of the worker's CPU each time.
        for i in 1..=300 {
            t += CHECK_EVERY;
            p.record_exit(PollExit::Hit);
            let wait = if i % 100 == 0 { 2 } else { 0 };
            assert_eq!(
                waited(&mut p, t, &mut sched, wait),
                Check::Same,
                "check {i}"
            );
            assert!(p.budget(t) > 0);
        }
    }

    #[test]
    fn a_back_off_followed_by_no_polling_ends_and_a_later_blip_is_only_a_blip() {
        let (mut p, mut t, mut sched) = contended();
        // The back-off ends and the queue goes quiet: long gaps take the budget to 0.
        t += BACKOFF_MIN;
        feed(&mut p, t, [1000; 3]);
        assert_eq!(p.budget(t), 0);
        // A second of clean checks: the contention is long gone.
        for _ in 0..100 {
            t += CHECK_EVERY;
            waited(&mut p, t, &mut sched, 0);
        }
        assert!(!p.contended(t));
        // Traffic is back: a near miss restarts polling.
        feed(&mut p, t, [30]);
        assert_eq!(p.budget(t), START_POLL_US);
        // One interval with a wait (a `virtnet ctl` request) is a blip: polling goes on.
        t += CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 5), Check::Same);
        assert!(
            p.budget(t) > 0,
            "a blip stopped polling for {:?}",
            p.backoff
        );
    }

    #[test]
    fn the_back_off_is_capped_at_a_second() {
        let mut t = Instant::now();
        let mut p = AutoPoll::new(t);
        let mut sched = (0, 0);
        for _ in 0..20 {
            waited(&mut p, t, &mut sched, 5);
            t += CHECK_EVERY;
        }
        assert_eq!(p.backoff, BACKOFF_MAX);
    }

    #[test]
    fn waits_the_siblings_on_its_cpu_account_for_are_not_contention() {
        let t0 = Instant::now();
        let mut p = AutoPoll::new(t0);
        let sample = |waited_ms: u64, slices: u64, siblings_ms: u64| {
            with_siblings(waited_ms * 1_000_000, slices, siblings_ms * 1_000_000)
        };
        p.check(t0, sample(0, 0, 0));
        // 5 ms waited in 10, in one slice, while a sibling ran 5 ms: it polled in the wait.
        let t1 = t0 + CHECK_EVERY;
        assert_eq!(p.check(t1, sample(5, 1, 5)), Check::Same);
        // 5 ms waited while the sibling ran 1 ms: 4 ms went to something else; twice.
        let t2 = t1 + CHECK_EVERY;
        assert_eq!(p.check(t2, sample(10, 2, 6)), Check::Same);
        assert_eq!(
            p.check(t2 + CHECK_EVERY, sample(15, 3, 7)),
            Check::Contended
        );
    }

    #[test]
    fn contention_found_again_soon_after_it_cleared_resumes_the_back_off_where_it_was() {
        let mut t = Instant::now();
        let mut p = AutoPoll::new(t);
        let mut sched = (0, 0);
        waited(&mut p, t, &mut sched, 0);
        t += CHECK_EVERY;
        waited(&mut p, t, &mut sched, 5);
        // Contended, then still at each probe: 10, 20, 40 ms.
        for want in [10, 20, 40] {
            t += CHECK_EVERY.max(p.backoff);
            p.record_exit(PollExit::Hit);
            waited(&mut p, t, &mut sched, 5);
            assert_eq!(p.backoff, Duration::from_millis(want));
        }
        // A clean probe clears it.
        t += p.backoff;
        p.record_exit(PollExit::Hit);
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Clear);
        // Back soon (a scheduler that lets a worker fresh from sleep run ahead of
        // a spinning thread for a while): 80 ms, not 10.
        t += BACKOFF_MEMORY / 2;
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Same);
        t += CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 5), Check::Contended);
        assert_eq!(p.backoff, Duration::from_millis(80));
        // Cleared, and contended again only after BACKOFF_MEMORY: from 10 ms again.
        t += p.backoff;
        p.record_exit(PollExit::Hit);
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Clear);
        t += BACKOFF_MEMORY;
        assert_eq!(waited(&mut p, t, &mut sched, 0), Check::Same);
        t += CHECK_EVERY;
        assert_eq!(
            waited(&mut p, t, &mut sched, 5),
            Check::Same,
            "a blip, at first"
        );
        t += CHECK_EVERY;
        assert_eq!(waited(&mut p, t, &mut sched, 5), Check::Contended);
        assert_eq!(p.backoff, BACKOFF_MIN);
    }
}
