//! Median, minimum and maximum of repeated measurements.

use serde::Serialize;

/// The spread of one figure over repeats: what every timing figure is reported as.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: usize,
}

impl Summary {
    /// Summarises `samples`; `None` if there are none. NaNs sort last.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: s[0],
            max: s[n - 1],
            runs: n,
        })
    }

    /// Summarises the figures of runs that took place: at least one, or it panics (the
    /// experiments call it with the runs they made).
    pub fn of_runs(runs: impl IntoIterator<Item = f64>) -> Summary {
        Summary::of(&runs.into_iter().collect::<Vec<_>>()).expect("at least one run")
    }

    /// `median (min..max)` with `prec` decimals, or just the median for a single run.
    pub fn display(&self, prec: usize) -> String {
        if self.runs <= 1 {
            format!("{:.prec$}", self.median)
        } else {
            format!(
                "{:.prec$} ({:.prec$}..{:.prec$})",
                self.median, self.min, self.max
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.runs), (2.0, 1.0, 3.0, 3));
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Summary::of(&[]).is_none());
        assert_eq!(Summary::of(&[1.5]).unwrap().display(2), "1.50");
    }
}
