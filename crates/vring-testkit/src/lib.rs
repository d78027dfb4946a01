//! Ring-level test scaffolding (a dev-dependency only, never shipped): a driver queue and a
//! device queue on one virtqueue in one anonymous memory, the way a guest and a device share a
//! ring ([`pair`]), and guest memory in a file on /dev/shm ([`shm_memory`]).
//!
//! It depends on vring alone, so that vring's integration tests build nothing else; `testkit`
//! re-exports it as `testkit::pair` for the tests that need the backend and the driver too.
//! vring's own unit tests keep a copy of their own (`vring/src/testutil.rs`): a crate's unit
//! tests cannot use a crate that depends on the crate under test.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use vring::{
    Buf, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, IndirectArea, QueueConfig,
    RingAddresses,
};

/// Where the rings start.
pub const RING_BASE: GuestAddress = GuestAddress(0x1000);
/// The driver's indirect tables.
pub const INDIRECT_BASE: GuestAddress = GuestAddress(0x10_0000);
/// Buffers: [`Pair::buf`] hands out 4 KiB slots from here.
pub const DATA_BASE: GuestAddress = GuestAddress(0x20_0000);
/// The memory: 4 MiB from guest address 0.
pub const MEM_SIZE: usize = 0x40_0000;

/// `len` bytes of guest memory at guest address 0 in a file on /dev/shm that nobody sealed
/// (what QEMU's `memory-backend-file` makes), mapped as a backend maps a frontend's, with user
/// address `user_addr`; and the file, for a test to shrink it. The file is unlinked at once.
pub fn shm_memory(tag: &str, len: u64, user_addr: u64) -> (std::fs::File, GuestMemory) {
    let path = shm_path(tag);
    let file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("a file on /dev/shm");
    std::fs::remove_file(&path).expect("unlink");
    file.set_len(len).expect("size");
    let source = vring::memory::RegionSource {
        guest_addr: GuestAddress(0),
        size: len,
        user_addr,
        file: file.try_clone().expect("file"),
        mmap_offset: 0,
    };
    let mem = GuestMemory::from_sources(vec![source]).expect("mapping");
    (file, mem)
}

/// `/dev/shm/vring-testkit-<tag>-<pid>-<n>`: a path no other test of this process or of a
/// concurrent one opens. The file lives only until [`shm_memory`] unlinks it.
fn shm_path(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    assert!(
        !tag.is_empty() && tag.chars().all(|c| c.is_ascii_lowercase()),
        "tag {tag:?}: lowercase letters only"
    );
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("/dev/shm/vring-testkit-{tag}-{}-{n}", std::process::id())
}

/// A driver and a device on one queue in one memory.
#[derive(Debug)]
pub struct Pair {
    pub mem: Arc<GuestMemory>,
    pub config: QueueConfig,
    pub driver: DriverQueue<u32>,
    pub device: DeviceQueue,
}

/// A queue of `size` with `features`, its indirect area holding up to `max_chain` entries
/// per table; both sides start at index 0.
pub fn pair(size: u16, features: Features, max_chain: u16) -> Pair {
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM_SIZE)]).expect("memory"));
    let rings = RingAddresses::contiguous(RING_BASE, size);
    let config = QueueConfig::new(size as u32, rings, features).expect("queue config");
    let area = IndirectArea {
        addr: INDIRECT_BASE,
        max_chain,
    };
    let driver = DriverQueue::activate(&config, mem.clone(), Some(area)).expect("driver queue");
    let device = DeviceQueue::activate(&config, mem.clone(), vring::RingPosition::START)
        .expect("device queue");
    Pair {
        mem,
        config,
        driver,
        device,
    }
}

impl Pair {
    /// A buffer of `len` bytes in the data area, the `i`th of its 4 KiB slots.
    pub fn buf(i: u64, len: u32) -> Buf {
        Buf::new(GuestAddress(DATA_BASE.0 + i * 4096), len)
    }

    /// `n` buffers of `len` bytes, in slots `0..n`.
    pub fn bufs(n: u64, len: u32) -> Vec<Buf> {
        (0..n).map(|i| Pair::buf(i, len)).collect()
    }
}
