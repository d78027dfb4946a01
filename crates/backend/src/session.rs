//! Serving frontends: one connection at a time, each request through rust-vmm's message
//! layer into our protocol state ([`vhost::Connection`]), except the status requests that
//! layer does not dispatch ([`status`]).

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use ::vhost::vhost_user::message::VhostUserProtocolFeatures;
use ::vhost::vhost_user::{BackendReqHandler, Error as VuError};

use super::device::Device;
use super::{rarp, status, vhost};

/// The vhost-user message layer of one connection, dispatching to its [`vhost::Connection`].
pub type RequestHandler = BackendReqHandler<Mutex<vhost::Connection>>;

/// Serves one frontend connection until it goes away or breaks the protocol, then stops its
/// queues. Never panics on frontend input.
pub fn serve_connection(device: &Arc<Device>, stream: UnixStream) {
    match Session::new(device, stream) {
        Ok(mut s) => while s.serve_one() {},
        Err(e) => tracing::warn!(error = %e, "cannot serve the frontend"),
    }
}

/// One frontend connection being served: rust-vmm's request handler over our protocol state,
/// plus the status requests the handler does not dispatch ([`status`]).
pub struct Session {
    handler: Option<RequestHandler>,
    conn: Arc<Mutex<vhost::Connection>>,
    /// The same socket, to peek at each request and answer the status requests.
    stream: UnixStream,
    status: status::Status,
    device: Arc<Device>,
    /// Until the first request is handled, reads time out ([`FIRST_REQUEST_TIMEOUT`]).
    awaiting_first: bool,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("open", &self.handler.is_some())
            .field("status", &self.status)
            .finish()
    }
}

impl Session {
    /// A fresh connection: the device is reset to its defaults.
    pub(crate) fn new(device: &Arc<Device>, stream: UnixStream) -> io::Result<Session> {
        device.reset();
        // The socket's timeout is the connection's, whichever clone sets it.
        stream.set_read_timeout(Some(FIRST_REQUEST_TIMEOUT))?;
        let conn = Arc::new(Mutex::new(vhost::Connection::new(device.clone())));
        Ok(Session {
            stream: stream.try_clone()?,
            handler: Some(RequestHandler::from_stream(stream, conn.clone())),
            conn,
            status: status::Status::default(),
            device: device.clone(),
            awaiting_first: true,
        })
    }

    /// Handles one request; returns false once the connection has closed (its queues are
    /// stopped then). The vhost-user fuzz target steps through the same loop, message by
    /// message (`fuzzing::serve_one`).
    pub(crate) fn serve_one(&mut self) -> bool {
        let Some(handler) = self.handler.as_mut() else {
            return false;
        };
        let (negotiated, reply_ack, rarp) = match self.conn.lock() {
            Ok(c) => {
                let p = c.acked_protocol();
                let status = p.contains(VhostUserProtocolFeatures::STATUS);
                let rarp = p.contains(VhostUserProtocolFeatures::RARP);
                (
                    status,
                    p.contains(VhostUserProtocolFeatures::REPLY_ACK),
                    rarp,
                )
            }
            Err(_) => (false, false, false),
        };
        // Read when GET_STATUS arrives, not before waiting for it.
        let conn = &self.conn;
        let needs_reset = || conn.lock().map(|c| c.needs_reset()).unwrap_or(true);
        let open = match self
            .status
            .handle_next(&self.stream, negotiated, reply_ack, needs_reset)
        {
            Ok(status::Handled::Yes) => {
                let shared = self.device.shared();
                shared.status.store(self.status.status, Relaxed);
                shared.status_sets.store(self.status.sets, Relaxed);
                true
            }
            Ok(status::Handled::No) => {
                match rarp::handle_next(&self.stream, rarp, reply_ack, &self.device) {
                    Ok(status::Handled::No) => serve_request(handler, &self.conn),
                    Ok(status::Handled::Yes) => true,
                    Ok(status::Handled::Close(why)) => {
                        tracing::warn!(why, "closing the connection");
                        false
                    }
                    Err(e) => {
                        tracing::info!(error = %e, "frontend disconnected");
                        false
                    }
                }
            }
            Ok(status::Handled::Close(why)) => {
                tracing::warn!(why, "closing the connection");
                false
            }
            Err(e) => {
                tracing::info!(error = %e, "frontend disconnected");
                false
            }
        };
        if !open {
            self.close();
        } else if std::mem::take(&mut self.awaiting_first) {
            // A frontend may go quiet for as long as it likes once it has spoken (QEMU waits
            // for its guest's driver before it sets up any queue).
            if let Err(e) = self.stream.set_read_timeout(None) {
                tracing::warn!(error = %e, "cannot clear the socket's read timeout");
            }
        }
        open
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
        }
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
            let must_close = conn.lock().map(|c| c.must_disconnect).unwrap_or(true);
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
pub(crate) const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// How long a new frontend has to send its first request: one that connects and says nothing
/// must not keep the next one waiting (frontends are served one at a time).
pub const FIRST_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::time::Duration;

    use ::vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserVirtioFeatures};
    use vnet::vhost_wire::{self, HDR_LEN, VERSION_1};

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
