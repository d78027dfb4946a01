//! `virtnet gen --mode tcp-sink`: the receiving end of TCP over IPv4, as much of it as a
//! sender on the host side (a socket in the TAP's network namespace, connecting to
//! [`ADDR`]) needs to stream into the guest side as it would into a Linux guest. The sender's
//! stack then hands the TAP GSO super-frames of up to 64 KiB, which the device passes to the
//! driver whole (GUEST_TSO4, mergeable buffers): the host → guest offload path.
//!
//! Its Ethernet address is the device's (the config space's `mac`) where the device gives
//! one, else 02:00:00:00:00:01: the host side needs a neighbour entry for [`ADDR`] with it,
//! as the sink answers no ARP.
//!
//! What it does (RFC 9293): a SYN to [`ADDR`] gets a SYN-ACK offering an MSS of 1460 and window
//! scaling (RFC 7323); data that arrives in order is acknowledged cumulatively, one ack per
//! connection per receive round ([`TcpSink::take_replies`]), with a window of 8 MiB; a FIN is
//! answered with FIN-ACK and the connection forgotten, as it is on a RST.
//!
//! What it does not: keep data, send any, retransmit, or keep segments that arrive out of
//! order (the ack repeats the next byte it expects and the sender retransmits; a TAP does
//! not reorder). Frames for other addresses or protocols are counted and ignored.

use super::frames::{write_ipv4_header, ETHERTYPE_IPV4, ETH_HLEN, IPV4_HDR_LEN};
use crate::offload::{fold, sum16};

/// The guest side's address: the source address of the frames `virtnet gen` sends.
pub const ADDR: [u8; 4] = [198, 18, 0, 1];
/// Our initial sequence number.
const ISS: u32 = 0x1000_0000;
/// The window scale we offer, and the (scaled) window we advertise: 0xffff << 7, 8 MiB.
const WSCALE: u8 = 7;
const WINDOW: u16 = 0xffff;
/// The MSS we offer: a 1500-byte MTU.
const MSS: u16 = 1460;
/// Connections kept at once; a SYN beyond them replaces the oldest.
const MAX_CONNS: usize = 16;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const ACK: u8 = 0x10;
/// The IPv4 protocol number of TCP.
const PROTO_TCP: u8 = 6;
/// A TCP header without options.
const TCP_HDR_LEN: usize = 20;

/// A connection, named from our side: the peer's address and port, and our port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    peer: [u8; 4],
    peer_port: u16,
    port: u16,
}

#[derive(Clone, Debug)]
struct Conn {
    key: Key,
    peer_mac: [u8; 6],
    /// The next sequence number we expect, and the next we send.
    rcv_nxt: u32,
    snd_nxt: u32,
    /// Data or a FIN arrived since the last ack.
    owed: bool,
    /// The peer's FIN arrived: the next ack carries ours, then the connection goes.
    fin: bool,
}

/// The parts of a received TCP segment the sink uses.
#[derive(Clone, Copy, Debug)]
struct Segment {
    src_mac: [u8; 6],
    key: Key,
    dst: [u8; 4],
    seq: u32,
    flags: u8,
    payload: u32,
}

/// What the sink has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SinkCounts {
    /// Connections opened (SYNs answered).
    pub connections: u64,
    /// TCP segments (super-frames count once) of known connections, and their in-order
    /// payload bytes.
    pub segments: u64,
    pub bytes: u64,
    /// Segments that did not start at the next byte expected (retransmissions, gaps).
    pub out_of_order: u64,
    /// Acks and SYN-ACKs sent.
    pub replies: u64,
    /// Frames that are not TCP to [`ADDR`] on a known connection, or a SYN.
    pub ignored: u64,
}

impl SinkCounts {
    /// Adds `o`'s counts (another connection's, in a run that reconnected).
    pub fn add(&mut self, o: &SinkCounts) {
        self.connections += o.connections;
        self.segments += o.segments;
        self.bytes += o.bytes;
        self.out_of_order += o.out_of_order;
        self.replies += o.replies;
        self.ignored += o.ignored;
    }
}

/// The receiving end of TCP connections to one address.
#[derive(Debug)]
pub struct TcpSink {
    mac: [u8; 6],
    conns: Vec<Conn>,
    replies: Vec<Vec<u8>>,
    counts: SinkCounts,
}

