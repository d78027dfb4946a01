//! Host ports: where a pair's guest tx frames go and its guest rx frames come from, and what a
//! port does for the device beyond frames.
//!
//! A [`Port`] is passive: it moves frames when asked, `send` for a batch of guest tx frames and
//! `recv` for one host frame, with `readable`, `writable` and `fd` to say when. The policy of
//! when and how is the data path's, the same for every port: the tx path
//! (`crate::tx`) checks the virtio-net headers a kernel will trust and holds frames the port
//! pushes back on the ring; the rx path (`crate::rx`) reads only when the guest has posted
//! buffers, straight into them when it posted enough for the largest frame, else into a buffer
//! of its own where a frame waits for more.
//!
//! A port's control plane is its [`Control`], which the device owns: the features the port
//! makes the device offer, its MTU, the negotiated offloads, attaching and detaching a pair's
//! queue, announcing a MAC after a migration.
//!
//! - [`tap::TapPort`]: a TAP queue (IFF_VNET_HDR), the production port, and [`tap::TapControl`].
//! - [`null::NullPort`]: drops guest tx, fills guest rx with one generated frame (benchmarks).
//! - [`echo::EchoPort`]: guest tx comes back on guest rx (benchmarks, tests).
//! - [`socket::SocketPort`]: one end of a unix datagram socket, whose other end's holder is the
//!   host side (benchmarks: a peer that answers from its own thread, as a TAP's would).
//!
//! A new kind of port is one more file here with its `Port` (and `Control`, if it has one), and
//! one arm in [`open`].

pub mod batch;
pub mod echo;
pub mod null;
pub mod socket;
pub mod tap;

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Instant;

use vring::{Error as RingError, Features, Gather, GuestMemory, Segment};

use crate::config::{BackendConfig, IoMode, MAX_MTU};
use crate::queue::QueueRuntime;

/// What became of one guest tx frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The host took it.
    Taken,
    /// The host refused it (a frame the TAP does not take, too many segments): consumed,
    /// counted as dropped.
    Dropped,
    /// The host cannot take frames now (the TAP's send buffer is full): the frame stays on
    /// the tx ring, and tx waits until [`Port::writable`].
    Busy,
    /// The frame's virtio-net header is one a driver must not send: consumed, counted as
    /// dropped and by reason (the tx path's verdict; a port never says it).
    Refused(vnet::TxHdrError),
}

