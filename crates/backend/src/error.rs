//! The backend's error type: what broke a queue or refused a request, and whose fault it was:
//! the guest's (a ring), the frontend's (a vhost-user request), or the host's.

use std::io;

/// Why a queue stopped working. The guest's errors keep the engine's error whole, so the
/// report names the descriptor or index at fault; the host's name the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The guest broke a ring or a buffer: the ring engine refused what it found there.
    #[error("{0}")]
    Guest(#[from] vring::Error),
    /// The frontend asked for something the device refuses: a queue configuration, memory
    /// table or feature set the engine does not accept (the engine's error, whole).
    #[error("frontend: {what}: {source}")]
    Protocol {
        what: &'static str,
        #[source]
        source: vring::Error,
    },
    /// A frontend request carried a value the device cannot take (NET_SET_MTU outside the
    /// range the device carries).
    #[error("frontend: {what}: {value} is outside {min}..={max}")]
    OutOfRange {
        what: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    /// A frontend request the device answers itself was not the shape the spec gives it.
    #[error("frontend: {what}: {why}")]
    Malformed {
        what: &'static str,
        why: &'static str,
    },
    /// A notification fd the frontend sent misbehaved: a write to it blocked until the
    /// watchdog interrupted it (the frontend cleared `O_NONBLOCK` and filled the counter).
    #[error("frontend: {what}: {source}")]
    PeerFd {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A host operation the queue needs failed (epoll, a TAP ioctl).
    #[error("host: {op}: {source}")]
    Host {
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// A frontend request refused for `what`.
    pub fn protocol(what: &'static str) -> impl FnOnce(vring::Error) -> Error {
        move |source| Error::Protocol { what, source }
    }

    /// A misbehaving frontend fd, `what`.
    pub fn peer_fd(what: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::PeerFd { what, source }
    }

    /// A host failure of `op`.
    pub fn host(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Host { op, source }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn each_error_names_whose_fault_it_is_and_keeps_its_cause() {
        let ring = vring::Error::InvalidMemory {
            reason: "no regions",
        };
        let p = Error::protocol("SET_MEM_TABLE")(ring.clone());
        assert!(
            p.to_string().starts_with("frontend: SET_MEM_TABLE: "),
            "{p}"
        );
        assert_eq!(p.source().map(|s| s.to_string()), Some(ring.to_string()));
        let g = Error::from(ring.clone());
        assert_eq!(g.to_string(), ring.to_string());
        let h = Error::host("epoll")(std::io::Error::from_raw_os_error(libc::EBADF));
        assert!(h.to_string().starts_with("host: epoll: "), "{h}");
        assert!(h.source().is_some());
    }
}
