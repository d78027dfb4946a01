//! The `tap` port: guest frames to and from one queue of a multi-queue TAP device, with the
//! virtio-net header on every frame (IFF_VNET_HDR), so offloads pass through unchanged.
//!
//! tx writes each frame straight from guest memory (one writev); a chain of more segments
//! than one writev takes is dropped and counted, never cut short. rx reads each frame into a
//! bounce buffer and copies it into guest buffers; a frame that does not fit the posted
//! buffers waits here, as vhost_net leaves it queued, until the guest posts more.

use std::os::fd::{AsRawFd, RawFd};

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use vring::{Chain, Error as RingError, GuestMemory};

use super::{Host, Received, Sent};
use crate::rx::{Delivery, RxPath};
use crate::shared::Shared;
use virtnet_sys::tap::TapQueue;

/// The largest frame the rx path reads: a 64 KiB GSO frame and its header.
const MAX_RX_FRAME: usize = 65536 + vnet::HDR_LEN + 14 + 4;

#[derive(Debug)]
pub struct TapPort {
    tap: TapQueue,
    /// A frame read from the TAP (its length in `bounce`) that did not fit the posted rx
    /// buffers: it goes first once the guest posts more.
    pending: Option<usize>,
    bounce: Vec<u8>,
}

impl TapPort {
    pub fn new(tap: TapQueue) -> TapPort {
        TapPort {
            tap,
            pending: None,
            bounce: vec![0u8; MAX_RX_FRAME],
        }
    }
}

impl Host for TapPort {
    const POLL_EVERY: u32 = 8;

    fn rx_stopped(&mut self) -> bool {
        self.pending.take().is_some()
    }

    fn send(
        &mut self,
        mem: &GuestMemory,
        chain: &Chain,
        _rx: &mut RxPath,
        _shared: &Shared,
    ) -> Result<Sent, RingError> {
        match self.tap.write_frame(mem, chain.readable()) {
            Ok(Ok(_)) => Ok(Sent::Taken),
            Ok(Err(_)) => Ok(Sent::Dropped),
            // A legal chain that one writev cannot take: drop it whole rather than send a cut
            // frame, and keep the queue running.
            Err(RingError::TooManySegments { count, max }) => {
                static LOGGED: AtomicBool = AtomicBool::new(false);
                if !LOGGED.swap(true, Relaxed) {
                    tracing::debug!(
                        count,
                        max,
                        "tx chain has too many segments; dropped (logged once)"
                    );
                }
                Ok(Sent::Dropped)
            }
            Err(e) => Err(e),
        }
    }

    fn receive(
        &mut self,
        rx: &mut RxPath,
        shared: &Shared,
        _room: usize,
    ) -> Result<Received, RingError> {
        let n = match self.pending.take() {
            Some(n) => n,
            None => {
                // Read the TAP only when the guest has posted buffers, so frames wait in the
                // kernel instead of here.
                if !rx.has_buffers() {
                    return Ok(Received::default());
                }
                let Ok(n) = self.tap.read(&mut self.bounce) else {
                    return Ok(Received::default());
                };
                n
            }
        };
        Ok(match rx.deliver(shared, &mut self.bounce[..n])? {
            Delivery::Delivered => Received {
                frames: 1,
                bytes: n.saturating_sub(rx.hdr_len()) as u64,
                dropped: 0,
            },
            Delivery::Dropped => Received {
                dropped: 1,
                ..Received::default()
            },
            Delivery::NoRoom => {
                // Too few buffers for this frame: keep it until the guest posts more.
                self.pending = Some(n);
                rx.block();
                Received::default()
            }
        })
    }

    fn has_frames(&self) -> bool {
        self.pending.is_some() || virtnet_sys::readable_now(self.tap.as_raw_fd())
    }

    fn holds_frame(&self) -> bool {
        self.pending.is_some()
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }
}
