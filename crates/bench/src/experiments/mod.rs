//! What `virtnet bench` runs: a numbered list of experiments, each in its own module, each
//! producing tables for people and a JSON value for machines.
//!
//! Experiment 0 measures the ring engine alone. Experiments 1 to 6 reproduce the seed
//! techniques' measurements (issue 5), each with the seed's published figure beside ours:
//! [`event_idx`], [`used_batch`], [`busy_poll`], [`rx_from_tx`], [`ctrl`], [`tx_completion`];
//! experiment 7 ([`poll_loads`]) takes busy polling's settings across loads, auto among
//! them; experiment 8 ([`switch`]) sends from guest to guest through `virtnet switch`;
//! [`common`] holds the in-process backend they share.

pub mod busy_poll;
pub mod common;
pub mod ctrl;
pub mod event_idx;
pub mod poll_loads;
pub mod ring;
pub mod rx_from_tx;
pub mod switch;
pub mod tx_completion;
pub mod used_batch;

use serde::Serialize;

use crate::table::Table;
use crate::BenchError;

/// How much to measure.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// A few seconds in all, for CI: fewer and shorter runs. Counts stay meaningful; times
    /// are rough.
    pub quick: bool,
    /// Repeats of each measurement, interleaved; `None` for the experiment's default.
    pub repeats: Option<u32>,
}

/// What an experiment reports.
#[derive(Debug)]
pub struct Outcome {
    pub tables: Vec<Table>,
    pub json: serde_json::Value,
}

impl Outcome {
    /// An experiment's tables, and its results as JSON.
    pub fn new<R: Serialize>(tables: Vec<Table>, results: &R) -> Result<Outcome, BenchError> {
        let json =
            serde_json::to_value(results).map_err(|e| BenchError::Inconsistent(e.to_string()))?;
        Ok(Outcome { tables, json })
    }
}

/// Progress lines, for a display while an experiment runs.
pub type Progress<'a> = &'a mut dyn FnMut(&str);

/// One experiment.
#[derive(Clone, Copy, Debug)]
pub struct Experiment {
    pub id: u32,
    pub name: &'static str,
    pub summary: &'static str,
    pub run: fn(&Options, Progress<'_>) -> Result<Outcome, BenchError>,
}

/// Every experiment, by number.
pub const ALL: &[Experiment] = &[
    ring::EXPERIMENT,
    event_idx::EXPERIMENT,
    used_batch::EXPERIMENT,
    busy_poll::EXPERIMENT,
    rx_from_tx::EXPERIMENT,
    ctrl::EXPERIMENT,
    tx_completion::EXPERIMENT,
    poll_loads::EXPERIMENT,
    switch::EXPERIMENT,
];

/// The experiments numbered in `only`, in that order; all of them when `only` is empty.
pub fn select(only: &[u32]) -> Result<Vec<&'static Experiment>, BenchError> {
    if only.is_empty() {
        return Ok(ALL.iter().collect());
    }
    only.iter()
        .map(|&id| {
            ALL.iter()
                .find(|e| e.id == id)
                .ok_or(BenchError::UnknownExperiment(id))
        })
        .collect()
}

/// The JSON document `virtnet bench --json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    pub quick: bool,
    pub experiments: Vec<ExperimentReport>,
}

#[derive(Debug, Serialize)]
pub struct ExperimentReport {
    pub id: u32,
    pub name: &'static str,
    pub results: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_by_number() {
        assert_eq!(select(&[]).unwrap().len(), ALL.len());
        assert_eq!(select(&[0]).unwrap()[0].name, "ring");
        assert!(matches!(
            select(&[0, 99]),
            Err(BenchError::UnknownExperiment(99))
        ));
    }
}
