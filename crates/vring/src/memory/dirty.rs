//! The dirty log of live migration (vhost-user spec, "Migration" and "Dirty logging"; Linux
//! drivers/vhost/vhost.c `log_write`): a bitmap the frontend shares, one bit per 4 KiB page of
//! guest physical address space, `log[page / 8] |= 1 << (page % 8)`. While the frontend
//! migrates, the device sets the bit of every page it writes (received frames, used elements,
//! the used index), and the frontend sends those pages again.
//!
//! Bits are set with an atomic OR: the frontend clears bits concurrently (QEMU exchanges
//! whole words with zero, then sends the pages they named), and several device threads mark
//! the same bytes. An OR never takes a bit away, so neither side loses the other's. A bit
//! is set after the write it covers and the OR is a release: a frontend that reads the bit
//! (and clears it) and then copies the page sees the write; one that read it before the write
//! finds the bit set again next round. Either way the page's last contents reach the
//! destination.
//!
//! The log mapping is registered with the SIGBUS handler like guest memory (`fault.rs`): a
//! frontend that shrinks the log's file gets its log replaced by zeroes, not a dead backend.

use std::fs::File;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};

use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

use super::fault;
use super::region::{check_ram_file, mmap_error};
use crate::{Error, GuestAddress, Segment};

/// Bytes of guest memory per bit of the log (VHOST_LOG_PAGE).
pub const LOG_PAGE: u64 = 4096;

/// A frontend's dirty log, mapped.
#[derive(Debug)]
pub struct DirtyLog {
    /// The first byte of the bitmap: `mmap_offset` into the mapping.
    bitmap: NonNull<AtomicU8>,
    /// Bytes of bitmap: it covers `8 * len` pages from guest address 0.
    len: usize,
    /// Writes that fell outside the bitmap (a frontend that sized it too small).
    missed: AtomicU64,
    /// Released before `mmap` unmaps (fields drop in order).
    _fault: fault::Registration,
    _mmap: MmapRegion<()>,
}

// SAFETY: the bitmap pointer points into the mapping `_mmap` owns, which lives as long as the
// log; it is only accessed as atomics, valid from any thread.
unsafe impl Send for DirtyLog {}
// SAFETY: as above; every method takes `&self` and touches the bitmap only through atomics.
unsafe impl Sync for DirtyLog {}

impl DirtyLog {
    /// Maps `size` bytes of log at `offset` in `file` (VHOST_USER_SET_LOG_BASE with
    /// LOG_SHMFD). The file must be shared memory (a memfd, tmpfs or hugetlbfs, as guest
    /// memory is) and hold the whole log; the size must be non-zero.
    pub fn from_file(file: File, size: u64, offset: u64) -> Result<DirtyLog, Error> {
        let (file_len, page) = check_ram_file(&file)?;
        let end = offset
            .checked_add(size)
            .filter(|&e| size > 0 && e <= file_len);
        let (Some(end), Ok(len)) = (end, usize::try_from(size)) else {
            return Err(Error::InvalidMemory {
                reason: "dirty log is empty or extends past the end of its file",
            });
        };
        // Whole pages of the file (huge pages on hugetlbfs), which holds them: see
        // `Region::from_source`.
        let end = end.div_ceil(page) * page;
        let total = usize::try_from(end).map_err(|_| Error::InvalidMemory {
            reason: "dirty log too large to map",
        })?;
        // Mapped from the file's start, so that any offset works (mmap wants page-aligned
        // ones); the bitmap starts `offset` bytes in.
        let mmap = MmapRegion::from_file(FileOffset::new(file, 0), total).map_err(mmap_error)?;
        let start = NonNull::new(mmap.as_ptr()).ok_or(Error::InvalidMemory {
            reason: "mapping at address 0",
        })?;
        let fault = fault::Registration::new(start.as_ptr(), mmap.size())?;
        // `offset < total`, so this stays inside the mapping; bytes need no alignment.
        let bitmap = NonNull::new(start.as_ptr().wrapping_add(offset as usize) as *mut AtomicU8)
            .ok_or(Error::InvalidMemory {
                reason: "mapping at address 0",
            })?;
        Ok(DirtyLog {
            bitmap,
            len,
            missed: AtomicU64::new(0),
            _fault: fault,
            _mmap: mmap,
        })
    }

