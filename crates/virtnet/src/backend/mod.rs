//! `virtnet backend`: a vhost-user-net device. It serves one frontend at a time (QEMU, DPDK
//! virtio-user, our own driver) over a unix socket, and forwards frames to a TAP device or
//! to the `null` / `echo` generators.
//!
//! - [`vhost`]: the protocol state of a connection.
//! - [`worker`]: the data path, one thread per queue pair.
//! - [`metrics`]: per-queue counters, JSON and Prometheus.
//!
//! The [`Device`] outlives connections: the TAP queues, workers and counters stay when a
//! frontend goes away, and the next connection (a QEMU `reconnect=1`) picks them up.

pub mod ctl;
pub mod metrics;
pub mod vhost;
pub mod worker;

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use ::vhost::vhost_user::message::VhostUserProtocolFeatures;
use ::vhost::vhost_user::{BackendReqHandler, Error as VuError};
use vring::Features;

use crate::sys::tap::{TapOffloads, TapQueue};
use metrics::{QueueMetrics, QueueReport};
use worker::{Io, WorkerHandle};

/// The vhost-user protocol features we implement. STATUS is not among them: rust-vmm
/// `vhost` 0.18 does not dispatch SET_STATUS/GET_STATUS to a backend.
pub const PROTOCOL_FEATURES: VhostUserProtocolFeatures = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CONFIG)
    .union(VhostUserProtocolFeatures::MTU);

/// The virtio features the device offers (on top of vhost-user's PROTOCOL_FEATURES bit).
pub fn device_features(pairs: u16) -> Features {
    let mut f = Features::VERSION_1
        | Features::RING_EVENT_IDX
        | Features::RING_INDIRECT_DESC
        | Features::NOTIFY_ON_EMPTY
        | Features::NET_MRG_RXBUF
        | Features::NET_CSUM
        | Features::NET_GUEST_CSUM
        | Features::NET_HOST_TSO4
        | Features::NET_HOST_TSO6
        | Features::NET_HOST_ECN
        | Features::NET_GUEST_TSO4
        | Features::NET_GUEST_TSO6
        | Features::NET_GUEST_ECN
        | Features::NET_MTU
        | Features::NET_STATUS
        | Features::NET_MAC;
    if pairs > 1 {
        f = f | Features::NET_MQ;
    }
    f
}

/// Where frames go, as chosen on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    Tap(String),
    Null { size: usize },
    Echo,
}

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub pairs: u16,
    pub io: IoMode,
    pub mac: [u8; 6],
    pub mtu: u16,
    pub busy_poll_us: u32,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            pairs: 1,
            io: IoMode::Null { size: 64 },
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            mtu: 1500,
            busy_poll_us: 0,
        }
    }
}

/// The device: configuration, TAP queues, workers and counters, shared by connections.
#[derive(Debug)]
pub struct Device {
    config: BackendConfig,
    taps: Vec<TapQueue>,
    workers: Vec<WorkerHandle>,
    metrics: Vec<Arc<QueueMetrics>>,
}

