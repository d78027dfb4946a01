//! The switch's forwarding step with real frames, from a guest's tx ring to other guests' rx
//! rings, against a model: see `vring_fuzz::switch_forward`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::switch_forward::{run, SwitchInput};

fuzz_target!(|input: SwitchInput| {
    run(&input);
});
