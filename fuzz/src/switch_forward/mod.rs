//! The `switch_forward` target: the switch's forwarding step with real frames, through the
//! code its workers run. Guest ports (up to four, and a TAP uplink without a TAP) are
//! attached to a real `SwitchCore`; each has its own guest memory, a tx queue whose driver
//! posts frames, and one or two rx queues (adopted into the port's `Sink`s) with buffers
//! posted. A step sends a batch of frames from one port: any virtio-net header (raw fields,
//! or a checksum or GSO request made to fit the frame) and any bytes (raw, or built:
//! VLAN tags, ARP, RARP, IPv4 and IPv6 with TCP, UDP or another protocol, cut anywhere), each
//! chain cut into buffers anywhere. The port's `TxPath::turn` takes them as a worker does:
//! the tx header check (`tx::check_header`), `GuestPort::send` (the first bytes copied),
//! `SwitchCore::forward` (`flow::frame`, `decide`, `flow::hash`, learning after the batch),
//! and each destination's `Sink::deliver` (`vnet::gso` for a receiver without the offloads,
//! `RxPath::deliver_pieces` into its ring).
//!
//! After every step the harness checks, against [`model`] and the backend's reference model
//! of the decision (`switch::model::Reference`):
//!
//! - nothing panics, and every tx frame is used;
//! - a header a driver must not send is refused (`NetHdr::check_tx`, whose verdict the
//!   vhost_user target's `tx_header` rules check too) and counted by reason, and ends the
//!   batch there (the frames after it are learned from after it);
//! - each frame goes where the model's decision says (port security, static and learned
//!   MACs, flooding, hairpin, announcements), to the queue pair its flow hashes to, and
//!   nowhere else: each rx ring holds exactly the frames the model offers it, in order, byte
//!   for byte, behind the header the receiver should get (`num_buffers` the buffers the frame
//!   took); a receiver without the offloads gets what `vnet::gso` makes of the frame (a
//!   segment longer than its MTU dropped), and the segments keep what Linux's GSO
//!   guarantees: the Ethernet header, IP lengths, IPv4's header checksum, UDP's length, and
//!   the payloads, put together, the frame's; every transport checksum completed for a frame
//!   built here (its checksum asked for, the field seeded as Linux does) is right;
//! - a frame a ring has no room for is counted (`rx_missed`), as is one larger than any
//!   buffers hold or the MTU (`dropped`) and one the receive filter refuses (`filtered`); a
//!   buffer without a writable byte breaks the ring, and a broken ring takes nothing more
//!   and counts each frame it is offered (`rx_missed`), those of the chunk that broke it
//!   included; one never started takes nothing;
//! - the tx, rx and per-port drop counters, every MAC table entry and the table's counters
//!   are the models'.
//!
//! The MAC table has the reference model's capacity, and an age and a move hold of an hour:
//! no run lasts that long, so the model's time stands still and no result depends on the
//! clock.

mod input;
pub mod model;

pub use input::{
    guest_mac, Body, Built, FrameSpec, Hdr, PortSetup, RxSetup, Step, SwitchInput, TxFrame,
    FEATURES, L4, MAX_BATCH, MAX_CUTS, MAX_GUESTS, MTUS,
};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use virtnet_backend::switch::core::{Out, SwitchCore};
use virtnet_backend::switch::guest::GuestPort;
use virtnet_backend::switch::model::{self as reference, Reference};
use virtnet_backend::switch::sink::Sink;
use virtnet_backend::switch::{flow, FdbConfig, Learn, PortAddress, PortConfig, PortId, Verdict};
use virtnet_backend::tx::TxPath;
use virtnet_backend::{fuzzing, BackendConfig, IoMode, QueueId, Shared};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vnet::{NetHdr, TxHdrError, HDR_LEN};
use vring::{
    Buf, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses,
};

use model::{Fate, Piece, Ring, RxMode};

