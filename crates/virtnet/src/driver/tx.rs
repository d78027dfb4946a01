//! The transmit half of a queue pair (spec 5.1.6.2), as Linux's virtio_net after seed 002:
//!
//! - capacity is checked before adding: the queue stops when fewer descriptors than a
//!   worst-case packet remain (or no buffer is free), and restarts from the completion path;
//! - completions are reclaimed in bounded amounts per transmit call ("limit xmit polling");
//! - while stopped, the completion interrupt is a delayed callback (`enable_cb_delayed`): one
//!   interrupt once 3/4 of what is in flight has completed, not one per frame;
//! - the avail index is published on every add, the kick is decided once per burst.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;
use vring::{Buf, DriverQueue, GuestAddress, GuestMemory};

use super::counters::QueueCounters;
use super::offload::{self, TxOffloads};
use super::{ring_error, BufPool, DriverError};
use crate::frontend::{Allocator, FrontendError, QueueSetup};
use crate::net::{self, NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_NONE};

/// Descriptors a worst-case packet needs: Linux's `2 + MAX_SKB_FRAGS`.
pub const TX_WORST_CASE_DESCS: u16 = 2 + 17;
/// Completions reclaimed per transmit call ("limit xmit polling").
pub const TX_RECLAIM_BUDGET: usize = 32;

/// The transmit half of a queue pair.
#[derive(Debug)]
pub struct TxQueue {
    vq: u16,
    q: DriverQueue<u16>,
    pool: BufPool,
    mem: Arc<GuestMemory>,
    kick: EventFd,
    call: EventFd,
    hdr_len: usize,
    offloads: TxOffloads,
    /// Reclaim from the transmit path only below this many free descriptors (two budgets'
    /// worth): reading the used index costs a cache-line transfer from a device that keeps
    /// writing it, worth paying once per budget of completions, not on every frame.
    reclaim_below: u16,
    /// The header last written into each buffer: an unchanged header is not written again.
    slot_hdr: Vec<Option<NetHdr>>,
    /// The caller's tag for the frame body last written into each buffer (see
    /// [`TxQueue::send_tagged`]).
    slot_tag: Vec<Option<u64>>,
    stopped: bool,
    pending_kick: bool,
    /// The owner polls instead of sleeping: never ask the device for an interrupt.
    busy_poll: bool,
    /// A stopped queue restarts once this many descriptors are free.
    wake_at: u16,
    /// Ask for the completion interrupt after 3/4 of what is in flight (seed 002's delayed
    /// callback, the default) rather than at the next completion (for `virtnet bench`).
    delayed_cb: bool,
    pub counters: Arc<QueueCounters>,
}

