//! A vhost-user connection's unix stream socket, looked at without reading from it, so that
//! the backend can decide when a message layer that blocks until a message is whole may read
//! it: how many bytes wait ([`queued_bytes`], FIONREAD), the next bytes and how many
//! descriptors come with them ([`peek_with_fds`], a `recvmsg` peek whose descriptors are
//! closed at once), readiness ([`wait_socket`], poll), and a connect that does not wait for a
//! listener that never accepts ([`connect_now`]).
//!
//! How Linux reads a unix stream socket (net/unix/af_unix.c, `unix_stream_read_generic`),
//! which these functions rely on: every `sendmsg` of the peer queues one or more segments, its
//! descriptors on the first; one read copies across segments, but stops after a segment
//! that carries descriptors, and at an out-of-band mark (MSG_OOB); a peek stops at the same
//! places. A read with no room for the descriptors it meets has the kernel close them and
//! set MSG_CTRUNC.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Bytes waiting to be read on `socket` (ioctl FIONREAD: on a unix stream socket, the sum over
/// every queued segment, whatever stops a single read among them).
pub fn queued_bytes(socket: &UnixStream) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD takes a pointer to an int, which `n` is, live for the call.
    unsafe { crate::ioctl_ptr(socket.as_raw_fd(), libc::FIONREAD, &mut n) }?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// What [`peek_with_fds`] found at the head of a socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peeked {
    /// Bytes copied: at most the buffer's length, and fewer when a segment with descriptors
    /// or an out-of-band mark ends the read first.
    pub bytes: usize,
    /// Descriptors attached to the bytes peeked (all of them already closed again).
    pub fds: usize,
    /// More descriptors came than there was room for (MSG_CTRUNC).
    pub fds_truncated: bool,
}

/// Copies up to `buf.len()` bytes waiting on `socket` into `buf` without consuming them and
/// without waiting (`recvmsg` with MSG_PEEK and MSG_DONTWAIT), with room for `max_fds`
/// descriptors, and counts the descriptors attached to them: exactly what a read of as many
/// bytes with room for as many descriptors would get. A peek installs the descriptors it
/// returns in this process, as a read would; every one is closed before this returns, so
/// nothing is kept. `WouldBlock` when nothing waits; 0 bytes when the peer has closed.
pub fn peek_with_fds(socket: &UnixStream, buf: &mut [u8], max_fds: usize) -> io::Result<Peeked> {
    let fd_bytes = max_fds
        .checked_mul(std::mem::size_of::<libc::c_int>())
        .and_then(|b| libc::c_uint::try_from(b).ok())
        .filter(|&b| b <= 4096)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors"))?;
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    // u64 words: a control buffer must be aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if max_fds > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
    }
    let flags = libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    let r = loop {
        // SAFETY: `msg` points at `iov` (valid for writes of `buf.len()` bytes) and at
        // `control` (valid for writes of `msg_controllen` bytes), both live for the call.
        let r = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, flags) };
        if r >= 0 {
            break r as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let fds = if max_fds > 0 {
        close_passed_fds(&msg)
    } else {
        0
    };
    Ok(Peeked {
        bytes: r,
        fds,
        fds_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// Closes every descriptor an SCM_RIGHTS message in `msg`'s control data installed; how many.
fn close_passed_fds(msg: &libc::msghdr) -> usize {
    let mut closed = 0;
    // SAFETY: `msg` was filled by recvmsg: its control pointer and length describe the
    // control data the kernel wrote.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(msg) };
    while !cmsg.is_null() {
        // SAFETY: CMSG_FIRSTHDR and CMSG_NXTHDR return null or a header inside the buffer.
        let hdr = unsafe { std::ptr::read_unaligned(cmsg) };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN is arithmetic on its argument.
            let header_len = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = (hdr.cmsg_len as usize).saturating_sub(header_len)
                / std::mem::size_of::<libc::c_int>();
            // SAFETY: `cmsg` is a header inside the buffer (see above).
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..n {
                let at = data.wrapping_add(i);
                // SAFETY: the kernel wrote `n` ints after the header, inside the buffer
                // (cmsg_len counts them), so `at` points at one; it may be unaligned.
                let fd = unsafe { std::ptr::read_unaligned(at) };
                // SAFETY: the peek just installed `fd` in this process and nothing else
                // knows its number: this is its only owner.
                drop(unsafe { OwnedFd::from_raw_fd(fd) });
                closed += 1;
            }
        }
        // SAFETY: `msg` and `cmsg` as above.
        cmsg = unsafe { libc::CMSG_NXTHDR(msg, cmsg) };
    }
    closed
}

/// What to wait for with [`wait_socket`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Bytes to read, urgent data, or the peer's end of stream.
    Readable,
    /// Room to send.
    Writable,
}

/// What [`wait_socket`] found; all false when the wait timed out or a signal cut it short.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub readable: bool,
    /// On a unix stream socket, POLLOUT: what this socket sent and the peer has not read
    /// takes at most a quarter of its send buffer (`unix_writable`). A send then allocates
    /// at once (the kernel waits only while all of the buffer is taken), so a message of a
    /// few KiB does not block.
    pub writable: bool,
    /// Out-of-band data is pending (POLLPRI, MSG_OOB): a read stops at its mark.
    pub urgent: bool,
    /// The peer has closed or shut down its sending side, or the socket failed (POLLHUP,
    /// POLLRDHUP, POLLERR): reads return what is queued and then the end, at once.
    pub closed: bool,
}

