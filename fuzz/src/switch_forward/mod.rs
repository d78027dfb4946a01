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
//! `RxPath::deliver_pieces` into its ring). Another step sends a batch of frames from the host
//! through the uplink, laid out as the uplink reads them from its TAP and forwarded by the
//! uplink's own code (`uplink::forward_read`, through `fuzzing::uplink_forward`): each behind
//! a header the kernel writes for the TAP's offloads (none, DATA_VALID, a partial checksum or
//! a GSO super-frame made to fit, `num_buffers` left stale), or shorter than a header
//! (`host.rs`). Another has a guest's driver ask for 0 to 3 queue pairs on its control queue
//! (MQ VQ_PAIRS_SET, answered by the control thread's `process_commands`) between batches.
//!
//! After every step the harness checks, against [`model`] and the backend's reference model
//! of the decision (`switch::model::Reference`):
//!
//! - nothing panics, and every tx frame is used;
//! - a frame from the host is decided from port 0 (learned from up to the uplink's limit),
//!   never sent back out of the uplink, and delivered to guests as a guest's frame is (its
//!   flow hashed over the whole frame, the uplink's prefix, not its first 64 bytes); the
//!   uplink counts the frames it forwarded and their bytes, and as dropped those the decision
//!   drops and those shorter than a header;
//! - an MQ command is acked OK, and its pairs used from the next batch on, only for 1 up to
//!   the pairs the guest has; anything else is acked ERR and changes nothing;
//! - a header a driver must not send is refused (`NetHdr::check_tx`, whose verdict the
//!   vhost_user target's `tx_header` rules check too) and counted by reason, and ends the
//!   batch there (the frames after it are learned from after it);
//! - each frame goes where the model's decision says (port security, static and learned
//!   MACs, flooding, hairpin, announcements), to the queue pair its flow hashes to, and
//!   nowhere else: each rx ring holds exactly the frames the model offers it, in order, byte
//!   for byte, behind the header the receiver should get (`num_buffers` the buffers the frame
//!   took; flags zero for one without GUEST_CSUM); a receiver without the offloads gets what `vnet::gso` makes of the frame (a
//!   segment longer than its MTU dropped), and the segments keep what Linux's GSO
//!   guarantees: the Ethernet header, IP lengths, IPv4's header checksum, UDP's length, and
//!   the payloads, put together, the frame's; every transport checksum completed for a frame
//!   built here (its checksum asked for, the field seeded as Linux does) is right;
//! - a frame a ring has no room for is counted (`rx_missed`), as is one larger than any
//!   buffers hold or the MTU (`dropped`) and one the receive filter refuses (`filtered`); a
//!   buffer without a writable byte breaks the ring, and a broken ring takes nothing more
//!   and counts each frame it is offered (`rx_missed`), those of the chunk that broke it
//!   included; one never started takes nothing;
//! - the tx, rx and per-port drop counters, the uplink's, each guest's active pairs, every
//!   MAC table entry and the table's counters are the models'.
//!
//! The MAC table has the reference model's capacity, and an age and a move hold of an hour:
//! no run lasts that long, so the model's time stands still and no result depends on the
//! clock.
//!
//! The input types are in `input.rs`, the host's frames in `host.rs`; a guest port (memory,
//! tx and control queues, attachment) in `guest.rs`, and its rx queues with the frames they
//! should hold in `rx.rs`; what a receiver should get, frame by frame, in `model.rs`. This
//! file is the switch, the batches' decision and delivery as the models see them, and the
//! checks after each step.

mod guest;
mod host;
mod input;
pub mod model;
mod rx;

pub use host::{HostFrame, HostHdr, TAP_OFFLOADS};
pub use input::{
    guest_mac, Body, Built, FrameSpec, Hdr, PortSetup, RxSetup, Step, SwitchInput, TxFrame,
    FEATURES, L4, MAX_BATCH, MAX_CUTS, MAX_GUESTS, MTUS,
};

use std::sync::Arc;
use std::time::Duration;

use virtnet_backend::fuzzing;
use virtnet_backend::switch::core::{Out, SwitchCore};
use virtnet_backend::switch::model::{self as reference, Reference};
use virtnet_backend::switch::tap::UplinkCounters;
use virtnet_backend::switch::{flow, FdbConfig, Learn, PortConfig, PortId, Verdict};
use virtnet_backend::QueueId;
use vnet::{NetHdr, TxHdrError, HDR_LEN};

use guest::{hdr_kind, Guest, TxCounts};
use model::{Fate, Piece};
use rx::RxCounts;

/// What a run did, for the seeds to check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Frames each guest port received (segments one each), by port, and by port and pair.
    pub received: Vec<usize>,
    pub by_pair: Vec<Vec<usize>>,
    /// Frames from the host forwarded, and dropped (by the decision, or shorter than a
    /// header), as the uplink counts them.
    pub host_forwarded: u64,
    pub host_dropped: u64,
    /// MQ commands refused.
    pub pairs_refused: usize,
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

/// The uplink's counters of frames from the host (`UplinkCounters::into`) as the model
/// keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct HostCounts {
    packets: u64,
    bytes: u64,
    dropped: u64,
}

