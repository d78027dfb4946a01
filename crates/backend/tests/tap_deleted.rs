//! A TAP deleted under a running backend (`ip link del` in its namespace), with the guest's
//! rx buffers posted and the workers under their seccomp filter, as in production: the
//! worker's fd reports EPOLLERR for good, and its error path (reading SO_ERROR, a call the
//! filter once lacked, which killed the whole process with SIGSYS) runs under the filter.
//!
//! Each case, with the worker asleep and with it busy-polling (a fixed 50 us): the process
//! survives; the pair counts the error (`host_errors`) and stops watching the fd; the worker
//! does not spin; guest tx still completes, dropped and counted; a new frontend is served;
//! and another device of the process moves frames throughout. It ends with that device's
//! `assert_recovered`, once the TAP's device is gone: its descriptors were all released.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). The cases measure the process
//! (`testkit::recovery`), so they take its exclusive lock and run one at a time.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, echo_backend, start_backend, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::recovery::{self, Baseline};
use virtnet_backend::metrics::CountersSnapshot;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use vnet::NetHdr;

const TEST: &str = "tap_deleted";
/// The guest's address on the TAP's subnet (10.99.0.1/24 is the TAP's), and its MAC.
const GUEST: &str = "10.99.0.2:9000";
const GUEST_MAC: &str = "52:54:00:12:34:56";

/// A namespace with the backend's TAP and a neighbour entry for the guest; None (and a
/// printed reason) without root or `ip`.
fn setup() -> Option<(NetNs, TapSpec)> {
    if !packages::netns_ready(TEST) {
        return None;
    }
    let ns = NetNs::create("tapdel").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let ip = GUEST.split(':').next().unwrap();
    ns.exec(&[
        "ip", "neigh", "add", ip, "lladdr", GUEST_MAC, "dev", &tap.name,
    ])
    .expect("neighbour entry");
    Some((ns, tap))
}

fn counters(b: &Backend, queue: usize) -> CountersSnapshot {
    b.device.reports()[queue].counters.clone()
}

/// One datagram from the namespace reaches the guest: rx runs, with buffers posted.
fn datagram_reaches_the_guest(ns: &NetNs, p: &mut Pair) {
    let udp = ns.run(|| UdpSocket::bind("10.99.0.1:0").expect("UDP socket"));
    udp.send_to(b"before the TAP goes", GUEST).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut f = Vec::new();
    while p.rx.recv(&mut f).unwrap().is_none() {
        assert!(Instant::now() < deadline, "no frame from the TAP");
        p.rx.refill().unwrap();
        p.rx.wait(10);
    }
    assert!(f.ends_with(b"before the TAP goes"));
    p.rx.refill().unwrap();
}

/// The guest sends `n` frames into the deleted TAP: each is completed (the guest gets its
/// buffer back) and counted as dropped.
fn tx_completes_and_is_dropped(b: &Backend, p: &mut Pair, n: usize) {
    // What the guest sent before is completed first, so that only these frames count.
    assert!(
        p.tx.drain(Duration::from_secs(5)).unwrap(),
        "earlier frames"
    );
    let dropped = counters(b, 1).dropped;
    let mut sent = 0;
    let mut completed = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while completed < n && Instant::now() < deadline {
        while sent < n && p.tx.send(&[0x5a; 60], NetHdr::default()).unwrap() {
            sent += 1;
        }
        p.tx.flush();
        completed += p.tx.reclaim(256).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(completed, n, "tx frames completed after the TAP went");
    let tx = counters(b, 1);
    assert_eq!(tx.dropped - dropped, n as u64, "{tx:?}");
    assert!(tx.broken.is_none(), "{tx:?}");
}

fn deleted_tap_case(tag: &str, busy_poll: BusyPoll) {
    let exclusive = recovery::exclusive();
    let Some((ns, tap)) = setup() else { return };
    // Another device of the process: it must not notice.
    let other = echo_backend(&format!("{tag}-echo"));
    let base = Baseline::take(&exclusive, &other);
    let b = ns.run(|| {
        start_backend(
            tag,
            BackendConfig {
                io: IoMode::Tap(tap.name.clone()),
                busy_poll,
                ..Default::default()
            },
        )
    });
    assert!(
        b.device.shared().config().seccomp,
        "the workers run filtered"
    );
    let mut p = connect(&b, WANTED);
    ns.wait_tap_attached(&tap.name, 1);
    datagram_reaches_the_guest(&ns, &mut p);
    let delete = || {
        ns.exec(&["ip", "link", "del", &tap.name])
            .expect("deleting the TAP")
    };
    if busy_poll == BusyPoll::Off {
        // Nothing moves: the worker sleeps on the TAP (armed for reading: rx has buffers).
        std::thread::sleep(Duration::from_millis(100));
        delete();
    } else {
        // The guest streams frames into the TAP, so that the worker runs turns and polls
        // between them when the TAP goes; its frames after that are dropped.
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                delete();
            });
            let end = Instant::now() + Duration::from_millis(300);
            while Instant::now() < end {
                let _ = p.tx.send(&[0x5a; 60], NetHdr::default()).unwrap();
                p.tx.flush();
                p.tx.reclaim(256).unwrap();
            }
        });
        assert!(counters(&b, 1).dropped > 0, "{:?}", counters(&b, 1));
    }
    // The worker wakes on EPOLLERR, takes the error path under the filter and lives.
    let seen = testkit::eventually(Duration::from_secs(5), || counters(&b, 0).host_errors > 0);
    assert!(seen, "the error was not counted: {:?}", counters(&b, 0));
    let rx = counters(&b, 0);
    assert_eq!(rx.host_errors, 1, "{rx:?}");
    assert!(rx.broken.is_none(), "{rx:?}");
    recovery::assert_alive(&b);
    recovery::assert_idle(&b);
    recovery::assert_fresh_connection_moves_frames(&other);

    tx_completes_and_is_dropped(&b, &mut p, 64);
    assert!(counters(&b, 1).host_errors >= 1, "{:?}", counters(&b, 1));
    recovery::assert_idle(&b);

    // A new frontend: served, its queues start on the deleted TAP, which is watched again,
    // found in error again, and given up on again, without a spin.
    drop(p);
    let errors = counters(&b, 0).host_errors;
    let mut p = connect(&b, WANTED);
    let again = testkit::eventually(Duration::from_secs(5), || {
        counters(&b, 0).host_errors > errors
    });
    assert!(again, "{:?}", counters(&b, 0));
    tx_completes_and_is_dropped(&b, &mut p, 16);
    recovery::assert_alive(&b);
    recovery::assert_idle(&b);
    drop(p);

    // The TAP's device goes, and with it everything it held: the process is back where it
    // was before the case (descriptors counted exactly), and the other device serves on.
    drop(b);
    drop(ns);
    recovery::assert_recovered(&other, &base);
}

#[test]
fn a_tap_deleted_under_a_sleeping_worker_with_rx_buffers_posted_is_counted_and_survived() {
    deleted_tap_case("tapdel-sleep", BusyPoll::Off);
}

#[test]
fn a_tap_deleted_under_a_busy_polling_worker_is_counted_and_survived() {
    deleted_tap_case("tapdel-poll", BusyPoll::Fixed(50));
}
