//! Unit-test scaffolding: a queue whose device side a test drives by hand.

use virtnet_sys::PeerEventFd;
use vring::GuestAddress;

use crate::frontend::Allocator;

/// For unit tests that drive a queue's device side by hand: 1 MiB of memory, the setup of
/// virtqueue `index` (`size` entries, rings at 4 KiB, no indirect area, non-blocking
/// eventfds) and an allocator over the memory past the rings.
pub(crate) fn hand_built(
    index: u16,
    size: u16,
    features: vring::Features,
) -> (
    std::sync::Arc<vring::GuestMemory>,
    crate::frontend::QueueSetup,
    Allocator,
) {
    use crate::frontend::QueueSetup;
    use std::sync::Arc;
    use vring::{GuestMemory, QueueConfig, RingAddresses};
    const MEM: usize = 1 << 20;
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM)]).unwrap());
    let rings = RingAddresses::contiguous(GuestAddress(0x1000), size);
    let setup = QueueSetup {
        index,
        config: QueueConfig::new(size as u32, rings, features).unwrap(),
        indirect: None,
        kick: PeerEventFd::new().unwrap(),
        call: PeerEventFd::new().unwrap(),
    };
    let alloc = Allocator::over(GuestAddress(0x1_0000), MEM as u64);
    (mem, setup, alloc)
}
