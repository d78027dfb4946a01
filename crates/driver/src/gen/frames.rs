//! The frames `virtnet gen` sends: Ethernet, then IPv4 or IPv6 (RFC 791, RFC 8200), then UDP
//! or TCP (RFC 768, RFC 9293), every length field and checksum filled in as a sender's stack
//! fills them.
//!
//! A super-frame (up to 64 KiB of IP payload) carries the lengths of the whole frame, as the
//! GSO skbs that Linux hands to a TAP do: the IPv4 total length or IPv6 payload length, and
//! for UDP the UDP length, cover all of it; the device's segmentation rewrites them per
//! segment (`inet_gso_segment`, `__udp_gso_segment`). [`Flow::gso_frame`] gives it the net
//! header that asks for the segmentation ([`offload::prepare`]).

use serde::Serialize;
use vnet::{NetHdr, HDR_GSO_NONE};

use super::GenError;
use crate::offload::{self, fold, sum16, TxOffloads};

pub const ETH_HLEN: usize = 14;
pub(crate) const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
pub(crate) const IPV4_HDR_LEN: usize = 20;
const IPV6_HDR_LEN: usize = 40;
/// Our TCP header: 20 bytes and the timestamp option (two NOPs and 10 bytes), as Linux sends
/// on an established connection; at an MTU of 1500 the MSS is then 1448.
pub const TCP_HDR_LEN: usize = 32;
pub const UDP_HDR_LEN: usize = 8;
/// The most segments a USO frame may ask for: Linux refuses more (UDP_MAX_SEGMENTS, 64 since
/// USO came in; later kernels allow 128), in `virtio_net_hdr_to_skb` as in `udp_send_skb`.
pub const UDP_MAX_SEGMENTS: usize = 64;
/// TCP flags of every frame: ACK and PSH (segmentation keeps PSH on the last segment only).
pub const TCP_FLAGS: u8 = 0x18;

/// The transport protocol of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
}

impl std::str::FromStr for Proto {
    type Err = String;
    fn from_str(s: &str) -> Result<Proto, String> {
        match s {
            "tcp" => Ok(Proto::Tcp),
            "udp" => Ok(Proto::Udp),
            _ => Err(format!("unknown protocol {s:?} (tcp or udp)")),
        }
    }
}

/// Source and destination addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addrs {
    V4 { src: [u8; 4], dst: [u8; 4] },
    V6 { src: [u8; 16], dst: [u8; 16] },
}

/// One flow's headers: what every frame of a run carries before its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub addrs: Addrs,
    pub proto: Proto,
    pub src_port: u16,
    pub dst_port: u16,
    /// TCP: the sequence number of the first payload byte.
    pub seq: u32,
}

impl Flow {
    /// The flow `virtnet gen` sends: from 198.18.0.1 to 198.18.0.2 (RFC 2544's benchmarking
    /// range) or from 2001:2::1 to 2001:2::2 (RFC 5180's), port 9 to port 9 (discard).
    pub fn benchmark(dst_mac: [u8; 6], src_mac: [u8; 6], proto: Proto, ipv6: bool) -> Flow {
        let addrs = if ipv6 {
            let mut src = [0u8; 16];
            src[..4].copy_from_slice(&[0x20, 0x01, 0x00, 0x02]);
            let mut dst = src;
            src[15] = 1;
            dst[15] = 2;
            Addrs::V6 { src, dst }
        } else {
            Addrs::V4 {
                src: [198, 18, 0, 1],
                dst: [198, 18, 0, 2],
            }
        };
        Flow {
            dst_mac,
            src_mac,
            addrs,
            proto,
            src_port: 9,
            dst_port: 9,
            seq: 1,
        }
    }

    pub fn is_ipv6(&self) -> bool {
        matches!(self.addrs, Addrs::V6 { .. })
    }

    pub fn ip_hdr_len(&self) -> usize {
        if self.is_ipv6() {
            IPV6_HDR_LEN
        } else {
            IPV4_HDR_LEN
        }
    }

