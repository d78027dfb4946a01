//! The `ctrl_queue` seeds: every command, commands split across descriptors, malformed
//! commands and hostile rings, each run and checked for the acks its name promises.

use super::{replay, write_corpus};
use crate::ctrl::{self, CtrlInput, CtrlOp as C, CtrlSetup, Payload};
use crate::encode::Encode;
use crate::rings::{Addr, Len, RawDesc};

fn ctrl_input(pairs: u16, size: u16, ops: Vec<C>) -> CtrlInput {
    CtrlInput {
        setup: CtrlSetup {
            pairs: (pairs - 1) as u8,
            size_log2: size.trailing_zeros() as u8,
            event_idx: false,
            indirect: false,
        },
        ops,
    }
}

/// A command in one readable buffer with `writable` bytes for the answer.
fn post(payload: Payload, writable: u8) -> C {
    C::Post {
        payload,
        cuts: Vec::new(),
        writable: vec![writable],
    }
}

/// `KNOWN[which]` with `data`.
fn exact(which: u8, data: &[u8]) -> Payload {
    Payload::Exact {
        which,
        data: data.to_vec(),
    }
}

type CtrlSeed = (&'static str, CtrlInput, ctrl::Outcome);

fn ctrl_seeds() -> Vec<CtrlSeed> {
    let coal = [16, 0, 0, 0, 200, 0, 0, 0];
    let mut vq_set = vec![3, 0, 0, 0];
    vq_set.extend(coal);
    let every = vec![
        post(exact(0, &[0]), 1),
        post(exact(1, &[1]), 1),
        post(exact(2, &[2, 0, 0, 0, 0, 9]), 1),
        post(exact(3, &[2, 0]), 1),
        C::Process,
        post(exact(4, &coal), 1),
        post(exact(5, &coal), 1),
        post(exact(6, &vq_set), 1),
        post(exact(7, &[3, 0, 0, 0]), 9),
        C::Process,
    ];
    let mut seeds = vec![(
        "every_command",
        ctrl_input(2, 8, every),
        ctrl::Outcome {
            oks: 8,
            ..Default::default()
        },
    )];

    // A MAC_ADDR_SET cut into five descriptors, its ack room in three (one empty); then a GET whose reply
    // straddles descriptors, all through indirect tables, with event idx.
    let mut i = ctrl_input(1, 8, Vec::new());
    i.setup.indirect = true;
    i.setup.event_idx = true;
    i.ops = vec![
        C::Post {
            payload: exact(2, &[2, 0, 0, 0, 0, 7]),
            cuts: vec![1; 4],
            writable: vec![1, 0, 1],
        },
        C::Process,
        C::Post {
            payload: exact(7, &[1, 0, 0, 0]),
            cuts: vec![2, 0, 1],
            writable: vec![3, 3, 3],
        },
        C::Process,
    ];
    seeds.push((
        "split_across_descriptors",
        i,
        ctrl::Outcome {
            oks: 2,
            ..Default::default()
        },
    ));

    let malformed = vec![
        post(Payload::Raw(vec![4]), 1),
        post(Payload::Raw(vec![99, 1, 0]), 1),
        post(
            Payload::Known {
                which: 3,
                data: vec![1],
            },
            1,
        ),
        post(Payload::Long(0), 1),
        C::Process,
        post(exact(3, &[0, 0]), 1),
        post(exact(3, &[3, 0]), 1),
        post(exact(7, &[4, 0, 0, 0]), 9),
        post(exact(7, &[0, 0, 0, 0]), 8),
        C::Process,
        post(exact(0, &[0]), 0),
        C::Process,
    ];
    seeds.push((
        "malformed_commands",
        ctrl_input(2, 8, malformed),
        ctrl::Outcome {
            errs: 8,
            unacked: 1,
            ..Default::default()
        },
    ));

    // MAC_TABLE_SET: lists kept, a list past 64 addresses overflowed, lengths off by one.
    let table = |unicast, multicast, malformed| Payload::MacTable {
        unicast,
        multicast,
        seed: 7,
        malformed,
    };
    let tables = vec![
        post(table(1, 2, 0), 1),
        post(table(0, 65, 0), 1),
        C::Process,
        post(table(3, 0, 1), 1),
        post(table(3, 0, -1), 1),
        C::Process,
    ];
    seeds.push((
        "mac_tables",
        ctrl_input(1, 8, tables),
        ctrl::Outcome {
            oks: 2,
            errs: 2,
            ..Default::default()
        },
    ));

    // A head out of range breaks the queue; a later command is not processed.
    let hostile = vec![
        post(exact(0, &[0]), 1),
        C::Process,
        C::Publish(vec![99]),
        C::Process,
        post(exact(0, &[1]), 1),
        C::Process,
    ];
    seeds.push((
        "head_out_of_range",
        ctrl_input(1, 4, hostile),
        ctrl::Outcome {
            oks: 1,
            broken: Some(String::new()),
            ..Default::default()
        },
    ));
    // A descriptor pointing outside memory.
    let hostile = vec![
        C::WriteDesc {
            index: 0,
            desc: RawDesc {
                addr: Addr::Raw(1 << 40),
                len: Len::Small(8),
                flags: 0,
                next: 0,
            },
        },
        C::Publish(vec![0]),
        C::Process,
    ];
    seeds.push((
        "descriptor_outside_memory",
        ctrl_input(1, 1, hostile),
        ctrl::Outcome {
            broken: Some(String::new()),
            ..Default::default()
        },
    ));
    seeds
}

#[test]
fn ctrl_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, want) in ctrl_seeds() {
        let bytes = input.to_bytes();
        let decoded: CtrlInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        let mut got = ctrl::run(&input);
        // Only whether it broke, not why.
        got.broken = got.broken.map(|_| String::new());
        assert_eq!(got, want, "{name}");
        files.push((name, bytes));
    }
    write_corpus("ctrl_queue", &files);
    replay("ctrl_queue", |b| {
        if let Some(i) = crate::decode::<CtrlInput>(b) {
            ctrl::run(&i);
        }
    });
}
