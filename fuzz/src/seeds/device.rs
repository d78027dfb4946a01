//! The `device_queue` seeds: a `DeviceQueue` facing an honest driver (round trips, indirect
//! chains, event-idx batching, index wrap, overlapping rings, read chains with and without
//! IN_ORDER), then each hostile case of the vring unit tests, which must break the queue with
//! its named error.

use vring::Error;

use super::{replay, write_corpus};
use crate::device::{self, DeviceInput, DeviceOp as D, DeviceSetup, UsedHead};
use crate::encode::Encode;
use crate::mem::{Placement, DEV_INDIRECT};
use crate::rings::{Addr, AvailRing, Len, RawDesc, Scribble, UsedRing};
use crate::walk::{INDIRECT as IND, NEXT, WRITE};

fn desc(addr: Addr, len: u32, flags: u16, next: u16) -> RawDesc {
    let len = match len {
        0..=255 => Len::Small(len as u8),
        256..=65535 => Len::Medium(len as u16),
        _ => Len::Raw(len),
    };
    RawDesc {
        addr,
        len,
        flags,
        next,
    }
}

/// A descriptor for a 4 KiB slot `i` of the data area, as the vring unit tests' `buf`.
pub(super) fn data(i: u16, len: u32, flags: u16, next: u16) -> RawDesc {
    desc(Addr::Data(i * 4096), len, flags, next)
}

pub(super) fn device(size: u16) -> DeviceInput {
    DeviceInput {
        setup: DeviceSetup {
            size_log2: size.trailing_zeros() as u8,
            event_idx: false,
            indirect: false,
            notify_on_empty: false,
            in_order: false,
            placement: Placement::Separate,
            next_avail: 0,
        },
        descs: Vec::new(),
        avail: AvailRing::default(),
        used: UsedRing::default(),
        indirect: Vec::new(),
        ops: Vec::new(),
    }
}

/// `heads` published from avail index 0.
fn avail(heads: &[u16]) -> AvailRing {
    AvailRing {
        idx: heads.len() as u16,
        ring: heads.to_vec(),
        ..AvailRing::default()
    }
}

/// Every fallible call once, after the queue broke.
fn after_break() -> Vec<D> {
    vec![
        D::Pop,
        D::PopInto,
        D::AddUsed {
            head: UsedHead::Raw(0),
            len: 0,
        },
        D::AddUsedRead(UsedHead::Raw(0)),
        D::EnableNotification,
        D::AvailPending,
        D::NeedsNotification,
        D::Flush,
    ]
}

/// Pops whatever is there and hands it back used.
fn serve(n: usize, len: u32) -> Vec<D> {
    let mut ops = Vec::new();
    for _ in 0..n {
        ops.push(D::Pop);
        ops.push(D::AddUsed {
            head: UsedHead::Popped(0),
            len,
        });
    }
    ops
}

