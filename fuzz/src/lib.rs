//! Structure-aware fuzzing of the `vring` split-virtqueue engine.
//!
//! Each target decodes its input with `arbitrary` into a queue setup, the raw ring contents a
//! hostile peer left in memory, and a list of operations: one variant per public call of the
//! queue under test, interleaved with the peer rewriting ring bytes. The harness runs them and
//! checks invariants after every step (see [`device`] and [`driver`]).
//!
//! The harnesses live in this library, not in the `fuzz_targets/` binaries, so that the unit
//! tests of this crate can write the seed corpus from the same types ([`encode`] turns a value
//! back into the bytes `arbitrary` decodes it from) and replay the committed corpus on stable
//! Rust without libFuzzer.

pub mod ctrl;
pub mod device;
pub mod driver;
pub mod encode;
pub mod fdb;
pub mod mem;
pub mod rings;
pub mod switch_forward;
pub mod vhost_user;
pub mod walk;

#[cfg(test)]
mod seeds;

use arbitrary::{Arbitrary, Unstructured};

/// Decodes a fuzz input exactly as `libfuzzer_sys::fuzz_target!` does for a typed target, so
/// the corpus replays and regression inputs see what the fuzzer saw.
pub fn decode<'a, T: Arbitrary<'a>>(data: &'a [u8]) -> Option<T> {
    if data.len() < T::size_hint(0).0 {
        return None;
    }
    T::arbitrary_take_rest(Unstructured::new(data)).ok()
}
