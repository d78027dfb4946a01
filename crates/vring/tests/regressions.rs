//! Regression tests for inputs the fuzz targets (`fuzz/`, see fuzz/README.md) flagged, one
//! named test each, replayed here with the vring API directly. Each test pastes the fuzz input
//! it came from; the same bytes are in `fuzz/corpus/<target>/regression-<name>`, which the fuzz
//! crate's `cargo test` replays through the harness.

use vring::{Error, Features};
use vring_testkit::{pair, Pair};

/// driver_queue: with INDIRECT_DESC and an indirect area of 16 entries per head, a queue of 8
/// put a chain of 16 buffers (8 out, 8 in) into one indirect table. Spec 2.7.5.3.1 forbids a
/// chain longer than the queue size, indirect or not, and our own device refuses the table
/// with `IndirectTooLarge` and breaks the queue; the harness's read-back of the chain failed.
/// Found first by the model test (tests/model/) and fixed in `DriverQueue::uses_indirect`
/// (b164c9c); the fuzz seed `indirect_chains` hits it too, and this minimal input alone:
///
/// ```text
/// DriverInput { setup: DriverSetup { size_log2: 3, event_idx: false, indirect: true,
///     indirect_area: Some(16), placement: Separate },
///   used: UsedRing { flags: 0, idx: 0, elems: [], avail_event: 0 },
///   ops: [Add { out: [8 x BufSpec { offset: 4096 * i, len: 100 }],
///               in_: [8 x BufSpec { offset: 4096 * i, len: 1000 }] }] }
///
/// 03 00 01 01 10 00 00 00 00 00 00 00 00 00 00 00
/// 01 00 00 00 00 01 00 00 64 00 01 00 10 64 00 01
/// 00 20 64 00 01 00 30 64 00 01 00 40 64 00 01 00
/// 50 64 00 01 00 60 64 00 01 00 70 64 00 00 01 00
/// 00 e8 03 01 00 10 e8 03 01 00 20 e8 03 01 00 30
/// e8 03 01 00 40 e8 03 01 00 50 e8 03 01 00 60 e8
/// 03 01 00 70 e8 03 00 00
/// ```
#[test]
fn driver_never_builds_an_indirect_chain_longer_than_the_queue() {
    let Pair {
        mut driver,
        mut device,
        ..
    } = pair(8, Features::RING_INDIRECT_DESC, 16);
    assert!(!driver.uses_indirect(16));
    assert_eq!(
        driver.add(&Pair::bufs(8, 100), &Pair::bufs(8, 1000), 0),
        Err(Error::QueueFull {
            needed: 16,
            free: 8
        })
    );
    assert_eq!(driver.broken(), None);
    assert_eq!(device.pop(), Ok(None));

    // A chain as long as the queue still goes indirect, and the device takes it.
    assert!(driver.uses_indirect(8));
    driver
        .add(&Pair::bufs(4, 100), &Pair::bufs(4, 1000), 1)
        .unwrap();
    assert_eq!(driver.num_free(), 7);
    let chain = device.pop().unwrap().unwrap();
    assert_eq!((chain.readable().len(), chain.writable().len()), (4, 4));
    device.add_used(chain.head(), 4000).unwrap();
    device.flush();
    assert_eq!(driver.get_used(), Ok(Some((1, 4000))));
    assert_eq!(driver.num_free(), 8);
}
