//! A thousand frontends one after another, each with its queues running and a few frames
//! moved (every other one going with frames still in flight, as a guest that reboots), three
//! of them hostile (a call eventfd made to block, a tx ring with a head out of range, garbage
//! on the socket): the backend
//! releases everything a connection held when it goes, so the process's descriptors and
//! threads come back to exactly what they were after the warm-up, and its memory stays put.
//!
//! One test in a binary of its own: it reads the process's descriptors, memory and threads.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use testkit::inproc::{
    block_rx_call, break_tx_ring, connect, echo_backend, echo_round, frame, Backend, WANTED,
};
use testkit::recovery::{self, Baseline, Usage};

const CONNECTIONS: usize = 1000;
/// Descriptors and memory are measured after this many connections: the allocator's arenas
/// and the backend's workers have reached their working size by then.
const WARM_UP: usize = 50;
/// This connection makes its rx call eventfd block (see tests/peer_fds.rs).
const HOSTILE_CALL: usize = 250;
/// This connection breaks its tx ring.
const HOSTILE_RING: usize = 500;
/// This one sends garbage instead of a vhost-user message.
const HOSTILE_SOCKET: usize = 750;
/// What resident memory may gain from the warm-up to the end. Measured: 12 KiB in debug
/// builds, none in release. A connection that left one page behind (its guest memory's
/// rings, say, mapped with no descriptor kept) would add 3.7 MiB over the 950 after the
/// warm-up.
const RSS_GROWTH_KIB: u64 = 2 << 10;

/// An ordinary frontend: its queues run and echo a few frames; with `in_flight`, it then
/// goes with more frames sent than rx has buffers for, none of them received.
fn ordinary(b: &Backend, in_flight: bool) {
    let mut p = connect(b, WANTED);
    assert_eq!(echo_round(&mut p, 4, 64).len(), 4, "frames lost");
    if in_flight {
        for i in 0..300 {
            if !p.tx.send(&frame(i, 1000), vnet::NetHdr::default()).unwrap() {
                break;
            }
        }
        p.tx.flush();
    }
}

/// A frontend whose guest publishes head 999 on its tx avail ring (size 256) and kicks: the
/// backend breaks that queue; the frontend then goes.
fn broken_tx_ring(b: &Backend) {
    let p = connect(b, WANTED);
    let reason = break_tx_ring(b, &p);
    assert!(
        reason.as_deref().is_some_and(|r| r.contains("head 999")),
        "tx not broken by head 999: {reason:?}"
    );
}

/// A frontend that clears O_NONBLOCK on its rx call eventfd and fills the counter, then has
/// frames echoed to rx: the worker's call blocks until the watchdog interrupts it, which
/// breaks rx; the frontend then goes.
fn blocking_call_fd(b: &Backend) {
    let mut p = connect(b, WANTED);
    let reason = block_rx_call(b, &mut p);
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("call eventfd")),
        "rx not broken by its call eventfd: {reason:?}; rx {:?}; interrupted writes {}",
        b.device.reports()[0].counters,
        virtnet_sys::peer_fd::interrupted_writes()
    );
}

/// A frontend that sends a header claiming an unknown request with a 4 KiB body, then noise,
/// and goes.
fn garbage_on_the_socket(b: &Backend) {
    let mut s = UnixStream::connect(&b.socket).unwrap();
    let mut msg = vec![0xad, 0xde, 0, 0, 1, 0, 0, 0, 0, 0x10, 0, 0];
    msg.extend(std::iter::repeat_n(0x5a, 64));
    let _ = s.write_all(&msg);
}

#[test]
fn a_thousand_reconnects_three_hostile_hold_no_more_descriptors_or_memory() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("reconnect");
    let base = Baseline::take(&exclusive, &b);
    let start = Instant::now();
    let mut warm = None;
    for i in 0..CONNECTIONS {
        if i == WARM_UP {
            warm = Some(Usage::settled(&b));
        }
        match i {
            HOSTILE_CALL => blocking_call_fd(&b),
            HOSTILE_RING => broken_tx_ring(&b),
            HOSTILE_SOCKET => garbage_on_the_socket(&b),
            _ => ordinary(&b, i % 2 == 1),
        }
    }
    let took = start.elapsed();
    let warm = warm.expect("measured after the warm-up");
    let end = Usage::settled(&b);
    eprintln!(
        "{CONNECTIONS} connections in {took:?}; after the warm-up {warm:?}, at the end {end:?}"
    );
    assert_eq!(
        (end.fds, end.threads),
        (warm.fds, warm.threads),
        "descriptors and threads (after {WARM_UP} connections, then after {CONNECTIONS})"
    );
    assert!(
        end.rss_kib <= warm.rss_kib + RSS_GROWTH_KIB,
        "resident memory grew from {} KiB to {} KiB",
        warm.rss_kib,
        end.rss_kib
    );
    // The hostile connections left the device as a user finds it.
    assert!(
        b.device
            .reports()
            .iter()
            .all(|r| r.counters.broken.is_none()),
        "reset clears broken"
    );
    recovery::assert_recovered(&b, &base);
}
