//! The super-frames `virtnet gen --gso` builds ([`Flow::gso_frame`]), written into a real
//! TAP with IFF_VNET_HDR, and what the kernel makes of them after segmenting, byte for byte:
//!
//! - forwarded: the namespace routes them from the TAP they were written into (`vngso0`) out
//!   of a second TAP (`vngso1`) that offers the kernel no offload, so the kernel segments
//!   them and completes every checksum in software; we read each segment from `vngso1` and
//!   check its headers, checksums and payload (TSO and USO, IPv4 and IPv6);
//! - delivered: USO datagrams to a UDP socket bound in the namespace, each payload whole;
//! - refused: a header the kernel must not take (USO without NEEDS_CSUM, with TCP's checksum
//!   offset, GSO with no segment size) gets EINVAL and does not go in; and a TSO frame
//!   whose checksum field leaves the length out of the pseudo-header (a NIC's convention, not
//!   Linux's) comes out with a bad checksum on every segment, which shows the checks bite.
//!
//! `virtnet gen` through our backend and a TAP (its `--gso` super-frames, its TCP sink) is
//! `gso_gen.rs`.
//!
//! Needs root (network namespaces, TAP devices); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure).

use std::io;
use std::net::UdpSocket;
use std::time::Duration;

use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use virtnet_driver::gen::frames::{Addrs, Flow, Proto, TCP_FLAGS};
use virtnet_driver::offload::TxOffloads;
use virtnet_sys::tap::TapQueue;
use vnet::{feature, NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_TCPV4, HDR_GSO_UDP_L4, HDR_LEN};
use vring::{GuestAddress, GuestMemory, Segment};

const IN_TAP: &str = "vngso0";
const OUT_TAP: &str = "vngso1";
/// The sender behind `vngso0`, and the next hop behind `vngso1`.
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x99, 0x02];
const NEXT_HOP_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x98, 0x02];
const SRC4: [u8; 4] = [10, 99, 0, 2];
const LOCAL4: [u8; 4] = [10, 99, 0, 1];
const DST4: [u8; 4] = [10, 98, 0, 2];
/// fd00:0:0:99::2 and fd00:0:0:98::2.
const SRC6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 2];
const DST6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0x98, 0, 0, 0, 0, 0, 0, 0, 2];

fn all_offloads() -> TxOffloads {
    TxOffloads::from_features(
        feature::CSUM | feature::HOST_TSO4 | feature::HOST_TSO6 | feature::HOST_USO,
    )
}

/// Byte `i` of every payload: not periodic in any segment size we use.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

/// A namespace that forwards from `vngso0` (where frames are written) to `vngso1` (where
/// the segments are read), IPv4 and IPv6.
struct Rig {
    ns: NetNs,
    input: TapQueue,
    output: TapQueue,
    input_mac: [u8; 6],
    mem: GuestMemory,
}

