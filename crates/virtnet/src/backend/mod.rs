//! `virtnet backend`: a vhost-user-net device. It serves one frontend at a time (QEMU, DPDK
//! virtio-user, our own driver) over a unix socket, and forwards frames to a TAP device or
//! to the `null` / `echo` generators.
//!
//! - [`vhost`]: the protocol state of a connection.
//! - [`worker`]: the data path, one thread per queue pair.
//! - [`ctrlq`]: the control virtqueue (spec 5.1.6.5).
//! - [`metrics`]: per-queue counters, JSON and Prometheus.
//! - [`ctl`]: the control socket of `virtnet ctl`, and /metrics.
//!
//! The [`Device`] outlives connections: the TAP queues, workers and counters stay when a
//! frontend goes away, and the next connection (a QEMU `reconnect=1`) picks them up.

pub mod ctl;
pub mod ctrlq;
pub mod metrics;
pub mod status;
pub mod vhost;
pub mod worker;

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering::Relaxed};
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
    .union(VhostUserProtocolFeatures::MTU)
    .union(VhostUserProtocolFeatures::STATUS);

/// The virtio features the device offers (on top of vhost-user's PROTOCOL_FEATURES bit).
/// The control queue features are for drivers that pass the control queue to us (ours, DPDK);
/// QEMU keeps the control queue to itself and never acknowledges them.
pub fn device_features(pairs: u16) -> Features {
    let mut f = Features::VERSION_1
        | Features::RING_EVENT_IDX
        | Features::RING_INDIRECT_DESC
        | Features::NOTIFY_ON_EMPTY
        | Features::IN_ORDER
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
        | Features::NET_MAC
        | Features::NET_CTRL_VQ
        | Features::NET_CTRL_RX
        | Features::NET_CTRL_MAC_ADDR
        | Features::NET_NOTF_COAL
        | Features::NET_VQ_NOTF_COAL;
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
    /// Seed 004's slow device: wait this long before answering each control command.
    pub ctrl_delay_us: u32,
    /// Used entries written before `used.idx` is published (seed 001; 1 = every entry).
    pub used_batch: u16,
    /// While busy polling the tx ring, also poll the host side for rx (seed 003).
    pub poll_rx_from_tx: bool,
    /// Pin every data worker to this CPU (for the contended case of seed 000).
    pub worker_cpu: Option<usize>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            pairs: 1,
            io: IoMode::Null { size: 64 },
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            mtu: 1500,
            busy_poll_us: 0,
            ctrl_delay_us: 0,
            used_batch: vring::DEFAULT_USED_BATCH,
            poll_rx_from_tx: true,
            worker_cpu: None,
        }
    }
}

/// Device state that the data workers, the control queue and the protocol handler share.
#[derive(Debug)]
pub struct Shared {
    pub config: BackendConfig,
    /// One per virtqueue: rx0, tx0, rx1, tx1, ..., ctrl.
    pub metrics: Vec<Arc<QueueMetrics>>,
    /// Control handles on the TAP queues (one per pair), for attach/detach and offloads.
    pub taps: Vec<TapQueue>,
    /// Queue pairs in use (MQ VQ_PAIRS_SET); the others carry no traffic.
    pub active_pairs: AtomicU16,
    /// The receive filter (CTRL_RX, CTRL_MAC_ADDR): promiscuous by default, as in QEMU.
    pub promisc: AtomicBool,
    pub allmulti: AtomicBool,
    /// The MAC address, packed in the low 48 bits.
    pub mac: AtomicU64,
    /// Each data worker's wake-up eventfd, so a control command can get it to re-check.
    pub wakes: Vec<vmm_sys_util::eventfd::EventFd>,
    /// The virtio features the frontend acknowledged (0 before SET_FEATURES), for reports.
    pub features: AtomicU64,
    /// The device status the frontend last set (SET_STATUS), and how many times it set one
    /// on this connection, for reports.
    pub status: AtomicU8,
    pub status_sets: AtomicU64,
}

pub(crate) fn mac_to_u64(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac);
    u64::from_le_bytes(b)
}

