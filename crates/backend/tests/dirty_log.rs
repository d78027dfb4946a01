//! Dirty logging for live migration against an in-process backend, as QEMU drives it when a
//! migration starts: the queues run, the frontend shares a log (SET_LOG_BASE with LOG_SHMFD),
//! sets LOG_ALL and the rings' log flag, traffic flows both ways, and the queues stop
//! (GET_VRING_BASE). Every page the device wrote (rx buffers, the used rings) is marked;
//! no other page (tx frames, descriptor tables, avail rings, the unwritten rest of a buffer)
//! is.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd;
use std::time::Duration;

use testkit::eventually;
use testkit::inproc::start_backend;
use testkit::raw::{RawFrontend, RawQueue};
use vhost::vhost_user::message::VhostUserVirtioFeatures;
use vhost::{VhostBackend, VhostUserDirtyLogRegion};
use virtnet_backend::{BackendConfig, IoMode};
use vring::{Buf, DirtyLog, Features, GuestAddress, GuestMemory, RingAddresses};

const RX: usize = 0;
const TX: usize = 1;
const SIZE: u16 = 64;
const MEM: usize = 4 << 20;
const PAGE: u64 = 4096;
const FRAME: usize = 60;
const LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();

/// Each part of each ring on a page of its own, so that the test can tell them apart.
fn rings(index: usize) -> RingAddresses {
    let base = 0x1_0000 + index as u64 * 0x4000;
    RingAddresses {
        desc: GuestAddress(base),
        avail: GuestAddress(base + PAGE),
        used: GuestAddress(base + 2 * PAGE),
    }
}

/// The pages `[addr, addr + len)` touches.
fn pages(addr: u64, len: u64) -> impl Iterator<Item = u64> {
    addr / PAGE..=(addr + len - 1) / PAGE
}

fn all_used(q: &mut RawQueue, n: usize) -> Vec<(u32, u32)> {
    let mut got = Vec::new();
    let done = eventually(Duration::from_secs(5), || {
        while let Some(u) = q.driver.get_used().unwrap() {
            got.push(u);
        }
        got.len() >= n
    });
    assert!(done, "{} of {n} used", got.len());
    got
}

#[test]
fn every_page_the_device_writes_while_logging_is_marked_and_no_other() {
    let b = start_backend(
        "dirtylog",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            ..Default::default()
        },
    );
    let features = Features::VERSION_1 | Features::RING_EVENT_IDX;
    let mut f = RawFrontend::connect(&b.socket, 2, features, &[(GuestAddress(0), MEM)]);
    f.set_mem_table();
    let mut rx = f.start_queue(RX, SIZE, rings(RX));
    let mut tx = f.start_queue(TX, SIZE, rings(TX));

    // The migration starts: a log for all of memory, LOG_ALL, the rings' log flag (QEMU's
    // order, each acked before the next).
    let log_len = (MEM as u64 / PAGE).div_ceil(8);
    let logmem = GuestMemory::memfd(&[(GuestAddress(0), log_len as usize)]).unwrap();
    let log_file = logmem.regions().next().unwrap().file.unwrap();
    let region = VhostUserDirtyLogRegion {
        mmap_size: log_len,
        mmap_offset: 0,
        mmap_handle: log_file.as_raw_fd(),
    };
    f.frontend.set_log_base(0, Some(region)).unwrap();
    let protocol_bit = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    f.frontend
        .set_features(features.0 | protocol_bit | LOG_ALL)
        .unwrap();
    for (i, r) in [(RX, rings(RX)), (TX, rings(TX))] {
        let addr = f.vring_addr(r, SIZE, true);
        f.frontend.set_vring_addr(i, &addr).unwrap();
    }
    // The frontend's view of the log, cleared: what was marked before counts for nothing.
    let view = DirtyLog::from_file(log_file.try_clone().unwrap(), log_len, 0).unwrap();
    view.take_dirty();

    // rx: 24 buffers of 3000 bytes, each starting 100 bytes before a page boundary: a frame
    // (72 bytes with its header) marks that page and not the next two the buffer spans.
    // tx: 16 frames on pages of their own, which the device only reads.
    let rx_buf = |i: u64| 0x10_0000 + i * 2 * PAGE + PAGE - 100;
    for i in 0..24 {
        let buf = Buf::new(GuestAddress(rx_buf(i)), 3000);
        rx.driver.add(&[], &[buf], i as u32).unwrap();
    }
    rx.kick.write(1).unwrap();
    let rx_used = all_used(&mut rx, 24);
    let tx_frame = |i: u64| 0x30_0000 + i * PAGE;
    for i in 0..16 {
        let buf = Buf::new(GuestAddress(tx_frame(i)), 72);
        tx.driver.add(&[buf], &[], i as u32).unwrap();
        tx.kick.write(1).unwrap();
    }
    all_used(&mut tx, 16);
    // The migration's end: the queues stop, their batches published.
    let rx_base = f.frontend.get_vring_base(RX).unwrap();
    let tx_base = f.frontend.get_vring_base(TX).unwrap();
    assert_eq!(
        (rx_base, tx_base),
        (24, 16),
        "what the destination resumes from"
    );

    let mut want = BTreeSet::new();
    for &(token, len) in &rx_used {
        assert_eq!(len as usize, vnet::HDR_LEN + FRAME);
        want.extend(pages(rx_buf(token as u64), len as u64));
    }
    for q in [RX, TX] {
        want.extend(pages(rings(q).used.0, vring::layout::used_ring_size(SIZE)));
    }
    let got: BTreeSet<u64> = view.take_dirty().into_iter().collect();
    let missing: Vec<_> = want.difference(&got).collect();
    assert!(missing.is_empty(), "written but not marked: {missing:?}");
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(extra.is_empty(), "marked but not written: {extra:?}");
    // Each rx frame was in one page: 24 pages, plus the two used rings'.
    assert_eq!(got.len(), 24 + 2);
    assert_eq!(view.missed(), 0);
    drop((f, rx, tx));
}

#[test]
fn with_logging_off_nothing_is_marked() {
    let b = start_backend(
        "dirtyoff",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            ..Default::default()
        },
    );
    let features = Features::VERSION_1;
    let mut f = RawFrontend::connect(&b.socket, 2, features, &[(GuestAddress(0), MEM)]);
    f.set_mem_table();
    let log_len = (MEM as u64 / PAGE).div_ceil(8);
    let logmem = GuestMemory::memfd(&[(GuestAddress(0), log_len as usize)]).unwrap();
    let log_file = logmem.regions().next().unwrap().file.unwrap();
    let region = VhostUserDirtyLogRegion {
        mmap_size: log_len,
        mmap_offset: 0,
        mmap_handle: log_file.as_raw_fd(),
    };
    // A log shared but LOG_ALL never set (QEMU shares it first): nothing is written to it.
    f.frontend.set_log_base(0, Some(region)).unwrap();
    let mut rx = f.start_queue(RX, SIZE, rings(RX));
    for i in 0..8 {
        let buf = Buf::new(GuestAddress(0x10_0000 + i * PAGE), 2048);
        rx.driver.add(&[], &[buf], i as u32).unwrap();
    }
    rx.kick.write(1).unwrap();
    all_used(&mut rx, 8);
    f.frontend.get_vring_base(RX).unwrap();
    let view = DirtyLog::from_file(log_file.try_clone().unwrap(), log_len, 0).unwrap();
    assert_eq!(view.take_dirty(), Vec::<u64>::new());
    drop((f, rx));
}
