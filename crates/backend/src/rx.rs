//! Guest receive: putting host frames into the buffers the guest posted on its rx queue
//! (VIRTIO 1.2 5.1.6.3-5.1.6.4), with mergeable buffers when MRG_RXBUF is negotiated.
//!
//! [`RxPath`] owns a pair's rx queue and the receive policy, the same for every port: read a
//! frame from the port only when the guest has posted buffers (so frames wait in the host, not
//! here); straight into the guest's buffers once it has posted enough for the largest frame
//! (`rx/direct.rs`), else through a buffer of its own and a copy (`rx/copy.rs`); a frame that
//! does not fit the posted buffers waits here, as vhost_net leaves it queued, and rx does not
//! try again until the guest posts more (the mark at which it lacked room). A port whose
//! frames are all the same (the null generator) is copied in bursts.

use std::collections::VecDeque;
use std::io;

use vring::{AvailMark, Chain, Error as RingError, Segment};

use super::error::Error;
use super::host::{Port, MAX_RX_FRAME};
use super::queue::{break_queue, notify, QueueRuntime};
use super::shared::Shared;
use super::turn::{Turn, WEIGHT_PACKETS};

mod copy;
mod direct;

pub use copy::Pieces;

/// Frames per burst of [`RxPath::deliver_burst`]: as many buffer fetches in flight as the CPU
/// keeps.
const BURST: usize = 32;
/// Cache lines of rx buffers prefetched ahead of the copies: enough transfers in flight to
/// hide their latency, few enough for the CPU's miss buffers. Frames longer than half of this
/// are not prefetched: on AMD EPYC (Zen 4) vCPUs 1500 B guest rx ran 6% slower with the
/// prefetch (docs/PERFORMANCE-HISTORY.md, 2026-11-30, the backend against DPDK's vhost PMD with
/// PREFETCHW), the copy's own streaming being enough there.
const PREFETCH_LINES: usize = 16;
/// The most buffers one merged frame may take (as vhost_net's `UIO_MAXIOV` quota), and never
/// more than the queue holds: a frame that needs more is dropped, not waited for.
const MAX_MERGED_BUFFERS: usize = 1024;

/// Segments one frame may take over all its merged buffers: as many as one chain may have
/// (Linux's UIO_MAXIOV). Beyond it the frame is dropped and counted, so the chains popped for
/// one frame hold at most this many segments.
const MAX_FRAME_SEGMENTS: usize = vring::MAX_CHAIN_SEGMENTS;

/// What the rx path keeps between frames: chains, and segments per chain. A Linux guest
/// needs far less (a 64 KiB frame takes 44 mergeable buffers of 1500 bytes; a big-packets
/// chain has 19 segments); a guest that makes them grow past it pays an allocation, and the
/// memory goes back after the frame. So an rx path holds at most 64 x 64 segments between
/// frames whatever the guest posts.
const KEEP_CHAINS: usize = 64;
const KEEP_SEGMENTS: usize = 64;

/// What became of one frame offered to guest rx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// In the guest's buffers.
    Delivered,
    /// Consumed and counted, not delivered: the receive filter refused it (`filtered`), or
    /// the posted buffers can never hold it (`dropped`).
    Dropped,
    /// Not enough buffers posted yet: nothing consumed.
    NoRoom,
}

/// What became of one [`RxPath::receive_direct`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direct {
    /// A frame of this many bytes, header included, is in the guest's buffers.
    Delivered(usize),
    /// A frame was read and consumed but not delivered (the receive filter's, or longer than
    /// the buffers the guest could post): counted.
    Dropped,
    /// The host had no frame.
    Empty,
    /// The guest has not posted buffers for the largest frame: nothing was read, and nothing
    /// is held; the caller reads through a buffer of its own instead.
    NoRoom,
}

/// Frames one [`RxPath::receive`] handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// Frames put into guest rx, and their bytes, headers excluded.
    pub frames: usize,
    pub bytes: u64,
    /// Host frames consumed but not delivered (filtered, or too large for every buffer the
    /// guest could post): counted by the rx path, and against the turn's weight.
    pub dropped: usize,
}

impl Received {
    /// One frame of `len` bytes, `hdr_len` of them the virtio-net header, put into guest rx.
    pub fn one(len: usize, hdr_len: usize) -> Received {
        Received {
            frames: 1,
            bytes: len.saturating_sub(hdr_len) as u64,
            dropped: 0,
        }
    }

    /// One host frame consumed and not delivered.
    pub const DROPPED: Received = Received {
        frames: 0,
        bytes: 0,
        dropped: 1,
    };
}

/// The rx queue of one pair and where its last delivery stopped.
#[derive(Debug)]
pub struct RxPath {
    queue: Option<QueueRuntime>,
    /// The avail index at which rx last lacked room (a frame waiting for buffers, an echo):
    /// rx is not worth retrying until the guest moves it.
    blocked: Option<AvailMark>,
    /// Chains popped for one frame (mergeable) or one burst.
    chains: Vec<Chain>,
    /// A chain of `chains` has grown past KEEP_SEGMENTS: trim them after the frame.
    grown: bool,
    /// Buffers popped for reading frames straight into them ([`RxPath::receive_direct`]),
    /// oldest first: enough for the largest frame, kept from one frame to the next. They are
    /// the queue's latest pops, so they go back to the ring with one `undo_pop`.
    posted: VecDeque<Chain>,
    /// Their writable bytes.
    posted_bytes: u64,
    /// Chains to pop into, and the read's segments, kept for their allocations.
    spare: Vec<Chain>,
    segs: Vec<Segment>,
    /// A host frame read into `bounce` (its length) that did not fit the posted buffers: it
    /// goes first once the guest posts more.
    pending: Option<usize>,
    /// Frames are read here when the guest has posted too few buffers; reads into guest
    /// buffers sized for the usual frame put here what does not fit. One byte longer than the
    /// largest frame, so that a longer one (a datagram socket's) is seen to be too long.
    bounce: Vec<u8>,
}

