//! A chain's buffers seen as one stream of bytes (spec 2.7.4: a device reads a chain's
//! device-readable buffers in order): a checked cursor over its segments, so that no caller
//! does its own segment arithmetic.
//!
//! - [`Tail`]: the bytes of some segments from an offset on (what a cursor has not read yet).
//! - [`Reader`]: copies bytes out of guest memory from the front of a [`Tail`], once each: a
//!   value read through it (a virtio-net header, say) is a copy in this process, which the
//!   caller checks and then uses, never the guest's bytes read a second time.
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
    pub fn len(&self) -> u64 {
        let all: u64 = self.segs.iter().map(|s| s.len as u64).sum();
        all - self.skip as u64
    }

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
    pub fn new(mem: &'m GuestMemory, segs: &'a [Segment]) -> Reader<'m, 'a> {
        Reader {
            mem,
            tail: Tail::new(segs),
        }
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> u64 {
        self.tail.len()
    }

    /// What is not read yet, for a vectored write after what was read.
    pub fn tail(&self) -> Tail<'a> {
        self.tail
    }

    /// Copies the next `buf.len()` bytes into `buf`. When fewer are left, fails with
    /// [`Error::ShortChain`] and reads nothing; a segment outside memory (the memory changed
    /// since the chain was popped) fails with the memory's error.
    pub fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
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

/// The bytes of one vectored write: `head`, bytes of this process, then `body`, guest memory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gather<'a> {
    pub head: &'a [u8],
    pub body: Tail<'a>,
}

impl<'a> Gather<'a> {
    /// `head`, then `body`.
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
}
