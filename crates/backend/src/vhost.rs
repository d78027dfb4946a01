//! The vhost-user protocol state of one frontend connection (vhost-user spec, "Back-end
//! message types"), on rust-vmm `vhost`'s message layer.
//!
//! Every value here comes from the frontend and is checked before use: queue indices against
//! the queue count, sizes by `QueueConfig`, ring addresses by translation through the memory
//! table and then by `DeviceQueue::activate`. A queue runs when it has a kick fd, an address,
//! a memory table and is enabled; GET_VRING_BASE stops it; SET_MEM_TABLE, ADD_MEM_REG and
//! REM_MEM_REG (CONFIGURE_MEM_SLOTS, memory hotplug) quiesce and restart the running queues
//! around the swap.

use std::fs::File;
use std::sync::Arc;

use vhost::vhost_user::message::{
    VhostTransferStateDirection, VhostTransferStatePhase, VhostUserConfigFlags, VhostUserInflight,
    VhostUserLog, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserShMemConfig,
    VhostUserSharedMsg, VhostUserSingleMemoryRegion, VhostUserVirtioFeatures,
    VhostUserVringAddrFlags, VhostUserVringState,
};
use vhost::vhost_user::{
    Backend, Error as VuError, GpuBackend, Result as VuResult, VhostUserBackendReqHandlerMut,
};
use vhost::VhostUserMemoryRegionBase;
use vnet::feature;
use vring::memory::MAX_REGIONS;
use vring::{Features, GuestMemory, RingPosition};

use super::device::Device;
use super::error::Error;
use super::queue::QueueId;

mod memory;
mod queues;
use memory::SharedLog;
use virtnet_sys::PeerEventFd;
use vnet::{NetConfig, NET_S_LINK_UP};

/// What the frontend set up for one virtqueue.
#[derive(Debug, Default)]
struct VringSetup {
    num: u32,
    /// desc, avail, used in the frontend's virtual address space.
    addrs: Option<(u64, u64, u64)>,
    /// With VHOST_VRING_F_LOG: the guest address the used ring is logged at.
    log_addr: Option<u64>,
    base: RingPosition,
    kick: Option<PeerEventFd>,
    call: Option<PeerEventFd>,
    err: Option<PeerEventFd>,
    enabled: bool,
    running: bool,
}

/// One connection's protocol state.
#[derive(Debug)]
pub struct Connection {
    device: Arc<Device>,
    acked_features: Features,
    acked_protocol: VhostUserProtocolFeatures,
    features_set: bool,
    mem: Option<Arc<GuestMemory>>,
    /// The dirty log the frontend shared (SET_LOG_BASE): written while LOG_ALL is acked.
    log: Option<SharedLog>,
    /// Regions (guest address, size, user address) removed by REM_MEM_REG since the last
    /// SET_MEM_TABLE: QEMU keeps a region table per queue pair and adds (and removes) every
    /// region once per pair over the one connection, so a removal is repeated by the other
    /// pairs. A region goes at the first removal (all pairs share one memory, and the next
    /// pair's ADD_MEM_REG of a replacement must not overlap it); repeats are acked.
    removed: Vec<(u64, u64, u64)>,
    vrings: Vec<VringSetup>,
    /// Set when a request that needs a reply failed: the frontend would wait forever for an
    /// answer we did not send, so the connection must close.
    pub must_disconnect: bool,
    /// QEMU 7.2 sends SET_VRING_ENABLE before SET_FEATURES; rust-vmm `vhost` refuses it then
    /// (PROTOCOL_FEATURES not acked yet) without telling us which ring. When that happened,
    /// the rings start enabled once the features arrive, as the frontend believes they are.
    pub enable_before_features: bool,
}

/// VHOST_F_LOG_ALL: log every write to guest memory (vhost-user spec, "Migration").
pub const LOG_ALL: Features = Features(VhostUserVirtioFeatures::LOG_ALL.bits());

fn invalid(what: &'static str) -> VuError {
    VuError::InvalidOperation(what)
}

impl Connection {
    pub fn new(device: Arc<Device>) -> Connection {
        let n = device.num_queues();
        Connection {
            device,
            acked_features: Features::EMPTY,
            acked_protocol: VhostUserProtocolFeatures::empty(),
            features_set: false,
            mem: None,
            log: None,
            removed: Vec::new(),
            vrings: (0..n).map(|_| VringSetup::default()).collect(),
            must_disconnect: false,
            enable_before_features: false,
        }
    }

    fn vring(&mut self, index: u32) -> VuResult<&mut VringSetup> {
        self.vrings
            .get_mut(index as usize)
            .ok_or(VuError::InvalidParam)
    }

    /// The protocol features the frontend acknowledged.
    pub fn acked_protocol(&self) -> VhostUserProtocolFeatures {
        self.acked_protocol
    }

    /// Whether a queue of the device is broken, which GET_STATUS reports as NEEDS_RESET.
    pub fn needs_reset(&self) -> bool {
        (0..self.device.num_queues()).any(|q| self.device.counters(q).is_broken())
    }

    fn protocol_negotiated(&self) -> bool {
        self.acked_features.0 & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0
    }

    /// The frontend enabled or disabled the rx ring of pair `pair` (None: every pair): the
    /// pair's TAP queue follows, so that the kernel steers no frame to a queue nobody takes.
    fn rx_rings_enabled(&self, pair: Option<usize>, on: bool) {
        if let Err(e) = self.device.shared().set_rx_enabled(pair, on) {
            tracing::warn!(error = %e, ?pair, on, "attaching or detaching a TAP queue");
        }
    }

    /// Adopts a kick, call or err fd: only an eventfd is taken (see `virtnet_sys::peer_fd`);
    /// anything else gets an error answer and leaves the vring as it was.
    fn new_fd(fd: Option<File>, what: &str) -> VuResult<Option<PeerEventFd>> {
        fd.map(PeerEventFd::adopt).transpose().map_err(|e| {
            tracing::warn!(error = %e, "{what} fd refused");
            VuError::InvalidParam
        })
    }
}

