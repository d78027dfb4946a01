//! A guest's queue pair as a port of the switch. Its tx frames (headers checked once by the
//! tx path) are forwarded by the pair's own worker: each frame's header and first bytes copied
//! once ([`super::flow::PREFIX`]), classified from the copy, and delivered from the copy and the
//! sender's memory into each destination's buffers. Its rx queue is not the pair's own rx
//! path: the port adopts it into the pair's [`Sink`], into which any worker forwards.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use vnet::{NetHdr, HDR_LEN};
use vring::{Error as RingError, Gather, GuestMemory, Reader};

use super::core::{Scratch, SwitchCore};
use super::flow::{Inbound, PREFIX};
use super::port::PortId;
use super::sink::Sink;
use super::tap::UplinkQueue;
use crate::host::{Port, Sent};
use crate::queue::QueueRuntime;

/// Frames a guest's tx turn hands the switch at once, at most.
pub const BATCH: usize = 64;

/// Bytes kept of each frame of a batch: the header as the uplink's TAP takes it (12 bytes,
/// `num_buffers` zero), then up to [`PREFIX`] bytes of the frame.
const HEAD: usize = HDR_LEN + PREFIX;

/// A guest pair of port `id`, on the worker whose uplink queue is `uplink`.
pub struct GuestPort {
    id: PortId,
    core: Arc<SwitchCore>,
    sink: Arc<Sink>,
    uplink: Option<Arc<Mutex<UplinkQueue>>>,
    heads: Box<[[u8; HEAD]; BATCH]>,
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
            heads: Box::new([[0; HEAD]; BATCH]),
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

    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let frames = &frames[..frames.len().min(BATCH)];
        let GuestPort {
            id,
            core,
            uplink,
            heads,
            scratch,
            ..
        } = self;
        // Copy each frame's header and first bytes; a segment outside the sender's memory
        // ends the batch there, with the error.
        let mut lens = [0usize; BATCH];
        let mut rests = [vring::Tail::default(); BATCH];
        let mut failed = None;
        for (k, g) in frames.iter().enumerate() {
            let head = &mut heads[k];
            head[..HDR_LEN].fill(0);
            let n = g.head.len().min(HDR_LEN - 2);
            head[..n].copy_from_slice(&g.head[..n]);
            let mut r = Reader::from_tail(mem, g.body);
            let take = r.remaining().min(PREFIX as u64) as usize;
            if let Err(e) = r.read_exact(&mut head[HDR_LEN..HDR_LEN + take]) {
                failed = Some((k, e));
                break;
            }
            lens[k] = HDR_LEN + take;
            rests[k] = r.tail();
        }
        let good = failed.as_ref().map_or(frames.len(), |&(k, _)| k);
        let inbound: [Inbound<'_>; BATCH] = std::array::from_fn(|k| {
            if k >= good {
                return Inbound::default();
            }
            let head = &heads[k][..lens[k]];
            let mut hdr = [0u8; HDR_LEN];
            hdr.copy_from_slice(&head[..HDR_LEN]);
            Inbound {
                hdr: NetHdr::from_bytes(&hdr),
                tap_head: head,
                prefix: &head[HDR_LEN..],
                rest: (!rests[k].is_empty()).then_some((mem, rests[k])),
            }
        });
        let uplink = uplink.as_deref();
        core.forward(*id, &inbound[..good], uplink, scratch, sent)?;
        match failed {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
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
