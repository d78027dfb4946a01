//! The `vhost_user` seeds of guest traffic, after a whole start-up: frames echoed, tiny and
//! too small rx buffers behind the null port, an rx chain with no writable byte, tx chains
//! cut every which way, tx headers for each verdict of `check_tx`, a frame longer than the
//! echo port takes, and traffic on a second pair. Each also checks the chains posted and used
//! and the queues broken.

use super::*;

/// The traffic seeds': mergeable rx buffers, and the tx offloads whose headers `check_tx`
/// lets through (not HOST_TSO6, so that a TCPv6 header is refused as not negotiated).
const TRAFFIC: u64 =
    FEATURES | feature::MRG_RXBUF.0 | feature::CSUM.0 | feature::HOST_TSO4.0 | feature::HOST_ECN.0;

fn guest(op: GuestOp) -> Step {
    Step::Guest(op)
}

/// A broadcast frame of the local experimental ethertype: 60 bytes, after the header.
fn eth() -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend([0x02, 0, 0, 0, 0, 9]);
    f.extend(0x88b5u16.to_be_bytes());
    f.extend((0..46).map(|i| i as u8));
    f
}

/// A tx chain of `hdr` and the 60-byte frame, cut into `readable`.
fn tx(queue: u8, hdr: Hdr, readable: Vec<Segment>) -> Step {
    guest(GuestOp::Tx {
        queue,
        frame: Frame {
            hdr,
            payload: eth(),
        },
        readable,
        writable: Vec::new(),
    })
}

/// `chains` rx chains of `writable`.
fn rx(queue: u8, chains: u8, writable: Vec<Segment>) -> Step {
    guest(GuestOp::Rx {
        queue,
        count: chains - 1,
        readable: Vec::new(),
        writable,
    })
}

/// The whole header and the 60-byte frame in one buffer.
const WHOLE: Segment = Segment::Data(72);
const RX_BUF: Segment = Segment::Data(2048);

/// A start-up with `features` on `port`, virtqueues `0..queues` running; its replies.
fn started(features: u64, port: Port, queues: u32) -> (VhostInput, Vec<u32>) {
    let mut m = negotiate_with(features);
    m.push(mem_table());
    for q in 0..queues {
        m.extend(start_queue(q));
    }
    let mut input = vhost(m);
    input.port = port;
    input.pairs = (queues > 2) as u8;
    let mut replies = vec![
        code::GET_FEATURES,
        code::GET_PROTOCOL_FEATURES,
        code::GET_QUEUE_NUM,
        code::SET_MEM_TABLE,
    ];
    replies.extend((0..queues).map(|_| code::SET_VRING_ENABLE));
    (input, replies)
}

/// What a traffic seed must do: the start-up's messages and replies, the chains posted and
/// used, the virtqueues broken.
fn traffic(
    i: &VhostInput,
    replies: Vec<u32>,
    posted: usize,
    used: usize,
    broken: &[usize],
) -> vhost_user::Outcome {
    vhost_user::Outcome {
        handled: i
            .steps
            .iter()
            .filter(|s| matches!(s, Step::Message(_)))
            .count(),
        closed: false,
        replies,
        posted,
        used,
        broken: broken.to_vec(),
    }
}

