//! A reference model of the switch, for the property test below and the `fdb` fuzz target
//! (compiled only for tests and with the `fuzzing` feature): the FDB as a plain `BTreeMap`
//! from MAC to (port, static, last seen), with every rule of `fdb.rs` and `forward.rs`
//! written out as directly as it can be, with none of their machinery (no hash table, no
//! per-port counts kept up to date, no read and write paths, no bitsets).
//!
//! [`run`] (in `model/run.rs`) drives the real [`Fdb`](super::fdb::Fdb) and
//! [`Ports`](super::forward::Ports) and the model through the same [`Op`]s, as the switch's
//! callers would (a decision's learning done after it, with the read lock
//! dropped), and panics at the first difference: in what an operation returned, or in the
//! state after it (every entry with its port, kind and age, each port's learned count and
//! reservation, every counter). It also checks that the table never holds more than its
//! capacity and that its memory never changes.
//!
//! [`Reference`] is the model alone, for the `switch_forward` fuzz target, which drives the
//! switch with real frames through its running parts.
//!
//! Operations name ports, MACs and times by small numbers, so that random sequences hit the
//! same few addresses and ports over and over (moves, limits, conflicts) and cross the age
//! and the move hold often.

use std::collections::BTreeMap;

use super::error::SwitchError;
use super::fdb::{FdbCountersSnapshot, Learn, Learned, Refusal};
use super::filter::{RxFilter, MAC_LIST_MAX};
use super::forward::{
    Decision, DropReason, Frame, PortAddress, PortConfig, PortCountersSnapshot, Verdict,
};
use super::mac::Mac;
use super::port::{PortId, PortSet};

mod run;

pub use run::{run, Op, Outcome};

/// Ports `0..PORTS` are used.
pub const PORTS: u8 = 6;
/// The FDB's capacity: smaller than what six ports may ask for, so some are refused.
pub const CAPACITY: usize = 12;
pub const AGE_MS: u64 = 3_000;
pub const HOLD_MS: u64 = 500;
/// A learn limit is `learn_limit % LIMITS`.
pub const LIMITS: u8 = 5;
/// Time advances by `ms % MAX_ADVANCE_MS`.
pub const MAX_ADVANCE_MS: u16 = 4_096;

/// MAC number `i`: 0 is zero, 1 broadcast, 2 and 3 multicast (IPv4 and IPv6 groups), any
/// other `02:00:00:00:00:i`, unicast.
pub fn mac(i: u8) -> Mac {
    match i {
        0 => Mac::ZERO,
        1 => Mac::BROADCAST,
        2 => Mac::new([0x01, 0x00, 0x5e, 0, 0, 1]),
        3 => Mac::new([0x33, 0x33, 0, 0, 0, 1]),
        i => Mac::new([0x02, 0, 0, 0, 0, i]),
    }
}

fn port(n: u8) -> PortId {
    PortId::new(usize::from(n % PORTS)).expect("below MAX_PORTS")
}

/// A receive filter. `flags` bits: 0 PROMISC, 1 ALLMULTI, 2 ALLUNI, 3 NOMULTI, 4 NOUNI,
/// 5 NOBCAST; 6 and 7 make the unicast and the multicast list overflow (as a list longer than
/// `MAC_LIST_MAX` does). MACs by number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    pub flags: u8,
    pub mac: Option<u8>,
    pub unicast: Vec<u8>,
    pub multicast: Vec<u8>,
}

impl Filter {
    fn flag(&self, bit: u8) -> bool {
        self.flags & (1 << bit) != 0
    }

    fn to_rx_filter(&self) -> RxFilter {
        let mut f = RxFilter::promiscuous(self.mac.map(mac));
        f.promisc = self.flag(0);
        f.allmulti = self.flag(1);
        f.alluni = self.flag(2);
        f.nomulti = self.flag(3);
        f.nouni = self.flag(4);
        f.nobcast = self.flag(5);
        let list = |macs: &[u8], overflow: bool| -> Vec<Mac> {
            let mut l: Vec<Mac> = macs.iter().map(|i| mac(*i)).collect();
            if overflow {
                l.resize(MAC_LIST_MAX + 1, mac(4));
            }
            l
        };
        f.set_mac_table(
            &list(&self.unicast, self.flag(6)),
            &list(&self.multicast, self.flag(7)),
        );
        f
    }

    /// The model's filter, from the spec's words (VIRTIO 1.2 5.1.6.5.1, 5.1.6.5.2), and
    /// QEMU's for a list longer than its table: every address of that kind.
    fn accepts(&self, dst: Mac) -> bool {
        let listed = |l: &[u8], overflow_bit| {
            self.flag(overflow_bit) || l.len() > MAC_LIST_MAX || l.iter().any(|i| mac(*i) == dst)
        };
        if self.flag(0) {
            return true;
        }
        if dst == Mac::BROADCAST {
            return !self.flag(5);
        }
        if dst.bytes()[0] & 1 == 1 {
            return !self.flag(3) && (self.flag(1) || listed(&self.multicast, 7));
        }
        !self.flag(4)
            && (self.flag(2) || self.mac.map(mac) == Some(dst) || listed(&self.unicast, 6))
    }
}

