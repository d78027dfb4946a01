//! The device: the shared state ([`Shared`]) plus the worker threads, which outlive
//! connections (the port's queues, workers and counters stay when a frontend goes away, and the
//! next connection, a QEMU `reconnect=1`, picks them up).

use std::io;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, PoisonError};

use vnet::feature;
use vring::Features;

use super::config::{check_pairs, BackendConfig};
use super::ctrlq::CtrlWorker;
use super::host::{self, Port};
use super::metrics::{QueueCounters, QueueReport};
use super::pair::Pair;
use super::poll::BusyPoll;
use super::queue::QueueId;
use super::shared::Shared;
use super::thread::{PairHandle, StopTimedOut, WorkerHandle, PAIR_THREAD};
use super::worker::{self, WorkerConfig};

/// Starts a worker of its own for pair `pair` on host port `port`.
fn spawn_pair(pair: u16, port: Box<dyn Port>, shared: &Arc<Shared>) -> io::Result<PairHandle> {
    let wake = shared.wake(pair).try_clone()?;
    let config = WorkerConfig::of(shared.config());
    let worker = worker::spawn(format!("{PAIR_THREAD}{pair}"), wake, config)?;
    Ok(worker.add_pair(Pair::new(pair, port, shared.clone())))
}

/// Starts the control queue's worker.
fn spawn_ctrl(shared: &Arc<Shared>) -> io::Result<WorkerHandle> {
    let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?;
    let s = shared.clone();
    WorkerHandle::spawn(
        "virtnet-ctrlq".into(),
        wake,
        move |inbox| match CtrlWorker::new(s, inbox) {
            Ok(mut w) => report_exit("control queue", w.run()),
            Err(e) => tracing::error!(error = %e, "cannot start the control queue's worker"),
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
    /// Each pair's place on its worker.
    pairs: Vec<PairHandle>,
    /// The control queue's worker.
    ctrl: WorkerHandle,
    /// The connection being served, so that [`Device::retire`] can end it.
    frontend: Mutex<Frontend>,
}

/// The frontend connection a device serves, as seen from outside its session.
#[derive(Debug, Default)]
struct Frontend {
    /// The session's number and a clone of its socket.
    serving: Option<(u64, UnixStream)>,
    /// The number of the next session.
    next: u64,
    /// Set by [`Device::retire`]: no session is served from then on.
    retired: bool,
}

/// The worker of one queue of a device, as the protocol layer drives it.
#[derive(Clone, Copy, Debug)]
pub enum QueueWorker<'a> {
    Pair(&'a PairHandle),
    Ctrl(&'a WorkerHandle),
}

impl QueueWorker<'_> {
    pub fn start(self, q: crate::QueueRuntime) {
        match self {
            QueueWorker::Pair(p) => p.start(q),
            QueueWorker::Ctrl(w) => w.start(q),
        }
    }

    /// Stops queue `id` and returns where it stood (see `WorkerHandle::stop`).
    pub fn stop(self, id: QueueId) -> Result<Option<vring::RingPosition>, StopTimedOut> {
        match self {
            QueueWorker::Pair(p) => p.stop(id),
            QueueWorker::Ctrl(w) => w.stop(id),
        }
    }

    /// Whether the worker's thread has ended.
    pub fn is_finished(self) -> bool {
        match self {
            QueueWorker::Pair(p) => p.is_finished(),
            QueueWorker::Ctrl(w) => w.is_finished(),
        }
    }
}

impl Device {
    pub fn new(config: BackendConfig) -> io::Result<Arc<Device>> {
        check_pairs(config.pairs)?;
        let opened = host::open(&config)?;
        if config.seccomp {
            // Sandboxed workers cannot start the watchdog thread on their first call.
            virtnet_sys::peer_fd::prepare_watchdog()?;
        }
        let shared = Arc::new(Shared::new(config, opened.control)?);
        let mut pairs = Vec::new();
        for (p, port) in (0..).zip(opened.ports) {
            pairs.push(spawn_pair(p, port, &shared)?);
        }
        let ctrl = spawn_ctrl(&shared)?;
        Ok(Arc::new(Device {
            shared,
            pairs,
            ctrl,
            frontend: Mutex::default(),
        }))
    }

    /// A device whose pairs run on `workers` (pair `p` on `workers[p % len]`, woken through
    /// that worker's eventfd), each on the port `port(p, worker)` makes, with `control` its
    /// port's control plane: a port of a switch, whose workers serve many devices.
    pub fn on_workers(
        config: BackendConfig,
        control: Box<dyn host::Control>,
        workers: &[Arc<WorkerHandle>],
        mut port: impl FnMut(u16, usize) -> Box<dyn Port>,
    ) -> io::Result<Arc<Device>> {
        check_pairs(config.pairs)?;
        if workers.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no worker"));
        }
        if config.seccomp {
            virtnet_sys::peer_fd::prepare_watchdog()?;
        }
        let on = |p: u16| p as usize % workers.len();
        let wakes = (0..config.pairs)
            .map(|p| workers[on(p)].wake().try_clone())
            .collect::<io::Result<_>>()?;
        let shared = Arc::new(Shared::with_wakes(config, control, wakes)?);
        let pairs = (0..shared.config().pairs)
            .map(|p| workers[on(p)].add_pair(Pair::new(p, port(p, on(p)), shared.clone())))
            .collect();
        let ctrl = spawn_ctrl(&shared)?;
        Ok(Arc::new(Device {
            shared,
            pairs,
            ctrl,
            frontend: Mutex::default(),
        }))
    }

    /// The worker serving each pair, by pair.
    pub fn pair_workers(&self) -> impl Iterator<Item = &Arc<WorkerHandle>> {
        self.pairs.iter().map(PairHandle::worker)
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
    /// Virtqueues: two per pair and the control queue.
    pub fn num_queues(&self) -> usize {
        self.shared.num_queues()
    }
    pub fn pairs(&self) -> u16 {
        self.shared.pairs()
    }
    pub fn mac(&self) -> [u8; 6] {
        self.shared.mac()
    }
    /// The MTU in effect (the config space's `mtu`).
    pub fn mtu(&self) -> u16 {
        self.shared.mtu()
    }
    pub fn offered_features(&self) -> Features {
        self.shared.offered()
    }
    /// The counters of virtqueue `queue`, by index.
    pub fn counters(&self, queue: usize) -> Arc<QueueCounters> {
        let id = QueueId::from_index(queue, self.pairs()).expect("a virtqueue of the device");
        self.shared.queue_counters(id).clone()
    }
    /// The worker serving queue `id`: its pair's, or the control queue's.
    pub fn worker(&self, id: QueueId) -> QueueWorker<'_> {
        match id.pair() {
            Some(p) => QueueWorker::Pair(&self.pairs[p as usize]),
            None => QueueWorker::Ctrl(&self.ctrl),
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
        let m = self.shared.tunables();
        match queue {
            Some(q) => m.get(q).ok_or(format!("no queue {q}"))?.set_busy_poll(b),
            None => m.iter().for_each(|m| m.set_busy_poll(b)),
        }
        Ok(())
    }

    /// A new connection starts from the device's defaults (see [`Shared::reset`]).
    pub fn reset(&self) {
        self.shared.reset();
    }

    fn frontend(&self) -> std::sync::MutexGuard<'_, Frontend> {
        self.frontend.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `stream` as the connection a new session serves, for [`Device::retire`], and
    /// returns the session's number (for [`Device::served`]); refused once the device is
    /// retired.
    pub(crate) fn serving(&self, stream: &UnixStream) -> io::Result<u64> {
        let clone = stream.try_clone()?;
        let mut f = self.frontend();
        if f.retired {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "the device was removed",
            ));
        }
        let id = f.next;
        f.next += 1;
        f.serving = Some((id, clone));
        Ok(id)
    }

    /// Forgets session `id`'s connection, which has closed (its clone of the socket with it).
    pub(crate) fn served(&self, id: u64) {
        let mut f = self.frontend();
        if f.serving.as_ref().is_some_and(|(s, _)| *s == id) {
            f.serving = None;
        }
    }

    /// Serves no frontend from now on, for a device that goes away (a switch's port removed):
    /// the connection being served is shut down, so that its session ends as if the frontend
    /// had left (its queues stopped) and the frontend reads the end of the stream; a later
    /// connection is closed at once.
    pub fn retire(&self) {
        let mut f = self.frontend();
        f.retired = true;
        if let Some((_, socket)) = f.serving.take() {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    pub fn reports(&self) -> Vec<QueueReport> {
        let pairs = self.pairs();
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
        let (promisc, allmulti) = s.filter();
        let (status, status_sets) = s.status();
        DeviceReport {
            pairs: s.pairs(),
            active_pairs: s.active_pairs(),
            promisc,
            allmulti,
            features: feature::names(s.features()),
            status,
            status_sets,
            mtu: s.mtu(),
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
