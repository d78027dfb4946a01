//! The `fdb` target: the switch's MAC learning table and forwarding decision
//! (`virtnet_backend::switch`: `Fdb`, `Ports`, `decide`) against their reference model
//! (`switch::model`, compiled with the backend's `fuzzing` feature), through any sequence of
//! operations, one variant per public call: add a port (none, checked or unchecked address,
//! a learn limit), remove one, learn or announce a MAC, look one up, let time pass, age, set a
//! port's receive filter, and decide a frame then learn from it as a worker would.
//!
//! `switch::model::run` checks after every step, and panics at the first difference:
//!
//! - every result (learning outcomes, refused configurations, lookups, aging counts,
//!   decisions: the destination set or the drop reason, and what is left to learn) is the
//!   model's;
//! - every entry (port, static or learned, age), each port's learned count, reservation and
//!   drop counters, and the FDB's counters are the model's;
//! - the table never holds more than its capacity, and its memory (its slots) never changes.
//!
//! Ports, MACs and times are small numbers the model maps (`switch::model::mac`): six ports,
//! MAC 0 zero, 1 broadcast, 2 and 3 multicast, the rest unicast; a capacity of 12 entries, an
//! age of 3 s and a move hold of 0.5 s, so that conflicts, limits, moves and aging come fast.

use arbitrary::Arbitrary;
use virtnet_backend::switch::model::{self, Filter, Op};

use crate::encode::{variant, Encode};
use crate::encode_struct;

pub use virtnet_backend::switch::model::Outcome;

/// A receive filter: `flags` as `switch::model::Filter` reads them, MACs by number.
#[derive(Arbitrary, Clone, Debug, Default, PartialEq, Eq)]
pub struct RxFilter {
    pub flags: u8,
    pub mac: Option<u8>,
    pub unicast: Vec<u8>,
    pub multicast: Vec<u8>,
}
encode_struct!(RxFilter {
    flags,
    mac,
    unicast,
    multicast
});

/// One step: see [`Op`], which each variant becomes.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum FdbOp {
    AddPort {
        port: u8,
        address: u8,
        mac: u8,
        learn_limit: u8,
    },
    RemovePort(u8),
    Learn {
        port: u8,
        mac: u8,
        announce: bool,
    },
    Lookup(u8),
    Advance(u16),
    Age,
    SetFilter {
        port: u8,
        filter: RxFilter,
    },
    Decide {
        port: u8,
        dst: u8,
        src: u8,
        announce: bool,
    },
}

impl FdbOp {
    fn to_op(&self) -> Op {
        match self.clone() {
            FdbOp::AddPort {
                port,
                address,
                mac,
                learn_limit,
            } => Op::AddPort {
                port,
                address,
                mac,
                learn_limit,
            },
            FdbOp::RemovePort(port) => Op::RemovePort { port },
            FdbOp::Learn {
                port,
                mac,
                announce,
            } => Op::Learn {
                port,
                mac,
                announce,
            },
            FdbOp::Lookup(mac) => Op::Lookup { mac },
            FdbOp::Advance(ms) => Op::Advance { ms },
            FdbOp::Age => Op::Age,
            FdbOp::SetFilter { port, filter } => Op::SetFilter {
                port,
                filter: Filter {
                    flags: filter.flags,
                    mac: filter.mac,
                    unicast: filter.unicast,
                    multicast: filter.multicast,
                },
            },
            FdbOp::Decide {
                port,
                dst,
                src,
                announce,
            } => Op::Decide {
                port,
                dst,
                src,
                announce,
            },
        }
    }
}

impl Encode for FdbOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 8;
        match self {
            FdbOp::AddPort {
                port,
                address,
                mac,
                learn_limit,
            } => {
                variant(0, N, out);
                [*port, *address, *mac, *learn_limit].encode(out);
            }
            FdbOp::RemovePort(port) => (variant(1, N, out), port.encode(out)).1,
            FdbOp::Learn {
                port,
                mac,
                announce,
            } => {
                variant(2, N, out);
                [*port, *mac].encode(out);
                announce.encode(out);
            }
            FdbOp::Lookup(mac) => (variant(3, N, out), mac.encode(out)).1,
            FdbOp::Advance(ms) => (variant(4, N, out), ms.encode(out)).1,
            FdbOp::Age => variant(5, N, out),
            FdbOp::SetFilter { port, filter } => {
                variant(6, N, out);
                port.encode(out);
                filter.encode(out);
            }
            FdbOp::Decide {
                port,
                dst,
                src,
                announce,
            } => {
                variant(7, N, out);
                [*port, *dst, *src].encode(out);
                announce.encode(out);
            }
        }
    }
}

/// A whole `fdb` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct FdbInput {
    pub ops: Vec<FdbOp>,
}
encode_struct!(FdbInput { ops });

/// Runs `input` on the switch and its model: panics at the first difference.
pub fn run(input: &FdbInput) -> Outcome {
    let ops: Vec<Op> = input.ops.iter().map(FdbOp::to_op).collect();
    model::run(&ops)
}
