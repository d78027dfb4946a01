//! `virtnet switch`: a learning L2 switch that forwards frames between many vhost-user ports
//! (each a guest's virtio-net device, the backend's own) and a TAP uplink, as a Linux bridge
//! does, one copy per frame from guest to guest.
//!
//! Running it (threads and I/O):
//! - [`service`]: the running switch: its workers, the uplink's queues, the guest ports
//!   (added and removed at run time, each served on its socket), aging; [`ctl`]: its answers
//!   on `virtnet ctl` and /metrics;
//! - [`guest`]: a guest pair as a port (its tx frames forwarded by its own worker);
//!   [`sink`]: a guest pair's rx queue, into which any worker delivers; [`uplink`] and
//!   [`tap`]: the TAP uplink, reading and writing;
//! - [`core`]: one port's batch forwarded: decided, grouped by destination and pair,
//!   delivered; [`flow`]: a frame as the switch sees it, its addresses and its flow hash.
//!
//! The forwarding logic (pure, no I/O and no threads: the callers pass in each frame's
//! addresses and the time, and get back where it goes):
//! - [`fdb`]: the MAC learning table: learning, static entries, aging, moves, per-port
//!   limits within a fixed capacity, and its read/write locking; `table`: its fixed-size
//!   hash table;
//! - [`forward`]: the port table and the decision for one frame: source checks (port
//!   security), learning, known unicast, flooding, hairpin, receive filters;
//! - [`filter`]: a port's receive filter, as its driver sets it on the control queue;
//! - [`mac`], [`port`]: MAC addresses; port numbers and sets of them; [`tick`]: the time
//!   the callers pass in; [`error`]: refused configurations;
//! - `model` (for tests, and the `fdb` and `switch_forward` fuzz targets with the `fuzzing`
//!   feature): a reference model of the FDB and the decision that they are checked against.
//!
//! A worker's batch, from one port:
//!
//! ```
//! # use virtnet_backend::switch::*;
//! # let fdb = Fdb::new(FdbConfig::default()).unwrap();
//! # let mut ports = Ports::new();
//! # let (guest, uplink) = (PortId::new(1).unwrap(), PortId::new(0).unwrap());
//! # let mac = Mac::new([2, 0, 0, 0, 0, 1]);
//! # let now = Tick::from_millis(0);
//! ports.add(&fdb, uplink, PortConfig::uplink(4096), now)?;
//! ports.add(&fdb, guest, PortConfig::guest(mac), now)?;
//! # let batch = [Frame { dst: Mac::BROADCAST, src: mac, announce: false }];
//! let mut to_learn = Vec::new();
//! {
//!     let read = fdb.read();
//!     for frame in batch {
//!         let d = decide(&ports, &read, guest, frame, now);
//!         to_learn.extend(d.learn);
//!         // ... queue the frame for each port of d.verdict ...
//!     }
//! }
//! for req in to_learn {
//!     fdb.learn(req, now);
//! }
//! # Ok::<(), SwitchError>(())
//! ```

pub mod core;
pub mod ctl;
pub mod error;
pub mod fdb;
pub mod filter;
pub mod flow;
pub mod forward;
pub mod guest;
pub mod mac;
#[cfg(any(test, feature = "fuzzing"))]
pub mod model;
pub mod port;
pub mod service;
pub mod sink;
mod table;
pub mod tap;
pub mod tick;
pub mod uplink;

pub use error::SwitchError;
pub use fdb::{
    EntryKind, Fdb, FdbConfig, FdbCounters, FdbEntry, FdbRead, FdbShow, Learn, Learned, Refusal,
};
pub use filter::RxFilter;
pub use forward::{
    decide, Decision, DropReason, Frame, PortAddress, PortConfig, PortCounters, Ports, Verdict,
};
pub use mac::Mac;
pub use port::{PortId, PortSet, MAX_PORTS};
pub use service::{PortSpec, Switch, SwitchConfig};
pub use tick::Tick;
