//! A guest port of the harness: its own guest memory, a tx queue whose driver posts a step's
//! frames (each chain cut into buffers) and whose `TxPath` takes them as a worker does, one
//! or two rx queues ([`RxQueue`]) adopted into the port's `Sink`s, and a control queue (set
//! up for the first MQ command) whose commands the control thread's `process_commands`
//! answers; the port attached to the `SwitchCore` and to the reference model alike.

use std::collections::VecDeque;
use std::sync::Arc;

use virtnet_backend::switch::core::{Out, SwitchCore};
use virtnet_backend::switch::guest::GuestPort;
use virtnet_backend::switch::model::{self as reference, Reference};
use virtnet_backend::switch::sink::Sink;
use virtnet_backend::switch::{PortAddress, PortConfig, PortId};
use virtnet_backend::tx::TxPath;
use virtnet_backend::{fuzzing, BackendConfig, IoMode, QueueId, QueueRuntime, Shared};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vnet::ctrl::{self, Command};
use vnet::TxHdrError;
use vring::{Buf, Chain, DriverQueue, Features, GuestAddress, GuestMemory};

use super::model::{Ring, RxMode};
use super::rx::{RxCounts, RxQueue};
use super::{guest_mac, PortSetup, TxFrame, FEATURES, MAX_BATCH, MAX_CUTS, MTUS};

/// Each port's guest memory: its rings, then a data area for tx frames and one per pair for
/// rx buffers.
const MEM_SIZE: usize = 0x30_0000;
const TX_RING: u64 = 0;
const RX_RING: [u64; 2] = [0x4000, 0x8000];
const CTRL_RING: u64 = 0xc000;
const CTRL_SIZE: u16 = 4;
/// An MQ command's bytes, and its ack.
const CTRL_CMD: u64 = 0xe000;
const CTRL_ACK: u64 = 0xe100;
const TX_DATA: u64 = 0x1_0000;
/// Each tx frame's slot: the longest frame and its header.
const TX_SLOT: u64 = 0x1_2000;
const RX_DATA: [u64; 2] = [0x10_0000, 0x20_0000];
const RX_AREA: u64 = 0x10_0000;
const TX_SIZE: u16 = 64;

/// A tx queue's counters as the model keeps them (`hdr` by `TxHdrError` kind, in the order of
/// `QueueCounters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TxCounts {
    pub(super) packets: u64,
    pub(super) dropped: u64,
    pub(super) hdr: [u64; 6],
}

pub(super) struct Guest {
    pub(super) id: PortId,
    pub(super) shared: Arc<Shared>,
    pub(super) mem: Arc<GuestMemory>,
    pub(super) features: Features,
    pub(super) mtu: u16,
    pub(super) mode: RxMode,
    pub(super) rx: Vec<RxQueue>,
    /// The queue pairs in use, as the model keeps them: all at first, then what the driver
    /// last asked for and the device acked.
    pub(super) active: u16,
    tx_driver: DriverQueue<u32>,
    ctrl: Option<(DriverQueue<u32>, QueueRuntime, Chain)>,
    tx: TxPath,
    port: GuestPort,
    pub(super) tx_counts: TxCounts,
    pub(super) received: usize,
    pub(super) by_pair: [usize; 2],
}

fn eventfd() -> EventFd {
    EventFd::new(EFD_NONBLOCK).expect("an eventfd")
}

pub(super) fn hdr_kind(e: &TxHdrError) -> usize {
    match e {
        TxHdrError::Short => 0,
        TxHdrError::Flags(_) => 1,
        TxHdrError::NotNegotiated => 2,
        TxHdrError::Csum { .. } => 3,
        TxHdrError::Gso { .. } => 4,
        TxHdrError::TooLong { .. } => 5,
    }
}

