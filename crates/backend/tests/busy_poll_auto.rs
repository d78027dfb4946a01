//! Busy polling auto under CPU contention: request-response traffic through an echo backend
//! whose worker is pinned to CPU 0. Alone on its CPU the worker polls; when a busy thread is
//! pinned to the same CPU, auto sees the CPU wanted (the worker's time spent waiting to run,
//! in slices), counts it and mostly stops polling, and the traffic still flows; once the
//! thread is gone it polls again; and with no traffic at all the worker takes no CPU.
//!
//! One test in a binary of its own: the worker's CPU time is read by its thread's name.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, echo_round_within, start_backend, thread_cpu_ticks, Backend};
use virtnet_backend::metrics::CountersSnapshot;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use vring::Features;

/// The tx queue's counters (pair 0).
fn tx(b: &Backend) -> CountersSnapshot {
    b.device.reports()[1].counters.clone()
}

/// One-frame transactions for `d`: how many completed.
fn rr_for(p: &mut testkit::inproc::Pair, d: Duration) -> u64 {
    let end = Instant::now() + d;
    let mut n = 0;
    while Instant::now() < end {
        if echo_round_within(p, 1, 60, Duration::from_secs(2)).len() == 1 {
            n += 1;
        }
    }
    n
}

#[test]
fn auto_stops_polling_while_another_thread_wants_the_workers_cpu_and_traffic_flows() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs 2 CPUs (the driver on one, the worker and the hog on the other)");
        return;
    }
    let b = start_backend(
        "auto-contended",
        BackendConfig {
            io: IoMode::Echo,
            busy_poll: BusyPoll::Auto,
            worker_cpu: Some(0),
            ..Default::default()
        },
    );
    // The driver on CPU 1, the worker alone on CPU 0.
    virtnet_sys::pin_thread(1).unwrap();
    let mut p = connect(&b, Features::VERSION_1 | vnet::feature::MRG_RXBUF);
    let alone = rr_for(&mut p, Duration::from_millis(500));
    let before = tx(&b);
    assert!(alone > 100, "{alone} transactions alone");
    assert!(
        before.busy_poll_hits > 0,
        "alone on its CPU, auto polls and hits: {before:?}"
    );

    // A thread spinning on the worker's CPU.
    let stop = Arc::new(AtomicBool::new(false));
    let hog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            virtnet_sys::pin_thread(0).unwrap();
            while !stop.load(Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let mut contended = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while tx(&b).busy_poll_contended == before.busy_poll_contended && Instant::now() < deadline {
        contended += rr_for(&mut p, Duration::from_millis(100));
    }
    let seen = tx(&b);
    assert!(
        seen.busy_poll_contended > before.busy_poll_contended,
        "auto never found the CPU contended: {seen:?}"
    );
    // While the CPU stays contended, auto backs off: most idle turns of the next second sleep
    // at once. (Before the back-off resumed where it was when contention came back soon, AMD
    // EPYC family 26 model 2 under Linux 6.18 made 52,446 polls against 9,522 skipped turns:
    // a worker that slept through its back-off ran ahead of the spinner for a while, so the
    // next check found the CPU free.)
    let during = rr_for(&mut p, Duration::from_secs(1));
    let after = tx(&b);
    contended += during;
    assert!(during > 20, "{during} transactions in 1 s on a shared CPU");
    let (polls, skipped) = (
        after.busy_poll_entries - seen.busy_poll_entries,
        after.busy_poll_skipped - seen.busy_poll_skipped,
    );
    eprintln!("contended: {polls} polls against {skipped} idle turns without one");
    assert!(
        skipped > polls,
        "contended, auto polled {polls} times and skipped {skipped}: {after:?}"
    );
    stop.store(true, Relaxed);
    hog.join().unwrap();
    eprintln!("transactions: {alone} in 0.5 s alone, {contended} contended");

    // Alone again: auto finds the CPU free and polls again.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut again = tx(&b);
    while again.busy_poll_hits - after.busy_poll_hits < 100 && Instant::now() < deadline {
        rr_for(&mut p, Duration::from_millis(100));
        again = tx(&b);
    }
    assert!(
        again.busy_poll_hits - after.busy_poll_hits >= 100,
        "polling did not come back: {again:?}"
    );

    // No traffic: the worker sleeps (under 1% of a CPU: at most 1 tick of 10 ms a second,
    // and one more for the tick boundaries).
    std::thread::sleep(Duration::from_millis(200));
    let t0 = thread_cpu_ticks("virtnet-pair0");
    std::thread::sleep(Duration::from_secs(1));
    let idle = thread_cpu_ticks("virtnet-pair0") - t0;
    assert!(idle <= 2, "the idle worker took {idle} ticks in 1 s");
    drop(p);
}
