//! The FDB's storage: a hash table from MAC to (port, static or learned, last seen) whose
//! slots are allocated once, when the FDB is made, and never grow. `fdb.rs` decides what goes
//! in; this file only stores it.
//!
//! Open addressing with linear probing over a power-of-two slot array at most half full (the
//! FDB never holds more than `capacity` entries, and there are at least twice as many slots),
//! so a hit costs 1.5 probes on average and a miss 2.5, on adjacent slots. A removal shifts
//! the entries after it back (Knuth's algorithm R, 6.4), so there are no tombstones: a
//! table churned by learning and aging stays as fast as a fresh one, and never needs a rehash.
//! std's `HashMap` would do for lookups, but with tombstones it may reallocate to twice its
//! size under churn even within the capacity it reserved; this table's memory is fixed.
//!
//! The hash is keyed with a secret drawn per table (a folded multiply, as foldhash does): the
//! guests choose the source MACs, and without the key one could pick addresses that all land
//! in one probe run and make every lookup long.
//!
//! Concurrency: the FDB keeps the table behind an `RwLock`. Only `last_seen` changes under the
//! read lock (see [`MacTable::touch`]); everything else changes under the write lock.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::mac::Mac;
use super::port::PortId;

/// The most entries a table holds (and an FDB's capacity): 2^20, in 2^21 slots of 24 bytes,
/// 48 MiB.
pub const MAX_CAPACITY: usize = 1 << 20;

/// The key of an empty slot: not a 48-bit MAC.
const EMPTY: u64 = u64::MAX;

#[derive(Debug)]
struct Slot {
    key: u64,
    port: PortId,
    is_static: bool,
    /// When a frame from this MAC was last seen on `port` (a [`super::fdb::Tick`]'s
    /// milliseconds).
    last_seen: AtomicU64,
}

impl Slot {
    fn empty() -> Slot {
        const PORT_0: PortId = match PortId::new(0) {
            Some(p) => p,
            None => unreachable!(),
        };
        Slot {
            key: EMPTY,
            port: PORT_0,
            is_static: false,
            last_seen: AtomicU64::new(0),
        }
    }
}

/// One entry, as read out of its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub mac: Mac,
    pub port: PortId,
    pub is_static: bool,
    pub last_seen: u64,
}

/// A fixed-size MAC table. Slot indices returned by [`find`](MacTable::find) are valid until
/// the next `&mut self` call.
#[derive(Debug)]
pub struct MacTable {
    slots: Box<[Slot]>,
    mask: usize,
    capacity: usize,
    len: usize,
    /// The hash's secret: a key XORed in, and an odd multiplier.
    xor: u64,
    mul: u64,
}

impl MacTable {
    /// A table for up to `capacity` entries (at most [`MAX_CAPACITY`]), its memory allocated
    /// now and never again.
    pub fn new(capacity: usize) -> MacTable {
        let s = RandomState::new();
        MacTable::with_keys(capacity, s.hash_one(0u64), s.hash_one(1u64))
    }

    /// With a chosen secret, for tests that need collisions.
    pub(super) fn with_keys(capacity: usize, xor: u64, mul: u64) -> MacTable {
        assert!(capacity <= MAX_CAPACITY, "FDB capacity checked by Fdb::new");
        // At least one slot more than entries, so every probe meets an empty slot and ends.
        let n = (capacity * 2).next_power_of_two();
        MacTable {
            slots: (0..n).map(|_| Slot::empty()).collect(),
            mask: n - 1,
            capacity,
            len: 0,
            xor,
            mul: mul | 1,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The slots allocated: fixed for the table's life.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    fn home(&self, key: u64) -> usize {
        let p = u128::from(key ^ self.xor) * u128::from(self.mul);
        ((p as u64) ^ ((p >> 64) as u64)) as usize & self.mask
    }

    /// The slot holding `mac`.
    #[inline]
    pub fn find(&self, mac: Mac) -> Option<usize> {
        let key = mac.to_u64();
        let mut i = self.home(key);
        loop {
            match self.slots[i].key {
                k if k == key => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & self.mask,
            }
        }
    }

    pub fn entry(&self, i: usize) -> Entry {
        let s = &self.slots[i];
        Entry {
            mac: Mac::from_u64(s.key),
            port: s.port,
            is_static: s.is_static,
            last_seen: s.last_seen.load(Relaxed),
        }
    }

    /// Slot `i`'s port: a lookup's answer, without the last-seen time's load.
    #[inline]
    pub fn port(&self, i: usize) -> PortId {
        self.slots[i].port
    }

    /// Records that slot `i`'s MAC was seen at `now`, under the read lock: several workers may
    /// do it at once. Relaxed: the time is a hint for aging and moves, read under the write
    /// lock, whose acquisition orders it after the readers' unlocks. Most calls find it
    /// already at `now` (the caller's clock ticks in milliseconds, per batch), and a load
    /// leaves the cache line shared where a store would take it from the other cores.
    #[inline]
    pub fn touch(&self, i: usize, now: u64) {
        let seen = &self.slots[i].last_seen;
        if seen.load(Relaxed) < now {
            // Never backwards: another worker may hold a later `now`.
            seen.fetch_max(now, Relaxed);
        }
    }

    /// Adds `mac`, which must not be in the table. False, and nothing added, when the table
    /// holds `capacity` entries already (which the FDB's reservations rule out).
    pub fn insert(&mut self, mac: Mac, port: PortId, is_static: bool, now: u64) -> bool {
        debug_assert!(self.find(mac).is_none());
        if self.len >= self.capacity {
            return false;
        }
        let key = mac.to_u64();
        let mut i = self.home(key);
        while self.slots[i].key != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = Slot {
            key,
            port,
            is_static,
            last_seen: AtomicU64::new(now),
        };
        self.len += 1;
        true
    }

    /// Moves slot `i`'s entry to `port` (learned, seen at `now`).
    pub fn set_port(&mut self, i: usize, port: PortId, now: u64) {
        let s = &mut self.slots[i];
        s.port = port;
        *s.last_seen.get_mut() = now;
    }

    /// Empties slot `i`, then shifts back each entry after it in the probe run that may fill
    /// the hole, so that a later probe never stops early.
    pub fn remove(&mut self, i: usize) {
        debug_assert!(self.slots[i].key != EMPTY);
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let key = self.slots[j].key;
            if key == EMPTY {
                break;
            }
            // The entry at j may move to the hole if the hole lies on its probe path, from
            // its home slot to j (cyclically).
            let from_home = j.wrapping_sub(self.home(key)) & self.mask;
            let from_hole = j.wrapping_sub(hole) & self.mask;
            if from_home >= from_hole {
                self.slots.swap(hole, j);
                hole = j;
            }
        }
        self.slots[hole] = Slot::empty();
        self.len -= 1;
    }

