//! The device's configuration and the state its workers, its control queue and the protocol
//! handler share: the receive filter, the active pairs, the negotiated features and status,
//! each queue's counters and tunables, the TAP control handles and the workers' wake-ups.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use virtnet_sys::tap::{TapQueue, TapSupport};
use vnet::feature;
use vring::Features;

use super::error::Error;
use super::host::tap::TapIo;
use super::metrics::{QueueCounters, QueueTunables};
use super::poll::BusyPoll;
use super::queue::QueueId;

/// The vhost-user protocol features we implement. rust-vmm `vhost` 0.18 does not dispatch
/// SET_STATUS/GET_STATUS, NET_SET_MTU or SEND_RARP to a backend: the session answers those
/// itself (`intercept.rs`, with `status.rs`, `mtu.rs` and `rarp.rs`). LOG_SHMFD with the
/// LOG_ALL feature bit is live migration's dirty log; CONFIGURE_MEM_SLOTS memory hotplug.
pub const PROTOCOL_FEATURES: VhostUserProtocolFeatures = VhostUserProtocolFeatures::MQ
    .union(VhostUserProtocolFeatures::REPLY_ACK)
    .union(VhostUserProtocolFeatures::CONFIG)
    .union(VhostUserProtocolFeatures::MTU)
    .union(VhostUserProtocolFeatures::STATUS)
    .union(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS)
    .union(VhostUserProtocolFeatures::LOG_SHMFD)
    .union(VhostUserProtocolFeatures::RARP);

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

/// What a TAP device adds to [`device_features`]: UFO from the guest always (Linux segments
/// UFO frames written into a TAP since 4.15), and UDP segmentation both ways where the kernel
/// has it (Linux 6.2). GUEST_UFO is not offered: no kernel since 4.14 hands UFO frames out.
pub fn tap_features(support: TapSupport) -> Features {
    let mut f = feature::HOST_UFO;
    if support.uso {
        f = f | feature::HOST_USO | feature::GUEST_USO4 | feature::GUEST_USO6;
    }
    f
}

/// Where frames go, as chosen on the command line (or, for `Socket`, by the program that
/// builds the device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    Tap(String),
    Null {
        size: usize,
    },
    Echo,
    /// One connected unix datagram socket per pair (`host::socket`): the host side is whoever
    /// holds the other ends.
    Socket(HostSockets),
}

/// The sockets of [`IoMode::Socket`], one per pair, shared by the configuration's copies:
/// the device works on duplicates of them. Two are equal when they are the same sockets.
#[derive(Clone, Debug)]
pub struct HostSockets(Arc<[std::os::unix::net::UnixDatagram]>);

