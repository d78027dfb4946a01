//! The `driver_queue` target: a `DriverQueue` facing a hostile device.
//!
//! The device writes arbitrary used elements, `used.idx`, `used.flags` and `avail_event`, or
//! raw bytes anywhere; it may also complete chains honestly ([`DriverOp::Complete`]), which
//! lets the fuzzer reach deep queue states. Ops have one variant per public `DriverQueue`
//! call. After every step the harness checks:
//!
//! - nothing panics;
//! - `num_free()` never exceeds the size and equals the size less the descriptors held by the
//!   chains in flight; `in_flight()` counts them;
//! - a token comes back at most once, only if it was added, with a length no larger than the
//!   chain's writable bytes; `detach_unused` returns exactly the tokens still in flight;
//! - once a call returns a protocol error, `broken()` holds it and every later fallible call
//!   returns `Broken` with it as the reason, until `detach_unused` resets the queue; `QueueFull`
//!   and `EmptyChain` do not break it and come exactly when they should;
//! - each chain `add` writes reads back (spec-level walk) as the buffers given, on descriptors no
//!   other chain in flight holds, indirect exactly when it should be;
//! - while the device has only behaved, nothing fails, tokens come back in completion order,
//!   and `used_pending` / `enable_cb` / `enable_cb_delayed` / `enable_cb_after` report what is
//!   pending, and the delayed ones ask (with EVENT_IDX) for a used entry the chains in flight
//!   reach;
//! - `kick_prepare` answers as the flags or `avail_event` say.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arbitrary::Arbitrary;
use vring::{
    vring_need_event, Buf, DriverQueue, Error, ErrorKind, Features, GuestAddress, GuestMemory,
    IndirectArea, QueueConfig, RingAddresses,
};

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::mem::{self, overlap, peek16, poke16, Placement, DATA, DRV_INDIRECT};
use crate::rings::{write_used_elem, Scribble, UsedRing};
use crate::walk::{self, read_desc, Rules, INDIRECT, NEXT};

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverSetup {
    /// Queue size `1 << (size_log2 % 9)`; bit 7 turns on FIFO descriptor reuse
    /// (`DriverQueue::set_fifo_reuse`).
    pub size_log2: u8,
    pub event_idx: bool,
    pub indirect: bool,
    /// An `IndirectArea` with `max_chain = n % 17` (below 2 the queue uses none).
    pub indirect_area: Option<u8>,
    pub placement: Placement,
}
encode_struct!(DriverSetup {
    size_log2,
    event_idx,
    indirect,
    indirect_area,
    placement
});

/// A buffer in the data area: `DATA + offset`, `len` bytes.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufSpec {
    pub offset: u16,
    pub len: u16,
}
encode_struct!(BufSpec { offset, len });

impl BufSpec {
    fn buf(self) -> Buf {
        Buf::new(GuestAddress(DATA + self.offset as u64), self.len as u32)
    }
}

#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum DriverOp {
    Add {
        out: Vec<BufSpec>,
        in_: Vec<BufSpec>,
    },
    KickPrepare,
    GetUsed,
    UsedPending,
    EnableCb,
    EnableCbDelayed,
    DisableCb,
    DetachUnused,
    SetPublishOnKick(bool),

    // ---- The device.
    /// Completes the `pick % n`th of the `n` published chains not yet completed, writing
    /// `len % (writable + 1)` bytes: what a correct device does.
    Complete {
        pick: u8,
        len: u32,
    },
    /// Moves `avail_event` (a correct device does that too).
    SetAvailEvent(u16),
    /// Sets `used.flags` (NO_NOTIFY is bit 0; a correct device does that too).
    SetUsedFlags(u16),
    /// A used element with any id and length, anywhere in the ring.
    WriteUsedElem {
        slot: u16,
        id: u32,
        len: u32,
    },
    SetUsedIdx(u16),
    /// Raw bytes anywhere in region 0.
    Scribble(Scribble),

    // ---- The driver again (last, so that earlier variants keep their encoding's order).
    /// `enable_cb_after(bufs)`: a delay of the caller's choosing, any `u16`.
    EnableCbAfter(u16),
}

