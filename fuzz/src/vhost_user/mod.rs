//! The `vhost_user` target: the backend's vhost-user protocol handler (rust-vmm `vhost`'s
//! message layer dispatching to `virtnet_backend::vhost::Connection`) and its workers facing a
//! hostile frontend, through a real unix socket pair and the same per-request loop as the
//! backend's accept loop (`virtnet_backend::fuzzing::serve_one`).
//!
//! The input picks the host port (echo, or null with a frame size) and is a list of steps. A
//! step is a message: a request code (one of those the spec defines, most of the time), header
//! flags, a body built field by field (memory tables, ring addresses, ring states, config
//! ranges) or raw, a header size that usually matches the body and sometimes does not, and the
//! file descriptors a real frontend attaches (memfds for memory tables, eventfds for
//! kick/call/err, a socket for the backend channel) or others. Each message goes out in one
//! `sendmsg`, then the backend handles one request. Or a step is the guest's traffic on the
//! rings the frontend set up ([`guest`]): tx chains with any header and segmenting, rx chains of
//! any sizes and counts, kicks, and waits for the workers. A message may also go in two
//! writes (its descriptors with either), or be cut short and the frontend stall: only part of
//! it sent, or nothing at all as the first request (the session's gate drops the connection
//! at its deadline, shortened to milliseconds here: [`GATE`]). An optional tail of raw bytes
//! ends the stream (a truncated or garbage message before the frontend hangs up). The harness
//! checks:
//!
//! - nothing panics, in the protocol thread or a worker, and nothing hangs (libFuzzer's
//!   `-timeout`);
//! - every reply the backend sends is a well-formed reply to the request just sent, at most
//!   one per request;
//! - a stalled request gets no reply, and the connection closes within [`STALL_LIMIT`] (the
//!   gate's deadlines, not the layer's reads, end it);
//! - the device state stays in bounds (active pairs in 1..=pairs);
//! - every tx header the guest posts gets the TAP port's verdict from `check_tx` that the
//!   spec's rules give it ([`tx_header`]);
//! - if the connection is still open after the steps, it answers a fresh GET_FEATURES with the
//!   device's features; once it closes, the frontend sees the socket closed;
//! - then, liveness ([`live`]): a well-behaved frontend connects to the same device, sets up
//!   every pair and must see a frame move both ways on each within a second.
//!
//! [`protocol`] holds the vhost-user numbers the harness writes and checks, [`input`] the input
//! types and the bytes each message becomes, [`traffic`] the guest's; this file sends them
//! and checks what comes back.

mod guest;
mod input;
mod live;
mod protocol;
mod traffic;
pub(crate) mod tx_header;

pub use guest::{Patience, FUZZING, SEEDS};
pub use input::{
    Body, Fds, Flags, Message, Port, Region, Request, Size, Step, UserAddr, VhostInput,
    MAX_NULL_FRAME, MEMFD_PAGES,
};
pub use live::DEADLINE;
pub use protocol::{
    code, protocol_feature, HEADER_LEN, MAX_BODY, NEED_REPLY, NOFD, PROTOCOL_FEATURES_BIT, REPLY,
    VERSION_1,
};
pub use traffic::{Frame, GuestOp, Hdr, Segment};

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_backend::gate::Deadlines;
use virtnet_backend::{fuzzing, BackendConfig, Device, Session};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vring::{GuestAddress, GuestMemory};

use input::{wire, PAGE};

/// The session's deadlines here: a stalled message costs an input a few milliseconds, not
/// seconds. Whole messages never wait for them (they are sent before the backend looks), so
/// the outcome of an input does not depend on them.
pub const GATE: Deadlines = Deadlines {
    first_request: Duration::from_millis(5),
    message: Duration::from_millis(1),
};

/// How long the backend may take to drop a stalled connection: its deadlines, and room for
/// a loaded machine.
pub const STALL_LIMIT: Duration = Duration::from_secs(1);

/// What a run did, for the seed tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Messages the backend handled before the connection closed (all of them if it did not).
    pub handled: usize,
    pub closed: bool,
    /// Replies received, by request code.
    pub replies: Vec<u32>,
    /// Chains the guest's drivers took, and used entries they got back.
    pub posted: usize,
    pub used: usize,
    /// Virtqueues broken after the steps.
    pub broken: Vec<usize>,
}

/// Whatever is attached to one message. The backend has its own copies once it is sent; the
/// guest keeps the memfds of a memory table and a kick eventfd, the rest is dropped.
#[derive(Debug)]
enum Attached {
    Memfd(GuestMemory),
    Eventfd(EventFd),
    Socket(UnixStream),
}

impl Attached {
    fn memfd() -> Attached {
        let size = MEMFD_PAGES as usize * PAGE as usize;
        Attached::Memfd(GuestMemory::memfd(&[(GuestAddress(0), size)]).expect("memfd"))
    }
    fn raw_fd(&self) -> RawFd {
        match self {
            Attached::Memfd(m) => m.regions().next().unwrap().file.unwrap().as_raw_fd(),
            Attached::Eventfd(e) => e.as_raw_fd(),
            Attached::Socket(s) => s.as_raw_fd(),
        }
    }
}

