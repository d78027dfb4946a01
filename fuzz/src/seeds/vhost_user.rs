//! The `vhost_user` seeds: a frontend's start-up and stop, a memory table swapped under
//! running queues, config reads, bad memory tables and rings, SET_VRING_ENABLE before
//! SET_FEATURES, unknown codes, stray fds and a truncated tail (here); guest traffic
//! (`vhost_user/traffic.rs`); and messages that do not come whole (`vhost_user/stalls.rs`).
//! Each is run and checked for the replies, the close, the chains used and the queues broken
//! that its name promises (and every run ends with the liveness check); the test here writes
//! them all to the corpus and replays it. The messages of a start-up, which all three build
//! on, are here too.

mod stalls;
mod traffic;

use super::{replay, write_corpus};
use crate::encode::Encode;
use crate::vhost_user::{
    self, code, Body, Fds, Flags, Frame, GuestOp, Hdr, Message, Port, Region, Request, Segment,
    Size, Step, UserAddr, VhostInput, HEADER_LEN, NOFD, PROTOCOL_FEATURES_BIT, SEEDS,
};
use vnet::feature;
use vring::Features;

fn msg(code: u32, body: Body) -> Message {
    Message {
        request: Request::of(code),
        flags: Flags::Plain,
        body,
        size: Size::Body,
        fds: Fds::Auto,
    }
}

fn need_reply(mut m: Message) -> Message {
    m.flags = Flags::NeedReply;
    m
}

fn state(code: u32, index: u32, num: u32) -> Message {
    msg(code, Body::State { index, num })
}

/// A small fixed feature set, so that the seeds do not change with what the device offers.
const FEATURES: u64 = Features::VERSION_1.0 | Features::RING_EVENT_IDX.0;
/// MQ, REPLY_ACK, CONFIG, MTU.
const PROTOCOL: u64 = 0x1 | 0x8 | 0x200 | 0x10;
/// Where the frontend says its memory is mapped: 16 pages from page 0x100.
const USER_PAGE: u16 = 0x100;

/// Feature negotiation as QEMU does it.
fn negotiate() -> Vec<Message> {
    negotiate_with(FEATURES)
}

fn negotiate_with(features: u64) -> Vec<Message> {
    vec![
        msg(code::GET_FEATURES, Body::Empty),
        msg(
            code::SET_FEATURES,
            Body::U64(features | PROTOCOL_FEATURES_BIT),
        ),
        msg(code::GET_PROTOCOL_FEATURES, Body::Empty),
        msg(code::SET_PROTOCOL_FEATURES, Body::U64(PROTOCOL)),
        msg(code::SET_OWNER, Body::Empty),
        msg(code::GET_QUEUE_NUM, Body::Empty),
    ]
}

fn mem_table() -> Message {
    need_reply(msg(
        code::SET_MEM_TABLE,
        Body::MemTable(vec![Region::Pages {
            guest_page: 0,
            pages: 16,
            user_page: USER_PAGE,
            offset_pages: 0,
        }]),
    ))
}

/// Starts virtqueue `index` of size 64 with its rings in page `index` (descriptors, avail at
/// 0x400, used at 0x800), below the guest's data area (pages 8 to 15).
fn start_queue(index: u32) -> Vec<Message> {
    let page = |k: u16| UserAddr {
        page: USER_PAGE + index as u16,
        offset: k * 0x400,
    };
    vec![
        state(code::SET_VRING_NUM, index, 64),
        msg(
            code::SET_VRING_ADDR,
            Body::Addr {
                index,
                flags: 0,
                desc: page(0),
                used: page(2),
                avail: page(1),
                log: 0,
            },
        ),
        state(code::SET_VRING_BASE, index, 0),
        msg(code::SET_VRING_KICK, Body::U64(index as u64)),
        msg(code::SET_VRING_CALL, Body::U64(index as u64)),
        msg(code::SET_VRING_ERR, Body::U64(index as u64 | NOFD)),
        need_reply(state(code::SET_VRING_ENABLE, index, 1)),
    ]
}

