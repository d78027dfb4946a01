//! An Ethernet MAC address (IEEE 802-2014 8.2), as the switch keys and compares it: the six
//! bytes in transmission order, packed in the low 48 bits of a `u64` so that hashing and
//! comparing one costs an integer operation.

use std::fmt;

use serde::{Serialize, Serializer};

/// A MAC address. Byte 0 is the first on the wire; its least significant bit is the
/// individual/group bit (multicast), so `[0xff; 6]` is broadcast.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(u64);

impl Mac {
    pub const BROADCAST: Mac = Mac::new([0xff; 6]);
    pub const ZERO: Mac = Mac::new([0; 6]);

    pub const fn new(b: [u8; 6]) -> Mac {
        Mac(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], 0, 0,
        ]))
    }

    /// The destination (bytes 0..6) and source (6..12) of an Ethernet header, or None when
    /// `header` is shorter than 12 bytes.
    pub fn from_header(header: &[u8]) -> Option<(Mac, Mac)> {
        let dst: [u8; 6] = header.get(0..6)?.try_into().ok()?;
        let src: [u8; 6] = header.get(6..12)?.try_into().ok()?;
        Some((Mac::new(dst), Mac::new(src)))
    }

    pub const fn bytes(self) -> [u8; 6] {
        let b = self.0.to_le_bytes();
        [b[0], b[1], b[2], b[3], b[4], b[5]]
    }

    /// The 48 bits as an integer (byte 0 lowest): the FDB's key.
    pub const fn to_u64(self) -> u64 {
        self.0
    }

    /// The address whose 48 bits are the low 48 of `v`.
    pub const fn from_u64(v: u64) -> Mac {
        Mac(v & 0xffff_ffff_ffff)
    }

    /// A group address: multicast, broadcast included.
    pub const fn is_multicast(self) -> bool {
        self.0 & 1 != 0
    }

    pub const fn is_broadcast(self) -> bool {
        self.0 == Mac::BROADCAST.0
    }

    /// Whether a frame may come from this address, as Linux's `is_valid_ether_addr`: neither
    /// a group address nor all zeroes. A bridge drops frames from any other source and never
    /// learns one.
    pub const fn is_valid_source(self) -> bool {
        !self.is_multicast() && self.0 != 0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bytes();
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// As `virtnet ctl` prints it: `"52:54:00:12:34:56"`.
impl Serialize for Mac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_in_wire_order() {
        let m = Mac::new([0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(m.bytes(), [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(Mac::from_u64(m.to_u64()), m);
        assert_eq!(Mac::from_u64(u64::MAX), Mac::BROADCAST);
        assert_eq!(m.to_string(), "52:54:00:12:34:56");
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"52:54:00:12:34:56\"");
    }

    #[test]
    fn group_and_valid_source() {
        let uni = Mac::new([2, 0, 0, 0, 0, 1]);
        let multi = Mac::new([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(!uni.is_multicast() && uni.is_valid_source());
        assert!(multi.is_multicast() && !multi.is_broadcast() && !multi.is_valid_source());
        assert!(Mac::BROADCAST.is_multicast() && Mac::BROADCAST.is_broadcast());
        assert!(!Mac::BROADCAST.is_valid_source());
        assert!(!Mac::ZERO.is_multicast() && !Mac::ZERO.is_valid_source());
    }

    #[test]
    fn from_header_takes_destination_then_source() {
        let mut h = [0u8; 14];
        h[..6].copy_from_slice(&[0xff; 6]);
        h[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 7]);
        let (dst, src) = Mac::from_header(&h).unwrap();
        assert_eq!((dst, src), (Mac::BROADCAST, Mac::new([2, 0, 0, 0, 0, 7])));
        assert_eq!(Mac::from_header(&h[..11]), None);
        assert!(Mac::from_header(&h[..12]).is_some());
    }
}
