//! virtnet: virtio-net (spec 5.1) over vhost-user, both halves.
//!
//! - [`net`]: the net header, config space and features shared by both halves.
//! - [`backend`]: the device half, `virtnet backend`.
//! - [`frontend`]: the driver half's vhost-user transport; [`driver`]: its data path.
//! - [`gen`]: `virtnet gen`, the traffic generator on the driver.
//! - [`sys`]: the OS interfaces (TAP, syscalls): the crate's only `unsafe`.

#![deny(unsafe_code)]

pub mod backend;
pub mod driver;
pub mod frontend;
pub mod gen;
pub mod net;
#[allow(unsafe_code)]
pub mod sys;
pub(crate) mod vhost_wire;