    pub fn l4_hdr_len(&self) -> usize {
        match self.proto {
            Proto::Tcp => TCP_HDR_LEN,
            Proto::Udp => UDP_HDR_LEN,
        }
    }

    /// Ethernet, IP and L4 headers: the `hdr_len` of a GSO header.
    pub fn hdr_len(&self) -> usize {
        ETH_HLEN + self.ip_hdr_len() + self.l4_hdr_len()
    }

    /// The largest frame: the IPv4 total length, the IPv6 payload length and the UDP length
    /// are 16-bit fields.
    pub fn max_len(&self) -> usize {
        if self.is_ipv6() {
            ETH_HLEN + IPV6_HDR_LEN + 0xffff
        } else {
            ETH_HLEN + 0xffff
        }
    }

    /// The segment payload that fills an IP packet of `mtu` bytes.
    pub fn mss_for_mtu(&self, mtu: u16) -> u16 {
        (mtu as usize).saturating_sub(self.ip_hdr_len() + self.l4_hdr_len()) as u16
    }

    /// A frame of `len` bytes (Ethernet header included, no FCS; kept within
    /// `hdr_len()..=max_len()`) whose payload byte `i` is `payload(i)`, with complete checksums.
    pub fn frame(&self, len: usize, payload: impl Fn(usize) -> u8) -> Vec<u8> {
        let len = len.clamp(self.hdr_len(), self.max_len());
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&self.dst_mac);
        f[6..12].copy_from_slice(&self.src_mac);
        let l3 = ETH_HLEN;
        let l4 = l3 + self.ip_hdr_len();
        let l4_len = len - l4;
        let proto = match self.proto {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        };
        // The pseudo-header's addresses (RFC 9293 3.1, RFC 8200 8.1).
        let pseudo = match self.addrs {
            Addrs::V4 { src, dst } => {
                f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                let ip = &mut f[l3..l4];
                write_ipv4_header(ip, len - l3, 1, proto, src, dst);
                sum16(0, &f[l3 + 12..l3 + 20])
            }
            Addrs::V6 { src, dst } => {
                f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
                let ip = &mut f[l3..l4];
                ip[0] = 0x60;
                ip[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
                ip[6] = proto;
                ip[7] = 64;
                ip[8..24].copy_from_slice(&src);
                ip[24..40].copy_from_slice(&dst);
                sum16(0, &f[l3 + 8..l3 + 40])
            }
        };
        let h = &mut f[l4..];
        h[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        h[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        let csum_at = match self.proto {
            Proto::Udp => {
                h[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
                6
            }
            Proto::Tcp => {
                h[4..8].copy_from_slice(&self.seq.to_be_bytes());
                h[8..12].copy_from_slice(&1u32.to_be_bytes());
                h[12] = ((TCP_HDR_LEN / 4) as u8) << 4;
                h[13] = TCP_FLAGS;
                h[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
                // NOP, NOP, timestamps (kind 8, length 10): TSval, TSecr.
                h[20..24].copy_from_slice(&[1, 1, 8, 10]);
                h[24..28].copy_from_slice(&0x0102_0304u32.to_be_bytes());
                h[28..32].copy_from_slice(&1u32.to_be_bytes());
                16
            }
        };
        let body = l4 + self.l4_hdr_len();
        for (i, b) in f[body..].iter_mut().enumerate() {
            *b = payload(i);
        }
        let sum = pseudo + proto as u32 + l4_len as u32;
        let mut c = !fold(sum16(sum, &f[l4..]));
        if c == 0 && self.proto == Proto::Udp {
            // A computed zero is sent as all ones: zero means "no checksum" (RFC 768).
            c = 0xffff;
        }
        f[l4 + csum_at..l4 + csum_at + 2].copy_from_slice(&c.to_be_bytes());
        f
    }

    /// A super-frame of `len` bytes for segments of `mss` payload bytes, with the net header
    /// that asks the device to cut it (TSO for TCP, USO for UDP) and its checksum field
    /// prepared for that. Refused: an offload that `offloads` lacks, a frame too large for
    /// the length fields, or one that would not make at least two segments.
    pub fn gso_frame(
        &self,
        len: usize,
        mss: u16,
        offloads: TxOffloads,
        payload: impl Fn(usize) -> u8,
    ) -> Result<(Vec<u8>, NetHdr), GenError> {
        let (offered, feature, what) = match (self.proto, self.is_ipv6()) {
            (Proto::Tcp, false) => (offloads.tso4, "HOST_TSO4", "--gso tcp"),
            (Proto::Tcp, true) => (offloads.tso6, "HOST_TSO6", "--gso tcp --ipv6"),
            (Proto::Udp, false) => (offloads.uso, "HOST_USO", "--gso udp"),
            (Proto::Udp, true) => (offloads.uso, "HOST_USO", "--gso udp --ipv6"),
        };
        if !offered {
            // Every segmentation offload needs checksum offload (spec 5.1.3.1).
            let feature = if offloads.csum { feature } else { "CSUM" };
            return Err(GenError::Negotiation { feature, what });
        }
        if len > self.max_len() {
            return Err(GenError::Options(format!(
                "--size {len} is larger than the {} bytes the IP length fields allow",
                self.max_len()
            )));
        }
        let payload_len = len.saturating_sub(self.hdr_len());
        if mss == 0 || payload_len <= mss as usize {
            return Err(GenError::Options(format!(
                "--size {len} holds {payload_len} payload bytes: not more than one segment of \
                 {mss} (--mss), so not a super-frame"
            )));
        }
        let segments = payload_len.div_ceil(mss as usize);
        if self.proto == Proto::Udp && segments > UDP_MAX_SEGMENTS {
            return Err(GenError::Options(format!(
                "--size {len} makes {segments} UDP segments of {mss} bytes; Linux takes at \
                 most {UDP_MAX_SEGMENTS} (raise --mss or lower --size)"
            )));
        }
        let mut f = self.frame(len, payload);
        let hdr = offload::prepare(&mut f, offloads, Some(mss));
        debug_assert_ne!(hdr.gso_type, HDR_GSO_NONE, "checked above");
        Ok((f, hdr))
    }
}

/// Writes the 20-byte IPv4 header `ip` (zeroed) of a packet of `total_len` bytes, header
/// included, with its checksum: don't fragment, as TCP and Linux's UDP path MTU discovery
/// send; a TTL of 64.
pub(crate) fn write_ipv4_header(
    ip: &mut [u8],
    total_len: usize,
    id: u16,
    proto: u8,
    src: [u8; 4],
    dst: [u8; 4],
) {
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total_len as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let c = !fold(sum16(0, &ip[..IPV4_HDR_LEN]));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// An IPv4/UDP frame of `len` bytes (at least 42) from `src` to `dst`, with `payload` at the
/// start of the UDP payload and no UDP checksum (allowed over IPv4: `virtnet gen --mode rr`
/// rewrites payload bytes per frame): what `virtnet gen` sends without `--gso`, as DPDK's
/// txonly does.
pub fn udp4_frame(len: usize, dst: [u8; 6], src: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let flow = Flow::benchmark(dst, src, Proto::Udp, false);
    let mut f = flow.frame(len, |i| payload.get(i).copied().unwrap_or(0));
    let at = ETH_HLEN + IPV4_HDR_LEN + 6;
    f[at..at + 2].copy_from_slice(&[0, 0]);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet::{feature, HDR_F_NEEDS_CSUM, HDR_GSO_TCPV4, HDR_GSO_TCPV6, HDR_GSO_UDP_L4};

    const DST: [u8; 6] = [2, 0, 0, 0, 0, 2];
    const SRC: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn be16(f: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([f[at], f[at + 1]])
    }

    /// The L4 checksum recomputed from the frame, with the field itself counted as zero.
    fn l4_checksum(f: &[u8], flow: &Flow) -> u16 {
        let l4 = ETH_HLEN + flow.ip_hdr_len();
        let at = l4 + if flow.proto == Proto::Tcp { 16 } else { 6 };
        let mut g = f.to_vec();
        g[at..at + 2].copy_from_slice(&[0, 0]);
        let (addrs, proto) = if flow.is_ipv6() {
            (&g[ETH_HLEN + 8..ETH_HLEN + 40], g[ETH_HLEN + 6])
        } else {
            (&g[ETH_HLEN + 12..ETH_HLEN + 20], g[ETH_HLEN + 9])
        };
        let sum = sum16(0, addrs) + proto as u32 + (g.len() - l4) as u32;
        !fold(sum16(sum, &g[l4..]))
    }

    fn all_flows() -> Vec<Flow> {
        let mut v = Vec::new();
        for proto in [Proto::Tcp, Proto::Udp] {
            for ipv6 in [false, true] {
                v.push(Flow::benchmark(DST, SRC, proto, ipv6));
            }
        }
        v
    }

    #[test]
    fn frames_have_valid_lengths_and_checksums() {
        for flow in all_flows() {
            for len in [flow.hdr_len(), 64.max(flow.hdr_len()), 1514, 9000, 65000] {
                let f = flow.frame(len, |i| (i % 251) as u8);
                assert_eq!(f.len(), len, "{flow:?}");
                let l4 = ETH_HLEN + flow.ip_hdr_len();
                if flow.is_ipv6() {
                    assert_eq!(be16(&f, 12), ETHERTYPE_IPV6);
                    assert_eq!(be16(&f, ETH_HLEN + 4) as usize, len - l4);
                } else {
                    assert_eq!(be16(&f, 12), ETHERTYPE_IPV4);
                    assert_eq!(be16(&f, ETH_HLEN + 2) as usize, len - ETH_HLEN);
                    assert_eq!(fold(sum16(0, &f[14..34])), 0xffff, "IP header checksum");
                }
                if flow.proto == Proto::Udp {
                    assert_eq!(be16(&f, l4 + 4) as usize, len - l4, "UDP length");
                    assert_eq!(be16(&f, l4 + 6), l4_checksum(&f, &flow));
                } else {
                    assert_eq!(f[l4 + 12] >> 4, 8, "data offset: 32 bytes");
                    assert_eq!(f[l4 + 13], TCP_FLAGS);
                    assert_eq!(be16(&f, l4 + 16), l4_checksum(&f, &flow));
                }
                let body = flow.hdr_len();
                assert!(f[body..]
                    .iter()
                    .enumerate()
                    .all(|(i, &b)| b == (i % 251) as u8));
            }
        }
    }

    #[test]
    fn the_mss_fills_the_mtu() {
        let tcp4 = Flow::benchmark(DST, SRC, Proto::Tcp, false);
        assert_eq!(tcp4.mss_for_mtu(1500), 1448, "as Linux with timestamps");
        assert_eq!(tcp4.hdr_len(), 66);
        let udp6 = Flow::benchmark(DST, SRC, Proto::Udp, true);
        assert_eq!(udp6.mss_for_mtu(1500), 1452);
        assert_eq!(udp6.hdr_len(), 62);
        assert_eq!(tcp4.max_len(), 65549);
        assert_eq!(udp6.max_len(), 65589);
    }

    #[test]
    fn tso_super_frames_ask_for_tcp_segmentation() {
        let off =
            TxOffloads::from_features(feature::CSUM | feature::HOST_TSO4 | feature::HOST_TSO6);
        for (ipv6, gso_type) in [(false, HDR_GSO_TCPV4), (true, HDR_GSO_TCPV6)] {
            let flow = Flow::benchmark(DST, SRC, Proto::Tcp, ipv6);
            let (mut f, h) = flow.gso_frame(65000, 1448, off, |i| i as u8).unwrap();
            let l4 = ETH_HLEN + flow.ip_hdr_len();
            assert_eq!(
                (h.flags, h.gso_type, h.gso_size, h.hdr_len),
                (HDR_F_NEEDS_CSUM, gso_type, 1448, flow.hdr_len() as u16)
            );
            assert_eq!((h.csum_start, h.csum_offset), (l4 as u16, 16));
            // The field holds the pseudo-header sum over the whole frame's length: completed
            // over the super-frame it gives the super-frame's own checksum.
            let want = l4_checksum(&f, &flow);
            offload::complete_checksum(&mut f, &h);
            assert_eq!(be16(&f, l4 + 16), want);
        }
    }

    #[test]
    fn uso_super_frames_ask_for_udp_segmentation() {
        let off = TxOffloads::from_features(feature::CSUM | feature::HOST_USO);
        for ipv6 in [false, true] {
            let flow = Flow::benchmark(DST, SRC, Proto::Udp, ipv6);
            let (mut f, h) = flow.gso_frame(65000, 1400, off, |i| i as u8).unwrap();
            let l4 = ETH_HLEN + flow.ip_hdr_len();
            assert_eq!(
                (h.flags, h.gso_type, h.gso_size, h.hdr_len),
                (
                    HDR_F_NEEDS_CSUM,
                    HDR_GSO_UDP_L4,
                    1400,
                    flow.hdr_len() as u16
                )
            );
            assert_eq!((h.csum_start, h.csum_offset), (l4 as u16, 6));
            // The UDP length covers the whole frame, as in a GSO skb from a UDP_SEGMENT socket.
            assert_eq!(be16(&f, l4 + 4) as usize, 65000 - l4);
            let want = l4_checksum(&f, &flow);
            offload::complete_checksum(&mut f, &h);
            assert_eq!(be16(&f, l4 + 6), want);
        }
    }

    #[test]
    fn gso_frames_are_refused_when_the_offload_is_not_negotiated_or_the_size_is_wrong() {
        let tcp4 = Flow::benchmark(DST, SRC, Proto::Tcp, false);
        let tcp6 = Flow::benchmark(DST, SRC, Proto::Tcp, true);
        let udp4 = Flow::benchmark(DST, SRC, Proto::Udp, false);
        let tso4 = TxOffloads::from_features(feature::CSUM | feature::HOST_TSO4);
        let feature_of = |r: Result<(Vec<u8>, NetHdr), GenError>| match r {
            Err(GenError::Negotiation { feature, .. }) => feature,
            other => panic!("not a negotiation error: {other:?}"),
        };
        assert_eq!(
            feature_of(udp4.gso_frame(65000, 1472, tso4, |_| 0)),
            "HOST_USO"
        );
        assert_eq!(
            feature_of(tcp6.gso_frame(65000, 1428, tso4, |_| 0)),
            "HOST_TSO6"
        );
        let no_csum = TxOffloads::from_features(feature::HOST_TSO4 | feature::HOST_USO);
        assert_eq!(
            feature_of(tcp4.gso_frame(65000, 1448, no_csum, |_| 0)),
            "CSUM"
        );
        assert!(tcp4.gso_frame(65000, 1448, tso4, |_| 0).is_ok());
        for (len, mss) in [(65550, 1448), (66 + 1448, 1448), (65000, 0)] {
            assert!(
                matches!(
                    tcp4.gso_frame(len, mss, tso4, |_| 0),
                    Err(GenError::Options(_))
                ),
                "{len} {mss}"
            );
        }
        let uso = TxOffloads::from_features(feature::CSUM | feature::HOST_USO);
        // 65 segments of 1000 bytes: more than Linux takes.
        let r = udp4.gso_frame(42 + 65 * 1000, 1000, uso, |_| 0);
        assert!(matches!(r, Err(GenError::Options(m)) if m.contains("at most 64")));
        assert!(udp4.gso_frame(42 + 64 * 1000, 1000, uso, |_| 0).is_ok());
    }

    #[test]
    fn udp4_frame_has_a_valid_ip_header_and_no_udp_checksum() {
        let f = udp4_frame(64, [2; 6], [4; 6], &[1, 2, 3]);
        assert_eq!(f.len(), 64);
        assert_eq!(fold(sum16(0, &f[14..34])), 0xffff, "IP header checksum");
        assert_eq!(&f[42..45], &[1, 2, 3]);
        assert_eq!(&f[40..42], &[0, 0]);
        assert_eq!(udp4_frame(10, [2; 6], [4; 6], &[]).len(), 42);
    }
}
