//! Feature bits: a 64-bit set with named bits taken from `virtio-bindings`, and negotiation.
//!
//! Negotiation is the intersection of what the device offers and what the driver wants; a
//! device refuses an acknowledgement that contains bits it never offered.

use std::fmt;

use virtio_bindings::{virtio_config as cfg, virtio_net as net, virtio_ring as ring};

use crate::Error;

/// A set of virtio feature bits (64 of them, spec 2.2).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Features(pub u64);

const fn bit(n: u32) -> Features {
    Features(1 << n)
}

impl Features {
    pub const EMPTY: Features = Features(0);
    // Transport and ring bits.
    pub const VERSION_1: Features = bit(cfg::VIRTIO_F_VERSION_1);
    pub const NOTIFY_ON_EMPTY: Features = bit(cfg::VIRTIO_F_NOTIFY_ON_EMPTY);
    pub const ANY_LAYOUT: Features = bit(cfg::VIRTIO_F_ANY_LAYOUT);
    pub const ACCESS_PLATFORM: Features = bit(cfg::VIRTIO_F_ACCESS_PLATFORM);
    pub const RING_PACKED: Features = bit(cfg::VIRTIO_F_RING_PACKED);
    pub const IN_ORDER: Features = bit(cfg::VIRTIO_F_IN_ORDER);
    pub const RING_INDIRECT_DESC: Features = bit(ring::VIRTIO_RING_F_INDIRECT_DESC);
    pub const RING_EVENT_IDX: Features = bit(ring::VIRTIO_RING_F_EVENT_IDX);
    // Net device bits (spec 5.1.3).
    pub const NET_CSUM: Features = bit(net::VIRTIO_NET_F_CSUM);
    pub const NET_GUEST_CSUM: Features = bit(net::VIRTIO_NET_F_GUEST_CSUM);
    pub const NET_CTRL_GUEST_OFFLOADS: Features = bit(net::VIRTIO_NET_F_CTRL_GUEST_OFFLOADS);
    pub const NET_MTU: Features = bit(net::VIRTIO_NET_F_MTU);
    pub const NET_MAC: Features = bit(net::VIRTIO_NET_F_MAC);
    pub const NET_GUEST_TSO4: Features = bit(net::VIRTIO_NET_F_GUEST_TSO4);
    pub const NET_GUEST_TSO6: Features = bit(net::VIRTIO_NET_F_GUEST_TSO6);
    pub const NET_GUEST_ECN: Features = bit(net::VIRTIO_NET_F_GUEST_ECN);
    pub const NET_GUEST_UFO: Features = bit(net::VIRTIO_NET_F_GUEST_UFO);
    pub const NET_HOST_TSO4: Features = bit(net::VIRTIO_NET_F_HOST_TSO4);
    pub const NET_HOST_TSO6: Features = bit(net::VIRTIO_NET_F_HOST_TSO6);
    pub const NET_HOST_ECN: Features = bit(net::VIRTIO_NET_F_HOST_ECN);
    pub const NET_HOST_UFO: Features = bit(net::VIRTIO_NET_F_HOST_UFO);
    pub const NET_MRG_RXBUF: Features = bit(net::VIRTIO_NET_F_MRG_RXBUF);
    pub const NET_STATUS: Features = bit(net::VIRTIO_NET_F_STATUS);
    pub const NET_CTRL_VQ: Features = bit(net::VIRTIO_NET_F_CTRL_VQ);
    pub const NET_CTRL_RX: Features = bit(net::VIRTIO_NET_F_CTRL_RX);
    pub const NET_CTRL_VLAN: Features = bit(net::VIRTIO_NET_F_CTRL_VLAN);
    pub const NET_GUEST_ANNOUNCE: Features = bit(net::VIRTIO_NET_F_GUEST_ANNOUNCE);
    pub const NET_MQ: Features = bit(net::VIRTIO_NET_F_MQ);
    pub const NET_CTRL_MAC_ADDR: Features = bit(net::VIRTIO_NET_F_CTRL_MAC_ADDR);
    pub const NET_NOTF_COAL: Features = bit(net::VIRTIO_NET_F_NOTF_COAL);
    pub const NET_VQ_NOTF_COAL: Features = bit(net::VIRTIO_NET_F_VQ_NOTF_COAL);

