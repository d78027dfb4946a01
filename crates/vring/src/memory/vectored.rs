//! Vectored I/O between guest memory and a file descriptor: one `writev` or `readv` over a
//! chain's segments, each checked against the memory first, with the iovecs on the stack.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::GuestMemory;
use crate::cursor::Gather;
use crate::{Error, Segment};

/// The most segments one [`GuestMemory::writev_to`] or [`GuestMemory::readv_from`] takes: their
/// iovecs live on the stack. Linux's own limit (`UIO_MAXIOV`) is 1024.
pub const MAX_IOVECS: usize = 64;

impl GuestMemory {
    /// Writes the bytes of `segs`, in order, to `fd` with one `writev`: a frame goes from guest
    /// memory to the host without a copy in this process. Returns the bytes written.
    ///
    /// The outer error is the guest's: a segment outside memory
    /// ([`Error::AddressOutOfRange`]), or more than [`MAX_IOVECS`] segments
    /// ([`Error::TooManySegments`]); then nothing is written. The inner one is the host's, as
    /// `writev` reported it (`WouldBlock` when a non-blocking `fd` is full, for example).
    pub fn writev_to(
        &self,
        fd: BorrowedFd<'_>,
        segs: &[Segment],
    ) -> Result<io::Result<usize>, Error> {
        self.writev_gather(fd, Gather::from(segs))
    }

    /// Writes `frame` to `fd` with one `writev`: its head (bytes of this process: a header
    /// copied out of guest memory and checked, say, so that the host gets the bytes that were
    /// checked), then its body straight from guest memory. Errors as in
    /// [`GuestMemory::writev_to`]; the head counts as one segment.
    pub fn writev_gather(
        &self,
        fd: BorrowedFd<'_>,
        frame: Gather<'_>,
    ) -> Result<io::Result<usize>, Error> {
        let mut iov = [EMPTY_IOVEC; MAX_IOVECS];
        let n = self.iovecs(frame, &mut iov)?;
        Ok(retry_interrupted(|| {
            // SAFETY: `iovecs` checked that each guest iovec lies inside a mapping of `self`,
            // which the borrow keeps alive for the call, and the head's is `frame.head`,
            // borrowed for the call; writev only reads them. The peer may change guest bytes
            // meanwhile: the host then gets whatever was there, as with a copy.
            unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), n as libc::c_int) }
        }))
    }

    /// Reads from `fd` with one `readv`, scattering the bytes over `segs` in order: a frame goes
    /// from the host into guest memory without a copy in this process. Returns the bytes read;
    /// a read longer than the segments is cut by the kernel, as `readv` does.
    ///
    /// Errors as in [`GuestMemory::writev_to`]; on an outer error nothing is read.
    pub fn readv_from(
        &self,
        fd: BorrowedFd<'_>,
        segs: &[Segment],
    ) -> Result<io::Result<usize>, Error> {
        self.readv_with_tail(fd, segs, &mut [])
    }

    /// As [`GuestMemory::readv_from`], with `tail`, a buffer of this process, after the
    /// segments: what does not fit them lands there (bytes past `segs`' total length), so that
    /// a read sized for the usual frame never cuts a longer one. `segs` take at most
    /// [`MAX_IOVECS`] - 1 segments.
    pub fn readv_with_tail(
        &self,
        fd: BorrowedFd<'_>,
        segs: &[Segment],
        tail: &mut [u8],
    ) -> Result<io::Result<usize>, Error> {
        let mut iov = [EMPTY_IOVEC; MAX_IOVECS];
        let mut n = self.iovecs(Gather::from(segs), &mut iov)?;
        if !tail.is_empty() {
            if n == MAX_IOVECS {
                return Err(Error::TooManySegments {
                    count: n + 1,
                    max: MAX_IOVECS,
                });
            }
            iov[n] = libc::iovec {
                iov_base: tail.as_mut_ptr().cast(),
                iov_len: tail.len(),
            };
            n += 1;
        }
        Ok(retry_interrupted(|| {
            // SAFETY: `iovecs` checked that each guest iovec lies inside a mapping of `self`,
            // which the borrow keeps alive for the call, and the tail iovec is `tail`, borrowed
            // mutably for the call. The kernel's stores into guest memory race with the peer's
            // accesses, which is fine: this memory is shared and only ever accessed by copies
            // and atomics, so no Rust reference to plain bytes exists under it, and where a
            // hostile guest points a segment at its own ring, the ring's Rust views are atomics
            // (interior mutability), which the peer may overwrite anyway.
            unsafe { libc::readv(fd.as_raw_fd(), iov.as_ptr(), n as libc::c_int) }
        }))
    }

    /// Translates `frame` into `iov`, checking each guest segment; returns how many it filled.
    fn iovecs(
        &self,
        frame: Gather<'_>,
        iov: &mut [libc::iovec; MAX_IOVECS],
    ) -> Result<usize, Error> {
        let count = frame.iovec_count();
        if count > MAX_IOVECS {
            return Err(Error::TooManySegments {
                count,
                max: MAX_IOVECS,
            });
        }
        let mut n = 0;
        if !frame.head.is_empty() {
            iov[0] = libc::iovec {
                iov_base: frame.head.as_ptr().cast_mut().cast(),
                iov_len: frame.head.len(),
            };
            n = 1;
        }
        for s in frame.body.iter() {
            let span = self.host_span(s.addr, s.len as usize)?;
            iov[n] = libc::iovec {
                iov_base: span.ptr.cast(),
                iov_len: span.len,
            };
            n += 1;
        }
        Ok(n)
    }
}