impl Encode for DriverOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 16;
        match self {
            DriverOp::Add { out: o, in_ } => {
                variant(0, N, out);
                o.encode(out);
                in_.encode(out);
            }
            DriverOp::KickPrepare => variant(1, N, out),
            DriverOp::GetUsed => variant(2, N, out),
            DriverOp::UsedPending => variant(3, N, out),
            DriverOp::EnableCb => variant(4, N, out),
            DriverOp::EnableCbDelayed => variant(5, N, out),
            DriverOp::DisableCb => variant(6, N, out),
            DriverOp::DetachUnused => variant(7, N, out),
            DriverOp::SetPublishOnKick(b) => (variant(8, N, out), b.encode(out)).1,
            DriverOp::Complete { pick, len } => {
                variant(9, N, out);
                pick.encode(out);
                len.encode(out);
            }
            DriverOp::SetAvailEvent(v) => (variant(10, N, out), v.encode(out)).1,
            DriverOp::SetUsedFlags(v) => (variant(11, N, out), v.encode(out)).1,
            DriverOp::WriteUsedElem { slot, id, len } => {
                variant(12, N, out);
                slot.encode(out);
                id.encode(out);
                len.encode(out);
            }
            DriverOp::SetUsedIdx(v) => (variant(13, N, out), v.encode(out)).1,
            DriverOp::Scribble(s) => (variant(14, N, out), s.encode(out)).1,
            DriverOp::EnableCbAfter(b) => (variant(15, N, out), b.encode(out)).1,
        }
    }
}

/// A whole `driver_queue` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct DriverInput {
    pub setup: DriverSetup,
    /// What the used ring holds before the driver starts (the driver does not clear it).
    pub used: UsedRing,
    pub ops: Vec<DriverOp>,
}
encode_struct!(DriverInput { setup, used, ops });

/// What a run did, for the seed tests to check that each seed means what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The error that broke the queue (since the last reset), if one did.
    pub broken: Option<Error>,
    pub added: u64,
    pub reclaimed: u64,
    /// The device only did what a correct device does.
    pub honest: bool,
}

/// The `driver_queue` fuzz target's body. `None` when the queue did not activate.
pub fn run(input: &DriverInput) -> Option<Outcome> {
    let s = input.setup;
    let size = mem::queue_size(s.size_log2);
    let rings = s.placement.rings(size);
    let mem = mem::memory();
    input.used.write(&mem, rings.used.0, size);
    let mut features = Features::EMPTY;
    if s.event_idx {
        features = features.union(Features::RING_EVENT_IDX);
    }
    if s.indirect {
        features = features.union(Features::RING_INDIRECT_DESC);
    }
    let config =
        QueueConfig::new(size as u32, rings, features).expect("sizes from queue_size are valid");
    let area = s.indirect_area.map(|n| IndirectArea {
        addr: GuestAddress(DRV_INDIRECT),
        max_chain: n as u16 % 17,
    });
    let mut queue = match DriverQueue::<u32>::activate(&config, mem.clone(), area) {
        Ok(q) => q,
        Err(e) => {
            assert!(
                matches!(e, Error::RingOutOfMemory { .. }),
                "activation failed: {e}"
            );
            return None;
        }
    };
    queue.set_fifo_reuse(s.size_log2 & 0x80 != 0);
    let max_chain = area
        .filter(|a| s.indirect && a.max_chain >= 2)
        .map(|a| a.max_chain);
    let mut parts = vec![
        (rings.desc.0, 16 * size as u64),
        (rings.avail.0, 6 + 2 * size as u64),
        (rings.used.0, 6 + 8 * size as u64),
    ];
    if let Some(m) = max_chain {
        parts.push((DRV_INDIRECT, IndirectArea::bytes_needed(size, m)));
    }
    let apart = parts
        .iter()
        .enumerate()
        .all(|(i, a)| parts[i + 1..].iter().all(|b| !overlap(*a, *b)));
    let mut h = Harness {
        mem,
        rings,
        size,
        event_idx: s.event_idx,
        max_chain,
        apart,
        queue,
        broken: None,
        next_token: 0,
        in_flight: BTreeMap::new(),
        added: 0,
        reclaimed: 0,
        adds: 0,
        added_since_kick: 0,
        honest: apart && input.used.idx == 0,
        avail_heads: Vec::new(),
        completions: VecDeque::new(),
        used_shadow: 0,
    };
    for op in &input.ops {
        h.step(op);
        h.check_state();
    }
    Some(Outcome {
        broken: h.broken,
        added: h.added,
        reclaimed: h.reclaimed,
        honest: h.honest,
    })
}

