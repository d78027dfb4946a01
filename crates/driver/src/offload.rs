//! Transmit offloads in the net header (spec 5.1.6.2): checksum offload (NEEDS_CSUM with
//! `csum_start` / `csum_offset`) when CSUM is negotiated, and segmentation offload (`gso_type`,
//! `gso_size`, `hdr_len`): TCP when HOST_TSO4 / HOST_TSO6 are, UDP (USO, `GSO_UDP_L4`) when
//! HOST_USO is.
//!
//! As Linux does for a CHECKSUM_PARTIAL skb, the frame's checksum field is set to the
//! pseudo-header sum, which the device completes over the bytes from `csum_start`. The sum
//! includes the L4 length of the whole frame, for a GSO frame too: Linux's segmentation
//! (`tcp_gso_segment`, `__udp_gso_segment`) takes that length out of the field and puts each
//! segment's in (DPDK's virtio PMD adds it back for this reason, `virtio_tso_fix_cksum`).
//! A hardware NIC's TSO convention, the sum without the length, gives segments with bad
//! checksums behind a TAP (the driver's `gso_tap` test shows both).

use vnet::feature;
use vring::Features;

use vnet::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_NONE, HDR_GSO_TCPV4, HDR_GSO_TCPV6, HDR_GSO_UDP_L4};

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
    /// UDP segmentation offload, IPv4 and IPv6 (HOST_USO).
    pub uso: bool,
}

impl TxOffloads {
    pub fn from_features(f: Features) -> TxOffloads {
        let csum = f.contains(feature::CSUM);
        TxOffloads {
            csum,
            // TSO needs checksum offload (spec 5.1.3.1).
            tso4: csum && f.contains(feature::HOST_TSO4),
            tso6: csum && f.contains(feature::HOST_TSO6),
            // So does USO (spec 5.1.3.1: HOST_USO requires CSUM).
            uso: csum && f.contains(feature::HOST_USO),
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
pub(crate) fn sum16(mut sum: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    sum
}

pub(crate) fn fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The pseudo-header sum (not complemented), with `len` the L4 length.
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

/// The L4 length the IP header gives (a short frame may carry Ethernet padding after it),
/// or what the frame holds past `l4` when the IP header gives more than that.
fn l4_len(frame: &[u8], f: &L4Frame) -> usize {
    let held = frame.len() - f.l4;
    let given = if f.ipv6 {
        be16(frame, f.l3 + 4).map(|n| n as usize)
    } else {
        be16(frame, f.l3 + 2).and_then(|n| (n as usize).checked_sub(f.l4 - f.l3))
    };
    match given {
        Some(n) if n >= f.l4_hdr_len && n <= held => n,
        _ => held,
    }
}

/// Builds the header for `frame` with the offloads that are negotiated, preparing the frame's
/// checksum field to match. `mss`: segment frames whose L4 payload exceeds it into segments
/// of `mss` payload bytes (GSO): TCP frames when TSO is negotiated for the frame's IP version,
/// UDP frames when USO is (a UDP frame is segmented only when `mss` asks for it, as Linux
/// does only for a socket with UDP_SEGMENT). Frames that are neither TCP nor UDP over
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
    let l4_len = l4_len(frame, &f);
    let payload = l4_len - f.l4_hdr_len;
    let gso = match mss {
        Some(mss) if mss > 0 && payload > mss as usize => match (f.proto, f.ipv6) {
            (PROTO_TCP, true) if offloads.tso6 => Some((HDR_GSO_TCPV6, mss)),
            (PROTO_TCP, false) if offloads.tso4 => Some((HDR_GSO_TCPV4, mss)),
            (PROTO_UDP, _) if offloads.uso => Some((HDR_GSO_UDP_L4, mss)),
            _ => None,
        },
        _ => None,
    };
    let pseudo = pseudo_header_sum(frame, &f, l4_len as u32);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::frames::udp4_frame;

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
    fn uso_only_when_negotiated_and_asked_for() {
        let uso = TxOffloads::from_features(feature::CSUM | feature::HOST_USO);
        assert!(uso.uso);
        assert!(
            !TxOffloads::from_features(feature::HOST_USO).uso,
            "USO needs CSUM"
        );
        let mut u = udp4_frame(3000, [2; 6], [4; 6], &[]);
        let h = prepare(&mut u, uso, Some(1000));
        assert_eq!(
            (
                h.gso_type,
                h.gso_size,
                h.hdr_len,
                h.csum_start,
                h.csum_offset
            ),
            (HDR_GSO_UDP_L4, 1000, 42, 34, 6)
        );
        // Without a segment size a UDP frame is only checksummed, whatever its length.
        let mut u = udp4_frame(3000, [2; 6], [4; 6], &[]);
        assert_eq!(prepare(&mut u, uso, None).gso_type, HDR_GSO_NONE);
        let csum_only = TxOffloads::from_features(feature::CSUM | feature::HOST_TSO4);
        let mut u = udp4_frame(3000, [2; 6], [4; 6], &[]);
        let h = prepare(&mut u, csum_only, Some(1000));
        assert_eq!((h.gso_type, h.flags), (HDR_GSO_NONE, HDR_F_NEEDS_CSUM));
    }

    #[test]
    fn a_gso_frame_sums_its_whole_length_into_the_pseudo_header() {
        let off = TxOffloads::from_features(feature::CSUM | feature::HOST_TSO4);
        let mut f = tcp4_frame(3000);
        let want = reference_tcp4_checksum(&f);
        let h = prepare(&mut f, off, Some(1448));
        assert_eq!(h.gso_type, HDR_GSO_TCPV4);
        let l4_len = (f.len() - 34) as u32;
        let mut sum = sum16(0, &f[26..34]) + PROTO_TCP as u32;
        sum += l4_len;
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), fold(sum));
        complete_checksum(&mut f, &h);
        assert_eq!(u16::from_be_bytes([f[50], f[51]]), want);
    }

    #[test]
    fn ethernet_padding_is_not_counted_in_the_pseudo_header() {
        let off = TxOffloads::from_features(feature::CSUM);
        // 2 payload bytes: a 44-byte frame padded to the 60-byte minimum.
        let mut f = udp4_frame(44, [2; 6], [4; 6], &[7, 9]);
        let mut padded = f.clone();
        padded.resize(60, 0);
        let h = prepare(&mut f, off, None);
        let hp = prepare(&mut padded, off, None);
        assert_eq!(h, hp);
        assert_eq!(f[34..44], padded[34..44], "same pseudo-header sum");
        complete_checksum(&mut padded, &hp);
        let mut sum = sum16(0, &padded[26..34]) + PROTO_UDP as u32 + 10;
        sum = sum16(sum, &padded[34..44]);
        assert_eq!(fold(sum), 0xffff, "a valid checksum over the 10 UDP bytes");
    }
}