impl VhostUserBackendReqHandlerMut for Connection {
    fn set_owner(&mut self) -> VuResult<()> {
        Ok(())
    }

    fn reset_owner(&mut self) -> VuResult<()> {
        self.stop_all();
        Ok(())
    }

    fn reset_device(&mut self) -> VuResult<()> {
        self.stop_all();
        let dev = self.device.clone();
        *self = Connection::new(dev);
        Ok(())
    }

    fn get_features(&mut self) -> VuResult<u64> {
        Ok(self.device.offered_features().0
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | LOG_ALL.0)
    }

    fn set_features(&mut self, features: u64) -> VuResult<()> {
        let offered = Features(self.get_features()?);
        let acked = Features::check_acked(offered, Features(features)).map_err(|e| {
            let e = Error::protocol("SET_FEATURES")(e);
            tracing::warn!(error = %e, "features refused");
            VuError::InvalidParam
        })?;
        // Only LOG_ALL may change under running queues: QEMU sets it when a migration starts
        // and clears it when one ends or fails, with the device running.
        let changed = Features(acked.0 ^ self.acked_features.0);
        if self.vrings.iter().any(|v| v.running)
            && self.features_set
            && changed.difference(LOG_ALL) != Features::EMPTY
        {
            return Err(invalid("features changed while queues run"));
        }
        let was_logging = self.logging();
        let first = !self.features_set;
        self.acked_features = acked;
        self.features_set = true;
        // Without protocol features, rings start enabled (vhost-user spec, "Ring states"); see
        // `enable_before_features` for the other case.
        // Only the first SET_FEATURES sets the rings' initial state: QEMU repeats it (once per
        // queue pair, and with LOG_ALL when a migration starts or ends), and a ring the
        // frontend enabled or disabled since keeps that state.
        if first {
            let enabled = !self.protocol_negotiated() || self.enable_before_features;
            for v in &mut self.vrings {
                v.enabled = enabled;
            }
            self.rx_rings_enabled(None, enabled);
        }
        // The port takes the header length and the guest's receive offloads.
        self.device.shared().set_features(acked).map_err(|e| {
            tracing::warn!(error = %e, "configuring the port failed");
            VuError::BackendInternalError
        })?;
        tracing::info!(features = %feature::names(acked), "features negotiated");
        if acked.contains(LOG_ALL) && self.log.is_none() {
            tracing::warn!("LOG_ALL without a dirty log: nothing is logged until SET_LOG_BASE");
        }
        if self.logging() != was_logging {
            // QEMU waits for this request's ack: once it has it, every write is logged.
            self.requeue(|_| {})?;
            tracing::info!(on = self.logging(), "dirty logging");
        }
        Ok(())
    }

