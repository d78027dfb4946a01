//! Host ports: where a pair's guest frames go and its host frames come from.
//!
//! A worker drives one port through [`Host`]: `send` for each guest tx frame, `receive` to fill
//! guest rx, `fd` and `has_frames` to know when the host side has frames. A new kind of port
//! is one more file here implementing the trait, and one arm in `Device::new` that builds it.
//!
//! - [`tap::TapPort`]: a TAP queue (IFF_VNET_HDR), the production port.
//! - [`null::NullPort`]: drops guest tx, fills guest rx with generated frames (benchmarks).
//! - [`echo::EchoPort`]: loops guest tx back to guest rx (benchmarks, tests).
//! - [`socket::SocketPort`]: one end of a unix datagram socket, the other end's holder being
//!   the host side (benchmarks: a peer that answers from its own thread, as a TAP's would).

pub mod batch;
pub mod echo;
pub mod null;
pub mod socket;
pub mod tap;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use vring::{Chain, Error as RingError, GuestMemory};

use super::queue::QueueRuntime;
use super::rx::{Delivery, RxPath};
use super::shared::Shared;

/// What became of one guest tx frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The host took it.
    Taken,
    /// The host refused it (a frame the TAP does not take, too many segments): consumed,
    /// counted as dropped.
    Dropped,
    /// Not now: the frame stays on the tx ring (a loopback port without rx room).
    Later,
    /// The host cannot take frames now (the TAP's send buffer is full): the frame stays on
    /// the tx ring, and tx waits until [`Host::writable`].
    Busy,
    /// The frame's virtio-net header is one a driver must not send: consumed, counted as
    /// dropped and by reason.
    Refused(vnet::TxHdrError),
}

/// Frames one `receive` call handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Received {
    /// Frames put into guest rx, and their bytes, headers excluded.
    pub frames: usize,
    pub bytes: u64,
    /// Host frames consumed but not delivered (filtered, or too large for every buffer the
    /// guest could post): counted by the rx path, and against the turn's weight.
    pub dropped: usize,
}

impl Received {
    /// One frame of `len` bytes, `hdr_len` of them the virtio-net header, put into guest rx.
    pub fn one(len: usize, hdr_len: usize) -> Received {
        Received {
            frames: 1,
            bytes: len.saturating_sub(hdr_len) as u64,
            dropped: 0,
        }
    }

    /// One host frame consumed and not delivered.
    pub const DROPPED: Received = Received {
        frames: 0,
        bytes: 0,
        dropped: 1,
    };
}

/// Delivers the `n`-byte frame in `bounce` (read by a port whose rx went through its own
/// buffer); one that does not fit the posted buffers stays there, in `pending`, until the
/// guest posts more.
pub(crate) fn deliver_bounced(
    rx: &mut RxPath,
    shared: &Shared,
    bounce: &mut [u8],
    n: usize,
    pending: &mut Option<usize>,
) -> Result<Received, RingError> {
    Ok(match rx.deliver(shared, &mut bounce[..n])? {
        Delivery::Delivered => Received::one(n, rx.hdr_len()),
        Delivery::Dropped => Received::DROPPED,
        Delivery::NoRoom => {
            // Too few buffers for this frame: keep it until the guest posts more.
            *pending = Some(n);
            rx.block();
            Received::default()
        }
    })
}

/// [`Host::send_batch`] frame by frame, through [`Host::send`].
pub(crate) fn send_each<H: Host + ?Sized>(
    host: &mut H,
    mem: &GuestMemory,
    chains: &[Chain],
    rx: &mut RxPath,
    shared: &Shared,
    sent: &mut Vec<Sent>,
) -> Result<(), RingError> {
    for chain in chains {
        let s = host.send(mem, chain, rx, shared)?;
        sent.push(s);
        if matches!(s, Sent::Later | Sent::Busy) {
            break;
        }
    }
    Ok(())
}

/// What became of a frame, from what writing it returned.
pub(crate) fn tx_outcome(
    written: Result<std::io::Result<usize>, RingError>,
) -> Result<Sent, RingError> {
    match written {
        Ok(Ok(_)) => Ok(Sent::Taken),
        // The send buffer is full (or the kernel short of memory): as vhost_net, keep the
        // frame and wait for the TAP to become writable.
        Ok(Err(e)) if is_pushback(&e) => Ok(Sent::Busy),
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

/// A write error that means "not now" rather than "not this frame" (vhost_net's `handle_tx`
/// treats the same three so): the frame stays on the tx ring.
pub(crate) fn is_pushback(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::ENOMEM | libc::ENOBUFS)
    )
}

/// A pair's host side, as its worker drives it. Ring errors returned break the queue the
/// call was about (tx for `send`, rx for `receive`).
pub trait Host: Send + 'static {
    /// Guest tx is looped to guest rx: tx needs a usable rx queue, waits while rx has no room,
    /// and rx is notified after each tx turn.
    const LOOPBACK: bool = false;
    /// Busy polling asks [`Host::has_frames`] every this many spins (more than 1 when asking
    /// costs a syscall).
    const POLL_EVERY: u32 = 1;

    /// The rx queue (re)started; the port may prepare for its features.
    fn rx_started(&mut self, _rx: &QueueRuntime) {}

    /// The rx queue stopped. Returns true if a frame the port held for it was dropped.
    fn rx_stopped(&mut self) -> bool {
        false
    }

    /// Passes one guest tx frame (the readable part of `chain` in `mem`, header first) to the
    /// host.
    fn send(
        &mut self,
        mem: &GuestMemory,
        chain: &Chain,
        rx: &mut RxPath,
        shared: &Shared,
    ) -> Result<Sent, RingError>;

    /// How many guest tx frames [`Host::send_batch`] takes at once (1: frame by frame).
    fn tx_batch(&self) -> usize {
        1
    }

    /// Passes the guest tx frames of `chains` to the host, in order, and pushes what became
    /// of each into `sent`. It may stop early: the frames after the last outcome pushed stay
    /// on the tx ring, as does a frame whose outcome is [`Sent::Later`] or [`Sent::Busy`],
    /// which ends the batch. On an error, the outcomes pushed are those of the frames before
    /// the one the error is about. By default, [`Host::send`] for each frame.
    fn send_batch(
        &mut self,
        mem: &GuestMemory,
        chains: &[Chain],
        rx: &mut RxPath,
        shared: &Shared,
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        send_each(self, mem, chains, rx, shared, sent)
    }

    /// Puts host frames into guest rx, at most `room` of them. Zero frames: nothing more
    /// for now. The caller has checked that rx is usable.
    fn receive(
        &mut self,
        rx: &mut RxPath,
        shared: &Shared,
        room: usize,
    ) -> Result<Received, RingError>;

    /// Whether host frames are waiting for guest rx now.
    fn has_frames(&self) -> bool;

    /// Whether the port takes frames again after [`Sent::Busy`].
    fn writable(&self) -> bool {
        true
    }

    /// Whether the port holds a frame that did not fit guest rx (the fd has nothing to add).
    fn holds_frame(&self) -> bool {
        false
    }

    /// The fd that becomes readable when host frames arrive, and writable when the port takes
    /// frames again after [`Sent::Busy`], if the port has one.
    fn fd(&self) -> Option<RawFd> {
        None
    }
}
