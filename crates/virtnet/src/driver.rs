//! The userspace virtio-net driver's data path (spec 5.1.6), the way Linux's virtio_net
//! drives a queue pair (seed 002):
//!
//! - tx checks capacity before adding, stops when fewer descriptors than a worst-case packet
//!   remain and restarts from the completion path; completions are reclaimed in bounded
//!   amounts per transmit call; tx completion interrupts use `enable_cb_delayed`;
//! - rx keeps the ring filled with buffers (mergeable when MRG_RXBUF is negotiated) and is
//!   processed NAPI-style: disable callbacks, poll up to a budget, enable and re-check.
//!
//! Frames are copied into and out of buffers in the frontend's own memory.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;
use vring::{Buf, DriverQueue, Error as RingError, Features, GuestAddress, GuestMemory};

use crate::frontend::{Allocator, FrontendError, QueueSetup};
use crate::net::{self, NetHdr};

/// Descriptors a worst-case packet needs: Linux's `2 + MAX_SKB_FRAGS`.
pub const TX_WORST_CASE_DESCS: u16 = 2 + 17;
/// Completions reclaimed per transmit call ("limit xmit polling").
pub const TX_RECLAIM_BUDGET: usize = 32;

/// Driver-side counters of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DriverCounters {
    pub packets: u64,
    pub bytes: u64,
    /// Kicks written to the backend.
    pub kicks: u64,
    /// Call eventfd reads that found a notification (interrupts).
    pub interrupts: u64,
    /// Times the tx queue stopped for lack of descriptors, and restarts.
    pub stops: u64,
    pub wakes: u64,
    /// Frames dropped: rx frames that were malformed (bad num_buffers or length).
    pub dropped: u64,
}

/// Packet buffers carved from frontend memory, one per token.
#[derive(Debug)]
struct BufPool {
    base: GuestAddress,
    buf_len: u32,
    free: Vec<u16>,
}

impl BufPool {
    fn new(alloc: &mut Allocator, count: u16, buf_len: u32) -> Result<BufPool, FrontendError> {
        let base = alloc.alloc(count as u64 * buf_len as u64, 64)?;
        Ok(BufPool {
            base,
            buf_len,
            free: (0..count).rev().collect(),
        })
    }
    fn addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.base.0 + slot as u64 * self.buf_len as u64)
    }
}

/// The transmit half of a queue pair.
#[derive(Debug)]
pub struct TxQueue {
    q: DriverQueue<u16>,
    pool: BufPool,
    mem: Arc<GuestMemory>,
    kick: EventFd,
    call: EventFd,
    hdr_len: usize,
    stopped: bool,
    pending_kick: bool,
    pub counters: DriverCounters,
}

