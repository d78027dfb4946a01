//! The `device_queue` target: a `DeviceQueue` facing a hostile driver.
//!
//! The input fills the descriptor table, the avail and used rings and an indirect-table area
//! with raw contents, then runs a list of [`DeviceOp`]s: one variant per public `DeviceQueue`
//! call, interleaved with the driver rewriting ring bytes. After every step the harness checks:
//!
//! - nothing panics;
//! - once a call returns an error other than `Broken`, `broken()` holds that error and every
//!   later fallible call returns `Broken` with it as the reason; no call fails before that;
//! - every popped chain is the one the avail ring names, equal to what the spec-level walk in
//!   [`crate::walk`] finds (segments, readable before writable, each inside memory by both
//!   `GuestMemory::contains` and the harness's own layout), and every refused chain is refused
//!   by that walk too, for the same reason;
//! - used elements land where they should, and `used.idx` is published once per batch, as a
//!   small model of the batching predicts; the stats agree with the calls that succeeded.

use std::sync::Arc;

use arbitrary::Arbitrary;
use vring::{
    Chain, DeviceQueue, Error, ErrorKind, Features, GuestMemory, QueueConfig, RingAddresses,
};

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::mem::{self, peek16, peek32, poke, poke16, Placement, DEV_INDIRECT, DEV_INDIRECT_LEN};
use crate::rings::{AvailRing, RawDesc, Scribble, UsedRing};
use crate::walk::{self, Rules};

/// The queue as the driver configured it.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSetup {
    /// Queue size `1 << (size_log2 % 9)`.
    pub size_log2: u8,
    pub event_idx: bool,
    pub indirect: bool,
    pub notify_on_empty: bool,
    pub placement: Placement,
    /// Where the device starts popping (vhost-user's SET_VRING_BASE).
    pub next_avail: u16,
}
encode_struct!(DeviceSetup {
    size_log2,
    event_idx,
    indirect,
    notify_on_empty,
    placement,
    next_avail
});

impl DeviceSetup {
    pub fn features(&self) -> Features {
        let mut f = Features::EMPTY;
        for (on, bit) in [
            (self.event_idx, Features::RING_EVENT_IDX),
            (self.indirect, Features::RING_INDIRECT_DESC),
            (self.notify_on_empty, Features::NOTIFY_ON_EMPTY),
        ] {
            if on {
                f = f.union(bit);
            }
        }
        f
    }
}

/// Which head `add_used` hands back.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsedHead {
    /// The `n % len`th chain popped and not yet used (head 0 if there is none).
    Popped(u8),
    /// Any number: the device's own business, never checked by the queue.
    Raw(u16),
}

impl Encode for UsedHead {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            UsedHead::Popped(n) => (variant(0, 2, out), n.encode(out)),
            UsedHead::Raw(h) => (variant(1, 2, out), h.encode(out)),
        };
    }
}

/// One step: a `DeviceQueue` call, or the hostile driver writing memory.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    Pop,
    /// `pop_into` a `Chain` reused across the whole run.
    PopInto,
    AddUsed {
        head: UsedHead,
        len: u32,
    },
    Flush,
    NeedsNotification,
    EnableNotification,
    DisableNotification,
    AvailPending,
    SetUsedBatch(u16),
    /// `undo_pop(n % (k + 1))`, `k` being the chains popped since the last `add_used` or
    /// undo: the call's contract is to hand back chains popped and not used.
    UndoPop(u16),

    // ---- The hostile driver.
    /// Raw bytes anywhere in region 0: rings, tables, indices, data.
    Scribble(Scribble),
    /// Descriptor `index % size` of the table.
    WriteDesc {
        index: u16,
        desc: RawDesc,
    },
    /// Entry `slot` of the indirect area.
    WriteIndirect {
        slot: u8,
        desc: RawDesc,
    },
    /// Puts `heads` on the avail ring from the current `avail.idx` and moves it past them, as a
    /// driver does.
    Publish(Vec<u16>),
    SetAvailIdx(u16),
    SetAvailFlags(u16),
    SetUsedEvent(u16),
}

