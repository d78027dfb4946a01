//! State-machine test of the ring engine (test tier 2 of docs/ARCHITECTURE.md): random interleavings of
//! driver and device operations on one queue, run in one thread, each checked against a simple
//! model of what a split virtqueue must do.
//!
//! The model is counts and FIFOs, not indices: chains added and not yet popped, chains popped
//! and not yet used, used elements written, published and reclaimed. It checks that
//! - every token comes back from `get_used` exactly once, in used-ring order, with the length
//!   the device gave `add_used`, and that used elements appear exactly when the batch or a
//!   flush publishes them;
//! - `num_free` is the queue size minus the descriptors of the chains in flight (one per
//!   indirect chain), and `add` fails with `QueueFull` exactly when the model says so;
//! - the device pops the buffers the driver added, readable then writable;
//! - no wake-up is lost on either side: a device asleep after `enable_notification` is kicked
//!   once chains are added behind it, and a driver waiting after `enable_cb`,
//!   `enable_cb_delayed` (3/4 of the chains then in flight) or a `get_used` that found nothing
//!   with callbacks on, is notified by the `needs_notification` call that publishes or follows
//!   the used entries it waits for;
//! - in flag mode, exactly: kicks and notifications follow the flags the other side set;
//! - no call fails other than with `QueueFull` or `EmptyChain`: a correct peer never breaks
//!   the queue;
//! - with IN_ORDER (the device then uses chains in the order it popped them), the same, with
//!   the driver's in-order reclaim.
//!
//! Sleeping and waiting are states of the model: a device asleep does nothing until a kick
//! wakes it, a waiting driver only adds and kicks until a notification wakes it. Chains have 0
//! to 5 buffers on each side (so pure tx and rx chains, and empty ones, occur). One case in
//! four first runs the queue close to the 16-bit index wrap, so the random operations cross it
//! (and the device's `signalled_used` invalidation is exercised).
//!
//! [`ops`] holds what proptest generates (the queue's setup and the operations), [`harness`]
//! the engines under test with the model beside them.

mod harness;
mod ops;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use vring::Error;

use harness::Harness;
use ops::{op, setup, BufSpec, Op, PrefixNotify, Setup};

proptest! {
    // The default case count; failures are saved beside this file (the default location
    // needs a lib.rs, which an integration test does not have).
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn driver_and_device_agree_with_the_model(
        s in setup(),
        ops in prop::collection::vec(op(), 0..300),
    ) {
        let mut h = Harness::new(s);
        for op in &ops {
            h.run(op);
        }
        h.drain();
    }
}

/// Found by the model: with INDIRECT_DESC the driver put chains longer than the queue size in
/// an indirect table, which spec 2.7.5.3.1 forbids, and the device refused them
/// (`IndirectTooLarge`), breaking the queue. Such a chain is now refused as `QueueFull`.
#[test]
fn indirect_chains_are_never_longer_than_the_queue() {
    let mut h = Harness::new(Setup {
        size: 2,
        event_idx: false,
        indirect: true,
        max_chain: 8,
        prefix: 0,
        prefix_notify: PrefixNotify::Never,
        prefix_cb_disabled: false,
        fifo_reuse: false,
        in_order: false,
    });
    let b = BufSpec { slot: 1, len: 100 };
    assert!(!h.driver.uses_indirect(3));
    assert_eq!(
        h.driver.add(&[b.buf(); 3], &[], 7),
        Err(Error::QueueFull { needed: 3, free: 2 })
    );
    h.run(&Op::Add {
        out: vec![b],
        in_: vec![b],
    });
    assert_eq!(
        h.driver.num_free(),
        1,
        "two buffers fit the queue: one indirect descriptor"
    );
    h.run(&Op::Pop);
    h.drain();
}
