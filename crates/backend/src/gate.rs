//! The gate in front of the vhost-user message layer: a request is read only once it is whole
//! on the socket, with no more descriptors than the layer takes, and once the socket can take
//! its reply; a frontend that keeps either from happening within a deadline is dropped.
//!
//! Why: rust-vmm `vhost` 0.18 reads a request with blocking reads and retries every read or
//! send that fails with `SocketRetry`. That is EAGAIN (a socket timeout), and ENOBUFS, which
//! vmm-sys-util returns when a message brought more descriptors than the layer's 32 slots
//! (after consuming its bytes). So one byte of a header, a header then silence, or a header
//! with 40 descriptors kept the layer reading for as long as the peer stayed, and a frontend
//! that never read its replies kept it sending. Frontends are served one at a time, so the
//! next one waited as long.
//!
//! The gate parses nothing but the header's size field: rust-vmm still reads, checks and
//! dispatches every message (and [`super::intercept`] the few it does not dispatch). It only
//! decides when they may read:
//!
//! - **the first byte** of a request may take as long as the frontend likes (QEMU goes quiet
//!   while its guest boots), except a connection's first request, which must be whole within
//!   [`FIRST_REQUEST_TIMEOUT`] of the connect;
//! - **the whole message** (the 12-byte header and the size it announces, at most the layer's
//!   `MAX_MSG_SIZE`, 4 KiB) must be queued within [`MESSAGE_DEADLINE`] of its first byte.
//!   The header must come whole in the first read the layer makes: its descriptors (at most
//!   32, `MAX_ATTACHED_FD_ENTRIES`) with it, no out-of-band byte before its end. Each is
//!   checked with a peek ([`virtnet_sys::socket`]) whose descriptors are closed at once;
//! - **the reply**: the socket must be writable (a unix stream's POLLOUT: at most a quarter of
//!   its send buffer is taken, so one reply is sent at once) within [`MESSAGE_DEADLINE`].
//!
//! A frontend that sends each message in one `sendmsg`, as QEMU, DPDK and ours do, never
//! waits here: its messages are whole when their first byte is. A message that arrives in
//! pieces is looked at again after a pause that doubles from 1 ms up to 16 ms.

use std::io;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{MAX_ATTACHED_FD_ENTRIES, MAX_MSG_SIZE};
use virtnet_sys::socket::{self, Readiness, Wait};
use vnet::vhost_wire::{self, HDR_LEN};

/// How long a new frontend has to send its first request, whole: one that connects and says
/// nothing, or starts and never finishes, must not keep the next one waiting.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request may take from its first byte to its last, and how long the socket may
/// refuse to take a reply. A frontend writes a message of at most 4 KiB in one go: a second
/// is a thousand times what one takes on a loaded host, and short enough that a frontend
/// dropped for missing it costs the next one little.
pub const MESSAGE_DEADLINE: Duration = Duration::from_secs(1);

/// The first and the longest pause between two looks at a message that is not whole yet.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const MAX_PAUSE: Duration = Duration::from_millis(16);

/// The deadlines of one connection ([`FIRST_REQUEST_TIMEOUT`] and [`MESSAGE_DEADLINE`] by
/// default; the fuzz target shortens them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// From the connect until the first request is whole on the socket.
    pub first_request: Duration,
    /// From a request's first byte until it is whole; and for the socket to take a reply.
    pub message: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines {
            first_request: FIRST_REQUEST_TIMEOUT,
            message: MESSAGE_DEADLINE,
        }
    }
}

