//! The driver side's used ring: reclaiming the chains the device used (each used element
//! checked before it indexes anything of ours; with IN_ORDER, a batch reclaimed from one
//! element, in avail order), and asking for the device's interrupts (callbacks, delayed
//! callbacks; spec 2.7.10 and Linux's `virtqueue_enable_cb_delayed`).

use std::sync::atomic::Ordering::SeqCst;

use crate::sync::fence;

use super::DriverQueue;
use crate::error::Broken;
use crate::layout::AVAIL_F_NO_INTERRUPT;
use crate::Error;

impl<T> DriverQueue<T> {
    /// Whether the used ring holds entries not yet reclaimed.
    pub fn used_pending(&mut self) -> bool {
        self.last_used != self.used_cache || self.rings.used_idx_acquire() != self.last_used
    }

    /// Reclaims the next used chain: its token and the bytes the device wrote. Any bad used
    /// element (index, id, length; with IN_ORDER, an id out of order) breaks the queue.
    pub fn get_used(&mut self) -> Result<Option<(T, u32)>, Error> {
        self.broken.check()?;
        if self.last_used == self.used_cache && !self.refresh_used()? {
            return Ok(None);
        }
        let (head, len) = if self.in_order {
            self.next_in_order()?
        } else {
            let (id, len) = self.rings.used_elem(self.last_used & self.mask);
            self.check_used(id, len)?;
            (id as u16, len)
        };
        Ok(self.finish_used(head).map(|t| (t, len)))
    }

    /// Reclaims the next used chain when the caller needs its token only, not the length the
    /// device wrote (a transmit completion: the device only read the buffers). With IN_ORDER
    /// the used index alone says which chains are done, since the device uses them in avail
    /// order (spec 2.7.9), so no used element is read: the lines of the used ring stay in the
    /// device's cache rather than crossing to ours and back on every lap. Only what the index
    /// is checked for is checked (not past what is in flight); an id the device wrote out of
    /// order goes unseen, and with it nothing but the device's own view of buffers we reuse.
    /// Without IN_ORDER it is [`DriverQueue::get_used`].
    pub fn get_used_token(&mut self) -> Result<Option<T>, Error> {
        if !self.in_order {
            return Ok(self.get_used()?.map(|(t, _)| t));
        }
        self.broken.check()?;
        if self.last_used == self.used_cache && !self.refresh_used()? {
            return Ok(None);
        }
        let pos = self.last_used;
        // A batch that get_used began: this chain is in it, and may be its last.
        if self.batch_end.is_some_and(|(end, _)| end == pos) {
            self.batch_end = None;
        }
        self.stats.used_inferred += 1;
        let head = self.order[(pos & self.mask) as usize];
        Ok(self.finish_used(head))
    }

    /// Returns used chain `head` (the one at `last_used`) to the free list, moves past it and,
    /// with callbacks on, asks for the next; its token.
    fn finish_used(&mut self, head: u16) -> Option<T> {
        let token = self.detach(head);
        self.last_used = self.last_used.wrapping_add(1);
        self.stats.used += 1;
        if self.event_idx && self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT == 0 {
            // Callbacks are on: ask for the next one, and make that store visible before the
            // next used.idx read (pairs with the device's fence in needs_notification).
            self.rings.set_used_event(self.last_used);
            fence(SeqCst);
        }
        token
    }

    /// Reads `used.idx` into the cache, checked against what is in flight; whether used
    /// chains wait.
    fn refresh_used(&mut self) -> Result<bool, Error> {
        // Acquire pairs with the device's release store of used.idx (flush): the used
        // elements are visible once we see the index.
        let idx = self.rings.used_idx_acquire();
        if idx.wrapping_sub(self.last_used) > self.in_flight() {
            let size = self.config.size();
            return Err(self.broken.set(Error::UsedIdxOutOfRange {
                used_idx: idx,
                last_used: self.last_used,
                size,
            }));
        }
        self.used_cache = idx;
        Ok(idx != self.last_used)
    }

    /// Checks a used element read from the ring: an id in range, of a chain in flight, with a
    /// length within what the chain lets the device write. Returns the chain's avail position.
    fn check_used(&mut self, id: u32, len: u32) -> Result<u16, Error> {
        if id > self.mask as u32 {
            return Err(self.broken.set(Error::UsedIdOutOfRange {
                id,
                size: self.config.size(),
            }));
        }
        let slot = &self.slots[id as usize];
        if slot.token.is_none() {
            return Err(self.broken.set(Error::UsedIdNotInFlight { id }));
        }
        if len as u64 > slot.writable {
            let max = slot.full_len();
            return Err(self.broken.set(Error::UsedLenTooLarge { id, len, max }));
        }
        Ok(slot.pos)
    }

    /// IN_ORDER: the head and used length of the chain at `last_used` in avail order. Reads
    /// the used element there only when no batch is being reclaimed; a chain before its
    /// batch's last was used in full.
    ///
    /// Every chain exposed at an avail position from `last_used` on is in flight (chains are
    /// reclaimed only here, in that order), so `order` names a chain in flight, and an id in
    /// flight lies at or after `last_used`.
    fn next_in_order(&mut self) -> Result<(u16, u32), Error> {
        let pos = self.last_used;
        let head = self.order[(pos & self.mask) as usize];
        match self.batch_end {
            Some((end, len)) if end == pos => {
                self.batch_end = None;
                return Ok((head, len));
            }
            Some(_) => {
                self.stats.used_inferred += 1;
                return Ok((head, self.slots[head as usize].full_len()));
            }
            None => {}
        }
        let (id, len) = self.rings.used_elem(pos & self.mask);
        let end = self.check_used(id, len)?;
        // Chains after this one that the element covers, against those used.idx covers.
        let after = end.wrapping_sub(pos);
        let used = self.used_cache.wrapping_sub(pos);
        if after >= used {
            return Err(self.broken.set(Error::UsedIdOutOfOrder {
                id,
                batch: after as u32 + 1,
                used,
            }));
        }
        if after == 0 {
            debug_assert_eq!(head as u32, id, "order and slot positions agree");
            return Ok((head, len));
        }
        self.batch_end = Some((end, len));
        self.stats.used_inferred += 1;
        Ok((head, self.slots[head as usize].full_len()))
    }