/// Each port's guest memory: its rings, then a data area for tx frames and one per pair for
/// rx buffers.
const MEM_SIZE: usize = 0x30_0000;
const TX_RING: u64 = 0;
const RX_RING: [u64; 2] = [0x4000, 0x8000];
const TX_DATA: u64 = 0x1_0000;
/// Each tx frame's slot: the longest frame and its header.
const TX_SLOT: u64 = 0x1_2000;
const RX_DATA: [u64; 2] = [0x10_0000, 0x20_0000];
const RX_AREA: u64 = 0x10_0000;
const TX_SIZE: u16 = 64;

/// What a run did, for the seeds to check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Frames each guest port received (segments one each), by port.
    pub received: Vec<usize>,
    /// Tx frames refused for their header, and dropped by the decision.
    pub refused: u64,
    pub not_forwarded: u64,
    /// Frames offered to receivers resolved in software (checksum or segments), and the
    /// segments received.
    pub resolved: usize,
    pub segments: usize,
    /// Frames dropped by receivers: no room, too large, filtered.
    pub rx_missed: u64,
    pub rx_dropped: u64,
    pub filtered: u64,
    /// Rx rings broken.
    pub broken: usize,
}

/// An rx queue's counters as the model keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct RxCounts {
    packets: u64,
    bytes: u64,
    dropped: u64,
    rx_missed: u64,
    filtered: u64,
}

/// A tx queue's counters as the model keeps them (`hdr` by `TxHdrError` kind, in the order of
/// `QueueCounters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct TxCounts {
    packets: u64,
    dropped: u64,
    hdr: [u64; 6],
}

/// One rx queue: the driver's end, and what the model expects of it.
struct RxQueue {
    driver: Option<DriverQueue<u32>>,
    /// Tokens the driver got back, to post again.
    free: Vec<u32>,
    lens: [u32; 2],
    readable_at: Option<u32>,
    /// Where token t's buffer is: `data + t * stride`.
    data: u64,
    stride: u64,
    ring: Ring,
    /// Frames the ring should hold, in order: header (with `num_buffers`) and bytes, and
    /// whether it may be missing (see [`RxQueue::broke`]).
    want: VecDeque<(NetHdr, Vec<u8>, bool)>,
    /// Where the frames of the batch being forwarded start in `want`.
    group: usize,
    /// The frames the sink passes as sent, gathered into a chunk that goes into the ring at
    /// once: at the end of a batch, or before a frame it resolves.
    chunk: Vec<(NetHdr, Vec<u8>)>,
    counts: RxCounts,
}

struct Guest {
    id: PortId,
    shared: Arc<Shared>,
    mem: Arc<GuestMemory>,
    features: Features,
    mtu: u16,
    mode: RxMode,
    rx: Vec<RxQueue>,
    tx_driver: DriverQueue<u32>,
    tx: TxPath,
    port: GuestPort,
    tx_counts: TxCounts,
    received: usize,
}

fn eventfd() -> EventFd {
    EventFd::new(EFD_NONBLOCK).expect("an eventfd")
}

fn hdr_kind(e: &TxHdrError) -> usize {
    match e {
        TxHdrError::Short => 0,
        TxHdrError::Flags(_) => 1,
        TxHdrError::NotNegotiated => 2,
        TxHdrError::Csum { .. } => 3,
        TxHdrError::Gso { .. } => 4,
        TxHdrError::TooLong { .. } => 5,
    }
}

/// A device queue of `shared` on `mem` and the driver's end of it.
fn queue(
    shared: &Shared,
    mem: &Arc<GuestMemory>,
    id: QueueId,
    size: u16,
    at: u64,
    features: Features,
) -> (DriverQueue<u32>, virtnet_backend::QueueRuntime) {
    let rings = RingAddresses::contiguous(GuestAddress(at), size);
    let config = QueueConfig::new(size as u32, rings, features).expect("queue config");
    let driver = DriverQueue::activate(&config, mem.clone(), None).expect("driver queue");
    let device = DeviceQueue::activate(&config, mem.clone(), vring::RingPosition::START)
        .expect("device queue");
    let rt = fuzzing::queue_runtime(
        id,
        device,
        eventfd(),
        Some(eventfd()),
        Some(eventfd()),
        shared.queue_counters(id).clone(),
        shared.queue_tunables(id).clone(),
    );
    (driver, rt)
}

