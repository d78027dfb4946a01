//! systemd's socket activation and readiness protocols, the few lines each takes, without
//! libsystemd (sd_listen_fds(3), sd_notify(3)).
//!
//! - **Socket activation.** A service started by its socket unit inherits the listening
//!   sockets as descriptors 3, 4, ... (`SD_LISTEN_FDS_START`), and is told so by
//!   `LISTEN_PID` (its own pid, so that a child that inherits the environment does not take
//!   them too), `LISTEN_FDS` (how many) and `LISTEN_FDNAMES` (their names, `:`-separated).
//! - **Readiness.** `NOTIFY_SOCKET` names a unix datagram socket (a path, or an abstract name
//!   when it starts with `@`); the service sends it `READY=1` once it serves, `STOPPING=1`
//!   when it begins to stop.
//!
//! Both read their variables once, then remove them from the environment, as libsystemd's
//! `unset_environment` does: call them first thing in `main`, before any thread starts
//! (changing the environment races with threads that read it).

use std::io;
use std::os::fd::RawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// What the environment says systemd passed this process.
#[derive(Debug, PartialEq, Eq)]
pub struct Passed {
    /// How many descriptors, from [`LISTEN_FDS_START`] on.
    pub count: u32,
    /// Their names (`FileDescriptorName=`, by default the socket unit's name), if given.
    pub names: Vec<String>,
}

/// The most descriptors a socket unit can pass: their numbers must fit an int from
/// [`LISTEN_FDS_START`] on (sd_listen_fds' bound).
pub const MAX_LISTEN_FDS: u32 = (i32::MAX - LISTEN_FDS_START) as u32;

/// Reads `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` for a process of id `pid`, as
/// sd_listen_fds(3) does: None when they are not there, are for another process (a parent's,
/// inherited: not ours to take), or pass no descriptor (`LISTEN_FDS=0`). A `LISTEN_PID` that
/// is no process id, or a `LISTEN_FDS` that is no count of descriptors (not a number,
/// negative, more than [`MAX_LISTEN_FDS`]), is an error: a socket unit meant something and we
/// cannot tell what.
pub fn parse_listen_env(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    listen_fdnames: Option<&str>,
    pid: u32,
) -> io::Result<Option<Passed>> {
    let (Some(listen_pid), Some(listen_fds)) = (listen_pid, listen_fds) else {
        return Ok(None);
    };
    let bad = |what: &str, value: &str, why: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket activation: {what}={value:?} is not {why}"),
        )
    };
    let for_pid = listen_pid
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| bad("LISTEN_PID", listen_pid, "a process id"))?;
    if for_pid != pid {
        return Ok(None);
    }
    let too_many = || bad("LISTEN_FDS", listen_fds, "a count a process can have");
    let count = match listen_fds.trim().parse::<u64>() {
        Ok(count) => count,
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => return Err(too_many()),
        Err(_) => return Err(bad("LISTEN_FDS", listen_fds, "a count of descriptors")),
    };
    if count == 0 {
        return Ok(None);
    }
    let count = u32::try_from(count)
        .ok()
        .filter(|&c| c <= MAX_LISTEN_FDS)
        .ok_or_else(too_many)?;
    let names = listen_fdnames
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    Ok(Some(Passed { count, names }))
}

/// The listening socket systemd passed this process, if it passed one: descriptor 3, checked
/// to be a listening unix stream socket. With more than one, the first is taken and the
/// others are left alone, with a warning. Every passed descriptor must be open, and is marked
/// close-on-exec (as sd_listen_fds does); the variables are removed from the environment
/// either way. A variable that is not UTF-8 counts as garbage (an error), not as missing.
///
/// Descriptor 3 is adopted as [`crate::unix_listener_from_fd`] adopts `--fd N`: through a
/// copy this owns, since nothing proves nothing else in the process owns the number.
pub fn listener_from_systemd() -> io::Result<Option<UnixListener>> {
    let var = |name| {
        std::env::var_os(name)
            .map(|v| {
                v.into_string().map_err(|v| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("socket activation: {name}={v:?} is not UTF-8"),
                    )
                })
            })
            .transpose()
    };
    let read = || -> io::Result<Option<Passed>> {
        parse_listen_env(
            var("LISTEN_PID")?.as_deref(),
            var("LISTEN_FDS")?.as_deref(),
            var("LISTEN_FDNAMES")?.as_deref(),
            std::process::id(),
        )
    };
    let passed = read();
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let Some(passed) = passed? else {
        return Ok(None);
    };
    adopt_passed(LISTEN_FDS_START, &passed)
        .map(Some)
        .map_err(|e| io::Error::new(e.kind(), format!("socket activation: {e}")))
}

