//! A worker's busy poll (the technique of vhost_net's busy polling, with rx polled from the
//! tx path): how long to poll, by the queue's setting or auto's budget (`crate::poll`), and
//! the loop that spins with notifications off until work shows up or one of its exits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Pair, Worker};
use crate::metrics::QueueCounters;
use crate::poll::PollExit;
use crate::poll::{BusyPoll, Check};
use crate::siblings::Sibling;

impl Worker {
    /// How long to poll now, in microseconds, by the first usable queue's setting; None:
    /// do not poll.
    pub(super) fn poll_budget(&mut self) -> Option<(u32, Arc<QueueCounters>)> {
        let q = self
            .pairs
            .iter()
            .flatten()
            .flat_map(Pair::queues)
            .find(|q| q.usable())?;
        let (counters, tunables) = (q.counters(), q.tunables());
        let us = match tunables.busy_poll() {
            BusyPoll::Off => return None,
            BusyPoll::Fixed(us) => us,
            BusyPoll::Auto => {
                let now = Instant::now();
                if self.auto.check_due(now) {
                    let sched = self.sibling.as_ref().and_then(Sibling::sample);
                    if self.auto.check(now, sched) == Check::Contended {
                        counters.busy_poll_contended.add(1);
                    }
                }
                let us = self.auto.budget(now);
                tunables.set_auto_budget(us);
                if us == 0 {
                    counters.busy_poll_skipped.add(1);
                    return None;
                }
                us
            }
        };
        Some((us, counters.clone()))
    }

    /// Spins with notifications off until work shows up, other work is pending, the CPU is
    /// wanted elsewhere, a signal is pending, or the time is up. None when not polling.
    pub(super) fn busy_poll(&mut self) -> Option<PollExit> {
        let (us, counters) = self.poll_budget()?;
        counters.busy_poll_entries.add(1);
        self.disarm_notifications();
        let deadline = Instant::now() + Duration::from_micros(us as u64);
        let switches = virtnet_sys::involuntary_switches();
        let poll_rx = self.config.poll_rx_from_tx;
        let mut spins = 0u32;
        let exit = loop {
            if self.inbox.pending() {
                break if self.inbox.shutting_down() {
                    PollExit::Shutdown
                } else {
                    PollExit::OtherWork
                };
            }
            if self
                .pairs
                .iter_mut()
                .flatten()
                .any(|p| p.poll_hit(spins, poll_rx))
            {
                break PollExit::Hit;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                let now = Instant::now();
                if now >= deadline {
                    break PollExit::Timeout;
                }
                if self.next_call_deadline().is_some_and(|d| now >= d) {
                    break PollExit::OtherWork; // A held call is due.
                }
                if virtnet_sys::involuntary_switches() != switches {
                    break PollExit::Yield;
                }
                if virtnet_sys::signal_pending() {
                    break PollExit::Signal;
                }
            }
            std::hint::spin_loop();
        };
        counters.poll_exit(exit);
        self.auto.record_exit(exit);
        Some(exit)
    }
}