impl Encode for DeviceOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 17;
        match self {
            DeviceOp::Pop => variant(0, N, out),
            DeviceOp::PopInto => variant(1, N, out),
            DeviceOp::AddUsed { head, len } => {
                variant(2, N, out);
                head.encode(out);
                len.encode(out);
            }
            DeviceOp::Flush => variant(3, N, out),
            DeviceOp::NeedsNotification => variant(4, N, out),
            DeviceOp::EnableNotification => variant(5, N, out),
            DeviceOp::DisableNotification => variant(6, N, out),
            DeviceOp::AvailPending => variant(7, N, out),
            DeviceOp::SetUsedBatch(b) => (variant(8, N, out), b.encode(out)).1,
            DeviceOp::UndoPop(n) => (variant(9, N, out), n.encode(out)).1,
            DeviceOp::Scribble(s) => (variant(10, N, out), s.encode(out)).1,
            DeviceOp::WriteDesc { index, desc } => {
                variant(11, N, out);
                index.encode(out);
                desc.encode(out);
            }
            DeviceOp::WriteIndirect { slot, desc } => {
                variant(12, N, out);
                slot.encode(out);
                desc.encode(out);
            }
            DeviceOp::Publish(heads) => (variant(13, N, out), heads.encode(out)).1,
            DeviceOp::SetAvailIdx(v) => (variant(14, N, out), v.encode(out)).1,
            DeviceOp::SetAvailFlags(v) => (variant(15, N, out), v.encode(out)).1,
            DeviceOp::SetUsedEvent(v) => (variant(16, N, out), v.encode(out)).1,
        }
    }
}

/// A whole `device_queue` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct DeviceInput {
    pub setup: DeviceSetup,
    /// The descriptor table from entry 0 (entries past the size are ignored).
    pub descs: Vec<RawDesc>,
    pub avail: AvailRing,
    pub used: UsedRing,
    /// The indirect area from its start (at most 256 entries).
    pub indirect: Vec<RawDesc>,
    pub ops: Vec<DeviceOp>,
}
encode_struct!(DeviceInput {
    setup,
    descs,
    avail,
    used,
    indirect,
    ops
});

/// What a run did, for the seed tests to check that each seed means what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The error that broke the queue, if one did.
    pub broken: Option<Error>,
    pub popped: u64,
    pub used: u64,
}

/// The `device_queue` fuzz target's body. `None` when the queue did not activate.
pub fn run(input: &DeviceInput) -> Option<Outcome> {
    let size = mem::queue_size(input.setup.size_log2);
    let rings = input.setup.placement.rings(size);
    let mem = mem::memory();
    // Fill memory as the driver left it. Overlapping placements overwrite in this order.
    for (i, d) in input.descs.iter().take(size as usize).enumerate() {
        d.write(&mem, rings.desc.0 + 16 * i as u64);
    }
    input.avail.write(&mem, rings.avail.0, size);
    input.used.write(&mem, rings.used.0, size);
    for (i, d) in input.indirect.iter().take(256).enumerate() {
        d.write(&mem, DEV_INDIRECT + 16 * i as u64);
    }
    let config = QueueConfig::new(size as u32, rings, input.setup.features())
        .expect("sizes from queue_size are valid");
    let queue = match DeviceQueue::activate(
        &config,
        mem.clone(),
        vring::RingPosition::split(input.setup.next_avail),
    ) {
        Ok(q) => q,
        Err(e) => {
            // Placements wrap inside region 0 and are aligned; only the end may stick out.
            assert!(
                matches!(e, Error::RingOutOfMemory { .. }),
                "activation failed: {e}"
            );
            return None;
        }
    };
    let next_used = peek16(&mem, rings.used.0 + 2);
    let mut h = Harness {
        batch: vring::DEFAULT_USED_BATCH.min(size),
        mem,
        rings,
        size,
        indirect_ok: input.setup.indirect,
        queue,
        chain: Chain::new(),
        broken: None,
        outstanding: Vec::new(),
        undoable: 0,
        popped: 0,
        used: 0,
        next_used,
        published_used: next_used,
        used_idx_stores: 0,
    };
    for op in &input.ops {
        h.step(op);
        h.check_state();
    }
    Some(Outcome {
        broken: h.broken,
        popped: h.popped,
        used: h.used,
    })
}

struct Harness {
    mem: Arc<GuestMemory>,
    rings: RingAddresses,
    size: u16,
    indirect_ok: bool,
    queue: DeviceQueue,
    /// The chain `pop_into` reuses.
    chain: Chain,
    /// The first error any call returned.
    broken: Option<Error>,
    /// Heads popped and not yet handed to `add_used`.
    outstanding: Vec<u16>,
    /// Chains popped since the last `add_used` or `undo_pop`: what `undo_pop` may hand back.
    undoable: u16,
    popped: u64,
    used: u64,
    // A model of batched used publishing.
    next_used: u16,
    published_used: u16,
    batch: u16,
    used_idx_stores: u64,
}