/// A pair's host side, as its worker drives it. Ring errors returned are the guest's (a
/// segment outside memory) and break the queue the call was about.
pub trait Port: Send + 'static {
    /// Whether a kernel builds packets from the frames' virtio-net headers (a TAP's
    /// `virtio_net_hdr_to_skb` trusts them): the tx path then checks each header, and hands
    /// the port the checked copy. Other ports get the frames as they are in guest memory.
    fn checks_tx_headers(&self) -> bool {
        false
    }

    /// How many of each frame's first bytes (after its header, up to
    /// [`crate::tx::MAX_TX_PREFIX`]) a port that checks headers wants copied with the header,
    /// in the same read. When more than 0, [`Gather::head`] holds the header in
    /// [`vnet::HDR_LEN`] bytes (`num_buffers` zero, as a TAP takes it), then those bytes, and
    /// `body` the rest of the frame.
    fn tx_prefix(&self) -> usize {
        0
    }

    /// Busy polling asks [`Port::readable`] and [`Port::writable`] every this many spins (more
    /// than 1 when asking costs a system call).
    fn poll_every(&self) -> u32 {
        1
    }

    /// How many guest tx frames [`Port::send`] takes at once.
    fn tx_batch(&self) -> usize {
        1
    }

    /// Passes guest tx frames of `mem` (a header copy, then the frame's bytes in guest
    /// memory) to the host, in order, and pushes what became of each into `sent`. It may stop
    /// early: the frames after the last outcome pushed stay on the tx ring, as does one whose
    /// outcome is [`Sent::Busy`], which ends the batch. On an error, the outcomes pushed are
    /// those of the frames before the one the error is about.
    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError>;

    /// Reads the next host frame, virtio-net header first: into `segs` of `mem`, then `tail`
    /// for what they cannot hold. Returns its length; `WouldBlock` (inner) when none waits,
    /// always for a port that never has frames for the guest (the default).
    fn recv(
        &mut self,
        _mem: &GuestMemory,
        _segs: &[Segment],
        _tail: &mut [u8],
    ) -> Result<io::Result<usize>, RingError> {
        Ok(Err(io::ErrorKind::WouldBlock.into()))
    }

    /// The frame the port gives again and again, built for a header of `hdr_len` bytes (the
    /// null generator): the rx path copies it into the guest's buffers in bursts instead of
    /// calling [`Port::recv`].
    fn repeated_frame(&mut self, _hdr_len: usize) -> Option<&mut [u8]> {
        None
    }

    /// A queue of the pair stopped (the frontend went away, or reset it): a port that holds
    /// guest frames of its own drops them.
    fn queue_stopped(&mut self) {}

    /// Whether the port delivers into the pair's guest rx queue itself (a switch's port, into
    /// which other ports' workers forward) rather than the pair's rx path.
    fn adopts_rx(&self) -> bool {
        false
    }

    /// Takes over the pair's guest rx queue (when [`Port::adopts_rx`]); returns the queue it
    /// replaces.
    fn adopt_rx(&mut self, q: QueueRuntime) -> Option<QueueRuntime> {
        Some(q)
    }

    /// Gives back the rx queue [`Port::adopt_rx`] took, stopped.
    fn release_rx(&mut self) -> Option<QueueRuntime> {
        None
    }

    /// When the earliest call held back on a queue the port adopted is due.
    fn next_call_deadline(&self) -> Option<Instant> {
        None
    }

    /// Sends the calls held on queues the port adopted that are due at `now`.
    fn fire_due_calls(&mut self, _now: Instant) {}

    /// Whether the port forwards host frames itself ([`Port::forward`]) rather than into the
    /// pair's rx queue: its fd is then watched whatever the guest's rx buffers.
    fn forwards(&self) -> bool {
        false
    }

    /// Forwards up to `budget` host frames itself (a switch's uplink, which delivers them to
    /// the guests they are for); returns how many it handled.
    fn forward(&mut self, _budget: usize) -> usize {
        0
    }

    /// The largest frame the port hands out with `features` negotiated (so its offloads
    /// set) on a link of `mtu`: what the rx path reads a frame into the guest's buffers for,
    /// and beyond which it drops one.
    fn max_frame(&self, features: Features, mtu: u16) -> usize {
        max_rx_frame(features, mtu)
    }

    /// Whether host frames wait now.
    fn readable(&self) -> bool;

    /// Whether the port takes frames again after [`Sent::Busy`].
    fn writable(&self) -> bool {
        true
    }

    /// The fd that becomes readable when host frames arrive, and writable when the port takes
    /// frames again, if the port has one.
    fn fd(&self) -> Option<RawFd> {
        None
    }
}

/// The largest frame rx reads: a 64 KiB GSO frame and its header.
pub const MAX_RX_FRAME: usize = 65536 + vnet::HDR_LEN + 14 + 4;

/// The largest frame a kernel port (a TAP) hands out with `features` negotiated (so its
/// offloads set) on a link of `mtu`: 64 KiB with any receive segmentation offload, else one
/// MTU-sized frame with a VLAN tag.
pub fn max_rx_frame(features: Features, mtu: u16) -> usize {
    let gso = vnet::feature::GUEST_TSO4
        | vnet::feature::GUEST_TSO6
        | vnet::feature::GUEST_UFO
        | vnet::feature::GUEST_USO4
        | vnet::feature::GUEST_USO6;
    if features.intersection(gso) != Features::EMPTY {
        MAX_RX_FRAME
    } else {
        vnet::hdr_len(features) + 14 + 4 + mtu.max(1500) as usize
    }
}