/// The first of the `passed.count` descriptors from `first`: each is marked close-on-exec,
/// and must be open (a count larger than what was passed is refused at the first number that
/// is not, without going through the rest); the first must be a listening unix stream socket,
/// and is adopted through a copy.
fn adopt_passed(first: RawFd, passed: &Passed) -> io::Result<UnixListener> {
    let count = i32::try_from(passed.count).unwrap_or(i32::MAX);
    for fd in first..first.saturating_add(count) {
        // SAFETY: F_SETFD takes an int flag and touches no memory; on a number that is not
        // open it fails with EBADF.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "LISTEN_FDS={}, but descriptor {fd} is not open: {e}",
                    passed.count
                ),
            ));
        }
    }
    if passed.count > 1 {
        tracing::warn!(
            count = passed.count,
            names = passed.names.join(":"),
            "socket activation passed more than one socket: serving the first"
        );
    }
    crate::unix_listener_from_fd(first)
}

/// Where readiness goes: the socket `NOTIFY_SOCKET` names.
#[derive(Debug)]
pub struct Notifier {
    addr: SocketAddr,
    socket: UnixDatagram,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, if it is set (and then removes it from the
    /// environment). An address we cannot use (not absolute, not abstract: systemd also has
    /// `vsock:`) is an error.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        let Some(address) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(None);
        };
        std::env::remove_var("NOTIFY_SOCKET");
        let address = address.to_str().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "NOTIFY_SOCKET is not UTF-8")
        })?;
        Notifier::new(address).map(Some)
    }

    /// A notifier for `address`: an absolute path, or `@name` for an abstract socket.
    pub fn new(address: &str) -> io::Result<Notifier> {
        let addr = if let Some(name) = address.strip_prefix('@') {
            SocketAddr::from_abstract_name(name.as_bytes())?
        } else if address.starts_with('/') {
            SocketAddr::from_pathname(address)?
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NOTIFY_SOCKET={address:?}: neither a path nor an abstract name"),
            ));
        };
        Ok(Notifier {
            addr,
            socket: UnixDatagram::unbound()?,
        })
    }

    /// Sends `state` (`READY=1`, `STOPPING=1`, `STATUS=...`: newline-separated assignments)
    /// as one datagram.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.socket
            .send_to_addr(state.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn the_listen_variables_count_only_for_our_pid() {
        let parse = |pid, fds, names| parse_listen_env(pid, fds, names, 42);
        assert_eq!(
            parse(Some("42"), Some("1"), None).unwrap(),
            Some(Passed {
                count: 1,
                names: Vec::new()
            })
        );
        assert_eq!(
            parse(Some("42"), Some("2"), Some("vhost:ctl")).unwrap(),
            Some(Passed {
                count: 2,
                names: vec!["vhost".into(), "ctl".into()]
            })
        );
        assert_eq!(
            parse(Some("41"), Some("1"), None).unwrap(),
            None,
            "a parent's"
        );
        // Another process's, whatever its LISTEN_FDS says.
        assert_eq!(parse(Some("41"), Some("x"), None).unwrap(), None);
        assert_eq!(parse(None, Some("1"), None).unwrap(), None);
        assert_eq!(parse(Some("42"), None, None).unwrap(), None);
    }

    #[test]
    fn no_descriptors_passed_is_nothing_passed() {
        let parse = |fds| parse_listen_env(Some("42"), Some(fds), None, 42);
        assert_eq!(parse("0").unwrap(), None);
        assert_eq!(parse(" 0 ").unwrap(), None);
    }

    #[test]
    fn a_pid_or_count_that_is_garbage_is_a_clear_error() {
        let err = |pid, fds| {
            parse_listen_env(Some(pid), Some(fds), None, 42)
                .expect_err("should be refused")
                .to_string()
        };
        for pid in ["x", "", "0", "-42", "42x", "99999999999"] {
            let e = err(pid, "1");
            assert!(
                e.contains("LISTEN_PID") && e.contains("process id"),
                "{pid:?}: {e}"
            );
        }
        for fds in ["x", "", "-1", "1.5", "0x1"] {
            let e = err("42", fds);
            assert!(
                e.contains("LISTEN_FDS") && e.contains("count"),
                "{fds:?}: {e}"
            );
        }
    }

    #[test]
    fn a_huge_count_is_refused_or_bounded_by_the_descriptors_open() {
        fn parse(fds: &str) -> io::Result<Option<Passed>> {
            parse_listen_env(Some("42"), Some(fds), None, 42)
        }
        let most = MAX_LISTEN_FDS.to_string();
        assert_eq!(parse(&most).unwrap().unwrap().count, MAX_LISTEN_FDS);
        for fds in [
            (MAX_LISTEN_FDS as u64 + 1).to_string(),
            u32::MAX.to_string(),
            "18446744073709551615".to_string(),
            "99999999999999999999999".to_string(),
        ] {
            let e = parse(&fds).expect_err("should be refused").to_string();
            assert!(e.contains("a count a process can have"), "{fds}: {e}");
        }
        // The largest count allowed, from a listener: refused at the first number past it
        // that is not open, at once, rather than after two billion fcntl calls.
        let (dir, l) = listener("huge");
        let fd = above(&l, 900);
        let t = std::time::Instant::now();
        let e = adopt_passed(fd.0, &passed(MAX_LISTEN_FDS)).expect_err("refused");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("is not open"), "{e}");
        drop((fd, l, dir));
    }

    fn passed(count: u32) -> Passed {
        Passed {
            count,
            names: Vec::new(),
        }
    }

    /// A descriptor at `number` or the next free one above it, closed on drop.
    struct Above(RawFd);
    impl Drop for Above {
        fn drop(&mut self) {
            // SAFETY: the test made this descriptor and nothing else owns it.
            unsafe { libc::close(self.0) };
        }
    }

    /// A copy of `fd` at the lowest free number from `number` on, as systemd would have put
    /// it at 3; the next number stays free for the test (it is checked).
    fn above(fd: &impl AsRawFd, number: RawFd) -> Above {
        // SAFETY: F_DUPFD takes an int and touches no memory.
        let copy = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD, number) };
        assert!(copy >= number, "{}", io::Error::last_os_error());
        // SAFETY: F_GETFD takes no argument and touches no memory.
        let next = unsafe { libc::fcntl(copy + 1, libc::F_GETFD) };
        assert!(next < 0, "descriptor {} is open", copy + 1);
        Above(copy)
    }

    /// A directory of the test's, removed on drop (a failed test's too).
    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    impl std::ops::Deref for Dir {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    /// A listener on `l.sock` in a directory of its own.
    fn listener(tag: &str) -> (Dir, UnixListener) {
        let dir = std::env::temp_dir().join(format!("virtnet-act-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let l = UnixListener::bind(dir.join("l.sock")).unwrap();
        (Dir(dir), l)
    }

    #[test]
    fn the_passed_listener_is_adopted_through_a_copy() {
        let (dir, l) = listener("adopt");
        let fd = above(&l, 910);
        let adopted = adopt_passed(fd.0, &passed(1)).unwrap();
        assert_ne!(adopted.as_raw_fd(), fd.0);
        // Marked close-on-exec, and still open.
        // SAFETY: F_GETFD takes no argument and touches no memory.
        let flags = unsafe { libc::fcntl(fd.0, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        let _c = std::os::unix::net::UnixStream::connect(dir.join("l.sock")).unwrap();
        adopted.accept().unwrap();
        drop((adopted, fd, l, dir));
    }

    #[test]
    fn more_descriptors_counted_than_passed_are_refused() {
        let (dir, l) = listener("count");
        let fd = above(&l, 920);
        let e = adopt_passed(fd.0, &passed(2)).expect_err("refused");
        let want = format!("LISTEN_FDS=2, but descriptor {} is not open", fd.0 + 1);
        assert!(e.to_string().contains(&want), "{e}");
        drop((fd, l, dir));
    }

    #[test]
    fn a_first_descriptor_that_is_not_a_listening_unix_socket_is_refused() {
        // Not open at all.
        let e = adopt_passed(930, &passed(1)).expect_err("refused");
        assert!(e.to_string().contains("descriptor 930 is not open"), "{e}");
        // A pipe, a connected unix stream, a unix datagram socket, a TCP listener.
        let (rx, _tx) = std::io::pipe().unwrap();
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (d, _e) = UnixDatagram::pair().unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let others: [&dyn AsRawFd; 4] = [&rx, &a, &d, &tcp];
        for other in others {
            let fd = above(&other.as_raw_fd(), 940);
            let e = adopt_passed(fd.0, &passed(1)).expect_err("refused");
            assert!(
                e.to_string().contains("not a listening unix stream socket"),
                "{e}"
            );
        }
    }

    #[test]
    fn readiness_reaches_an_abstract_or_a_path_socket() {
        let name = format!("virtnet-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_listener = UnixDatagram::bind_addr(&addr).unwrap();
        Notifier::new(&format!("@{name}"))
            .unwrap()
            .notify("READY=1")
            .unwrap();
        let mut buf = [0u8; 64];
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        let dir = std::env::temp_dir().join(format!("virtnet-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let path_listener = UnixDatagram::bind(&path).unwrap();
        Notifier::new(path.to_str().unwrap())
            .unwrap()
            .notify("STOPPING=1")
            .unwrap();
        let n = path_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        let _ = std::fs::remove_dir_all(&dir);

        assert!(Notifier::new("relative/path").is_err());
        assert!(Notifier::new("vsock:2:1234").is_err());
    }
}
