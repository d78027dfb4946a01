//! The switch's uplink, its reading side: frames the host sends in are read by each worker's
//! [`UplinkPort`] from the worker's queue of the TAP and forwarded to the guests they are for
//! (which get super-frames as they can take them: `Sink`). Its writing side and the TAP's
//! queues are in [`super::tap`].

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};

use vnet::NetHdr;
use vring::{Error as RingError, GuestMemory};

use super::core::{Scratch, SwitchCore};
use super::flow::Inbound;
use super::port::PortId;
use super::tap::{UplinkCounters, UplinkQueue};
use crate::host::{Port, Sent, MAX_RX_FRAME};
use virtnet_sys::tap::TapQueue;

/// Frames read from the TAP and forwarded at once, at most.
const BATCH: usize = 64;

/// The bytes the uplink reads a batch into: room for [`BATCH`] frames, a 64 KiB super-frame
/// always fitting after the last one.
const ARENA: usize = 4 * MAX_RX_FRAME;

/// The uplink as a worker serves it: a port with no guest queues, whose host frames the
/// worker forwards ([`Port::forward`]).
pub struct UplinkPort {
    id: PortId,
    tap: TapQueue,
    core: Arc<SwitchCore>,
    /// The worker's queue of the TAP: a frame from the host is never sent back out of it,
    /// but the forwarding step takes one.
    queue: Arc<Mutex<UplinkQueue>>,
    counters: Arc<UplinkCounters>,
    arena: Vec<u8>,
    /// Where each frame of the batch is in the arena.
    spans: Vec<(usize, usize)>,
    scratch: Scratch,
    sent: Vec<Sent>,
}

impl std::fmt::Debug for UplinkPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UplinkPort").field("id", &self.id).finish()
    }
}

impl UplinkPort {
    /// Port `id` of `core`, reading from `tap` (a queue of the uplink, the one the worker
    /// also writes through `queue`).
    pub fn new(
        id: PortId,
        tap: TapQueue,
        core: Arc<SwitchCore>,
        queue: Arc<Mutex<UplinkQueue>>,
        counters: Arc<UplinkCounters>,
    ) -> UplinkPort {
        UplinkPort {
            id,
            tap,
            core,
            queue,
            counters,
            arena: vec![0; ARENA],
            spans: Vec::with_capacity(BATCH),
            scratch: Scratch::default(),
            sent: Vec::with_capacity(BATCH),
        }
    }

    /// Reads up to `budget` frames (at most a batch) into the arena; returns how many.
    fn read_batch(&mut self, budget: usize) -> usize {
        self.spans.clear();
        let mut at = 0;
        while self.spans.len() < budget.min(BATCH) && ARENA - at >= MAX_RX_FRAME {
            match self.tap.read(&mut self.arena[at..at + MAX_RX_FRAME]) {
                Ok(n) => {
                    self.spans.push((at, n));
                    // Each frame starts 64-byte aligned: the copies out of it are faster.
                    at = (at + n).next_multiple_of(64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // The TAP is gone (deleted), or its queue detached: the worker stops
                    // watching it on the fd's error.
                    break;
                }
            }
        }
        self.spans.len()
    }
}

impl Port for UplinkPort {
    fn send(
        &mut self,
        _mem: &GuestMemory,
        _frames: &[vring::Gather<'_>],
        _sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        // No guest queues: nothing is ever sent to it.
        Ok(())
    }

    fn poll_every(&self) -> u32 {
        8
    }

    fn forwards(&self) -> bool {
        true
    }

    fn forward(&mut self, budget: usize) -> usize {
        let n = self.read_batch(budget);
        if n == 0 {
            return 0;
        }
        let arena = &self.arena;
        let mut frames: [Inbound<'_>; BATCH] = std::array::from_fn(|_| Inbound::default());
        let mut len = 0;
        let mut bytes = 0u64;
        for &(at, n) in &self.spans {
            if n < vnet::HDR_LEN {
                continue;
            }
            let b = &arena[at..at + n];
            let mut hdr = [0u8; vnet::HDR_LEN];
            hdr.copy_from_slice(&b[..vnet::HDR_LEN]);
            frames[len] = Inbound {
                hdr: NetHdr::from_bytes(&hdr),
                tap_head: &[],
                prefix: &b[vnet::HDR_LEN..],
                rest: None,
            };
            bytes += (n - vnet::HDR_LEN) as u64;
            len += 1;
        }
        self.sent.clear();
        // Frames from the host never go back out of the uplink (not a hairpin port), and
        // have no rest in guest memory: the forwarding step has no guest error to return.
        let _ = self.core.forward(
            self.id,
            &frames[..len],
            Some(&self.queue),
            &mut self.scratch,
            &mut self.sent,
        );
        let c = &self.counters.into;
        let dropped = self.sent.iter().filter(|s| **s != Sent::Taken).count();
        c.packets.add((len - dropped) as u64);
        c.bytes.add(bytes);
        c.dropped.add((dropped + n - len) as u64);
        n
    }

    fn readable(&self) -> bool {
        virtnet_sys::readable_now(self.tap.as_raw_fd())
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }
}
