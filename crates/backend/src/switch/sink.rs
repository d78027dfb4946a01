//! A guest's rx queue of one pair as the switch delivers into it: whichever worker forwards a
//! frame for the guest locks the sink, puts the frame in, and calls the guest.
//!
//! A frame goes in as the guest can take it (`vnet::gso::delivery`): as sent, its virtio-net
//! header passed on, when the guest negotiated the offloads the header uses; otherwise copied
//! whole into the sink's scratch buffer, its checksum finished and a super-frame segmented in
//! software, byte for byte as Linux's GSO would, each segment delivered on its own. A frame the
//! guest's ring has no room for is dropped and counted (`rx_missed`), never waited for: a
//! guest that does not post buffers costs the sender nothing but the drop. One longer than the
//! guest's MTU (a frame that is not a super-frame) is dropped and counted (`dropped`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;
use vnet::gso::{self, Delivery as Offloads};
use vnet::{NetHdr, HDR_GSO_NONE};
use vring::{GuestMemory, Reader, Tail};

use crate::queue::{notify, QueueRuntime};
use crate::rx::{Delivery, Pieces, RxPath};
use crate::shared::Shared;

/// The largest frame the switch carries: a 64 KiB super-frame and its headers.
const MAX_FRAME: usize = crate::host::MAX_RX_FRAME;

/// One frame on its way to a sink: its virtio-net header, its first bytes (a copy of the
/// sender's, or the uplink's frame whole), and the rest in the sender's memory.
#[derive(Clone, Copy, Debug)]
pub struct Outbound<'a> {
    pub hdr: NetHdr,
    pub prefix: &'a [u8],
    pub rest: Option<(&'a GuestMemory, Tail<'a>)>,
}

impl Outbound<'_> {
    fn len(&self) -> usize {
        self.prefix.len() + self.rest.map_or(0, |(_, t)| t.len() as usize)
    }
}

/// What became of the frames handed to a sink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    /// Frames (segments of a super-frame counting one each) in the guest's buffers.
    pub frames: usize,
    /// Frames dropped: no room, too long, or refused by the guest's receive filter.
    pub dropped: usize,
}

/// A guest pair's rx queue, behind its lock, and the worker that owns the pair.
#[derive(Debug)]
pub struct Sink {
    state: Mutex<State>,
    /// The pair's own worker: woken when a call is held back, to send it when it is due.
    owner: EventFd,
    /// A call is held on the queue (the owner has a deadline to keep).
    held: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    path: RxPath,
    /// A frame copied whole, for its checksum to be finished or to be segmented.
    scratch: Vec<u8>,
}

