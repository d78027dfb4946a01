//! The `ctrl_queue` input: the device's shape, the commands a driver posts (known, exact,
//! raw, too long) and how it cuts them into buffers, and the hostile driver's writes.

use arbitrary::Arbitrary;

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::rings::{RawDesc, Scribble};

/// The device and its control queue.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlSetup {
    /// Queue pairs `1 + pairs % 4`.
    pub pairs: u8,
    /// Control queue size `1 << (size_log2 % 4)`: 1 to 8.
    pub size_log2: u8,
    pub event_idx: bool,
    /// INDIRECT_DESC: chains of more than one buffer go in an indirect table.
    pub indirect: bool,
}
encode_struct!(CtrlSetup {
    pairs,
    size_log2,
    event_idx,
    indirect
});

/// The device-readable bytes of a command.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Command `KNOWN[which % 8]` with `data` as its data bytes, whatever their length.
    Known { which: u8, data: Vec<u8> },
    /// Command `KNOWN[which % 8]` with data of exactly the length it needs, from `data`
    /// (zero-padded).
    Exact { which: u8, data: Vec<u8> },
    /// Any bytes.
    Raw(Vec<u8>),
    /// `MAX_COMMAND + 1 + extra` zero bytes: longer than the device reads.
    Long(u8),
    /// MAC_TABLE_SET with `unicast` and `multicast` addresses (past 64, a list overflows),
    /// made from `seed`; then, when `malformed` is not 0, that many zero bytes more (above 0)
    /// or fewer (below 0).
    MacTable {
        unicast: u8,
        multicast: u8,
        seed: u8,
        malformed: i8,
    },
}

impl Encode for Payload {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Payload::Known { which, data } => {
                (variant(0, 5, out), which.encode(out), data.encode(out)).0
            }
            Payload::Exact { which, data } => {
                (variant(1, 5, out), which.encode(out), data.encode(out)).0
            }
            Payload::Raw(b) => (variant(2, 5, out), b.encode(out)).0,
            Payload::Long(n) => (variant(3, 5, out), n.encode(out)).0,
            Payload::MacTable {
                unicast,
                multicast,
                seed,
                malformed,
            } => {
                variant(4, 5, out);
                unicast.encode(out);
                multicast.encode(out);
                seed.encode(out);
                malformed.encode(out);
            }
        }
    }
}

/// The device's command size limit (`ctrlq::MAX_COMMAND`).
pub const MAX_COMMAND: usize = 4096;

/// (class, command, data bytes) of every command the device implements (spec 5.1.6.5).
pub const KNOWN: [(u8, u8, usize); 8] = [
    (0, 0, 1),  // RX PROMISC
    (0, 1, 1),  // RX ALLMULTI
    (1, 1, 6),  // MAC ADDR_SET
    (4, 0, 2),  // MQ VQ_PAIRS_SET
    (6, 0, 8),  // NOTF_COAL TX_SET
    (6, 1, 8),  // NOTF_COAL RX_SET
    (6, 2, 12), // NOTF_COAL VQ_SET
    (6, 3, 4),  // NOTF_COAL VQ_GET
];

impl Payload {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Payload::Known { which, data } | Payload::Exact { which, data } => {
                let (class, command, need) = KNOWN[*which as usize % KNOWN.len()];
                let mut b = vec![class, command];
                b.extend(data);
                if matches!(self, Payload::Exact { .. }) {
                    b.resize(2 + need, 0);
                }
                b
            }
            Payload::Raw(b) => b.clone(),
            Payload::Long(n) => vec![0; MAX_COMMAND + 1 + *n as usize],
            Payload::MacTable {
                unicast,
                multicast,
                seed,
                malformed,
            } => {
                let mut b = vec![1, 0];
                for (n, first) in [(*unicast, 0x02), (*multicast, 0x33)] {
                    b.extend((n as u32).to_le_bytes());
                    (0..n).for_each(|i| b.extend([first, 0x33, 0, 0, *seed, i]));
                }
                let len = b.len() as isize + *malformed as isize;
                b.resize(len.max(2) as usize, 0);
                b
            }
        }
    }
}

/// One step.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum CtrlOp {
    /// The driver posts a command: its bytes cut into readable buffers of the lengths in
    /// `cuts` (the rest in one last buffer), then writable buffers of the lengths in
    /// `writable`, and kicks.
    Post {
        payload: Payload,
        cuts: Vec<u8>,
        writable: Vec<u8>,
    },
    /// The device handles every pending command (the control thread woken by the kick).
    Process,

    // ---- The hostile driver: after any of these the model no longer applies.
    /// Descriptor `index % size` of the table.
    WriteDesc {
        index: u16,
        desc: RawDesc,
    },
    /// Puts `heads` on the avail ring from the current `avail.idx` and moves it past them.
    Publish(Vec<u16>),
    SetAvailIdx(u16),
    /// Raw bytes anywhere in region 0: rings, tables, buffers.
    Scribble(Scribble),
}

impl Encode for CtrlOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 6;
        match self {
            CtrlOp::Post {
                payload,
                cuts,
                writable,
            } => {
                variant(0, N, out);
                payload.encode(out);
                cuts.encode(out);
                writable.encode(out);
            }
            CtrlOp::Process => variant(1, N, out),
            CtrlOp::WriteDesc { index, desc } => {
                variant(2, N, out);
                index.encode(out);
                desc.encode(out);
            }
            CtrlOp::Publish(heads) => (variant(3, N, out), heads.encode(out)).1,
            CtrlOp::SetAvailIdx(v) => (variant(4, N, out), v.encode(out)).1,
            CtrlOp::Scribble(s) => (variant(5, N, out), s.encode(out)).1,
        }
    }
}

/// A whole `ctrl_queue` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct CtrlInput {
    pub setup: CtrlSetup,
    pub ops: Vec<CtrlOp>,
}
encode_struct!(CtrlInput { setup, ops });