impl Rig {
    fn new(tag: &str) -> Rig {
        let ns = NetNs::create(tag).expect("network namespace");
        ns.add_tap(&TapSpec {
            name: IN_TAP.into(),
            address: "10.99.0.1/24".into(),
            multi_queue: true,
            vnet_hdr: true,
            mtu: None,
            owner: None,
        })
        .expect("input TAP");
        // Both TAPs are opened from a thread inside the namespace; the output TAP is created
        // by the open, with no offload set (TUNSETOFFLOAD never called), so the kernel must
        // segment and checksum what it sends there.
        let (input, output) = ns.run(|| (TapQueue::open(IN_TAP), TapQueue::open(OUT_TAP)));
        let (input, output) = (input.expect("open vngso0"), output.expect("open vngso1"));
        input.set_vnet_hdr_len(HDR_LEN).unwrap();
        output.set_vnet_hdr_len(HDR_LEN).unwrap();
        let ip = |args: &str| {
            let argv: Vec<&str> = args.split(' ').collect();
            ns.exec(&argv).unwrap_or_else(|e| panic!("{args}: {e}"));
        };
        for v in ["all", "default", IN_TAP, OUT_TAP] {
            ip(&format!("sysctl -qw net.ipv6.conf.{v}.disable_ipv6=0"));
        }
        ip("sysctl -qw net.ipv4.ip_forward=1");
        ip("sysctl -qw net.ipv6.conf.all.forwarding=1");
        ip("sysctl -qw net.ipv4.conf.all.rp_filter=0");
        ip(&format!("ip addr add 10.98.0.1/24 dev {OUT_TAP}"));
        ip(&format!(
            "ip -6 addr add fd00:0:0:99::1/64 dev {IN_TAP} nodad"
        ));
        ip(&format!(
            "ip -6 addr add fd00:0:0:98::1/64 dev {OUT_TAP} nodad"
        ));
        ip(&format!("ip link set {OUT_TAP} up"));
        let mac = mac_str(NEXT_HOP_MAC);
        ip(&format!(
            "ip neigh replace 10.98.0.2 lladdr {mac} dev {OUT_TAP} nud permanent"
        ));
        ip(&format!(
            "ip -6 neigh replace fd00:0:0:98::2 lladdr {mac} dev {OUT_TAP} nud permanent"
        ));
        let addr = ns
            .exec(&["cat", &format!("/sys/class/net/{IN_TAP}/address")])
            .unwrap();
        let input_mac = vnet::parse_mac(addr.trim()).expect("TAP MAC");
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 128 << 10)]).unwrap();
        let rig = Rig {
            ns,
            input,
            output,
            input_mac,
            mem,
        };
        rig.drain_output();
        rig
    }

    /// Writes one frame behind `hdr` into the input TAP, with one writev as our backend does.
    fn write(&self, hdr: NetHdr, frame: &[u8]) -> io::Result<usize> {
        self.mem.write(GuestAddress(0), &hdr.to_bytes()).unwrap();
        self.mem.write(GuestAddress(HDR_LEN as u64), frame).unwrap();
        let seg = Segment {
            addr: GuestAddress(0),
            len: (HDR_LEN + frame.len()) as u32,
        };
        self.input
            .write_frame(&self.mem, vring::Gather::from(&[seg][..]))
            .expect("segment inside memory")
    }

    /// Frames the kernel sent out of the output TAP (without their virtio-net header) that
    /// belong to `flow` (IPv6 neighbour and listener chatter is left out), until `want` came
    /// or a second passed with none.
    fn read_segments(&self, flow: &Flow, want: usize) -> Vec<Vec<u8>> {
        use std::os::fd::AsRawFd;
        let mut got = Vec::new();
        let mut buf = vec![0u8; 70_000];
        while got.len() < want {
            match self.output.read(&mut buf) {
                Ok(n) => {
                    let f = &buf[HDR_LEN..n];
                    if of_flow(f, flow) {
                        got.push(f.to_vec());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !virtnet_sys::wait_readable(self.output.as_raw_fd(), 1000) {
                        break;
                    }
                }
                Err(e) => panic!("reading {OUT_TAP}: {e}"),
            }
        }
        got
    }

    fn drain_output(&self) {
        let mut buf = vec![0u8; 70_000];
        while self.output.read(&mut buf).is_ok() {}
    }

    /// Frames the input TAP took (its rx: what its user wrote).
    fn taken(&self) -> u64 {
        self.ns.stats(IN_TAP).expect("TAP counters")["rx_packets"]
    }

    /// A flow from the peer behind the input TAP to the next hop behind the output TAP.
    fn forwarded_flow(&self, proto: Proto, ipv6: bool) -> Flow {
        Flow {
            dst_mac: self.input_mac,
            src_mac: PEER_MAC,
            addrs: if ipv6 {
                Addrs::V6 {
                    src: SRC6,
                    dst: DST6,
                }
            } else {
                Addrs::V4 {
                    src: SRC4,
                    dst: DST4,
                }
            },
            proto,
            src_port: 40000,
            dst_port: 5001,
            seq: 0xfff0_0000,
        }
    }
}

fn mac_str(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
}

