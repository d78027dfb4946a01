//! A guest's rx queue of one pair as the switch delivers into it: whichever worker forwards
//! frames for the guest locks the sink, puts them in, and calls the guest.
//!
//! A frame goes in as the guest can take it (`vnet::gso::delivery`): as sent, its virtio-net
//! header passed on, when the guest negotiated the offloads the header uses (those go in
//! chunks, [`RxPath::deliver_pieces`]: the chunk's buffers popped and prefetched, then the
//! frames copied); otherwise copied whole into the sink's scratch buffer, its checksum
//! finished and a super-frame segmented in software, byte for byte as Linux's GSO would, each
//! segment delivered on its own. A frame the guest's ring has no room for is dropped and
//! counted (`rx_missed`), never waited for, and so are the frames after it in its chunk, and
//! every frame for a queue that broke or stopped: a guest that does not post buffers costs the
//! sender nothing but the drop. One longer than the guest's MTU (a frame that is not a
//! super-frame) is dropped and counted (`dropped`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use arrayvec::ArrayVec;
use vmm_sys_util::eventfd::EventFd;
use vnet::gso::{self, Delivery as Offloads};
use vnet::{NetHdr, HDR_GSO_NONE};
use vring::Reader;

use crate::metrics::QueueCounters;
use crate::queue::{notify, QueueRuntime};
use crate::rx::{Delivery, Pieces, RxPath};
use crate::shared::Shared;

