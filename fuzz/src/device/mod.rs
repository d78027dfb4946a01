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
//!   small model of the batching predicts; the stats agree with the calls that succeeded;
//! - with IN_ORDER, chains completed by `add_used_read` get one used element per run of
//!   them: the run's last head, length 0, at the run's first slot, written when the run ends
//!   (at the next element written or where the batch is published) and not before, the other
//!   slots of the run left as they were; `used.idx` still counts every chain. So a guest that
//!   reads the element and reclaims chains in avail order up to it gets the whole run back.
//!   Without IN_ORDER, `add_used_read` is `add_used` with length 0;
//! - the device writes nothing but what the model says: a shadow of region 0 follows the
//!   driver's writes and the model's used elements, `used.idx` and `used.flags` (and
//!   `avail_event`, whose value is the device's own); the used ring must equal it after every
//!   step, and all of memory at the end of the run (region 1, which nobody writes, stays zero).
//!
//! The input types are in `input.rs`; the shadow of guest memory, and its comparisons with
//! real memory, in `shadow.rs`. This file is the harness: the run, the model of the used ring
//! and the checks after each step.

mod input;
mod shadow;

pub use input::{DeviceInput, DeviceOp, DeviceSetup, UsedHead};

use std::sync::Arc;

use vring::{Chain, DeviceQueue, Error, ErrorKind, GuestMemory, QueueConfig, RingAddresses};

use crate::mem::{self, peek16, peek32, poke16, DEV_INDIRECT, DEV_INDIRECT_LEN, REGION0};
use crate::walk::{self, Rules};
use shadow::Shadow;

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
    let mut shadow = Shadow::take();
    let mem = shadow.mem.clone();
    // Fill memory as the driver left it. Overlapping placements overwrite in this order.
    for (i, d) in input.descs.iter().take(size as usize).enumerate() {
        d.write(&mem, rings.desc.0 + 16 * i as u64);
    }
    input.avail.write(&mem, rings.avail.0, size);
    input.used.write(&mem, rings.used.0, size);
    for (i, d) in input.indirect.iter().take(256).enumerate() {
        d.write(&mem, DEV_INDIRECT + 16 * i as u64);
    }
    for (at, len) in [
        (rings.desc.0, 16 * size as usize),
        (rings.avail.0, 6 + 2 * size as usize),
        (rings.used.0, 6 + 8 * size as usize),
        (DEV_INDIRECT, DEV_INDIRECT_LEN as usize),
    ] {
        shadow.driver_wrote(at, len);
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
            shadow.give_back();
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
        event_idx: input.setup.event_idx,
        in_order: input.setup.in_order,
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
        read_run: None,
        no_notify: false,
        shadow,
    };
    for op in &input.ops {
        h.step(op);
        h.check_state();
        h.check_used_ring();
    }
    h.shadow.check_all();
    let Harness {
        shadow,
        broken,
        popped,
        used,
        ..
    } = h;
    shadow.give_back();
    Some(Outcome {
        broken,
        popped,
        used,
    })
}
struct Harness {
    mem: Arc<GuestMemory>,
    rings: RingAddresses,
    size: u16,
    indirect_ok: bool,
    event_idx: bool,
    in_order: bool,
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
    /// IN_ORDER: the run of read chains whose element is not written yet: its first used
    /// index and its last head.
    read_run: Option<(u16, u16)>,
    /// Whether the device's `used.flags` has NO_NOTIFY (it writes them from its own copy).
    no_notify: bool,
    /// Region 0 as it should be.
    shadow: Shadow,
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

    /// The model's side of a flush: the open run's element, then a store of `used.idx` if
    /// anything is unpublished.
    fn model_flush(&mut self) {
        self.model_end_read_run();
        if self.published_used != self.next_used {
            self.published_used = self.next_used;
            self.used_idx_stores += 1;
            assert_eq!(
                peek16(&self.mem, self.rings.used.0 + 2),
                self.next_used,
                "used.idx not published"
            );
            self.shadow
                .expect(self.rings.used.0 + 2, &self.next_used.to_le_bytes());
        }
    }

    /// IN_ORDER: the open run of read chains ends; its element (the run's last head, length
    /// 0, at its first slot) must be written now.
    fn model_end_read_run(&mut self) {
        if let Some((start, head)) = self.read_run.take() {
            self.model_used_elem(start, head, 0, "a run's element");
        }
    }

