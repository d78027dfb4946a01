//! The transmit half of a queue pair (spec 5.1.6.2), as Linux's virtio_net since its 2011 event-index series:
//!
//! - capacity is checked before adding: the queue stops when fewer descriptors than a
//!   worst-case packet remain (or no buffer is free), and restarts from the completion path;
//! - completions are reclaimed in bounded amounts per transmit call ("limit xmit polling");
//! - while stopped, the completion interrupt is a delayed callback: one interrupt once 3/4 of
//!   what is in flight has completed, not one per frame; sooner when the device ran dry
//!   while the driver woke up ([`crate::cb_delay`]);
//! - the avail index is published on every add, the kick is decided once per burst.
//!
//! A queue's behaviour is one [`TxPolicy`], fixed when it is built. With the `experiments`
//! feature (for `virtnet bench`) the policy can also switch the first three off, to measure
//! what each buys, and `DriverConfig` can delay the avail index to the kick.

/// How a transmit queue works, fixed when it is built. The default is Linux's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxPolicy {
    /// The owner busy-polls [`TxQueue::reclaim`] while the queue is stopped, so stopping asks
    /// for no completion interrupt: the device is spared the eventfd writes.
    pub busy_poll: bool,
    /// Which of the event-index series' techniques are on (all, by default).
    #[cfg(feature = "experiments")]
    pub techniques: TxTechniques,
}

/// The techniques of Linux's event-index series that a measurement may switch off; off is the
/// driver before that series.
#[cfg(feature = "experiments")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxTechniques {
    /// On: while stopped, ask for the completion interrupt after 3/4 of what is in flight.
    /// Off: completion interrupts stay enabled (re-armed at the next completion on every flush
    /// and stop), so the owner should read the call eventfd (`ack_interrupt`) after each burst.
    pub delayed_callbacks: bool,
    /// With delayed callbacks: adapt the delay to the wake-up ([`crate::cb_delay`]). Off:
    /// always 3/4, as seed 002.
    pub adaptive_delay: bool,
    /// On: stop while a worst-case packet still fits. Off: no capacity check before adding; a
    /// frame that finds the ring full is not sent (counted in `ring_full`, [`TxQueue::send`]
    /// returns false as Linux's NETDEV_TX_BUSY, for the caller to retry), the queue stops
    /// then, and restarts as soon as one frame fits again.
    pub capacity_stop: bool,
    /// On: reclaim at most [`TX_RECLAIM_BUDGET`] completions per transmit call, and only when
    /// short of room. Off: every transmit call first reclaims every completion published.
    pub bounded_reclaim: bool,
}

#[cfg(feature = "experiments")]
impl Default for TxTechniques {
    fn default() -> Self {
        TxTechniques {
            delayed_callbacks: true,
            adaptive_delay: true,
            capacity_stop: true,
            bounded_reclaim: true,
        }
    }
}

impl TxPolicy {
    /// This policy, with the owner busy-polling (or not).
    pub fn with_busy_poll(mut self, on: bool) -> TxPolicy {
        self.busy_poll = on;
        self
    }

    #[inline]
    fn delayed_callbacks(&self) -> bool {
        #[cfg(feature = "experiments")]
        return self.techniques.delayed_callbacks;
        #[cfg(not(feature = "experiments"))]
        true
    }
    #[inline]
    fn adaptive_delay(&self) -> bool {
        #[cfg(feature = "experiments")]
        return self.techniques.adaptive_delay;
        #[cfg(not(feature = "experiments"))]
        true
    }
    #[inline]
    fn capacity_stop(&self) -> bool {
        #[cfg(feature = "experiments")]
        return self.techniques.capacity_stop;
        #[cfg(not(feature = "experiments"))]
        true
    }
    #[inline]
    fn bounded_reclaim(&self) -> bool {
        #[cfg(feature = "experiments")]
        return self.techniques.bounded_reclaim;
        #[cfg(not(feature = "experiments"))]
        true
    }
}

use std::sync::Arc;

use virtnet_sys::PeerEventFd;
use vring::{Buf, DriverQueue, GuestAddress, GuestMemory};

