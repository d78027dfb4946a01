//! Unit-test scaffolding for the backend's parts: a device-side queue runtime on one end of a
//! [`testkit::Pair`], the test holding the driver end; and for the protocol layer, a device
//! with worker threads and what a frontend hands it (a memory table, eventfds as files).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::{pair, Pair};
use vhost::vhost_user::message::{
    VhostUserMemoryRegion, VhostUserSingleMemoryRegion, VhostUserVringAddrFlags,
};
use vhost::vhost_user::{Result as VuResult, VhostUserBackendReqHandlerMut};
use virtnet_sys::PeerEventFd;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vring::{Buf, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses};

use super::config::{BackendConfig, IoMode};
use super::device::Device;
use super::metrics::{QueueCounters, QueueTunables};
use super::queue::{QueueId, QueueRuntime};
use super::shared::Shared;
use super::vhost::Connection;

/// The driver's end, the device's queue runtime, and the device's err eventfd.
pub struct Setup {
    pub driver: DriverQueue<u32>,
    pub mem: Arc<GuestMemory>,
    pub runtime: QueueRuntime,
    pub err: EventFd,
}

/// A queue of 16 with `features`, its device end as queue `id`.
pub fn setup(id: QueueId, features: Features) -> Setup {
    setup_sized(id, features, 16)
}

/// A queue of `size` with `features`, its device end as queue `id`.
pub fn setup_sized(id: QueueId, features: Features, size: u16) -> Setup {
    let Pair {
        mem,
        driver,
        device,
        ..
    } = pair(size, features, 16);
    let err = EventFd::new(EFD_NONBLOCK).unwrap();
    let peer = |e: EventFd| PeerEventFd::from_eventfd(e).unwrap();
    let runtime = QueueRuntime::new(
        id,
        device,
        peer(EventFd::new(EFD_NONBLOCK).unwrap()),
        Some(peer(EventFd::new(EFD_NONBLOCK).unwrap())),
        Some(peer(err.try_clone().unwrap())),
        Arc::new(QueueCounters::default()),
        Arc::new(QueueTunables::default()),
    );
    Setup {
        driver,
        mem,
        runtime,
        err,
    }
}

/// Device state of one pair without workers or a port.
pub fn shared() -> Shared {
    Shared::new(BackendConfig::default(), Box::new(crate::host::NoControl)).unwrap()
}

/// The driver posts `n` writable buffers of `len` bytes, tokens `0..n`.
pub fn post_rx(driver: &mut DriverQueue<u32>, n: u32, len: u32) {
    for i in 0..n {
        driver.add(&[], &[Pair::buf(i as u64, len)], i).unwrap();
    }
}

/// Every used entry the driver sees now, as (token, length).
pub fn used(driver: &mut DriverQueue<u32>) -> Vec<(u32, u32)> {
    std::iter::from_fn(|| driver.get_used().unwrap()).collect()
}

/// A device of one pair on the `null` port, its worker threads running.
pub fn null_device() -> Arc<Device> {
    Device::new(BackendConfig {
        io: IoMode::Null { size: 64 },
        ..Default::default()
    })
    .unwrap()
}

/// What SET_MEM_TABLE carries for `mem`: each region as the frontend describes it, and a file
/// of its memfd.
fn mem_table(mem: &GuestMemory) -> (Vec<VhostUserMemoryRegion>, Vec<File>) {
    mem.regions()
        .map(|r| {
            let region =
                VhostUserMemoryRegion::new(r.guest_addr.0, r.size, r.user_addr, r.file_offset);
            let file = r.file.expect("memfd-backed memory").try_clone().unwrap();
            (region, file)
        })
        .unzip()
}

/// `e` as the backend receives it from a frontend: a file for the same eventfd, passed over a
/// unix socket (so no unsafe code adopts a raw fd here).
pub fn eventfd_file(e: &EventFd) -> File {
    let (a, b) = UnixStream::pair().unwrap();
    a.send_with_fd(&[0u8][..], e.as_raw_fd()).unwrap();
    let mut byte = [0u8; 1];
    let (_, file) = b.recv_with_fd(&mut byte[..]).unwrap();
    file.expect("the eventfd came across")
}

/// A frontend of the protocol tests, by what it shares: its memory, one memfd region at guest
/// address 0 with the rings of virtqueue `i` at `RINGS + i * 0x1000` (size `QUEUE_SIZE`) and
/// a frame buffer at `DATA`.
#[derive(Debug)]
pub struct Frontend {
    mem: Arc<GuestMemory>,
}

/// Virtqueue 1: the tx queue of pair 0.
pub const TX0: u32 = 1;

impl Frontend {
    pub const MEM_SIZE: usize = 0x1_0000;
    pub const RINGS: u64 = 0x1000;
    pub const DATA: u64 = 0x8000;
    pub const QUEUE_SIZE: u16 = 16;

    pub fn new() -> Frontend {
        let mem = GuestMemory::memfd(&[(GuestAddress(0), Self::MEM_SIZE)]).unwrap();
        Frontend { mem: Arc::new(mem) }
    }