    /// The bitmap, as atomics.
    fn bytes(&self) -> &[AtomicU8] {
        // SAFETY: `from_file` checked that `len` bytes at `bitmap` lie inside the mapping,
        // which `self` owns; AtomicU8 has the size and alignment of u8 and every bit pattern
        // is valid, and the frontend writes the same bytes only with atomics of its own
        // (or, after a fault, nobody does).
        unsafe { std::slice::from_raw_parts(self.bitmap.as_ptr(), self.len) }
    }

    /// Pages the log covers, from guest address 0.
    pub fn pages(&self) -> u64 {
        self.len as u64 * 8
    }

    /// Writes marked outside the log so far: each is a write the frontend will not resend.
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    /// Marks the pages of `[addr, addr + len)` dirty. Called after the write.
    #[inline]
    pub fn mark(&self, addr: GuestAddress, len: u64) {
        if len == 0 {
            return;
        }
        // Release: the write this mark covers is visible before the bit; pairs with the
        // frontend's read-and-clear of the bitmap (an atomic exchange in QEMU) that comes
        // before it copies the page.
        fence(Ordering::Release);
        self.set_bits(addr, len);
    }

    /// Marks the first `len` bytes of `segs` dirty (what a device wrote into a chain's
    /// writable part). Called after the writes.
    #[inline]
    pub fn mark_segments(&self, segs: &[Segment], len: u64) {
        // Release: as in `mark`.
        fence(Ordering::Release);
        let mut left = len;
        for s in segs {
            if left == 0 {
                break;
            }
            let n = left.min(s.len as u64);
            if n > 0 {
                self.set_bits(s.addr, n);
            }
            left -= n;
        }
    }

