//! The guest memory both targets run in: where the rings, indirect tables and data go.
//!
//! Two regions with a gap between them, so that "inside memory" has edges to find: region 0
//! holds the rings, the indirect areas and a data area that ends with the region, region 1 is a
//! small second data area.

use std::sync::Arc;

use vring::{GuestAddress, GuestMemory, RingAddresses};

pub const REGION0: (u64, u64) = (0, 0x4_0000);
pub const REGION1: (u64, u64) = (0x10_0000, 0x1000);

/// Ring addresses for [`Placement::Separate`]: one 4 KiB page each (enough for size 256).
pub const DESC: u64 = 0x0000;
pub const AVAIL: u64 = 0x1000;
pub const USED: u64 = 0x2000;
/// Base for [`Placement::Contiguous`] (`RingAddresses::contiguous`).
pub const CONTIGUOUS: u64 = 0x4000;
/// Indirect tables the device-side fuzzer lays out: 256 descriptors.
pub const DEV_INDIRECT: u64 = 0x8000;
pub const DEV_INDIRECT_LEN: u64 = 0x1000;
/// The driver's `IndirectArea`: room for 256 heads of 16 entries.
pub const DRV_INDIRECT: u64 = 0x1_0000;
/// Data buffers: the last 64 KiB of region 0, so offsets near the top run off its end.
pub const DATA: u64 = 0x3_0000;

/// Largest queue size the targets use: `1 << (size_log2 % 9)`. Bigger queues only make the
/// rings longer; every check that depends on the size is exercised from 1 to 256.
pub fn queue_size(size_log2: u8) -> u16 {
    1 << (size_log2 % 9)
}

/// Where the three rings go.
#[derive(arbitrary::Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// One page each, apart.
    Separate,
    /// Packed one after another, as a driver lays them out.
    Contiguous,
    /// Anywhere in region 0, aligned (offsets are scaled by the alignment and wrapped), so the
    /// rings may overlap each other, the indirect area or the data area.
    Custom { desc: u16, avail: u16, used: u16 },
}

impl crate::encode::Encode for Placement {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Placement::Separate => crate::encode::variant(0, 3, out),
            Placement::Contiguous => crate::encode::variant(1, 3, out),
            Placement::Custom { desc, avail, used } => {
                crate::encode::variant(2, 3, out);
                desc.encode(out);
                avail.encode(out);
                used.encode(out);
            }
        }
    }
}

impl Placement {
    pub fn rings(self, size: u16) -> RingAddresses {
        match self {
            Placement::Separate => RingAddresses {
                desc: GuestAddress(DESC),
                avail: GuestAddress(AVAIL),
                used: GuestAddress(USED),
            },
            Placement::Contiguous => RingAddresses::contiguous(GuestAddress(CONTIGUOUS), size),
            Placement::Custom { desc, avail, used } => {
                let at = |off: u16, align: u64| GuestAddress((off as u64 * align) % REGION0.1);
                RingAddresses {
                    desc: at(desc, 16),
                    avail: at(avail, 2),
                    used: at(used, 4),
                }
            }
        }
    }
}

/// A fresh, zeroed memory.
pub fn memory() -> Arc<GuestMemory> {
    let layout = [
        (GuestAddress(REGION0.0), REGION0.1 as usize),
        (GuestAddress(REGION1.0), REGION1.1 as usize),
    ];
    Arc::new(GuestMemory::anonymous(&layout).expect("mapping fuzz memory"))
}

/// Whether `[addr, addr + len)` lies inside one region: the harness's own answer, computed
/// from the layout above, to check `GuestMemory::contains` against.
pub fn inside(addr: u64, len: u64) -> bool {
    [REGION0, REGION1]
        .iter()
        .any(|&(base, size)| addr >= base && addr - base < size && len <= size - (addr - base))
}

/// Writes `bytes` at `addr` as a peer would, clipped to region 0 (the peer cannot write outside
/// the memory it shares).
pub fn poke(mem: &GuestMemory, addr: u64, bytes: &[u8]) {
    if addr >= REGION0.1 {
        return;
    }
    let n = bytes.len().min((REGION0.1 - addr) as usize);
    mem.write(GuestAddress(addr), &bytes[..n])
        .expect("poke inside region 0");
}

pub fn poke16(mem: &GuestMemory, addr: u64, v: u16) {
    poke(mem, addr, &v.to_le_bytes());
}

pub fn peek16(mem: &GuestMemory, addr: u64) -> u16 {
    let mut b = [0u8; 2];
    mem.read(GuestAddress(addr), &mut b)
        .expect("peek inside memory");
    u16::from_le_bytes(b)
}

pub fn peek32(mem: &GuestMemory, addr: u64) -> u32 {
    let mut b = [0u8; 4];
    mem.read(GuestAddress(addr), &mut b)
        .expect("peek inside memory");
    u32::from_le_bytes(b)
}

/// Whether the byte ranges overlap (empty ranges never do).
pub fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}
