//! A chain's buffers seen as one stream of bytes (spec 2.7.4: a device reads a chain's
//! device-readable buffers in order): a checked cursor over its segments, so that no caller
//! does its own segment arithmetic.
//!
//! - [`Tail`]: the bytes of some segments from an offset on (what a cursor has not read yet).
//! - [`Reader`]: copies bytes out of guest memory from the front of a [`Tail`], once each: a
//!   value read through it (a virtio-net header, say) is a copy in this process, which the
//!   caller checks and then uses, never the guest's bytes read a second time.
//! - [`Writer`]: copies bytes into a chain's writable segments in order, from this process
//!   or straight from another chain (a [`Reader`] on another guest's memory: one copy between
//!   two guests, as a switch forwards a frame).
//! - [`Gather`]: what one vectored write takes, a head of this process's bytes (such a checked
//!   copy) then a [`Tail`] of guest memory (`GuestMemory::writev_gather`, `writev_batch`).

use crate::{Error, GuestMemory, Segment};

/// The bytes of `segs` after their first few: the first segment is cut at `skip`.
///
/// Invariant: `skip` is 0, or less than the first segment's length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tail<'a> {
    segs: &'a [Segment],
    skip: u32,
}

impl<'a> Tail<'a> {
    /// All the bytes of `segs`.
    #[inline]
    pub fn new(segs: &'a [Segment]) -> Tail<'a> {
        Tail { segs, skip: 0 }
    }

    /// The bytes of `segs` after the first `n`; an error when they have fewer.
    pub fn after(segs: &'a [Segment], n: u64) -> Result<Tail<'a>, Error> {
        let mut t = Tail::new(segs);
        t.advance(n)?;
        Ok(t)
    }

    /// How many bytes are left.
    #[inline]
    pub fn len(&self) -> u64 {
        let all: u64 = self.segs.iter().map(|s| s.len as u64).sum();
        all - self.skip as u64
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.segs.iter().all(|s| s.len == 0)
    }

    /// How many segments the bytes left span (each is one iovec of a vectored call).
    pub fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// The segments left, the first one cut where the tail starts.
    pub fn iter(&self) -> impl Iterator<Item = Segment> + 'a {
        let skip = self.skip;
        self.segs.iter().enumerate().map(move |(i, s)| {
            if i == 0 && skip > 0 {
                // In range: `skip` < `s.len`, and the segment was checked to lie in memory.
                Segment {
                    addr: crate::GuestAddress(s.addr.0.wrapping_add(skip as u64)),
                    len: s.len - skip,
                }
            } else {
                *s
            }
        })
    }

    /// Where the next `n` bytes (at least one) are, when the first segment holds them all:
    /// the cursors' quick way (a header, a short frame), without walking the segments.
    #[inline]
    fn front(&self, n: usize) -> Option<crate::GuestAddress> {
        let s = self.segs.first()?;
        let room = (s.len - self.skip) as usize;
        (n > 0 && n <= room).then(|| crate::GuestAddress(s.addr.0.wrapping_add(self.skip as u64)))
    }

    /// Drops the `n` bytes [`Tail::front`] found, as [`Tail::advance`] would.
    #[inline]
    fn drop_front(&mut self, n: usize) {
        self.skip += n as u32;
        if self.skip == self.segs[0].len {
            self.skip = 0;
            self.segs = &self.segs[1..];
            while let Some((first, rest)) = self.segs.split_first() {
                if first.len > 0 {
                    break;
                }
                self.segs = rest;
            }
        }
    }

    /// Drops the first `n` bytes; an error (and nothing dropped) when fewer are left.
    pub fn advance(&mut self, n: u64) -> Result<(), Error> {
        let left = self.len();
        if n > left {
            return Err(Error::ShortChain { wanted: n, left });
        }
        let mut n = n + self.skip as u64;
        let mut segs = self.segs;
        while let Some((first, rest)) = segs.split_first() {
            if n < first.len as u64 {
                break;
            }
            n -= first.len as u64;
            segs = rest;
        }
        self.segs = segs;
        self.skip = n as u32;
        Ok(())
    }
}

/// Reads a chain's bytes in order, each once, into this process's memory.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'m, 'a> {
    mem: &'m GuestMemory,
    tail: Tail<'a>,
}

