//! The switch's uplink TAP: its queues opened (a multi-queue TAP, one queue per worker, as a
//! Linux bridge's port to the host), and the writing side: frames the switch sends out of it
//! are written by the forwarding worker into its own queue ([`UplinkQueue`]).
//!
//! The TAP carries 12-byte virtio-net headers (IFF_VNET_HDR) and takes the offloads a guest
//! may send (checksum, TSO, USO): super-frames go out whole, and the kernel hands super-frames
//! in (read by [`super::uplink`]).

use std::io;
use std::sync::Arc;

use vring::Error as RingError;

use super::flow::{tap_gather, Inbound};
use crate::host::is_pushback;
use crate::metrics::QueueCounters;
use virtnet_sys::tap::{TapOffloads, TapQueue};

/// The uplink's traffic, both ways.
#[derive(Debug, Default)]
pub struct UplinkCounters {
    /// Frames the switch sent out of the TAP (`packets`, `bytes`), and those the TAP
    /// refused (`dropped`: its send buffer full, or a frame it does not take).
    pub out: QueueCounters,
    /// Frames read from the TAP and forwarded (`packets`, `bytes`); `dropped`, those the
    /// switch dropped (no destination, or too short to switch).
    pub into: QueueCounters,
}

/// Opens `queues` queues of the TAP `name` for the switch's uplink, each with 12-byte headers
/// and the offloads guests may send.
pub fn open(name: &str, queues: usize) -> io::Result<Vec<TapQueue>> {
    let mut out = Vec::new();
    for _ in 0..queues {
        let q = TapQueue::open(name)?;
        q.set_vnet_hdr_len(vnet::HDR_LEN)?;
        let uso = q.probe().uso;
        q.set_offloads(TapOffloads {
            csum: true,
            tso4: true,
            tso6: true,
            ecn: true,
            uso,
        })?;
        out.push(q);
    }
    Ok(out)
}

/// One worker's queue of the uplink TAP, for the frames its ports send out.
#[derive(Debug)]
pub struct UplinkQueue {
    tap: TapQueue,
    counters: Arc<UplinkCounters>,
}

impl UplinkQueue {
    pub fn new(tap: TapQueue, counters: Arc<UplinkCounters>) -> UplinkQueue {
        UplinkQueue { tap, counters }
    }

    /// Writes frames `which` of `frames` into the TAP, one writev each: the header and first
    /// bytes from the copy, the rest from the sender's memory. A frame the TAP does not take
    /// is dropped and counted (the sender's tx ring does not wait for the uplink: one slow
    /// destination must not hold up the others). A segment outside the sender's memory is the
    /// sender's error.
    pub fn send(&mut self, frames: &[Inbound<'_>], which: &[usize]) -> Result<(), RingError> {
        let c = &self.counters.out;
        for &k in which {
            let f = &frames[k];
            let written = match f.pieces.rest {
                Some((mem, _)) => self.tap.write_frame(mem, tap_gather(f))?,
                None => self.tap.write(f.tap_head),
            };
            match written {
                Ok(n) => {
                    c.packets.add(1);
                    c.bytes.add(n.saturating_sub(vnet::HDR_LEN) as u64);
                }
                Err(e) => {
                    if is_pushback(&e) {
                        c.host_pushback.add(1);
                    }
                    c.dropped.add(1);
                }
            }
        }
        Ok(())
    }
}
