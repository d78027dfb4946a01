//! Frontends that would hold the session without finishing a message: one byte of a first
//! request, a header with 40 descriptors, a header then silence, a body cut short, urgent
//! data inside a header, and a frontend that sends requests and never reads the replies. Each
//! is dropped by the session's gate, and a fresh frontend connecting right after it (the bad
//! one still connected) is answered within the message deadline plus a second; each case
//! ends with [`recovery::assert_recovered`].
//!
//! Before the gate, every one of them kept the next frontend waiting for as long as it
//! stayed: rust-vmm's message layer retried its reads and sends for good.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use testkit::inproc::{echo_backend, Backend};
use testkit::recovery::{self, Baseline};
use virtnet_backend::session::MESSAGE_DEADLINE;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;

/// One request: three native-endian u32 (code, flags: version 1, payload size), the payload.
fn request(code: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    for w in [code, 1, payload.len() as u32] {
        m.extend_from_slice(&w.to_ne_bytes());
    }
    m.extend_from_slice(payload);
    m
}

/// How long a fresh frontend may wait after a bad one connected.
fn fresh_within() -> Duration {
    MESSAGE_DEADLINE + Duration::from_secs(1)
}

/// A new frontend sends GET_FEATURES to `b` and must have its reply within `within` of
/// `since`.
fn assert_fresh_answered(b: &Backend, since: Instant, within: Duration) {
    let mut s = UnixStream::connect(&b.socket).unwrap();
    s.set_read_timeout(Some(within + Duration::from_secs(5)))
        .unwrap();
    s.write_all(&request(GET_FEATURES, &[])).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).expect("the GET_FEATURES reply");
    assert_eq!(
        reply[..4],
        GET_FEATURES.to_ne_bytes(),
        "a reply to GET_FEATURES"
    );
    let took = since.elapsed();
    assert!(
        took <= within,
        "a fresh frontend was answered after {took:?}"
    );
}

/// `bad`'s connection was closed by the backend: after whatever replies it holds, the end.
fn assert_closed(mut bad: UnixStream) {
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match bad.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return,
            Err(e) => panic!("the bad frontend's connection is still open: {e}"),
        }
    }
}

/// Runs `bad` (which connects and misbehaves, returning its connection, left open) against a
/// fresh echo backend, then the fresh frontend, then the checks.
fn case(tag: &str, bad: impl FnOnce(&Backend) -> UnixStream) {
    let exclusive = recovery::exclusive();
    let b = echo_backend(tag);
    let base = Baseline::take(&exclusive, &b);
    let start = Instant::now();
    let s = bad(&b);
    assert_fresh_answered(&b, start, fresh_within());
    assert_closed(s);
    recovery::assert_recovered(&b, &base);
}

/// A connection to `b` on which GET_FEATURES has been answered: a frontend that spoke.
fn spoken(b: &Backend) -> UnixStream {
    let mut s = UnixStream::connect(&b.socket).unwrap();
    s.write_all(&request(GET_FEATURES, &[])).unwrap();
    s.read_exact(&mut [0u8; 20]).unwrap();
    s
}

#[test]
fn a_one_byte_first_request_is_dropped_and_the_next_frontend_answered() {
    case("onebyte", |b| {
        let mut s = UnixStream::connect(&b.socket).unwrap();
        s.write_all(&request(GET_FEATURES, &[])[..1]).unwrap();
        s
    });
}

#[test]
fn a_header_with_40_descriptors_is_dropped_and_the_next_frontend_answered() {
    case("fortyfds", |b| {
        let s = UnixStream::connect(&b.socket).unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        let m = request(GET_FEATURES, &[]);
        s.send_with_fds(&[&m[..]], &[x.as_raw_fd(); 40]).unwrap();
        s
    });
}

#[test]
fn a_header_then_silence_is_dropped_and_the_next_frontend_answered() {
    case("silentbody", |b| {
        let mut s = spoken(b);
        s.write_all(&request(SET_FEATURES, &[0; 8])[..12]).unwrap();
        s
    });
}

#[test]
fn a_body_cut_short_is_dropped_and_the_next_frontend_answered() {
    case("cutbody", |b| {
        let mut s = spoken(b);
        s.write_all(&request(SET_FEATURES, &[0; 8])[..16]).unwrap();
        s
    });
}

#[test]
fn urgent_data_inside_a_header_is_dropped_and_the_next_frontend_answered() {
    let (probe, _peer) = UnixStream::pair().unwrap();
    if send_urgent(&probe).is_err() {
        // A kernel without AF_UNIX MSG_OOB (before 5.15, or CONFIG_AF_UNIX_OOB off).
        return;
    }
    case("urgent", |b| {
        let mut s = spoken(b);
        // Eleven bytes of a header and its last byte out of band: a read stops at the mark,
        // and the next one would skip it and wait for a byte that never comes.
        s.write_all(&request(GET_FEATURES, &[])[..11]).unwrap();
        send_urgent(&s).unwrap();
        s
    });
}

/// Sends one byte out of band (MSG_OOB).
fn send_urgent(s: &UnixStream) -> std::io::Result<()> {
    let byte = [0u8];
    // SAFETY: `byte` is valid for reads of one byte for the duration of the call.
    let r = unsafe { libc::send(s.as_raw_fd(), byte.as_ptr().cast(), 1, libc::MSG_OOB) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn a_frontend_that_never_reads_its_replies_is_dropped_and_the_next_frontend_answered() {
    case("noreader", |b| {
        let mut s = UnixStream::connect(&b.socket).unwrap();
        // 4096 requests in one write (48 KiB): their replies would fill the socket's send
        // buffer four times over, and the backend's send would then block.
        let many: Vec<u8> = (0..4096).flat_map(|_| request(GET_FEATURES, &[])).collect();
        s.write_all(&many).unwrap();
        s
    });
}