impl<'m, 'a> Reader<'m, 'a> {
    /// A reader at the first byte of `segs` (a chain's readable segments, say) in `mem`.
    #[inline]
    pub fn new(mem: &'m GuestMemory, segs: &'a [Segment]) -> Reader<'m, 'a> {
        Reader {
            mem,
            tail: Tail::new(segs),
        }
    }

    /// A reader at the first byte of `tail` in `mem`.
    #[inline]
    pub fn from_tail(mem: &'m GuestMemory, tail: Tail<'a>) -> Reader<'m, 'a> {
        Reader { mem, tail }
    }

    /// Bytes not read yet.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.tail.len()
    }

    /// What is not read yet, for a vectored write after what was read.
    #[inline]
    pub fn tail(&self) -> Tail<'a> {
        self.tail
    }

    /// Skips the next `n` bytes; fails with [`Error::ShortChain`] (and skips nothing) when
    /// fewer are left.
    pub fn skip(&mut self, n: u64) -> Result<(), Error> {
        self.tail.advance(n)
    }

    /// Copies the next `buf.len()` bytes into `buf`. When fewer are left, fails with
    /// [`Error::ShortChain`] and reads nothing; a segment outside memory (the memory changed
    /// since the chain was popped) fails with the memory's error.
    ///
    /// The bytes in one segment (a header, say) are read inline; bytes across segments by a
    /// call (as a call, the common case cost 21 instructions a frame more in the switch's
    /// bench: callgrind).
    #[inline(always)]
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        if let Some(addr) = self.tail.front(buf.len()) {
            self.mem.read(addr, buf)?;
            self.tail.drop_front(buf.len());
            return Ok(());
        }
        self.read_across(buf)
    }

    #[inline(never)]
    fn read_across(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        let left = self.tail.len();
        if buf.len() as u64 > left {
            return Err(Error::ShortChain {
                wanted: buf.len() as u64,
                left,
            });
        }
        let mut at = 0;
        for s in self.tail.iter() {
            if at == buf.len() {
                break;
            }
            let n = (s.len as usize).min(buf.len() - at);
            self.mem.read(s.addr, &mut buf[at..at + n])?;
            at += n;
        }
        self.tail.advance(buf.len() as u64)
    }
}

/// Writes into a chain's bytes in order (its writable segments, say), each byte once.
#[derive(Debug)]
pub struct Writer<'m, 'a> {
    mem: &'m GuestMemory,
    tail: Tail<'a>,
    written: u64,
}

impl<'m, 'a> Writer<'m, 'a> {
    /// A writer at the first byte of `segs` in `mem`.
    #[inline]
    pub fn new(mem: &'m GuestMemory, segs: &'a [Segment]) -> Writer<'m, 'a> {
        Writer {
            mem,
            tail: Tail::new(segs),
            written: 0,
        }
    }

    /// A writer at byte `at` of `segs`; fails with [`Error::ShortChain`] when they hold fewer.
    pub fn at(mem: &'m GuestMemory, segs: &'a [Segment], at: u64) -> Result<Writer<'m, 'a>, Error> {
        Ok(Writer {
            mem,
            tail: Tail::after(segs, at)?,
            written: 0,
        })
    }

    /// Room left.
    #[inline]
    pub fn remaining(&self) -> u64 {
        self.tail.len()
    }

