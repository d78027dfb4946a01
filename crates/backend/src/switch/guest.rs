//! A guest's queue pair as a port of the switch. Its tx frames are forwarded by the pair's own
//! worker: each frame's header and first bytes ([`super::flow::PREFIX`]) copied once, in one
//! read, by the tx path (which checks the header's copy: [`Port::tx_prefix`]), classified from
//! the copy, and delivered from the copy and the sender's memory into each destination's
//! buffers. Its rx queue is not the pair's own rx path: the port adopts it into the pair's
//! [`Sink`], into which any worker forwards.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrayvec::ArrayVec;
use vnet::{NetHdr, HDR_LEN};
use vring::{Error as RingError, Gather, GuestMemory};

use super::core::{Scratch, SwitchCore};
use super::flow::{Inbound, PREFIX};
use super::port::PortId;
use super::sink::Sink;
use super::tap::UplinkQueue;
use crate::host::{Port, Sent};
use crate::queue::QueueRuntime;
use crate::rx::Pieces;

/// Frames a guest's tx turn hands the switch at once, at most.
pub const BATCH: usize = 64;

/// A guest pair of port `id`, on the worker whose uplink queue is `uplink`.
pub struct GuestPort {
    id: PortId,
    core: Arc<SwitchCore>,
    sink: Arc<Sink>,
    uplink: Option<Arc<Mutex<UplinkQueue>>>,
    scratch: Scratch,
}

impl std::fmt::Debug for GuestPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestPort").field("id", &self.id).finish()
    }
}

impl GuestPort {
    pub fn new(
        id: PortId,
        core: Arc<SwitchCore>,
        sink: Arc<Sink>,
        uplink: Option<Arc<Mutex<UplinkQueue>>>,
    ) -> GuestPort {
        GuestPort {
            id,
            core,
            sink,
            uplink,
            scratch: Scratch::default(),
        }
    }
}

impl Port for GuestPort {
    fn checks_tx_headers(&self) -> bool {
        // Another guest, or the uplink's kernel, gets the header: checked once, the copy used.
        true
    }

    fn tx_batch(&self) -> usize {
        BATCH
    }

    fn tx_prefix(&self) -> usize {
        PREFIX
    }

    /// Forwards `frames` (at most [`BATCH`]): each frame's header and first bytes, read in
    /// one piece and checked by the tx path (`tx_prefix`), are laid out as the uplink's TAP
    /// takes them.
    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let frames = &frames[..frames.len().min(BATCH)];
        let mut inbound = ArrayVec::<Inbound<'_>, BATCH>::new();
        for g in frames {
            // At least HDR_LEN bytes (the tx path's copy, for a port with a prefix), parsed in
            // place.
            let (hdr, prefix) = g
                .head
                .split_first_chunk::<HDR_LEN>()
                .unwrap_or((&[0; HDR_LEN], &[]));
            inbound.push(Inbound {
                pieces: Pieces {
                    hdr: NetHdr::from_bytes(hdr),
                    prefix,
                    rest: (!g.body.is_empty()).then_some((mem, g.body)),
                },
                tap_head: g.head,
            });
        }
        let uplink = self.uplink.as_deref();
        self.core
            .forward(self.id, &inbound, uplink, &mut self.scratch, sent)
    }

    fn adopts_rx(&self) -> bool {
        true
    }

    fn adopt_rx(&mut self, q: QueueRuntime) -> Option<QueueRuntime> {
        self.sink.start(q)
    }

    fn release_rx(&mut self) -> Option<QueueRuntime> {
        self.sink.stop()
    }

    fn next_call_deadline(&self) -> Option<Instant> {
        self.sink.next_call_deadline()
    }

    fn fire_due_calls(&mut self, now: Instant) {
        self.sink.fire_due_calls(now);
    }

    fn readable(&self) -> bool {
        false
    }

    fn fd(&self) -> Option<RawFd> {
        None
    }
}
