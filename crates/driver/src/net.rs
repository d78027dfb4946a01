//! A connected virtio-net device: negotiation, the config space, N queue pairs and the
//! control queue (spec 5.1.5, device initialisation).
//!
//! The control queue sits at virtqueue 2 * max_virtqueue_pairs (spec 5.1.2), after every data
//! queue the device has, whether or not we use them all; with MQ the driver then tells the
//! device how many pairs it uses (VQ_PAIRS_SET).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vnet::feature;
use vring::{Features, RingAddresses};

use super::counters::QueueCounters;
use super::ctrl::{CtrlMode, CtrlQueue};
use super::rx::{self, RxLayout, RxQueue};
use super::tx::{TxPolicy, TxQueue};
use super::DriverError;
use crate::frontend::{status, Connection};
use vnet::ctrl::{Coalesce, Command};

/// The largest queue-pair count a vhost-user-net device may have (the spec's 0x8000 is far
/// beyond any backend; ours stops at 127, QEMU at 1024). vhost-user names a vring in 8 bits,
/// so a control queue past index 255 is refused at set-up.
const MAX_PAIRS: u16 = 1024;

/// The features a control queue brings, asked for whenever one is wanted.
pub const CTRL_FEATURES: Features = Features(
    feature::CTRL_VQ.0
        | feature::CTRL_RX.0
        | feature::CTRL_MAC_ADDR.0
        | feature::NOTF_COAL.0
        | feature::VQ_NOTF_COAL.0
        | feature::MQ.0,
);

/// The data-path features the driver asks for by default. IN_ORDER, when the device offers
/// it, makes the queues reclaim in avail order with one used element read per batch (see
/// `vring::driver`); without it they take used elements in any order.
pub const DEFAULT_FEATURES: Features = Features(
    Features::VERSION_1.0
        | Features::RING_EVENT_IDX.0
        | Features::RING_INDIRECT_DESC.0
        | Features::IN_ORDER.0
        | feature::MRG_RXBUF.0
        | feature::MAC.0
        | feature::MTU.0
        | feature::STATUS.0,
);

/// What to ask of the device.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    /// Queue pairs to use; 0: every pair the device has.
    pub pairs: u16,
    pub queue_size: u16,
    pub ctrl_queue_size: u16,
    /// Features wanted (the control queue's are added when `ctrl` is set).
    pub features: Features,
    /// Use the control queue, in this mode, if the device offers one.
    pub ctrl: Option<CtrlMode>,
    pub ctrl_timeout: Duration,
    /// Bytes per tx buffer (header included): the largest frame is this minus the header.
    pub tx_buf_len: u32,
    /// How long to retry connecting while the socket does not accept yet.
    pub connect_wait: Duration,
    /// How the tx queues work.
    pub tx: TxPolicy,
    /// Publish every queue's avail index once per burst instead of on every buffer (see
    /// [`TxQueue`]'s `set_avail_per_burst`).
    #[cfg(feature = "experiments")]
    pub avail_per_burst: bool,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            pairs: 1,
            queue_size: 256,
            ctrl_queue_size: 64,
            features: DEFAULT_FEATURES,
            ctrl: None,
            ctrl_timeout: Duration::from_secs(5),
            tx_buf_len: 2048,
            connect_wait: Duration::from_secs(5),
            tx: TxPolicy::default(),
            #[cfg(feature = "experiments")]
            avail_per_burst: false,
        }
    }
}

/// One queue pair, to be moved to the thread that runs it.
#[derive(Debug)]
pub struct QueuePair {
    pub pair: u16,
    pub rx: RxQueue,
    pub tx: TxQueue,
}

/// A connected device.
#[derive(Debug)]
pub struct NetDriver {
    conn: Connection,
    max_pairs: u16,
    mac: Option<[u8; 6]>,
    mtu: Option<u16>,
    pairs: Vec<QueuePair>,
    counters: Vec<(Arc<QueueCounters>, Arc<QueueCounters>)>,
    ctrl: Option<Arc<CtrlQueue>>,
    active_pairs: u16,
}