impl Harness {
    fn mask(&self) -> u16 {
        self.size - 1
    }

    /// Checks a call's result against the broken-state rules; `Some` on success.
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
            Err(e) => {
                assert!(
                    self.broken.is_none(),
                    "{e} after the queue broke with {:?}",
                    self.broken
                );
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
        let stats = self.queue.stats();
        assert_eq!(stats.popped, self.popped);
        assert_eq!(stats.used, self.used);
        assert_eq!(stats.used_idx_stores, self.used_idx_stores);
    }

    /// The model's side of a flush: a store of `used.idx` if anything is unpublished.
    fn model_flush(&mut self) {
        if self.published_used != self.next_used {
            self.published_used = self.next_used;
            self.used_idx_stores += 1;
            assert_eq!(
                peek16(&self.mem, self.rings.used.0 + 2),
                self.next_used,
                "used.idx not published"
            );
        }
    }

    fn step(&mut self, op: &DeviceOp) {
        let avail = self.rings.avail.0;
        match op {
            DeviceOp::Pop => self.pop(false),
            DeviceOp::PopInto => self.pop(true),
            DeviceOp::AddUsed { head, len } => {
                let head = match *head {
                    UsedHead::Popped(n) if !self.outstanding.is_empty() => {
                        let i = n as usize % self.outstanding.len();
                        self.outstanding.remove(i)
                    }
                    UsedHead::Popped(_) => 0,
                    UsedHead::Raw(h) => h,
                };
                let r = self.queue.add_used(head, *len);
                if self.check(r).is_some() {
                    let at = self.rings.used.0 + 4 + 8 * (self.next_used & self.mask()) as u64;
                    assert_eq!(peek32(&self.mem, at), head as u32, "used element id");
                    assert_eq!(peek32(&self.mem, at + 4), *len, "used element len");
                    self.next_used = self.next_used.wrapping_add(1);
                    self.used += 1;
                    self.undoable = 0;
                    if self.next_used.wrapping_sub(self.published_used) >= self.batch {
                        self.model_flush();
                    }
                }
            }
            DeviceOp::Flush => {
                self.queue.flush();
                self.model_flush();
            }
            DeviceOp::NeedsNotification => {
                let broken = self.broken.is_some();
                let need = self.queue.needs_notification();
                if broken {
                    assert!(!need, "a broken queue asked to notify");
                } else {
                    self.model_flush();
                }
            }
            DeviceOp::EnableNotification => {
                let broken = self.broken.is_some();
                let r = self.queue.enable_notification();
                if !broken {
                    self.model_flush();
                }
                self.check(r);
            }
            DeviceOp::DisableNotification => self.queue.disable_notification(),
            DeviceOp::AvailPending => {
                let last = self.queue.position().next_avail();
                let idx = peek16(&self.mem, avail + 2);
                let r = self.queue.avail_pending();
                self.check_avail_error(&r, idx, last);
                if let Some(pending) = self.check(r) {
                    if !pending {
                        assert_eq!(idx, last, "avail_pending missed published chains");
                    }
                }
            }
            DeviceOp::SetUsedBatch(b) => {
                self.queue.set_used_batch(*b);
                self.batch = (*b).clamp(1, self.size);
            }
            DeviceOp::UndoPop(n) => {
                let n = n % (self.undoable + 1);
                let before = self.queue.position().next_avail();
                self.queue.undo_pop(n);
                assert_eq!(self.queue.position().next_avail(), before.wrapping_sub(n));
                self.undoable -= n;
                self.outstanding
                    .truncate(self.outstanding.len().saturating_sub(n as usize));
            }
            DeviceOp::Scribble(s) => s.write(&self.mem),
            DeviceOp::WriteDesc { index, desc } => {
                let i = index & self.mask();
                desc.write(&self.mem, self.rings.desc.0 + 16 * i as u64);
            }
            DeviceOp::WriteIndirect { slot, desc } => {
                const { assert!(16 * 256 <= DEV_INDIRECT_LEN) };
                desc.write(&self.mem, DEV_INDIRECT + 16 * *slot as u64);
            }
            DeviceOp::Publish(heads) => {
                let mut idx = peek16(&self.mem, avail + 2);
                for &head in heads {
                    let slot = idx & self.mask();
                    poke16(&self.mem, avail + 4 + 2 * slot as u64, head);
                    idx = idx.wrapping_add(1);
                }
                poke16(&self.mem, avail + 2, idx);
            }
            DeviceOp::SetAvailIdx(v) => poke16(&self.mem, avail + 2, *v),
            DeviceOp::SetAvailFlags(v) => poke16(&self.mem, avail, *v),
            DeviceOp::SetUsedEvent(v) => poke(
                &self.mem,
                avail + 4 + 2 * self.size as u64,
                &v.to_le_bytes(),
            ),
        }
    }