impl Sink {
    /// A sink whose pair's worker is woken through `owner`.
    pub fn new(owner: EventFd) -> Sink {
        Sink {
            state: Mutex::default(),
            owner,
            held: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock is a bug, not a state the queue cannot go on from.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes over the rx queue the frontend (re)started; returns the one it replaces.
    pub fn start(&self, q: QueueRuntime) -> Option<QueueRuntime> {
        self.lock().path.start(q)
    }

    /// Gives back the rx queue, stopped.
    pub fn stop(&self) -> Option<QueueRuntime> {
        self.held.store(false, Relaxed);
        self.lock().path.stop()
    }

    /// When the call held on the queue is due, if one is.
    pub fn next_call_deadline(&self) -> Option<Instant> {
        if !self.held.load(Relaxed) {
            return None;
        }
        self.lock()
            .path
            .queue()
            .and_then(QueueRuntime::call_deadline)
    }

    /// Sends the held call if its time has come.
    pub fn fire_due_calls(&self, now: Instant) {
        if !self.held.load(Relaxed) {
            return;
        }
        let mut state = self.lock();
        if let Some(q) = state.path.queue_mut() {
            q.fire_if_due(now);
            if q.call_deadline().is_some() {
                return;
            }
        }
        self.held.store(false, Relaxed);
    }

    /// Delivers `frames` into the guest of device `shared`, then calls it as it asked.
    pub fn deliver<'a>(
        &self,
        shared: &Shared,
        frames: impl IntoIterator<Item = Outbound<'a>>,
    ) -> Delivered {
        let mut state = self.lock();
        let State { path, scratch } = &mut *state;
        let mut done = Delivered::default();
        if path.usable().is_none() {
            // No queue running (or it broke): nowhere to put them.
            done.dropped = frames.into_iter().count();
            return done;
        }
        let mut bytes = 0u64;
        for f in frames {
            match deliver_one(path, shared, scratch, f) {
                Ok(n) => {
                    done.frames += n.frames;
                    done.dropped += n.dropped;
                    if n.frames > 0 {
                        bytes += f.len() as u64;
                    }
                }
                Err(e) => {
                    path.fail(e);
                    done.dropped += 1;
                    break;
                }
            }
        }
        let Some(q) = path.queue_mut() else {
            return done;
        };
        let c = q.counters();
        c.packets.add(done.frames as u64);
        c.bytes.add(bytes);
        if done.frames > 0 && q.usable() {
            notify(q);
            if q.call_deadline().is_some() && !self.held.swap(true, Relaxed) {
                // A non-blocking eventfd: a write fails only when the worker is awake anyway.
                let _ = self.owner.write(1);
            }
        }
        done
    }
}

/// Puts `f` into `path`'s queue as its guest can take it (see the module's docs).
fn deliver_one(
    path: &mut RxPath,
    shared: &Shared,
    scratch: &mut Vec<u8>,
    f: Outbound<'_>,
) -> Result<Delivered, vring::Error> {
    let Some(q) = path.queue() else {
        return Ok(Delivered {
            frames: 0,
            dropped: 1,
        });
    };
    let features = q.features();
    let longest = 14 + 4 + shared.mtu() as usize;
    let counters = q.counters().clone();
    let dropped = |c: &crate::metrics::QueueCounters| {
        c.dropped.add(1);
        Delivered {
            frames: 0,
            dropped: 1,
        }
    };
    match gso::delivery(&f.hdr, f.prefix, features) {
        Offloads::AsSent => {
            if f.hdr.gso_type == HDR_GSO_NONE && f.len() > longest {
                return Ok(dropped(&counters));
            }
            let pieces = Pieces {
                hdr: f.hdr,
                prefix: f.prefix,
                rest: f.rest.map(|(mem, t)| Reader::from_tail(mem, t)),
            };
            Ok(outcome(path.deliver_pieces(shared, pieces)?, &counters))
        }
        Offloads::Resolve(csum) => {
            // Copied whole: the checksum and the segments are computed over our copy.
            let len = f.len();
            if len > MAX_FRAME {
                return Ok(dropped(&counters));
            }
            scratch.clear();
            scratch.extend_from_slice(f.prefix);
            scratch.resize(len, 0);
            if let Some((mem, t)) = f.rest {
                Reader::from_tail(mem, t).read_exact(&mut scratch[f.prefix.len()..])?;
            }
            if f.hdr.gso_type == HDR_GSO_NONE {
                let Ok(hdr) = gso::complete_csum(&f.hdr, scratch) else {
                    return Ok(dropped(&counters));
                };
                if len > longest {
                    return Ok(dropped(&counters));
                }
                let pieces = Pieces {
                    hdr,
                    prefix: scratch,
                    rest: None,
                };
                return Ok(outcome(path.deliver_pieces(shared, pieces)?, &counters));
            }
            let Ok(mut segments) = gso::segment(&f.hdr, scratch, csum) else {
                return Ok(dropped(&counters));
            };
            let mut done = Delivered::default();
            while let Some((hdr, bytes)) = segments.next_segment() {
                if bytes.len() > longest {
                    done.dropped += 1;
                    counters.dropped.add(1);
                    continue;
                }
                let pieces = Pieces {
                    hdr,
                    prefix: bytes,
                    rest: None,
                };
                let n = outcome(path.deliver_pieces(shared, pieces)?, &counters);
                done.frames += n.frames;
                done.dropped += n.dropped;
                if n.dropped > 0 {
                    // No room for this one: none for the rest either.
                    break;
                }
            }
            Ok(done)
        }
    }
}

/// Counts what [`RxPath::deliver_pieces`] said of a frame.
fn outcome(d: Delivery, counters: &crate::metrics::QueueCounters) -> Delivered {
    match d {
        Delivery::Delivered => Delivered {
            frames: 1,
            dropped: 0,
        },
        // Counted by the rx path (filtered, or too large for every buffer).
        Delivery::Dropped => Delivered {
            frames: 0,
            dropped: 1,
        },
        Delivery::NoRoom => {
            counters.rx_missed.add(1);
            Delivered {
                frames: 0,
                dropped: 1,
            }
        }
    }
}
