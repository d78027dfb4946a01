//! The `device_queue` input: the queue as the driver configured it, the raw ring contents it
//! left in memory, and the steps: one per public `DeviceQueue` call, or the hostile driver
//! writing memory.

use arbitrary::Arbitrary;
use vring::Features;

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::mem::Placement;
use crate::rings::{AvailRing, RawDesc, Scribble, UsedRing};

/// The queue as the driver configured it.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSetup {
    /// Queue size `1 << (size_log2 % 9)`.
    pub size_log2: u8,
    pub event_idx: bool,
    pub indirect: bool,
    pub notify_on_empty: bool,
    pub in_order: bool,
    pub placement: Placement,
    /// Where the device starts popping (vhost-user's SET_VRING_BASE).
    pub next_avail: u16,
}
encode_struct!(DeviceSetup {
    size_log2,
    event_idx,
    indirect,
    notify_on_empty,
    in_order,
    placement,
    next_avail
});

impl DeviceSetup {
    pub fn features(&self) -> Features {
        let mut f = Features::EMPTY;
        for (on, bit) in [
            (self.event_idx, Features::RING_EVENT_IDX),
            (self.indirect, Features::RING_INDIRECT_DESC),
            (self.notify_on_empty, Features::NOTIFY_ON_EMPTY),
            (self.in_order, Features::IN_ORDER),
        ] {
            if on {
                f = f.union(bit);
            }
        }
        f
    }
}

/// Which head `add_used` or `add_used_read` hands back.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsedHead {
    /// The `n % len`th chain popped and not yet used (head 0 if there is none).
    Popped(u8),
    /// Any number: the device's own business, never checked by the queue.
    Raw(u16),
}

impl Encode for UsedHead {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            UsedHead::Popped(n) => (variant(0, 2, out), n.encode(out)),
            UsedHead::Raw(h) => (variant(1, 2, out), h.encode(out)),
        };
    }
}

/// One step: a `DeviceQueue` call, or the hostile driver writing memory.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    Pop,
    /// `pop_into` a `Chain` reused across the whole run.
    PopInto,
    AddUsed {
        head: UsedHead,
        len: u32,
    },
    /// `add_used_read`: the chain completed as one the device only read.
    AddUsedRead(UsedHead),
    Flush,
    NeedsNotification,
    EnableNotification,
    DisableNotification,
    AvailPending,
    SetUsedBatch(u16),
    /// `undo_pop(n % (k + 1))`, `k` being the chains popped since the last `add_used` or
    /// undo: the call's contract is to hand back chains popped and not used.
    UndoPop(u16),

    // ---- The hostile driver.
    /// Raw bytes anywhere in region 0: rings, tables, indices, data.
    Scribble(Scribble),
    /// Descriptor `index % size` of the table.
    WriteDesc {
        index: u16,
        desc: RawDesc,
    },
    /// Entry `slot` of the indirect area.
    WriteIndirect {
        slot: u8,
        desc: RawDesc,
    },
    /// Puts `heads` on the avail ring from the current `avail.idx` and moves it past them, as a
    /// driver does.
    Publish(Vec<u16>),
    SetAvailIdx(u16),
    SetAvailFlags(u16),
    SetUsedEvent(u16),
}

impl Encode for DeviceOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 18;
        match self {
            DeviceOp::Pop => variant(0, N, out),
            DeviceOp::PopInto => variant(1, N, out),
            DeviceOp::AddUsed { head, len } => {
                variant(2, N, out);
                head.encode(out);
                len.encode(out);
            }
            DeviceOp::AddUsedRead(head) => (variant(3, N, out), head.encode(out)).1,
            DeviceOp::Flush => variant(4, N, out),
            DeviceOp::NeedsNotification => variant(5, N, out),
            DeviceOp::EnableNotification => variant(6, N, out),
            DeviceOp::DisableNotification => variant(7, N, out),
            DeviceOp::AvailPending => variant(8, N, out),
            DeviceOp::SetUsedBatch(b) => (variant(9, N, out), b.encode(out)).1,
            DeviceOp::UndoPop(n) => (variant(10, N, out), n.encode(out)).1,
            DeviceOp::Scribble(s) => (variant(11, N, out), s.encode(out)).1,
            DeviceOp::WriteDesc { index, desc } => {
                variant(12, N, out);
                index.encode(out);
                desc.encode(out);
            }
            DeviceOp::WriteIndirect { slot, desc } => {
                variant(13, N, out);
                slot.encode(out);
                desc.encode(out);
            }
            DeviceOp::Publish(heads) => (variant(14, N, out), heads.encode(out)).1,
            DeviceOp::SetAvailIdx(v) => (variant(15, N, out), v.encode(out)).1,
            DeviceOp::SetAvailFlags(v) => (variant(16, N, out), v.encode(out)).1,
            DeviceOp::SetUsedEvent(v) => (variant(17, N, out), v.encode(out)).1,
        }
    }
}

/// A whole `device_queue` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct DeviceInput {
    pub setup: DeviceSetup,
    /// The descriptor table from entry 0 (entries past the size are ignored).
    pub descs: Vec<RawDesc>,
    pub avail: AvailRing,
    pub used: UsedRing,
    /// The indirect area from its start (at most 256 entries).
    pub indirect: Vec<RawDesc>,
    pub ops: Vec<DeviceOp>,
}
encode_struct!(DeviceInput {
    setup,
    descs,
    avail,
    used,
    indirect,
    ops
});