impl Device {
    pub fn new(config: BackendConfig) -> io::Result<Arc<Device>> {
        if config.pairs == 0 || config.pairs > 128 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "queue pairs must be 1..=128",
            ));
        }
        let n = 2 * config.pairs as usize;
        let metrics: Vec<_> = (0..n).map(|_| Arc::new(QueueMetrics::default())).collect();
        for m in &metrics {
            m.busy_poll_us.store(config.busy_poll_us, Relaxed);
        }
        let mut taps = Vec::new();
        let mut workers = Vec::new();
        for p in 0..config.pairs {
            let io = match &config.io {
                IoMode::Tap(name) => {
                    let q = TapQueue::open(name)?;
                    q.set_vnet_hdr_len(crate::net::HDR_LEN)?;
                    taps.push(TapQueue::open_clone(&q)?);
                    Io::Tap(q)
                }
                IoMode::Null { size } => Io::Null { size: *size },
                IoMode::Echo => Io::Echo,
            };
            workers.push(WorkerHandle::spawn(p, io)?);
        }
        Ok(Arc::new(Device {
            config,
            taps,
            workers,
            metrics,
        }))
    }

    pub fn num_queues(&self) -> usize {
        2 * self.config.pairs as usize
    }
    pub fn pairs(&self) -> u16 {
        self.config.pairs
    }
    pub fn mac(&self) -> [u8; 6] {
        self.config.mac
    }
    pub fn mtu(&self) -> u16 {
        self.config.mtu
    }
    pub fn offered_features(&self) -> Features {
        device_features(self.config.pairs)
    }
    pub fn metrics(&self, queue: usize) -> Arc<QueueMetrics> {
        self.metrics[queue].clone()
    }
    pub fn worker(&self, queue: usize) -> &WorkerHandle {
        &self.workers[queue / 2]
    }

    /// Sets the busy-poll timeout of one queue, or of all.
    pub fn set_busy_poll(&self, us: u32, queue: Option<usize>) -> Result<(), String> {
        match queue {
            Some(q) => self
                .metrics
                .get(q)
                .ok_or(format!("no queue {q}"))?
                .busy_poll_us
                .store(us, Relaxed),
            None => self
                .metrics
                .iter()
                .for_each(|m| m.busy_poll_us.store(us, Relaxed)),
        }
        Ok(())
    }

    /// Applies the negotiated header length and guest offloads to every TAP queue.
    pub fn configure_tap(&self, hdr_len: usize, offloads: TapOffloads) -> io::Result<()> {
        for t in &self.taps {
            t.set_vnet_hdr_len(hdr_len)?;
            t.set_offloads(offloads)?;
        }
        Ok(())
    }

    pub fn reports(&self) -> Vec<QueueReport> {
        self.metrics
            .iter()
            .enumerate()
            .map(|(i, m)| QueueReport::new(i as u16, if i % 2 == 0 { "rx" } else { "tx" }, m))
            .collect()
    }
}

/// Serves one frontend connection until it goes away or breaks the protocol, then stops its
/// queues. Never panics on frontend input.
pub fn serve_connection(device: &Arc<Device>, stream: UnixStream) {
    let conn = Arc::new(Mutex::new(vhost::Connection::new(device.clone())));
    let mut handler = BackendReqHandler::from_stream(stream, conn.clone());
    loop {
        match handler.handle_request() {
            Ok(()) => {}
            Err(VuError::Disconnected) | Err(VuError::PartialMessage) => {
                tracing::info!("frontend disconnected");
                break;
            }
            Err(e) => {
                let must_close = conn.lock().map(|c| c.must_disconnect).unwrap_or(true);
                let socket_level = matches!(
                    e,
                    VuError::SocketBroken(_)
                        | VuError::SocketError(_)
                        | VuError::SocketRetry(_)
                        | VuError::InvalidMessage
                        | VuError::OversizedMsg
                        | VuError::IncorrectFds
                );
                tracing::warn!(error = %e, "vhost-user request failed");
                if must_close || socket_level {
                    tracing::warn!("closing the connection");
                    break;
                }
            }
        }
    }
    drop(handler);
    match conn.lock() {
        Ok(mut c) => c.stop_all(),
        Err(poisoned) => poisoned.into_inner().stop_all(),
    };
}

/// Accepts frontends one after another until `stop` is set.
pub fn serve(device: Arc<Device>, listener: UnixListener, stop: Arc<AtomicBool>) -> io::Result<()> {
    for stream in listener.incoming() {
        if stop.load(Relaxed) {
            break;
        }
        match stream {
            Ok(s) => {
                tracing::info!("frontend connected");
                serve_connection(&device, s);
            }
            Err(e) => tracing::warn!(error = %e, "accept failed"),
        }
    }
    Ok(())
}
