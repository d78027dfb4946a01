//! The device side of a split virtqueue: pop validated chains, return them used in batches,
//! and decide when to notify the driver (spec 2.7.7, 2.7.8, 2.7.10; Linux drivers/vhost).
//!
//! Used entries are written as they complete but `used.idx` is published once per batch (seed
//! 001): the driver never reads an element before the index that covers it, so one release
//! store per batch is enough, and the driver touches the index cache line once per batch.

use std::sync::atomic::Ordering::SeqCst;

use crate::sync::fence;
use std::sync::Arc;

use crate::chain::{Chain, Segment};
use crate::error::Broken;
use crate::event::vring_need_event;
use crate::layout::{used_ring_offset, AVAIL_F_NO_INTERRUPT, USED_ELEM_SIZE, USED_F_NO_NOTIFY};
use crate::position::AvailMark;
use crate::ring::Rings;
use crate::{DirtyLog, Error, GuestAddress, GuestMemory, QueueConfig, RingPosition};

/// Offset of `used.idx` in the used ring (spec 2.7.8), after its flags.
const USED_IDX_OFFSET: u64 = 2;

/// The default number of used entries written before `used.idx` is published (Linux's
/// VHOST_NET_BATCH).
pub const DEFAULT_USED_BATCH: u16 = 64;

/// Counters kept by a device queue. Plain integers: a queue has one owner at a time; a
/// caller that shares them across threads copies them into its own atomics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DeviceStats {
    /// Chains popped.
    pub popped: u64,
    /// Used elements written.
    pub used: u64,
    /// Stores to `used.idx` (one per published batch).
    pub used_idx_stores: u64,
    /// `needs_notification` answers: notify, or suppressed.
    pub notifications: u64,
    pub notifications_suppressed: u64,
    /// `enable_notification` calls that found the ring non-empty on the re-check.
    pub enable_rechecks_hit: u64,
}

/// A running device-side queue.
#[derive(Debug)]
pub struct DeviceQueue {
    rings: Rings,
    mem: Arc<GuestMemory>,
    config: QueueConfig,
    /// `size - 1`, kept in 32 bits: a u16 beside `last_avail` was read with it in one 32-bit
    /// load, which waited for the last pop's 16-bit store to `last_avail` (a store-forwarding
    /// stall on every pop).
    mask: u32,
    event_idx: bool,
    indirect: bool,
    notify_on_empty: bool,
    /// Next avail entry to pop.
    last_avail: u16,
    /// The last value read from `avail.idx`; `last_avail..avail_cache` are known to be ready.
    avail_cache: u16,
    /// Next used index to write.
    next_used: u16,
    /// The last value stored to `used.idx`.
    published_used: u16,
    /// IN_ORDER: the used element not yet written for a run of chains the device only read
    /// ([`DeviceQueue::add_used_read`]): the run's first slot and its last head.
    read_run: Option<(u16, u16)>,
    in_order: bool,
    batch: u16,
    /// The used index at the last notification decision, and whether it is still meaningful
    /// (it is not once the used index has wrapped past it).
    signalled_used: u16,
    signalled_used_valid: bool,
    used_flags: u16,
    /// While the frontend migrates: the log the queue marks every write of its in.
    log: Option<QueueLog>,
    broken: Broken,
    stats: DeviceStats,
}

/// A queue's dirty logging: the log, and the guest address its used ring is logged at
/// (vhost-user's `log_guest_addr`).
#[derive(Debug)]
struct QueueLog {
    log: Arc<DirtyLog>,
    used: GuestAddress,
}

impl DeviceQueue {
    /// Checks `config` against `mem` and starts the queue at position `at` (what vhost-user's
    /// SET_VRING_BASE gives; [`RingPosition::START`] for a fresh ring). The used index
    /// continues from what the ring holds.
    pub fn activate(
        config: &QueueConfig,
        mem: Arc<GuestMemory>,
        at: RingPosition,
    ) -> Result<DeviceQueue, Error> {
        let next_avail = at.next_avail();
        let rings = Rings::new(&mem, config.size(), &config.rings())?;
        let next_used = rings.used_idx_relaxed();
        Ok(DeviceQueue {
            mask: config.size() as u32 - 1,
            event_idx: config.event_idx(),
            indirect: config.indirect(),
            notify_on_empty: config.notify_on_empty(),
            last_avail: next_avail,
            avail_cache: next_avail,
            next_used,
            published_used: next_used,
            read_run: None,
            in_order: config.in_order(),
            batch: DEFAULT_USED_BATCH.min(config.size()),
            signalled_used: next_used,
            signalled_used_valid: false,
            used_flags: 0,
            log: None,
            broken: Broken::default(),
            stats: DeviceStats::default(),
            config: *config,
            rings,
            mem,
        })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }
    pub fn memory(&self) -> &Arc<GuestMemory> {
        &self.mem
    }
    pub fn stats(&self) -> DeviceStats {
        self.stats
    }
    /// Where the queue stands: the next chain to pop (what GET_VRING_BASE returns).
    pub fn position(&self) -> RingPosition {
        RingPosition::split(self.last_avail)
    }
    /// What the driver had made available when the device last looked (by a pop,
    /// `avail_pending` or `avail_moved`), without looking again: the device has seen no chain
    /// from there on. A caller short of buffers keeps it to ask [`DeviceQueue::avail_moved`]
    /// later.
    pub fn avail_mark(&self) -> AvailMark {
        AvailMark(self.avail_cache)
    }
    /// The first protocol violation, if the queue is broken.
    pub fn broken(&self) -> Option<&Error> {
        self.broken.get()
    }

