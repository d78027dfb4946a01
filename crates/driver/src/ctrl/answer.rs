//! What a control command gets back: its [`Reply`] or [`CtrlError`], delivered once through
//! its [`Completion`] by whoever reaps it.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vnet::ctrl::{Coalesce, Command};

/// Why a command did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CtrlError {
    #[error(
        "control command {cmd:?} got no answer within {after:?}; it stays in flight until \
         the device hands it back"
    )]
    Timeout { cmd: Command, after: Duration },
    #[error(
        "no room for control command {cmd:?} within {after:?}: every slot is held by commands \
         the device has not answered"
    )]
    NoRoom { cmd: Command, after: Duration },
    #[error("the device refused control command {cmd:?} (VIRTIO_NET_ERR)")]
    Refused { cmd: Command },
    #[error(
        "the device returned control command {cmd:?} without a valid ack (ack byte {ack:#04x})"
    )]
    NoAck { cmd: Command, ack: u8 },
    #[error("the control queue (virtqueue {vq}) was broken by the device: {reason}")]
    Broken { vq: u16, reason: vring::Error },
    #[error("the control queue is shut down")]
    Closed,
    #[error("control queue setup: {0}")]
    Setup(String),
}

/// What a successful command returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    Ack,
    /// VQ_NOTF_COAL GET's answer.
    Coalesce(Coalesce),
}

/// One command's answer, delivered once by whoever reaps it.
#[derive(Debug, Default)]
pub struct Completion {
    result: Mutex<Option<Result<Reply, CtrlError>>>,
    cv: Condvar,
}

impl Completion {
    pub(super) fn complete(&self, r: Result<Reply, CtrlError>) {
        let mut g = lock(&self.result);
        *g = Some(r);
        self.cv.notify_all();
    }

    pub(super) fn try_take(&self) -> Option<Result<Reply, CtrlError>> {
        lock(&self.result).take()
    }

    pub(super) fn is_done(&self) -> bool {
        lock(&self.result).is_some()
    }

    /// Sleeps until completed or `deadline`.
    pub(super) fn wait_until(&self, deadline: Instant) -> Option<Result<Reply, CtrlError>> {
        let mut g = lock(&self.result);
        loop {
            if let Some(r) = g.take() {
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = match self.cv.wait_timeout(g, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

/// Locks, ignoring poisoning: the state guarded here stays consistent across a panic in
/// another holder (every update is a single assignment).
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
