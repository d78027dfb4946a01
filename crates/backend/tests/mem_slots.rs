//! Memory hotplug (CONFIGURE_MEM_SLOTS) against an in-process backend: the frontend shares
//! its memory region by region, as QEMU does once the backend offers the feature, adds a
//! region while rx and tx run and places buffers in it, removes it again; hostile region
//! requests get error replies on a connection that goes on. Ends with the recovery check.

use std::time::Duration;

use testkit::eventually;
use testkit::inproc::start_backend;
use testkit::raw::{RawFrontend, RawQueue};
use testkit::recovery::{self, Baseline};
use vhost::vhost_user::VhostUserFrontend;
use vhost::VhostUserMemoryRegionInfo;
use virtnet_backend::{BackendConfig, IoMode};
use vring::{Buf, Features, GuestAddress, RingAddresses};

const RX: usize = 0;
const TX: usize = 1;
const SIZE: u16 = 64;
const REGION: usize = 1 << 20;
/// Where the second region sits: above 4 GiB, as a hotplugged DIMM does.
const HOTPLUG: u64 = 0x1_4000_0000;
const FRAME: usize = 60;

fn rings(index: usize) -> RingAddresses {
    RingAddresses::contiguous(GuestAddress(0x1000 + index as u64 * 0x4000), SIZE)
}

/// Waits for the used entry of `token`; its length.
fn used(q: &mut RawQueue, token: u32) -> u32 {
    let mut got = None;
    let done = eventually(Duration::from_secs(5), || {
        if let Some((t, len)) = q.driver.get_used().unwrap() {
            assert_eq!(t, token, "used out of order");
            got = Some(len);
        }
        got.is_some()
    });
    assert!(done, "chain {token} was never used");
    got.unwrap()
}

fn send(tx: &mut RawQueue, at: u64, token: u32) {
    tx.driver
        .add(&[Buf::new(GuestAddress(at), 72)], &[], token)
        .unwrap();
    tx.kick.write(1).unwrap();
    assert_eq!(used(tx, token), 0);
}

#[test]
fn regions_added_while_queues_run_carry_frames_and_hostile_ones_are_refused() {
    let exclusive = recovery::exclusive();
    let b = start_backend(
        "memslots",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            ..Default::default()
        },
    );
    let base = Baseline::take(&exclusive, &b);
    let layout = [(GuestAddress(0), REGION), (GuestAddress(HOTPLUG), REGION)];
    let mut f = RawFrontend::connect(&b.socket, 2, Features::VERSION_1, &layout);
    let counters = |q: usize| b.device.reports()[q].counters.clone();
    let sent_before = counters(TX).packets;
    assert_eq!(f.frontend.get_max_mem_slots().unwrap(), 509);
    f.add_region(0).unwrap();
    let mut tx = f.start_queue(TX, SIZE, rings(TX));
    let mut rx = f.start_queue(RX, SIZE, rings(RX));
    send(&mut tx, 0x8_0000, 1);

    // The second region, while both queues run: rx buffers and a tx frame in it.
    f.add_region(1).unwrap();
    let rx_buf = HOTPLUG + 0x2_0000;
    f.mem.write(GuestAddress(rx_buf), &[0xa5; 128]).unwrap();
    rx.driver
        .add(&[], &[Buf::new(GuestAddress(rx_buf), 128)], 7)
        .unwrap();
    rx.kick.write(1).unwrap();
    let len = used(&mut rx, 7) as usize;
    assert_eq!(len, vnet::HDR_LEN + FRAME);
    let mut frame = vec![0u8; 128];
    f.mem.read(GuestAddress(rx_buf), &mut frame).unwrap();
    assert!(
        frame[vnet::HDR_LEN..len].iter().any(|&b| b != 0xa5),
        "the frame was not written into the new region"
    );
    assert_eq!(frame[len..], [0xa5; 128][len..], "written past the frame");
    send(&mut tx, HOTPLUG + 0x3_0000, 2);

    // Hostile requests: an error reply each, and the connection goes on.
    let second = f.region(1);
    let overlapping = VhostUserMemoryRegionInfo {
        guest_phys_addr: HOTPLUG + 0x1000,
        userspace_addr: second.userspace_addr + (2 * REGION) as u64,
        ..second
    };
    assert!(f.frontend.add_mem_region(&overlapping).is_err(), "overlap");
    let past_file = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0x4000_0000,
        userspace_addr: second.userspace_addr + (4 * REGION) as u64,
        memory_size: 2 * REGION as u64,
        ..second
    };
    assert!(
        f.frontend.add_mem_region(&past_file).is_err(),
        "past its file"
    );
    let unknown = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0x4000_0000,
        ..second
    };
    assert!(
        f.frontend.remove_mem_region(&unknown).is_err(),
        "not a region"
    );
    assert_eq!(f.frontend.get_max_mem_slots().unwrap(), 509);
    // The same region again, as QEMU's second queue pair adds it: mapped already, acked.
    f.add_region(1).unwrap();
    send(&mut tx, HOTPLUG + 0x3_0000, 3);

    // Removed at the first removal; the other pair's removal is acked. Traffic in the first
    // region carries on.
    f.remove_region(1).unwrap();
    f.remove_region(1).unwrap();
    send(&mut tx, 0x8_0000, 4);
    assert_eq!(counters(TX).packets - sent_before, 4);
    assert!(counters(TX).broken.is_none() && counters(RX).broken.is_none());
    drop((f, tx, rx));

    recovery::assert_recovered(&b, &base);
}
