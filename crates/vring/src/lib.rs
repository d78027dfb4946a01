//! vring: the VIRTIO 1.2 split virtqueue (spec section 2.7), driver and device sides, over
//! shared memory.
//!
//! - [`memory`]: guest memory regions and checked translation (the crate's only `unsafe`),
//!   and the dirty log of live migration ([`DirtyLog`]), which a [`DeviceQueue`] marks.
//! - [`layout`]: ring sizes, offsets and flags; [`event`]: `vring_need_event`.
//! - [`QueueConfig`] is a queue as configured; [`DeviceQueue::activate`] and
//!   [`DriverQueue::activate`] check it against memory and start it.
//! - [`DeviceQueue`]: pop validated [`Chain`]s, batched used publish, notification decisions.
//! - [`DriverQueue`]: add chains (direct or indirect), kick decisions, reclaim, callbacks.
//! - [`PollPace`]: how soon a device that keeps finding a little work looks again.
//! - [`RingPosition`]: where a device stands in its ring (vhost-user's vring base).
//! - [`cursor`]: a chain's bytes as one stream: [`Reader`] copies them out once each,
//!   [`Writer`] copies into them (from this process, or from another chain), [`Tail`] is what
//!   is left, [`Gather`] a checked copy followed by a tail, to write.
//!
//! The crate starts no threads and opens no files: kicks and calls are the caller's business.
//! Mapping a peer's files ([`GuestMemory::from_sources`]) installs a SIGBUS handler, once, so
//! that a peer shrinking a file does not kill the process (`memory/fault.rs`).
//! Its only I/O is [`GuestMemory::writev_to`] and [`GuestMemory::readv_from`], vectored I/O
//! between guest memory and a file descriptor the caller lends.

#![deny(unsafe_code)]

pub mod chain;
pub mod config;
pub mod cursor;
pub mod device;
pub mod driver;
pub mod error;
pub mod event;
pub mod features;
pub mod layout;
#[allow(unsafe_code)]
pub mod memory;
pub mod pace;
pub mod position;
mod ring;
pub mod sync;
#[cfg(test)]
mod testutil;

pub use chain::{Chain, Segment, MAX_CHAIN_SEGMENTS};
pub use config::QueueConfig;
pub use cursor::{Gather, Reader, Tail, Writer};
pub use device::{DeviceQueue, DeviceStats, DEFAULT_USED_BATCH};
pub use driver::{Buf, DriverQueue, DriverStats, IndirectArea};
pub use error::{Error, ErrorKind};
pub use event::vring_need_event;
pub use features::Features;
pub use layout::RingAddresses;
pub use memory::{DirtyLog, GuestAddress, GuestMemory, UringWriter, MAX_IOVECS};
pub use pace::PollPace;
pub use position::{AvailMark, RingPosition};
