//! A hostile or careless frontend and guest: malformed vhost-user messages and broken rings
//! get a clean error, the queue concerned is marked broken, and the backend keeps serving.
//!
//! Each case ends with [`recovery::assert_recovered`]: what a user sees afterwards (threads
//! alive and idle, a fresh connection served within a second, descriptors and memory back to
//! the baseline). Those are the process's, so the tests take [`recovery::exclusive`] first
//! and run one at a time. They are short (1.5 s each, most of it the idle second), so
//! serialised in one binary they cost less than a binary each would to link.

use testkit::inproc;
use testkit::recovery::{self, Baseline};
use virtnet_driver::{Frames, PollMode};

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use inproc::*;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtnet_backend::{BackendConfig, IoMode};
use vring::{GuestAddress, GuestMemory};

/// A raw frontend with REPLY_ACK, so every bad request gets an error answer.
fn raw_frontend(b: &Backend, max_queues: u64) -> Frontend {
    let mut f = Frontend::connect(&b.socket, max_queues).unwrap();
    f.set_owner().unwrap();
    let features = f.get_features().unwrap();
    f.set_features(features).unwrap();
    assert!(features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0);
    let p = f.get_protocol_features().unwrap();
    assert!(p.contains(VhostUserProtocolFeatures::REPLY_ACK));
    f.set_protocol_features(p).unwrap();
    f.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    f
}

fn region(mem: &GuestMemory) -> VhostUserMemoryRegionInfo {
    use std::os::fd::AsRawFd;
    let r = mem.regions().next().unwrap();
    VhostUserMemoryRegionInfo {
        guest_phys_addr: r.guest_addr.0,
        memory_size: r.size,
        userspace_addr: r.user_addr,
        mmap_offset: 0,
        mmap_handle: r.file.unwrap().as_raw_fd(),
    }
}

#[test]
fn bad_queue_sizes_and_indices_get_errors() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("badidx");
    let base = Baseline::take(&exclusive, &b);
    let f = raw_frontend(&b, 300);
    assert!(f.set_vring_num(0, 3).is_err(), "size not a power of two");
    assert!(f.set_vring_num(0, 65535).is_err(), "size above 32768");
    assert!(
        f.set_vring_num(200, 256).is_err(),
        "queue index out of range"
    );
    // GET_VRING_BASE needs a reply: an index out of range closes the connection instead.
    assert!(f.get_vring_base(250).is_err());
    drop(f);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn overlapping_and_oversized_memory_tables_get_errors() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("badmem");
    let base = Baseline::take(&exclusive, &b);
    let f = raw_frontend(&b, 2);
    let mem = GuestMemory::memfd(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let r = region(&mem);
    let overlapping = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0x8_0000,
        userspace_addr: r.userspace_addr + (1 << 30),
        ..r
    };
    assert!(
        f.set_mem_table(&[r, overlapping]).is_err(),
        "overlapping regions"
    );
    let huge = VhostUserMemoryRegionInfo {
        memory_size: 1 << 40,
        ..r
    };
    assert!(
        f.set_mem_table(&[huge]).is_err(),
        "region past the end of its file"
    );
    // A good table is still accepted on the same connection.
    assert!(f.set_mem_table(&[r]).is_ok());
    // The message layer refuses a wrapping range (and closes the connection).
    let wrapping = VhostUserMemoryRegionInfo {
        guest_phys_addr: u64::MAX - 4095,
        ..r
    };
    assert!(
        f.set_mem_table(&[wrapping]).is_err(),
        "guest address range wraps"
    );
    drop((f, mem));
    recovery::assert_recovered(&b, &base);
}

