//! The forwarding database (FDB), the switch's MAC learning table: on which port each MAC
//! address was last seen as a source, so that a frame to it goes to that port alone instead
//! of being flooded. The rules are a Linux bridge's (IEEE 802.1D 7.8, 7.9), with the bounds
//! of OVS's and VPP's tables:
//!
//! - **Learning**: a frame's valid source (unicast, not zero) is learned on the port that sent
//!   it, or refreshed there.
//! - **Static entries**: each port's own MAC, added with the port and removed with it; never
//!   aged, never moved by learning. Learning a MAC that is another port's own is refused.
//! - **Aging**: [`Fdb::age`] drops learned entries not seen for [`FdbConfig::age`] (300 s, a
//!   Linux bridge's `ageing_time`). Nothing else removes them: the caller runs it about once
//!   a second, so an entry lives between `age` and `age` plus that period.
//! - **Moves**: a learned MAC seen on another port moves there (a VM migrated, a host
//!   re-cabled), once it has been quiet on its port for [`FdbConfig::move_hold`] (1 s); until
//!   then it stays and the frame is forwarded without learning. The hold keeps a MAC seen on
//!   two ports at once (a loop, a broadcast reflected back) from flapping at frame rate, each
//!   flap a write lock that stalls every worker. An announcement (RARP or gratuitous ARP, as
//!   QEMU and the guest send after a migration; the caller recognises them) moves the MAC at
//!   once ([`Learn::announce`]). OVS locks an entry for a few seconds after a gratuitous ARP
//!   for the same reason.
//! - **Limits**: each port learns at most its `learn_limit` MACs (its own MAC aside). At its
//!   limit a port learns nothing new until its entries age out; none of its entries is
//!   evicted and no other port's is (as a Linux bridge port's `max_learned` and VPP's learn
//!   limit; OVS evicts instead). Eviction would let a guest sending from random sources churn
//!   its own good entries away, would need a per-port LRU order kept up to date at frame rate,
//!   and gains nothing: a MAC not learned is flooded, so its frames still arrive. A MAC that
//!   moves to a port at its limit is dropped from its old port and not learned: flooded, not
//!   sent to where it no longer is.
//! - **Memory**: the FDB's `capacity` is fixed when it is made, and the table's slots
//!   allocated then (`table.rs`). A port reserves its limit plus one (its MAC) when added, and
//!   a port is refused when the reservations would exceed the capacity. So every port can
//!   always learn up to its limit, whatever the others do, and the table never holds more than
//!   its capacity.
//!
//! **Concurrency.** Several workers forward at once; each looks up destinations and learns
//! sources. The table sits behind a std `RwLock`. A worker takes the read lock once per batch
//! of frames ([`Fdb::read`]) and, for each frame, looks up the destination and tries to learn
//! the source under it ([`FdbRead::try_learn`]): a MAC already known on the same port, by far
//! the common case, only updates its last-seen time, an atomic; refusals (the limit, a held
//! move, a static MAC) change nothing either. Only a new MAC or a move needs the write lock:
//! the worker does those after the batch, with the read lock released ([`Fdb::learn`]), which
//! decides again under the write lock. std's `RwLock` on Linux (futex-based) lets no new
//! reader in while a writer waits, so learning is not starved by busy readers. Aging finds
//! expired entries under the read lock and takes the write lock only to remove them.
//!
//! A per-worker cache of the last destination would save the hash and probe (one multiply,
//! one or two adjacent slots), but would have to be invalidated on every move, removal and
//! aging (a generation counter, one more shared cache line read per frame); without a
//! measurement showing the lookup matters, there is none.
//!
//! Lock order: a caller that holds its port table's lock takes the FDB's after it
//! (`forward.rs`); the FDB never calls out while holding its own.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use serde::Serialize;

use super::error::SwitchError;
use super::mac::Mac;
use super::port::{PortId, MAX_PORTS};
use super::table::{MacTable, MAX_CAPACITY};
use super::tick::{millis, Tick};

/// How an FDB is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FdbConfig {
    /// The most entries, static and learned: what the ports' reservations share. At most
    /// 2^20.
    pub capacity: usize,
    /// How long a learned entry lives without its MAC being seen.
    pub age: Duration,
    /// How long a learned entry must have been quiet on its port before learning moves it
    /// elsewhere (announcements move it at once).
    pub move_hold: Duration,
}

impl Default for FdbConfig {
    /// 16384 entries (OVS's default is 8192 for a whole bridge), 300 s, 1 s.
    fn default() -> FdbConfig {
        FdbConfig {
            capacity: 16384,
            age: Duration::from_secs(300),
            move_hold: Duration::from_secs(1),
        }
    }
}