impl TxQueue {
    pub fn new(
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<TxQueue, FrontendError> {
        let q = DriverQueue::activate(&setup.config, mem.clone(), setup.indirect)?;
        let pool = BufPool::new(alloc, setup.config.size(), buf_len)?;
        let mut q = TxQueue {
            q,
            pool,
            mem: mem.clone(),
            kick: setup.kick.try_clone()?,
            call: setup.call.try_clone()?,
            hdr_len: net::hdr_len(setup.config.features()),
            stopped: false,
            pending_kick: false,
            counters: DriverCounters::default(),
        };
        // Tx completions are reclaimed from the transmit path; interrupts only when stopped.
        q.q.disable_cb();
        Ok(q)
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

    /// Reclaims up to `budget` completions; returns how many.
    pub fn reclaim(&mut self, budget: usize) -> Result<usize, RingError> {
        let mut n = 0;
        while n < budget {
            match self.q.get_used()? {
                Some((slot, _)) => {
                    self.pool.free.push(slot);
                    n += 1;
                }
                None => break,
            }
        }
        if self.stopped && self.q.num_free() >= TX_WORST_CASE_DESCS && !self.pool.free.is_empty() {
            self.stopped = false;
            self.counters.wakes += 1;
            self.q.disable_cb();
        }
        Ok(n)
    }

    /// Queues one frame with header `hdr`. Returns Ok(false) when the queue is stopped (the
    /// caller waits for [`TxQueue::wait_wake`] or polls [`TxQueue::reclaim`]). The frame is
    /// exposed to the device at once (avail index published); the kick waits for
    /// [`TxQueue::flush`], so a burst costs at most one kick.
    pub fn send(&mut self, frame: &[u8], hdr: NetHdr) -> Result<bool, RingError> {
        self.reclaim(TX_RECLAIM_BUDGET)?;
        if self.stopped {
            return Ok(false);
        }
        let Some(slot) = self.pool.free.pop() else {
            self.stop()?;
            return Ok(false);
        };
        let len = (self.hdr_len + frame.len()).min(self.pool.buf_len as usize);
        let at = self.pool.addr(slot);
        self.mem.write(at, &hdr.to_bytes()[..self.hdr_len])?;
        self.mem.write(
            GuestAddress(at.0 + self.hdr_len as u64),
            &frame[..len - self.hdr_len],
        )?;
        self.q.add(&[Buf::new(at, len as u32)], &[], slot)?;
        self.pending_kick = true;
        self.counters.packets += 1;
        self.counters.bytes += frame.len() as u64;
        if self.q.num_free() < TX_WORST_CASE_DESCS || self.pool.free.is_empty() {
            self.stop()?;
        }
        Ok(true)
    }

    /// Stops the queue, asking for an interrupt once 3/4 of what is in flight completes
    /// (delayed callback); if that many already did, reclaims and restarts at once.
    fn stop(&mut self) -> Result<(), RingError> {
        self.stopped = true;
        self.counters.stops += 1;
        self.flush();
        if self.q.enable_cb_delayed() {
            self.reclaim(usize::MAX)?;
        }
        Ok(())
    }

    /// Kicks the device if it asked for it, for the frames sent since the last flush.
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.pending_kick) && self.q.kick_prepare() {
            let _ = self.kick.write(1);
            self.counters.kicks += 1;
        }
    }

    /// Blocks until the stopped queue can send again (or `timeout_ms` passes). Returns
    /// whether it is running.
    pub fn wait_wake(&mut self, timeout_ms: i32) -> Result<bool, RingError> {
        if !self.stopped {
            return Ok(true);
        }
        if wait_readable(&self.call, timeout_ms) && self.call.read().is_ok() {
            self.counters.interrupts += 1;
        }
        self.reclaim(usize::MAX)?;
        if self.stopped && self.q.enable_cb_delayed() {
            self.reclaim(usize::MAX)?;
        }
        Ok(!self.stopped)
    }
}

/// The receive half of a queue pair.
#[derive(Debug)]
pub struct RxQueue {
    q: DriverQueue<u16>,
    pool: BufPool,
    mem: Arc<GuestMemory>,
    kick: EventFd,
    call: EventFd,
    hdr_len: usize,
    mergeable: bool,
    pub counters: DriverCounters,
}