use super::cb_delay::CallbackDelay;
use super::counters::QueueCounters;
use super::offload::{self, TxOffloads};
use super::{ring_error, BufPool, DriverError};
use crate::frontend::{Allocator, FrontendError, QueueSetup};
use vnet::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_NONE};

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
    kick: PeerEventFd,
    call: PeerEventFd,
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
    /// IN_ORDER: buffers are taken oldest first, as the ring takes descriptors, so each
    /// descriptor keeps the buffer it had and is not rewritten (nor, with a tagged frame, the
    /// buffer). Otherwise the newest, whose lines are likeliest still in our cache.
    fifo_buffers: bool,
    policy: TxPolicy,
    /// A stopped queue restarts once this many descriptors are free.
    wake_at: u16,
    /// How many completions a stopped queue waits for before its interrupt, and how many
    /// chains were in flight when it last asked.
    cb_delay: CallbackDelay,
    cb_asked_at: u16,
    pub counters: Arc<QueueCounters>,
}

impl TxQueue {
    /// The tx queue of pair 0 (virtqueue 1), with one `buf_len`-byte buffer per descriptor,
    /// working as Linux's.
    pub fn new(
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<TxQueue, DriverError> {
        TxQueue::with_vq(1, setup, mem, alloc, buf_len, TxPolicy::default())
    }

    /// The tx queue at virtqueue index `vq` (2 * pair + 1), working by `policy`.
    pub fn with_vq(
        vq: u16,
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
        policy: TxPolicy,
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
            hdr_len: vnet::hdr_len(features),
            offloads: TxOffloads::from_features(features),
            reclaim_below: (2 * TX_RECLAIM_BUDGET as u16)
                .min(size / 2)
                .max(TX_WORST_CASE_DESCS.min(size)),
            slot_hdr: vec![None; size as usize],
            slot_tag: vec![None; size as usize],
            stopped: false,
            pending_kick: false,
            fifo_buffers: features.contains(vring::Features::IN_ORDER),
            policy,
            wake_at: TX_WORST_CASE_DESCS.min(size),
            cb_delay: CallbackDelay::new(),
            cb_asked_at: 0,
            counters: Arc::new(QueueCounters::default()),
        };
        // Completions are reclaimed from the transmit path; interrupts only while stopped.
        q.q.disable_cb();
        Ok(q)
    }

    pub fn vq(&self) -> u16 {
        self.vq
    }

    fn enable_completion_cb(&mut self) -> bool {
        if self.policy.delayed_callbacks() {
            self.cb_asked_at = self.q.in_flight();
            if self.policy.adaptive_delay() {
                self.q
                    .enable_cb_after(self.cb_delay.wait_for(self.cb_asked_at))
            } else {
                self.q.enable_cb_delayed()
            }
        } else {
            self.q.enable_cb()
        }
    }

    pub fn policy(&self) -> TxPolicy {
        self.policy
    }

