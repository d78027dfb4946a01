//! The Internet checksum (RFC 1071; RFC 1624 for updating one) as Linux computes it in
//! software: for a frame whose checksum the sender left to the device (VIRTIO 1.2 5.1.6.2,
//! NEEDS_CSUM) and for the segments [`crate::gso`] cuts.
//!
//! The arithmetic is one's complement: a sum's value is fixed modulo 0xffff, and the only
//! freedom left is 0x0000 against 0xffff (both zero). Adding with end-around carry, as Linux
//! does, gives 0 only when everything added was 0 and a value in 1..=0xffff otherwise, so a
//! sum here is the kernel's to the bit, not just modulo 0xffff: [`crate::gso`] hands out the
//! kernel's bytes, its checksum fields included.

/// A one's-complement sum in progress.
///
/// Words are added 64 bits at a time with end-around carry: modulo 2^64 - 1, which is a
/// multiple of 2^16 - 1, so folding gives the 16-bit sum RFC 1071 defines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sum {
    acc: u64,
    /// The bytes added so far are odd in number: the next byte is the low half of a word.
    odd: bool,
}

impl Sum {
    pub const ZERO: Sum = Sum { acc: 0, odd: false };

    /// Adds `bytes` as big-endian 16-bit words, continuing where the bytes added before left
    /// off (a piece of odd length shifts the next piece by a byte, as in the concatenation).
    pub fn add_bytes(self, bytes: &[u8]) -> Sum {
        let mut piece = sum_words(bytes);
        if self.odd {
            // Every byte of this piece sits one place later in its word than `sum_words`
            // assumed: a byte swap of each word, which is a multiplication by 2^8.
            piece = piece.rotate_left(8);
        }
        Sum {
            acc: add_carry(self.acc, piece),
            odd: self.odd ^ (bytes.len() % 2 == 1),
        }
    }

    /// Adds a 16-bit value (a header field, read big-endian).
    pub fn add_u16(self, v: u16) -> Sum {
        Sum {
            acc: add_carry(self.acc, v as u64),
            ..self
        }
    }

    /// Adds a 32-bit value (a pseudo-header length): its two halves.
    pub fn add_u32(self, v: u32) -> Sum {
        Sum {
            acc: add_carry(self.acc, v as u64),
            ..self
        }
    }

    /// Subtracts a 16-bit value: adds its one's complement (RFC 1624).
    pub fn sub_u16(self, v: u16) -> Sum {
        self.add_u16(!v)
    }

    /// Subtracts a 32-bit value, as Linux takes an old length out of a checksum
    /// (`tcp_gso_segment`'s `oldlen = ~skb->len`).
    pub fn sub_u32(self, v: u32) -> Sum {
        self.add_u32(!v)
    }

    /// The sum folded to 16 bits: 0 if only zeros were added, else in 1..=0xffff.
    pub fn fold(self) -> u16 {
        let mut s = (self.acc & 0xffff_ffff) + (self.acc >> 32);
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The checksum of what was added: the complement of the folded sum.
    pub fn checksum(self) -> u16 {
        !self.fold()
    }
}

/// The checksum of `bytes`, as it goes in a checksum field that was zero while summing.
pub fn checksum(bytes: &[u8]) -> u16 {
    Sum::ZERO.add_bytes(bytes).checksum()
}

/// `a + b` with end-around carry.
fn add_carry(a: u64, b: u64) -> u64 {
    let (s, carried) = a.overflowing_add(b);
    s + carried as u64
}

/// `bytes` as big-endian words from an even position, summed with end-around carry; an odd
/// last byte is the high half of a word whose low half is zero.
fn sum_words(bytes: &[u8]) -> u64 {
    let mut acc = 0u64;
    let mut carries = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let (s, carried) = acc.overflowing_add(w);
        acc = s;
        carries += carried as u64;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        // Zero-padded on the right: the same words, the odd byte a high half.
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        let (s, carried) = acc.overflowing_add(u64::from_be_bytes(w));
        acc = s;
        carries += carried as u64;
    }
    add_carry(acc, carries)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071's definition, word by word, for comparison.
    fn reference(bytes: &[u8]) -> u16 {
        let mut s: u32 = 0;
        for c in bytes.chunks(2) {
            s += u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]) as u32;
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    #[test]
    fn rfc1071_example_sums_to_its_published_value() {
        // RFC 1071 3: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        let b = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(Sum::ZERO.add_bytes(&b).fold(), 0xddf2);
        assert_eq!(checksum(&b), !0xddf2);
    }

