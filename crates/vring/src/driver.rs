//! The driver side of a split virtqueue: expose buffers, decide when to kick, reclaim used
//! buffers (spec 2.7.13; Linux drivers/virtio/virtio_ring.c).
//!
//! The driver owns its free list and per-chain bookkeeping privately: nothing read back from
//! shared memory (which the device may scribble on) is trusted to index its tables unchecked.
//!
//! With VIRTIO_F_IN_ORDER (spec 2.7.9) the device uses chains in the order they were made
//! available, and may write one used element for a batch: at the batch's first place in the
//! used ring, with the id of its last chain, moving `used.idx` past the whole batch. The
//! driver then reclaims in avail order from its own record of that order, reads one used
//! element per batch, and takes the chains before the batch's last as used in full (their
//! whole writable size, as the spec says and Linux reports). An id that ends a batch past
//! what `used.idx` covers, or names a chain not in flight, breaks the queue before anything is
//! reclaimed. Freed chains are reused oldest first, so descriptors go round the table in
//! order.

use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

use crate::sync::{fence, AtomicU64};
use std::sync::Arc;

use crate::error::Broken;
use crate::event::vring_need_event;
use crate::layout::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DESC_SIZE, USED_F_NO_NOTIFY};
use crate::memory::SharedSlice;

mod used;
use crate::ring::{Desc, Rings};
use crate::{Error, GuestAddress, GuestMemory, QueueConfig};

/// One buffer to expose: `len` bytes at `addr` in the driver's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buf {
    pub addr: GuestAddress,
    pub len: u32,
}

impl Buf {
    pub fn new(addr: GuestAddress, len: u32) -> Buf {
        Buf { addr, len }
    }
}

/// Memory set aside for indirect tables: `max_chain` entries for each of the queue's heads,
/// so a head in flight always owns its table. Used when INDIRECT_DESC is negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndirectArea {
    pub addr: GuestAddress,
    pub max_chain: u16,
}

impl IndirectArea {
    /// Bytes the area needs for a queue of `size`.
    pub fn bytes_needed(size: u16, max_chain: u16) -> u64 {
        size as u64 * max_chain as u64 * DESC_SIZE
    }
}

/// Counters kept by a driver queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub added: u64,
    pub added_indirect: u64,
    /// `kick_prepare` answers: kick, or suppressed.
    pub kicks: u64,
    pub kicks_suppressed: u64,
    pub used: u64,
    /// `enable_cb*` calls that found used entries already pending.
    pub enable_rechecks_hit: u64,
    /// IN_ORDER: chains reclaimed without reading a used element of their own (included in
    /// `used`): part of a batch, or taken by [`DriverQueue::get_used_token`]. Zero against a
    /// device that writes every element in order, when reclaimed with `get_used`.
    pub used_inferred: u64,
}

#[derive(Debug)]
struct Slot<T> {
    token: Option<T>,
    /// Descriptors this chain holds in the table (1 for an indirect chain).
    ndescs: u16,
    /// Bytes the device may write, to check the used length against.
    writable: u64,
    /// The avail ring position (free-running) the chain was exposed at.
    pos: u16,
}

impl<T> Slot<T> {
    /// The used length of a chain the device used in full: its writable size.
    fn full_len(&self) -> u32 {
        self.writable.min(u32::MAX as u64) as u32
    }
}

struct Indirect {
    words: SharedSlice<AtomicU64>,
    base: GuestAddress,
    max_chain: u16,
}

/// A running driver-side queue; `T` is the caller's token for each chain in flight.
pub struct DriverQueue<T> {
    rings: Rings,
    config: QueueConfig,
    mask: u16,
    event_idx: bool,
    indirect: Option<Indirect>,
    /// Private links: the free list, and each chain's order while in flight.
    next: Vec<u16>,
    slots: Vec<Slot<T>>,
    free_head: u16,
    /// The last free descriptor (while any is free), where [`DriverQueue::set_fifo_reuse`]
    /// appends freed chains.
    free_tail: u16,
    fifo: bool,
    num_free: u16,
    avail_idx_shadow: u16,
    /// Chains added since the last kick decision.
    num_added: u16,
    force_kick: bool,
    publish_on_kick: bool,
    last_used: u16,
    used_cache: u16,
    /// IN_ORDER negotiated: reclaim in avail order, one used element per batch.
    in_order: bool,
    /// IN_ORDER: the head exposed at each avail ring slot, our own copy of the avail ring
    /// (the shared one is the device's to read, not ours to trust). Empty otherwise.
    order: Vec<u16>,
    /// IN_ORDER: the avail position of the last chain of the batch being reclaimed, and the
    /// used length the device wrote for it.
    batch_end: Option<(u16, u32)>,
    avail_flags_shadow: u16,
    broken: Broken,
    stats: DriverStats,
    _mem: Arc<GuestMemory>,
}

impl<T> std::fmt::Debug for DriverQueue<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverQueue")
            .field("config", &self.config)
            .field("num_free", &self.num_free)
            .field("avail_idx", &self.avail_idx_shadow)
            .field("last_used", &self.last_used)
            .field("broken", &self.broken)
            .finish()
    }
}

