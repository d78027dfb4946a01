//! The `fdb` seeds: forwarding (flooding, known unicast, hairpin), aging, static entries,
//! moves held and announced, a port flooding the table from made-up sources, port security,
//! receive filters, and ports added, refused and removed. Each is run against the model (which
//! checks every step) and checked for the verdicts, learning and counters its name promises.

use virtnet_backend::switch::model::{mac, Outcome};
use virtnet_backend::switch::{
    DropReason, Learned, PortId, PortSet, Refusal, SwitchError, Verdict,
};

use super::{replay, write_corpus};
use crate::encode::Encode;
use crate::fdb::{self, FdbInput, FdbOp as F, RxFilter};

const BCAST: u8 = 1;
const GROUP: u8 = 2;
/// The guests' own MACs (guest n has `GUEST + n`) and hosts behind the uplink.
const GUEST: u8 = 10;
const HOST: u8 = 20;

fn p(n: u8) -> PortId {
    PortId::new(n.into()).unwrap()
}

fn to(ports: &[u8]) -> Verdict {
    Verdict::Forward(ports.iter().map(|n| p(*n)).collect::<PortSet>())
}

fn dropped(reason: DropReason) -> Verdict {
    Verdict::Drop(reason)
}

fn add(port: u8, address: u8, mac: u8, learn_limit: u8) -> F {
    F::AddPort {
        port,
        address,
        mac,
        learn_limit,
    }
}

fn frame(port: u8, dst: u8, src: u8) -> F {
    F::Decide {
        port,
        dst,
        src,
        announce: false,
    }
}

/// The uplink (port 0, learning up to 4 MACs) and guests 1 and 2 with port security.
fn switch() -> Vec<F> {
    vec![
        add(0, 0, 0, 4),
        add(1, 1, GUEST + 1, 0),
        add(2, 1, GUEST + 2, 0),
    ]
}

/// Guest 3, spoof-check off, learning up to 2 MACs.
fn unchecked_guest() -> F {
    add(3, 2, GUEST + 3, 2)
}

fn input(mut ops: Vec<F>, more: impl IntoIterator<Item = F>) -> FdbInput {
    ops.extend(more);
    FdbInput { ops }
}

