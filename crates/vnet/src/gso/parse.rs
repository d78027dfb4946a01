//! What Linux checks before it segments a frame a guest sent, and where the frame's headers
//! lie: `virtio_net_hdr_to_skb` on the header (as a TAP takes it), then the Ethernet, IP and
//! transport layers' `gso_segment` callbacks on the frame. A frame either passes all of them
//! and becomes a [`Cut`] whose every segment can be written without another check, or it
//! gets the [`GsoError`] for the first rule it breaks.

use super::{GsoError, MAX_SEGMENTS, UDP_MAX_SEGMENTS, VLAN_MAX_DEPTH};
use crate::csum::Sum;
use crate::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_ECN, HDR_GSO_NONE, HDR_GSO_TCPV4};
use crate::{HDR_GSO_TCPV6, HDR_GSO_UDP, HDR_GSO_UDP_L4};

pub(super) const ETH_HLEN: usize = 14;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const IPV4_HLEN: usize = 20;
pub(super) const IPV6_HLEN: usize = 40;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
/// The IPv6 extension headers Linux's GSO steps over (INET6_PROTO_GSO_EXTHDR): hop-by-hop
/// options, routing, destination options. Any other (a fragment header, AH, ESP) ends
/// segmentation.
const EXT_HOP: u8 = 0;
const EXT_ROUTING: u8 = 43;
const EXT_DSTOPTS: u8 = 60;
pub(super) const TCP_HLEN: usize = 20;
pub(super) const UDP_HLEN: usize = 8;
/// The checksum field's offset in each transport header.
pub(super) const TCP_CSUM_OFFSET: u16 = 16;
pub(super) const UDP_CSUM_OFFSET: u16 = 6;
/// Linux's GSO_BY_FRAGS: a `gso_size` that means "cut where the fragments are", which a
/// virtio header may not ask for.
const GSO_BY_FRAGS: u16 = 0xffff;
/// Linux's GRO_LEGACY_MAX_SIZE: an IPv6 packet longer than this may carry BIG TCP's
/// hop-by-hop jumbo option, which the kernel's GSO strips.
const GRO_LEGACY_MAX_SIZE: usize = 65536;
/// The hop-by-hop option type of a jumbo payload length (RFC 2675).
const IPV6_TLV_JUMBO: u8 = 0xc2;

/// Where a NEEDS_CSUM checksum starts and lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CsumAt {
    pub start: usize,
    pub offset: usize,
}

/// The segmentation a header asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tcp4,
    Tcp6,
    Udp,
}

/// What segmentation does with a frame that passed the checks.
#[derive(Debug)]
pub(super) enum Plan {
    /// Not segmented: GSO_NONE, or a GSO frame with no more than one segment's payload
    /// (Linux: "too small packets are not really GSO ones"). Its checksum is completed if
    /// the header asks for it.
    Whole {
        csum: Option<CsumAt>,
    },
    Cut(Cut),
}

/// The transport protocol of a frame being cut, and its fields as sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Transport {
    /// `len`: the whole frame's TCP length, which the checksum seed counted.
    Tcp { seq: u32, flags: u8, len: u32 },
    /// `len`: the UDP length field as sent (Linux takes it, not the real length, out of the
    /// checksum seed).
    Udp { len: u16 },
}

/// A GSO frame checked to be cut: every offset below is inside the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cut {
    /// The IP header, after the Ethernet header and any VLAN tags.
    pub l3: usize,
    /// The transport header.
    pub l4: usize,
    /// Where the payload starts: the headers every segment carries.
    pub hdr_len: usize,
    pub ipv6: bool,
    /// The IPv4 identification as sent (each segment gets it plus its index).
    pub ip_id: u16,
    /// The transport checksum field the segments' seeds derive from: as sent under
    /// NEEDS_CSUM (the pseudo-header sum by Linux's convention), else the pseudo-header sum
    /// Linux puts there itself (`__tcp_v4_send_check`).
    pub check: u16,
    pub transport: Transport,
    /// Payload bytes per segment, the last one's fewer.
    pub mss: usize,
    pub count: usize,
}

impl Cut {
    pub fn payload(&self, frame_len: usize) -> usize {
        frame_len - self.hdr_len
    }
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
}

/// Whether `frame` holds the `n` bytes of `layer` at `at`.
fn need(frame: &[u8], layer: &'static str, at: usize, n: usize) -> Result<(), GsoError> {
    if at + n > frame.len() {
        return Err(GsoError::Truncated {
            layer,
            end: at + n,
            len: frame.len(),
        });
    }
    Ok(())
}