vnet::counters! {
    /// What learning and aging did, over all ports. Bumped by any worker (a locked add), on
    /// a cache line of their own so that a port hammering them (a guest at its limit sending
    /// from random sources) does not slow the lock word the other workers take.
    #[repr(align(128))]
    pub struct FdbCounters / FdbCountersSnapshot of SharedCounter {
        /// MACs learned: new entries.
        learned,
        /// Entries moved to another port (learning after the hold, an announcement, or a
        /// port added with a MAC learned elsewhere as its own).
        moved,
        /// Learned entries removed by aging.
        aged,
        /// MACs not learned because their port was at its learn limit.
        refused,
        /// Moves not made because the entry was seen on its port within the move hold.
        held,
        /// MACs not learned because they are another port's own.
        static_conflicts,
    }
}

/// A source address to learn: a frame's, which the forwarding decision passes on when it
/// needs the write lock, or an announcement's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learn {
    pub mac: Mac,
    pub port: PortId,
    /// A RARP or gratuitous ARP from `port` for `mac`: moves it without the hold.
    pub announce: bool,
}

/// What learning did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Known on this port already: its last-seen time updated.
    Refreshed,
    New,
    Moved {
        from: PortId,
    },
    Refused(Refusal),
}

/// Why a MAC was not learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Multicast or zero: no frame comes from it.
    InvalidSource,
    /// The port is not in the FDB.
    NoSuchPort,
    /// It is `owner`'s own MAC.
    Static { owner: PortId },
    /// Learned on `on`, which saw it within the move hold.
    Held { on: PortId },
    /// The port is at its learn limit. Had the MAC been learned on another port, that
    /// entry is gone.
    Limit,
}

#[derive(Debug)]
struct PortState {
    own: Option<Mac>,
    learn_limit: usize,
    learned: usize,
}

impl PortState {
    /// Entries reserved for the port.
    fn reserved(&self) -> usize {
        self.learn_limit + usize::from(self.own.is_some())
    }
}

/// The state behind the lock.
#[derive(Debug)]
struct Inner {
    table: MacTable,
    ports: Vec<Option<PortState>>,
    reserved: usize,
}

/// What learning a MAC takes, decided under either lock.
enum Plan {
    Touch(usize),
    Refuse(Refusal),
    Insert,
    Move {
        slot: usize,
        from: PortId,
    },
    /// Moving to a port at its limit: the old entry goes, nothing is learned.
    Evict {
        slot: usize,
        from: PortId,
    },
}

impl Inner {
    fn port(&self, p: PortId) -> Option<&PortState> {
        self.ports[p.index()].as_ref()
    }

    fn port_mut(&mut self, p: PortId) -> &mut PortState {
        self.ports[p.index()]
            .as_mut()
            .expect("a port with FDB entries is in the FDB")
    }

    fn plan(&self, req: Learn, now: Tick, hold_ms: u64) -> Plan {
        if !req.mac.is_valid_source() {
            return Plan::Refuse(Refusal::InvalidSource);
        }
        let Some(port) = self.port(req.port) else {
            return Plan::Refuse(Refusal::NoSuchPort);
        };
        let full = port.learned >= port.learn_limit;
        let Some(slot) = self.table.find(req.mac) else {
            return if full {
                Plan::Refuse(Refusal::Limit)
            } else {
                Plan::Insert
            };
        };
        let e = self.table.entry(slot);
        if e.port == req.port {
            Plan::Touch(slot)
        } else if e.is_static {
            Plan::Refuse(Refusal::Static { owner: e.port })
        } else if !req.announce && now.elapsed_since(e.last_seen) < hold_ms {
            Plan::Refuse(Refusal::Held { on: e.port })
        } else if full {
            Plan::Evict { slot, from: e.port }
        } else {
            Plan::Move { slot, from: e.port }
        }
    }
}

/// The MAC learning table. See the module documentation for its rules.
#[derive(Debug)]
pub struct Fdb {
    inner: RwLock<Inner>,
    age_ms: u64,
    hold_ms: u64,
    counters: FdbCounters,
}

/// The FDB read-locked, for a batch of frames: lookups, and the learning that changes nothing
/// but last-seen times. Drop it before [`Fdb::learn`] (the same thread taking the write lock
/// while holding the read lock would deadlock).
#[derive(Debug)]
pub struct FdbRead<'a> {
    inner: RwLockReadGuard<'a, Inner>,
    fdb: &'a Fdb,
}

