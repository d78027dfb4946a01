//! Guest tx frames written in bursts: one `io_uring_enter` for up to 64 frames, each its own
//! writev of its header copy and the frame after it straight from guest memory
//! (`vring::UringWriter`), and the outcome of each frame as the tx path needs it ([`Sent`]),
//! in order.
//!
//! Ports whose fd takes one frame per write (a TAP) use it for [`super::Port::send`].

use std::io;
use std::os::fd::BorrowedFd;

use vring::memory::{FrameResult, MAX_URING_BATCH};
use vring::{Error as RingError, Gather, GuestMemory, UringWriter};

use super::{tx_outcome, Sent};

/// Batched writes to one fd, and the scratch space of a batch.
#[derive(Debug)]
pub struct BatchWriter {
    uring: UringWriter,
    results: Vec<FrameResult>,
}

impl BatchWriter {
    /// Writes to `fd`. `pushback`: the fd may say it is full, and a batch then stops at the
    /// frame that found it so (linked writes), so that it and the frames after it wait on the
    /// ring in order. Without, writes are unlinked, which costs less.
    pub fn new(fd: BorrowedFd<'_>, pushback: bool) -> io::Result<BatchWriter> {
        Ok(BatchWriter {
            uring: UringWriter::new(fd, pushback)?,
            results: Vec::with_capacity(MAX_URING_BATCH),
        })
    }

    /// Whether the ring failed: the caller writes with system calls from then on.
    pub fn is_dead(&self) -> bool {
        self.uring.is_dead()
    }

    /// Writes `frames` (at most [`MAX_URING_BATCH`]), in order, and pushes what became of each
    /// into `sent`, as [`super::Port::send`] does: the first frame not tried ends the batch, and
    /// so does a frame the fd pushed back ([`Sent::Busy`]) with linked writes. A frame whose
    /// segments are outside memory is the guest's error, returned; the batch ends before it.
    pub fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let frames = &frames[..frames.len().min(MAX_URING_BATCH)];
        self.results.clear();
        if let Err(e) = mem.writev_batch(&mut self.uring, frames.iter().copied(), &mut self.results)
        {
            // `results` still says what became of the frames it wrote.
            tracing::warn!(error = %e, "io_uring failed");
        }
        for k in 0..self.results.len() {
            let r = std::mem::replace(&mut self.results[k], Ok(Ok(0)));
            let later_taken = || self.results[k + 1..].iter().any(|r| matches!(r, Ok(Ok(_))));
            match tx_outcome(r)? {
                // Unlinked writes (the fd never pushes back but for a failed allocation): a
                // frame after this one went out, so this one cannot wait on the ring for its
                // turn. Dropped and counted.
                Sent::Busy if later_taken() => sent.push(Sent::Dropped),
                Sent::Busy => {
                    sent.push(Sent::Busy);
                    break;
                }
                s => sent.push(s),
            }
        }
        Ok(())
    }
}
