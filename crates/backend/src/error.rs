//! The backend's error type: what broke a queue, and whose fault it was.

use std::io;

/// Why a queue stopped working. The guest's errors keep the engine's error whole, so the
/// report names the descriptor or index at fault; the host's name the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The guest broke a ring or a buffer: the ring engine refused what it found there.
    #[error("{0}")]
    Guest(#[from] vring::Error),
    /// A host operation the queue needs failed (epoll, a TAP ioctl).
    #[error("host: {op}: {source}")]
    Host {
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// A host failure of `op`.
    pub fn host(op: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Host { op, source }
    }
}
