//! Serving frontends: one connection at a time, each request through rust-vmm's message
//! layer into our protocol state ([`vhost::Connection`]), except the requests that layer does
//! not dispatch ([`intercept`]: the status requests and NET_SET_MTU); each only once
//! [`gate`] says it is whole on the socket and a reply can be sent.
//!
//! One frontend at a time, as a vhost-user device is one device: a frontend that speaks the
//! protocol keeps the device for as long as it stays connected, however quiet it goes (QEMU
//! waits for its guest's driver before it sets up a queue, for minutes if the guest takes
//! them). A frontend that does not speak, or starts a message and does not finish it, or does
//! not read its replies, is dropped by the gate's deadlines, and the next one is served.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ::vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures};
use ::vhost::vhost_user::{BackendReqHandler, Error as VuError};

use super::device::Device;
use super::gate::{self, Deadlines};
use super::intercept::{Handled, Header};
use super::status::Status;
use super::{mtu, rarp, status, vhost};

pub use super::gate::{FIRST_REQUEST_TIMEOUT, MESSAGE_DEADLINE};

/// The vhost-user message layer of one connection, dispatching to its [`vhost::Connection`].
pub type RequestHandler = BackendReqHandler<Mutex<vhost::Connection>>;

/// Serves one frontend connection until it goes away or breaks the protocol, then stops its
/// queues. Never panics on frontend input.
pub fn serve_connection(device: &Arc<Device>, stream: UnixStream) {
    serve_stream(device, stream);
}

/// [`serve_connection`]; whether the frontend spoke (had a request served).
fn serve_stream(device: &Arc<Device>, stream: UnixStream) -> bool {
    match Session::new(device, stream) {
        Ok(mut s) => {
            while s.serve_one() {}
            s.spoke
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot serve the frontend");
            false
        }
    }
}

/// One frontend connection being served: rust-vmm's request handler over our protocol state,
/// plus the requests the handler does not dispatch ([`intercept`]).
pub struct Session {
    handler: Option<RequestHandler>,
    conn: Arc<Mutex<vhost::Connection>>,
    /// The same socket, to peek at each request and answer those the handler does not
    /// dispatch.
    stream: UnixStream,
    status: status::Status,
    device: Arc<Device>,
    deadlines: Deadlines,
    /// When the session started serving the connection: its first request is due by then
    /// plus `deadlines.first_request`.
    opened: Instant,
    /// Whether a request has been served; until then the first request's deadline holds.
    spoke: bool,
    /// The session's number on its device (`Device::serving`).
    id: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("open", &self.handler.is_some())
            .field("status", &self.status)
            .field("spoke", &self.spoke)
            .finish()
    }
}

impl Session {
    /// A fresh connection: the device is reset to its defaults. Refused if the device is
    /// retired (`Device::retire`).
    pub(crate) fn new(device: &Arc<Device>, stream: UnixStream) -> io::Result<Session> {
        let ours = stream.try_clone()?;
        let id = device.serving(&stream)?;
        device.reset();
        // After the reset, which waits for the workers: the frontend's time starts now.
        let opened = Instant::now();
        let conn = Arc::new(Mutex::new(vhost::Connection::new(device.clone())));
        Ok(Session {
            stream: ours,
            handler: Some(RequestHandler::from_stream(stream, conn.clone())),
            conn,
            status: status::Status::default(),
            device: device.clone(),
            deadlines: Deadlines::default(),
            opened,
            spoke: false,
            id,
        })
    }