    fn set_bits(&self, addr: GuestAddress, len: u64) {
        let first = addr.0 / LOG_PAGE;
        // A range that wraps the address space ends at its last page.
        let last = addr.0.saturating_add(len - 1) / LOG_PAGE;
        let bytes = self.bytes();
        let mut page = first;
        while page <= last {
            let byte = page / 8;
            let Some(b) = usize::try_from(byte).ok().and_then(|i| bytes.get(i)) else {
                self.missed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let lo = (page % 8) as u32;
            let hi = (last - byte * 8).min(7) as u32;
            let mask = (0xffu8 >> (7 - (hi - lo))) << lo;
            b.fetch_or(mask, Ordering::Relaxed);
            page = (byte + 1) * 8;
        }
    }

    /// Whether `page`'s bit is set (for tests and reports).
    pub fn is_dirty(&self, page: u64) -> bool {
        usize::try_from(page / 8)
            .ok()
            .and_then(|i| self.bytes().get(i))
            .is_some_and(|b| b.load(Ordering::Relaxed) & (1 << (page % 8)) != 0)
    }

    /// Clears the bitmap and returns the pages that were set, as the frontend does at each
    /// round of a migration (for tests).
    pub fn take_dirty(&self) -> Vec<u64> {
        let mut pages = Vec::new();
        for (i, b) in self.bytes().iter().enumerate() {
            let v = b.swap(0, Ordering::Acquire);
            for bit in 0..8 {
                if v & (1 << bit) != 0 {
                    pages.push(i as u64 * 8 + bit);
                }
            }
        }
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    /// A log of `bytes` bytes on a memfd, and the file (the frontend's handle).
    fn log(bytes: u64) -> (DirtyLog, File) {
        let mem = crate::GuestMemory::memfd(&[(GuestAddress(0), bytes as usize)]).unwrap();
        let file = mem
            .regions()
            .next()
            .unwrap()
            .file
            .unwrap()
            .try_clone()
            .unwrap();
        let log = DirtyLog::from_file(file.try_clone().unwrap(), bytes, 0).unwrap();
        (log, file)
    }

    #[test]
    fn the_pages_written_and_only_those_are_marked() {
        let (log, _f) = log(4096);
        assert_eq!(log.pages(), 4096 * 8);
        // One byte, a page exactly, a write straddling a page boundary, one across a byte
        // of the bitmap (pages 6..=9), and the last byte of the address space the log covers.
        log.mark(GuestAddress(5 * 4096 + 17), 1);
        log.mark(GuestAddress(11 * 4096), 4096);
        log.mark(GuestAddress(20 * 4096 - 2), 4);
        log.mark(GuestAddress(6 * 4096 + 100), 3 * 4096);
        log.mark(GuestAddress(log.pages() * 4096 - 1), 1);
        log.mark(GuestAddress(40 * 4096), 0);
        let want = [5, 6, 7, 8, 9, 11, 19, 20, log.pages() - 1];
        assert_eq!(log.take_dirty(), want);
        assert_eq!(log.take_dirty(), Vec::<u64>::new(), "cleared");
        assert_eq!(log.missed(), 0);
    }

    #[test]
    fn a_write_into_a_chain_marks_the_pages_of_the_bytes_written() {
        let (log, _f) = log(64);
        let seg = |page: u64, off: u64, len: u32| Segment {
            addr: GuestAddress(page * 4096 + off),
            len,
        };
        // 5000 bytes over three segments: all of the first (it straddles 2|3), 900 of the
        // second, none of the third.
        let segs = [seg(2, 4000, 200), seg(7, 0, 5000), seg(9, 0, 100)];
        log.mark_segments(&segs, 1100);
        assert_eq!(log.take_dirty(), [2, 3, 7]);
        log.mark_segments(&segs, 200 + 5000 + 1);
        assert_eq!(log.take_dirty(), [2, 3, 7, 8, 9]);
        log.mark_segments(&segs, 0);
        assert!(log.take_dirty().is_empty());
    }

    #[test]
    fn writes_outside_the_log_are_counted_not_marked() {
        let (log, f) = log(4096);
        let end = log.pages() * 4096;
        log.mark(GuestAddress(end - 4096), 8192);
        assert_eq!(log.take_dirty(), [log.pages() - 1]);
        assert_eq!(log.missed(), 1);
        log.mark(GuestAddress(u64::MAX - 10), 100);
        assert_eq!(log.missed(), 2);
        // The frontend's bytes are the bitmap: what it sees is what was marked.
        log.mark(GuestAddress(9 * 4096), 1);
        let mut b = [0u8; 2];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, 0).unwrap();
        assert_eq!(b, [0, 1 << 1]);
    }

    #[test]
    fn a_log_that_does_not_fit_its_file_is_refused() {
        let (_, file) = log(4096);
        for (size, offset) in [(0, 0), (4097, 0), (4096, 1), (1, 4096), (u64::MAX, 2)] {
            let r = DirtyLog::from_file(file.try_clone().unwrap(), size, offset);
            assert!(
                matches!(r, Err(Error::InvalidMemory { .. })),
                "size {size} offset {offset}: {r:?}"
            );
        }
        let dev = File::open("/dev/zero").unwrap();
        assert!(DirtyLog::from_file(dev, 4096, 0).is_err());
        // An offset inside the file: the bitmap starts there.
        let log = DirtyLog::from_file(file.try_clone().unwrap(), 100, 3000).unwrap();
        log.mark(GuestAddress(0), 1);
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut b, 3000).unwrap();
        assert_eq!(b, [1]);
    }

