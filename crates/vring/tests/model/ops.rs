//! What proptest generates: the queue's shape with an optional prefix of round trips, and
//! the public calls of either side.

use proptest::prelude::*;
use proptest::sample::Index;
use vring::{Buf, GuestAddress};

/// Guest memory: the rings, then the driver's indirect tables, then the data slots.
pub const RING_BASE: GuestAddress = GuestAddress(0x1000);
pub const INDIRECT_BASE: GuestAddress = GuestAddress(0x1_0000);
pub const DATA_BASE: u64 = 0x2_0000;
/// Buffers sit in 4 KiB slots of the data area.
const DATA_SLOTS: u8 = 32;
pub const MEM_SIZE: usize = 0x4_0000;
/// The most buffers on each side of a chain.
const MAX_BUFS: usize = 5;

#[derive(Clone, Copy, Debug)]
pub struct BufSpec {
    pub slot: u8,
    pub len: u32,
}

impl BufSpec {
    pub fn buf(self) -> Buf {
        Buf::new(GuestAddress(DATA_BASE + self.slot as u64 * 4096), self.len)
    }
}

/// One public call on one side; `wait`/`sleep` say whether the caller blocks when the call
/// says nothing is pending.
#[derive(Clone, Debug)]
pub enum Op {
    // Driver.
    Add {
        out: Vec<BufSpec>,
        in_: Vec<BufSpec>,
    },
    KickPrepare,
    GetUsed,
    DisableCb,
    EnableCb {
        wait: bool,
    },
    EnableCbDelayed {
        wait: bool,
    },
    /// Waits relying on the callbacks left enabled, after `get_used` found nothing (what a
    /// driver without NAPI-style polling does: `get_used` keeps moving `used_event`).
    Wait,
    // Device.
    Pop,
    AddUsed {
        pick: Index,
        len: u32,
    },
    Flush,
    NeedsNotification,
    EnableNotification {
        sleep: bool,
    },
    DisableNotification,
    SetUsedBatch(u16),
}

/// The queue's shape, and an optional run of round trips before the random operations.
#[derive(Clone, Debug)]
pub struct Setup {
    pub size: u16,
    pub event_idx: bool,
    pub indirect: bool,
    pub max_chain: u16,
    /// Round trips (add, kick_prepare, pop, add_used, flush, get_used) run first.
    pub prefix: u32,
    /// In the prefix, which round trips end with `needs_notification` rather than `flush`.
    pub prefix_notify: PrefixNotify,
    /// Callbacks disabled during the prefix (the driver polls).
    pub prefix_cb_disabled: bool,
    /// The driver reuses freed descriptors oldest first (`set_fifo_reuse`).
    pub fifo_reuse: bool,
    /// VIRTIO_F_IN_ORDER: the device uses chains in the order it popped them, the driver
    /// reclaims in avail order.
    pub in_order: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum PrefixNotify {
    Every(u32),
    /// Only round trip `k`: `signalled_used` then goes stale as the used index wraps past it.
    Once(u32),
    Never,
}

impl PrefixNotify {
    pub fn at(self, i: u32) -> bool {
        match self {
            PrefixNotify::Every(n) => i.is_multiple_of(n),
            PrefixNotify::Once(k) => i == k,
            PrefixNotify::Never => false,
        }
    }
}

fn buf_spec() -> impl Strategy<Value = BufSpec> {
    let len = prop_oneof![1 => Just(0u32), 9 => 1u32..=4096];
    (0..DATA_SLOTS, len).prop_map(|(slot, len)| BufSpec { slot, len })
}

pub fn op() -> impl Strategy<Value = Op> {
    let bufs = || prop::collection::vec(buf_spec(), 0..=MAX_BUFS);
    prop_oneof![
        6 => (bufs(), bufs()).prop_map(|(out, in_)| Op::Add { out, in_ }),
        3 => Just(Op::KickPrepare),
        4 => Just(Op::GetUsed),
        1 => Just(Op::DisableCb),
        1 => any::<bool>().prop_map(|wait| Op::EnableCb { wait }),
        1 => any::<bool>().prop_map(|wait| Op::EnableCbDelayed { wait }),
        1 => Just(Op::Wait),
        5 => Just(Op::Pop),
        5 => (any::<Index>(), any::<u32>()).prop_map(|(pick, len)| Op::AddUsed { pick, len }),
        1 => Just(Op::Flush),
        2 => Just(Op::NeedsNotification),
        2 => any::<bool>().prop_map(|sleep| Op::EnableNotification { sleep }),
        1 => Just(Op::DisableNotification),
        1 => (0u16..=70).prop_map(Op::SetUsedBatch),
    ]
}

pub fn setup() -> impl Strategy<Value = Setup> {
    let prefix = prop_oneof![
        6 => Just((0u32, PrefixNotify::Never)),
        // Near the wrap, notifying now and then.
        1 => (65_400u32..=65_800, 1u32..=1000)
            .prop_map(|(n, every)| (n, PrefixNotify::Every(every))),
        // One decision at round trip k, then the used index ends a few entries short of
        // wrapping past it: the random operations make the device's signalled_used stale.
        1 => (0u32..=300, 0u32..=4).prop_map(|(k, d)| (65_536 + k - d, PrefixNotify::Once(k))),
    ];
    (
        0u32..=6,
        any::<bool>(),
        any::<bool>(),
        2u16..=12,
        prefix,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                log2,
                event_idx,
                indirect,
                max_chain,
                (prefix, notify),
                cb_off,
                fifo_reuse,
                in_order,
            )| Setup {
                size: 1 << log2,
                event_idx,
                indirect,
                max_chain,
                prefix,
                prefix_notify: notify,
                prefix_cb_disabled: cb_off,
                fifo_reuse,
                in_order,
            },
        )
}
