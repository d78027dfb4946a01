//! Descriptor chains as the device sees them: walking and validating a chain from its head
//! (spec 2.7.5 and 2.7.5.3, indirect descriptors).
//!
//! Every number read from the table is hostile until checked here: indices against the table
//! size, lengths against memory, the walk against loops. A malformed chain is an error, never
//! a shorter chain.

use std::sync::atomic::Ordering::Relaxed;

use crate::sync::AtomicU64;

use crate::layout::{DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE, DESC_SIZE};
use crate::ring::{Desc, Rings};
use crate::{Error, GuestAddress, GuestMemory};

/// The most segments a chain may have, direct and indirect together: Linux's `UIO_MAXIOV`,
/// which bounds vhost's chains too. A longer chain breaks the queue, as in vhost; it bounds
/// the memory a chain takes whatever the guest writes.
pub const MAX_CHAIN_SEGMENTS: usize = 1024;

/// One buffer of a chain, checked to lie inside guest memory when the chain was popped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A validated descriptor chain: device-readable segments first, then device-writable ones.
///
/// A `Chain` may be reused across pops (`DeviceQueue::pop_into`) to avoid allocating.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    head: u16,
    segments: Vec<Segment>,
    readable: usize,
    readable_len: u64,
    writable_len: u64,
}

impl Chain {
    pub fn new() -> Chain {
        Chain::default()
    }

    /// The head index, to hand back with `DeviceQueue::add_used`.
    #[inline]
    pub fn head(&self) -> u16 {
        self.head
    }
    /// The device-readable (driver to device) segments.
    #[inline]
    pub fn readable(&self) -> &[Segment] {
        &self.segments[..self.readable]
    }
    /// The device-writable (device to driver) segments.
    #[inline]
    pub fn writable(&self) -> &[Segment] {
        &self.segments[self.readable..]
    }
    #[inline]
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }
    /// Segments the chain can hold without allocating (what reusing it keeps).
    pub fn capacity(&self) -> usize {
        self.segments.capacity()
    }
    /// Empties the chain and gives back memory above `segments` segments (a chain reused
    /// across pops keeps room for its longest).
    pub fn clear_and_shrink(&mut self, segments: usize) {
        *self = Chain {
            segments: std::mem::take(&mut self.segments),
            ..Chain::default()
        };
        self.segments.clear();
        self.segments.shrink_to(segments);
    }
    #[inline]
    pub fn readable_len(&self) -> u64 {
        self.readable_len
    }
    #[inline]
    pub fn writable_len(&self) -> u64 {
        self.writable_len
    }

    #[inline(always)]
    fn push(&mut self, index: u16, d: Desc, mem: &GuestMemory) -> Result<(), Error> {
        let addr = GuestAddress(d.addr);
        if !mem.contains(addr, d.len as u64) {
            return Err(Error::BufferOutOfMemory {
                index,
                addr: d.addr,
                len: d.len,
            });
        }
        if self.segments.len() >= MAX_CHAIN_SEGMENTS {
            return Err(Error::ChainTooLong {
                head: self.head,
                max: MAX_CHAIN_SEGMENTS,
            });
        }
        if d.flags & DESC_F_WRITE != 0 {
            self.writable_len += d.len as u64;
        } else {
            if self.segments.len() != self.readable {
                return Err(Error::ReadableAfterWritable { index });
            }
            self.readable += 1;
            self.readable_len += d.len as u64;
        }
        self.segments.push(Segment { addr, len: d.len });
        Ok(())
    }

    /// Walks and validates the chain starting at `head` (already checked < size) into `self`.
    /// Inlined into `pop_into`, and so into its callers: as a call it cost a third of the
    /// device side's instructions per 1-descriptor chain (register saves, the `Result` through
    /// memory; callgrind), and LLVM stopped inlining it once `pop_into` itself was inlined
    /// (26 instructions more a pop in the switch's bench).
    #[inline(always)]
    pub(crate) fn walk(
        &mut self,
        rings: &Rings,
        mem: &GuestMemory,
        indirect_ok: bool,
        head: u16,
    ) -> Result<(), Error> {
        self.head = head;
        self.segments.clear();
        self.readable = 0;
        self.readable_len = 0;
        self.writable_len = 0;
        let size = rings.size();
        let mut index = head;
        // A chain visits at most `size` descriptors; one more means a loop.
        for _ in 0..size {
            let d = rings.desc(index);
            if d.flags & DESC_F_INDIRECT != 0 {
                if !indirect_ok {
                    return Err(Error::IndirectNotNegotiated { index });
                }
                if d.flags & DESC_F_NEXT != 0 {
                    return Err(Error::IndirectWithNext { index });
                }
                return self.walk_indirect(mem, size, index, d);
            }
            self.push(index, d, mem)?;
            if d.flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            if d.next >= size {
                return Err(Error::NextOutOfRange {
                    index,
                    next: d.next,
                    size: size as u32,
                });
            }
            index = d.next;
        }
        Err(Error::ChainLoop {
            head,
            max: size as u32,
        })
    }

    /// Walks the indirect table that descriptor `index` points at (spec 2.7.5.3).
    fn walk_indirect(
        &mut self,
        mem: &GuestMemory,
        size: u16,
        index: u16,
        d: Desc,
    ) -> Result<(), Error> {
        if d.len == 0 || !(d.len as u64).is_multiple_of(DESC_SIZE) {
            return Err(Error::IndirectBadLength { index, len: d.len });
        }
        let entries = d.len / DESC_SIZE as u32;
        if entries > size as u32 {
            return Err(Error::IndirectTooLarge {
                index,
                entries,
                max: size as u32,
            });
        }
        let table = GuestAddress(d.addr);
        if !mem.contains(table, d.len as u64) {
            return Err(Error::IndirectOutOfMemory {
                index,
                addr: d.addr,
                len: d.len,
            });
        }
        // Drivers allocate tables 8-aligned or better; read those as atomics in place, and
        // copy out the rare unaligned one entry by entry.
        let aligned = mem
            .atomic_slice::<AtomicU64>(table, 2 * entries as usize)
            .ok();
        let read = |i: u32| -> Result<Desc, Error> {
            match aligned {
                Some(words) => {
                    let i = 2 * i as usize;
                    Ok(Desc::from_words(
                        words[i].load(Relaxed),
                        words[i + 1].load(Relaxed),
                    ))
                }
                None => {
                    let mut b = [0u8; 16];
                    mem.read(GuestAddress(d.addr + i as u64 * DESC_SIZE), &mut b)?;
                    let w = |r: std::ops::Range<usize>| {
                        let mut x = [0u8; 8];
                        x.copy_from_slice(&b[r]);
                        u64::from_ne_bytes(x)
                    };
                    Ok(Desc::from_words(w(0..8), w(8..16)))
                }
            }
        };
        let mut i = 0u32;
        for _ in 0..entries {
            let e = read(i)?;
            if e.flags & DESC_F_INDIRECT != 0 {
                return Err(Error::NestedIndirect { index: i as u16 });
            }
            self.push(i as u16, e, mem)?;
            if e.flags & DESC_F_NEXT == 0 {
                return Ok(());
            }
            if e.next as u32 >= entries {
                return Err(Error::NextOutOfRange {
                    index: i as u16,
                    next: e.next,
                    size: entries,
                });
            }
            i = e.next as u32;
        }
        Err(Error::ChainLoop {
            head: self.head,
            max: entries,
        })
    }
}