impl RxQueue {
    /// Posts the free buffers, in token order.
    fn post(&mut self) {
        let Some(driver) = self.driver.as_mut() else {
            return;
        };
        let mut free = std::mem::take(&mut self.free);
        free.sort_unstable();
        for t in free {
            let addr = GuestAddress(self.data + t as u64 * self.stride);
            let len = self.lens[t as usize % 2];
            let readable = Some(t) == self.readable_at;
            let added = if readable {
                driver.add(&[Buf::new(addr, len.max(1))], &[], t)
            } else {
                driver.add(&[], &[Buf::new(addr, len)], t)
            };
            if added.is_err() {
                self.free.push(t);
                continue;
            }
            self.ring.posted.push_back(if readable { 0 } else { len });
        }
        driver.kick_prepare();
    }

    /// Offers one frame, as sent or resolved, to the ring: what became of it, counted (the
    /// frames delivered are left to the caller, which counts them when the sink does).
    fn offer(&mut self, hdr: &NetHdr, bytes: &[u8], mode: &RxMode) -> Fate {
        if !mode.accepts(bytes) {
            self.counts.filtered += 1;
            return Fate::Filtered;
        }
        let fate = self.ring.offer((HDR_LEN + bytes.len()) as u64);
        match fate {
            Fate::Delivered(n) => {
                let h = NetHdr {
                    num_buffers: n as u16,
                    ..*hdr
                };
                self.want.push_back((h, bytes.to_vec(), false));
            }
            Fate::TooLarge => self.counts.dropped += 1,
            Fate::NoRoom => self.counts.rx_missed += 1,
            Fate::Filtered | Fate::Gone => {}
            Fate::Broke => self.broke(),
        }
        fate
    }

    /// Puts the chunk into the ring, as the sink does: once a frame finds no room the rest
    /// of the chunk finds none either; the frames are counted once all are in, so not at all
    /// when the ring breaks. Whether it broke.
    fn end_chunk(&mut self, mode: &RxMode) -> bool {
        let (mut packets, mut bytes, mut missed) = (0, 0, false);
        let chunk = std::mem::take(&mut self.chunk);
        let n = chunk.len() as u64;
        for (h, b) in chunk {
            if missed {
                self.counts.rx_missed += 1;
                continue;
            }
            match self.offer(&h, &b, mode) {
                Fate::Delivered(_) => {
                    packets += 1;
                    bytes += b.len() as u64;
                }
                Fate::NoRoom => missed = true,
                Fate::Broke => {
                    // The whole chunk is missed, the frames put in before the break too.
                    self.counts.rx_missed += n;
                    return true;
                }
                _ => {}
            }
        }
        self.counts.packets += packets;
        self.counts.bytes += bytes;
        false
    }

    /// The ring broke while the sink delivered a batch's frames: the frames before, in the
    /// ring's buffers and used, are published only if the device's used batch filled
    /// (`vring::DEFAULT_USED_BATCH`) before the break, as the sink calls the guest (and
    /// publishes) only on a ring that works. A broken ring's driver must reset the device,
    /// so they may be missing, the last of them first.
    fn broke(&mut self) {
        for w in self.want.iter_mut().skip(self.group) {
            w.2 = true;
        }
    }