    /// Sets how many used entries are written before `used.idx` is published (1 = publish
    /// every entry). Clamped to 1..=queue size.
    pub fn set_used_batch(&mut self, batch: u16) {
        self.batch = batch.clamp(1, self.config.size());
    }

    /// Logs every write of the device to guest memory in `log` from now on (live migration),
    /// the used ring's at `used_log_addr` (vhost-user's `log_guest_addr`, normally the used
    /// ring's own guest address); `None` stops logging. The rings' writes are marked here;
    /// the caller marks what it writes into buffers with [`DeviceQueue::add_used_written`] or
    /// [`DeviceQueue::log_write`].
    pub fn set_dirty_log(&mut self, log: Option<Arc<DirtyLog>>, used_log_addr: GuestAddress) {
        self.log = log.map(|log| QueueLog {
            log,
            used: used_log_addr,
        });
    }

    /// Whether the queue logs its writes.
    pub fn logging(&self) -> bool {
        self.log.is_some()
    }

    /// Marks the first `len` bytes of `segs` in the dirty log, if the queue logs: the device
    /// wrote them (after the write). Without a log, one branch.
    #[inline]
    pub fn log_write(&self, segs: &[Segment], len: u64) {
        if let Some(l) = &self.log {
            l.log.mark_segments(segs, len);
        }
    }

    /// [`DeviceQueue::add_used`] for a chain the device wrote `len` bytes into: those bytes
    /// are marked in the dirty log first, if the queue logs. Inlined into its callers (a
    /// frame's last buffer each): as a call it cost 10 instructions a frame more.
    #[inline(always)]
    pub fn add_used_written(&mut self, chain: &Chain, len: u32) -> Result<(), Error> {
        self.log_write(chain.writable(), len as u64);
        self.add_used(chain.head(), len)
    }

    /// [`DeviceQueue::add_used_written`] for a buffer of a frame that is not its last: this
    /// one never publishes `used.idx`, even with the batch full, so that the driver sees the
    /// frame's buffers used together (spec 5.1.6.4.2: a device MUST use all buffers of a
    /// receive packet together, so that at least `num_buffers` are observed as used). Adding
    /// the frame's last buffer with `add_used_written` publishes them all if the batch is
    /// full by then.
    #[inline]
    pub fn add_used_written_part(&mut self, chain: &Chain, len: u32) -> Result<(), Error> {
        self.broken.check()?;
        self.log_write(chain.writable(), len as u64);
        self.write_used(chain.head(), len);
        Ok(())
    }

    /// Marks `len` bytes at `offset` into the used ring in the dirty log.
    #[cold]
    fn log_used(&self, offset: u64, len: u64) {
        if let Some(l) = &self.log {
            if let Some(at) = l.used.checked_add(offset) {
                l.log.mark(at, len);
            }
        }
    }

    /// Marks the used elements of slots `old..new` and the used index in the dirty log.
    #[cold]
    fn log_used_batch(&self, old: u16, new: u16) {
        // The slots written, `old & mask` onwards, wrapping to slot 0 at most once.
        let size = self.config.size();
        let count = new.wrapping_sub(old).min(size);
        let start = old & self.mask();
        let first = count.min(size - start);
        self.log_used(used_ring_offset(start), USED_ELEM_SIZE * first as u64);
        self.log_used(used_ring_offset(0), USED_ELEM_SIZE * (count - first) as u64);
        self.log_used(USED_IDX_OFFSET, 2);
    }

    /// Reads `avail.idx` and checks it; returns whether entries are ready.
    #[inline]
    fn refresh_avail(&mut self) -> Result<bool, Error> {
        // Acquire pairs with the driver's release store of avail.idx (DriverQueue::add): the
        // ring entries and descriptors written before it are visible once we see the index.
        let idx = self.rings.avail_idx_acquire();
        if idx.wrapping_sub(self.last_avail) > self.config.size() {
            let size = self.config.size();
            return Err(self.broken.set(Error::AvailIdxOutOfRange {
                avail_idx: idx,
                last_avail: self.last_avail,
                size,
            }));
        }
        self.avail_cache = idx;
        Ok(idx != self.last_avail)
    }

    /// Whether the avail ring holds chains not yet popped (reads `avail.idx` if the cached
    /// value says empty). For busy polling.
    #[inline]
    pub fn avail_pending(&mut self) -> Result<bool, Error> {
        self.broken.check()?;
        if self.last_avail != self.avail_cache {
            return Ok(true);
        }
        self.refresh_avail()
    }

    /// Whether the driver has made chains available since `mark` (read and checked now): lets
    /// a caller that is waiting for more buffers tell whether any were added.
    pub fn avail_moved(&mut self, mark: AvailMark) -> Result<bool, Error> {
        self.broken.check()?;
        self.refresh_avail()?;
        Ok(self.avail_cache != mark.0)
    }

    /// `size - 1`, the mask of a ring index.
    #[inline]
    fn mask(&self) -> u16 {
        self.mask as u16
    }

    /// Pops the next available chain into `chain`, reusing its allocation. Returns false when
    /// the ring is empty. Any malformed chain breaks the queue. Inlined into each caller (a
    /// few, each a loop of pops): as a call it cost 7 instructions a pop more (callgrind).
    #[inline(always)]
    pub fn pop_into(&mut self, chain: &mut Chain) -> Result<bool, Error> {
        self.broken.check()?;
        if self.last_avail == self.avail_cache && !self.refresh_avail()? {
            return Ok(false);
        }
        let head = self.rings.avail_entry(self.last_avail & self.mask());
        if head > self.mask() {
            return Err(self.broken.set(Error::HeadOutOfRange {
                head,
                size: self.config.size(),
            }));
        }
        if let Err(e) = chain.walk(&self.rings, &self.mem, self.indirect, head) {
            return Err(self.broken.set(e));
        }
        self.last_avail = self.last_avail.wrapping_add(1);
        self.stats.popped += 1;
        Ok(true)
    }