impl RxQueue {
    /// `buf_len`: 1536-byte buffers with MRG_RXBUF; without it, one buffer must hold the
    /// largest frame, so pass at least MTU + 14 + header.
    pub fn new(
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<RxQueue, FrontendError> {
        let q = DriverQueue::activate(&setup.config, mem.clone(), None)?;
        let pool = BufPool::new(alloc, setup.config.size(), buf_len)?;
        let features = setup.config.features();
        let mut rx = RxQueue {
            q,
            pool,
            mem: mem.clone(),
            kick: setup.kick.try_clone()?,
            call: setup.call.try_clone()?,
            hdr_len: net::hdr_len(features),
            mergeable: features.contains(Features::NET_MRG_RXBUF),
            counters: DriverCounters::default(),
        };
        rx.refill()?;
        Ok(rx)
    }

    pub fn call_fd(&self) -> &EventFd {
        &self.call
    }
    pub fn ring(&self) -> &DriverQueue<u16> {
        &self.q
    }

    /// Posts every free buffer; kicks if the device asked for it.
    pub fn refill(&mut self) -> Result<(), RingError> {
        let mut added = false;
        while self.q.num_free() > 0 {
            let Some(slot) = self.pool.free.pop() else {
                break;
            };
            self.q.add(
                &[],
                &[Buf::new(self.pool.addr(slot), self.pool.buf_len)],
                slot,
            )?;
            added = true;
        }
        if added && self.q.kick_prepare() {
            let _ = self.kick.write(1);
            self.counters.kicks += 1;
        }
        Ok(())
    }

    /// Takes the next received frame (header stripped) into `out`; None when nothing waits.
    pub fn recv(&mut self, out: &mut Vec<u8>) -> Result<Option<NetHdr>, RingError> {
        let Some((slot, len)) = self.q.get_used()? else {
            return Ok(None);
        };
        out.clear();
        let mut hdr_bytes = [0u8; net::HDR_LEN];
        let first = self.pool.addr(slot);
        let len = len as usize;
        let mut ok = len >= self.hdr_len;
        let mut buffers = 1u16;
        if ok {
            self.mem.read(first, &mut hdr_bytes[..self.hdr_len])?;
            let hdr = NetHdr::from_bytes(&hdr_bytes);
            if self.mergeable {
                buffers = hdr.num_buffers.max(1);
            }
            self.copy_out(first, self.hdr_len, len, out)?;
        }
        self.pool.free.push(slot);
        for _ in 1..buffers {
            match self.q.get_used()? {
                Some((slot, len)) => {
                    self.copy_out(self.pool.addr(slot), 0, len as usize, out)?;
                    self.pool.free.push(slot);
                }
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            self.counters.dropped += 1;
            return Ok(None);
        }
        self.counters.packets += 1;
        self.counters.bytes += out.len() as u64;
        Ok(Some(NetHdr::from_bytes(&hdr_bytes)))
    }

    fn copy_out(
        &self,
        at: GuestAddress,
        from: usize,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), RingError> {
        let len = len.min(self.pool.buf_len as usize);
        if len > from {
            let start = out.len();
            out.resize(start + len - from, 0);
            self.mem
                .read(GuestAddress(at.0 + from as u64), &mut out[start..])?;
        }
        Ok(())
    }

    /// NAPI-style poll: up to `budget` frames handed to `f`, refill, then enable callbacks
    /// and re-check. Returns the frames received; when it returns fewer than `budget`,
    /// callbacks are on and the caller may sleep on the call eventfd.
    pub fn poll(&mut self, budget: usize, mut f: impl FnMut(&[u8])) -> Result<usize, RingError> {
        self.q.disable_cb();
        let mut buf = Vec::with_capacity(2048);
        let mut n = 0;
        loop {
            while n < budget {
                match self.recv(&mut buf)? {
                    Some(_) => {
                        f(&buf);
                        n += 1;
                    }
                    None => break,
                }
            }
            self.refill()?;
            if n >= budget {
                return Ok(n);
            }
            // Enable and re-check: a frame that landed meanwhile must not wait for the next
            // interrupt.
            if !self.q.enable_cb() {
                return Ok(n);
            }
            self.q.disable_cb();
        }
    }

    /// Blocks until the call eventfd fires or `timeout_ms` passes; counts the interrupt.
    pub fn wait(&mut self, timeout_ms: i32) -> bool {
        let fired = wait_readable(&self.call, timeout_ms) && self.call.read().is_ok();
        if fired {
            self.counters.interrupts += 1;
        }
        fired
    }
}

/// Waits up to `timeout_ms` for `fd` to become readable.
pub fn wait_readable(fd: &EventFd, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    crate::sys::wait_readable(fd.as_raw_fd(), timeout_ms)
}
