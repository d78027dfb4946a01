//! virtnet's driver half: a userspace virtio-net driver (spec 5.1.6), the way Linux's
//! virtio_net drives a device, over the vhost-user transport of [`frontend`], and the traffic
//! generator on top of it ([`gen`], `virtnet gen`):
//!
//! - [`frontend`]: the vhost-user frontend: connection, memory, queue set-up;
//! - [`tx`]: transmit with capacity stop/wake, delayed callbacks and bounded reclaim;
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

pub mod counters;
pub mod ctrl;
pub mod dim;
pub mod frontend;
pub mod gen;
mod net;
pub mod offload;
pub mod rx;
pub mod tx;

use vmm_sys_util::eventfd::EventFd;
use vring::{ErrorKind, GuestAddress};

use crate::frontend::{Allocator, FrontendError};
pub use counters::{CountersSnapshot, QueueCounters};
pub use ctrl::{CtrlError, CtrlMode, CtrlQueue, Reply};
pub use net::{DriverConfig, NetDriver, QueuePair, CTRL_FEATURES, DEFAULT_FEATURES};
pub use rx::{Count, Frames, PollMode, RxLayout, RxQueue, Sink};
#[cfg(feature = "experiments")]
pub use tx::TxTechniques;
pub use tx::{TxPolicy, TxQueue, TX_RECLAIM_BUDGET, TX_WORST_CASE_DESCS};

use counters::QueueCounters as Counters;

/// Driver errors: the device broke a queue, we asked for something impossible, or the
/// transport failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("virtqueue {vq} was broken by the device: {source}; it stays out of use")]
    Broken { vq: u16, source: vring::Error },
    #[error("virtqueue {vq}: {source}")]
    Ring { vq: u16, source: vring::Error },
    #[error("a {len}-byte frame does not fit a tx buffer ({max} bytes at most)")]
    FrameTooLarge { len: usize, max: usize },
    #[error("{0}")]
    Frontend(#[from] FrontendError),
    #[error("{0}")]
    Ctrl(#[from] CtrlError),
    #[error("the device did not negotiate {feature}, needed to {what}")]
    NotNegotiated {
        feature: &'static str,
        what: &'static str,
    },
    #[error("{wanted} queue pairs asked for, the device has {max}")]
    TooManyPairs { wanted: u16, max: u16 },
}

/// Maps an engine error on virtqueue `vq`: the device's fault breaks the queue (recorded in
/// its counters), anything else is ours.
fn ring_error(vq: u16, counters: &Counters, e: vring::Error) -> DriverError {
    if e.kind() == ErrorKind::Peer {
        if !counters.is_broken() {
            tracing::error!(vq, error = %e, "the device broke a virtqueue; it stays out of use");
        }
        counters.set_broken(e.to_string());
        DriverError::Broken { vq, source: e }
    } else {
        DriverError::Ring { vq, source: e }
    }
}

/// Packet buffers carved from frontend memory, one per token.
#[derive(Debug)]
struct BufPool {
    base: GuestAddress,
    buf_len: u32,
    /// Free slots. rx takes the oldest (FIFO, with the engine's FIFO descriptor reuse, so a
    /// buffer goes back to the descriptor and avail entry it had); tx the newest, whose
    /// lines are likeliest still in our cache.
    free: std::collections::VecDeque<u16>,
}

impl BufPool {
    fn new(alloc: &mut Allocator, count: u16, buf_len: u32) -> Result<BufPool, FrontendError> {
        let base = alloc.alloc(count as u64 * buf_len as u64, 64)?;
        Ok(BufPool {
            base,
            buf_len,
            free: (0..count).rev().collect(),
        })
    }
    fn addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.base.0 + slot as u64 * self.buf_len as u64)
    }
}

/// For unit tests that drive a queue's device side by hand: 1 MiB of memory, the setup of
/// virtqueue `index` (`size` entries, rings at 4 KiB, no indirect area, non-blocking
/// eventfds) and an allocator over the memory past the rings.
#[cfg(test)]
fn hand_built(
    index: u16,
    size: u16,
    features: vring::Features,
) -> (
    std::sync::Arc<vring::GuestMemory>,
    crate::frontend::QueueSetup,
    Allocator,
) {
    use crate::frontend::QueueSetup;
    use std::sync::Arc;
    use vring::{GuestMemory, QueueConfig, RingAddresses};
    const MEM: usize = 1 << 20;
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM)]).unwrap());
    let rings = RingAddresses::contiguous(GuestAddress(0x1000), size);
    let setup = QueueSetup {
        index,
        config: QueueConfig::new(size as u32, rings, features).unwrap(),
        indirect: None,
        kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        call: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
    };
    let alloc = Allocator::over(GuestAddress(0x1_0000), MEM as u64);
    (mem, setup, alloc)
}

/// Waits up to `timeout_ms` (negative: forever) for `fd` to become readable.
pub fn wait_readable(fd: &EventFd, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    virtnet_sys::wait_readable(fd.as_raw_fd(), timeout_ms)
}