    /// Asks for the descriptors of the next `n` chains known to be available (up to the last
    /// `avail.idx` read), so that the transfers of those the driver's CPU last wrote overlap
    /// instead of each pop waiting for its own. A hint: it reads the avail ring's entries and
    /// changes nothing; a head out of range is left to [`DeviceQueue::pop_into`] to refuse.
    #[inline]
    pub fn prefetch_avail(&self, n: u16) {
        let ready = self.avail_cache.wrapping_sub(self.last_avail);
        let mut slot = self.last_avail;
        for _ in 0..n.min(ready) {
            self.rings
                .prefetch_desc(self.rings.avail_entry(slot & self.mask()));
            slot = slot.wrapping_add(1);
        }
    }

    /// Asks for the used ring's lines that the next `n` used elements go into, for writing: the
    /// driver's CPU last read them, and their transfers then overlap the work before the stores
    /// instead of the stores waiting for them. A hint; it changes nothing. More than the ring
    /// holds asks for each of its lines once.
    #[inline]
    pub fn prefetch_used(&self, n: u16) {
        let n = n.min(self.config.size());
        if n == 0 {
            return;
        }
        let mut k = 0;
        while k < n {
            self.rings
                .prefetch_used_elem(self.next_used.wrapping_add(k) & self.mask());
            k = k.saturating_add(8);
        }
        self.rings
            .prefetch_used_elem(self.next_used.wrapping_add(n - 1) & self.mask());
    }

    /// Pops the next available chain, or `None` when the ring is empty.
    pub fn pop(&mut self) -> Result<Option<Chain>, Error> {
        let mut chain = Chain::new();
        Ok(self.pop_into(&mut chain)?.then_some(chain))
    }

    /// Hands back the last `count` chains popped but not used, so they are popped again (vhost's
    /// `vhost_discard_vq_desc`, for a packet that could not be sent).
    pub fn undo_pop(&mut self, count: u16) {
        self.last_avail = self.last_avail.wrapping_sub(count);
    }

    /// Writes a used element for chain `head` with `len` bytes written into its writable
    /// part. `used.idx` is published when the batch is full, or by [`DeviceQueue::flush`].
    /// Inlined into each caller, the publish out of line (`flush_full`): as a
    /// call, a frame's two adds (one on each side of the switch) cost 30 instructions more,
    /// a third of it the call's register saves (callgrind, the switch's bench).
    #[inline(always)]
    pub fn add_used(&mut self, head: u16, len: u32) -> Result<(), Error> {
        self.broken.check()?;
        self.write_used(head, len);
        self.flush_if_full();
        Ok(())
    }

    /// Publishes the used batch once it is full.
    #[inline(always)]
    fn flush_if_full(&mut self) {
        if self.next_used.wrapping_sub(self.published_used) >= self.batch {
            self.flush_full();
        }
    }

    /// [`DeviceQueue::flush`] out of line, once a batch, for the adds that inline the check.
    #[inline(never)]
    fn flush_full(&mut self) {
        self.flush();
    }

    /// Completes chain `head`, which the device only read (used length 0, a transmitted
    /// frame). With IN_ORDER, a run of such chains gets one used element, written when the
    /// run ends (another element follows, or the batch is published): the run's last head at
    /// its first slot, the used index moved by its length (VIRTIO 1.2 2.7.9; DPDK's virtio
    /// PMD reclaims tx so, Linux's in-order ring and ours read the element). A store per
    /// frame into the line the driver reads, and the transfers of that line back and forth,
    /// become one per batch. Without IN_ORDER, [`DeviceQueue::add_used`] with length 0.
    #[inline(always)]
    pub fn add_used_read(&mut self, head: u16) -> Result<(), Error> {
        if !self.in_order {
            return self.add_used(head, 0);
        }
        self.broken.check()?;
        let start = self.read_run.map_or(self.next_used, |(start, _)| start);
        self.read_run = Some((start, head));
        self.next_used = self.next_used.wrapping_add(1);
        self.stats.used += 1;
        self.flush_if_full();
        Ok(())
    }

    /// Writes the used element of the run of read chains, if one is open.
    #[inline]
    fn end_read_run(&mut self) {
        if let Some((start, head)) = self.read_run.take() {
            self.rings
                .set_used_elem(start & self.mask(), head as u32, 0);
        }
    }

    /// Writes the next used element, unpublished.
    #[inline]
    fn write_used(&mut self, head: u16, len: u32) {
        self.end_read_run();
        self.rings
            .set_used_elem(self.next_used & self.mask(), head as u32, len);
        self.next_used = self.next_used.wrapping_add(1);
        self.stats.used += 1;
    }

    /// Publishes the used elements written so far with one store of `used.idx`. Call it
    /// before waiting or busy polling, so the driver never waits on unpublished work.
    #[inline]
    pub fn flush(&mut self) {
        self.end_read_run();
        let (old, new) = (self.published_used, self.next_used);
        if old == new {
            return;
        }
        // Release: the used elements written above become visible before the index that
        // covers them; pairs with the driver's acquire load of used.idx (get_used).
        self.rings.set_used_idx_release(new);
        if self.log.is_some() {
            self.log_used_batch(old, new);
        }
        self.published_used = new;
        self.stats.used_idx_stores += 1;
        // If the driver has not been notified for a long while, the used index may wrap past
        // signalled_used; it then says nothing about what the driver saw (vhost_add_used_n).
        if new.wrapping_sub(self.signalled_used) < new.wrapping_sub(old) {
            self.signalled_used_valid = false;
        }
    }

