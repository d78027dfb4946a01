//! A driver and a device over the same queue in one memory, for unit tests.

use std::sync::Arc;

use crate::*;

pub const RING_BASE: GuestAddress = GuestAddress(0x1000);
pub const INDIRECT_BASE: GuestAddress = GuestAddress(0x10_0000);
pub const DATA_BASE: GuestAddress = GuestAddress(0x20_0000);
pub const MEM_SIZE: usize = 0x40_0000;

pub struct Pair {
    pub mem: Arc<GuestMemory>,
    pub config: QueueConfig,
    pub driver: DriverQueue<u32>,
    pub device: DeviceQueue,
}

pub fn pair(size: u16, features: Features) -> Pair {
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
    let config = QueueConfig::new(
        size as u32,
        RingAddresses::contiguous(RING_BASE, size),
        features,
    )
    .unwrap();
    let area = IndirectArea {
        addr: INDIRECT_BASE,
        max_chain: 16,
    };
    let driver = DriverQueue::activate(&config, mem.clone(), Some(area)).unwrap();
    let device = DeviceQueue::activate(&config, mem.clone(), crate::RingPosition::START).unwrap();
    Pair {
        mem,
        config,
        driver,
        device,
    }
}

/// A buffer of `len` bytes in the data area, the `i`th of 4 KiB slots.
pub fn buf(i: u64, len: u32) -> driver::Buf {
    driver::Buf::new(GuestAddress(DATA_BASE.0 + i * 4096), len)
}

impl Pair {
    /// Writes raw descriptor `i` of the table.
    pub fn write_desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.write_desc_at(
            GuestAddress(self.config.rings().desc.0 + i as u64 * 16),
            addr,
            len,
            flags,
            next,
        );
    }

    pub fn write_desc_at(&self, at: GuestAddress, addr: u64, len: u32, flags: u16, next: u16) {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&addr.to_le_bytes());
        b[8..12].copy_from_slice(&len.to_le_bytes());
        b[12..14].copy_from_slice(&flags.to_le_bytes());
        b[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write(at, &b).unwrap();
    }

    /// Publishes `heads` on the avail ring from index `start`, as a (possibly hostile) driver.
    pub fn publish(&self, start: u16, heads: &[u16]) {
        let avail = self.config.rings().avail.0;
        let n = self.config.size();
        for (k, &h) in heads.iter().enumerate() {
            let slot = start.wrapping_add(k as u16) & (n - 1);
            self.mem
                .write(GuestAddress(avail + 4 + 2 * slot as u64), &h.to_le_bytes())
                .unwrap();
        }
        self.set_avail_idx(start.wrapping_add(heads.len() as u16));
    }

    pub fn set_avail_idx(&self, idx: u16) {
        self.mem
            .write(
                GuestAddress(self.config.rings().avail.0 + 2),
                &idx.to_le_bytes(),
            )
            .unwrap();
    }
}
