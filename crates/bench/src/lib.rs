//! Measurement harnesses shared by `virtnet bench`, the criterion benches and the comparison
//! with rust-vmm's virtio-queue.
//!
//! - [`ring`]: the virtqueue engine alone, over shared memory: a two-thread driver/device
//!   ping-pong ([`ring::pingpong`]) and a one-thread device-side loop ([`ring::device_side`]).
//!   Both are generic over the device-side engine ([`ring::RingDevice`]), so another engine can
//!   be measured on exactly the same workload, fed by the same driver.
//! - [`experiments`]: what `virtnet bench` runs, one module per experiment, selected by number.
//! - [`notify`], [`pin`], [`summary`], [`table`]: eventfd notifications, thread pinning, medians
//!   and text tables.

#![forbid(unsafe_code)]

pub mod error;
pub mod experiments;
pub mod notify;
pub mod pin;
pub mod plot;
pub mod ring;
pub mod summary;
pub mod table;

pub use error::BenchError;