impl Default for RxPath {
    fn default() -> Self {
        RxPath {
            queue: None,
            blocked: None,
            chains: Vec::new(),
            grown: false,
            posted: VecDeque::new(),
            posted_bytes: 0,
            spare: Vec::new(),
            segs: Vec::new(),
            pending: None,
            bounce: vec![0u8; MAX_RX_FRAME + 1],
        }
    }
}

impl RxPath {
    /// An rx path on a running queue.
    pub fn with_queue(q: QueueRuntime) -> RxPath {
        RxPath {
            queue: Some(q),
            ..RxPath::default()
        }
    }

    /// The rx queue, if one runs.
    pub fn queue(&self) -> Option<&QueueRuntime> {
        self.queue.as_ref()
    }

    pub fn queue_mut(&mut self) -> Option<&mut QueueRuntime> {
        self.queue.as_mut()
    }

    /// Takes over `q`, a queue the frontend (re)started, and returns the one it replaces.
    pub fn start(&mut self, q: QueueRuntime) -> Option<QueueRuntime> {
        let old = self.stop();
        self.queue = Some(q);
        old
    }

    /// Gives back the rx queue, stopped: the posted buffers go back to its ring, and a frame
    /// that waited for buffers is dropped and counted.
    pub fn stop(&mut self) -> Option<QueueRuntime> {
        if self.pending.take().is_some() {
            if let Some(q) = &self.queue {
                q.counters().dropped.add(1);
            }
        }
        self.release();
        self.queue.take()
    }

    /// Whether a host frame waits here for buffers (the port's fd has nothing to add).
    pub fn holds_frame(&self) -> bool {
        self.pending.is_some()
    }

    /// The rx queue, if it runs and is not broken.
    pub fn usable(&mut self) -> Option<&mut QueueRuntime> {
        self.queue.as_mut().filter(|q| q.usable())
    }

    /// The virtio-net header length the rx queue negotiated.
    pub fn hdr_len(&self) -> usize {
        self.queue
            .as_ref()
            .map_or(vnet::HDR_LEN, |q| vnet::hdr_len(q.features()))
    }

    /// Forgets where rx lacked room, returns the posted buffers to the ring (so that the
    /// queue's state, GET_VRING_BASE, counts them as not taken), and gives back the chains'
    /// memory: the queue is being replaced or stopped.
    fn release(&mut self) {
        self.unpost();
        self.blocked = None;
        self.chains = Vec::new();
        self.grown = false;
        self.posted = VecDeque::new();
        self.spare = Vec::new();
        self.segs = Vec::new();
    }

    /// Returns the posted buffers to the ring.
    fn unpost(&mut self) {
        if let Some(q) = self.queue.as_mut() {
            q.undo_pop(self.posted.len() as u16);
        }
        self.spare.extend(self.posted.drain(..));
        self.posted_bytes = 0;
    }

    /// Gives back what the last frame made the chains grow to (see KEEP_CHAINS).
    #[inline]
    fn trim(&mut self) {
        if self.chains.len() > KEEP_CHAINS || self.grown {
            self.shrink_chains();
        }
    }

    #[cold]
    fn shrink_chains(&mut self) {
        self.chains.truncate(KEEP_CHAINS);
        self.chains.shrink_to(KEEP_CHAINS);
        for c in &mut self.chains {
            c.clear_and_shrink(KEEP_SEGMENTS);
        }
        self.grown = false;
    }

    /// Breaks the rx queue on an error of its own.
    pub fn fail(&mut self, e: RingError) {
        if let Some(q) = &self.queue {
            break_queue(q, &Error::Guest(e));
        }
    }

    /// Whether the guest has posted buffers (false without a usable queue). A ring error
    /// breaks the queue.
    pub fn has_buffers(&mut self) -> bool {
        let Some(q) = self.queue.as_mut().filter(|q| q.usable()) else {
            return false;
        };
        !self.posted.is_empty() || q.avail_pending()
    }

    /// Records that rx lacked room at the avail index it last read. Not a fresh one: buffers
    /// the guest posted since the pop that found none (and kicked for) must not count as seen,
    /// or rx would wait for more that never come.
    pub fn block(&mut self) {
        if let Some(q) = self.queue.as_ref() {
            self.blocked = Some(q.avail_mark());
        }
    }

    /// Whether rx is still waiting for the guest to post more buffers (see `blocked`).
    pub fn still_blocked(&mut self) -> bool {
        let (Some(at), Some(q)) = (self.blocked, self.queue.as_mut()) else {
            return false;
        };
        match q.avail_moved(at) {
            Ok(false) => true,
            Ok(true) => {
                self.blocked = None;
                false
            }
            Err(e) => {
                self.fail(e);
                true
            }
        }
    }

    /// Guest receive: host frames from `port` into posted buffers, up to the weight; nothing
    /// while the pair is not `active` or rx waits for the guest to post more. A ring error
    /// breaks the queue.
    pub fn turn(&mut self, port: &mut dyn Port, shared: &Shared, active: bool) -> Turn {
        let mut turn = Turn::default();
        if self.usable().is_none() || !active || self.still_blocked() {
            return turn;
        }
        let mut bytes = 0u64;
        let mut delivered = 0;
        let result: Result<(), RingError> = loop {
            let Some(rx) = self.queue.as_ref() else {
                break Ok(());
            };
            if turn.at_weight(bytes, rx) {
                break Ok(());
            }
            let room = WEIGHT_PACKETS - turn.frames;
            match self.receive(port, shared, room) {
                Ok(r) if r.frames + r.dropped == 0 => break Ok(()),
                Ok(r) => {
                    delivered += r.frames;
                    turn.frames += r.frames + r.dropped;
                    bytes += r.bytes;
                }
                Err(e) => break Err(e),
            }
        };
        let Some(rx) = self.queue.as_mut() else {
            return turn;
        };
        let c = rx.counters();
        c.packets.add(delivered as u64);
        c.bytes.add(bytes);
        match result {
            Ok(()) => {
                if delivered > 0 && rx.usable() {
                    notify(rx);
                }
            }
            Err(e) => break_queue(rx, &e.into()),
        }
        turn
    }