    #[test]
    fn an_ipv4_header_checks_to_zero() {
        // A captured header with its checksum 0xb861 in place (the classic example).
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0);
        let mut z = h;
        z[10..12].copy_from_slice(&[0, 0]);
        assert_eq!(checksum(&z), 0xb861);
    }

    #[test]
    fn odd_lengths_pad_the_last_byte_as_a_high_half() {
        assert_eq!(Sum::ZERO.add_bytes(&[0xab]).fold(), 0xab00);
        assert_eq!(Sum::ZERO.add_bytes(&[1, 2, 3]).fold(), 0x0102 + 0x0300);
        for n in 0..40 {
            let b: Vec<u8> = (0..n).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(Sum::ZERO.add_bytes(&b).fold(), reference(&b), "{n} bytes");
        }
    }

    #[test]
    fn carries_fold_back_in() {
        // 0xffff + 0xffff = 0x1fffe, folded 0xffff: never the +0 representation.
        assert_eq!(Sum::ZERO.add_bytes(&[0xff; 4]).fold(), 0xffff);
        assert_eq!(Sum::ZERO.add_bytes(&[0xff; 64 * 1024]).fold(), 0xffff);
        // 64-bit words that overflow the accumulator.
        let b = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0, 0, 0, 0, 0, 0, 0, 3,
        ];
        assert_eq!(Sum::ZERO.add_bytes(&b).fold(), reference(&b));
        assert_eq!(Sum::ZERO.add_u32(0x0001_ffff).fold(), 0x0001);
    }

    #[test]
    fn zero_only_from_zeros() {
        assert_eq!(Sum::ZERO.add_bytes(&[0; 100]).fold(), 0);
        assert_eq!(checksum(&[0; 100]), 0xffff);
        // x + ~x is 0xffff, the other zero.
        assert_eq!(Sum::ZERO.add_u16(0x1234).sub_u16(0x1234).fold(), 0xffff);
    }

    #[test]
    fn pieces_sum_as_their_concatenation_whatever_their_parity() {
        let b: Vec<u8> = (0..1001u32).map(|i| (i * 7919 % 251) as u8).collect();
        let whole = Sum::ZERO.add_bytes(&b).fold();
        assert_eq!(whole, reference(&b));
        for cut in [0, 1, 2, 3, 7, 8, 9, 500, 999, 1000, 1001] {
            let (x, y) = b.split_at(cut);
            assert_eq!(
                Sum::ZERO.add_bytes(x).add_bytes(y).fold(),
                whole,
                "cut at {cut}"
            );
            let (y1, y2) = y.split_at(y.len() / 3);
            assert_eq!(
                Sum::ZERO.add_bytes(x).add_bytes(y1).add_bytes(y2).fold(),
                whole
            );
        }
    }

    #[test]
    fn an_update_equals_a_recomputation() {
        // RFC 1624: changing a field from m to m' changes the sum by m' - m.
        let mut b: Vec<u8> = (0..64u8).collect();
        let before = Sum::ZERO.add_bytes(&b);
        b[10..12].copy_from_slice(&0xbeefu16.to_be_bytes());
        let old = u16::from_be_bytes([10, 11]);
        let updated = before.sub_u16(old).add_u16(0xbeef).fold();
        assert_eq!(updated, Sum::ZERO.add_bytes(&b).fold());
        // A 32-bit length taken out and another put in, as TCP segmentation does.
        let s = Sum::ZERO.add_bytes(&b).add_u32(70_000);
        assert_eq!(
            s.sub_u32(70_000).add_u32(1480).fold(),
            Sum::ZERO.add_bytes(&b).add_u32(1480).fold()
        );
    }
}
