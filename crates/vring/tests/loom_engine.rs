//! loom models of the notification protocol driving the engine itself: the real `DriverQueue`
//! and `DeviceQueue`, built with `--cfg loom` so that every ring access is one of loom's
//! atomics (crate `sync` module; `GuestMemory` keeps loom storage for each ring part, shared by
//! both sides' views). `tests/loom.rs` models the same protocol written out by hand, with
//! negative models that show each re-check and fence is needed; these show that the engine,
//! as it is, loses no wake-up and completes nothing twice.
//!
//! Run with:
//!
//! ```sh
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p vring --test loom_engine --release
//! ```
//!
//! A kick or a call is a loom `Notify` (eventfd semantics: a notification sent while nobody
//! waits is kept for the next wait); a thread that waits forever is a loom deadlock, which is
//! what a lost wake-up looks like. The preemption bound is 3 (or `LOOM_MAX_PREEMPTIONS`).
#![cfg(loom)]

use std::sync::Arc;

use loom::sync::Notify;
use loom::thread;
use vring::{
    Buf, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses,
};

const QUEUE: u16 = 4;

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

/// A driver and a device on one queue of `QUEUE` entries in one memory.
fn pair(features: Features) -> (DriverQueue<u16>, DeviceQueue) {
    let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), 0x1_0000)]).unwrap());
    let rings = RingAddresses::contiguous(GuestAddress(0x1000), QUEUE);
    let config = QueueConfig::new(QUEUE as u32, rings, features).unwrap();
    let driver = DriverQueue::activate(&config, mem.clone(), None).unwrap();
    let device = DeviceQueue::activate(&config, mem, vring::RingPosition::START).unwrap();
    (driver, device)
}

fn buf(i: u16) -> Buf {
    Buf::new(GuestAddress(0x8000 + 0x100 * i as u64), 64)
}

/// Whether the side that enables notifications heeds the re-check the engine makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Recheck {
    Heeded,
    /// The caller sleeps whatever the re-check found: the negative models, which must
    /// deadlock, showing the models would catch a lost wake-up.
    Ignored,
}

/// The driver adds `chains` chains one at a time and kicks when `kick_prepare` says so; the
/// device sleeps on the kick, pops everything, enables notifications and re-checks before
/// sleeping again. Every chain must be popped exactly once.
fn kick_side(features: Features, chains: u16, recheck: Recheck) {
    check(move || {
        let (mut drv, mut dev) = pair(features);
        let kick = Arc::new(Notify::new());
        let device = {
            let kick = kick.clone();
            thread::spawn(move || {
                let mut popped = 0;
                loop {
                    kick.wait();
                    dev.disable_notification();
                    loop {
                        while dev.pop().unwrap().is_some() {
                            popped += 1;
                        }
                        assert!(popped <= chains, "a chain popped twice");
                        if popped == chains {
                            return;
                        }
                        let pending = dev.enable_notification().unwrap();
                        if !pending || recheck == Recheck::Ignored {
                            break; // Sleep until the next kick.
                        }
                        dev.disable_notification();
                    }
                }
            })
        };
        for i in 0..chains {
            drv.add(&[buf(i)], &[], i).unwrap();
            if drv.kick_prepare() {
                kick.notify();
            }
        }
        device.join().unwrap();
    });
}

/// How the driver asks for its next interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    /// `enable_cb`: at the next used entry.
    Next,
    /// `enable_cb_delayed`: once 3/4 of what is in flight is used.
    Delayed,
    /// `enable_cb_after(u16::MAX)`: the longest delay a caller can ask for, which the engine
    /// keeps to the last chain in flight.
    Longest,
}

/// `chains` chains are in flight; the device completes them one at a time, publishing and
/// deciding on a notification after each. The driver polls with callbacks off, enables them
/// as `arm` says and re-checks before sleeping on the call. Every chain must come back
/// exactly once.
fn call_side(features: Features, chains: u16, arm: Arm, recheck: Recheck) {
    check(move || {
        let (mut drv, mut dev) = pair(features);
        for i in 0..chains {
            drv.add(&[], &[buf(i)], i).unwrap();
        }
        drv.disable_cb();
        let call = Arc::new(Notify::new());
        let device = {
            let call = call.clone();
            thread::spawn(move || {
                for _ in 0..chains {
                    let c = dev.pop().unwrap().expect("every chain was added before");
                    dev.add_used(c.head(), 64).unwrap();
                    if dev.needs_notification() {
                        call.notify();
                    }
                }
            })
        };
        let mut seen = [false; QUEUE as usize];
        let mut reclaimed = 0;
        loop {
            while let Some((token, _)) = drv.get_used().unwrap() {
                assert!(!seen[token as usize], "chain {token} completed twice");
                seen[token as usize] = true;
                reclaimed += 1;
            }
            if reclaimed == chains {
                break;
            }
            let pending = match arm {
                Arm::Next => drv.enable_cb(),
                Arm::Delayed => drv.enable_cb_delayed(),
                Arm::Longest => drv.enable_cb_after(u16::MAX),
            };
            if !pending || recheck == Recheck::Ignored {
                call.wait();
            }
            drv.disable_cb();
        }
        device.join().unwrap();
    });
}

const FLAGS: Features = Features::VERSION_1;
const EVENT_IDX: Features = Features::VERSION_1.union(Features::RING_EVENT_IDX);

#[test]
fn engine_kick_side_flags_no_lost_wakeup() {
    kick_side(FLAGS, 2, Recheck::Heeded);
}

#[test]
fn engine_kick_side_event_idx_no_lost_wakeup() {
    kick_side(EVENT_IDX, 2, Recheck::Heeded);
}

#[test]
#[should_panic(expected = "deadlock")]
fn engine_kick_side_ignoring_the_recheck_loses_a_wakeup() {
    kick_side(EVENT_IDX, 2, Recheck::Ignored);
}

#[test]
fn engine_call_side_flags_no_lost_interrupt() {
    call_side(FLAGS, 2, Arm::Next, Recheck::Heeded);
}

#[test]
fn engine_call_side_event_idx_no_lost_interrupt() {
    call_side(EVENT_IDX, 2, Arm::Next, Recheck::Heeded);
}

#[test]
fn engine_call_side_event_idx_delayed_no_lost_interrupt() {
    call_side(EVENT_IDX, 3, Arm::Delayed, Recheck::Heeded);
}

#[test]
fn engine_call_side_event_idx_longest_delay_no_lost_interrupt() {
    call_side(EVENT_IDX, 3, Arm::Longest, Recheck::Heeded);
}

#[test]
#[should_panic(expected = "deadlock")]
fn engine_call_side_ignoring_the_recheck_loses_an_interrupt() {
    call_side(FLAGS, 2, Arm::Next, Recheck::Ignored);
}