fn attachments(m: &Message) -> Vec<Attached> {
    let eventfd = || Attached::Eventfd(EventFd::new(0).expect("eventfd"));
    match m.fds {
        Fds::None => Vec::new(),
        Fds::Eventfd => vec![eventfd()],
        Fds::Memfds(n) => (0..n % 4).map(|_| Attached::memfd()).collect(),
        Fds::Many(n) => {
            let e = EventFd::new(0).expect("eventfd");
            let copy = || Attached::Eventfd(e.try_clone().expect("dup"));
            (0..n % 64).map(|_| copy()).collect()
        }
        Fds::Auto => match (m.request.code(), &m.body) {
            (code::SET_MEM_TABLE, Body::MemTable(r)) => {
                r.iter().take(8).map(|_| Attached::memfd()).collect()
            }
            (code::SET_VRING_KICK | code::SET_VRING_CALL | code::SET_VRING_ERR, b) => match b {
                Body::U64(v) if v & NOFD != 0 => Vec::new(),
                _ => vec![eventfd()],
            },
            (
                code::SET_LOG_BASE
                | code::SET_LOG_FD
                | code::SET_INFLIGHT_FD
                | code::ADD_MEM_REG
                | code::SET_DEVICE_STATE_FD,
                _,
            ) => vec![Attached::memfd()],
            (code::SET_BACKEND_REQ_FD, _) => {
                vec![Attached::Socket(UnixStream::pair().expect("socketpair").0)]
            }
            _ => Vec::new(),
        },
    }
}

/// A connection of the backend: the frontend's socket end and the backend's session.
struct Conn {
    frontend: UnixStream,
    session: Session,
}

impl Conn {
    fn open(device: &Arc<Device>) -> Conn {
        let (frontend, backend_end) = UnixStream::pair().expect("socketpair");
        frontend.set_nonblocking(true).unwrap();
        let mut session = fuzzing::open_session(device, backend_end).expect("session");
        fuzzing::set_deadlines(&mut session, GATE);
        Conn { frontend, session }
    }

    /// One request, as `serve_connection` handles it; false: the connection closed.
    fn serve(&mut self) -> bool {
        fuzzing::serve_one(&mut self.session)
    }

    /// What `serve_connection` does when its loop ends.
    fn close(&mut self) {
        fuzzing::close_session(&mut self.session);
    }

    /// Everything the backend sent so far; `true` when it has closed its end, too.
    fn received(&mut self) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.frontend.read(&mut buf) {
                // A close with our bytes still unread reaches us as a reset.
                Ok(0) => return (got, true),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
                Ok(n) => got.extend(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return (got, false),
                Err(e) => panic!("reading replies: {e}"),
            }
        }
    }
}

/// Splits what the backend sent after request `code` into replies, checking each.
fn check_replies(bytes: &[u8], code: u32, replies: &mut Vec<u32>) {
    let mut rest = bytes;
    let mut n = 0;
    while !rest.is_empty() {
        assert!(
            rest.len() >= HEADER_LEN,
            "truncated reply header: {rest:02x?}"
        );
        let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().unwrap());
        let (req, flags, size) = (word(0), word(4), word(8) as usize);
        assert_eq!(req, code, "a reply to another request");
        assert_eq!(flags, VERSION_1 | REPLY, "reply flags");
        assert!(size <= MAX_BODY, "reply body of {size} bytes");
        assert!(rest.len() >= HEADER_LEN + size, "truncated reply body");
        rest = &rest[HEADER_LEN + size..];
        replies.push(req);
        n += 1;
    }
    assert!(n <= 1, "{n} replies to one request {code}");
}

/// Sends `bytes` with `fds` in one write, or with `split` = (at, fds_later) in two: the first
/// of `1 + at % (len - 1)` bytes, the descriptors with the first or the second.
fn send(frontend: &UnixStream, bytes: &[u8], fds: &[RawFd], split: Option<(u16, bool)>) {
    // The socket buffer holds far more than one message and its reply.
    let put = |b: &[u8], fds: &[RawFd]| {
        let sent = frontend.send_with_fds(&[b], fds).expect("send");
        assert_eq!(sent, b.len());
    };
    match split {
        Some((at, fds_later)) if bytes.len() > 1 => {
            let (first, second) = bytes.split_at(1 + at as usize % (bytes.len() - 1));
            let (f1, f2) = if fds_later {
                (&[][..], fds)
            } else {
                (fds, &[][..])
            };
            put(first, f1);
            put(second, f2);
        }
        _ => put(bytes, fds),
    }
}

