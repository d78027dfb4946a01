//! The receive half of a queue pair (spec 5.1.6.3 and 5.1.6.4).
//!
//! The ring is kept full of buffers, in one of Linux virtio_net's three layouts: mergeable
//! buffers (MRG_RXBUF: a frame may span several, counted by `num_buffers`), big buffers
//! (no MRG_RXBUF but guest TSO: each buffer is a chain able to hold a 64 KiB frame), or small
//! buffers (one frame of at most the MTU per buffer).
//!
//! Processing is NAPI-style: the call eventfd fires, callbacks are disabled, up to a budget of
//! frames is taken, the ring refilled, and callbacks enabled again with a re-check, so that a
//! frame that lands meanwhile is not left waiting for an interrupt that will never come.

use std::sync::Arc;

use virtnet_sys::PeerEventFd;
use vnet::feature;
use vring::{Buf, DriverQueue, Features, GuestAddress, GuestMemory};

use super::counters::QueueCounters;
use super::dim::RxDim;
use super::{ring_error, BufPool, DriverError};
use crate::frontend::{Allocator, FrontendError, QueueSetup};
use vnet::NetHdr;

/// Used buffers whose headers are prefetched ahead of the one being taken.
const RX_PREFETCH: u16 = 8;

/// The largest frame a big buffer must hold: a 64 KiB IP datagram behind Ethernet and VLAN.
pub const MAX_GSO_FRAME: u32 = 65535 + 14 + 4;

/// How receive buffers are shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxLayout {
    /// MRG_RXBUF: `buf_len`-byte buffers, one descriptor each; a frame may span several.
    Mergeable { buf_len: u32 },
    /// One `buf_len`-byte buffer per frame (header included), one descriptor.
    Small { buf_len: u32 },
    /// A chain per frame: a header descriptor then `segs` descriptors of `seg_len` bytes,
    /// together able to hold [`MAX_GSO_FRAME`].
    Big { segs: u16, seg_len: u32 },
}

impl RxLayout {
    /// The layout Linux would pick for `features`: mergeable if negotiated, else big buffers
    /// if the device may send GSO frames, else small ones sized for `mtu`. Big chains have at
    /// most `max_chain` descriptors (an indirect table's capacity, and never more than the
    /// queue size).
    pub fn for_features(features: Features, mtu: u16, max_chain: u16) -> RxLayout {
        let hdr = vnet::hdr_len(features) as u32;
        if features.contains(feature::MRG_RXBUF) {
            return RxLayout::Mergeable { buf_len: 1536 };
        }
        let gso = feature::GUEST_TSO4 | feature::GUEST_TSO6 | feature::GUEST_UFO;
        if features.intersection(gso) != Features::EMPTY {
            let segs = max_chain.clamp(2, 64) - 1;
            let seg_len = MAX_GSO_FRAME.div_ceil(segs as u32).next_multiple_of(64);
            return RxLayout::Big { segs, seg_len };
        }
        // Header, Ethernet header, a VLAN tag and the MTU.
        RxLayout::Small {
            buf_len: hdr + 14 + 4 + mtu.max(1500) as u32,
        }
    }

    /// Descriptors one buffer takes when added directly.
    fn descs(&self) -> usize {
        match self {
            RxLayout::Big { segs, .. } => 1 + *segs as usize,
            _ => 1,
        }
    }

    fn bytes(&self, hdr_len: usize) -> u32 {
        match *self {
            RxLayout::Mergeable { buf_len } | RxLayout::Small { buf_len } => buf_len,
            RxLayout::Big { segs, seg_len } => hdr_len as u32 + segs as u32 * seg_len,
        }
    }
}

