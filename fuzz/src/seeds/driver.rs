//! The `driver_queue` seeds: a `DriverQueue` facing an honest device (round trips, indirect
//! chains, out-of-order completions, FIFO reuse, event idx, flag mode), then a hostile device
//! for each check of `get_used`, each followed by a reset.

use vring::Error;

use super::{replay, write_corpus};
use crate::driver::{self, BufSpec, DriverInput, DriverOp as R, DriverSetup};
use crate::encode::Encode;
use crate::mem::Placement;
use crate::rings::{UsedElem, UsedRing};

pub(super) fn driver(size: u16) -> DriverInput {
    DriverInput {
        setup: DriverSetup {
            size_log2: size.trailing_zeros() as u8,
            event_idx: false,
            indirect: false,
            indirect_area: None,
            placement: Placement::Separate,
        },
        used: UsedRing::default(),
        ops: Vec::new(),
    }
}

fn bufs(n: u16, len: u16) -> Vec<BufSpec> {
    (0..n)
        .map(|i| BufSpec {
            offset: i * 4096,
            len,
        })
        .collect()
}

pub(super) fn add(out: u16, in_: u16) -> R {
    R::Add {
        out: bufs(out, 100),
        in_: bufs(in_, 1000),
    }
}

/// Completes the oldest chain honestly and reclaims it.
fn reclaim(n: usize) -> Vec<R> {
    let mut ops = Vec::new();
    for _ in 0..n {
        ops.push(R::Complete { pick: 0, len: 1000 });
        ops.push(R::GetUsed);
    }
    ops
}

/// After a break: every fallible call, a reset, and a clean round trip.
fn break_then_reset() -> Vec<R> {
    let mut ops = vec![
        R::GetUsed,
        add(1, 1),
        R::GetUsed,
        R::DetachUnused,
        add(1, 1),
    ];
    ops.push(R::Complete { pick: 0, len: 5 });
    ops.push(R::GetUsed);
    ops
}