impl<T> DriverQueue<T> {
    /// Checks `config` against `mem`, initialises the rings (indices 0, callbacks enabled) and
    /// returns an empty queue. `indirect` is used only if INDIRECT_DESC was negotiated.
    pub fn activate(
        config: &QueueConfig,
        mem: Arc<GuestMemory>,
        indirect: Option<IndirectArea>,
    ) -> Result<DriverQueue<T>, Error> {
        let size = config.size();
        let rings = Rings::new(&mem, size, &config.rings())?;
        let indirect = match indirect.filter(|_| config.indirect()) {
            Some(a) if a.max_chain >= 2 => {
                let words = a.max_chain as usize * size as usize * 2;
                let words = mem.shared_slice::<AtomicU64>(a.addr, words)?;
                Some(Indirect {
                    words,
                    base: a.addr,
                    max_chain: a.max_chain,
                })
            }
            _ => None,
        };
        rings.set_avail_flags(0);
        rings.set_avail_idx_release(0);
        rings.set_used_event(0);
        let mut slots = Vec::with_capacity(size as usize);
        slots.resize_with(size as usize, || Slot {
            token: None,
            ndescs: 0,
            writable: 0,
            pos: 0,
        });
        let in_order = config.in_order();
        Ok(DriverQueue {
            mask: size - 1,
            event_idx: config.event_idx(),
            indirect,
            next: (1..=size).collect(),
            slots,
            free_head: 0,
            free_tail: size - 1,
            // In order, freed chains go back in the order they were taken: descriptors then
            // cycle through the table as the avail ring does.
            fifo: in_order,
            num_free: size,
            avail_idx_shadow: 0,
            num_added: 0,
            force_kick: false,
            publish_on_kick: false,
            last_used: 0,
            used_cache: 0,
            in_order,
            order: if in_order {
                vec![0; size as usize]
            } else {
                Vec::new()
            },
            batch_end: None,
            avail_flags_shadow: 0,
            broken: Broken::default(),
            stats: DriverStats::default(),
            config: *config,
            rings,
            _mem: mem,
        })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }
    pub fn stats(&self) -> DriverStats {
        self.stats
    }
    pub fn broken(&self) -> Option<&Error> {
        self.broken.get()
    }
    /// Free descriptors (Linux's capacity API). An indirect chain takes one.
    pub fn num_free(&self) -> u16 {
        self.num_free
    }
    /// Whether VIRTIO_F_IN_ORDER was negotiated: used chains are reclaimed in avail order.
    pub fn in_order(&self) -> bool {
        self.in_order
    }
    /// Chains in flight.
    pub fn in_flight(&self) -> u16 {
        self.avail_idx_shadow.wrapping_sub(self.last_used)
    }
    /// Whether a chain of `bufs` buffers is added as an indirect table. Never for more
    /// buffers than the queue size: spec 2.7.5.3.1 forbids a chain longer than that, indirect
    /// or not, and devices (ours included) refuse it.
    pub fn uses_indirect(&self, bufs: usize) -> bool {
        self.indirect.as_ref().is_some_and(|i| {
            bufs > 1 && bufs <= i.max_chain as usize && bufs <= self.config.size() as usize
        })
    }

    /// Reuses freed descriptors oldest first instead of most recently freed first. When the
    /// device completes in order and the caller posts each token's buffer again in the order
    /// it got them back (as a FIFO), every descriptor and avail entry is rewritten with the
    /// value it already holds, and is left untouched: its cache line stays shared with the
    /// device instead of moving on every lap. Off by default (most recently freed first),
    /// on by default with IN_ORDER.
    pub fn set_fifo_reuse(&mut self, on: bool) {
        self.fifo = on;
    }

    /// Delays publishing `avail.idx` until `kick_prepare` (the behaviour Linux's event-index
    /// series removed), for measurements: the `experiments` feature. Off by default: every
    /// `add` publishes.
    #[cfg(any(test, feature = "experiments"))]
    pub fn set_publish_on_kick(&mut self, on: bool) {
        self.publish_on_kick = on;
    }

