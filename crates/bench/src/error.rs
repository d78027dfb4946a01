//! The crate's error type.

use std::io;

/// Why a measurement could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The virtqueue engine refused an operation or found the ring broken.
    #[error("vring: {0}")]
    Ring(#[from] vring::Error),
    /// A device-side engine other than ours failed (its error, as text).
    #[error("{engine}: {reason}")]
    Engine {
        engine: &'static str,
        reason: String,
    },
    /// An eventfd or epoll call failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A side slept for longer than any peer would take to notify it: a lost wake-up.
    #[error("{side} waited {waited_ms} ms for a notification that never came (lost wake-up)")]
    LostWakeup { side: &'static str, waited_ms: u64 },
    /// The other thread of a two-thread run failed; its error is reported instead.
    #[error("stopped because the peer thread failed")]
    PeerFailed,
    /// A run's counts contradict each other (for example fewer completions than chains).
    #[error("inconsistent run: {0}")]
    Inconsistent(String),
    /// `--only` named an experiment that does not exist.
    #[error("no experiment numbered {0} (see `virtnet bench --list`)")]
    UnknownExperiment(u32),
}

impl BenchError {
    pub(crate) fn io(what: &'static str) -> impl FnOnce(io::Error) -> BenchError {
        move |source| BenchError::Io { what, source }
    }
}