/// One pair behind the null port (64-byte frames), as before the input had a port.
fn vhost(messages: Vec<Message>) -> VhostInput {
    VhostInput {
        pairs: 0,
        port: Port::Null(64),
        steps: messages.into_iter().map(Step::Message).collect(),
        tail: None,
    }
}

type VhostSeed = (&'static str, VhostInput, vhost_user::Outcome);

fn outcome(handled: usize, closed: bool, replies: &[u32]) -> vhost_user::Outcome {
    vhost_user::Outcome {
        handled,
        closed,
        replies: replies.to_vec(),
        ..Default::default()
    }
}

fn vhost_seeds() -> Vec<VhostSeed> {
    use code::*;
    let mut seeds = Vec::new();

    // A frontend's whole start-up, both queues running, then stopped again.
    let mut m = negotiate();
    m.push(mem_table());
    m.extend(start_queue(0));
    m.extend(start_queue(1));
    m.push(state(GET_VRING_BASE, 0, 0));
    m.push(state(GET_VRING_BASE, 1, 0));
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        SET_MEM_TABLE,
        SET_VRING_ENABLE,
        SET_VRING_ENABLE,
        GET_VRING_BASE,
        GET_VRING_BASE,
    ];
    seeds.push((
        "start_and_stop",
        vhost(m.clone()),
        outcome(m.len(), false, &replies),
    ));

    // A new memory table while queues run, then a reset.
    let mut m = negotiate();
    m.push(mem_table());
    m.extend(start_queue(0));
    m.push(mem_table());
    m.push(msg(RESET_OWNER, Body::Empty));
    let mut i = vhost(m.clone());
    i.pairs = 1;
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        SET_MEM_TABLE,
        SET_VRING_ENABLE,
        SET_MEM_TABLE,
    ];
    seeds.push((
        "mem_table_swap_and_reset",
        i,
        outcome(m.len(), false, &replies),
    ));

    // Config space reads, in range and past the end: the message layer answers the latter
    // with an empty reply, and a later refused request does not close the connection.
    let mut m = negotiate();
    m.push(msg(GET_CONFIG, Body::ConfigRead { offset: 0, size: 6 }));
    m.push(msg(
        GET_CONFIG,
        Body::ConfigRead {
            offset: 8,
            size: 64,
        },
    ));
    m.push(need_reply(state(SET_VRING_NUM, 0, 3)));
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        GET_CONFIG,
        GET_CONFIG,
        SET_VRING_NUM,
    ];
    seeds.push((
        "config_reads",
        vhost(m.clone()),
        outcome(m.len(), false, &replies),
    ));

    // Bad memory tables: overlapping, past the end of the file (refused, the connection goes
    // on), then fewer fds than regions.
    let good = Region::Pages {
        guest_page: 0,
        pages: 16,
        user_page: USER_PAGE,
        offset_pages: 0,
    };
    let mut m = negotiate();
    let overlapping = Region::Pages {
        guest_page: 8,
        pages: 16,
        user_page: 0x200,
        offset_pages: 0,
    };
    m.push(need_reply(msg(
        SET_MEM_TABLE,
        Body::MemTable(vec![good, overlapping]),
    )));
    let past_end = Region::Pages {
        guest_page: 0,
        pages: 16,
        user_page: USER_PAGE,
        offset_pages: 1,
    };
    m.push(need_reply(msg(
        SET_MEM_TABLE,
        Body::MemTable(vec![past_end]),
    )));
    // Fewer fds than regions: the message layer closes the connection.
    let mut few_fds = need_reply(msg(SET_MEM_TABLE, Body::MemTable(vec![good, overlapping])));
    few_fds.fds = Fds::Memfds(1);
    m.push(few_fds);
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        SET_MEM_TABLE,
        SET_MEM_TABLE,
        SET_MEM_TABLE,
    ];
    seeds.push((
        "bad_memory_tables",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));

    // A wrapping guest range: the message layer refuses it and closes.
    let wrapping = Region::Raw {
        guest: u64::MAX - 4095,
        size: 16 * 4096,
        user: 0,
        offset: 0,
    };
    let mut m = negotiate();
    m.push(need_reply(msg(
        SET_MEM_TABLE,
        Body::MemTable(vec![wrapping]),
    )));
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        SET_MEM_TABLE,
    ];
    seeds.push((
        "wrapping_memory_region",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));

    // Bad rings: a size that is no power of two, an index out of range, a ring outside the
    // table, and GET_VRING_BASE out of range (it needs a reply: the connection closes).
    let mut m = negotiate();
    m.push(mem_table());
    m.push(need_reply(state(SET_VRING_NUM, 0, 3)));
    m.push(need_reply(state(SET_VRING_NUM, 200, 256)));
    let mut q = start_queue(1);
    q[1] = need_reply(msg(
        SET_VRING_ADDR,
        Body::Addr {
            index: 1,
            flags: 0,
            desc: UserAddr {
                page: 0x300,
                offset: 0,
            },
            used: UserAddr {
                page: USER_PAGE,
                offset: 0,
            },
            avail: UserAddr {
                page: USER_PAGE,
                offset: 0,
            },
            log: 0,
        },
    ));
    m.extend(q);
    m.push(state(GET_VRING_BASE, 250, 0));
    let replies = [
        GET_FEATURES,
        GET_PROTOCOL_FEATURES,
        GET_QUEUE_NUM,
        SET_MEM_TABLE,
        SET_VRING_NUM,
        SET_VRING_NUM,
        SET_VRING_ADDR,
        SET_VRING_ENABLE,
    ];
    seeds.push((
        "bad_rings",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));

    // QEMU 7.2: SET_VRING_ENABLE before SET_FEATURES; then a message with a wrong size.
    let mut m = vec![
        msg(GET_FEATURES, Body::Empty),
        msg(GET_PROTOCOL_FEATURES, Body::Empty),
        msg(SET_PROTOCOL_FEATURES, Body::U64(PROTOCOL)),
        state(SET_VRING_ENABLE, 0, 1),
        msg(SET_FEATURES, Body::U64(FEATURES | PROTOCOL_FEATURES_BIT)),
    ];
    let mut wrong_size = msg(GET_FEATURES, Body::U64(0));
    wrong_size.size = Size::Raw(8);
    m.push(wrong_size);
    let replies = [GET_FEATURES, GET_PROTOCOL_FEATURES];
    seeds.push((
        "enable_before_features",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));

    // Unknown codes and fds where none belong close the connection; so does a truncated tail.
    let mut m = negotiate();
    let mut unknown = msg(GET_FEATURES, Body::Raw(vec![0x5a; 64]));
    unknown.request = Request::Raw(0xdead);
    m.push(unknown);
    let replies = [GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM];
    seeds.push((
        "unknown_request",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));
    let mut m = negotiate();
    let mut stray_fd = msg(GET_QUEUE_NUM, Body::Empty);
    stray_fd.fds = Fds::Eventfd;
    m.push(stray_fd);
    seeds.push((
        "fd_where_none_belongs",
        vhost(m.clone()),
        outcome(m.len() - 1, true, &replies),
    ));
    let mut i = vhost(negotiate());
    i.tail = Some(vec![0xff; 7]);
    seeds.push(("truncated_tail", i, outcome(6, true, &replies)));
    seeds.extend(traffic::seeds());
    seeds.extend(stalls::seeds());
    seeds
}

#[test]
fn vhost_user_seeds_are_written_and_the_corpus_replays() {
    let mut files = Vec::new();
    for (name, input, want) in vhost_seeds() {
        let bytes = input.to_bytes();
        let decoded: VhostInput = crate::decode(&bytes).expect("seed decodes");
        assert_eq!(decoded, input, "{name}: the encoding does not round-trip");
        assert_eq!(vhost_user::run_with(&input, SEEDS), want, "{name}");
        files.push((name, bytes));
    }
    write_corpus("vhost_user", &files);
    replay("vhost_user", |b| {
        if let Some(i) = crate::decode::<VhostInput>(b) {
            vhost_user::run(&i);
        }
    });
}