    /// Takes every frame the driver got back and checks it against what the model expects.
    fn check(&mut self, mem: &GuestMemory, what: &str) -> usize {
        let Some(driver) = self.driver.as_mut() else {
            return 0;
        };
        let mut got = 0;
        loop {
            let mut bytes = Vec::new();
            let mut buffers = 0usize;
            let mut need = 1usize;
            let mut parsed = false;
            while buffers < need {
                let used = driver.get_used().expect("an honest device");
                let Some((t, len)) = used else {
                    assert_eq!(buffers, 0, "{what}: a frame's buffers were not all used");
                    assert!(
                        self.want.iter().all(|w| w.2),
                        "{what}: frames missing: {:?}",
                        self.want.iter().map(|w| w.0).collect::<Vec<_>>()
                    );
                    self.want.clear();
                    return got;
                };
                self.free.push(t);
                let at = self.data + t as u64 * self.stride;
                assert!(len <= self.lens[t as usize % 2], "{what}: used length");
                let mut b = vec![0u8; len as usize];
                mem.read(GuestAddress(at), &mut b).expect("a posted buffer");
                bytes.extend(b);
                buffers += 1;
                // The header (and its num_buffers) may span buffers.
                if !parsed {
                    need = match bytes.get(..HDR_LEN) {
                        Some(h) => {
                            parsed = true;
                            u16::from_le_bytes([h[10], h[11]]).max(1) as usize
                        }
                        None => buffers + 1,
                    };
                }
            }
            let mut h = [0u8; HDR_LEN];
            h.copy_from_slice(&bytes[..HDR_LEN]);
            let hdr = NetHdr::from_bytes(&h);
            let Some((want_hdr, want, _)) = self.want.pop_front() else {
                panic!("{what}: a frame the model did not send there: {hdr:?}, {bytes:02x?}");
            };
            assert_eq!(hdr, want_hdr, "{what}: frame {got}'s header");
            assert!(
                bytes[HDR_LEN..] == want[..],
                "{what}: frame {got}'s bytes differ: got {} bytes, want {}",
                bytes.len() - HDR_LEN,
                want.len()
            );
            got += 1;
        }
    }
}

impl Guest {
    fn new(core: &Arc<SwitchCore>, reference: &mut Reference, n: usize, s: &PortSetup) -> Guest {
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
                let (driver, rt) = queue(&shared, &mem, id, size, RX_RING[p as usize], features);
                assert!(sink.start(rt).is_none());
                q.driver = Some(driver);
                q.ring.running = true;
                q.post();
            }
            rx.push(q);
            sinks.push(sink);
        }
        let (tx_driver, rt) = queue(&shared, &mem, QueueId::Tx(0), TX_SIZE, TX_RING, features);
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
            tx_driver,
            tx,
            port,
            tx_counts: TxCounts::default(),
            received: 0,
        }
    }

    /// The guest's driver sends `frames` on its tx queue, and its worker takes them; returns
    /// each frame's header and bytes as the driver wrote them.
    fn send(&mut self, frames: &[TxFrame]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
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
}

/// The switch, its ports, and the models.
struct Harness {
    core: Arc<SwitchCore>,
    reference: Reference,
    uplink: bool,
    guests: Vec<Guest>,
    out: Outcome,
}

impl Harness {
    fn new(input: &SwitchInput) -> Harness {
        let fdb = FdbConfig {
            capacity: reference::CAPACITY,
            age: Duration::from_secs(3600),
            move_hold: Duration::from_secs(3600),
        };
        let core = Arc::new(SwitchCore::new(fdb).expect("a small FDB"));
        let mut reference = Reference::new();
        let uplink = PortId::new(0).expect("port 0");
        if let Some(limit) = input.uplink {
            let config = PortConfig::uplink((limit % reference::LIMITS).into());
            let got = core.add_port(uplink, config, Out::Uplink);
            assert_eq!(got, reference.add_port(uplink, config), "adding the uplink");
        }
        let mut guests = Vec::new();
        for (n, s) in input.ports.iter().take(MAX_GUESTS).enumerate() {
            guests.push(Guest::new(&core, &mut reference, n, s));
        }
        Harness {
            core,
            reference,
            uplink: input.uplink.is_some(),
            guests,
            out: Outcome::default(),
        }
    }

