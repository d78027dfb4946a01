//! The `tap` port: guest frames to and from one queue of a multi-queue TAP device, with the
//! virtio-net header on every frame (IFF_VNET_HDR), so offloads pass through unchanged.
//!
//! tx copies each frame's virtio-net header out of guest memory once and checks the copy
//! against the negotiated features and the frame (a header a driver must not send is dropped
//! and counted by reason), then writes that copy and the frame after it straight from guest
//! memory, one writev per frame, so that the TAP gets the header that was checked, whatever
//! the guest writes meanwhile: a system call each
//! ([`TapIo::Syscalls`]), or a burst of up to 64 frames submitted with one `io_uring_enter`
//! ([`TapIo::Uring`], `vring::UringWriter`). A chain of more segments than one writev takes
//! is dropped and counted, never cut short. A frame the TAP cannot take yet (its send buffer
//! is full) stays on the tx ring, with the frames after it, until the TAP is writable again.
//!
//! rx reads each frame with one readv straight into the guest's buffers, once the guest has
//! posted enough for the largest frame the negotiated offloads allow (`RxPath::receive_direct`).
//! When it has not, the frame is read into a bounce buffer and copied; one that does not fit
//! the posted buffers waits here, as vhost_net leaves it queued, until the guest posts more.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use std::sync::atomic::Ordering::Relaxed;

use vnet::{feature, NetHdr, TxHdrError};
use vring::{Chain, Error as RingError, Features, Gather, GuestMemory, Reader, Tail};

use super::batch::BatchWriter;
use super::{deliver_bounced, send_each, tx_outcome, Host, Received, Sent};
use crate::rx::{Direct, RxPath};
use crate::shared::Shared;
use virtnet_sys::tap::TapQueue;

/// The largest frame the rx path reads: a 64 KiB GSO frame and its header.
pub(crate) const MAX_RX_FRAME: usize = 65536 + vnet::HDR_LEN + 14 + 4;

/// How guest tx frames are written into the TAP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TapIo {
    /// One `writev` system call per frame.
    Syscalls,
    /// A burst of up to 64 frames per `io_uring_enter` (one writev each, in order); where the
    /// kernel has no usable io_uring, the port falls back to `Syscalls`.
    #[default]
    Uring,
}

impl std::str::FromStr for TapIo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "syscalls" => Ok(TapIo::Syscalls),
            "uring" => Ok(TapIo::Uring),
            _ => Err(format!("expected syscalls or uring, not {s:?}")),
        }
    }
}

#[derive(Debug)]
pub struct TapPort {
    tap: TapQueue,
    /// Batched tx ([`TapIo::Uring`]); None: one writev system call per frame.
    batch: Option<BatchWriter>,
    /// A frame read from the TAP (its length in `bounce`) that did not fit the posted rx
    /// buffers: it goes first once the guest posts more.
    pending: Option<usize>,
    /// Frames wait here when the guest has posted too few buffers; reads into guest buffers
    /// sized for the usual frame put what does not fit here.
    bounce: Vec<u8>,
}

impl TapPort {
    /// A port on `tap`, writing guest tx as `io` says (or with system calls, where io_uring
    /// cannot be set up: logged). `pushback`: the TAP has a send-buffer limit, so that a
    /// write may find it full; a batch then stops at such a frame (linked writes), so that it
    /// and the frames after it wait on the ring, in order. Without a limit Linux builds each
    /// frame in place and never says EAGAIN, and the writes go unlinked, which is cheaper.
    pub fn new(tap: TapQueue, io: TapIo, pushback: bool) -> TapPort {
        let batch = match io {
            TapIo::Syscalls => None,
            TapIo::Uring => match BatchWriter::new(tap.as_fd(), pushback) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring unavailable: TAP tx by system calls");
                    None
                }
            },
        };
        TapPort {
            tap,
            batch,
            pending: None,
            bounce: vec![0u8; MAX_RX_FRAME],
        }
    }
}

/// The largest frame a TAP hands out with `features` negotiated (so its offloads set) on a
/// link of `mtu`: 64 KiB with any receive segmentation offload, else one MTU-sized frame
/// with a VLAN tag.
pub fn max_rx_frame(features: Features, mtu: u16) -> usize {
    let gso = feature::GUEST_TSO4
        | feature::GUEST_TSO6
        | feature::GUEST_UFO
        | feature::GUEST_USO4
        | feature::GUEST_USO6;
    if features.intersection(gso) != Features::EMPTY {
        MAX_RX_FRAME
    } else {
        vnet::hdr_len(features) + 14 + 4 + mtu.max(1500) as usize
    }
}

