//! Frames built here, cut by [`segment`], and every segment checked field by field against
//! what RFC 791/8200/9293/768 and Linux's GSO say it must hold, checksums recomputed from
//! scratch. The kernel itself is compared in the driver's `gso_vs_kernel` test.

// The whole file is tests (gso.rs includes it under cfg(test)); said again here for tools
// that measure code before its tests.
#[cfg(test)]
use super::*;
use crate::csum::Sum;
use proptest::prelude::*;

const TCP_ACK: u8 = 0x10;
const TCP_ECE: u8 = 0x40;

/// A super-frame to build: Ethernet, `vlans` tags, IPv4 or IPv6, TCP (with the timestamp
/// option, 32 bytes, as Linux sends) or UDP, and `payload` bytes.
#[derive(Clone, Copy, Debug)]
struct Spec {
    ipv6: bool,
    tcp: bool,
    vlans: usize,
    payload: usize,
    mss: u16,
    tcp_flags: u8,
    ip_id: u16,
    seq: u32,
}

impl Spec {
    fn new(ipv6: bool, tcp: bool) -> Spec {
        Spec {
            ipv6,
            tcp,
            vlans: 0,
            payload: 10_000,
            mss: 1448,
            tcp_flags: TCP_ACK | TCP_PSH,
            ip_id: 0x1234,
            seq: 0xffff_f000,
        }
    }

    fn l3(&self) -> usize {
        14 + 4 * self.vlans
    }

    fn l4(&self) -> usize {
        self.l3() + if self.ipv6 { 40 } else { 20 }
    }