    /// Puts host frames from `port` into guest rx: one frame (or, from a port whose frames
    /// are all the same, a burst of up to `room`), by the policy of the module's docs. Zero
    /// frames handled: nothing more for now. The caller has checked that the queue is
    /// usable; a ring error is returned, to break it.
    pub fn receive(
        &mut self,
        port: &mut dyn Port,
        shared: &Shared,
        room: usize,
    ) -> Result<Received, RingError> {
        let hdr_len = self.hdr_len();
        if let Some(frame) = port.repeated_frame(hdr_len) {
            return self.receive_repeated(frame, shared, room);
        }
        let n = match self.pending.take() {
            Some(n) => n,
            None => match self.read(port, shared)? {
                Read::Frame(n) => n,
                Read::Done(r) => return Ok(r),
            },
        };
        let mut bounce = std::mem::take(&mut self.bounce);
        let r = self.deliver(shared, &mut bounce[..n]);
        self.bounce = bounce;
        Ok(match r? {
            Delivery::Delivered => Received::one(n, hdr_len),
            Delivery::Dropped => Received::DROPPED,
            Delivery::NoRoom => {
                // Too few buffers for this frame: keep it until the guest posts more.
                self.pending = Some(n);
                self.block();
                Received::default()
            }
        })
    }

    /// Reads the next frame from `port`: straight into the guest's buffers if it has posted
    /// enough for the largest frame, else into the bounce buffer (its length returned).
    fn read(&mut self, port: &mut dyn Port, shared: &Shared) -> Result<Read, RingError> {
        // Read only when the guest has posted buffers, so that frames wait in the host.
        let Some(features) = self.queue.as_ref().map(|q| q.features()) else {
            return Ok(Read::Done(Received::default()));
        };
        if !self.has_buffers() {
            return Ok(Read::Done(Received::default()));
        }
        let hdr_len = vnet::hdr_len(features);
        // With the MTU in effect (NET_SET_MTU may change it).
        let max_frame = port.max_frame(features, shared.mtu());
        let mut bounce = std::mem::take(&mut self.bounce);
        let mut too_long = false;
        let direct = self.receive_direct(shared, max_frame, &mut bounce, |mem, segs, tail| {
            Ok(match port.recv(mem, segs, tail)? {
                Ok(n) if n > max_frame => {
                    too_long = true;
                    Err(io::ErrorKind::InvalidData.into())
                }
                r => r,
            })
        });
        let read = match direct {
            Ok(Direct::Delivered(n)) => Ok(Read::Done(Received::one(n, hdr_len))),
            // Counted by the direct path (filtered, or too long for the guest's buffers).
            Ok(Direct::Dropped) => Ok(Read::Done(Received::DROPPED)),
            Ok(Direct::Empty) if too_long => {
                self.count_dropped();
                Ok(Read::Done(Received::DROPPED))
            }
            Ok(Direct::Empty) => Ok(Read::Done(Received::default())),
            Ok(Direct::NoRoom) => self.read_bounced(port, &mut bounce, max_frame),
            Err(e) => Err(e),
        };
        self.bounce = bounce;
        read
    }

    /// Reads the next frame from `port` into `bounce`, for a copy.
    fn read_bounced(
        &mut self,
        port: &mut dyn Port,
        bounce: &mut [u8],
        max_frame: usize,
    ) -> Result<Read, RingError> {
        let Some(q) = self.queue.as_ref() else {
            return Ok(Read::Done(Received::default()));
        };
        let n = match port.recv(q.memory(), &[], bounce)? {
            Ok(n) => n,
            // Nothing waits, or the host failed (a TAP going down): the fd says when to try
            // again.
            Err(_) => return Ok(Read::Done(Received::default())),
        };
        if n > max_frame {
            self.count_dropped();
            return Ok(Read::Done(Received::DROPPED));
        }
        if n == 0 {
            return Ok(Read::Done(Received::default()));
        }
        q.counters().rx_bounced.add(1);
        Ok(Read::Frame(n))
    }

    /// Copies `frame` into the guest's buffers, one per frame in bursts of up to `room`, or
    /// merged over several when one will not hold it.
    fn receive_repeated(
        &mut self,
        frame: &mut [u8],
        shared: &Shared,
        room: usize,
    ) -> Result<Received, RingError> {
        let payload = frame.len().saturating_sub(self.hdr_len()) as u64;
        let mut frames = self.deliver_burst(shared, frame, room)?;
        if frames == 0 {
            match self.deliver(shared, frame)? {
                Delivery::Delivered => frames = 1,
                // The same frame again would not fit either: wait for the guest to post more,
                // rather than spin on buffers that cannot take it.
                Delivery::Dropped | Delivery::NoRoom => self.block(),
            }
        }
        Ok(Received {
            frames,
            bytes: frames as u64 * payload,
            dropped: 0,
        })
    }

    fn count_dropped(&self) {
        if let Some(q) = &self.queue {
            q.counters().dropped.add(1);
        }
    }

    /// Puts one frame (virtio-net header first, `frame[..hdr_len]`) into the rx queue, merging
    /// buffers when MRG_RXBUF is negotiated ([`Delivery`] says what became of it; with too few
    /// buffers nothing is consumed). A frame that more buffers than [`MAX_MERGED_BUFFERS`] (or the
    /// queue size) could not hold is dropped and counted. An rx chain with no writable bytes
    /// is the guest's error, as in vhost_net ("unexpected descriptor format for RX"). The
    /// caller has checked that the queue is usable.
    pub fn deliver(&mut self, shared: &Shared, frame: &mut [u8]) -> Result<Delivery, RingError> {
        let Some(rx) = self.queue.as_mut() else {
            return Ok(Delivery::NoRoom);
        };
        let r = copy::deliver(shared, rx, frame, &mut self.chains, &mut self.grown);
        self.trim();
        r
    }

