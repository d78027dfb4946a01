//! Split virtqueue layout (VIRTIO 1.2, section 2.7): sizes, alignments and field offsets, each
//! with its formula. `n` is the queue size.

use crate::{Error, GuestAddress};

/// The largest queue size the split ring allows.
pub const MAX_QUEUE_SIZE: u16 = 32768;

/// A descriptor: `le64 addr; le32 len; le16 flags; le16 next` = 16 bytes.
pub const DESC_SIZE: u64 = 16;
/// A used element: `le32 id; le32 len` = 8 bytes.
pub const USED_ELEM_SIZE: u64 = 8;

/// Alignment of the descriptor table (spec 2.7, "Virtqueue Alignment").
pub const DESC_ALIGN: u64 = 16;
/// Alignment of the available ring.
pub const AVAIL_ALIGN: u64 = 2;
/// Alignment of the used ring.
pub const USED_ALIGN: u64 = 4;
/// Where [`RingAddresses::contiguous`] starts the used ring: on a cache line of its own,
/// as Linux's virtio_pci lays out a modern queue (`SMP_CACHE_BYTES`). Packed right after the
/// avail ring, the used index (the device writes it, the driver polls it) shares a line with
/// the avail ring's tail and `used_event` (the driver writes them): two-thread ping-pong
/// publishing every used entry ran 1.26x faster with the line split (docs/PERFORMANCE.md).
pub const DRIVER_USED_ALIGN: u64 = 64;

/// Descriptor flags (`VIRTQ_DESC_F_*`).
pub const DESC_F_NEXT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_NEXT as u16;
pub const DESC_F_WRITE: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as u16;
pub const DESC_F_INDIRECT: u16 = virtio_bindings::virtio_ring::VRING_DESC_F_INDIRECT as u16;
/// `avail.flags`: the driver asks for no used-buffer notifications (flag mode only).
pub const AVAIL_F_NO_INTERRUPT: u16 =
    virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT as u16;
/// `used.flags`: the device asks for no available-buffer notifications (flag mode only).
pub const USED_F_NO_NOTIFY: u16 = virtio_bindings::virtio_ring::VRING_USED_F_NO_NOTIFY as u16;

/// Descriptor table size: `16 * n`.
pub const fn desc_table_size(n: u16) -> u64 {
    DESC_SIZE * n as u64
}

/// Available ring size: `flags (2) + idx (2) + ring (2 * n) + used_event (2)` = `6 + 2 * n`.
pub const fn avail_ring_size(n: u16) -> u64 {
    6 + 2 * n as u64
}

/// Used ring size: `flags (2) + idx (2) + ring (8 * n) + avail_event (2)` = `6 + 8 * n`.
pub const fn used_ring_size(n: u16) -> u64 {
    6 + USED_ELEM_SIZE * n as u64
}

/// Offset of `avail.ring[i]`: `4 + 2 * i`. `used_event` is `avail.ring[n]`.
pub const fn avail_ring_offset(i: u16) -> u64 {
    4 + 2 * i as u64
}

/// Offset of `used.ring[i]`: `4 + 8 * i`. `avail_event` is at `4 + 8 * n`, just past the ring.
pub const fn used_ring_offset(i: u16) -> u64 {
    4 + USED_ELEM_SIZE * i as u64
}

/// Checks that `size` is a valid split-ring queue size: a power of two from 1 to 32768.
pub fn check_queue_size(size: u32) -> Result<u16, Error> {
    if size == 0 || size > MAX_QUEUE_SIZE as u32 || !size.is_power_of_two() {
        return Err(Error::InvalidQueueSize { size });
    }
    Ok(size as u16)
}

/// Where the three parts of one queue live in guest memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingAddresses {
    pub desc: GuestAddress,
    pub avail: GuestAddress,
    pub used: GuestAddress,
}

impl RingAddresses {
    /// The three parts one after another from `base` (which must be 16-aligned), the used ring
    /// aligned up to [`DRIVER_USED_ALIGN`]: how a driver lays out a queue in memory it owns.
    pub fn contiguous(base: GuestAddress, size: u16) -> RingAddresses {
        let avail = base.0 + desc_table_size(size);
        let used = (avail + avail_ring_size(size)).next_multiple_of(DRIVER_USED_ALIGN);
        RingAddresses {
            desc: base,
            avail: GuestAddress(avail),
            used: GuestAddress(used),
        }
    }

    /// Bytes from `base` to the end of the used ring, for [`RingAddresses::contiguous`].
    pub fn contiguous_len(size: u16) -> u64 {
        let avail_end = desc_table_size(size) + avail_ring_size(size);
        avail_end.next_multiple_of(DRIVER_USED_ALIGN) + used_ring_size(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_spec_formulas() {
        // Spec 2.7: desc 16*n, avail 6+2*n, used 6+8*n (with the event fields).
        for n in [1u16, 2, 256, 1024, 32768] {
            assert_eq!(desc_table_size(n), 16 * n as u64);
            assert_eq!(avail_ring_size(n), 6 + 2 * n as u64);
            assert_eq!(used_ring_size(n), 6 + 8 * n as u64);
            // used_event sits at avail->ring[n], avail_event at used->ring[n].
            assert_eq!(avail_ring_offset(n), avail_ring_size(n) - 2);
            assert_eq!(used_ring_offset(n), used_ring_size(n) - 2);
        }
    }

    #[test]
    fn queue_size_must_be_a_power_of_two_up_to_32768() {
        assert_eq!(check_queue_size(256), Ok(256));
        assert_eq!(check_queue_size(32768), Ok(32768));
        assert_eq!(check_queue_size(1), Ok(1));
        for bad in [0u32, 3, 100, 65536, 32769] {
            assert_eq!(
                check_queue_size(bad),
                Err(Error::InvalidQueueSize { size: bad })
            );
        }
    }

    #[test]
    fn contiguous_layout_is_aligned_and_disjoint() {
        for n in [1u16, 2, 4, 256, 32768] {
            let a = RingAddresses::contiguous(GuestAddress(0x1000), n);
            assert_eq!(a.desc.0 % DESC_ALIGN, 0);
            assert_eq!(a.avail.0 % AVAIL_ALIGN, 0);
            assert_eq!(a.used.0 % DRIVER_USED_ALIGN, 0);
            // The used index is on no line the avail ring (or used_event) touches.
            let line = DRIVER_USED_ALIGN;
            assert!((a.avail.0 + avail_ring_size(n)).div_ceil(line) <= a.used.0 / line);
            assert!(a.desc.0 + desc_table_size(n) <= a.avail.0);
            assert!(a.avail.0 + avail_ring_size(n) <= a.used.0);
            assert_eq!(
                a.used.0 + used_ring_size(n),
                0x1000 + RingAddresses::contiguous_len(n)
            );
        }
    }
}