#[derive(Clone, Copy, Debug)]
struct ModelEntry {
    port: PortId,
    is_static: bool,
    last_seen: u64,
}

#[derive(Debug)]
struct ModelPort {
    config: PortConfig,
    filter: Filter,
    dropped: PortCountersSnapshot,
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    entries: BTreeMap<Mac, ModelEntry>,
    ports: BTreeMap<PortId, ModelPort>,
    counters: FdbCountersSnapshot,
}

impl Model {
    fn learned_on(&self, p: PortId) -> usize {
        self.entries
            .values()
            .filter(|e| e.port == p && !e.is_static)
            .count()
    }

    fn reserved(&self) -> usize {
        let own = |c: &PortConfig| usize::from(c.address.mac().is_some());
        self.ports
            .values()
            .map(|p| p.config.learn_limit + own(&p.config))
            .sum()
    }

    fn add_port(&mut self, p: PortId, config: PortConfig) -> Result<(), SwitchError> {
        if self.ports.contains_key(&p) {
            return Err(SwitchError::PortExists { port: p });
        }
        let own = config.address.mac();
        if let Some(m) = own {
            if m.is_multicast() || m == Mac::ZERO {
                return Err(SwitchError::InvalidMac { port: p, mac: m });
            }
        }
        let need = config.learn_limit + usize::from(own.is_some());
        let free = CAPACITY - self.reserved();
        if need > free {
            return Err(SwitchError::NoRoom {
                port: p,
                need,
                free,
            });
        }
        if let Some(m) = own {
            match self.entries.get(&m) {
                Some(e) if e.is_static => {
                    let owner = e.port;
                    return Err(SwitchError::MacInUse {
                        port: p,
                        mac: m,
                        owner,
                    });
                }
                Some(_) => self.counters.moved += 1,
                None => {}
            }
            let e = ModelEntry {
                port: p,
                is_static: true,
                last_seen: self.now,
            };
            self.entries.insert(m, e);
        }
        let filter = Filter {
            flags: 1,
            mac: own.map(|m| m.bytes()[5]),
            unicast: Vec::new(),
            multicast: Vec::new(),
        };
        let dropped = PortCountersSnapshot::default();
        self.ports.insert(
            p,
            ModelPort {
                config,
                filter,
                dropped,
            },
        );
        Ok(())
    }

    fn remove_port(&mut self, p: PortId) -> bool {
        self.entries.retain(|_, e| e.port != p);
        self.ports.remove(&p).is_some()
    }

    /// What learning `mac` on `p` would do, and whether it takes the write lock.
    fn learn(&mut self, m: Mac, p: PortId, announce: bool, apply_writes: bool) -> Option<Learned> {
        if m.is_multicast() || m == Mac::ZERO {
            return Some(Learned::Refused(Refusal::InvalidSource));
        }
        let Some(port) = self.ports.get(&p) else {
            return Some(Learned::Refused(Refusal::NoSuchPort));
        };
        let full = self.learned_on(p) >= port.config.learn_limit;
        let now = self.now;
        let Some(e) = self.entries.get(&m).copied() else {
            if full {
                self.counters.refused += 1;
                return Some(Learned::Refused(Refusal::Limit));
            }
            if !apply_writes {
                return None;
            }
            let e = ModelEntry {
                port: p,
                is_static: false,
                last_seen: now,
            };
            self.entries.insert(m, e);
            self.counters.learned += 1;
            return Some(Learned::New);
        };
        if e.port == p {
            self.entries.get_mut(&m).expect("found").last_seen = now;
            return Some(Learned::Refreshed);
        }
        if e.is_static {
            self.counters.static_conflicts += 1;
            return Some(Learned::Refused(Refusal::Static { owner: e.port }));
        }
        if !announce && now - e.last_seen < HOLD_MS {
            self.counters.held += 1;
            return Some(Learned::Refused(Refusal::Held { on: e.port }));
        }
        if !apply_writes {
            return None;
        }
        if full {
            self.entries.remove(&m);
            self.counters.refused += 1;
            return Some(Learned::Refused(Refusal::Limit));
        }
        let moved = ModelEntry {
            port: p,
            is_static: false,
            last_seen: now,
        };
        self.entries.insert(m, moved);
        self.counters.moved += 1;
        Some(Learned::Moved { from: e.port })
    }

