//! A TAP that pushes back (`tap_sndbuf`, `virtnet backend --tap-sndbuf`: its send buffer
//! full, the frame that found it so and the frames after it wait on the tx ring, the worker
//! waiting for the TAP to be writable) under a frontend that breaks its tx ring, or goes
//! away, while frames wait.
//!
//! The namespace makes the TAP push back: a tc ingress filter redirects every frame the guest
//! writes to the TAP's own egress (`mirred`: an echo), and a token bucket of 8 kbit/s as the
//! TAP's root qdisc holds them there, still charged to the TAP's send buffer, which fills;
//! deleting the bucket frees them and the TAP is writable again.
//!
//! Each case: the waiting worker takes no CPU; a ring scribbled meanwhile breaks tx once the
//! TAP drains (and only tx); a frontend that goes away is answered at once, not after the
//! TAP drains; and then a fresh connection moves frames into the TAP
//! (`recovery::assert_recovered`).
//!
//! Needs root (a network namespace with a TAP, tc); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). The cases measure the process,
//! so they take its exclusive lock.

use std::time::{Duration, Instant};

use testkit::inproc::{connect, frame, tap_backend_with, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::recovery::{self, Baseline};
use virtnet_backend::metrics::CountersSnapshot;
use virtnet_backend::{BackendConfig, TapIo};
use vnet::NetHdr;

const TEST: &str = "tap_pushback";
/// The TAP's send buffer: a few dozen 1000-byte frames.
const SNDBUF: i32 = 64 << 10;

/// A namespace whose TAP echoes what the guest writes; None (and a printed reason) without
/// root, `ip` or `tc`.
fn setup() -> Option<(NetNs, TapSpec)> {
    if !packages::is_root() {
        packages::skip(TEST, "needs root (network namespaces, TAP devices)");
        return None;
    }
    let tools = [
        packages::Requirement::command("ip", "iproute2"),
        packages::Requirement::command("tc", "iproute2"),
    ];
    if let Err(reason) = packages::ensure(&tools) {
        packages::skip(TEST, &reason);
        return None;
    }
    let ns = NetNs::create("tappush").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let dev = tap.name.as_str();
    ns.exec(&["tc", "qdisc", "add", "dev", dev, "ingress"])
        .expect("ingress qdisc");
    let echo = [
        "tc", "filter", "add", "dev", dev, "parent", "ffff:", "protocol", "all", "u32", "match",
        "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", dev,
    ];
    ns.exec(&echo).expect("the TAP's echo (tc mirred)");
    Some((ns, tap))
}

/// Frames the guest writes now wait in a slow qdisc, charged to the TAP's send buffer.
fn hold(ns: &NetNs, tap: &TapSpec) {
    let tbf = [
        "tc", "qdisc", "replace", "dev", &tap.name, "root", "tbf", "rate", "8kbit", "burst",
        "1600", "limit", "10000000",
    ];
    ns.exec(&tbf).expect("a slow qdisc on the TAP");
}

/// The slow qdisc goes, and the frames in it: the TAP is writable again.
fn release(ns: &NetNs, tap: &TapSpec) {
    ns.exec(&["tc", "qdisc", "del", "dev", &tap.name, "root"])
        .expect("deleting the slow qdisc");
}

fn backend(ns: &NetNs, tap: &TapSpec, tag: &str, tap_io: TapIo) -> Backend {
    let config = BackendConfig {
        tap_sndbuf: Some(SNDBUF),
        tap_io,
        ..Default::default()
    };
    tap_backend_with(ns, tag, &tap.name, config)
}

fn tx(b: &Backend) -> CountersSnapshot {
    b.device.reports()[1].counters.clone()
}

/// The guest sends 1000-byte frames until the TAP pushes back: the worker then waits with
/// frames left on the tx ring.
fn fill_until_pushback(b: &Backend, p: &mut Pair) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = tx(b).host_pushback;
    let mut i = 0;
    while tx(b).host_pushback == before {
        assert!(
            Instant::now() < deadline,
            "the TAP never pushed back: {:?}",
            tx(b)
        );
        if p.tx.send(&frame(i, 1000), NetHdr::default()).unwrap() {
            i += 1;
        }
        p.tx.flush();
        let _ = p.tx.reclaim(256);
        std::thread::sleep(Duration::from_millis(1));
    }
    // Frames left on the ring behind the one that waits.
    for k in 0..8 {
        let _ = p.tx.send(&frame(i + k, 1000), NetHdr::default());
    }
    p.tx.flush();
}

