//! Feature bits: a 64-bit set with the transport and ring bits named (from `virtio-bindings`;
//! a device type names its own, as `vnet::feature` does for virtio-net), and negotiation.
//!
//! Negotiation is the intersection of what the device offers and what the driver wants; a
//! device refuses an acknowledgement that contains bits it never offered.

use std::fmt;

use virtio_bindings::{virtio_config as cfg, virtio_ring as ring};

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

    /// Every named bit with its spec name, for display.
    const NAMES: &'static [(Features, &'static str)] = &[
        (Self::NOTIFY_ON_EMPTY, "NOTIFY_ON_EMPTY"),
        (Self::ANY_LAYOUT, "ANY_LAYOUT"),
        (Self::RING_INDIRECT_DESC, "RING_INDIRECT_DESC"),
        (Self::RING_EVENT_IDX, "RING_EVENT_IDX"),
        (Self::VERSION_1, "VERSION_1"),
        (Self::ACCESS_PLATFORM, "ACCESS_PLATFORM"),
        (Self::RING_PACKED, "RING_PACKED"),
        (Self::IN_ORDER, "IN_ORDER"),
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
    }

    #[test]
    fn negotiation_is_the_intersection_and_the_device_refuses_unoffered_bits() {
        let offered = Features::VERSION_1 | Features::RING_EVENT_IDX | Features(1 << 22);
        let wanted = Features::VERSION_1 | Features::RING_EVENT_IDX | Features(1 << 17);
        let acked = Features::negotiate(offered, wanted);
        assert_eq!(acked, Features::VERSION_1 | Features::RING_EVENT_IDX);
        assert_eq!(Features::check_acked(offered, acked), Ok(acked));
        assert_eq!(
            Features::check_acked(offered, wanted),
            Err(Error::UnofferedFeatures { bits: 1 << 17 })
        );
    }

    #[test]
    fn display_names_bits_and_keeps_unknown_ones() {
        let f = Features::VERSION_1 | Features::RING_EVENT_IDX | Features(1 << 63);
        assert_eq!(f.to_string(), "RING_EVENT_IDX|VERSION_1|bit63");
    }
}