    /// Replaces the gate's deadlines (the fuzz target's are short, so that a stalled message
    /// costs it milliseconds).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn set_deadlines(&mut self, deadlines: Deadlines) {
        self.deadlines = deadlines;
    }

    /// Handles one request; returns false once the connection has closed (its queues are
    /// stopped then). The vhost-user fuzz target steps through the same loop, message by
    /// message (`fuzzing::serve_one`).
    pub(crate) fn serve_one(&mut self) -> bool {
        if self.handler.is_none() {
            return false;
        }
        // A frontend may go quiet for as long as it likes once it has spoken.
        let first_by = (!self.spoke).then(|| self.opened + self.deadlines.first_request);
        let open = match gate::await_request(&self.stream, self.deadlines, first_by) {
            Err(why) => {
                tracing::warn!(%why, "closing the connection");
                false
            }
            Ok(()) => match self.intercept() {
                Ok(Handled::Yes) => true,
                Ok(Handled::No) => match self.handler.as_mut() {
                    Some(handler) => serve_request(handler, &self.conn),
                    None => false,
                },
                Ok(Handled::Close(why)) => {
                    tracing::warn!(why, "closing the connection");
                    false
                }
                Err(e) => {
                    tracing::info!(error = %e, "frontend disconnected");
                    false
                }
            },
        };
        if open {
            self.spoke = true;
        } else {
            self.close();
        }
        open
    }

    /// Answers the next request if it is one rust-vmm's handler does not dispatch, and its
    /// protocol feature was acknowledged (if not, the handler refuses it, as the spec wants).
    fn intercept(&mut self) -> io::Result<Handled> {
        let Some(hdr) = Header::peek(&self.stream)? else {
            return Ok(Handled::No);
        };
        let acked = match self.conn.lock() {
            Ok(c) => c.acked_protocol(),
            Err(_) => VhostUserProtocolFeatures::empty(),
        };
        let reply_ack = acked.contains(VhostUserProtocolFeatures::REPLY_ACK);
        if Status::handles(&hdr) && acked.contains(VhostUserProtocolFeatures::STATUS) {
            // Read when GET_STATUS arrives, not before waiting for it.
            let conn = &self.conn;
            let needs_reset = || conn.lock().map(|c| c.needs_reset()).unwrap_or(true);
            let handled = self
                .status
                .handle(&self.stream, &hdr, reply_ack, needs_reset)?;
            let shared = self.device.shared();
            shared.set_status(self.status.status, self.status.sets);
            return Ok(handled);
        }
        if hdr.is(FrontendReq::NET_SET_MTU) && acked.contains(VhostUserProtocolFeatures::MTU) {
            let shared = self.device.shared();
            return mtu::handle(&self.stream, &hdr, reply_ack, |m| shared.set_mtu(m));
        }
        if hdr.is(FrontendReq::SEND_RARP) && acked.contains(VhostUserProtocolFeatures::RARP) {
            return rarp::handle(&self.stream, &hdr, reply_ack, self.device.shared());
        }
        Ok(Handled::No)
    }

    /// Closes the connection and stops its queues (what happens when the frontend goes away).
    pub(crate) fn close(&mut self) {
        if self.handler.take().is_some() {
            // Our clone of the socket would keep it open: the frontend must see the close.
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            match self.conn.lock() {
                Ok(mut c) => c.stop_all(),
                Err(poisoned) => poisoned.into_inner().stop_all(),
            };
            self.device.served(self.id);
        }
    }
}

impl Drop for Session {
    /// The device's clone of the socket goes with the session, closed or not.
    fn drop(&mut self) {
        self.device.served(self.id);
    }
}

/// Handles one request of the frontend through rust-vmm's handler; returns false when the
/// connection must close: the frontend went away, broke the message layer, or waits for a
/// reply we could not send.
fn serve_request(handler: &mut RequestHandler, conn: &Mutex<vhost::Connection>) -> bool {
    match handler.handle_request() {
        Ok(()) => true,
        Err(VuError::Disconnected) | Err(VuError::PartialMessage) => {
            tracing::info!("frontend disconnected");
            false
        }
        Err(VuError::InactiveFeature(_)) => {
            // SET_VRING_ENABLE before SET_FEATURES (QEMU 7.2): see Connection.
            tracing::debug!("ring enabled before features were set; enabling at SET_FEATURES");
            if let Ok(mut c) = conn.lock() {
                c.enable_before_features = true;
            }
            true
        }
        Err(e) => {
            // A request whose protocol feature was not acknowledged: the handler refused it
            // without an answer, which a request that wants one would wait for forever.
            let unanswered = matches!(e, VuError::InactiveOperation(_));
            let must_close = unanswered || conn.lock().map(|c| c.must_disconnect).unwrap_or(true);
            let socket_level = matches!(
                e,
                VuError::SocketBroken(_)
                    | VuError::SocketError(_)
                    | VuError::SocketRetry(_)
                    | VuError::InvalidMessage
                    | VuError::OversizedMsg
                    | VuError::IncorrectFds
            );
            tracing::warn!(error = %e, "vhost-user request failed");
            if must_close || socket_level {
                tracing::warn!("closing the connection");
            }
            !(must_close || socket_level)
        }
    }
}