type DriverSeed = (&'static str, DriverInput, Option<fn(&Error) -> bool>);

/// Driver-side seeds: (name, input, the error the last break must be, if any).
fn driver_seeds() -> Vec<DriverSeed> {
    let mut seeds: Vec<DriverSeed> = Vec::new();
    let mut seed = |name, input, want| seeds.push((name, input, want));

    // Round trip with an honest device, callbacks on and off.
    let mut i = driver(8);
    i.ops = vec![add(2, 1), add(1, 0), R::KickPrepare, R::UsedPending];
    i.ops.extend(reclaim(2));
    i.ops.extend([
        R::GetUsed,
        R::EnableCb,
        R::DisableCb,
        add(1, 1),
        R::Complete { pick: 0, len: 7 },
        R::UsedPending,
        R::EnableCbDelayed,
        R::GetUsed,
        R::Add {
            out: vec![],
            in_: vec![],
        },
    ]);
    seed("round_trip", i, None);

    // Indirect chains fill the queue one descriptor each, then a full queue, then a reset.
    let mut i = driver(8);
    i.setup.indirect = true;
    i.setup.indirect_area = Some(16);
    i.ops = (0..9).map(|_| add(2, 1)).collect();
    i.ops.extend(reclaim(8));
    i.ops
        .extend([add(1, 0), add(16, 1), add(8, 8), R::DetachUnused]);
    seed("indirect_chains", i, None);

    // Direct chains completed out of order; the free list must come back whole.
    let out_of_order = [
        add(3, 0),
        add(1, 1),
        add(2, 2),
        R::Complete { pick: 1, len: 1 },
        R::Complete { pick: 1, len: 1 },
        R::Complete { pick: 0, len: 0 },
        R::GetUsed,
        R::GetUsed,
        R::GetUsed,
        add(8, 0),
    ];
    let mut i = driver(8);
    i.ops = out_of_order.to_vec();
    i.ops.push(add(1, 0));
    seed("out_of_order_completions", i, None);

    // The same with FIFO descriptor reuse (bit 7 of size_log2), then laps of the whole ring.
    let mut i = driver(8);
    i.setup.size_log2 |= 0x80;
    i.ops = out_of_order.to_vec();
    i.ops.extend(reclaim(1));
    for _ in 0..3 {
        i.ops.extend((0..8).map(|_| add(0, 1)));
        i.ops.extend(reclaim(8));
    }
    seed("fifo_reuse", i, None);

    // Event idx: kicks follow avail_event, callbacks follow used_event.
    let mut i = driver(8);
    i.setup.event_idx = true;
    i.ops = vec![add(1, 0), R::KickPrepare, add(1, 0), R::KickPrepare];
    i.ops
        .extend([R::SetAvailEvent(2), add(1, 0), R::KickPrepare]);
    i.ops.extend([add(1, 0), R::EnableCbDelayed]);
    i.ops
        .extend([R::EnableCbAfter(1), R::EnableCbAfter(u16::MAX)]);
    i.ops.extend(reclaim(4));
    i.ops
        .extend([R::DisableCb, add(1, 1), R::Complete { pick: 0, len: 1 }]);
    i.ops.extend([R::EnableCb, R::GetUsed, R::EnableCb]);
    seed("event_idx", i, None);

    // Flag mode: the device asks for no kicks, then for kicks again.
    let mut i = driver(4);
    i.ops = vec![R::SetUsedFlags(1), add(1, 0), R::KickPrepare];
    i.ops
        .extend([R::SetUsedFlags(0), add(1, 0), R::KickPrepare]);
    i.ops.extend(reclaim(2));
    seed("flag_mode_kicks", i, None);

    // publish_on_kick: the device sees nothing until the kick.
    let mut i = driver(4);
    i.ops = vec![
        R::SetPublishOnKick(true),
        add(1, 1),
        R::Complete { pick: 0, len: 1 },
    ];
    i.ops
        .extend([R::KickPrepare, R::Complete { pick: 0, len: 1 }, R::GetUsed]);
    i.ops.extend([R::SetPublishOnKick(false), add(1, 0)]);
    i.ops.extend(reclaim(1));
    seed("publish_on_kick", i, None);

    // A queue of one, many rounds.
    let mut i = driver(1);
    i.setup.event_idx = true;
    for _ in 0..20 {
        i.ops.extend([add(1, 0), R::KickPrepare]);
        i.ops.extend(reclaim(1));
    }
    seed("size_1_rounds", i, None);

    // Rings overlapping each other: the driver's own writes land on one another.
    let mut i = driver(2);
    i.setup.placement = Placement::Custom {
        desc: 0,
        avail: 8,
        used: 2,
    };
    i.ops = vec![add(1, 1), R::GetUsed, R::KickPrepare];
    seed("overlapping_rings", i, None);

    // ---- The hostile device: each check of get_used, then a reset.
    let hostile = |elem: (u16, u32, u32), idx: u16| {
        let mut i = driver(8);
        i.ops = vec![add(1, 1), add(1, 0)];
        i.ops.push(R::WriteUsedElem {
            slot: elem.0,
            id: elem.1,
            len: elem.2,
        });
        i.ops.extend([R::SetUsedIdx(idx), R::GetUsed]);
        i.ops.extend(break_then_reset());
        i
    };
    seed(
        "used_id_out_of_range",
        hostile((0, 8, 0), 1),
        Some(|e| matches!(e, Error::UsedIdOutOfRange { .. })),
    );
    seed(
        "used_id_not_in_flight",
        hostile((0, 3, 0), 1),
        Some(|e| matches!(e, Error::UsedIdNotInFlight { .. })),
    );
    seed(
        "used_len_too_large",
        hostile((0, 0, 1001), 1),
        Some(|e| matches!(e, Error::UsedLenTooLarge { .. })),
    );
    seed(
        "used_idx_beyond_in_flight",
        hostile((0, 0, 0), 3),
        Some(|e| matches!(e, Error::UsedIdxOutOfRange { .. })),
    );
    // The same chain returned twice: the second return finds it no longer in flight.
    let mut i = driver(8);
    i.ops = vec![add(1, 1), add(1, 1)];
    i.ops.extend([
        R::WriteUsedElem {
            slot: 0,
            id: 0,
            len: 1,
        },
        R::WriteUsedElem {
            slot: 1,
            id: 0,
            len: 1,
        },
        R::SetUsedIdx(2),
        R::GetUsed,
        R::GetUsed,
        R::GetUsed,
        R::DetachUnused,
    ]);
    seed(
        "used_id_returned_twice",
        i,
        Some(|e| matches!(e, Error::UsedIdNotInFlight { .. })),
    );
    // Garbage in the used ring before the driver starts.
    let mut i = driver(4);
    i.used = UsedRing {
        flags: 1,
        idx: 3,
        elems: vec![UsedElem { id: 0, len: 0 }; 4],
        avail_event: 9,
    };
    i.ops = vec![add(1, 0), R::KickPrepare, R::GetUsed];
    i.ops.extend(break_then_reset());
    seed(
        "stale_used_ring",
        i,
        Some(|e| matches!(e, Error::UsedIdxOutOfRange { .. })),
    );
    seeds
}

#[test]
fn driver_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, want) in driver_seeds() {
        let bytes = input.to_bytes();
        let decoded: DriverInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        let out = driver::run(&input).unwrap_or_else(|| panic!("{name}: did not activate"));
        match want {
            None => {
                assert_eq!(out.broken, None, "{name}");
                // Overlapping rings are not a setup the harness can call honest.
                if name != "overlapping_rings" {
                    assert!(out.honest && out.reclaimed > 0, "{name}: {out:?}");
                }
            }
            // Hostile seeds end with a reset: their break is in the past; they must not be
            // honest, and the run must have got past the reset.
            Some(_) => assert!(!out.honest, "{name}"),
        }
        files.push((name, bytes));
    }
    write_corpus("driver_queue", &files);
    replay("driver_queue", |b| {
        if let Some(i) = crate::decode::<DriverInput>(b) {
            driver::run(&i);
        }
    });
}
