//! Where a device stands in its ring: what vhost-user's GET_VRING_BASE reports and
//! SET_VRING_BASE restores (the "vring base"), and what a queue starts from.
//!
//! A split ring's position is the next avail index the device will take, a free-running 16-bit
//! counter (spec 2.7.6). A packed ring's would be an index and a wrap counter for each of the
//! avail and used sides (spec 2.8, and vhost-user's encoding of them in one 32-bit base): the
//! type keeps callers (the protocol layer, the workers) from handling the bare number, so that a
//! second ring layout changes this file and the engine, not them.

use crate::Error;

/// A device's position in its ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingPosition {
    next_avail: u16,
}

impl RingPosition {
    /// A ring nobody has used: where a fresh queue starts.
    pub const START: RingPosition = RingPosition { next_avail: 0 };

    /// A split ring's position: `next_avail` is the next avail index the device takes.
    pub fn split(next_avail: u16) -> RingPosition {
        RingPosition { next_avail }
    }

    /// The position a vhost-user vring base names (SET_VRING_BASE's `num`). For a split ring
    /// it is the next avail index, which must fit 16 bits: anything above is the frontend's
    /// error.
    pub fn from_vhost_base(base: u32) -> Result<RingPosition, Error> {
        u16::try_from(base)
            .map(RingPosition::split)
            .map_err(|_| Error::InvalidVringBase { base })
    }

    /// The vhost-user vring base for this position (GET_VRING_BASE's answer).
    pub fn vhost_base(self) -> u32 {
        self.next_avail.into()
    }

    /// The next avail index the device takes.
    pub fn next_avail(self) -> u16 {
        self.next_avail
    }
}

/// How far the driver had made chains available when the device last looked: kept by a
/// device that ran short of buffers, to tell later whether the driver has added any
/// (`DeviceQueue::avail_mark`, `DeviceQueue::avail_moved`). Opaque for the same reason as
/// [`RingPosition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvailMark(pub(crate) u16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_ring_base_is_its_next_avail_index_and_nothing_above_16_bits() {
        let p = RingPosition::from_vhost_base(0xfffe).unwrap();
        assert_eq!(p, RingPosition::split(0xfffe));
        assert_eq!(p.vhost_base(), 0xfffe);
        assert_eq!(RingPosition::START.next_avail(), 0);
        assert_eq!(
            RingPosition::from_vhost_base(0x1_0000),
            Err(Error::InvalidVringBase { base: 0x1_0000 })
        );
    }
}