/// As a hostile guest: the avail entry of the next chain the device takes (the one waiting
/// for the TAP: every chain before it was used) names head 999, out of range; then a kick.
fn scribble_next_avail(p: &Pair) {
    let q = &p.conn.queues[1];
    let (rings, size) = (q.config.rings(), q.config.size());
    let mem = &p.conn.mem;
    let mut used = [0u8; 2];
    mem.read(vring::GuestAddress(rings.used.0 + 2), &mut used)
        .unwrap();
    let next = u16::from_le_bytes(used);
    let slot = rings.avail.0 + 4 + 2 * (next % size) as u64;
    mem.write(vring::GuestAddress(slot), &999u16.to_le_bytes())
        .unwrap();
    q.kick.signal().unwrap();
}

fn ring_broken_while_frames_wait(tag: &str, tap_io: TapIo) {
    let exclusive = recovery::exclusive();
    let Some((ns, tap)) = setup() else { return };
    let b = backend(&ns, &tap, tag, tap_io);
    let base = Baseline::take(&exclusive, &b);
    hold(&ns, &tap);
    let mut p = connect(&b, WANTED);
    fill_until_pushback(&b, &mut p);
    // Waiting on the TAP: no CPU.
    recovery::assert_idle(&b);
    let waiting = tx(&b);
    scribble_next_avail(&p);
    // Still full: the worker woke for the kick, and waits on.
    recovery::assert_idle(&b);
    assert!(
        tx(&b).broken.is_none(),
        "tx broke before it looked: {:?}",
        tx(&b)
    );
    // The TAP drains: the worker takes the waiting chain again, finds head 999, breaks tx.
    release(&ns, &tap);
    let broken = testkit::eventually(Duration::from_secs(5), || tx(&b).broken.is_some());
    assert!(broken, "tx not broken: {:?}", tx(&b));
    let now = tx(&b);
    let reason = now.broken.clone().unwrap();
    assert!(reason.contains("999"), "{reason}");
    assert_eq!(
        now.packets, waiting.packets,
        "frames sent past the break: {now:?}"
    );
    assert!(
        b.device.reports()[0].counters.broken.is_none(),
        "rx broke too"
    );
    recovery::assert_idle(&b);
    drop(p);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn a_tx_ring_scribbled_while_frames_wait_for_the_tap_breaks_once_it_drains_system_calls() {
    ring_broken_while_frames_wait("tappush-sys", TapIo::Syscalls);
}

#[test]
fn a_tx_ring_scribbled_while_frames_wait_for_the_tap_breaks_once_it_drains_io_uring() {
    // With a send-buffer limit the burst's writes are linked: the ones after the write that
    // found the TAP full are cancelled and wait on the ring too.
    ring_broken_while_frames_wait("tappush-uring", TapIo::Uring);
}

#[test]
fn a_frontend_that_goes_while_frames_wait_for_the_tap_is_let_go_at_once() {
    let exclusive = recovery::exclusive();
    let Some((ns, tap)) = setup() else { return };
    let b = backend(&ns, &tap, "tappush-gone", TapIo::Uring);
    let base = Baseline::take(&exclusive, &b);
    hold(&ns, &tap);
    let mut p = connect(&b, WANTED);
    fill_until_pushback(&b, &mut p);
    // It goes, the TAP still full: its queues are stopped (the worker answers the stop
    // without waiting for the TAP), and the next frontend is served at once.
    drop(p);
    let started = Instant::now();
    let mut p = connect(&b, WANTED);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the next frontend waited {:?}",
        started.elapsed()
    );
    assert!(tx(&b).broken.is_none(), "{:?}", tx(&b));
    // Its frames wait for the TAP in turn, without a spin.
    fill_until_pushback(&b, &mut p);
    recovery::assert_idle(&b);
    drop(p);
    release(&ns, &tap);
    recovery::assert_recovered(&b, &base);
}