/// Sends the first `cut % len` bytes of `m` (at least one once the connection has `spoken`)
/// with its descriptors, and nothing more: the backend must drop the connection within
/// [`STALL_LIMIT`], without a reply.
fn stall(c: &mut Conn, m: &Message, cut: u16, spoken: bool) {
    let bytes = wire(m);
    let mut n = cut as usize % bytes.len();
    if spoken {
        n = n.max(1);
    }
    let attached = attachments(m);
    if n > 0 {
        let fds: Vec<RawFd> = attached.iter().map(Attached::raw_fd).collect();
        send(&c.frontend, &bytes[..n], &fds, None);
    }
    drop(attached);
    let start = Instant::now();
    assert!(
        !c.serve(),
        "a request cut after {n} of its {} bytes was served",
        bytes.len()
    );
    let took = start.elapsed();
    assert!(
        took < STALL_LIMIT,
        "a stalled connection dropped after {took:?}"
    );
    let (got, eof) = c.received();
    assert!(
        got.is_empty(),
        "a reply to a request never whole: {got:02x?}"
    );
    assert!(
        eof || c.received().1,
        "the backend closed without closing its end"
    );
}

/// GET_FEATURES on an open connection must answer the device's features.
fn assert_answers_get_features(c: &mut Conn, device: &Device) {
    let m = Message {
        request: Request::of(code::GET_FEATURES),
        flags: Flags::Plain,
        body: Body::Empty,
        size: Size::Body,
        fds: Fds::None,
    };
    c.frontend.write_all(&wire(&m)).unwrap();
    assert!(c.serve(), "GET_FEATURES closed the connection");
    let (got, _) = c.received();
    // What the backend offers: the device's features, the protocol-features bit and live
    // migration's LOG_ALL (both vhost-user's, not the device's).
    let want =
        device.offered_features().0 | PROTOCOL_FEATURES_BIT | virtnet_backend::vhost::LOG_ALL.0;
    let mut reply = Vec::new();
    reply.extend(code::GET_FEATURES.to_le_bytes());
    reply.extend((VERSION_1 | REPLY).to_le_bytes());
    reply.extend(8u32.to_le_bytes());
    reply.extend(want.to_le_bytes());
    assert_eq!(got, reply, "GET_FEATURES reply");
}

fn check_bounds(device: &Device) {
    let r = device.device_report();
    assert!(
        (1..=r.pairs).contains(&r.active_pairs),
        "{} active pairs of {}",
        r.active_pairs,
        r.pairs
    );
}

/// The `vhost_user` fuzz target's body.
pub fn run(input: &VhostInput) -> Outcome {
    run_with(input, FUZZING)
}

/// The target's body, waiting for the workers as `patience` says.
pub fn run_with(input: &VhostInput, patience: Patience) -> Outcome {
    let device = Device::new(BackendConfig {
        pairs: 1 + (input.pairs % 2) as u16,
        io: input.port.io_mode(),
        // The workers run in libFuzzer's process: a crash there is reported from the crashing
        // thread by the sanitizers and libFuzzer (which open files and start a symbolizer),
        // and the filter would turn the report into SIGSYS. The filter has tests of its own.
        seccomp: false,
        ..BackendConfig::default()
    })
    .expect("device");
    let mut out = Outcome::default();
    let mut guest = guest::Guest::new(&device, input.port, patience);
    let mut c = Conn::open(&device);
    for step in &input.steps {
        let (m, split) = match step {
            Step::Message(m) => (m, None),
            Step::Split {
                message,
                at,
                fds_later,
            } => (message, Some((*at, *fds_later))),
            Step::Guest(op) => {
                guest.apply(&device, op);
                continue;
            }
            Step::Stall { message, cut } => {
                stall(&mut c, message, *cut, out.handled > 0);
                out.closed = true;
                break;
            }
        };
        let bytes = wire(m);
        let attached = attachments(m);
        let fds: Vec<RawFd> = attached.iter().map(Attached::raw_fd).collect();
        send(&c.frontend, &bytes, &fds, split);
        guest.sent(m, attached);
        let open = c.serve();
        let (got, eof) = c.received();
        check_replies(&got, m.request.code(), &mut out.replies);
        check_bounds(&device);
        if !open {
            out.closed = true;
            assert!(
                eof || c.received().1,
                "the backend closed without closing its end"
            );
            break;
        }
        out.handled += 1;
    }
    (out.posted, out.used) = (guest.posted, guest.used);
    out.broken = (0..device.num_queues())
        .filter(|&q| device.counters(q).is_broken())
        .collect();
    if !out.closed {
        match &input.tail {
            None => assert_answers_get_features(&mut c, &device),
            Some(tail) => {
                c.frontend.set_nonblocking(false).unwrap();
                c.frontend.write_all(tail).unwrap();
                c.frontend.shutdown(Shutdown::Write).unwrap();
                c.frontend.set_nonblocking(true).unwrap();
                // Each request consumes bytes; at the end of the stream it closes.
                while c.serve() {}
                out.closed = true;
            }
        }
    }
    c.close();
    drop(guest);
    check_bounds(&device);
    // The next frontend finds the device serving, and moving frames.
    live::assert_live(&device, input.port);
    check_bounds(&device);
    out
}
