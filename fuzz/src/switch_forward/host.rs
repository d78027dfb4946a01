//! The uplink's frames: what the host's kernel hands the switch through its TAP, a frame
//! (built or raw, as a guest's) behind the virtio-net header the kernel writes for it
//! (`virtio_net_hdr_from_skb`, for the offloads the switch's TAP takes: checksum, TSO4, TSO6,
//! ECN, USO). The kernel is trusted to write valid headers, so the header is one it writes:
//! none, DATA_VALID (a checksum checked already, which tun passes on), a partial checksum, or
//! a GSO super-frame, made to fit the frame; or the read is shorter than a header.

use arbitrary::Arbitrary;
use vnet::{NetHdr, HDR_GSO_ECN, HDR_GSO_UDP_L4, HDR_LEN};
use vring::Features;

use super::input::{FrameSpec, Hdr, TxFrame};
use crate::encode::{variant, Encode};
use crate::encode_struct;

/// The offloads the switch sets on its TAP (`switch::tap::open`; USO where the kernel has
/// it): the headers the kernel writes are those a driver with these may send.
pub const TAP_OFFLOADS: Features = {
    use vnet::feature::*;
    Features::VERSION_1
        .union(CSUM)
        .union(HOST_TSO4)
        .union(HOST_TSO6)
        .union(HOST_ECN)
        .union(HOST_USO)
};

/// `VIRTIO_NET_HDR_F_DATA_VALID`: the kernel's CHECKSUM_UNNECESSARY (a frame a NIC checked,
/// bridged to the TAP).
pub const HDR_F_DATA_VALID: u8 = 2;

/// The longest frame the uplink reads, its header included (`host::MAX_RX_FRAME`).
const MAX_READ: usize = 65536 + HDR_LEN + 14 + 4;

/// The header the kernel writes before a frame.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostHdr {
    /// All zero (CHECKSUM_NONE).
    Plain,
    /// DATA_VALID (CHECKSUM_UNNECESSARY).
    DataValid,
    /// NEEDS_CSUM at the transport checksum of a built TCP or UDP frame (CHECKSUM_PARTIAL).
    Csum,
    /// A GSO super-frame of a built TCP or UDP frame, in segments of `mss` bytes (at least
    /// one), with the ECN bit if `ecn` (TCP only); `hdr_len` is the skb's linear part, a hint:
    /// the headers and up to `linear` bytes more.
    Gso { mss: u16, ecn: bool, linear: u16 },
    /// A read of only `n % 12` bytes.
    Short(u8),
}

impl Encode for HostHdr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            HostHdr::Plain => variant(0, 5, out),
            HostHdr::DataValid => variant(1, 5, out),
            HostHdr::Csum => variant(2, 5, out),
            HostHdr::Gso { mss, ecn, linear } => {
                variant(3, 5, out);
                mss.encode(out);
                ecn.encode(out);
                linear.encode(out);
            }
            HostHdr::Short(n) => (variant(4, 5, out), n.encode(out)).1,
        }
    }
}

/// One frame the host sends in through the uplink.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct HostFrame {
    pub hdr: HostHdr,
    pub frame: FrameSpec,
    /// The header's last two bytes (`num_buffers`), which tun does not write: whatever the
    /// switch's buffer held.
    pub stale: u16,
}
encode_struct!(HostFrame { hdr, frame, stale });

impl HostFrame {
    /// The bytes the uplink reads (the header, then the frame), and whether the header asks
    /// for the transport checksum of a whole built TCP or UDP frame (as `TxFrame::bytes`).
    /// A checksum or GSO request for a frame the kernel would not make it for (not TCP or
    /// UDP, cut short, or longer than a read) becomes a plain header.
    pub fn bytes(&self) -> (Vec<u8>, bool) {
        let made = |hdr| {
            let f = TxFrame {
                hdr,
                frame: self.frame.clone(),
                cuts: Vec::new(),
            };
            f.bytes()
        };
        let (hdr, mut frame, mut seeded) = match self.hdr {
            HostHdr::Short(n) => return (vec![0x5a; (n % 12) as usize], false),
            HostHdr::Plain | HostHdr::DataValid => made(Hdr::Plain),
            HostHdr::Csum => made(Hdr::Csum),
            HostHdr::Gso { mss, ecn, .. } => made(Hdr::Gso {
                mss: mss.max(1),
                ecn,
            }),
        };
        let mut h = NetHdr::from_bytes(hdr[..HDR_LEN].try_into().expect("a whole header"));
        if frame.len() > MAX_READ - HDR_LEN {
            frame.truncate(MAX_READ - HDR_LEN);
            seeded = false;
        }
        if !seeded {
            h = NetHdr::default();
        }
        if h.gso_type & !HDR_GSO_ECN == HDR_GSO_UDP_L4 {
            // ECN is TCP's.
            h.gso_type = HDR_GSO_UDP_L4;
        }
        if let HostHdr::Gso { linear, .. } = self.hdr {
            if h.gso_type != 0 {
                h.hdr_len = (h.hdr_len as usize + linear as usize).min(frame.len()) as u16;
            }
        }
        assert_eq!(
            h.check_tx(TAP_OFFLOADS, frame.len()),
            Ok(()),
            "a header the kernel writes is one a TAP takes"
        );
        if self.hdr == HostHdr::DataValid {
            h.flags = HDR_F_DATA_VALID;
        }
        h.num_buffers = self.stale;
        let mut all = h.to_bytes().to_vec();
        all.extend(frame);
        (all, seeded)
    }
}