/// What [`NetDriver::start`] set up.
struct Started {
    max_pairs: u16,
    mac: Option<[u8; 6]>,
    mtu: Option<u16>,
    pairs: u16,
    queue_pairs: Vec<QueuePair>,
    ctrl: Option<Arc<CtrlQueue>>,
}

/// What the config space holds (spec 5.1.4): mac, status, max_virtqueue_pairs, mtu.
const CONFIG_LEN: u32 = 12;

impl NetDriver {
    /// Connects to the vhost-user socket at `path`, negotiates, sets up `config.pairs` queue
    /// pairs (and the control queue if asked and offered), fills the rx rings and starts every
    /// queue. With MQ, tells the device how many pairs are in use.
    pub fn connect(path: &Path, config: &DriverConfig) -> Result<NetDriver, DriverError> {
        let mut wanted = config.features;
        if config.ctrl.is_some() {
            wanted = wanted | CTRL_FEATURES;
        }
        let mut conn = Connection::open_sized(
            path,
            2 * MAX_PAIRS + 1,
            wanted,
            Features::VERSION_1,
            &|negotiated| Self::memory_needed(config, negotiated),
            config.connect_wait,
        )?;
        let s = Self::start(&mut conn, config).map_err(|e| conn.handshake_error(e))?;
        conn.finish_handshake()?;
        let counters = s
            .queue_pairs
            .iter()
            .map(|p| (p.rx.counters.clone(), p.tx.counters.clone()))
            .collect();
        let pairs = s.pairs;
        let mut driver = NetDriver {
            conn,
            max_pairs: s.max_pairs,
            mac: s.mac,
            mtu: s.mtu,
            pairs: s.queue_pairs,
            counters,
            ctrl: s.ctrl,
            active_pairs: pairs,
        };
        if driver.features().contains(feature::MQ) && driver.ctrl.is_some() {
            driver.set_queue_pairs(pairs)?;
        }
        Ok(driver)
    }

    /// The handshake after negotiation: config space, queues set up and started, DRIVER_OK.
    fn start(conn: &mut Connection, config: &DriverConfig) -> Result<Started, DriverError> {
        let features = conn.features;
        let (mac, max_pairs, mtu) = Self::read_config(conn)?;
        let pairs = match config.pairs {
            0 => max_pairs,
            n if features.contains(feature::MQ) && n > max_pairs => {
                return Err(DriverError::TooManyPairs {
                    wanted: n,
                    max: max_pairs,
                })
            }
            n => n,
        };
        let mem = conn.mem.clone();
        let mtu_for_rx = mtu.unwrap_or(1500);
        let mut queue_pairs = Vec::with_capacity(pairs as usize);
        for p in 0..pairs {
            let (rx_vq, tx_vq) = (2 * p, 2 * p + 1);
            conn.setup_queue(rx_vq, config.queue_size)?;
            conn.setup_queue(tx_vq, config.queue_size)?;
            let max_chain = conn
                .queue(rx_vq)
                .and_then(|q| q.indirect)
                .map_or(config.queue_size, |a| a.max_chain)
                .min(config.queue_size);
            let layout = RxLayout::for_features(features, mtu_for_rx, max_chain);
            let (conn_ref, alloc) = (&conn.queues, &mut conn.alloc);
            let rx_setup = conn_ref.iter().find(|q| q.index == rx_vq);
            let tx_setup = conn_ref.iter().find(|q| q.index == tx_vq);
            let (Some(rx_setup), Some(tx_setup)) = (rx_setup, tx_setup) else {
                unreachable!("set up just above");
            };
            #[allow(unused_mut)] // Mutated with the `experiments` feature only.
            let mut rx = RxQueue::with_layout(rx_vq, rx_setup, &mem, alloc, layout)?;
            #[allow(unused_mut)]
            let mut tx =
                TxQueue::with_vq(tx_vq, tx_setup, &mem, alloc, config.tx_buf_len, config.tx)?;
            #[cfg(feature = "experiments")]
            {
                rx.set_avail_per_burst(config.avail_per_burst);
                tx.set_avail_per_burst(config.avail_per_burst);
            }
            queue_pairs.push(QueuePair { pair: p, rx, tx });
        }
        let ctrl = match config.ctrl {
            Some(mode) if features.contains(feature::CTRL_VQ) => {
                let vq = 2 * max_pairs;
                conn.setup_queue(vq, config.ctrl_queue_size)?;
                let buffers = conn
                    .alloc
                    .alloc(CtrlQueue::bytes_needed(config.ctrl_queue_size), 64)?;
                let Some(setup) = conn.queue(vq) else {
                    unreachable!("set up just above");
                };
                let q = CtrlQueue::new(vq, setup, &mem, buffers, mode, config.ctrl_timeout)?;
                Some(Arc::new(q))
            }
            _ => None,
        };
        for p in 0..pairs {
            conn.start_queue(2 * p as usize)?;
            conn.start_queue(2 * p as usize + 1)?;
        }
        if let Some(c) = &ctrl {
            conn.start_queue(c.vq() as usize)?;
        }
        conn.set_status(conn.status() | status::DRIVER_OK)?;
        Ok(Started {
            max_pairs,
            mac,
            mtu,
            pairs,
            queue_pairs,
            ctrl,
        })
    }

