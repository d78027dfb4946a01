//! A frontend that sends vhost-user requests one by one, on rust-vmm `vhost`'s `Frontend`,
//! for the backend's tests of what our driver does not send: memory regions added and removed
//! (CONFIGURE_MEM_SLOTS), dirty logging (SET_LOG_BASE, LOG_ALL), SEND_RARP. Its memory is
//! memfds at guest addresses the test chooses; its queues are our driver's queues over it.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vhost::vhost_user::message::{
    FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vring::{DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses};

/// The frontend: rust-vmm's request layer, a clone of its socket for requests that layer
/// cannot send, and the memory it shares.
pub struct RawFrontend {
    pub frontend: Frontend,
    pub socket: UnixStream,
    pub mem: Arc<GuestMemory>,
    pub features: Features,
}

/// A started queue: our driver's end and its kick and call eventfds.
#[derive(Debug)]
pub struct RawQueue {
    pub driver: DriverQueue<u32>,
    pub kick: EventFd,
    pub call: EventFd,
}

impl std::fmt::Debug for RawFrontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawFrontend")
            .field("features", &self.features)
            .finish()
    }
}

impl RawFrontend {
    /// Connects to `socket`, negotiates `features` (with PROTOCOL_FEATURES) and every protocol
    /// feature the backend offers, REPLY_ACK on every request (so a refusal is an error here),
    /// and maps `layout` as memfds. No memory is shared yet.
    pub fn connect(
        socket: &Path,
        max_queues: u64,
        features: Features,
        layout: &[(GuestAddress, usize)],
    ) -> RawFrontend {
        let sock = UnixStream::connect(socket).expect("connect");
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let raw = sock.try_clone().unwrap();
        let mut f = Frontend::from_stream(sock, max_queues);
        f.set_owner().unwrap();
        let offered = f.get_features().unwrap();
        let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        assert!(offered & features.0 == features.0, "features not offered");
        f.set_features(features.0 | protocol_bit).unwrap();
        let p = f.get_protocol_features().unwrap();
        f.set_protocol_features(p).unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::REPLY_ACK));
        f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let mem = Arc::new(GuestMemory::memfd(layout).expect("memory"));
        RawFrontend {
            frontend: f,
            socket: raw,
            mem,
            features,
        }
    }

    /// Region `i` of the memory, as the frontend describes it.
    pub fn region(&self, i: usize) -> VhostUserMemoryRegionInfo {
        let r = self.mem.regions().nth(i).expect("no such region");
        VhostUserMemoryRegionInfo {
            guest_phys_addr: r.guest_addr.0,
            memory_size: r.size,
            userspace_addr: r.user_addr,
            mmap_offset: r.file_offset,
            mmap_handle: r.file.expect("memfd").as_raw_fd(),
        }
    }

    /// Shares region `i` (ADD_MEM_REG).
    pub fn add_region(&mut self, i: usize) -> vhost::Result<()> {
        let r = self.region(i);
        self.frontend.add_mem_region(&r).map(|_| ())
    }

    /// Unshares region `i` (REM_MEM_REG).
    pub fn remove_region(&mut self, i: usize) -> vhost::Result<()> {
        let r = self.region(i);
        self.frontend.remove_mem_region(&r)
    }

    /// Shares every region at once (SET_MEM_TABLE).
    pub fn set_mem_table(&self) {
        let regions: Vec<_> = (0..self.mem.regions().count())
            .map(|i| self.region(i))
            .collect();
        self.frontend.set_mem_table(&regions).unwrap();
    }

    /// The frontend's virtual address of guest address `a`.
    pub fn user(&self, a: GuestAddress) -> u64 {
        let r = self
            .mem
            .regions()
            .find(|r| a.0.wrapping_sub(r.guest_addr.0) < r.size)
            .expect("an address in the frontend's memory");
        r.user_addr + (a.0 - r.guest_addr.0)
    }

    /// The ring addresses of virtqueue `index`, as SET_VRING_ADDR carries them; with
    /// `log`, the VHOST_VRING_F_LOG flag and the used ring's guest address for logging.
    pub fn vring_addr(&self, rings: RingAddresses, size: u16, log: bool) -> VringConfigData {
        VringConfigData {
            queue_max_size: size,
            queue_size: size,
            flags: u32::from(log),
            desc_table_addr: self.user(rings.desc),
            used_ring_addr: self.user(rings.used),
            avail_ring_addr: self.user(rings.avail),
            log_addr: log.then_some(rings.used.0),
        }
    }

    /// Sets up and starts virtqueue `index` of `size` at `rings`, from avail index 0, and our
    /// driver over it.
    pub fn start_queue(&mut self, index: usize, size: u16, rings: RingAddresses) -> RawQueue {
        let addr = self.vring_addr(rings, size, false);
        let f = &mut self.frontend;
        f.set_vring_num(index, size).unwrap();
        f.set_vring_addr(index, &addr).unwrap();
        f.set_vring_base(index, 0).unwrap();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        let call = EventFd::new(EFD_NONBLOCK).unwrap();
        f.set_vring_call(index, &call).unwrap();
        f.set_vring_kick(index, &kick).unwrap();
        f.set_vring_enable(index, true).unwrap();
        let ring_features = self
            .features
            .intersection(Features::VERSION_1 | Features::RING_EVENT_IDX);
        let config = QueueConfig::new(size as u32, rings, ring_features).unwrap();
        let driver = DriverQueue::activate(&config, self.mem.clone(), None).unwrap();
        RawQueue { driver, kick, call }
    }

    /// Sends `code` with `payload` on the socket itself, with NEED_REPLY when `ack`, and
    /// returns the ack's value (None without `ack`): for requests rust-vmm's frontend does
    /// not send.
    pub fn send_raw(&self, code: FrontendReq, payload: &[u8], ack: bool) -> Option<u64> {
        use std::io::{Read, Write};
        let flags = vnet::vhost_wire::VERSION_1
            | if ack {
                VhostUserHeaderFlag::NEED_REPLY.bits()
            } else {
                0
            };
        (&self.socket)
            .write_all(&vnet::vhost_wire::encode(code, flags, payload))
            .unwrap();
        if !ack {
            return None;
        }
        let mut reply = [0u8; vnet::vhost_wire::HDR_LEN + 8];
        (&self.socket).read_exact(&mut reply).unwrap();
        Some(u64::from_ne_bytes(
            reply[vnet::vhost_wire::HDR_LEN..].try_into().unwrap(),
        ))
    }
}
