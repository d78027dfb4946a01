//! Batched writes from guest memory through io_uring: a burst of frames, each one `writev`,
//! submitted with one `io_uring_enter` instead of one system call per frame.
//!
//! The ring is bound to one file descriptor at creation and restricted to that use
//! (IORING_REGISTER_RESTRICTIONS): its only operation is WRITEV, only on its one registered
//! file, with no flag but IO_LINK, and no register operation once enabled. Operations
//! submitted through io_uring are not seen by seccomp, so a worker thread that holds such a
//! ring gains nothing beyond the writes it already makes with `writev`.
//!
//! Writes never wait (RWF_NOWAIT): a file that cannot take a frame now fails it with
//! `WouldBlock`, as a non-blocking `writev` would. The writes of a batch are issued in order
//! during `io_uring_enter`. A *linked* writer (IOSQE_IO_LINK) also stops at the first write
//! that fails: the kernel cancels the ones after it, reported as not tried, so that they can
//! be written later in their order. Links cost: io_uring runs each linked write from task
//! work after the one before it completes, where unlinked writes are issued straight from
//! the submission (Linux 6.18, TAP writes of 64 bytes: 0.9-1.1 against 1.1-1.4 Mpps), so a
//! caller links only when a write may fail for want of room.
//!
//! [`GuestMemory::writev_batch`] waits for every submitted write to complete before it
//! returns, so no write outlives the borrow of the memory it reads.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::GuestMemory;
use crate::cursor::Gather;
use crate::Error;

/// Frames one batch takes at most: the ring's size.
pub const MAX_BATCH: usize = 64;

/// An io_uring that writes to one file descriptor, and the scratch space of its batches.
pub struct UringWriter {
    ring: IoUring,
    /// Whether a failed write cancels the writes after it (see the module's docs).
    linked: bool,
    /// Every frame's iovecs, back to back, for the batch being submitted.
    iov: Vec<libc::iovec>,
    /// Each submitted frame's first iovec and count in `iov`.
    frames: Vec<(usize, usize)>,
    /// The completion of each submitted frame, by its place in `frames`.
    done: Vec<Option<i32>>,
    /// Per frame of the batch: a guest error found while translating it, or None when it was
    /// submitted.
    refused: Vec<Option<Error>>,
    /// Set when the ring failed in a way that leaves it unusable: no batch is taken again.
    dead: bool,
}

impl std::fmt::Debug for UringWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringWriter")
            .field("linked", &self.linked)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers in `iov` are scratch: they are handed to the kernel and read only
// within one `writev_batch`, which borrows the writer mutably for the whole batch; between
// batches they are stale and never dereferenced. The ring itself may move between threads.
unsafe impl Send for UringWriter {}

/// What became of one frame of a batch.
pub type FrameResult = Result<io::Result<usize>, Error>;

impl UringWriter {
    /// A ring that writes to `fd` only, in batches of up to [`MAX_BATCH`] frames, `linked`
    /// or not (see the module's docs). Fails where the kernel has no io_uring, or has it
    /// disabled (`kernel.io_uring_disabled`), or lacks restrictions (before Linux 5.10):
    /// callers then write with `writev`.
    pub fn new(fd: BorrowedFd<'_>, linked: bool) -> io::Result<UringWriter> {
        let ring = IoUring::builder()
            // Registered, restricted and then enabled (R_DISABLED), so that nothing is ever
            // submitted to an unrestricted ring.
            .setup_r_disabled()
            .build(MAX_BATCH as u32)?;
        let submitter = ring.submitter();
        let mut probe = Probe::new();
        submitter.register_probe(&mut probe)?;
        if !probe.is_supported(opcode::Writev::CODE) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring without WRITEV",
            ));
        }
        submitter.register_files(&[fd.as_raw_fd()])?;
        submitter.register_restrictions(&mut [
            io_uring::register::Restriction::sqe_op(opcode::Writev::CODE),
            io_uring::register::Restriction::sqe_flags_allowed(squeue::Flags::IO_LINK.bits()),
            io_uring::register::Restriction::sqe_flags_required(squeue::Flags::FIXED_FILE.bits()),
        ])?;
        submitter.register_enable_rings()?;
        Ok(UringWriter {
            ring,
            linked,
            iov: Vec::with_capacity(MAX_BATCH * 4),
            frames: Vec::with_capacity(MAX_BATCH),
            done: Vec::with_capacity(MAX_BATCH),
            refused: Vec::with_capacity(MAX_BATCH),
            dead: false,
        })
    }

    /// Whether the ring failed and takes no more batches.
    pub fn is_dead(&self) -> bool {
        self.dead
    }
}

