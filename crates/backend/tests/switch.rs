//! `virtnet switch` with our driver as its guests, in one process: frames go from one guest's
//! tx buffers into another's rx buffers byte for byte; known unicast reaches only its port; a
//! broadcast reaches every other port and not its sender; a port sends only from its MAC
//! (spoofed sources dropped, counted and never learned). A guest that takes no frames, floods
//! the MAC table or the other ports, sends bad headers or breaks its ring, and two senders
//! sharing one receiver, are `switch_load.rs`; ports removed and added again and guests
//! migrating between them, `switch_ports.rs`.
//!
//! Each case ends with the recovery check ([`recovery::assert_recovered`] on
//! [`SwitchPorts`]): the switch's threads alive (its workers under the seccomp filter) and
//! idle, two ports the case left alone exchanging frames on fresh connections within a
//! second, and the process's descriptors and memory back to what they were before the case.
//! Those are the process's, so the tests take [`recovery::exclusive`] first and run one at a
//! time. The set-up they share with the other `switch*` tests is in `switch_common/`.

mod switch_common;

use std::time::Duration;

use switch_common::{frame, guests, receive, send_all, three_ports, MAC};
use testkit::inproc::{connect_socket, WANTED};
use testkit::recovery::{self, Baseline, SwitchPorts};

#[test]
fn guests_exchange_frames_byte_for_byte_and_ports_send_only_from_their_mac() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-basic");
    let check = SwitchPorts::new(&s, "vm2", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let mut g = guests(&dir);

    // Unicast both ways, sizes from the smallest to a full MTU frame: byte for byte.
    let sizes = [60usize, 64, 65, 128, 1000, 1514];
    let to2: Vec<Vec<u8>> = (0..200)
        .map(|i| frame(MAC[1], MAC[0], i, sizes[i as usize % sizes.len()]))
        .collect();
    send_all(&mut g[0], &to2);
    assert_eq!(receive(&mut g[1], to2.len(), Duration::from_secs(5)), to2);
    let to1: Vec<Vec<u8>> = (0..200).map(|i| frame(MAC[0], MAC[1], i, 1514)).collect();
    send_all(&mut g[1], &to1);
    assert_eq!(receive(&mut g[0], to1.len(), Duration::from_secs(5)), to1);
    // Known unicast reached only its port: vm3 got none of it (vm2's MAC is static, and vm1's
    // too, so not even the first frames flooded).
    assert!(receive(&mut g[2], 1, Duration::from_millis(200)).is_empty());

    // A broadcast from vm3 reaches vm1 and vm2, and not vm3.
    let b = frame([0xff; 6], MAC[2], 7, 100);
    send_all(&mut g[2], std::slice::from_ref(&b));
    assert_eq!(
        receive(&mut g[0], 1, Duration::from_secs(5)),
        std::slice::from_ref(&b)
    );
    assert_eq!(
        receive(&mut g[1], 1, Duration::from_secs(5)),
        std::slice::from_ref(&b)
    );
    assert!(receive(&mut g[2], 1, Duration::from_millis(200)).is_empty());

    // Spoofed sources from vm1: dropped, counted on vm1's port, none delivered.
    let spoofed: Vec<Vec<u8>> = (0..50)
        .map(|i| frame([0xff; 6], [0x02, 0, 0, 0, 0, i as u8], i, 64))
        .collect();
    send_all(&mut g[0], &spoofed);
    assert!(receive(&mut g[1], 1, Duration::from_millis(300)).is_empty());
    assert!(receive(&mut g[2], 1, Duration::from_millis(100)).is_empty());
    let report = s
        .reports()
        .into_iter()
        .find(|r| r.spec.name == "vm1")
        .unwrap();
    let drops = serde_json::to_value(report.drops.unwrap()).unwrap();
    let spoof: u64 = drops
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.contains("spoof") || k.contains("source"))
        .map(|(_, v)| v.as_u64().unwrap())
        .sum();
    assert_eq!(spoof, 50, "{drops}");
    // No spoofed MAC was learned.
    let fdb = serde_json::to_value(s.core().fdb_show()).unwrap();
    assert!(!fdb.to_string().contains("02:00:00:00:00"), "{fdb}");

    // The workers ran under the seccomp filter, and go idle once the traffic stops.
    drop(g);
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}

/// A guest's rx queue on the switch asks its driver for no kicks: the switch never waits for
/// rx buffers (a frame without room is dropped), so a kick after each refill would be a system
/// call in the guest for nothing. DPDK's virtio-user, which has no EVENT_IDX, kicked after
/// every refill and spent an eighth of its CPU on it. Without EVENT_IDX here, vm2 takes four
/// rings' worth of frames, refilling as it goes, and writes no kick.
#[test]
fn a_guest_without_event_idx_does_not_kick_after_refilling_rx() {
    let exclusive = recovery::exclusive();
    let (dir, s) = three_ports("switch-rx-kicks");
    let check = SwitchPorts::new(&s, "vm1", "vm3");
    let base = Baseline::take(&exclusive, &check);
    let wanted = vring::Features(WANTED.0 & !vring::Features::RING_EVENT_IDX.0);
    let mut a = connect_socket(&dir.0.join("vm1.sock"), wanted, 2048);
    let mut b = connect_socket(&dir.0.join("vm2.sock"), wanted, 2048);
    // The first frame tells that vm2's rx queue runs on the switch.
    let first = [frame(MAC[1], MAC[0], 0, 64)];
    send_all(&mut a, &first);
    assert_eq!(receive(&mut b, 1, Duration::from_secs(5)), first);
    let kicks = b.rx.counters.kicks.get();
    let frames: Vec<Vec<u8>> = (1..=1024).map(|i| frame(MAC[1], MAC[0], i, 64)).collect();
    for chunk in frames.chunks(128) {
        send_all(&mut a, chunk);
        assert_eq!(receive(&mut b, chunk.len(), Duration::from_secs(5)), chunk);
    }
    assert_eq!(
        b.rx.counters.kicks.get(),
        kicks,
        "vm2 kicked after refilling rx"
    );
    drop((a, b));
    recovery::assert_recovered(&check, &base);
    s.shutdown();
}