    fn age(&mut self) -> usize {
        let now = self.now;
        let before = self.entries.len();
        self.entries
            .retain(|_, e| e.is_static || now - e.last_seen < AGE_MS);
        let n = before - self.entries.len();
        self.counters.aged += n as u64;
        n
    }

    fn decide(&mut self, from: PortId, frame: Frame) -> Decision {
        let drop = |reason, learn| Decision {
            verdict: Verdict::Drop(reason),
            learn,
        };
        let Some(source) = self.ports.get_mut(&from) else {
            return drop(DropReason::NoSuchPort, None);
        };
        let (src, dst) = (frame.src, frame.dst);
        if src.is_multicast() || src == Mac::ZERO {
            source.dropped.invalid_source += 1;
            return drop(DropReason::InvalidSource, None);
        }
        if let PortAddress::Checked(own) = source.config.address {
            if src != own {
                source.dropped.spoofed += 1;
                return drop(DropReason::Spoofed, None);
            }
        }
        let learn = match self.learn(src, from, frame.announce, false) {
            None => Some(Learn {
                mac: src,
                port: from,
                announce: frame.announce,
            }),
            Some(Learned::Refused(Refusal::Static { .. })) => {
                self.count(from, |d| d.static_source += 1);
                return drop(DropReason::StaticSource, None);
            }
            Some(_) => None,
        };
        let others: Vec<PortId> = self.ports.keys().copied().filter(|p| *p != from).collect();
        let candidates = if dst.is_multicast() {
            others
        } else {
            match self.entries.get(&dst) {
                Some(e) if e.port == from => {
                    self.count(from, |d| d.hairpin += 1);
                    return drop(DropReason::Hairpin, learn);
                }
                Some(e) => vec![e.port],
                None => others,
            }
        };
        if candidates.is_empty() {
            self.count(from, |d| d.no_destination += 1);
            return drop(DropReason::NoDestination, learn);
        }
        let to: Vec<PortId> = candidates
            .into_iter()
            .filter(|p| self.ports[p].filter.accepts(dst))
            .collect();
        if to.is_empty() {
            self.count(from, |d| d.filtered += 1);
            return drop(DropReason::Filtered, learn);
        }
        Decision {
            verdict: Verdict::Forward(to.into_iter().collect::<PortSet>()),
            learn,
        }
    }

    fn count(&mut self, p: PortId, f: impl FnOnce(&mut PortCountersSnapshot)) {
        f(&mut self.ports.get_mut(&p).expect("the source port").dropped);
    }
}

/// The model alone, for a harness that drives the switch through its running parts rather
/// than its pure calls (the `switch_forward` fuzz target: real frames through
/// `SwitchCore::forward`). Its time stands still at 0, so an entry never ages and a learned
/// MAC seen on another port is always held (it moves only when announced): the switch under
/// test must be given an age and a move hold longer than any run, and the FDB's capacity
/// [`CAPACITY`].
#[derive(Debug, Default)]
pub struct Reference {
    model: Model,
}

impl Reference {
    pub fn new() -> Reference {
        Reference::default()
    }

    /// `Ports::add`: the model's answer.
    pub fn add_port(&mut self, p: PortId, config: PortConfig) -> Result<(), SwitchError> {
        self.model.add_port(p, config)
    }

    /// `decide`, on the model's table as it is: where `frame` from `from` goes, and what is
    /// left to learn after the batch.
    pub fn decide(&mut self, from: PortId, frame: Frame) -> Decision {
        self.model.decide(from, frame)
    }

    /// `Fdb::learn` of a decision's request, after its batch.
    pub fn learn(&mut self, req: Learn) -> Option<Learned> {
        self.model.learn(req.mac, req.port, req.announce, true)
    }

    /// Every entry: MAC, port, static.
    pub fn entries(&self) -> Vec<(Mac, PortId, bool)> {
        let e = self.model.entries.iter();
        e.map(|(m, e)| (*m, e.port, e.is_static)).collect()
    }

    pub fn counters(&self) -> FdbCountersSnapshot {
        self.model.counters
    }

