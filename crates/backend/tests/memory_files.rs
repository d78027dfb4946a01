//! A frontend that shrinks its memory file under a running queue, as a file on /dev/shm
//! (QEMU's `memory-backend-file`, unsealed) allows: the backend's next access faults. The
//! process survives, the queue is marked broken, and the same pair serves the next frontend
//! at once, with its worker idle and the connection's descriptors released.
//!
//! One test in a binary of its own: it measures the process (`testkit::recovery`).

use std::os::fd::AsRawFd;
use std::time::Duration;

use testkit::eventually;
use testkit::inproc::start_backend;
use testkit::recovery::{self, Baseline};
use vhost::vhost_user::message::VhostUserVirtioFeatures;
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtnet_backend::{BackendConfig, IoMode};
use vmm_sys_util::eventfd::EventFd;
use vring::{Buf, DriverQueue, Features, GuestAddress, QueueConfig, RingAddresses};

const MEM: u64 = 1 << 20;
const TX: usize = 1;
const SIZE: u16 = 256;

#[test]
fn a_memory_file_shrunk_under_a_running_queue_breaks_it_and_the_next_frontend_is_served() {
    let exclusive = recovery::exclusive();
    let b = start_backend(
        "shrink",
        BackendConfig {
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let base = Baseline::take(&exclusive, &b);

    // A frontend whose memory is the shm file: tx0 only.
    let (file, mem) = testkit::pair::shm_memory("shrink", MEM, 0x7000_0000);
    let mem = std::sync::Arc::new(mem);
    let mut f = Frontend::connect(&b.socket, 2).unwrap();
    f.set_owner().unwrap();
    f.get_features().unwrap();
    let features = Features::VERSION_1.0 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    f.set_features(features).unwrap();
    let p = f.get_protocol_features().unwrap();
    f.set_protocol_features(p).unwrap();
    let r = mem.regions().next().unwrap();
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: MEM,
        userspace_addr: r.user_addr,
        mmap_offset: 0,
        mmap_handle: file.as_raw_fd(),
    };
    f.set_mem_table(&[region]).unwrap();
    let rings = RingAddresses::contiguous(GuestAddress(0x1000), SIZE);
    f.set_vring_num(TX, SIZE).unwrap();
    f.set_vring_addr(
        TX,
        &VringConfigData {
            queue_max_size: SIZE,
            queue_size: SIZE,
            flags: 0,
            desc_table_addr: r.user_addr + rings.desc.0,
            used_ring_addr: r.user_addr + rings.used.0,
            avail_ring_addr: r.user_addr + rings.avail.0,
            log_addr: None,
        },
    )
    .unwrap();
    f.set_vring_base(TX, 0).unwrap();
    let (kick, call) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
    f.set_vring_call(TX, &call).unwrap();
    f.set_vring_kick(TX, &kick).unwrap();
    f.set_vring_enable(TX, true).unwrap();
    let config = QueueConfig::new(SIZE as u32, rings, Features::VERSION_1).unwrap();
    let mut driver = DriverQueue::<u32>::activate(&config, mem.clone(), None).unwrap();
    let frame = Buf::new(GuestAddress(0x8_0000), 72);
    driver.add(&[frame], &[], 1).unwrap();
    kick.write(1).unwrap();
    assert!(eventually(Duration::from_secs(5), || driver
        .get_used()
        .unwrap()
        .is_some()));

    // The frontend truncates the file: our driver's accesses and the backend's fault.
    file.set_len(0).unwrap();
    driver.add(&[frame], &[], 2).unwrap();
    kick.write(1).unwrap();
    let tx0 = || b.device.reports()[TX].counters.broken.clone();
    assert!(
        eventually(Duration::from_secs(5), || tx0().is_some()),
        "tx0 was not marked broken"
    );
    assert!(tx0().unwrap().contains("shrank"), "{:?}", tx0());
    drop((f, driver, mem, file, kick, call));

    // The process alive, the workers idle, a fresh connection on the same pair moving frames
    // within a second, and the hostile connection's descriptors and memory gone.
    recovery::assert_recovered(&b, &base);
    assert!(tx0().is_none(), "the next frontend reset the queue");
}
