//! The running switch: its ports and where frames for each go (a guest's rx sinks, or the
//! uplink), the forwarding database, and [`SwitchCore::forward`], the forwarding of one port's
//! batch of frames, run by the worker that took them from the port.
//!
//! Per batch: the port table's read lock, then the FDB's, once; each frame classified from the
//! copy of its first bytes ([`flow::frame`], [`decide`]); the frames grouped by destination
//! port and queue pair (one flow hashes to one pair of its destination), and each group
//! delivered under its sink's lock, once per group; frames for the uplink written into the
//! forwarding worker's own queue of the TAP. Learning that needs the FDB's write lock waits
//! for the end of the decisions, and is done before the frames are delivered.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use vring::Error as RingError;

use super::fdb::{Fdb, FdbConfig, FdbShow, Learn};
use super::flow::{self, Inbound};
use super::forward::{decide, Frame, PortConfig, Ports, Verdict};
use super::port::{PortId, PortSet, MAX_PORTS};
use super::sink::Sink;
use super::tap::UplinkQueue;
use super::tick::Tick;
use super::SwitchError;
use crate::host::Sent;
use crate::shared::Shared;

/// Where frames for a port go.
#[derive(Clone, Debug)]
pub enum Out {
    /// A guest: its device's state, and each queue pair's rx sink.
    Guest {
        shared: Arc<Shared>,
        sinks: Arc<[Arc<Sink>]>,
    },
    /// The uplink: written by the forwarding worker into its own queue of the TAP.
    Uplink,
}

/// The scratch space of a worker's batches, kept for its allocations.
#[derive(Debug, Default)]
pub struct Scratch {
    /// (destination port, queue pair, frame) for each copy of a frame to deliver.
    routes: Vec<(u16, u16, u16)>,
    learns: Vec<Learn>,
    gathers: Vec<usize>,
}

/// The switch's state, shared by its ports' workers.
#[derive(Debug)]
pub struct SwitchCore {
    fdb: Fdb,
    table: RwLock<Table>,
    /// The clock's origin for the FDB's ticks.
    epoch: Instant,
}

#[derive(Debug)]
struct Table {
    ports: Ports,
    outs: Vec<Option<Out>>,
}

impl SwitchCore {
    pub fn new(fdb: FdbConfig) -> Result<SwitchCore, SwitchError> {
        Ok(SwitchCore {
            fdb: Fdb::new(fdb)?,
            table: RwLock::new(Table {
                ports: Ports::new(),
                outs: (0..MAX_PORTS).map(|_| None).collect(),
            }),
            epoch: Instant::now(),
        })
    }