impl TcpSink {
    /// A sink at [`ADDR`] with Ethernet address `mac`.
    pub fn new(mac: [u8; 6]) -> TcpSink {
        TcpSink {
            mac,
            conns: Vec::new(),
            replies: Vec::new(),
            counts: SinkCounts::default(),
        }
    }

    pub fn counts(&self) -> SinkCounts {
        self.counts
    }

    /// Takes one received frame (Ethernet header first, net header stripped).
    pub fn on_frame(&mut self, frame: &[u8]) {
        let Some(s) = parse(frame).filter(|s| s.dst == ADDR) else {
            self.counts.ignored += 1;
            return;
        };
        let at = self.conns.iter().position(|c| c.key == s.key);
        if s.flags & RST != 0 {
            if let Some(i) = at {
                self.conns.remove(i);
            }
            return;
        }
        if s.flags & (SYN | ACK) == SYN {
            // A new connection, or the same one opened again: start it afresh.
            let conn = Conn {
                key: s.key,
                peer_mac: s.src_mac,
                rcv_nxt: s.seq.wrapping_add(1),
                snd_nxt: ISS.wrapping_add(1),
                owed: false,
                fin: false,
            };
            let syn_ack = self.segment(&conn, ISS, SYN | ACK);
            self.replies.push(syn_ack);
            self.counts.connections += 1;
            match at {
                Some(i) => self.conns[i] = conn,
                None => {
                    if self.conns.len() == MAX_CONNS {
                        self.conns.remove(0);
                    }
                    self.conns.push(conn);
                }
            }
            return;
        }
        let Some(c) = at.map(|i| &mut self.conns[i]) else {
            self.counts.ignored += 1;
            return;
        };
        self.counts.segments += 1;
        if s.seq == c.rcv_nxt {
            c.rcv_nxt = c.rcv_nxt.wrapping_add(s.payload);
            self.counts.bytes += s.payload as u64;
            if s.flags & FIN != 0 {
                c.rcv_nxt = c.rcv_nxt.wrapping_add(1);
                c.fin = true;
            }
        } else if s.payload > 0 || s.flags & FIN != 0 {
            self.counts.out_of_order += 1;
        }
        c.owed |= s.payload > 0 || s.flags & FIN != 0;
    }

    /// Moves the replies owed into `out`: the SYN-ACKs, then one cumulative ack for each
    /// connection that got data or a FIN since the last call (with our FIN after theirs).
    pub fn take_replies(&mut self, out: &mut Vec<Vec<u8>>) {
        let before = out.len();
        out.append(&mut self.replies);
        let mut i = 0;
        while i < self.conns.len() {
            let c = &self.conns[i];
            if !c.owed {
                i += 1;
                continue;
            }
            let flags = if c.fin { FIN | ACK } else { ACK };
            out.push(self.segment(c, c.snd_nxt, flags));
            if c.fin {
                self.conns.remove(i);
            } else {
                self.conns[i].owed = false;
                i += 1;
            }
        }
        self.counts.replies += (out.len() - before) as u64;
    }

    /// Our segment on `c` with sequence number `seq` and `flags`, acknowledging
    /// `c.rcv_nxt`; a SYN carries the MSS and window scale options. A minimal Ethernet frame
    /// (60 bytes, padded) at least.
    fn segment(&self, c: &Conn, seq: u32, flags: u8) -> Vec<u8> {
        let opts: &[u8] = if flags & SYN != 0 {
            let m = MSS.to_be_bytes();
            &[2, 4, m[0], m[1], 1, 3, 3, WSCALE]
        } else {
            &[]
        };
        let tcp_len = TCP_HDR_LEN + opts.len();
        let ip_len = IPV4_HDR_LEN + tcp_len;
        let mut f = vec![0u8; (ETH_HLEN + ip_len).max(60)];
        f[..6].copy_from_slice(&c.peer_mac);
        f[6..12].copy_from_slice(&self.mac);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETH_HLEN..ETH_HLEN + IPV4_HDR_LEN];
        write_ipv4_header(ip, ip_len, 0, PROTO_TCP, ADDR, c.key.peer);
        let l4 = ETH_HLEN + IPV4_HDR_LEN;
        let t = &mut f[l4..l4 + tcp_len];
        t[0..2].copy_from_slice(&c.key.port.to_be_bytes());
        t[2..4].copy_from_slice(&c.key.peer_port.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&c.rcv_nxt.to_be_bytes());
        t[12] = ((tcp_len / 4) as u8) << 4;
        t[13] = flags;
        t[14..16].copy_from_slice(&WINDOW.to_be_bytes());
        t[TCP_HDR_LEN..].copy_from_slice(opts);
        // RFC 9293 3.1: over the pseudo-header (addresses, protocol, TCP length) and the
        // segment, its checksum field zero.
        let pseudo = sum16(sum16(0, &ADDR), &c.key.peer) + PROTO_TCP as u32 + tcp_len as u32;
        let sum = !fold(sum16(pseudo, t));
        t[16..18].copy_from_slice(&sum.to_be_bytes());
        f
    }
}