struct Flight {
    writable: u64,
    ndescs: u16,
    /// The descriptor-table entries the chain holds, when the layout lets us read them back.
    descs: Vec<u16>,
}

struct Harness {
    mem: Arc<GuestMemory>,
    rings: RingAddresses,
    size: u16,
    event_idx: bool,
    /// The indirect table size when indirect chains are in use.
    max_chain: Option<u16>,
    /// No two ring parts (nor the indirect area) overlap, so what the driver wrote stays put.
    apart: bool,
    queue: DriverQueue<u32>,
    broken: Option<Error>,
    next_token: u32,
    in_flight: BTreeMap<u32, Flight>,
    added: u64,
    reclaimed: u64,
    /// Chains added since the reset: the driver's avail index.
    adds: u16,
    added_since_kick: u32,
    /// The device has only done what a correct device does.
    honest: bool,
    /// Chains put on the avail ring and not completed by `Complete`: (head, token).
    avail_heads: Vec<(u16, u32)>,
    /// Honest completions not yet reclaimed, in used-ring order: (token, len).
    completions: VecDeque<(u32, u32)>,
    /// The used index the honest device writes next.
    used_shadow: u16,
}

impl Harness {
    fn mask(&self) -> u16 {
        self.size - 1
    }

    fn check<T>(&mut self, r: Result<T, Error>) -> Option<T> {
        match r {
            Ok(v) => {
                assert!(self.broken.is_none(), "a call succeeded on a broken queue");
                Some(v)
            }
            Err(Error::Broken { reason }) => {
                let first = self.broken.as_ref().expect("Broken before any error");
                assert_eq!(&*reason, first, "Broken names another reason");
                None
            }
            Err(e) if e.kind() == ErrorKind::Usage => {
                assert!(self.broken.is_none(), "{e} on a broken queue");
                assert!(self.queue.broken().is_none(), "{e} broke the queue");
                None
            }
            Err(e) => {
                assert!(!self.honest, "an honest device broke the queue: {e}");
                assert!(self.broken.is_none(), "{e} after the queue broke");
                assert_eq!(e.kind(), ErrorKind::Peer, "{e} is not the peer's fault");
                assert_eq!(
                    self.queue.broken(),
                    Some(&e),
                    "error did not break the queue"
                );
                self.broken = Some(e);
                None
            }
        }
    }

    fn check_state(&self) {
        assert_eq!(self.queue.broken(), self.broken.as_ref());
        let held: u32 = self.in_flight.values().map(|f| f.ndescs as u32).sum();
        assert!(
            self.queue.num_free() <= self.size,
            "num_free above the size"
        );
        assert_eq!(self.queue.num_free() as u32, self.size as u32 - held);
        assert_eq!(self.queue.in_flight() as usize, self.in_flight.len());
    }

