//! Software segmentation and checksum completion: what a frame becomes for a receiver that
//! did not negotiate the offloads its sender used (VIRTIO 1.2 5.1.6.2, what a driver may ask
//! of a device on transmit; 5.1.6.4, what a device may hand a driver on receive). The bytes
//! are Linux's: a super-frame comes out as the kernel's GSO cuts it when it forwards a
//! guest's frame from one TAP to another that lacks the offload (`virtio_net_hdr_to_skb`,
//! `skb_mac_gso_segment`, `inet_gso_segment` / `ipv6_gso_segment`, `tcp_gso_segment`,
//! `__udp_gso_segment`, `skb_segment`), and a partial checksum is completed as
//! `skb_checksum_help` completes it.
//!
//! - [`delivery`] decides from the sender's header and the receiver's features whether the
//!   frame goes as sent or must be resolved, and how;
//! - [`segment`] resolves it: checks the header against the frame as Linux does and hands
//!   out the frames the receiver gets ([`Segments`]), each behind its header;
//! - [`complete_csum`] completes a NEEDS_CSUM checksum alone.
//!
//! What Linux does, and so do we:
//! - every segment carries the super-frame's headers; IPv4 gets its total length, an
//!   identification counting up from the super-frame's (DF or not: the kernel increments
//!   per segment unless GRO marked the ID fixed, which a virtio header cannot) and a new
//!   header checksum; IPv6 its payload length; TCP its sequence number advanced by the
//!   payload before it, FIN and PSH on the last segment only, CWR on the first only (with
//!   the ECN bit or without it: the bit only tells a device it must do the same); UDP its
//!   length;
//! - the transport checksum of each segment is derived from the field as sent: Linux's
//!   convention is that it holds the pseudo-header sum over the whole frame's length, and
//!   the kernel swaps that length for the segment's (TCP: the real length; UDP: the UDP
//!   length field as sent) rather than recomputing the pseudo-header. A sender that put
//!   something else there gets segments with bad checksums, from Linux and from us. TCP
//!   without NEEDS_CSUM gets the pseudo-header sum put in first, as `tcp4_gso_segment` does;
//! - [`Csum::Complete`] sums every segment fully (UDP's 0 sent as 0xffff);
//!   [`Csum::Partial`] leaves the seed in the field and NEEDS_CSUM in the header, as the
//!   kernel hands segments to a device with checksum offload;
//! - `hdr_len` is a hint: headers are found by parsing, and only a `hdr_len` past the frame
//!   is refused (as a TAP does).
//!
//! Decisions of ours:
//! - **UFO is refused** ([`GsoError::Ufo`]). Linux since 4.14 sends no UFO and no other
//!   driver we know does; the kernel still takes it from a TAP and cuts it into IP fragments
//!   (`udp4_ufo_fragment`), but its IPv6 fragment identification comes from a per-namespace
//!   secret (`ipv6_proxy_select_ident`), so "as the kernel does" has no fixed bytes there.
//!   The switch does not offer HOST_UFO, so a guest fragments such datagrams itself.
//! - **At most [`MAX_SEGMENTS`] segments**: Linux would cut a 64 KiB frame into 65,535
//!   one-byte segments (GSO_MAX_SEGS), each behind a copy of the headers: some 67 times the
//!   bytes sent, written into the receiver's ring. Our bound is the most a Linux TCP sender
//!   can ask for, so no guest's stream stalls on it. USO keeps Linux's own bound,
//!   [`UDP_MAX_SEGMENTS`].
//! - An IPv6 frame with BIG TCP's jumbo option is refused (the kernel strips the option).
//!
//! Left to the caller: copying the frame into a scratch buffer (it is rewritten in place),
//! the receiver's `num_buffers`, the receiver's MTU (a bridge drops a frame past it, and a
//! super-frame's segments are as long as the sender's `gso_size` makes them), and what to do
//! when the receiver's ring fills (stop taking segments).

mod parse;
#[cfg(test)]
mod tests;

use crate::csum::{self, Sum};
use crate::{feature, NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_ECN, HDR_GSO_NONE, HDR_GSO_TCPV4};
use crate::{HDR_GSO_TCPV6, HDR_GSO_UDP, HDR_GSO_UDP_L4};
use parse::{Cut, Plan, Transport, IPV6_HLEN, TCP_CSUM_OFFSET, UDP_CSUM_OFFSET};
use vring::Features;

