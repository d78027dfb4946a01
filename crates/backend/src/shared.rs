//! The state a device's parts share: its workers, its control queue and the protocol handler.
//! The configuration, the port's control plane, what the frontend negotiated and set (features,
//! status, MTU), the receive filter and the active pairs, each queue's counters and tunables,
//! and the workers' wake-ups; each behind methods that say what they do.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vmm_sys_util::eventfd::EventFd;
use vnet::ctrl::MacTable;
use vnet::feature;
use vring::Features;

use super::config::{check_mtu, check_pairs, BackendConfig, MIN_MTU};
use super::error::Error;
use super::host::Control;
use super::metrics::{QueueCounters, QueueTunables};
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

/// The virtio features the device offers (on top of vhost-user's PROTOCOL_FEATURES bit), before
/// what its port adds (`host::Control::offered`). The control queue features are for drivers
/// that pass the control queue to us (ours, DPDK); QEMU keeps the control queue to itself and
/// never acknowledges them.
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

/// Device state that the data workers, the control queue and the protocol handler share.
#[derive(Debug)]
pub struct Shared {
    config: BackendConfig,
    /// The port's control plane (offloads, MTU, queues attached, announcements).
    control: Box<dyn Control>,
    /// The virtio features the device offers: [`device_features`] and the port's.
    offered: Features,
    /// One each per virtqueue, in index order (rx0, tx0, rx1, tx1, ..., ctrl): what the queue
    /// observed, and what it is told to do.
    counters: Vec<Arc<QueueCounters>>,
    tunables: Vec<Arc<QueueTunables>>,
    /// Queue pairs in use (MQ VQ_PAIRS_SET); the others carry no traffic.
    active_pairs: AtomicU16,
    /// Whether each pair's rx ring is enabled (SET_VRING_ENABLE): QEMU runs the control queue
    /// itself and tells us which pairs the guest uses this way. All, until a frontend says.
    rx_enabled: Vec<AtomicBool>,
    /// The receive filter (CTRL_RX, CTRL_MAC_ADDR): promiscuous by default, as in QEMU.
    promisc: AtomicBool,
    allmulti: AtomicBool,
    /// MAC_TABLE_SET's unicast and multicast lists, read only for a frame the rest refuses
    /// (and only once a driver has set one: `tables_set`).
    tables: RwLock<(MacTable, MacTable)>,
    tables_set: AtomicBool,
    /// The MAC address, packed in the low 48 bits.
    mac: AtomicU64,
    /// The MTU in effect, which the config space reports: the configured one (or the port's
    /// interface's), then the last NET_SET_MTU's. The device's, not a connection's: it stays
    /// when a frontend goes, as the TAP's interface keeps it.
    mtu: AtomicU16,
    /// Each data worker's wake-up eventfd, so a control command can get it to re-check.
    wakes: Vec<EventFd>,
    /// The virtio features the frontend acknowledged (0 before SET_FEATURES). Queues carry
    /// their own copy, from when they started; this one is for reports and announcements.
    features: AtomicU64,
    /// The device status the frontend last set (SET_STATUS), and how many times it set one on
    /// this connection, for reports.
    status: AtomicU8,
    status_sets: AtomicU64,
}

fn mac_to_u64(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac);
    u64::from_le_bytes(b)
}

impl Shared {
    /// The state of a device with `config.pairs` pairs (1..=`MAX_PAIRS`) on a port with
    /// `control`, every pair active and the default receive filter. The MTU is the configured
    /// one, set on the port's interface, else the interface's, else 1500. [`Device::new`]
    /// builds it; the control-queue fuzz target builds one alone (`fuzzing::shared`), to drive
    /// the control queue without the worker threads.
    ///
    /// [`Device::new`]: crate::Device::new
    pub fn new(config: BackendConfig, control: Box<dyn Control>) -> io::Result<Shared> {
        let wakes = (0..config.pairs)
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<io::Result<_>>()?;
        Shared::with_wakes(config, control, wakes)
    }

