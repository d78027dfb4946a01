//! `virtnet switch`'s forwarding core: the learning L2 switch that forwards frames between
//! many vhost-user ports (each a guest's virtio-net device) and a TAP uplink, as a Linux
//! bridge does. Pure logic, no I/O and no threads of its own: the callers (the ports'
//! workers) pass in each frame's addresses and the time, and get back where it goes.
//!
//! - [`filter`]: a port's receive filter, as its driver sets it on the control queue;
//! - [`mac`], [`port`]: MAC addresses; port numbers and sets of them.

pub mod filter;
pub mod mac;
pub mod port;

pub use filter::RxFilter;
pub use mac::Mac;
pub use port::{PortId, PortSet, MAX_PORTS};
