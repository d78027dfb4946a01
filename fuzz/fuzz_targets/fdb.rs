//! The switch's FDB and forwarding decision against their reference model: see
//! `vring_fuzz::fdb`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::fdb::{run, FdbInput};

fuzz_target!(|input: FdbInput| {
    run(&input);
});
