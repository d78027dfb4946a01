//! A queue's configuration as the driver set it up, before it runs.
//!
//! The typestate: a [`QueueConfig`] holds the numbers a driver chose (size, ring addresses,
//! negotiated features), checked only for shape. `DeviceQueue::activate` and
//! `DriverQueue::activate` check them against memory and yield a running queue, which never
//! holds an unchecked address.

use crate::layout::{check_queue_size, RingAddresses};
use crate::{Error, Features};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    size: u16,
    rings: RingAddresses,
    features: Features,
}

impl QueueConfig {
    /// `size` must be a power of two from 1 to 32768; `features` are the negotiated ones (the
    /// ring cares about EVENT_IDX, INDIRECT_DESC, NOTIFY_ON_EMPTY and IN_ORDER).
    pub fn new(size: u32, rings: RingAddresses, features: Features) -> Result<QueueConfig, Error> {
        Ok(QueueConfig {
            size: check_queue_size(size)?,
            rings,
            features,
        })
    }

    pub fn size(&self) -> u16 {
        self.size
    }
    pub fn rings(&self) -> RingAddresses {
        self.rings
    }
    pub fn features(&self) -> Features {
        self.features
    }
    pub(crate) fn event_idx(&self) -> bool {
        self.features.contains(Features::RING_EVENT_IDX)
    }
    pub(crate) fn indirect(&self) -> bool {
        self.features.contains(Features::RING_INDIRECT_DESC)
    }
    pub(crate) fn in_order(&self) -> bool {
        self.features.contains(Features::IN_ORDER)
    }
    pub(crate) fn notify_on_empty(&self) -> bool {
        self.features.contains(Features::NOTIFY_ON_EMPTY)
    }
}
