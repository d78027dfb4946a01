//! The `tap` port: guest frames to and from one queue of a multi-queue TAP device, with the
//! virtio-net header on every frame (IFF_VNET_HDR), so offloads pass through unchanged; and
//! the TAP's control plane ([`TapControl`]): its offloads, its interface's MTU, attaching a
//! pair's queue, announcing a MAC.
//!
//! tx writes each frame (the checked header copy the tx path hands over, then the frame
//! straight from guest memory), one writev per frame: a system call each ([`TapIo::Syscalls`]),
//! or a burst of up to 64 frames submitted with one `io_uring_enter` ([`TapIo::Uring`],
//! `vring::UringWriter`). A frame the TAP cannot take yet (its send buffer is full) is
//! [`Sent::Busy`]: the tx path keeps it on the ring.
//!
//! rx reads one frame per readv, into the guest's buffers and the rx path's tail buffer as the
//! rx path asks.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use vnet::feature;
use vring::{Error as RingError, Features, Gather, GuestMemory, Segment};

use super::batch::BatchWriter;
use super::{send_each, Control, Port, Sent};
use crate::config::{BackendConfig, TapIo};
use virtnet_sys::tap::{TapOffloads, TapQueue, TapSupport};

/// What a TAP device adds to the device's own features: UFO from the guest always (Linux
/// segments UFO frames written into a TAP since 4.15), and UDP segmentation both ways where the
/// kernel has it (Linux 6.2). GUEST_UFO is not offered: no kernel since 4.14 hands UFO frames
/// out.
pub fn tap_features(support: TapSupport) -> Features {
    let mut f = feature::HOST_UFO;
    if support.uso {
        f = f | feature::HOST_USO | feature::GUEST_USO4 | feature::GUEST_USO6;
    }
    f
}

/// Opens `name` once per pair (`config.pairs` queues of a multi-queue TAP), with the
/// configured send buffer: the pairs' ports, and the control plane on duplicates of them.
pub fn open(name: &str, config: &BackendConfig) -> io::Result<(TapControl, Vec<TapPort>)> {
    let mut handles = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..config.pairs {
        let q = TapQueue::open(name)?;
        q.set_vnet_hdr_len(vnet::HDR_LEN)?;
        if let Some(bytes) = config.tap_sndbuf {
            q.set_sndbuf(bytes)?;
        }
        handles.push(TapQueue::open_clone(&q)?);
        ports.push(TapPort::new(q, config.tap_io, config.tap_sndbuf.is_some()));
    }
    let support = handles.first().map(TapQueue::probe).unwrap_or_default();
    Ok((TapControl { handles, support }, ports))
}

#[derive(Debug)]
pub struct TapPort {
    tap: TapQueue,
    /// Batched tx ([`TapIo::Uring`]); None: one writev system call per frame.
    batch: Option<BatchWriter>,
}

impl TapPort {
    /// A port on `tap`, writing guest tx as `io` says (or with system calls, where io_uring
    /// cannot be set up: logged). `pushback`: the TAP has a send-buffer limit, so that a
    /// write may find it full; a batch then stops at such a frame (linked writes), so that it
    /// and the frames after it wait on the ring, in order. Without a limit Linux builds each
    /// frame in place and never says EAGAIN, and the writes go unlinked, which is cheaper.
    pub fn new(tap: TapQueue, io: TapIo, pushback: bool) -> TapPort {
        let batch = match io {
            TapIo::Syscalls => None,
            TapIo::Uring => match BatchWriter::new(tap.as_fd(), pushback) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(error = %e, "io_uring unavailable: TAP tx by system calls");
                    None
                }
            },
        };
        TapPort { tap, batch }
    }
}

impl Port for TapPort {
    /// The kernel's `virtio_net_hdr_to_skb` trusts the header.
    fn checks_tx_headers(&self) -> bool {
        true
    }

    /// Asking whether the TAP is readable or writable is a poll(2).
    fn poll_every(&self) -> u32 {
        8
    }

    fn tx_batch(&self) -> usize {
        match &self.batch {
            Some(_) => vring::memory::MAX_URING_BATCH,
            None => 1,
        }
    }

    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let Some(batch) = self.batch.as_mut() else {
            return send_each(frames, sent, |f| self.tap.write_frame(mem, f));
        };
        let r = batch.send(mem, frames, sent);
        if batch.is_dead() {
            // The frames it did not write go by system calls.
            tracing::warn!("io_uring failed: TAP tx by system calls from now on");
            self.batch = None;
        }
        r
    }

    fn recv(
        &mut self,
        mem: &GuestMemory,
        segs: &[Segment],
        tail: &mut [u8],
    ) -> Result<io::Result<usize>, RingError> {
        self.tap.read_frame(mem, segs, tail)
    }

    fn readable(&self) -> bool {
        virtnet_sys::readable_now(self.tap.as_raw_fd())
    }

    fn writable(&self) -> bool {
        virtnet_sys::writable_now(self.tap.as_raw_fd())
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }
}

/// A TAP's control plane, on duplicates of the pairs' queues (one per pair).
#[derive(Debug)]
pub struct TapControl {
    handles: Vec<TapQueue>,
    support: TapSupport,
}

impl TapControl {
    fn first(&self) -> io::Result<&TapQueue> {
        self.handles
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no TAP queue"))
    }
}

impl Control for TapControl {
    fn offered(&self) -> Features {
        tap_features(self.support)
    }

    fn max_mtu(&self) -> u16 {
        TapQueue::MAX_MTU
    }

    fn mtu(&self) -> io::Result<Option<u16>> {
        self.first()?.mtu().map(Some)
    }

    /// One MTU for the interface, whichever queue sets it.
    fn set_mtu(&self, mtu: u16) -> io::Result<()> {
        self.first()?.set_mtu(mtu)
    }

    /// Every queue takes the negotiated header length and the guest's receive offloads.
    fn configure(&self, features: Features) -> io::Result<()> {
        let offloads = TapOffloads {
            csum: features.contains(feature::GUEST_CSUM),
            tso4: features.contains(feature::GUEST_TSO4),
            tso6: features.contains(feature::GUEST_TSO6),
            ecn: features.contains(feature::GUEST_ECN),
            // The TAP takes USO for both IP versions or neither.
            uso: features.contains(feature::GUEST_USO4 | feature::GUEST_USO6),
        };
        for t in &self.handles {
            t.set_vnet_hdr_len(vnet::hdr_len(features))?;
            t.set_offloads(offloads)?;
        }
        Ok(())
    }

    fn attach(&self, pair: u16, on: bool) -> io::Result<()> {
        match self.handles.get(pair as usize) {
            Some(t) => t.set_attached(on),
            None => Ok(()),
        }
    }

    /// Out of the first pair's queue, which is always in use, with a header of the length
    /// negotiated (10 before any features).
    fn announce(&self, frame: &[u8], features: Features) -> io::Result<bool> {
        let mut buf = vec![0u8; vnet::hdr_len(features)];
        buf.extend_from_slice(frame);
        self.first()?.write(&buf)?;
        Ok(true)
    }

    fn name(&self) -> Option<&str> {
        self.handles.first().map(TapQueue::name)
    }
}