    /// Exposes a chain: `out` buffers the device reads, then `in_` buffers it writes. Uses an
    /// indirect table when negotiated and the chain has more than one buffer.
    pub fn add(&mut self, out: &[Buf], in_: &[Buf], token: T) -> Result<(), Error> {
        self.broken.check()?;
        let total = out.len() + in_.len();
        if total == 0 {
            return Err(Error::EmptyChain);
        }
        let indirect = self.uses_indirect(total);
        let needed = if indirect { 1 } else { total };
        if needed > self.num_free as usize {
            return Err(Error::QueueFull {
                needed,
                free: self.num_free,
            });
        }
        let head = self.free_head;
        if total == 1 {
            // The common case (one rx buffer, one tx frame): no chain to link.
            let (b, flags) = match (out.first(), in_.first()) {
                (Some(b), _) => (b, 0),
                (None, Some(b)) => (b, DESC_F_WRITE),
                (None, None) => unreachable!("total is 1"),
            };
            self.rings.update_desc(
                head,
                Desc {
                    addr: b.addr.0,
                    len: b.len,
                    flags,
                    next: 0,
                },
            );
            self.free_head = self.next[head as usize];
            let writable = if flags == 0 { 0 } else { b.len as u64 };
            self.expose(head, 1, writable, token);
            return Ok(());
        }
        let bufs = out
            .iter()
            .map(|b| (b, 0))
            .chain(in_.iter().map(|b| (b, DESC_F_WRITE)));
        let writable = in_.iter().map(|b| b.len as u64).sum();
        if let Some(ind) = &self.indirect.as_ref().filter(|_| indirect) {
            let table = head as usize * ind.max_chain as usize;
            let words = ind.words.as_slice();
            for (i, (b, write)) in bufs.enumerate() {
                let last = i + 1 == total;
                let flags = write | if last { 0 } else { DESC_F_NEXT };
                let next = if last { 0 } else { i as u16 + 1 };
                let (a, w) = Desc {
                    addr: b.addr.0,
                    len: b.len,
                    flags,
                    next,
                }
                .to_words();
                words[2 * (table + i)].store(a, Relaxed);
                words[2 * (table + i) + 1].store(w, Relaxed);
            }
            let addr = ind.base.0 + table as u64 * DESC_SIZE;
            let len = (total as u64 * DESC_SIZE) as u32;
            self.rings.set_desc(
                head,
                Desc {
                    addr,
                    len,
                    flags: DESC_F_INDIRECT,
                    next: 0,
                },
            );
            self.free_head = self.next[head as usize];
            self.stats.added_indirect += 1;
        } else {
            let mut i = head;
            for (n, (b, write)) in bufs.enumerate() {
                let last = n + 1 == total;
                let flags = write | if last { 0 } else { DESC_F_NEXT };
                let next = if last { 0 } else { self.next[i as usize] };
                self.rings.update_desc(
                    i,
                    Desc {
                        addr: b.addr.0,
                        len: b.len,
                        flags,
                        next,
                    },
                );
                i = self.next[i as usize];
            }
            self.free_head = i;
        }
        self.expose(head, needed as u16, writable, token);
        Ok(())
    }

    /// Takes `ndescs` descriptors from the free count, records the chain at `head` and puts
    /// it in the avail ring (publishing the index unless that waits for the kick).
    #[inline(always)]
    fn expose(&mut self, head: u16, ndescs: u16, writable: u64, token: T) {
        self.num_free -= ndescs;
        let pos = self.avail_idx_shadow;
        self.slots[head as usize] = Slot {
            token: Some(token),
            ndescs,
            writable,
            pos,
        };
        if self.in_order {
            self.order[(pos & self.mask) as usize] = head;
        }
        self.rings.set_avail_entry(pos & self.mask, head);
        self.avail_idx_shadow = self.avail_idx_shadow.wrapping_add(1);
        self.num_added += 1;
        // Past 65535 adds the kick window (new - old) would wrap: fold it and force a kick.
        if self.num_added == u16::MAX {
            self.num_added = 0;
            self.force_kick = true;
        }
        if !self.publish_on_kick {
            // Release: the descriptors and ring entry written above are visible before the
            // index that exposes them; pairs with the device's acquire load of avail.idx.
            self.rings.set_avail_idx_release(self.avail_idx_shadow);
        }
        self.stats.added += 1;
    }