    fn hdr_len(&self) -> usize {
        self.l4() + if self.tcp { 32 } else { 8 }
    }
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

/// The pseudo-header sum (not complemented) of the L4 bytes from `l4` to the end.
fn pseudo(f: &[u8], l3: usize, l4: usize, ipv6: bool, proto: u8) -> Sum {
    let addrs = if ipv6 {
        &f[l3 + 8..l3 + 40]
    } else {
        &f[l3 + 12..l3 + 20]
    };
    Sum::ZERO
        .add_bytes(addrs)
        .add_u16(proto as u16)
        .add_u32((f.len() - l4) as u32)
}

/// The frame and the header a Linux guest sends it with: NEEDS_CSUM, the checksum field
/// holding the pseudo-header sum over the whole frame.
fn build(s: &Spec) -> (NetHdr, Vec<u8>) {
    let len = s.hdr_len() + s.payload;
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    let mut at = 12;
    for v in 0..s.vlans {
        let tpid: u16 = if v + 1 < s.vlans { 0x88a8 } else { 0x8100 };
        put16(&mut f, at, tpid);
        put16(&mut f, at + 2, 100 + v as u16);
        at += 4;
    }
    let (l3, l4) = (s.l3(), s.l4());
    let proto = if s.tcp { 6 } else { 17 };
    if s.ipv6 {
        put16(&mut f, at, 0x86dd);
        f[l3] = 0x60;
        put16(&mut f, l3 + 4, (len - l4) as u16);
        f[l3 + 6] = proto;
        f[l3 + 7] = 64;
        f[l3 + 8] = 0xfd;
        f[l3 + 23] = 1;
        f[l3 + 24] = 0xfd;
        f[l3 + 39] = 2;
    } else {
        put16(&mut f, at, 0x0800);
        f[l3] = 0x45;
        put16(&mut f, l3 + 2, (len - l3) as u16);
        put16(&mut f, l3 + 4, s.ip_id);
        f[l3 + 6] = 0x40;
        f[l3 + 8] = 64;
        f[l3 + 9] = proto;
        f[l3 + 12..l3 + 16].copy_from_slice(&[10, 0, 0, 1]);
        f[l3 + 16..l3 + 20].copy_from_slice(&[10, 0, 0, 2]);
        let c = csum::checksum(&f[l3..l4]);
        put16(&mut f, l3 + 10, c);
    }
    put16(&mut f, l4, 40000);
    put16(&mut f, l4 + 2, 5001);
    if s.tcp {
        f[l4 + 4..l4 + 8].copy_from_slice(&s.seq.to_be_bytes());
        f[l4 + 8..l4 + 12].copy_from_slice(&7u32.to_be_bytes());
        f[l4 + 12] = 8 << 4;
        f[l4 + 13] = s.tcp_flags;
        put16(&mut f, l4 + 14, 0xffff);
        f[l4 + 20..l4 + 24].copy_from_slice(&[1, 1, 8, 10]);
    } else {
        put16(&mut f, l4 + 4, (len - l4) as u16);
    }
    for (i, b) in f[s.hdr_len()..].iter_mut().enumerate() {
        *b = pattern(i);
    }
    let offset = if s.tcp { 16 } else { 6 };
    let seed = pseudo(&f, l3, l4, s.ipv6, proto).fold();
    put16(&mut f, l4 + offset, seed);
    let gso_type = match (s.tcp, s.ipv6) {
        (true, false) => HDR_GSO_TCPV4,
        (true, true) => HDR_GSO_TCPV6,
        (false, _) => HDR_GSO_UDP_L4,
    };
    let hdr = NetHdr {
        flags: HDR_F_NEEDS_CSUM,
        gso_type,
        hdr_len: s.hdr_len() as u16,
        gso_size: s.mss,
        csum_start: l4 as u16,
        csum_offset: offset as u16,
        num_buffers: 0,
    };
    (hdr, f)
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
}

/// Every frame `segment` hands out, with its header.
fn cut_all(hdr: &NetHdr, frame: &[u8], csum: Csum) -> Result<Vec<(NetHdr, Vec<u8>)>, GsoError> {
    let mut scratch = frame.to_vec();
    let mut segs = segment(hdr, &mut scratch, csum)?;
    let count = segs.count();
    let mut out = Vec::new();
    while let Some((h, b)) = segs.next_segment() {
        out.push((h, b.to_vec()));
    }
    assert_eq!(out.len(), count);
    Ok(out)
}

/// Checks the segments of `sent` (built from `s`) against the rules, from scratch.
fn check(s: &Spec, sent: &[u8], segs: &[(NetHdr, Vec<u8>)], csum: Csum) {
    let (l3, l4, h) = (s.l3(), s.l4(), s.hdr_len());
    let mss = s.mss as usize;
    assert_eq!(segs.len(), s.payload.div_ceil(mss), "{s:?}");
    let proto = if s.tcp { 6 } else { 17 };
    let offset = if s.tcp { 16 } else { 6 };
    for (k, (hdr, g)) in segs.iter().enumerate() {
        let what = format!("{s:?} {csum:?} segment {k}");
        let chunk = &sent[h + k * mss..(h + (k + 1) * mss).min(sent.len())];
        assert_eq!(g.len(), h + chunk.len(), "{what}");
        assert_eq!(&g[h..], chunk, "{what}: payload");
        assert_eq!(g[..l3], sent[..l3], "{what}: Ethernet and VLAN tags");
        if s.ipv6 {
            assert_eq!(be16(g, l3 + 4) as usize, g.len() - l4, "{what}");
            assert_eq!(g[l3..l3 + 4], sent[l3..l3 + 4]);
            assert_eq!(g[l3 + 6..l4], sent[l3 + 6..l4]);
        } else {
            assert_eq!(be16(g, l3 + 2) as usize, g.len() - l3, "{what}");
            assert_eq!(be16(g, l3 + 4), s.ip_id.wrapping_add(k as u16), "{what}");
            assert_eq!(csum::checksum(&g[l3..l4]), 0, "{what}: IP checksum");
            assert_eq!(g[l3 + 6..l3 + 10], sent[l3 + 6..l3 + 10], "{what}: DF, TTL");
            assert_eq!(g[l3 + 12..l4], sent[l3 + 12..l4]);
        }
        assert_eq!(g[l4..l4 + 4], sent[l4..l4 + 4], "{what}: ports");
        if s.tcp {
            let seq = s.seq.wrapping_add((k * mss) as u32);
            assert_eq!(be32(g, l4 + 4), seq, "{what}");
            let mut flags = s.tcp_flags;
            if k + 1 < segs.len() {
                flags &= !(TCP_FIN | TCP_PSH);
            }
            if k > 0 {
                flags &= !TCP_CWR;
            }
            assert_eq!(g[l4 + 13], flags, "{what}: flags");
            assert_eq!(g[l4 + 8..l4 + 13], sent[l4 + 8..l4 + 13]);
            assert_eq!(g[l4 + 14..l4 + 16], sent[l4 + 14..l4 + 16]);
            assert_eq!(g[l4 + 18..h], sent[l4 + 18..h], "{what}: options");
        } else {
            assert_eq!(be16(g, l4 + 4) as usize, g.len() - l4, "{what}: UDP length");
        }
        let field = be16(g, l4 + offset);
        match csum {
            Csum::Complete => {
                assert_eq!(*hdr, NetHdr::default(), "{what}");
                let sum = pseudo(g, l3, l4, s.ipv6, proto).add_bytes(&g[l4..]);
                assert_eq!(sum.fold(), 0xffff, "{what}: L4 checksum");
            }
            Csum::Partial => {
                assert_eq!(*hdr, partial_hdr(l4, offset as u16), "{what}");
                let seed = pseudo(g, l3, l4, s.ipv6, proto).fold();
                assert_eq!(field, seed, "{what}: the segment's pseudo-header sum");
            }
        }
    }
}

fn cut_and_check(s: Spec) {
    let (hdr, sent) = build(&s);
    for csum in [Csum::Complete, Csum::Partial] {
        let segs = cut_all(&hdr, &sent, csum).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        check(&s, &sent, &segs, csum);
    }
}

#[test]
fn tso_over_ipv4_and_ipv6_gives_mss_sized_segments() {
    for ipv6 in [false, true] {
        cut_and_check(Spec {
            payload: 64_000,
            ..Spec::new(ipv6, true)
        });
    }
}

#[test]
fn uso_over_ipv4_and_ipv6_gives_datagrams_of_gso_size() {
    for ipv6 in [false, true] {
        cut_and_check(Spec {
            payload: 60_000,
            mss: 1472,
            ..Spec::new(ipv6, false)
        });
    }
}

#[test]
fn fin_and_psh_go_on_the_last_segment_and_cwr_on_the_first_only() {
    let flags = TCP_CWR | TCP_ECE | TCP_ACK | TCP_PSH | TCP_FIN;
    for ipv6 in [false, true] {
        let s = Spec {
            tcp_flags: flags,
            ..Spec::new(ipv6, true)
        };
        let (mut hdr, sent) = build(&s);
        for ecn in [0, HDR_GSO_ECN] {
            hdr.gso_type |= ecn;
            let segs = cut_all(&hdr, &sent, Csum::Complete).unwrap();
            check(&s, &sent, &segs, Csum::Complete);
            let l4 = s.l4();
            let f: Vec<u8> = segs.iter().map(|(_, g)| g[l4 + 13]).collect();
            assert_eq!(f[0], TCP_CWR | TCP_ECE | TCP_ACK);
            assert!(f[1..f.len() - 1].iter().all(|&x| x == TCP_ECE | TCP_ACK));
            assert_eq!(f[f.len() - 1], TCP_ECE | TCP_ACK | TCP_PSH | TCP_FIN);
        }
    }
}

#[test]
fn the_last_segment_carries_the_rest_down_to_one_byte() {
    for (payload, mss, last) in [(40_001, 1000, 1), (10_000, 1448, 10_000 - 6 * 1448)] {
        let s = Spec {
            payload,
            mss,
            ..Spec::new(false, true)
        };
        let (hdr, sent) = build(&s);
        let segs = cut_all(&hdr, &sent, Csum::Complete).unwrap();
        check(&s, &sent, &segs, Csum::Complete);
        assert_eq!(segs.last().unwrap().1.len(), s.hdr_len() + last);
    }
}

#[test]
fn ipv4_identification_counts_up_and_wraps() {
    let s = Spec {
        ip_id: 0xfffe,
        ..Spec::new(false, false)
    };
    let (hdr, sent) = build(&s);
    let segs = cut_all(&hdr, &sent, Csum::Complete).unwrap();
    let ids: Vec<u16> = segs.iter().map(|(_, g)| be16(g, 18)).collect();
    assert_eq!(ids[..4], [0xfffe, 0xffff, 0, 1]);
    check(&s, &sent, &segs, Csum::Complete);
}

#[test]
fn vlan_tagged_frames_are_cut_below_their_tags() {
    for (vlans, ipv6, tcp) in [(1, false, true), (2, true, true), (1, true, false)] {
        cut_and_check(Spec {
            vlans,
            ..Spec::new(ipv6, tcp)
        });
    }
}

#[test]
fn segments_smaller_than_their_headers_are_cut_right() {
    // Each segment's headers are copied over the end of the one before: with 1-byte and
    // 7-byte segments they overlap it many times over.
    for mss in [1, 7, 31] {
        for tcp in [true, false] {
            cut_and_check(Spec {
                payload: 100,
                mss,
                ..Spec::new(true, tcp)
            });
        }
    }
}

#[test]
fn tso_without_needs_csum_is_seeded_with_the_pseudo_header_as_linux_does() {
    let s = Spec::new(false, true);
    let (hdr, sent) = build(&s);
    let with = cut_all(&hdr, &sent, Csum::Complete).unwrap();
    let mut garbage = sent.clone();
    put16(&mut garbage, s.l4() + 16, 0xdead);
    let bare = NetHdr {
        flags: 0,
        csum_start: 0,
        csum_offset: 0,
        ..hdr
    };
    assert_eq!(cut_all(&bare, &garbage, Csum::Complete).unwrap(), with);
}

#[test]
fn a_seed_without_the_length_gives_every_segment_the_same_error() {
    // A NIC's convention: the pseudo-header sum without the length. Linux (and we) keep
    // the field's sum and swap lengths, so every segment's sum is off by the whole length.
    let s = Spec::new(false, true);
    let (hdr, mut sent) = build(&s);
    let l4 = s.l4();
    let total = (sent.len() - l4) as u32;
    let nic = Sum::ZERO
        .add_u16(be16(&sent, l4 + 16))
        .sub_u32(total)
        .fold();
    put16(&mut sent, l4 + 16, nic);
    for (_, g) in cut_all(&hdr, &sent, Csum::Complete).unwrap() {
        let sum = pseudo(&g, 14, l4, false, 6).add_bytes(&g[l4..]);
        assert_ne!(sum.fold(), 0xffff);
        assert_eq!(sum.sub_u32(total).fold(), 0xffff);
    }
}

#[test]
fn a_frame_not_cut_comes_out_whole_with_its_checksum_completed_or_left() {
    // GSO_NONE, and a GSO frame with no more than one segment of payload.
    let s = Spec {
        payload: 1000,
        ..Spec::new(false, false)
    };
    let (gso, sent) = build(&s);
    let none = NetHdr {
        gso_type: HDR_GSO_NONE,
        gso_size: 0,
        hdr_len: 0,
        ..gso
    };
    for hdr in [none, gso] {
        let segs = cut_all(&hdr, &sent, Csum::Complete).unwrap();
        assert_eq!(segs.len(), 1);
        let (h, g) = &segs[0];
        assert_eq!(*h, NetHdr::default());
        assert_eq!(g[..s.l4() + 6], sent[..s.l4() + 6]);
        assert_eq!(g[s.l4() + 8..], sent[s.l4() + 8..]);
        assert_eq!(
            pseudo(g, 14, 34, false, 17).add_bytes(&g[34..]).fold(),
            0xffff
        );
        let partial = cut_all(&hdr, &sent, Csum::Partial).unwrap();
        assert_eq!(partial, vec![(partial_hdr(34, 6), sent.clone())]);
    }
    // Without NEEDS_CSUM nothing is touched.
    let plain = NetHdr { flags: 0, ..none };
    let segs = cut_all(&plain, &sent, Csum::Complete).unwrap();
    assert_eq!(segs, vec![(NetHdr::default(), sent)]);
}

#[test]
fn complete_csum_puts_the_checksum_in_and_a_zero_as_all_ones() {
    let s = Spec {
        payload: 101,
        ..Spec::new(true, true)
    };
    let (hdr, sent) = build(&s);
    let mut f = sent.clone();
    let out = complete_csum(&hdr, &mut f).unwrap();
    assert_eq!(out.flags, 0);
    assert_eq!(
        pseudo(&f, 14, 54, true, 6).add_bytes(&f[54..]).fold(),
        0xffff
    );
    // Two payload bytes chosen so that the sum is 0xffff: the checksum would be 0, and
    // skb_checksum_help writes 0xffff, for TCP too.
    let mut z = sent.clone();
    let at = s.hdr_len();
    put16(&mut z, at, 0);
    let rest = Sum::ZERO.add_bytes(&z[54..]).fold();
    put16(&mut z, at, !rest);
    assert_eq!(Sum::ZERO.add_bytes(&z[54..]).fold(), 0xffff);
    complete_csum(&hdr, &mut z).unwrap();
    assert_eq!(be16(&z, 54 + 16), 0xffff);
    // Outside the frame: refused, nothing written.
    let far = NetHdr {
        csum_start: 100,
        csum_offset: sent.len() as u16 - 101,
        ..hdr
    };
    let mut g = sent.clone();
    assert!(matches!(
        complete_csum(&far, &mut g),
        Err(GsoError::CsumRange { .. })
    ));
    assert_eq!(g, sent);
}

#[test]
fn segments_can_be_taken_one_at_a_time_and_left() {
    let s = Spec::new(false, true);
    let (hdr, sent) = build(&s);
    let mut scratch = sent.clone();
    let mut segs = segment(&hdr, &mut scratch, Csum::Complete).unwrap();
    assert_eq!((segs.count(), segs.header_len()), (7, Some(66)));
    let first = segs.next_segment().map(|(_, b)| b.to_vec()).unwrap();
    assert_eq!(first.len(), 66 + 1448);
    let all = cut_all(&hdr, &sent, Csum::Complete).unwrap();
    assert_eq!(first, all[0].1);
}

/// Headers that break one rule each, with the error each gets; the frame is left alone.
#[test]
fn each_rule_linux_enforces_is_refused_with_its_error() {
    let tcp4 = Spec::new(false, true);
    let (t4, f4) = build(&tcp4);
    let (u6, f6) = build(&Spec::new(true, false));
    let (t6, ft6) = build(&Spec::new(true, true));
    let with = |f: &[u8], at: usize, b: u8| {
        let mut g = f.to_vec();
        g[at] = b;
        g
    };
    let cases: Vec<(&str, NetHdr, Vec<u8>, GsoError)> = vec![
        (
            "no Ethernet header",
            t4,
            f4[..13].to_vec(),
            GsoError::Short {
                len: 13,
                hdr_len: 66,
            },
        ),
        (
            "unknown GSO type",
            NetHdr { gso_type: 2, ..t4 },
            f4.clone(),
            GsoError::GsoType { gso_type: 2 },
        ),
        (
            "ECN bit alone",
            NetHdr {
                gso_type: HDR_GSO_ECN,
                ..t4
            },
            f4.clone(),
            GsoError::GsoType {
                gso_type: HDR_GSO_ECN,
            },
        ),
        (
            "ECN on USO",
            NetHdr {
                gso_type: HDR_GSO_UDP_L4 | HDR_GSO_ECN,
                ..u6
            },
            f6.clone(),
            GsoError::GsoType {
                gso_type: HDR_GSO_UDP_L4 | HDR_GSO_ECN,
            },
        ),
        (
            "UFO",
            NetHdr {
                gso_type: HDR_GSO_UDP,
                ..u6
            },
            f6.clone(),
            GsoError::Ufo,
        ),
        (
            "gso_size 0",
            NetHdr { gso_size: 0, ..t4 },
            f4.clone(),
            GsoError::GsoSize { gso_size: 0 },
        ),
        (
            "GSO_BY_FRAGS",
            NetHdr {
                gso_size: 0xffff,
                ..t4
            },
            f4.clone(),
            GsoError::GsoSize { gso_size: 0xffff },
        ),
        (
            "checksum inside the IPv6 header's room",
            NetHdr {
                csum_start: 39,
                ..t6
            },
            ft6.clone(),
            GsoError::CsumRange {
                start: 39,
                offset: 16,
                len: ft6.len(),
            },
        ),
        (
            "TSO checksum offset",
            NetHdr {
                csum_offset: 6,
                ..t4
            },
            f4.clone(),
            GsoError::CsumOffset {
                offset: 6,
                want: 16,
            },
        ),
        (
            "USO checksum offset",
            NetHdr {
                csum_offset: 16,
                ..u6
            },
            f6.clone(),
            GsoError::CsumOffset {
                offset: 16,
                want: 6,
            },
        ),
        (
            "checksum start off the transport header",
            NetHdr {
                csum_start: 38,
                ..t4
            },
            f4.clone(),
            GsoError::CsumStart { start: 38, l4: 34 },
        ),
        (
            "USO without NEEDS_CSUM",
            NetHdr { flags: 0, ..u6 },
            f6.clone(),
            GsoError::UsoWithoutCsum,
        ),
        (
            "IPv4 IHL 4",
            t4,
            with(&f4, 14, 0x44),
            GsoError::HeaderLen {
                layer: "IPv4",
                value: 4,
            },
        ),
        (
            "TCP data offset 4",
            t4,
            with(&f4, 34 + 12, 4 << 4),
            GsoError::HeaderLen {
                layer: "TCP",
                value: 4,
            },
        ),
        (
            "not IP",
            t4,
            with(&f4, 13, 0x06),
            GsoError::NotIp { ethertype: 0x0806 },
        ),
        (
            "TSO over IPv4 on a UDP packet",
            t4,
            with(&f4, 14 + 9, 17),
            GsoError::Protocol {
                proto: 17,
                ipv6: false,
            },
        ),
        (
            "TCPV4 on an IPv6 frame",
            NetHdr {
                gso_type: HDR_GSO_TCPV4,
                ..t6
            },
            ft6.clone(),
            GsoError::Protocol {
                proto: 6,
                ipv6: true,
            },
        ),
        (
            "an IPv6 fragment header",
            u6,
            with(&f6, 14 + 6, 44),
            GsoError::Protocol {
                proto: 44,
                ipv6: true,
            },
        ),
        (
            "one segment of payload past the options Linux did not count",
            NetHdr {
                gso_size: 10_000,
                ..t4
            },
            f4.clone(),
            GsoError::NotSegmentable {
                payload: 10_000,
                gso_size: 10_000,
            },
        ),
        (
            "more than 128 USO segments",
            NetHdr { gso_size: 70, ..u6 },
            f6.clone(),
            GsoError::TooManySegments {
                segments: 10_000usize.div_ceil(70),
                max: 128,
            },
        ),
        (
            "more than MAX_SEGMENTS",
            NetHdr { gso_size: 1, ..t4 },
            f4.clone(),
            GsoError::TooManySegments {
                segments: 10_000,
                max: MAX_SEGMENTS,
            },
        ),
    ];
    for (why, hdr, frame, want) in cases {
        let mut g = frame.clone();
        assert_eq!(
            segment(&hdr, &mut g, Csum::Complete).err(),
            Some(want),
            "{why}"
        );
        assert_eq!(g, frame, "{why}: the frame is left alone");
    }
}

#[test]
fn truncated_headers_nested_tags_and_jumbograms_are_refused() {
    let (t4, f4) = build(&Spec::new(false, true));
    // IHL 15: 60 bytes of IPv4 header from offset 14, in a 60-byte frame.
    let mut g = f4[..60].to_vec();
    g[14] = 0x4f;
    let bare = NetHdr {
        flags: 0,
        hdr_len: 0,
        gso_size: 10,
        ..t4
    };
    assert_eq!(
        segment(&bare, &mut g, Csum::Complete).err(),
        Some(GsoError::Truncated {
            layer: "IPv4",
            end: 74,
            len: 60
        })
    );
    // Nine VLAN tags.
    let s = Spec {
        vlans: 9,
        ..Spec::new(false, true)
    };
    let (h, mut f) = build(&s);
    assert_eq!(
        segment(&h, &mut f, Csum::Complete).err(),
        Some(GsoError::VlanDepth)
    );
    // A hop-by-hop jumbo option on an IPv6 packet past 64 KiB.
    let s = Spec {
        payload: 65_600,
        mss: 9000,
        ..Spec::new(true, true)
    };
    let (mut h, mut f) = build(&s);
    let jumbo = [6, 0, 0xc2, 4, 0, 1, 0, 0];
    f.splice(54..54, jumbo);
    f[20] = 0;
    h.csum_start += 8;
    assert_eq!(
        segment(&h, &mut f, Csum::Complete).err(),
        Some(GsoError::Jumbogram)
    );
}

#[test]
fn ipv6_extension_headers_linux_steps_over_are_copied_into_every_segment() {
    let s = Spec::new(true, true);
    let (mut h, f) = build(&s);
    // A destination options header (8 bytes: next header, length 0, PadN), then TCP.
    let mut g = f.clone();
    g.splice(54..54, [6, 0, 1, 4, 0, 0, 0, 0]);
    g[20] = 60;
    h.csum_start += 8;
    h.hdr_len += 8;
    let segs = cut_all(&h, &g, Csum::Complete).unwrap();
    assert_eq!(segs.len(), 7);
    for (_, seg) in &segs {
        assert_eq!(seg[54..62], [6, 0, 1, 4, 0, 0, 0, 0]);
        assert_eq!(
            be16(seg, 18) as usize,
            seg.len() - 54,
            "payload length counts it"
        );
        // The pseudo-header's length is the TCP length, without the extension header.
        let tcp_len = (seg.len() - 62) as u32;
        let sum = Sum::ZERO
            .add_bytes(&seg[22..54])
            .add_u16(6)
            .add_u32(tcp_len)
            .add_bytes(&seg[62..]);
        assert_eq!(sum.fold(), 0xffff);
    }
}

#[test]
fn delivery_passes_what_the_receiver_negotiated_and_resolves_the_rest() {
    use crate::feature::*;
    let (tso4, f4) = build(&Spec::new(false, true));
    let (uso6, f6) = build(&Spec::new(true, false));
    let (uso4, fu4) = build(&Spec::new(false, false));
    let csum_only = NetHdr {
        gso_type: HDR_GSO_NONE,
        ..tso4
    };
    let plain = NetHdr::default();
    let all = GUEST_CSUM | GUEST_TSO4 | GUEST_TSO6 | GUEST_USO4 | GUEST_USO6 | GUEST_ECN;
    let partial = Delivery::Resolve(Csum::Partial);
    let complete = Delivery::Resolve(Csum::Complete);
    let e = Features::EMPTY;
    let ecn = NetHdr {
        gso_type: HDR_GSO_TCPV4 | HDR_GSO_ECN,
        ..tso4
    };
    let no_csum = NetHdr { flags: 0, ..tso4 };
    for (why, hdr, frame, rx, want) in [
        (
            "plain frame, bare receiver",
            plain,
            &f4,
            e,
            Delivery::AsSent,
        ),
        ("NEEDS_CSUM, bare receiver", csum_only, &f4, e, complete),
        (
            "NEEDS_CSUM, GUEST_CSUM",
            csum_only,
            &f4,
            GUEST_CSUM,
            Delivery::AsSent,
        ),
        ("TSO4, everything", tso4, &f4, all, Delivery::AsSent),
        ("TSO4, bare receiver", tso4, &f4, e, complete),
        ("TSO4, GUEST_CSUM only", tso4, &f4, GUEST_CSUM, partial),
        ("TSO4 without GUEST_CSUM", tso4, &f4, GUEST_TSO4, complete),
        (
            "TSO4, GUEST_TSO6 only",
            tso4,
            &f4,
            GUEST_CSUM | GUEST_TSO6,
            partial,
        ),
        (
            "ECN without GUEST_ECN",
            ecn,
            &f4,
            all.difference(GUEST_ECN),
            partial,
        ),
        ("ECN with GUEST_ECN", ecn, &f4, all, Delivery::AsSent),
        ("TSO without NEEDS_CSUM", no_csum, &f4, all, partial),
        (
            "USO6 to USO6",
            uso6,
            &f6,
            GUEST_CSUM | GUEST_USO6,
            Delivery::AsSent,
        ),
        ("USO6 to USO4", uso6, &f6, GUEST_CSUM | GUEST_USO4, partial),
        (
            "USO4 to USO4",
            uso4,
            &fu4,
            GUEST_CSUM | GUEST_USO4,
            Delivery::AsSent,
        ),
        ("USO on no IP", uso4, &f4[..13].to_vec(), all, partial),
    ] {
        assert_eq!(delivery(&hdr, frame, rx), want, "{why}");
    }
}

/// A header near what drivers send, and anything else.
fn any_hdr() -> impl Strategy<Value = NetHdr> {
    let gso_type = prop_oneof![
        Just(HDR_GSO_NONE),
        Just(HDR_GSO_TCPV4),
        Just(HDR_GSO_TCPV6),
        Just(HDR_GSO_UDP_L4),
        Just(HDR_GSO_TCPV4 | HDR_GSO_ECN),
        any::<u8>(),
    ];
    let small = prop_oneof![0u16..200, any::<u16>()];
    (
        prop_oneof![Just(HDR_F_NEEDS_CSUM), any::<u8>()],
        gso_type,
        small.clone(),
        prop_oneof![1u16..3000, any::<u16>()],
        small,
        prop_oneof![Just(6u16), Just(16), any::<u16>()],
    )
        .prop_map(
            |(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)| NetHdr {
                flags,
                gso_type,
                hdr_len,
                gso_size,
                csum_start,
                csum_offset,
                num_buffers: 0,
            },
        )
}

/// A valid super-frame of any kind, then bytes of it overwritten.
fn mutated_frame() -> impl Strategy<Value = (NetHdr, Vec<u8>)> {
    (
        any::<bool>(),
        any::<bool>(),
        0usize..3,
        0usize..5000,
        1u16..2000,
        proptest::collection::vec((0usize..120, any::<u8>()), 0..4),
    )
        .prop_map(|(ipv6, tcp, vlans, payload, mss, edits)| {
            let s = Spec {
                vlans,
                payload,
                mss,
                ..Spec::new(ipv6, tcp)
            };
            let (hdr, mut f) = build(&s);
            for (at, b) in edits {
                if let Some(x) = f.get_mut(at) {
                    *x = b;
                }
            }
            (hdr, f)
        })
}

/// What must hold of any outcome: no panic; an error leaves the frame alone; frames
/// handed out are the whole frame or fit gso_size behind the headers, and their payloads
/// put back together are the frame's. `delivery` and `complete_csum` take anything too.
fn outcome_is_sound(hdr: &NetHdr, frame: &[u8], rx: u64) -> Result<(), TestCaseError> {
    let _ = delivery(hdr, frame, Features(rx));
    let mut g = frame.to_vec();
    if complete_csum(hdr, &mut g).is_err() {
        prop_assert_eq!(&g[..], frame);
    }
    for csum in [Csum::Complete, Csum::Partial] {
        let mut g = frame.to_vec();
        let Ok(mut segs) = segment(hdr, &mut g, csum) else {
            prop_assert_eq!(&g[..], frame);
            continue;
        };
        let count = segs.count();
        prop_assert!(count <= MAX_SEGMENTS);
        let Some(h) = segs.header_len() else {
            prop_assert_eq!(count, 1);
            let (_, f) = segs.next_segment().unwrap();
            prop_assert_eq!(f.len(), frame.len());
            continue;
        };
        let mut payload = Vec::new();
        let mut n = 0;
        while let Some((_, f)) = segs.next_segment() {
            prop_assert!(f.len() > h && f.len() <= h + hdr.gso_size as usize);
            payload.extend_from_slice(&f[h..]);
            n += 1;
        }
        prop_assert_eq!(n, count);
        prop_assert_eq!(&payload[..], &frame[h..]);
    }
    Ok(())
}

proptest! {
    #[test]
    fn any_header_on_any_bytes_is_cut_soundly_or_refused(
        hdr in any_hdr(),
        frame in proptest::collection::vec(any::<u8>(), 0..600),
        rx in any::<u64>(),
    ) {
        outcome_is_sound(&hdr, &frame, rx)?;
    }

    #[test]
    fn any_header_on_a_mutated_super_frame_is_cut_soundly_or_refused(
        hdr in any_hdr(),
        (valid, frame) in mutated_frame(),
        keep_header in any::<bool>(),
        rx in any::<u64>(),
    ) {
        let hdr = if keep_header { valid } else { hdr };
        outcome_is_sound(&hdr, &frame, rx)?;
    }

    #[test]
    fn valid_super_frames_of_every_kind_are_cut_right(
        ipv6 in any::<bool>(),
        tcp in any::<bool>(),
        vlans in 0usize..3,
        payload in 1usize..20_000,
        mss in 1u16..3000,
        id in any::<u16>(),
        seq in any::<u32>(),
    ) {
        let s = Spec { vlans, payload, mss, ip_id: id, seq, ..Spec::new(ipv6, tcp) };
        let (hdr, sent) = build(&s);
        let count = payload.div_ceil(mss as usize);
        let too_many = if tcp { count > MAX_SEGMENTS } else { count > UDP_MAX_SEGMENTS };
        for csum in [Csum::Complete, Csum::Partial] {
            match cut_all(&hdr, &sent, csum) {
                Ok(segs) if payload > mss as usize => check(&s, &sent, &segs, csum),
                Ok(segs) => prop_assert_eq!(segs.len(), 1),
                Err(GsoError::TooManySegments { .. }) => prop_assert!(too_many),
                // TCP options push a payload just over one segment into "not GSO" by
                // Linux's count, then short of two by its own.
                Err(GsoError::NotSegmentable { .. }) => {
                    prop_assert!(tcp && payload <= mss as usize)
                }
                Err(e) => prop_assert!(false, "{:?}: {}", s, e),
            }
        }
    }
}
