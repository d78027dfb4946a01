//! Raw ring contents, as a peer leaves them in memory: descriptors whose addresses are steered
//! towards the interesting places (the data area, its end, region 1, the indirect area) but may
//! be any 64-bit number, and the avail and used rings field by field.

use arbitrary::Arbitrary;
use vring::GuestMemory;

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::mem::{poke, poke16, DATA, DEV_INDIRECT, REGION1};

/// A descriptor's buffer address.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addr {
    /// `DATA + offset`: inside region 0 for any offset, so only the length decides.
    Data(u16),
    /// `REGION1 + offset`: region 1 is 4 KiB, so most offsets fall outside memory.
    Region1(u16),
    /// `DEV_INDIRECT + offset`: where the device target's indirect tables are.
    Indirect(u16),
    Raw(u64),
}

impl Addr {
    pub fn guest(self) -> u64 {
        match self {
            Addr::Data(o) => DATA + o as u64,
            Addr::Region1(o) => REGION1.0 + o as u64,
            Addr::Indirect(o) => DEV_INDIRECT + o as u64,
            Addr::Raw(a) => a,
        }
    }
}

impl Encode for Addr {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Addr::Data(o) => (variant(0, 4, out), o.encode(out)),
            Addr::Region1(o) => (variant(1, 4, out), o.encode(out)),
            Addr::Indirect(o) => (variant(2, 4, out), o.encode(out)),
            Addr::Raw(a) => (variant(3, 4, out), a.encode(out)),
        };
    }
}

/// A descriptor's length: small ones make valid chains, raw ones find the edges.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Len {
    Small(u8),
    Medium(u16),
    Raw(u32),
}

impl Len {
    pub fn get(self) -> u32 {
        match self {
            Len::Small(l) => l as u32,
            Len::Medium(l) => l as u32,
            Len::Raw(l) => l,
        }
    }
}

impl Encode for Len {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Len::Small(l) => (variant(0, 3, out), l.encode(out)),
            Len::Medium(l) => (variant(1, 3, out), l.encode(out)),
            Len::Raw(l) => (variant(2, 3, out), l.encode(out)),
        };
    }
}

/// One descriptor, as the hostile driver writes it. `flags` and `next` are raw.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawDesc {
    pub addr: Addr,
    pub len: Len,
    pub flags: u16,
    pub next: u16,
}
encode_struct!(RawDesc {
    addr,
    len,
    flags,
    next
});

impl RawDesc {
    pub fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.addr.guest().to_le_bytes());
        b[8..12].copy_from_slice(&self.len.get().to_le_bytes());
        b[12..14].copy_from_slice(&self.flags.to_le_bytes());
        b[14..16].copy_from_slice(&self.next.to_le_bytes());
        b
    }

    pub fn write(&self, mem: &GuestMemory, at: u64) {
        poke(mem, at, &self.bytes());
    }
}

/// The avail ring: `flags, idx, ring[size], used_event`. Entries past the queue size are
/// ignored; missing ones stay zero.
#[derive(Arbitrary, Clone, Debug, Default, PartialEq, Eq)]
pub struct AvailRing {
    pub flags: u16,
    pub idx: u16,
    pub ring: Vec<u16>,
    pub used_event: u16,
}
encode_struct!(AvailRing {
    flags,
    idx,
    ring,
    used_event
});

impl AvailRing {
    pub fn write(&self, mem: &GuestMemory, at: u64, size: u16) {
        poke16(mem, at, self.flags);
        poke16(mem, at + 2, self.idx);
        for (i, h) in self.ring.iter().take(size as usize).enumerate() {
            poke16(mem, at + 4 + 2 * i as u64, *h);
        }
        poke16(mem, at + 4 + 2 * size as u64, self.used_event);
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsedElem {
    pub id: u32,
    pub len: u32,
}
encode_struct!(UsedElem { id, len });

/// The used ring: `flags, idx, ring[size], avail_event`.
#[derive(Arbitrary, Clone, Debug, Default, PartialEq, Eq)]
pub struct UsedRing {
    pub flags: u16,
    pub idx: u16,
    pub elems: Vec<UsedElem>,
    pub avail_event: u16,
}
encode_struct!(UsedRing {
    flags,
    idx,
    elems,
    avail_event
});

impl UsedRing {
    pub fn write(&self, mem: &GuestMemory, at: u64, size: u16) {
        poke16(mem, at, self.flags);
        poke16(mem, at + 2, self.idx);
        for (i, e) in self.elems.iter().take(size as usize).enumerate() {
            write_used_elem(mem, at, i as u16, e.id, e.len);
        }
        poke16(mem, at + 4 + 8 * size as u64, self.avail_event);
    }
}

pub fn write_used_elem(mem: &GuestMemory, used: u64, slot: u16, id: u32, len: u32) {
    let at = used + 4 + 8 * slot as u64;
    poke(mem, at, &id.to_le_bytes());
    poke(mem, at + 4, &len.to_le_bytes());
}

/// Raw bytes written anywhere in region 0 (`offset` wraps at its end).
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Scribble {
    pub offset: u32,
    pub bytes: Vec<u8>,
}
encode_struct!(Scribble { offset, bytes });

impl Scribble {
    pub fn write(&self, mem: &GuestMemory) {
        poke(mem, self.offset as u64 % crate::mem::REGION0.1, &self.bytes);
    }
}