impl TxQueue {
    /// The tx queue of pair 0 (virtqueue 1), with one `buf_len`-byte buffer per descriptor.
    pub fn new(
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<TxQueue, DriverError> {
        TxQueue::with_vq(1, setup, mem, alloc, buf_len)
    }

    /// The tx queue at virtqueue index `vq` (2 * pair + 1).
    pub fn with_vq(
        vq: u16,
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<TxQueue, DriverError> {
        let q = DriverQueue::activate(&setup.config, mem.clone(), setup.indirect)
            .map_err(|source| DriverError::Ring { vq, source })?;
        let size = setup.config.size();
        let pool = BufPool::new(alloc, size, buf_len)?;
        let features = setup.config.features();
        let mut q = TxQueue {
            vq,
            q,
            pool,
            mem: mem.clone(),
            kick: setup.kick.try_clone().map_err(FrontendError::from)?,
            call: setup.call.try_clone().map_err(FrontendError::from)?,
            hdr_len: net::hdr_len(features),
            offloads: TxOffloads::from_features(features),
            reclaim_below: (2 * TX_RECLAIM_BUDGET as u16)
                .min(size / 2)
                .max(TX_WORST_CASE_DESCS.min(size)),
            slot_hdr: vec![None; size as usize],
            slot_tag: vec![None; size as usize],
            stopped: false,
            pending_kick: false,
            busy_poll: false,
            delayed_cb: true,
            wake_at: TX_WORST_CASE_DESCS.min(size),
            counters: Arc::new(QueueCounters::default()),
        };
        // Completions are reclaimed from the transmit path; interrupts only while stopped.
        q.q.disable_cb();
        Ok(q)
    }

    pub fn vq(&self) -> u16 {
        self.vq
    }

    /// Publishes the avail index once per burst ([`TxQueue::flush`]) instead of on every
    /// frame. Seed 002 made every add publish, which lets a sleeping device start early; a
    /// device that polls the ring instead pays a cache-line transfer per frame for it. Off by
    /// default.
    pub fn set_avail_per_burst(&mut self, on: bool) {
        self.q.set_publish_on_kick(on);
    }

    /// The owner busy-polls [`TxQueue::reclaim`] while stopped, so stopping asks for no
    /// completion interrupt: the device is spared the eventfd writes.
    /// Delayed completion callbacks on (the default) or off. Off is the driver before seed
    /// 002: completion interrupts stay enabled (re-armed at the next completion on every flush
    /// and stop), so the owner should read the call eventfd (`ack_interrupt`) after each burst.
    /// For measurements.
    pub fn set_delayed_callbacks(&mut self, on: bool) {
        self.delayed_cb = on;
    }

    fn enable_completion_cb(&mut self) -> bool {
        if self.delayed_cb {
            self.q.enable_cb_delayed()
        } else {
            self.q.enable_cb()
        }
    }

    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }

    /// Restarts a stopped queue only once `free` descriptors are free (at least a worst-case
    /// packet's): hysteresis, so that a polling owner sends in bursts instead of a frame
    /// per completion.
    pub fn set_wake_threshold(&mut self, free: u16) {
        let size = self.q.config().size();
        self.wake_at = free.clamp(TX_WORST_CASE_DESCS.min(size), size);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }
    pub fn ring(&self) -> &DriverQueue<u16> {
        &self.q
    }
    pub fn offloads(&self) -> TxOffloads {
        self.offloads
    }
    /// The largest frame one buffer takes.
    pub fn max_frame(&self) -> usize {
        self.pool.buf_len as usize - self.hdr_len
    }
    /// Frames handed to the device and not yet reclaimed.
    pub fn in_flight(&self) -> u16 {
        self.q.in_flight()
    }

    /// Reclaims up to `budget` completions and restarts a stopped queue that has room again;
    /// returns how many were reclaimed.
    pub fn reclaim(&mut self, budget: usize) -> Result<usize, DriverError> {
        let mut n = 0;
        while n < budget {
            match self.q.get_used() {
                Ok(Some((slot, _))) => {
                    // The engine checked the id against its own in-flight table and gave back
                    // our token: `slot` is one of ours.
                    self.pool.free.push(slot);
                    n += 1;
                }
                Ok(None) => break,
                Err(e) => return Err(ring_error(self.vq, &self.counters, e)),
            }
        }
        self.counters.completed.add(n as u64);
        if self.stopped && self.q.num_free() >= self.wake_at && self.has_room() {
            self.stopped = false;
            self.counters.wakes.add(1);
            self.q.disable_cb();
        }
        Ok(n)
    }

    fn has_room(&self) -> bool {
        self.q.num_free() >= TX_WORST_CASE_DESCS.min(self.q.config().size())
            && !self.pool.free.is_empty()
    }

    /// Queues one frame behind header `hdr`. Returns Ok(false) when the queue is stopped: the
    /// caller waits with [`TxQueue::wait_wake`] or polls [`TxQueue::reclaim`]. The frame is
    /// exposed to the device at once (avail index published); the kick waits for
    /// [`TxQueue::flush`], so a burst costs at most one kick.
    pub fn send(&mut self, frame: &[u8], hdr: NetHdr) -> Result<bool, DriverError> {
        self.send_inner(frame, hdr, None)
    }

    /// Like [`TxQueue::send`] for a frame the caller sends again and again: `tag` names its
    /// content, and a buffer that already holds the frame with that tag is not written again
    /// (the device only reads tx buffers). A traffic generator's frames then cost the
    /// descriptor only, as DPDK's txonly reuses its mbufs.
    pub fn send_tagged(
        &mut self,
        frame: &[u8],
        hdr: NetHdr,
        tag: u64,
    ) -> Result<bool, DriverError> {
        self.send_inner(frame, hdr, Some(tag))
    }

    fn send_inner(
        &mut self,
        frame: &[u8],
        hdr: NetHdr,
        tag: Option<u64>,
    ) -> Result<bool, DriverError> {
        if self.q.num_free() < self.reclaim_below || self.stopped {
            self.reclaim(TX_RECLAIM_BUDGET)?;
        }
        if self.stopped {
            return Ok(false);
        }
        if frame.len() > self.max_frame() {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.max_frame(),
            });
        }
        let Some(slot) = self.pool.free.pop() else {
            self.stop()?;
            return Ok(false);
        };
        let at = self.pool.addr(slot);
        let body = GuestAddress(at.0 + self.hdr_len as u64);
        // The buffer is ours alone to write (the device only reads tx buffers), so a header
        // equal to the one already there need not be copied again.
        let hdr_slot = &mut self.slot_hdr[slot as usize];
        let written = if *hdr_slot == Some(hdr) {
            Ok(())
        } else {
            *hdr_slot = Some(hdr);
            self.mem.write(at, &hdr.to_bytes()[..self.hdr_len])
        }
        .and_then(|()| {
            let tag_slot = &mut self.slot_tag[slot as usize];
            if tag.is_some() && *tag_slot == tag {
                return Ok(());
            }
            *tag_slot = tag;
            self.mem.write(body, frame)
        });
        let len = (self.hdr_len + frame.len()) as u32;
        if let Err(e) = written.and_then(|()| self.q.add(&[Buf::new(at, len)], &[], slot)) {
            self.slot_hdr[slot as usize] = None;
            self.slot_tag[slot as usize] = None;
            self.pool.free.push(slot);
            return Err(ring_error(self.vq, &self.counters, e));
        }
        self.pending_kick = true;
        self.counters.packets.add(1);
        self.counters.bytes.add(frame.len() as u64);
        if hdr.flags & HDR_F_NEEDS_CSUM != 0 {
            self.counters.csum_offloaded.add(1);
        }
        if hdr.gso_type != HDR_GSO_NONE {
            self.counters.gso_offloaded.add(1);
        }
        if !self.has_room() {
            self.stop()?;
        }
        Ok(true)
    }

    /// Like [`TxQueue::send`], with the header built from the negotiated offloads (checksum,
    /// and TSO with segments of `mss` bytes); the frame's checksum field is prepared for it.
    pub fn send_offloaded(
        &mut self,
        frame: &mut [u8],
        mss: Option<u16>,
    ) -> Result<bool, DriverError> {
        let hdr = offload::prepare(frame, self.offloads, mss);
        self.send(frame, hdr)
    }

    /// Stops the queue, asking for an interrupt once 3/4 of what is in flight completes
    /// (delayed callback); if that many already did, reclaims and restarts at once.
    fn stop(&mut self) -> Result<(), DriverError> {
        self.stopped = true;
        self.counters.stops.add(1);
        self.flush();
        if self.busy_poll {
            return Ok(());
        }
        if self.enable_completion_cb() {
            self.reclaim(usize::MAX)?;
        }
        Ok(())
    }

    /// Kicks the device if it asked for it, for the frames sent since the last flush.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.pending_kick) && self.q.kick_prepare() {
            let _ = self.kick.write(1);
            self.counters.kicks.add(1);
        }
        if !self.delayed_cb && !self.busy_poll {
            // Before seed 002: tx completion interrupts stay enabled (at the next completion).
            self.q.enable_cb();
        }
    }

    /// Blocks until the stopped queue can send again, or `timeout_ms` passes (negative:
    /// forever). Returns whether it is running.
    pub fn wait_wake(&mut self, timeout_ms: i32) -> Result<bool, DriverError> {
        if !self.stopped {
            return Ok(true);
        }
        if super::wait_readable(&self.call, timeout_ms) {
            self.ack_interrupt();
        }
        self.reclaim(usize::MAX)?;
        if self.stopped && self.enable_completion_cb() {
            self.reclaim(usize::MAX)?;
        }
        Ok(!self.stopped)
    }

    /// Reads the call eventfd and counts an interrupt if one was pending.
    pub fn ack_interrupt(&mut self) -> bool {
        let fired = self.call.read().is_ok();
        if fired {
            self.counters.interrupts.add(1);
        }
        fired
    }

    /// Reclaims everything the device has completed until nothing is in flight, for a clean
    /// stop; gives up after `timeout`. Returns whether the queue drained. It polls (every
    /// millisecond) rather than taking interrupts: a shutdown path, not a data path.
    pub fn drain(&mut self, timeout: std::time::Duration) -> Result<bool, DriverError> {
        self.flush();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.reclaim(usize::MAX)?;
            let drained = self.q.in_flight() == 0;
            if drained || std::time::Instant::now() >= deadline {
                return Ok(drained);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