    fn set_mem_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        self.memory_table(ctx, files)
    }

    fn set_vring_num(&mut self, index: u32, num: u32) -> VuResult<()> {
        vring::layout::check_queue_size(num).map_err(|_| VuError::InvalidParam)?;
        let v = self.vring(index)?;
        if v.running {
            return Err(invalid("SET_VRING_NUM on a running queue"));
        }
        v.num = num;
        Ok(())
    }

    fn set_vring_addr(
        &mut self,
        index: u32,
        flags: VhostUserVringAddrFlags,
        descriptor: u64,
        used: u64,
        available: u64,
        log: u64,
    ) -> VuResult<()> {
        let log_addr = flags
            .contains(VhostUserVringAddrFlags::VHOST_VRING_F_LOG)
            .then_some(log);
        let v = self.vring(index)?;
        if v.running {
            // QEMU sends the same addresses again with the log flag when a migration starts
            // (and without it when it ends): only the logging of the used ring changes.
            if v.addrs != Some((descriptor, available, used)) {
                return Err(invalid("SET_VRING_ADDR on a running queue"));
            }
            if v.log_addr != log_addr {
                let i = index as usize;
                self.stop(i)?;
                self.vrings[i].log_addr = log_addr;
                self.try_start(i)?;
            }
            return Ok(());
        }
        // Check what can be checked now; sizes and alignment are checked when the queue starts.
        if let Some(mem) = &self.mem {
            if [descriptor, available, used]
                .iter()
                .any(|&a| mem.user_to_guest(a).is_none())
            {
                tracing::warn!(queue = index, "ring address outside the memory table");
                return Err(VuError::InvalidParam);
            }
        }
        let v = self.vring(index)?;
        v.addrs = Some((descriptor, available, used));
        v.log_addr = log_addr;
        Ok(())
    }

    fn set_vring_base(&mut self, index: u32, base: u32) -> VuResult<()> {
        let v = self.vring(index)?;
        if v.running {
            return Err(invalid("SET_VRING_BASE on a running queue"));
        }
        v.base = RingPosition::from_vhost_base(base).map_err(|_| VuError::InvalidParam)?;
        Ok(())
    }

    fn get_vring_base(&mut self, index: u32) -> VuResult<VhostUserVringState> {
        if index as usize >= self.vrings.len() {
            self.must_disconnect = true;
            return Err(VuError::InvalidParam);
        }
        self.stop(index as usize)?;
        let v = &mut self.vrings[index as usize];
        // The queue is stopped until the next SET_VRING_KICK (vhost-user spec).
        v.kick = None;
        Ok(VhostUserVringState::new(index, v.base.vhost_base()))
    }

    fn set_vring_kick(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = index as usize;
        let fd = Self::new_fd(fd, "kick")?;
        self.stop(i)?;
        self.vring(index as u32)?.kick = fd;
        self.try_start(i)
    }

    fn set_vring_call(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = index as usize;
        let fd = Self::new_fd(fd, "call")?;
        let running = self.vring(index as u32)?.running;
        if running {
            self.stop(i)?;
        }
        self.vring(index as u32)?.call = fd;
        if running {
            self.try_start(i)?;
        }
        Ok(())
    }

    fn set_vring_err(&mut self, index: u8, fd: Option<File>) -> VuResult<()> {
        let i = index as usize;
        let fd = Self::new_fd(fd, "err")?;
        let running = self.vring(index as u32)?.running;
        if running {
            self.stop(i)?;
        }
        self.vring(index as u32)?.err = fd;
        if running {
            self.try_start(i)?;
        }
        Ok(())
    }

    fn get_protocol_features(&mut self) -> VuResult<VhostUserProtocolFeatures> {
        Ok(super::PROTOCOL_FEATURES)
    }

    fn set_protocol_features(&mut self, features: u64) -> VuResult<()> {
        let f = VhostUserProtocolFeatures::from_bits(features).ok_or(VuError::InvalidParam)?;
        if !super::PROTOCOL_FEATURES.contains(f) {
            return Err(VuError::InvalidParam);
        }
        self.acked_protocol = f;
        Ok(())
    }

    fn get_queue_num(&mut self) -> VuResult<u64> {
        // For vhost-user-net this counts queue pairs (QEMU and DPDK read it so).
        Ok(self.device.pairs() as u64)
    }

    fn set_vring_enable(&mut self, index: u32, enable: bool) -> VuResult<()> {
        if !self.protocol_negotiated() {
            return Err(invalid("SET_VRING_ENABLE without protocol features"));
        }
        let i = index as usize;
        self.vring(index)?.enabled = enable;
        // An rx ring's TAP queue is attached before the ring starts and detached once it has
        // stopped, so that its worker never watches a detached queue.
        let rx_pair = match self.queue_id(i) {
            Some(QueueId::Rx(p)) => Some(p as usize),
            _ => None,
        };
        if enable {
            if rx_pair.is_some() {
                self.rx_rings_enabled(rx_pair, true);
            }
            self.try_start(i)
        } else {
            let stopped = self.stop(i);
            if rx_pair.is_some() {
                self.rx_rings_enabled(rx_pair, false);
            }
            stopped
        }
    }

    fn get_config(
        &mut self,
        offset: u32,
        size: u32,
        _flags: VhostUserConfigFlags,
    ) -> VuResult<Vec<u8>> {
        let cfg = NetConfig {
            mac: self.device.mac(),
            status: NET_S_LINK_UP,
            max_virtqueue_pairs: self.device.pairs(),
            mtu: self.device.mtu(),
        }
        .to_bytes();
        let (o, s) = (offset as usize, size as usize);
        // Out of range: the message layer answers an empty payload (the spec's error reply),
        // so the frontend is not left waiting and the connection need not close.
        match o.checked_add(s) {
            Some(end) if end <= cfg.len() => Ok(cfg[o..end].to_vec()),
            _ => Err(VuError::InvalidParam),
        }
    }

    fn set_config(
        &mut self,
        _offset: u32,
        _buf: &[u8],
        _flags: VhostUserConfigFlags,
    ) -> VuResult<()> {
        Err(invalid("the net config space is read-only"))
    }

    fn set_backend_req_fd(&mut self, _backend: Backend) {}

    fn set_gpu_socket(&mut self, _gpu_backend: GpuBackend) -> VuResult<()> {
        Err(invalid("not a GPU"))
    }

    fn get_shared_object(&mut self, _uuid: VhostUserSharedMsg) -> VuResult<File> {
        self.must_disconnect = true;
        Err(invalid("no shared objects"))
    }

    fn get_inflight_fd(
        &mut self,
        _inflight: &VhostUserInflight,
    ) -> VuResult<(VhostUserInflight, File)> {
        self.must_disconnect = true;
        Err(invalid("no inflight tracking"))
    }

    fn set_inflight_fd(&mut self, _inflight: &VhostUserInflight, _file: File) -> VuResult<()> {
        Err(invalid("no inflight tracking"))
    }

    fn get_max_mem_slots(&mut self) -> VuResult<u64> {
        Ok(MAX_REGIONS as u64)
    }

    fn add_mem_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
        _postcopy_listening: Option<bool>,
    ) -> VuResult<Option<VhostUserMemoryRegionBase>> {
        self.add_region(region, fd).map(|()| None)
    }

    fn remove_mem_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        self.remove_region(region)
    }

    fn set_device_state_fd(
        &mut self,
        _direction: VhostTransferStateDirection,
        _phase: VhostTransferStatePhase,
        _fd: File,
    ) -> VuResult<Option<File>> {
        self.must_disconnect = true;
        Err(invalid("no device state transfer"))
    }

    fn check_device_state(&mut self) -> VuResult<()> {
        Err(invalid("no device state transfer"))
    }

    fn get_shmem_config(&mut self) -> VuResult<VhostUserShMemConfig> {
        self.must_disconnect = true;
        Err(invalid("no shared memory regions"))
    }

    fn set_log_base(&mut self, log: &VhostUserLog, file: File) -> VuResult<()> {
        self.share_log(log, file)
    }
}

#[cfg(test)]
mod tests {

