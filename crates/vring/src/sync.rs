//! The atomics the engine uses on shared memory: std's, or loom's when the crate is built with
//! `--cfg loom` for the model tests (`tests/loom_engine.rs`), which then drive the real
//! `DeviceQueue` and `DriverQueue` under loom's scheduler.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU64};