fn check_pairs(pairs: u16) -> io::Result<()> {
    if pairs == 0 || pairs > 128 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "queue pairs must be 1..=128",
        ));
    }
    Ok(())
}

impl Shared {
    /// The state of a device with `config.pairs` pairs (1..=128), every pair active and the
    /// default receive filter; `taps` holds one control handle per pair, or none without a
    /// TAP. [`Device::new`] builds it; the control-queue fuzz target builds one alone, to
    /// drive [`ctrlq::process_commands`] without the worker threads.
    pub fn new(config: BackendConfig, taps: Vec<TapQueue>) -> io::Result<Shared> {
        check_pairs(config.pairs)?;
        let n = 2 * config.pairs as usize + 1;
        let metrics: Vec<_> = (0..n).map(|_| Arc::new(QueueMetrics::default())).collect();
        for m in &metrics {
            m.busy_poll_us.store(config.busy_poll_us, Relaxed);
        }
        Ok(Shared {
            active_pairs: AtomicU16::new(config.pairs),
            promisc: AtomicBool::new(true),
            allmulti: AtomicBool::new(false),
            mac: AtomicU64::new(mac_to_u64(config.mac)),
            features: AtomicU64::new(0),
            status: AtomicU8::new(0),
            status_sets: AtomicU64::new(0),
            wakes: (0..config.pairs)
                .map(|_| vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK))
                .collect::<io::Result<_>>()?,
            config,
            metrics,
            taps,
        })
    }

    pub fn mac(&self) -> [u8; 6] {
        let b = self.mac.load(Relaxed).to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }

    /// Whether a frame to `dst` passes the receive filter.
    pub fn accepts(&self, dst: &[u8]) -> bool {
        if self.promisc.load(Relaxed) || dst.len() < 6 {
            return true;
        }
        let broadcast = dst[..6] == [0xff; 6];
        let multicast = dst[0] & 1 != 0;
        broadcast || dst[..6] == self.mac() || (multicast && self.allmulti.load(Relaxed))
    }

    /// Uses the first `n` pairs: the TAP queues of the others are detached, so the kernel
    /// stops steering frames to them.
    pub fn set_active_pairs(&self, n: u16) -> io::Result<()> {
        for (p, t) in self.taps.iter().enumerate() {
            t.set_attached(p < n as usize)?;
        }
        self.active_pairs.store(n, Relaxed);
        for w in &self.wakes {
            let _ = w.write(1);
        }
        Ok(())
    }

    pub fn ctrl_queue(&self) -> usize {
        2 * self.config.pairs as usize
    }
}

/// The device: shared state plus the worker threads, living across connections.
#[derive(Debug)]
pub struct Device {
    shared: Arc<Shared>,
    /// One per pair, then the control queue's.
    workers: Vec<WorkerHandle>,
}

impl Device {
    pub fn new(config: BackendConfig) -> io::Result<Arc<Device>> {
        check_pairs(config.pairs)?;
        let mut taps = Vec::new();
        let mut ios = Vec::new();
        for _ in 0..config.pairs {
            ios.push(match &config.io {
                IoMode::Tap(name) => {
                    let q = TapQueue::open(name)?;
                    q.set_vnet_hdr_len(crate::net::HDR_LEN)?;
                    taps.push(TapQueue::open_clone(&q)?);
                    Io::Tap(q)
                }
                IoMode::Null { size } => Io::Null { size: *size },
                IoMode::Echo => Io::Echo,
            });
        }
        let shared = Arc::new(Shared::new(config, taps)?);
        let mut workers = Vec::new();
        for (p, io) in ios.into_iter().enumerate() {
            workers.push(WorkerHandle::spawn(p as u16, io, shared.clone())?);
        }
        workers.push(WorkerHandle::spawn_ctrl(shared.clone())?);
        Ok(Arc::new(Device { shared, workers }))
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    /// Virtqueues: two per pair and the control queue.
    pub fn num_queues(&self) -> usize {
        2 * self.shared.config.pairs as usize + 1
    }
    pub fn pairs(&self) -> u16 {
        self.shared.config.pairs
    }
    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac()
    }
    pub fn mtu(&self) -> u16 {
        self.shared.config.mtu
    }
    pub fn offered_features(&self) -> Features {
        device_features(self.shared.config.pairs)
    }
    pub fn metrics(&self, queue: usize) -> Arc<QueueMetrics> {
        self.shared.metrics[queue].clone()
    }
    /// The worker serving virtqueue `queue`.
    pub fn worker(&self, queue: usize) -> &WorkerHandle {
        &self.workers[(queue / 2).min(self.workers.len() - 1)]
    }

