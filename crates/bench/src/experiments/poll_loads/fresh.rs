//! Experiment 7's fresh comparisons: auto held against one setting on runs of their own, in
//! paired rounds (one run of each a round, the order reversed every other round), the ratios
//! round by round, and whether each comparison meets its target.

use std::time::Duration;

use serde::Serialize;
use virtnet_backend::BusyPoll;

use super::loads::{one, Load};
use crate::experiments::Progress;
use crate::summary::Summary;
use crate::BenchError;

/// Auto held against one setting on runs of their own, after the sweep chose that setting:
/// A/B alternated, the order reversed each round (auto first, then it first), so that
/// neither always follows the other.
#[derive(Debug, Serialize)]
pub struct Fresh {
    #[serde(rename = "against_us")]
    pub against: BusyPoll,
    pub auto: Summary,
    pub other: Summary,
    /// Auto's median over the other's, and auto over the other round by round.
    pub ratio_of_medians: Option<f64>,
    pub per_round: Option<Summary>,
    pub auto_runs: Vec<f64>,
    pub other_runs: Vec<f64>,
}

/// Whether auto runs first in round `round` (from 0) of a fresh comparison: every other one.
pub(super) fn auto_first(round: u32) -> bool {
    round.is_multiple_of(2)
}

/// `rounds` rounds of auto against each of `against`, one run of each a round.
pub(super) fn fresh(
    load: Load,
    against: &[BusyPoll],
    rounds: u32,
    secs: f64,
    pinned: bool,
    progress: Progress<'_>,
) -> Result<Vec<Fresh>, BenchError> {
    let mut out = Vec::new();
    for &other in against {
        let (mut auto, mut them) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let order = if auto_first(round) {
                [BusyPoll::Auto, other]
            } else {
                [other, BusyPoll::Auto]
            };
            for b in order {
                progress(&format!(
                    "[fresh {}/{rounds}] {load:?}, auto against {other}: busy poll {b}",
                    round + 1
                ));
                let main = one(load, b, secs, pinned)?.main;
                if b == BusyPoll::Auto {
                    &mut auto
                } else {
                    &mut them
                }
                .push(main);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        out.push(fresh_result(other, auto, them));
    }
    Ok(out)
}

fn fresh_result(against: BusyPoll, auto: Vec<f64>, other: Vec<f64>) -> Fresh {
    let (a, o) = (
        Summary::of_runs(auto.iter().copied()),
        Summary::of_runs(other.iter().copied()),
    );
    Fresh {
        against,
        ratio_of_medians: (o.median != 0.0).then(|| a.median / o.median),
        per_round: paired_ratios(&auto, &other),
        auto: a,
        other: o,
        auto_runs: auto,
        other_runs: other,
    }
}

/// `a[i] / b[i]` for each pair whose `b` is not 0, summarised; none without any.
pub(super) fn paired_ratios(a: &[f64], b: &[f64]) -> Option<Summary> {
    let ratios: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, b)| **b != 0.0)
        .map(|(a, b)| a / b)
        .collect();
    Summary::of(&ratios)
}

/// Whether a fresh comparison meets the target, in words. It goes by the median of
/// the rounds' paired ratios: the two runs of a round are back to back, so they see the same
/// level of the machine, where the medians of each side's runs depend on how many of them
/// the machine's slow stretches fell on (on a shared VM every load's rate moves between
/// levels every few seconds, whatever the setting; docs/PERFORMANCE.md).
pub(super) fn verdict(load: Load, c: &Fresh, auto_cpu_pct: Option<f64>) -> &'static str {
    let met = |ok: bool, yes, no| if ok { yes } else { no };
    match (load, c.against, c.per_round.map(|s| s.median)) {
        (Load::Idle, ..) => met(
            auto_cpu_pct.is_some_and(|p| p < 1.0),
            "under 1% of a core: met",
            "1% of a core or more: NOT MET",
        ),
        (_, BusyPoll::Off, Some(r)) => met(
            r >= 1.0,
            "not worse than off: met",
            "worse than off: NOT MET",
        ),
        (_, _, Some(r)) => met(r >= 0.95, "within 5%: met", "not within 5%: NOT MET"),
        (_, _, None) => "-",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_runs_give_both_ratios_and_the_verdict_follows_the_target() {
        // The machine slowed in the last round: the medians hide it, round by round auto
        // is 0.96 to 0.98.
        let c = fresh_result(
            BusyPoll::Fixed(50),
            vec![98.0, 96.0, 48.0],
            vec![100.0, 100.0, 50.0],
        );
        assert_eq!((c.auto.median, c.other.median), (96.0, 100.0));
        assert_eq!(c.ratio_of_medians, Some(0.96));
        let p = c.per_round.unwrap();
        assert!((p.median - 0.96).abs() < 1e-9 && (p.min - 0.96).abs() < 1e-9);
        assert!((p.max - 0.98).abs() < 1e-9);
        assert_eq!(verdict(Load::Rr, &c, None), "within 5%: met");
        let c = fresh_result(BusyPoll::Fixed(50), vec![94.0], vec![100.0]);
        assert_eq!(verdict(Load::Rr, &c, None), "not within 5%: NOT MET");
        // Against off, even 1% worse misses.
        let c = fresh_result(BusyPoll::Off, vec![99.0], vec![100.0]);
        assert_eq!(
            verdict(Load::Contended, &c, None),
            "worse than off: NOT MET"
        );
        // The machine's level moved between rounds: the medians compare runs at different
        // levels (0.1, or 9), the rounds do not, and the verdict goes by the rounds, either way.
        for (auto, other, medians, want) in [
            (
                [100.0, 10.0, 10.0],
                [100.0, 100.0, 10.0],
                0.1,
                "within 5%: met",
            ),
            (
                [90.0, 900.0, 900.0],
                [100.0, 1000.0, 100.0],
                9.0,
                "not within 5%: NOT MET",
            ),
        ] {
            let c = fresh_result(BusyPoll::Fixed(100), auto.to_vec(), other.to_vec());
            assert_eq!(c.ratio_of_medians, Some(medians));
            assert_eq!(verdict(Load::Contended, &c, None), want);
        }
        // Idle goes by auto's CPU, not by the ratio; a divisor of 0 gives no ratio.
        let c = fresh_result(BusyPoll::Fixed(10), vec![0.02], vec![0.0]);
        assert_eq!(c.ratio_of_medians, None);
        assert!(c.per_round.is_none());
        assert_eq!(
            verdict(Load::Idle, &c, Some(0.02)),
            "under 1% of a core: met"
        );
        assert_eq!(
            verdict(Load::Idle, &c, Some(3.0)),
            "1% of a core or more: NOT MET"
        );
        assert_eq!(verdict(Load::Rr, &c, None), "-");
    }
}
