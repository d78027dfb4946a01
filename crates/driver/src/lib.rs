//! virtnet's driver half: a userspace virtio-net driver (spec 5.1.6), the way Linux's
//! virtio_net drives a device, over the vhost-user transport of [`frontend`], and the traffic
//! generator on top of it ([`gen`], `virtnet gen`):
//!
//! - [`frontend`]: the vhost-user frontend: connection, memory, queue set-up;
//! - [`tx`]: transmit with capacity stop/wake, delayed callbacks and bounded reclaim;
//! - [`cb_delay`]: how long a stopped transmit queue waits for its interrupt;
//! - [`rx`]: receive with mergeable, big or small buffers and NAPI-style polling;
//! - [`offload`]: checksum and TSO flags in the net header;
//! - [`ctrl`]: the control queue, interrupt-driven and concurrent, or polling;
//! - [`dim`]: dynamic interrupt moderation through VQ_NOTF_COAL;
//! - [`counters`]: per-queue lock-free counters;
//! - [`NetDriver`] (in `net`): a connected device with its queue pairs and control queue.
//!
//! Frames are copied into and out of buffers in the frontend's own memory. Nothing the device
//! writes indexes our tables unchecked: used ids are checked by the ring engine against its
//! in-flight table, and a device that breaks a ring breaks only that queue, with
//! [`DriverError::Broken`] naming it.

#![forbid(unsafe_code)]

pub mod cb_delay;
pub mod counters;
pub mod ctrl;
pub mod dim;
mod error;
pub mod frontend;
pub mod gen;
mod net;
pub mod offload;
mod pool;
pub mod rx;
#[cfg(test)]
mod testing;
pub mod tx;

pub use counters::{CountersSnapshot, QueueCounters};
pub use ctrl::{CtrlError, CtrlMode, CtrlQueue, Reply};
pub use net::{DriverConfig, NetDriver, QueuePair, CTRL_FEATURES, DEFAULT_FEATURES};
pub use rx::{Count, Frames, PollMode, RxLayout, RxQueue, Sink};
#[cfg(feature = "experiments")]
pub use tx::TxTechniques;
pub use tx::{TxPolicy, TxQueue, TX_RECLAIM_BUDGET, TX_WORST_CASE_DESCS};

use error::ring_error;
pub use error::DriverError;
pub use frontend::wait_readable;
use pool::BufPool;
#[cfg(test)]
use testing::hand_built;
