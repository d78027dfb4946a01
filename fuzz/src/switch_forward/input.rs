//! The `switch_forward` input: the switch's ports (each a guest device with its offloads, MTU,
//! receive filter, queue pairs and rx buffers) and steps (a batch of tx frames from one port,
//! a port's driver posting its rx buffers again, a batch of frames from the host through the
//! uplink (`host.rs`), or a port's driver changing how many queue pairs it uses). A frame is raw bytes or built from a few
//! numbers (Ethernet, VLAN, ARP, RARP, IPv4, IPv6, TCP, UDP, other protocols, cut short
//! anywhere) behind a virtio-net header that is raw or made to fit the frame (a checksum or
//! a GSO super-frame asked for, as a driver with the offloads sends them).

use arbitrary::Arbitrary;
use vnet::csum::{self, Sum};
use vnet::{NetHdr, HDR_F_NEEDS_CSUM, HDR_GSO_ECN, HDR_GSO_TCPV4, HDR_GSO_TCPV6, HDR_GSO_UDP_L4};

use super::host::HostFrame;
use crate::encode::{variant, Encode};
use crate::encode_struct;

/// A guest port's receive side: its rx queue and the buffers its driver posts.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct RxSetup {
    /// Queue size `1 << (size_log2 % 9)`.
    pub size_log2: u8,
    /// Buffers posted, at most the queue size (and what the data area holds).
    pub buffers: u16,
    /// Their writable lengths, alternately (0: a buffer without a writable byte, which
    /// breaks the ring when the device pops it).
    pub lens: [u16; 2],
    /// The `n`th buffer posted is readable only (it breaks the ring when popped).
    pub readable_at: Option<u8>,
    /// No rx queue runs: nowhere to deliver.
    pub stopped: bool,
}
encode_struct!(RxSetup {
    size_log2,
    buffers,
    lens,
    readable_at,
    stopped
});

/// A guest port: its address and port security, its device's features, MTU, receive filter
/// and queue pairs, and its rx buffers (the same on each pair).
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct PortSetup {
    /// Spoof-check off (its sources learned, up to `learn_limit`), or on.
    pub unchecked: bool,
    pub learn_limit: u8,
    /// Bit `i` negotiates `FEATURES[i]`.
    pub features: u16,
    /// `MTUS[mtu % MTUS.len()]`.
    pub mtu: u8,
    /// Bit 0: promiscuous off; bit 1: all-multicast on.
    pub filter: u8,
    pub two_pairs: bool,
    pub rx: RxSetup,
}
encode_struct!(PortSetup {
    unchecked,
    learn_limit,
    features,
    mtu,
    filter,
    two_pairs,
    rx
});

/// The features a port may negotiate (VERSION_1 always), by bit of [`PortSetup::features`].
pub const FEATURES: [vring::Features; 15] = {
    use vnet::feature::*;
    [
        MRG_RXBUF,
        CSUM,
        GUEST_CSUM,
        HOST_TSO4,
        HOST_TSO6,
        HOST_ECN,
        HOST_USO,
        GUEST_TSO4,
        GUEST_TSO6,
        GUEST_ECN,
        GUEST_USO4,
        GUEST_USO6,
        HOST_UFO,
        GUEST_UFO,
        // The rings' own: a transmitted run gets one used element (`add_used_read`), which
        // the guest's driver reclaims the whole run by.
        vring::Features::IN_ORDER,
    ]
};

/// The MTUs a port may have: Ethernet's, the least, a jumbo one, the most.
pub const MTUS: [u16; 4] = [1500, 68, 9000, 65535];

/// A transport header.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    /// `options % 11` words of options (NOPs); `flags` as sent (FIN, PSH, CWR...).
    Tcp {
        options: u8,
        flags: u8,
        seq: u32,
    },
    Udp,
    /// Another protocol number: no transport header.
    Other(u8),
}

impl Encode for L4 {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            L4::Tcp {
                options,
                flags,
                seq,
            } => {
                variant(0, 3, out);
                [*options, *flags].encode(out);
                seq.encode(out);
            }
            L4::Udp => variant(1, 3, out),
            L4::Other(p) => (variant(2, 3, out), p.encode(out)).1,
        }
    }
}

/// What follows the Ethernet header (and tags).
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// An IPv4 ARP request: sender and target protocol addresses `10.0.0.spa` and
    /// `10.0.0.tpa` (equal: a gratuitous ARP, which announces its source).
    Arp {
        spa: u8,
        tpa: u8,
    },
    /// A RARP request: announces its source.
    Rarp,
    /// `options % 11` words of IP options; `payload` bytes after the transport header.
    Ipv4 {
        l4: L4,
        options: u8,
        payload: u16,
    },
    Ipv6 {
        l4: L4,
        payload: u16,
    },
    Other {
        ethertype: u16,
        bytes: Vec<u8>,
    },
}

