//! Transmit offloads in the net header (spec 5.1.6.2): checksum offload (NEEDS_CSUM with
//! `csum_start` / `csum_offset`) when CSUM is negotiated, and TCP segmentation offload
//! (`gso_type`, `gso_size`, `hdr_len`) when HOST_TSO4 / HOST_TSO6 are.
//!
//! As Linux does for a CHECKSUM_PARTIAL skb, the frame's checksum field is set to the
//! pseudo-header sum, which the device completes over the bytes from `csum_start`. For a GSO
//! frame the pseudo-header sum leaves out the length, which differs per segment.

use vnet::feature;
use vring::Features;

use vnet::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_NONE, HDR_GSO_TCPV4, HDR_GSO_TCPV6};

const ETH_HLEN: usize = 14;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// The offloads negotiated for transmit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxOffloads {
    pub csum: bool,
    pub tso4: bool,
    pub tso6: bool,
}

impl TxOffloads {
    pub fn from_features(f: Features) -> TxOffloads {
        let csum = f.contains(feature::CSUM);
        TxOffloads {
            csum,
            // TSO needs checksum offload (spec 5.1.3.1).
            tso4: csum && f.contains(feature::HOST_TSO4),
            tso6: csum && f.contains(feature::HOST_TSO6),
        }
    }
}

/// Where the layers of a TCP or UDP frame start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct L4Frame {
    l3: usize,
    l4: usize,
    proto: u8,
    ipv6: bool,
    /// TCP: the TCP header length; UDP: 8.
    l4_hdr_len: usize,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn parse(frame: &[u8]) -> Option<L4Frame> {
    let mut l3 = ETH_HLEN;
    let mut ethertype = be16(frame, 12)?;
    if ethertype == ETHERTYPE_VLAN {
        ethertype = be16(frame, 16)?;
        l3 += 4;
    }
    let (l4, proto, ipv6) = match ethertype {
        ETHERTYPE_IPV4 => {
            let ihl = (*frame.get(l3)? & 0x0f) as usize * 4;
            if ihl < 20 {
                return None;
            }
            (l3 + ihl, *frame.get(l3 + 9)?, false)
        }
        // Extension headers are not walked: such frames go without offload.
        ETHERTYPE_IPV6 => (l3 + 40, *frame.get(l3 + 6)?, true),
        _ => return None,
    };
    let l4_hdr_len = match proto {
        PROTO_TCP => (*frame.get(l4 + 12)? >> 4) as usize * 4,
        PROTO_UDP => 8,
        _ => return None,
    };
    if l4_hdr_len < 8 || frame.len() < l4 + l4_hdr_len {
        return None;
    }
    Some(L4Frame {
        l3,
        l4,
        proto,
        ipv6,
        l4_hdr_len,
    })
}