/// Accepts frontends one after another until `stop` is set.
pub fn serve(device: Arc<Device>, listener: UnixListener, stop: Arc<AtomicBool>) -> io::Result<()> {
    for stream in listener.incoming() {
        if stop.load(Relaxed) {
            break;
        }
        match stream {
            Ok(s) => {
                tracing::info!("frontend connected");
                serve_connection(&device, s);
            }
            Err(e) => accept_failed(&e),
        }
    }
    Ok(())
}

/// Client mode: connects to a frontend listening at `path` (QEMU's `-chardev
/// socket,server=on`, OVS-DPDK's `dpdkvhostuserclient` ports) and serves it as
/// [`serve_connection`] serves an accepted one; when the connection ends, or while nothing
/// listens there yet, connects again after a back-off: [`RECONNECT_FIRST`], doubling on each
/// attempt that fails up to [`RECONNECT_MAX`]. An attempt fails unless its frontend spoke and
/// its connection lasted [`RECONNECT_STABLE`]: a listener that accepts and hangs up, sends
/// garbage, says nothing until the gate drops it, or never accepts (its backlog full: the
/// connect does not wait for it) is not hammered. Returns once `stop` is set (checked at
/// least every [`RECONNECT_POLL`] while waiting).
pub fn serve_client(device: Arc<Device>, path: &Path, stop: Arc<AtomicBool>) -> io::Result<()> {
    let mut delay = RECONNECT_FIRST;
    let mut failures = 0u64;
    while !stop.load(Relaxed) {
        match virtnet_sys::socket::connect_now(path) {
            Ok(s) => {
                tracing::info!(path = %path.display(), "connected to the frontend");
                failures = 0;
                let started = Instant::now();
                let spoke = serve_stream(&device, s);
                if spoke && started.elapsed() >= RECONNECT_STABLE {
                    delay = RECONNECT_FIRST;
                }
            }
            Err(e) => {
                // The first failure of a run is worth a line; the retries that follow are not.
                if failures == 0 {
                    tracing::info!(path = %path.display(), error = %e, "no frontend yet; retrying");
                } else {
                    tracing::debug!(path = %path.display(), error = %e, failures, "no frontend yet");
                }
                failures += 1;
            }
        }
        let until = Instant::now() + delay;
        while !stop.load(Relaxed) && Instant::now() < until {
            std::thread::sleep(RECONNECT_POLL.min(until.saturating_duration_since(Instant::now())));
        }
        delay = (delay * 2).min(RECONNECT_MAX);
    }
    Ok(())
}

/// Client mode's first wait before connecting again, and its ceiling (the wait doubles in
/// between): a frontend that restarts is found within about 100 ms, one that is away for long
/// is asked every 5 s.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(100);
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// A connection that lasted this long resets the back-off; a shorter one (a frontend that
/// accepts and hangs up) counts as a failed attempt.
pub const RECONNECT_STABLE: Duration = Duration::from_secs(1);
/// How often a waiting client checks its stop flag.
pub const RECONNECT_POLL: Duration = Duration::from_millis(50);

/// After a failed accept: out of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
/// next accept fails the same way at once, so wait a little instead of spinning.
pub(crate) fn accept_failed(e: &io::Error) {
    tracing::warn!(error = %e, "accept failed");
    let exhausted = [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM];
    if e.raw_os_error().is_some_and(|c| exhausted.contains(&c)) {
        std::thread::sleep(ACCEPT_BACKOFF);
    }
}