    fn step(&mut self, op: &DriverOp) {
        let used = self.rings.used.0;
        match op {
            DriverOp::Add { out, in_ } => self.add(out, in_),
            DriverOp::KickPrepare => {
                let added = std::mem::take(&mut self.added_since_kick);
                let avail_event = peek16(&self.mem, used + 4 + 8 * self.size as u64);
                let flags = peek16(&self.mem, used);
                let kick = self.queue.kick_prepare();
                if self.apart {
                    let new = self.adds;
                    let old = new.wrapping_sub((added % 65535) as u16);
                    let want = if added == 0 {
                        false
                    } else if added >= 65535 {
                        true
                    } else if self.event_idx {
                        vring_need_event(avail_event, new, old)
                    } else {
                        flags & 1 == 0
                    };
                    assert_eq!(kick, want, "kick_prepare after {added} adds");
                }
            }
            DriverOp::GetUsed => {
                let r = self.queue.get_used();
                match self.check(r) {
                    Some(Some((token, len))) => {
                        let f = self
                            .in_flight
                            .remove(&token)
                            .unwrap_or_else(|| panic!("token {token} not in flight"));
                        assert!(len as u64 <= f.writable, "used len above the writable part");
                        self.reclaimed += 1;
                        self.avail_heads.retain(|&(_, t)| t != token);
                        if self.honest {
                            assert_eq!(self.completions.pop_front(), Some((token, len)));
                        }
                    }
                    Some(None) if self.honest => {
                        assert!(self.completions.is_empty(), "a completion was missed");
                    }
                    Some(None) | None => {}
                }
            }
            DriverOp::UsedPending => {
                let pending = self.queue.used_pending();
                if self.honest {
                    assert_eq!(pending, !self.completions.is_empty());
                }
            }
            DriverOp::EnableCb => {
                let pending = self.queue.enable_cb();
                if self.honest {
                    assert_eq!(pending, !self.completions.is_empty());
                }
            }
            DriverOp::EnableCbDelayed => {
                let bufs = self.in_flight.len() * 3 / 4;
                let pending = self.queue.enable_cb_delayed();
                if self.honest {
                    assert_eq!(pending, self.completions.len() > bufs);
                }
                self.check_used_event(bufs);
            }
            DriverOp::EnableCbAfter(bufs) => {
                let pending = self.queue.enable_cb_after(*bufs);
                // Kept below what is in flight, so that the last chain in flight notifies.
                let bufs = (*bufs as usize).min(self.in_flight.len().saturating_sub(1));
                if self.honest {
                    assert_eq!(pending, self.completions.len() > bufs);
                }
                self.check_used_event(bufs);
            }
            DriverOp::DisableCb => self.queue.disable_cb(),
            DriverOp::DetachUnused => {
                let mut got = self.queue.detach_unused();
                got.sort_unstable();
                let want: Vec<u32> = self.in_flight.keys().copied().collect();
                assert_eq!(got, want, "detach_unused returned other tokens");
                assert_eq!(self.queue.num_free(), self.size);
                assert!(self.queue.broken().is_none(), "reset left the queue broken");
                self.in_flight.clear();
                self.broken = None;
                self.adds = 0;
                self.added_since_kick = 0;
                self.avail_heads.clear();
                self.completions.clear();
                self.used_shadow = 0;
            }
            DriverOp::SetPublishOnKick(on) => self.queue.set_publish_on_kick(*on),
            DriverOp::Complete { pick, len } => self.complete(*pick, *len),
            DriverOp::SetAvailEvent(v) => poke16(&self.mem, used + 4 + 8 * self.size as u64, *v),
            DriverOp::SetUsedFlags(v) => poke16(&self.mem, used, *v),
            DriverOp::WriteUsedElem { slot, id, len } => {
                self.honest = false;
                write_used_elem(&self.mem, used, slot & self.mask(), *id, *len);
            }
            DriverOp::SetUsedIdx(v) => {
                self.honest = false;
                poke16(&self.mem, used + 2, *v);
            }
            DriverOp::Scribble(s) => {
                self.honest = false;
                s.write(&self.mem);
            }
        }
    }

    fn add(&mut self, out: &[BufSpec], in_: &[BufSpec]) {
        let outb: Vec<Buf> = out.iter().map(|b| b.buf()).collect();
        let inb: Vec<Buf> = in_.iter().map(|b| b.buf()).collect();
        let total = outb.len() + inb.len();
        let indirect = self.queue.uses_indirect(total);
        // Spec 2.7.5.3.1: no chain, indirect or not, longer than the queue size.
        let want_indirect = self
            .max_chain
            .is_some_and(|m| total > 1 && total <= m as usize && total <= self.size as usize);
        assert_eq!(indirect, want_indirect, "uses_indirect({total})");
        let needed = if indirect { 1 } else { total };
        let free = self.queue.num_free();
        let token = self.next_token;
        self.next_token += 1;
        let slot = self.adds & self.mask();
        let r = self.queue.add(&outb, &inb, token);
        match &r {
            Err(Error::EmptyChain) => assert_eq!(total, 0),
            Err(Error::QueueFull { needed: n, free: f }) => {
                assert_eq!((*n, *f), (needed, free));
                assert!(needed > free as usize, "QueueFull with room");
            }
            Ok(()) => {
                assert!(
                    total > 0 && needed <= free as usize,
                    "add should have failed"
                );
            }
            Err(_) => {}
        }
        if self.check(r).is_none() {
            return;
        }
        let head = peek16(&self.mem, self.rings.avail.0 + 4 + 2 * slot as u64);
        let writable = inb.iter().map(|b| b.len as u64).sum();
        let descs = if self.apart {
            self.read_back(head, indirect, &outb, &inb)
        } else {
            Vec::new()
        };
        self.in_flight.insert(
            token,
            Flight {
                writable,
                ndescs: needed as u16,
                descs,
            },
        );
        self.adds = self.adds.wrapping_add(1);
        self.added_since_kick += 1;
        self.added += 1;
        self.avail_heads.push((head, token));
    }