impl Encode for Body {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Body::Arp { spa, tpa } => (variant(0, 5, out), [*spa, *tpa].encode(out)).1,
            Body::Rarp => variant(1, 5, out),
            Body::Ipv4 {
                l4,
                options,
                payload,
            } => {
                variant(2, 5, out);
                l4.encode(out);
                options.encode(out);
                payload.encode(out);
            }
            Body::Ipv6 { l4, payload } => {
                variant(3, 5, out);
                l4.encode(out);
                payload.encode(out);
            }
            Body::Other { ethertype, bytes } => {
                variant(4, 5, out);
                ethertype.encode(out);
                bytes.encode(out);
            }
        }
    }
}

/// A frame built from numbers: MACs by `switch::model::mac` number, up to two VLAN tags.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Built {
    pub dst: u8,
    pub src: u8,
    pub vlans: Vec<u16>,
    pub body: Body,
    /// Cut to this many bytes (if shorter).
    pub cut: Option<u16>,
}
encode_struct!(Built {
    dst,
    src,
    vlans,
    body,
    cut
});

#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum FrameSpec {
    Raw(Vec<u8>),
    Built(Built),
}

impl Encode for FrameSpec {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            FrameSpec::Raw(b) => (variant(0, 2, out), b.encode(out)).1,
            FrameSpec::Built(b) => (variant(1, 2, out), b.encode(out)).1,
        }
    }
}

/// The virtio-net header a frame is sent behind.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hdr {
    /// All zero: nothing asked of the device.
    Plain,
    /// NEEDS_CSUM at the frame's transport checksum.
    Csum,
    /// A GSO super-frame of segments of `mss` bytes (TCPv4, TCPv6 or USO by the frame's
    /// transport), its checksum asked for; the ECN bit too if `ecn`.
    Gso { mss: u16, ecn: bool },
    /// Any fields (`num_buffers` too, which a device must ignore on tx).
    Raw([u8; 12]),
    /// Only `n % 12` bytes of a header, and no frame.
    Short(u8),
}

impl Encode for Hdr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Hdr::Plain => variant(0, 5, out),
            Hdr::Csum => variant(1, 5, out),
            Hdr::Gso { mss, ecn } => {
                variant(2, 5, out);
                mss.encode(out);
                ecn.encode(out);
            }
            Hdr::Raw(b) => (variant(3, 5, out), b.encode(out)).1,
            Hdr::Short(n) => (variant(4, 5, out), n.encode(out)).1,
        }
    }
}

/// One tx frame: its header, its bytes, and where its chain's buffers are cut.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct TxFrame {
    pub hdr: Hdr,
    pub frame: FrameSpec,
    pub cuts: Vec<u16>,
}
encode_struct!(TxFrame { hdr, frame, cuts });

#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Port `port % ports`'s driver sends `frames` (at most [`MAX_BATCH`]) on its first
    /// pair's tx queue, and its worker forwards them.
    Send { port: u8, frames: Vec<TxFrame> },
    /// Port `port % ports`'s driver posts again the rx buffers it got back.
    Refill { port: u8 },
    /// The host sends `frames` (at most [`MAX_BATCH`]) in through the uplink, and its
    /// worker forwards them as one batch read from the TAP (nothing without an uplink).
    Uplink { frames: Vec<HostFrame> },
    /// Port `port % ports`'s driver asks for `pairs % 4` queue pairs on its control queue
    /// (MQ VQ_PAIRS_SET), between batches: 0, or more than it has, is refused.
    Pairs { port: u8, pairs: u8 },
}

impl Encode for Step {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Step::Send { port, frames } => {
                variant(0, 4, out);
                port.encode(out);
                frames.encode(out);
            }
            Step::Refill { port } => (variant(1, 4, out), port.encode(out)).1,
            Step::Uplink { frames } => (variant(2, 4, out), frames.encode(out)).1,
            Step::Pairs { port, pairs } => {
                variant(3, 4, out);
                [*port, *pairs].encode(out);
            }
        }
    }
}

/// A whole input: the uplink (port 0, its learn limit) if there is one, the guest ports
/// (ports 1 up, at most [`MAX_GUESTS`]; at least one), and the steps.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct SwitchInput {
    pub uplink: Option<u8>,
    pub ports: Vec<PortSetup>,
    pub steps: Vec<Step>,
}
encode_struct!(SwitchInput {
    uplink,
    ports,
    steps
});