/// The switch, its ports, and the models.
struct Harness {
    core: Arc<SwitchCore>,
    reference: Reference,
    uplink: bool,
    uplink_counters: UplinkCounters,
    host: HostCounts,
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
            uplink_counters: UplinkCounters::default(),
            host: HostCounts::default(),
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
                self.deliver(p.index() - 1, (&hdr, prefix), &frame, *seeded, &what);
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

    /// The host sends `frames` in through the uplink: they are laid out as the uplink reads
    /// a batch from its TAP (each 64-byte aligned), and forwarded as its worker forwards
    /// them; the model decides each from port 0 and delivers it, and every ring and counter
    /// is checked.
    fn host_send(&mut self, frames: &[HostFrame]) {
        let uplink = PortId::new(0).expect("port 0");
        let (mut arena, mut spans, mut seeded) = (Vec::new(), Vec::new(), Vec::new());
        for f in frames.iter().take(MAX_BATCH) {
            let (bytes, s) = f.bytes();
            spans.push((arena.len(), bytes.len()));
            arena.extend(&bytes);
            arena.resize(arena.len().next_multiple_of(64), 0);
            seeded.push(s);
        }
        fuzzing::uplink_forward(&self.core, uplink, &self.uplink_counters, &arena, &spans);
        let mut learns: Vec<Learn> = Vec::new();
        self.begin_batch();
        for (k, (&(at, n), &seeded)) in spans.iter().zip(&seeded).enumerate() {
            let what = format!("frame {k} from the host");
            let Some(hdr) = arena[at..at + n].first_chunk::<HDR_LEN>() else {
                self.host.dropped += 1;
                continue;
            };
            let hdr = NetHdr::from_bytes(hdr);
            let frame = &arena[at + HDR_LEN..at + n];
            let to = model::frame(&frame[..frame.len().min(model::PREFIX)]).and_then(|f| {
                let d = self.reference.decide(uplink, f);
                learns.extend(d.learn);
                match d.verdict {
                    Verdict::Forward(to) => Some(to),
                    Verdict::Drop(_) => None,
                }
            });
            let Some(to) = to else {
                self.host.dropped += 1;
                self.out.not_forwarded += 1;
                continue;
            };
            self.host.packets += 1;
            self.host.bytes += frame.len() as u64;
            for p in to.iter() {
                assert_ne!(p.index(), 0, "{what}: back out of the uplink");
                // The uplink's prefix is the frame whole: its flow hash reads past the
                // first bytes a guest's frame is hashed over (an IPv6 frame's ports
                // behind two tags, say).
                self.deliver(p.index() - 1, (&hdr, frame), frame, seeded, &what);
            }
        }
        for l in learns.drain(..) {
            self.reference.learn(l);
        }
        self.begin_batch();
        self.check();
    }

    /// Guest `g`'s driver asks for `n` queue pairs: acked OK, and used from the next batch,
    /// only for 1 up to the pairs it has.
    fn set_pairs(&mut self, g: usize, n: u16) {
        let guest = &mut self.guests[g];
        let ok = guest.set_pairs(n);
        let want = (1..=guest.rx.len() as u16).contains(&n);
        assert_eq!(ok, want, "{:?}: VQ_PAIRS_SET {n}", guest.id);
        if ok {
            guest.active = n;
        } else {
            self.out.pairs_refused += 1;
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

    /// What guest `d`'s sink should make of `frame`, sent behind `hdr`, whose bytes the
    /// switch read first (its flow hashed over them) are `prefix`.
    fn deliver(
        &mut self,
        d: usize,
        (hdr, prefix): (&NetHdr, &[u8]),
        frame: &[u8],
        seeded: bool,
        what: &str,
    ) {
        let dest = &mut self.guests[d];
        let pairs = dest.rx.len() as u32;
        let active = (dest.active as u32).clamp(1, pairs);
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
                g.by_pair[p] += n;
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
            assert_eq!(
                g.shared.active_pairs(),
                g.active,
                "{:?}: active pairs",
                g.id
            );
        }
        let c = self.uplink_counters.into.snapshot();
        let got = HostCounts {
            packets: c.packets,
            bytes: c.bytes,
            dropped: c.dropped,
        };
        assert_eq!(
            got, self.host,
            "the uplink's counters of frames from the host"
        );
        let c = self.uplink_counters.out.snapshot();
        assert_eq!((c.packets, c.dropped), (0, 0), "nothing written to a TAP");
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
            Step::Uplink { frames } => {
                if h.uplink {
                    h.host_send(frames);
                }
            }
            Step::Pairs { port, pairs } => {
                let g = *port as usize % h.guests.len();
                h.set_pairs(g, (*pairs % 4).into());
            }
        }
    }
    h.out.host_forwarded = h.host.packets;
    h.out.host_dropped = h.host.dropped;
    for g in &h.guests {
        h.out.received.push(g.received);
        h.out.by_pair.push(g.by_pair.to_vec());
        for q in &g.rx {
            h.out.rx_missed += q.counts.rx_missed;
            h.out.rx_dropped += q.counts.dropped;
            h.out.filtered += q.counts.filtered;
        }
    }
    h.out
}
