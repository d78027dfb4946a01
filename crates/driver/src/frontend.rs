//! The driver half's transport: a vhost-user frontend (vhost-user spec, "Front-end message
//! types") on rust-vmm `vhost`, like DPDK's virtio-user.
//!
//! The frontend owns its memory: one memfd region shared with the backend through
//! SET_MEM_TABLE, from which rings, indirect tables and packet buffers are carved. Ring
//! addresses travel as frontend virtual addresses, as QEMU sends them.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtnet_sys::PeerEventFd;
use vring::driver::IndirectArea;
use vring::{Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses};

use vnet::vhost_wire;

/// Frontend errors: the transport failed, or the backend cannot give what we need.
#[derive(Debug, thiserror::Error)]
pub enum FrontendError {
    #[error("cannot connect to {path}: {source}")]
    Connect { path: String, source: vhost::Error },
    #[error("vhost-user {request} failed: {source}")]
    Request {
        request: &'static str,
        source: vhost::Error,
    },
    #[error("backend lacks required features {missing}")]
    MissingFeatures { missing: Features },
    #[error("guest memory: {0}")]
    Memory(#[from] vring::Error),
    #[error("eventfd: {0}")]
    EventFd(#[from] std::io::Error),
    #[error("queue {index} was never set up")]
    NoSuchQueue { index: usize },
    #[error("virtqueue {index} cannot be named: vhost-user's SET_VRING_KICK/CALL carry 8 bits")]
    QueueIndex { index: u16 },
    #[error("out of frontend memory: {wanted} bytes more needed")]
    OutOfMemory { wanted: u64 },
    #[error("the backend did not finish the vhost-user handshake within {after:?}")]
    Timeout { after: Duration },
    #[error("vhost-user {request}: {reason}")]
    Status {
        request: &'static str,
        reason: String,
    },
}

/// The virtio device status bits (spec 2.1) a driver sets, in the order it sets them.
pub mod status {
    use virtio_bindings::virtio_config as c;
    pub const ACKNOWLEDGE: u8 = c::VIRTIO_CONFIG_S_ACKNOWLEDGE as u8;
    pub const DRIVER: u8 = c::VIRTIO_CONFIG_S_DRIVER as u8;
    pub const FEATURES_OK: u8 = c::VIRTIO_CONFIG_S_FEATURES_OK as u8;
    pub const DRIVER_OK: u8 = c::VIRTIO_CONFIG_S_DRIVER_OK as u8;
}

fn req(request: &'static str) -> impl FnOnce(vhost::Error) -> FrontendError {
    move |source| FrontendError::Request { request, source }
}

/// A bump allocator over the frontend's memory.
#[derive(Debug)]
pub struct Allocator {
    next: u64,
    end: u64,
}

impl Allocator {
    /// An allocator over `[start, end)`, for unit tests that build queues by hand.
    #[cfg(test)]
    pub(crate) fn over(start: GuestAddress, end: u64) -> Allocator {
        Allocator { next: start.0, end }
    }

    pub fn alloc(&mut self, len: u64, align: u64) -> Result<GuestAddress, FrontendError> {
        let at = self.next.next_multiple_of(align);
        if at + len > self.end {
            return Err(FrontendError::OutOfMemory {
                wanted: at + len - self.end,
            });
        }
        self.next = at + len;
        Ok(GuestAddress(at))
    }
}

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

/// A connected, negotiated vhost-user device.
pub struct Connection {
    frontend: Frontend,
    /// The same socket, for SET_STATUS, GET_STATUS and NET_SET_MTU, which rust-vmm's
    /// `Frontend` cannot send.
    raw: UnixStream,
    /// Armed from connecting until [`Connection::finish_handshake`].
    watchdog: Option<Watchdog>,
    /// The status last set (0 until [`Connection::set_status`]).
    status: u8,
    pub features: Features,
    pub protocol: VhostUserProtocolFeatures,
    pub mem: Arc<GuestMemory>,
    pub alloc: Allocator,
    pub queues: Vec<QueueSetup>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("features", &self.features)
            .field("queues", &self.queues.len())
            .finish()
    }
}

/// How long the handshake, from connecting to [`Connection::finish_handshake`], may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Shuts the socket down if the handshake has not finished in time. rust-vmm's `Frontend`
/// retries a read that times out, so a receive timeout cannot stop a backend that never
/// answers from blocking us forever; a shut-down socket makes the read fail.
#[derive(Debug)]
struct Watchdog {
    /// (finished, fired), and the condition the watchdog thread waits on.
    state: Arc<(std::sync::Mutex<(bool, bool)>, std::sync::Condvar)>,
}

impl Watchdog {
    fn arm(sock: UnixStream, timeout: Duration) -> Result<Watchdog, FrontendError> {
        let state = Arc::new((
            std::sync::Mutex::new((false, false)),
            std::sync::Condvar::new(),
        ));
        let s = state.clone();
        std::thread::Builder::new()
            .name("vhost-user-watchdog".into())
            .spawn(move || {
                let (m, cv) = &*s;
                let g = m.lock().unwrap_or_else(|e| e.into_inner());
                let (mut g, _) = cv
                    .wait_timeout_while(g, timeout, |(finished, _)| !*finished)
                    .unwrap_or_else(|e| e.into_inner());
                if !g.0 {
                    g.1 = true;
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            })?;
        Ok(Watchdog { state })
    }

    fn fired(&self) -> bool {
        self.state.0.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Stops the watchdog; returns whether it had already fired (then the socket is shut
    /// down, whatever the requests before said).
    fn finish(&self) -> bool {
        let fired = {
            let mut g = self.state.0.lock().unwrap_or_else(|e| e.into_inner());
            g.0 = true;
            g.1
        };
        self.state.1.notify_one();
        fired
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Guest address where the frontend's memory starts (any page-aligned value works).
const MEM_BASE: u64 = 0x1_0000_0000;

impl Connection {
    /// Connects to `path` (retrying for up to `wait`), negotiates `wanted` features (those in
    /// `required` must be offered) and the protocol features we use, shares `mem_size` bytes of
    /// memory, and sets up `num_queues` queues of `queue_size`.
    pub fn connect(
        path: &Path,
        num_queues: u16,
        queue_size: u16,
        wanted: Features,
        required: Features,
        mem_size: usize,
        wait: Duration,
    ) -> Result<Connection, FrontendError> {
        let conn = Connection::open(path, num_queues, wanted, required, mem_size, wait)?;
        conn.with_queues(num_queues, queue_size)
    }

    /// Like [`Connection::connect`], on a socket already connected to the backend: one a
    /// listening frontend accepted (QEMU's `-chardev socket,server=on`, with the backend in
    /// client mode).
    pub fn from_stream(
        sock: UnixStream,
        num_queues: u16,
        queue_size: u16,
        wanted: Features,
        required: Features,
        mem_size: usize,
    ) -> Result<Connection, FrontendError> {
        let conn = Connection::open_stream(sock, num_queues, wanted, required, &|_| mem_size)?;
        conn.with_queues(num_queues, queue_size)
    }

    /// Sets up queues `0..num_queues` of `queue_size` and ends the handshake's deadline.
    fn with_queues(
        mut self,
        num_queues: u16,
        queue_size: u16,
    ) -> Result<Connection, FrontendError> {
        for i in 0..num_queues {
            if let Err(e) = self.setup_queue(i, queue_size) {
                return Err(self.handshake_error(e));
            }
        }
        self.finish_handshake()?;
        Ok(self)
    }

    /// Like [`Connection::connect`], but sets up no queue: the caller reads the config space
    /// first and then sets up the queues it wants with [`Connection::setup_queue`] (a control
    /// queue sits at 2 * max_virtqueue_pairs, after every data queue the device has).
    /// `max_queues` bounds the queue indices used later.
    pub fn open(
        path: &Path,
        max_queues: u16,
        wanted: Features,
        required: Features,
        mem_size: usize,
        wait: Duration,
    ) -> Result<Connection, FrontendError> {
        Connection::open_sized(path, max_queues, wanted, required, &|_| mem_size, wait)
    }

    /// Like [`Connection::open`], with the memory's size computed from the features
    /// negotiated (the rx buffers a device without MRG_RXBUF needs are 40 times larger).
    pub fn open_sized(
        path: &Path,
        max_queues: u16,
        wanted: Features,
        required: Features,
        mem_size: &dyn Fn(Features) -> usize,
        wait: Duration,
    ) -> Result<Connection, FrontendError> {
        let deadline = Instant::now() + wait;
        let sock = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(FrontendError::Connect {
                        path: path.display().to_string(),
                        source: vhost::Error::VhostUserProtocol(
                            vhost::vhost_user::Error::SocketConnect(e),
                        ),
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        Connection::open_stream(sock, max_queues, wanted, required, mem_size)
    }

    /// [`Connection::open`] on a connected socket: the handshake, under its deadline.
    fn open_stream(
        sock: UnixStream,
        max_queues: u16,
        wanted: Features,
        required: Features,
        mem_size: &dyn Fn(Features) -> usize,
    ) -> Result<Connection, FrontendError> {
        let watchdog = Watchdog::arm(sock.try_clone()?, HANDSHAKE_TIMEOUT)?;
        match Self::handshake(sock, max_queues, wanted, required, mem_size) {
            Ok(mut conn) => {
                conn.watchdog = Some(watchdog);
                Ok(conn)
            }
            Err(_) if watchdog.fired() => Err(FrontendError::Timeout {
                after: HANDSHAKE_TIMEOUT,
            }),
            Err(e) => Err(e),
        }
    }

    /// Negotiation and memory, on a connected socket.
    fn handshake(
        sock: UnixStream,
        max_queues: u16,
        wanted: Features,
        required: Features,
        mem_size: &dyn Fn(Features) -> usize,
    ) -> Result<Connection, FrontendError> {
        let raw = sock.try_clone()?;
        let mut frontend = Frontend::from_stream(sock, max_queues as u64);
        frontend.set_owner().map_err(req("SET_OWNER"))?;
        let offered = Features(frontend.get_features().map_err(req("GET_FEATURES"))?);
        let missing = required.difference(offered);
        if missing != Features::EMPTY {
            return Err(FrontendError::MissingFeatures { missing });
        }
        let protocol_bit = Features(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
        let features = Features::negotiate(offered, wanted | protocol_bit);
        let mut protocol = VhostUserProtocolFeatures::empty();
        if features.contains(protocol_bit) {
            let ours = VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MTU
                | VhostUserProtocolFeatures::STATUS;
            protocol = frontend
                .get_protocol_features()
                .map_err(req("GET_PROTOCOL_FEATURES"))?
                & ours;
            frontend
                .set_protocol_features(protocol)
                .map_err(req("SET_PROTOCOL_FEATURES"))?;
            // GET_QUEUE_NUM is not asked: vhost-user-net backends (DPDK, ours) answer in queue
            // pairs, while rust-vmm's Frontend takes the answer as a vring count and would
            // then refuse our tx queues. A backend with too few queues refuses SET_VRING_*.
        }
        frontend
            .set_features(features.0)
            .map_err(req("SET_FEATURES"))?;
        let mem_size = mem_size(features);
        let mem = Arc::new(GuestMemory::memfd(&[(GuestAddress(MEM_BASE), mem_size)])?);
        let regions: Vec<_> = mem
            .regions()
            .map(|r| VhostUserMemoryRegionInfo {
                guest_phys_addr: r.guest_addr.0,
                memory_size: r.size,
                userspace_addr: r.user_addr,
                mmap_offset: r.file_offset,
                mmap_handle: r.file.map_or(-1, |f| f.as_raw_fd()),
            })
            .collect();
        frontend
            .set_mem_table(&regions)
            .map_err(req("SET_MEM_TABLE"))?;
        let mut conn = Connection {
            frontend,
            raw,
            watchdog: None,
            status: 0,
            features,
            protocol,
            mem,
            alloc: Allocator {
                next: MEM_BASE,
                end: MEM_BASE + mem_size as u64,
            },
            queues: Vec::new(),
        };
        // The driver's steps so far (spec 3.1.1): it found the device, knows how to drive it,
        // and the features are set. The caller sets DRIVER_OK once its queues run.
        conn.set_status(status::ACKNOWLEDGE | status::DRIVER)?;
        conn.set_status(status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK)?;
        Ok(conn)
    }

    /// Ends the handshake's deadline ([`HANDSHAKE_TIMEOUT`] from connecting): the caller has
    /// set up and started its queues. Until then, a backend that stops answering has the
    /// socket shut down under it, and the request waiting on it fails. [`FrontendError::Timeout`]
    /// if the deadline passed (even if every request before happened to succeed).
    pub fn finish_handshake(&mut self) -> Result<(), FrontendError> {
        if self.watchdog.take().is_some_and(|w| w.finish()) {
            return Err(FrontendError::Timeout {
                after: HANDSHAKE_TIMEOUT,
            });
        }
        Ok(())
    }

    /// What a request failing during the handshake failed of: [`FrontendError::Timeout`] once
    /// the deadline passed (the socket was shut down under the request), else `e`.
    pub fn handshake_error<E: From<FrontendError>>(&self, e: E) -> E {
        if self.watchdog.as_ref().is_some_and(Watchdog::fired) {
            FrontendError::Timeout {
                after: HANDSHAKE_TIMEOUT,
            }
            .into()
        } else {
            e
        }
    }

    /// Whether the STATUS protocol feature was negotiated: SET_STATUS and GET_STATUS work.
    pub fn has_status(&self) -> bool {
        self.protocol.contains(VhostUserProtocolFeatures::STATUS)
    }

    /// Sends SET_STATUS with `value` (waiting for the backend's ack with REPLY_ACK). Without
    /// the STATUS protocol feature, only remembers it. DPDK's vhost library starts a device
    /// that negotiated STATUS only once DRIVER_OK is set.
    pub fn set_status(&mut self, value: u8) -> Result<(), FrontendError> {
        self.status = value;
        if !self.has_status() {
            return Ok(());
        }
        match self.send_u64(FrontendReq::SET_STATUS, "SET_STATUS", value.into())? {
            Some(code) if code != 0 => Err(FrontendError::Status {
                request: "SET_STATUS",
                reason: format!("the backend refused status {value:#x} (reply {code})"),
            }),
            _ => Ok(()),
        }
    }

    /// Sends `req` (one we frame ourselves, see `vhost_wire`) with a u64 payload, asking for
    /// an ack when REPLY_ACK was negotiated; returns the ack's code then, None without it.
    fn send_u64(
        &mut self,
        req: FrontendReq,
        name: &'static str,
        value: u64,
    ) -> Result<Option<u64>, FrontendError> {
        let ack = self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        let need_reply = if ack {
            VhostUserHeaderFlag::NEED_REPLY.bits()
        } else {
            0
        };
        let msg = vhost_wire::encode(
            req,
            vhost_wire::VERSION_1 | need_reply,
            &value.to_ne_bytes(),
        );
        self.raw.write_all(&msg)?;
        Ok(if ack {
            Some(self.reply(req, name)?)
        } else {
            None
        })
    }

    /// Tells the backend the MTU the driver is given (NET_SET_MTU, what QEMU sends for
    /// `host_mtu`), and with REPLY_ACK waits for its answer: an error if it refused. Needs the
    /// MTU protocol feature.
    pub fn set_mtu(&mut self, mtu: u16) -> Result<(), FrontendError> {
        let refused = |reason: String| FrontendError::Status {
            request: "NET_SET_MTU",
            reason,
        };
        if !self.protocol.contains(VhostUserProtocolFeatures::MTU) {
            return Err(refused(
                "the MTU protocol feature was not negotiated".into(),
            ));
        }
        match self.send_u64(FrontendReq::NET_SET_MTU, "NET_SET_MTU", mtu.into())? {
            Some(code) if code != 0 => Err(refused(format!(
                "the backend refused MTU {mtu} (reply {code})"
            ))),
            _ => Ok(()),
        }
    }

    /// Waits up to `timeout` for the backend to close the connection, and returns whether it
    /// did: end of file or an error on the vhost-user socket, which is how a backend that
    /// exited or was killed shows (its kick and call eventfds do not: an eventfd has no peer,
    /// so kicks still succeed and calls just stop). After the handshake a backend sends
    /// nothing unasked, so a readable socket means it closed; bytes it sends anyway are read
    /// and dropped (up to 4 KiB a call, so that a close after them still shows on a later
    /// call), and the wait sleeps out its time.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if !virtnet_sys::wait_readable(self.raw.as_raw_fd(), ms) {
            return false;
        }
        match virtnet_sys::recv_now(&self.raw, &mut [0u8; 4096]) {
            Ok(0) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => true,
            Ok(_) => {
                std::thread::sleep(timeout);
                false
            }
        }
    }

    /// The status last set with [`Connection::set_status`].
    pub fn status(&self) -> u8 {
        self.status
    }

    /// Asks the backend for the device status (GET_STATUS): what it took from SET_STATUS,
    /// plus NEEDS_RESET if it stopped a queue. None without the STATUS protocol feature.
    pub fn get_status(&mut self) -> Result<Option<u8>, FrontendError> {
        if !self.has_status() {
            return Ok(None);
        }
        let msg = vhost_wire::encode(FrontendReq::GET_STATUS, vhost_wire::VERSION_1, &[]);
        self.raw.write_all(&msg)?;
        let v = self.reply(FrontendReq::GET_STATUS, "GET_STATUS")?;
        u8::try_from(v)
            .map(Some)
            .map_err(|_| FrontendError::Status {
                request: "GET_STATUS",
                reason: format!("status {v:#x} does not fit a byte"),
            })
    }

    /// Reads the reply to `code` (named `request` in errors): a header with REPLY set and a
    /// u64 payload, which it returns.
    fn reply(&mut self, code: FrontendReq, request: &'static str) -> Result<u64, FrontendError> {
        let mut hdr = [0u8; vhost_wire::HDR_LEN];
        self.raw.read_exact(&mut hdr)?;
        let (got, flags, size) = vhost_wire::decode_header(&hdr);
        if got != u32::from(code) || flags & VhostUserHeaderFlag::REPLY.bits() == 0 || size != 8 {
            return Err(FrontendError::Status {
                request,
                reason: format!("unexpected reply: request {got}, flags {flags:#x}, size {size}"),
            });
        }
        let mut v = [0u8; 8];
        self.raw.read_exact(&mut v)?;
        Ok(u64::from_ne_bytes(v))
    }

    fn user_addr(&self, a: GuestAddress) -> u64 {
        let r = self.mem.regions().next().expect("one region");
        r.user_addr + (a.0 - r.guest_addr.0)
    }

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

    /// Reads `len` bytes of the device config space at `offset`.
    pub fn get_config(&mut self, offset: u32, len: u32) -> Result<Vec<u8>, FrontendError> {
        use vhost::vhost_user::message::VhostUserConfigFlags;
        let buf = vec![0u8; len as usize];
        let (_, data) = self
            .frontend
            .get_config(offset, len, VhostUserConfigFlags::WRITABLE, &buf)
            .map_err(req("GET_CONFIG"))?;
        Ok(data)
    }
}

/// Waits up to `timeout_ms` (negative: forever) for `fd` to become readable.
pub fn wait_readable(fd: &PeerEventFd, timeout_ms: i32) -> bool {
    use std::os::fd::AsRawFd;
    virtnet_sys::wait_readable(fd.as_raw_fd(), timeout_ms)
}