    /// Every named bit with its spec name, for display.
    const NAMES: &'static [(Features, &'static str)] = &[
        (Self::NET_CSUM, "CSUM"),
        (Self::NET_GUEST_CSUM, "GUEST_CSUM"),
        (Self::NET_CTRL_GUEST_OFFLOADS, "CTRL_GUEST_OFFLOADS"),
        (Self::NET_MTU, "MTU"),
        (Self::NET_MAC, "MAC"),
        (Self::NET_GUEST_TSO4, "GUEST_TSO4"),
        (Self::NET_GUEST_TSO6, "GUEST_TSO6"),
        (Self::NET_GUEST_ECN, "GUEST_ECN"),
        (Self::NET_GUEST_UFO, "GUEST_UFO"),
        (Self::NET_HOST_TSO4, "HOST_TSO4"),
        (Self::NET_HOST_TSO6, "HOST_TSO6"),
        (Self::NET_HOST_ECN, "HOST_ECN"),
        (Self::NET_HOST_UFO, "HOST_UFO"),
        (Self::NET_MRG_RXBUF, "MRG_RXBUF"),
        (Self::NET_STATUS, "STATUS"),
        (Self::NET_CTRL_VQ, "CTRL_VQ"),
        (Self::NET_CTRL_RX, "CTRL_RX"),
        (Self::NET_CTRL_VLAN, "CTRL_VLAN"),
        (Self::NET_GUEST_ANNOUNCE, "GUEST_ANNOUNCE"),
        (Self::NET_MQ, "MQ"),
        (Self::NET_CTRL_MAC_ADDR, "CTRL_MAC_ADDR"),
        (Self::NOTIFY_ON_EMPTY, "NOTIFY_ON_EMPTY"),
        (Self::ANY_LAYOUT, "ANY_LAYOUT"),
        (Self::RING_INDIRECT_DESC, "RING_INDIRECT_DESC"),
        (Self::RING_EVENT_IDX, "RING_EVENT_IDX"),
        (Self::VERSION_1, "VERSION_1"),
        (Self::ACCESS_PLATFORM, "ACCESS_PLATFORM"),
        (Self::RING_PACKED, "RING_PACKED"),
        (Self::IN_ORDER, "IN_ORDER"),
        (Self::NET_NOTF_COAL, "NOTF_COAL"),
        (Self::NET_VQ_NOTF_COAL, "VQ_NOTF_COAL"),
    ];

    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }
    pub const fn intersection(self, other: Features) -> Features {
        Features(self.0 & other.0)
    }
    pub const fn difference(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }

    /// Driver side: what to acknowledge given what the device offers.
    pub const fn negotiate(offered: Features, wanted: Features) -> Features {
        offered.intersection(wanted)
    }

    /// Device side: accepts an acknowledgement only if every bit in it was offered.
    pub fn check_acked(offered: Features, acked: Features) -> Result<Features, Error> {
        let extra = acked.difference(offered);
        if extra != Features::EMPTY {
            return Err(Error::UnofferedFeatures { bits: extra.0 });
        }
        Ok(acked)
    }
}

impl std::ops::BitOr for Features {
    type Output = Features;
    fn bitor(self, rhs: Features) -> Features {
        self.union(rhs)
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({:#x}: {})", self.0, self)
    }
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            let s = if first { "" } else { "|" };
            first = false;
            f.write_str(s)
        };
        for &(bits, name) in Self::NAMES {
            if self.contains(bits) {
                sep(f)?;
                f.write_str(name)?;
                rest &= !bits.0;
            }
        }
        for b in (0..64).filter(|b| rest & (1 << b) != 0) {
            sep(f)?;
            write!(f, "bit{b}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_bits_are_the_spec_numbers() {
        // Spot checks against the spec's numbering: a retyped table would drift from these.
        assert_eq!(Features::VERSION_1.0, 1 << 32);
        assert_eq!(Features::RING_EVENT_IDX.0, 1 << 29);
        assert_eq!(Features::RING_INDIRECT_DESC.0, 1 << 28);
        assert_eq!(Features::NET_MRG_RXBUF.0, 1 << 15);
        assert_eq!(Features::NET_VQ_NOTF_COAL.0, 1 << 52);
    }

    #[test]
    fn negotiation_is_the_intersection_and_the_device_refuses_unoffered_bits() {
        let offered = Features::VERSION_1 | Features::RING_EVENT_IDX | Features::NET_MQ;
        let wanted = Features::VERSION_1 | Features::RING_EVENT_IDX | Features::NET_CTRL_VQ;
        let acked = Features::negotiate(offered, wanted);
        assert_eq!(acked, Features::VERSION_1 | Features::RING_EVENT_IDX);
        assert_eq!(Features::check_acked(offered, acked), Ok(acked));
        assert_eq!(
            Features::check_acked(offered, wanted),
            Err(Error::UnofferedFeatures {
                bits: Features::NET_CTRL_VQ.0
            })
        );
    }

    #[test]
    fn display_names_bits_and_keeps_unknown_ones() {
        let f = Features::VERSION_1 | Features::RING_EVENT_IDX | Features(1 << 63);
        assert_eq!(f.to_string(), "RING_EVENT_IDX|VERSION_1|bit63");
    }
}