    /// Reads back the chain just added at `head`; returns the table entries it holds.
    fn read_back(&self, head: u16, indirect: bool, out: &[Buf], in_: &[Buf]) -> Vec<u16> {
        assert!(head < self.size, "avail names head {head}");
        let desc = self.rings.desc.0;
        let rules = Rules {
            indirect_ok: true,
            check_memory: false,
        };
        let segs = walk::walk(&self.mem, desc, self.size, head, rules)
            .unwrap_or_else(|why| panic!("the driver wrote a bad chain: {why:?}"));
        let got: Vec<_> = segs.iter().map(|s| (s.addr, s.len, s.write)).collect();
        let want: Vec<_> = out
            .iter()
            .map(|b| (b.addr.0, b.len, false))
            .chain(in_.iter().map(|b| (b.addr.0, b.len, true)))
            .collect();
        assert_eq!(got, want, "the chain reads back differently");
        let first = read_desc(&self.mem, desc + 16 * head as u64).expect("table in memory");
        assert_eq!(
            first.flags & INDIRECT != 0,
            indirect,
            "indirect flag on the head"
        );
        // The table entries this chain holds: none may belong to another chain in flight.
        let mut descs = vec![head];
        let mut d = first;
        while d.flags & NEXT != 0 {
            descs.push(d.next);
            d = read_desc(&self.mem, desc + 16 * d.next as u64).expect("table in memory");
        }
        for (token, f) in &self.in_flight {
            for i in &descs {
                assert!(
                    !f.descs.contains(i),
                    "descriptor {i} also held by token {token}"
                );
            }
        }
        descs
    }

    /// After a delayed `enable_cb*` with the delay `bufs` (the caller keeps it below what is in
    /// flight), on an honest device with EVENT_IDX: `used_event` names the used entry after the
    /// next `bufs`, one the chains in flight reach (a later one would never come, and a driver
    /// waiting for it would wait for good).
    fn check_used_event(&self, bufs: usize) {
        if !(self.honest && self.event_idx && self.apart) || self.broken.is_some() {
            return;
        }
        let last_used = self.used_shadow.wrapping_sub(self.completions.len() as u16);
        let used_event = peek16(&self.mem, self.rings.avail.0 + 4 + 2 * self.size as u64);
        assert_eq!(
            used_event,
            last_used.wrapping_add(bufs as u16),
            "used_event"
        );
    }

    fn complete(&mut self, pick: u8, len: u32) {
        let used = self.rings.used.0;
        // Only chains whose avail entry is published (publish_on_kick delays it).
        let published = peek16(&self.mem, self.rings.avail.0 + 2);
        let unpublished = self.adds.wrapping_sub(published) as usize;
        let eligible = self.avail_heads.len().saturating_sub(unpublished);
        if eligible == 0 {
            return;
        }
        let (head, token) = self.avail_heads.remove(pick as usize % eligible);
        let writable = self.in_flight[&token].writable;
        let len = (len as u64 % (writable + 1)) as u32;
        write_used_elem(
            &self.mem,
            used,
            self.used_shadow & self.mask(),
            head as u32,
            len,
        );
        self.used_shadow = self.used_shadow.wrapping_add(1);
        poke16(&self.mem, used + 2, self.used_shadow);
        self.completions.push_back((token, len));
    }
}
