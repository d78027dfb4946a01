//! A guest that rewrites a tx frame's virtio-net header while the backend transmits it (one
//! vCPU flipping `gso_type` between a valid and an unknown value, another sending): the
//! backend must hand the TAP exactly the header it checked. Were it to check one read of the
//! header and write the guest's bytes again, some frames would pass the check with a valid
//! type and reach the TAP with the unknown one, which the kernel refuses (EINVAL), counted
//! as dropped beyond the refusals. So: every drop is a refusal counted by reason, and every
//! frame not refused reached the TAP. The race is shown to have been run: the flipped value
//! was refused many times.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). One test in a binary of its own:
//! it measures the process (`testkit::recovery`).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, frame, tap_backend_with, tap_rx_packets, Backend, Pair, WANTED};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::recovery::{self, Baseline};
use virtnet_backend::{BackendConfig, TapIo};
use vnet::NetHdr;
use vring::{Features, GuestAddress, GuestMemory};

const TEST: &str = "tx_header_race";

/// A GSO type no kernel knows: virtio_net_hdr_to_skb refuses it with EINVAL.
const UNKNOWN_GSO: u8 = 0x33;

/// The TAP's received frames: what the backend wrote into it.
fn tap_rx(ns: &NetNs, tap: &str) -> u64 {
    tap_rx_packets(ns.name(), tap)
}

/// Flips byte 1 (`gso_type`) of the buffer each of the `size` descriptors at `desc` points
/// at, between NONE and [`UNKNOWN_GSO`], until `stop`. Returns the passes made.
fn scribble(mem: &GuestMemory, desc: u64, size: u16, stop: &AtomicBool) -> u64 {
    let mut passes = 0u64;
    while !stop.load(Relaxed) {
        let value = if passes.is_multiple_of(2) {
            UNKNOWN_GSO
        } else {
            0
        };
        for i in 0..size as u64 {
            let mut addr = [0u8; 8];
            mem.read(GuestAddress(desc + 16 * i), &mut addr).unwrap();
            let addr = u64::from_le_bytes(addr);
            if addr != 0 {
                let _ = mem.write(GuestAddress(addr + 1), &[value]);
            }
        }
        passes += 1;
    }
    passes
}

#[test]
fn the_tap_gets_the_tx_header_that_was_checked_while_the_guest_rewrites_it() {
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("race").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    // Bursts through io_uring, and a writev per frame.
    for tap_io in [TapIo::Uring, TapIo::Syscalls] {
        let exclusive = recovery::exclusive();
        let config = BackendConfig {
            tap_io,
            ..Default::default()
        };
        let b = tap_backend_with(&ns, "race", &tap.name, config);
        let base = Baseline::take(&exclusive, &b);
        race(&b, &ns, &tap.name, tap_io);
        recovery::assert_recovered(&b, &base);
    }
}

/// Transmits for a second while a guest thread rewrites the headers, and checks what
/// reached the TAP.
fn race(b: &Backend, ns: &NetNs, tap: &str, tap_io: TapIo) {
    // Direct descriptors only, so that every descriptor's buffer starts with a header.
    let wanted = Features(WANTED.0 & !Features::RING_INDIRECT_DESC.0);

    let tx = || b.device.reports()[1].counters.clone();
    // The device's counters run across connections: this one's are the difference.
    let (packets0, dropped0) = (tx().packets, tx().dropped);
    let mut p: Pair = connect(b, wanted);
    let before = tap_rx(ns, tap);
    let mem = p.conn.mem.clone();
    let desc = p.conn.queues[1].config.rings().desc.0;
    let size = p.conn.queues[1].config.size();
    let stop = Arc::new(AtomicBool::new(false));
    let scribbler = {
        let (mem, stop) = (mem.clone(), stop.clone());
        std::thread::spawn(move || scribble(&mem, desc, size, &stop))
    };
    let f = frame(0, 64);
    let mut sent = 0u64;
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        for _ in 0..32 {
            if p.tx.send(&f, NetHdr::default()).unwrap() {
                sent += 1;
            } else {
                p.tx.flush();
                p.tx.wait_wake(10).unwrap();
            }
        }
        p.tx.flush();
    }
    stop.store(true, Relaxed);
    let passes = scribbler.join().unwrap();
    assert!(
        testkit::eventually(Duration::from_secs(5), || tx().packets - packets0 >= sent),
        "not every frame was handled: {:?}, {sent} sent",
        tx()
    );
    let c = tx();
    assert!(c.broken.is_none(), "{c:?}");
    let refused = c.hdr_short
        + c.hdr_bad_flags
        + c.hdr_not_negotiated
        + c.hdr_bad_csum
        + c.hdr_bad_gso
        + c.hdr_too_long;
    eprintln!(
        "{tap_io:?}: {sent} frames sent, {passes} scribbler passes, {refused} refused: {c:?}"
    );
    assert!(
        c.hdr_bad_gso >= 100,
        "the race was hardly run: {} frames refused for their GSO type",
        c.hdr_bad_gso
    );
    assert_eq!(
        c.dropped - dropped0,
        refused,
        "frames dropped beyond the refused ones: the TAP refused a header we had passed"
    );
    let reached = (c.packets - packets0) - (c.dropped - dropped0);
    assert!(
        testkit::eventually(Duration::from_secs(2), || tap_rx(ns, tap)
            >= before + reached),
        "the frames passed did not all reach the TAP: {reached} passed, {:?}",
        ns.stats(tap)
    );
    assert_eq!(tap_rx(ns, tap), before + reached);
    drop((p, mem));
}
