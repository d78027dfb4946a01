//! The inverse of `arbitrary`'s decoding, for the types the fuzz inputs are made of, so unit
//! tests can write meaningful seeds (see `seeds/`).
//!
//! `arbitrary` 1.x reads integers as little-endian bytes, a `bool` as the low bit of a byte, an
//! `Option` as a `bool` then the value, an array element by element, a `Vec` as (`true`,
//! element)* then `false`, and an enum variant from a `u32` scaled to the variant count. Struct
//! fields come in declaration order. The seed tests decode every encoding again and compare, so
//! a change in `arbitrary`'s format or a field added without updating its `Encode` impl fails
//! loudly instead of writing seeds that mean something else.

pub trait Encode {
    fn encode(&self, out: &mut Vec<u8>);

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

macro_rules! encode_ints {
    ($($t:ty)*) => {$(
        impl Encode for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
encode_ints!(u8 i8 u16 u32 u64);

impl Encode for bool {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
}

impl<T: Encode> Encode for Option<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        self.is_some().encode(out);
        if let Some(v) = self {
            v.encode(out);
        }
    }
}

impl<T: Encode, const N: usize> Encode for [T; N] {
    fn encode(&self, out: &mut Vec<u8>) {
        self.iter().for_each(|v| v.encode(out));
    }
}

impl<T: Encode> Encode for Vec<T> {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in self {
            true.encode(out);
            v.encode(out);
        }
        false.encode(out);
    }
}

/// Writes the discriminant that makes `arbitrary` pick variant `index` of `count`: it computes
/// `(u32 as u64 * count) >> 32`, so the smallest `u32` that lands on `index` is the ceiling of
/// `index * 2^32 / count`.
pub fn variant(index: u32, count: u32, out: &mut Vec<u8>) {
    assert!(index < count);
    let v = ((index as u64) << 32).div_ceil(count as u64) as u32;
    debug_assert_eq!((v as u64 * count as u64) >> 32, index as u64);
    v.encode(out);
}

/// `impl Encode` for a struct: its fields in declaration order.
#[macro_export]
macro_rules! encode_struct {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl $crate::encode::Encode for $t {
            fn encode(&self, out: &mut Vec<u8>) {
                $( $crate::encode::Encode::encode(&self.$f, out); )*
            }
        }
    };
}
