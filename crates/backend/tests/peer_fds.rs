//! A frontend that turns its own call eventfd against the backend: it clears `O_NONBLOCK` on
//! the file description it shares with us and fills the counter, so that the worker's next
//! call would block forever. The watchdog interrupts that write, the queue is marked broken,
//! and once the frontend goes the same pair serves the next one at once, with the worker idle
//! and the connection's descriptors released.
//!
//! One test in a binary of its own: it measures the process (`testkit::recovery`).

use testkit::inproc::{self, connect, echo_backend, WANTED};
use testkit::recovery::{self, Baseline};

#[test]
fn a_call_eventfd_made_to_block_breaks_its_queue_and_the_next_frontend_is_served() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("peer-fds");
    let base = Baseline::take(&exclusive, &b);

    let mut p = connect(&b, WANTED);
    let reason = inproc::block_rx_call(&b, &mut p).expect("rx0 marked broken");
    assert!(reason.contains("call eventfd"), "{reason}");
    drop(p);

    // The process alive, the workers idle, a fresh connection on the same pair moving frames
    // within a second, and the hostile connection's descriptors and memory gone.
    recovery::assert_recovered(&b, &base);
    assert!(b.device.reports()[0].counters.broken.is_none());
}
