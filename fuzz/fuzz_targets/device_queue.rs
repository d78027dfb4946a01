//! A `DeviceQueue` facing a hostile driver: see `vring_fuzz::device`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::device::{run, DeviceInput};

fuzz_target!(|input: DeviceInput| {
    run(&input);
});
