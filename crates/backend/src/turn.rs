//! A queue's share of one turn of its worker: vhost_net's weights, so that one busy queue
//! leaves the others their turn.

use super::queue::QueueRuntime;

/// vhost_net's VHOST_NET_PKT_WEIGHT and VHOST_NET_WEIGHT: a queue's share of one turn.
pub const WEIGHT_PACKETS: usize = 256;
pub const WEIGHT_BYTES: u64 = 512 * 1024;

/// What one turn of a queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Turn {
    /// Frames moved (and frames consumed without being delivered).
    pub frames: usize,
    /// Stopped at the weight: more work is probably waiting.
    pub exhausted: bool,
}

impl Turn {
    /// Whether the turn has used up its weight with `bytes` moved, counting it on `q` if so.
    pub fn at_weight(&mut self, bytes: u64, q: &QueueRuntime) -> bool {
        if self.frames >= WEIGHT_PACKETS || bytes >= WEIGHT_BYTES {
            self.exhausted = true;
            q.counters().weight_exhausted.add(1);
        }
        self.exhausted
    }
}