    /// Publishes pending used entries, then says whether the driver asked to be notified of
    /// them: through `used_event` with EVENT_IDX, else through the NO_INTERRUPT flag.
    pub fn needs_notification(&mut self) -> bool {
        if self.broken.get().is_some() {
            return false;
        }
        self.flush();
        if self.signalled_used_valid && self.signalled_used == self.published_used {
            return false; // Nothing new since the last decision.
        }
        // Full fence: our used.idx store must be visible before we read used_event/flags;
        // pairs with the driver's fence in enable_cb between its used_event/flags store and
        // its used.idx re-read. Without it each side can miss the other: a lost interrupt.
        fence(SeqCst);
        let need = if self.notify_on_empty
            && self.last_avail == self.avail_cache
            && self.rings.avail_idx_acquire() == self.last_avail
        {
            true
        } else if self.event_idx {
            let (old, valid) = (self.signalled_used, self.signalled_used_valid);
            !valid || vring_need_event(self.rings.used_event(), self.published_used, old)
        } else {
            self.rings.avail_flags() & AVAIL_F_NO_INTERRUPT == 0
        };
        self.signalled_used = self.published_used;
        self.signalled_used_valid = true;
        if need {
            self.stats.notifications += 1;
        } else {
            self.stats.notifications_suppressed += 1;
        }
        need
    }

    /// Asks the driver for available-buffer notifications again, then re-checks the ring.
    /// Returns whether chains are pending, in which case the caller must keep processing
    /// instead of sleeping. Also flushes the used batch, since the caller is about to wait.
    pub fn enable_notification(&mut self) -> Result<bool, Error> {
        self.broken.check()?;
        self.flush();
        if self.event_idx {
            self.rings.set_avail_event(self.avail_cache);
            if self.log.is_some() {
                // avail_event sits just past the used ring's elements.
                self.log_used(used_ring_offset(self.config.size()), 2);
            }
        } else if self.used_flags & USED_F_NO_NOTIFY != 0 {
            self.used_flags &= !USED_F_NO_NOTIFY;
            self.rings.set_used_flags(self.used_flags);
            if self.log.is_some() {
                self.log_used(0, 2);
            }
        }
        // Full fence: the avail_event/flags store must be visible before we re-read
        // avail.idx; pairs with the driver's fence in kick_prepare between its avail.idx store
        // and its avail_event/flags load. This re-check is what prevents the lost wake-up.
        fence(SeqCst);
        let pending = self.last_avail != self.avail_cache || self.refresh_avail()?;
        if pending {
            self.stats.enable_rechecks_hit += 1;
        }
        Ok(pending)
    }

