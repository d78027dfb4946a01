//! The guest traffic of a `vhost_user` input: tx chains (a virtio-net header and a frame
//! cut into buffers), rx chains, kicks and waits, on the rings the frontend set up; and the
//! encoding the seed tests write (`crate::encode`).

use arbitrary::Arbitrary;
use vnet::{NetHdr, HDR_F_NEEDS_CSUM};

use crate::encode::{variant, Encode};
use crate::encode_struct;

/// Where a buffer of a guest chain lies.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Segment {
    /// `n` bytes at the next free bytes of the data area (the upper half of the lowest region
    /// of the last memory table), wrapping to its start; 0 is a zero-length buffer, more than
    /// the area runs off it.
    Data(u16),
    /// `len` bytes at guest address `addr`: outside memory, across a region's end, over the
    /// rings or another chain's buffers.
    Raw { addr: u64, len: u32 },
}

/// The virtio-net header in front of a guest tx frame.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hdr {
    /// No offload: all zero.
    Plain,
    /// NEEDS_CSUM, the checksum at `start + offset`.
    Csum { start: u16, offset: u16 },
    /// A GSO frame as drivers send it: NEEDS_CSUM and a GSO type, size and header length.
    Gso {
        gso_type: u8,
        gso_size: u16,
        hdr_len: u16,
        csum_start: u16,
        csum_offset: u16,
    },
    /// Any 12 bytes.
    Raw([u8; 12]),
}

impl Hdr {
    pub fn net_hdr(self) -> NetHdr {
        match self {
            Hdr::Plain => NetHdr::default(),
            Hdr::Csum { start, offset } => NetHdr {
                flags: HDR_F_NEEDS_CSUM,
                csum_start: start,
                csum_offset: offset,
                ..NetHdr::default()
            },
            Hdr::Gso {
                gso_type,
                gso_size,
                hdr_len,
                csum_start,
                csum_offset,
            } => NetHdr {
                flags: HDR_F_NEEDS_CSUM,
                gso_type,
                hdr_len,
                gso_size,
                csum_start,
                csum_offset,
                num_buffers: 0,
            },
            Hdr::Raw(b) => NetHdr::from_bytes(&b),
        }
    }
}

/// A guest tx frame: its header, then the first bytes of the frame (the chain's segments
/// decide its length; bytes past `payload` are whatever the buffers held).
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub hdr: Hdr,
    pub payload: Vec<u8>,
}
encode_struct!(Frame { hdr, payload });

impl Frame {
    /// The bytes the guest writes: the header cut to `hdr_len` (10 or 12), then the payload.
    pub fn bytes(&self, hdr_len: usize) -> Vec<u8> {
        let mut b = self.hdr.net_hdr().to_bytes()[..hdr_len].to_vec();
        b.extend(&self.payload);
        b
    }
}

/// What the hostile frontend's guest does on virtqueue `queue % virtqueues` (rx `2p`, tx
/// `2p + 1`, then the control queue), through a driver on the rings the frontend last set up
/// for it, in the memory of the last table it sent. Nothing happens before a table maps.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum GuestOp {
    /// A tx chain: `frame` written across the readable `Data` segments in order, then the
    /// writable segments (none from an honest driver).
    Tx {
        queue: u8,
        frame: Frame,
        readable: Vec<Segment>,
        writable: Vec<Segment>,
    },
    /// `1 + count % 64` rx chains, each of the readable segments (none from an honest
    /// driver), then the writable ones.
    Rx {
        queue: u8,
        count: u8,
        readable: Vec<Segment>,
        writable: Vec<Segment>,
    },
    /// The driver's kick decision, then a kick whatever it said.
    Kick(u8),
    /// Waits a little for the workers, taking back used buffers (see `guest::Guest::settle`).
    Settle,
}

impl Encode for Segment {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Segment::Data(n) => (variant(0, 2, out), n.encode(out)).1,
            Segment::Raw { addr, len } => {
                variant(1, 2, out);
                addr.encode(out);
                len.encode(out);
            }
        }
    }
}

impl Encode for Hdr {
    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Hdr::Plain => variant(0, 4, out),
            Hdr::Csum { start, offset } => {
                variant(1, 4, out);
                start.encode(out);
                offset.encode(out);
            }
            Hdr::Gso {
                gso_type,
                gso_size,
                hdr_len,
                csum_start,
                csum_offset,
            } => {
                variant(2, 4, out);
                gso_type.encode(out);
                gso_size.encode(out);
                hdr_len.encode(out);
                csum_start.encode(out);
                csum_offset.encode(out);
            }
            Hdr::Raw(b) => (variant(3, 4, out), b.encode(out)).1,
        }
    }
}

impl Encode for GuestOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 4;
        match self {
            GuestOp::Tx {
                queue,
                frame,
                readable,
                writable,
            } => {
                variant(0, N, out);
                queue.encode(out);
                frame.encode(out);
                readable.encode(out);
                writable.encode(out);
            }
            GuestOp::Rx {
                queue,
                count,
                readable,
                writable,
            } => {
                variant(1, N, out);
                queue.encode(out);
                count.encode(out);
                readable.encode(out);
                writable.encode(out);
            }
            GuestOp::Kick(q) => (variant(2, N, out), q.encode(out)).1,
            GuestOp::Settle => variant(3, N, out),
        }
    }
}