    /// Bytes written through this writer.
    #[inline]
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Copies as much of `buf` as there is room for; returns how much that was.
    #[inline]
    pub fn write(&mut self, buf: &[u8]) -> Result<usize, Error> {
        if let Some(addr) = self.tail.front(buf.len()) {
            self.mem.write(addr, buf)?;
            self.tail.drop_front(buf.len());
            self.written += buf.len() as u64;
            return Ok(buf.len());
        }
        let n = (buf.len() as u64).min(self.tail.len()) as usize;
        let mut at = 0;
        for s in self.tail.iter() {
            if at == n {
                break;
            }
            let k = (s.len as usize).min(n - at);
            self.mem.write(s.addr, &buf[at..at + k])?;
            at += k;
        }
        self.tail.advance(n as u64)?;
        self.written += n as u64;
        Ok(n)
    }

    /// [`Writer::write`] of a short array of ours: with fixed-size stores
    /// ([`GuestMemory::write_array`]) when the current segment holds it all.
    #[inline]
    pub fn write_array<const N: usize>(&mut self, bytes: [u8; N]) -> Result<usize, Error> {
        match self.tail.front(N) {
            Some(addr) => {
                self.mem.write_array(addr, bytes)?;
                self.tail.drop_front(N);
                self.written += N as u64;
                Ok(N)
            }
            None => self.write(&bytes),
        }
    }

    /// Copies all of `buf`; fails with [`Error::ShortChain`] (and writes nothing) when there
    /// is not room for it.
    pub fn write_all(&mut self, buf: &[u8]) -> Result<(), Error> {
        let left = self.tail.len();
        if buf.len() as u64 > left {
            return Err(Error::ShortChain {
                wanted: buf.len() as u64,
                left,
            });
        }
        self.write(buf).map(|_| ())
    }

    /// Copies up to `n` bytes from `src` (another chain, in its own memory) straight into
    /// this one, as many as both have; returns how many. The one copy of a frame from one
    /// guest's buffers into another's.
    pub fn copy_from(&mut self, src: &mut Reader<'_, '_>, n: u64) -> Result<u64, Error> {
        let n = n.min(self.tail.len()).min(src.tail.len());
        let mut done = 0u64;
        while done < n {
            let (Some(d), Some(s)) = (self.tail.iter().next(), src.tail.iter().next()) else {
                break;
            };
            // The next piece: what is left of the current segment on both sides.
            let k = (d.len as u64).min(s.len as u64).min(n - done);
            if k > 0 {
                src.mem.copy_to(s.addr, self.mem, d.addr, k as usize)?;
            }
            // (A segment of no bytes on either side makes `k` 0: advancing drops it.)
            self.tail.advance(k)?;
            src.tail.advance(k)?;
            done += k;
        }
        self.written += done;
        Ok(done)
    }
}

/// The bytes of one vectored write: `head`, bytes of this process, then `body`, guest memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gather<'a> {
    pub head: &'a [u8],
    pub body: Tail<'a>,
}

impl<'a> Gather<'a> {
    /// `head`, then `body`.
    #[inline]
    pub fn new(head: &'a [u8], body: Tail<'a>) -> Gather<'a> {
        Gather { head, body }
    }

    /// The iovecs it takes: one for a non-empty head, one per body segment.
    pub fn iovec_count(&self) -> usize {
        usize::from(!self.head.is_empty()) + self.body.segment_count()
    }
}