/// A tx frame's virtio-net header, copied out of guest memory once and checked: the bytes the
/// TAP gets (never the guest's, read again).
#[derive(Clone, Copy, Debug, Default)]
pub struct TxHead {
    bytes: [u8; vnet::HDR_LEN],
    len: u8,
}

impl TxHead {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// What [`check_header`] found: the checked header and the frame after it, or why the header
/// must not reach the TAP.
pub type Checked<'c> = Result<(TxHead, Tail<'c>), TxHdrError>;

/// Copies the virtio-net header at the start of `chain`'s readable part and checks the copy
/// against the negotiated `features` and the frame after it. The outer error is a ring error
/// (a segment outside memory breaks the queue); the inner one, a header the TAP must not get.
fn check_header<'c>(
    mem: &GuestMemory,
    chain: &'c Chain,
    features: Features,
) -> Result<Checked<'c>, RingError> {
    let hdr_len = vnet::hdr_len(features);
    let total = chain.readable_len() as usize;
    if total < hdr_len {
        return Ok(Err(TxHdrError::Short));
    }
    let mut head = TxHead {
        len: hdr_len as u8,
        ..TxHead::default()
    };
    let mut r = Reader::new(mem, chain.readable());
    r.read_exact(&mut head.bytes[..hdr_len])?;
    Ok(NetHdr::from_bytes(&head.bytes)
        .check_tx(features, total - hdr_len)
        .map(|()| (head, r.tail())))
}

impl Host for TapPort {
    const POLL_EVERY: u32 = 8;

    fn rx_stopped(&mut self) -> bool {
        self.pending.take().is_some()
    }

    fn send(
        &mut self,
        mem: &GuestMemory,
        chain: &Chain,
        _rx: &mut RxPath,
        shared: &Shared,
    ) -> Result<Sent, RingError> {
        // The kernel's virtio_net_hdr_to_skb trusts the header: check it first.
        let features = Features(shared.features.load(Relaxed));
        let (head, body) = match check_header(mem, chain, features)? {
            Ok(checked) => checked,
            Err(why) => return Ok(Sent::Refused(why)),
        };
        tx_outcome(
            self.tap
                .write_frame(mem, Gather::new(head.as_bytes(), body)),
        )
    }

    fn tx_batch(&self) -> usize {
        match &self.batch {
            Some(_) => vring::memory::MAX_URING_BATCH,
            None => 1,
        }
    }

    fn send_batch(
        &mut self,
        mem: &GuestMemory,
        chains: &[Chain],
        rx: &mut RxPath,
        shared: &Shared,
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let Some(batch) = self.batch.as_mut() else {
            return send_each(self, mem, chains, rx, shared, sent);
        };
        // The kernel's virtio_net_hdr_to_skb trusts the header: check it first.
        let features = Features(shared.features.load(Relaxed));
        let r = batch.send(mem, chains, sent, |c| check_header(mem, c, features));
        if batch.is_dead() {
            // The frames it did not write go by system calls.
            tracing::warn!("io_uring failed: TAP tx by system calls from now on");
            self.batch = None;
        }
        r
    }

    fn receive(
        &mut self,
        rx: &mut RxPath,
        shared: &Shared,
        _room: usize,
    ) -> Result<Received, RingError> {
        let n = match self.pending.take() {
            Some(n) => n,
            None => {
                // Read the TAP only when the guest has posted buffers, so frames wait in the
                // kernel instead of here.
                if !rx.has_buffers() {
                    return Ok(Received::default());
                }
                // Straight into the guest's buffers when it has posted enough for the largest
                // frame: with the MTU in effect (NET_SET_MTU may change it).
                let features = rx.queue.as_ref().map(|q| q.features());
                let mtu = shared.mtu.load(Relaxed);
                let max_frame = max_rx_frame(features.unwrap_or_default(), mtu);
                let tap = &self.tap;
                let read = |mem: &GuestMemory, segs: &[_], tail: &mut [u8]| {
                    tap.read_frame(mem, segs, tail)
                };
                match rx.receive_direct(shared, max_frame, &mut self.bounce, read)? {
                    Direct::Delivered(n) => return Ok(Received::one(n, rx.hdr_len())),
                    Direct::Dropped => return Ok(Received::DROPPED),
                    Direct::Empty => return Ok(Received::default()),
                    Direct::NoRoom => {}
                }
                let Ok(n) = self.tap.read(&mut self.bounce) else {
                    return Ok(Received::default());
                };
                if let Some(q) = &rx.queue {
                    q.counters().rx_bounced.add(1);
                }
                n
            }
        };
        deliver_bounced(rx, shared, &mut self.bounce, n, &mut self.pending)
    }

