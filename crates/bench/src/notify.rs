//! Notifications between the two threads of a run: one eventfd per direction (the kick and the
//! call of vhost-user), written by one side and slept on by the other.
//!
//! Sleeping goes through epoll with a timeout, so a lost wake-up (a protocol bug) is reported
//! as [`BenchError::LostWakeup`] instead of hanging the run, and a failed peer is noticed.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::BenchError;

/// How long a side sleeps between checks of the abort flag.
const POLL_SLICE_MS: i32 = 50;
/// How long a side may sleep before the run is declared a lost wake-up. Any real peer answers
/// within microseconds; seconds only pass when nobody is going to notify.
const LOST_WAKEUP_MS: u64 = 5_000;

/// One direction of notification: an eventfd and the epoll set its sleeper waits in.
#[derive(Debug)]
pub struct Notifier {
    fd: EventFd,
    epoll: Epoll,
    side: &'static str,
}

impl Notifier {
    /// A notifier slept on by `side` ("device" for the kick, "driver" for the call).
    pub fn new(side: &'static str) -> Result<Notifier, BenchError> {
        let fd = EventFd::new(EFD_NONBLOCK).map_err(BenchError::io("eventfd"))?;
        let epoll = Epoll::new().map_err(BenchError::io("epoll_create"))?;
        epoll
            .ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, 0),
            )
            .map_err(BenchError::io("epoll_ctl"))?;
        Ok(Notifier { fd, epoll, side })
    }

    /// Sends one notification (one eventfd write).
    #[inline]
    pub fn notify(&self) -> Result<(), BenchError> {
        self.fd.write(1).map_err(BenchError::io("eventfd write"))
    }

    /// Sleeps until at least one notification arrived, and consumes all that did: returns
    /// true. Returns false, without a notification, once `finished` is set (the peer has no
    /// more work to give), and fails with [`BenchError::PeerFailed`] once `abort` is set.
    pub fn wait(
        &self,
        abort: &AtomicBool,
        finished: Option<&AtomicBool>,
    ) -> Result<bool, BenchError> {
        let mut waited_ms = 0u64;
        let mut events = [EpollEvent::default()];
        loop {
            match self.fd.read() {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(BenchError::io("eventfd read")(e)),
            }
            match self.epoll.wait(POLL_SLICE_MS, &mut events) {
                Ok(0) => {
                    if abort.load(Relaxed) {
                        return Err(BenchError::PeerFailed);
                    }
                    if finished.is_some_and(|f| f.load(Relaxed)) {
                        return Ok(false);
                    }
                    waited_ms += POLL_SLICE_MS as u64;
                    if waited_ms >= LOST_WAKEUP_MS {
                        return Err(BenchError::LostWakeup {
                            side: self.side,
                            waited_ms,
                        });
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(BenchError::io("epoll_wait")(e)),
            }
        }
    }
}