    /// An `AvailIdxOutOfRange` must report what memory held, and be right about it.
    fn check_avail_error<T>(&self, r: &Result<T, Error>, idx: u16, last: u16) {
        if let Err(Error::AvailIdxOutOfRange {
            avail_idx,
            last_avail,
            size,
        }) = r
        {
            assert_eq!((*avail_idx, *last_avail, *size), (idx, last, self.size));
            assert!(
                idx.wrapping_sub(last) > self.size,
                "avail index was in range"
            );
        }
    }

    fn pop(&mut self, into: bool) {
        let avail = self.rings.avail.0;
        let last = self.queue.position().next_avail();
        let idx = peek16(&self.mem, avail + 2);
        let head = peek16(&self.mem, avail + 4 + 2 * (last & self.mask()) as u64);
        let r = if into {
            self.queue
                .pop_into(&mut self.chain)
                .map(|got| got.then(|| self.chain.clone()))
        } else {
            self.queue.pop()
        };
        match &r {
            Ok(None) => assert_eq!(idx, last, "pop found nothing but chains were published"),
            Ok(Some(chain)) => {
                assert_eq!(chain.head(), head, "popped another head than avail names");
                self.check_chain(chain);
            }
            Err(Error::HeadOutOfRange { head: h, size }) => {
                assert_eq!((*h, *size), (head, self.size));
                assert!(head >= self.size, "head was in range");
            }
            Err(e @ (Error::Broken { .. } | Error::AvailIdxOutOfRange { .. })) => {
                self.check_avail_error(&Err::<(), _>(e.clone()), idx, last)
            }
            Err(e) => {
                let rules = Rules {
                    indirect_ok: self.indirect_ok,
                    check_memory: true,
                };
                match walk::walk(&self.mem, self.rings.desc.0, self.size, head, rules) {
                    Ok(segs) => panic!("pop refused a valid chain with {e}: {segs:?}"),
                    Err(why) => assert!(why.matches(e), "pop refused with {e}, the walk: {why:?}"),
                }
            }
        }
        let popped = matches!(r, Ok(Some(_)));
        assert_eq!(
            self.queue.position().next_avail(),
            last.wrapping_add(popped as u16),
            "next_avail moved wrongly"
        );
        if let Some(Some(chain)) = self.check(r) {
            self.popped += 1;
            self.undoable += 1;
            self.outstanding.push(chain.head());
        }
    }

    /// A popped chain against the reference walk and the memory layout.
    fn check_chain(&self, chain: &Chain) {
        let rules = Rules {
            indirect_ok: self.indirect_ok,
            check_memory: true,
        };
        let segs = match walk::walk(&self.mem, self.rings.desc.0, self.size, chain.head(), rules) {
            Ok(segs) => segs,
            Err(why) => panic!("pop accepted a chain the walk refuses ({why:?}): {chain:?}"),
        };
        let got: Vec<_> = chain.segments().iter().map(|s| (s.addr.0, s.len)).collect();
        let want: Vec<_> = segs.iter().map(|s| (s.addr, s.len)).collect();
        assert_eq!(got, want, "popped segments differ from the walk");
        let readable = chain.readable().len();
        assert_eq!(readable, segs.iter().filter(|s| !s.write).count());
        assert!(
            segs[..readable].iter().all(|s| !s.write),
            "writable in readable()"
        );
        assert!(
            segs[readable..].iter().all(|s| s.write),
            "readable in writable()"
        );
        for s in chain.segments() {
            assert!(
                self.mem.contains(s.addr, s.len as u64),
                "segment outside memory"
            );
            assert!(
                mem::inside(s.addr.0, s.len as u64),
                "segment outside the layout"
            );
        }
        let sum = |w: bool| -> u64 {
            segs.iter()
                .filter(|s| s.write == w)
                .map(|s| s.len as u64)
                .sum()
        };
        assert_eq!(chain.readable_len(), sum(false));
        assert_eq!(chain.writable_len(), sum(true));
    }
}