/// The receive half of a queue pair.
#[derive(Debug)]
pub struct RxQueue {
    vq: u16,
    q: DriverQueue<u16>,
    pool: BufPool,
    layout: RxLayout,
    mem: Arc<GuestMemory>,
    kick: PeerEventFd,
    call: PeerEventFd,
    hdr_len: usize,
    scratch: Vec<Buf>,
    frame: Vec<u8>,
    dim: Option<RxDim>,
    /// Used buffers past the next one whose headers are already prefetched.
    prefetched: u16,
    pub counters: Arc<QueueCounters>,
}

/// How [`RxQueue::poll`] waits for more frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// As Linux's NAPI: enable callbacks and re-check at the end, for an owner that sleeps on
    /// the call eventfd.
    Napi,
    /// Callbacks stay off: the owner polls again and never sleeps.
    Busy,
}

/// Where [`RxQueue::poll`] puts the frames it receives.
pub trait Sink {
    /// Whether the frames' bytes are copied out (else they are only counted).
    const COPY: bool;
    /// One frame, header stripped (only called when `COPY`).
    fn frame(&mut self, frame: &[u8]);
}

/// Frames are counted, not copied.
#[derive(Clone, Copy, Debug, Default)]
pub struct Count;

impl Sink for Count {
    const COPY: bool = false;
    fn frame(&mut self, _: &[u8]) {}
}

/// Each frame goes to the closure.
#[derive(Debug)]
pub struct Frames<F>(pub F);

impl<F: FnMut(&[u8])> Sink for Frames<F> {
    const COPY: bool = true;
    fn frame(&mut self, frame: &[u8]) {
        (self.0)(frame)
    }
}

impl RxQueue {
    /// The rx queue of pair 0 (virtqueue 0) with `buf_len`-byte buffers: mergeable ones if
    /// MRG_RXBUF is negotiated, else one buffer per frame, which must then hold the largest
    /// frame and its header.
    pub fn new(
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        buf_len: u32,
    ) -> Result<RxQueue, DriverError> {
        let layout = if setup.config.features().contains(feature::MRG_RXBUF) {
            RxLayout::Mergeable { buf_len }
        } else {
            RxLayout::Small { buf_len }
        };
        RxQueue::with_layout(0, setup, mem, alloc, layout)
    }

    /// The rx queue at virtqueue index `vq` (2 * pair), with `layout` buffers, filled.
    pub fn with_layout(
        vq: u16,
        setup: &QueueSetup,
        mem: &Arc<GuestMemory>,
        alloc: &mut Allocator,
        layout: RxLayout,
    ) -> Result<RxQueue, DriverError> {
        let q = DriverQueue::activate(&setup.config, mem.clone(), setup.indirect)
            .map_err(|source| DriverError::Ring { vq, source })?;
        let features = setup.config.features();
        let hdr_len = vnet::hdr_len(features);
        let size = setup.config.size();
        let descs = layout.descs();
        if descs > size as usize {
            return Err(DriverError::Ring {
                vq,
                source: vring::Error::QueueFull {
                    needed: descs,
                    free: size,
                },
            });
        }
        // Buffers that fit the ring at once: all of them when each takes one descriptor.
        let count = if q.uses_indirect(descs) || descs == 1 {
            size
        } else {
            size / descs as u16
        };
        let pool = BufPool::new(alloc, count, layout.bytes(hdr_len))?;
        let mut rx = RxQueue {
            vq,
            q,
            pool,
            layout,
            mem: mem.clone(),
            kick: setup.kick.try_clone().map_err(FrontendError::from)?,
            call: setup.call.try_clone().map_err(FrontendError::from)?,
            hdr_len,
            scratch: Vec::with_capacity(descs),
            frame: Vec::with_capacity(2048),
            dim: None,
            prefetched: 0,
            counters: Arc::new(QueueCounters::default()),
        };
        // Buffers go back in the order the device used them, each to the descriptor it had:
        // an in-order device then finds every descriptor and avail entry as it left them.
        rx.q.set_fifo_reuse(true);
        rx.refill()?;
        Ok(rx)
    }