    /// Sets the busy-poll timeout of one queue, or of all.
    pub fn set_busy_poll(&self, us: u32, queue: Option<usize>) -> Result<(), String> {
        let m = &self.shared.metrics;
        match queue {
            Some(q) => m
                .get(q)
                .ok_or(format!("no queue {q}"))?
                .busy_poll_us
                .store(us, Relaxed),
            None => m.iter().for_each(|m| m.busy_poll_us.store(us, Relaxed)),
        }
        Ok(())
    }

    /// Applies the negotiated header length and guest offloads to every TAP queue.
    pub fn configure_tap(&self, hdr_len: usize, offloads: TapOffloads) -> io::Result<()> {
        for t in &self.shared.taps {
            t.set_vnet_hdr_len(hdr_len)?;
            t.set_offloads(offloads)?;
        }
        Ok(())
    }

    /// A new connection starts with every pair active and the default receive filter.
    pub fn reset(&self) {
        let s = &self.shared;
        let _ = s.set_active_pairs(s.config.pairs);
        s.promisc.store(true, Relaxed);
        s.allmulti.store(false, Relaxed);
        s.mac.store(mac_to_u64(s.config.mac), Relaxed);
        s.features.store(0, Relaxed);
        s.status.store(0, Relaxed);
        s.status_sets.store(0, Relaxed);
        for m in &s.metrics {
            m.set_coalesce(crate::net::ctrl::Coalesce::default());
        }
    }

    pub fn reports(&self) -> Vec<QueueReport> {
        let ctrl = self.shared.ctrl_queue();
        self.shared
            .metrics
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let kind = if i == ctrl {
                    "ctrl"
                } else if i % 2 == 0 {
                    "rx"
                } else {
                    "tx"
                };
                QueueReport::new(i as u16, kind, m)
            })
            .collect()
    }

    /// Device-wide state for `virtnet ctl stats`.
    pub fn device_report(&self) -> DeviceReport {
        let s = &self.shared;
        DeviceReport {
            pairs: s.config.pairs,
            active_pairs: s.active_pairs.load(Relaxed),
            promisc: s.promisc.load(Relaxed),
            allmulti: s.allmulti.load(Relaxed),
            features: Features(s.features.load(Relaxed)).to_string(),
            status: s.status.load(Relaxed),
            status_sets: s.status_sets.load(Relaxed),
            mac: s
                .mac()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":"),
        }
    }
}

/// Device-wide state, as `virtnet ctl stats` prints it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceReport {
    pub pairs: u16,
    pub active_pairs: u16,
    pub promisc: bool,
    pub allmulti: bool,
    /// The negotiated virtio features, by name ("VERSION_1|IN_ORDER|..."); empty before
    /// SET_FEATURES.
    pub features: String,
    pub mac: String,
    /// The virtio device status byte the frontend last set with SET_STATUS (ACKNOWLEDGE 1,
    /// DRIVER 2, DRIVER_OK 4, FEATURES_OK 8); 0 if it never sent one.
    #[serde(default)]
    pub status: u8,
    /// SET_STATUS requests on this connection (0 from a frontend that does not use them).
    #[serde(default)]
    pub status_sets: u64,
}

/// The vhost-user message layer of one connection, dispatching to its [`vhost::Connection`].
pub type RequestHandler = BackendReqHandler<Mutex<vhost::Connection>>;

