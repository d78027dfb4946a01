//! A frame as the switch sees it ([`Inbound`]: its header, the copy of its first bytes
//! ([`PREFIX`]), the rest in the sender's memory), and what it reads of one from that copy:
//! its Ethernet addresses, whether it announces its source (RARP, gratuitous ARP), and a flow
//! hash that keeps one flow's frames on one queue pair of their destination.

use vring::Gather;

use super::forward::Frame;
use super::mac::Mac;
use crate::rx::Pieces;

/// How many of a frame's first bytes the switch copies out of the sender's memory, once: the
/// Ethernet header with up to two VLAN tags, an IPv6 header and a transport header's ports.
/// What the switch classified is what it delivers: these bytes go to the destination from
/// the copy, the rest straight from the sender's buffers.
pub const PREFIX: usize = 64;

/// One frame a port sends into the switch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inbound<'a> {
    /// Its virtio-net header (checked by the sender's tx path, or the kernel's); the frame's
    /// first bytes (the copy's, after the header; or the uplink's frame whole); the rest of
    /// it, in the sender's memory. What a guest's sink copies, from here (built in place:
    /// a copy of one built on the stack waited for the stores that built it).
    pub pieces: Pieces<'a>,
    /// The header as the uplink's TAP takes it (12 bytes), then the frame's first bytes: a
    /// copy, what the switch classifies and delivers. For the uplink's own frames, unused.
    pub tap_head: &'a [u8],
}

/// The gather of frame `f` for the uplink's TAP: its header and first bytes from the copy,
/// then the rest from the sender's memory.
pub(super) fn tap_gather<'a>(f: &Inbound<'a>) -> Gather<'a> {
    Gather::new(
        f.tap_head,
        f.pieces.rest.map(|(_, t)| t).unwrap_or_default(),
    )
}

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_RARP: u16 = 0x8035;
const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The ethertype after any VLAN tags, and where the network header starts.
fn network(prefix: &[u8]) -> Option<(u16, usize)> {
    let mut at = 12;
    let mut ty = be16(prefix, at)?;
    for _ in 0..2 {
        if ty != ETH_P_8021Q && ty != ETH_P_8021AD {
            break;
        }
        at += 4;
        ty = be16(prefix, at)?;
    }
    Some((ty, at + 2))
}

/// An Ethernet header: destination, source, ethertype (Linux's ETH_HLEN).
const ETH_HLEN: usize = 14;

/// The addresses of a frame whose first bytes are `prefix`; None for one shorter than an
/// Ethernet header (its ethertype too: a TAP refuses such a frame, and no receiver takes it).
/// A RARP request, or a gratuitous ARP (sender and target protocol addresses equal),
/// announces its source: a guest that migrated here moves its MAC to this port at once.
pub fn frame(prefix: &[u8]) -> Option<Frame> {
    if prefix.len() < ETH_HLEN {
        return None;
    }
    let (dst, src) = Mac::from_header(prefix)?;
    let announce = match network(prefix) {
        Some((ETH_P_RARP, _)) => true,
        Some((ETH_P_ARP, at)) => {
            // Sender protocol address at 14, target at 24 (Ethernet, IPv4 ARP).
            let spa = prefix.get(at + 14..at + 18);
            let tpa = prefix.get(at + 24..at + 28);
            spa.is_some() && spa == tpa
        }
        _ => false,
    };
    Some(Frame { dst, src, announce })
}

/// A hash of the frame's flow: its IP addresses and transport ports when it has them (TCP,
/// UDP, SCTP), else its Ethernet addresses and type. Frames of one flow hash alike, so they
/// take one queue pair of their destination and stay in order.
pub fn hash(prefix: &[u8]) -> u32 {
    let mut h = Fnv::default();
    match network(prefix) {
        Some((ETH_P_IPV4, at)) if prefix.len() >= at + 20 => {
            let ihl = (prefix[at] & 0xf) as usize * 4;
            let proto = prefix[at + 9];
            h.add(&prefix[at + 12..at + 20]);
            h.add(&[proto]);
            // Ports only in a first fragment (offset 0, any MF): later ones have none.
            let frag = be16(prefix, at + 6).unwrap_or(0) & 0x1fff;
            if frag == 0 {
                ports(&mut h, prefix, proto, at + ihl);
            }
        }
        Some((ETH_P_IPV6, at)) if prefix.len() >= at + 40 => {
            let next = prefix[at + 6];
            h.add(&prefix[at + 8..at + 40]);
            h.add(&[next]);
            ports(&mut h, prefix, next, at + 40);
        }
        Some((ty, _)) => {
            h.add(&prefix[..12]);
            h.add(&ty.to_be_bytes());
        }
        None => h.add(prefix),
    }
    h.finish()
}

