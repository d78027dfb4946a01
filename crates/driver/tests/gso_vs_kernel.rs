//! `vnet::gso` against the kernel's GSO, byte for byte.
//!
//! Two TAPs in a network namespace, bridged: a frame written into `vngsi` behind its
//! virtio-net header is forwarded by the bridge to `vngso` as it was written (a bridge does
//! not route: MAC addresses, TTL and hop limit stay as sent, so nothing needs accounting
//! for), and since `vngso` offers the kernel no segmentation offload, `validate_xmit_skb`
//! resolves it in software: it cuts a super-frame (`skb_gso_segment`) or completes a
//! checksum (`skb_checksum_help`). We read every frame the kernel hands out of `vngso`
//! with the virtio-net header it writes in front, and compare them, header and bytes,
//! frame for frame, with what `vnet::gso::segment` makes of the same header and frame:
//!
//! - `vngso` with no offload at all: against `Csum::Complete` (headers all zero, every
//!   checksum in full);
//! - `vngso` with checksum offload only (TUN_F_CSUM): against `Csum::Partial` (NEEDS_CSUM
//!   and the segment's pseudo-header sum in the field, as the kernel leaves it to a device).
//!
//! The frames: the TSO and USO super-frames `virtnet gen --gso` sends (`Flow::gso_frame`)
//! over IPv4 and IPv6, and the cases where Linux's rules show: a last segment of one byte,
//! CWR/ECE/FIN with the ECN bit, an IPv4 identification that wraps, TSO without NEEDS_CSUM
//! (the kernel seeds the checksum itself), a NIC-style seed without the length (both give
//! the same bad checksums), VLAN tags, an IPv6 destination options header, a plain
//! NEEDS_CSUM frame, a checksum that comes out 0 (written 0xffff), and a USO frame with one
//! segment of payload (not GSO by the kernel's count). The bridge's netfilter hooks are
//! turned off so that nothing validates or trims IP packets on the way.
//!
//! And the other side: headers and frames the TAP refuses (EINVAL) or the kernel's GSO
//! drops (nothing comes out) are refused by `vnet::gso` too.
//!
//! Needs root (network namespaces, TAP devices); skips with a printed reason otherwise.

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use testkit::netns::NetNs;
use testkit::packages;
use virtnet_driver::gen::frames::{Addrs, Flow, Proto};
use virtnet_driver::offload::{self, TxOffloads};
use virtnet_sys::tap::{TapOffloads, TapQueue};
use vnet::csum::Sum;
use vnet::gso::{self, Csum};
use vnet::{feature, NetHdr, HDR_GSO_ECN, HDR_GSO_UDP_L4, HDR_LEN};

const BRIDGE: &str = "vngsbr";
const IN_TAP: &str = "vngsi";
const OUT_TAP: &str = "vngso";
/// The sender behind `vngsi` (the frames the test looks for come from it), and a
/// destination the bridge has not learnt, so that it floods the frame to `vngso`.
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x99, 0x02];
const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x98, 0x02];

fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

/// Two TAPs on a bridge in a namespace of their own.
struct Bridge {
    _ns: NetNs,
    input: TapQueue,
    output: TapQueue,
}

impl Bridge {
    fn new(tag: &str) -> Bridge {
        let ns = NetNs::create(tag).expect("network namespace");
        // Opened from a thread in the namespace, the TAPs are created there, with no
        // offload (TUNSETOFFLOAD not called).
        let (input, output) = ns.run(|| (TapQueue::open(IN_TAP), TapQueue::open(OUT_TAP)));
        let (input, output) = (input.expect("open vngsi"), output.expect("open vngso"));
        input.set_vnet_hdr_len(HDR_LEN).unwrap();
        output.set_vnet_hdr_len(HDR_LEN).unwrap();
        let run = |args: &str| {
            let argv: Vec<&str> = args.split(' ').collect();
            ns.exec(&argv).unwrap_or_else(|e| panic!("{args}: {e}"));
        };
        // Where br_netfilter is built in, its hooks validate IP headers and trim packets to
        // their IP length before the bridge forwards them: not what is compared here. The
        // switches are per namespace; without br_netfilter they do not exist.
        for t in ["iptables", "ip6tables", "arptables"] {
            let _ = ns.exec(&["sysctl", "-qw", &format!("net.bridge.bridge-nf-call-{t}=0")]);
        }
        run(&format!("ip link add {BRIDGE} type bridge"));
        run(&format!("ip link set {IN_TAP} master {BRIDGE} up"));
        run(&format!("ip link set {OUT_TAP} master {BRIDGE} up"));
        run(&format!("ip link set {BRIDGE} up"));
        let bridge = Bridge {
            _ns: ns,
            input,
            output,
        };
        bridge.wait_forwarding();
        bridge
    }

