//! A reference walk of a descriptor chain, written from the spec (2.7.5, 2.7.5.3) in the
//! plainest way: every descriptor copied out of memory byte by byte, every rule checked where
//! the spec states it. The targets compare `DeviceQueue::pop` with it (same chain, or refused
//! for the same reason), and the driver target reads back the chains `DriverQueue::add` wrote.

use vring::{Error, GuestAddress, GuestMemory};

pub const NEXT: u16 = 1;
pub const WRITE: u16 = 2;
pub const INDIRECT: u16 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// Reads the 16 bytes of a descriptor at `at`, or `None` when they are not all in memory.
pub fn read_desc(mem: &GuestMemory, at: u64) -> Option<Desc> {
    let mut b = [0u8; 16];
    mem.read(GuestAddress(at), &mut b).ok()?;
    Some(Desc {
        addr: u64::from_le_bytes(b[0..8].try_into().unwrap()),
        len: u32::from_le_bytes(b[8..12].try_into().unwrap()),
        flags: u16::from_le_bytes(b[12..14].try_into().unwrap()),
        next: u16::from_le_bytes(b[14..16].try_into().unwrap()),
    })
}

/// One buffer of a walked chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

/// Why the reference walk refuses a chain, named as `vring::Error`'s chain variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    NextOutOfRange,
    ChainLoop,
    IndirectNotNegotiated,
    IndirectWithNext,
    NestedIndirect,
    IndirectBadLength,
    IndirectTooLarge,
    IndirectOutOfMemory,
    BufferOutOfMemory,
    ReadableAfterWritable,
}

impl Refusal {
    /// Whether `e` is the error vring should report for this refusal.
    pub fn matches(self, e: &Error) -> bool {
        use Refusal::*;
        matches!(
            (self, e),
            (NextOutOfRange, Error::NextOutOfRange { .. })
                | (ChainLoop, Error::ChainLoop { .. })
                | (IndirectNotNegotiated, Error::IndirectNotNegotiated { .. })
                | (IndirectWithNext, Error::IndirectWithNext { .. })
                | (NestedIndirect, Error::NestedIndirect { .. })
                | (IndirectBadLength, Error::IndirectBadLength { .. })
                | (IndirectTooLarge, Error::IndirectTooLarge { .. })
                | (IndirectOutOfMemory, Error::IndirectOutOfMemory { .. })
                | (BufferOutOfMemory, Error::BufferOutOfMemory { .. })
                | (ReadableAfterWritable, Error::ReadableAfterWritable { .. })
        )
    }
}

/// What the walk checks beyond the chain's shape.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// INDIRECT_DESC was negotiated.
    pub indirect_ok: bool,
    /// Buffers and indirect tables must lie inside memory (checked with [`crate::mem::inside`],
    /// not with `GuestMemory`). The driver target turns this off: its buffers are its own.
    pub check_memory: bool,
}

struct Walk {
    segs: Vec<Seg>,
    check_memory: bool,
}

impl Walk {
    fn push(&mut self, d: Desc) -> Result<(), Refusal> {
        if self.check_memory && !crate::mem::inside(d.addr, d.len as u64) {
            return Err(Refusal::BufferOutOfMemory);
        }
        let write = d.flags & WRITE != 0;
        // 2.7.4.2: the driver MUST place device-writable descriptors after readable ones.
        if !write && self.segs.last().is_some_and(|s| s.write) {
            return Err(Refusal::ReadableAfterWritable);
        }
        self.segs.push(Seg {
            addr: d.addr,
            len: d.len,
            write,
        });
        Ok(())
    }
}

/// Walks the chain at `head` (< `size`) of the table at `desc_table`.
pub fn walk(
    mem: &GuestMemory,
    desc_table: u64,
    size: u16,
    head: u16,
    rules: Rules,
) -> Result<Vec<Seg>, Refusal> {
    let mut w = Walk {
        segs: Vec::new(),
        check_memory: rules.check_memory,
    };
    let mut index = head;
    // A chain without loops visits each of the `size` descriptors at most once.
    for _ in 0..size {
        let d = read_desc(mem, desc_table + 16 * index as u64).expect("table inside memory");
        if d.flags & INDIRECT != 0 {
            if !rules.indirect_ok {
                return Err(Refusal::IndirectNotNegotiated);
            }
            if d.flags & NEXT != 0 {
                return Err(Refusal::IndirectWithNext);
            }
            walk_table(&mut w, mem, size, d)?;
            return Ok(w.segs);
        }
        w.push(d)?;
        if d.flags & NEXT == 0 {
            return Ok(w.segs);
        }
        if d.next >= size {
            return Err(Refusal::NextOutOfRange);
        }
        index = d.next;
    }
    Err(Refusal::ChainLoop)
}

fn walk_table(w: &mut Walk, mem: &GuestMemory, size: u16, d: Desc) -> Result<(), Refusal> {
    if d.len == 0 || !d.len.is_multiple_of(16) {
        return Err(Refusal::IndirectBadLength);
    }
    let entries = d.len / 16;
    if entries > size as u32 {
        return Err(Refusal::IndirectTooLarge);
    }
    if w.check_memory && !crate::mem::inside(d.addr, d.len as u64) {
        return Err(Refusal::IndirectOutOfMemory);
    }
    let mut i = 0u32;
    for _ in 0..entries {
        let e = read_desc(mem, d.addr + 16 * i as u64).ok_or(Refusal::IndirectOutOfMemory)?;
        if e.flags & INDIRECT != 0 {
            return Err(Refusal::NestedIndirect);
        }
        w.push(e)?;
        if e.flags & NEXT == 0 {
            return Ok(());
        }
        if e.next as u32 >= entries {
            return Err(Refusal::NextOutOfRange);
        }
        i = e.next as u32;
    }
    Err(Refusal::ChainLoop)
}
