//! One engine's device-side loop alone, for profilers (callgrind counts instructions
//! repeatably where timings on a shared machine do not):
//!
//! ```text
//! cargo build --release -p bench --example ring_profile
//! valgrind --tool=callgrind --toggle-collect='*device_round*' \
//!     target/release/examples/ring_profile vring 1 10000
//! ```
//!
//! Arguments: engine (`vring` or `virtio-queue`), descriptors per chain (1 or 4), rounds of
//! 64 chains. Prints the run's figures; callgrind's total is then the device's instructions.

#![forbid(unsafe_code)]

use bench::ring::{device_side, ChainShape, RingMemory};
use bench::BenchError;

fn main() -> Result<(), BenchError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (engine, descs, rounds) = match args.as_slice() {
        [e, d, r] => (e.clone(), d.clone(), r.parse::<u64>().ok()),
        _ => (String::new(), String::new(), None),
    };
    let shape = match descs.as_str() {
        "1" => ChainShape::ONE,
        "4" => ChainShape::FOUR,
        _ => usage(),
    };
    let rounds = rounds.unwrap_or_else(|| usage());
    let ring = RingMemory::new(device_side::FEATURES)?;
    let cfg = device_side::Config {
        shape,
        rounds,
        deadline: None,
    };
    let run = match engine.as_str() {
        "vring" => device_side::run(&ring, ring.vring_device()?, &cfg)?,
        "virtio-queue" => device_side::run(&ring, testkit::baseline::VqDevice::new(&ring)?, &cfg)?,
        _ => usage(),
    };
    println!(
        "{}: {} chains, {} descriptors, {:.1} Mdesc/s, {:.1} ns/chain (device time)",
        run.engine,
        run.chains,
        run.descriptors,
        run.mdesc_per_sec(),
        run.ns_per_chain()
    );
    Ok(())
}

fn usage() -> ! {
    eprintln!("usage: ring_profile vring|virtio-queue 1|4 ROUNDS");
    std::process::exit(2)
}
