//! Packet buffers in the frontend's memory.

use vring::GuestAddress;

use crate::frontend::{Allocator, FrontendError};

/// Packet buffers carved from frontend memory, one per token.
#[derive(Debug)]
pub(crate) struct BufPool {
    base: GuestAddress,
    pub(crate) buf_len: u32,
    /// Free slots. rx takes the oldest (FIFO, with the engine's FIFO descriptor reuse, so a
    /// buffer goes back to the descriptor and avail entry it had); tx the newest, whose
    /// lines are likeliest still in our cache, or with IN_ORDER the oldest, as rx.
    pub(crate) free: std::collections::VecDeque<u16>,
}

impl BufPool {
    pub(crate) fn new(
        alloc: &mut Allocator,
        count: u16,
        buf_len: u32,
    ) -> Result<BufPool, FrontendError> {
        let base = alloc.alloc(count as u64 * buf_len as u64, 64)?;
        Ok(BufPool {
            base,
            buf_len,
            free: (0..count).rev().collect(),
        })
    }
    pub(crate) fn addr(&self, slot: u16) -> GuestAddress {
        GuestAddress(self.base.0 + slot as u64 * self.buf_len as u64)
    }
}