pub const MAX_GUESTS: usize = 4;
/// Frames per `Send`, at most: one batch of the tx path.
pub const MAX_BATCH: usize = 8;
/// Buffers a tx chain is cut into, at most.
pub const MAX_CUTS: usize = 4;

/// Guest `n`'s own MAC number (`switch::model::mac`).
pub fn guest_mac(n: usize) -> u8 {
    10 + n as u8
}

/// Where a built frame's headers are, for the header made to fit it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    /// The transport header's offset and length, and its checksum field's offset in it,
    /// when it is TCP or UDP.
    pub l4: Option<(usize, usize, u16)>,
    pub tcp: bool,
    pub ipv6: bool,
    /// The network header's offset.
    pub l3: usize,
    /// The frame was cut short.
    pub cut: bool,
}

fn ip4(n: u8) -> [u8; 4] {
    [10, 0, 0, n]
}

fn ip6(n: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = n;
    a
}

/// The payload's bytes: a pattern that differs from one offset to the next.
pub fn payload(len: usize) -> impl Iterator<Item = u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8)
}

impl Built {
    /// The frame's bytes and where its headers are; `partial`: the transport checksum
    /// field holds the pseudo-header sum (Linux's convention for a checksum the device
    /// finishes), else the full checksum.
    pub fn bytes(&self, partial: bool) -> (Vec<u8>, Layout) {
        let mac = |i| virtnet_backend::switch::model::mac(i).bytes();
        let mut f = Vec::with_capacity(128);
        f.extend(mac(self.dst));
        f.extend(mac(self.src));
        for &tci in self.vlans.iter().take(2) {
            f.extend(0x8100u16.to_be_bytes());
            f.extend(tci.to_be_bytes());
        }
        let l3 = f.len() + 2;
        let mut layout = Layout {
            l3,
            ..Layout::default()
        };
        match &self.body {
            Body::Arp { spa, tpa } => arp(&mut f, 0x0806, 1, mac(self.src), ip4(*spa), ip4(*tpa)),
            Body::Rarp => arp(&mut f, 0x8035, 3, mac(self.src), [0; 4], [0; 4]),
            Body::Ipv4 {
                l4,
                options,
                payload: n,
            } => {
                f.extend(0x0800u16.to_be_bytes());
                let opts = (*options % 11) as usize * 4;
                let (l4h, proto) = transport(l4);
                let total = 20 + opts + l4h + *n as usize;
                f.push(0x45 + (opts / 4) as u8);
                f.push(0);
                f.extend((total as u16).to_be_bytes());
                f.extend([0x12, 0x34, 0x40, 0, 64, proto, 0, 0]);
                f.extend(ip4(self.src));
                f.extend(ip4(self.dst));
                f.extend(std::iter::repeat_n(1u8, opts));
                let c = csum::checksum(&f[l3..l3 + 20 + opts]);
                f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
                let pseudo = Sum::ZERO
                    .add_bytes(&ip4(self.src))
                    .add_bytes(&ip4(self.dst))
                    .add_u16(proto.into())
                    .add_u16((l4h + *n as usize) as u16);
                self.l4(&mut f, l4, *n, pseudo, partial, &mut layout);
            }
            Body::Ipv6 { l4, payload: n } => {
                f.extend(0x86ddu16.to_be_bytes());
                let (l4h, proto) = transport(l4);
                f.extend([0x60, 0, 0, 0]);
                f.extend(((l4h + *n as usize) as u16).to_be_bytes());
                f.extend([proto, 64]);
                f.extend(ip6(self.src));
                f.extend(ip6(self.dst));
                let pseudo = Sum::ZERO
                    .add_bytes(&ip6(self.src))
                    .add_bytes(&ip6(self.dst))
                    .add_u32((l4h + *n as usize) as u32)
                    .add_u16(proto.into());
                layout.ipv6 = true;
                self.l4(&mut f, l4, *n, pseudo, partial, &mut layout);
            }
            Body::Other { ethertype, bytes } => {
                f.extend(ethertype.to_be_bytes());
                f.extend(bytes);
            }
        }
        if let Some(n) = self.cut {
            layout.cut = (n as usize) < f.len();
            f.truncate(n as usize);
        }
        (f, layout)
    }

