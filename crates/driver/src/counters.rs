//! Per-queue driver counters (`vnet::stats`): written by the one thread that owns the queue
//! and read at any time by others (`virtnet gen`'s rate lines, DIM's sampler, tests).

pub use vnet::stats::Counter;

vnet::counters! {
    /// The counters of one driver queue (rx or tx), and its broken state.
    pub struct QueueCounters / CountersSnapshot with broken {
        /// Frames moved (tx: handed to the device; rx: received) and their bytes, header excluded.
        packets,
        bytes,
        /// Kicks written to the device's kick eventfd, and writes that failed (the device's fd
        /// is full or not an eventfd): the kick is lost, so they are counted.
        kicks,
        kick_errors,
        /// Call eventfd reads that found a notification (interrupts).
        interrupts,
        /// tx: times the queue stopped for lack of descriptors or buffers, and restarts.
        stops,
        wakes,
        /// tx: frames that found the ring full and were not sent (the caller retries them); only
        /// with capacity stop/wake off, else the queue stops before the ring fills.
        ring_full,
        /// tx: completions reclaimed.
        completed,
        /// rx: frames dropped because the device described them badly (short, bad num_buffers).
        dropped,
        /// rx: NAPI rounds, and rounds whose re-check after enabling callbacks found more work.
        polls,
        rechecks,
        /// tx: frames sent with checksum offload (NEEDS_CSUM) and with segmentation offload (GSO).
        csum_offloaded,
        gso_offloaded,
        /// tx: frames in flight taken back without the device (`TxQueue::abandon`, when gen's
        /// connection is lost): the device went away before completing them, or completed them
        /// unseen if not reclaimed first.
        abandoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_queue_shows_in_its_snapshot_and_totals() {
        let (a, b) = (QueueCounters::default(), QueueCounters::default());
        a.packets.add(3);
        b.packets.add(4);
        b.set_broken("used id 9 out of range".into());
        let mut t = CountersSnapshot::default();
        t.accumulate(&a.snapshot());
        t.accumulate(&b.snapshot());
        assert_eq!(t.packets, 7);
        assert_eq!(t.broken.as_deref(), Some("used id 9 out of range"));
    }
}
