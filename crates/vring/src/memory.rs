//! Guest memory: the regions that a virtqueue's rings and buffers live in, the same shape as a
//! vhost-user memory table, with bounds-checked translation from guest addresses to host memory.
//!
//! This is the only module of the crate with `unsafe`. It hands out atomics over checked,
//! aligned, mapped addresses, copies payload bytes, and does vectored I/O between payload bytes
//! and a file descriptor; everything above it is safe code, and no raw pointer into guest memory
//! leaves this module. The mappings themselves are made by `vm-memory`'s `MmapRegion`.
//!
//! Every byte behind these mappings may be written by the peer at any moment, so the rings are
//! only ever accessed through atomics, and payload bytes only by copying them out or in (here,
//! or by the kernel in `readv`/`writev`).

#[cfg(loom)]
use std::sync::Arc;

use crate::Error;

/// The most regions a memory may have: what a vhost-user backend answers to
/// GET_MAX_MEM_SLOTS. 509 is libvhost-user's `VHOST_USER_MAX_RAM_SLOTS` and KVM's usable
/// memslots on x86, more than QEMU 7.2 uses (it caps at 256 on x86), so a backend with this
/// limit is never the device that stops a guest from hotplugging memory.
pub const MAX_REGIONS: usize = 509;

/// Up to this many regions, translation scans them in order; above, it searches.
const LINEAR_LOOKUP: usize = 8;

/// The CPU's cache line, as the prefetches walk memory and [`GuestMemory::update_array_then`]
/// tells a head alone at the end of its line (x86-64's, and most Arm cores').
const LINE: usize = 64;

/// An address in the guest's physical address space: what descriptors and ring addresses hold.
/// It is not a host pointer; only [`GuestMemory`] turns it into one, after checking it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuestAddress(pub u64);

impl GuestAddress {
    /// `self + offset`, or `None` when it overflows.
    pub fn checked_add(self, offset: u64) -> Option<GuestAddress> {
        self.0.checked_add(offset).map(GuestAddress)
    }
}

/// A checked span of host memory: `len` bytes at `ptr` lie inside one mapped region of the
/// memory that produced it. Private, so that no code outside this module holds a raw pointer
/// into guest memory, nor one that outlives the borrow of the memory.
#[derive(Clone, Copy, Debug)]
struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

/// A set of non-overlapping guest memory regions, each mapped into this process.
#[derive(Debug)]
pub struct GuestMemory {
    /// Sorted by guest address; never empty.
    regions: Vec<Region>,
    /// Under loom, the atomic views live here instead of in the mapping (loom's atomics are
    /// objects of their own): one storage per (address, element size, count), shared by every
    /// view of the same ring part, created from the memory's bytes on first use and kept for
    /// the memory's life.
    #[cfg(loom)]
    loom_views: LoomViews,
}

#[cfg(loom)]
#[derive(Default)]
struct LoomViews(std::sync::Mutex<Vec<(u64, usize, usize, Arc<dyn std::any::Any + Send + Sync>)>>);

#[cfg(loom)]
impl std::fmt::Debug for LoomViews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoomViews")
    }
}

