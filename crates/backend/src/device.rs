//! The device: its configuration, the state its workers share, and the worker threads, which
//! outlive connections (the TAP queues, workers and counters stay when a frontend goes away,
//! and the next connection, a QEMU `reconnect=1`, picks them up).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vnet::feature;
use vring::Features;

use super::ctrlq::CtrlWorker;
use super::host::{echo::EchoPort, null::NullPort, tap::TapPort, Host};
use super::metrics::{QueueCounters, QueueReport, QueueTunables};
use super::queue::QueueId;
use super::thread::WorkerHandle;
use super::worker::Worker;
use virtnet_sys::tap::{TapOffloads, TapQueue};

/// The vhost-user protocol features we implement. rust-vmm `vhost` 0.18 does not dispatch
/// SET_STATUS/GET_STATUS to a backend: the session answers those itself (`status.rs`).
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
        | feature::MRG_RXBUF
        | feature::CSUM
        | feature::GUEST_CSUM
        | feature::HOST_TSO4
        | feature::HOST_TSO6
        | feature::HOST_ECN
        | feature::GUEST_TSO4
        | feature::GUEST_TSO6
        | feature::GUEST_ECN
        | feature::MTU
        | feature::STATUS
        | feature::MAC
        | feature::CTRL_VQ
        | feature::CTRL_RX
        | feature::CTRL_MAC_ADDR
        | feature::NOTF_COAL
        | feature::VQ_NOTF_COAL;
    if pairs > 1 {
        f = f | feature::MQ;
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
    /// A slow device on purpose (the control-queue benchmark): wait this long before answering
    /// each control command. The `experiments` feature.
    #[cfg(feature = "experiments")]
    pub ctrl_delay_us: u32,
    /// Used entries written before `used.idx` is published (batched used publish; 1 = every entry).
    pub used_batch: u16,
    /// While busy polling the tx ring, also poll the host side for rx (rx polled from the tx path).
    pub poll_rx_from_tx: bool,
    /// Pin every data worker to this CPU (the contended case of the busy-polling benchmark).
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
            #[cfg(feature = "experiments")]
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
    /// One each per virtqueue, in index order (rx0, tx0, rx1, tx1, ..., ctrl): what the queue
    /// observed, and what it is told to do.
    pub counters: Vec<Arc<QueueCounters>>,
    pub tunables: Vec<Arc<QueueTunables>>,
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
    /// TAP. [`Device::new`] builds it; the control-queue fuzz target builds one alone
    /// (`fuzzing::shared`), to drive the control queue without the worker threads.
    pub(crate) fn new(config: BackendConfig, taps: Vec<TapQueue>) -> io::Result<Shared> {
        check_pairs(config.pairs)?;
        let queues = || QueueId::all(config.pairs);
        let counters = queues().map(|_| Arc::default()).collect();
        let tunables: Vec<Arc<QueueTunables>> = queues().map(|_| Arc::default()).collect();
        for t in &tunables {
            t.busy_poll_us.store(config.busy_poll_us, Relaxed);
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
            counters,
            tunables,
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

    /// The counters of queue `id`.
    pub fn queue_counters(&self, id: QueueId) -> &Arc<QueueCounters> {
        &self.counters[id.index(self.config.pairs)]
    }

    /// The tunables of queue `id`.
    pub fn queue_tunables(&self, id: QueueId) -> &Arc<QueueTunables> {
        &self.tunables[id.index(self.config.pairs)]
    }
}

/// Starts the worker of pair `pair` on host port `host`.
fn spawn_pair<H: Host>(pair: u16, host: H, shared: &Arc<Shared>) -> io::Result<WorkerHandle> {
    let wake = shared.wakes[pair as usize].try_clone()?;
    let s = shared.clone();
    WorkerHandle::spawn(
        format!("virtnet-pair{pair}"),
        wake,
        move |inbox| match Worker::new(pair, host, s, inbox) {
            Ok(mut w) => report_exit("data", w.run()),
            Err(e) => tracing::error!(pair, error = %e, "cannot start the pair's worker"),
        },
    )
}

fn report_exit(what: &str, r: Result<(), super::Error>) {
    if let Err(e) = r {
        tracing::error!(worker = what, error = %e, "worker stopped; its queues no longer run");
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
        // The data queues' TAP handles first: the shared state keeps a control handle on each.
        let mut taps = Vec::new();
        let mut tap_queues = Vec::new();
        if let IoMode::Tap(name) = &config.io {
            for _ in 0..config.pairs {
                let q = TapQueue::open(name)?;
                q.set_vnet_hdr_len(vnet::HDR_LEN)?;
                taps.push(TapQueue::open_clone(&q)?);
                tap_queues.push(q);
            }
        }
        let io = config.io.clone();
        let shared = Arc::new(Shared::new(config, taps)?);
        let mut workers = Vec::new();
        let mut tap_queues = tap_queues.into_iter();
        for p in 0..shared.config.pairs {
            let worker = match &io {
                IoMode::Tap(_) => {
                    let q = tap_queues.next().expect("one TAP queue per pair");
                    spawn_pair(p, TapPort::new(q), &shared)
                }
                IoMode::Null { size } => spawn_pair(p, NullPort::new(*size, p), &shared),
                IoMode::Echo => spawn_pair(p, EchoPort::default(), &shared),
            };
            workers.push(worker?);
        }
        let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?;
        let s = shared.clone();
        workers.push(WorkerHandle::spawn(
            "virtnet-ctrlq".into(),
            wake,
            move |inbox| match CtrlWorker::new(s, inbox) {
                Ok(mut w) => report_exit("control queue", w.run()),
                Err(e) => tracing::error!(error = %e, "cannot start the control queue's worker"),
            },
        )?);
        Ok(Arc::new(Device { shared, workers }))
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    /// Virtqueues: two per pair and the control queue.
    pub fn num_queues(&self) -> usize {
        self.shared.counters.len()
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
    /// The counters of virtqueue `queue`, by index.
    pub fn counters(&self, queue: usize) -> Arc<QueueCounters> {
        self.shared.counters[queue].clone()
    }
    /// The worker serving queue `id`: its pair's, or the control queue's (the last).
    pub fn worker(&self, id: QueueId) -> &WorkerHandle {
        match id.pair() {
            Some(p) => &self.workers[p as usize],
            None => &self.workers[self.workers.len() - 1],
        }
    }

    /// Sets the busy-poll timeout of one queue, or of all.
    pub fn set_busy_poll(&self, us: u32, queue: Option<usize>) -> Result<(), String> {
        let m = &self.shared.tunables;
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
        for t in &s.tunables {
            t.set_coalesce(vnet::ctrl::Coalesce::default());
        }
    }

    pub fn reports(&self) -> Vec<QueueReport> {
        let pairs = self.shared.config.pairs;
        QueueId::all(pairs)
            .map(|id| {
                let (c, t) = (
                    self.shared.queue_counters(id),
                    self.shared.queue_tunables(id),
                );
                QueueReport::new(id.index(pairs) as u16, id.kind(), c, t)
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
            features: feature::names(Features(s.features.load(Relaxed))),
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