/// The most segments one frame may be cut into: 64 KiB in segments of 8 bytes, the least
/// Linux's TCP puts in one (its MSS floor, TCP_MIN_SND_MSS = 48, is "room for full set of
/// TCP options and 8 bytes of data"). Each segment repeats the headers (66 bytes for TCP
/// over IPv4 with timestamps), so a receiver gets at most about 9 times what was sent,
/// where one-byte segments would make it 67.
pub const MAX_SEGMENTS: usize = 8192;
/// The most segments a USO frame may ask for: Linux's UDP_MAX_SEGMENTS (128 in current
/// kernels, 64 in older ones), refused by `virtio_net_hdr_to_skb` past it.
pub const UDP_MAX_SEGMENTS: usize = 128;
/// The most VLAN tags (802.1Q or 802.1ad) walked before the IP header: Linux's
/// VLAN_MAX_DEPTH.
pub const VLAN_MAX_DEPTH: usize = 8;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Why a frame cannot be segmented or checksummed: it breaks a rule Linux enforces on a
/// frame from a guest, or one of ours. The guest sent it; nothing of the host failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GsoError {
    #[error("a {len}-byte frame: shorter than an Ethernet header or its header length {hdr_len}")]
    Short { len: usize, hdr_len: u16 },
    /// Unknown, the ECN bit without a GSO type, or the ECN bit on USO.
    #[error("GSO type {gso_type:#04x} is unknown or does not take the ECN bit")]
    GsoType { gso_type: u8 },
    #[error("UFO (GSO type UDP) is not segmented: HOST_UFO is not offered")]
    Ufo,
    /// 0, or Linux's GSO_BY_FRAGS (0xffff).
    #[error("segment size {gso_size} is invalid")]
    GsoSize { gso_size: u16 },
    /// The checksum field is outside the frame, or the transport header it starts would be,
    /// or it starts inside where the IP header must be.
    #[error(
        "checksum at {start} + {offset}: outside a {len}-byte frame or in the IP header's room"
    )]
    CsumRange { start: u16, offset: u16, len: usize },
    #[error("checksum offset {offset}: the transport header's checksum field is at {want}")]
    CsumOffset { offset: u16, want: u16 },
    #[error("checksum start {start} is not the transport header, at {l4}")]
    CsumStart { start: usize, l4: usize },
    #[error("USO without NEEDS_CSUM")]
    UsoWithoutCsum,
    #[error("the {layer} header ends at {end}, past the {len}-byte frame")]
    Truncated {
        layer: &'static str,
        end: usize,
        len: usize,
    },
    /// An IPv4 IHL or a TCP data offset below the header's fixed part.
    #[error("{layer} header length field {value} is below the minimum")]
    HeaderLen { layer: &'static str, value: u8 },
    #[error("more than {VLAN_MAX_DEPTH} VLAN tags")]
    VlanDepth,
    #[error("ethertype {ethertype:#06x} is not IPv4 or IPv6")]
    NotIp { ethertype: u16 },
    /// The transport protocol (after any IPv6 extension headers Linux steps over) is not
    /// the one the GSO type names, or TCP's IP version is not.
    #[error("IP protocol {proto} (IPv6: {ipv6}) does not match the GSO type")]
    Protocol { proto: u8, ipv6: bool },
    #[error("the transport header at {l4} is past a 16-bit offset")]
    HeadersTooLong { l4: usize },
    #[error("an IPv6 jumbogram (BIG TCP's hop-by-hop option)")]
    Jumbogram,
    /// A GSO frame whose payload after its full transport header fits one segment, which
    /// Linux's TCP segmentation refuses (it took the frame for GSO by a shorter header).
    #[error("{payload} payload bytes are not more than one segment of {gso_size}")]
    NotSegmentable { payload: usize, gso_size: u16 },
    #[error("{segments} segments: more than {max}")]
    TooManySegments { segments: usize, max: usize },
}

/// How the frames handed to a receiver carry their transport checksums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Csum {
    /// Computed in full: for a receiver without GUEST_CSUM (headers' flags 0).
    Complete,
    /// Left to the receiver: NEEDS_CSUM, the pseudo-header sum in the field, as Linux hands
    /// segments to a device with checksum offload: for a receiver with GUEST_CSUM.
    Partial,
}

/// What a receiver gets of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// It negotiated every offload the frame uses: the frame as sent, behind the sender's
    /// header (and the receiver's `num_buffers`).
    AsSent,
    /// The frames [`segment`] makes of it with this checksum mode, each behind the header
    /// `segment` gives.
    Resolve(Csum),
}

