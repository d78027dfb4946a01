//! The virtqueues set up with the backend: rings carved from the frontend's memory, their
//! addresses, sizes and eventfds sent (SET_VRING_*), and each queue started (kick, enable) and
//! stopped (GET_VRING_BASE).

use vhost::vhost_user::message::{
    VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::VhostUserFrontend;
use vhost::{VhostBackend, VringConfigData};
use virtnet_sys::PeerEventFd;
use vring::driver::IndirectArea;
use vring::{Features, QueueConfig, RingAddresses};

use super::{req, Connection, FrontendError};

/// One virtqueue as set up with the backend.
#[derive(Debug)]
pub struct QueueSetup {
    /// Its virtqueue index.
    pub index: u16,
    pub config: QueueConfig,
    pub indirect: Option<IndirectArea>,
    /// We write it to notify the backend (kick).
    pub kick: PeerEventFd,
    /// The backend writes it to notify us (call).
    pub call: PeerEventFd,
}

impl Connection {
    /// The queue set up at virtqueue index `index`, if any.
    pub fn queue(&self, index: u16) -> Option<&QueueSetup> {
        self.queues.iter().find(|q| q.index == index)
    }

    /// Sets up virtqueue `index` with `size` entries: rings carved from our memory, kick and
    /// call eventfds. The queue runs once its rings are initialised (DriverQueue::activate)
    /// and [`Connection::start_queue`] is called.
    pub fn setup_queue(&mut self, index: u16, size: u16) -> Result<&QueueSetup, FrontendError> {
        // Bits 0-7 of SET_VRING_KICK/CALL/ERR name the vring, bit 8 means "no fd": 256 would
        // reach the backend as queue 0 without an fd, 512 as queue 0.
        if index > 0xff {
            return Err(FrontendError::QueueIndex { index });
        }
        let vq = index as usize;
        let len = RingAddresses::contiguous_len(size);
        let base = self.alloc.alloc(len, 4096)?;
        let rings = RingAddresses::contiguous(base, size);
        let indirect = if self.features.contains(Features::RING_INDIRECT_DESC) {
            let max_chain = 16;
            let addr = self
                .alloc
                .alloc(IndirectArea::bytes_needed(size, max_chain), 64)?;
            Some(IndirectArea { addr, max_chain })
        } else {
            None
        };
        let config = QueueConfig::new(size as u32, rings, self.features)?;
        let kick = PeerEventFd::new()?;
        let call = PeerEventFd::new()?;
        let f = &mut self.frontend;
        f.set_vring_num(vq, size).map_err(req("SET_VRING_NUM"))?;
        let data = VringConfigData {
            queue_max_size: size,
            queue_size: size,
            flags: 0,
            desc_table_addr: 0,
            used_ring_addr: 0,
            avail_ring_addr: 0,
            log_addr: None,
        };
        let data = VringConfigData {
            desc_table_addr: self.user_addr(rings.desc),
            used_ring_addr: self.user_addr(rings.used),
            avail_ring_addr: self.user_addr(rings.avail),
            ..data
        };
        let f = &mut self.frontend;
        f.set_vring_addr(vq, &data).map_err(req("SET_VRING_ADDR"))?;
        f.set_vring_base(vq, 0).map_err(req("SET_VRING_BASE"))?;
        f.set_vring_call(vq, &call.to_eventfd()?)
            .map_err(req("SET_VRING_CALL"))?;
        self.queues.push(QueueSetup {
            index,
            config,
            indirect,
            kick,
            call,
        });
        Ok(&self.queues[self.queues.len() - 1])
    }

    /// Starts queue `index`: the rings must be initialised (DriverQueue::activate) first.
    pub fn start_queue(&mut self, index: usize) -> Result<(), FrontendError> {
        let setup = self
            .queue(index as u16)
            .ok_or(FrontendError::NoSuchQueue { index })?;
        let kick = setup.kick.to_eventfd()?;
        self.frontend
            .set_vring_kick(index, &kick)
            .map_err(req("SET_VRING_KICK"))?;
        // Rings start disabled when PROTOCOL_FEATURES was negotiated, whichever protocol
        // features were (vhost-user spec, "Ring states").
        let protocol_bit = Features(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
        if self.features.contains(protocol_bit) {
            // With REPLY_ACK, wait for the backend to have enabled it: a frame sent right after
            // this returns then finds the ring serving (a TAP backend attaches the pair's TAP
            // queue as its rx ring is enabled, and the kernel drops what comes before).
            let ack = self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
            if ack {
                self.frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
            let enabled = self.frontend.set_vring_enable(index, true);
            if ack {
                self.frontend.set_hdr_flags(VhostUserHeaderFlag::empty());
            }
            enabled.map_err(req("SET_VRING_ENABLE"))?;
        }
        Ok(())
    }

    /// Stops queue `index` and returns the backend's next avail index.
    pub fn stop_queue(&mut self, index: usize) -> Result<u32, FrontendError> {
        self.frontend
            .get_vring_base(index)
            .map_err(req("GET_VRING_BASE"))
    }
}
