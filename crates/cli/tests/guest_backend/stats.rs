//! The counters the checks compare: `virtnet ctl stats` parsed (the backend's counters per
//! queue, summed per kind, deltas over a run), and the TAP's counters over a run.

use std::collections::BTreeMap;

/// One queue of `virtnet ctl stats`.
#[derive(Debug, Clone, Default)]
pub struct QueueStats {
    pub kind: String,
    pub broken: Option<String>,
    pub busy_poll_us: u64,
    pub counters: BTreeMap<String, u64>,
}

/// `virtnet ctl stats`, per queue (rx0, tx0, rx1, tx1, ..., ctrl).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub queues: Vec<QueueStats>,
    /// The device report's SET_STATUS count for the current connection.
    pub status_sets: u64,
    /// The device report's MTU.
    pub device_mtu: u64,
}

impl Stats {
    pub fn parse(json: &str) -> Stats {
        let v: serde_json::Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("ctl stats: {e}: {json}"));
        let queues = v["queues"]
            .as_array()
            .unwrap_or_else(|| panic!("no queues in {json}"))
            .iter()
            .map(|q| {
                let counters = q
                    .as_object()
                    .unwrap()
                    .iter()
                    .filter(|(k, _)| !k.starts_with("coalesce") && *k != "index")
                    .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                    .collect();
                QueueStats {
                    kind: q["kind"].as_str().unwrap_or_default().to_string(),
                    broken: q["broken"].as_str().map(str::to_string),
                    busy_poll_us: q["busy_poll_us"].as_u64().unwrap_or_default(),
                    counters,
                }
            })
            .collect();
        let status_sets = v["device"]["status_sets"].as_u64().unwrap_or_default();
        let device_mtu = v["device"]["mtu"].as_u64().unwrap_or_default();
        Stats {
            queues,
            status_sets,
            device_mtu,
        }
    }

    /// A counter of virtqueue `index`.
    pub fn get(&self, index: usize, name: &str) -> u64 {
        self.queues
            .get(index)
            .and_then(|q| q.counters.get(name))
            .copied()
            .unwrap_or_else(|| panic!("no counter {name} of queue {index} in {self:?}"))
    }

    /// A counter summed over the queues of one kind ("rx", "tx").
    pub fn sum(&self, kind: &str, name: &str) -> u64 {
        (0..self.queues.len())
            .filter(|&i| self.queues[i].kind == kind)
            .map(|i| self.get(i, name))
            .sum()
    }

    /// A counter summed over every queue.
    pub fn total(&self, name: &str) -> u64 {
        self.sum("rx", name) + self.sum("tx", name) + self.sum("ctrl", name)
    }

    /// The counters moved since `before` (queue states from `self`).
    pub fn since(&self, before: &Stats) -> Stats {
        let mut delta = self.clone();
        for (i, q) in delta.queues.iter_mut().enumerate() {
            for (name, value) in q.counters.iter_mut() {
                let old = before
                    .queues
                    .get(i)
                    .and_then(|b| b.counters.get(name))
                    .copied()
                    .unwrap_or(0);
                *value = value.saturating_sub(old);
            }
        }
        delta
    }

    pub fn broken(&self) -> Vec<String> {
        self.queues
            .iter()
            .enumerate()
            .filter_map(|(i, q)| Some(format!("queue {i}: {}", q.broken.as_ref()?)))
            .collect()
    }

    /// One line per data queue with the counters that matter here, for the test log.
    pub fn summary(&self) -> String {
        let keys = [
            "packets",
            "bytes",
            "dropped",
            "filtered",
            "kicks",
            "calls",
            "calls_suppressed",
            "batches_flushed",
            "busy_poll_entries",
            "busy_poll_hits",
            "busy_poll_timeouts",
            "busy_poll_exit_yield",
            "weight_exhausted",
        ];
        self.queues
            .iter()
            .enumerate()
            .filter(|(_, q)| q.kind != "ctrl")
            .map(|(i, q)| {
                let fields: Vec<String> = keys
                    .iter()
                    .map(|k| format!("{k}={}", q.counters.get(*k).copied().unwrap_or(0)))
                    .collect();
                format!("  {} {i}: {}", q.kind, fields.join(" "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The TAP's counters moved since `before`.
pub fn tap_delta(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.saturating_sub(before.get(k).copied().unwrap_or(0)),
            )
        })
        .collect()
}