    /// Publishes the avail index once per burst ([`TxQueue::flush`]) instead of on every
    /// frame. Linux's event-index series made every add publish, which lets a sleeping device
    /// start early; a device that polls the ring pays a cache-line transfer per frame for it.
    /// Set by `NetDriver` when it builds the queue.
    #[cfg(feature = "experiments")]
    pub(crate) fn set_avail_per_burst(&mut self, on: bool) {
        self.q.set_publish_on_kick(on);
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }
    pub fn call_fd(&self) -> &PeerEventFd {
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
            // The device only read a tx chain: its used length says nothing we need, and
            // with IN_ORDER no used element is read at all.
            match self.q.get_used_token() {
                Ok(Some(slot)) => {
                    // The engine checked the id against its own in-flight table and gave back
                    // our token: `slot` is one of ours.
                    self.pool.free.push_back(slot);
                    n += 1;
                }
                Ok(None) => break,
                Err(e) => return Err(ring_error(self.vq, &self.counters, e)),
            }
        }
        self.counters.completed.add(n as u64);
        if self.stopped && self.can_wake() {
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

    /// Whether a stopped queue may restart: with capacity stop/wake, once `wake_at`
    /// descriptors and a worst-case packet's room are free; without, once one frame fits.
    fn can_wake(&self) -> bool {
        if self.policy.capacity_stop() {
            self.q.num_free() >= self.wake_at && self.has_room()
        } else {
            self.q.num_free() > 0 && !self.pool.free.is_empty()
        }
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
        if !self.policy.bounded_reclaim() {
            // Before the event-index series: every transmit first frees everything completed.
            self.reclaim(usize::MAX)?;
        } else if self.q.num_free() < self.reclaim_below || self.stopped {
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
        let slot = if self.fifo_buffers {
            self.pool.free.pop_front()
        } else {
            self.pool.free.pop_back()
        };
        let Some(slot) = slot else {
            // One buffer per descriptor: no buffer left means the ring is full. With capacity
            // stop/wake the queue stopped before this could happen.
            return self.ring_full();
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
            if self.fifo_buffers {
                self.pool.free.push_front(slot);
            } else {
                self.pool.free.push_back(slot);
            }
            if let vring::Error::QueueFull { .. } = e {
                return self.ring_full();
            }
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
        if self.policy.capacity_stop() && !self.has_room() {
            self.stop()?;
        }
        Ok(true)
    }

    /// The frame found the ring full: it is not sent, and the queue stops until completions
    /// free room (the caller sends the frame again then).
    fn ring_full(&mut self) -> Result<bool, DriverError> {
        self.counters.ring_full.add(1);
        self.stop()?;
        Ok(false)
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
    /// (delayed callback; sooner while the device runs dry before the driver is up, see
    /// [`crate::cb_delay`]); if that many already did, reclaims and restarts at once.
    fn stop(&mut self) -> Result<(), DriverError> {
        self.stopped = true;
        self.counters.stops.add(1);
        self.flush();
        if self.policy.busy_poll {
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
            if self.kick.signal().is_err() {
                self.counters.kick_errors.add(1);
            }
            self.counters.kicks.add(1);
        }
        if !self.policy.delayed_callbacks() && !self.policy.busy_poll {
            // Before the event-index series: tx completion interrupts stay enabled (at the
            // next completion).
            self.q.enable_cb();
        }
    }

    /// Blocks until the stopped queue can send again, or `timeout_ms` passes (negative:
    /// forever). Returns whether it is running.
    pub fn wait_wake(&mut self, timeout_ms: i32) -> Result<bool, DriverError> {
        if !self.stopped {
            return Ok(true);
        }
        let interrupted = crate::wait_readable(&self.call, timeout_ms) && self.ack_interrupt();
        self.reclaim(usize::MAX)?;
        if interrupted && self.policy.delayed_callbacks() && self.policy.adaptive_delay() {
            // What the device still had to do once we were up: nothing means it waited for us.
            self.cb_delay.woke(self.cb_asked_at, self.q.in_flight());
        }
        if self.stopped && self.enable_completion_cb() {
            self.reclaim(usize::MAX)?;
        }
        Ok(!self.stopped)
    }

    /// Reads the call eventfd and counts an interrupt if one was pending.
    pub fn ack_interrupt(&mut self) -> bool {
        let fired = self.call.take().is_ok_and(|n| n > 0);
        if fired {
            self.counters.interrupts.add(1);
        }
        fired
    }

    /// Takes back every frame in flight without the device, for a device that is gone (the
    /// connection to it lost): the buffers return to the pool and the ring is empty, as
    /// after activation. Returns how many frames were abandoned (counted in `abandoned`).
    pub fn abandon(&mut self) -> usize {
        let slots = self.q.detach_unused();
        let n = slots.len();
        self.pool.free.extend(slots);
        self.stopped = false;
        self.pending_kick = false;
        self.counters.abandoned.add(n as u64);
        n
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hand_built;
    use vring::{DeviceQueue, Features};

    /// A tx queue of `size` with a device side we drive by hand.
    struct Rig {
        tx: TxQueue,
        device: DeviceQueue,
    }

    fn rig(size: u16) -> Rig {
        rig_with(size, TxPolicy::default())
    }

    fn rig_with(size: u16, policy: TxPolicy) -> Rig {
        let features = Features::VERSION_1 | Features::RING_EVENT_IDX;
        let (mem, setup, mut alloc) = hand_built(1, size, features);
        let tx = TxQueue::with_vq(1, &setup, &mem, &mut alloc, 256, policy).unwrap();
        let device = DeviceQueue::activate(&setup.config, mem, vring::RingPosition::START).unwrap();
        Rig { tx, device }
    }

    impl Rig {
        /// Sends frames until the queue refuses one; returns how many it took.
        fn fill(&mut self) -> usize {
            let mut sent = 0;
            while self.tx.send(&[0u8; 60], NetHdr::default()).unwrap() {
                sent += 1;
            }
            sent
        }

        /// The device completes `n` frames and publishes them.
        fn complete(&mut self, n: usize) {
            for _ in 0..n {
                let c = self.device.pop().unwrap().expect("a frame in flight");
                self.device.add_used(c.head(), 0).unwrap();
            }
            self.device.flush();
        }
    }

    #[test]
    fn in_order_reuses_descriptors_and_buffers_in_ring_order() {
        // Irregular bursts and completions over many laps of a 64-entry ring: with IN_ORDER,
        // descriptor i always carries the same buffer and sits at avail slot i, so once every
        // slot has been used neither the table nor the avail ring is ever written again.
        let features = Features::VERSION_1 | Features::RING_EVENT_IDX | Features::IN_ORDER;
        let (mem, setup, mut alloc) = hand_built(1, 64, features);
        let mut tx = TxQueue::new(&setup, &mem, &mut alloc, 256).unwrap();
        let mut device =
            DeviceQueue::activate(&setup.config, mem.clone(), vring::RingPosition::START).unwrap();
        let rings = setup.config.rings();
        let snapshot = || {
            let mut b = vec![0u8; 64 * 16 + 2 * 64];
            mem.read(rings.desc, &mut b[..64 * 16]).unwrap();
            mem.read(GuestAddress(rings.avail.0 + 4), &mut b[64 * 16..])
                .unwrap();
            b
        };
        let mut first = None;
        for round in 0..200usize {
            let mut sent = 0;
            while sent < 1 + round % 37 && tx.send_tagged(&[7u8; 60], NetHdr::default(), 1).unwrap()
            {
                sent += 1;
            }
            tx.flush();
            for _ in 0..1 + round % 23 {
                let Some(c) = device.pop().unwrap() else {
                    break;
                };
                device.add_used(c.head(), 0).unwrap();
            }
            device.flush();
            tx.reclaim(usize::MAX).unwrap();
            if tx.counters.packets.get() >= 64 {
                let now = snapshot();
                assert_eq!(
                    first.get_or_insert_with(|| now.clone()),
                    &now,
                    "round {round}"
                );
            }
        }
        assert!(tx.counters.packets.get() > 20 * 64, "many laps");
        // A tx completion needs no used length: with IN_ORDER none of the elements this
        // device wrote was read, the used index told it all.
        let stats = tx.ring().stats();
        assert_eq!(stats.used_inferred, stats.used);
        assert_eq!(stats.used, tx.counters.completed.get());
    }

    /// A policy with the event-index series' techniques as given.
    #[cfg(feature = "experiments")]
    fn with(f: impl FnOnce(&mut TxTechniques)) -> TxPolicy {
        let mut p = TxPolicy::default();
        f(&mut p.techniques);
        p
    }

    #[cfg(feature = "experiments")]
    #[test]
    fn delayed_callbacks_ask_for_an_interrupt_after_three_quarters_in_flight() {
        for delayed in [true, false] {
            let mut r = rig_with(64, with(|t| t.delayed_callbacks = delayed));
            // The device's first decision after activation always notifies: take it now.
            r.device.needs_notification();
            // The queue stops full, asking for its completion interrupt.
            let sent = r.fill() as u16;
            assert!(r.tx.is_stopped());
            let first = (1..=sent).find(|_| {
                r.complete(1);
                r.device.needs_notification()
            });
            let expected = if delayed { sent * 3 / 4 + 1 } else { 1 };
            assert_eq!(first, Some(expected), "delayed {delayed}");
        }
    }

    #[test]
    fn a_device_that_ran_dry_while_the_driver_woke_is_interrupted_sooner() {
        let mut r = rig(64);
        r.device.needs_notification();
        let mut asked = Vec::new();
        for _ in 0..3 {
            let sent = r.fill() as u16;
            assert!(r.tx.is_stopped());
            let first = (1..=sent)
                .find(|_| {
                    r.complete(1);
                    r.device.needs_notification()
                })
                .expect("an interrupt");
            asked.push((sent, first));
            // The device finishes everything before the driver is up: it ran dry.
            r.complete((sent - first) as usize);
            r.tx.call_fd().signal().unwrap();
            assert!(r.tx.wait_wake(0).unwrap(), "running again");
            assert_eq!(r.tx.in_flight(), 0);
        }
        let at = |eighths: u16| asked[0].0 * eighths / 8 + 1;
        assert_eq!(
            asked,
            [
                (asked[0].0, at(6)),
                (asked[0].0, at(5)),
                (asked[0].0, at(4))
            ]
        );
        assert_eq!(r.tx.counters.interrupts.get(), 3);
    }

    /// Fills an eventfd's counter to its maximum, 2^64 - 2: the next write would overflow.
    fn fill_counter(e: &PeerEventFd) {
        e.to_eventfd().unwrap().write(u64::MAX - 1).unwrap();
    }

    #[test]
    fn a_kick_the_device_cannot_take_is_counted() {
        let features = Features::VERSION_1;
        let (mem, setup, mut alloc) = hand_built(1, 64, features);
        let mut tx = TxQueue::new(&setup, &mem, &mut alloc, 256).unwrap();
        // An eventfd one short of its limit refuses the next write (EAGAIN).
        fill_counter(&setup.kick);
        assert!(tx.send(&[0u8; 60], NetHdr::default()).unwrap());
        tx.flush();
        assert_eq!(
            (tx.counters.kicks.get(), tx.counters.kick_errors.get()),
            (1, 1)
        );
        setup.kick.take().unwrap();
        assert!(tx.send(&[0u8; 60], NetHdr::default()).unwrap());
        tx.flush();
        assert_eq!(
            (tx.counters.kicks.get(), tx.counters.kick_errors.get()),
            (2, 1)
        );
    }

    #[test]
    fn a_kick_fd_the_backend_makes_block_stalls_the_driver_once_not_on_every_kick() {
        use std::os::fd::AsFd;
        use std::time::{Duration, Instant};
        let features = Features::VERSION_1;
        let (mem, setup, mut alloc) = hand_built(1, 64, features);
        let mut tx = TxQueue::new(&setup, &mem, &mut alloc, 256).unwrap();
        // The backend clears O_NONBLOCK on the shared description and fills the counter.
        fill_counter(&setup.kick);
        virtnet_sys::set_nonblocking(setup.kick.as_fd(), false).unwrap();
        let started = Instant::now();
        assert!(tx.send(&[0u8; 60], NetHdr::default()).unwrap());
        tx.flush();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the watchdog freed it"
        );
        assert_eq!(tx.counters.kick_errors.get(), 1);
        // The next kicks fail at once.
        let started = Instant::now();
        for _ in 0..3 {
            assert!(tx.send(&[0u8; 60], NetHdr::default()).unwrap());
            tx.flush();
        }
        assert!(started.elapsed() < Duration::from_millis(200));
        assert!(tx.counters.kick_errors.get() >= 2);
    }

    #[test]
    fn capacity_stop_stops_while_a_worst_case_packet_still_fits() {
        let mut r = rig(64);
        let sent = r.fill();
        // Stopped after the send that left fewer than a worst-case packet's descriptors.
        assert_eq!(sent, 64 - TX_WORST_CASE_DESCS as usize + 1);
        assert!(r.tx.is_stopped());
        assert_eq!(r.tx.ring().num_free(), TX_WORST_CASE_DESCS - 1);
        assert_eq!(r.tx.counters.stops, 1);
        assert_eq!(r.tx.counters.ring_full, 0);
    }

    #[cfg(feature = "experiments")]
    #[test]
    fn without_capacity_stop_a_frame_finds_the_ring_full() {
        let mut r = rig_with(64, with(|t| t.capacity_stop = false));
        let sent = r.fill();
        // Every descriptor used; the next frame found the ring full and was not sent.
        assert_eq!(sent, 64);
        assert_eq!(r.tx.ring().num_free(), 0);
        assert!(r.tx.is_stopped());
        assert_eq!(r.tx.counters.ring_full, 1);
        assert_eq!(r.tx.counters.stops, 1);
        assert_eq!(r.tx.counters.packets, 64);
        // One completion is enough to restart: the queue wakes as soon as a frame fits.
        r.complete(1);
        r.tx.reclaim(usize::MAX).unwrap();
        assert!(!r.tx.is_stopped());
        assert!(r.tx.send(&[0u8; 60], NetHdr::default()).unwrap());
    }

    #[cfg(feature = "experiments")]
    #[test]
    fn bounded_reclaim_takes_at_most_a_budget_per_send() {
        for bounded in [true, false] {
            let mut r = rig_with(128, with(|t| t.bounded_reclaim = bounded));
            for _ in 0..100 {
                assert!(r.tx.send(&[0u8; 60], NetHdr::default()).unwrap());
            }
            r.complete(100);
            assert_eq!(r.tx.counters.completed, 0, "bounded {bounded}");
            assert!(r.tx.send(&[0u8; 60], NetHdr::default()).unwrap());
            let expected = if bounded {
                TX_RECLAIM_BUDGET as u64
            } else {
                100
            };
            assert_eq!(r.tx.counters.completed, expected, "bounded {bounded}");
        }
    }
}