    pub fn vq(&self) -> u16 {
        self.vq
    }
    pub fn layout(&self) -> RxLayout {
        self.layout
    }
    pub fn call_fd(&self) -> &PeerEventFd {
        &self.call
    }
    pub fn ring(&self) -> &DriverQueue<u16> {
        &self.q
    }
    /// Publishes the avail index once per refill instead of per buffer (see
    /// `TxQueue::set_avail_per_burst`). Set by `NetDriver` when it builds the queue.
    #[cfg(feature = "experiments")]
    pub(crate) fn set_avail_per_burst(&mut self, on: bool) {
        self.q.set_publish_on_kick(on);
    }

    /// Attaches dynamic interrupt moderation: it runs each time a NAPI round completes.
    pub fn attach_dim(&mut self, dim: RxDim) {
        self.dim = Some(dim);
    }
    pub fn dim(&self) -> Option<&RxDim> {
        self.dim.as_ref()
    }

    /// Posts every free buffer; kicks if the device asked for it.
    pub fn refill(&mut self) -> Result<(), DriverError> {
        let mut added = false;
        let descs = self.layout.descs();
        let needed = if self.q.uses_indirect(descs) {
            1
        } else {
            descs
        };
        while self.q.num_free() as usize >= needed {
            let Some(slot) = self.pool.free.pop_front() else {
                break;
            };
            let at = self.pool.addr(slot);
            let one;
            let bufs = match self.layout {
                RxLayout::Mergeable { buf_len } | RxLayout::Small { buf_len } => {
                    one = Buf::new(at, buf_len);
                    std::slice::from_ref(&one)
                }
                RxLayout::Big { segs, seg_len } => {
                    self.scratch.clear();
                    self.scratch.push(Buf::new(at, self.hdr_len as u32));
                    for i in 0..segs as u64 {
                        let a = at.0 + self.hdr_len as u64 + i * seg_len as u64;
                        self.scratch.push(Buf::new(GuestAddress(a), seg_len));
                    }
                    &self.scratch[..]
                }
            };
            if let Err(e) = self.q.add(&[], bufs, slot) {
                self.pool.free.push_back(slot);
                return Err(ring_error(self.vq, &self.counters, e));
            }
            added = true;
        }
        if added && self.q.kick_prepare() {
            if self.kick.signal().is_err() {
                self.counters.kick_errors.add(1);
            }
            self.counters.kicks.add(1);
        }
        Ok(())
    }

    /// The next used buffer; with `prefetch`, the headers of the ones after it are
    /// prefetched.
    fn next_used(&mut self, prefetch: bool) -> Result<Option<(u16, u32)>, DriverError> {
        // The engine checked the used id against its in-flight table and the length against
        // what the chain can take; the token it returns is one of our slots.
        let used = self
            .q
            .get_used()
            .map_err(|e| ring_error(self.vq, &self.counters, e))?;
        if prefetch && used.is_some() {
            self.prefetch_headers();
        }
        Ok(used)
    }

    /// Prefetches the headers of the next few used buffers, so that the transfers of the
    /// cache lines the device wrote overlap instead of each frame waiting for its own.
    fn prefetch_headers(&mut self) {
        let pending = self.q.used_seen();
        self.prefetched = self.prefetched.saturating_sub(1).min(pending);
        while self.prefetched < pending.min(RX_PREFETCH) {
            if let Some(&slot) = self.q.peek_used(self.prefetched) {
                self.mem.prefetch_read(self.pool.addr(slot), self.hdr_len);
            }
            self.prefetched += 1;
        }
    }

    /// Takes the next received frame (header stripped) into `out`. Ok(None) when nothing
    /// waits; a frame the device described badly is dropped and counted, and the next one
    /// is tried.
    pub fn recv(&mut self, out: &mut Vec<u8>) -> Result<Option<NetHdr>, DriverError> {
        Ok(self.take(Some(out))?.map(|(hdr, _)| hdr))
    }

