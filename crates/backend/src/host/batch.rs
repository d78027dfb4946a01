//! Guest tx frames written in bursts: one `io_uring_enter` for up to 64 frames, each its own
//! writev of its checked header copy and the frame after it straight from guest memory
//! (`vring::UringWriter`), and the outcome of each frame as the worker needs it ([`Sent`]), in
//! order.
//!
//! Ports whose fd takes one frame per write (a TAP) use it for [`super::Host::send_batch`].

use std::io;
use std::os::fd::BorrowedFd;

use vring::memory::{FrameResult, MAX_URING_BATCH};
use vring::{Chain, Error as RingError, Gather, GuestMemory, Tail, UringWriter};

use super::tap::{Checked, TxHead};
use super::{tx_outcome, Sent};

/// Batched writes to one fd, and the scratch space of a batch.
#[derive(Debug)]
pub struct BatchWriter {
    uring: UringWriter,
    /// The chains of the batch that were written (by index), and their results.
    written: Vec<usize>,
    results: Vec<FrameResult>,
}

impl BatchWriter {
    /// Writes to `fd`. `pushback`: the fd may say it is full, and a batch then stops at the
    /// frame that found it so (linked writes), so that it and the frames after it wait on the
    /// ring in order. Without, writes are unlinked, which costs less.
    pub fn new(fd: BorrowedFd<'_>, pushback: bool) -> io::Result<BatchWriter> {
        Ok(BatchWriter {
            uring: UringWriter::new(fd, pushback)?,
            written: Vec::with_capacity(MAX_URING_BATCH),
            results: Vec::with_capacity(MAX_URING_BATCH),
        })
    }

    /// Whether the ring failed: the caller writes with system calls from then on.
    pub fn is_dead(&self) -> bool {
        self.uring.is_dead()
    }

    /// Writes the frames of `chains` that `check` passes, in order, and pushes what became of
    /// each chain into `sent`, as [`super::Host::send_batch`] does (a frame `check` refuses
    /// is not written, and its outcome keeps its place). What is written of a frame is the
    /// header copy `check` checked, then the frame after it. `check`'s outer error is a ring
    /// error about that chain; the batch ends before it.
    pub fn send<'c>(
        &mut self,
        mem: &GuestMemory,
        chains: &'c [Chain],
        sent: &mut Vec<Sent>,
        mut check: impl FnMut(&'c Chain) -> Result<Checked<'c>, RingError>,
    ) -> Result<(), RingError> {
        let first = sent.len();
        let mut error = None;
        self.written.clear();
        // Each written frame's header copy and body, by its place in `written`.
        let mut heads = [TxHead::default(); MAX_URING_BATCH];
        let mut bodies = [Tail::default(); MAX_URING_BATCH];
        for (i, c) in chains.iter().enumerate().take(MAX_URING_BATCH) {
            match check(c) {
                Ok(Ok((head, body))) => {
                    heads[self.written.len()] = head;
                    bodies[self.written.len()] = body;
                    self.written.push(i);
                    sent.push(Sent::Taken);
                }
                Ok(Err(why)) => sent.push(Sent::Refused(why)),
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        }
        self.results.clear();
        let frames = (0..self.written.len()).map(|k| Gather::new(heads[k].as_bytes(), bodies[k]));
        if let Err(e) = mem.writev_batch(&mut self.uring, frames, &mut self.results) {
            // `results` still says what became of the frames it wrote.
            tracing::warn!(error = %e, "io_uring failed");
        }
        // Each frame written has its outcome; the first one not tried ends the batch there.
        let mut end = sent.len();
        for (k, &i) in self.written.iter().enumerate() {
            let Some(r) = self.results.get_mut(k) else {
                end = first + i;
                break;
            };
            let r = std::mem::replace(r, Ok(Ok(0)));
            let later_taken = || self.results[k + 1..].iter().any(|r| matches!(r, Ok(Ok(_))));
            match tx_outcome(r) {
                // Unlinked writes (the fd never pushes back but for a failed allocation): a
                // frame after this one went out, so this one cannot wait on the ring for its
                // turn. Dropped and counted.
                Ok(Sent::Busy) if later_taken() => sent[first + i] = Sent::Dropped,
                Ok(s) => {
                    sent[first + i] = s;
                    if matches!(s, Sent::Busy) {
                        end = first + i + 1;
                        break;
                    }
                }
                Err(e) => {
                    end = first + i;
                    error = Some(e);
                    break;
                }
            }
        }
        sent.truncate(end);
        error.map_or(Ok(()), Err)
    }
}