#[test]
fn rings_outside_memory_are_refused_when_the_queue_starts() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("badring");
    let base = Baseline::take(&exclusive, &b);
    let mut f = raw_frontend(&b, 2);
    let mem = GuestMemory::memfd(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let r = region(&mem);
    f.set_mem_table(&[r]).unwrap();
    f.set_vring_num(1, 256).unwrap();
    let outside = r.userspace_addr + (2 << 20);
    let data = VringConfigData {
        queue_max_size: 256,
        queue_size: 256,
        flags: 0,
        desc_table_addr: outside,
        used_ring_addr: r.userspace_addr + 0x2000,
        avail_ring_addr: r.userspace_addr + 0x1000,
        log_addr: None,
    };
    assert!(
        f.set_vring_addr(1, &data).is_err(),
        "descriptor table outside memory"
    );
    // A ring that runs past the end of memory is refused when the queue starts.
    let tail = VringConfigData {
        desc_table_addr: r.userspace_addr + (1 << 20) - 2048,
        ..data
    };
    f.set_vring_addr(1, &tail).unwrap();
    f.set_vring_base(1, 0).unwrap();
    let kick = vmm_sys_util::eventfd::EventFd::new(0).unwrap();
    f.set_vring_kick(1, &kick).unwrap();
    assert!(
        f.set_vring_enable(1, true).is_err(),
        "descriptor table runs past memory"
    );
    // A misaligned ring is refused by the message layer, which closes the connection.
    let misaligned = VringConfigData {
        desc_table_addr: r.userspace_addr + 8,
        ..data
    };
    assert!(
        f.set_vring_addr(1, &misaligned).is_err(),
        "descriptor table not 16-aligned"
    );
    drop((f, mem, kick));
    recovery::assert_recovered(&b, &base);
}