pub(super) fn seeds() -> Vec<VhostSeed> {
    let mut seeds = Vec::new();
    let kick = |q| guest(GuestOp::Kick(q));
    let settle = guest(GuestOp::Settle);

    // A frame echoed: four rx buffers posted, one tx frame, each kicked; the tx chain and one
    // rx buffer come back.
    let (mut i, replies) = started(TRAFFIC, Port::Echo, 2);
    i.steps.extend([
        rx(0, 4, vec![RX_BUF]),
        kick(0),
        tx(1, Hdr::Plain, vec![WHOLE]),
        kick(1),
        settle.clone(),
    ]);
    let want = traffic(&i, replies, 5, 2, &[]);
    seeds.push(("echo_frames", i, want));

    // The null port's 1512-byte frame (header included) merged across all 32 rx chains of two
    // 24-byte buffers that the ring holds (the guest tries 64); the next frame waits.
    let (mut i, replies) = started(TRAFFIC, Port::Null(1500), 2);
    let tiny = vec![Segment::Data(24), Segment::Data(24)];
    i.steps.extend([rx(0, 64, tiny), kick(0), settle.clone()]);
    let want = traffic(&i, replies, 32, 32, &[]);
    seeds.push(("null_tiny_rx_buffers", i, want));

    // Without MRG_RXBUF a frame must fit one chain: the null port's 112-byte frame is dropped,
    // the 64-byte buffers are kept, and the port waits for more.
    let (mut i, replies) = started(FEATURES, Port::Null(100), 2);
    i.steps
        .extend([rx(0, 4, vec![Segment::Data(64)]), kick(0), settle.clone()]);
    let want = traffic(&i, replies, 4, 0, &[]);
    seeds.push(("null_rx_buffers_too_small", i, want));

    // An rx chain with no writable byte breaks rx when the echo port delivers into it; the tx
    // frame is used all the same.
    let (mut i, replies) = started(TRAFFIC, Port::Echo, 2);
    i.steps.extend([
        guest(GuestOp::Rx {
            queue: 0,
            count: 0,
            readable: vec![Segment::Data(64)],
            writable: Vec::new(),
        }),
        kick(0),
        tx(1, Hdr::Plain, vec![WHOLE]),
        kick(1),
        settle.clone(),
    ]);
    let want = traffic(&i, replies, 2, 1, &[0]);
    seeds.push(("rx_no_writable_bytes", i, want));

    // tx chains cut every which way: the header split around a zero-length buffer, a writable
    // buffer after the frame (both echoed), then a buffer outside memory, which breaks tx.
    let (mut i, replies) = started(TRAFFIC, Port::Echo, 2);
    let split = [4, 0, 8, 60].map(Segment::Data).to_vec();
    i.steps.extend([
        rx(0, 8, vec![RX_BUF]),
        kick(0),
        tx(1, Hdr::Plain, split),
        guest(GuestOp::Tx {
            queue: 1,
            frame: Frame {
                hdr: Hdr::Plain,
                payload: eth(),
            },
            readable: vec![WHOLE],
            writable: vec![Segment::Data(16)],
        }),
        kick(1),
        settle.clone(),
        tx(
            1,
            Hdr::Plain,
            vec![
                WHOLE,
                Segment::Raw {
                    addr: 1 << 40,
                    len: 64,
                },
            ],
        ),
        kick(1),
        settle.clone(),
    ]);
    let want = traffic(&i, replies, 11, 4, &[1]);
    seeds.push(("tx_segments", i, want));

    // A header for each verdict of check_tx (which the harness applies, as the TAP port
    // would): a checksum inside the frame and past it, TSO4 with and without ECN, TSO6 (not
    // negotiated), an unknown GSO type, gso_size 0, DATA_VALID. The echo port takes them all.
    let (mut i, replies) = started(TRAFFIC, Port::Echo, 2);
    let gso = |gso_type: u8, gso_size: u16| Hdr::Gso {
        gso_type,
        gso_size,
        hdr_len: 54,
        csum_start: 34,
        csum_offset: 16,
    };
    let mut data_valid = [0u8; 12];
    data_valid[0] = 2;
    let headers = [
        Hdr::Csum {
            start: 14,
            offset: 16,
        },
        Hdr::Csum {
            start: 50,
            offset: 16,
        },
        gso(vnet::HDR_GSO_TCPV4, 1448),
        gso(vnet::HDR_GSO_TCPV4 | vnet::HDR_GSO_ECN, 1448),
        gso(vnet::HDR_GSO_TCPV6, 1448),
        gso(7, 1448),
        gso(vnet::HDR_GSO_TCPV4, 0),
        Hdr::Raw(data_valid),
    ];
    i.steps.extend([rx(0, 8, vec![RX_BUF]), kick(0)]);
    i.steps
        .extend(headers.iter().map(|&h| tx(1, h, vec![WHOLE])));
    i.steps.extend([kick(1), settle.clone()]);
    let want = traffic(&i, replies, 16, 16, &[]);
    seeds.push(("tx_headers", i, want));

    // A 128 KiB tx chain over two regions: the echo port takes its first 65566 bytes (a 64 KiB
    // GSO frame and its header), which rx merges across 33 of the 40 chains posted.
    let (mut i, replies) = started(TRAFFIC, Port::Echo, 2);
    let Step::Message(table) = &mut i.steps[6] else {
        unreachable!("the memory table follows the negotiation")
    };
    table.body = Body::MemTable(vec![
        Region::Pages {
            guest_page: 0,
            pages: 16,
            user_page: USER_PAGE,
            offset_pages: 0,
        },
        Region::Pages {
            guest_page: 16,
            pages: 16,
            user_page: 0x200,
            offset_pages: 0,
        },
    ]);
    let region = |addr| Segment::Raw {
        addr,
        len: 0x1_0000,
    };
    i.steps.extend([
        rx(0, 40, vec![RX_BUF]),
        kick(0),
        tx(1, Hdr::Plain, vec![region(0), region(0x1_0000)]),
        kick(1),
        settle.clone(),
    ]);
    let want = traffic(&i, replies, 41, 34, &[]);
    seeds.push(("echo_frame_longer_than_the_port_takes", i, want));

    // Two pairs under MQ: a frame echoed on the second.
    let (mut i, replies) = started(TRAFFIC | feature::MQ.0, Port::Echo, 4);
    i.steps.extend([
        rx(2, 2, vec![RX_BUF]),
        kick(2),
        tx(3, Hdr::Plain, vec![WHOLE]),
        kick(3),
        settle,
    ]);
    let want = traffic(&i, replies, 3, 2, &[]);
    seeds.push(("second_pair_echo", i, want));
    seeds
}