    /// Now, as the FDB counts time.
    pub fn now(&self) -> Tick {
        Tick::since(self.epoch, Instant::now())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Table> {
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Table> {
        self.table.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds port `id`: its configuration (address, port security, learn limit), and where
    /// frames for it go.
    pub fn add_port(&self, id: PortId, config: PortConfig, out: Out) -> Result<(), SwitchError> {
        let now = self.now();
        let mut t = self.write();
        t.ports.add(&self.fdb, id, config, now)?;
        t.outs[id.index()] = Some(out);
        Ok(())
    }

    /// Removes port `id` and its MAC table entries; false if it was not there.
    pub fn remove_port(&self, id: PortId) -> bool {
        let mut t = self.write();
        t.outs[id.index()] = None;
        t.ports.remove(&self.fdb, id)
    }

    /// The ports present.
    pub fn ports(&self) -> PortSet {
        self.read().ports.present()
    }

    /// What `virtnet ctl fdb` shows.
    pub fn fdb_show(&self) -> FdbShow {
        self.fdb.show(self.now())
    }

    /// Ages out the MAC table's entries not seen for its age; returns how many went.
    pub fn age(&self) -> usize {
        self.fdb.age(self.now())
    }

    /// The per-port counters of `id`'s drops, as a snapshot.
    pub fn port_counters(&self, id: PortId) -> Option<super::forward::PortCountersSnapshot> {
        self.read().ports.counters(id).map(|c| c.snapshot())
    }

    /// The MAC table's counters.
    pub fn fdb_counters(&self) -> super::fdb::FdbCountersSnapshot {
        self.fdb.counters().snapshot()
    }

    /// `mac` announced itself on port `id` (a RARP after a migration): its entry moves there
    /// at once.
    pub fn announce(&self, id: PortId, mac: super::mac::Mac) {
        self.fdb.announce(mac, id, self.now());
    }

    /// Forwards `frames`, all from port `from`, and pushes what became of each into `sent`
    /// (dropped by the decision, or taken: a destination that has no room counts its own
    /// drops). Frames for the uplink go into `uplink`, the forwarding worker's queue of the
    /// TAP. A guest error (a segment outside the sender's memory) is returned, after the
    /// outcomes of the frames before it.
    pub fn forward(
        &self,
        from: PortId,
        frames: &[Inbound<'_>],
        uplink: Option<&Mutex<UplinkQueue>>,
        scratch: &mut Scratch,
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        let now = self.now();
        let table = self.read();
        let Scratch {
            routes,
            learns,
            gathers,
        } = scratch;
        routes.clear();
        learns.clear();
        // Whether `routes` is in order as pushed (frames in order; a repeated route keeps it
        // so): then the sort before delivery is skipped.
        let mut sorted = true;
        {
            let fdb = self.fdb.read();
            // The last frame forwarded from a source known on this port, where it went, and
            // its one route when that does not hang on the frame's flow: a batch is mostly one
            // flow or a few, and under the same locks and tick a frame with the same addresses
            // gets the same decision (drops and refused sources are decided each time, for
            // their counters).
            let mut last: Option<(Frame, PortSet)> = None;
            let mut route: Option<(u16, u16)> = None;
            for (k, f) in frames.iter().enumerate() {
                let Some(frame) = flow::frame(f.pieces.prefix) else {
                    // Shorter than an Ethernet header: nothing to switch on.
                    sent.push(Sent::Dropped);
                    continue;
                };
                if let (Some((seen, _)), Some((port, pair))) = (last, route) {
                    if seen == frame {
                        sent.push(Sent::Taken);
                        routes.push((port, pair, k as u16));
                        continue;
                    }
                }
                let to = match last {
                    Some((seen, to)) if seen == frame => to,
                    _ => {
                        route = None;
                        let d = decide(&table.ports, &fdb, from, frame, now);
                        learns.extend(d.learn);
                        match d.verdict {
                            Verdict::Forward(to) => {
                                // Reused only when the source is known here: its learning
                                // just refreshed it, and counted nothing.
                                let known = fdb.lookup(frame.src) == Some(from);
                                last = (d.learn.is_none() && known).then_some((frame, to));
                                to
                            }
                            Verdict::Drop(_) => {
                                sent.push(Sent::Dropped);
                                continue;
                            }
                        }
                    }
                };
                sent.push(Sent::Taken);
                let mut hash = None;
                for p in to.iter() {
                    let pair = match &table.outs[p.index()] {
                        Some(Out::Guest { shared, sinks }) if sinks.len() > 1 => {
                            let active = shared.active_pairs().clamp(1, sinks.len() as u16);
                            let h = *hash.get_or_insert_with(|| flow::hash(f.pieces.prefix));
                            (h % active as u32) as u16
                        }
                        _ => 0,
                    };
                    let r = (p.index() as u16, pair, k as u16);
                    sorted &= routes.last().is_none_or(|l| *l < r);
                    routes.push(r);
                }
                if last.is_some() && hash.is_none() && to.len() == 1 {
                    // One port, one pair whatever the flow: the same frames go there too.
                    route = routes.last().map(|&(port, pair, _)| (port, pair));
                }
            }
        }
        // Learned before any frame is delivered, as a bridge does: a receiver that answers
        // at once finds its correspondent's address known.
        for l in learns.drain(..) {
            self.fdb.learn(l, now);
        }
        if !sorted {
            routes.sort_unstable();
        }
        for run in routes.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            let (port, pair) = (run[0].0 as usize, run[0].1 as usize);
            match &table.outs[port] {
                Some(Out::Guest { shared, sinks }) => {
                    let frames = run.iter().map(|&(_, _, k)| &frames[k as usize].pieces);
                    sinks[pair].deliver(shared, frames);
                }
                Some(Out::Uplink) => {
                    if let Some(q) = uplink {
                        gathers.clear();
                        gathers.extend(run.iter().map(|&(_, _, k)| k as usize));
                        let q = &mut *q.lock().unwrap_or_else(PoisonError::into_inner);
                        q.send(frames, gathers)?;
                    }
                }
                None => {}
            }
        }
        drop(table);
        Ok(())
    }
}
