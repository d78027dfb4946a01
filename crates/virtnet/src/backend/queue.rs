//! A running virtqueue as a worker holds it: the engine's `DeviceQueue`, its notification
//! fds (kick, call, err), its metrics, and notification coalescing (NOTF_COAL, VIRTIO 1.2
//! 5.1.6.5.6).
//!
//! The queue's life on a worker: [`install_queue`] when the frontend starts it,
//! [`notify`] after each turn that used buffers, [`break_queue`] when the guest (or the host)
//! makes it unusable, [`retire_queue`] when the frontend stops it.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;
use vring::DeviceQueue;

use super::error::Error;
use super::metrics::QueueMetrics;

/// A running queue handed to a worker, with its notification fds and metrics.
#[derive(Debug)]
pub struct QueueRuntime {
    pub index: u16,
    pub queue: DeviceQueue,
    pub kick: EventFd,
    pub call: Option<EventFd>,
    pub err: Option<EventFd>,
    pub metrics: Arc<QueueMetrics>,
    /// Notification coalescing: a call the driver asked for but we hold back, since when,
    /// and the used count at the last call.
    held_since: Option<Instant>,
    used_at_last_call: u64,
    /// The engine's used-index store count already added to the metrics.
    stores_reported: u64,
}

impl QueueRuntime {
    pub fn new(
        index: u16,
        queue: DeviceQueue,
        kick: EventFd,
        call: Option<EventFd>,
        err: Option<EventFd>,
        metrics: Arc<QueueMetrics>,
    ) -> QueueRuntime {
        let used_at_last_call = queue.stats().used;
        let stores_reported = queue.stats().used_idx_stores;
        QueueRuntime {
            index,
            queue,
            kick,
            call,
            err,
            metrics,
            held_since: None,
            used_at_last_call,
            stores_reported,
        }
    }

    /// Whether the queue still works: neither the engine nor [`break_queue`] has marked it
    /// broken.
    pub fn usable(&self) -> bool {
        self.queue.broken().is_none() && !self.metrics.is_broken()
    }

    fn fire(&mut self) {
        if let Some(call) = &self.call {
            if call.write(1).is_err() {
                self.metrics.add(&self.metrics.counters.call_errors, 1);
            }
        }
        self.metrics.add(&self.metrics.counters.calls, 1);
        if self.held_since.take().is_some() {
            self.metrics.add(&self.metrics.counters.calls_coalesced, 1);
        }
        self.used_at_last_call = self.queue.stats().used;
    }

    /// When the held call is due, if one is held.
    pub fn call_deadline(&self) -> Option<Instant> {
        let since = self.held_since?;
        Some(since + Duration::from_micros(self.metrics.coalesce().max_usecs as u64))
    }

    /// Sends the held call if its time has come.
    pub fn fire_if_due(&mut self, now: Instant) {
        if self.call_deadline().is_some_and(|d| now >= d) {
            self.fire();
        }
    }

    /// Consumes a kick: reads the kick eventfd and counts it.
    pub fn take_kick(&self) {
        if self.kick.read().is_ok() {
            self.metrics.add(&self.metrics.counters.kicks, 1);
        }
    }
}

/// Puts a started queue in `slot` and watches its kick under epoll tag `tag`; a queue it
/// replaces is retired. A queue whose kick cannot be watched would never run: it is installed
/// broken, so the frontend hears of it (err eventfd, NEEDS_RESET) instead of waiting.
pub fn install_queue(epoll: &Epoll, slot: &mut Option<QueueRuntime>, q: QueueRuntime, tag: u64) {
    q.metrics.clear_broken();
    let watched = epoll.ctl(
        ControlOperation::Add,
        q.kick.as_raw_fd(),
        EpollEvent::new(EventSet::IN, tag),
    );
    if let Err(e) = watched {
        break_queue(&q, &Error::host("watching the kick eventfd")(e));
    }
    if let Some(old) = slot.replace(q) {
        retire_queue(epoll, old);
    }
}

/// Stops a queue: publishes its used batch, sends a call held back by coalescing, stops
/// watching its kick, and returns its next avail index (what GET_VRING_BASE reports).
pub fn retire_queue(epoll: &Epoll, mut q: QueueRuntime) -> u16 {
    q.queue.flush();
    if q.held_since.is_some() {
        q.fire();
    }
    // The kick may not be watched (see install_queue): nothing to undo then.
    let _ = epoll.ctl(
        ControlOperation::Delete,
        q.kick.as_raw_fd(),
        EpollEvent::default(),
    );
    q.queue.next_avail()
}

/// Marks a queue broken: logs once, counts, signals the frontend's error eventfd. The
/// engine refuses every later call on a queue the guest broke; a host failure is recorded
/// here, and the worker stops serving the queue from its metrics' broken flag.
pub fn break_queue(q: &QueueRuntime, e: &Error) {
    if q.metrics.set_broken(e.to_string()) {
        tracing::error!(queue = q.index, error = %e, "queue broken; it stays stopped until reset");
        if let Some(err) = &q.err {
            if err.write(1).is_err() {
                q.metrics.add(&q.metrics.counters.call_errors, 1);
            }
        }
    }
}

/// Publishes the used batch and sends the call if the driver asked for it, unless
/// coalescing holds it back: then it goes once `max_packets` completions accumulate or
/// `max_usecs` pass (the worker's timer), whichever is first. A held call is never dropped:
/// with EVENT_IDX the driver will not ask again until it has been woken.
pub fn notify(q: &mut QueueRuntime) {
    let need = q.queue.needs_notification();
    // Every used.idx store, including those add_used made when a batch filled.
    let stores = q.queue.stats().used_idx_stores;
    q.metrics.add(
        &q.metrics.counters.batches_flushed,
        stores - q.stores_reported,
    );
    q.stores_reported = stores;
    let coal = q.metrics.coalesce();
    if need && coal.is_off() {
        q.fire();
        return;
    }
    if need && q.held_since.is_none() {
        q.held_since = Some(Instant::now());
    }
    if q.held_since.is_none() {
        q.metrics.add(&q.metrics.counters.calls_suppressed, 1);
        return;
    }
    let used = q.queue.stats().used - q.used_at_last_call;
    if coal.is_off() || (coal.max_packets > 0 && used >= coal.max_packets as u64) {
        q.fire();
    } else {
        q.fire_if_due(Instant::now());
    }
}