impl<'a> From<&'a [Segment]> for Gather<'a> {
    /// All of `segs`, no head.
    fn from(segs: &'a [Segment]) -> Gather<'a> {
        Gather::new(&[], Tail::new(segs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GuestAddress;

    fn seg(addr: u64, len: u32) -> Segment {
        Segment {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn a_tail_cuts_its_first_segment_and_drops_those_consumed() {
        let segs = [seg(0x1000, 4), seg(0x2000, 8), seg(0x3000, 2)];
        let t = Tail::after(&segs, 6).unwrap();
        assert_eq!(t.len(), 8);
        assert_eq!(t.segment_count(), 2);
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            vec![seg(0x2002, 6), seg(0x3000, 2)]
        );
        // A cut on a boundary starts at the next segment, whole.
        let t = Tail::after(&segs, 4).unwrap();
        assert_eq!(
            t.iter().collect::<Vec<_>>(),
            vec![seg(0x2000, 8), seg(0x3000, 2)]
        );
        // All of it: nothing left.
        let t = Tail::after(&segs, 14).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.len(), 0);
        assert_eq!(t.iter().count(), 0);
        // More than there is: an error.
        assert_eq!(
            Tail::after(&segs, 15),
            Err(Error::ShortChain {
                wanted: 15,
                left: 14
            })
        );
    }

    #[test]
    fn advancing_in_steps_is_advancing_at_once() {
        let segs = [
            seg(0x1000, 3),
            seg(0x2000, 0),
            seg(0x3000, 5),
            seg(0x4000, 7),
        ];
        for a in 0..=15u64 {
            for b in 0..=15 - a {
                let mut t = Tail::new(&segs);
                t.advance(a).unwrap();
                t.advance(b).unwrap();
                let once = Tail::after(&segs, a + b).unwrap();
                assert_eq!(
                    t.iter().filter(|s| s.len > 0).collect::<Vec<_>>(),
                    once.iter().filter(|s| s.len > 0).collect::<Vec<_>>(),
                    "{a} then {b}"
                );
                assert_eq!(t.len(), 15 - a - b);
            }
        }
    }

    #[test]
    fn a_reader_copies_across_segments_and_leaves_the_rest() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        mem.write(GuestAddress(0x1000), &[1, 2, 3]).unwrap();
        mem.write(GuestAddress(0x2000), &[4, 5, 6, 7]).unwrap();
        let segs = [seg(0x1000, 3), seg(0x2000, 4)];
        let mut r = Reader::new(&mem, &segs);
        let mut hdr = [0u8; 5];
        r.read_exact(&mut hdr).unwrap();
        assert_eq!(hdr, [1, 2, 3, 4, 5]);
        assert_eq!(r.remaining(), 2);
        assert_eq!(r.tail().iter().collect::<Vec<_>>(), vec![seg(0x2002, 2)]);
        let mut more = [0u8; 3];
        assert_eq!(
            r.read_exact(&mut more),
            Err(Error::ShortChain { wanted: 3, left: 2 })
        );
        assert_eq!(r.remaining(), 2, "a failed read consumes nothing");
    }

    #[test]
    fn a_writer_fills_segments_in_order_and_reports_what_fit() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        let segs = [seg(0x1000, 3), seg(0x2000, 4)];
        let mut w = Writer::new(&mem, &segs);
        assert_eq!(w.write(b"abcde").unwrap(), 5);
        assert_eq!(w.write(b"XYZ").unwrap(), 2, "only two bytes of room left");
        assert_eq!(w.written(), 7);
        assert_eq!(w.remaining(), 0);
        let mut back = [0u8; 7];
        Reader::new(&mem, &segs).read_exact(&mut back).unwrap();
        assert_eq!(&back, b"abcdeXY");
        // At an offset, across the boundary; too much: nothing written.
        let mut w = Writer::at(&mem, &segs, 2).unwrap();
        w.write_all(b"12").unwrap();
        assert_eq!(
            w.write_all(b"6789"),
            Err(Error::ShortChain { wanted: 4, left: 3 })
        );
        Reader::new(&mem, &segs).read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ab12eXY");
        assert!(Writer::at(&mem, &segs, 8).is_err());
    }

    /// The quick way of a read or write within the first segment leaves the tail where
    /// `advance` does, zero-length segments after it dropped too.
    #[test]
    fn reads_and_writes_of_any_length_leave_the_tail_where_advance_does() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        let layouts: [&[Segment]; 3] = [
            &[seg(0x1000, 4), seg(0x2000, 0), seg(0x3000, 5)],
            &[
                seg(0x1000, 0),
                seg(0x2000, 3),
                seg(0x3000, 0),
                seg(0x4000, 0),
            ],
            &[seg(0x1000, 9)],
        ];
        for segs in layouts {
            let total = Tail::new(segs).len() as usize;
            for first in 0..=total {
                for n in 0..=total - first {
                    let want = Tail::after(segs, (first + n) as u64).unwrap();
                    let mut r = Reader::new(&mem, segs);
                    r.skip(first as u64).unwrap();
                    r.read_exact(&mut vec![0; n]).unwrap();
                    assert_eq!(r.tail(), want, "read {n} after {first} of {segs:?}");
                    let mut w = Writer::at(&mem, segs, first as u64).unwrap();
                    assert_eq!(w.write(&vec![7; n]).unwrap(), n);
                    assert_eq!(w.tail, want, "write {n} after {first} of {segs:?}");
                }
            }
        }
    }

    #[test]
    fn an_array_is_written_like_a_slice_within_a_segment_and_across_one() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        let segs = [seg(0x1000, 5), seg(0x2000, 4)];
        let mut w = Writer::new(&mem, &segs);
        assert_eq!(
            w.write_array(*b"abc").unwrap(),
            3,
            "within the first segment"
        );
        assert_eq!(w.write_array(*b"defg").unwrap(), 4, "across the boundary");
        assert_eq!(w.write_array(*b"hijk").unwrap(), 2, "what fits");
        assert_eq!((w.written(), w.remaining()), (9, 0));
        let mut back = [0u8; 9];
        Reader::new(&mem, &segs).read_exact(&mut back).unwrap();
        assert_eq!(&back, b"abcdefghi");
        // A segment outside memory: an error, as `write`'s.
        let out = [seg(0x20000, 16)];
        assert!(Writer::new(&mem, &out).write_array([0u8; 12]).is_err());
    }

    #[test]
    fn copy_from_moves_bytes_between_two_memories_across_unaligned_segments() {
        let a = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        let b = GuestMemory::anonymous(&[(GuestAddress(0x40000), 0x10000)]).unwrap();
        let frame: Vec<u8> = (0..50u8).collect();
        let src = [seg(0x1000, 7), seg(0x3000, 0), seg(0x2000, 43)];
        Writer::new(&a, &src).write_all(&frame).unwrap();
        let dst = [seg(0x41000, 20), seg(0x42000, 11), seg(0x43000, 64)];
        let mut r = Reader::new(&a, &src);
        r.skip(5).unwrap();
        let mut w = Writer::new(&b, &dst);
        w.write_all(b"hdr").unwrap();
        assert_eq!(w.copy_from(&mut r, 40).unwrap(), 40);
        assert_eq!(r.remaining(), 5);
        // What is left of the source, more than asked: only what there is.
        assert_eq!(w.copy_from(&mut r, 100).unwrap(), 5);
        assert_eq!(w.written(), 48);
        let mut got = [0u8; 48];
        Reader::new(&b, &dst).read_exact(&mut got).unwrap();
        assert_eq!(&got[..3], b"hdr");
        assert_eq!(&got[3..], &frame[5..]);
    }

    #[test]
    fn copy_from_memory_shared_with_itself_is_a_move() {
        // Two memories may map the same file (a frontend may send one file twice): a copy
        // whose source and destination overlap must still give the source's bytes.
        let mem = GuestMemory::memfd(&[(GuestAddress(0), 0x4000)]).unwrap();
        let data: Vec<u8> = (0..100u8).collect();
        mem.write(GuestAddress(0x1000), &data).unwrap();
        let src = [seg(0x1000, 100)];
        let dst = [seg(0x1010, 100)];
        let mut r = Reader::new(&mem, &src);
        let mut w = Writer::new(&mem, &dst);
        assert_eq!(w.copy_from(&mut r, 100).unwrap(), 100);
        let mut got = [0u8; 100];
        mem.read(GuestAddress(0x1010), &mut got).unwrap();
        assert_eq!(&got[..], &data[..]);
    }
}