    /// Whether the device must be kicked for the chains added since the last call: through
    /// `avail_event` with EVENT_IDX, else through the NO_NOTIFY flag.
    pub fn kick_prepare(&mut self) -> bool {
        if self.publish_on_kick {
            // Release, as in `add`.
            self.rings.set_avail_idx_release(self.avail_idx_shadow);
        }
        if self.num_added == 0 && !self.force_kick {
            return false;
        }
        // Full fence: our avail.idx store must be visible before we read avail_event/flags;
        // pairs with the device's fence in enable_notification between its avail_event/flags
        // store and its avail.idx re-read. Without it both sides can miss each other.
        fence(SeqCst);
        let new = self.avail_idx_shadow;
        let old = new.wrapping_sub(self.num_added);
        self.num_added = 0;
        let need = std::mem::take(&mut self.force_kick)
            || if self.event_idx {
                vring_need_event(self.rings.avail_event(), new, old)
            } else {
                self.rings.used_flags() & USED_F_NO_NOTIFY == 0
            };
        if need {
            self.stats.kicks += 1;
        } else {
            self.stats.kicks_suppressed += 1;
        }
        need
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;
    use crate::Features;

    fn write_used(p: &Pair, slot: u16, id: u32, len: u32, idx: u16) {
        let used = p.config.rings().used.0;
        let mut e = [0u8; 8];
        e[..4].copy_from_slice(&id.to_le_bytes());
        e[4..].copy_from_slice(&len.to_le_bytes());
        p.mem
            .write(GuestAddress(used + 4 + 8 * slot as u64), &e)
            .unwrap();
        p.mem
            .write(GuestAddress(used + 2), &idx.to_le_bytes())
            .unwrap();
    }

    #[test]
    fn indirect_chains_take_one_descriptor() {
        let mut p = pair(8, Features::RING_INDIRECT_DESC);
        for i in 0..8 {
            p.driver
                .add(&[buf(0, 10), buf(1, 10)], &[buf(2, 10)], i)
                .unwrap();
        }
        assert_eq!(p.driver.num_free(), 0);
        assert_eq!(p.driver.stats().added_indirect, 8);
        assert_eq!(
            p.driver.add(&[buf(0, 1)], &[], 9),
            Err(Error::QueueFull { needed: 1, free: 0 })
        );
        for _ in 0..8 {
            let c = p.device.pop().unwrap().unwrap();
            assert_eq!((c.readable().len(), c.writable().len()), (2, 1));
            p.device.add_used(c.head(), 10).unwrap();
        }
        p.device.flush();
        for i in 0..8 {
            assert_eq!(p.driver.get_used(), Ok(Some((i, 10))));
        }
        assert_eq!(p.driver.num_free(), 8);
    }

    #[test]
    fn direct_chains_free_their_descriptors_in_any_completion_order() {
        let mut p = pair(8, Features::EMPTY);
        p.driver
            .add(&[buf(0, 1), buf(1, 1), buf(2, 1)], &[], 0)
            .unwrap();
        p.driver.add(&[buf(0, 1)], &[buf(1, 1)], 1).unwrap();
        assert_eq!(p.driver.num_free(), 3);
        let a = p.device.pop().unwrap().unwrap();
        let b = p.device.pop().unwrap().unwrap();
        p.device.add_used(b.head(), 1).unwrap();
        p.device.add_used(a.head(), 0).unwrap();
        p.device.flush();
        assert_eq!(p.driver.get_used(), Ok(Some((1, 1))));
        assert_eq!(p.driver.get_used(), Ok(Some((0, 0))));
        assert_eq!(p.driver.num_free(), 8);
        // The free list is intact: all 8 descriptors can be used by one chain again.
        let all: Vec<_> = (0..8).map(|i| buf(i, 1)).collect();
        p.driver.add(&all, &[], 2).unwrap();
        assert_eq!(p.device.pop().unwrap().unwrap().readable().len(), 8);
    }

    /// The avail ring entries and the descriptor table, as the device sees them.
    fn ring_bytes(p: &Pair, size: u16) -> (Vec<u8>, Vec<u8>) {
        let r = p.config.rings();
        let mut avail = vec![0u8; 2 * size as usize];
        p.mem.read(GuestAddress(r.avail.0 + 4), &mut avail).unwrap();
        let mut desc = vec![0u8; 16 * size as usize];
        p.mem.read(GuestAddress(r.desc.0), &mut desc).unwrap();
        (avail, desc)
    }

    #[test]
    fn fifo_reuse_posts_each_lap_as_the_last() {
        // A full ring completed in order and posted again in the order it came back: with
        // FIFO reuse the device finds the same avail entries and descriptors on every lap;
        // most-recently-freed-first hands the descriptors out in reverse each lap.
        for fifo in [true, false] {
            let mut p = pair(8, Features::EMPTY);
            p.driver.set_fifo_reuse(fifo);
            let mut free: std::collections::VecDeque<u32> = (0..8).collect();
            let mut laps = Vec::new();
            for lap in 0..3 {
                while let Some(t) = free.pop_front() {
                    p.driver.add(&[], &[buf(t as u64, 64)], t).unwrap();
                }
                laps.push(ring_bytes(&p, 8));
                for _ in 0..8 {
                    let c = p.device.pop().unwrap().unwrap();
                    p.device.add_used(c.head(), 64).unwrap();
                }
                p.device.flush();
                for i in 0..8 {
                    let (t, len) = p.driver.get_used().unwrap().unwrap();
                    assert_eq!(len, 64);
                    if lap == 0 {
                        assert_eq!(t, i, "completed in order");
                    }
                    free.push_back(t);
                }
            }
            assert_eq!(laps[1].1 == laps[2].1, fifo, "descriptors (fifo {fifo})");
            assert_eq!(laps[1].0 == laps[2].0, fifo, "avail entries (fifo {fifo})");
            assert_eq!(
                laps[0] == laps[1],
                fifo,
                "lap 0 against lap 1 (fifo {fifo})"
            );
        }
    }

    #[test]
    fn fifo_reuse_keeps_the_free_list_intact() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.set_fifo_reuse(true);
        // Chains of 3, 3 and 2 descriptors take the whole table, complete out of order, and
        // must leave all 8 for one chain again, twice over.
        for round in 0..2u32 {
            for (t, n) in [(0u32, 3u64), (1, 3), (2, 2)] {
                let bufs: Vec<_> = (0..n).map(|i| buf(i, 16)).collect();
                p.driver.add(&bufs, &[], round * 10 + t).unwrap();
            }
            assert_eq!(p.driver.num_free(), 0);
            let chains: Vec<_> = (0..3).map(|_| p.device.pop().unwrap().unwrap()).collect();
            for c in [&chains[1], &chains[2], &chains[0]] {
                p.device.add_used(c.head(), 0).unwrap();
            }
            p.device.flush();
            for t in [1, 2, 0] {
                assert_eq!(p.driver.get_used(), Ok(Some((round * 10 + t, 0))));
            }
            assert_eq!(p.driver.num_free(), 8);
            let all: Vec<_> = (0..8).map(|i| buf(i, 1)).collect();
            p.driver.add(&all, &[], 99).unwrap();
            let c = p.device.pop().unwrap().unwrap();
            assert_eq!(c.readable().len(), 8);
            p.device.add_used(c.head(), 0).unwrap();
            p.device.flush();
            assert_eq!(p.driver.get_used(), Ok(Some((99, 0))));
        }
    }