type FdbSeed = (&'static str, FdbInput, fn(&Outcome));

fn fdb_seeds() -> Vec<FdbSeed> {
    let forwarding = input(
        switch(),
        [
            frame(0, BCAST, HOST),
            frame(1, HOST, GUEST + 1),
            frame(2, GUEST + 1, GUEST + 2),
            frame(0, HOST + 1, HOST),
            frame(0, HOST, HOST + 1),
            frame(1, GROUP, GUEST + 1),
        ],
    );
    let aging = input(
        switch(),
        [
            frame(0, BCAST, HOST),
            F::Advance(2_000),
            frame(0, BCAST, HOST + 1),
            F::Advance(1_000),
            F::Age,
            F::Lookup(HOST),
            F::Advance(2_000),
            F::Age,
        ],
    );
    let static_entries = input(
        switch(),
        [
            frame(0, BCAST, GUEST + 1),
            F::Learn {
                port: 0,
                mac: GUEST + 1,
                announce: true,
            },
            F::Advance(4_000),
            F::Age,
            F::Lookup(GUEST + 1),
        ],
    );
    let moves = input(
        switch(),
        [
            unchecked_guest(),
            frame(0, BCAST, HOST),
            F::Advance(100),
            frame(3, BCAST, HOST),
            F::Advance(500),
            frame(3, BCAST, HOST),
            F::Decide {
                port: 0,
                dst: BCAST,
                src: HOST,
                announce: true,
            },
        ],
    );
    let mut limits = switch();
    limits.extend([unchecked_guest(), frame(3, BCAST, HOST + 50)]);
    limits.extend((0..40).map(|i| frame(0, BCAST, HOST + i)));
    limits.extend([frame(1, HOST, GUEST + 1), frame(1, HOST + 50, GUEST + 1)]);
    let port_security = input(
        switch(),
        [
            frame(1, BCAST, HOST),
            frame(0, BCAST, 0),
            frame(0, BCAST, GROUP),
            frame(5, BCAST, HOST),
            unchecked_guest(),
            frame(3, BCAST, HOST),
        ],
    );
    let closed = |port, flags, mac, multicast: Vec<u8>| F::SetFilter {
        port,
        filter: RxFilter {
            flags,
            mac,
            unicast: Vec::new(),
            multicast,
        },
    };
    let receive_filters = input(
        switch(),
        [
            closed(1, 0, Some(GUEST + 1), vec![]),
            closed(2, 0b10, Some(GUEST + 2), vec![]),
            frame(0, BCAST, HOST),
            frame(0, GROUP, HOST),
            frame(0, HOST + 1, HOST),
            frame(0, GUEST + 1, HOST),
            closed(1, 0, Some(GUEST + 1), vec![GROUP]),
            frame(0, GROUP, HOST),
            closed(2, 1 << 5, None, vec![]),
            frame(0, BCAST, HOST),
            frame(0, GUEST + 2, HOST),
        ],
    );
    let port_changes = input(
        vec![
            add(0, 0, 0, 4),
            add(0, 1, GUEST, 0),
            add(1, 1, BCAST, 0),
            add(1, 1, GUEST + 1, 0),
            add(2, 1, GUEST + 1, 0),
            add(2, 2, GUEST + 2, 4),
            add(3, 2, GUEST + 3, 4),
            F::RemovePort(2),
            add(3, 2, GUEST + 3, 4),
            frame(0, BCAST, HOST),
            // A VM migrated here: its MAC, learned on the uplink, becomes port 4's own.
            add(4, 1, HOST, 0),
            frame(1, HOST, GUEST + 1),
        ],
        [],
    );

    vec![
        ("forwarding", forwarding, |o| {
            let want = [
                to(&[1, 2]),
                to(&[0]),
                to(&[1]),
                to(&[1, 2]),
                dropped(DropReason::Hairpin),
                to(&[0, 2]),
            ];
            assert_eq!(o.verdicts, want);
            assert_eq!(o.learned, [Learned::New, Learned::New]);
            assert_eq!(o.entries, 4);
        }),
        ("aging", aging, |o| {
            assert_eq!((o.counters.learned, o.counters.aged), (2, 2));
            assert_eq!(o.entries, 2, "the guests' own MACs");
        }),
        ("static_entries", static_entries, |o| {
            assert_eq!(o.verdicts, [dropped(DropReason::StaticSource)]);
            let owner = p(1);
            assert_eq!(o.learned, [Learned::Refused(Refusal::Static { owner })]);
            assert_eq!((o.counters.static_conflicts, o.counters.aged), (2, 0));
            assert_eq!(o.entries, 2);
        }),
        ("moves_held_and_announced", moves, |o| {
            let want = [
                to(&[1, 2, 3]),
                to(&[0, 1, 2]),
                to(&[0, 1, 2]),
                to(&[1, 2, 3]),
            ];
            assert_eq!(o.verdicts, want);
            let moved = |n| Learned::Moved { from: p(n) };
            assert_eq!(o.learned, [Learned::New, moved(0), moved(3)]);
            assert_eq!((o.counters.moved, o.counters.held), (2, 1));
        }),
        ("flooding_port_keeps_to_its_limit", input(limits, []), |o| {
            assert_eq!(o.learned, [Learned::New; 5]);
            assert_eq!(o.counters.refused, 36);
            assert_eq!(o.entries, 3 + 1 + 4);
            // The uplink's first four and guest 3's MAC are still known.
            assert_eq!(o.verdicts[o.verdicts.len() - 2..], [to(&[0]), to(&[3])]);
        }),
        ("port_security", port_security, |o| {
            let want = [
                dropped(DropReason::Spoofed),
                dropped(DropReason::InvalidSource),
                dropped(DropReason::InvalidSource),
                dropped(DropReason::NoSuchPort),
                to(&[0, 1, 2]),
            ];
            assert_eq!(o.verdicts, want);
            assert_eq!(o.learned, [Learned::New]);
        }),
        ("receive_filters", receive_filters, |o| {
            let want = [
                to(&[1, 2]),
                to(&[2]),
                dropped(DropReason::Filtered),
                to(&[1]),
                to(&[1, 2]),
                to(&[1]),
                dropped(DropReason::Filtered),
            ];
            assert_eq!(o.verdicts, want);
        }),
        ("port_changes", port_changes, |o| {
            let want = [
                Ok(()),
                Err(SwitchError::PortExists { port: p(0) }),
                Err(SwitchError::InvalidMac {
                    port: p(1),
                    mac: mac(BCAST),
                }),
                Ok(()),
                Err(SwitchError::MacInUse {
                    port: p(2),
                    mac: mac(GUEST + 1),
                    owner: p(1),
                }),
                Ok(()),
                Err(SwitchError::NoRoom {
                    port: p(3),
                    need: 5,
                    free: 2,
                }),
                Ok(()),
                Ok(()),
            ];
            assert_eq!(o.added, want);
            assert_eq!(o.verdicts, [to(&[1, 3]), to(&[4])]);
            assert_eq!((o.counters.learned, o.counters.moved), (1, 1));
        }),
    ]
}

#[test]
fn fdb_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, check) in fdb_seeds() {
        let bytes = input.to_bytes();
        let decoded: FdbInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        check(&fdb::run(&input));
        files.push((name, bytes));
    }
    write_corpus("fdb", &files);
    replay("fdb", |b| {
        if let Some(i) = crate::decode::<FdbInput>(b) {
            fdb::run(&i);
        }
    });
}
