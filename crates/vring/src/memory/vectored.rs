//! Vectored I/O between guest memory and a file descriptor: one `writev` or `readv` over a
//! chain's segments, each checked against the memory first, with the iovecs on the stack.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::GuestMemory;
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
        let mut iov = [EMPTY_IOVEC; MAX_IOVECS];
        let n = self.iovecs(segs, &mut iov)?;
        Ok(retry_interrupted(|| {
            // SAFETY: `iovecs` checked that each of the `n` iovecs lies inside a mapping of
            // `self`, which the borrow keeps alive for the call; writev only reads them. The peer
            // may change those bytes meanwhile: the host then gets whatever was there, as with
            // a copy.
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
        let mut n = self.iovecs(segs, &mut iov)?;
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

    /// Translates `segs` into `iov`, checking each one; returns how many it filled.
    fn iovecs(
        &self,
        segs: &[Segment],
        iov: &mut [libc::iovec; MAX_IOVECS],
    ) -> Result<usize, Error> {
        if segs.len() > MAX_IOVECS {
            return Err(Error::TooManySegments {
                count: segs.len(),
                max: MAX_IOVECS,
            });
        }
        for (slot, s) in iov.iter_mut().zip(segs) {
            let span = self.host_span(s.addr, s.len as usize)?;
            *slot = libc::iovec {
                iov_base: span.ptr.cast(),
                iov_len: span.len,
            };
        }
        Ok(segs.len())
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