    /// Puts frames given in pieces (see [`Pieces`]) into the rx queue in order, merging
    /// buffers when MRG_RXBUF is negotiated; what became of each goes into `out` (as
    /// [`RxPath::deliver`] says it of one). The caller has checked that the queue is usable.
    pub fn deliver_pieces(
        &mut self,
        shared: &Shared,
        frames: &[&Pieces<'_>],
        out: &mut [Delivery],
    ) -> Result<(), RingError> {
        let Some(rx) = self.queue.as_mut() else {
            out.iter_mut().for_each(|o| *o = Delivery::NoRoom);
            return Ok(());
        };
        let r = copy::deliver_pieces(shared, rx, frames, &mut self.chains, &mut self.grown, out);
        self.trim();
        r
    }

    /// Puts up to `max` copies of `frame` (header first) into the rx queue, as long as each
    /// fits the first writable segment of one chain: the chains are popped, then the frames
    /// copied. Short frames' buffers are prefetched for writing ahead of the copies, so that the
    /// transfers of the cache lines the driver last touched overlap. Returns how many were
    /// delivered; 0 leaves the next frame to [`RxPath::deliver`] (no buffer, a buffer that is
    /// too small or split, or the receive filter's verdict).
    pub fn deliver_burst(
        &mut self,
        shared: &Shared,
        frame: &mut [u8],
        max: usize,
    ) -> Result<usize, RingError> {
        let Some(rx) = self.queue.as_mut() else {
            return Ok(0);
        };
        let r = copy::deliver_burst(shared, rx, frame, &mut self.chains, max, &mut self.grown);
        self.trim();
        r
    }
}

/// What [`RxPath::read`] got.
enum Read {
    /// A frame of this many bytes in the bounce buffer, to be copied.
    Frame(usize),
    /// The frame was handled (or none was there).
    Done(Received),
}

#[cfg(test)]
mod tests {

    use testkit::Pair;
    use vring::Features;

    use vring::GuestMemory;

    use super::*;
    use crate::queue::QueueId;
    use crate::testing::{post_rx, setup, shared, used};