    fn writable(&self) -> bool {
        virtnet_sys::writable_now(self.tap.as_raw_fd())
    }

    fn has_frames(&self) -> bool {
        self.pending.is_some() || virtnet_sys::readable_now(self.tap.as_raw_fd())
    }

    fn holds_frame(&self) -> bool {
        self.pending.is_some()
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use testkit::Pair;
    use vnet::{feature, HDR_F_NEEDS_CSUM};
    use vring::Buf;

    use super::*;
    use crate::queue::QueueId;
    use crate::testing::setup;

    /// A tx chain: `hdr` then a `payload`-byte frame, the header split across two buffers.
    fn chain(hdr: NetHdr, payload: u32) -> (Chain, crate::testing::Setup) {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        let bytes = hdr.to_bytes();
        s.mem.write(Pair::buf(0, 0).addr, &bytes[..4]).unwrap();
        s.mem.write(Pair::buf(1, 0).addr, &bytes[4..]).unwrap();
        let bufs = [
            Pair::buf(0, 4),
            Pair::buf(1, vnet::HDR_LEN as u32 - 4),
            Pair::buf(2, payload),
        ];
        s.driver.add(&bufs, &[], 0).unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        (c, s)
    }

    #[test]
    fn a_tx_header_split_across_buffers_is_read_whole_and_checked() {
        let csum = NetHdr {
            flags: HDR_F_NEEDS_CSUM,
            csum_start: 14,
            csum_offset: 6,
            ..NetHdr::default()
        };
        let with_csum = Features::VERSION_1 | feature::CSUM;
        let (c, s) = chain(csum, 60);
        let mem = s.runtime.memory();
        assert!(matches!(check_header(mem, &c, with_csum), Ok(Ok(_))));
        // Without CSUM negotiated, or with the checksum past the frame: refused.
        assert!(matches!(
            check_header(mem, &c, Features::VERSION_1),
            Ok(Err(TxHdrError::NotNegotiated))
        ));
        let (c, s) = chain(csum, 21);
        let mem = s.runtime.memory();
        assert!(matches!(
            check_header(mem, &c, with_csum),
            Ok(Err(TxHdrError::Csum { .. }))
        ));
    }

    #[test]
    fn a_tx_chain_shorter_than_its_header_is_refused() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        s.driver
            .add(&[Buf::new(Pair::buf(0, 0).addr, 8)], &[], 0)
            .unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        let got = check_header(s.runtime.memory(), &c, Features::VERSION_1);
        assert!(matches!(got, Ok(Err(TxHdrError::Short))));
    }

    /// A frame the TAP can never take for want of memory (Linux allocates a linear
    /// skb for it: ENOBUFS above about 4 MiB, every time) must not reach it.
    #[test]
    fn a_tx_frame_of_megabytes_is_refused() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        s.mem
            .write(Pair::buf(0, 0).addr, &[0u8; vnet::HDR_LEN])
            .unwrap();
        // 12-byte header, then 8 x 1 MiB segments over the same guest pages: 8 MiB.
        let mut bufs = vec![Pair::buf(0, vnet::HDR_LEN as u32)];
        bufs.extend((0..8).map(|_| Buf::new(Pair::buf(1, 0).addr, 1 << 20)));
        s.driver.add(&bufs, &[], 0).unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        assert_eq!(c.readable_len(), (vnet::HDR_LEN + (8 << 20)) as u64);
        let got = check_header(s.runtime.memory(), &c, Features::VERSION_1);
        assert!(matches!(
            got,
            Ok(Err(TxHdrError::TooLong { len: 0x80_0000 }))
        ));
    }
}
