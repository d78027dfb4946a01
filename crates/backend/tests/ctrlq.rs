//! The device side of the control queue, driven by a bare driver queue: every command's
//! effect is visible in the backend, and malformed commands are acked ERR. VQ_PAIRS_SET on a
//! TAP (root: a network namespace) detaches and attaches its queues from the filtered
//! control-queue worker.

use testkit::inproc;
use virtnet_driver::{Frames, PollMode};

use std::time::{Duration, Instant};

use inproc::*;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::frontend::Connection;
use virtnet_driver::{RxQueue, TxQueue};
use vnet::ctrl::{self, Coalesce, Command, MacTable, MacTables};
use vnet::feature;
use vnet::NetHdr;
use vring::{Buf, DriverQueue, Features, GuestAddress};

struct Ctrl {
    q: DriverQueue<u32>,
    kick: virtnet_sys::PeerEventFd,
    buf: GuestAddress,
}

/// A frontend connection with `queues` virtqueues that needs CTRL_VQ.
fn connect_ctrl(b: &Backend, queues: u16, wanted: Features) -> Connection {
    Connection::connect(
        &b.socket,
        queues,
        256,
        wanted,
        feature::CTRL_VQ,
        32 << 20,
        Duration::from_secs(5),
    )
    .unwrap()
}

fn setup(b: &Backend, pairs: u16) -> (Connection, Ctrl, Vec<(RxQueue, TxQueue)>) {
    let wanted = WANTED
        | feature::CTRL_VQ
        | feature::CTRL_RX
        | feature::CTRL_MAC_ADDR
        | feature::NOTF_COAL
        | feature::VQ_NOTF_COAL;
    let n = 2 * pairs + 1;
    let mut conn = connect_ctrl(b, n, wanted);
    let mem = conn.mem.clone();
    let mut queues = Vec::new();
    for p in 0..pairs as usize {
        let rx = RxQueue::new(&conn.queues[2 * p], &mem, &mut conn.alloc, 1536).unwrap();
        let tx = TxQueue::new(&conn.queues[2 * p + 1], &mem, &mut conn.alloc, 2048).unwrap();
        queues.push((rx, tx));
    }
    let c = (n - 1) as usize;
    let q = DriverQueue::activate(&conn.queues[c].config, mem.clone(), None).unwrap();
    let buf = conn.alloc.alloc(4096, 64).unwrap();
    let kick = conn.queues[c].kick.try_clone().unwrap();
    for i in 0..n as usize {
        conn.start_queue(i).unwrap();
    }
    (conn, Ctrl { q, kick, buf }, queues)
}

