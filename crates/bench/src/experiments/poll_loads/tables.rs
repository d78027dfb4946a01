//! Experiment 7's tables: each load's main figure by setting with auto's ratios, auto on
//! fresh runs against its targets, and every cell with the device's CPU and counters.

use virtnet_backend::BusyPoll;

use super::fresh::verdict;
use super::{Results, Run, SETTINGS};
use crate::experiments::common::spread;
use crate::summary::Summary;
use crate::table::Table;

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut header = vec!["load (main figure)".to_string()];
    header.extend(SETTINGS.iter().map(|b| match b {
        BusyPoll::Fixed(us) => format!("{us} us"),
        b => b.to_string(),
    }));
    header.extend(["best fixed", "auto/best fixed", "per repeat", "auto/off"].map(String::from));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(
        "7. Busy polling across loads: each load's main figure (median) by setting",
        &header,
    );
    for l in &r.loads {
        let mut row = vec![l.load.label().to_string()];
        row.extend(
            l.settings
                .iter()
                .map(|s| format!("{:.*}", l.load.precision(), s.main.median)),
        );
        row.push(format!("{} us", l.best_fixed));
        row.push(ratio(l.auto_over_best_fixed));
        row.push(
            l.auto_over_best_fixed_per_repeat
                .map_or("-".into(), |s| s.display(2)),
        );
        row.push(ratio(l.auto_over_off));
        t.row(row);
    }
    t.note(format!(
        "{} of {:.2} s per cell. Ratios are of the main figure: above 1 is better, except for \
         idle's device CPU, where it is worse. Per repeat: auto over the best fixed timeout in \
         each repeat, median (min..max). Each repeat runs the settings in turn, starting one \
         later than the last.",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(if r.pinned {
        format!(
            "driver threads on CPU 0, backend worker on CPU 1; contended: both workers on CPU {}, \
             both drivers on CPU {}.",
            r.contended_cpu, r.contended_drivers_cpu
        )
    } else {
        "NOT pinned (fewer than 2 CPUs).".into()
    });
    let mut f = Table::new(
        "7. Auto on fresh runs, against the setting the sweep found best (and off, contended)",
        &[
            "load",
            "auto against",
            "auto",
            "that setting",
            "auto/that, medians",
            "per round",
            "target, this run",
        ],
    );
    for l in &r.loads {
        let auto_cpu = l
            .settings
            .iter()
            .find(|s| s.busy_poll == BusyPoll::Auto)
            .map(|s| s.device_cpu_pct.median);
        for c in &l.fresh {
            let prec = l.load.precision();
            f.row(vec![
                l.load.label().to_string(),
                match c.against {
                    BusyPoll::Fixed(us) => format!("{us} us"),
                    b => b.to_string(),
                },
                c.auto.display(prec),
                c.other.display(prec),
                ratio(c.ratio_of_medians),
                c.per_round.map_or("-".into(), |s| s.display(2)),
                verdict(l.load, c, auto_cpu).into(),
            ]);
        }
    }
    f.note(format!(
        "The sweep's best fixed timeout is the best of three noisy medians, which favours it on \
         its own runs; here each pair ran again, {} of one {:.2} s run each, auto first in \
         every other round. Targets, judged on the median of the per-round ratios (a round's two \
         runs see the same level of the machine; each side's median depends on how many of its \
         runs a slow stretch fell on): idle under 1% of a core (auto's device CPU in the sweep); \
         auto within 5% of the best fixed timeout (at least 0.95); contended, never worse than \
         off (at least 1.00).",
        match r.fresh_rounds {
            1 => "1 round".to_string(),
            n => format!("{n} rounds"),
        },
        r.fresh_secs_per_run
    ));
    let mut d = Table::new(
        "7. Busy polling across loads, every cell",
        &[
            "load",
            "busy poll us",
            "main figure",
            "p50 us",
            "p99 us",
            "device CPU %",
            "device CPU us/frame",
            "poll hits/entries",
            "auto skipped/contended",
            "steal %",
        ],
    );
    for l in &r.loads {
        for s in &l.settings {
            let total = |f: fn(&Run) -> u64| s.runs.iter().map(f).sum::<u64>();
            let opt = |v: &Option<Summary>, prec| v.map_or("-".into(), |v| v.display(prec));
            d.row(vec![
                format!("{:?}", l.load).to_lowercase(),
                s.busy_poll.to_string(),
                s.main.display(l.load.precision()),
                opt(&s.p50_us, 1),
                opt(&s.p99_us, 1),
                s.device_cpu_pct.display(2),
                opt(&s.device_cpu_us_per_frame, 2),
                format!(
                    "{}/{}",
                    total(|r| r.busy_poll_hits),
                    total(|r| r.busy_poll_entries)
                ),
                match s.busy_poll {
                    BusyPoll::Auto => format!(
                        "{}/{}",
                        total(|r| r.busy_poll_skipped),
                        total(|r| r.busy_poll_contended)
                    ),
                    _ => "-".into(),
                },
                s.steal_pct.display(0),
            ]);
        }
    }
    d.note(
        "device CPU: the threads living through the run (the device's), from schedstat, over the \
         run's wall time (connection and drain included); per frame: over the frames it moved, tx \
         and rx. Poll counts are summed over the runs. Steal: the share of all CPUs' time the \
         hypervisor gave to others during the runs; every rate here falls as it rises.",
    );
    d.note(format!(
        "bursty: rr for {} ms, then nothing for {} ms, over and over; its rate counts the silences.",
        r.on_off.on.as_millis(),
        r.on_off.off.as_millis()
    ));
    vec![t, f, d]
}