    /// The device wrote used element `index` (a used index, masked here): checks and records it.
    fn model_used_elem(&mut self, index: u16, head: u16, len: u32, what: &str) {
        let at = self.rings.used.0 + 4 + 8 * (index & self.mask()) as u64;
        assert_eq!(
            peek32(&self.mem, at),
            head as u32,
            "{what}: used element id"
        );
        assert_eq!(peek32(&self.mem, at + 4), len, "{what}: used element len");
        let mut elem = [0; 8];
        elem[..4].copy_from_slice(&(head as u32).to_le_bytes());
        elem[4..].copy_from_slice(&len.to_le_bytes());
        self.shadow.expect(at, &elem);
    }

    /// A completed chain, as `add_used` (`read`: `add_used_read`) takes it.
    fn add_used(&mut self, head: UsedHead, len: u32, read: bool) {
        let head = match head {
            UsedHead::Popped(n) if !self.outstanding.is_empty() => {
                let i = n as usize % self.outstanding.len();
                self.outstanding.remove(i)
            }
            UsedHead::Popped(_) => 0,
            UsedHead::Raw(h) => h,
        };
        let r = if read {
            self.queue.add_used_read(head)
        } else {
            self.queue.add_used(head, len)
        };
        if self.check(r).is_none() {
            return;
        }
        if read && self.in_order {
            // Nothing written yet: the run's element waits for the run's end.
            let start = self.read_run.map_or(self.next_used, |(start, _)| start);
            self.read_run = Some((start, head));
        } else {
            self.model_end_read_run();
            self.model_used_elem(self.next_used, head, len, "add_used");
        }
        self.next_used = self.next_used.wrapping_add(1);
        self.used += 1;
        self.undoable = 0;
        if self.next_used.wrapping_sub(self.published_used) >= self.batch {
            self.model_flush();
        }
    }

    /// The used ring (flags, index, elements, avail_event) holds what the model says.
    fn check_used_ring(&mut self) {
        let len = 6 + 8 * self.size as usize;
        self.shadow.check(self.rings.used.0, len, "used ring");
    }

    fn step(&mut self, op: &DeviceOp) {
        let avail = self.rings.avail.0;
        match op {
            DeviceOp::Pop => self.pop(false),
            DeviceOp::PopInto => self.pop(true),
            DeviceOp::AddUsed { head, len } => self.add_used(*head, *len, false),
            DeviceOp::AddUsedRead(head) => self.add_used(*head, 0, true),
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
                    let used = self.rings.used.0;
                    if self.event_idx {
                        // The device's own avail index: nothing to predict it from.
                        self.shadow.driver_wrote(used + 4 + 8 * self.size as u64, 2);
                    } else if self.no_notify {
                        self.no_notify = false;
                        self.shadow.expect(used, &0u16.to_le_bytes());
                    }
                }
                self.check(r);
            }
            DeviceOp::DisableNotification => {
                self.queue.disable_notification();
                if !self.event_idx && !self.no_notify {
                    self.no_notify = true;
                    self.shadow.expect(self.rings.used.0, &1u16.to_le_bytes());
                }
            }
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
            DeviceOp::Scribble(s) => {
                s.write(&self.mem);
                self.shadow
                    .driver_wrote(s.offset as u64 % REGION0.1, s.bytes.len());
            }
            DeviceOp::WriteDesc { index, desc } => {
                let at = self.rings.desc.0 + 16 * (index & self.mask()) as u64;
                desc.write(&self.mem, at);
                self.shadow.driver_wrote(at, 16);
            }
            DeviceOp::WriteIndirect { slot, desc } => {
                const { assert!(16 * 256 <= DEV_INDIRECT_LEN) };
                let at = DEV_INDIRECT + 16 * *slot as u64;
                desc.write(&self.mem, at);
                self.shadow.driver_wrote(at, 16);
            }
            DeviceOp::Publish(heads) => {
                let mut idx = peek16(&self.mem, avail + 2);
                for &head in heads {
                    let at = avail + 4 + 2 * (idx & self.mask()) as u64;
                    poke16(&self.mem, at, head);
                    self.shadow.driver_wrote(at, 2);
                    idx = idx.wrapping_add(1);
                }
                self.driver_poke16(avail + 2, idx);
            }
            DeviceOp::SetAvailIdx(v) => self.driver_poke16(avail + 2, *v),
            DeviceOp::SetAvailFlags(v) => self.driver_poke16(avail, *v),
            DeviceOp::SetUsedEvent(v) => self.driver_poke16(avail + 4 + 2 * self.size as u64, *v),
        }
    }

    fn driver_poke16(&mut self, addr: u64, v: u16) {
        poke16(&self.mem, addr, v);
        self.shadow.driver_wrote(addr, 2);
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