impl FdbRead<'_> {
    /// The port `mac` was learned on, or is the own MAC of.
    #[inline]
    pub fn lookup(&self, mac: Mac) -> Option<PortId> {
        self.inner.table.find(mac).map(|i| self.inner.table.port(i))
    }

    /// Learns `req` if that needs no write: refreshes a MAC known on the same port, or
    /// refuses one (and counts the refusal). None when it takes the write lock (a new MAC, a
    /// move): call [`Fdb::learn`] once this guard is dropped.
    #[inline]
    pub fn try_learn(&self, req: Learn, now: Tick) -> Option<Learned> {
        match self.inner.plan(req, now, self.fdb.hold_ms) {
            Plan::Touch(slot) => {
                self.inner.table.touch(slot, now.millis());
                Some(Learned::Refreshed)
            }
            Plan::Refuse(why) => Some(self.fdb.refused(why)),
            Plan::Insert | Plan::Move { .. } | Plan::Evict { .. } => None,
        }
    }
}

impl Fdb {
    pub fn new(config: FdbConfig) -> Result<Fdb, SwitchError> {
        if config.capacity > MAX_CAPACITY {
            return Err(SwitchError::Capacity {
                capacity: config.capacity,
                max: MAX_CAPACITY,
            });
        }
        Ok(Fdb {
            inner: RwLock::new(Inner {
                table: MacTable::new(config.capacity),
                ports: (0..MAX_PORTS).map(|_| None).collect(),
                reserved: 0,
            }),
            age_ms: millis(config.age),
            hold_ms: millis(config.move_hold),
            counters: FdbCounters::default(),
        })
    }