    /// Every entry, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = Entry> + '_ {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].key != EMPTY)
            .map(|i| self.entry(i))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn port(n: usize) -> PortId {
        PortId::new(n).unwrap()
    }

    /// xorshift64: a fixed sequence, for a randomised test that replays exactly.
    fn rng(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn slots_are_a_power_of_two_at_least_twice_the_capacity() {
        assert_eq!(
            std::mem::size_of::<Slot>(),
            24,
            "as MAX_CAPACITY and FdbShow say"
        );
        for (capacity, slots) in [(0, 1), (1, 2), (3, 8), (4, 8), (5, 16), (1000, 2048)] {
            let t = MacTable::new(capacity);
            assert_eq!(
                (t.capacity(), t.slot_count(), t.len()),
                (capacity, slots, 0)
            );
        }
        let mut t = MacTable::new(0);
        assert!(!t.insert(Mac::from_u64(2), port(0), false, 0));
        assert_eq!(t.find(Mac::from_u64(2)), None);
    }

    #[test]
    fn insert_find_touch_move_remove() {
        let mut t = MacTable::new(4);
        let m = Mac::new([2, 0, 0, 0, 0, 1]);
        assert!(t.insert(m, port(3), true, 10));
        let i = t.find(m).unwrap();
        let want = Entry {
            mac: m,
            port: port(3),
            is_static: true,
            last_seen: 10,
        };
        assert_eq!(t.entry(i), want);
        t.touch(i, 9);
        assert_eq!(t.entry(i).last_seen, 10, "never backwards");
        t.touch(i, 12);
        assert_eq!(t.entry(i).last_seen, 12);
        t.set_port(i, port(4), 20);
        assert_eq!((t.entry(i).port, t.entry(i).last_seen), (port(4), 20));
        assert_eq!(t.iter().count(), 1);
        t.remove(i);
        assert_eq!((t.find(m), t.len(), t.iter().count()), (None, 0, 0));
    }

    #[test]
    fn full_table_refuses_and_memory_stays_fixed() {
        let mut t = MacTable::new(8);
        let slots = t.slot_count();
        for k in 1..=8 {
            assert!(t.insert(Mac::from_u64(k << 1), port(0), false, 0));
        }
        assert!(!t.insert(Mac::from_u64(100), port(0), false, 0));
        assert_eq!((t.len(), t.slot_count()), (8, slots));
    }

    /// Every key hashes to the home its low bits name (secret 0, multiplier 1), so chains of
    /// collisions, runs that wrap past the last slot and shifts back across the wrap all
    /// happen; the table must agree with a BTreeMap through a long random sequence.
    #[test]
    fn collisions_and_wrapping_runs_agree_with_a_map() {
        let mut t = MacTable::with_keys(32, 0, 1);
        let mask = t.slot_count() as u64 - 1;
        let mut model = BTreeMap::new();
        let mut state = 0x9e37_79b9_7f4a_7c15;
        for step in 0..20_000u64 {
            let r = rng(&mut state);
            // Four homes only (the last slots, so runs wrap), 16 keys each.
            let home = mask - (r & 3);
            let mac = Mac::from_u64(home | ((r >> 2) & 15) << 8);
            match (t.find(mac), r >> 60) {
                (Some(i), 0..=6) => {
                    t.remove(i);
                    model.remove(&mac);
                }
                (Some(i), _) => t.touch(i, step),
                (None, _) => {
                    let added = t.insert(mac, port(step as usize % 4), false, step);
                    assert_eq!(added, model.len() < 32);
                    if added {
                        model.insert(mac, (port(step as usize % 4), step));
                    }
                }
            }
            assert_eq!(t.len(), model.len());
            for (m, (p, _)) in &model {
                let i = t.find(*m).expect("every entry stays reachable");
                assert_eq!(t.entry(i).port, *p);
            }
        }
        let mut all: Vec<Mac> = t.iter().map(|e| e.mac).collect();
        all.sort();
        assert_eq!(all, model.keys().copied().collect::<Vec<_>>());
    }
}
