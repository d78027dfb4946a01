//! Why the switch refused a configuration: the operator's, never a guest's (a guest's frames
//! are dropped and counted, not refused with an error).

use super::mac::Mac;
use super::port::PortId;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// An FDB larger than the table takes.
    #[error("FDB capacity {capacity} is above the most, {max}")]
    Capacity { capacity: usize, max: usize },
    #[error("port {port} is already on the switch")]
    PortExists { port: PortId },
    /// A port's own MAC must be one a frame may come from: not multicast, not zero.
    #[error("port {port}: {mac} cannot be a port's address (multicast or zero)")]
    InvalidMac { port: PortId, mac: Mac },
    /// Another port has this MAC as its own.
    #[error("port {port}: {mac} is already port {owner}'s address")]
    MacInUse {
        port: PortId,
        mac: Mac,
        owner: PortId,
    },
    /// The port's entries (its learn limit, plus its own MAC) do not fit in what the other
    /// ports left of the FDB's capacity.
    #[error("port {port} needs {need} FDB entries, {free} are left")]
    NoRoom {
        port: PortId,
        need: usize,
        free: usize,
    },
}
