//! Typed access to the three parts of a split ring in shared memory (spec 2.7.5-2.7.8).
//!
//! Every field is an atomic in little-endian byte order, converted here. Accessors are Relaxed
//! unless their name says otherwise: callers order them with the `_acquire`/`_release` index
//! accessors or with explicit fences, each commented at the call site with what it pairs with.
//! Slot numbers are always masked by the caller, so slice indexing never fails.

use crate::sync::{AtomicU16, AtomicU32, AtomicU64};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;

use crate::layout::{self, RingAddresses, AVAIL_ALIGN, DESC_ALIGN, USED_ALIGN};
use crate::memory::SharedSlice;
use crate::{Error, GuestAddress, GuestMemory};

/// One descriptor as read from or written to the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

impl Desc {
    /// The second 8 bytes of a descriptor as one little-endian word: `len | flags << 32 |
    /// next << 48`.
    #[inline(always)]
    pub fn from_words(addr: u64, word: u64) -> Desc {
        let w = u64::from_le(word);
        Desc {
            addr: u64::from_le(addr),
            len: w as u32,
            flags: (w >> 32) as u16,
            next: (w >> 48) as u16,
        }
    }

    #[inline(always)]
    pub fn to_words(self) -> (u64, u64) {
        let w = self.len as u64 | (self.flags as u64) << 32 | (self.next as u64) << 48;
        (self.addr.to_le(), w.to_le())
    }
}

/// Checked, owned atomic views of one queue's descriptor table, avail ring and used ring.
#[derive(Debug)]
pub(crate) struct Rings {
    /// Two words per descriptor: `addr`, then `len | flags | next`.
    desc: SharedSlice<AtomicU64>,
    /// `flags, idx, ring[n], used_event`.
    avail: SharedSlice<AtomicU16>,
    /// The used ring as 16-bit words: `flags, idx, ...ring..., avail_event`.
    used: SharedSlice<AtomicU16>,
    /// The used ring's elements as 32-bit words from offset 4: `id, len` per element.
    used_elems: SharedSlice<AtomicU32>,
    size: u16,
}

fn ring_part<T: crate::memory::SharedAtomic>(
    mem: &Arc<GuestMemory>,
    what: &'static str,
    addr: GuestAddress,
    bytes: u64,
    align: u64,
    count: usize,
) -> Result<SharedSlice<T>, Error> {
    if !addr.0.is_multiple_of(align) {
        return Err(Error::Misaligned {
            what,
            addr: addr.0,
            align,
        });
    }
    if !mem.contains(addr, bytes) {
        return Err(Error::RingOutOfMemory {
            what,
            addr: addr.0,
            len: bytes,
        });
    }
    mem.shared_slice::<T>(addr, count).map_err(|e| match e {
        Error::Misaligned { addr, align, .. } => Error::Misaligned { what, addr, align },
        _ => Error::RingOutOfMemory {
            what,
            addr: addr.0,
            len: bytes,
        },
    })
}

impl Rings {
    pub fn new(mem: &Arc<GuestMemory>, size: u16, at: &RingAddresses) -> Result<Rings, Error> {
        let n = size as usize;
        let desc = ring_part(
            mem,
            "descriptor table",
            at.desc,
            layout::desc_table_size(size),
            DESC_ALIGN,
            2 * n,
        )?;
        let avail = ring_part(
            mem,
            "avail ring",
            at.avail,
            layout::avail_ring_size(size),
            AVAIL_ALIGN,
            3 + n,
        )?;
        let used = ring_part(
            mem,
            "used ring",
            at.used,
            layout::used_ring_size(size),
            USED_ALIGN,
            3 + 4 * n,
        )?;
        let elems_at = GuestAddress(at.used.0 + layout::used_ring_offset(0));
        let used_elems = ring_part(mem, "used ring", elems_at, 8 * n as u64, USED_ALIGN, 2 * n)?;
        Ok(Rings {
            desc,
            avail,
            used,
            used_elems,
            size,
        })
    }

    #[inline(always)]
    pub fn size(&self) -> u16 {
        self.size
    }

    // ---- Descriptor table.

    #[inline(always)]
    pub fn desc(&self, i: u16) -> Desc {
        let d = self.desc.as_slice();
        let i = i as usize * 2;
        Desc::from_words(d[i].load(Relaxed), d[i + 1].load(Relaxed))
    }

