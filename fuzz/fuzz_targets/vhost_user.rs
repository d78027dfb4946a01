//! The backend's vhost-user protocol handler facing a hostile frontend: see
//! `vring_fuzz::vhost_user`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vring_fuzz::vhost_user::{run, VhostInput};

fuzz_target!(|input: VhostInput| {
    run(&input);
});