/// Adds the transport ports at `at` of protocol `proto` to `h`, when the prefix holds them.
fn ports(h: &mut Fnv, prefix: &[u8], proto: u8, at: usize) {
    const TCP: u8 = 6;
    const UDP: u8 = 17;
    const SCTP: u8 = 132;
    if matches!(proto, TCP | UDP | SCTP) {
        if let Some(p) = prefix.get(at..at + 4) {
            h.add(p);
        }
    }
}

/// FNV-1a, 32 bits: small and good enough to spread flows over a few queue pairs.
struct Fnv(u32);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0x811c_9dc5)
    }
}

impl Fnv {
    fn add(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u32).wrapping_mul(0x0100_0193);
        }
    }

    fn finish(&self) -> u32 {
        // Fold the high bits down: the caller takes the hash modulo a few pairs.
        self.0 ^ (self.0 >> 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eth(ty: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        f.extend(ty.to_be_bytes());
        f.extend(payload);
        f
    }

    fn udp4(src_port: u16) -> Vec<u8> {
        let mut ip = vec![
            0x45, 0, 0, 28, 0, 1, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip.extend(src_port.to_be_bytes());
        ip.extend(9000u16.to_be_bytes());
        ip.extend([0, 8, 0, 0]);
        eth(ETH_P_IPV4, &ip)
    }

    #[test]
    fn addresses_come_from_the_ethernet_header_and_a_short_frame_has_none() {
        let f = frame(&udp4(1)).unwrap();
        assert_eq!(f.dst, Mac::new([2, 0, 0, 0, 0, 2]));
        assert_eq!(f.src, Mac::new([2, 0, 0, 0, 0, 1]));
        assert!(!f.announce);
        assert!(frame(&[0u8; 11]).is_none());
    }

    /// Found by the `switch_forward` fuzz target (corpus/switch_forward/regression-runt):
    /// a 12- or 13-byte frame, addresses but no ethertype, was switched (learned from,
    /// delivered to other guests) as a frame. A TAP refuses one shorter than ETH_HLEN.
    #[test]
    fn regression_a_frame_without_its_ethertype_has_nothing_to_switch_on() {
        let f = udp4(1);
        assert!(frame(&f[..12]).is_none());
        assert!(frame(&f[..13]).is_none());
        assert!(frame(&f[..14]).is_some());
    }

    #[test]
    fn rarp_and_gratuitous_arp_announce_their_source_and_other_arp_does_not() {
        assert!(frame(&eth(ETH_P_RARP, &[0; 28])).unwrap().announce);
        let arp = |spa: [u8; 4], tpa: [u8; 4]| {
            let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
            a.extend([2, 0, 0, 0, 0, 1]);
            a.extend(spa);
            a.extend([0; 6]);
            a.extend(tpa);
            eth(ETH_P_ARP, &a)
        };
        assert!(frame(&arp([10, 0, 0, 1], [10, 0, 0, 1])).unwrap().announce);
        assert!(!frame(&arp([10, 0, 0, 1], [10, 0, 0, 2])).unwrap().announce);
        // Behind a VLAN tag too.
        let mut tagged = eth(ETH_P_8021Q, &[0, 5]);
        tagged.extend(ETH_P_RARP.to_be_bytes());
        tagged.extend([0; 28]);
        assert!(frame(&tagged).unwrap().announce);
    }

    #[test]
    fn a_flow_hashes_alike_and_flows_spread() {
        assert_eq!(hash(&udp4(1000)), hash(&udp4(1000)));
        // Over 4 pairs, 64 flows that differ by source port use every pair.
        let mut used = [false; 4];
        for p in 0..64 {
            used[hash(&udp4(1000 + p)) as usize % 4] = true;
        }
        assert!(used.iter().all(|&u| u), "{used:?}");
        // Anything at all hashes without panicking.
        for n in 0..PREFIX {
            hash(&vec![0xff; n]);
            hash(&udp4(7)[..n.min(42)]);
        }
    }
}
