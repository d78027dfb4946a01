//! What the switch should do with a frame, written out plainly: the addresses the decision
//! reads (and whether a frame announces its source), a guest's receive filter, what a
//! receiver gets of a frame (as sent, its checksum finished, or segments), and a receiver's
//! rx ring (which buffers a frame takes, or why it is dropped). The forwarding decision
//! itself is the backend's reference model (`switch::model::Reference`).

use std::collections::VecDeque;

use virtnet_backend::switch::{Frame, Mac};
use vnet::csum::{self, Sum};
use vnet::gso::{self, Csum, Delivery};
use vnet::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_NONE};
use vring::Features;

/// The first bytes of a frame the switch reads (`switch::flow::PREFIX`).
pub const PREFIX: usize = 64;
/// The longest frame a receiver takes: a 64 KiB super-frame and its headers
/// (`host::MAX_RX_FRAME`).
const MAX_RX_FRAME: usize = 65536 + vnet::HDR_LEN + 14 + 4;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The decision's view of a frame whose first bytes are `prefix`: None when it has no
/// Ethernet header. It announces its source if it is a RARP, or an ARP whose sender and
/// target protocol addresses are equal, behind up to two VLAN tags (802.1Q, 802.1ad).
pub fn frame(prefix: &[u8]) -> Option<Frame> {
    if prefix.len() < 14 {
        return None;
    }
    let mac = |at: usize| {
        let mut m = [0u8; 6];
        m.copy_from_slice(&prefix[at..at + 6]);
        Mac::new(m)
    };
    let mut at = 12;
    let mut ty = be16(prefix, at);
    let mut tags = 0;
    while tags < 2 && matches!(ty, Some(0x8100 | 0x88a8)) {
        at += 4;
        ty = be16(prefix, at);
        tags += 1;
    }
    let l3 = at + 2;
    let announce = match ty {
        Some(0x8035) => true,
        Some(0x0806) => {
            let spa = prefix.get(l3 + 14..l3 + 18);
            spa.is_some() && spa == prefix.get(l3 + 24..l3 + 28)
        }
        _ => false,
    };
    Some(Frame {
        dst: mac(0),
        src: mac(6),
        announce,
    })
}

/// A guest's receive filter (VIRTIO 1.2 5.1.6.5.1): promiscuous, or broadcast, its own MAC,
/// and multicast when all-multicast is on.
#[derive(Clone, Copy, Debug)]
pub struct RxMode {
    pub promisc: bool,
    pub allmulti: bool,
    pub mac: [u8; 6],
}

impl RxMode {
    pub fn accepts(&self, frame: &[u8]) -> bool {
        let Some(dst) = frame.get(..6) else {
            return true;
        };
        self.promisc || dst == [0xff; 6] || dst == self.mac || (dst[0] & 1 == 1 && self.allmulti)
    }
}

/// One frame a receiver is offered: its header (`num_buffers` 0) and bytes; or a drop the
/// receiver counts (`dropped`) before its ring is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Frame(NetHdr, Vec<u8>),
    Dropped,
}

/// What a receiver with `features` and `mtu` is offered of `frame`, sent behind `hdr`: as
/// sent when it negotiated what the header uses (`resolved` None); else its checksum
/// finished, or its segments (`segmented`: a segment the ring has no room for ends the frame
/// there).
#[derive(Clone, Debug)]
pub struct Offer {
    pub pieces: Vec<Piece>,
    pub segmented: bool,
    /// How the checksums were resolved, if they were.
    pub resolved: Option<Csum>,
}

/// `seeded`: the sender asked for the transport checksum of a whole TCP or UDP frame, its
/// field seeded as Linux does, so that every checksum completed here must be right.
pub fn offer(hdr: &NetHdr, frame: &[u8], features: Features, mtu: u16, seeded: bool) -> Offer {
    let offer = resolve(hdr, frame, features, mtu);
    if seeded && offer.resolved == Some(Csum::Complete) {
        for p in &offer.pieces {
            if let Piece::Frame(_, bytes) = p {
                check_transport(bytes, hdr.csum_start as usize);
            }
        }
    }
    offer
}

/// The transport checksum of `seg`, whose transport header is at `l4`, over the pseudo-header
/// (RFC 793, RFC 768, RFC 8200 8.1).
fn check_transport(seg: &[u8], l4: usize) {
    let (l3, ipv6) = network(seg);
    let (addrs, proto) = if ipv6 {
        (&seg[l3 + 8..l3 + 40], seg[l3 + 6])
    } else {
        (&seg[l3 + 12..l3 + 20], seg[l3 + 9])
    };
    let sum = Sum::ZERO
        .add_bytes(addrs)
        .add_u16(proto.into())
        .add_u32((seg.len() - l4) as u32)
        .add_bytes(&seg[l4..]);
    assert_eq!(sum.checksum(), 0, "a completed transport checksum is wrong");
}