/// One's-complement sum of `b` (big-endian 16-bit words) added to `sum`.
fn sum16(mut sum: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The pseudo-header sum (not complemented), with `len` the L4 length (0 for GSO).
fn pseudo_header_sum(frame: &[u8], f: &L4Frame, len: u32) -> u16 {
    let mut sum = if f.ipv6 {
        sum16(0, &frame[f.l3 + 8..f.l3 + 40])
    } else {
        sum16(0, &frame[f.l3 + 12..f.l3 + 20])
    };
    sum += f.proto as u32;
    sum += len >> 16;
    sum += len & 0xffff;
    fold(sum)
}

/// Builds the header for `frame` with the offloads that are negotiated, preparing the frame's
/// checksum field to match. `mss`: segment TCP frames whose payload exceeds it (GSO), when
/// TSO is negotiated for the frame's IP version. Frames that are neither TCP nor UDP over
/// IPv4/IPv6, or without CSUM, get an empty header: the caller must have checksummed them.
pub fn prepare(frame: &mut [u8], offloads: TxOffloads, mss: Option<u16>) -> NetHdr {
    let mut hdr = NetHdr::default();
    if !offloads.csum {
        return hdr;
    }
    let Some(f) = parse(frame) else {
        return hdr;
    };
    let csum_offset = if f.proto == PROTO_TCP { 16 } else { 6 };
    let payload = frame.len() - f.l4 - f.l4_hdr_len;
    let gso = match mss {
        Some(mss) if f.proto == PROTO_TCP && mss > 0 && payload > mss as usize => {
            if f.ipv6 && offloads.tso6 {
                Some((HDR_GSO_TCPV6, mss))
            } else if !f.ipv6 && offloads.tso4 {
                Some((HDR_GSO_TCPV4, mss))
            } else {
                None
            }
        }
        _ => None,
    };
    let l4_len = if gso.is_some() {
        0
    } else {
        (frame.len() - f.l4) as u32
    };
    let pseudo = pseudo_header_sum(frame, &f, l4_len);
    frame[f.l4 + csum_offset..f.l4 + csum_offset + 2].copy_from_slice(&pseudo.to_be_bytes());
    hdr.flags = HDR_F_NEEDS_CSUM;
    hdr.csum_start = f.l4 as u16;
    hdr.csum_offset = csum_offset as u16;
    hdr.gso_type = HDR_GSO_NONE;
    if let Some((gso_type, mss)) = gso {
        hdr.gso_type = gso_type;
        hdr.gso_size = mss;
        hdr.hdr_len = (f.l4 + f.l4_hdr_len) as u16;
    }
    hdr
}

/// Completes the checksum the way a device does for NEEDS_CSUM (for tests and for software
/// fallback): the one's complement of the sum from `csum_start` to the end, stored at
/// `csum_start + csum_offset`.
pub fn complete_checksum(frame: &mut [u8], hdr: &NetHdr) {
    if hdr.flags & HDR_F_NEEDS_CSUM == 0 {
        return;
    }
    let start = hdr.csum_start as usize;
    let at = start + hdr.csum_offset as usize;
    if at + 2 > frame.len() {
        return;
    }
    let sum = !fold(sum16(0, &frame[start..]));
    frame[at..at + 2].copy_from_slice(&sum.to_be_bytes());
}

/// A checksummed IPv4/UDP frame of `len` bytes (at least 42) from `src` to `dst`, with
/// `payload` at the start of the UDP payload: what `virtnet gen` sends, as DPDK's txonly does.
pub fn udp4_frame(len: usize, dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let len = len.max(42);
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = PROTO_UDP;
    ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
    ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
    let c = !fold(sum16(0, &f[14..34]));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&9u16.to_be_bytes());
    f[36..38].copy_from_slice(&9u16.to_be_bytes());
    f[38..40].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    let n = payload.len().min(len - 42);
    f[42..42 + n].copy_from_slice(&payload[..n]);
    // UDP over IPv4 may leave the checksum zero ("none"); gen rewrites payload bytes per frame.
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp4_frame(payload: usize) -> Vec<u8> {
        let len = 14 + 20 + 20 + payload;
        let mut f = vec![0u8; len];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((len - 14) as u16).to_be_bytes());
        f[23] = PROTO_TCP;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[46] = 5 << 4;
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = i as u8;
        }
        f
    }

    /// The full TCP checksum computed directly, to check the offload path against.
    fn reference_tcp4_checksum(f: &[u8]) -> u16 {
        let mut g = f.to_vec();
        g[50..52].copy_from_slice(&[0, 0]);
        let mut sum = sum16(0, &g[26..34]);
        sum += PROTO_TCP as u32 + (g.len() - 34) as u32;
        !fold(sum16(sum, &g[34..]))
    }

    #[test]
    fn no_offload_without_csum() {
        let mut f = tcp4_frame(100);
        let orig = f.clone();
        let all = TxOffloads::from_features(feature::HOST_TSO4);
        assert_eq!(all, TxOffloads::default(), "TSO without CSUM is not usable");
        assert_eq!(prepare(&mut f, all, Some(100)), NetHdr::default());
        assert_eq!(f, orig);
    }

    #[test]
    fn checksum_offload_header_and_device_completion_give_the_right_checksum() {
        let mut f = tcp4_frame(101);
        let want = reference_tcp4_checksum(&f);
        let off = TxOffloads::from_features(feature::CSUM);
        let h = prepare(&mut f, off, None);
        assert_eq!(h.flags, HDR_F_NEEDS_CSUM);
        assert_eq!((h.csum_start, h.csum_offset), (34, 16));
        assert_eq!(h.gso_type, HDR_GSO_NONE);
        complete_checksum(&mut f, &h);
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), want);
    }

    #[test]
    fn tso_only_when_negotiated_and_payload_exceeds_mss() {
        let off = TxOffloads::from_features(feature::CSUM | feature::HOST_TSO4);
        let mut big = tcp4_frame(3000);
        let h = prepare(&mut big, off, Some(1448));
        assert_eq!(
            (h.gso_type, h.gso_size, h.hdr_len),
            (HDR_GSO_TCPV4, 1448, 54)
        );
        let mut small = tcp4_frame(1000);
        assert_eq!(prepare(&mut small, off, Some(1448)).gso_type, HDR_GSO_NONE);
        let no_tso = TxOffloads::from_features(feature::CSUM);
        let mut big = tcp4_frame(3000);
        let h = prepare(&mut big, no_tso, Some(1448));
        assert_eq!((h.gso_type, h.flags), (HDR_GSO_NONE, HDR_F_NEEDS_CSUM));
    }

    #[test]
    fn udp_and_vlan_and_garbage() {
        let off = TxOffloads::from_features(feature::CSUM);
        let mut u = udp4_frame(64, [2; 6], [4; 6], b"hi");
        let h = prepare(&mut u, off, None);
        assert_eq!((h.csum_start, h.csum_offset), (34, 6));
        // The same frame behind a VLAN tag: offsets move by 4.
        let mut v = u[..12].to_vec();
        v.extend([0x81, 0x00, 0, 5]);
        v.extend(&u[12..]);
        let h = prepare(&mut v, off, None);
        assert_eq!(h.csum_start, 38);
        for len in 0..60 {
            let mut g = vec![0xffu8; len];
            if let Some(t) = g.get_mut(12..14) {
                t.copy_from_slice(&[0x08, 0x00]);
            }
            let _ = prepare(&mut g, off, Some(10));
        }
    }

    #[test]
    fn udp4_frame_has_a_valid_ip_header() {
        let f = udp4_frame(64, [2; 6], [4; 6], &[1, 2, 3]);
        assert_eq!(f.len(), 64);
        assert_eq!(fold(sum16(0, &f[14..34])), 0xffff, "IP header checksum");
        assert_eq!(&f[42..45], &[1, 2, 3]);
    }
}