/// How long an accept loop waits after running out of descriptors or memory.
pub(crate) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};

    use ::vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserVirtioFeatures};
    use vnet::vhost_wire::{self, HDR_LEN, VERSION_1};
    use vring::Features;

    use super::*;
    use crate::queue::QueueId;
    use crate::testing::{null_device, Frontend};

    /// Sends GET_FEATURES on `frontend`, serves it, and returns the features answered.
    fn get_features(session: &mut Session, mut frontend: &UnixStream) -> u64 {
        let request = vhost_wire::encode(FrontendReq::GET_FEATURES, VERSION_1, &[]);
        frontend.write_all(&request).unwrap();
        assert!(session.serve_one(), "GET_FEATURES closed the connection");
        let mut reply = [0u8; HDR_LEN + 8];
        frontend.read_exact(&mut reply).unwrap();
        let (code, flags, size) = vhost_wire::decode_header(reply[..HDR_LEN].try_into().unwrap());
        assert_eq!(code, u32::from(FrontendReq::GET_FEATURES));
        assert_eq!(flags, VERSION_1 | VhostUserHeaderFlag::REPLY.bits());
        assert_eq!(size, 8);
        u64::from_le_bytes(reply[HDR_LEN..].try_into().unwrap())
    }

    /// Sends `payload` as request `code` with `flags` and serves it.
    fn send(
        session: &mut Session,
        mut frontend: &UnixStream,
        code: FrontendReq,
        flags: u32,
        payload: &[u8],
    ) -> bool {
        frontend
            .write_all(&vhost_wire::encode(code, flags, payload))
            .unwrap();
        session.serve_one()
    }

    /// The u64 reply to `code` waiting on `frontend`.
    fn reply_u64(mut frontend: &UnixStream, code: FrontendReq) -> u64 {
        let mut reply = [0u8; HDR_LEN + 8];
        frontend.read_exact(&mut reply).unwrap();
        let (got, flags, size) = vhost_wire::decode_header(reply[..HDR_LEN].try_into().unwrap());
        assert_eq!(
            (got, flags, size),
            (
                u32::from(code),
                VERSION_1 | VhostUserHeaderFlag::REPLY.bits(),
                8
            )
        );
        u64::from_ne_bytes(reply[HDR_LEN..].try_into().unwrap())
    }

    /// A session on `device` whose frontend acknowledged PROTOCOL_FEATURES and `protocol`.
    fn negotiated(
        device: &Arc<Device>,
        protocol: VhostUserProtocolFeatures,
    ) -> (Session, UnixStream) {
        let (frontend, backend_end) = UnixStream::pair().unwrap();
        frontend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut session = Session::new(device, backend_end).unwrap();
        get_features(&mut session, &frontend);
        let features = Features::VERSION_1.0 | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        let set = FrontendReq::SET_FEATURES;
        assert!(send(
            &mut session,
            &frontend,
            set,
            VERSION_1,
            &features.to_le_bytes()
        ));
        let set = FrontendReq::SET_PROTOCOL_FEATURES;
        let bits = protocol.bits().to_le_bytes();
        assert!(send(&mut session, &frontend, set, VERSION_1, &bits));
        assert_eq!(session.conn.lock().unwrap().acked_protocol(), protocol);
        (session, frontend)
    }

    /// The config space's `mtu` (VIRTIO 1.2 5.1.4: bytes 10 and 11, little-endian).
    fn config_mtu(session: &Session) -> u16 {
        let flags = ::vhost::vhost_user::message::VhostUserConfigFlags::empty();
        let mut conn = session.conn.lock().unwrap();
        let b = ::vhost::vhost_user::VhostUserBackendReqHandlerMut::get_config(
            &mut *conn, 10, 2, flags,
        )
        .unwrap();
        u16::from_le_bytes([b[0], b[1]])
    }

    #[test]
    fn a_retired_device_ends_its_session_and_refuses_the_next() {
        let device = null_device();
        let (mut session, mut frontend) = negotiated(&device, VhostUserProtocolFeatures::empty());
        device.retire();
        // The session reads the end of its stream, and the frontend the end of its.
        assert!(!session.serve_one(), "the retired device served on");
        assert_eq!(frontend.read(&mut [0u8; 16]).unwrap(), 0);
        let (_frontend, backend_end) = UnixStream::pair().unwrap();
        let refused = Session::new(&device, backend_end).err();
        assert_eq!(
            refused.map(|e| e.kind()),
            Some(ErrorKind::ConnectionRefused)
        );
    }

    #[test]
    fn net_set_mtu_is_applied_acked_and_reported_in_the_config_space() {
        let device = null_device();
        let protocol = VhostUserProtocolFeatures::MTU | VhostUserProtocolFeatures::REPLY_ACK;
        let (mut session, frontend) = negotiated(&device, protocol);
        assert_eq!(config_mtu(&session), 1500, "the default");
        let set_mtu = FrontendReq::NET_SET_MTU;
        let need_reply = VERSION_1 | VhostUserHeaderFlag::NEED_REPLY.bits();
        assert!(send(
            &mut session,
            &frontend,
            set_mtu,
            need_reply,
            &9000u64.to_ne_bytes()
        ));
        assert_eq!(reply_u64(&frontend, set_mtu), 0, "acked");
        assert_eq!((device.mtu(), config_mtu(&session)), (9000, 9000));
        assert_eq!(device.device_report().mtu, 9000);

        // Refused with a non-zero ack, nothing changed, the connection served on.
        let bad: [&[u8]; 4] = [
            &67u64.to_ne_bytes(),
            &65536u64.to_ne_bytes(),
            &[0x28, 0x23],
            &[],
        ];
        for payload in bad {
            assert!(
                send(&mut session, &frontend, set_mtu, need_reply, payload),
                "{payload:02x?} closed it"
            );
            assert_eq!(reply_u64(&frontend, set_mtu), 1, "{payload:02x?} acked");
            assert_eq!(device.mtu(), 9000, "{payload:02x?} applied");
        }
        let features = get_features(&mut session, &frontend);
        assert_eq!(
            features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
            VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
        );
        // The MTU is the device's: the next connection finds it.
        drop(session);
        let (session, _frontend) = negotiated(&device, protocol);
        assert_eq!(config_mtu(&session), 9000);
    }

    #[test]
    fn requests_of_features_not_acknowledged_go_to_the_handler_which_closes_the_connection() {
        let device = null_device();
        for (protocol, code, payload) in [
            (
                VhostUserProtocolFeatures::REPLY_ACK,
                FrontendReq::NET_SET_MTU,
                9000u64,
            ),
            (
                VhostUserProtocolFeatures::REPLY_ACK,
                FrontendReq::SET_STATUS,
                1u64,
            ),
        ] {
            let (mut session, frontend) = negotiated(&device, protocol);
            let need_reply = VERSION_1 | VhostUserHeaderFlag::NEED_REPLY.bits();
            assert!(
                !send(
                    &mut session,
                    &frontend,
                    code,
                    need_reply,
                    &payload.to_ne_bytes()
                ),
                "{code:?} was served"
            );
            assert_eq!(device.mtu(), 1500);
            assert_eq!(device.device_report().status, 0);
        }
    }

    #[test]
    fn a_client_waiting_for_its_frontend_returns_soon_after_stop() {
        let device = null_device();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let path = std::env::temp_dir().join(format!("virtnet-nobody-{}.sock", std::process::id()));
        let client = std::thread::spawn(move || serve_client(device, &path, s));
        // Long enough to be in a back-off of several steps.
        std::thread::sleep(Duration::from_millis(400));
        let stopped = Instant::now();
        stop.store(true, Relaxed);
        while !client.is_finished() {
            assert!(stopped.elapsed() < RECONNECT_POLL * 4, "still waiting");
            std::thread::sleep(Duration::from_millis(5));
        }
        client.join().unwrap().unwrap();
    }

    const SHORT: Deadlines = Deadlines {
        first_request: Duration::from_millis(300),
        message: Duration::from_millis(60),
    };

    #[test]
    fn a_stalled_request_closes_the_connection_and_its_queues_and_the_next_is_served() {
        let device = null_device();
        let tx0 = QueueId::Tx(0);
        let (mut frontend, backend_end) = UnixStream::pair().unwrap();
        let mut session = Session::new(&device, backend_end).unwrap();
        session.set_deadlines(SHORT);
        get_features(&mut session, &frontend);
        let front = Frontend::new();
        let mut tx = front.start_tx0(&mut session.conn.lock().unwrap());
        assert_eq!(tx.send(1), (1, 0));
        // A header announcing 8 bytes, and 3 of them.
        let m = vhost_wire::encode(FrontendReq::SET_FEATURES, VERSION_1, &[0; 8]);
        frontend.write_all(&m[..HDR_LEN + 3]).unwrap();
        let start = Instant::now();
        assert!(!session.serve_one(), "a stalled request was served");
        let took = start.elapsed();
        assert!(
            took >= SHORT.message && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert!(session.spoke, "it had spoken before");
        frontend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        match frontend.read(&mut [0u8; 1]) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("the connection is still open: {other:?}"),
        }
        assert_eq!(device.worker(tx0).stop(tx0), Ok(None), "tx0 still runs");
        drop(session);
        let (frontend, backend_end) = UnixStream::pair().unwrap();
        let mut next = Session::new(&device, backend_end).unwrap();
        get_features(&mut next, &frontend);
    }

    #[test]
    fn a_frontend_that_spoke_keeps_its_connection_through_any_silence() {
        let device = null_device();
        let (frontend, backend_end) = UnixStream::pair().unwrap();
        frontend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut session = Session::new(&device, backend_end).unwrap();
        session.set_deadlines(SHORT);
        get_features(&mut session, &frontend);
        // Quiet for longer than both deadlines, then the next request, which is served.
        let quiet = SHORT.first_request + SHORT.message * 2;
        let f = frontend.try_clone().unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(quiet);
            let m = vhost_wire::encode(FrontendReq::GET_FEATURES, VERSION_1, &[]);
            (&f).write_all(&m).unwrap();
        });
        assert!(session.serve_one(), "closed after a silence");
        writer.join().unwrap();
        reply_u64(&frontend, FrontendReq::GET_FEATURES);
    }

    #[test]
    fn a_frontend_that_never_spoke_is_dropped_at_the_first_request_deadline() {
        let device = null_device();
        let (_frontend, backend_end) = UnixStream::pair().unwrap();
        let mut session = Session::new(&device, backend_end).unwrap();
        session.set_deadlines(SHORT);
        let start = Instant::now();
        assert!(!session.serve_one());
        let took = start.elapsed();
        assert!(
            took >= SHORT.first_request && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert!(!session.spoke);
    }

    #[test]
    fn a_frontend_sending_garbage_is_closed_and_the_device_serves_the_next() {
        let device = null_device();
        let features = device.offered_features().0
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
            | vhost::LOG_ALL.0;
        let tx0 = QueueId::Tx(0);

        let (mut frontend, backend_end) = UnixStream::pair().unwrap();
        frontend
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut session = Session::new(&device, backend_end).unwrap();
        assert_eq!(get_features(&mut session, &frontend), features);
        // A queue running for this connection (set up on its protocol state directly).
        let front = Frontend::new();
        let mut tx = front.start_tx0(&mut session.conn.lock().unwrap());
        assert_eq!(tx.send(1), (1, 0));

        // A header no frontend sends: an unknown code, reserved flags, a body too large.
        frontend.write_all(&[0xff; HDR_LEN]).unwrap();
        assert!(!session.serve_one(), "garbage left the connection open");
        assert!(!session.serve_one(), "a closed session served again");
        // The frontend sees its connection closed, and the queue was stopped with it.
        let mut byte = [0u8; 1];
        match frontend.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            other => panic!("the connection is still open: {other:?}"),
        }
        assert_eq!(device.worker(tx0).stop(tx0), Ok(None), "tx0 still runs");
        drop(session);

        // The next frontend is served: its requests answered, its queue run.
        let (frontend, backend_end) = UnixStream::pair().unwrap();
        let mut next = Session::new(&device, backend_end).unwrap();
        assert_eq!(get_features(&mut next, &frontend), features);
        let front = Frontend::new();
        let mut tx = front.start_tx0(&mut next.conn.lock().unwrap());
        assert_eq!(tx.send(2), (2, 0));
        assert_eq!(device.counters(tx0.index(1)).packets.get(), 2);
    }
}