impl HostSockets {
    pub fn new(sockets: Vec<std::os::unix::net::UnixDatagram>) -> HostSockets {
        HostSockets(sockets.into())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A duplicate of pair `pair`'s socket (the same open file).
    pub fn duplicate(&self, pair: u16) -> io::Result<std::os::unix::net::UnixDatagram> {
        self.0
            .get(pair as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no socket for the pair"))?
            .try_clone()
    }
}

impl PartialEq for HostSockets {
    fn eq(&self, other: &HostSockets) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for HostSockets {}

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub pairs: u16,
    pub io: IoMode,
    pub mac: [u8; 6],
    /// The MTU to start with, set on the TAP's interface ([`MIN_MTU`] up to what the device
    /// carries, [`Shared::max_mtu`]). None: the TAP's MTU as it is, or 1500 without a TAP.
    /// The frontend may change it (NET_SET_MTU).
    pub mtu: Option<u16>,
    /// How each queue busy-polls before sleeping: auto by default (`virtnet ctl` changes it).
    pub busy_poll: BusyPoll,
    /// Hold a data queue's call a few microseconds while its driver is busy and holding
    /// gathers more completions (`hold`); the driver's NOTF_COAL settings win.
    pub hold_calls: bool,
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
    /// The file where pinned workers of several backends list themselves (CPU, process,
    /// thread), so that auto busy polling tells the other backends' workers on its CPU from
    /// other tasks (`crate::siblings::Board`). None: only this process's workers are known.
    pub worker_board: Option<std::path::PathBuf>,
    /// A send buffer for the TAP in bytes (TUNSETSNDBUF): how much of the guest's tx the
    /// kernel may hold before the TAP pushes back. None keeps the kernel's, unlimited
    /// (INT_MAX), which QEMU sets too: a limit makes Linux copy every written frame into an skb
    /// charged to the TAP instead of building it in place (358 against 316 ns per 64-byte
    /// write, Intel Xeon, Linux 6.18).
    pub tap_sndbuf: Option<i32>,
    /// How guest tx is written into the TAP: a burst per `io_uring_enter` (the default, where
    /// the kernel allows it) or a `writev` system call per frame.
    pub tap_io: TapIo,
    /// Each worker thread (the pairs' and the control queue's) allows itself only the system
    /// calls it needs (`virtnet_sys::sandbox::WORKER_SYSCALLS`); any other kills the process.
    /// On by default, in tests and benchmarks too, so that every worker path they reach runs
    /// under the filter that ships (a call missing from the list kills the test process: a
    /// loud failure). Off only where the process is not ours to restrict: `virtnet backend
    /// --sandbox off`, and the fuzz targets, whose workers run inside libFuzzer's process,
    /// where the sanitizers' and libFuzzer's own crash reports run on the crashing thread
    /// (and open files, start a symbolizer).
    pub seccomp: bool,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            pairs: 1,
            io: IoMode::Null { size: 64 },
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            mtu: None,
            busy_poll: BusyPoll::Auto,
            hold_calls: true,
            #[cfg(feature = "experiments")]
            ctrl_delay_us: 0,
            used_batch: vring::DEFAULT_USED_BATCH,
            poll_rx_from_tx: true,
            worker_cpu: None,
            worker_board: None,
            tap_sndbuf: None,
            tap_io: TapIo::default(),
            seccomp: true,
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
    /// Whether each pair's rx ring is enabled (SET_VRING_ENABLE): QEMU runs the control queue
    /// itself and tells us which pairs the guest uses this way. All, until a frontend says.
    pub rx_enabled: Vec<AtomicBool>,
    /// The receive filter (CTRL_RX, CTRL_MAC_ADDR): promiscuous by default, as in QEMU.
    pub promisc: AtomicBool,
    pub allmulti: AtomicBool,
    /// The MAC address, packed in the low 48 bits.
    pub mac: AtomicU64,
    /// The MTU in effect, which the config space reports: the configured one, then the last
    /// NET_SET_MTU's. The device's, not a connection's: it stays when a frontend goes, as the
    /// TAP's interface keeps it.
    pub mtu: AtomicU16,
    /// Each data worker's wake-up eventfd, so a control command can get it to re-check.
    pub wakes: Vec<vmm_sys_util::eventfd::EventFd>,
    /// The virtio features the frontend acknowledged (0 before SET_FEATURES), for reports.
    pub features: AtomicU64,
    /// The device status the frontend last set (SET_STATUS), and how many times it set one
    /// on this connection, for reports.
    pub status: AtomicU8,
    pub status_sets: AtomicU64,
    /// The virtio features the device offers: [`device_features`], and [`tap_features`] with a
    /// TAP.
    pub offered: Features,
}

pub(crate) fn mac_to_u64(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac);
    u64::from_le_bytes(b)
}

/// The most queue pairs a device may have: vhost-user names a virtqueue in SET_VRING_KICK,
/// CALL and ERR by 8 bits, so the control queue after `2 * pairs` data queues must be at most
/// virtqueue 255.
pub const MAX_PAIRS: u16 = 127;

/// The smallest MTU, and the largest, that the config space may hold (VIRTIO 1.2 5.1.4.1).
pub const MIN_MTU: u16 = 68;
pub const MAX_MTU: u16 = 65535;

/// `mtu` as an MTU the device takes: in [`MIN_MTU`]..=`max`.
pub(crate) fn check_mtu(mtu: u64, max: u16) -> Result<u16, Error> {
    u16::try_from(mtu)
        .ok()
        .filter(|m| (MIN_MTU..=max).contains(m))
        .ok_or(Error::OutOfRange {
            what: "MTU",
            value: mtu,
            min: MIN_MTU.into(),
            max: max.into(),
        })
}

fn max_mtu(taps: &[TapQueue]) -> u16 {
    if taps.is_empty() {
        MAX_MTU
    } else {
        TapQueue::MAX_MTU
    }
}

pub(crate) fn check_pairs(pairs: u16) -> io::Result<()> {
    if pairs == 0 || pairs > MAX_PAIRS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("queue pairs must be 1..={MAX_PAIRS}"),
        ));
    }
    Ok(())
}