/// What a port does for the device beyond moving frames. Every method has the behaviour of a
/// port with no host device of its own (the generators) as its default.
pub trait Control: Send + Sync + std::fmt::Debug {
    /// Features the port makes the device offer beyond `shared::device_features`.
    fn offered(&self) -> Features {
        Features::EMPTY
    }

    /// The largest MTU the port carries.
    fn max_mtu(&self) -> u16 {
        MAX_MTU
    }

    /// The MTU of the port's host interface, if it has one.
    fn mtu(&self) -> io::Result<Option<u16>> {
        Ok(None)
    }

    /// Sets the MTU of the port's host interface.
    fn set_mtu(&self, _mtu: u16) -> io::Result<()> {
        Ok(())
    }

    /// Applies the features the frontend acknowledged (the header length, the receive
    /// offloads the guest can take).
    fn configure(&self, _features: Features) -> io::Result<()> {
        Ok(())
    }

    /// Attaches or detaches pair `pair`'s host queue: frames are steered only to attached
    /// ones.
    fn attach(&self, _pair: u16, _on: bool) -> io::Result<()> {
        Ok(())
    }

    /// Sends `frame` (Ethernet header first) out of the host side as if the guest had, with
    /// `features` negotiated; false when the port has nowhere to send it.
    fn announce(&self, _frame: &[u8], _features: Features) -> io::Result<bool> {
        Ok(false)
    }

    /// The host interface's name, for logs.
    fn name(&self) -> Option<&str> {
        None
    }
}

/// The control of a port with no host device of its own.
#[derive(Debug, Default)]
pub struct NoControl;

impl Control for NoControl {}

/// A device's ports: one per pair, and their control.
pub struct Opened {
    pub control: Box<dyn Control>,
    pub ports: Vec<Box<dyn Port>>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("control", &self.control)
            .field("ports", &self.ports.len())
            .finish()
    }
}

/// Opens the ports `config.io` names, one per pair.
pub fn open(config: &BackendConfig) -> io::Result<Opened> {
    let pairs = config.pairs;
    fn boxed<P: Port>(ports: Vec<P>) -> Vec<Box<dyn Port>> {
        ports
            .into_iter()
            .map(|p| Box::new(p) as Box<dyn Port>)
            .collect()
    }
    Ok(match &config.io {
        IoMode::Tap(name) => {
            let (control, ports) = tap::open(name, config)?;
            Opened {
                control: Box::new(control),
                ports: boxed(ports),
            }
        }
        IoMode::Null { size } => Opened {
            control: Box::new(NoControl),
            ports: boxed((0..pairs).map(|p| null::NullPort::new(*size, p)).collect()),
        },
        IoMode::Echo => Opened {
            control: Box::new(NoControl),
            ports: boxed((0..pairs).map(|_| echo::EchoPort::default()).collect()),
        },
        IoMode::Socket(s) => {
            if s.len() != pairs as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} sockets for {} queue pairs", s.len(), pairs),
                ));
            }
            let ports = (0..pairs)
                .map(|p| socket::SocketPort::new(s.duplicate(p)?))
                .collect::<io::Result<Vec<_>>>()?;
            Opened {
                control: Box::new(NoControl),
                ports: boxed(ports),
            }
        }
    })
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

/// Writes `frames` one writev each with `write`, pushing each outcome into `sent`; stops after
/// a [`Sent::Busy`]. A port's `send` when it has no batched writes.
pub(crate) fn send_each(
    frames: &[Gather<'_>],
    sent: &mut Vec<Sent>,
    mut write: impl FnMut(Gather<'_>) -> Result<io::Result<usize>, RingError>,
) -> Result<(), RingError> {
    for f in frames {
        let s = tx_outcome(write(*f))?;
        sent.push(s);
        if s == Sent::Busy {
            break;
        }
    }
    Ok(())
}

/// A write error that means "not now" rather than "not this frame" (vhost_net's `handle_tx`
/// treats the same three so): the frame stays on the tx ring.
pub(crate) fn is_pushback(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN | libc::ENOMEM | libc::ENOBUFS)
    )
}
