//! The vhost-user handshake (vhost-user spec, "Front-end message types"): connecting,
//! negotiating the features and protocol features, sharing the memory (SET_MEM_TABLE), and the
//! deadline over it all, [`HANDSHAKE_TIMEOUT`], kept by a watchdog thread.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vring::{Features, GuestAddress, GuestMemory};

use super::memory::{Allocator, MEM_BASE};
use super::{req, status, Connection, FrontendError};

/// How long the handshake, from connecting to [`Connection::finish_handshake`], may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Shuts the socket down if the handshake has not finished in time. rust-vmm's `Frontend`
/// retries a read that times out, so a receive timeout cannot stop a backend that never
/// answers from blocking us forever; a shut-down socket makes the read fail.
#[derive(Debug)]
pub(super) struct Watchdog {
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
}