impl Shared {
    /// The state of a device with `config.pairs` pairs (1..=[`MAX_PAIRS`]), every pair active and the
    /// default receive filter; `taps` holds one control handle per pair, or none without a
    /// TAP. [`Device::new`] builds it; the control-queue fuzz target builds one alone
    /// (`fuzzing::shared`), to drive the control queue without the worker threads.
    pub(crate) fn new(config: BackendConfig, taps: Vec<TapQueue>) -> io::Result<Shared> {
        check_pairs(config.pairs)?;
        let max = max_mtu(&taps);
        let mtu = match config.mtu {
            Some(m) => check_mtu(m.into(), max).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("MTU {m}: the device takes {MIN_MTU}..={max}"),
                )
            })?,
            None => 1500,
        };
        let queues = || QueueId::all(config.pairs);
        let counters = queues().map(|_| Arc::default()).collect();
        let tunables: Vec<Arc<QueueTunables>> = queues().map(|_| Arc::default()).collect();
        for (t, id) in tunables.iter().zip(queues()) {
            t.set_busy_poll(config.busy_poll);
            // The control queue's calls answer commands one at a time: never held.
            t.set_hold_calls(config.hold_calls && id != QueueId::Ctrl);
        }
        let mut offered = device_features(config.pairs);
        if let Some(t) = taps.first() {
            offered = offered | tap_features(t.probe());
        }
        Ok(Shared {
            offered,
            active_pairs: AtomicU16::new(config.pairs),
            rx_enabled: (0..config.pairs).map(|_| AtomicBool::new(true)).collect(),
            promisc: AtomicBool::new(true),
            allmulti: AtomicBool::new(false),
            mac: AtomicU64::new(mac_to_u64(config.mac)),
            mtu: AtomicU16::new(mtu),
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

    /// The largest MTU the device carries: a TAP interface's limit ([`TapQueue::MAX_MTU`]),
    /// or [`MAX_MTU`] for the generators (their buffers hold a 64 KiB frame).
    pub fn max_mtu(&self) -> u16 {
        max_mtu(&self.taps)
    }

    /// Sets the MTU (NET_SET_MTU, or the configured one at start): checked against what the
    /// device carries, set on the TAP's interface (one for all its queues), then reported in
    /// the config space. Refused, nothing changes.
    pub fn set_mtu(&self, mtu: u64) -> Result<u16, Error> {
        let mtu = check_mtu(mtu, self.max_mtu())?;
        if let Some(tap) = self.taps.first() {
            tap.set_mtu(mtu)
                .map_err(Error::host("setting the TAP interface's MTU"))?;
        }
        self.mtu.store(mtu, Relaxed);
        Ok(mtu)
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
        self.active_pairs.store(n, Relaxed);
        self.attach_taps()?;
        for w in &self.wakes {
            let _ = w.write(1);
        }
        Ok(())
    }

    /// Records whether pair `p`'s rx ring is enabled (None: every pair's, as before any
    /// frontend), and attaches or detaches the TAP queues to match: the kernel steers frames
    /// only to attached queues, and those of a pair nobody receives on would be lost.
    pub fn set_rx_enabled(&self, p: Option<usize>, on: bool) -> io::Result<()> {
        for (i, e) in self.rx_enabled.iter().enumerate() {
            if p.is_none_or(|p| p == i) {
                e.store(on, Relaxed);
            }
        }
        self.attach_taps()
    }

    /// Attaches the TAP queue of each pair that is in use and whose rx ring is enabled, and
    /// detaches the others.
    fn attach_taps(&self) -> io::Result<()> {
        let n = self.active_pairs.load(Relaxed) as usize;
        for (p, t) in self.taps.iter().enumerate() {
            t.set_attached(p < n && self.rx_enabled[p].load(Relaxed))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_virtqueue_of_the_largest_device_has_an_8_bit_index() {
        let config = |pairs| BackendConfig {
            pairs,
            ..BackendConfig::default()
        };
        let s = Shared::new(config(MAX_PAIRS), Vec::new()).unwrap();
        let last = QueueId::Ctrl.index(s.config.pairs);
        assert!(last <= u8::MAX as usize, "control queue at {last}");
        assert!(Shared::new(config(MAX_PAIRS + 1), Vec::new()).is_err());
        assert!(Shared::new(config(0), Vec::new()).is_err());
    }

    #[test]
    fn the_configured_mtu_is_checked_and_a_set_one_replaces_it() {
        let config = |mtu| BackendConfig {
            mtu,
            ..BackendConfig::default()
        };
        let s = Shared::new(config(None), Vec::new()).unwrap();
        assert_eq!(s.mtu.load(Relaxed), 1500, "the default without a TAP");
        let s = Shared::new(config(Some(MAX_MTU)), Vec::new()).unwrap();
        assert_eq!(s.mtu.load(Relaxed), MAX_MTU);
        assert!(Shared::new(config(Some(MIN_MTU - 1)), Vec::new()).is_err());
        assert_eq!(s.set_mtu(9000).unwrap(), 9000);
        assert_eq!(s.mtu.load(Relaxed), 9000);
        for bad in [0, u64::from(MIN_MTU) - 1, u64::from(MAX_MTU) + 1, u64::MAX] {
            assert!(
                matches!(s.set_mtu(bad), Err(Error::OutOfRange { value, .. }) if value == bad),
                "{bad}"
            );
            assert_eq!(s.mtu.load(Relaxed), 9000, "changed by {bad}");
        }
    }
}
