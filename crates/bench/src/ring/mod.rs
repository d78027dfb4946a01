//! The ring measurements: our driver side feeding a device-side engine over shared memory.
//!
//! The memory is a memfd mapped twice, as between a vhost-user frontend and backend: the
//! driver uses one mapping ([`RingMemory`]), the device another, made from the same file. The
//! device side is anything that implements [`RingDevice`]: our [`VringDevice`], or (in the
//! comparison benches) rust-vmm's virtio-queue over vm-memory's own mapping of the file.

pub mod device_side;
pub mod pingpong;

use std::fs::File;
use std::sync::Arc;

use serde::Serialize;
use vring::memory::RegionSource;
use vring::{
    Buf, Chain, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, IndirectArea,
    QueueConfig, RingAddresses,
};

use crate::BenchError;

/// The queue size of every ring measurement (as vhost-net and virtio_test use).
pub const QUEUE_SIZE: u16 = 256;
/// Where the data buffers start; the rings sit below, at guest address 0.
const DATA_BASE: u64 = 0x10_0000;
/// The driver's indirect tables (used only when INDIRECT_DESC is negotiated): between the
/// rings and the buffers, room for [`INDIRECT_MAX_CHAIN`] descriptors per head.
const INDIRECT_BASE: u64 = 0x8_0000;
/// The longest chain added as an indirect table: [`ChainShape::FOUR`].
const INDIRECT_MAX_CHAIN: u16 = 4;
// The rings (with at most 3 bytes of padding before the used ring) end below the tables,
// and the tables below the buffers.
const _: () = {
    use vring::layout::{avail_ring_size, desc_table_size, used_ring_size, DESC_SIZE};
    let rings = desc_table_size(QUEUE_SIZE) + avail_ring_size(QUEUE_SIZE) + 3;
    assert!(rings + used_ring_size(QUEUE_SIZE) <= INDIRECT_BASE);
    assert!(INDIRECT_BASE + QUEUE_SIZE as u64 * INDIRECT_MAX_CHAIN as u64 * DESC_SIZE <= DATA_BASE);
};
/// Bytes of memory: the rings, then the buffers. The device never touches buffer bytes; the
/// buffers only have to lie inside memory, since the device side checks that they do.
const MEM_SIZE: usize = 0x20_0000;

/// The shape of every chain the driver adds: `out` device-readable buffers, then `in_`
/// device-writable ones. The device returns each chain with its writable length as used length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChainShape {
    pub out: u8,
    pub in_: u8,
}

impl ChainShape {
    /// One readable descriptor: a transmitted frame.
    pub const ONE: ChainShape = ChainShape { out: 1, in_: 0 };
    /// Two readable descriptors: a buffer in two pieces, the shortest chain that can be added
    /// as an indirect table.
    pub const TWO: ChainShape = ChainShape { out: 2, in_: 0 };
    /// Two readable then two writable descriptors.
    pub const FOUR: ChainShape = ChainShape { out: 2, in_: 2 };

    pub fn descriptors(self) -> u16 {
        self.out as u16 + self.in_ as u16
    }

    /// The buffers of every chain of this shape: 512-byte slices of one page each.
    fn bufs(self) -> (Vec<Buf>, Vec<Buf>) {
        let buf = |i: u8| Buf::new(GuestAddress(DATA_BASE + 4096 * i as u64), 512);
        (
            (0..self.out).map(buf).collect(),
            (self.out..self.out + self.in_).map(buf).collect(),
        )
    }
}

/// The driver's memory for one queue, backed by a memfd that the device side maps again.
#[derive(Debug)]
pub struct RingMemory {
    mem: Arc<GuestMemory>,
    config: QueueConfig,
}

impl RingMemory {
    /// Memory for one queue of [`QUEUE_SIZE`] with the given negotiated `features`.
    pub fn new(features: Features) -> Result<RingMemory, BenchError> {
        let mem = Arc::new(GuestMemory::memfd(&[(GuestAddress(0), MEM_SIZE)])?);
        let rings = RingAddresses::contiguous(GuestAddress(0), QUEUE_SIZE);
        let config = QueueConfig::new(QUEUE_SIZE as u32, rings, features)?;
        Ok(RingMemory { mem, config })
    }

    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// The memory's size in bytes (one region at guest address 0).
    pub fn size(&self) -> usize {
        MEM_SIZE
    }

    /// A new handle on the memfd, for mapping the memory again on the device side.
    pub fn file(&self) -> Result<File, BenchError> {
        let region = self.mem.regions().next();
        let file = region.and_then(|r| r.file).ok_or(BenchError::Inconsistent(
            "memfd-backed memory has no file".into(),
        ))?;
        file.try_clone().map_err(BenchError::io("dup memfd"))
    }

    /// Activates the driver side: rings initialised at index 0. With INDIRECT_DESC
    /// negotiated, chains of 2 to 4 descriptors are added as indirect tables.
    pub fn driver(&self) -> Result<DriverQueue<u32>, BenchError> {
        let indirect = IndirectArea {
            addr: GuestAddress(INDIRECT_BASE),
            max_chain: INDIRECT_MAX_CHAIN,
        };
        Ok(DriverQueue::activate(
            &self.config,
            self.mem.clone(),
            Some(indirect),
        )?)
    }