/// Waits up to `timeout` (None: without limit) for `socket` to become ready as `wait` says.
pub fn wait_socket(
    socket: &UnixStream,
    wait: Wait,
    timeout: Option<Duration>,
) -> io::Result<Readiness> {
    let events = match wait {
        Wait::Readable => libc::POLLIN | libc::POLLPRI | libc::POLLRDHUP,
        Wait::Writable => libc::POLLOUT,
    };
    let mut p = libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    };
    // Rounded up, so that a wait never ends just before its deadline and is tried again.
    let ms = timeout.map_or(-1, |t| {
        i32::try_from(t.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
    });
    // SAFETY: `p` is a valid pollfd for the duration of the call; nfds = 1.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::Interrupted => Ok(Readiness::default()),
            _ => Err(e),
        };
    }
    let has = |bits: libc::c_short| p.revents & bits != 0;
    Ok(Readiness {
        readable: has(libc::POLLIN),
        writable: has(libc::POLLOUT),
        urgent: has(libc::POLLPRI),
        closed: has(libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR),
    })
}

/// Connects to the unix stream socket listening at `path` without waiting for it: when the
/// listener's backlog is full (a listener that does not accept), the connect fails at once
/// with `WouldBlock`, where a blocking one would wait until the listener accepts, which a
/// hostile one never does. The stream returned blocks, as `UnixStream::connect`'s does.
pub fn connect_now(path: &Path) -> io::Result<UnixStream> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid (empty) address.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    // The path and its terminating NUL must fit; a NUL inside it would cut it short.
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a usable unix socket path", path.display()),
        ));
    }
    for (dst, &src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket takes integers and touches no memory.
    let fd = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just made by socket, so nothing else in the process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `addr` is a valid sockaddr_un and `len` at most its size.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    use vmm_sys_util::sock_ctrl_msg::ScmSocket;

    use super::*;

    /// Reads everything `b` holds (the kernel closes the descriptors in flight), drops `x` and
    /// checks that its peer `y` sees the close: nothing else holds `x`, not even a copy that a
    /// peek installed. (Counting /proc/self/fd would race with the other tests.)
    fn no_copy_kept(b: &UnixStream, x: UnixStream, y: &UnixStream) {
        b.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        while (&*b).read(&mut buf).is_ok_and(|n| n > 0) {}
        drop(x);
        let r = wait_socket(y, Wait::Readable, Some(Duration::from_secs(5))).unwrap();
        assert!(r.closed, "a copy of the descriptor is still open: {r:?}");
    }

    #[test]
    fn queued_bytes_count_every_write_and_nothing_is_consumed() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert_eq!(queued_bytes(&b).unwrap(), 0);
        a.write_all(&[1; 5]).unwrap();
        a.write_all(&[2; 7]).unwrap();
        assert_eq!(queued_bytes(&b).unwrap(), 12);
        let mut buf = [0u8; 12];
        let p = peek_with_fds(&b, &mut buf, 4).unwrap();
        assert_eq!((p.bytes, p.fds, p.fds_truncated), (12, 0, false));
        assert_eq!(queued_bytes(&b).unwrap(), 12, "a peek takes nothing");
        (&b).read_exact(&mut buf).unwrap();
        assert_eq!(buf[..6], [1, 1, 1, 1, 1, 2]);
        assert_eq!(queued_bytes(&b).unwrap(), 0);
    }

    #[test]
    fn a_peek_counts_descriptors_keeps_none_and_stops_after_their_segment() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        // Three bytes with three descriptors, then nine more bytes.
        let fds = [x.as_raw_fd(); 3];
        a.send_with_fds(&[&[7u8; 3][..]], &fds).unwrap();
        (&a).write_all(&[8; 9]).unwrap();
        let mut buf = [0u8; 12];
        let p = peek_with_fds(&b, &mut buf, 32).unwrap();
        assert_eq!((p.bytes, p.fds, p.fds_truncated), (3, 3, false));
        assert_eq!(queued_bytes(&b).unwrap(), 12);
        // The same peek again sees the same, and with no room the kernel says so.
        assert_eq!(peek_with_fds(&b, &mut buf, 32).unwrap(), p);
        let p = peek_with_fds(&b, &mut buf, 0).unwrap();
        assert_eq!((p.bytes, p.fds, p.fds_truncated), (3, 0, true));
        no_copy_kept(&b, x, &y);
    }

    #[test]
    fn more_descriptors_than_room_are_truncated_and_none_kept() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, y) = UnixStream::pair().unwrap();
        a.send_with_fds(&[&[0u8; 12][..]], &[x.as_raw_fd(); 40])
            .unwrap();
        let mut buf = [0u8; 12];
        let p = peek_with_fds(&b, &mut buf, 32).unwrap();
        assert_eq!((p.bytes, p.fds, p.fds_truncated), (12, 32, true));
        no_copy_kept(&b, x, &y);
    }

    #[test]
    fn an_empty_socket_would_block_and_a_closed_one_peeks_nothing() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut buf = [0u8; 4];
        let e = peek_with_fds(&b, &mut buf, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let zero = Duration::ZERO;
        assert_eq!(
            wait_socket(&b, Wait::Readable, Some(zero)).unwrap(),
            Readiness::default()
        );
        drop(a);
        assert_eq!(peek_with_fds(&b, &mut buf, 1).unwrap().bytes, 0);
        let r = wait_socket(&b, Wait::Readable, None).unwrap();
        assert!(r.closed && !r.urgent, "{r:?}");
    }

    #[test]
    fn a_socket_whose_peer_does_not_read_stops_being_writable() {
        let (_a, b) = UnixStream::pair().unwrap();
        let zero = Some(Duration::ZERO);
        assert!(wait_socket(&b, Wait::Writable, zero).unwrap().writable);
        b.set_nonblocking(true).unwrap();
        let chunk = [0u8; 4096];
        while (&b).write(&chunk).is_ok() {}
        assert!(!wait_socket(&b, Wait::Writable, zero).unwrap().writable);
        let t = std::time::Instant::now();
        let r = wait_socket(&b, Wait::Writable, Some(Duration::from_millis(30))).unwrap();
        assert_eq!(r, Readiness::default());
        assert!(
            t.elapsed() >= Duration::from_millis(30),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn urgent_data_is_reported() {
        let (a, b) = UnixStream::pair().unwrap();
        let byte = [1u8];
        // SAFETY: `byte` is valid for reads of one byte for the call.
        let r = unsafe { libc::send(a.as_raw_fd(), byte.as_ptr().cast(), 1, libc::MSG_OOB) };
        if r < 0 {
            // A kernel without AF_UNIX MSG_OOB (before 5.15, or CONFIG_AF_UNIX_OOB off).
            assert_eq!(
                io::Error::last_os_error().raw_os_error(),
                Some(libc::EOPNOTSUPP)
            );
            return;
        }
        let r = wait_socket(&b, Wait::Readable, Some(Duration::ZERO)).unwrap();
        assert!(r.urgent && !r.closed, "{r:?}");
    }

    #[test]
    fn a_listener_with_a_full_backlog_is_refused_at_once() {
        let dir = std::env::temp_dir().join(format!("virtnet-sys-now-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let listener = UnixListener::bind(&path).unwrap();
        // A backlog of one connection (listen again to change it).
        // SAFETY: listen takes integers and touches no memory.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        let mut first = connect_now(&path).unwrap();
        let e = connect_now(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        // The connection made blocks, as a std one does, and works.
        let (mut accepted, _) = listener.accept().unwrap();
        first.write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // SAFETY: F_GETFL takes no argument and touches no memory.
        let flags = unsafe { libc::fcntl(first.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0);
        let long = dir.join("x".repeat(200));
        assert_eq!(
            connect_now(&long).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