const EMPTY_IOVEC: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// Runs a vectored I/O call until a signal does not interrupt it: an interrupted call moved no
/// bytes, so repeating it is what the caller wants.
fn retry_interrupted(mut call: impl FnMut() -> libc::ssize_t) -> io::Result<usize> {
    loop {
        let n = call();
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use crate::cursor::{Reader, Tail};
    use crate::{GuestAddress, GuestMemory};

    use super::*;

    fn seg(addr: u64, len: u32) -> Segment {
        Segment {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn a_gather_writes_its_head_then_the_guest_bytes_after_what_was_read() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        mem.write(GuestAddress(0x1000), b"HDRxx").unwrap();
        mem.write(GuestAddress(0x2000), b"abcdef").unwrap();
        let segs = [seg(0x1000, 5), seg(0x2000, 6)];
        // Read a 7-byte "header" out of the chain, then change it in guest memory: the write
        // sends the copy, not the guest's bytes now.
        let mut r = Reader::new(&mem, &segs);
        let mut hdr = [0u8; 7];
        r.read_exact(&mut hdr).unwrap();
        assert_eq!(&hdr, b"HDRxxab");
        mem.write(GuestAddress(0x1000), b"EVIL!").unwrap();
        mem.write(GuestAddress(0x2000), b"ZZ").unwrap();
        let (mut rx, tx) = std::io::pipe().unwrap();
        let n = mem
            .writev_gather(tx.as_fd(), Gather::new(&hdr, r.tail()))
            .unwrap()
            .unwrap();
        assert_eq!(n, 11);
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"HDRxxabcdef");
    }

    #[test]
    fn the_head_counts_as_one_of_the_iovecs_a_call_takes() {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0), 0x10000)]).unwrap();
        let segs = vec![seg(0x1100, 1); MAX_IOVECS];
        let (_rx, tx) = std::io::pipe().unwrap();
        let e = mem
            .writev_gather(tx.as_fd(), Gather::new(b"h", Tail::new(&segs)))
            .unwrap_err();
        assert_eq!(
            e,
            Error::TooManySegments {
                count: MAX_IOVECS + 1,
                max: MAX_IOVECS
            }
        );
        let n = mem
            .writev_gather(tx.as_fd(), Gather::new(b"h", Tail::new(&segs[1..])))
            .unwrap()
            .unwrap();
        assert_eq!(n, MAX_IOVECS);
    }

    /// Two regions with a gap, so that a chain can cross from one to the other.
    fn two_regions() -> GuestMemory {
        GuestMemory::anonymous(&[(GuestAddress(0x1000), 4096), (GuestAddress(0x10000), 4096)])
            .unwrap()
    }

    fn nonblocking_pair() -> (UnixStream, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    #[test]
    fn writev_to_gathers_segments_in_order() {
        let mem = two_regions();
        let segs = [
            seg(0x1ff0, 16),
            seg(0x1000, 0),
            seg(0x10000, 5),
            seg(0x1003, 7),
        ];
        mem.write(GuestAddress(0x1ff0), b"0123456789abcdef")
            .unwrap();
        mem.write(GuestAddress(0x10000), b"ghijk").unwrap();
        mem.write(GuestAddress(0x1003), b"lmnopqr").unwrap();
        let (mut rx, tx) = std::io::pipe().unwrap();
        let n = mem.writev_to(tx.as_fd(), &segs).unwrap().unwrap();
        assert_eq!(n, 28);
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"0123456789abcdefghijklmnopqr");
    }

    #[test]
    fn readv_with_tail_puts_what_the_segments_cannot_hold_in_the_tail() {
        let mem = two_regions();
        let frame: Vec<u8> = (0..100u8).collect();
        let (rx, mut tx) = std::io::pipe().unwrap();
        tx.write_all(&frame).unwrap();
        let segs = [seg(0x1100, 30), seg(0x10000, 40)];
        let mut tail = [0u8; 64];
        let n = mem.readv_with_tail(rx.as_fd(), &segs, &mut tail).unwrap();
        assert_eq!(n.unwrap(), 100);
        let mut back = [0u8; 40];
        mem.read(GuestAddress(0x1100), &mut back[..30]).unwrap();
        assert_eq!(back[..30], frame[..30]);
        mem.read(GuestAddress(0x10000), &mut back).unwrap();
        assert_eq!(back[..], frame[30..70]);
        assert_eq!(tail[..30], frame[70..]);
        // With the tail, one segment fewer fits.
        let segs = vec![seg(0x1100, 1); MAX_IOVECS];
        let e = mem
            .readv_with_tail(rx.as_fd(), &segs, &mut tail)
            .unwrap_err();
        assert!(matches!(e, Error::TooManySegments { .. }), "{e:?}");
    }

    #[test]
    fn readv_from_scatters_over_segments() {
        let mem = two_regions();
        let frame: Vec<u8> = (0..100u8).collect();
        let (rx, mut tx) = std::io::pipe().unwrap();
        tx.write_all(&frame).unwrap();
        mem.write(GuestAddress(0x10000 + 60), &[0xee; 8]).unwrap();
        // The last segment is longer than what is left: readv fills only its start.
        let segs = [
            seg(0x1ffa, 6),
            seg(0x1000, 0),
            seg(0x1100, 34),
            seg(0x10000, 128),
        ];
        let n = mem.readv_from(rx.as_fd(), &segs).unwrap().unwrap();
        assert_eq!(n, 100);
        let mut back = [0u8; 64];
        mem.read(GuestAddress(0x1ffa), &mut back[..6]).unwrap();
        assert_eq!(back[..6], frame[..6]);
        mem.read(GuestAddress(0x1100), &mut back[..34]).unwrap();
        assert_eq!(back[..34], frame[6..40]);
        mem.read(GuestAddress(0x10000), &mut back).unwrap();
        assert_eq!(back[..60], frame[40..]);
        assert_eq!(back[60..], [0xee; 4], "readv wrote past the bytes it read");
    }

    #[test]
    fn a_segment_outside_memory_fails_before_any_io() {
        let mem = two_regions();
        let (a, mut b) = nonblocking_pair();
        // The bad segment comes last: no partial write of the good ones before it.
        let segs = [seg(0x1000, 16), seg(0x1ffc, 8)];
        assert_eq!(
            mem.writev_to(a.as_fd(), &segs).unwrap_err(),
            Error::AddressOutOfRange {
                addr: 0x1ffc,
                len: 8
            }
        );
        let mut buf = [0u8; 32];
        assert_eq!(
            b.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        b.write_all(b"frame").unwrap();
        let segs = [seg(0x1000, 4), seg(0x5000, 4)];
        assert_eq!(
            mem.readv_from(a.as_fd(), &segs).unwrap_err(),
            Error::AddressOutOfRange {
                addr: 0x5000,
                len: 4
            }
        );
        assert_eq!((&a).read(&mut buf).unwrap(), 5, "the frame was consumed");
        mem.read(GuestAddress(0x1000), &mut buf[..4]).unwrap();
        assert_eq!(buf[..4], [0; 4]);
    }

    #[test]
    fn more_segments_than_iovecs_are_refused_not_cut() {
        let mem = two_regions();
        let (a, mut b) = nonblocking_pair();
        let segs: Vec<Segment> = (0..MAX_IOVECS as u64 + 1)
            .map(|i| seg(0x1000 + i, 1))
            .collect();
        let want = Error::TooManySegments {
            count: MAX_IOVECS + 1,
            max: MAX_IOVECS,
        };
        assert_eq!(mem.writev_to(a.as_fd(), &segs).unwrap_err(), want);
        assert_eq!(mem.readv_from(a.as_fd(), &segs).unwrap_err(), want);
        let mut buf = [0u8; 128];
        assert_eq!(
            b.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // Exactly the limit is fine.
        let n = mem.writev_to(a.as_fd(), &segs[..MAX_IOVECS]).unwrap();
        assert_eq!(n.unwrap(), MAX_IOVECS);
        assert_eq!(b.read(&mut buf).unwrap(), MAX_IOVECS);
    }

    #[test]
    fn host_errors_come_back_inside() {
        let mem = two_regions();
        let (a, mut b) = nonblocking_pair();
        let segs = [seg(0x1000, 4096), seg(0x10000, 4096)];
        let empty = mem.readv_from(a.as_fd(), &segs).unwrap();
        assert_eq!(empty.unwrap_err().kind(), io::ErrorKind::WouldBlock);
        let chunk = [0u8; 4096];
        while b.write(&chunk).is_ok() {}
        let full = mem.writev_to(b.as_fd(), &segs).unwrap();
        assert_eq!(full.unwrap_err().raw_os_error(), Some(libc::EAGAIN));
    }
}