#[test]
fn garbage_on_the_socket_closes_that_connection_only() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("garbage");
    let base = Baseline::take(&exclusive, &b);
    let mut s = UnixStream::connect(&b.socket).unwrap();
    // A header claiming request 0xdead with a 4 KiB body, then noise.
    let mut msg = vec![0xad, 0xde, 0, 0, 1, 0, 0, 0, 0, 0x10, 0, 0];
    msg.extend(std::iter::repeat_n(0x5a, 64));
    let _ = s.write_all(&msg);
    drop(s);
    let mut s = UnixStream::connect(&b.socket).unwrap();
    let _ = s.write_all(&[0xff; 7]); // A truncated header.
    drop(s);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn an_indirect_table_longer_than_the_queue_breaks_tx_and_nothing_else() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("longchain");
    let base = Baseline::take(&exclusive, &b);
    let p = connect(&b, WANTED);
    // As a hostile guest: tx descriptor 0 points at an indirect table of 300 entries, more
    // than the queue's 256 (VIRTIO 1.2 2.7.5.3.1), each a 4 KiB buffer; published and kicked.
    let rings = p.conn.queues[1].config.rings();
    let mem = &p.conn.mem;
    let r = mem.regions().next().unwrap();
    let table = GuestAddress(r.guest_addr.0 + r.size - 0x8000);
    for j in 0..300u64 {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&(table.0 - 0x1000).to_le_bytes());
        d[8..12].copy_from_slice(&4096u32.to_le_bytes());
        d[12..14].copy_from_slice(&1u16.to_le_bytes()); // NEXT
        d[14..].copy_from_slice(&(j as u16 + 1).to_le_bytes());
        mem.write(GuestAddress(table.0 + j * 16), &d).unwrap();
    }
    let mut head = [0u8; 16];
    head[..8].copy_from_slice(&table.0.to_le_bytes());
    head[8..12].copy_from_slice(&(300u32 * 16).to_le_bytes());
    head[12..14].copy_from_slice(&4u16.to_le_bytes()); // INDIRECT
    mem.write(rings.desc, &head).unwrap();
    mem.write(GuestAddress(rings.avail.0 + 4), &0u16.to_le_bytes())
        .unwrap();
    mem.write(GuestAddress(rings.avail.0 + 2), &1u16.to_le_bytes())
        .unwrap();
    p.conn.queues[1].kick.signal().unwrap();
    let tx = || b.device.reports()[1].counters.broken.clone();
    assert!(testkit::eventually(Duration::from_secs(5), || tx().is_some()));
    assert!(tx().unwrap().contains("indirect"), "{:?}", tx());
    assert!(
        b.device.reports()[0].counters.broken.is_none(),
        "rx untouched"
    );
    drop(p);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn a_ring_error_only_busy_polling_sees_breaks_the_queue_and_is_reported() {
    let exclusive = recovery::exclusive();
    let b = start_backend(
        "pollbreak",
        BackendConfig {
            io: IoMode::Echo,
            busy_poll: virtnet_backend::BusyPoll::Fixed(300_000),
            ..Default::default()
        },
    );
    let base = Baseline::take(&exclusive, &b);
    let mut p = connect(&b, WANTED);
    assert_eq!(echo_round(&mut p, 1, 64).len(), 1);
    // The worker now busy-polls for 300 ms. Without a kick, the guest moves its tx avail
    // index 300 ahead (more than the queue's 256): only the busy-poll loop reads it.
    let rings = p.conn.queues[1].config.rings();
    let idx = GuestAddress(rings.avail.0 + 2);
    let mut now = [0u8; 2];
    p.conn.mem.read(idx, &mut now).unwrap();
    let ahead = u16::from_le_bytes(now).wrapping_add(300);
    p.conn.mem.write(idx, &ahead.to_le_bytes()).unwrap();
    let tx = || b.device.reports()[1].counters.broken.clone();
    assert!(
        testkit::eventually(Duration::from_secs(5), || tx().is_some()),
        "the busy-poll loop's ring error was swallowed"
    );
    assert!(tx().unwrap().contains("avail"), "{:?}", tx());
    // Reported as every break is: NEEDS_RESET in the device status.
    let status = p.conn.get_status().unwrap().expect("STATUS negotiated");
    assert_ne!(status & 0x40, 0, "NEEDS_RESET, status {status:#x}");
    drop(p);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn a_broken_tx_ring_stops_that_queue_and_rx_keeps_working() {
    let exclusive = recovery::exclusive();
    let b = start_backend(
        "brokenring",
        BackendConfig {
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let base = Baseline::take(&exclusive, &b);
    let mut p = connect(&b, WANTED);
    // Act as a hostile guest: publish head 999 on the tx avail ring (size 256) and kick.
    let reason = break_tx_ring(&b, &p).expect("tx queue marked broken");
    assert!(reason.contains("head 999"), "{reason}");
    // The rx queue of the same worker still delivers frames.
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < 1000 && Instant::now() < deadline {
        got +=
            p.rx.poll(256, PollMode::Napi, Frames(|_: &[u8]| {}))
                .unwrap();
        p.rx.wait(10);
    }
    assert!(got >= 1000, "rx stalled after tx broke: {got}");
    assert!(b.device.reports()[0].counters.broken.is_none());
    // Reconnecting resets the queue: a new driver works again.
    drop(p);
    let mut p = connect(&b, WANTED);
    assert!(p
        .rx
        .poll(256, PollMode::Napi, Frames(|_: &[u8]| {}))
        .is_ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.device.reports()[1].counters.broken.is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        b.device.reports()[1].counters.broken.is_none(),
        "reset clears broken"
    );
    drop(p);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn reconnect_in_the_middle_of_traffic_resumes() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("reconnect");
    let base = Baseline::take(&exclusive, &b);
    let mut p = connect(&b, WANTED);
    // Leave frames in flight, then vanish.
    for i in 0..100 {
        let _ = p.tx.send(&frame(i, 64), vnet::NetHdr::default());
    }
    p.tx.flush();
    drop(p);
    let before = b.device.reports()[1].counters.packets;
    let mut p = connect(&b, WANTED);
    let got = echo_round(&mut p, 1000, 64);
    assert_eq!(got.len(), 1000);
    assert!(b.device.reports()[1].counters.packets >= before + 1000);
    drop(p);
    recovery::assert_recovered(&b, &base);
}

/// Sends one request in the vhost-user framing (three native-endian u32, then the payload).
fn raw_send(s: &mut UnixStream, code: u32, flags: u32, payload: &[u8]) {
    let mut m = Vec::new();
    for w in [code, flags, payload.len() as u32] {
        m.extend_from_slice(&w.to_ne_bytes());
    }
    m.extend_from_slice(payload);
    s.write_all(&m).unwrap();
}

/// Reads one reply carrying a u64: (request code, value).
fn raw_reply_u64(s: &mut UnixStream) -> (u32, u64) {
    use std::io::Read;
    let mut r = [0u8; 20];
    s.read_exact(&mut r).unwrap();
    let w = |i: usize| u32::from_ne_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!((w(1) & 0x4, w(2)), (0x4, 8), "a reply with a u64");
    (w(0), u64::from_ne_bytes(r[12..].try_into().unwrap()))
}

/// A request whose protocol feature was not acknowledged (GET_QUEUE_NUM without MQ) gets no
/// answer from the handler: the connection closes, so the frontend sees why at once instead of
/// waiting for a reply that never comes.
#[test]
fn a_request_of_a_protocol_feature_never_acked_closes_the_connection() {
    use std::io::Read;
    const SET_OWNER: u32 = 3;
    const GET_QUEUE_NUM: u32 = 17;
    let exclusive = recovery::exclusive();
    let b = echo_backend("inactive");
    let base = Baseline::take(&exclusive, &b);
    let mut s = UnixStream::connect(&b.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    raw_send(&mut s, SET_OWNER, 1, &[]);
    raw_send(&mut s, GET_QUEUE_NUM, 1, &[]);
    let t = Instant::now();
    let got = s.read(&mut [0u8; 64]);
    assert!(
        matches!(got, Ok(0)),
        "after {:?}: {got:?}, not the close",
        t.elapsed()
    );
    drop(s);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn status_is_kept_and_a_broken_queue_reports_needs_reset() {
    const GET_FEATURES: u32 = 1;
    const SET_FEATURES: u32 = 2;
    const SET_OWNER: u32 = 3;
    const GET_PROTOCOL_FEATURES: u32 = 15;
    const SET_PROTOCOL_FEATURES: u32 = 16;
    const SET_STATUS: u32 = 39;
    const GET_STATUS: u32 = 40;
    let exclusive = recovery::exclusive();
    let b = echo_backend("status");
    let base = Baseline::take(&exclusive, &b);
    let mut s = UnixStream::connect(&b.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    raw_send(&mut s, SET_OWNER, 1, &[]);
    raw_send(&mut s, GET_FEATURES, 1, &[]);
    let features = raw_reply_u64(&mut s).1;
    raw_send(&mut s, SET_FEATURES, 1, &features.to_ne_bytes());
    raw_send(&mut s, GET_PROTOCOL_FEATURES, 1, &[]);
    let protocol = raw_reply_u64(&mut s).1;
    let status_bit = VhostUserProtocolFeatures::STATUS.bits();
    assert!(protocol & status_bit != 0, "STATUS offered");
    raw_send(&mut s, SET_PROTOCOL_FEATURES, 1, &protocol.to_ne_bytes());
    // ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK, with REPLY_ACK's NEED_REPLY.
    raw_send(&mut s, SET_STATUS, 1 | 0x8, &15u64.to_ne_bytes());
    assert_eq!(raw_reply_u64(&mut s), (SET_STATUS, 0), "acked with success");
    raw_send(&mut s, GET_STATUS, 1, &[]);
    assert_eq!(raw_reply_u64(&mut s), (GET_STATUS, 15));
    // A queue the guest broke: the device asks for a reset (virtio NEEDS_RESET, 0x40).
    b.device
        .counters(1)
        .set_broken("test: a hostile ring".into());
    raw_send(&mut s, GET_STATUS, 1, &[]);
    assert_eq!(raw_reply_u64(&mut s), (GET_STATUS, 15 | 0x40));
    // The ordinary requests still go through rust-vmm's handler on the same connection.
    raw_send(&mut s, GET_FEATURES, 1, &[]);
    assert_eq!(raw_reply_u64(&mut s), (GET_FEATURES, features));
    drop(s);
    recovery::assert_recovered(&b, &base);
}