    /// Four writers each own a bit of one bitmap byte and mark it again as soon as the
    /// frontend, clearing the byte as fast as it can, has seen it: each mark must be seen
    /// exactly once. A bit lost (a load and a store instead of one OR) leaves its writer
    /// waiting; one brought back after the clear is seen twice.
    #[test]
    fn writers_sharing_a_byte_with_a_clearing_frontend_lose_and_revive_no_bit() {
        use std::sync::atomic::AtomicBool;
        use std::time::{Duration, Instant};
        const WRITERS: usize = 4;
        const MARKS: u64 = 20_000;
        let (log, _f) = log(1);
        let log = Arc::new(log);
        let seen: Arc<[AtomicU64; WRITERS]> = Arc::new(Default::default());
        let stop = Arc::new(AtomicBool::new(false));
        let clearer = {
            let (log, seen, stop) = (log.clone(), seen.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    for p in log.take_dirty() {
                        seen[p as usize % WRITERS].fetch_add(1, Ordering::Release);
                    }
                    std::thread::yield_now();
                }
            })
        };
        // A lost bit is never seen; on a loaded machine a mark may wait for the scheduler, so
        // the limit is per mark, not for all of them.
        const STALL: Duration = Duration::from_secs(5);
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (log, seen) = (log.clone(), seen.clone());
                std::thread::spawn(move || {
                    for i in 0..MARKS {
                        // Pages w and w + 4: bits w and w + 4 of byte 0, alternately.
                        let page = w as u64 + 4 * (i % 2);
                        log.mark(GuestAddress(page * 4096), 1);
                        let marked = Instant::now();
                        while seen[w].load(Ordering::Acquire) <= i {
                            if marked.elapsed() > STALL {
                                return Err(format!("writer {w}: mark {i} not seen in {STALL:?}"));
                            }
                            std::thread::yield_now();
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let results: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Release);
        clearer.join().unwrap();
        for r in results {
            r.unwrap();
        }
        for (w, s) in seen.iter().enumerate() {
            assert_eq!(
                s.load(Ordering::Relaxed),
                MARKS,
                "writer {w}: a mark seen twice"
            );
        }
    }

    /// Writers marking while the frontend clears, as during a migration: every page marked
    /// is seen by the clearer, in some round or in the final one. A lost bit (a plain store
    /// instead of an OR, a clear that is not an exchange) fails this.
    #[test]
    fn concurrent_writers_and_a_clearing_frontend_lose_no_page() {
        const WRITERS: u64 = 4;
        const MARKS: u64 = 20_000;
        let (log, _f) = log(1024);
        let log = Arc::new(log);
        let pages = log.pages();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clearer = {
            let (log, done) = (log.clone(), done.clone());
            std::thread::spawn(move || {
                let mut seen = vec![false; pages as usize];
                while !done.load(Ordering::Acquire) {
                    for p in log.take_dirty() {
                        seen[p as usize] = true;
                    }
                }
                for p in log.take_dirty() {
                    seen[p as usize] = true;
                }
                seen
            })
        };
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let log = log.clone();
                std::thread::spawn(move || {
                    // Each writer its own pages, interleaved with the others' in every byte,
                    // and ranges straddling pages.
                    let mut marked = Vec::new();
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ w;
                    for _ in 0..MARKS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let page = (x % (pages / WRITERS)) * WRITERS + w;
                        let len = if x & 1 == 0 { 1 } else { 4096 };
                        log.mark(GuestAddress(page * 4096 + 4095), len);
                        marked.push(page);
                        if len > 1 && page + 1 < pages {
                            marked.push(page + 1);
                        }
                    }
                    marked
                })
            })
            .collect();
        let mut want = vec![false; pages as usize];
        for w in writers {
            for p in w.join().unwrap() {
                want[p as usize] = true;
            }
        }
        done.store(true, Ordering::Release);
        let seen = clearer.join().unwrap();
        let lost: Vec<_> = (0..pages as usize)
            .filter(|&p| want[p] && !seen[p])
            .collect();
        assert!(lost.is_empty(), "pages marked but never seen: {lost:?}");
        let extra: Vec<_> = (0..pages as usize)
            .filter(|&p| seen[p] && !want[p])
            .collect();
        assert!(extra.is_empty(), "pages seen but never marked: {extra:?}");
    }
}