type DeviceSeed = (&'static str, DeviceInput, Option<fn(&Error) -> bool>);

/// Device-side seeds: (name, input, the error it must break with, if any).
fn device_seeds() -> Vec<DeviceSeed> {
    let mut seeds: Vec<DeviceSeed> = Vec::new();
    let mut add = |name, input, want| seeds.push((name, input, want));

    // A chain round trip: two readable and one writable buffer, popped, used, published.
    let mut i = device(8);
    i.descs = vec![
        data(0, 10, NEXT, 1),
        data(1, 20, NEXT, 2),
        data(2, 30, WRITE, 0),
    ];
    i.avail = avail(&[0]);
    i.ops = vec![
        D::Pop,
        D::AddUsed {
            head: UsedHead::Popped(0),
            len: 25,
        },
        D::NeedsNotification,
        D::Pop,
        D::EnableNotification,
        D::DisableNotification,
        D::AvailPending,
    ];
    add("round_trip", i, None);

    // An indirect chain of three, popped into a reused Chain, twice (undo in between).
    let mut i = device(8);
    i.setup.indirect = true;
    i.descs = vec![desc(Addr::Indirect(0), 48, IND, 0)];
    i.indirect = vec![
        data(0, 64, NEXT, 1),
        data(1, 64, NEXT, 2),
        data(2, 128, WRITE, 0),
    ];
    i.avail = avail(&[0]);
    i.ops = vec![
        D::PopInto,
        D::UndoPop(1),
        D::PopInto,
        D::AddUsed {
            head: UsedHead::Popped(0),
            len: 128,
        },
        D::Flush,
    ];
    add("indirect_chain", i, None);

    // A mixed chain: a direct readable descriptor, then an indirect table for the rest.
    let mut i = device(4);
    i.setup.indirect = true;
    i.descs = vec![
        data(0, 12, NEXT, 1),
        desc(Addr::Indirect(0x100), 32, IND, 0),
    ];
    i.indirect = vec![RawDesc { ..data(0, 0, 0, 0) }; 16];
    i.indirect.push(data(1, 1500, NEXT, 1));
    i.indirect.push(data(2, 1500, WRITE, 0));
    i.avail = avail(&[0]);
    i.ops = serve(1, 100);
    add("direct_then_indirect", i, None);

    // Event idx: the driver publishes over time, the device batches and decides notifications.
    let mut i = device(16);
    i.setup.event_idx = true;
    i.descs = (0..16).map(|k| data(k, 256, WRITE, 0)).collect();
    i.ops = vec![D::Publish(vec![0, 1, 2, 3]), D::SetUsedBatch(2)];
    i.ops.extend(serve(4, 256));
    i.ops.extend([
        D::SetUsedEvent(5),
        D::NeedsNotification,
        D::EnableNotification,
        D::Publish(vec![4, 5, 6, 7, 8, 9]),
        D::AvailPending,
        D::EnableNotification,
        D::DisableNotification,
    ]);
    i.ops.extend(serve(6, 1));
    i.ops
        .extend([D::NeedsNotification, D::Flush, D::NeedsNotification]);
    add("event_idx_batches", i, None);

    // Flag mode with NOTIFY_ON_EMPTY, contiguous rings, the driver asking for no interrupts.
    let mut i = device(4);
    i.setup.notify_on_empty = true;
    i.setup.placement = Placement::Contiguous;
    i.descs = (0..4).map(|k| data(k, 64, 0, 0)).collect();
    i.avail = avail(&[0, 1]);
    i.avail.flags = 1;
    i.ops = serve(2, 0);
    i.ops.extend([D::NeedsNotification, D::DisableNotification]);
    i.ops
        .extend([D::Publish(vec![2, 3]), D::EnableNotification]);
    i.ops.extend(serve(2, 0));
    i.ops.push(D::NeedsNotification);
    add("notify_on_empty_contiguous", i, None);

    // The avail index wraps: the device starts at 65535 (SET_VRING_BASE) on a queue of one.
    let mut i = device(1);
    i.setup.next_avail = u16::MAX;
    i.descs = vec![data(0, 8, WRITE, 0)];
    i.avail = AvailRing {
        idx: 0,
        ring: vec![0],
        ..AvailRing::default()
    };
    i.used.idx = u16::MAX;
    i.ops = serve(1, 8);
    i.ops.extend([D::Flush, D::Publish(vec![0])]);
    i.ops.extend(serve(1, 8));
    i.ops.push(D::NeedsNotification);
    add("index_wrap_size_1", i, None);

    // Buffers in the second region, one ending exactly at its end.
    let mut i = device(2);
    i.descs = vec![
        desc(Addr::Region1(0), 16, NEXT, 1),
        desc(Addr::Region1(0xff0), 16, WRITE, 0),
    ];
    i.avail = avail(&[0]);
    i.ops = serve(1, 16);
    add("second_region", i, None);

    // Rings overlapping each other (the driver may configure that).
    let mut i = device(2);
    i.setup.placement = Placement::Custom {
        desc: 0,
        avail: 8,
        used: 4,
    };
    i.ops = vec![D::Publish(vec![0]), D::Pop, D::Pop];
    add("overlapping_rings", i, None);

    // An indirect table not 8-aligned: read by copy, entry by entry.
    let mut i = device(8);
    i.setup.indirect = true;
    i.descs = vec![desc(Addr::Indirect(4), 32, IND, 0)];
    i.avail = avail(&[0]);
    let mut table = data(0, 64, NEXT, 1).bytes().to_vec();
    table.extend(data(1, 128, WRITE, 0).bytes());
    i.ops = vec![D::Scribble(Scribble {
        offset: DEV_INDIRECT as u32 + 4,
        bytes: table,
    })];
    i.ops.extend(serve(1, 128));
    add("unaligned_indirect_table", i, None);

    // IN_ORDER: three frames sent, an rx-like chain written, two more sent (the unit test
    // `read_chains_get_one_used_element_per_run_with_in_order`): runs of one element each,
    // ended by the written chain's element and by the flush. Then runs ended by a batch of
    // two, by `needs_notification` and by `enable_notification`, the ring's index wrapping,
    // and one left open when the input ends.
    let sent = |i: &mut DeviceInput, n: usize| {
        i.ops
            .extend((0..n).flat_map(|_| [D::Pop, D::AddUsedRead(UsedHead::Popped(0))]))
    };
    let mut i = device(8);
    i.setup.in_order = true;
    i.descs = (0..8).map(|k| data(k, 60, 0, 0)).collect();
    i.descs[3] = data(3, 1500, WRITE, 0);
    i.avail = avail(&[0, 1, 2, 3, 4, 5]);
    sent(&mut i, 3);
    i.ops.extend(serve(1, 7));
    sent(&mut i, 2);
    i.ops.extend([
        D::Flush,
        D::Publish(vec![6, 7, 0, 1, 2]),
        D::SetUsedBatch(2),
    ]);
    sent(&mut i, 3);
    i.ops.push(D::NeedsNotification);
    sent(&mut i, 1);
    i.ops
        .extend([D::DisableNotification, D::EnableNotification]);
    i.ops
        .extend([D::Publish(vec![4, 5, 6]), D::SetUsedBatch(8)]);
    sent(&mut i, 3);
    add("in_order_read_runs", i, None);

    // The same calls without IN_ORDER: an element per read chain, of length 0.
    let mut i = device(4);
    i.descs = (0..4).map(|k| data(k, 60, 0, 0)).collect();
    i.avail = avail(&[0, 1, 2, 3]);
    sent(&mut i, 2);
    i.ops.extend(serve(1, 0));
    sent(&mut i, 1);
    i.ops.push(D::Flush);
    add("read_chains_without_in_order", i, None);

    // ---- Each hostile case of the vring unit tests, then every call once more.
    let hostile = |size: u16, indirect: bool, descs: Vec<RawDesc>, table: Vec<RawDesc>| {
        let mut i = device(size);
        i.setup.indirect = indirect;
        i.descs = descs;
        i.indirect = table;
        i.avail = avail(&[0]);
        i.ops = after_break();
        i
    };
    let mut i = hostile(8, false, vec![], vec![]);
    i.avail.idx = 9;
    add(
        "avail_idx_too_far",
        i,
        Some(|e| matches!(e, Error::AvailIdxOutOfRange { .. })),
    );
    let mut i = hostile(8, false, vec![], vec![]);
    i.avail = avail(&[8]);
    add(
        "head_out_of_range",
        i,
        Some(|e| matches!(e, Error::HeadOutOfRange { .. })),
    );
    add(
        "next_out_of_range",
        hostile(8, false, vec![data(0, 64, NEXT, 12)], vec![]),
        Some(|e| matches!(e, Error::NextOutOfRange { .. })),
    );
    add(
        "descriptor_loop",
        hostile(
            8,
            false,
            vec![data(0, 64, NEXT, 1), data(0, 64, NEXT, 0)],
            vec![],
        ),
        Some(|e| matches!(e, Error::ChainLoop { .. })),
    );
    add(
        "buffer_outside_memory",
        hostile(8, false, vec![desc(Addr::Data(0xfff6), 64, 0, 0)], vec![]),
        Some(|e| matches!(e, Error::BufferOutOfMemory { .. })),
    );
    add(
        "buffer_wrapping_address",
        hostile(
            8,
            false,
            vec![desc(Addr::Raw(u64::MAX - 1), 64, 0, 0)],
            vec![],
        ),
        Some(|e| matches!(e, Error::BufferOutOfMemory { .. })),
    );
    add(
        "buffer_across_region_end",
        hostile(8, false, vec![desc(Addr::Region1(0xff0), 32, 0, 0)], vec![]),
        Some(|e| matches!(e, Error::BufferOutOfMemory { .. })),
    );
    add(
        "readable_after_writable",
        hostile(
            8,
            false,
            vec![data(0, 64, NEXT | WRITE, 1), data(0, 64, 0, 0)],
            vec![],
        ),
        Some(|e| matches!(e, Error::ReadableAfterWritable { .. })),
    );
    add(
        "indirect_not_negotiated",
        hostile(8, false, vec![desc(Addr::Indirect(0), 32, IND, 0)], vec![]),
        Some(|e| matches!(e, Error::IndirectNotNegotiated { .. })),
    );
    add(
        "indirect_with_next",
        hostile(
            8,
            true,
            vec![desc(Addr::Indirect(0), 32, IND | NEXT, 1)],
            vec![],
        ),
        Some(|e| matches!(e, Error::IndirectWithNext { .. })),
    );
    add(
        "indirect_length_0",
        hostile(8, true, vec![desc(Addr::Indirect(0), 0, IND, 0)], vec![]),
        Some(|e| matches!(e, Error::IndirectBadLength { .. })),
    );
    add(
        "indirect_length_24",
        hostile(8, true, vec![desc(Addr::Indirect(0), 24, IND, 0)], vec![]),
        Some(|e| matches!(e, Error::IndirectBadLength { .. })),
    );
    add(
        "indirect_too_large",
        hostile(
            8,
            true,
            vec![desc(Addr::Indirect(0), 16 * 9, IND, 0)],
            vec![],
        ),
        Some(|e| matches!(e, Error::IndirectTooLarge { .. })),
    );
    add(
        "indirect_outside_memory",
        hostile(8, true, vec![desc(Addr::Data(0xfff0), 32, IND, 0)], vec![]),
        Some(|e| matches!(e, Error::IndirectOutOfMemory { .. })),
    );
    add(
        "nested_indirect",
        hostile(
            8,
            true,
            vec![desc(Addr::Indirect(0), 32, IND, 0)],
            vec![data(0, 64, NEXT, 1), desc(Addr::Indirect(0), 16, IND, 0)],
        ),
        Some(|e| matches!(e, Error::NestedIndirect { .. })),
    );
    add(
        "indirect_loop",
        hostile(
            8,
            true,
            vec![desc(Addr::Indirect(0), 32, IND, 0)],
            vec![data(0, 64, NEXT, 1), data(0, 64, NEXT, 0)],
        ),
        Some(|e| matches!(e, Error::ChainLoop { .. })),
    );
    add(
        "indirect_next_out_of_range",
        hostile(
            8,
            true,
            vec![desc(Addr::Indirect(0), 32, IND, 0)],
            vec![data(0, 64, NEXT, 2)],
        ),
        Some(|e| matches!(e, Error::NextOutOfRange { .. })),
    );
    seeds
}

#[test]
fn device_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, want) in device_seeds() {
        let bytes = input.to_bytes();
        let decoded: DeviceInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        let out = device::run(&input).unwrap_or_else(|| panic!("{name}: did not activate"));
        match (want, &out.broken) {
            (None, None) => assert!(out.popped > 0 || name == "overlapping_rings", "{name}"),
            (Some(want), Some(e)) => assert!(want(e), "{name}: broke with {e}"),
            (_, got) => panic!("{name}: broke with {got:?}"),
        }
        files.push((name, bytes));
    }
    write_corpus("device_queue", &files);
    replay("device_queue", |b| {
        if let Some(i) = crate::decode::<DeviceInput>(b) {
            device::run(&i);
        }
    });
}