    /// As [`Shared::new`], for pairs whose workers are woken through `wakes` (one per pair: a
    /// switch's workers serve the pairs of many devices).
    pub fn with_wakes(
        config: BackendConfig,
        control: Box<dyn Control>,
        wakes: Vec<EventFd>,
    ) -> io::Result<Shared> {
        check_pairs(config.pairs)?;
        if wakes.len() != config.pairs as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "one wake-up eventfd per queue pair",
            ));
        }
        let queues = || QueueId::all(config.pairs);
        let counters = queues().map(|_| Arc::default()).collect();
        let tunables: Vec<Arc<QueueTunables>> = queues().map(|_| Arc::default()).collect();
        for (t, id) in tunables.iter().zip(queues()) {
            t.set_busy_poll(config.busy_poll);
            // The control queue's calls answer commands one at a time: never held.
            t.set_hold_calls(config.hold_calls && id != QueueId::Ctrl);
        }
        let shared = Shared {
            offered: device_features(config.pairs) | control.offered(),
            active_pairs: AtomicU16::new(config.pairs),
            rx_enabled: (0..config.pairs).map(|_| AtomicBool::new(true)).collect(),
            promisc: AtomicBool::new(true),
            allmulti: AtomicBool::new(false),
            tables: RwLock::default(),
            tables_set: AtomicBool::new(false),
            mac: AtomicU64::new(mac_to_u64(config.mac)),
            mtu: AtomicU16::new(1500),
            features: AtomicU64::new(0),
            status: AtomicU8::new(0),
            status_sets: AtomicU64::new(0),
            wakes,
            counters,
            tunables,
            control,
            config,
        };
        match shared.config.mtu {
            Some(m) => {
                shared.set_mtu(m.into()).map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "MTU {m}: the device takes {MIN_MTU}..={} ({e})",
                            shared.max_mtu()
                        ),
                    )
                })?;
            }
            None => {
                if let Some(mtu) = shared.control.mtu()? {
                    shared.mtu.store(mtu, Relaxed);
                }
            }
        }
        Ok(shared)
    }

    pub fn config(&self) -> &BackendConfig {
        &self.config
    }

    pub fn pairs(&self) -> u16 {
        self.config.pairs
    }

    /// The port's control plane.
    pub fn control(&self) -> &dyn Control {
        &*self.control
    }

    /// The virtio features the device offers.
    pub fn offered(&self) -> Features {
        self.offered
    }

    /// A new connection starts with every pair active, the default receive filter, no
    /// features, status or coalescing. The MTU stays as it is (the port's interface keeps it
    /// too): a frontend that wants another sends NET_SET_MTU.
    pub fn reset(&self) {
        let _ = self.set_active_pairs(self.config.pairs);
        self.promisc.store(true, Relaxed);
        self.allmulti.store(false, Relaxed);
        self.set_mac_tables(MacTable::default(), MacTable::default());
        self.mac.store(mac_to_u64(self.config.mac), Relaxed);
        self.features.store(0, Relaxed);
        self.status.store(0, Relaxed);
        self.status_sets.store(0, Relaxed);
        for t in &self.tunables {
            t.set_coalesce(vnet::ctrl::Coalesce::default());
        }
    }

    /// The features the frontend acknowledged (empty before SET_FEATURES).
    pub fn features(&self) -> Features {
        Features(self.features.load(Relaxed))
    }

    /// Records the features the frontend acknowledged and applies them to the port (its
    /// header length and receive offloads).
    pub fn set_features(&self, acked: Features) -> io::Result<()> {
        self.features.store(acked.0, Relaxed);
        self.control.configure(acked)
    }

    /// The device status the frontend last set, and how many times it set one.
    pub fn status(&self) -> (u8, u64) {
        (self.status.load(Relaxed), self.status_sets.load(Relaxed))
    }

    pub fn set_status(&self, status: u8, sets: u64) {
        self.status.store(status, Relaxed);
        self.status_sets.store(sets, Relaxed);
    }

    pub fn mac(&self) -> [u8; 6] {
        let b = self.mac.load(Relaxed).to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }

    /// The MAC the driver set (CTRL_MAC_ADDR_SET).
    pub fn set_mac(&self, mac: [u8; 6]) {
        self.mac.store(mac_to_u64(mac), Relaxed);
    }

    /// The receive filter: promiscuous, and all-multicast.
    pub fn filter(&self) -> (bool, bool) {
        (self.promisc.load(Relaxed), self.allmulti.load(Relaxed))
    }

    pub fn set_promisc(&self, on: bool) {
        self.promisc.store(on, Relaxed);
    }

    pub fn set_allmulti(&self, on: bool) {
        self.allmulti.store(on, Relaxed);
    }

    /// The MAC tables the driver set (MAC_TABLE_SET): the unicast and the multicast
    /// addresses it takes besides its own.
    pub fn set_mac_tables(&self, unicast: MacTable, multicast: MacTable) {
        let empty = MacTable::default();
        let set = unicast != empty || multicast != empty;
        *self.tables.write().unwrap_or_else(PoisonError::into_inner) = (unicast, multicast);
        self.tables_set.store(set, Relaxed);
    }

    /// The MAC tables in effect: unicast, multicast.
    pub fn mac_tables(&self) -> (MacTable, MacTable) {
        *self.tables.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a frame to `dst` passes the receive filter, as QEMU's virtio-net filters:
    /// everything when promiscuous; broadcast; multicast when all-multicast or in the
    /// multicast table; unicast to the device's address or in the unicast table.
    pub fn accepts(&self, dst: &[u8]) -> bool {
        let Some(dst) = dst.first_chunk::<6>() else {
            return true;
        };
        if self.promisc.load(Relaxed) || *dst == [0xff; 6] {
            return true;
        }
        let multicast = dst[0] & 1 != 0;
        let quick = if multicast {
            self.allmulti.load(Relaxed)
        } else {
            *dst == self.mac()
        };
        quick || (self.tables_set.load(Relaxed) && self.in_tables(dst, multicast))
    }

    #[cold]
    fn in_tables(&self, dst: &[u8; 6], multicast: bool) -> bool {
        let (unicast, multi) = &*self.tables.read().unwrap_or_else(PoisonError::into_inner);
        if multicast {
            multi.accepts(dst)
        } else {
            unicast.accepts(dst)
        }
    }

    /// The MTU in effect.
    pub fn mtu(&self) -> u16 {
        self.mtu.load(Relaxed)
    }

    /// The largest MTU the device carries: its port's.
    pub fn max_mtu(&self) -> u16 {
        self.control.max_mtu()
    }

    /// Sets the MTU (NET_SET_MTU, or the configured one at start): checked against what the
    /// device carries, set on the port's interface, then reported in the config space.
    /// Refused, nothing changes.
    pub fn set_mtu(&self, mtu: u64) -> Result<u16, Error> {
        let mtu = check_mtu(mtu, self.max_mtu())?;
        self.control
            .set_mtu(mtu)
            .map_err(Error::host("setting the port interface's MTU"))?;
        self.mtu.store(mtu, Relaxed);
        Ok(mtu)
    }

    /// Queue pairs in use.
    pub fn active_pairs(&self) -> u16 {
        self.active_pairs.load(Relaxed)
    }

    /// Whether pair `p` carries traffic.
    pub fn pair_active(&self, p: u16) -> bool {
        p < self.active_pairs()
    }

    /// Uses the first `n` pairs: the port's queues of the others are detached, so the host
    /// stops steering frames to them; the workers re-check.
    pub fn set_active_pairs(&self, n: u16) -> io::Result<()> {
        self.active_pairs.store(n, Relaxed);
        self.attach_queues()?;
        for w in &self.wakes {
            let _ = w.write(1);
        }
        Ok(())
    }

    /// Records whether pair `p`'s rx ring is enabled (None: every pair's, as before any
    /// frontend), and attaches or detaches the port's queues to match: the host steers frames
    /// only to attached queues, and those of a pair nobody receives on would be lost.
    pub fn set_rx_enabled(&self, p: Option<usize>, on: bool) -> io::Result<()> {
        for (i, e) in self.rx_enabled.iter().enumerate() {
            if p.is_none_or(|p| p == i) {
                e.store(on, Relaxed);
            }
        }
        self.attach_queues()
    }

    /// Attaches the port's queue of each pair that is in use and whose rx ring is enabled,
    /// and detaches the others.
    fn attach_queues(&self) -> io::Result<()> {
        let n = self.active_pairs();
        for (p, enabled) in (0..).zip(&self.rx_enabled) {
            self.control.attach(p, p < n && enabled.load(Relaxed))?;
        }
        Ok(())
    }

    /// Pair `pair`'s worker's wake-up eventfd.
    pub fn wake(&self, pair: u16) -> &EventFd {
        &self.wakes[pair as usize]
    }

    /// The counters of queue `id`.
    pub fn queue_counters(&self, id: QueueId) -> &Arc<QueueCounters> {
        &self.counters[id.index(self.config.pairs)]
    }

    /// The tunables of queue `id`.
    pub fn queue_tunables(&self, id: QueueId) -> &Arc<QueueTunables> {
        &self.tunables[id.index(self.config.pairs)]
    }

    /// Every queue's tunables, in index order.
    pub fn tunables(&self) -> &[Arc<QueueTunables>] {
        &self.tunables
    }

    /// Virtqueues: two per pair and the control queue.
    pub fn num_queues(&self) -> usize {
        self.counters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{MAX_MTU, MAX_PAIRS};
    use crate::host::NoControl;

    fn shared(config: BackendConfig) -> io::Result<Shared> {
        Shared::new(config, Box::new(NoControl))
    }

    #[test]
    fn every_virtqueue_of_the_largest_device_has_an_8_bit_index() {
        let config = |pairs| BackendConfig {
            pairs,
            ..BackendConfig::default()
        };
        let s = shared(config(MAX_PAIRS)).unwrap();
        let last = QueueId::Ctrl.index(s.pairs());
        assert!(last <= u8::MAX as usize, "control queue at {last}");
        assert!(shared(config(MAX_PAIRS + 1)).is_err());
        assert!(shared(config(0)).is_err());
    }

    #[test]
    fn the_configured_mtu_is_checked_and_a_set_one_replaces_it() {
        let config = |mtu| BackendConfig {
            mtu,
            ..BackendConfig::default()
        };
        let s = shared(config(None)).unwrap();
        assert_eq!(s.mtu(), 1500, "the default without a TAP");
        let s = shared(config(Some(MAX_MTU))).unwrap();
        assert_eq!(s.mtu(), MAX_MTU);
        assert!(shared(config(Some(MIN_MTU - 1))).is_err());
        assert_eq!(s.set_mtu(9000).unwrap(), 9000);
        assert_eq!(s.mtu(), 9000);
        for bad in [0, u64::from(MIN_MTU) - 1, u64::from(MAX_MTU) + 1, u64::MAX] {
            assert!(
                matches!(s.set_mtu(bad), Err(Error::OutOfRange { value, .. }) if value == bad),
                "{bad}"
            );
            assert_eq!(s.mtu(), 9000, "changed by {bad}");
        }
    }
}