    // A panic under the lock cannot leave the table half-changed (nothing in it panics on a
    // peer's input), so a poisoned lock is taken as it is rather than spreading the panic to
    // every worker.
    fn read_inner(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_inner(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The read lock, for a batch of frames.
    pub fn read(&self) -> FdbRead<'_> {
        FdbRead {
            inner: self.read_inner(),
            fdb: self,
        }
    }

    /// Entries in the table, static and learned.
    pub fn len(&self) -> usize {
        self.read_inner().table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn counters(&self) -> &FdbCounters {
        &self.counters
    }

    fn refused(&self, why: Refusal) -> Learned {
        match why {
            Refusal::Limit => self.counters.refused.add(1),
            Refusal::Held { .. } => self.counters.held.add(1),
            Refusal::Static { .. } => self.counters.static_conflicts.add(1),
            Refusal::InvalidSource | Refusal::NoSuchPort => {}
        }
        Learned::Refused(why)
    }

    /// Learns `req` (a new MAC, a move, or anything [`FdbRead::try_learn`] does), deciding
    /// again under the write lock, which it takes only when something changes. Never call it
    /// while this thread holds an [`FdbRead`].
    pub fn learn(&self, req: Learn, now: Tick) -> Learned {
        if let Some(done) = self.read().try_learn(req, now) {
            return done;
        }
        let mut inner = self.write_inner();
        match inner.plan(req, now, self.hold_ms) {
            Plan::Touch(slot) => {
                inner.table.touch(slot, now.millis());
                Learned::Refreshed
            }
            Plan::Refuse(why) => self.refused(why),
            Plan::Insert => {
                // The port's reservation guarantees the room.
                if !inner.table.insert(req.mac, req.port, false, now.millis()) {
                    return self.refused(Refusal::Limit);
                }
                inner.port_mut(req.port).learned += 1;
                self.counters.learned.add(1);
                Learned::New
            }
            Plan::Move { slot, from } => {
                inner.table.set_port(slot, req.port, now.millis());
                inner.port_mut(from).learned -= 1;
                inner.port_mut(req.port).learned += 1;
                self.counters.moved.add(1);
                Learned::Moved { from }
            }
            Plan::Evict { slot, from } => {
                inner.table.remove(slot);
                inner.port_mut(from).learned -= 1;
                self.refused(Refusal::Limit)
            }
        }
    }

    /// A RARP or gratuitous ARP for `mac` from `port`: learns it, moving it at once.
    pub fn announce(&self, mac: Mac, port: PortId, now: Tick) -> Learned {
        let req = Learn {
            mac,
            port,
            announce: true,
        };
        self.learn(req, now)
    }

    /// Adds `port`, with `own` as its static entry, reserving `learn_limit` entries for what
    /// it learns. A MAC learned elsewhere becomes the port's own (a VM migrated here); one that
    /// is another port's own is refused. Through `Ports::add`, which keeps the port table and
    /// the FDB in step.
    pub(super) fn add_port(
        &self,
        port: PortId,
        own: Option<Mac>,
        learn_limit: usize,
        now: Tick,
    ) -> Result<(), SwitchError> {
        if let Some(mac) = own.filter(|m| !m.is_valid_source()) {
            return Err(SwitchError::InvalidMac { port, mac });
        }
        let mut inner = self.write_inner();
        if inner.port(port).is_some() {
            return Err(SwitchError::PortExists { port });
        }
        let state = PortState {
            own,
            learn_limit,
            learned: 0,
        };
        let free = inner.table.capacity() - inner.reserved;
        if state.reserved() > free {
            let need = state.reserved();
            return Err(SwitchError::NoRoom { port, need, free });
        }
        if let Some(mac) = own {
            if let Some(slot) = inner.table.find(mac) {
                let e = inner.table.entry(slot);
                if e.is_static {
                    let owner = e.port;
                    return Err(SwitchError::MacInUse { port, mac, owner });
                }
                inner.table.remove(slot);
                inner.port_mut(e.port).learned -= 1;
                self.counters.moved.add(1);
            }
        }
        inner.reserved += state.reserved();
        inner.ports[port.index()] = Some(state);
        if let Some(mac) = own {
            let added = inner.table.insert(mac, port, true, now.millis());
            debug_assert!(added, "the reservation holds the own MAC");
        }
        Ok(())
    }

    /// Removes `port` and every entry on it, its own MAC's included. False if it was not in
    /// the FDB.
    pub(super) fn remove_port(&self, port: PortId) -> bool {
        let mut inner = self.write_inner();
        let Some(state) = inner.ports[port.index()].take() else {
            return false;
        };
        inner.reserved -= state.reserved();
        let gone: Vec<Mac> = inner
            .table
            .iter()
            .filter(|e| e.port == port)
            .map(|e| e.mac)
            .collect();
        for mac in gone {
            if let Some(slot) = inner.table.find(mac) {
                inner.table.remove(slot);
            }
        }
        true
    }

    /// Removes the learned entries not seen for the configured age; returns how many.
    pub fn age(&self, now: Tick) -> usize {
        let expired = |last_seen: u64| now.elapsed_since(last_seen) >= self.age_ms;
        // Found under the read lock, so the workers stall only if there is something to remove.
        let stale: Vec<Mac> = self
            .read_inner()
            .table
            .iter()
            .filter(|e| !e.is_static && expired(e.last_seen))
            .map(|e| e.mac)
            .collect();
        if stale.is_empty() {
            return 0;
        }
        let mut inner = self.write_inner();
        let mut n = 0;
        for mac in stale {
            // Seen again, moved or removed since the scan: decided again here.
            let Some(slot) = inner.table.find(mac) else {
                continue;
            };
            let e = inner.table.entry(slot);
            if !e.is_static && expired(e.last_seen) {
                inner.table.remove(slot);
                inner.port_mut(e.port).learned -= 1;
                n += 1;
            }
        }
        self.counters.aged.add(n as u64);
        n
    }

    /// The table for `virtnet ctl fdb`, entries by port then MAC.
    pub fn show(&self, now: Tick) -> FdbShow {
        let inner = self.read_inner();
        let mut entries: Vec<FdbEntry> = inner
            .table
            .iter()
            .map(|e| FdbEntry {
                port: e.port,
                mac: e.mac,
                kind: if e.is_static {
                    EntryKind::Static
                } else {
                    EntryKind::Learned
                },
                age_ms: now.elapsed_since(e.last_seen),
            })
            .collect();
        entries.sort_by_key(|e| (e.port, e.mac));
        let ports = (0..MAX_PORTS)
            .filter_map(|n| {
                let port = PortId::new(n)?;
                let s = inner.port(port)?;
                Some(FdbPort {
                    port,
                    own: s.own,
                    learned: s.learned,
                    learn_limit: s.learn_limit,
                })
            })
            .collect();
        FdbShow {
            entries,
            ports,
            capacity: inner.table.capacity(),
            reserved: inner.reserved,
            slots: inner.table.slot_count(),
            age_ms: self.age_ms,
            move_hold_ms: self.hold_ms,
            counters: self.counters.snapshot(),
        }
    }
}

/// Whether an entry is a port's own MAC or learned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    Static,
    Learned,
}

/// One FDB entry, as `virtnet ctl fdb` shows it (OVS's `fdb/show`: port, MAC, age).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FdbEntry {
    pub port: PortId,
    pub mac: Mac,
    pub kind: EntryKind,
    /// Since the MAC was last seen on the port (since the port was added, for an own MAC
    /// never seen).
    pub age_ms: u64,
}