    use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserVirtioFeatures};
    use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK, EFD_SEMAPHORE};

    use vring::{DirtyLog, GuestAddress, RingAddresses};

    use super::*;
    use crate::testing::{eventfd_file, null_device, Frontend, TX0};

    /// A connection to a fresh device, and the frontend's memory.
    struct Setup {
        front: Frontend,
        device: Arc<Device>,
        conn: Connection,
    }

    fn setup() -> Setup {
        let device = null_device();
        Setup {
            front: Frontend::new(),
            conn: Connection::new(device.clone()),
            device,
        }
    }

    #[test]
    fn features_with_bits_not_offered_are_refused() {
        let mut s = setup();
        let offered = s.conn.get_features().unwrap();
        let stray = 1u64 << (!offered).trailing_zeros();
        assert!(matches!(
            s.conn.set_features(offered | stray),
            Err(VuError::InvalidParam)
        ));
        assert!(!s.conn.features_set);
        assert_eq!(s.device.shared().features(), Features::EMPTY);
        // What was offered is taken.
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        assert_eq!(s.conn.acked_features, Features::VERSION_1);
        assert_eq!(s.device.shared().features(), Features::VERSION_1);
    }

    #[test]
    fn every_bit_a_backend_offers_has_a_name_in_the_device_report() {
        let mut s = setup();
        let offered = s.conn.get_features().unwrap();
        s.conn.set_features(offered).unwrap();
        let report = s.device.device_report().features;
        assert!(report.contains("PROTOCOL_FEATURES"), "{report}");
        let all_named = |names: &str| !names.split('|').any(|n| n.starts_with("bit"));
        assert!(all_named(&report), "{report}");
        // With more pairs (MQ) and a TAP that has USO, the most a backend offers.
        let tap = crate::tap_features(virtnet_sys::tap::TapSupport { uso: true });
        let most = Features(offered) | crate::device_features(2) | tap;
        assert!(all_named(&feature::names(most)), "{}", feature::names(most));
    }

    #[test]
    fn set_vring_num_refuses_sizes_that_are_not_a_power_of_two_up_to_32768() {
        let mut s = setup();
        for bad in [0, 3, 96, 65536] {
            assert!(
                matches!(s.conn.set_vring_num(0, bad), Err(VuError::InvalidParam)),
                "size {bad}"
            );
            assert_eq!(s.conn.vrings[0].num, 0, "size {bad} was kept");
        }
        s.conn.set_vring_num(0, 256).unwrap();
        assert_eq!(s.conn.vrings[0].num, 256);
    }

    #[test]
    fn a_memory_file_shrunk_under_a_running_queue_breaks_it_and_the_device_serves_on() {
        let device = null_device();
        let mut conn = Connection::new(device.clone());
        let (front, file) = Frontend::shm("shrink");
        let mut tx = front.start_tx0(&mut conn);
        assert_eq!(tx.send(1).0, 1);
        // The frontend truncates its memory file under both mappings.
        file.set_len(0).unwrap();
        let buf = vring::Buf::new(GuestAddress(Frontend::DATA), 64);
        tx.driver.add(&[buf], &[], 2).unwrap();
        tx.kick.write(1).unwrap();
        let tx0 = || device.reports()[TX0 as usize].counters.broken.clone();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while tx0().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let reason = tx0().expect("tx0 broken");
        assert!(reason.contains("shrank"), "{reason}");
        conn.stop_all();
        drop(conn);
        // The same device, a new frontend with memory that stays: tx0 moves again.
        let mut conn = Connection::new(device.clone());
        let front = Frontend::new();
        let mut tx = front.start_tx0(&mut conn);
        assert_eq!(tx.send(3).0, 3);
        assert!(tx0().is_none());
    }

    #[test]
    fn kick_call_and_err_fds_that_are_not_eventfds_are_refused() {
        let mut s = setup();
        let invalid = |r: VuResult<()>| matches!(r, Err(VuError::InvalidParam));
        let not_eventfds = || {
            let (r, _w) = std::io::pipe().unwrap();
            [
                File::from(std::os::fd::OwnedFd::from(r)),
                File::open("/proc/self/status").unwrap(),
                File::from(std::os::fd::OwnedFd::from(
                    std::os::unix::net::UnixStream::pair().unwrap().0,
                )),
            ]
        };
        for f in not_eventfds() {
            assert!(invalid(s.conn.set_vring_kick(0, Some(f))));
        }
        for f in not_eventfds() {
            assert!(invalid(s.conn.set_vring_call(0, Some(f))));
        }
        for f in not_eventfds() {
            assert!(invalid(s.conn.set_vring_err(0, Some(f))));
        }
        let v = &s.conn.vrings[0];
        assert!(v.kick.is_none() && v.call.is_none() && v.err.is_none());
        assert!(!s.conn.must_disconnect, "a refused fd closes nothing");
        let e = EventFd::new(0).unwrap();
        s.conn.set_vring_kick(0, Some(eventfd_file(&e))).unwrap();
        assert!(s.conn.vrings[0].kick.is_some());
    }

    #[test]
    fn a_queue_index_out_of_range_is_refused() {
        let mut s = setup();
        // One pair without MQ: rx0, tx0, ctrl.
        assert_eq!(s.conn.vrings.len(), 3);
        let bad = 3;
        let invalid = |r: VuResult<()>| matches!(r, Err(VuError::InvalidParam));
        assert!(invalid(s.conn.set_vring_num(bad, 16)));
        assert!(invalid(s.conn.set_vring_base(bad, 0)));
        let rings = Frontend::rings(0);
        assert!(invalid(s.front.set_vring_addr(&mut s.conn, bad, rings)));
        let e = EventFd::new(EFD_NONBLOCK).unwrap();
        let bad = bad as u8;
        assert!(invalid(s.conn.set_vring_kick(bad, Some(eventfd_file(&e)))));
        assert!(invalid(s.conn.set_vring_call(bad, Some(eventfd_file(&e)))));
        assert!(invalid(s.conn.set_vring_err(bad, Some(eventfd_file(&e)))));
        assert!(!s.conn.must_disconnect);
        // GET_VRING_BASE needs a reply we cannot give: the connection must close.
        assert!(matches!(
            s.conn.get_vring_base(bad as u32),
            Err(VuError::InvalidParam)
        ));
        assert!(s.conn.must_disconnect);
    }

    #[test]
    fn ring_addresses_outside_the_memory_table_are_refused() {
        let mut s = setup();
        s.front.set_mem_table(&mut s.conn).unwrap();
        let inside = Frontend::rings(0);
        let past_end = GuestAddress(Frontend::MEM_SIZE as u64);
        for rings in [
            RingAddresses {
                desc: past_end,
                ..inside
            },
            RingAddresses {
                avail: past_end,
                ..inside
            },
            RingAddresses {
                used: past_end,
                ..inside
            },
        ] {
            assert!(matches!(
                s.front.set_vring_addr(&mut s.conn, 0, rings),
                Err(VuError::InvalidParam)
            ));
            assert_eq!(s.conn.vrings[0].addrs, None);
        }
        s.front.set_vring_addr(&mut s.conn, 0, inside).unwrap();
        assert!(s.conn.vrings[0].addrs.is_some());
    }

    #[test]
    fn a_queue_with_all_it_needs_runs_on_its_worker_until_get_vring_base() {
        let mut s = setup();
        // A queue that never ran gives back the base it was set to.
        s.conn.set_vring_base(0, 9).unwrap();
        let state = s.conn.get_vring_base(0).unwrap();
        // Copies: the message struct is packed.
        let (index, num) = (state.index, state.num);
        assert_eq!((index, num), (0, 9));

        let mut tx = s.front.start_tx0(&mut s.conn);
        assert!(s.conn.vrings[TX0 as usize].running);
        // The pair's worker serves it: a frame sent is used, counted and called for.
        assert_eq!(tx.send(7), (7, 0));
        let counters = s.device.counters(TX0 as usize);
        assert_eq!(counters.packets.get(), 1);
        assert_eq!(counters.bytes.get(), 64 - vnet::HDR_LEN as u64);
        // (Found by its kick or by busy polling, whichever came first: no count of either.)
        assert!(tx.call.read().unwrap() >= 1, "the device called");

        // GET_VRING_BASE stops it: the worker reports where it stopped, and no longer has it.
        let state = s.conn.get_vring_base(TX0).unwrap();
        let (index, num) = (state.index, state.num);
        assert_eq!((index, num), (TX0, 1));
        let v = &s.conn.vrings[TX0 as usize];
        assert!(!v.running && v.kick.is_none());
        assert_eq!(
            s.device.worker(QueueId::Tx(0)).stop(QueueId::Tx(0)),
            Ok(None)
        );
    }

    /// Everything virtqueue `index` needs but the memory table, as a frontend may send it.
    fn set_up_without_memory(s: &mut Setup, index: u32) -> (EventFd, EventFd) {
        s.conn
            .set_vring_num(index, Frontend::QUEUE_SIZE as u32)
            .unwrap();
        s.front
            .set_vring_addr(&mut s.conn, index, Frontend::rings(index))
            .unwrap();
        s.conn.set_vring_base(index, 0).unwrap();
        let (kick, call) = (
            EventFd::new(EFD_NONBLOCK).unwrap(),
            EventFd::new(EFD_NONBLOCK).unwrap(),
        );
        s.conn
            .set_vring_call(index as u8, Some(eventfd_file(&call)))
            .unwrap();
        (kick, call)
    }

    #[test]
    fn a_queue_whose_kick_came_before_the_memory_table_starts_with_it() {
        let mut s = setup();
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        let (kick, _call) = set_up_without_memory(&mut s, TX0);
        s.conn
            .set_vring_kick(TX0 as u8, Some(eventfd_file(&kick)))
            .unwrap();
        assert!(!s.conn.vrings[TX0 as usize].running, "no memory yet");
        s.front.set_mem_table(&mut s.conn).unwrap();
        assert!(s.conn.vrings[TX0 as usize].running);
    }

    #[test]
    fn a_virtqueue_the_negotiated_features_do_not_have_is_refused() {
        let mut s = setup();
        // Without CTRL_VQ there is no virtqueue 2 (the control queue of a one-pair device).
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        s.front.set_mem_table(&mut s.conn).unwrap();
        let (kick, _call) = set_up_without_memory(&mut s, 2);
        assert!(matches!(
            s.conn.set_vring_kick(2, Some(eventfd_file(&kick))),
            Err(VuError::InvalidOperation(_))
        ));
        assert!(!s.conn.vrings[2].running);
        // With it, the same set-up starts the control queue.
        let ctrl = Features::VERSION_1 | vnet::feature::CTRL_VQ;
        let mut s = setup();
        s.conn.set_features(ctrl.0).unwrap();
        s.front.set_mem_table(&mut s.conn).unwrap();
        let (kick, _call) = set_up_without_memory(&mut s, 2);
        s.conn.set_vring_kick(2, Some(eventfd_file(&kick))).unwrap();
        assert!(s.conn.vrings[2].running);
    }

    #[test]
    fn features_cannot_change_while_queues_run() {
        let mut s = setup();
        let _tx = s.front.start_tx0(&mut s.conn);
        assert!(s.conn.vrings[TX0 as usize].running);
        let other = Features::VERSION_1 | Features::RING_EVENT_IDX;
        assert!(matches!(
            s.conn.set_features(other.0),
            Err(VuError::InvalidOperation(_))
        ));
        assert_eq!(s.conn.acked_features, Features::VERSION_1);
        // The same features again are fine (QEMU repeats SET_FEATURES).
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        assert!(s.conn.vrings[TX0 as usize].running);
    }

    #[test]
    fn memory_slots_are_offered_up_to_the_regions_memory_takes() {
        let mut s = setup();
        let p = s.conn.get_protocol_features().unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS));
        assert_eq!(s.conn.get_max_mem_slots().unwrap(), MAX_REGIONS as u64);
        assert!(!s.conn.must_disconnect);
    }

    #[test]
    fn regions_added_and_removed_while_tx_runs_carry_its_frames() {
        let mut s = setup();
        let front = Frontend::two_regions();
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        // QEMU with CONFIGURE_MEM_SLOTS sends no memory table, only regions.
        let (first, file) = front.region(0);
        s.conn.add_mem_region(&first, file, None).unwrap();
        let mut tx = front.set_up_tx0(&mut s.conn);
        assert!(s.conn.vrings[TX0 as usize].running);
        assert_eq!(tx.send(1), (1, 0));

        // A region added under the running queue: a frame in it goes out.
        let (second, file) = front.region(1);
        s.conn.add_mem_region(&second, file, None).unwrap();
        assert!(s.conn.vrings[TX0 as usize].running);
        let hotplugged = GuestAddress(Frontend::HOTPLUG + 0x100);
        assert_eq!(tx.send_from(hotplugged, 2), (2, 0));
        let counters = s.device.counters(TX0 as usize);
        assert_eq!(counters.packets.get(), 2);
        assert!(!counters.is_broken());

        // Removed again: the queue runs on. Then the region with its rings: it stops until
        // they come back, and carries on from where it was.
        s.conn.remove_mem_region(&second).unwrap();
        assert!(s.conn.vrings[TX0 as usize].running);
        assert_eq!(tx.send(3), (3, 0));
        s.conn.remove_mem_region(&first).unwrap();
        assert!(s.conn.mem.is_none());
        assert!(!s.conn.vrings[TX0 as usize].running);
        assert_eq!(s.conn.vrings[TX0 as usize].base, RingPosition::split(3));
        let (first, file) = front.region(0);
        s.conn.add_mem_region(&first, file, None).unwrap();
        assert!(s.conn.vrings[TX0 as usize].running);
        assert_eq!(tx.send(4), (4, 0));
        assert_eq!(counters.packets.get(), 4);
        let state = s.conn.get_vring_base(TX0).unwrap();
        let num = state.num;
        assert_eq!(num, 4);
    }

    #[test]
    fn a_region_every_queue_pair_added_and_removed_is_mapped_once_and_goes_at_the_first_removal() {
        let mut s = setup();
        let front = Frontend::two_regions();
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        // QEMU with two queue pairs: each pair's table adds each region.
        for _ in 0..2 {
            for i in 0..2 {
                let (r, file) = front.region(i);
                s.conn.add_mem_region(&r, file, None).unwrap();
            }
        }
        assert_eq!(s.conn.mem.as_ref().unwrap().regions().count(), 2);
        let mut tx = front.set_up_tx0(&mut s.conn);
        let (second, _) = front.region(1);
        s.conn.remove_mem_region(&second).unwrap();
        assert_eq!(s.conn.mem.as_ref().unwrap().regions().count(), 1);
        // The other pair's removal is acked; a region never added is still refused.
        s.conn.remove_mem_region(&second).unwrap();
        let never = VhostUserSingleMemoryRegion::new(0x40_0000, 0x1000, 0x7000_0000, 0);
        assert!(matches!(
            s.conn.remove_mem_region(&never),
            Err(VuError::InvalidParam)
        ));
        assert_eq!(tx.send(2), (2, 0));
    }

    #[test]
    fn hostile_region_requests_are_refused_and_change_nothing() {
        let mut s = setup();
        let front = Frontend::two_regions();
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        let (first, file) = front.region(0);
        s.conn.add_mem_region(&first, file, None).unwrap();
        let mut tx = front.set_up_tx0(&mut s.conn);
        let refused = |r: VuResult<()>| matches!(r, Err(VuError::InvalidParam));
        let (second, file) = front.region(1);
        let (g, size, user, off) = (
            second.guest_phys_addr,
            second.memory_size,
            second.user_addr,
            second.mmap_offset,
        );
        let region = VhostUserSingleMemoryRegion::new;
        let cases = [
            // Overlapping the first in guest space (at its address, smaller), in user space.
            region(0, 0x1000, user, off),
            region(g, size, first.user_addr + 0x1000, off),
            // Zero bytes; past the end of its file; an address range that wraps.
            region(g, 0, user, off),
            region(g, size + 4096, user, off),
            region(g, size, user, size),
            region(u64::MAX - 4095, size, user, off),
        ];
        let add = |c: &mut Connection, r: &VhostUserSingleMemoryRegion, f: &File| {
            c.add_mem_region(r, f.try_clone().unwrap(), None)
                .map(|_| ())
        };
        for (i, r) in cases.iter().enumerate() {
            assert!(refused(add(&mut s.conn, r, &file)), "case {i}");
        }
        // A region that is not one of ours is not removed: by address, size or user address.
        for r in [
            region(g, size, user, off),
            region(0, 0x1000, first.user_addr, 0),
            region(0, first.memory_size, first.user_addr + 1, 0),
        ] {
            assert!(refused(s.conn.remove_mem_region(&r)));
        }
        // Not a file that can be guest memory.
        let dev = File::open("/dev/zero").unwrap();
        assert!(refused(add(&mut s.conn, &second, &dev)));
        assert!(!s.conn.must_disconnect);
        // The memory is the one region, and tx0 runs on it.
        let mem = s.conn.mem.as_ref().unwrap();
        assert_eq!(mem.regions().count(), 1);
        assert!(s.conn.vrings[TX0 as usize].running);
        assert_eq!(tx.send(1), (1, 0));
    }

    /// A dirty log of `bytes` on a memfd: the file to share, and the frontend's view of it.
    fn log_file(bytes: u64) -> (File, DirtyLog) {
        let mem = GuestMemory::memfd(&[(GuestAddress(0), bytes as usize)]).unwrap();
        let file = mem
            .regions()
            .next()
            .unwrap()
            .file
            .unwrap()
            .try_clone()
            .unwrap();
        let view = DirtyLog::from_file(file.try_clone().unwrap(), bytes, 0).unwrap();
        (file, view)
    }

    /// Every page marked in `view` until the worker has been quiet for 60 ms (after a frame
    /// it goes on to re-enable notifications, a write of the used ring too), cleared.
    fn settled_dirty(view: &DirtyLog) -> Vec<u64> {
        let mut pages = view.take_dirty();
        let mut quiet = 0;
        while quiet < 3 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let more = view.take_dirty();
            quiet = if more.is_empty() { quiet + 1 } else { 0 };
            pages.extend(more);
        }
        pages.sort_unstable();
        pages.dedup();
        pages
    }

    #[test]
    fn migration_features_are_offered() {
        let mut s = setup();
        assert!(Features(s.conn.get_features().unwrap()).contains(LOG_ALL));
        let p = s.conn.get_protocol_features().unwrap();
        assert!(p.contains(VhostUserProtocolFeatures::LOG_SHMFD));
    }

    #[test]
    fn a_dirty_log_that_cannot_be_mapped_is_refused_and_closes_the_connection() {
        let (file, _) = log_file(4096);
        for (size, offset) in [(0, 0), (4097, 0), (4096, 4096), (u64::MAX, 1)] {
            let mut s = setup();
            let log = VhostUserLog::new(size, offset);
            let r = s.conn.set_log_base(&log, file.try_clone().unwrap());
            assert!(matches!(r, Err(VuError::InvalidParam)), "{size} {offset}");
            // The frontend waits for a reply the message layer does not send on failure.
            assert!(s.conn.must_disconnect);
            assert!(s.conn.log.is_none());
        }
        let mut s = setup();
        let dev = File::open("/dev/zero").unwrap();
        assert!(s
            .conn
            .set_log_base(&VhostUserLog::new(4096, 0), dev)
            .is_err());
        let mut s = setup();
        s.conn
            .set_log_base(&VhostUserLog::new(4096, 0), file)
            .unwrap();
        assert!(s.conn.log.is_some() && !s.conn.must_disconnect);
        assert!(!s.conn.logging(), "not before LOG_ALL");
    }

    #[test]
    fn logging_starts_and_stops_under_a_running_queue_and_marks_its_used_ring() {
        let mut s = setup();
        let mut tx = s.front.start_tx0(&mut s.conn);
        let (file, view) = log_file(4096);
        s.conn
            .set_log_base(&VhostUserLog::new(4096, 0), file.try_clone().unwrap())
            .unwrap();
        // LOG_ALL while tx0 runs (a migration starts): the queue runs on, logging.
        s.conn
            .set_features((Features::VERSION_1 | LOG_ALL).0)
            .unwrap();
        assert!(s.conn.logging() && s.conn.vrings[TX0 as usize].running);
        assert_eq!(tx.send(1), (1, 0));
        let used_page = Frontend::rings(TX0).used.0 / 4096;
        // The device only read the frame: its page is not marked, the used ring's is.
        assert_eq!(settled_dirty(&view), [used_page]);

        // The same addresses with VHOST_VRING_F_LOG and another log address: the used ring
        // is logged there. Other addresses on a running queue are refused.
        let rings = Frontend::rings(TX0);
        let user = |a: GuestAddress| s.front.user(a);
        let (desc, used, avail) = (user(rings.desc), user(rings.used), user(rings.avail));
        let flag = || VhostUserVringAddrFlags::VHOST_VRING_F_LOG;
        let elsewhere = 0x4_0000;
        s.conn
            .set_vring_addr(TX0, flag(), desc, used, avail, elsewhere)
            .unwrap();
        assert!(matches!(
            s.conn
                .set_vring_addr(TX0, flag(), desc + 0x1000, used, avail, elsewhere),
            Err(VuError::InvalidOperation(_))
        ));
        // The old queue may write its used flags while it stops: logged where it was told.
        assert!(settled_dirty(&view)
            .iter()
            .all(|&p| p == used_page || p == elsewhere / 4096));
        assert_eq!(tx.send(2), (2, 0));
        assert_eq!(settled_dirty(&view), [elsewhere / 4096]);

        // The same log again changes nothing; LOG_ALL cleared: nothing is marked.
        s.conn
            .set_log_base(&VhostUserLog::new(4096, 0), file)
            .unwrap();
        assert!(s.conn.logging());
        s.conn.set_features(Features::VERSION_1.0).unwrap();
        assert!(!s.conn.logging() && s.conn.vrings[TX0 as usize].running);
        settled_dirty(&view);
        assert_eq!(tx.send(3), (3, 0));
        assert!(settled_dirty(&view).is_empty());
        // Other feature changes under a running queue are still refused.
        let other = Features::VERSION_1 | Features::RING_EVENT_IDX | LOG_ALL;
        assert!(s.conn.set_features(other.0).is_err());
    }

    #[test]
    fn a_new_log_under_logging_queues_takes_over_before_the_reply() {
        let mut s = setup();
        let mut tx = s.front.start_tx0(&mut s.conn);
        let (old_file, old) = log_file(4096);
        s.conn
            .set_log_base(&VhostUserLog::new(4096, 0), old_file)
            .unwrap();
        s.conn
            .set_features((Features::VERSION_1 | LOG_ALL).0)
            .unwrap();
        assert_eq!(tx.send(1), (1, 0));
        assert!(!settled_dirty(&old).is_empty());
        // QEMU resizes the log: a new file; once the reply is in, the old one is unused.
        let (new_file, new) = log_file(8192);
        s.conn
            .set_log_base(&VhostUserLog::new(8192, 0), new_file)
            .unwrap();
        // What the old queue wrote while it stopped went to the old log; nothing after.
        settled_dirty(&old);
        settled_dirty(&new);
        assert_eq!(tx.send(2), (2, 0));
        assert!(settled_dirty(&old).is_empty(), "the old log was written");
        assert_eq!(settled_dirty(&new), [Frontend::rings(TX0).used.0 / 4096]);
    }

    #[test]
    fn get_config_out_of_range_is_refused() {
        let mut s = setup();
        let flags = VhostUserConfigFlags::empty();
        let cfg = NetConfig {
            mac: s.device.mac(),
            status: NET_S_LINK_UP,
            max_virtqueue_pairs: 1,
            mtu: s.device.mtu(),
        }
        .to_bytes();
        let end = cfg.len() as u32;
        assert_eq!(s.conn.get_config(0, end, flags).unwrap(), cfg);
        assert_eq!(s.conn.get_config(0, 6, flags).unwrap(), s.device.mac());
        for (offset, size) in [(end - 1, 2), (end, 1), (0, end + 1), (u32::MAX, 1)] {
            assert!(
                matches!(
                    s.conn.get_config(offset, size, flags),
                    Err(VuError::InvalidParam)
                ),
                "offset {offset} size {size}"
            );
        }
    }

    /// A kick eventfd in semaphore mode (EFD_SEMAPHORE) is an eventfd like any: each read
    /// takes 1 off its counter, so one write of 2^64 - 2 would keep a level-triggered watch
    /// ready for good. The worker watches kicks edge-triggered and sleeps.
    #[test]
    fn a_semaphore_kick_filled_once_does_not_keep_the_worker_awake() {
        let device = null_device();
        let mut conn = Connection::new(device.clone());
        let front = Frontend::new();
        conn.set_features(Features::VERSION_1.0).unwrap();
        front.set_mem_table(&mut conn).unwrap();
        conn.set_vring_num(TX0, Frontend::QUEUE_SIZE as u32)
            .unwrap();
        front
            .set_vring_addr(&mut conn, TX0, Frontend::rings(TX0))
            .unwrap();
        conn.set_vring_base(TX0, 0).unwrap();
        let kick = EventFd::new(EFD_NONBLOCK | EFD_SEMAPHORE).unwrap();
        conn.set_vring_kick(TX0 as u8, Some(eventfd_file(&kick)))
            .unwrap();
        assert!(conn.vrings[TX0 as usize].running);
        kick.write(u64::MAX - 1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300)); // busy polling ends
        let before = testkit::inproc::thread_cpu_ticks("virtnet-pair0");
        std::thread::sleep(std::time::Duration::from_secs(1));
        let ticks = testkit::inproc::thread_cpu_ticks("virtnet-pair0") - before;
        conn.stop_all();
        assert!(
            ticks <= 10,
            "the worker took {ticks} of 100 ticks with nothing to do"
        );
    }

    /// Only the first SET_FEATURES sets the rings' initial state. With `enable_before_features`
    /// (QEMU 7.2) a ring the frontend disabled afterwards was enabled again by the next
    /// SET_FEATURES (LOG_ALL at migration start), and the next requeue ran it.
    #[test]
    fn a_ring_disabled_after_the_features_stays_disabled_when_they_are_sent_again() {
        let device = null_device();
        let mut conn = Connection::new(device.clone());
        let front = Frontend::new();
        conn.enable_before_features = true; // what the session records for QEMU 7.2
        let f = Features::VERSION_1.0 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        conn.set_features(f).unwrap();
        front.set_mem_table(&mut conn).unwrap();
        let _tx = front.set_up_tx0(&mut conn);
        assert!(conn.vrings[TX0 as usize].running);
        conn.set_vring_enable(TX0, false).unwrap();
        assert!(!conn.vrings[TX0 as usize].running);
        // Migration starts: SET_FEATURES with LOG_ALL, then a memory change requeues.
        conn.set_features(f | LOG_ALL.0).unwrap();
        front.set_mem_table(&mut conn).unwrap();
        assert!(!conn.vrings[TX0 as usize].running, "a disabled ring runs");
    }

    /// The other way: a ring enabled but waiting for its memory was disabled by a repeated
    /// SET_FEATURES (QEMU sends one per queue pair) and never started.
    #[test]
    fn a_ring_enabled_before_its_memory_stays_enabled_across_set_features() {
        let device = null_device();
        let mut conn = Connection::new(device.clone());
        let front = Frontend::new();
        let f = Features::VERSION_1.0 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        conn.set_features(f).unwrap();
        conn.set_vring_num(TX0, Frontend::QUEUE_SIZE as u32)
            .unwrap();
        front
            .set_vring_addr(&mut conn, TX0, Frontend::rings(TX0))
            .unwrap();
        let kick = EventFd::new(EFD_NONBLOCK).unwrap();
        conn.set_vring_kick(TX0 as u8, Some(eventfd_file(&kick)))
            .unwrap();
        conn.set_vring_enable(TX0, true).unwrap();
        conn.set_features(f).unwrap();
        front.set_mem_table(&mut conn).unwrap();
        assert!(
            conn.vrings[TX0 as usize].running,
            "an enabled ring did not start"
        );
    }

    /// With two queue pairs, QEMU 7.2 replaces a region (resized, or merged with a neighbour)
    /// as REM_MEM_REG + ADD_MEM_REG per pair. When a region stayed until the last pair removed
    /// it, pair 0's ADD of the replacement overlapped the old region and was refused.
    #[test]
    fn a_region_replaced_by_each_pair_in_turn_is_accepted() {
        let device = null_device();
        let mut conn = Connection::new(device.clone());
        conn.set_features(Features::VERSION_1.0).unwrap();
        let old = GuestMemory::memfd(&[(GuestAddress(0), 0x1_0000)]).unwrap();
        let new = GuestMemory::memfd(&[(GuestAddress(0), 0x2_0000)]).unwrap();
        let region = |m: &GuestMemory| {
            let r = m.regions().next().unwrap();
            let msg = VhostUserSingleMemoryRegion::new(
                r.guest_addr.0,
                r.size,
                r.user_addr,
                r.file_offset,
            );
            (msg, r.file.unwrap().try_clone().unwrap())
        };
        for _pair in 0..2 {
            let (r, f) = region(&old);
            conn.add_mem_region(&r, f, None).unwrap();
        }
        for pair in 0..2 {
            let (r, _) = region(&old);
            conn.remove_mem_region(&r).unwrap();
            let (r, f) = region(&new);
            assert!(
                conn.add_mem_region(&r, f, None).is_ok(),
                "pair {pair}'s ADD_MEM_REG of the resized region refused"
            );
        }
        let mem = conn.mem.as_ref().unwrap();
        assert_eq!(
            mem.regions().map(|r| r.size).collect::<Vec<_>>(),
            [0x2_0000]
        );
    }
}