/// The largest frame the switch carries: a 64 KiB super-frame and its headers.
const MAX_FRAME: usize = crate::host::MAX_RX_FRAME;

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
    /// The queue's counters (kept once it stops, for the frames it then misses), held here
    /// rather than cloned per frame: a locked reference count update would wait for the
    /// frame's stores into the guest to drain.
    counters: Option<Arc<QueueCounters>>,
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
    ///
    /// The queue's notifications go off for good, as DPDK's vhost PMD turns them off: a sink
    /// never waits for buffers (a frame with no room is dropped), so a kick after each refill
    /// would tell it nothing, and a polling driver without EVENT_IDX (DPDK's virtio-user)
    /// would pay a system call for each (an eighth of testpmd's CPU as a guest of the switch).
    /// With EVENT_IDX the sink never moves `avail_event`, with the same effect.
    pub fn start(&self, mut q: QueueRuntime) -> Option<QueueRuntime> {
        q.disable_notification();
        let mut state = self.lock();
        state.counters = Some(q.counters().clone());
        state.path.start(q)
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
    pub fn deliver<'a: 'b, 'b>(
        &self,
        shared: &Shared,
        frames: impl IntoIterator<Item = &'b Pieces<'a>>,
    ) -> Delivered {
        let mut frames = frames.into_iter();
        let mut state = self.lock();
        let State {
            path,
            scratch,
            counters,
        } = &mut *state;
        let nowhere = |frames: usize| Delivered {
            frames: 0,
            dropped: frames,
        };
        let Some(counters) = counters.as_deref() else {
            // The guest never started the queue: nowhere to put them, nor to count them.
            return nowhere(frames.count());
        };
        let Some(q) = path.usable() else {
            // The queue broke, or stopped: missed, as by a NIC whose ring is down.
            let n = frames.count();
            counters.rx_missed.add(n as u64);
            return nowhere(n);
        };
        let mut filling = Filling {
            features: q.features(),
            longest: 14 + 4 + shared.mtu() as usize,
            path,
            shared,
            counters,
            done: Delivered::default(),
            bytes: 0,
        };
        let mut batch = ArrayVec::<&Pieces<'_>, CHUNK>::new();
        // On a ring error, the frames it cost: those of the batch and the one being resolved.
        let failed = loop {
            let Some(f) = frames.next() else {
                break filling.flush(&batch).err().map(|e| (e, batch.len()));
            };
            match gso::delivery(&f.hdr, f.prefix, filling.features) {
                Offloads::AsSent => {
                    if f.hdr.gso_type == HDR_GSO_NONE && f.frame_len() > filling.longest as u64 {
                        filling.drop_one();
                        continue;
                    }
                    batch.push(f);
                    if batch.is_full() {
                        if let Err(e) = filling.flush(&batch) {
                            break Some((e, batch.len()));
                        }
                        batch.clear();
                    }
                }
                Offloads::Resolve(csum) => {
                    if let Err(e) = filling.flush(&batch) {
                        break Some((e, batch.len() + 1));
                    }
                    batch.clear();
                    if let Err(e) = filling.resolve(scratch, *f, csum) {
                        break Some((e, 1));
                    }
                }
            }
        };
        let (mut done, bytes) = (filling.done, filling.bytes);
        if let Some((e, lost)) = failed {
            // The frames of the failed chunk (in buffers the guest may never see) and the
            // rest are missed, as any later ones are.
            path.fail(e);
            let missed = lost + frames.count();
            counters.rx_missed.add(missed as u64);
            done.dropped += missed;
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

/// Frames put into one sink's queue at once, at most: a guest's tx batch.
const CHUNK: usize = 64;

/// One [`Sink::deliver`]: the queue, what its guest takes, and what became of the frames.
struct Filling<'p, 's> {
    path: &'p mut RxPath,
    shared: &'s Shared,
    counters: &'s QueueCounters,
    features: vring::Features,
    /// The longest frame (not a super-frame) the guest's MTU admits.
    longest: usize,
    done: Delivered,
    bytes: u64,
}

impl Filling<'_, '_> {
    /// Puts `frames`, each as sent, into the queue; says how many found no room.
    fn flush(&mut self, frames: &[&Pieces<'_>]) -> Result<usize, vring::Error> {
        let mut missed = 0;
        if frames.is_empty() {
            return Ok(missed);
        }
        let mut outs = [Delivery::NoRoom; CHUNK];
        let outs = &mut outs[..frames.len()];
        self.path.deliver_pieces(self.shared, frames, outs)?;
        for (f, o) in frames.iter().zip(outs.iter()) {
            match o {
                Delivery::Delivered => {
                    self.done.frames += 1;
                    self.bytes += f.frame_len();
                }
                // Counted by the rx path (filtered, or too large for every buffer).
                Delivery::Dropped => self.done.dropped += 1,
                Delivery::NoRoom => {
                    self.counters.rx_missed.add(1);
                    self.done.dropped += 1;
                    missed += 1;
                }
            }
        }
        Ok(missed)
    }

    /// Counts a frame the guest cannot take.
    fn drop_one(&mut self) {
        self.counters.dropped.add(1);
        self.done.dropped += 1;
    }

    /// Puts `f` into the queue as its guest can take it: copied whole into `scratch`, its
    /// checksum finished, a super-frame segmented (see the module's docs).
    fn resolve(
        &mut self,
        scratch: &mut Vec<u8>,
        f: Pieces<'_>,
        csum: gso::Csum,
    ) -> Result<(), vring::Error> {
        let len = f.frame_len() as usize;
        if len > MAX_FRAME {
            self.drop_one();
            return Ok(());
        }
        scratch.clear();
        scratch.extend_from_slice(f.prefix);
        scratch.resize(len, 0);
        if let Some((mem, t)) = f.rest {
            Reader::from_tail(mem, t).read_exact(&mut scratch[f.prefix.len()..])?;
        }
        if f.hdr.gso_type == HDR_GSO_NONE {
            match gso::complete_csum(&f.hdr, scratch) {
                Ok(hdr) if len <= self.longest => {
                    self.flush(&[&whole(hdr, scratch)])?;
                    return Ok(());
                }
                _ => {
                    self.drop_one();
                    return Ok(());
                }
            }
        }
        let Ok(mut segments) = gso::segment(&f.hdr, scratch, csum) else {
            self.drop_one();
            return Ok(());
        };
        while let Some((hdr, bytes)) = segments.next_segment() {
            if bytes.len() > self.longest {
                self.drop_one();
                continue;
            }
            if self.flush(&[&whole(hdr, bytes)])? > 0 {
                // No room for this one: none for the rest either.
                break;
            }
        }
        Ok(())
    }
}

/// A frame of ours, whole, as the sink delivers it.
fn whole(hdr: NetHdr, frame: &[u8]) -> Pieces<'_> {
    Pieces {
        hdr,
        prefix: frame,
        rest: None,
    }
}