/// What the receiver with features `rx` gets of `frame`, sent behind `hdr`: as sent when it
/// negotiated what the header uses (GUEST_CSUM for NEEDS_CSUM; for a GSO frame the matching
/// GUEST_TSO4/TSO6/USO4/USO6/UFO, GUEST_ECN for the ECN bit, and NEEDS_CSUM set, which
/// 5.1.6.4 requires of a GSO frame on receive), else resolved. A frame passed as sent is
/// checked by the receiver's driver, as a NIC's would be; one resolved is checked here.
#[inline]
pub fn delivery(hdr: &NetHdr, frame: &[u8], rx: Features) -> Delivery {
    let guest_csum = rx.contains(feature::GUEST_CSUM);
    let resolve = Delivery::Resolve(if guest_csum {
        Csum::Partial
    } else {
        Csum::Complete
    });
    let needs_csum = hdr.flags & HDR_F_NEEDS_CSUM != 0;
    if hdr.gso_type == HDR_GSO_NONE {
        return if needs_csum && !guest_csum {
            resolve
        } else {
            Delivery::AsSent
        };
    }
    let offload = match hdr.gso_type & !HDR_GSO_ECN {
        HDR_GSO_TCPV4 => feature::GUEST_TSO4,
        HDR_GSO_TCPV6 => feature::GUEST_TSO6,
        HDR_GSO_UDP => feature::GUEST_UFO,
        HDR_GSO_UDP_L4 => match parse::network(frame) {
            Ok((0x0800, _)) => feature::GUEST_USO4,
            Ok((0x86dd, _)) => feature::GUEST_USO6,
            _ => return resolve,
        },
        _ => return resolve,
    };
    let ecn = hdr.gso_type & HDR_GSO_ECN == 0 || rx.contains(feature::GUEST_ECN);
    if needs_csum && guest_csum && ecn && rx.contains(offload) {
        Delivery::AsSent
    } else {
        resolve
    }
}

/// Completes the checksum a NEEDS_CSUM header left partial, as `skb_checksum_help` does:
/// the checksum of the bytes from `csum_start` to the end (the field holding the
/// pseudo-header sum, by Linux's convention) goes in at `csum_start + csum_offset`, a
/// computed 0 as 0xffff. Returns the header without NEEDS_CSUM; a header without it leaves
/// the frame as it is.
pub fn complete_csum(hdr: &NetHdr, frame: &mut [u8]) -> Result<NetHdr, GsoError> {
    if hdr.flags & HDR_F_NEEDS_CSUM == 0 {
        return Ok(*hdr);
    }
    let (start, offset) = (hdr.csum_start as usize, hdr.csum_offset as usize);
    if start + offset + 2 > frame.len() {
        return Err(GsoError::CsumRange {
            start: hdr.csum_start,
            offset: hdr.csum_offset,
            len: frame.len(),
        });
    }
    store_checksum(frame, start, offset);
    Ok(NetHdr {
        flags: hdr.flags & !HDR_F_NEEDS_CSUM,
        ..*hdr
    })
}

/// The checksum from `start` to the end, in at `start + offset` (in the frame).
fn store_checksum(frame: &mut [u8], start: usize, offset: usize) {
    let c = match csum::checksum(&frame[start..]) {
        0 => 0xffff,
        c => c,
    };
    frame[start + offset..start + offset + 2].copy_from_slice(&c.to_be_bytes());
}

/// Checks `hdr` against `frame` as Linux does and returns the frames a receiver without
/// the offloads gets, checksummed as `csum` says: one if the frame is not cut (its checksum
/// completed for [`Csum::Complete`]), else its segments. They are written into `frame`
/// itself, one after the other (each segment's headers over the end of the one before), so
/// `frame` is the caller's scratch copy. On error the frame is unchanged.
pub fn segment<'a>(
    hdr: &NetHdr,
    frame: &'a mut [u8],
    csum: Csum,
) -> Result<Segments<'a>, GsoError> {
    let (count, cut, whole) = match parse::plan(hdr, frame)? {
        Plan::Whole { csum: at } => {
            let out = match (at, csum) {
                (Some(at), Csum::Complete) => {
                    store_checksum(frame, at.start, at.offset);
                    NetHdr::default()
                }
                (Some(at), Csum::Partial) => partial_hdr(at.start, at.offset as u16),
                (None, _) => NetHdr::default(),
            };
            (1, None, out)
        }
        Plan::Cut(cut) => (cut.count, Some(cut), NetHdr::default()),
    };
    Ok(Segments {
        frame,
        csum,
        cut,
        whole,
        count,
        next: 0,
    })
}

/// A header asking the receiver to complete a checksum.
fn partial_hdr(start: usize, offset: u16) -> NetHdr {
    NetHdr {
        flags: HDR_F_NEEDS_CSUM,
        csum_start: start as u16,
        csum_offset: offset,
        ..NetHdr::default()
    }
}