    /// Asks the driver not to notify (the device is polling). With EVENT_IDX nothing is
    /// written: `avail_event` simply stops moving, so the driver stops passing it.
    pub fn disable_notification(&mut self) {
        if !self.event_idx && self.used_flags & USED_F_NO_NOTIFY == 0 {
            self.used_flags |= USED_F_NO_NOTIFY;
            self.rings.set_used_flags(self.used_flags);
            if self.log.is_some() {
                self.log_used(0, 2);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{DESC_F_INDIRECT as IND, DESC_F_NEXT as NEXT, DESC_F_WRITE as WRITE};
    use crate::testutil::*;
    use crate::{Features, GuestAddress, Segment};

    const DATA: u64 = DATA_BASE.0;

    /// Asserts that popping fails with `want`, that the queue is broken, and that every later
    /// call fails too.
    fn assert_breaks(p: &mut Pair, want: Error) {
        assert_eq!(p.device.pop(), Err(want.clone()));
        assert_eq!(p.device.broken(), Some(&want));
        let broken = Error::Broken {
            reason: Box::new(want),
        };
        assert_eq!(p.device.pop(), Err(broken.clone()));
        assert_eq!(p.device.add_used(0, 0), Err(broken.clone()));
        assert_eq!(p.device.enable_notification(), Err(broken));
        assert!(!p.device.needs_notification());
    }

    #[test]
    fn read_chains_get_one_used_element_per_run_with_in_order() {
        const UNWRITTEN: (u32, u32) = (0xdead, 0xbeef);
        for in_order in [false, true] {
            let features = if in_order {
                Features::IN_ORDER
            } else {
                Features::EMPTY
            };
            let mut p = pair(8, features);
            for slot in 0..8 {
                p.device.rings.set_used_elem(slot, UNWRITTEN.0, UNWRITTEN.1);
            }
            // Three frames sent, an rx-like chain written, two more sent.
            for t in 0..6 {
                let (out, inp) = if t == 3 {
                    (vec![], vec![buf(t, 10)])
                } else {
                    (vec![buf(t, 10)], vec![])
                };
                p.driver.add(&out, &inp, t as u32).unwrap();
            }
            let heads: Vec<u16> = (0..6)
                .map(|_| p.device.pop().unwrap().unwrap().head())
                .collect();
            for (t, &h) in heads.iter().enumerate() {
                if t == 3 {
                    p.device.add_used(h, 7).unwrap();
                } else {
                    p.device.add_used_read(h).unwrap();
                }
            }
            assert_eq!(p.device.rings.used_idx_relaxed(), 0, "not published yet");
            p.device.flush();
            assert_eq!(p.device.rings.used_idx_relaxed(), 6);
            let written: Vec<_> = (0..6).map(|s| p.device.rings.used_elem(s)).collect();
            let want: Vec<_> = if in_order {
                // Each run's last head at its first slot; the other slots untouched.
                let h = |t: usize| heads[t] as u32;
                vec![
                    (h(2), 0),
                    UNWRITTEN,
                    UNWRITTEN,
                    (h(3), 7),
                    (h(5), 0),
                    UNWRITTEN,
                ]
            } else {
                let len = |t| if t == 3 { 7 } else { 0 };
                heads
                    .iter()
                    .enumerate()
                    .map(|(t, &h)| (h as u32, len(t)))
                    .collect()
            };
            assert_eq!(written, want, "in_order {in_order}");
            // The driver reclaims every chain, in order, with its length.
            let got: Vec<_> = std::iter::from_fn(|| p.driver.get_used().unwrap()).collect();
            assert_eq!(got, [(0, 0), (1, 0), (2, 0), (3, 7), (4, 0), (5, 0)]);
        }
    }

    #[test]
    fn a_run_of_read_chains_ends_where_the_used_batch_is_published() {
        let mut p = pair(8, Features::IN_ORDER);
        p.device.set_used_batch(2);
        for t in 0..3u32 {
            p.driver.add(&[buf(t as u64, 10)], &[], t).unwrap();
        }
        let heads: Vec<u16> = (0..3)
            .map(|_| p.device.pop().unwrap().unwrap().head())
            .collect();
        p.device.add_used_read(heads[0]).unwrap();
        p.device.add_used_read(heads[1]).unwrap();
        // The batch of two went out with its run's one element.
        assert_eq!(p.device.rings.used_idx_relaxed(), 2);
        assert_eq!(p.device.rings.used_elem(0), (heads[1] as u32, 0));
        assert_eq!(p.driver.get_used().unwrap(), Some((0, 0)));
        assert_eq!(p.driver.get_used().unwrap(), Some((1, 0)));
        assert_eq!(p.driver.get_used().unwrap(), None);
        // The next run starts at the next slot.
        p.device.add_used_read(heads[2]).unwrap();
        assert_eq!(p.device.rings.used_idx_relaxed(), 2, "not yet");
        p.device.flush();
        assert_eq!(p.device.rings.used_idx_relaxed(), 3);
        assert_eq!(p.device.rings.used_elem(2), (heads[2] as u32, 0));
        assert_eq!(p.driver.get_used().unwrap(), Some((2, 0)));
    }

    #[test]
    fn chain_comes_out_as_it_went_in() {
        let mut p = pair(8, Features::EMPTY);
        p.driver
            .add(&[buf(0, 10), buf(1, 20)], &[buf(2, 30)], 7)
            .unwrap();
        let c = p.device.pop().unwrap().unwrap();
        assert_eq!(c.readable().len(), 2);
        assert_eq!(
            c.writable(),
            &[Segment {
                addr: GuestAddress(DATA + 2 * 4096),
                len: 30
            }]
        );
        assert_eq!((c.readable_len(), c.writable_len()), (30, 30));
        assert_eq!(p.device.pop(), Ok(None));
        p.device.add_used(c.head(), 25).unwrap();
        assert_eq!(p.driver.get_used(), Ok(None), "not published before flush");
        p.device.flush();
        assert_eq!(p.driver.get_used(), Ok(Some((7, 25))));
        assert_eq!(p.driver.num_free(), 8);
    }

    /// A dirty log covering the pair's memory, on a memfd.
    fn dirty_log() -> Arc<DirtyLog> {
        let bytes = (MEM_SIZE as u64 / crate::memory::LOG_PAGE).div_ceil(8);
        let mem = GuestMemory::memfd(&[(GuestAddress(0), bytes as usize)]).unwrap();
        let file = mem
            .regions()
            .next()
            .unwrap()
            .file
            .unwrap()
            .try_clone()
            .unwrap();
        Arc::new(DirtyLog::from_file(file, bytes, 0).unwrap())
    }

    #[test]
    fn a_logging_queue_marks_the_bytes_it_wrote_and_its_used_ring_at_the_log_address() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        let log = dirty_log();
        // The used ring logged at a page boundary of its own choosing (the frontend's
        // log_guest_addr): elements from 0x2ff4, slot 1 straddling into page 3.
        let used_log = GuestAddress(0x3000 - 16);
        p.device.set_dirty_log(Some(log.clone()), used_log);
        assert!(p.device.logging());
        // 5000 bytes into a 6000-byte buffer at page 0x202: pages 0x202 and 0x203.
        p.driver.add(&[], &[buf(2, 6000)], 1).unwrap();
        let c = p.device.pop().unwrap().unwrap();
        p.mem.write(c.writable()[0].addr, &[7; 5000]).unwrap();
        p.device.add_used_written(&c, 5000).unwrap();
        assert_eq!(
            log.take_dirty(),
            [0x202, 0x203],
            "the buffer, not yet the ring"
        );
        p.device.flush();
        // Slot 0 (0x2ff4) and the index (0x2ff2): page 2.
        assert_eq!(log.take_dirty(), [2]);
        assert_eq!(p.driver.get_used().unwrap(), Some((1, 5000)));
        // Eight more, wrapping: slots 1..=7 and 0 again, pages 2 and 3; avail_event at
        // 0x2ff4 + 64, page 3.
        for i in 0..8 {
            p.driver.add(&[buf(10, 64)], &[], i).unwrap();
            let c = p.device.pop().unwrap().unwrap();
            p.device.add_used(c.head(), 0).unwrap();
            p.device.flush();
            assert_eq!(p.driver.get_used().unwrap(), Some((i, 0)));
        }
        assert_eq!(log.take_dirty(), [2, 3]);
        assert!(!p.device.enable_notification().unwrap());
        assert_eq!(log.take_dirty(), [3]);
        assert_eq!(log.missed(), 0);

        // Logging off: the same traffic marks nothing.
        p.device.set_dirty_log(None, used_log);
        p.driver.add(&[], &[buf(2, 6000)], 9).unwrap();
        let c = p.device.pop().unwrap().unwrap();
        p.device.add_used_written(&c, 100).unwrap();
        p.device.flush();
        p.device.enable_notification().unwrap();
        assert_eq!(p.driver.get_used().unwrap(), Some((9, 100)));
        assert!(log.take_dirty().is_empty());
    }

    #[test]
    fn without_event_idx_the_used_flags_are_logged_too() {
        let mut p = pair(8, Features::EMPTY);
        let log = dirty_log();
        let used = p.config.rings().used;
        p.device.set_dirty_log(Some(log.clone()), used);
        p.device.disable_notification();
        assert_eq!(log.take_dirty(), [used.0 / 4096]);
        p.device.enable_notification().unwrap();
        assert_eq!(log.take_dirty(), [used.0 / 4096]);
    }

    /// A hint over any count, at any position of the ring (wrapped included): nothing moves,
    /// and the driver gets what it would have without it.
    #[test]
    fn prefetching_used_lines_changes_nothing_the_driver_sees() {
        let mut p = pair(8, Features::EMPTY);
        for round in 0..13u32 {
            for n in [0, 1, 7, 8, 9, 255, 256, u16::MAX] {
                p.device.prefetch_used(n);
            }
            let before = (p.device.stats(), p.device.position());
            for n in [0, 1, 8, u16::MAX] {
                p.device.prefetch_used(n);
            }
            assert_eq!((p.device.stats(), p.device.position()), before);
            p.driver.add(&[], &[buf(0, 64)], round).unwrap();
            let c = p.device.pop().unwrap().unwrap();
            p.device.add_used_written(&c, round).unwrap();
            p.device.flush();
            assert_eq!(p.driver.get_used().unwrap(), Some((round, round)));
        }
    }

    #[test]
    fn used_idx_is_published_once_per_batch() {
        let mut p = pair(256, Features::EMPTY);
        for i in 0..200 {
            p.driver.add(&[buf(0, 64)], &[], i).unwrap();
        }
        while let Some(c) = p.device.pop().unwrap() {
            p.device.add_used(c.head(), 0).unwrap();
        }
        p.device.flush();
        // 200 entries in batches of 64: 3 full batches and the flushed rest.
        assert_eq!(p.device.stats().used_idx_stores, 4);
        for i in 0..200 {
            assert_eq!(p.driver.get_used().unwrap().unwrap().0, i);
        }
    }

    #[test]
    fn a_frames_buffers_are_published_together_across_a_full_batch() {
        let mut p = pair(16, Features::EMPTY);
        p.device.set_used_batch(4);
        for i in 0..8 {
            p.driver.add(&[], &[buf(i, 100)], i as u32).unwrap();
        }
        let chains: Vec<Chain> = (0..8).map(|_| p.device.pop().unwrap().unwrap()).collect();
        // One buffer, then a frame of six: the batch fills at its third buffer, and nothing
        // is published until its last.
        p.device.add_used_written(&chains[0], 100).unwrap();
        for c in &chains[1..6] {
            p.device.add_used_written_part(c, 100).unwrap();
            assert_eq!(p.device.stats().used_idx_stores, 0);
        }
        p.device.add_used_written(&chains[6], 50).unwrap();
        assert_eq!(p.device.stats().used_idx_stores, 1);
        assert_eq!(p.device.stats().used, 7);
        let mut got = Vec::new();
        while let Some((t, len)) = p.driver.get_used().unwrap() {
            got.push((t, len));
        }
        assert_eq!(got.len(), 7, "the whole frame at once");
        assert_eq!(got[6], (6, 50));
        // A broken queue takes no part either.
        p.set_avail_idx(100);
        assert!(p.device.pop().is_err());
        assert!(p.device.add_used_written_part(&chains[7], 1).is_err());
    }

    #[test]
    fn avail_index_too_far_ahead_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.set_avail_idx(9);
        assert_breaks(
            &mut p,
            Error::AvailIdxOutOfRange {
                avail_idx: 9,
                last_avail: 0,
                size: 8,
            },
        );
    }

    #[test]
    fn head_out_of_range_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.publish(0, &[8]);
        assert_breaks(&mut p, Error::HeadOutOfRange { head: 8, size: 8 });
    }