/// Why the gate refused a connection: what its frontend did (or failed to do).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// Its first request did not arrive whole within the first request's deadline.
    #[error("frontend: no whole request within {0:?} of connecting")]
    Silent(Duration),
    /// A request's bytes stopped coming before the message was whole.
    #[error("frontend: a request not whole within {0:?} of its first byte")]
    Incomplete(Duration),
    /// More descriptors than the message layer takes.
    #[error("frontend: more than {MAX_ATTACHED_FD_ENTRIES} descriptors attached to a request")]
    TooManyFds,
    /// A header whose first read stops short: descriptors attached to a piece of it, or an
    /// out-of-band byte inside it.
    #[error("frontend: a request header cut by attached descriptors")]
    CutHeader,
    /// A header announcing more than the message layer reads.
    #[error("frontend: a request of {0} bytes announced, more than {MAX_MSG_SIZE}")]
    Oversized(u32),
    /// Out-of-band data (MSG_OOB), which vhost-user never sends and at which reads stop.
    #[error("frontend: out-of-band data on the socket")]
    Urgent,
    /// The socket took no reply within the message deadline: the frontend does not read.
    #[error("frontend: replies not read for {0:?}")]
    NotReading(Duration),
    /// Looking at the socket failed.
    #[error("host: looking at the frontend's socket: {0}")]
    Socket(#[from] io::Error),
}

/// Waits until the next request on `stream` may go to the message layer: it is whole on the
/// socket (or the peer has closed its end, so reads stop at once at the end of what it sent)
/// and the socket can take a reply. `first_by` is the first request's deadline (from the
/// connect); None for later requests, which may come after any silence. On a refusal the
/// connection must close.
pub fn await_request(
    stream: &UnixStream,
    deadlines: Deadlines,
    first_by: Option<Instant>,
) -> Result<(), Refused> {
    // Idle until the first byte.
    loop {
        let left = first_by.map(|t| t.saturating_duration_since(Instant::now()));
        if wait(stream, Wait::Readable, left)? != Readiness::default() {
            break;
        }
        if left.is_some_and(|l| l.is_zero()) {
            return Err(Refused::Silent(deadlines.first_request));
        }
    }
    let by = Instant::now() + deadlines.message;
    match first_by {
        Some(first) if first < by => {
            whole(stream, first, Refused::Silent(deadlines.first_request))?
        }
        _ => whole(stream, by, Refused::Incomplete(deadlines.message))?,
    }
    writable(stream, deadlines.message)
}

fn wait(stream: &UnixStream, what: Wait, timeout: Option<Duration>) -> io::Result<Readiness> {
    socket::wait_socket(stream, what, timeout)
}