    /// Our device side, over its own mapping of the memfd (what a backend gets from
    /// SET_MEM_TABLE). Activate the driver first: it initialises the rings.
    pub fn vring_device(&self) -> Result<VringDevice, BenchError> {
        let source = RegionSource {
            guest_addr: GuestAddress(0),
            size: MEM_SIZE as u64,
            user_addr: 0,
            file: self.file()?,
            mmap_offset: 0,
        };
        let mem = Arc::new(GuestMemory::from_sources(vec![source])?);
        let queue = DeviceQueue::activate(&self.config, mem, vring::RingPosition::START)?;
        Ok(VringDevice {
            queue,
            chain: Chain::new(),
            batch: vring::DEFAULT_USED_BATCH.min(QUEUE_SIZE),
        })
    }
}

/// What the device side learned from one popped chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Popped {
    pub head: u16,
    /// Descriptors in the chain.
    pub descriptors: u16,
    /// Bytes the device may write: what it reports as used length.
    pub writable: u32,
}

/// Device-side counters that every engine can report: the engine's own, which the
/// virtio-queue baseline fills in the same way.
pub type DeviceCounts = vring::DeviceStats;

/// A device-side virtqueue engine, as the harnesses drive it. Two implementations: ours
/// ([`VringDevice`]) and rust-vmm's virtio-queue (in the comparison benches).
pub trait RingDevice {
    /// The engine's name in reports.
    const NAME: &'static str;
    /// Pops the next chain and walks it, or `None` when the ring is empty.
    fn pop(&mut self) -> Result<Option<Popped>, BenchError>;
    /// Returns chain `head` used, with `len` bytes written.
    fn add_used(&mut self, head: u16, len: u32) -> Result<(), BenchError>;
    /// Publishes what is pending and says whether the driver wants a used-buffer notification.
    fn needs_notification(&mut self) -> Result<bool, BenchError>;
    /// Asks for available-buffer notifications and re-checks: true if chains are pending.
    fn enable_notification(&mut self) -> Result<bool, BenchError>;
    fn disable_notification(&mut self) -> Result<(), BenchError>;
    /// Used entries per `used.idx` store, where the engine has the knob.
    fn set_used_batch(&mut self, batch: u16);
    /// Used entries per `used.idx` store, if the engine batches them; `None` if it publishes
    /// as it goes (then a device decides on a notification once per drain of the ring).
    fn used_batch(&self) -> Option<u16>;
    fn counts(&self) -> DeviceCounts;
}

/// Our device side: a [`DeviceQueue`] and the chain it pops into, reused across pops.
#[derive(Debug)]
pub struct VringDevice {
    queue: DeviceQueue,
    chain: Chain,
    batch: u16,
}

impl RingDevice for VringDevice {
    const NAME: &'static str = "vring";

    #[inline]
    fn pop(&mut self) -> Result<Option<Popped>, BenchError> {
        if !self.queue.pop_into(&mut self.chain)? {
            return Ok(None);
        }
        Ok(Some(Popped {
            head: self.chain.head(),
            descriptors: self.chain.segments().len() as u16,
            writable: self.chain.writable_len() as u32,
        }))
    }

    #[inline]
    fn add_used(&mut self, head: u16, len: u32) -> Result<(), BenchError> {
        Ok(self.queue.add_used(head, len)?)
    }

    #[inline]
    fn needs_notification(&mut self) -> Result<bool, BenchError> {
        let need = self.queue.needs_notification();
        match self.queue.broken() {
            Some(e) => Err(e.clone().into()),
            None => Ok(need),
        }
    }

    fn enable_notification(&mut self) -> Result<bool, BenchError> {
        Ok(self.queue.enable_notification()?)
    }

    fn disable_notification(&mut self) -> Result<(), BenchError> {
        self.queue.disable_notification();
        Ok(())
    }

    fn set_used_batch(&mut self, batch: u16) {
        self.batch = batch.clamp(1, QUEUE_SIZE);
        self.queue.set_used_batch(self.batch);
    }

    fn used_batch(&self) -> Option<u16> {
        Some(self.batch)
    }

    fn counts(&self) -> DeviceCounts {
        self.queue.stats()
    }
}

/// The driver's side of a chain shape: the buffers it adds for every chain.
#[derive(Debug)]
pub(crate) struct ChainBufs {
    out: Vec<Buf>,
    in_: Vec<Buf>,
    descriptors: u16,
}

impl ChainBufs {
    pub(crate) fn new(shape: ChainShape) -> ChainBufs {
        let (out, in_) = shape.bufs();
        ChainBufs {
            out,
            in_,
            descriptors: shape.descriptors(),
        }
    }

    /// Adds one chain if there is room; false when the ring is full. An indirect chain
    /// takes one descriptor of the ring.
    #[inline]
    pub(crate) fn add(
        &self,
        driver: &mut DriverQueue<u32>,
        token: u32,
    ) -> Result<bool, BenchError> {
        let needed = if driver.uses_indirect(self.descriptors as usize) {
            1
        } else {
            self.descriptors
        };
        if driver.num_free() < needed {
            return Ok(false);
        }
        driver.add(&self.out, &self.in_, token)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_the_same_ring() {
        let ring = RingMemory::new(Features::RING_EVENT_IDX).unwrap();
        let mut driver = ring.driver().unwrap();
        let mut device = ring.vring_device().unwrap();
        let bufs = ChainBufs::new(ChainShape::FOUR);
        assert!(bufs.add(&mut driver, 7).unwrap());
        let p = device.pop().unwrap().unwrap();
        assert_eq!((p.descriptors, p.writable), (4, 1024));
        device.add_used(p.head, p.writable).unwrap();
        device.needs_notification().unwrap();
        assert_eq!(driver.get_used().unwrap(), Some((7, 1024)));
        assert_eq!(device.counts().popped, 1);
    }
}