/// Sends one command and waits for its ack; returns (ack, reply).
fn command(conn: &Connection, c: &mut Ctrl, cmd: &[u8], reply_len: usize) -> (u8, Vec<u8>) {
    let mem = &conn.mem;
    mem.write(c.buf, cmd).unwrap();
    let inb = GuestAddress(c.buf.0 + 1024);
    mem.write(inb, &vec![0xee; reply_len + 1]).unwrap();
    c.q.add(
        &[Buf::new(c.buf, cmd.len() as u32)],
        &[Buf::new(inb, reply_len as u32 + 1)],
        1,
    )
    .unwrap();
    if c.q.kick_prepare() {
        c.kick.signal().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some((_, len)) = c.q.get_used().unwrap() {
            let mut out = vec![0u8; reply_len + 1];
            mem.read(inb, &mut out).unwrap();
            assert!(len as usize <= reply_len + 1);
            let ack = out[reply_len];
            out.truncate(reply_len);
            return (ack, out);
        }
        assert!(
            Instant::now() < deadline,
            "no answer to the control command"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn coalescing_commands_set_and_get_per_queue_parameters() {
    let b = start_backend(
        "ctrl-coal",
        BackendConfig {
            pairs: 2,
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let (conn, mut c, _queues) = setup(&b, 2);
    let coal = Coalesce {
        max_packets: 16,
        max_usecs: 200,
    };
    let (ack, _) = command(
        &conn,
        &mut c,
        &Command::VqNotfCoalSet { vqn: 2, coal }.encode(),
        0,
    );
    assert_eq!(ack, ctrl::OK);
    let r = b.device.reports();
    assert_eq!(
        (r[2].coalesce_max_packets, r[2].coalesce_max_usecs),
        (16, 200)
    );
    assert_eq!(r[0].coalesce_max_packets, 0, "only queue 2 changed");
    let (ack, reply) = command(
        &conn,
        &mut c,
        &Command::VqNotfCoalGet { vqn: 2 }.encode(),
        8,
    );
    assert_eq!(ack, ctrl::OK);
    assert_eq!(Command::decode_reply(&reply.try_into().unwrap()), coal);
    let tx = Coalesce {
        max_packets: 32,
        max_usecs: 100,
    };
    assert_eq!(
        command(&conn, &mut c, &Command::NotfCoalTx(tx).encode(), 0).0,
        ctrl::OK
    );
    let r = b.device.reports();
    assert_eq!(
        (r[1].coalesce_max_packets, r[3].coalesce_max_packets),
        (32, 32)
    );
    assert_eq!(r[2].coalesce_max_packets, 16, "rx queues keep theirs");
    // Out of range, unknown, truncated: ERR, and the queue keeps working.
    assert_eq!(
        command(
            &conn,
            &mut c,
            &Command::VqNotfCoalGet { vqn: 4 }.encode(),
            8
        )
        .0,
        ctrl::ERR
    );
    assert_eq!(command(&conn, &mut c, &[99, 99], 0).0, ctrl::ERR);
    assert_eq!(command(&conn, &mut c, &[6, 2, 1], 0).0, ctrl::ERR);
    assert_eq!(
        command(&conn, &mut c, &Command::VqPairsSet(3).encode(), 0).0,
        ctrl::ERR
    );
    assert_eq!(
        command(&conn, &mut c, &Command::RxPromisc(true).encode(), 0).0,
        ctrl::OK
    );
    let ctrl_q = &b.device.reports()[4];
    assert_eq!(ctrl_q.kind, "ctrl");
    assert_eq!(
        (ctrl_q.counters.ctrl_commands, ctrl_q.counters.ctrl_errors),
        (8, 4)
    );
    assert!(ctrl_q.counters.broken.is_none());
}

#[test]
fn vq_pairs_set_silences_the_other_pairs() {
    let b = start_backend(
        "ctrl-mq",
        BackendConfig {
            pairs: 2,
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let (conn, mut c, mut queues) = setup(&b, 2);
    assert_eq!(
        command(&conn, &mut c, &Command::VqPairsSet(1).encode(), 0).0,
        ctrl::OK
    );
    assert_eq!(b.device.device_report().active_pairs, 1);
    let before = b.device.reports()[2].counters.packets;
    let mut got = [0usize; 2];
    let deadline = Instant::now() + Duration::from_millis(500);
    while Instant::now() < deadline {
        for (p, (rx, _)) in queues.iter_mut().enumerate() {
            got[p] += rx.poll(256, PollMode::Napi, Frames(|_: &[u8]| {})).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(got[0] > 1000, "pair 0 carries traffic: {got:?}");
    // Pair 1 may deliver what was already in flight when the command landed, no more.
    let after = b.device.reports()[2].counters.packets;
    assert!(
        after - before <= 256,
        "pair 1 kept receiving: {before} -> {after}"
    );
    assert_eq!(
        command(&conn, &mut c, &Command::VqPairsSet(2).encode(), 0).0,
        ctrl::OK
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut more = 0;
    while more < 1000 && Instant::now() < deadline {
        more += queues[1]
            .0
            .poll(256, PollMode::Napi, Frames(|_: &[u8]| {}))
            .unwrap();
        queues[1].0.wait(5);
    }
    assert!(more >= 1000, "pair 1 back: {more}");
}

/// Sends one frame to each of `dsts` through the echo backend; the frames that come back.
fn echoed(queues: &mut [(RxQueue, TxQueue)], dsts: &[[u8; 6]]) -> Vec<Vec<u8>> {
    let (rx, tx) = &mut queues[0];
    for (i, d) in dsts.iter().enumerate() {
        let mut f = frame(i as u32, 64);
        f[..6].copy_from_slice(d);
        assert!(tx.send(&f, NetHdr::default()).unwrap());
    }
    tx.flush();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.is_empty() && Instant::now() < deadline {
        rx.poll(16, PollMode::Napi, Frames(|x: &[u8]| got.push(x.to_vec())))
            .unwrap();
        rx.wait(5);
    }
    std::thread::sleep(Duration::from_millis(50));
    rx.poll(16, PollMode::Napi, Frames(|x: &[u8]| got.push(x.to_vec())))
        .unwrap();
    got
}

#[test]
fn promisc_off_filters_frames_to_other_macs() {
    let b = start_backend(
        "ctrl-rx",
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let (conn, mut c, mut queues) = setup(&b, 1);
    let ours = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    let other = [0x52, 0x54, 0, 0x99, 0x99, 0x99];
    assert_eq!(
        command(&conn, &mut c, &Command::MacAddrSet(ours).encode(), 0).0,
        ctrl::OK
    );
    assert_eq!(
        command(&conn, &mut c, &Command::RxPromisc(false).encode(), 0).0,
        ctrl::OK
    );
    let got = echoed(&mut queues, &[other, ours]);
    assert_eq!(got.len(), 1, "only the frame to our MAC comes back");
    assert_eq!(got[0][..6], ours);
    assert_eq!(b.device.reports()[0].counters.filtered, 1);
    assert!(!b.device.device_report().promisc);
}

/// Linux's virtio_net turns promiscuous mode off and lists the multicast groups its stack
/// joined (IPv6's all-nodes and solicited-node groups) with MAC_TABLE_SET: those, and the
/// unicast addresses listed, must pass the filter, others not.
#[test]
fn mac_table_set_lets_the_listed_addresses_through() {
    let ours = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
    let b = start_backend(
        "ctrl-table",
        BackendConfig {
            io: IoMode::Echo,
            mac: ours,
            ..Default::default()
        },
    );
    let (conn, mut c, mut queues) = setup(&b, 1);
    let listed = [0x52, 0x54, 0, 0x77, 0x77, 0x77];
    let unlisted = [0x52, 0x54, 0, 0x99, 0x99, 0x99];
    let all_nodes = [0x33, 0x33, 0, 0, 0, 1];
    let other_group = [0x33, 0x33, 0xff, 0, 0, 9];
    let table = Command::MacTableSet(Box::new(MacTables {
        unicast: MacTable::new(&[listed]),
        multicast: MacTable::new(&[all_nodes]),
    }));
    for cmd in [Command::RxPromisc(false), table] {
        assert_eq!(command(&conn, &mut c, &cmd.encode(), 0).0, ctrl::OK);
    }
    let dsts = [unlisted, all_nodes, other_group, listed, ours, [0xff; 6]];
    let got: Vec<[u8; 6]> = echoed(&mut queues, &dsts)
        .iter()
        .map(|f| f[..6].try_into().unwrap())
        .collect();
    assert_eq!(got, [all_nodes, listed, ours, [0xff; 6]]);
    assert_eq!(b.device.reports()[0].counters.filtered, 2);
}

#[test]
fn without_mq_the_control_queue_is_virtqueue_2() {
    // A two-pair device, and a driver that does not negotiate MQ: its control queue is
    // virtqueue 2 (spec 5.1.2), not 2 * max_virtqueue_pairs.
    let b = start_backend(
        "ctrl-nomq",
        BackendConfig {
            pairs: 2,
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let wanted =
        Features::VERSION_1 | feature::MRG_RXBUF | feature::CTRL_VQ | feature::VQ_NOTF_COAL;
    let mut conn = connect_ctrl(&b, 3, wanted);
    assert!(!conn.features.contains(feature::MQ));
    let mem = conn.mem.clone();
    let q = DriverQueue::activate(&conn.queues[2].config, mem, None).unwrap();
    let buf = conn.alloc.alloc(4096, 64).unwrap();
    let kick = conn.queues[2].kick.try_clone().unwrap();
    for i in 0..3 {
        conn.start_queue(i).unwrap();
    }
    let mut c = Ctrl { q, kick, buf };
    let coal = Coalesce {
        max_packets: 8,
        max_usecs: 100,
    };
    assert_eq!(
        command(
            &conn,
            &mut c,
            &Command::VqNotfCoalSet { vqn: 0, coal }.encode(),
            0
        )
        .0,
        ctrl::OK
    );
    let r = b.device.reports();
    assert_eq!(r[0].coalesce_max_packets, 8);
    assert_eq!(r[4].kind, "ctrl");
    assert_eq!(
        r[4].counters.ctrl_commands, 1,
        "answered by the control queue"
    );
    assert_eq!(r[2].counters.packets, 0, "not taken for pair 1's rx queue");
}

/// VQ_PAIRS_SET on a TAP: the control queue's worker, under its seccomp filter, detaches the
/// TAP queues of the pairs it turns off (TUNSETQUEUE, the one ioctl the filter allows) and
/// attaches them again.
#[test]
fn vq_pairs_set_detaches_and_attaches_tap_queues_under_the_filter() {
    use testkit::netns::{NetNs, TapSpec};
    use testkit::packages;
    if !packages::is_root() {
        packages::skip("ctrlq", "needs root (network namespaces, TAP devices)");
        return;
    }
    if let Err(reason) = packages::ensure(&[packages::Requirement::command("ip", "iproute2")]) {
        packages::skip("ctrlq", &reason);
        return;
    }
    let ns = NetNs::create("ctrlqtap").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let b = ns.run(|| {
        start_backend(
            "ctrl-mq-tap",
            BackendConfig {
                pairs: 2,
                io: IoMode::Tap(tap.name.clone()),
                ..Default::default()
            },
        )
    });
    assert!(b.device.shared().config().seccomp);
    let (conn, mut c, _queues) = setup(&b, 2);
    ns.wait_tap_attached(&tap.name, 2);
    let set = |c: &mut Ctrl, n: u16| command(&conn, c, &Command::VqPairsSet(n).encode(), 0).0;
    assert_eq!(set(&mut c, 1), ctrl::OK);
    assert_eq!(
        ns.tap_queues(&tap.name),
        Ok((1, 1)),
        "pair 1's queue detached"
    );
    assert_eq!(set(&mut c, 2), ctrl::OK);
    assert_eq!(ns.tap_queues(&tap.name), Ok((2, 0)), "attached again");
    testkit::recovery::assert_alive(&b);
}