    /// Used chains already seen by [`DriverQueue::get_used`] and not yet reclaimed (no read of
    /// `used.idx`): how far ahead [`DriverQueue::peek_used`] can look.
    pub fn used_seen(&self) -> u16 {
        self.used_cache.wrapping_sub(self.last_used)
    }

    /// The token of the used chain `ahead` places after the next one, without reclaiming it,
    /// for prefetching its buffer. A hint: a bad or unknown element gives `None` here and
    /// breaks the queue only when [`DriverQueue::get_used`] reaches it.
    pub fn peek_used(&self, ahead: u16) -> Option<&T> {
        if ahead >= self.used_seen() {
            return None;
        }
        let at = self.last_used.wrapping_add(ahead) & self.mask;
        if self.in_order {
            // No used element read: the order is ours.
            let head = self.order[at as usize];
            return self.slots[head as usize].token.as_ref();
        }
        let (id, _) = self.rings.used_elem(at);
        self.slots.get(id as usize)?.token.as_ref()
    }

    /// Returns chain `head` to the free list and takes its token.
    fn detach(&mut self, head: u16) -> Option<T> {
        let slot = &mut self.slots[head as usize];
        let token = slot.token.take();
        let mut last = head;
        for _ in 1..slot.ndescs {
            last = self.next[last as usize];
        }
        // The tail is kept in both orders, so the order may change at any time.
        if self.num_free == 0 {
            self.free_head = head;
            self.free_tail = last;
        } else if self.fifo {
            self.next[self.free_tail as usize] = head;
            self.free_tail = last;
        } else {
            self.next[last as usize] = self.free_head;
            self.free_head = head;
        }
        self.num_free += slot.ndescs;
        token
    }

    /// Asks the device not to send used-buffer notifications (the caller polls).
    pub fn disable_cb(&mut self) {
        if self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT != 0 {
            return;
        }
        self.avail_flags_shadow |= AVAIL_F_NO_INTERRUPT;
        if self.event_idx {
            // Move used_event as far as possible from where the used index is heading.
            self.rings
                .set_used_event(self.last_used.wrapping_add(0x8000));
        } else {
            self.rings.set_avail_flags(self.avail_flags_shadow);
        }
    }

    /// Asks for a notification at the next used entry, then re-checks. Returns whether used
    /// entries are already pending, in which case the caller must poll again rather than wait.
    pub fn enable_cb(&mut self) -> bool {
        let last_used = self.last_used;
        self.enable_cb_at(last_used, 0)
    }

    /// Like [`DriverQueue::enable_cb`], but asks for the notification only after 3/4 of the
    /// chains in flight are used (Linux's delayed callbacks, for tx completions). Returns
    /// whether more than that many are already pending.
    pub fn enable_cb_delayed(&mut self) -> bool {
        self.enable_cb_after((self.in_flight() as u32 * 3 / 4) as u16)
    }

    /// Like [`DriverQueue::enable_cb_delayed`] with the delay chosen by the caller: the
    /// notification comes with the used entry after the next `bufs`, that is once more than
    /// `bufs` chains are used. `bufs` is kept below what is in flight, so the last chain in
    /// flight always notifies: a used entry past them would never come while nothing more is
    /// added, and the driver would wait for good. Without EVENT_IDX there is no delay to ask
    /// for: the flag asks for the next one, as [`DriverQueue::enable_cb`]. Returns whether
    /// more than `bufs` are already pending.
    pub fn enable_cb_after(&mut self, bufs: u16) -> bool {
        let bufs = bufs.min(self.in_flight().saturating_sub(1));
        let event = self.last_used.wrapping_add(bufs);
        self.enable_cb_at(event, bufs)
    }

    fn enable_cb_at(&mut self, used_event: u16, bufs: u16) -> bool {
        if self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT != 0 {
            self.avail_flags_shadow &= !AVAIL_F_NO_INTERRUPT;
            if !self.event_idx {
                self.rings.set_avail_flags(self.avail_flags_shadow);
            }
        }
        if self.event_idx {
            self.rings.set_used_event(used_event);
        }
        // Full fence: the used_event/flags store must be visible before we re-read used.idx;
        // pairs with the device's fence in needs_notification between its used.idx store and
        // its used_event/flags load.
        fence(SeqCst);
        let pending = self.rings.used_idx_acquire().wrapping_sub(self.last_used) > bufs;
        if pending {
            self.stats.enable_rechecks_hit += 1;
        }
        pending
    }

    /// Takes back every chain in flight, for a reset: the device must be stopped. The queue
    /// is left empty, with the rings at index 0 as after `activate`.
    pub fn detach_unused(&mut self) -> Vec<T> {
        let tokens = self
            .slots
            .iter_mut()
            .filter_map(|s| s.token.take())
            .collect();
        let size = self.config.size();
        self.next = (1..=size).collect();
        self.free_head = 0;
        self.free_tail = size - 1;
        self.num_free = size;
        self.avail_idx_shadow = 0;
        self.num_added = 0;
        self.force_kick = false;
        self.last_used = 0;
        self.used_cache = 0;
        self.batch_end = None;
        self.broken = Broken::default();
        self.rings.set_avail_idx_release(0);
        self.rings.set_used_idx_release(0);
        tokens
    }
}