    /// Like [`RxQueue::recv`] without copying the frame out: its length only, for a consumer
    /// that only counts (as DPDK's rxonly forwarding does; [`Count`] in a poll).
    ///
    /// The frame's bytes, header included, are not read at all unless the frame may go on
    /// into another buffer (mergeable buffers only): the device's cache keeps the lines it
    /// wrote, and its next write there costs it no transfer. A buffer the device did not fill
    /// ends its frame, because a device must fill every buffer of a frame but the last
    /// (spec 5.1.6.4.2), so `num_buffers` is read only for a full buffer.
    fn recv_len(&mut self) -> Result<Option<usize>, DriverError> {
        Ok(self.take(None)?.map(|(_, len)| len))
    }

    /// The next frame: its header and length, its bytes appended to `out` if given. Without
    /// `out` the header is read only when the frame may span buffers (see
    /// [`RxQueue::recv_len`]); the header returned is then all zero.
    fn take(
        &mut self,
        mut out: Option<&mut Vec<u8>>,
    ) -> Result<Option<(NetHdr, usize)>, DriverError> {
        let copy = out.is_some();
        loop {
            let Some((slot, len)) = self.next_used(copy)? else {
                return Ok(None);
            };
            if let Some(o) = out.as_deref_mut() {
                o.clear();
            }
            let mut hdr_bytes = [0u8; vnet::HDR_LEN];
            let first = self.pool.addr(slot);
            let len = len as usize;
            let mut ok = len >= self.hdr_len;
            let mut buffers = 1u16;
            let mut frame_len = 0;
            // Only a full mergeable buffer may have a successor (spec 5.1.6.4.2).
            let full =
                matches!(self.layout, RxLayout::Mergeable { buf_len } if len >= buf_len as usize);
            if ok && (copy || full) {
                self.read(first, &mut hdr_bytes[..self.hdr_len])?;
                if matches!(self.layout, RxLayout::Mergeable { .. }) {
                    buffers = NetHdr::from_bytes(&hdr_bytes).num_buffers.max(1);
                }
                // A short buffer that claims successors: the device broke the rule above. The
                // frame is dropped and the buffers after it are taken as frames of their own,
                // as a consumer that does not read headers takes them.
                if buffers > 1 && !full {
                    ok = false;
                    buffers = 1;
                }
            }
            if ok {
                frame_len += self.copy_out(first, self.hdr_len, len, out.as_deref_mut())?;
            }
            self.pool.free.push_back(slot);
            // More buffers than could possibly be in flight: a lie, not a frame to wait for.
            if buffers as usize > self.q.config().size() as usize {
                ok = false;
                buffers = 1;
            }
            for _ in 1..buffers {
                match self.next_used(copy)? {
                    Some((slot, len)) => {
                        let at = self.pool.addr(slot);
                        frame_len += self.copy_out(at, 0, len as usize, out.as_deref_mut())?;
                        self.pool.free.push_back(slot);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                self.counters.dropped.add(1);
                continue;
            }
            self.counters.packets.add(1);
            self.counters.bytes.add(frame_len as u64);
            return Ok(Some((NetHdr::from_bytes(&hdr_bytes), frame_len)));
        }
    }

    fn read(&self, at: GuestAddress, buf: &mut [u8]) -> Result<(), DriverError> {
        self.mem
            .read(at, buf)
            .map_err(|e| ring_error(self.vq, &self.counters, e))
    }

    /// Appends bytes `from..len` of the buffer at `at` to `out` (if given); returns how many.
    fn copy_out(
        &self,
        at: GuestAddress,
        from: usize,
        len: usize,
        out: Option<&mut Vec<u8>>,
    ) -> Result<usize, DriverError> {
        let len = len.min(self.pool.buf_len as usize);
        if len <= from {
            return Ok(0);
        }
        if let Some(out) = out {
            let start = out.len();
            out.resize(start + len - from, 0);
            self.read(GuestAddress(at.0 + from as u64), &mut out[start..])?;
        }
        Ok(len - from)
    }

    /// Receives up to `budget` frames into `sink`, then refills; returns how many.
    ///
    /// - [`PollMode::Napi`]: then enables callbacks and re-checks, so that a frame that landed
    ///   meanwhile does not wait for the next interrupt. When it returns fewer than `budget`,
    ///   callbacks are on and the caller may sleep on the call eventfd.
    /// - [`PollMode::Busy`]: callbacks stay off (the caller never sleeps), so nothing is
    ///   written to the ring for them.
    ///
    /// [`Frames`] hands each frame (header stripped) to a closure; [`Count`] only counts them,
    /// reading no byte of a frame unless it may continue into another buffer.
    pub fn poll<S: Sink>(
        &mut self,
        budget: usize,
        mode: PollMode,
        mut sink: S,
    ) -> Result<usize, DriverError> {
        let mut frame = std::mem::take(&mut self.frame);
        let take_one = |rx: &mut RxQueue| -> Result<bool, DriverError> {
            if S::COPY {
                let got = rx.take(Some(&mut frame))?.is_some();
                if got {
                    sink.frame(&frame);
                }
                Ok(got)
            } else {
                Ok(rx.recv_len()?.is_some())
            }
        };
        let r = match mode {
            PollMode::Napi => self.napi(budget, take_one),
            PollMode::Busy => self.busy(budget, take_one),
        };
        self.frame = frame;
        r
    }

    /// The busy round: `take_one` until `budget` or empty, then refill; callbacks off.
    fn busy(
        &mut self,
        budget: usize,
        mut take_one: impl FnMut(&mut RxQueue) -> Result<bool, DriverError>,
    ) -> Result<usize, DriverError> {
        self.q.disable_cb();
        let mut n = 0;
        while n < budget && take_one(self)? {
            n += 1;
        }
        if n > 0 {
            self.counters.polls.add(1);
            self.refill()?;
        }
        Ok(n)
    }

    /// The NAPI round: `take_one` until `budget` or empty, refill, enable and re-check.
    fn napi(
        &mut self,
        budget: usize,
        mut take_one: impl FnMut(&mut RxQueue) -> Result<bool, DriverError>,
    ) -> Result<usize, DriverError> {
        self.q.disable_cb();
        self.counters.polls.add(1);
        let mut n = 0;
        loop {
            while n < budget && take_one(self)? {
                n += 1;
            }
            self.refill()?;
            if n >= budget {
                return Ok(n);
            }
            // Enable and re-check: a frame that landed meanwhile must not wait for the next
            // interrupt.
            if !self.q.enable_cb() {
                if let Some(dim) = &mut self.dim {
                    dim.on_napi_complete(&self.counters);
                }
                return Ok(n);
            }
            self.counters.rechecks.add(1);
            self.q.disable_cb();
        }
    }

    /// Takes back every posted buffer without the device, for a device that is gone (the
    /// connection to it lost): the ring is left empty, as after activation. Returns how many
    /// buffers it held.
    pub fn abandon(&mut self) -> usize {
        let slots = self.q.detach_unused();
        let n = slots.len();
        self.pool.free.extend(slots);
        self.prefetched = 0;
        n
    }

    /// Blocks until the call eventfd fires or `timeout_ms` passes (negative: forever);
    /// counts the interrupt.
    pub fn wait(&mut self, timeout_ms: i32) -> bool {
        crate::wait_readable(&self.call, timeout_ms) && self.ack_interrupt()
    }

    /// Reads the call eventfd and counts an interrupt if one was pending.
    pub fn ack_interrupt(&mut self) -> bool {
        let fired = self.call.take().is_ok_and(|n| n > 0);
        if fired {
            self.counters.interrupts.add(1);
        }
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hand_built;
    use vring::DeviceQueue;

    const BUF: u32 = 128;

    /// A mergeable rx queue of 8 `BUF`-byte buffers with a device side we drive by hand.
    struct Rig {
        rx: RxQueue,
        device: DeviceQueue,
        mem: Arc<GuestMemory>,
    }

    fn rig() -> Rig {
        let features = Features::VERSION_1 | feature::MRG_RXBUF;
        let (mem, setup, mut alloc) = hand_built(0, 8, features);
        let rx = RxQueue::new(&setup, &mem, &mut alloc, BUF).unwrap();
        let device =
            DeviceQueue::activate(&setup.config, mem.clone(), vring::RingPosition::START).unwrap();
        Rig { rx, device, mem }
    }

    impl Rig {
        /// The device writes a frame of `buffers.len()` buffers: the header (claiming
        /// `num_buffers`) then payload, `buffers[i]` bytes used in buffer i.
        fn deliver(&mut self, num_buffers: u16, buffers: &[u32]) {
            for (i, &len) in buffers.iter().enumerate() {
                let c = self.device.pop().unwrap().expect("a posted buffer");
                let at = c.writable()[0].addr;
                self.mem.write(at, &vec![0xab; len as usize]).unwrap();
                if i == 0 {
                    let hdr = NetHdr {
                        num_buffers,
                        ..Default::default()
                    };
                    self.mem.write(at, &hdr.to_bytes()).unwrap();
                }
                self.device.add_used(c.head(), len).unwrap();
            }
            self.device.flush();
        }
    }

    #[test]
    fn counting_and_copying_agree_on_frame_boundaries() {
        // One frame in a short buffer, one spanning two full buffers and a short third, and
        // a short buffer that claims a successor: the device broke the rule that only a full
        // buffer continues, so the buffer after it starts a frame of its own.
        let frames: [(u16, &[u32]); 4] = [
            (1, &[12 + 60]),
            (3, &[BUF, BUF, 40]),
            (2, &[12 + 50]),
            (1, &[12 + 30]),
        ];
        for count in [true, false] {
            let mut r = rig();
            for (n, bufs) in frames {
                r.deliver(n, bufs);
                if r.rx.q.num_free() > 0 {
                    r.rx.refill().unwrap();
                }
            }
            let mut got = Vec::new();
            let mut frame = Vec::new();
            loop {
                let len = if count {
                    r.rx.recv_len().unwrap()
                } else {
                    r.rx.recv(&mut frame).unwrap().map(|_| frame.len())
                };
                match len {
                    Some(l) => got.push(l),
                    None => break,
                }
                r.rx.refill().unwrap();
            }
            let c = &r.rx.counters;
            if count {
                // Without reading the third header, its claim is not seen: a frame.
                assert_eq!(got, [60, 2 * BUF as usize - 12 + 40, 50, 30]);
                assert_eq!(c.dropped.get(), 0);
            } else {
                assert_eq!(got, [60, 2 * BUF as usize - 12 + 40, 30]);
                assert_eq!(c.dropped.get(), 1);
            }
        }
    }

    #[test]
    fn layouts_follow_features() {
        let v1 = Features::VERSION_1;
        assert_eq!(
            RxLayout::for_features(v1 | feature::MRG_RXBUF, 1500, 16),
            RxLayout::Mergeable { buf_len: 1536 }
        );
        assert_eq!(
            RxLayout::for_features(v1, 1500, 16),
            RxLayout::Small {
                buf_len: 12 + 14 + 4 + 1500
            }
        );
        let big = RxLayout::for_features(v1 | feature::GUEST_TSO4, 1500, 16);
        let RxLayout::Big { segs, seg_len } = big else {
            panic!("{big:?}")
        };
        assert_eq!(big.descs(), 16);
        assert!(segs as u32 * seg_len >= MAX_GSO_FRAME);
    }
}