/// Checks `hdr` against `frame` as Linux does, and where the frame must be cut.
pub(super) fn plan(hdr: &NetHdr, frame: &[u8]) -> Result<Plan, GsoError> {
    let len = frame.len();
    // A TAP takes no frame shorter than an Ethernet header, nor a header length past it.
    if len < ETH_HLEN || hdr.hdr_len as usize > len {
        return Err(GsoError::Short {
            len,
            hdr_len: hdr.hdr_len,
        });
    }
    let kind = match hdr.gso_type {
        HDR_GSO_NONE => None,
        t => match t & !HDR_GSO_ECN {
            HDR_GSO_TCPV4 => Some(Kind::Tcp4),
            HDR_GSO_TCPV6 => Some(Kind::Tcp6),
            HDR_GSO_UDP_L4 => Some(Kind::Udp),
            HDR_GSO_UDP => return Err(GsoError::Ufo),
            // Unknown, or the ECN bit alone.
            _ => return Err(GsoError::GsoType { gso_type: t }),
        },
    };
    let ecn = hdr.gso_type & HDR_GSO_ECN != 0;
    if kind.is_some() && hdr.gso_size == 0 {
        return Err(GsoError::GsoSize {
            gso_size: hdr.gso_size,
        });
    }
    // The transport header's fixed part and the least the network header may take, by
    // which Linux judges offsets before it has parsed anything.
    let (thlen, nh_min) = match kind {
        None => (0, IPV4_HLEN),
        Some(Kind::Tcp4) => (TCP_HLEN, IPV4_HLEN),
        Some(Kind::Tcp6) => (TCP_HLEN, IPV6_HLEN),
        Some(Kind::Udp) => (UDP_HLEN, IPV4_HLEN),
    };
    let csum = if hdr.flags & HDR_F_NEEDS_CSUM != 0 {
        let (start, offset) = (hdr.csum_start as usize, hdr.csum_offset as usize);
        if start < nh_min || start + thlen.max(offset + 2) > len {
            return Err(GsoError::CsumRange {
                start: hdr.csum_start,
                offset: hdr.csum_offset,
                len,
            });
        }
        Some(CsumAt { start, offset })
    } else {
        None
    };
    let Some(kind) = kind else {
        return Ok(Plan::Whole { csum });
    };
    // Where Linux thinks the payload starts: past the checksummed transport header, or
    // without NEEDS_CSUM past the least headers could take (Ethernet left out: its rule).
    let p_off = csum.map_or(nh_min + thlen, |c| c.start + thlen);
    need(frame, "transport", 0, p_off)?;
    let mss = hdr.gso_size as usize;
    match kind {
        Kind::Udp => {
            if csum.is_none() {
                return Err(GsoError::UsoWithoutCsum);
            }
            if hdr.csum_offset != UDP_CSUM_OFFSET {
                return Err(GsoError::CsumOffset {
                    offset: hdr.csum_offset,
                    want: UDP_CSUM_OFFSET,
                });
            }
            if len - p_off > mss * UDP_MAX_SEGMENTS {
                return Err(GsoError::TooManySegments {
                    segments: (len - p_off).div_ceil(mss),
                    max: UDP_MAX_SEGMENTS,
                });
            }
            if ecn {
                return Err(GsoError::GsoType {
                    gso_type: hdr.gso_type,
                });
            }
        }
        Kind::Tcp4 | Kind::Tcp6 => {
            if csum.is_some() && hdr.csum_offset != TCP_CSUM_OFFSET {
                return Err(GsoError::CsumOffset {
                    offset: hdr.csum_offset,
                    want: TCP_CSUM_OFFSET,
                });
            }
        }
    }
    if hdr.gso_size == GSO_BY_FRAGS {
        return Err(GsoError::GsoSize {
            gso_size: hdr.gso_size,
        });
    }
    if len - p_off <= mss {
        return Ok(Plan::Whole { csum });
    }
    cut(kind, frame, mss, csum).map(Plan::Cut)
}

/// The ethertype after any VLAN tags, and where the network header starts.
pub(super) fn network(frame: &[u8]) -> Result<(u16, usize), GsoError> {
    need(frame, "Ethernet", 0, ETH_HLEN)?;
    let mut at = 12;
    let mut ethertype = be16(frame, at);
    let mut tags = 0;
    while ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
        tags += 1;
        if tags > VLAN_MAX_DEPTH {
            return Err(GsoError::VlanDepth);
        }
        at += 4;
        need(frame, "VLAN", at, 2)?;
        ethertype = be16(frame, at);
    }
    Ok((ethertype, at + 2))
}

/// The IPv4 header at `l3`: where the transport header starts, its protocol, the
/// identification.
fn ipv4(frame: &[u8], l3: usize) -> Result<(usize, u8, u16), GsoError> {
    need(frame, "IPv4", l3, IPV4_HLEN)?;
    let ihl = (frame[l3] & 0x0f) as usize * 4;
    if ihl < IPV4_HLEN {
        return Err(GsoError::HeaderLen {
            layer: "IPv4",
            value: frame[l3] & 0x0f,
        });
    }
    need(frame, "IPv4", l3, ihl)?;
    Ok((l3 + ihl, frame[l3 + 9], be16(frame, l3 + 4)))
}

