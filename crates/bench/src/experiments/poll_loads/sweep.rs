//! The sweep of experiment 7: every load at every busy-polling setting, the settings in an
//! order that turns each repeat, summarised per setting; the best fixed timeout and auto's
//! ratios to it and to off, over the medians and repeat by repeat; then the fresh rounds.

use std::time::Duration;

use serde::Serialize;
use virtnet_backend::BusyPoll;

use super::fresh::{fresh, paired_ratios, Fresh};
use super::loads::{one, Load, Run};
use super::{
    Results, CONTENDED_CPU, CONTENDED_DRIVERS_CPU, FRESH_ROUNDS_PER_REPEAT, LOADS, ON_OFF, SETTINGS,
};
use crate::experiments::{Options, Progress};
use crate::summary::Summary;
use crate::BenchError;

#[derive(Debug, Serialize)]
pub struct SettingResult {
    #[serde(rename = "busy_poll_us")]
    pub busy_poll: BusyPoll,
    pub main: Summary,
    pub device_cpu_pct: Summary,
    pub device_cpu_us_per_frame: Option<Summary>,
    pub p50_us: Option<Summary>,
    pub p99_us: Option<Summary>,
    pub steal_pct: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct LoadResult {
    pub load: Load,
    /// What `main` is in this load's runs, and whether more is better (idle: device CPU,
    /// less is better).
    pub main_figure: &'static str,
    pub higher_is_better: bool,
    pub settings: Vec<SettingResult>,
    /// The fixed timeout with the best main figure (medians), and auto's main figure divided
    /// by that one's and by off's (none when that is 0). Above 1 is better for a figure where
    /// more is better, worse for idle's CPU.
    #[serde(rename = "best_fixed_us")]
    pub best_fixed: BusyPoll,
    pub auto_over_best_fixed: Option<f64>,
    pub auto_over_off: Option<f64>,
    /// Auto's main figure over the best fixed timeout's in each repeat (the two ran in the
    /// same repeat, minutes apart at most): the machine's drift between repeats cancels.
    pub auto_over_best_fixed_per_repeat: Option<Summary>,
    /// Auto against the best fixed timeout (and, contended, against off) on fresh runs.
    pub fresh: Vec<Fresh>,
}

/// The fixed timeout with the best of `main` (medians by setting), and auto's over it and
/// over off's; none for a ratio whose divisor is 0 or missing.
fn compare(
    main: &[(BusyPoll, f64)],
    higher_is_better: bool,
) -> (BusyPoll, Option<f64>, Option<f64>) {
    let of = |b: BusyPoll| main.iter().find(|(s, _)| *s == b).map(|&(_, m)| m);
    let better = |a: f64, b: f64| if higher_is_better { a > b } else { a < b };
    let best = main
        .iter()
        .filter(|(s, _)| matches!(s, BusyPoll::Fixed(_)))
        .fold(None, |best: Option<(BusyPoll, f64)>, &(s, m)| match best {
            Some((_, bm)) if !better(m, bm) => best,
            _ => Some((s, m)),
        });
    let ratio = |d: Option<f64>| match (of(BusyPoll::Auto), d) {
        (Some(a), Some(d)) if d != 0.0 => Some(a / d),
        _ => None,
    };
    let (best_fixed, best_main) = best.map_or((BusyPoll::Off, None), |(s, m)| (s, Some(m)));
    (best_fixed, ratio(best_main), ratio(of(BusyPoll::Off)))
}

fn setting_result(load: Load, busy_poll: BusyPoll, runs: Vec<Run>) -> SettingResult {
    let per_frame: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.device_cpu_us_per_frame)
        .collect();
    let latency = |f: fn(&Run) -> f64| {
        load.has_latency()
            .then(|| Summary::of_runs(runs.iter().map(f)))
    };
    SettingResult {
        busy_poll,
        main: Summary::of_runs(runs.iter().map(|r| r.main)),
        device_cpu_pct: Summary::of_runs(runs.iter().map(|r| r.device_cpu_pct)),
        device_cpu_us_per_frame: Summary::of(&per_frame),
        p50_us: latency(|r| r.p50_us),
        p99_us: latency(|r| r.p99_us),
        steal_pct: Summary::of_runs(runs.iter().map(|r| r.steal_pct)),
        runs,
    }
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.15, 1) } else { (2.0, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut runs: Vec<Vec<Vec<Run>>> = LOADS
        .iter()
        .map(|_| SETTINGS.iter().map(|_| Vec::new()).collect())
        .collect();
    for rep in 1..=repeats {
        for (l, &load) in LOADS.iter().enumerate() {
            for s in rotated(SETTINGS.len(), rep as usize - 1) {
                let b = SETTINGS[s];
                progress(&format!("[{rep}/{repeats}] {:?}, busy poll {b}", load));
                runs[l][s].push(one(load, b, secs, pinned)?);
                // Let the previous backend's threads go before the next run's clock starts.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
    let mut loads: Vec<LoadResult> = LOADS
        .iter()
        .zip(runs)
        .map(|(&load, runs)| {
            let settings: Vec<SettingResult> = SETTINGS
                .iter()
                .zip(runs)
                .map(|(&b, runs)| setting_result(load, b, runs))
                .collect();
            let (main_figure, higher_is_better) = load.main_figure();
            let medians: Vec<(BusyPoll, f64)> = settings
                .iter()
                .map(|s| (s.busy_poll, s.main.median))
                .collect();
            let (best_fixed, auto_over_best_fixed, auto_over_off) =
                compare(&medians, higher_is_better);
            let runs_of = |b: BusyPoll| {
                let s = settings.iter().find(|s| s.busy_poll == b);
                s.map_or(&[][..], |s| &s.runs[..])
            };
            let auto_over_best_fixed_per_repeat =
                per_repeat(runs_of(BusyPoll::Auto), runs_of(best_fixed));
            LoadResult {
                load,
                main_figure,
                higher_is_better,
                settings,
                best_fixed,
                auto_over_best_fixed,
                auto_over_off,
                auto_over_best_fixed_per_repeat,
                fresh: Vec::new(),
            }
        })
        .collect();
    // The sweep's best fixed timeout is the best of three noisy medians, so on its own runs
    // it looks better than it is (the winner's curse): auto is held against it on new runs.
    let fresh_rounds = repeats * FRESH_ROUNDS_PER_REPEAT;
    let fresh_secs = secs / FRESH_ROUNDS_PER_REPEAT as f64;
    for l in &mut loads {
        let mut against = vec![l.best_fixed];
        if l.load == Load::Contended {
            against.push(BusyPoll::Off); // The target: never worse than off.
        }
        l.fresh = fresh(
            l.load,
            &against,
            fresh_rounds,
            fresh_secs,
            pinned,
            &mut *progress,
        )?;
    }
    Ok(Results {
        secs_per_run: secs,
        repeats,
        fresh_rounds,
        fresh_secs_per_run: fresh_secs,
        pinned,
        contended_cpu: CONTENDED_CPU,
        contended_drivers_cpu: CONTENDED_DRIVERS_CPU,
        on_off: ON_OFF,
        loads,
    })
}

/// The order of `n` settings in repeat `rep` (from 0): each repeat starts one later, so no
/// setting always runs after the same one, or first or last.
fn rotated(n: usize, rep: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + rep) % n)
}

/// The ratios of `a`'s main figures over `b`'s, repeat by repeat; none without any.
fn per_repeat(a: &[Run], b: &[Run]) -> Option<Summary> {
    let main = |runs: &[Run]| runs.iter().map(|r| r.main).collect::<Vec<_>>();
    paired_ratios(&main(a), &main(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiments::poll_loads::fresh::auto_first;

    #[test]
    fn best_fixed_and_auto_ratios_follow_the_figure_direction() {
        let m = [
            (BusyPoll::Off, 100.0),
            (BusyPoll::Fixed(10), 120.0),
            (BusyPoll::Fixed(50), 150.0),
            (BusyPoll::Fixed(100), 140.0),
            (BusyPoll::Auto, 135.0),
        ];
        let (best, vs_best, vs_off) = compare(&m, true);
        assert_eq!(best, BusyPoll::Fixed(50));
        assert_eq!((vs_best, vs_off), (Some(0.9), Some(1.35)));
        // Less is better (idle CPU): the lowest fixed one; nothing to divide by 0.
        let idle = [
            (BusyPoll::Off, 0.0),
            (BusyPoll::Fixed(10), 0.5),
            (BusyPoll::Fixed(50), 0.25),
            (BusyPoll::Fixed(100), 1.0),
            (BusyPoll::Auto, 0.5),
        ];
        let (best, vs_best, vs_off) = compare(&idle, false);
        assert_eq!(best, BusyPoll::Fixed(50));
        assert_eq!((vs_best, vs_off), (Some(2.0), None));
    }

    #[test]
    fn per_repeat_ratios_pair_the_runs_of_one_repeat() {
        let runs = |v: &[f64]| -> Vec<Run> {
            v.iter()
                .map(|&main| Run {
                    main,
                    ..Run::default()
                })
                .collect()
        };
        // The machine ran twice as fast in the second repeat: paired, auto is 0.9 both times,
        // though its median (135) is above the fixed timeout's (100 and 200: 150).
        let s = per_repeat(&runs(&[90.0, 180.0]), &runs(&[100.0, 200.0])).unwrap();
        assert!((s.median - 0.9).abs() < 1e-9 && (s.max - 0.9).abs() < 1e-9);
        // A repeat whose divisor is 0 is left out; none left, no summary.
        let s = per_repeat(&runs(&[1.0, 3.0]), &runs(&[0.0, 2.0])).unwrap();
        assert_eq!((s.runs, s.median), (1, 1.5));
        assert!(per_repeat(&runs(&[1.0]), &runs(&[0.0])).is_none());
        assert!(per_repeat(&[], &runs(&[1.0])).is_none());
    }

    #[test]
    fn each_repeat_starts_one_setting_later_and_runs_them_all() {
        let orders: Vec<Vec<usize>> = (0..5).map(|rep| rotated(5, rep).collect()).collect();
        assert_eq!(orders[0], [0, 1, 2, 3, 4]);
        assert_eq!(orders[1], [1, 2, 3, 4, 0]);
        assert_eq!(orders[4], [4, 0, 1, 2, 3]);
        // Over five repeats each setting runs once in each position.
        for pos in 0..5 {
            let mut at: Vec<usize> = orders.iter().map(|o| o[pos]).collect();
            at.sort();
            assert_eq!(at, [0, 1, 2, 3, 4]);
        }
        assert!(auto_first(0) && !auto_first(1) && auto_first(2));
    }
}