    /// Asks for the cache line of descriptor `i` (see [`crate::memory::prefetch_value`]); an
    /// `i` out of the table does nothing.
    #[inline(always)]
    pub fn prefetch_desc(&self, i: u16) {
        if let Some(d) = self.desc.as_slice().get(i as usize * 2) {
            crate::memory::prefetch_value(d);
        }
    }

    #[inline(always)]
    pub fn set_desc(&self, i: u16, desc: Desc) {
        let d = self.desc.as_slice();
        let (a, w) = desc.to_words();
        let i = i as usize * 2;
        d[i].store(a, Relaxed);
        d[i + 1].store(w, Relaxed);
    }

    /// Like [`Rings::set_desc`], but leaves a descriptor that already holds `desc` untouched:
    /// a buffer posted again in the same slot (rx refills, reused tx buffers) then costs the
    /// device no cache-line transfer, because the line stays shared instead of dirtied.
    #[inline(always)]
    pub fn update_desc(&self, i: u16, desc: Desc) {
        let d = self.desc.as_slice();
        let (a, w) = desc.to_words();
        let i = i as usize * 2;
        if d[i].load(Relaxed) != a || d[i + 1].load(Relaxed) != w {
            d[i].store(a, Relaxed);
            d[i + 1].store(w, Relaxed);
        }
    }

    // ---- Avail ring: written by the driver, read by the device.

    #[inline(always)]
    pub fn avail_flags(&self) -> u16 {
        u16::from_le(self.avail.as_slice()[0].load(Relaxed))
    }
    #[inline(always)]
    pub fn set_avail_flags(&self, v: u16) {
        self.avail.as_slice()[0].store(v.to_le(), Relaxed)
    }
    #[inline(always)]
    pub fn avail_idx_acquire(&self) -> u16 {
        u16::from_le(self.avail.as_slice()[1].load(Acquire))
    }
    #[inline(always)]
    pub fn set_avail_idx_release(&self, v: u16) {
        self.avail.as_slice()[1].store(v.to_le(), Release)
    }
    #[inline(always)]
    pub fn avail_entry(&self, slot: u16) -> u16 {
        u16::from_le(self.avail.as_slice()[2 + slot as usize].load(Relaxed))
    }
    /// Like [`Rings::update_desc`], leaves an entry that already holds `head` untouched (a
    /// driver that posts its descriptors in the same order every lap).
    #[inline(always)]
    pub fn set_avail_entry(&self, slot: u16, head: u16) {
        let e = &self.avail.as_slice()[2 + slot as usize];
        if e.load(Relaxed) != head.to_le() {
            e.store(head.to_le(), Relaxed)
        }
    }
    /// `used_event`, at `avail->ring[n]`.
    #[inline(always)]
    pub fn used_event(&self) -> u16 {
        u16::from_le(self.avail.as_slice()[2 + self.size as usize].load(Relaxed))
    }
    #[inline(always)]
    pub fn set_used_event(&self, v: u16) {
        self.avail.as_slice()[2 + self.size as usize].store(v.to_le(), Relaxed)
    }

    // ---- Used ring: written by the device, read by the driver.