    /// What a `pop_into` returned, with the head and segments of the chain it popped.
    type Popped = Result<Option<(u16, Vec<Segment>)>, Error>;

    /// What each `pop_into` returns as a hostile driver fills the avail ring across its wrap
    /// with heads past the table, popping after `prefetch_avail` with `n` from 0 to past the
    /// ring each time, or never prefetching.
    fn pops_over_hostile_heads(prefetch: bool) -> Vec<Popped> {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, DATA, 64, 0, 0);
        p.write_desc(1, DATA + 4096, 128, WRITE, 0);
        let mut chain = Chain::new();
        let mut pop = |p: &mut Pair| {
            if prefetch {
                let (at, stats) = (p.device.position(), p.device.stats());
                for n in [0, 1, 3, 8, 9, 100, u16::MAX] {
                    p.device.prefetch_avail(n);
                }
                assert_eq!(p.device.position(), at, "prefetch moved the queue");
                assert_eq!(p.device.stats(), stats, "prefetch counted something");
            }
            let r = p.device.pop_into(&mut chain);
            r.map(|got| got.then(|| (chain.head(), chain.segments().to_vec())))
        };
        // Six good chains, then one pop more than there are.
        p.publish(0, &[0, 1, 0, 1, 0, 1]);
        let mut got: Vec<_> = (0..7).map(|_| pop(&mut p)).collect();
        // A full ring from slot 6, wrapping: two good chains, then heads past the table.
        p.publish(6, &[0, 1, 8, u16::MAX, 0x8000, 9, 1, 0]);
        got.extend((0..4).map(|_| pop(&mut p)));
        got
    }

    #[test]
    fn prefetching_hostile_avail_entries_neither_panics_nor_changes_what_pops() {
        let got = pops_over_hostile_heads(true);
        assert_eq!(got, pops_over_hostile_heads(false));
        let chain = |head: u16| {
            let seg = |addr, len| Segment {
                addr: GuestAddress(addr),
                len,
            };
            let segs = [seg(DATA, 64), seg(DATA + 4096, 128)];
            Ok(Some((head, vec![segs[head as usize]])))
        };
        let bad = Error::HeadOutOfRange { head: 8, size: 8 };
        let mut want: Vec<_> = (0..6).map(|k| chain(k % 2)).collect();
        want.extend([Ok(None), chain(0), chain(1), Err(bad.clone())]);
        want.push(Err(Error::Broken {
            reason: Box::new(bad),
        }));
        assert_eq!(got, want);
    }

    #[test]
    fn next_out_of_range_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, DATA, 64, NEXT, 12);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::NextOutOfRange {
                index: 0,
                next: 12,
                size: 8,
            },
        );
    }

    #[test]
    fn descriptor_loop_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, DATA, 64, NEXT, 1);
        p.write_desc(1, DATA, 64, NEXT, 0);
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::ChainLoop { head: 0, max: 8 });
    }

    #[test]
    fn buffer_outside_memory_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        let addr = MEM_SIZE as u64 - 10;
        p.write_desc(0, addr, 64, 0, 0);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::BufferOutOfMemory {
                index: 0,
                addr,
                len: 64,
            },
        );
    }

    #[test]
    fn buffer_with_wrapping_address_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, u64::MAX - 1, 64, 0, 0);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::BufferOutOfMemory {
                index: 0,
                addr: u64::MAX - 1,
                len: 64,
            },
        );
    }

    #[test]
    fn readable_after_writable_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, DATA, 64, NEXT | WRITE, 1);
        p.write_desc(1, DATA, 64, 0, 0);
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::ReadableAfterWritable { index: 1 });
    }

    #[test]
    fn indirect_without_the_feature_breaks_the_queue() {
        let mut p = pair(8, Features::EMPTY);
        p.write_desc(0, INDIRECT_BASE.0, 32, IND, 0);
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::IndirectNotNegotiated { index: 0 });
    }

    fn indirect_pair() -> Pair {
        pair(8, Features::RING_INDIRECT_DESC)
    }

    #[test]
    fn indirect_with_next_breaks_the_queue() {
        let mut p = indirect_pair();
        p.write_desc(0, INDIRECT_BASE.0, 32, IND | NEXT, 1);
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::IndirectWithNext { index: 0 });
    }

    #[test]
    fn indirect_length_not_a_multiple_of_16_breaks_the_queue() {
        for len in [0, 24] {
            let mut p = indirect_pair();
            p.write_desc(0, INDIRECT_BASE.0, len, IND, 0);
            p.publish(0, &[0]);
            assert_breaks(&mut p, Error::IndirectBadLength { index: 0, len });
        }
    }

    #[test]
    fn indirect_table_larger_than_the_queue_breaks_the_queue() {
        let mut p = indirect_pair();
        p.write_desc(0, INDIRECT_BASE.0, 16 * 9, IND, 0);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::IndirectTooLarge {
                index: 0,
                entries: 9,
                max: 8,
            },
        );
    }

    #[test]
    fn a_chain_of_more_than_1024_segments_breaks_the_queue() {
        // An indirect table of `n` one-byte buffers, each linked to the next.
        let table = |p: &Pair, n: u16| {
            for i in 0..n {
                let flags = if i + 1 < n { NEXT } else { 0 };
                let at = GuestAddress(INDIRECT_BASE.0 + 16 * i as u64);
                p.write_desc_at(at, DATA, 1, flags, i + 1);
            }
        };
        let max = crate::MAX_CHAIN_SEGMENTS as u16;
        let mut p = pair(2048, Features::RING_INDIRECT_DESC);
        table(&p, max);
        p.write_desc(0, INDIRECT_BASE.0, 16 * max as u32, IND, 0);
        p.publish(0, &[0]);
        let c = p.device.pop().unwrap().expect("1024 segments are fine");
        assert_eq!(c.readable().len(), max as usize);
        let mut p = pair(2048, Features::RING_INDIRECT_DESC);
        table(&p, max + 1);
        p.write_desc(0, INDIRECT_BASE.0, 16 * (max as u32 + 1), IND, 0);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::ChainTooLong {
                head: 0,
                max: max as usize,
            },
        );
    }

    #[test]
    fn indirect_table_outside_memory_breaks_the_queue() {
        let mut p = indirect_pair();
        let addr = MEM_SIZE as u64 - 16;
        p.write_desc(0, addr, 32, IND, 0);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::IndirectOutOfMemory {
                index: 0,
                addr,
                len: 32,
            },
        );
    }

    #[test]
    fn nested_indirect_breaks_the_queue() {
        let mut p = indirect_pair();
        p.write_desc(0, INDIRECT_BASE.0, 32, IND, 0);
        p.write_desc_at(INDIRECT_BASE, DATA, 64, NEXT, 1);
        p.write_desc_at(
            GuestAddress(INDIRECT_BASE.0 + 16),
            INDIRECT_BASE.0,
            16,
            IND,
            0,
        );
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::NestedIndirect { index: 1 });
    }

    #[test]
    fn indirect_loop_and_bad_next_break_the_queue() {
        let mut p = indirect_pair();
        p.write_desc(0, INDIRECT_BASE.0, 32, IND, 0);
        p.write_desc_at(INDIRECT_BASE, DATA, 64, NEXT, 1);
        p.write_desc_at(GuestAddress(INDIRECT_BASE.0 + 16), DATA, 64, NEXT, 0);
        p.publish(0, &[0]);
        assert_breaks(&mut p, Error::ChainLoop { head: 0, max: 2 });

        let mut p = indirect_pair();
        p.write_desc(0, INDIRECT_BASE.0, 32, IND, 0);
        p.write_desc_at(INDIRECT_BASE, DATA, 64, NEXT, 2);
        p.publish(0, &[0]);
        assert_breaks(
            &mut p,
            Error::NextOutOfRange {
                index: 0,
                next: 2,
                size: 2,
            },
        );
    }

    #[test]
    fn unaligned_indirect_table_is_read_by_copy() {
        let mut p = indirect_pair();
        let table = INDIRECT_BASE.0 + 4;
        p.write_desc(0, table, 32, IND, 0);
        p.write_desc_at(GuestAddress(table), DATA, 64, NEXT, 1);
        p.write_desc_at(GuestAddress(table + 16), DATA + 4096, 128, WRITE, 0);
        p.publish(0, &[0]);
        let c = p.device.pop().unwrap().unwrap();
        assert_eq!((c.readable_len(), c.writable_len()), (64, 128));
    }

    #[test]
    fn a_broken_queue_leaves_other_queues_working() {
        let mut bad = pair(8, Features::EMPTY);
        let mut good = pair(8, Features::EMPTY);
        bad.publish(0, &[9]);
        assert!(bad.device.pop().is_err());
        good.driver.add(&[buf(0, 1)], &[], 1).unwrap();
        assert!(good.device.pop().unwrap().is_some());
    }

    #[test]
    fn flag_mode_notifications_follow_the_flags() {
        let mut p = pair(8, Features::EMPTY);
        p.driver.add(&[buf(0, 1)], &[], 1).unwrap();
        assert!(
            p.driver.kick_prepare(),
            "device has not disabled notifications"
        );
        p.device.disable_notification();
        p.driver.add(&[buf(0, 1)], &[], 2).unwrap();
        assert!(!p.driver.kick_prepare(), "NO_NOTIFY is set");
        while let Some(c) = p.device.pop().unwrap() {
            p.device.add_used(c.head(), 0).unwrap();
        }
        assert!(p.device.needs_notification());
        p.driver.disable_cb();
        p.driver.add(&[buf(0, 1)], &[], 3).unwrap();
        let c = p.device.pop().unwrap().unwrap();
        p.device.add_used(c.head(), 0).unwrap();
        assert!(!p.device.needs_notification(), "NO_INTERRUPT is set");
        assert!(!p.device.enable_notification().unwrap());
        p.driver.add(&[buf(0, 1)], &[], 4).unwrap();
        assert!(p.driver.kick_prepare());
    }

    #[test]
    fn event_idx_kicks_only_when_avail_event_is_passed() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        p.driver.add(&[buf(0, 1)], &[], 1).unwrap();
        // avail_event starts at 0: the first add (0 -> 1) passes it.
        assert!(p.driver.kick_prepare());
        p.driver.add(&[buf(0, 1)], &[], 2).unwrap();
        assert!(!p.driver.kick_prepare(), "avail_event 0 already passed");
        p.device.pop().unwrap().unwrap();
        p.device.pop().unwrap().unwrap();
        assert!(!p.device.enable_notification().unwrap());
        p.driver.add(&[buf(0, 1)], &[], 3).unwrap();
        assert!(p.driver.kick_prepare(), "device asked at index 2");
    }

    #[test]
    fn event_idx_interrupts_only_when_used_event_is_passed() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        for i in 0..4 {
            p.driver.add(&[buf(0, 1)], &[], i).unwrap();
        }
        // Ask for an interrupt once 3/4 of the 4 in flight are used: used_event = 3.
        assert!(!p.driver.enable_cb_delayed());
        let mut heads = vec![];
        while let Some(c) = p.device.pop().unwrap() {
            heads.push(c.head());
        }
        p.device.add_used(heads[0], 0).unwrap();
        // The first decision has no history (signalled_used invalid): it notifies.
        assert!(p.device.needs_notification());
        p.device.add_used(heads[1], 0).unwrap();
        p.device.add_used(heads[2], 0).unwrap();
        assert!(
            !p.device.needs_notification(),
            "used 1 -> 3 does not pass used_event 3"
        );
        p.device.add_used(heads[3], 0).unwrap();
        assert!(
            p.device.needs_notification(),
            "used 3 -> 4 passes used_event 3"
        );
    }

    #[test]
    fn enable_notification_rechecks_the_ring() {
        let mut p = pair(8, Features::RING_EVENT_IDX);
        p.driver.add(&[buf(0, 1)], &[], 1).unwrap();
        // The device enables notifications with work already there: it must see it.
        assert_eq!(p.device.enable_notification(), Ok(true));
        assert_eq!(p.device.stats().enable_rechecks_hit, 1);
    }
}