/// Serves one frontend connection until it goes away or breaks the protocol, then stops its
/// queues. Never panics on frontend input.
pub fn serve_connection(device: &Arc<Device>, stream: UnixStream) {
    match Session::new(device, stream) {
        Ok(mut s) => while s.serve_one() {},
        Err(e) => tracing::warn!(error = %e, "cannot serve the frontend"),
    }
}

/// One frontend connection being served: rust-vmm's request handler over our protocol state,
/// plus the status requests the handler does not dispatch ([`status`]).
pub struct Session {
    handler: Option<RequestHandler>,
    conn: Arc<Mutex<vhost::Connection>>,
    /// The same socket, to peek at each request and answer the status requests.
    stream: UnixStream,
    status: status::Status,
    device: Arc<Device>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("open", &self.handler.is_some())
            .field("status", &self.status)
            .finish()
    }
}

impl Session {
    /// A fresh connection: the device is reset to its defaults.
    pub fn new(device: &Arc<Device>, stream: UnixStream) -> io::Result<Session> {
        device.reset();
        let conn = Arc::new(Mutex::new(vhost::Connection::new(device.clone())));
        Ok(Session {
            stream: stream.try_clone()?,
            handler: Some(RequestHandler::from_stream(stream, conn.clone())),
            conn,
            status: status::Status::default(),
            device: device.clone(),
        })
    }

    /// Handles one request; returns false once the connection has closed (its queues are
    /// stopped then). Public so that the vhost-user fuzz target steps through the same loop,
    /// message by message.
    pub fn serve_one(&mut self) -> bool {
        let Some(handler) = self.handler.as_mut() else {
            return false;
        };
        let (negotiated, reply_ack) = match self.conn.lock() {
            Ok(c) => {
                let p = c.acked_protocol();
                let status = p.contains(VhostUserProtocolFeatures::STATUS);
                (status, p.contains(VhostUserProtocolFeatures::REPLY_ACK))
            }
            Err(_) => (false, false),
        };
        // Read when GET_STATUS arrives, not before waiting for it.
        let conn = &self.conn;
        let needs_reset = || conn.lock().map(|c| c.needs_reset()).unwrap_or(true);
        let open = match self
            .status
            .handle_next(&self.stream, negotiated, reply_ack, needs_reset)
        {
            Ok(status::Handled::Yes) => {
                let shared = &self.device.shared;
                shared.status.store(self.status.status, Relaxed);
                shared.status_sets.store(self.status.sets, Relaxed);
                true
            }
            Ok(status::Handled::No) => serve_request(handler, &self.conn),
            Ok(status::Handled::Close(why)) => {
                tracing::warn!(why, "closing the connection");
                false
            }
            Err(e) => {
                tracing::info!(error = %e, "frontend disconnected");
                false
            }
        };
        if !open {
            self.close();
        }
        open
    }

    /// Closes the connection and stops its queues (what happens when the frontend goes away).
    pub fn close(&mut self) {
        if self.handler.take().is_some() {
            // Our clone of the socket would keep it open: the frontend must see the close.
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            match self.conn.lock() {
                Ok(mut c) => c.stop_all(),
                Err(poisoned) => poisoned.into_inner().stop_all(),
            };
        }
    }
}

/// Handles one request of the frontend through rust-vmm's handler; returns false when the
/// connection must close: the frontend went away, broke the message layer, or waits for a
/// reply we could not send.
fn serve_request(handler: &mut RequestHandler, conn: &Mutex<vhost::Connection>) -> bool {
    match handler.handle_request() {
        Ok(()) => true,
        Err(VuError::Disconnected) | Err(VuError::PartialMessage) => {
            tracing::info!("frontend disconnected");
            false
        }
        Err(VuError::InactiveFeature(_)) => {
            // SET_VRING_ENABLE before SET_FEATURES (QEMU 7.2): see Connection.
            tracing::debug!("ring enabled before features were set; enabling at SET_FEATURES");
            if let Ok(mut c) = conn.lock() {
                c.enable_before_features = true;
            }
            true
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
            }
            !(must_close || socket_level)
        }
    }
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
