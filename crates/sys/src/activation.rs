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

/// Reads `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` for a process of id `pid`: None when
/// they are not there or are for another process, or name no descriptor. Values that are not
/// numbers are an error: a socket unit meant something and we cannot tell what.
pub fn parse_listen_env(
    listen_pid: Option<&str>,
    listen_fds: Option<&str>,
    listen_fdnames: Option<&str>,
    pid: u32,
) -> io::Result<Option<Passed>> {
    let (Some(listen_pid), Some(listen_fds)) = (listen_pid, listen_fds) else {
        return Ok(None);
    };
    let bad = |what: &str, value: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket activation: {what}={value:?} is not a number"),
        )
    };
    let for_pid: u32 = listen_pid
        .trim()
        .parse()
        .map_err(|_| bad("LISTEN_PID", listen_pid))?;
    if for_pid != pid {
        return Ok(None);
    }
    let count: u32 = listen_fds
        .trim()
        .parse()
        .map_err(|_| bad("LISTEN_FDS", listen_fds))?;
    if count == 0 {
        return Ok(None);
    }
    let names = listen_fdnames
        .map(|n| n.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    Ok(Some(Passed { count, names }))
}

/// The listening socket systemd passed this process, if it passed one: descriptor 3, checked
/// to be a listening unix stream socket. With more than one, the first is taken and the
/// others are left alone, with a warning. Every passed descriptor is marked close-on-exec (as
/// sd_listen_fds does), and the variables are removed from the environment either way.
///
/// Descriptor 3 is adopted as [`crate::unix_listener_from_fd`] adopts `--fd N`: through a
/// copy this owns, since nothing proves nothing else in the process owns the number.
pub fn listener_from_systemd() -> io::Result<Option<UnixListener>> {
    let var = |name| std::env::var(name).ok();
    let passed = parse_listen_env(
        var("LISTEN_PID").as_deref(),
        var("LISTEN_FDS").as_deref(),
        var("LISTEN_FDNAMES").as_deref(),
        std::process::id(),
    );
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let Some(passed) = passed? else {
        return Ok(None);
    };
    let last = LISTEN_FDS_START.saturating_add(i32::try_from(passed.count).unwrap_or(i32::MAX));
    for fd in LISTEN_FDS_START..last {
        // SAFETY: F_SETFD takes an int flag and touches no memory; on a number that is not
        // open it fails with EBADF, which we ignore (the check below reports fd 3).
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    if passed.count > 1 {
        tracing::warn!(
            count = passed.count,
            names = passed.names.join(":"),
            "socket activation passed more than one socket: serving the first"
        );
    }
    crate::unix_listener_from_fd(LISTEN_FDS_START)
        .map(Some)
        .map_err(|e| io::Error::new(e.kind(), format!("socket activation: {e}")))
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
        assert_eq!(parse(Some("42"), Some("0"), None).unwrap(), None);
        assert_eq!(parse(None, Some("1"), None).unwrap(), None);
        assert_eq!(parse(Some("42"), None, None).unwrap(), None);
        assert!(parse(Some("x"), Some("1"), None).is_err());
        assert!(parse(Some("42"), Some("-1"), None).is_err());
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
