//! A `DriverQueue` facing a hostile device: see `vring_fuzz::driver`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::driver::{run, DriverInput};

fuzz_target!(|input: DriverInput| {
    run(&input);
});
