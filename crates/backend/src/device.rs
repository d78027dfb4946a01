//! The device: the shared state ([`Shared`]) plus the worker threads, which outlive
//! connections (the TAP queues, workers and counters stay when a frontend goes away, and the
//! next connection, a QEMU `reconnect=1`, picks them up).

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use vnet::feature;
use vring::Features;

use super::ctrlq::CtrlWorker;
use super::host::{echo::EchoPort, null::NullPort, socket::SocketPort, tap::TapPort, Host};
use super::metrics::{QueueCounters, QueueReport};
use super::poll::BusyPoll;
use super::queue::QueueId;
use super::shared::{check_pairs, mac_to_u64, BackendConfig, IoMode, Shared};
use super::thread::WorkerHandle;
use super::worker::Worker;
use virtnet_sys::tap::{TapOffloads, TapQueue};

/// The name of each pair's worker thread, followed by the pair's number (how the board of
/// pinned workers, `crate::siblings`, recognises another backend's worker).
pub const PAIR_THREAD: &str = "virtnet-pair";

/// Starts the worker of pair `pair` on host port `host`.
fn spawn_pair<H: Host>(pair: u16, host: H, shared: &Arc<Shared>) -> io::Result<WorkerHandle> {
    let wake = shared.wakes[pair as usize].try_clone()?;
    let s = shared.clone();
    WorkerHandle::spawn(
        format!("{PAIR_THREAD}{pair}"),
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
                if let Some(bytes) = config.tap_sndbuf {
                    q.set_sndbuf(bytes)?;
                }
                taps.push(TapQueue::open_clone(&q)?);
                tap_queues.push(q);
            }
        }
        if let IoMode::Socket(s) = &config.io {
            if s.len() != config.pairs as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} sockets for {} queue pairs", s.len(), config.pairs),
                ));
            }
        }
        if config.seccomp {
            // Sandboxed workers cannot start the watchdog thread on their first call.
            virtnet_sys::peer_fd::prepare_watchdog()?;
        }
        let io = config.io.clone();
        let shared = Arc::new(Shared::new(config, taps)?);
        if let Some(tap) = shared.taps.first() {
            // The MTU asked for is set on the TAP's interface; otherwise the interface's is
            // the device's.
            match shared.config.mtu {
                Some(mtu) => {
                    shared
                        .set_mtu(mtu.into())
                        .map_err(|e| io::Error::other(e.to_string()))?;
                }
                None => shared.mtu.store(tap.mtu()?, Relaxed),
            }
        }
        let mut workers = Vec::new();
        let mut tap_queues = tap_queues.into_iter();
        for p in 0..shared.config.pairs {
            let worker = match &io {
                IoMode::Tap(_) => {
                    let q = tap_queues.next().expect("one TAP queue per pair");
                    spawn_pair(
                        p,
                        TapPort::new(q, shared.config.tap_io, shared.config.tap_sndbuf.is_some()),
                        &shared,
                    )
                }
                IoMode::Null { size } => spawn_pair(p, NullPort::new(*size, p), &shared),
                IoMode::Echo => spawn_pair(p, EchoPort::default(), &shared),
                IoMode::Socket(s) => spawn_pair(p, SocketPort::new(s.duplicate(p)?)?, &shared),
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
    /// The MTU in effect (the config space's `mtu`).
    pub fn mtu(&self) -> u16 {
        self.shared.mtu.load(Relaxed)
    }
    pub fn offered_features(&self) -> Features {
        self.shared.offered
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

    /// Stops every running queue on its worker, as GET_VRING_BASE would: used batches are
    /// published and calls held by coalescing sent. For shutting down (SIGTERM); a worker
    /// that does not answer in 5 s is skipped. Returns how many queues were running.
    pub fn stop_all_queues(&self) -> usize {
        QueueId::all(self.pairs())
            .filter(|&id| matches!(self.worker(id).stop(id), Ok(Some(_))))
            .count()
    }

    /// Sets busy polling of one queue, or of all.
    pub fn set_busy_poll(&self, b: BusyPoll, queue: Option<usize>) -> Result<(), String> {
        let m = &self.shared.tunables;
        match queue {
            Some(q) => m.get(q).ok_or(format!("no queue {q}"))?.set_busy_poll(b),
            None => m.iter().for_each(|m| m.set_busy_poll(b)),
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

    /// Announces `mac` after a live migration: a RARP broadcast from it out of the TAP, as
    /// if the guest sent it (the first pair's queue, which is always active). Without a TAP
    /// it is only logged; returns whether a frame went out.
    pub fn announce(&self, mac: [u8; 6]) -> io::Result<bool> {
        let mac_text = mac.map(|b| format!("{b:02x}")).join(":");
        let Some(tap) = self.shared.taps.first() else {
            tracing::info!(mac = %mac_text, "SEND_RARP: no TAP, nothing to announce on");
            return Ok(false);
        };
        // The TAP expects the header length negotiated (10 before any features).
        let hdr_len = vnet::hdr_len(Features(self.shared.features.load(Relaxed)));
        let mut buf = vec![0u8; hdr_len];
        buf.extend_from_slice(&super::rarp::frame(mac));
        tap.write(&buf)?;
        tracing::info!(mac = %mac_text, tap = tap.name(), "SEND_RARP: RARP announcement sent");
        Ok(true)
    }

    /// A new connection starts with every pair active and the default receive filter. The
    /// MTU stays as it is (the TAP's interface keeps it too): a frontend that wants another
    /// sends NET_SET_MTU.
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
            mtu: s.mtu.load(Relaxed),
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
    /// The MTU in effect: configured, or set by the frontend (NET_SET_MTU).
    #[serde(default)]
    pub mtu: u16,
}
