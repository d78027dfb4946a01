//! The frontend's memory: one memfd region shared with the backend (SET_MEM_TABLE), where it
//! starts, the bump allocator that carves rings, indirect tables and packet buffers from it,
//! and the frontend virtual addresses the backend is given for them.

use vring::GuestAddress;

use super::{Connection, FrontendError};

/// Guest address where the frontend's memory starts (any page-aligned value works).
pub(super) const MEM_BASE: u64 = 0x1_0000_0000;

/// A bump allocator over the frontend's memory.
#[derive(Debug)]
pub struct Allocator {
    pub(super) next: u64,
    pub(super) end: u64,
}

impl Allocator {
    /// An allocator over `[start, end)`, for unit tests that build queues by hand.
    #[cfg(test)]
    pub(crate) fn over(start: GuestAddress, end: u64) -> Allocator {
        Allocator { next: start.0, end }
    }

    pub fn alloc(&mut self, len: u64, align: u64) -> Result<GuestAddress, FrontendError> {
        let at = self.next.next_multiple_of(align);
        if at + len > self.end {
            return Err(FrontendError::OutOfMemory {
                wanted: at + len - self.end,
            });
        }
        self.next = at + len;
        Ok(GuestAddress(at))
    }
}

impl Connection {
    /// The frontend virtual address of `a`: how ring addresses travel to the backend.
    pub(super) fn user_addr(&self, a: GuestAddress) -> u64 {
        let r = self.mem.regions().next().expect("one region");
        r.user_addr + (a.0 - r.guest_addr.0)
    }
}