/// Waits until the message whose first byte is on `stream` is whole, until `by`; `late` if
/// it is not by then.
fn whole(stream: &UnixStream, by: Instant, late: Refused) -> Result<(), Refused> {
    let mut len = None;
    let mut pause = FIRST_PAUSE;
    loop {
        let now = wait(stream, Wait::Readable, Some(Duration::ZERO))?;
        if now.urgent {
            return Err(Refused::Urgent);
        }
        if now.closed {
            // Nothing more can come: the layer reads what there is, and finds the end.
            return Ok(());
        }
        let queued = socket::queued_bytes(stream)?;
        if len.is_none() && queued >= HDR_LEN {
            len = Some(message_len(stream)?);
        }
        if len.is_some_and(|len| queued >= len) {
            return Ok(());
        }
        let left = by.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(late);
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// The length of the message whose header is queued on `stream`, header included; checks
/// that the layer's first read gets the whole header and every descriptor attached.
fn message_len(stream: &UnixStream) -> Result<usize, Refused> {
    let mut hdr = [0u8; HDR_LEN];
    // As many descriptor slots as the layer's reads have (vhost's `recv_into_iovec`).
    let peeked = socket::peek_with_fds(stream, &mut hdr, MAX_ATTACHED_FD_ENTRIES)?;
    if peeked.fds_truncated {
        return Err(Refused::TooManyFds);
    }
    if peeked.bytes < HDR_LEN {
        // The header's bytes are queued, but a read stops before its end.
        return Err(Refused::CutHeader);
    }
    let (_, _, size) = vhost_wire::decode_header(&hdr);
    if size as usize > MAX_MSG_SIZE {
        return Err(Refused::Oversized(size));
    }
    Ok(HDR_LEN + size as usize)
}

/// Waits up to `within` for the socket to take a reply.
fn writable(stream: &UnixStream, within: Duration) -> Result<(), Refused> {
    let until = Instant::now() + within;
    loop {
        let r = wait(
            stream,
            Wait::Writable,
            Some(until.saturating_duration_since(Instant::now())),
        )?;
        // A socket in error or hung up takes no reply either, but fails it at once.
        if r.writable || r.closed {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(Refused::NotReading(within));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsRawFd;

    use vhost::vhost_user::message::FrontendReq;
    use vmm_sys_util::sock_ctrl_msg::ScmSocket;
    use vnet::vhost_wire::VERSION_1;

    use super::*;

    const SHORT: Deadlines = Deadlines {
        first_request: Duration::from_millis(300),
        message: Duration::from_millis(60),
    };

    /// A later request (no first request's deadline) on a fresh pair; how long the gate took.
    fn later(
        frontend: impl FnOnce(&UnixStream),
        deadlines: Deadlines,
    ) -> (Result<(), Refused>, Duration) {
        gate(frontend, deadlines, false)
    }

    fn gate(
        frontend: impl FnOnce(&UnixStream),
        deadlines: Deadlines,
        first: bool,
    ) -> (Result<(), Refused>, Duration) {
        let (f, b) = UnixStream::pair().unwrap();
        let start = Instant::now();
        frontend(&f);
        let first_by = first.then(|| start + deadlines.first_request);
        let r = await_request(&b, deadlines, first_by);
        (r, start.elapsed())
    }

    fn set_features() -> Vec<u8> {
        vhost_wire::encode(FrontendReq::SET_FEATURES, VERSION_1, &[0; 8])
    }

    /// At least `deadline`, and not much more (a bound on the time, generous for a loaded
    /// machine: a gate that waits for good fails it).
    fn took(t: Duration, deadline: Duration) {
        assert!(t >= deadline, "refused after {t:?}, before {deadline:?}");
        assert!(t < deadline + Duration::from_secs(1), "refused after {t:?}");
    }

    #[test]
    fn a_whole_request_passes_at_once_and_one_in_pieces_once_whole() {
        let m = set_features();
        let (r, t) = later(|f| (&*f).write_all(&m).unwrap(), SHORT);
        assert!(r.is_ok(), "{r:?}");
        assert!(t < SHORT.message, "{t:?}");
        // The header, then the body a little later: passes when the body is there.
        let (f, b) = UnixStream::pair().unwrap();
        (&f).write_all(&m[..5]).unwrap();
        let rest = m[5..].to_vec();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            (&f).write_all(&rest).unwrap();
            f
        });
        let long = Deadlines {
            message: Duration::from_secs(5),
            ..SHORT
        };
        let start = Instant::now();
        assert!(await_request(&b, long, None).is_ok());
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_later_request_may_come_after_any_silence() {
        let (f, b) = UnixStream::pair().unwrap();
        let m = set_features();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(SHORT.first_request + SHORT.message);
            (&f).write_all(&m).unwrap();
            f
        });
        assert!(await_request(&b, SHORT, None).is_ok());
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_partial_request_is_refused_at_the_message_deadline() {
        let m = set_features();
        let cuts: [(&str, &[u8]); 3] = [
            ("one byte", &m[..1]),
            ("a header then silence", &m[..HDR_LEN]),
            ("a body cut short", &m[..HDR_LEN + 4]),
        ];
        for (what, bytes) in cuts {
            let (r, t) = later(|f| (&*f).write_all(bytes).unwrap(), SHORT);
            assert!(matches!(r, Err(Refused::Incomplete(_))), "{what}: {r:?}");
            took(t, SHORT.message);
        }
    }

    #[test]
    fn a_first_request_is_due_by_the_earlier_of_its_two_deadlines() {
        // Nothing at all: the first request's deadline.
        let (r, t) = gate(|_| {}, SHORT, true);
        assert!(matches!(r, Err(Refused::Silent(_))), "{r:?}");
        took(t, SHORT.first_request);
        // One byte: the message's, which ends first.
        let (r, t) = gate(|f| (&*f).write_all(&[1]).unwrap(), SHORT, true);
        assert!(matches!(r, Err(Refused::Incomplete(_))), "{r:?}");
        took(t, SHORT.message);
        // One byte, the connection's deadline ending first.
        let late = Deadlines {
            message: Duration::from_secs(10),
            ..SHORT
        };
        let (r, t) = gate(|f| (&*f).write_all(&[1]).unwrap(), late, true);
        assert!(matches!(r, Err(Refused::Silent(_))), "{r:?}");
        took(t, SHORT.first_request);
    }

    /// Drops `x` and checks that its peer `y` sees it closed: nothing kept a copy.
    fn no_copy_kept(x: UnixStream, y: &UnixStream) {
        drop(x);
        let r = socket::wait_socket(y, Wait::Readable, Some(Duration::from_secs(5))).unwrap();
        assert!(r.closed, "a descriptor copy is still open");
    }

    #[test]
    fn a_header_with_40_descriptors_is_refused_at_once_and_none_kept() {
        let (f, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        let m = vhost_wire::encode(FrontendReq::GET_FEATURES, VERSION_1, &[]);
        f.send_with_fds(&[&m[..]], &[x.as_raw_fd(); 40]).unwrap();
        let start = Instant::now();
        let r = await_request(&b, SHORT, None);
        assert!(matches!(r, Err(Refused::TooManyFds)), "{r:?}");
        assert!(start.elapsed() < SHORT.message, "{:?}", start.elapsed());
        // The 40 in flight go with the connection; none stayed with the gate.
        drop((f, b));
        no_copy_kept(x, &y);
        // 32, the message layer's slots, pass.
        let (f, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        f.send_with_fds(&[&m[..]], &[x.as_raw_fd(); 32]).unwrap();
        assert!(await_request(&b, SHORT, None).is_ok());
        drop((f, b));
        no_copy_kept(x, &y);
    }

    #[test]
    fn a_header_cut_by_descriptors_or_announcing_too_much_is_refused_at_once() {
        let (x, _y) = UnixStream::pair().unwrap();
        let m = set_features();
        let (r, t) = later(
            |f| {
                f.send_with_fds(&[&m[..3]], &[x.as_raw_fd()]).unwrap();
                (&*f).write_all(&m[3..]).unwrap();
            },
            SHORT,
        );
        assert!(matches!(r, Err(Refused::CutHeader)), "{r:?}");
        assert!(t < SHORT.message, "{t:?}");
        let mut big = vhost_wire::encode(FrontendReq::SET_FEATURES, VERSION_1, &[]);
        big[8..12].copy_from_slice(&(MAX_MSG_SIZE as u32 + 1).to_ne_bytes());
        let (r, t) = later(|f| (&*f).write_all(&big).unwrap(), SHORT);
        assert!(matches!(r, Err(Refused::Oversized(4097))), "{r:?}");
        assert!(t < SHORT.message, "{t:?}");
    }

    #[test]
    fn a_peer_gone_before_its_request_was_whole_lets_the_reads_end_at_once() {
        let m = set_features();
        let (f, b) = UnixStream::pair().unwrap();
        (&f).write_all(&m[..7]).unwrap();
        drop(f);
        let start = Instant::now();
        assert!(await_request(&b, SHORT, None).is_ok());
        assert!(start.elapsed() < SHORT.message);
        // And so does a peer that shuts down its sending side only.
        let (f, b) = UnixStream::pair().unwrap();
        (&f).write_all(&m[..7]).unwrap();
        f.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(await_request(&b, SHORT, None).is_ok());
    }

    #[test]
    fn a_frontend_that_does_not_read_its_replies_is_refused_at_the_message_deadline() {
        let (f, b) = UnixStream::pair().unwrap();
        // Replies the frontend never read fill the socket.
        b.set_nonblocking(true).unwrap();
        while (&b).write(&[0u8; 4096]).is_ok() {}
        b.set_nonblocking(false).unwrap();
        (&f).write_all(&set_features()).unwrap();
        let start = Instant::now();
        let r = await_request(&b, SHORT, None);
        assert!(matches!(r, Err(Refused::NotReading(_))), "{r:?}");
        took(start.elapsed(), SHORT.message);
    }
}