    /// Guest `g` sends `frames`: the switch forwards them, the model says what it should
    /// have done, and every ring and counter is checked.
    fn send(&mut self, g: usize, frames: &[TxFrame]) {
        let sent = self.guests[g].send(frames);
        let from = self.guests[g].id;
        let features = self.guests[g].features;
        let mut learns: Vec<Learn> = Vec::new();
        let mut tx = TxCounts::default();
        self.begin_batch();
        for (k, (hdr, frame, seeded)) in sent.iter().enumerate() {
            let what = format!("frame {k} from {from:?}");
            let total = hdr.len() + frame.len();
            tx.packets += 1;
            let verdict = if total < HDR_LEN {
                Err(TxHdrError::Short)
            } else {
                let mut all = hdr.clone();
                all.extend(frame);
                let mut h = [0u8; HDR_LEN];
                h.copy_from_slice(&all[..HDR_LEN]);
                let h = NetHdr::from_bytes(&h);
                let len = total - HDR_LEN;
                crate::vhost_user::tx_header::assert_checked(&h, features, len);
                h.check_tx(features, len).map(|()| {
                    let frame = all[HDR_LEN..].to_vec();
                    (
                        NetHdr {
                            num_buffers: 0,
                            ..h
                        },
                        frame,
                    )
                })
            };
            let (hdr, frame) = match verdict {
                Ok(v) => v,
                Err(e) => {
                    tx.dropped += 1;
                    tx.hdr[hdr_kind(&e)] += 1;
                    self.out.refused += 1;
                    // The batch ends before this frame: its learning is done.
                    for l in learns.drain(..) {
                        self.reference.learn(l);
                    }
                    self.begin_batch();
                    continue;
                }
            };
            let prefix = &frame[..frame.len().min(model::PREFIX)];
            let Some(f) = model::frame(prefix) else {
                tx.dropped += 1;
                self.out.not_forwarded += 1;
                continue;
            };
            let d = self.reference.decide(from, f);
            learns.extend(d.learn);
            let to = match d.verdict {
                Verdict::Forward(to) => to,
                Verdict::Drop(_) => {
                    tx.dropped += 1;
                    self.out.not_forwarded += 1;
                    continue;
                }
            };
            for p in to.iter() {
                if p.index() == 0 {
                    assert!(self.uplink, "{what}: to an uplink the switch has not");
                    continue;
                }
                self.deliver(p.index() - 1, &hdr, &frame, *seeded, &what);
            }
        }
        for l in learns.drain(..) {
            self.reference.learn(l);
        }
        self.begin_batch();
        let c = &mut self.guests[g].tx_counts;
        c.packets += tx.packets;
        c.dropped += tx.dropped;
        for (c, t) in c.hdr.iter_mut().zip(tx.hdr) {
            *c += t;
        }
        self.check();
    }

    /// The tx path hands the switch a new batch: each sink gets its frames in one group.
    /// Ends the one before.
    fn begin_batch(&mut self) {
        for g in &mut self.guests {
            for q in &mut g.rx {
                if q.end_chunk(&g.mode) {
                    self.out.broken += 1;
                }
                q.group = q.want.len();
            }
        }
    }