    #[test]
    fn peek_used_looks_ahead_without_reclaiming() {
        let mut p = pair(8, Features::EMPTY);
        for i in 0..4 {
            p.driver.add(&[buf(i, 10)], &[], i as u32 + 100).unwrap();
        }
        write_used(&p, 0, 0, 0, 1);
        write_used(&p, 1, 1, 0, 2);
        write_used(&p, 2, 3, 0, 3);
        write_used(&p, 3, 7, 0, 4); // An id that is not in flight.
        assert_eq!(p.driver.peek_used(0), None, "used.idx not read yet");
        assert_eq!(p.driver.get_used(), Ok(Some((100, 0))));
        assert_eq!(p.driver.used_seen(), 3);
        assert_eq!(p.driver.peek_used(0), Some(&101));
        assert_eq!(p.driver.peek_used(1), Some(&103));
        assert_eq!(p.driver.peek_used(2), None, "a bad id is only a miss here");
        assert_eq!(p.driver.peek_used(3), None);
        assert_eq!(p.driver.get_used(), Ok(Some((101, 0))));
        assert_eq!(p.driver.get_used(), Ok(Some((103, 0))));
        assert_eq!(p.driver.get_used(), Err(Error::UsedIdNotInFlight { id: 7 }));
    }

    #[test]
    fn descriptors_posted_again_hold_the_right_buffer() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[], &[buf(1, 64)], 0).unwrap();
        let desc = p.config.rings().desc.0;
        let mut before = [0u8; 16];
        p.mem.read(GuestAddress(desc), &mut before).unwrap();
        write_used(&p, 0, 0, 64, 1);
        assert_eq!(p.driver.get_used(), Ok(Some((0, 64))));
        // The same buffer again: the descriptor holds what it held (the store is skipped);
        // another buffer: it is written.
        p.driver.add(&[], &[buf(1, 64)], 1).unwrap();
        let mut after = [0u8; 16];
        p.mem.read(GuestAddress(desc), &mut after).unwrap();
        assert_eq!(before, after);
        write_used(&p, 1, 0, 0, 2);
        assert_eq!(p.driver.get_used(), Ok(Some((1, 0))));
        p.driver.add(&[], &[buf(2, 32)], 2).unwrap();
        p.mem.read(GuestAddress(desc), &mut after).unwrap();
        assert_eq!(u32::from_le_bytes(after[8..12].try_into().unwrap()), 32);
    }

    #[test]
    fn used_id_out_of_range_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        write_used(&p, 0, 8, 0, 1);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdOutOfRange { id: 8, size: 8 })
        );
        assert!(matches!(p.driver.get_used(), Err(Error::Broken { .. })));
        assert!(matches!(
            p.driver.add(&[buf(0, 1)], &[], 1),
            Err(Error::Broken { .. })
        ));
    }

    #[test]
    fn used_id_not_in_flight_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        write_used(&p, 0, 3, 0, 1);
        assert_eq!(p.driver.get_used(), Err(Error::UsedIdNotInFlight { id: 3 }));
    }

    #[test]
    fn used_len_beyond_the_writable_part_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[buf(1, 100)], 0).unwrap();
        write_used(&p, 0, 0, 101, 1);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedLenTooLarge {
                id: 0,
                len: 101,
                max: 100
            })
        );
    }

    #[test]
    fn used_len_of_one_buffer_chains_is_checked() {
        // One-buffer chains take their own path in `add`: a writable one bounds the length by
        // its size, a read-only one allows no length at all.
        let ok = |len| Ok(Some((0, len)));
        let too_large = |len, max| Err(Error::UsedLenTooLarge { id: 0, len, max });
        let writable: (&[Buf], &[Buf]) = (&[], &[buf(1, 100)]);
        let read_only: (&[Buf], &[Buf]) = (&[buf(0, 64)], &[]);
        for ((out, in_), len, expected) in [
            (writable, 100, ok(100)),
            (writable, 101, too_large(101, 100)),
            (read_only, 0, ok(0)),
            (read_only, 1, too_large(1, 0)),
        ] {
            let mut p = pair(8, Features::EMPTY);
            p.driver.add(out, in_, 0).unwrap();
            write_used(&p, 0, 0, len, 1);
            assert_eq!(
                p.driver.get_used(),
                expected,
                "{} out, length {len}",
                out.len()
            );
        }
    }

    #[test]
    fn used_idx_beyond_what_is_in_flight_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        write_used(&p, 0, 0, 0, 2);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdxOutOfRange {
                used_idx: 2,
                last_used: 0,
                size: 8
            })
        );
    }

    #[test]
    fn a_kick_is_forced_before_num_added_wraps() {
        let mut p = pair(1, Features::RING_EVENT_IDX);
        // The device polls without ever moving avail_event: event idx alone would never kick.
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        assert!(p.driver.kick_prepare());
        let mut forced = false;
        for i in 1..=u16::MAX as u32 {
            let c = p.device.pop().unwrap().unwrap();
            p.device.add_used(c.head(), 0).unwrap();
            p.device.flush();
            p.driver.get_used().unwrap().unwrap();
            p.driver.add(&[buf(0, 1)], &[], i).unwrap();
            if i == u16::MAX as u32 {
                assert!(p.driver.kick_prepare(), "65535 adds without a kick");
                forced = true;
            }
        }
        assert!(forced);
    }

    #[test]
    fn publish_on_kick_delays_the_avail_index() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.set_publish_on_kick(true);
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        assert_eq!(p.device.pop(), Ok(None));
        p.driver.kick_prepare();
        assert!(p.device.pop().unwrap().is_some());
    }

    #[test]
    fn detach_unused_returns_every_token_in_flight() {
        let mut p = pair(8, Features::RING_INDIRECT_DESC);
        p.driver.add(&[buf(0, 1)], &[], 10).unwrap();
        p.driver.add(&[buf(0, 1), buf(1, 1)], &[], 11).unwrap();
        let mut t = p.driver.detach_unused();
        t.sort();
        assert_eq!(t, vec![10, 11]);
        assert_eq!(p.driver.num_free(), 8);
    }

    /// An IN_ORDER queue of 8 with five one-buffer chains in flight, tokens 0..5, buffer i
    /// `10 * (i + 1)` bytes writable; returns their heads in avail order.
    fn in_order_pair() -> (Pair, Vec<u16>) {
        let mut p = pair(8, Features::IN_ORDER);
        for i in 0..5u32 {
            p.driver
                .add(&[], &[buf(i as u64, 10 * (i + 1))], i)
                .unwrap();
        }
        let heads = (0..5).map(|i| p.driver.order[i]).collect();
        (p, heads)
    }

    #[test]
    fn in_order_one_used_element_reclaims_its_whole_batch() {
        let (mut p, heads) = in_order_pair();
        assert!(p.driver.in_order());
        // One element, at the batch's first place, naming its last chain (the fourth); the
        // places it skips hold garbage the driver must not read.
        write_used(&p, 0, heads[3] as u32, 7, 4);
        write_used(&p, 1, 999, 999, 4);
        write_used(&p, 2, 5, 12345, 4);
        let got: Vec<_> = std::iter::from_fn(|| p.driver.get_used().unwrap()).collect();
        // Chains before the last were used in full; the last has the length written.
        assert_eq!(got, [(0, 10), (1, 20), (2, 30), (3, 7)]);
        assert_eq!(p.driver.stats().used_inferred, 3);
        assert_eq!(p.driver.stats().used, 4);
        assert_eq!((p.driver.num_free(), p.driver.in_flight()), (7, 1));
        // The fifth, as a batch of one, then nothing.
        write_used(&p, 4, heads[4] as u32, 50, 5);
        assert_eq!(p.driver.get_used(), Ok(Some((4, 50))));
        assert_eq!(p.driver.get_used(), Ok(None));
        assert_eq!(p.driver.stats().used_inferred, 3);
        assert_eq!(p.driver.num_free(), 8);
    }

    #[test]
    fn in_order_tokens_come_back_by_the_used_index_alone() {
        let (mut p, heads) = in_order_pair();
        // used.idx covers three chains; every element holds garbage that get_used would
        // refuse (an id outside the queue): get_used_token reads none of them.
        for i in 0..5 {
            write_used(&p, i, 999, 999, 3);
        }
        let got: Vec<_> = std::iter::from_fn(|| p.driver.get_used_token().unwrap()).collect();
        assert_eq!(got, [0, 1, 2], "in avail order, as far as used.idx says");
        assert_eq!(p.driver.stats().used_inferred, 3);
        assert_eq!((p.driver.num_free(), p.driver.in_flight()), (6, 2));
        // Mixed with get_used inside a batch it began: the batch's end is taken once.
        write_used(&p, 3, heads[4] as u32, 9, 5);
        assert_eq!(p.driver.get_used(), Ok(Some((3, 40))));
        assert_eq!(p.driver.get_used_token(), Ok(Some(4)));
        assert_eq!(p.driver.get_used_token(), Ok(None));
        assert_eq!(p.driver.get_used(), Ok(None));
        assert_eq!(p.driver.num_free(), 8);
        // The index is still checked: past what is in flight breaks the queue.
        let (mut p, _) = in_order_pair();
        write_used(&p, 0, 0, 0, 6);
        assert!(matches!(
            p.driver.get_used_token(),
            Err(Error::UsedIdxOutOfRange { used_idx: 6, .. })
        ));
        assert!(matches!(
            p.driver.get_used_token(),
            Err(Error::Broken { .. })
        ));
        // Without IN_ORDER the element is read and checked, as by get_used.
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[], 7u32).unwrap();
        write_used(&p, 0, 999, 0, 1);
        assert!(matches!(
            p.driver.get_used_token(),
            Err(Error::UsedIdOutOfRange { id: 999, .. })
        ));
    }

    #[test]
    fn in_order_batches_published_together_are_each_read_once() {
        let (mut p, heads) = in_order_pair();
        // Two batches under one used.idx store: chains 0-1 and 2-4.
        write_used(&p, 0, heads[1] as u32, 1, 5);
        write_used(&p, 2, heads[4] as u32, 2, 5);
        write_used(&p, 1, 0xdead, 0, 5);
        write_used(&p, 3, heads[0] as u32, 0, 5);
        assert!(p.driver.get_used().unwrap().is_some());
        // Looking ahead needs no used element: the order is the driver's own.
        assert_eq!(p.driver.peek_used(0), Some(&1));
        assert_eq!(p.driver.peek_used(3), Some(&4));
        assert_eq!(p.driver.peek_used(4), None);
        let rest: Vec<_> = std::iter::from_fn(|| p.driver.get_used().unwrap()).collect();
        assert_eq!(rest, [(1, 1), (2, 30), (3, 40), (4, 2)]);
        assert_eq!(p.driver.stats().used_inferred, 3);
    }

    #[test]
    fn in_order_ids_out_of_order_break_the_queue_and_reclaim_nothing() {
        // The third chain named at the first place while used.idx covers two: the device
        // used it before the ones ahead of it (or skipped past what it published).
        let (mut p, heads) = in_order_pair();
        write_used(&p, 0, heads[2] as u32, 0, 2);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdOutOfOrder {
                id: heads[2] as u32,
                batch: 3,
                used: 2
            })
        );
        assert!(matches!(p.driver.get_used(), Err(Error::Broken { .. })));
        assert_eq!((p.driver.num_free(), p.driver.in_flight()), (3, 5));

        // A chain the device already returned.
        let (mut p, heads) = in_order_pair();
        write_used(&p, 0, heads[1] as u32, 0, 2);
        write_used(&p, 2, heads[0] as u32, 0, 3);
        assert_eq!(p.driver.get_used(), Ok(Some((0, 10))));
        assert_eq!(p.driver.get_used(), Ok(Some((1, 0))));
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdNotInFlight {
                id: heads[0] as u32
            })
        );
        assert_eq!(p.driver.num_free(), 5, "only the first two came back");

        // Past what is in flight altogether, and an id outside the queue.
        let (mut p, heads) = in_order_pair();
        write_used(&p, 0, heads[0] as u32, 0, 6);
        assert!(matches!(
            p.driver.get_used(),
            Err(Error::UsedIdxOutOfRange { used_idx: 6, .. })
        ));
        let (mut p, _) = in_order_pair();
        write_used(&p, 0, 8, 0, 1);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdOutOfRange { id: 8, size: 8 })
        );
        // The length of a batch's last chain is checked against that chain.
        let (mut p, heads) = in_order_pair();
        write_used(&p, 0, heads[1] as u32, 21, 2);
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedLenTooLarge {
                id: heads[1] as u32,
                len: 21,
                max: 20
            })
        );
        assert_eq!(p.driver.num_free(), 3);
    }

    #[test]
    fn in_order_against_our_device_over_many_laps_keeps_the_free_list_whole() {
        // Chains of one to three buffers, direct and indirect, completed in order by the
        // device side in bursts, over enough laps to wrap the 16-bit indices: every element
        // is the next chain in order (nothing inferred), tokens come back in order, and
        // descriptors go round the table in order.
        for features in [
            Features::IN_ORDER,
            Features::IN_ORDER | Features::RING_INDIRECT_DESC,
        ] {
            let mut p = pair(16, features);
            let (mut next_token, mut next_back) = (0u32, 0u32);
            let mut heads = Vec::new();
            for round in 0..30_000u32 {
                let n = 1 + (round % 3) as u64;
                let bufs: Vec<_> = (0..n).map(|i| buf(i, 64)).collect();
                let half = (n / 2) as usize;
                while p
                    .driver
                    .add(&bufs[..half], &bufs[half..], next_token)
                    .is_ok()
                {
                    next_token += 1;
                }
                let burst = 1 + round % 5;
                for _ in 0..burst {
                    let Some(c) = p.device.pop().unwrap() else {
                        break;
                    };
                    let descs = if c.readable().len() + c.writable().len() > 1
                        && features.contains(Features::RING_INDIRECT_DESC)
                    {
                        1
                    } else {
                        c.readable().len() + c.writable().len()
                    };
                    heads.push((c.head(), descs as u16));
                    p.device.add_used(c.head(), 64).unwrap();
                }
                p.device.flush();
                while let Some((t, len)) = p.driver.get_used().unwrap() {
                    assert_eq!(t, next_back, "{features}: in order");
                    assert!(len == 64 || len == 0);
                    next_back += 1;
                }
            }
            assert!(next_back > 65_536, "{next_back}: the indices wrapped");
            assert_eq!(p.driver.stats().used_inferred, 0);
            // Each chain starts at the descriptor after the previous chain's last.
            for w in heads.windows(2) {
                assert_eq!(w[1].0, (w[0].0 + w[0].1) % 16, "{features}: {w:?}");
            }
            // Drain, and the whole table fits one chain again.
            while let Some(c) = p.device.pop().unwrap() {
                p.device.add_used(c.head(), 0).unwrap();
            }
            p.device.flush();
            while p.driver.get_used().unwrap().is_some() {}
            assert_eq!(p.driver.num_free(), 16);
            let all: Vec<_> = (0..16).map(|i| buf(i, 1)).collect();
            p.driver.add(&all, &[], 0).unwrap();
            assert_eq!(p.device.pop().unwrap().unwrap().readable().len(), 16);
        }
    }

    #[test]
    fn in_order_one_buffer_chains_reuse_descriptors_in_ring_order() {
        // A full ring completed in order and added again: descriptor i serves avail slot i on
        // every lap, so the avail ring is never rewritten (most recently freed first would
        // hand the descriptors out in reverse on the second lap).
        let mut p = pair(8, Features::IN_ORDER);
        let mut avail = Vec::new();
        for lap in 0..3u32 {
            for i in 0..8 {
                p.driver
                    .add(&[buf(i, 64)], &[], lap * 8 + i as u32)
                    .unwrap();
            }
            avail.push(ring_bytes(&p, 8).0);
            let heads: Vec<u16> = (0..8)
                .map(|_| {
                    let c = p.device.pop().unwrap().unwrap();
                    p.device.add_used(c.head(), 0).unwrap();
                    c.head()
                })
                .collect();
            assert_eq!(heads, (0..8).collect::<Vec<u16>>(), "lap {lap}");
            p.device.flush();
            while p.driver.get_used().unwrap().is_some() {}
        }
        assert!(avail.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn without_in_order_a_batch_element_is_refused_as_before() {
        // The same batch element, IN_ORDER not negotiated: the general path takes it as the
        // one chain it names, and the next element (garbage) breaks the queue.
        let mut p = pair(8, Features::EMPTY);
        for i in 0..3u32 {
            p.driver.add(&[], &[buf(i as u64, 10)], i).unwrap();
        }
        write_used(&p, 0, 2, 5, 3);
        write_used(&p, 1, 999, 0, 3);
        assert_eq!(p.driver.get_used(), Ok(Some((2, 5))));
        assert_eq!(
            p.driver.get_used(),
            Err(Error::UsedIdOutOfRange { id: 999, size: 8 })
        );
    }

    #[test]
    fn enable_cb_reports_pending_used_entries() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        p.driver.add(&[buf(0, 1)], &[], 0).unwrap();
        p.driver.disable_cb();
        let c = p.device.pop().unwrap().unwrap();
        p.device.add_used(c.head(), 0).unwrap();
        p.device.flush();
        assert!(p.driver.enable_cb(), "a used entry is pending");
        p.driver.get_used().unwrap().unwrap();
        assert!(!p.driver.enable_cb());
    }

    #[test]
    fn enable_cb_after_asks_for_the_chosen_used_entry() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        for t in 0..8 {
            p.driver.add(&[buf(t, 1)], &[], t as u32).unwrap();
        }
        p.driver.disable_cb();
        assert!(!p.driver.enable_cb_after(2));
        assert_eq!(p.driver.rings.used_event(), 2);
        for _ in 0..3 {
            let c = p.device.pop().unwrap().unwrap();
            p.device.add_used(c.head(), 0).unwrap();
        }
        p.device.flush();
        assert!(p.driver.enable_cb_after(2), "3 used, more than 2");
        assert!(!p.driver.enable_cb_after(3), "3 used, not more than 3");
        p.driver.get_used().unwrap().unwrap();
        // The delayed callback is the same at 3/4: 5 of the 7 in flight from last_used 1.
        assert!(!p.driver.enable_cb_delayed());
        assert_eq!(p.driver.rings.used_event(), 1 + 5);
        // Never at or past what is in flight: at most the 7th of the 7 notifies.
        assert!(!p.driver.enable_cb_after(100));
        assert_eq!(p.driver.rings.used_event(), 1 + 6);
        // The device completes the 4 it has not popped yet, then the rest: the last one, and
        // only it, asks for the notification the driver waits for.
        p.device.needs_notification(); // Settles the device's notion of what it signalled.
        for _ in 0..4 {
            let c = p.device.pop().unwrap().unwrap();
            p.device.add_used(c.head(), 0).unwrap();
            assert!(
                !p.device.needs_notification(),
                "not before the last in flight"
            );
        }
        let c = p.device.pop().unwrap().unwrap();
        p.device.add_used(c.head(), 0).unwrap();
        assert!(
            p.device.needs_notification(),
            "the last chain in flight notifies"
        );
    }
}