    /// Writes small frames until one comes out of the other side: the ports forward.
    fn wait_forwarding(&self) {
        let flow = flow(Proto::Udp, false);
        let frame = flow.frame(100, pattern);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            self.write(&NetHdr::default(), &frame);
            if !self.read(1).is_empty() {
                return;
            }
        }
        panic!("the bridge forwards nothing from {IN_TAP} to {OUT_TAP}");
    }

    fn write(&self, hdr: &NetHdr, frame: &[u8]) {
        if let Err(e) = self.try_write(hdr, frame) {
            panic!("writing into {IN_TAP}: {e}");
        }
    }

    fn try_write(&self, hdr: &NetHdr, frame: &[u8]) -> io::Result<()> {
        let mut b = hdr.to_bytes().to_vec();
        b.extend_from_slice(frame);
        let n = self.input.write(&b)?;
        assert_eq!(n, b.len(), "a short write");
        Ok(())
    }

    /// The frames from the peer the kernel hands out of the output TAP, each with its
    /// virtio-net header, until `want` came and then 100 ms passed without another, or a
    /// second passed without any.
    fn read(&self, want: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70_000];
        loop {
            match self.output.read(&mut buf) {
                Ok(n) => {
                    let f = &buf[..n];
                    if n >= HDR_LEN + 14 && f[HDR_LEN + 6..HDR_LEN + 12] == PEER_MAC {
                        got.push(f.to_vec());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let wait = if got.len() >= want { 100 } else { 1000 };
                    if !virtnet_sys::wait_readable(self.output.as_raw_fd(), wait) {
                        return got;
                    }
                }
                Err(e) => panic!("reading {OUT_TAP}: {e}"),
            }
        }
    }
}

fn flow(proto: Proto, ipv6: bool) -> Flow {
    let addrs = if ipv6 {
        let mut src = [0u8; 16];
        src[..2].copy_from_slice(&[0xfd, 0]);
        let mut dst = src;
        src[15] = 1;
        dst[15] = 2;
        Addrs::V6 { src, dst }
    } else {
        Addrs::V4 {
            src: [10, 99, 0, 1],
            dst: [10, 98, 0, 2],
        }
    };
    Flow {
        dst_mac: DST_MAC,
        src_mac: PEER_MAC,
        addrs,
        proto,
        src_port: 40000,
        dst_port: 5001,
        seq: 0xfff0_0000,
    }
}

fn all_offloads() -> TxOffloads {
    TxOffloads::from_features(
        feature::CSUM | feature::HOST_TSO4 | feature::HOST_TSO6 | feature::HOST_USO,
    )
}

/// A frame to write and its header.
struct Case {
    what: &'static str,
    hdr: NetHdr,
    frame: Vec<u8>,
}

fn case(what: &'static str, (frame, hdr): (Vec<u8>, NetHdr)) -> Case {
    Case { what, hdr, frame }
}

/// The super-frame `virtnet gen --gso` sends.
fn super_frame(proto: Proto, ipv6: bool, len: usize, mss: u16) -> (Vec<u8>, NetHdr) {
    flow(proto, ipv6)
        .gso_frame(len, mss, all_offloads(), pattern)
        .unwrap()
}

/// A frame of `len` bytes with NEEDS_CSUM and no GSO, as a driver sends it.
fn csum_frame(proto: Proto, ipv6: bool, len: usize) -> (Vec<u8>, NetHdr) {
    let mut f = flow(proto, ipv6).frame(len, pattern);
    let hdr = offload::prepare(&mut f, all_offloads(), None);
    (f, hdr)
}

