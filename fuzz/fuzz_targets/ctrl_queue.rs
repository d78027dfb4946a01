//! The backend's control-queue device facing a hostile driver: see `vring_fuzz::ctrl`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::ctrl::{run, CtrlInput};

fuzz_target!(|input: CtrlInput| {
    run(&input);
});