    const MRG: Features = Features::VERSION_1.union(vnet::feature::MRG_RXBUF);

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| i as u8).collect()
    }

    fn rx_path(features: Features) -> (RxPath, vring::DriverQueue<u32>, Arc<GuestMemory>) {
        let s = setup(QueueId::Rx(0), features);
        (RxPath::with_queue(s.runtime), s.driver, s.mem)
    }

    use std::sync::Arc;

    /// A non-blocking pipe holding `frames`, one per write: each `read` of `direct` takes one
    /// when it asks for at least its length (the tests size their reads so).
    struct Host {
        rd: std::io::PipeReader,
        _wr: std::io::PipeWriter,
    }

    impl Host {
        fn with(frames: &[Vec<u8>]) -> Host {
            use std::io::Write;
            let (rd, mut wr) = std::io::pipe().unwrap();
            for f in frames {
                wr.write_all(f).unwrap();
            }
            virtnet_sys::set_nonblocking(std::os::fd::AsFd::as_fd(&rd), true).unwrap();
            Host { rd, _wr: wr }
        }
    }

    /// One `receive_direct` of a frame `len` bytes long from `host`, with a tail as long as
    /// the rest of the frame beyond `max_frame`'s buffers.
    fn direct(
        rx: &mut RxPath,
        s: &Shared,
        host: &Host,
        max_frame: usize,
        len: usize,
    ) -> (Result<Direct, RingError>, Vec<u8>) {
        let mut tail = vec![0u8; 65536];
        let r = rx.receive_direct(s, max_frame, &mut tail, |mem, segs, tail| {
            // Read exactly one frame's bytes: the pipe is a stream.
            let mut left = len;
            let mut cut = Vec::new();
            for seg in segs {
                let k = (seg.len as usize).min(left);
                cut.push(vring::Segment {
                    len: k as u32,
                    ..*seg
                });
                left -= k;
            }
            mem.readv_with_tail(std::os::fd::AsFd::as_fd(&host.rd), &cut, &mut tail[..left])
        });
        (r, tail)
    }

    #[test]
    fn a_direct_read_fills_the_oldest_posted_buffers_and_keeps_the_rest_posted() {
        let (mut rx, mut driver, mem) = rx_path(MRG);
        post_rx(&mut driver, 8, 1024);
        let (a, b) = (frame(2500), frame(100));
        let host = Host::with(&[a.clone(), b.clone()]);
        let s = shared();
        // Posted for a 3000-byte frame: three buffers; the 2500-byte one takes all three.
        assert_eq!(
            direct(&mut rx, &s, &host, 3000, 2500).0,
            Ok(Direct::Delivered(2500))
        );
        assert_eq!(
            direct(&mut rx, &s, &host, 3000, 100).0,
            Ok(Direct::Delivered(100))
        );
        // Nothing more waits: the buffers posted for the next frame stay posted.
        assert_eq!(direct(&mut rx, &s, &host, 3000, 100).0, Ok(Direct::Empty));
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(
            used(&mut driver),
            [(0, 1024), (1, 1024), (2, 452), (3, 100)]
        );
        let mut hdr = [0u8; vnet::HDR_LEN];
        mem.read(Pair::buf(0, 0).addr, &mut hdr).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3, "num_buffers");
        mem.read(Pair::buf(3, 0).addr, &mut hdr).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1, "num_buffers");
        let mut got = vec![0u8; 452];
        mem.read(Pair::buf(2, 0).addr, &mut got).unwrap();
        assert_eq!(got[..], a[2048..]);
        let mut got = vec![0u8; 100];
        mem.read(Pair::buf(3, 0).addr, &mut got).unwrap();
        assert_eq!(got[vnet::HDR_LEN..], b[vnet::HDR_LEN..]);
        // Stopping gives the posted buffers (4, 5 and 6) back to the ring.
        let before = rx.queue.as_ref().unwrap().avail_mark();
        rx.release();
        let q = &mut rx.queue.as_mut().unwrap().engine();
        let mut c = Chain::new();
        assert!(q.pop_into(&mut c).unwrap());
        assert_eq!(c.head(), 4, "the first posted buffer is popped again");
        assert_eq!(q.avail_mark(), before);
    }

    /// A TAP hands on DATA_VALID (a frame a NIC checked) whatever the offloads it was set
    /// with: a guest with GUEST_CSUM gets it, one without gets flags zero (5.1.6.4.1), read
    /// straight into its buffers or copied.
    #[test]
    fn data_valid_reaches_only_a_guest_that_negotiated_guest_csum() {
        const DATA_VALID: u8 = 2;
        for csum in [false, true] {
            let features = if csum {
                MRG.union(vnet::feature::GUEST_CSUM)
            } else {
                MRG
            };
            let (mut rx, mut driver, mem) = rx_path(features);
            post_rx(&mut driver, 8, 1024);
            let mut f = frame(100);
            f[0] = DATA_VALID;
            let host = Host::with(std::slice::from_ref(&f));
            let s = shared();
            let (got, _) = direct(&mut rx, &s, &host, 3000, 100);
            assert_eq!(got, Ok(Direct::Delivered(100)));
            let mut copied = f.clone();
            assert_eq!(rx.deliver(&s, &mut copied), Ok(Delivery::Delivered));
            rx.queue.as_mut().unwrap().flush();
            let want = if csum { DATA_VALID } else { 0 };
            let used = used(&mut driver);
            assert_eq!(used.len(), 2, "one frame read straight in, one copied");
            for (head, _) in used {
                let mut flags = [0u8];
                mem.read(Pair::buf(head.into(), 0).addr, &mut flags)
                    .unwrap();
                assert_eq!(flags[0], want, "GUEST_CSUM {csum}, buffer {head}");
            }
        }
    }

    #[test]
    fn a_broken_rx_queue_has_no_buffers_even_with_some_posted() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        post_rx(&mut driver, 8, 1024);
        let host = Host::with(&[frame(100)]);
        let s = shared();
        assert_eq!(
            direct(&mut rx, &s, &host, 3000, 100).0,
            Ok(Direct::Delivered(100))
        );
        assert!(
            rx.has_buffers(),
            "two buffers stay posted for the next frame"
        );
        rx.fail(RingError::HeadOutOfRange { head: 99, size: 16 });
        assert!(rx.usable().is_none());
        // handle_rx will not run on a broken queue: if has_buffers said yes, busy_poll's
        // host_ready check (and arm_host's EPOLLIN) would fire on every readable host fd.
        assert!(!rx.has_buffers(), "a broken queue reports posted buffers");
    }

    #[test]
    fn too_few_buffers_for_the_largest_frame_read_nothing_and_hold_nothing() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        post_rx(&mut driver, 2, 1024);
        let host = Host::with(&[frame(100)]);
        let s = shared();
        assert_eq!(direct(&mut rx, &s, &host, 3000, 100).0, Ok(Direct::NoRoom));
        // The two buffers are back on the ring: a copied frame takes the first.
        assert_eq!(rx.deliver(&s, &mut frame(100)), Ok(Delivery::Delivered));
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 100)]);
    }

    #[test]
    fn a_frame_longer_than_the_posted_buffers_goes_on_into_more_or_is_dropped() {
        let (mut rx, mut driver, mem) = rx_path(MRG);
        post_rx(&mut driver, 3, 1024);
        let long = frame(2500);
        let host = Host::with(std::slice::from_ref(&long));
        let s = shared();
        // Posted for a 1000-byte frame (one buffer): the rest lands in the tail, then in two
        // more buffers.
        assert_eq!(
            direct(&mut rx, &s, &host, 1000, 2500).0,
            Ok(Direct::Delivered(2500))
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 1024), (1, 1024), (2, 452)]);
        let mut got = vec![0u8; 1024];
        mem.read(Pair::buf(1, 0).addr, &mut got).unwrap();
        assert_eq!(got[..], long[1024..2048]);
        // No more buffers for the rest: dropped, counted, the posted buffer kept.
        post_rx(&mut driver, 1, 1024);
        let host = Host::with(&[frame(2500)]);
        assert_eq!(
            direct(&mut rx, &s, &host, 1000, 2500).0,
            Ok(Direct::Dropped)
        );
        assert_eq!(rx.queue.as_ref().unwrap().counters().dropped.get(), 1);
        rx.queue.as_mut().unwrap().flush();
        assert!(used(&mut driver).is_empty());
        assert!(rx.has_buffers(), "the buffer stays posted");
    }

    #[test]
    fn a_chain_of_more_segments_than_one_read_takes_goes_through_the_bounce_path() {
        let features = MRG | Features::RING_INDIRECT_DESC;
        let s = crate::testing::setup_sized(QueueId::Rx(0), features, 1024);
        let mut rx = RxPath::with_queue(s.runtime);
        // One buffer of 100 one-byte segments: more than a readv of MAX_IOVECS takes.
        post_indirect(&s.mem, &[100]);
        let host = Host::with(&[frame(60)]);
        assert_eq!(
            direct(&mut rx, &shared(), &host, 60, 60).0,
            Ok(Direct::NoRoom)
        );
        // Nothing was read or consumed: the copy path delivers it into that buffer.
        assert_eq!(
            rx.deliver(&shared(), &mut frame(60)),
            Ok(Delivery::Delivered)
        );
    }

    #[test]
    fn a_frame_the_filter_refuses_uses_no_buffer() {
        let (mut rx, mut driver, _mem) = rx_path(Features::VERSION_1);
        post_rx(&mut driver, 2, 1536);
        let s = shared();
        s.set_promisc(false);
        let mut other = frame(100);
        other[vnet::HDR_LEN..vnet::HDR_LEN + 6].copy_from_slice(&[0x02, 1, 2, 3, 4, 5]);
        let mut ours = frame(100);
        ours[vnet::HDR_LEN..vnet::HDR_LEN + 6].copy_from_slice(&s.mac());
        let host = Host::with(&[other, ours]);
        assert_eq!(direct(&mut rx, &s, &host, 1530, 100).0, Ok(Direct::Dropped));
        assert_eq!(rx.queue.as_ref().unwrap().counters().filtered.get(), 1);
        assert_eq!(
            direct(&mut rx, &s, &host, 1530, 100).0,
            Ok(Direct::Delivered(100))
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(
            used(&mut driver),
            [(0, 100)],
            "the refused frame took no buffer"
        );
    }

    #[test]
    fn a_mergeable_frame_spans_buffers_and_says_how_many() {
        let (mut rx, mut driver, mem) = rx_path(MRG);
        post_rx(&mut driver, 4, 1024);
        let mut f = frame(3000);
        assert_eq!(rx.deliver(&shared(), &mut f), Ok(Delivery::Delivered));
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 1024), (1, 1024), (2, 952)]);
        // num_buffers, in the first buffer's header.
        let mut hdr = [0u8; vnet::HDR_LEN];
        mem.read(Pair::buf(0, 0).addr, &mut hdr).unwrap();
        assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 3);
        let mut tail = [0u8; 952];
        mem.read(Pair::buf(2, 0).addr, &mut tail).unwrap();
        assert_eq!(&tail[..], &f[2048..]);
    }

    #[test]
    fn too_few_buffers_consume_nothing() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        post_rx(&mut driver, 2, 1024);
        assert_eq!(
            rx.deliver(&shared(), &mut frame(3000)),
            Ok(Delivery::NoRoom)
        );
        // The two buffers are still there for a frame that fits.
        assert_eq!(
            rx.deliver(&shared(), &mut frame(2000)),
            Ok(Delivery::Delivered)
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 1024), (1, 976)]);
    }

    #[test]
    fn without_mergeable_buffers_a_long_frame_is_dropped_and_the_buffer_kept() {
        let (mut rx, mut driver, _mem) = rx_path(Features::VERSION_1);
        post_rx(&mut driver, 1, 1024);
        assert_eq!(
            rx.deliver(&shared(), &mut frame(2000)),
            Ok(Delivery::Dropped)
        );
        let q = rx.queue.as_mut().unwrap();
        assert_eq!(q.counters().dropped.get(), 1);
        q.flush();
        assert!(used(&mut driver).is_empty());
        assert_eq!(
            rx.deliver(&shared(), &mut frame(100)),
            Ok(Delivery::Delivered)
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 100)]);
    }

    #[test]
    fn the_receive_filter_drops_frames_for_other_macs() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        post_rx(&mut driver, 1, 1024);
        let s = shared();
        s.set_promisc(false);
        let mut f = frame(100);
        f[vnet::HDR_LEN..vnet::HDR_LEN + 6].copy_from_slice(&[0x02, 1, 2, 3, 4, 5]);
        assert_eq!(rx.deliver(&s, &mut f), Ok(Delivery::Dropped));
        let q = rx.queue.as_ref().unwrap();
        assert_eq!(q.counters().filtered.get(), 1);
        // A burst refuses the frame too, and leaves it to `deliver`.
        assert_eq!(rx.deliver_burst(&s, &mut f, 8).unwrap(), 0);
    }

    #[test]
    fn a_burst_fills_one_buffer_per_frame_up_to_its_limit() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        post_rx(&mut driver, 6, 128);
        let mut f = frame(100);
        assert_eq!(rx.deliver_burst(&shared(), &mut f, 4).unwrap(), 4);
        assert_eq!(rx.deliver_burst(&shared(), &mut f, 4).unwrap(), 2);
        assert_eq!(rx.deliver_burst(&shared(), &mut f, 4).unwrap(), 0);
        rx.queue.as_mut().unwrap().flush();
        let got = used(&mut driver);
        assert_eq!(got.len(), 6);
        assert!(got.iter().all(|&(_, len)| len == 100));
        // A frame longer than the first buffer is left to `deliver`.
        post_rx(&mut driver, 1, 64);
        assert_eq!(rx.deliver_burst(&shared(), &mut f, 4).unwrap(), 0);
    }

    #[test]
    fn a_frame_larger_than_every_buffer_the_queue_holds_is_dropped_not_waited_for() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        // The queue (16 entries) full of 64-byte buffers: 1024 bytes in all.
        post_rx(&mut driver, 16, 64);
        assert_eq!(
            rx.deliver(&shared(), &mut frame(2000)),
            Ok(Delivery::Dropped)
        );
        let q = rx.queue.as_mut().unwrap();
        assert_eq!(q.counters().dropped.get(), 1);
        q.flush();
        assert!(used(&mut driver).is_empty(), "the buffers are kept");
        assert_eq!(
            rx.deliver(&shared(), &mut frame(100)),
            Ok(Delivery::Delivered)
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 64), (1, 36)]);
    }

    /// Posts, as a hostile guest may, indirect chains of `segments` one-byte writable buffers
    /// each (one per avail entry from 0), by writing the rings of a 1024-entry queue at
    /// `testkit::pair::RING_BASE` directly.
    fn post_indirect(mem: &GuestMemory, chains: &[u16]) {
        use testkit::pair::{DATA_BASE, INDIRECT_BASE, RING_BASE};
        use vring::GuestAddress;
        let rings = vring::RingAddresses::contiguous(RING_BASE, 1024);
        let desc = |addr: u64, len: u32, flags: u16, next: u16| {
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..].copy_from_slice(&next.to_le_bytes());
            d
        };
        for (head, &n) in chains.iter().enumerate() {
            let table = INDIRECT_BASE.0 + head as u64 * 0x4000;
            for j in 0..n {
                let flags = 2 | if j + 1 < n { 1 } else { 0 };
                let d = desc(DATA_BASE.0 + j as u64, 1, flags, j + 1);
                mem.write(GuestAddress(table + j as u64 * 16), &d).unwrap();
            }
            let d = desc(table, n as u32 * 16, 4, 0);
            mem.write(GuestAddress(rings.desc.0 + head as u64 * 16), &d)
                .unwrap();
            let slot = GuestAddress(rings.avail.0 + 4 + head as u64 * 2);
            mem.write(slot, &(head as u16).to_le_bytes()).unwrap();
        }
        let idx = GuestAddress(rings.avail.0 + 2);
        mem.write(idx, &(chains.len() as u16).to_le_bytes())
            .unwrap();
    }

    #[test]
    fn a_frame_over_more_segments_than_a_frame_may_take_is_dropped_and_chains_shrink_back() {
        let features = MRG | Features::RING_INDIRECT_DESC;
        // Indirect tables may hold up to the queue size.
        let s = crate::testing::setup_sized(QueueId::Rx(0), features, 1024);
        let mut rx = RxPath::with_queue(s.runtime);
        // Buffers of 600 one-byte segments: a 1000-byte frame needs two, 1200 segments.
        post_indirect(&s.mem, &[600, 600, 600]);
        assert_eq!(
            rx.deliver(&shared(), &mut frame(1000)),
            Ok(Delivery::Dropped)
        );
        assert_eq!(rx.queue.as_ref().unwrap().counters().dropped.get(), 1);
        assert!(rx.chains.iter().all(|c| c.capacity() <= KEEP_SEGMENTS));
        // One buffer's 600 segments are within the bound: a 500-byte frame goes in, and
        // the chains give back what it made them grow to.
        assert_eq!(
            rx.deliver(&shared(), &mut frame(500)),
            Ok(Delivery::Delivered)
        );
        let q = rx.queue.as_mut().unwrap();
        assert_eq!(q.engine_stats().used, 1);
        assert!(rx.chains.iter().all(|c| c.capacity() <= KEEP_SEGMENTS));
        rx.release();
        assert_eq!(rx.chains.capacity(), 0, "a stopped queue keeps no chains");
    }

    #[test]
    fn an_rx_buffer_with_no_writable_bytes_breaks_the_queue() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        driver.add(&[Pair::buf(0, 64)], &[], 0).unwrap();
        let e = rx.deliver(&shared(), &mut frame(100)).unwrap_err();
        assert_eq!(e, RingError::NoWritableBytes { head: 0 });
    }

    #[test]
    fn blocked_rx_waits_until_the_guest_posts_more() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        assert!(!rx.has_buffers());
        rx.block();
        assert!(rx.still_blocked());
        post_rx(&mut driver, 1, 1024);
        assert!(!rx.still_blocked());
        assert!(rx.has_buffers());
        // Once moved on, it stays unblocked until the next block.
        assert!(!rx.still_blocked());
    }

    /// Found by the vhost_user fuzz target's liveness check: the null port's rx stalled for
    /// good when the guest posted its buffers (and kicked) between the pop that found none and
    /// `block`, which took them as already seen.
    #[test]
    fn buffers_posted_after_rx_lacked_room_wake_it_even_before_it_blocks() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        assert_eq!(rx.deliver(&shared(), &mut frame(100)), Ok(Delivery::NoRoom));
        post_rx(&mut driver, 1, 1024);
        rx.block();
        assert!(!rx.still_blocked(), "the new buffer was taken as seen");
        assert_eq!(
            rx.deliver(&shared(), &mut frame(100)),
            Ok(Delivery::Delivered)
        );
    }

    #[test]
    fn a_ring_error_breaks_the_rx_queue_and_signals_the_frontend() {
        let s = setup(QueueId::Rx(0), MRG);
        let mut rx = RxPath::with_queue(s.runtime);
        // An avail index 100 ahead of a queue of 16: the guest broke the ring.
        let avail = testkit::RING_BASE.0 + 16 * 16;
        s.mem
            .write(vring::GuestAddress(avail + 2), &100u16.to_le_bytes())
            .unwrap();
        assert!(!rx.has_buffers());
        assert!(rx.usable().is_none());
        let q = rx.queue.as_ref().unwrap();
        assert!(q.counters().is_broken());
        assert_eq!(s.err.read().unwrap(), 1);
    }

    /// With a dirty log (live migration), every rx path marks the pages of the bytes it put
    /// in the guest's buffers, by length, and the used ring's; the buffers still posted are
    /// not marked, unless a frame the filter refused was read into them.
    #[test]
    fn a_logging_rx_queue_marks_exactly_the_buffer_bytes_each_path_wrote() {
        let (mut rx, mut driver, _mem) = rx_path(MRG);
        let bytes = (testkit::MEM_SIZE as u64 / vring::memory::LOG_PAGE).div_ceil(8);
        let logmem = GuestMemory::memfd(&[(vring::GuestAddress(0), bytes as usize)]).unwrap();
        let file = logmem
            .regions()
            .next()
            .unwrap()
            .file
            .unwrap()
            .try_clone()
            .unwrap();
        let log = Arc::new(vring::DirtyLog::from_file(file, bytes, 0).unwrap());
        let q = &mut rx.queue.as_mut().unwrap().engine();
        let used_ring = q.config().rings().used;
        q.set_dirty_log(Some(log.clone()), used_ring);
        let page = |i: u64| Pair::buf(i, 0).addr.0 / 4096;
        let ring = used_ring.0 / 4096;
        post_rx(&mut driver, 12, 1024);
        let s = shared();
        // A direct read of 2500 bytes fills buffers 0, 1 and 452 bytes of 2; 3 and 4 stay
        // posted for the next frame.
        let host = Host::with(&[frame(2500)]);
        assert_eq!(
            direct(&mut rx, &s, &host, 5000, 2500).0,
            Ok(Direct::Delivered(2500))
        );
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(log.take_dirty(), [ring, page(0), page(1), page(2)]);
        rx.release();
        // A copied frame over the two buffers given back (3, 4), then a burst of two (5, 6).
        assert_eq!(rx.deliver(&s, &mut frame(1500)), Ok(Delivery::Delivered));
        assert_eq!(rx.deliver_burst(&s, &mut frame(100), 2), Ok(2));
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(log.take_dirty(), [ring, page(3), page(4), page(5), page(6)]);
        // A 1500-byte frame for another MAC, read into buffers 7 and 8 (posted for 2000
        // bytes), refused: they stay posted, and the bytes it left there are marked.
        s.set_promisc(false);
        let mut other = frame(1500);
        other[vnet::HDR_LEN..vnet::HDR_LEN + 6].copy_from_slice(&[0x02, 1, 2, 3, 4, 5]);
        let host = Host::with(&[other]);
        assert_eq!(
            direct(&mut rx, &s, &host, 2000, 1500).0,
            Ok(Direct::Dropped)
        );
        assert_eq!(log.take_dirty(), [page(7), page(8)]);
    }

    /// A header that ends its cache line (DPDK's mbufs) is compared with what the buffer holds
    /// and left when the same: whether the buffer held a stale header, the one it gets, or
    /// garbage, each frame lands with its own header, byte for byte.
    #[test]
    fn a_header_at_the_end_of_its_line_lands_whatever_the_buffer_held() {
        let (mut rx, mut driver, mem) = rx_path(MRG);
        // The header in the last 12 bytes of a line, the frame from the next.
        let at = |slot: u64| vring::GuestAddress(Pair::buf(slot, 0).addr.0 + 128 - 12);
        assert_eq!(at(0).0 % 64, 52);
        let f = frame(64);
        let hdr = vnet::NetHdr {
            flags: 2, // DATA_VALID, zero for this guest
            ..Default::default()
        };
        let mut want = hdr;
        want.flags = 0;
        want.num_buffers = 1;
        let stale = vnet::NetHdr {
            flags: 1,
            gso_type: 1,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 7,
        };
        mem.write(at(0), &stale.to_bytes()).unwrap();
        mem.write(at(1), &want.to_bytes()).unwrap();
        mem.write(at(2), &[0xa5; 76]).unwrap();
        for slot in 0..3 {
            driver
                .add(&[], &[vring::Buf::new(at(slot), 2048 - 128)], slot as u32)
                .unwrap();
        }
        let piece = Pieces {
            hdr,
            prefix: &f[..],
            rest: None,
        };
        let mut out = [Delivery::NoRoom; 3];
        rx.deliver_pieces(&shared(), &[&piece; 3], &mut out)
            .unwrap();
        assert_eq!(out, [Delivery::Delivered; 3]);
        rx.queue.as_mut().unwrap().flush();
        assert_eq!(used(&mut driver), [(0, 76), (1, 76), (2, 76)]);
        let landed = [&want.to_bytes()[..], &f[..]].concat();
        for (slot, held) in ["a stale header", "the same header", "garbage"]
            .iter()
            .enumerate()
        {
            let mut got = vec![0u8; landed.len()];
            mem.read(at(slot as u64), &mut got).unwrap();
            assert_eq!(got, landed, "the buffer held {held}");
        }
    }

    /// Frames in pieces (a header, the first 64 bytes, the rest in another guest's memory
    /// split over two segments) land byte for byte whatever the buffers' shape: one buffer,
    /// a chain whose first segment holds the header and first bytes and whose second the rest,
    /// a chain whose first segment is too short even for the header, and three merged
    /// buffers. The header's DATA_VALID goes to a guest without GUEST_CSUM as flags zero.
    #[test]
    fn frames_in_pieces_land_byte_for_byte_in_buffers_of_any_shape() {
        let (mut rx, mut driver, mem) = rx_path(MRG);
        let at = |slot: u64, skip: u64| vring::GuestAddress(Pair::buf(slot, 0).addr.0 + skip);
        let b = |slot: u64, skip: u64, len: u32| vring::Buf::new(at(slot, skip), len);
        driver.add(&[], &[b(0, 0, 2048)], 0).unwrap();
        driver.add(&[], &[b(1, 0, 80), b(2, 0, 2048)], 1).unwrap();
        driver.add(&[], &[b(3, 0, 8), b(4, 0, 2048)], 2).unwrap();
        for slot in 5..8 {
            driver.add(&[], &[b(slot, 0, 600)], slot as u32).unwrap();
        }
        let sender = GuestMemory::anonymous(&[(vring::GuestAddress(0), 0x4000)]).unwrap();
        let f = frame(1500);
        sender
            .write(vring::GuestAddress(0x100), &f[64..1000])
            .unwrap();
        sender
            .write(vring::GuestAddress(0x2000), &f[1000..])
            .unwrap();
        let segs = [
            vring::Segment {
                addr: vring::GuestAddress(0x100),
                len: 936,
            },
            vring::Segment {
                addr: vring::GuestAddress(0x2000),
                len: 500,
            },
        ];
        let hdr = vnet::NetHdr {
            flags: 2, // DATA_VALID
            ..Default::default()
        };
        let piece = Pieces {
            hdr,
            prefix: &f[..64],
            rest: Some((&sender, vring::Tail::new(&segs))),
        };
        let mut out = [Delivery::NoRoom; 4];
        rx.deliver_pieces(&shared(), &[&piece; 4], &mut out)
            .unwrap();
        assert_eq!(out, [Delivery::Delivered; 4]);
        rx.queue.as_mut().unwrap().flush();
        let total = (vnet::HDR_LEN + 1500) as u32;
        assert_eq!(
            used(&mut driver),
            [
                (0, total),
                (1, total),
                (2, total),
                (5, 600),
                (6, 600),
                (7, total - 1200)
            ]
        );
        let want = |buffers: u16| {
            // DATA_VALID is for a guest with GUEST_CSUM: this one gets flags zero.
            let mut h = hdr;
            h.flags = 0;
            h.num_buffers = buffers;
            [&h.to_bytes()[..], &f[..]].concat()
        };
        let read = |pieces: &[(u64, usize)]| {
            let mut got = Vec::new();
            for &(slot, len) in pieces {
                let mut b = vec![0u8; len];
                mem.read(at(slot, 0), &mut b).unwrap();
                got.extend(b);
            }
            got
        };
        let total = total as usize;
        assert_eq!(read(&[(0, total)]), want(1), "one buffer");
        assert_eq!(
            read(&[(1, 80), (2, total - 80)]),
            want(1),
            "header in the first"
        );
        assert_eq!(read(&[(3, 8), (4, total - 8)]), want(1), "header split");
        assert_eq!(
            read(&[(5, 600), (6, 600), (7, total - 1200)]),
            want(3),
            "merged"
        );
    }
}
