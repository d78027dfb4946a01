//! rust-vmm virtio-queue 0.18 as a bench [`RingDevice`], the baseline of the comparison
//! benches and examples (`crates/bench`): its `Queue` over
//! vm-memory's own `GuestMemoryMmap` mapping of the same memfd our driver writes into.
//!
//! Used as its documentation intends: `pop_descriptor_chain`, iterate the chain, `add_used`,
//! then `needs_notification`; `enable_notification` and its re-check before sleeping.

use bench::ring::{DeviceCounts, Popped, RingDevice, RingMemory};
use bench::BenchError;
use virtio_queue::{Queue, QueueT};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};
use vring::Features;

/// virtio-queue's device side and its mapping of the memory.
#[derive(Debug)]
pub struct VqDevice {
    queue: Queue,
    mem: GuestMemoryMmap<()>,
    counts: DeviceCounts,
}

fn vq_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Engine {
        engine: "virtio-queue",
        reason: e.to_string(),
    }
}

impl VqDevice {
    /// Maps `ring`'s memfd again through vm-memory and sets the queue up as a VMM would on
    /// DRIVER_OK. Activate our driver first: it initialises the rings.
    pub fn new(ring: &RingMemory) -> Result<VqDevice, BenchError> {
        let file = FileOffset::new(ring.file()?, 0);
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files([(
            GuestAddress(0),
            ring.size(),
            Some(file),
        )])
        .map_err(vq_error)?;
        let config = ring.config();
        let rings = config.rings();
        let mut queue = Queue::new(config.size()).map_err(vq_error)?;
        queue.try_set_size(config.size()).map_err(vq_error)?;
        queue
            .try_set_desc_table_address(GuestAddress(rings.desc.0))
            .map_err(vq_error)?;
        queue
            .try_set_avail_ring_address(GuestAddress(rings.avail.0))
            .map_err(vq_error)?;
        queue
            .try_set_used_ring_address(GuestAddress(rings.used.0))
            .map_err(vq_error)?;
        queue.set_event_idx(config.features().contains(Features::RING_EVENT_IDX));
        queue.set_ready(true);
        if !queue.is_valid(&mem) {
            return Err(vq_error("queue is not valid for the memory"));
        }
        Ok(VqDevice {
            queue,
            mem,
            counts: DeviceCounts::default(),
        })
    }
}

impl RingDevice for VqDevice {
    const NAME: &'static str = "virtio-queue";

    #[inline]
    fn pop(&mut self) -> Result<Option<Popped>, BenchError> {
        let Some(chain) = self.queue.pop_descriptor_chain(&self.mem) else {
            return Ok(None);
        };
        let head = chain.head_index();
        let (mut descriptors, mut writable) = (0u16, 0u32);
        for desc in chain {
            descriptors += 1;
            if desc.is_write_only() {
                writable += desc.len();
            }
        }
        self.counts.popped += 1;
        Ok(Some(Popped {
            head,
            descriptors,
            writable,
        }))
    }

    #[inline]
    fn add_used(&mut self, head: u16, len: u32) -> Result<(), BenchError> {
        self.queue
            .add_used(&self.mem, head, len)
            .map_err(vq_error)?;
        // virtio-queue publishes used.idx with every element.
        self.counts.used += 1;
        self.counts.used_idx_stores += 1;
        Ok(())
    }

    #[inline]
    fn needs_notification(&mut self) -> Result<bool, BenchError> {
        let need = self.queue.needs_notification(&self.mem).map_err(vq_error)?;
        if need {
            self.counts.notifications += 1;
        } else {
            self.counts.notifications_suppressed += 1;
        }
        Ok(need)
    }

    fn enable_notification(&mut self) -> Result<bool, BenchError> {
        let pending = self
            .queue
            .enable_notification(&self.mem)
            .map_err(vq_error)?;
        if pending {
            self.counts.enable_rechecks_hit += 1;
        }
        Ok(pending)
    }

    fn disable_notification(&mut self) -> Result<(), BenchError> {
        self.queue.disable_notification(&self.mem).map_err(vq_error)
    }

    /// virtio-queue has no used batch: it publishes used.idx in every `add_used`.
    fn set_used_batch(&mut self, _batch: u16) {}

    fn used_batch(&self) -> Option<u16> {
        None
    }

    fn counts(&self) -> DeviceCounts {
        self.counts
    }
}
