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
use crate::rx::Pieces;
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
        if n > 0 {
            forward_read(
                &self.core,
                self.id,
                Some(&self.queue),
                &self.counters,
                (&self.arena, &self.spans),
                &mut self.scratch,
                &mut self.sent,
            );
        }
        n
    }

    fn readable(&self) -> bool {
        virtnet_sys::readable_now(self.tap.as_raw_fd())
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.tap.as_raw_fd())
    }
}

/// Forwards a batch the uplink read from the TAP, from its port `id` of `core`: frame `k` is
/// `arena[at..at + n]` for `spans[k] = (at, n)` (at most [`BATCH`] of them), its 12-byte
/// virtio-net header (the kernel's, trusted) then the frame, which has no rest. Counted in
/// `counters.into`: the frames forwarded and their bytes; those the decision dropped, and
/// those shorter than a header, as dropped. `queue` is the worker's queue of the TAP, which
/// the forwarding step takes, though a frame from the host never goes back out of it.
pub(crate) fn forward_read(
    core: &SwitchCore,
    id: PortId,
    queue: Option<&Mutex<UplinkQueue>>,
    counters: &UplinkCounters,
    (arena, spans): (&[u8], &[(usize, usize)]),
    scratch: &mut Scratch,
    sent: &mut Vec<Sent>,
) {
    let mut frames: [Inbound<'_>; BATCH] = std::array::from_fn(|_| Inbound::default());
    let mut len = 0;
    for &(at, n) in spans {
        if n < vnet::HDR_LEN {
            continue;
        }
        let b = &arena[at..at + n];
        let mut hdr = [0u8; vnet::HDR_LEN];
        hdr.copy_from_slice(&b[..vnet::HDR_LEN]);
        frames[len] = Inbound {
            pieces: Pieces {
                hdr: NetHdr::from_bytes(&hdr),
                prefix: &b[vnet::HDR_LEN..],
                rest: None,
            },
            tap_head: &[],
        };
        len += 1;
    }
    let frames = &frames[..len];
    sent.clear();
    // Frames from the host never go back out of the uplink (not a hairpin port), and have no
    // rest in guest memory: the forwarding step has no guest error to return.
    let _ = core.forward(id, frames, queue, scratch, sent);
    let (mut packets, mut bytes) = (0u64, 0u64);
    for (f, s) in frames.iter().zip(sent.iter()) {
        if *s == Sent::Taken {
            packets += 1;
            bytes += f.pieces.prefix.len() as u64;
        }
    }
    // Bytes of the frames forwarded only, as `packets` counts them.
    let c = &counters.into;
    c.packets.add(packets);
    c.bytes.add(bytes);
    c.dropped.add(spans.len() as u64 - packets);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::switch::core::Out;
    use crate::switch::{FdbConfig, Mac, PortConfig};

    fn frame(dst: [u8; 6], src: [u8; 6], len: usize) -> Vec<u8> {
        let mut f = vec![0u8; vnet::HDR_LEN];
        f.extend(dst);
        f.extend(src);
        f.extend(0x0800u16.to_be_bytes());
        f.resize(vnet::HDR_LEN + len, 0x5a);
        f
    }

    #[test]
    fn a_batch_from_the_host_is_forwarded_learned_from_and_counted() {
        let core = SwitchCore::new(FdbConfig::default()).unwrap();
        let (uplink, other) = (PortId::new(0).unwrap(), PortId::new(1).unwrap());
        core.add_port(uplink, PortConfig::uplink(4), Out::Uplink)
            .unwrap();
        // A second port that writes nowhere (no TAP queue is passed): a destination.
        core.add_port(other, PortConfig::uplink(4), Out::Uplink)
            .unwrap();
        let host = [2, 0, 0, 0, 0, 1];
        let reads = [
            // Shorter than a header; a header and 13 bytes (no ethertype); a broadcast; one
            // from a multicast source.
            vec![0; 5],
            vec![0; vnet::HDR_LEN + 13],
            frame([0xff; 6], host, 60),
            frame([0xff; 6], [1, 0, 0x5e, 0, 0, 1], 60),
        ];
        let (mut arena, mut spans) = (Vec::new(), Vec::new());
        for r in &reads {
            spans.push((arena.len(), r.len()));
            arena.extend(r);
            arena.resize(arena.len().next_multiple_of(64), 0);
        }
        let counters = UplinkCounters::default();
        let mut sent = Vec::new();
        let mut scratch = Scratch::default();
        let batch = (&arena[..], &spans[..]);
        forward_read(
            &core,
            uplink,
            None,
            &counters,
            batch,
            &mut scratch,
            &mut sent,
        );
        assert_eq!(sent, [Sent::Dropped, Sent::Taken, Sent::Dropped]);
        let c = counters.into.snapshot();
        assert_eq!((c.packets, c.bytes, c.dropped), (1, 60, 3));
        let learned = core.fdb_show().entries;
        assert!(learned
            .iter()
            .any(|e| e.mac == Mac::new(host) && e.port == uplink));
    }
}