    /// Appends the transport header and `n` payload bytes, its checksum filled in.
    fn l4(
        &self,
        f: &mut Vec<u8>,
        l4: &L4,
        n: u16,
        pseudo: Sum,
        partial: bool,
        layout: &mut Layout,
    ) {
        let at = f.len();
        let (len, check) = match *l4 {
            L4::Tcp {
                options,
                flags,
                seq,
            } => {
                let opts = (options % 11) as usize * 4;
                f.extend(1000u16.to_be_bytes());
                f.extend(2000u16.to_be_bytes());
                f.extend(seq.to_be_bytes());
                f.extend(1u32.to_be_bytes());
                f.push((((20 + opts) / 4) as u8) << 4);
                f.push(flags);
                f.extend([0xff, 0xff, 0, 0, 0, 0]);
                f.extend(std::iter::repeat_n(1u8, opts));
                layout.tcp = true;
                (20 + opts, 16u16)
            }
            L4::Udp => {
                f.extend(3000u16.to_be_bytes());
                f.extend(4000u16.to_be_bytes());
                f.extend(8u16.wrapping_add(n).to_be_bytes());
                f.extend([0, 0]);
                (8, 6u16)
            }
            L4::Other(_) => {
                f.extend(payload(n as usize));
                return;
            }
        };
        f.extend(payload(n as usize));
        layout.l4 = Some((at, len, check));
        let seed = pseudo.fold();
        let c = check as usize;
        f[at + c..at + c + 2].copy_from_slice(&seed.to_be_bytes());
        if !partial {
            let full = match csum::checksum(&f[at..]) {
                0 if !layout.tcp => 0xffff,
                x => x,
            };
            f[at + c..at + c + 2].copy_from_slice(&full.to_be_bytes());
        }
    }
}

fn transport(l4: &L4) -> (usize, u8) {
    match *l4 {
        L4::Tcp { options, .. } => (20 + (options % 11) as usize * 4, 6),
        L4::Udp => (8, 17),
        L4::Other(p) => (0, p),
    }
}

fn arp(f: &mut Vec<u8>, ethertype: u16, op: u16, sha: [u8; 6], spa: [u8; 4], tpa: [u8; 4]) {
    f.extend(ethertype.to_be_bytes());
    f.extend([0, 1, 8, 0, 6, 4]);
    f.extend(op.to_be_bytes());
    f.extend(sha);
    f.extend(spa);
    f.extend([0; 6]);
    f.extend(tpa);
}

impl TxFrame {
    /// The header's bytes as the driver writes them, the frame's, and whether the header asks
    /// for the transport checksum of a TCP or UDP frame whole (the field seeded as Linux
    /// does): then every checksum a receiver gets completed must be right.
    pub fn bytes(&self) -> (Vec<u8>, Vec<u8>, bool) {
        let built = |partial| match &self.frame {
            FrameSpec::Raw(b) => (b.clone(), Layout::default()),
            FrameSpec::Built(b) => b.bytes(partial),
        };
        let hdr = |h: NetHdr| h.to_bytes().to_vec();
        match self.hdr {
            Hdr::Plain => (hdr(NetHdr::default()), built(false).0, false),
            Hdr::Raw(b) => (b.to_vec(), built(false).0, false),
            Hdr::Short(n) => (vec![0xa5; (n % 12) as usize], Vec::new(), false),
            Hdr::Csum => {
                let (f, l) = built(true);
                let (start, offset) = match l.l4 {
                    Some((at, _, check)) => (at, check),
                    None => (l.l3, 10),
                };
                let h = NetHdr {
                    flags: HDR_F_NEEDS_CSUM,
                    csum_start: start as u16,
                    csum_offset: offset,
                    ..NetHdr::default()
                };
                (hdr(h), f, l.l4.is_some() && !l.cut)
            }
            Hdr::Gso { mss, ecn } => {
                let (f, l) = built(true);
                let (start, len, offset) = l.l4.unwrap_or((l.l3, 20, 16));
                let kind = match (l.tcp, l.ipv6) {
                    (true, false) => HDR_GSO_TCPV4,
                    (true, true) => HDR_GSO_TCPV6,
                    _ if l.l4.is_some() => HDR_GSO_UDP_L4,
                    _ => HDR_GSO_TCPV4,
                };
                let h = NetHdr {
                    flags: HDR_F_NEEDS_CSUM,
                    gso_type: kind | if ecn { HDR_GSO_ECN } else { 0 },
                    hdr_len: (start + len) as u16,
                    gso_size: mss,
                    csum_start: start as u16,
                    csum_offset: offset,
                    num_buffers: 0,
                };
                (hdr(h), f, l.l4.is_some() && !l.cut)
            }
        }
    }
}