impl Guest {
    pub(super) fn new(
        core: &Arc<SwitchCore>,
        reference: &mut Reference,
        n: usize,
        s: &PortSetup,
    ) -> Guest {
        let id = PortId::new(n + 1).expect("a port number");
        let mac = reference::mac(guest_mac(n));
        let mut features = Features::VERSION_1;
        for (i, f) in FEATURES.iter().enumerate() {
            if s.features & (1 << i) != 0 {
                features = features.union(*f);
            }
        }
        let pairs = 1 + s.two_pairs as u16;
        let mtu = MTUS[s.mtu as usize % MTUS.len()];
        let config = BackendConfig {
            pairs,
            mac: mac.bytes(),
            mtu: Some(mtu),
            io: IoMode::Null { size: 64 },
            ..BackendConfig::default()
        };
        let shared = Arc::new(fuzzing::shared(config).expect("device state"));
        let mode = RxMode {
            promisc: s.filter & 1 == 0,
            allmulti: s.filter & 2 != 0,
            mac: mac.bytes(),
        };
        shared.set_promisc(mode.promisc);
        shared.set_allmulti(mode.allmulti);
        let mem =
            Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM_SIZE)]).expect("guest memory"));
        let size = 1u16 << (s.rx.size_log2 % 9);
        let lens = s.rx.lens.map(u32::from);
        let stride = (lens[0].max(lens[1]).max(1) as u64).next_multiple_of(16);
        let count = (s.rx.buffers as u64).min(size as u64).min(RX_AREA / stride) as u32;
        let mut rx = Vec::new();
        let mut sinks = Vec::new();
        for p in 0..pairs {
            let sink = Arc::new(Sink::new(eventfd()));
            let mut q = RxQueue {
                driver: None,
                free: (0..count).collect(),
                lens,
                readable_at: s.rx.readable_at.map(u32::from),
                data: RX_DATA[p as usize],
                stride,
                ring: Ring {
                    mergeable: features.contains(vnet::feature::MRG_RXBUF),
                    max_buffers: (size as usize).min(1024),
                    ..Ring::default()
                },
                want: VecDeque::new(),
                group: 0,
                chunk: Vec::new(),
                counts: RxCounts::default(),
            };
            if !s.rx.stopped {
                let id = QueueId::Rx(p);
                let at = (RX_RING[p as usize], size);
                let (driver, rt) = fuzzing::queue_pair(&shared, &mem, id, at, features, true);
                assert!(sink.start(rt).is_none());
                q.driver = Some(driver);
                q.ring.running = true;
                q.post();
            }
            rx.push(q);
            sinks.push(sink);
        }
        let at = (TX_RING, TX_SIZE);
        let (tx_driver, rt) =
            fuzzing::queue_pair(&shared, &mem, QueueId::Tx(0), at, features, true);
        let mut tx = TxPath::default();
        assert!(tx.start(rt).is_none());
        let port = GuestPort::new(id, core.clone(), sinks[0].clone(), None);
        let config = if s.unchecked {
            PortConfig {
                address: PortAddress::Unchecked(mac),
                learn_limit: (s.learn_limit % reference::LIMITS).into(),
            }
        } else {
            PortConfig::guest(mac)
        };
        let out = Out::Guest {
            shared: shared.clone(),
            sinks: sinks.into(),
        };
        let got = core.add_port(id, config, out);
        assert_eq!(got, reference.add_port(id, config), "adding {id:?}");
        Guest {
            id,
            shared,
            mem,
            features,
            mtu,
            mode,
            rx,
            active: pairs,
            tx_driver,
            ctrl: None,
            tx,
            port,
            tx_counts: TxCounts::default(),
            received: 0,
            by_pair: [0; 2],
        }
    }

    /// The guest's driver sends `frames` on its tx queue, and its worker takes them; returns
    /// each frame's header and bytes as the driver wrote them.
    pub(super) fn send(&mut self, frames: &[TxFrame]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        let mut sent = Vec::new();
        for (k, f) in frames.iter().take(MAX_BATCH).enumerate() {
            let (hdr, frame, seeded) = f.bytes();
            let mut all = hdr.clone();
            all.extend(&frame);
            let base = TX_DATA + k as u64 * TX_SLOT;
            self.mem
                .write(GuestAddress(base), &all)
                .expect("the tx area");
            let mut bufs = Vec::new();
            let mut at = 0usize;
            for &c in f.cuts.iter().take(MAX_CUTS) {
                let n = (c as usize).min(all.len() - at);
                bufs.push(Buf::new(GuestAddress(base + at as u64), n as u32));
                at += n;
            }
            if at < all.len() || bufs.is_empty() {
                let n = all.len() - at;
                bufs.push(Buf::new(GuestAddress(base + at as u64), n as u32));
            }
            self.tx_driver
                .add(&bufs, &[], k as u32)
                .expect("room on the tx ring");
            sent.push((hdr, frame, seeded));
        }
        self.tx_driver.kick_prepare();
        let mut turns = 0;
        while self.tx.pending() {
            self.tx.turn(&mut self.port);
            turns += 1;
            assert!(turns <= MAX_BATCH, "the tx path keeps frames it could send");
        }
        let q = self.tx.queue().expect("the tx queue");
        assert_eq!(
            q.counters().broken_reason(),
            None,
            "an honest tx queue broke"
        );
        let mut used = 0;
        while let Some((t, _)) = self.tx_driver.get_used().expect("an honest device") {
            assert_eq!(t, used, "tx frames used out of order");
            used += 1;
        }
        assert_eq!(used as usize, sent.len(), "tx frames not used");
        sent
    }

    /// The guest's driver asks for `n` queue pairs (MQ VQ_PAIRS_SET) on its control queue,
    /// and the control thread answers: whether the device acked it OK.
    pub(super) fn set_pairs(&mut self, n: u16) -> bool {
        let (driver, rt, chain) = self.ctrl.get_or_insert_with(|| {
            let at = (CTRL_RING, CTRL_SIZE);
            let (driver, rt) = fuzzing::queue_pair(
                &self.shared,
                &self.mem,
                QueueId::Ctrl,
                at,
                self.features,
                false,
            );
            (driver, rt, Chain::new())
        });
        let cmd = Command::VqPairsSet(n).encode();
        self.mem
            .write(GuestAddress(CTRL_CMD), &cmd)
            .expect("the command area");
        // Neither OK nor ERR, until the device writes it.
        self.mem
            .write(GuestAddress(CTRL_ACK), &[0xa5])
            .expect("the ack");
        let readable = [Buf::new(GuestAddress(CTRL_CMD), cmd.len() as u32)];
        let writable = [Buf::new(GuestAddress(CTRL_ACK), 1)];
        driver
            .add(&readable, &writable, 0)
            .expect("room on the control ring");
        driver.kick_prepare();
        let done = fuzzing::process_commands(&self.shared, rt, chain);
        assert_eq!(done, 1, "the MQ command was not answered");
        let used = driver.get_used().expect("an honest device");
        assert_eq!(used, Some((0, 1)), "the MQ command's ack");
        let mut ack = [0u8];
        self.mem
            .read(GuestAddress(CTRL_ACK), &mut ack)
            .expect("the ack");
        assert!(
            ack[0] == ctrl::OK || ack[0] == ctrl::ERR,
            "an ack: {}",
            ack[0]
        );
        ack[0] == ctrl::OK
    }
}