/// The IPv6 header at `l3` and the extension headers Linux steps over: where the
/// transport header starts and its protocol.
fn ipv6(frame: &[u8], l3: usize) -> Result<(usize, u8), GsoError> {
    need(frame, "IPv6", l3, IPV6_HLEN)?;
    let mut next = frame[l3 + 6];
    let mut at = l3 + IPV6_HLEN;
    // BIG TCP's jumbo option, which Linux removes before it segments (and only then): such
    // a packet is no virtio-net frame (a header's lengths are 16-bit), so it is refused.
    if frame.len() - l3 > GRO_LEGACY_MAX_SIZE
        && next == EXT_HOP
        && at + 8 <= frame.len()
        && frame[at] == PROTO_TCP
        && frame[at + 1] == 0
        && frame[at + 2] == IPV6_TLV_JUMBO
    {
        return Err(GsoError::Jumbogram);
    }
    while matches!(next, EXT_HOP | EXT_ROUTING | EXT_DSTOPTS) {
        need(frame, "IPv6 extension", at, 8)?;
        let ext_len = (frame[at + 1] as usize + 1) * 8;
        need(frame, "IPv6 extension", at, ext_len)?;
        next = frame[at];
        at += ext_len;
    }
    Ok((at, next))
}

/// The pseudo-header sum (RFC 9293 3.1, RFC 8200 8.1) Linux seeds a TCP checksum field
/// with when the sender did not: addresses, protocol, the transport length.
fn pseudo_header(frame: &[u8], l3: usize, ipv6: bool, l4_len: usize) -> u16 {
    let addrs = if ipv6 {
        &frame[l3 + 8..l3 + 40]
    } else {
        &frame[l3 + 12..l3 + 20]
    };
    Sum::ZERO
        .add_bytes(addrs)
        .add_u16(PROTO_TCP as u16)
        .add_u32(l4_len as u32)
        .fold()
}

/// The layers of a GSO frame, checked as Linux's GSO checks them.
fn cut(kind: Kind, frame: &[u8], mss: usize, csum: Option<CsumAt>) -> Result<Cut, GsoError> {
    let len = frame.len();
    let (ethertype, l3) = network(frame)?;
    let (l4, proto, ip_id, ipv6) = match ethertype {
        ETHERTYPE_IPV4 => {
            let (l4, proto, id) = ipv4(frame, l3)?;
            (l4, proto, id, false)
        }
        ETHERTYPE_IPV6 => {
            let (l4, proto) = ipv6(frame, l3)?;
            (l4, proto, 0, true)
        }
        _ => return Err(GsoError::NotIp { ethertype }),
    };
    // TCP segmentation is asked for per IP version, UDP's for both.
    match (proto, kind, ipv6) {
        (PROTO_TCP, Kind::Tcp4, false) | (PROTO_TCP, Kind::Tcp6, true) => {}
        (PROTO_UDP, Kind::Udp, _) => {}
        _ => return Err(GsoError::Protocol { proto, ipv6 }),
    }
    // Offsets in a segment's header are 16-bit (csum_start, Linux's transport_header).
    if l4 > u16::MAX as usize {
        return Err(GsoError::HeadersTooLong { l4 });
    }
    if let Some(c) = csum {
        if c.start != l4 {
            return Err(GsoError::CsumStart { start: c.start, l4 });
        }
    }
    let (hdr_len, check, transport) = if kind == Kind::Udp {
        need(frame, "UDP", l4, UDP_HLEN)?;
        let t = Transport::Udp {
            len: be16(frame, l4 + 4),
        };
        (l4 + UDP_HLEN, be16(frame, l4 + 6), t)
    } else {
        need(frame, "TCP", l4, TCP_HLEN)?;
        let doff = frame[l4 + 12] >> 4;
        let thlen = doff as usize * 4;
        if thlen < TCP_HLEN {
            return Err(GsoError::HeaderLen {
                layer: "TCP",
                value: doff,
            });
        }
        need(frame, "TCP", l4, thlen)?;
        let check = match csum {
            Some(_) => be16(frame, l4 + TCP_CSUM_OFFSET as usize),
            None => pseudo_header(frame, l3, ipv6, len - l4),
        };
        let t = Transport::Tcp {
            seq: be32(frame, l4 + 4),
            flags: frame[l4 + 13],
            len: (len - l4) as u32,
        };
        (l4 + thlen, check, t)
    };
    let payload = len - hdr_len;
    if payload <= mss {
        return Err(GsoError::NotSegmentable {
            payload,
            gso_size: mss as u16,
        });
    }
    let count = payload.div_ceil(mss);
    if count > MAX_SEGMENTS {
        return Err(GsoError::TooManySegments {
            segments: count,
            max: MAX_SEGMENTS,
        });
    }
    Ok(Cut {
        l3,
        l4,
        hdr_len,
        ipv6,
        ip_id,
        check,
        transport,
        mss,
        count,
    })
}