fn resolve(hdr: &NetHdr, frame: &[u8], features: Features, mtu: u16) -> Offer {
    let longest = 14 + 4 + mtu as usize;
    let prefix = &frame[..frame.len().min(PREFIX)];
    let one = |p| Offer {
        pieces: vec![p],
        segmented: false,
        resolved: None,
    };
    let csum = match gso::delivery(hdr, prefix, features) {
        Delivery::AsSent => {
            if hdr.gso_type == HDR_GSO_NONE && frame.len() > longest {
                return one(Piece::Dropped);
            }
            // A receiver without GUEST_CSUM gets flags zero (VIRTIO 1.2 5.1.6.4.1): a
            // header passed as sent carries no NEEDS_CSUM then, but may carry the host's
            // DATA_VALID.
            let mut hdr = *hdr;
            if !features.contains(vnet::feature::GUEST_CSUM) {
                hdr.flags = 0;
            }
            return one(Piece::Frame(hdr, frame.to_vec()));
        }
        Delivery::Resolve(c) => c,
    };
    let resolved = |p| Offer {
        resolved: Some(csum),
        ..one(p)
    };
    if frame.len() > MAX_RX_FRAME {
        return resolved(Piece::Dropped);
    }
    let mut copy = frame.to_vec();
    if hdr.gso_type == HDR_GSO_NONE {
        return match gso::complete_csum(hdr, &mut copy) {
            Ok(h) if copy.len() <= longest => resolved(Piece::Frame(h, copy)),
            _ => resolved(Piece::Dropped),
        };
    }
    let Ok(mut segments) = gso::segment(hdr, &mut copy, csum) else {
        return resolved(Piece::Dropped);
    };
    let mut pieces = Vec::with_capacity(segments.count());
    let mut all = Vec::with_capacity(segments.count());
    let hdr_len = segments.header_len();
    while let Some((h, bytes)) = segments.next_segment() {
        pieces.push(if bytes.len() > longest {
            Piece::Dropped
        } else {
            Piece::Frame(h, bytes.to_vec())
        });
        all.push(bytes.to_vec());
    }
    if let Some(hdr_len) = hdr_len {
        check_segments(hdr, frame, hdr_len, &all);
    }
    Offer {
        pieces,
        segmented: true,
        resolved: Some(csum),
    }
}

/// What a receiver's ring did with a frame offered to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// In this many buffers.
    Delivered(usize),
    /// Refused by the receive filter (`filtered`).
    Filtered,
    /// Larger than any buffers the guest can post hold (`dropped`).
    TooLarge,
    /// Too few buffers posted now (`rx_missed`).
    NoRoom,
    /// A buffer without a writable byte: the ring broke, and the frame is lost.
    Broke,
    /// No ring runs, or it broke before.
    Gone,
}

/// A receiver's rx ring: the writable lengths of the buffers posted and not yet taken, in
/// the order the device pops them (0 for a buffer without a writable byte).
#[derive(Clone, Debug, Default)]
pub struct Ring {
    pub posted: VecDeque<u32>,
    pub mergeable: bool,
    /// Buffers one frame may take: the queue size, at most 1024.
    pub max_buffers: usize,
    pub running: bool,
    pub broken: bool,
}

impl Ring {
    /// Offers a frame of `need` bytes (its header in the receiver's format included): the
    /// buffers it takes, merged when MRG_RXBUF is on, else one that holds it.
    pub fn offer(&mut self, need: u64) -> Fate {
        if !self.running || self.broken {
            return Fate::Gone;
        }
        let mut have = 0u64;
        let mut used = 0usize;
        while have < need {
            if used == self.max_buffers {
                return Fate::TooLarge;
            }
            let Some(&len) = self.posted.get(used) else {
                return Fate::NoRoom;
            };
            if len == 0 {
                self.broken = true;
                return Fate::Broke;
            }
            have += len as u64;
            used += 1;
            if !self.mergeable && have < need {
                return Fate::TooLarge;
            }
        }
        self.posted.drain(..used);
        Fate::Delivered(used)
    }
}

/// Where the network header of `frame` starts, after up to `gso::VLAN_MAX_DEPTH` tags, and
/// whether it is IPv6.
fn network(frame: &[u8]) -> (usize, bool) {
    let mut at = 12;
    for _ in 0..gso::VLAN_MAX_DEPTH {
        if !matches!(be16(frame, at), Some(0x8100 | 0x88a8)) {
            break;
        }
        at += 4;
    }
    (at + 2, be16(frame, at) == Some(0x86dd))
}

/// Checks the segments `vnet::gso` cut `frame` into, each behind the first `hdr_len` bytes
/// of headers, against what Linux's GSO guarantees: the IP header's lengths (and IPv4's
/// checksum), UDP's length, and the payloads, put together, the frame's.
fn check_segments(hdr: &NetHdr, frame: &[u8], hdr_len: usize, segments: &[Vec<u8>]) {
    let (l3, ipv6) = network(frame);
    let l4 = hdr.csum_start as usize;
    let udp = hdr.gso_type & !vnet::HDR_GSO_ECN == vnet::HDR_GSO_UDP_L4;
    let mut payload: Vec<u8> = Vec::with_capacity(frame.len());
    for seg in segments {
        let len = seg.len();
        if ipv6 {
            assert_eq!(
                be16(seg, l3 + 4),
                Some((len - l3 - 40) as u16),
                "IPv6 length"
            );
        } else {
            assert_eq!(be16(seg, l3 + 2), Some((len - l3) as u16), "IPv4 length");
            assert_eq!(csum::checksum(&seg[l3..l4]), 0, "IPv4 header checksum");
        }
        if udp {
            assert_eq!(be16(seg, l4 + 4), Some((len - l4) as u16), "UDP length");
        }
        assert_eq!(
            seg[..l3 - 2],
            frame[..l3 - 2],
            "a segment's Ethernet header"
        );
        payload.extend(&seg[hdr_len..]);
    }
    assert!(
        payload == frame[hdr_len..],
        "the segments' payloads are not the frame's"
    );
}

/// Whether `hdr` asks the receiver to finish a checksum.
pub fn needs_csum(hdr: &NetHdr) -> bool {
    hdr.flags & HDR_F_NEEDS_CSUM != 0
}