/// The frames [`segment`] made of one frame, handed out in order by
/// [`Segments::next_segment`]; each is written when asked for, so a caller that stops early
/// (its receiver's ring is full) pays for no more.
#[derive(Debug)]
pub struct Segments<'a> {
    frame: &'a mut [u8],
    csum: Csum,
    /// None: the frame goes whole, behind `whole`.
    cut: Option<Cut>,
    whole: NetHdr,
    count: usize,
    next: usize,
}

impl Segments<'_> {
    /// How many frames there are in all (1 for a frame not cut).
    pub fn count(&self) -> usize {
        self.count
    }

    /// The headers each segment carries before its payload, or None for a frame not cut.
    pub fn header_len(&self) -> Option<usize> {
        self.cut.map(|c| c.hdr_len)
    }

    /// The next frame and the header it goes behind (`num_buffers` 0, the caller's).
    pub fn next_segment(&mut self) -> Option<(NetHdr, &[u8])> {
        if self.next == self.count {
            return None;
        }
        let k = self.next;
        self.next += 1;
        let Some(cut) = self.cut else {
            return Some((self.whole, &self.frame[..]));
        };
        let (start, end) = write_segment(&cut, self.csum, self.frame, k);
        let hdr = match self.csum {
            Csum::Complete => NetHdr::default(),
            Csum::Partial => {
                let offset = match cut.transport {
                    Transport::Tcp { .. } => TCP_CSUM_OFFSET,
                    Transport::Udp { .. } => UDP_CSUM_OFFSET,
                };
                partial_hdr(cut.l4, offset)
            }
        };
        Some((hdr, &self.frame[start..end]))
    }
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes segment `k` of `cut` into `frame` and returns where it lies: its headers go just
/// before its payload, copied from segment `k - 1`'s (already handed out) and every field
/// that differs rewritten from the values as sent. Segment `k`'s payload is bytes
/// `k * mss..` of the payload, so its headers start at `k * mss`.
fn write_segment(cut: &Cut, csum: Csum, frame: &mut [u8], k: usize) -> (usize, usize) {
    let h = cut.hdr_len;
    let payload = cut.payload(frame.len());
    let start = k * cut.mss;
    let end = h + (start + cut.mss).min(payload);
    if k > 0 {
        frame.copy_within(start - cut.mss..start - cut.mss + h, start);
    }
    let seg = &mut frame[start..end];
    let len = seg.len();
    let last = k + 1 == cut.count;
    let (l3, l4) = (cut.l3, cut.l4);
    if cut.ipv6 {
        put16(seg, l3 + 4, (len - l3 - IPV6_HLEN) as u16);
    } else {
        put16(seg, l3 + 2, (len - l3) as u16);
        put16(seg, l3 + 4, cut.ip_id.wrapping_add(k as u16));
        put16(seg, l3 + 10, 0);
        let c = csum::checksum(&seg[l3..l4]);
        put16(seg, l3 + 10, c);
    }
    let l4_len = len - l4;
    match cut.transport {
        Transport::Tcp { seq, flags, len } => {
            let seq = seq.wrapping_add((k * cut.mss) as u32);
            seg[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            let mut f = flags;
            if !last {
                f &= !(TCP_FIN | TCP_PSH);
            }
            if k > 0 {
                f &= !TCP_CWR;
            }
            seg[l4 + 13] = f;
            // The whole frame's length out of the seed, this segment's in.
            let seed = Sum::ZERO
                .add_u16(cut.check)
                .sub_u32(len)
                .add_u32(l4_len as u32)
                .fold();
            let at = l4 + TCP_CSUM_OFFSET as usize;
            put16(seg, at, seed);
            if csum == Csum::Complete {
                let c = csum::checksum(&seg[l4..]);
                put16(seg, at, c);
            }
        }
        Transport::Udp { len } => {
            let new_len = l4_len as u16;
            put16(seg, l4 + 4, new_len);
            let seed = Sum::ZERO
                .add_u16(cut.check)
                .sub_u16(len)
                .add_u16(new_len)
                .fold();
            let at = l4 + UDP_CSUM_OFFSET as usize;
            put16(seg, at, seed);
            if csum == Csum::Complete {
                // A UDP checksum of 0 means none (RFC 768): 0xffff stands for it.
                let c = match csum::checksum(&seg[l4..]) {
                    0 => 0xffff,
                    c => c,
                };
                put16(seg, at, c);
            }
        }
    }
    (start, end)
}
