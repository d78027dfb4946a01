//! A frontend that turns its own call eventfd against the backend: it clears `O_NONBLOCK` on
//! the file description it shares with us and fills the counter, so that the worker's next
//! call would block forever. The watchdog interrupts that write, the queue is marked broken,
//! and once the frontend goes the same pair serves the next one at once, with the worker idle
//! and the connection's descriptors released.
//!
//! One test in a binary of its own: it measures the process (`testkit::recovery`).

use std::os::fd::AsFd;
use std::time::Duration;

use testkit::eventually;
use testkit::inproc::{self, connect, echo_backend, WANTED};
use testkit::recovery::{self, Baseline};
use virtnet_driver::{Frames, PollMode};

#[test]
fn a_call_eventfd_made_to_block_breaks_its_queue_and_the_next_frontend_is_served() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("peer-fds");
    let base = Baseline::take(&exclusive, &b);

    let mut p = connect(&b, WANTED);
    let call = &p.conn.queues[0].call;
    virtnet_sys::set_nonblocking(call.as_fd(), false).unwrap();
    call.to_eventfd().unwrap().write(u64::MAX - 1).unwrap();
    // Frames echoed to rx make the worker call: the write blocks until the watchdog steps in.
    let frame = inproc::frame(0, 64);
    for _ in 0..8 {
        p.tx.send(&frame, vnet::NetHdr::default()).unwrap();
    }
    p.tx.flush();
    let broken = eventually(Duration::from_secs(5), || {
        p.rx.poll(64, PollMode::Napi, Frames(|_: &[u8]| {})).ok();
        b.device.reports()[0].counters.broken.is_some()
    });
    let reason = b.device.reports()[0].counters.broken.clone();
    assert!(broken, "rx0 was not marked broken");
    assert!(reason.unwrap().contains("call eventfd"));
    drop(p);

    // The process alive, the workers idle, a fresh connection on the same pair moving frames
    // within a second, and the hostile connection's descriptors and memory gone.
    recovery::assert_recovered(&b, &base);
    assert!(b.device.reports()[0].counters.broken.is_none());
}