/// One port's share of the FDB.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FdbPort {
    pub port: PortId,
    pub own: Option<Mac>,
    pub learned: usize,
    pub learn_limit: usize,
}

/// The whole FDB, for `virtnet ctl fdb`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FdbShow {
    pub entries: Vec<FdbEntry>,
    pub ports: Vec<FdbPort>,
    /// Entries the FDB holds at most, and those the ports have reserved.
    pub capacity: usize,
    pub reserved: usize,
    /// The table's slots, allocated when the FDB was made (24 bytes each): its memory.
    pub slots: usize,
    pub age_ms: u64,
    pub move_hold_ms: u64,
    pub counters: FdbCountersSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGE: Duration = Duration::from_secs(300);
    const HOLD: Duration = Duration::from_secs(1);

    fn fdb(capacity: usize) -> Fdb {
        Fdb::new(FdbConfig {
            capacity,
            age: AGE,
            move_hold: HOLD,
        })
        .unwrap()
    }

    fn p(n: usize) -> PortId {
        PortId::new(n).unwrap()
    }

    fn mac(n: u64) -> Mac {
        // Locally administered unicast: 02:00:..
        Mac::from_u64(0x02 | n << 8)
    }

    fn at(ms: u64) -> Tick {
        Tick::from_millis(ms)
    }

    fn req(m: Mac, port: PortId) -> Learn {
        Learn {
            mac: m,
            port,
            announce: false,
        }
    }

    fn add(f: &Fdb, port: usize, own: Option<Mac>, limit: usize) {
        f.add_port(p(port), own, limit, at(0)).unwrap();
    }

    fn port_of(f: &Fdb, m: Mac) -> Option<PortId> {
        f.read().lookup(m)
    }

    fn learned_on(f: &Fdb, port: usize) -> usize {
        f.show(at(0))
            .ports
            .iter()
            .find(|s| s.port == p(port))
            .map_or(0, |s| s.learned)
    }

    /// xorshift64, for sources a guest makes up.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn learns_new_sources_and_refreshes_known_ones() {
        let f = fdb(64);
        add(&f, 1, None, 8);
        assert_eq!(port_of(&f, mac(1)), None);
        assert_eq!(f.learn(req(mac(1), p(1)), at(5)), Learned::New);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        assert_eq!(f.learn(req(mac(1), p(1)), at(9)), Learned::Refreshed);
        assert_eq!(f.show(at(10)).entries[0].age_ms, 1);
        let c = f.counters().snapshot();
        assert_eq!((c.learned, c.moved, c.refused), (1, 0, 0));
        assert_eq!((f.len(), learned_on(&f, 1)), (1, 1));
    }

    #[test]
    fn invalid_sources_and_unknown_ports_are_never_learned() {
        let f = fdb(64);
        add(&f, 1, None, 8);
        let group = Mac::new([0x01, 0, 0x5e, 0, 0, 1]);
        for m in [group, Mac::BROADCAST, Mac::ZERO] {
            let r = Learned::Refused(Refusal::InvalidSource);
            assert_eq!(f.learn(req(m, p(1)), at(0)), r);
        }
        let r = Learned::Refused(Refusal::NoSuchPort);
        assert_eq!(f.learn(req(mac(1), p(2)), at(0)), r);
        assert!(f.is_empty());
        assert_eq!(f.counters().snapshot(), FdbCountersSnapshot::default());
    }

    #[test]
    fn learned_entries_age_out_after_the_configured_age_from_when_last_seen() {
        let f = fdb(64);
        add(&f, 1, None, 8);
        f.learn(req(mac(1), p(1)), at(0));
        f.learn(req(mac(2), p(1)), at(0));
        // mac(2) seen again 100 s later: its age restarts.
        f.learn(req(mac(2), p(1)), at(100_000));
        let age = 300_000;
        assert_eq!(f.age(at(age - 1)), 0);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        assert_eq!(f.age(at(age)), 1);
        assert_eq!(
            (port_of(&f, mac(1)), port_of(&f, mac(2))),
            (None, Some(p(1)))
        );
        assert_eq!(f.age(at(100_000 + age)), 1);
        assert!(f.is_empty());
        assert_eq!(f.counters().snapshot().aged, 2);
        assert_eq!(learned_on(&f, 1), 0);
    }

    #[test]
    fn static_entries_never_age_and_never_move() {
        let f = fdb(64);
        add(&f, 1, Some(mac(1)), 0);
        add(&f, 2, None, 8);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        assert_eq!(f.age(at(10 * 300_000)), 0);
        let owner = p(1);
        let refused = Learned::Refused(Refusal::Static { owner });
        // Long after the port last sent, by learning or by announcement.
        assert_eq!(f.learn(req(mac(1), p(2)), at(1_000_000)), refused);
        assert_eq!(f.announce(mac(1), p(2), at(1_000_000)), refused);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        // Its own port refreshes it, as learning would.
        assert_eq!(f.learn(req(mac(1), p(1)), at(5)), Learned::Refreshed);
        let e = &f.show(at(5)).entries[0];
        assert_eq!((e.kind, e.age_ms), (EntryKind::Static, 0));
        assert_eq!(f.counters().snapshot().static_conflicts, 2);
    }

    #[test]
    fn a_mac_seen_elsewhere_moves_once_quiet_on_its_port_for_the_hold() {
        let f = fdb(64);
        add(&f, 1, None, 8);
        add(&f, 2, None, 8);
        f.learn(req(mac(1), p(1)), at(10_000));
        // Within the hold of its last frame on port 1: it stays.
        let held = Learned::Refused(Refusal::Held { on: p(1) });
        assert_eq!(f.learn(req(mac(1), p(2)), at(10_999)), held);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        // Seen on port 1 again: the hold restarts.
        f.learn(req(mac(1), p(1)), at(10_500));
        assert_eq!(f.learn(req(mac(1), p(2)), at(11_499)), held);
        // Quiet on port 1 for the hold: it moves.
        let moved = Learned::Moved { from: p(1) };
        assert_eq!(f.learn(req(mac(1), p(2)), at(11_500)), moved);
        assert_eq!(port_of(&f, mac(1)), Some(p(2)));
        assert_eq!((learned_on(&f, 1), learned_on(&f, 2)), (0, 1));
        let c = f.counters().snapshot();
        assert_eq!((c.learned, c.moved, c.held), (1, 1, 2));
        // And back only after the hold again.
        assert_eq!(
            f.learn(req(mac(1), p(1)), at(11_600)),
            Learned::Refused(Refusal::Held { on: p(2) })
        );
    }

    #[test]
    fn rarp_or_gratuitous_arp_moves_a_mac_at_once() {
        let f = fdb(64);
        add(&f, 1, None, 8);
        add(&f, 2, None, 8);
        f.learn(req(mac(1), p(1)), at(10_000));
        let moved = Learned::Moved { from: p(1) };
        assert_eq!(f.announce(mac(1), p(2), at(10_001)), moved);
        assert_eq!(port_of(&f, mac(1)), Some(p(2)));
        // A copy of the broadcast reflected back from port 1 does not move it back.
        let held = Learned::Refused(Refusal::Held { on: p(2) });
        assert_eq!(f.learn(req(mac(1), p(1)), at(10_002)), held);
        // An announcement of a MAC never seen is learned like any.
        assert_eq!(f.announce(mac(2), p(2), at(10_003)), Learned::New);
        assert_eq!(f.counters().snapshot().moved, 1);
    }

    #[test]
    fn a_port_at_its_limit_learns_nothing_new_until_its_entries_age() {
        let f = fdb(64);
        add(&f, 1, Some(mac(100)), 2);
        f.learn(req(mac(1), p(1)), at(0));
        f.learn(req(mac(2), p(1)), at(1_000));
        let limit = Learned::Refused(Refusal::Limit);
        assert_eq!(f.learn(req(mac(3), p(1)), at(2_000)), limit);
        // Its known entries stay, and refresh.
        assert_eq!(f.learn(req(mac(1), p(1)), at(2_000)), Learned::Refreshed);
        assert_eq!(f.len(), 3, "its own MAC and two learned");
        assert_eq!(f.counters().snapshot().refused, 1);
        // mac(2) ages out (mac(1) was refreshed): room for one more.
        assert_eq!(f.age(at(301_000)), 1);
        assert_eq!(f.learn(req(mac(3), p(1)), at(301_000)), Learned::New);
        assert_eq!(f.learn(req(mac(4), p(1)), at(301_000)), limit);
    }

    /// A guest sending from a million made-up sources keeps to its own reservation: the other
    /// ports' entries stay, and so does the memory.
    #[test]
    fn a_flooding_port_evicts_no_other_port_and_memory_stays_bounded() {
        let f = fdb(64);
        add(&f, 0, None, 16); // the uplink
        add(&f, 1, Some(mac(1)), 0);
        add(&f, 2, Some(mac(2)), 8); // spoof-check off: learns
        for n in 0..16 {
            assert_eq!(f.learn(req(mac(1000 + n), p(0)), at(0)), Learned::New);
        }
        let before = f.show(at(0)).entries;
        let slots = f.show(at(0)).slots;
        let mut state = 0x1234_5678_9abc_def1;
        let n = 1_000_000;
        for i in 0..n {
            let m = Mac::from_u64(rng(&mut state) & !1 | 2); // unicast, not zero
            f.learn(req(m, p(2)), at(i / 1000));
        }
        let after = f.show(at(0));
        let flooder = |e: &&FdbEntry| e.port == p(2) && e.kind == EntryKind::Learned;
        let others: Vec<_> = after.entries.iter().filter(|e| !flooder(e)).collect();
        assert_eq!(others, before.iter().collect::<Vec<_>>());
        assert_eq!(learned_on(&f, 2), 8);
        assert_eq!(f.len(), 16 + 2 + 8);
        assert!(f.len() <= after.capacity);
        assert_eq!(after.slots, slots);
        assert_eq!(f.counters().snapshot().refused, n - 8);
    }

    #[test]
    fn a_move_to_a_port_at_its_limit_drops_the_old_entry() {
        let f = fdb(64);
        add(&f, 1, None, 4);
        add(&f, 2, None, 1);
        f.learn(req(mac(1), p(1)), at(0));
        f.learn(req(mac(2), p(2)), at(0));
        let limit = Learned::Refused(Refusal::Limit);
        assert_eq!(f.learn(req(mac(1), p(2)), at(5_000)), limit);
        // Not on port 1 any more (where it is not), not on port 2: flooded until learned.
        assert_eq!(port_of(&f, mac(1)), None);
        assert_eq!((learned_on(&f, 1), learned_on(&f, 2)), (0, 1));
        assert_eq!(f.counters().snapshot().refused, 1);
    }

    #[test]
    fn ports_reserve_their_entries_within_the_capacity() {
        let f = fdb(10);
        add(&f, 1, Some(mac(1)), 4); // 5
        add(&f, 2, None, 4); // 9
        let err = f.add_port(p(3), Some(mac(3)), 1, at(0));
        assert_eq!(
            err,
            Err(SwitchError::NoRoom {
                port: p(3),
                need: 2,
                free: 1
            })
        );
        add(&f, 3, None, 1);
        assert_eq!(f.show(at(0)).reserved, 10);
        assert!(f.remove_port(p(1)));
        assert!(!f.remove_port(p(1)));
        add(&f, 4, Some(mac(4)), 4);
        assert_eq!(
            f.add_port(p(4), None, 0, at(0)),
            Err(SwitchError::PortExists { port: p(4) })
        );
        assert_eq!(
            Fdb::new(FdbConfig {
                capacity: MAX_CAPACITY + 1,
                ..FdbConfig::default()
            })
            .err(),
            Some(SwitchError::Capacity {
                capacity: MAX_CAPACITY + 1,
                max: MAX_CAPACITY
            })
        );
    }

    #[test]
    fn a_port_takes_its_mac_from_learning_but_not_from_another_port() {
        let f = fdb(64);
        add(&f, 0, None, 8);
        f.learn(req(mac(1), p(0)), at(0));
        // A VM migrated here: its MAC, learned on the uplink, becomes port 1's own.
        add(&f, 1, Some(mac(1)), 0);
        assert_eq!(port_of(&f, mac(1)), Some(p(1)));
        assert_eq!(learned_on(&f, 0), 0);
        assert_eq!(f.show(at(0)).entries[0].kind, EntryKind::Static);
        assert_eq!(f.counters().snapshot().moved, 1);
        assert_eq!(
            f.add_port(p(2), Some(mac(1)), 0, at(0)),
            Err(SwitchError::MacInUse {
                port: p(2),
                mac: mac(1),
                owner: p(1)
            })
        );
        let group = Mac::BROADCAST;
        assert_eq!(
            f.add_port(p(2), Some(group), 0, at(0)),
            Err(SwitchError::InvalidMac {
                port: p(2),
                mac: group
            })
        );
        assert_eq!(f.show(at(0)).reserved, 8 + 1);
    }

    #[test]
    fn removing_a_port_removes_its_entries_its_own_mac_included() {
        let f = fdb(64);
        add(&f, 1, Some(mac(1)), 8);
        add(&f, 2, None, 8);
        for n in 10..15 {
            f.learn(req(mac(n), p(1)), at(0));
        }
        f.learn(req(mac(20), p(2)), at(0));
        assert!(f.remove_port(p(1)));
        assert_eq!(f.len(), 1);
        assert_eq!(port_of(&f, mac(1)), None);
        assert_eq!(port_of(&f, mac(20)), Some(p(2)));
        // Its MAC is free again, for learning or for another port.
        assert_eq!(f.learn(req(mac(1), p(2)), at(0)), Learned::New);
    }

    #[test]
    fn under_the_read_lock_only_refreshes_and_refusals_happen() {
        let f = fdb(64);
        add(&f, 1, None, 1);
        add(&f, 2, None, 8);
        f.learn(req(mac(1), p(1)), at(0));
        {
            let r = f.read();
            assert_eq!(
                r.try_learn(req(mac(1), p(1)), at(7)),
                Some(Learned::Refreshed)
            );
            // New, a move, a move to a full port: the write lock's.
            assert_eq!(r.try_learn(req(mac(2), p(2)), at(7)), None);
            assert_eq!(r.try_learn(req(mac(1), p(2)), at(2_000)), None);
            assert_eq!(
                r.try_learn(req(mac(3), p(1)), at(7)),
                Some(Learned::Refused(Refusal::Limit))
            );
            assert_eq!(r.lookup(mac(2)), None);
        }
        assert_eq!(f.show(at(7)).entries[0].age_ms, 0);
        assert_eq!(f.learn(req(mac(2), p(2)), at(7)), Learned::New);
    }

    #[test]
    fn show_lists_entries_by_port_then_mac_with_kind_and_age() {
        let f = fdb(64);
        add(&f, 3, Some(Mac::new([0x52, 0x54, 0, 0, 0, 3])), 0);
        add(&f, 0, None, 8);
        f.learn(req(mac(9), p(0)), at(1_000));
        f.learn(req(mac(8), p(0)), at(2_000));
        let s = f.show(at(4_000));
        let rows: Vec<(u16, String, EntryKind, u64)> = s
            .entries
            .iter()
            .map(|e| (e.port.index() as u16, e.mac.to_string(), e.kind, e.age_ms))
            .collect();
        assert_eq!(
            rows,
            [
                (0, "02:08:00:00:00:00".into(), EntryKind::Learned, 2_000),
                (0, "02:09:00:00:00:00".into(), EntryKind::Learned, 3_000),
                (3, "52:54:00:00:00:03".into(), EntryKind::Static, 4_000),
            ]
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json["entries"][2],
            serde_json::json!({"port": 3, "mac": "52:54:00:00:00:03", "kind": "static", "age_ms": 4000})
        );
        assert_eq!(json["ports"][0]["learned"], 2);
        assert_eq!(json["counters"]["learned"], 2);
        assert_eq!(
            (json["capacity"].as_u64(), json["age_ms"].as_u64()),
            (Some(64), Some(300_000))
        );
    }

    /// Workers learning and looking up at once, with aging beside them: nothing deadlocks or
    /// panics, and the table stays consistent whatever the interleaving.
    #[test]
    fn workers_learn_and_look_up_concurrently() {
        let f = Fdb::new(FdbConfig {
            capacity: 4 * 64 + 4,
            age: Duration::from_millis(50),
            move_hold: Duration::from_millis(5),
        })
        .unwrap();
        for port in 0..4 {
            add(&f, port, Some(mac(900 + port as u64)), 64);
        }
        std::thread::scope(|s| {
            for port in 0..4usize {
                let f = &f;
                s.spawn(move || {
                    let mut state = 0x9e37_79b9 + port as u64;
                    for round in 0..200u64 {
                        let mut pending = Vec::new();
                        {
                            let r = f.read();
                            for _ in 0..32 {
                                let m = mac(rng(&mut state) % 128);
                                let l = req(m, p(port));
                                if r.try_learn(l, at(round * 10)).is_none() {
                                    pending.push(l);
                                }
                                let _ = r.lookup(mac(rng(&mut state) % 128));
                            }
                        }
                        for l in pending {
                            f.learn(l, at(round * 10));
                        }
                    }
                });
            }
            s.spawn(|| {
                for round in 0..50 {
                    f.age(at(round * 40));
                }
            });
        });
        let show = f.show(at(0));
        let learned: usize = show.ports.iter().map(|s| s.learned).sum();
        assert_eq!(f.len(), learned + 4);
        assert!(show.ports.iter().all(|s| s.learned <= s.learn_limit));
        // Everything learned ages out; the own MACs stay.
        f.age(at(1_000_000));
        assert_eq!(f.len(), 4);
        assert!(f.show(at(0)).ports.iter().all(|s| s.learned == 0));
        let c = f.counters().snapshot();
        assert!(c.learned >= c.aged && c.learned > 0);
    }
}
