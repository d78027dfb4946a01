//! A worker whose rx cannot take a frame waits for the guest instead of spinning: the null
//! generator with buffers smaller than its frame, and echo with busy polling and rx full. In
//! each case the pair's worker takes no CPU while nothing can move, and the same pair moves
//! frames again once the guest gives it room.
//!
//! One test in a binary of its own: the worker's CPU time is read by its thread's name.

use std::time::{Duration, Instant};

use testkit::inproc::{self, connect, connect_rx, start_backend, thread_cpu_ticks};
use testkit::recovery::{self, Baseline};
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{Count, PollMode};
use vring::Features;

/// The pair's worker CPU over one second of nothing to do, in clock ticks (100 a second).
fn idle_ticks() -> u64 {
    std::thread::sleep(Duration::from_millis(200));
    let before = thread_cpu_ticks("virtnet-pair0");
    std::thread::sleep(Duration::from_secs(1));
    thread_cpu_ticks("virtnet-pair0") - before
}

/// Frames received within `within`, polling.
fn receive_for(p: &mut inproc::Pair, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    let mut got = 0;
    while Instant::now() < deadline {
        got += p.rx.poll(64, PollMode::Napi, Count).unwrap();
        p.rx.wait(10);
    }
    got
}

#[test]
fn workers_wait_instead_of_spinning_when_rx_cannot_take_a_frame() {
    // The null generator's 76-byte frames (header and 64 bytes) into 32-byte buffers, without
    // mergeable buffers: no frame can ever fit.
    let b = start_backend(
        "idle-null",
        BackendConfig {
            io: IoMode::Null { size: 64 },
            ..Default::default()
        },
    );
    let exclusive = recovery::exclusive();
    let base = Baseline::take(&exclusive, &b);
    let before = b.device.reports()[0].counters.clone();
    let p = connect_rx(&b, Features::VERSION_1, 32);
    let ticks = idle_ticks();
    assert!(ticks <= 10, "the null worker took {ticks} ticks in 1 s");
    let rx = b.device.reports()[0].counters.clone();
    assert_eq!(rx.packets, before.packets, "nothing fits");
    assert!(
        rx.dropped > before.dropped,
        "the frame that cannot fit is counted"
    );
    drop(p);
    // A frontend with buffers that fit gets frames on the same pair at once.
    let mut p = connect(&b, Features::VERSION_1 | vnet::feature::MRG_RXBUF);
    assert!(receive_for(&mut p, Duration::from_secs(1)) > 0);
    drop(p);
    recovery::assert_recovered(&b, &base);
    drop(b);

    // Echo with busy polling: more frames sent than rx has buffers, and rx never polled, so
    // tx keeps a frame rx cannot take.
    let b = start_backend(
        "idle-echo",
        BackendConfig {
            io: IoMode::Echo,
            busy_poll: virtnet_backend::BusyPoll::Fixed(50),
            ..Default::default()
        },
    );
    let base = Baseline::take(&exclusive, &b);
    let mut p = connect(&b, Features::VERSION_1 | vnet::feature::MRG_RXBUF);
    let frame = inproc::frame(0, 60);
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while sent < 400 && Instant::now() < deadline {
        if p.tx.send(&frame, vnet::NetHdr::default()).unwrap() {
            sent += 1;
        } else {
            p.tx.flush();
            p.tx.wait_wake(10).unwrap();
        }
    }
    p.tx.flush();
    assert!(sent > 256, "{sent} frames sent, more than rx has buffers");
    let ticks = idle_ticks();
    assert!(ticks <= 10, "the echo worker took {ticks} ticks in 1 s");
    // Room again: the frames waiting on tx come back.
    assert!(receive_for(&mut p, Duration::from_secs(1)) > 0);
    drop(p);
    recovery::assert_recovered(&b, &base);
}
