//! A guest that sends frames with virtio-net headers the kernel must not see (offloads not
//! negotiated, flags that do not exist, a checksum outside the frame, GSO without a segment
//! size): the backend on a real TAP drops each of them before the TAP, counts it by reason,
//! and passes the valid frames around them. Then a fresh connection's frames reach the TAP
//! within a second, and the backend's threads are idle and its descriptors back.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). One test in a binary of its own:
//! it measures the process (`testkit::recovery`).

use std::time::{Duration, Instant};

use testkit::inproc::{connect, frame, tap_backend, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::recovery::{self, Usage};
use vnet::{feature, NetHdr};

const TEST: &str = "tx_headers";

/// The TAP's received frames: what the backend wrote into it.
fn tap_rx(ns: &NetNs, tap: &str) -> u64 {
    ns.stats(tap).expect("TAP counters")["rx_packets"]
}

/// Sends `n` 64-byte frames with `hdr` and kicks.
fn send(p: &mut Pair, hdr: NetHdr, n: u32) {
    for i in 0..n {
        assert!(p.tx.send(&frame(i, 64), hdr).unwrap(), "tx ring full");
    }
    p.tx.flush();
}

#[test]
fn invalid_tx_headers_never_reach_the_tap_and_are_counted_by_reason() {
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("hdr").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let exclusive = recovery::exclusive();
    // The backend opens the TAP by name from a thread inside the namespace.
    let b: Backend = tap_backend(&ns, "hdr", &tap.name);
    // A first connection, so that the baseline has every thread and descriptor it keeps.
    drop(connect(&b, WANTED | feature::CSUM));
    let base = Usage::settled(&b);

    let mut p = connect(&b, WANTED | feature::CSUM);
    let before = tap_rx(&ns, &tap.name);
    let tso = NetHdr {
        gso_type: vnet::HDR_GSO_TCPV4,
        gso_size: 1400,
        hdr_len: 54,
        ..NetHdr::default()
    };
    let bad_flags = NetHdr {
        flags: 0x80,
        ..NetHdr::default()
    };
    let csum_outside = NetHdr {
        flags: vnet::HDR_F_NEEDS_CSUM,
        csum_start: 60,
        csum_offset: 16,
        ..NetHdr::default()
    };
    let unknown_gso = NetHdr {
        gso_type: 0x33,
        ..NetHdr::default()
    };
    send(&mut p, NetHdr::default(), 10);
    send(&mut p, tso, 3);
    send(&mut p, bad_flags, 4);
    send(&mut p, csum_outside, 5);
    send(&mut p, unknown_gso, 6);
    send(&mut p, NetHdr::default(), 10);
    let tx = || b.device.reports()[1].counters.clone();
    // Every chain is used (`packets` counts them all), the refused ones by reason.
    let counted = testkit::eventually(Duration::from_secs(5), || tx().packets >= 38);
    let c = tx();
    assert!(counted, "not every frame was handled: {c:?}");
    assert_eq!(
        (
            c.hdr_not_negotiated,
            c.hdr_bad_flags,
            c.hdr_bad_csum,
            c.hdr_bad_gso,
            c.dropped
        ),
        (3, 4, 5, 6, 18),
        "refused by reason: {c:?}"
    );
    assert!(
        c.broken.is_none(),
        "a bad header is the frame's, not the queue's"
    );
    assert!(
        testkit::eventually(Duration::from_secs(2), || tap_rx(&ns, &tap.name)
            >= before + 20),
        "the valid frames did not reach the TAP"
    );
    assert_eq!(
        tap_rx(&ns, &tap.name),
        before + 20,
        "only the valid frames reached the TAP"
    );
    drop(p);

    // What a user sees next: the backend alive and idle, a fresh connection's frames at the
    // TAP within a second, the descriptors and memory back.
    recovery::assert_alive(&b);
    recovery::assert_idle(&b);
    let start = Instant::now();
    let mut p = connect(&b, WANTED | feature::CSUM);
    let before = tap_rx(&ns, &tap.name);
    send(&mut p, NetHdr::default(), 8);
    assert!(
        testkit::eventually(Duration::from_secs(1), || tap_rx(&ns, &tap.name)
            >= before + 8),
        "a fresh connection's frames did not reach the TAP"
    );
    assert!(start.elapsed() < Duration::from_secs(1) + Duration::from_millis(100));
    drop(p);
    let now = Usage::settled(&b);
    assert_eq!(now.fds, base.fds, "descriptors, after the case and before");
    assert!(
        now.rss_kib <= base.rss_kib + recovery::RSS_SLACK_KIB,
        "resident memory {} KiB, {} KiB before the case",
        now.rss_kib,
        base.rss_kib
    );
    drop(exclusive);
}
