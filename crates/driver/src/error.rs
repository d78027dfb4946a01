//! The driver's errors.

use vring::ErrorKind;

use crate::counters::QueueCounters;
use crate::ctrl::CtrlError;
use crate::frontend::FrontendError;

/// Driver errors: the device broke a queue, we asked for something impossible, or the
/// transport failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("virtqueue {vq} was broken by the device: {source}; it stays out of use")]
    Broken { vq: u16, source: vring::Error },
    #[error("virtqueue {vq}: {source}")]
    Ring { vq: u16, source: vring::Error },
    #[error("a {len}-byte frame does not fit a tx buffer ({max} bytes at most)")]
    FrameTooLarge { len: usize, max: usize },
    #[error("{0}")]
    Frontend(#[from] FrontendError),
    #[error("{0}")]
    Ctrl(#[from] CtrlError),
    #[error("the device did not negotiate {feature}, needed to {what}")]
    NotNegotiated {
        feature: &'static str,
        what: &'static str,
    },
    #[error("{wanted} queue pairs asked for, the device has {max}")]
    TooManyPairs { wanted: u16, max: u16 },
}

/// Maps an engine error on virtqueue `vq`: the device's fault breaks the queue (recorded in
/// its counters), anything else is ours.
pub(crate) fn ring_error(vq: u16, counters: &QueueCounters, e: vring::Error) -> DriverError {
    if e.kind() == ErrorKind::Peer {
        if !counters.is_broken() {
            tracing::error!(vq, error = %e, "the device broke a virtqueue; it stays out of use");
        }
        counters.set_broken(e.to_string());
        DriverError::Broken { vq, source: e }
    } else {
        DriverError::Ring { vq, source: e }
    }
}
