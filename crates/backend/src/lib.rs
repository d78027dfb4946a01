//! `virtnet backend`: a vhost-user-net device. It serves one frontend at a time (QEMU, DPDK
//! virtio-user, our own driver) over a unix socket, and forwards frames to a TAP device or
//! to the `null` / `echo` generators.
//!
//! The parts, from the socket down (each uses only those below it):
//! - [`session`]: accepting frontends (or, in client mode, connecting to one) and serving one
//!   connection's requests; [`gate`]: when a request may be read (whole on the socket, a
//!   reply sendable), and the deadlines that drop a frontend keeping it from being so;
//! - [`vhost`]: the vhost-user protocol state of a connection; [`intercept`]: the requests
//!   its message layer does not dispatch, [`status`] (SET/GET_STATUS), [`mtu`]
//!   (NET_SET_MTU) and [`rarp`] (SEND_RARP, the announcement after a live migration);
//! - [`device`]: the device and its worker threads;
//! - [`ctrlq`]: the control virtqueue (spec 5.1.6.5) on its own thread;
//! - [`worker`]: a data thread serving one or more queue pairs (turns, busy polling,
//!   sleeping); [`pair`]: one pair as a worker serves it; [`poll`]: the busy-poll setting and
//!   the auto policy;
//! - [`tx`]: guest transmit to the host port (headers checked once, push-back); [`rx`]: guest
//!   receive into posted buffers (the receive policy); [`turn`]: a queue's share of a turn;
//! - [`host`]: the host ports (tap, null, echo, socket), passive, and their control plane;
//! - [`shared`]: the state the device's parts share; [`config`]: its configuration;
//! - [`thread`]: a worker's thread and command channel; [`queue`]: a running queue, its
//!   notifications and coalescing; [`hold`]: holding calls while the driver is busy;
//! - [`metrics`]: per-queue counters, JSON and Prometheus; [`ctl`]: the control socket of
//!   `virtnet ctl`, and /metrics; [`endpoint`]: how both serve their clients (bounded, the
//!   longest waiting evicted, under deadlines); [`error`]: why a queue broke.
//!
//! With the `fuzzing` cargo feature, which only fuzz/ enables, the `fuzzing` module makes
//! public what the fuzz targets drive directly: the device state alone, a queue runtime, the
//! control queue's command loop, and a session served one request at a time.

#![forbid(unsafe_code)]

pub mod ab;
pub mod config;
pub mod ctl;
pub mod ctrlq;
pub mod device;
pub mod endpoint;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gate;
pub mod hold;
pub mod host;
pub mod intercept;
pub mod metrics;
pub mod mtu;
pub mod pair;
pub mod poll;
pub mod queue;
pub mod rarp;
pub mod rx;
pub mod session;
pub mod shared;
pub mod siblings;
pub mod status;
pub mod switch;
#[cfg(test)]
mod testing;
pub mod thread;
pub mod turn;
pub mod tx;
pub mod vhost;
pub mod worker;

pub use config::{BackendConfig, IoMode, TapIo, MAX_MTU, MAX_PAIRS, MIN_MTU};
pub use device::{Device, DeviceReport};
pub use error::Error;
pub use host::tap::tap_features;
pub use poll::BusyPoll;
pub use queue::{QueueId, QueueRuntime};
pub use session::{serve, serve_client, serve_connection, RequestHandler, Session};
pub use shared::{device_features, Shared, PROTOCOL_FEATURES};