/// `n` bytes inserted at `at`, in front of the transport header: the header's offsets move.
fn insert((mut f, mut hdr): (Vec<u8>, NetHdr), at: usize, bytes: &[u8]) -> (Vec<u8>, NetHdr) {
    f.splice(at..at, bytes.iter().copied());
    hdr.csum_start += bytes.len() as u16;
    hdr.hdr_len += bytes.len() as u16;
    (f, hdr)
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn put16(f: &mut [u8], at: usize, v: u16) {
    f[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn cases() -> Vec<Case> {
    let mut v = vec![
        case("TSO IPv4", super_frame(Proto::Tcp, false, 65_000, 1448)),
        case("TSO IPv6", super_frame(Proto::Tcp, true, 65_000, 1428)),
        case("USO IPv4", super_frame(Proto::Udp, false, 65_000, 1472)),
        case("USO IPv6", super_frame(Proto::Udp, true, 65_000, 1452)),
        case(
            "TSO IPv4, a last segment of one byte",
            super_frame(Proto::Tcp, false, 66 + 40_001, 1000),
        ),
    ];

    // CWR, ECE, PSH and FIN, and the ECN bit: CWR on the first segment only, FIN and PSH
    // on the last.
    let (mut f, mut hdr) = super_frame(Proto::Tcp, true, 30_000, 1428);
    f[54 + 13] = 0x80 | 0x40 | 0x10 | 0x08 | 0x01;
    hdr.gso_type |= HDR_GSO_ECN;
    v.push(case("TSO IPv6, ECN, CWR ECE PSH FIN", (f, hdr)));

    // An identification that wraps (the super-frame's header checksum is not looked at).
    let (mut f, hdr) = super_frame(Proto::Udp, false, 30_000, 1472);
    put16(&mut f, 18, 0xfff8);
    v.push(case("USO IPv4, identification wrapping", (f, hdr)));

    // TSO without NEEDS_CSUM: the kernel puts the pseudo-header sum in itself, whatever the
    // field held.
    let (mut f, mut hdr) = super_frame(Proto::Tcp, false, 30_000, 1448);
    put16(&mut f, 34 + 16, 0x1234);
    (hdr.flags, hdr.csum_start, hdr.csum_offset) = (0, 0, 0);
    v.push(case("TSO IPv4 without NEEDS_CSUM", (f, hdr)));

    // A NIC's seed, without the length: kept and adjusted, so every segment's checksum is
    // off the same way, from the kernel and from us.
    let (mut f, hdr) = super_frame(Proto::Tcp, false, 30_000, 1448);
    let seed = Sum::ZERO
        .add_u16(be16(&f, 34 + 16))
        .sub_u32((f.len() - 34) as u32)
        .fold();
    put16(&mut f, 34 + 16, seed);
    v.push(case("TSO IPv4, a seed without the length", (f, hdr)));

    // A VLAN tag: the kernel takes it into the skb on receive and puts it back on output.
    let tag = [0x81, 0x00, 0x00, 0x64];
    v.push(case(
        "TSO IPv4 behind a VLAN tag",
        insert(super_frame(Proto::Tcp, false, 30_000, 1448), 12, &tag),
    ));
    v.push(case(
        "USO IPv6 behind a VLAN tag",
        insert(super_frame(Proto::Udp, true, 30_000, 1452), 12, &tag),
    ));

    // A destination options header (PadN) between IPv6 and TCP, which GSO steps over.
    let (f, hdr) = insert(
        super_frame(Proto::Tcp, true, 30_000, 1428),
        54,
        &[6, 0, 1, 4, 0, 0, 0, 0],
    );
    let mut f = f;
    f[20] = 60;
    v.push(case("TSO IPv6, destination options", (f, hdr)));

    v.push(case(
        "UDP IPv4, NEEDS_CSUM, no GSO",
        csum_frame(Proto::Udp, false, 1000),
    ));

    // Two payload bytes chosen so that the sum is 0xffff: a checksum of 0, which
    // skb_checksum_help writes as 0xffff, for TCP too.
    let (mut f, hdr) = csum_frame(Proto::Tcp, true, 1200);
    put16(&mut f, 86, 0);
    let rest = Sum::ZERO.add_bytes(&f[54..]).fold();
    put16(&mut f, 86, !rest);
    v.push(case("TCP IPv6, NEEDS_CSUM, a checksum of 0", (f, hdr)));

    // USO with no more than one segment of payload: not GSO by Linux's count.
    let (f, mut hdr) = csum_frame(Proto::Udp, true, 62 + 1000);
    (hdr.gso_type, hdr.gso_size, hdr.hdr_len) = (HDR_GSO_UDP_L4, 1452, 62);
    v.push(case("USO IPv6, one segment's payload", (f, hdr)));
    v
}

/// What `vnet::gso` makes of a case: each frame behind its header, as a TAP hands it out.
fn ours(c: &Case, csum: Csum) -> Vec<Vec<u8>> {
    let mut scratch = c.frame.clone();
    let mut segs = gso::segment(&c.hdr, &mut scratch, csum)
        .unwrap_or_else(|e| panic!("{}: vnet::gso refuses it: {e}", c.what));
    let mut out = Vec::with_capacity(segs.count());
    while let Some((hdr, f)) = segs.next_segment() {
        let mut b = hdr.to_bytes().to_vec();
        b.extend_from_slice(f);
        out.push(b);
    }
    out
}

/// Writes every case and compares; returns how many frames were compared.
fn compare(bridge: &Bridge, csum: Csum) -> usize {
    let mut compared = 0;
    for c in cases() {
        let want = ours(&c, csum);
        bridge.write(&c.hdr, &c.frame);
        let got = bridge.read(want.len());
        let what = format!("{} ({csum:?})", c.what);
        assert_eq!(got.len(), want.len(), "{what}: frames from the kernel");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            if g != w {
                let at = g.iter().zip(w).position(|(a, b)| a != b);
                panic!(
                    "{what}: frame {k} differs ({} bytes from the kernel, {} ours), first at \
                     byte {at:?} (the virtio-net header is {HDR_LEN}):\nkernel {:02x?}\nours   \
                     {:02x?}",
                    g.len(),
                    w.len(),
                    &g[..g.len().min(HDR_LEN + 96)],
                    &w[..w.len().min(HDR_LEN + 96)],
                );
            }
        }
        eprintln!("{what}: {} frames equal", got.len());
        compared += got.len();
    }
    compared
}

#[test]
fn vnet_gso_cuts_and_checksums_as_the_kernel_does_byte_for_byte() {
    const TEST: &str = "gso_vs_kernel";
    if !packages::netns_ready(TEST) {
        return;
    }
    let bridge = Bridge::new("gsocmp");
    let complete = compare(&bridge, Csum::Complete);
    bridge
        .output
        .set_offloads(TapOffloads {
            csum: true,
            ..TapOffloads::default()
        })
        .expect("checksum offload on the output TAP");
    let partial = compare(&bridge, Csum::Partial);
    eprintln!("{TEST}: {complete} frames compared in full, {partial} with partial checksums");
    assert_eq!(complete, partial);
    assert!(complete > 300, "{complete} frames");
}

/// One rule broken per case: the kernel refuses the write (EINVAL) or takes the frame and
/// drops it in GSO, so nothing comes out of the bridge; `vnet::gso` refuses it.
#[test]
fn what_the_kernel_refuses_or_drops_vnet_gso_refuses() {
    const TEST: &str = "gso_vs_kernel::refused";
    if !packages::netns_ready(TEST) {
        return;
    }
    let bridge = Bridge::new("gsoref");
    let (t4f, t4) = super_frame(Proto::Tcp, false, 30_000, 1448);
    let (t6f, t6) = super_frame(Proto::Tcp, true, 30_000, 1428);
    let (u6f, u6) = super_frame(Proto::Udp, true, 30_000, 1452);
    let with = |f: &[u8], at: usize, b: u8| {
        let mut g = f.to_vec();
        g[at] = b;
        g
    };
    let cases: Vec<(&str, NetHdr, Vec<u8>)> = vec![
        ("shorter than Ethernet", NetHdr::default(), vec![0xff; 10]),
        (
            "USO without NEEDS_CSUM",
            NetHdr { flags: 0, ..u6 },
            u6f.clone(),
        ),
        (
            "USO with the ECN bit",
            NetHdr {
                gso_type: HDR_GSO_UDP_L4 | HDR_GSO_ECN,
                ..u6
            },
            u6f.clone(),
        ),
        (
            "USO of 150 segments",
            NetHdr {
                gso_size: 200,
                ..u6
            },
            u6f.clone(),
        ),
        (
            "TSO with UDP's checksum offset",
            NetHdr {
                csum_offset: 6,
                ..t4
            },
            t4f.clone(),
        ),
        ("gso_size 0", NetHdr { gso_size: 0, ..t4 }, t4f.clone()),
        (
            "gso_size 0xffff (GSO_BY_FRAGS)",
            NetHdr {
                gso_size: 0xffff,
                ..t4
            },
            t4f.clone(),
        ),
        (
            "TCPV6 checksum inside the IPv6 header's room",
            NetHdr {
                csum_start: 39,
                ..t6
            },
            t6f.clone(),
        ),
        (
            "TCPV4 on an IPv6 frame",
            NetHdr {
                gso_type: vnet::HDR_GSO_TCPV4,
                ..t6
            },
            t6f.clone(),
        ),
        (
            "checksum start off the TCP header",
            NetHdr {
                csum_start: 38,
                ..t4
            },
            t4f.clone(),
        ),
        (
            "one segment of payload past the TCP options",
            NetHdr {
                gso_size: 30_000 - 66,
                ..t4
            },
            t4f.clone(),
        ),
        ("IPv4 IHL 4", t4, with(&t4f, 14, 0x44)),
        ("TCP data offset 4", t4, with(&t4f, 34 + 12, 0x40)),
        ("an ARP ethertype", t4, with(&t4f, 13, 0x06)),
        ("an IPv6 fragment header", u6, with(&u6f, 20, 44)),
    ];
    for (why, hdr, frame) in cases {
        let mut scratch = frame.clone();
        let ours = gso::segment(&hdr, &mut scratch, Csum::Complete)
            .err()
            .unwrap_or_else(|| panic!("{why}: vnet::gso takes it"));
        let kernel = match bridge.try_write(&hdr, &frame) {
            Ok(()) => "takes it and drops it",
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => "refuses it (EINVAL)",
            Err(e) => panic!("{why}: writing into {IN_TAP}: {e}"),
        };
        let got = bridge.read(0);
        assert!(
            got.is_empty(),
            "{why}: the kernel sent {} frames",
            got.len()
        );
        eprintln!("{why}: the kernel {kernel}; vnet::gso: {ours}");
    }
}
