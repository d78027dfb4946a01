//! The model's differential run: [`run`] takes the real FDB and port table and the model
//! (`model.rs`) through the same [`Op`]s, step by step, and panics at the first difference in
//! an operation's result or in the state after it.

use std::time::Duration;

use super::{mac, port, Filter, Model, AGE_MS, CAPACITY, HOLD_MS, LIMITS, MAX_ADVANCE_MS};
use crate::switch::error::SwitchError;
use crate::switch::fdb::{
    EntryKind, Fdb, FdbConfig, FdbCountersSnapshot, FdbEntry, FdbPort, Learn, Learned,
};
use crate::switch::forward::{decide, Frame, PortAddress, PortConfig, Ports, Verdict};
use crate::switch::port::PortSet;
use crate::switch::tick::Tick;

/// One step: one variant per public operation of the FDB and the port table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `address % 3`: none (an uplink), checked, unchecked, with MAC `mac`.
    AddPort {
        port: u8,
        address: u8,
        mac: u8,
        learn_limit: u8,
    },
    RemovePort {
        port: u8,
    },
    /// `Fdb::learn` (or `announce`) directly.
    Learn {
        port: u8,
        mac: u8,
        announce: bool,
    },
    Lookup {
        mac: u8,
    },
    Advance {
        ms: u16,
    },
    Age,
    SetFilter {
        port: u8,
        filter: Filter,
    },
    /// A frame through `decide`, then its learning.
    Decide {
        port: u8,
        dst: u8,
        src: u8,
        announce: bool,
    },
}

/// The switch under test.
struct Real {
    fdb: Fdb,
    ports: Ports,
    slots: usize,
}

fn check(step: usize, op: &Op, real: &Real, model: &Model) {
    let now = Tick::from_millis(model.now);
    let show = real.fdb.show(now);
    let entries: Vec<FdbEntry> = model
        .entries
        .iter()
        .map(|(m, e)| FdbEntry {
            port: e.port,
            mac: *m,
            kind: if e.is_static {
                EntryKind::Static
            } else {
                EntryKind::Learned
            },
            age_ms: model.now - e.last_seen,
        })
        .collect();
    let mut sorted = entries;
    sorted.sort_by_key(|e| (e.port, e.mac));
    assert_eq!(show.entries, sorted, "step {step}, {op:?}: entries");
    let ports: Vec<FdbPort> = model
        .ports
        .iter()
        .map(|(p, mp)| FdbPort {
            port: *p,
            own: mp.config.address.mac(),
            learned: model.learned_on(*p),
            learn_limit: mp.config.learn_limit,
        })
        .collect();
    assert_eq!(show.ports, ports, "step {step}, {op:?}: ports");
    assert_eq!(
        show.counters, model.counters,
        "step {step}, {op:?}: counters"
    );
    assert_eq!(show.reserved, model.reserved(), "step {step}, {op:?}");
    assert!(real.fdb.len() <= CAPACITY && show.reserved <= CAPACITY);
    assert_eq!(show.slots, real.slots, "the table's memory never changes");
    assert_eq!(
        real.ports.present(),
        model.ports.keys().copied().collect::<PortSet>()
    );
    for (p, mp) in &model.ports {
        let got = real.ports.counters(*p).map(|c| c.snapshot());
        assert_eq!(got, Some(mp.dropped), "step {step}, {op:?}: {p:?}");
    }
}

/// What a run did, for seeds and tests to check that it meant what they say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Every decision's verdict, in order.
    pub verdicts: Vec<Verdict>,
    /// What each learning did: `Learn` operations' and decisions' (after them), in order.
    pub learned: Vec<Learned>,
    /// Each `AddPort`'s result.
    pub added: Vec<Result<(), SwitchError>>,
    /// The FDB's counters and entries at the end.
    pub counters: FdbCountersSnapshot,
    pub entries: usize,
}

/// Runs `ops` on the switch and on the model; panics at the first difference.
pub fn run(ops: &[Op]) -> Outcome {
    let mut outcome = Outcome::default();
    let config = FdbConfig {
        capacity: CAPACITY,
        age: Duration::from_millis(AGE_MS),
        move_hold: Duration::from_millis(HOLD_MS),
    };
    let fdb = Fdb::new(config).expect("a small FDB");
    let slots = fdb.show(Tick::default()).slots;
    let mut real = Real {
        fdb,
        ports: Ports::new(),
        slots,
    };
    let mut model = Model::default();
    for (step, op) in ops.iter().enumerate() {
        let now = Tick::from_millis(model.now);
        let Real { fdb, ports, .. } = &mut real;
        match op {
            Op::AddPort {
                port: n,
                address,
                mac: m,
                learn_limit,
            } => {
                let own = mac(*m);
                let address = match address % 3 {
                    0 => PortAddress::None,
                    1 => PortAddress::Checked(own),
                    _ => PortAddress::Unchecked(own),
                };
                let config = PortConfig {
                    address,
                    learn_limit: usize::from(learn_limit % LIMITS),
                };
                let got = ports.add(fdb, port(*n), config, now);
                let want = model.add_port(port(*n), config);
                assert_eq!(got, want, "step {step}, {op:?}");
                outcome.added.push(got);
            }
            Op::RemovePort { port: n } => {
                let got = ports.remove(fdb, port(*n));
                assert_eq!(got, model.remove_port(port(*n)), "step {step}, {op:?}");
            }
            Op::Learn {
                port: n,
                mac: m,
                announce,
            } => {
                let req = Learn {
                    mac: mac(*m),
                    port: port(*n),
                    announce: *announce,
                };
                let got = fdb.learn(req, now);
                let want = model.learn(mac(*m), port(*n), *announce, true);
                assert_eq!(Some(got), want, "step {step}, {op:?}");
                outcome.learned.push(got);
            }
            Op::Lookup { mac: m } => {
                let got = fdb.read().lookup(mac(*m));
                let want = model.entries.get(&mac(*m)).map(|e| e.port);
                assert_eq!(got, want, "step {step}, {op:?}");
            }
            Op::Advance { ms } => model.now += u64::from(ms % MAX_ADVANCE_MS),
            Op::Age => assert_eq!(fdb.age(now), model.age(), "step {step}, {op:?}"),
            Op::SetFilter { port: n, filter } => {
                let got = ports.set_filter(port(*n), filter.to_rx_filter());
                let want = match model.ports.get_mut(&port(*n)) {
                    Some(mp) => {
                        mp.filter = filter.clone();
                        true
                    }
                    None => false,
                };
                assert_eq!(got, want, "step {step}, {op:?}");
            }
            Op::Decide {
                port: n,
                dst,
                src,
                announce,
            } => {
                let frame = Frame {
                    dst: mac(*dst),
                    src: mac(*src),
                    announce: *announce,
                };
                let got = decide(ports, &fdb.read(), port(*n), frame, now);
                let want = model.decide(port(*n), frame);
                assert_eq!(got, want, "step {step}, {op:?}");
                outcome.verdicts.push(got.verdict);
                if let Some(l) = got.learn {
                    let learned = fdb.learn(l, now);
                    let want = model.learn(l.mac, l.port, l.announce, true);
                    assert_eq!(Some(learned), want, "step {step}, {op:?}: learning");
                    outcome.learned.push(learned);
                }
            }
        }
        check(step, op, &real, &model);
    }
    outcome.counters = model.counters;
    outcome.entries = model.entries.len();
    outcome
}