    /// Port `p`'s drop counters.
    pub fn port_counters(&self, p: PortId) -> Option<PortCountersSnapshot> {
        self.model.ports.get(&p).map(|mp| mp.dropped)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Mostly the first dozen MACs (the special four and eight unicast), sometimes any.
    fn mac_number() -> impl Strategy<Value = u8> {
        prop_oneof![9 => 0u8..12, 1 => any::<u8>()]
    }

    /// Often a step that lands on an edge of the hold or the age.
    fn advance() -> impl Strategy<Value = u16> {
        let edges = [
            0,
            1,
            HOLD_MS - 1,
            HOLD_MS,
            AGE_MS - HOLD_MS,
            AGE_MS - 1,
            AGE_MS,
        ];
        prop_oneof![
            proptest::sample::select(edges.map(|ms| ms as u16).to_vec()),
            0..1_500u16,
        ]
    }

    fn filter() -> impl Strategy<Value = Filter> {
        // Sometimes around MAC_LIST_MAX, where a list overflows.
        let list = || {
            prop_oneof![
                4 => proptest::collection::vec(mac_number(), 0..4),
                1 => proptest::collection::vec(mac_number(), MAC_LIST_MAX - 1..MAC_LIST_MAX + 2),
            ]
        };
        (
            any::<u8>(),
            proptest::option::of(mac_number()),
            list(),
            list(),
        )
            .prop_map(|(flags, mac, unicast, multicast)| Filter {
                flags,
                mac,
                unicast,
                multicast,
            })
    }

    fn op() -> impl Strategy<Value = Op> {
        let port = || 0..PORTS;
        prop_oneof![
            2 => (port(), 0u8..3, mac_number(), 0..LIMITS).prop_map(
                |(port, address, mac, learn_limit)| Op::AddPort {
                    port,
                    address,
                    mac,
                    learn_limit
                }
            ),
            1 => port().prop_map(|port| Op::RemovePort { port }),
            4 => (port(), mac_number(), any::<bool>())
                .prop_map(|(port, mac, announce)| Op::Learn { port, mac, announce }),
            2 => mac_number().prop_map(|mac| Op::Lookup { mac }),
            3 => advance().prop_map(|ms| Op::Advance { ms }),
            2 => Just(Op::Age),
            1 => (port(), filter()).prop_map(|(port, filter)| Op::SetFilter { port, filter }),
            6 => (port(), mac_number(), mac_number(), prop::bool::weighted(0.2)).prop_map(
                |(port, dst, src, announce)| Op::Decide {
                    port,
                    dst,
                    src,
                    announce
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn the_switch_follows_the_model(ops in proptest::collection::vec(op(), 1..120)) {
            run(&ops);
        }
    }

    /// Found by the `fdb` fuzz target (corpus/fdb/regression-mac_list_overflow): the model
    /// let a unicast list overflow only through its flag bit, not by its length, as
    /// `RxFilter` does (65 addresses, one more than it keeps).
    #[test]
    fn regression_a_unicast_list_longer_than_the_table_accepts_every_unicast() {
        let unicast = [vec![219; 33], vec![255; 31], vec![12]].concat();
        assert_eq!(unicast.len(), MAC_LIST_MAX + 1);
        let out = run(&[
            Op::AddPort {
                port: 2,
                address: 1,
                mac: 12,
                learn_limit: 0,
            },
            Op::SetFilter {
                port: 2,
                filter: Filter {
                    flags: 2,
                    mac: Some(219),
                    unicast,
                    multicast: vec![],
                },
            },
            Op::AddPort {
                port: 0,
                address: 2,
                mac: 20,
                learn_limit: 0,
            },
            Op::Decide {
                port: 0,
                dst: 21,
                src: 20,
                announce: false,
            },
        ]);
        assert_eq!(out.verdicts, [Verdict::Forward(PortSet::one(port(2)))]);
    }

    #[test]
    fn the_model_agrees_on_a_scripted_life() {
        let unicast = |n: u8| 4 + n;
        let add = |port, address, mac, learn_limit| Op::AddPort {
            port,
            address,
            mac,
            learn_limit,
        };
        let frame = |port, dst, src| Op::Decide {
            port,
            dst,
            src,
            announce: false,
        };
        let out = run(&[
            add(0, 0, 0, 4),
            add(1, 1, unicast(1), 0),
            add(2, 2, unicast(2), 2),
            frame(1, 1, unicast(1)),
            frame(0, unicast(1), unicast(5)),
            frame(2, unicast(5), unicast(6)),
            Op::Advance { ms: 600 },
            frame(2, 1, unicast(5)),
            Op::Advance { ms: 3_000 },
            Op::Age,
            Op::RemovePort { port: 2 },
            frame(1, unicast(2), unicast(1)),
        ]);
        let to = |ports: &[u8]| Verdict::Forward(ports.iter().map(|n| port(*n)).collect());
        assert_eq!(out.added, [Ok(()), Ok(()), Ok(())]);
        assert_eq!(
            out.verdicts,
            [to(&[0, 2]), to(&[1]), to(&[0]), to(&[0, 1]), to(&[0]),]
        );
        assert_eq!(
            out.learned,
            [Learned::New, Learned::New, Learned::Moved { from: port(0) }]
        );
        // Both learned MACs aged; port 2's own MAC went with it.
        assert_eq!(
            (out.counters.learned, out.counters.moved, out.counters.aged),
            (2, 1, 2)
        );
        assert_eq!(out.entries, 1);
    }
}