    /// Shared memory for `config`: rings, indirect tables and buffers, with room to spare.
    fn memory_needed(config: &DriverConfig, negotiated: Features) -> usize {
        let ring = |size: u16| RingAddresses::contiguous_len(size) + 4096 + size as u64 * 256;
        let size = config.queue_size as u64;
        // Big rx buffers (64 KiB each) are the worst case when MRG_RXBUF is not negotiated.
        let rx = if negotiated.contains(feature::MRG_RXBUF) {
            size * 1536
        } else {
            size * (rx::MAX_GSO_FRAME as u64 + 4096)
        };
        let pair = 2 * ring(config.queue_size) + rx + size * config.tx_buf_len as u64;
        let pairs = if config.pairs == 0 { 8 } else { config.pairs } as u64;
        let ctrl = ring(config.ctrl_queue_size) + CtrlQueue::bytes_needed(config.ctrl_queue_size);
        let total = pairs * pair + ctrl + (2 << 20);
        total.next_multiple_of(2 << 20) as usize
    }

    /// Reads mac, max_virtqueue_pairs and mtu from the config space when the features that
    /// give them meaning are negotiated (and the backend serves the config space).
    #[allow(clippy::type_complexity)]
    fn read_config(
        conn: &mut Connection,
    ) -> Result<(Option<[u8; 6]>, u16, Option<u16>), DriverError> {
        use vhost::vhost_user::message::VhostUserProtocolFeatures as P;
        let f = conn.features;
        let wants = f.contains(feature::MQ) || f.contains(feature::MAC) || f.contains(feature::MTU);
        if !wants || !conn.protocol.contains(P::CONFIG) {
            return Ok((None, 1, None));
        }
        let b = conn.get_config(0, CONFIG_LEN)?;
        if b.len() < CONFIG_LEN as usize {
            return Ok((None, 1, None));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let mac = f
            .contains(feature::MAC)
            .then(|| [b[0], b[1], b[2], b[3], b[4], b[5]]);
        let max_pairs = if f.contains(feature::MQ) {
            u16_at(8).clamp(1, MAX_PAIRS)
        } else {
            1
        };
        let mtu = f.contains(feature::MTU).then(|| u16_at(10));
        Ok((mac, max_pairs, mtu))
    }

    pub fn features(&self) -> Features {
        self.conn.features
    }
    /// The device's queue-pair count (1 without MQ).
    pub fn max_pairs(&self) -> u16 {
        self.max_pairs
    }
    /// Queue pairs set up (and handed out by [`NetDriver::take_pairs`]).
    pub fn pairs(&self) -> u16 {
        self.counters.len() as u16
    }
    /// Pairs the device was last told to use.
    pub fn active_pairs(&self) -> u16 {
        self.active_pairs
    }
    pub fn mac(&self) -> Option<[u8; 6]> {
        self.mac
    }
    pub fn mtu(&self) -> Option<u16> {
        self.mtu
    }
    pub fn ctrl(&self) -> Option<&Arc<CtrlQueue>> {
        self.ctrl.as_ref()
    }
    pub fn connection(&self) -> &Connection {
        &self.conn
    }
    /// The connection, for requests outside the data path (GET_STATUS).
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Hands out the queue pairs, to be run by their own threads. Their counters stay
    /// readable through [`NetDriver::counters`].
    pub fn take_pairs(&mut self) -> Vec<QueuePair> {
        std::mem::take(&mut self.pairs)
    }

    /// (rx, tx) counters of each pair.
    pub fn counters(&self) -> &[(Arc<QueueCounters>, Arc<QueueCounters>)] {
        &self.counters
    }

    fn ctrl_for(
        &self,
        feature: Features,
        name: &'static str,
        what: &'static str,
    ) -> Result<&Arc<CtrlQueue>, DriverError> {
        if !self.features().contains(feature) {
            return Err(DriverError::NotNegotiated {
                feature: name,
                what,
            });
        }
        self.ctrl.as_ref().ok_or(DriverError::NotNegotiated {
            feature: "CTRL_VQ",
            what,
        })
    }

    /// MQ VQ_PAIRS_SET: the device uses the first `n` pairs only.
    pub fn set_queue_pairs(&mut self, n: u16) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(feature::MQ, "MQ", "set the number of queue pairs")?;
        if n == 0 || n > self.pairs() {
            return Err(DriverError::TooManyPairs {
                wanted: n,
                max: self.pairs(),
            });
        }
        ctrl.execute_ack(Command::VqPairsSet(n))?;
        self.active_pairs = n;
        Ok(())
    }