    /// What guest `d`'s sink should make of `frame`.
    fn deliver(&mut self, d: usize, hdr: &NetHdr, frame: &[u8], seeded: bool, what: &str) {
        let dest = &mut self.guests[d];
        let prefix = &frame[..frame.len().min(model::PREFIX)];
        let pairs = dest.rx.len() as u32;
        let active = (dest.shared.active_pairs() as u32).clamp(1, pairs);
        let pair = if pairs > 1 {
            (flow::hash(prefix) % active) as usize
        } else {
            0
        };
        let q = &mut dest.rx[pair];
        if !q.ring.running {
            return;
        }
        if q.ring.broken {
            q.counts.rx_missed += 1;
            return;
        }
        let offer = model::offer(hdr, frame, dest.features, dest.mtu, seeded);
        let mode = dest.mode;
        if offer.resolved.is_none() {
            match &offer.pieces[..] {
                [Piece::Frame(h, bytes)] => q.chunk.push((*h, bytes.clone())),
                [Piece::Dropped] => q.counts.dropped += 1,
                p => unreachable!("{what}: a frame passed as sent is one piece: {p:?}"),
            }
            return;
        }
        if q.end_chunk(&mode) {
            // The frame is lost (and missed) with the chunk before it.
            q.counts.rx_missed += 1;
            self.out.broken += 1;
            return;
        }
        self.out.resolved += 1;
        for piece in &offer.pieces {
            let (h, bytes) = match piece {
                Piece::Dropped => {
                    q.counts.dropped += 1;
                    continue;
                }
                Piece::Frame(h, bytes) => (h, bytes),
            };
            match q.offer(h, bytes, &mode) {
                Fate::Delivered(_) => {
                    q.counts.packets += 1;
                    q.counts.bytes += bytes.len() as u64;
                    if offer.segmented {
                        self.out.segments += 1;
                    }
                }
                // No room for this one: none for the rest either.
                Fate::NoRoom => break,
                Fate::Broke => {
                    q.counts.rx_missed += 1;
                    self.out.broken += 1;
                    break;
                }
                _ => {}
            }
        }
    }

    /// Every ring holds what the models say, and every counter is theirs.
    fn check(&mut self) {
        for g in &mut self.guests {
            for (p, q) in g.rx.iter_mut().enumerate() {
                let what = format!("{:?} pair {p}", g.id);
                let n = q.check(&g.mem, &what);
                g.received += n;
                let c = g.shared.queue_counters(QueueId::Rx(p as u16)).snapshot();
                let got = RxCounts {
                    packets: c.packets,
                    bytes: c.bytes,
                    dropped: c.dropped,
                    rx_missed: c.rx_missed,
                    filtered: c.filtered,
                };
                assert_eq!(got, q.counts, "{what}: rx counters");
                assert_eq!(c.broken.is_some(), q.ring.broken, "{what}: broken");
            }
            let c = g.shared.queue_counters(QueueId::Tx(0)).snapshot();
            let got = TxCounts {
                packets: c.packets,
                dropped: c.dropped,
                hdr: [
                    c.hdr_short,
                    c.hdr_bad_flags,
                    c.hdr_not_negotiated,
                    c.hdr_bad_csum,
                    c.hdr_bad_gso,
                    c.hdr_too_long,
                ],
            };
            assert_eq!(got, g.tx_counts, "{:?}: tx counters", g.id);
            let port = self.core.port_counters(g.id);
            assert_eq!(port, self.reference.port_counters(g.id), "{:?}", g.id);
        }
        let show = self.core.fdb_show();
        let mut entries: Vec<_> = show
            .entries
            .iter()
            .map(|e| {
                let is_static = e.kind == virtnet_backend::switch::EntryKind::Static;
                (e.mac, e.port, is_static)
            })
            .collect();
        entries.sort();
        let mut want = self.reference.entries();
        want.sort();
        assert_eq!(entries, want, "MAC table entries");
        assert_eq!(
            show.counters,
            self.reference.counters(),
            "MAC table counters"
        );
    }
}

/// Runs `input` on the switch and its models: panics at the first difference.
pub fn run(input: &SwitchInput) -> Outcome {
    let mut h = Harness::new(input);
    if h.guests.is_empty() {
        return h.out;
    }
    for step in &input.steps {
        match step {
            Step::Send { port, frames } => {
                let g = *port as usize % h.guests.len();
                h.send(g, frames);
            }
            Step::Refill { port } => {
                let g = *port as usize % h.guests.len();
                for q in &mut h.guests[g].rx {
                    q.post();
                }
                h.check();
            }
        }
    }
    for g in &h.guests {
        h.out.received.push(g.received);
        for q in &g.rx {
            h.out.rx_missed += q.counts.rx_missed;
            h.out.rx_dropped += q.counts.dropped;
            h.out.filtered += q.counts.filtered;
        }
    }
    h.out
}