/// The TCP segment in `f`, if it is IPv4 and TCP with sane lengths. A super-frame's IPv4
/// total length covers all of it (zero, as Linux's BIG TCP sends past 64 KiB: the frame's).
fn parse(f: &[u8]) -> Option<Segment> {
    let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
    let be32 = |b: &[u8], at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    if f.len() < ETH_HLEN + IPV4_HDR_LEN + TCP_HDR_LEN || be16(f, 12) != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = &f[ETH_HLEN..];
    let ihl = (ip[0] & 0x0f) as usize * 4;
    if ip[0] >> 4 != 4 || ihl < IPV4_HDR_LEN || ip[9] != PROTO_TCP {
        return None;
    }
    let total = match be16(ip, 2) as usize {
        0 => ip.len(),
        n => n,
    };
    let tcp = ip.get(ihl..total)?;
    let doff = (tcp.get(12)? >> 4) as usize * 4;
    if doff < TCP_HDR_LEN || doff > tcp.len() {
        return None;
    }
    let addr = |at: usize| -> [u8; 4] { [ip[at], ip[at + 1], ip[at + 2], ip[at + 3]] };
    let mut src_mac = [0u8; 6];
    src_mac.copy_from_slice(&f[6..12]);
    Some(Segment {
        src_mac,
        key: Key {
            peer: addr(12),
            peer_port: be16(tcp, 0),
            port: be16(tcp, 2),
        },
        dst: addr(16),
        seq: be32(tcp, 4),
        flags: tcp[13],
        payload: (tcp.len() - doff) as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEN: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const PEER: [u8; 4] = [198, 18, 0, 2];

    /// A segment from the host side to the sink: `payload` bytes of data.
    fn from_host(seq: u32, flags: u8, payload: usize, dst: [u8; 4]) -> Vec<u8> {
        let c = Conn {
            key: Key {
                peer: dst,
                peer_port: 5201,
                port: 40000,
            },
            peer_mac: GEN,
            rcv_nxt: 0,
            snd_nxt: 0,
            owed: false,
            fin: false,
        };
        // Built by a sink at the peer's side: swap the addresses it writes.
        let mut f = TcpSink::new(HOST).segment(&c, seq, flags);
        let l3 = ETH_HLEN;
        f[l3 + 12..l3 + 16].copy_from_slice(&PEER);
        f[l3 + 16..l3 + 20].copy_from_slice(&dst);
        f.truncate(ETH_HLEN + IPV4_HDR_LEN + TCP_HDR_LEN + if flags & SYN != 0 { 8 } else { 0 });
        f.resize(f.len() + payload, 0xab);
        let total = (f.len() - ETH_HLEN) as u16;
        f[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
        f
    }

    fn checksums_hold(f: &[u8]) {
        let ip = &f[ETH_HLEN..ETH_HLEN + IPV4_HDR_LEN];
        assert_eq!(fold(sum16(0, ip)), 0xffff, "IPv4 header checksum");
        let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
        let tcp = &f[ETH_HLEN + IPV4_HDR_LEN..ETH_HLEN + total];
        let pseudo =
            sum16(sum16(0, &ip[12..16]), &ip[16..20]) + PROTO_TCP as u32 + tcp.len() as u32;
        assert_eq!(fold(sum16(pseudo, tcp)), 0xffff, "TCP checksum");
    }

    fn tcp(f: &[u8]) -> &[u8] {
        &f[ETH_HLEN + IPV4_HDR_LEN..]
    }

    fn ack_of(f: &[u8]) -> u32 {
        u32::from_be_bytes(tcp(f)[8..12].try_into().unwrap())
    }

    #[test]
    fn a_syn_gets_a_syn_ack_with_mss_and_window_scale_and_valid_checksums() {
        let mut s = TcpSink::new(GEN);
        s.on_frame(&from_host(1000, SYN, 0, ADDR));
        let mut out = Vec::new();
        s.take_replies(&mut out);
        assert_eq!(out.len(), 1);
        let r = &out[0];
        assert_eq!((&r[..6], &r[6..12]), (&HOST[..], &GEN[..]));
        checksums_hold(r);
        let t = tcp(r);
        assert_eq!(t[13], SYN | ACK);
        assert_eq!(
            u16::from_be_bytes([t[0], t[1]]),
            5201,
            "from the port it was sent to"
        );
        assert_eq!(u16::from_be_bytes([t[2], t[3]]), 40000);
        assert_eq!(u32::from_be_bytes(t[4..8].try_into().unwrap()), ISS);
        assert_eq!(ack_of(r), 1001);
        assert_eq!(&t[20..28], &[2, 4, 0x05, 0xb4, 1, 3, 3, WSCALE]);
        assert_eq!(s.counts().connections, 1);
    }

    #[test]
    fn in_order_data_is_acked_once_per_round_and_a_gap_repeats_the_ack() {
        let mut s = TcpSink::new(GEN);
        let mut out = Vec::new();
        s.on_frame(&from_host(1000, SYN, 0, ADDR));
        s.on_frame(&from_host(1001, ACK, 0, ADDR));
        s.take_replies(&mut out);
        out.clear();
        // A pure ack owes nothing.
        s.take_replies(&mut out);
        assert!(out.is_empty());
        // Two super-frames in one round: one ack, for both.
        s.on_frame(&from_host(1001, ACK, 60_000, ADDR));
        s.on_frame(&from_host(61_001, ACK, 5_000, ADDR));
        s.take_replies(&mut out);
        assert_eq!(out.len(), 1);
        checksums_hold(&out[0]);
        assert_eq!(tcp(&out[0])[13], ACK);
        assert_eq!(ack_of(&out[0]), 66_001);
        assert_eq!(
            u32::from_be_bytes(tcp(&out[0])[4..8].try_into().unwrap()),
            ISS + 1
        );
        // A segment past a gap is not taken: the ack names the byte still expected.
        out.clear();
        s.on_frame(&from_host(70_000, ACK, 1000, ADDR));
        s.take_replies(&mut out);
        assert_eq!(ack_of(&out[0]), 66_001);
        let c = s.counts();
        assert_eq!((c.segments, c.bytes, c.out_of_order), (4, 65_000, 1));
    }

    #[test]
    fn a_fin_is_answered_with_fin_ack_and_the_connection_forgotten() {
        let mut s = TcpSink::new(GEN);
        let mut out = Vec::new();
        s.on_frame(&from_host(1000, SYN, 0, ADDR));
        s.on_frame(&from_host(1001, ACK | FIN, 100, ADDR));
        s.take_replies(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(tcp(&out[1])[13], FIN | ACK);
        assert_eq!(ack_of(&out[1]), 1001 + 100 + 1);
        // Its last ack finds no connection.
        s.on_frame(&from_host(1102, ACK, 0, ADDR));
        assert_eq!(s.counts().ignored, 1);
    }

    #[test]
    fn other_frames_are_ignored() {
        let mut s = TcpSink::new(GEN);
        s.on_frame(&from_host(1000, SYN, 0, [10, 0, 0, 1]));
        s.on_frame(&from_host(1000, ACK, 10, ADDR)); // no connection
        s.on_frame(&[0u8; 20]);
        let mut udp = from_host(1000, SYN, 0, ADDR);
        udp[ETH_HLEN + 9] = 17;
        s.on_frame(&udp);
        let mut bad_doff = from_host(1000, SYN, 0, ADDR);
        bad_doff[ETH_HLEN + IPV4_HDR_LEN + 12] = 0xf0; // 60 bytes of header in 28
        s.on_frame(&bad_doff);
        let mut out = Vec::new();
        s.take_replies(&mut out);
        assert!(out.is_empty());
        assert_eq!(s.counts().ignored, 5);
        // A RST ends a connection.
        s.on_frame(&from_host(1000, SYN, 0, ADDR));
        s.on_frame(&from_host(1001, RST, 0, ADDR));
        s.on_frame(&from_host(1001, ACK, 10, ADDR));
        assert_eq!(s.counts().ignored, 6);
    }
}