    /// RX PROMISC: receive every frame, or only those the filter accepts.
    pub fn set_promisc(&self, on: bool) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(feature::CTRL_RX, "CTRL_RX", "set promiscuous mode")?;
        Ok(ctrl.execute_ack(Command::RxPromisc(on))?)
    }

    /// RX ALLMULTI: receive every multicast frame.
    pub fn set_allmulti(&self, on: bool) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(feature::CTRL_RX, "CTRL_RX", "set all-multicast mode")?;
        Ok(ctrl.execute_ack(Command::RxAllmulti(on))?)
    }

    /// MAC_ADDR_SET: the device's (filter's) MAC address.
    pub fn set_mac(&mut self, mac: [u8; 6]) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(
            feature::CTRL_MAC_ADDR,
            "CTRL_MAC_ADDR",
            "set the MAC address",
        )?;
        ctrl.execute_ack(Command::MacAddrSet(mac))?;
        self.mac = Some(mac);
        Ok(())
    }

    /// NOTF_COAL TX_SET: coalescing of every tx queue.
    pub fn set_tx_coalesce(&self, coal: Coalesce) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(feature::NOTF_COAL, "NOTF_COAL", "set tx coalescing")?;
        Ok(ctrl.execute_ack(Command::NotfCoalTx(coal))?)
    }

    /// NOTF_COAL RX_SET: coalescing of every rx queue.
    pub fn set_rx_coalesce(&self, coal: Coalesce) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(feature::NOTF_COAL, "NOTF_COAL", "set rx coalescing")?;
        Ok(ctrl.execute_ack(Command::NotfCoalRx(coal))?)
    }

    /// VQ_NOTF_COAL SET: coalescing of virtqueue `vqn`.
    pub fn set_vq_coalesce(&self, vqn: u16, coal: Coalesce) -> Result<(), DriverError> {
        let ctrl = self.ctrl_for(
            feature::VQ_NOTF_COAL,
            "VQ_NOTF_COAL",
            "set a queue's coalescing",
        )?;
        Ok(ctrl.execute_ack(Command::VqNotfCoalSet { vqn, coal })?)
    }

    /// VQ_NOTF_COAL GET: coalescing of virtqueue `vqn`.
    pub fn vq_coalesce(&self, vqn: u16) -> Result<Coalesce, DriverError> {
        let ctrl = self.ctrl_for(
            feature::VQ_NOTF_COAL,
            "VQ_NOTF_COAL",
            "read a queue's coalescing",
        )?;
        Ok(ctrl.vq_coalesce(vqn)?)
    }
}