    /// A frontend whose memory is a file on /dev/shm that nobody sealed (QEMU's
    /// `memory-backend-file`), and another handle of that file, for the test to shrink it.
    pub fn shm(tag: &str) -> (Frontend, File) {
        let (file, mem) = testkit::pair::shm_memory(tag, Self::MEM_SIZE as u64, 0x7000_0000);
        (Frontend { mem: Arc::new(mem) }, file)
    }

    /// Guest address of the second region of [`Frontend::two_regions`].
    pub const HOTPLUG: u64 = 0x10_0000;

    /// A frontend with a second region of `MEM_SIZE` at [`Frontend::HOTPLUG`], for memory
    /// hotplug: the test shares its regions one by one ([`Frontend::region`]).
    pub fn two_regions() -> Frontend {
        let layout = [
            (GuestAddress(0), Self::MEM_SIZE),
            (GuestAddress(Self::HOTPLUG), Self::MEM_SIZE),
        ];
        let mem = GuestMemory::memfd(&layout).unwrap();
        Frontend { mem: Arc::new(mem) }
    }

    /// Region `i` as ADD_MEM_REG and REM_MEM_REG carry it, and a file of its memfd.
    pub fn region(&self, i: usize) -> (VhostUserSingleMemoryRegion, File) {
        let r = self.mem.regions().nth(i).expect("no such region");
        let region =
            VhostUserSingleMemoryRegion::new(r.guest_addr.0, r.size, r.user_addr, r.file_offset);
        (region, r.file.unwrap().try_clone().unwrap())
    }

    /// The frontend's virtual address of guest address `a`, as ring addresses are sent: in
    /// the region that holds it, else (an address outside memory) past the first region.
    pub fn user(&self, a: GuestAddress) -> u64 {
        let r = self
            .mem
            .regions()
            .find(|r| a.0.wrapping_sub(r.guest_addr.0) < r.size)
            .unwrap_or_else(|| self.mem.regions().next().unwrap());
        r.user_addr.wrapping_add(a.0.wrapping_sub(r.guest_addr.0))
    }

    pub fn rings(index: u32) -> RingAddresses {
        let base = GuestAddress(Self::RINGS + index as u64 * 0x1000);
        RingAddresses::contiguous(base, Self::QUEUE_SIZE)
    }

    pub fn set_mem_table(&self, conn: &mut Connection) -> VuResult<()> {
        let (regions, files) = mem_table(&self.mem);
        conn.set_mem_table(&regions, files, None).map(|_| ())
    }

    pub fn set_vring_addr(
        &self,
        conn: &mut Connection,
        index: u32,
        rings: RingAddresses,
    ) -> VuResult<()> {
        let (desc, used, avail) = (
            self.user(rings.desc),
            self.user(rings.used),
            self.user(rings.avail),
        );
        let flags = VhostUserVringAddrFlags::empty();
        conn.set_vring_addr(index, flags, desc, used, avail, 0)
    }

    /// Everything tx0 needs, as QEMU sends it (VERSION_1 only, so the rings start enabled),
    /// its kick fd last, which starts it.
    pub fn start_tx0(&self, conn: &mut Connection) -> RunningTx {
        conn.set_features(Features::VERSION_1.0).unwrap();
        self.set_mem_table(conn).unwrap();
        self.set_up_tx0(conn)
    }

    /// The vring requests of [`Frontend::start_tx0`], after the features and memory the
    /// caller sent.
    pub fn set_up_tx0(&self, conn: &mut Connection) -> RunningTx {
        conn.set_vring_num(TX0, Self::QUEUE_SIZE as u32).unwrap();
        self.set_vring_addr(conn, TX0, Self::rings(TX0)).unwrap();
        conn.set_vring_base(TX0, 0).unwrap();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        conn.set_vring_call(TX0 as u8, Some(eventfd_file(&call)))
            .unwrap();
        conn.set_vring_kick(TX0 as u8, Some(eventfd_file(&kick)))
            .unwrap();
        let size = Self::QUEUE_SIZE as u32;
        let config = QueueConfig::new(size, Self::rings(TX0), Features::VERSION_1).unwrap();
        let driver = DriverQueue::activate(&config, self.mem.clone(), None).unwrap();
        RunningTx { driver, kick, call }
    }
}

/// The frontend's end of a started tx queue: the driver side and the kick and call eventfds.
#[derive(Debug)]
pub struct RunningTx {
    pub driver: DriverQueue<u32>,
    pub kick: EventFd,
    pub call: EventFd,
}

impl RunningTx {
    /// Sends a 64-byte chain (header included) with `token`, kicks, and waits at most 5 s for
    /// the device to use it; the used entry.
    pub fn send(&mut self, token: u32) -> (u32, u32) {
        self.send_from(GuestAddress(Frontend::DATA), token)
    }

    /// Like [`RunningTx::send`], with the frame at `addr`.
    pub fn send_from(&mut self, addr: GuestAddress, token: u32) -> (u32, u32) {
        let buf = Buf::new(addr, 64);
        self.driver.add(&[buf], &[], token).unwrap();
        self.driver.kick_prepare();
        self.kick.write(1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(used) = self.driver.get_used().unwrap() {
                return used;
            }
            assert!(Instant::now() < deadline, "the device never used the chain");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
