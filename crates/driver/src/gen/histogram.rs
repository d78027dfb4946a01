//! The latency histogram of `rr` mode.

use super::Latency;

/// A log-linear latency histogram: exact below 64 ns, then 32 buckets per power of two
/// (about 3% resolution), in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: u128,
    min: u64,
    max: u64,
}

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; (2 * SUB + 64 * SUB) as usize],
            total: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if v < 2 * SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        let mantissa = v >> shift; // in [SUB, 2 * SUB)
        (2 * SUB + (shift as u64 - 1) * SUB + (mantissa - SUB)) as usize
    }

    /// The middle of bucket `i`'s value range.
    fn value(i: usize) -> f64 {
        let i = i as u64;
        if i < 2 * SUB {
            return i as f64;
        }
        let shift = (i - 2 * SUB) / SUB + 1;
        let mantissa = (i - 2 * SUB) % SUB + SUB;
        let low = mantissa << shift;
        low as f64 + ((1u64 << shift) as f64 - 1.0) / 2.0
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum += ns as u128;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.sum += o.sum;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0..=1), in nanoseconds.
    pub fn quantile(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i).clamp(self.min as f64, self.max as f64);
            }
        }
        self.max as f64
    }

    pub(super) fn latency(&self) -> Latency {
        let us = |ns: f64| ns / 1000.0;
        Latency {
            samples: self.total,
            min_us: us(if self.total == 0 {
                0.0
            } else {
                self.min as f64
            }),
            p50_us: us(self.quantile(0.5)),
            p99_us: us(self.quantile(0.99)),
            p999_us: us(self.quantile(0.999)),
            max_us: us(self.max as f64),
            mean_us: us(self.sum as f64 / self.total.max(1) as f64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_monotonic_and_close() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 20, 123_456_789, u64::MAX / 4]) {
            let i = Histogram::index(v);
            assert!(
                i >= last || v < 100_000 && i == last,
                "index goes back at {v}"
            );
            last = last.max(i);
            let mid = Histogram::value(i);
            assert!(
                (mid - v as f64).abs() <= v as f64 / 32.0 + 1.0,
                "{v} -> {mid}"
            );
        }
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::default();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((p50 - 500_000.0).abs() < 500_000.0 * 0.04, "{p50}");
        let p99 = h.quantile(0.99);
        assert!((p99 - 990_000.0).abs() < 990_000.0 * 0.04, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000.0);
        let mut g = Histogram::default();
        g.record(5);
        h.merge(&g);
        assert_eq!((h.count(), h.quantile(0.0)), (1001, 5.0));
        assert_eq!(Histogram::default().quantile(0.5), 0.0);
    }
}