impl GuestMemory {
    /// Writes each frame of `frames` (a head of this process's bytes, a checked header copied
    /// out of guest memory say, then segments of this memory) to the writer's file, one
    /// `writev` each, in order, with one `io_uring_enter` for the batch (at most
    /// [`MAX_BATCH`] frames; more are not tried). Pushes what became of each frame tried into
    /// `out`, in order:
    /// - `Ok(Ok(n))`: written, `n` bytes;
    /// - `Ok(Err(e))`: the file refused it (`WouldBlock` when full); with a linked writer,
    ///   the frames after it are not tried;
    /// - `Err(Error::TooManySegments)`: the frame has more than [`super::MAX_IOVECS`]
    ///   segments, and was not written; the frames after it are;
    /// - `Err(e)`, any other guest error (a segment outside memory): not written, nor are the
    ///   frames after it.
    ///
    /// Frames without an entry in `out` were not tried. The error returned is the ring's own
    /// (it could not submit or wait): the writer is then dead, and `out` still says what
    /// became of the frames it wrote.
    pub fn writev_batch<'a>(
        &self,
        w: &mut UringWriter,
        frames: impl IntoIterator<Item = Gather<'a>>,
        out: &mut Vec<FrameResult>,
    ) -> io::Result<()> {
        if w.dead {
            return Err(io::Error::other("the io_uring writer failed before"));
        }
        // Translate every frame first: `iov` must not move once the kernel has its address.
        w.iov.clear();
        w.frames.clear();
        w.refused.clear();
        for frame in frames.into_iter().take(MAX_BATCH) {
            let start = w.iov.len();
            match self.push_iovecs(frame, &mut w.iov) {
                Ok(()) => {
                    w.frames.push((start, w.iov.len() - start));
                    w.refused.push(None);
                }
                Err(e) => {
                    w.iov.truncate(start);
                    let stop = !matches!(e, Error::TooManySegments { .. });
                    w.refused.push(Some(e));
                    if stop {
                        break;
                    }
                }
            }
        }
        let result = submit(w);
        // Every submitted frame has completed (or the ring is dead and no CQE will come):
        // report in order, up to the first frame not tried.
        let mut done = w.done.iter();
        for refused in w.refused.drain(..) {
            let r = match refused {
                Some(e) => Err(e),
                None => match done.next().copied().flatten() {
                    Some(n) if n >= 0 => Ok(Ok(n as usize)),
                    Some(n) if -n == libc::ECANCELED => break,
                    Some(n) => Ok(Err(io::Error::from_raw_os_error(-n))),
                    None => break,
                },
            };
            let stop = matches!(&r, Err(e) if !matches!(e, Error::TooManySegments { .. }));
            out.push(r);
            if stop {
                break;
            }
        }
        result
    }

    /// Appends the iovecs of `frame` to `iov`, checking each guest segment.
    fn push_iovecs(&self, frame: Gather<'_>, iov: &mut Vec<libc::iovec>) -> Result<(), Error> {
        let count = frame.iovec_count();
        if count > super::MAX_IOVECS {
            return Err(Error::TooManySegments {
                count,
                max: super::MAX_IOVECS,
            });
        }
        if !frame.head.is_empty() {
            iov.push(libc::iovec {
                iov_base: frame.head.as_ptr().cast_mut().cast(),
                iov_len: frame.head.len(),
            });
        }
        for s in frame.body.iter() {
            let span = self.host_span(s.addr, s.len as usize)?;
            iov.push(libc::iovec {
                iov_base: span.ptr.cast(),
                iov_len: span.len,
            });
        }
        Ok(())
    }
}