// SAFETY: the raw `host` pointers point into mappings owned by the same `Region`; they are only
// dereferenced through atomics or copies, which are valid from any thread. `MmapRegion` itself is
// Send + Sync.
unsafe impl Send for GuestMemory {}
// SAFETY: as above; no method takes `&self` and mutates Rust-visible state.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// Whether the peer shrank a file under one of the regions, so that its memory was
    /// replaced (see `memory/fault.rs`): nothing in it is shared with the peer any more.
    pub fn faulted(&self) -> bool {
        self.regions
            .iter()
            .any(|r| r.mapping.fault.as_ref().is_some_and(|f| f.faulted()))
    }

    /// The regions, for sharing them with a peer.
    pub fn regions(&self) -> impl Iterator<Item = RegionInfo<'_>> {
        self.regions.iter().map(|r| RegionInfo {
            guest_addr: GuestAddress(r.guest),
            size: r.len,
            user_addr: r.user_addr,
            host_addr: r.host.as_ptr() as u64,
            file: r.mapping.mmap.file_offset().map(|f| f.file()),
            file_offset: r.mapping.mmap.file_offset().map_or(0, |f| f.start()),
        })
    }

    /// Translates a frontend virtual address (vhost-user ring addresses) to a guest address.
    pub fn user_to_guest(&self, user_addr: u64) -> Option<GuestAddress> {
        self.regions
            .iter()
            .find(|r| user_addr.wrapping_sub(r.user_addr) < r.len)
            .map(|r| GuestAddress(r.guest + (user_addr - r.user_addr)))
    }

    /// The region holding `[addr, addr + len)` entirely, and the offset of `addr` in it.
    #[inline]
    fn find(&self, addr: GuestAddress, len: u64) -> Option<(&Region, usize)> {
        // Few regions (QEMU sends 1-3): a linear scan beats a binary search. Hotplugged
        // memory can bring hundreds (MAX_REGIONS), sorted by guest address.
        let r = if let [r] = &self.regions[..] {
            // One region (DPDK's virtio-user without hugepages, as testpmd's guests here; a
            // guest whose RAM is one piece): no loop, 24 instructions a frame fewer in the
            // switch's bench (callgrind).
            if addr.0.wrapping_sub(r.guest) >= r.len {
                return None;
            }
            r
        } else if self.regions.len() <= LINEAR_LOOKUP {
            self.regions
                .iter()
                .find(|r| addr.0.wrapping_sub(r.guest) < r.len)?
        } else {
            let i = self.regions.partition_point(|r| r.guest <= addr.0);
            let r = &self.regions[i.checked_sub(1)?];
            if addr.0 - r.guest >= r.len {
                return None;
            }
            r
        };
        let off = addr.0 - r.guest;
        (len <= r.len - off).then_some((r, off as usize))
    }

    /// Whether `[addr, addr + len)` lies inside one region. A zero-length range must still
    /// start inside memory.
    #[inline]
    pub fn contains(&self, addr: GuestAddress, len: u64) -> bool {
        self.find(addr, len).is_some()
    }

    /// The host span of `[addr, addr + len)`, which must lie inside one region.
    #[inline]
    fn host_span(&self, addr: GuestAddress, len: usize) -> Result<HostSpan, Error> {
        let (r, off) = self
            .find(addr, len as u64)
            .ok_or_else(|| out_of_range(addr, len))?;
        Ok(HostSpan {
            ptr: r.host.as_ptr().wrapping_add(off),
            len,
        })
    }

    /// Copies `buf.len()` bytes of guest memory at `addr` into `buf`.
    #[inline]
    pub fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), Error> {
        let span = self.host_span(addr, buf.len())?;
        // SAFETY: `host_span` checked that the span lies inside a live mapping of `self`; `buf`
        // is a Rust allocation, never guest memory, so the two do not overlap. The peer may
        // write the source concurrently: the bytes are then garbage, which callers validate.
        unsafe { std::ptr::copy_nonoverlapping(span.ptr, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Hints the CPU to fetch the cache lines of `[addr, addr + len)` for writing (x86's
    /// PREFETCHW: the line arrives owned, so the store that follows needs no second transfer
    /// to take it from the peer's cache), so that a burst of copies into buffers the peer last
    /// touched waits for their transfers in parallel instead of one after another. Does
    /// nothing outside memory or off x86-64, nor on the rare x86-64 CPUs without PREFETCHW,
    /// where the instruction is a no-op.
    #[inline]
    pub fn prefetch_write(&self, addr: GuestAddress, len: usize) {
        self.prefetch::<true>(addr, len)
    }

    /// Like [`GuestMemory::prefetch_write`], for data about to be read.
    #[inline]
    pub fn prefetch_read(&self, addr: GuestAddress, len: usize) {
        self.prefetch::<false>(addr, len)
    }

    /// Prefetches `[addr, addr + len)` for [`GuestMemory::update_array_then`] with an
    /// `n`-byte head: as [`GuestMemory::prefetch_write`], but the head's line for reading when
    /// the head ends it. Owned, that line would leave the peer's cache whether or not the head
    /// is stored.
    #[inline]
    pub fn prefetch_update(&self, addr: GuestAddress, n: usize, len: usize) {
        let Some((r, off)) = self.find(addr, len as u64) else {
            return;
        };
        let start = r.host.as_ptr().wrapping_add(off);
        if n <= len && head_ends_line(start, n) {
            prefetch_lines::<false>(start, n);
            prefetch_lines::<true>(start.wrapping_add(n), len - n);
        } else {
            prefetch_lines::<true>(start, len);
        }
    }

    #[inline]
    fn prefetch<const WRITE: bool>(&self, addr: GuestAddress, len: usize) {
        if let Some((r, off)) = self.find(addr, len as u64) {
            prefetch_lines::<WRITE>(r.host.as_ptr().wrapping_add(off), len);
        }
    }

    /// Copies `len` bytes at `src` of this memory to `dst` of `to` (another guest's memory, or
    /// this one): the one copy of a frame forwarded from one guest's buffers into another's.
    /// The two ranges may overlap (two memories may map the same file).
    pub fn copy_to(
        &self,
        src: GuestAddress,
        to: &GuestMemory,
        dst: GuestAddress,
        len: usize,
    ) -> Result<(), Error> {
        let from = self.host_span(src, len)?;
        let into = to.host_span(dst, len)?;
        // SAFETY: `host_span` checked that each span lies inside a live mapping of its memory,
        // which the borrows keep alive for the call. `ptr::copy` allows the spans to overlap.
        // The peers may write either meanwhile: the copy then holds whatever was there, which
        // callers treat as payload.
        unsafe { std::ptr::copy(from.ptr, into.ptr, len) };
        Ok(())
    }

    /// Copies `buf` into guest memory at `addr`.
    #[inline]
    pub fn write(&self, addr: GuestAddress, buf: &[u8]) -> Result<(), Error> {
        let span = self.host_span(addr, buf.len())?;
        // SAFETY: as in `read`, with the direction reversed.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), span.ptr, buf.len()) };
        Ok(())
    }

    /// Stores `bytes` into guest memory at `addr` with fixed-size stores: a value built in
    /// registers (a header) goes out from them, where a copy through a slice would reload it
    /// from the stack, each load waiting for the narrow stores it spans to complete.
    #[inline]
    pub fn write_array<const N: usize>(
        &self,
        addr: GuestAddress,
        bytes: [u8; N],
    ) -> Result<(), Error> {
        let span = self.host_span(addr, N)?;
        // SAFETY: `host_span` checked that the N bytes lie inside a live mapping of `self`;
        // the store is unaligned, and the peer may read or write them concurrently (then it
        // sees, or leaves, garbage, as with `write`).
        unsafe { std::ptr::write_unaligned(span.ptr.cast::<[u8; N]>(), bytes) };
        Ok(())
    }

    /// Stores `head` (out of registers, as [`GuestMemory::write_array`]) and then `buf` right
    /// after it, at `addr`: a frame's header and first bytes into one buffer, translated once.
    ///
    /// A head that ends its cache line is first compared with what the memory holds, and left
    /// unwritten when the same (as [`crate::DriverQueue`] leaves a descriptor or avail entry
    /// that holds its value). That is a receive header in a buffer the driver recycles:
    /// DPDK's virtio PMD receives into mbufs whose headroom still holds the header of the last
    /// frame they carried (its transmit leaves fields that hold their value unwritten too),
    /// and the header ends the line at which the frame's 128-byte-aligned data starts. The
    /// line then stays in the driver's cache, where its receive reads the header next,
    /// instead of going over to the device's and back. The memory ends up holding the same
    /// bytes either way (a peer that writes them meanwhile sees its own bytes, as it would
    /// after a store).
    #[inline]
    pub fn update_array_then<const N: usize>(
        &self,
        addr: GuestAddress,
        head: [u8; N],
        buf: &[u8],
    ) -> Result<(), Error> {
        let span = self.host_span(addr, N + buf.len())?;
        let at = span.ptr.cast::<[u8; N]>();
        // SAFETY: `host_span` checked that the N + buf.len() bytes lie inside a live mapping of
        // `self`; the load and the store are unaligned. The peer may read or write them
        // concurrently, as with `read` and `write`: what the load sees only decides whether
        // to store.
        let same = head_ends_line(span.ptr, N) && unsafe { std::ptr::read_unaligned(at) } == head;
        if !same {
            // SAFETY: as above.
            unsafe { std::ptr::write_unaligned(at, head) };
        }
        // SAFETY: the rest of the span checked above; `buf` is a Rust allocation, never guest
        // memory, so it does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), span.ptr.wrapping_add(N), buf.len()) };
        Ok(())
    }
}

/// Hints the CPU to fetch the cache line holding `v` for writing (as
/// [`GuestMemory::prefetch_write`]): a ring line the device is about to store into, which the
/// driver's CPU last read. Does nothing off x86-64.
#[inline(always)]
pub(crate) fn prefetch_value_for_write<T>(v: &T) {
    #[cfg(target_arch = "x86_64")]
    prefetchw(v as *const T as *const i8);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

/// Whether `n` bytes at `p` end a cache line (and do not fill it).
#[inline(always)]
fn head_ends_line(p: *const u8, n: usize) -> bool {
    n < LINE && (p as usize).wrapping_add(n).is_multiple_of(LINE)
}

/// Prefetches the lines of `[start, start + len)`, for writing or reading. A hint: it
/// dereferences nothing, whatever the pointer.
#[inline(always)]
fn prefetch_lines<const WRITE: bool>(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let skew = start as usize % LINE;
        let mut line = start.wrapping_sub(skew);
        let end = start.wrapping_add(len);
        while line < end {
            let p = line as *const i8;
            line = line.wrapping_add(LINE);
            if WRITE {
                prefetchw(p);
            } else {
                prefetchr(p);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len);
}

/// PREFETCHT0 of the line holding `p`: for reading, into every cache level.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetchr(p: *const i8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: a prefetch is a hint that never faults nor changes memory, whatever `p` is.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p) }
}

/// PREFETCHW of the line holding `p`. `_mm_prefetch::<_MM_HINT_ET0>` compiles to PREFETCHT0,
/// a read prefetch, unless the whole build enables the `prfchw` target feature: hence asm.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetchw(p: *const i8) {
    // SAFETY: a prefetch is a hint that never faults nor changes memory, whatever `p` is.
    unsafe {
        std::arch::asm!(
            "prefetchw [{}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        )
    }
}

/// Hints the CPU to fetch the cache line holding `v` for reading (the ring's own prefetches:
/// a descriptor the driver's CPU last wrote). Does nothing off x86-64.
#[inline(always)]
pub(crate) fn prefetch_value<T>(v: &T) {
    #[cfg(target_arch = "x86_64")]
    prefetchr(v as *const T as *const i8);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

fn out_of_range(addr: GuestAddress, len: usize) -> Error {
    Error::AddressOutOfRange {
        addr: addr.0,
        len: len as u64,
    }
}

mod atomic;
mod dirty;
mod fault;
mod region;
mod uring;
mod vectored;

pub use atomic::SharedAtomic;
pub(crate) use atomic::SharedSlice;
pub use dirty::{DirtyLog, LOG_PAGE};
pub use fault::fault_count;
use region::Region;
pub use region::{RegionInfo, RegionSource};
pub use uring::{FrameResult, UringWriter, MAX_BATCH as MAX_URING_BATCH};
pub use vectored::MAX_IOVECS;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::{AtomicU16, AtomicU32};
    use std::sync::atomic::Ordering;

    #[test]
    fn an_array_then_a_slice_go_in_one_after_the_other_inside_one_region_only() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 4096), (GuestAddress(0x10000), 4096)])
            .unwrap();
        mem.update_array_then(GuestAddress(4090), *b"ab", b"cdef")
            .unwrap();
        let mut back = [0u8; 6];
        mem.read(GuestAddress(4090), &mut back).unwrap();
        assert_eq!(&back, b"abcdef");
        // One byte past the region's end, or a slice that would: refused, nothing written.
        assert!(mem
            .update_array_then(GuestAddress(4091), *b"xy", b"zzzz")
            .is_err());
        assert!(mem
            .update_array_then(GuestAddress(4095), *b"xy", b"")
            .is_err());
        mem.read(GuestAddress(4090), &mut back).unwrap();
        assert_eq!(&back, b"abcdef");
    }

    /// A head that ends its cache line and is there already is not stored: its page made
    /// read-only, the update goes through (a store would fault) and writes the bytes after it
    /// on the next page. A different head there is stored, and so are the bytes of a head
    /// that does not end its line.
    #[test]
    fn a_head_at_the_end_of_its_line_that_is_there_already_is_not_stored() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 8192)]).unwrap();
        let head = *b"header:12byt";
        mem.write(GuestAddress(4096 - 12), &head).unwrap();
        let page = mem.host_span(GuestAddress(0), 4096).unwrap().ptr;
        // SAFETY: the first page of the anonymous mapping `mem` owns; made writable again
        // below, before anything else stores into it.
        let protect = |prot| unsafe { libc::mprotect(page.cast(), 4096, prot) };
        assert_eq!(protect(libc::PROT_READ), 0);
        mem.update_array_then(GuestAddress(4096 - 12), head, b"then")
            .unwrap();
        assert_eq!(protect(libc::PROT_READ | libc::PROT_WRITE), 0);
        let mut back = [0u8; 16];
        mem.read(GuestAddress(4096 - 12), &mut back).unwrap();
        assert_eq!(&back, b"header:12bytthen");

        mem.update_array_then(GuestAddress(4096 - 12), *b"another head", b"")
            .unwrap();
        mem.read(GuestAddress(4096 - 12), &mut back).unwrap();
        assert_eq!(&back, b"another headthen");
        mem.write(GuestAddress(100), b"0123456789ab").unwrap();
        mem.update_array_then(GuestAddress(100), *b"0123456789ab", b"!")
            .unwrap();
        mem.read(GuestAddress(100), &mut back[..13]).unwrap();
        assert_eq!(&back[..13], b"0123456789ab!");
    }

    #[test]
    fn translation_is_bounded_by_regions() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 4096), (GuestAddress(0x10000), 8192)])
            .unwrap();
        assert!(mem.contains(GuestAddress(0), 4096));
        assert!(!mem.contains(GuestAddress(0), 4097));
        assert!(!mem.contains(GuestAddress(4096), 1));
        // A range may not straddle a gap or run past the last region.
        assert!(!mem.contains(GuestAddress(0x10000 + 8191), 2));
        assert!(mem.contains(GuestAddress(0x10000 + 8191), 1));
        assert!(!mem.contains(GuestAddress(u64::MAX), 1));
        assert!(!mem.contains(GuestAddress(0x10), u64::MAX));
        assert!(matches!(
            mem.read(GuestAddress(0x5000), &mut [0u8; 4]),
            Err(Error::AddressOutOfRange {
                addr: 0x5000,
                len: 4
            })
        ));
    }

    #[test]
    fn read_write_and_atomics_see_the_same_bytes() {
        let mem = GuestMemory::memfd(&[(GuestAddress(0x1000), 4096)]).unwrap();
        mem.write(GuestAddress(0x1010), &0xbeefu16.to_le_bytes())
            .unwrap();
        let a = mem
            .atomic_slice::<AtomicU16>(GuestAddress(0x1010), 1)
            .unwrap();
        assert_eq!(u16::from_le(a[0].load(Ordering::Relaxed)), 0xbeef);
        assert!(matches!(
            mem.atomic_slice::<AtomicU32>(GuestAddress(0x1012), 1),
            Err(Error::Misaligned { .. })
        ));
        let info: Vec<_> = mem.regions().collect();
        assert_eq!(info.len(), 1);
        assert!(info[0].file.is_some());
        assert_eq!(
            mem.user_to_guest(info[0].user_addr + 0x10),
            Some(GuestAddress(0x1010))
        );
        assert_eq!(mem.user_to_guest(info[0].user_addr + 4096), None);
    }

    #[test]
    fn prefetches_change_nothing_and_ignore_bad_ranges() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0x1000), 8192)]).unwrap();
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        mem.write(GuestAddress(0x1000), &pattern).unwrap();
        // Whole region, unaligned spans ending at its last byte, past its end, outside
        // memory, and lengths that overflow.
        for (addr, len) in [
            (0x1000, 8192),
            (0x1003, 8189),
            (0x2ffc, 4),
            (0x2ffc, 64),
            (0x5000, 64),
            (u64::MAX - 8, 64),
            (0x1000, usize::MAX),
        ] {
            mem.prefetch_write(GuestAddress(addr), len);
            mem.prefetch_read(GuestAddress(addr), len);
        }
        let mut back = vec![0u8; 8192];
        mem.read(GuestAddress(0x1000), &mut back).unwrap();
        assert_eq!(back, pattern);
    }
}