/// One's-complement sum, folded: 0xffff over data that includes a correct checksum.
fn csum(mut sum: u32, data: &[u8]) -> u16 {
    for c in data.chunks(2) {
        sum += (c[0] as u32) << 8 | c.get(1).copied().unwrap_or(0) as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Whether an L4 checksum is right, computed from scratch (RFC 9293 3.1, RFC 8200 8.1).
fn l4_checksum_ok(f: &[u8], ipv6: bool, proto: u8) -> bool {
    let (addrs, l4) = if ipv6 {
        (&f[22..54], 54)
    } else {
        (&f[26..34], 34)
    };
    let pseudo = csum(0, addrs) as u32 + proto as u32 + (f.len() - l4) as u32;
    csum(pseudo, &f[l4..]) == 0xffff
}

fn of_flow(f: &[u8], flow: &Flow) -> bool {
    let (ethertype, proto_at, l4) = if flow.is_ipv6() {
        (0x86dd, 20, 54)
    } else {
        (0x0800, 23, 34)
    };
    let proto = if flow.proto == Proto::Tcp { 6 } else { 17 };
    f.len() > l4 + 4
        && be16(f, 12) == ethertype
        && f[proto_at] == proto
        && be16(f, l4) == flow.src_port
        && be16(f, l4 + 2) == flow.dst_port
}

/// Checks every segment the kernel cut from `sent` against what segmentation must give:
/// the headers of the super-frame with per-segment lengths, sequence numbers and flags,
/// valid checksums, and the payload in order. Returns why not, if not.
fn check_segments(flow: &Flow, sent: &[u8], mss: usize, segs: &[Vec<u8>]) -> Result<(), String> {
    let hdr_len = flow.hdr_len();
    let l4 = 14 + flow.ip_hdr_len();
    let payload = &sent[hdr_len..];
    let want = payload.len().div_ceil(mss);
    if segs.len() != want {
        return Err(format!("{} segments, {want} expected", segs.len()));
    }
    let (proto, ttl_at) = match (flow.proto, flow.is_ipv6()) {
        (Proto::Tcp, false) => (6, 22),
        (Proto::Udp, false) => (17, 22),
        (Proto::Tcp, true) => (6, 21),
        (Proto::Udp, true) => (17, 21),
    };
    for (k, s) in segs.iter().enumerate() {
        let chunk = &payload[k * mss..((k + 1) * mss).min(payload.len())];
        let at = |what: &str| format!("segment {k}: {what}");
        if s.len() != hdr_len + chunk.len() {
            return Err(at(&format!(
                "{} bytes, {} expected",
                s.len(),
                hdr_len + chunk.len()
            )));
        }
        if s[..6] != NEXT_HOP_MAC {
            return Err(at("not to the next hop's MAC"));
        }
        if s[ttl_at] != 63 {
            return Err(at(&format!("TTL / hop limit {}, 63 expected", s[ttl_at])));
        }
        if flow.is_ipv6() {
            if s[22..54] != sent[22..54] {
                return Err(at("IPv6 addresses changed"));
            }
            if be16(s, 18) as usize != s.len() - l4 {
                return Err(at("IPv6 payload length"));
            }
        } else {
            if s[26..34] != sent[26..34] {
                return Err(at("IPv4 addresses changed"));
            }
            if be16(s, 16) as usize != s.len() - 14 {
                return Err(at("IPv4 total length"));
            }
            if csum(0, &s[14..34]) != 0xffff {
                return Err(at("IPv4 header checksum"));
            }
        }
        if s[l4..l4 + 4] != sent[l4..l4 + 4] {
            return Err(at("ports"));
        }
        match flow.proto {
            Proto::Tcp => {
                let seq = be32(sent, l4 + 4).wrapping_add((k * mss) as u32);
                if be32(s, l4 + 4) != seq {
                    return Err(at(&format!(
                        "seq {:#x}, {seq:#x} expected",
                        be32(s, l4 + 4)
                    )));
                }
                if s[l4 + 8..l4 + 13] != sent[l4 + 8..l4 + 13] {
                    return Err(at("ack or data offset"));
                }
                let last = k + 1 == segs.len();
                let flags = if last { TCP_FLAGS } else { TCP_FLAGS & !0x08 };
                if s[l4 + 13] != flags {
                    return Err(at(&format!("flags {:#x}, {flags:#x} expected", s[l4 + 13])));
                }
                if s[l4 + 14..l4 + 16] != sent[l4 + 14..l4 + 16]
                    || s[l4 + 18..hdr_len] != sent[l4 + 18..hdr_len]
                {
                    return Err(at("window, urgent pointer or options"));
                }
            }
            Proto::Udp => {
                if be16(s, l4 + 4) as usize != s.len() - l4 {
                    return Err(at("UDP length"));
                }
            }
        }
        if !l4_checksum_ok(s, flow.is_ipv6(), proto) {
            return Err(at("bad L4 checksum"));
        }
        if &s[hdr_len..] != chunk {
            return Err(at("payload differs"));
        }
    }
    Ok(())
}

#[test]
fn tso_and_uso_super_frames_are_segmented_by_the_kernel_exactly() {
    const TEST: &str = "gso_tap::segmented";
    if !packages::netns_ready(TEST) {
        return;
    }
    let rig = Rig::new("gsoseg");
    let mut written = 0;
    for (proto, ipv6, mss) in [
        (Proto::Tcp, false, 1448),
        (Proto::Tcp, true, 1428),
        (Proto::Udp, false, 1472),
        (Proto::Udp, true, 1452),
        // A last segment of a single byte.
        (Proto::Tcp, false, 1000),
    ] {
        let flow = rig.forwarded_flow(proto, ipv6);
        let len = if mss == 1000 {
            flow.hdr_len() + 40_001
        } else {
            65_000
        };
        let (frame, hdr) = flow.gso_frame(len, mss, all_offloads(), pattern).unwrap();
        let what = format!("{proto:?} ipv6={ipv6} mss={mss}");
        assert_eq!(
            rig.write(hdr, &frame)
                .unwrap_or_else(|e| panic!("{what}: write: {e}")),
            HDR_LEN + frame.len(),
            "{what}"
        );
        written += 1;
        let want = (len - flow.hdr_len()).div_ceil(mss as usize);
        let segs = rig.read_segments(&flow, want);
        if let Err(why) = check_segments(&flow, &frame, mss as usize, &segs) {
            panic!("{what}: {why}");
        }
    }
    assert_eq!(
        rig.taken(),
        written,
        "every super-frame counted once, whole"
    );
}

#[test]
fn uso_datagrams_reach_a_udp_socket_whole() {
    const TEST: &str = "gso_tap::udp_socket";
    if !packages::netns_ready(TEST) {
        return;
    }
    let rig = Rig::new("gsoudp");
    let socket = rig
        .ns
        .run(|| UdpSocket::bind((std::net::Ipv4Addr::from(LOCAL4), 0)))
        .expect("UDP socket in the namespace");
    socket
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let flow = Flow {
        addrs: Addrs::V4 {
            src: SRC4,
            dst: LOCAL4,
        },
        dst_port: socket.local_addr().unwrap().port(),
        ..rig.forwarded_flow(Proto::Udp, false)
    };
    let mss = 1472;
    let (frame, hdr) = flow
        .gso_frame(65_000, mss, all_offloads(), pattern)
        .unwrap();
    assert_eq!((hdr.gso_type, hdr.gso_size), (HDR_GSO_UDP_L4, mss));
    rig.write(hdr, &frame).expect("the TAP takes a USO frame");
    let payload = &frame[flow.hdr_len()..];
    let mut buf = vec![0u8; 65_536];
    for (k, chunk) in payload.chunks(mss as usize).enumerate() {
        let (n, from) = socket
            .recv_from(&mut buf)
            .unwrap_or_else(|e| panic!("datagram {k} of {}: {e}", payload.len().div_ceil(1472)));
        assert_eq!(from.port(), flow.src_port);
        assert_eq!(&buf[..n], chunk, "datagram {k}");
    }
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(socket.recv(&mut buf).is_err(), "no datagram more");
}

#[test]
fn the_kernel_refuses_bad_gso_headers_and_a_nic_style_checksum_fails_the_check() {
    const TEST: &str = "gso_tap::refused";
    if !packages::netns_ready(TEST) {
        return;
    }
    let rig = Rig::new("gsobad");
    let udp = rig.forwarded_flow(Proto::Udp, false);
    let (frame, good) = udp
        .gso_frame(65_000, 1472, all_offloads(), pattern)
        .unwrap();
    let no_csum = NetHdr { flags: 0, ..good };
    let tcp_offset = NetHdr {
        csum_offset: 16,
        ..good
    };
    let no_size = NetHdr {
        gso_size: 0,
        ..good
    };
    let taken = rig.taken();
    for (why, hdr) in [
        ("USO without NEEDS_CSUM", no_csum),
        ("USO with TCP's checksum offset", tcp_offset),
        ("GSO with gso_size 0", no_size),
    ] {
        let r = rig.write(hdr, &frame);
        assert_eq!(
            r.as_ref().map_err(|e| e.raw_os_error()),
            Err(Some(libc::EINVAL)),
            "{why}: {r:?}"
        );
    }
    assert_eq!(rig.taken(), taken, "none of them went in");
    // The good header on the same frame goes through.
    rig.write(good, &frame).expect("the valid USO frame");
    assert_eq!(rig.read_segments(&udp, 45).len(), 45);

    // TSO with the pseudo-header sum left without the length: taken, but every segment the
    // kernel makes has a bad checksum, and `check_segments` says so.
    let tcp = rig.forwarded_flow(Proto::Tcp, false);
    let (mut frame, hdr) = tcp
        .gso_frame(65_000, 1448, all_offloads(), pattern)
        .unwrap();
    assert_eq!(hdr.gso_type, HDR_GSO_TCPV4);
    assert_eq!(hdr.flags, HDR_F_NEEDS_CSUM);
    let at = hdr.csum_start as usize + hdr.csum_offset as usize;
    let without_len = csum(0, &frame[26..34]) as u32 + 6;
    let without_len = csum(without_len, &[]);
    frame[at..at + 2].copy_from_slice(&without_len.to_be_bytes());
    rig.write(hdr, &frame)
        .expect("the TAP does not look at the checksum");
    let segs = rig.read_segments(&tcp, 45);
    assert_eq!(segs.len(), 45);
    let why = check_segments(&tcp, &frame, 1448, &segs).unwrap_err();
    assert!(why.contains("bad L4 checksum"), "{why}");
    assert!(
        segs.iter().all(|s| !l4_checksum_ok(s, false, 6)),
        "every segment's checksum is off by the length"
    );
}