/// Submits `w.frames` (linked if `w.linked`) and waits for all of them, filling
/// `w.done` (one entry per frame: its result, or None if it was never submitted).
fn submit(w: &mut UringWriter) -> io::Result<()> {
    w.done.clear();
    w.done.resize(w.frames.len(), None);
    let n = w.frames.len();
    if n == 0 {
        return Ok(());
    }
    {
        let mut sq = w.ring.submission();
        for (k, &(start, len)) in w.frames.iter().enumerate() {
            let mut flags = squeue::Flags::empty();
            if w.linked && k + 1 < n {
                flags |= squeue::Flags::IO_LINK;
            }
            // RWF_NOWAIT: a full file fails the write at once (EAGAIN) instead of io_uring
            // waiting for it to drain, which it does even for an O_NONBLOCK file.
            let e = opcode::Writev::new(types::Fixed(0), w.iov[start..].as_ptr(), len as u32)
                .rw_flags(libc::RWF_NOWAIT)
                .build()
                .flags(flags)
                .user_data(k as u64);
            // SAFETY: the iovecs at `w.iov[start..start + len]` were checked to lie inside
            // mappings of the memory borrowed by our caller, `writev_batch`, or are the head
            // of a frame it was lent for the whole call; it does not return before every
            // write submitted here has completed (below) or the ring is dead; `w.iov` is not
            // touched until then. The queue has room: it holds MAX_BATCH
            // entries, is empty between batches, and a batch has at most MAX_BATCH frames.
            if unsafe { sq.push(&e) }.is_err() {
                unreachable!("a batch never exceeds the submission queue");
            }
        }
    }
    // With writes to submit, io_uring_enter returns how many it submitted, or an error when
    // it submitted none (a signal during its wait is then not reported). Without, only
    // waiting, it may return EINTR.
    let again = |e: &io::Error| {
        matches!(
            e.raw_os_error(),
            Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
        )
    };
    let mut tries = 0;
    let submitted = loop {
        match w.ring.submitter().submit_and_wait(n) {
            Ok(k) => break k,
            Err(e) if again(&e) && tries < 100 => tries += 1,
            Err(e) => {
                // The writes are still queued in the ring, where only dropping it takes them
                // back: it takes no batch again.
                w.dead = true;
                return Err(e);
            }
        }
    };
    let mut seen = 0;
    loop {
        for c in w.ring.completion() {
            if let Some(slot @ None) = w.done.get_mut(c.user_data() as usize) {
                *slot = Some(c.result());
                seen += 1;
            }
        }
        if seen >= submitted {
            break;
        }
        match w.ring.submitter().submit_and_wait(submitted - seen) {
            Ok(_) => {}
            Err(e) if again(&e) => {}
            Err(e) => {
                // Writes are in flight that cannot be waited for. They read guest memory the
                // caller still borrows and iovecs the kernel copied at submission; the ring
                // takes no batch again.
                w.dead = true;
                return Err(e);
            }
        }
    }
    if submitted < n {
        // Writes that never reached the kernel stay queued in the ring.
        w.dead = true;
        return Err(io::Error::other(format!(
            "io_uring submitted {submitted} of {n} writes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsFd;

    use super::*;
    use crate::{GuestAddress, Segment};

    fn seg(addr: u64, len: u32) -> Segment {
        Segment {
            addr: GuestAddress(addr),
            len,
        }
    }

    /// Memory with bytes 0, 1, 2, ... (mod 251) from 0x1000, 64 KiB.
    fn memory() -> GuestMemory {
        let mem = GuestMemory::anonymous(&[(GuestAddress(0x1000), 0x10000)]).unwrap();
        let bytes: Vec<u8> = (0..0x10000u32).map(|i| (i % 251) as u8).collect();
        mem.write(GuestAddress(0x1000), &bytes).unwrap();
        mem
    }

    /// A non-blocking pipe holding `size` bytes: (read end, write end).
    fn pipe(size: libc::c_int) -> (std::io::PipeReader, std::io::PipeWriter) {
        let (rd, wr) = std::io::pipe().unwrap();
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        let r = unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
        assert!(r >= 0);
        // SAFETY: as above.
        let r = unsafe { libc::fcntl(wr.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        assert!(r >= 0);
        (rd, wr)
    }

    fn read_all(rd: &mut std::io::PipeReader, n: usize) -> Vec<u8> {
        let mut got = vec![0u8; n];
        rd.read_exact(&mut got).unwrap();
        got
    }

    #[test]
    fn a_batch_is_written_in_order_one_writev_per_frame() {
        let mem = memory();
        let (mut rd, wr) = pipe(1 << 20);
        let mut w = UringWriter::new(wr.as_fd(), true).unwrap();
        // Gathered frames, the second of two segments out of order.
        let frames: Vec<Vec<Segment>> = vec![
            vec![seg(0x1000, 10)],
            vec![seg(0x2000, 5), seg(0x1000, 3)],
            vec![seg(0x3000, 1000)],
        ];
        let mut out = Vec::new();
        mem.writev_batch(
            &mut w,
            frames.iter().map(|f| Gather::from(&f[..])),
            &mut out,
        )
        .unwrap();
        let lens: Vec<usize> = out.into_iter().map(|r| r.unwrap().unwrap()).collect();
        assert_eq!(lens, [10, 8, 1000]);
        let mut want = Vec::new();
        for f in &frames {
            for s in f {
                let mut b = vec![0u8; s.len as usize];
                mem.read(s.addr, &mut b).unwrap();
                want.extend(b);
            }
        }
        assert_eq!(read_all(&mut rd, want.len()), want);
    }

    #[test]
    fn each_frame_of_a_batch_is_its_head_then_its_guest_bytes() {
        let mem = memory();
        mem.write(GuestAddress(0x1000), b"0123456789").unwrap();
        let (mut rd, wr) = pipe(1 << 20);
        let mut w = UringWriter::new(wr.as_fd(), false).unwrap();
        let segs = [seg(0x1000, 10)];
        let frames = [
            Gather::new(b"AB", crate::Tail::after(&segs, 4).unwrap()),
            Gather::new(b"", crate::Tail::after(&segs, 8).unwrap()),
            Gather::new(b"CDE", crate::Tail::after(&segs, 10).unwrap()),
        ];
        let mut out = Vec::new();
        mem.writev_batch(&mut w, frames, &mut out).unwrap();
        let lens: Vec<usize> = out.into_iter().map(|r| r.unwrap().unwrap()).collect();
        assert_eq!(lens, [8, 2, 3]);
        assert_eq!(read_all(&mut rd, 13), b"AB45678989CDE");
    }

    #[test]
    fn a_full_file_stops_the_batch_and_the_frames_after_are_not_tried() {
        let mem = memory();
        let (mut rd, wr) = pipe(4096);
        let mut w = UringWriter::new(wr.as_fd(), true).unwrap();
        let frames: Vec<Vec<Segment>> =
            (0..6).map(|i| vec![seg(0x1000 + i * 2000, 2000)]).collect();
        let mut out = Vec::new();
        mem.writev_batch(
            &mut w,
            frames.iter().map(|f| Gather::from(&f[..])),
            &mut out,
        )
        .unwrap();
        // The frames that fit the pipe's 4096 bytes go; the next finds it full, and the rest
        // are not tried.
        let written = out.iter().take_while(|r| matches!(r, Ok(Ok(2000)))).count();
        assert!(written >= 1, "{out:?}");
        assert_eq!(out.len(), written + 1, "{out:?}");
        let e = out.pop().unwrap().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Once drained, the rest go, in order after the first ones.
        let first = read_all(&mut rd, written * 2000);
        let mut out = Vec::new();
        mem.writev_batch(
            &mut w,
            frames[written..]
                .iter()
                .map(|f| Gather::from(&f[..]))
                .take(1),
            &mut out,
        )
        .unwrap();
        assert!(matches!(out[..], [Ok(Ok(2000))]), "{out:?}");
        let mut want = vec![0u8; (written + 1) * 2000];
        mem.read(GuestAddress(0x1000), &mut want).unwrap();
        assert_eq!([first, read_all(&mut rd, 2000)].concat(), want);
    }

    #[test]
    fn an_unlinked_batch_tries_every_frame() {
        let mem = memory();
        let (mut rd, wr) = pipe(4096);
        let mut w = UringWriter::new(wr.as_fd(), false).unwrap();
        let frames: Vec<Vec<Segment>> =
            (0..6).map(|i| vec![seg(0x1000 + i * 2000, 2000)]).collect();
        let mut out = Vec::new();
        mem.writev_batch(
            &mut w,
            frames.iter().map(|f| Gather::from(&f[..])),
            &mut out,
        )
        .unwrap();
        // Every frame has an outcome: those that fit, then the pipe full for the others.
        assert_eq!(out.len(), 6, "{out:?}");
        let written = out.iter().take_while(|r| matches!(r, Ok(Ok(2000)))).count();
        assert!(written >= 1, "{out:?}");
        for r in &out[written..] {
            assert!(
                matches!(r, Ok(Err(e)) if e.kind() == io::ErrorKind::WouldBlock),
                "{out:?}"
            );
        }
        let mut want = vec![0u8; written * 2000];
        mem.read(GuestAddress(0x1000), &mut want).unwrap();
        assert_eq!(read_all(&mut rd, written * 2000), want);
    }

    #[test]
    fn guest_errors_are_per_frame_and_a_bad_address_ends_the_batch() {
        let mem = memory();
        let (mut rd, wr) = pipe(1 << 20);
        let mut w = UringWriter::new(wr.as_fd(), true).unwrap();
        let long = vec![seg(0x1000, 1); super::super::MAX_IOVECS + 1];
        let frames: Vec<Vec<Segment>> = vec![
            vec![seg(0x1000, 4)],
            long,
            vec![seg(0x1004, 4)],
            vec![seg(0x20000, 4)],
            vec![seg(0x1008, 4)],
        ];
        let mut out = Vec::new();
        mem.writev_batch(
            &mut w,
            frames.iter().map(|f| Gather::from(&f[..])),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 4, "{out:?}");
        assert!(matches!(out[0], Ok(Ok(4))));
        assert!(matches!(out[1], Err(Error::TooManySegments { .. })));
        assert!(matches!(out[2], Ok(Ok(4))));
        assert!(matches!(out[3], Err(Error::AddressOutOfRange { .. })));
        assert_eq!(read_all(&mut rd, 8), [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn the_ring_takes_no_other_file_nor_operation() {
        let (_rd, wr) = pipe(4096);
        let (_rd2, wr2) = pipe(4096);
        let w = UringWriter::new(wr.as_fd(), true).unwrap();
        // Registering another file is refused once the ring runs restricted.
        let e = w
            .ring
            .submitter()
            .register_files_update(0, &[wr2.as_raw_fd()]);
        assert!(e.is_err(), "a restricted ring took another file");
        // A write to an fd that is not the registered one (no FIXED_FILE) is refused.
        let buf = [0u8; 4];
        let e = opcode::Write::new(types::Fd(wr2.as_raw_fd()), buf.as_ptr(), 4)
            .build()
            .user_data(7);
        let mut ring = w.ring;
        // SAFETY: `buf` outlives the wait below.
        unsafe { ring.submission().push(&e).unwrap() };
        ring.submit_and_wait(1).unwrap();
        let c = ring.completion().next().unwrap();
        assert_eq!(c.result(), -libc::EACCES);
    }
}
