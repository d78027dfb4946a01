//! The driver half's transport: a vhost-user frontend (vhost-user spec, "Front-end message
//! types") on rust-vmm `vhost`, like DPDK's virtio-user.
//!
//! The frontend owns its memory: one memfd region shared with the backend through
//! SET_MEM_TABLE, from which rings, indirect tables and packet buffers are carved. Ring
//! addresses travel as frontend virtual addresses, as QEMU sends them.
//!
//! The parts: the handshake, from connecting to the end of its deadline (`handshake`); the
//! frontend's memory and its allocator (`memory`); the virtqueues set up with the backend
//! (`queues`); and what the driver asks of the device beyond its queues: status, MTU, config
//! space, and whether it is still there (`device`).

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost::vhost_user::Frontend;
use virtnet_sys::PeerEventFd;
use vring::{Features, GuestMemory};

mod device;
mod handshake;
mod memory;
mod queues;

use handshake::Watchdog;
pub use handshake::HANDSHAKE_TIMEOUT;
pub use memory::Allocator;
pub use queues::QueueSetup;

/// Frontend errors: the transport failed, or the backend cannot give what we need.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("cannot connect to {path}: {source}")]
    Connect { path: String, source: vhost::Error },
    #[error("vhost-user {request} failed: {source}")]
    Request {
        request: &'static str,
        source: vhost::Error,
    },
    #[error("backend lacks required features {missing}")]
    MissingFeatures { missing: Features },
    #[error("guest memory: {0}")]
    Memory(#[from] vring::Error),
    #[error("eventfd: {0}")]
    EventFd(#[from] std::io::Error),
    #[error("queue {index} was never set up")]
    NoSuchQueue { index: usize },
    #[error("virtqueue {index} cannot be named: vhost-user's SET_VRING_KICK/CALL carry 8 bits")]
    QueueIndex { index: u16 },
    #[error("out of frontend memory: {wanted} bytes more needed")]
    OutOfMemory { wanted: u64 },
    #[error("the backend did not finish the vhost-user handshake within {after:?}")]
    Timeout { after: Duration },
    #[error("vhost-user {request}: {reason}")]
    Status {
        request: &'static str,
        reason: String,
    },
}

/// The virtio device status bits (spec 2.1) a driver sets, in the order it sets them.
pub mod status {
    use virtio_bindings::virtio_config as c;
    pub const ACKNOWLEDGE: u8 = c::VIRTIO_CONFIG_S_ACKNOWLEDGE as u8;
    pub const DRIVER: u8 = c::VIRTIO_CONFIG_S_DRIVER as u8;
    pub const FEATURES_OK: u8 = c::VIRTIO_CONFIG_S_FEATURES_OK as u8;
    pub const DRIVER_OK: u8 = c::VIRTIO_CONFIG_S_DRIVER_OK as u8;
}

fn req(request: &'static str) -> impl FnOnce(vhost::Error) -> FrontendError {
    move |source| FrontendError::Request { request, source }
}

/// A connected, negotiated vhost-user device.
pub struct Connection {
    frontend: Frontend,
    /// The same socket, for SET_STATUS, GET_STATUS and NET_SET_MTU, which rust-vmm's
    /// `Frontend` cannot send.
    raw: UnixStream,
    /// Armed from connecting until [`Connection::finish_handshake`].
    watchdog: Option<Watchdog>,
    /// The status last set (0 until [`Connection::set_status`]).
    status: u8,
    pub features: Features,
    pub protocol: VhostUserProtocolFeatures,
    pub mem: Arc<GuestMemory>,
    pub alloc: Allocator,
    pub queues: Vec<QueueSetup>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("features", &self.features)
            .field("queues", &self.queues.len())
            .finish()
    }
}

/// Waits up to `timeout_ms` (negative: forever) for `fd` to become readable.
pub fn wait_readable(fd: &PeerEventFd, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    virtnet_sys::wait_readable(fd.as_raw_fd(), timeout_ms)
}