    #[inline(always)]
    pub fn used_flags(&self) -> u16 {
        u16::from_le(self.used.as_slice()[0].load(Relaxed))
    }
    #[inline(always)]
    pub fn set_used_flags(&self, v: u16) {
        self.used.as_slice()[0].store(v.to_le(), Relaxed)
    }
    #[inline(always)]
    pub fn used_idx_acquire(&self) -> u16 {
        u16::from_le(self.used.as_slice()[1].load(Acquire))
    }
    #[inline(always)]
    pub fn used_idx_relaxed(&self) -> u16 {
        u16::from_le(self.used.as_slice()[1].load(Relaxed))
    }
    #[inline(always)]
    pub fn set_used_idx_release(&self, v: u16) {
        self.used.as_slice()[1].store(v.to_le(), Release)
    }
    #[inline(always)]
    pub fn used_elem(&self, slot: u16) -> (u32, u32) {
        let e = self.used_elems.as_slice();
        let i = slot as usize * 2;
        (
            u32::from_le(e[i].load(Relaxed)),
            u32::from_le(e[i + 1].load(Relaxed)),
        )
    }
    /// Asks for the cache line of used element `slot`, for writing; a slot out of the ring does
    /// nothing.
    #[inline(always)]
    pub fn prefetch_used_elem(&self, slot: u16) {
        if let Some(e) = self.used_elems.as_slice().get(slot as usize * 2) {
            crate::memory::prefetch_value_for_write(e);
        }
    }
    #[inline(always)]
    pub fn set_used_elem(&self, slot: u16, id: u32, len: u32) {
        let e = self.used_elems.as_slice();
        let i = slot as usize * 2;
        e[i].store(id.to_le(), Relaxed);
        e[i + 1].store(len.to_le(), Relaxed);
    }
    /// `avail_event`, at `used->ring[n]`.
    #[inline(always)]
    pub fn avail_event(&self) -> u16 {
        u16::from_le(self.used.as_slice()[2 + 4 * self.size as usize].load(Relaxed))
    }
    #[inline(always)]
    pub fn set_avail_event(&self, v: u16) {
        self.used.as_slice()[2 + 4 * self.size as usize].store(v.to_le(), Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_at_the_spec_offsets() {
        let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), 1 << 16)]).unwrap());
        let n = 8u16;
        let at = RingAddresses::contiguous(GuestAddress(0x100), n);
        let r = Rings::new(&mem, n, &at).unwrap();
        let rd16 = |a: u64| {
            let mut b = [0u8; 2];
            mem.read(GuestAddress(a), &mut b).unwrap();
            u16::from_le_bytes(b)
        };
        let rd32 = |a: u64| {
            let mut b = [0u8; 4];
            mem.read(GuestAddress(a), &mut b).unwrap();
            u32::from_le_bytes(b)
        };
        r.set_desc(
            3,
            Desc {
                addr: 0x1122_3344_5566_7788,
                len: 0xaabbccdd,
                flags: 7,
                next: 5,
            },
        );
        let mut d = [0u8; 16];
        mem.read(GuestAddress(at.desc.0 + 3 * 16), &mut d).unwrap();
        assert_eq!(
            u64::from_le_bytes(d[0..8].try_into().unwrap()),
            0x1122_3344_5566_7788
        );
        assert_eq!(u32::from_le_bytes(d[8..12].try_into().unwrap()), 0xaabbccdd);
        assert_eq!(u16::from_le_bytes(d[12..14].try_into().unwrap()), 7);
        assert_eq!(u16::from_le_bytes(d[14..16].try_into().unwrap()), 5);
        r.set_avail_flags(1);
        r.set_avail_idx_release(0x1234);
        r.set_avail_entry(2, 6);
        r.set_used_event(0x4321);
        assert_eq!((rd16(at.avail.0), rd16(at.avail.0 + 2)), (1, 0x1234));
        assert_eq!(rd16(at.avail.0 + layout::avail_ring_offset(2)), 6);
        assert_eq!(rd16(at.avail.0 + layout::avail_ring_offset(n)), 0x4321);
        r.set_used_flags(1);
        r.set_used_idx_release(0x5678);
        r.set_used_elem(7, 0xdead, 0xbeef);
        r.set_avail_event(0x8765);
        assert_eq!((rd16(at.used.0), rd16(at.used.0 + 2)), (1, 0x5678));
        assert_eq!(rd32(at.used.0 + layout::used_ring_offset(7)), 0xdead);
        assert_eq!(rd32(at.used.0 + layout::used_ring_offset(7) + 4), 0xbeef);
        assert_eq!(rd16(at.used.0 + layout::used_ring_offset(n)), 0x8765);
        assert_eq!(r.desc(3).next, 5);
        assert_eq!(r.used_elem(7), (0xdead, 0xbeef));
    }

    #[test]
    fn misplaced_rings_are_refused_with_the_part_named() {
        let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), 4096)]).unwrap());
        let mut at = RingAddresses::contiguous(GuestAddress(0), 16);
        at.desc = GuestAddress(8);
        let e = Rings::new(&mem, 16, &at).unwrap_err();
        assert_eq!(
            e,
            Error::Misaligned {
                what: "descriptor table",
                addr: 8,
                align: 16
            }
        );
        let mut at = RingAddresses::contiguous(GuestAddress(0), 16);
        at.used = GuestAddress(4096 - 8);
        let e = Rings::new(&mem, 16, &at).unwrap_err();
        assert!(matches!(
            e,
            Error::RingOutOfMemory {
                what: "used ring",
                ..
            }
        ));
        let mut at = RingAddresses::contiguous(GuestAddress(0), 16);
        at.avail = GuestAddress(0x301);
        let e = Rings::new(&mem, 16, &at).unwrap_err();
        assert!(matches!(
            e,
            Error::Misaligned {
                what: "avail ring",
                ..
            }
        ));
    }
}
