//! The `vhost_user` seeds of messages that do not come whole in one write: a first request
//! that never comes or stops after a byte, a header with 40 descriptors, a header then
//! silence, a body cut short (each dropped by the session's gate, with no reply); a whole
//! start-up sent in two pieces per message (served as if whole); descriptors that cut a
//! header or come inside a body (dropped).

use super::*;

/// `m` cut after `cut` bytes, then nothing.
fn stall(m: Message, cut: u16) -> Step {
    Step::Stall { message: m, cut }
}

/// `m` in two writes, the first of `1 + at % (len - 1)` bytes.
fn split(m: Message, at: u16, fds_later: bool) -> Step {
    Step::Split {
        message: m,
        at,
        fds_later,
    }
}

/// The negotiation's messages as steps, then `last`.
fn negotiated_then(last: Step) -> VhostInput {
    let mut i = vhost(negotiate());
    i.steps.push(last);
    i
}

pub(super) fn seeds() -> Vec<VhostSeed> {
    use code::*;
    let mut seeds = Vec::new();
    let negotiated = [GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM];
    let get_features = || msg(GET_FEATURES, Body::Empty);

    // A first request that never comes, and one that stops after its first byte.
    let i = vhost(Vec::new());
    let mut silent = i.clone();
    silent.steps.push(stall(get_features(), 0));
    seeds.push(("first_request_silent", silent, outcome(0, true, &[])));
    let mut one_byte = i;
    one_byte.steps.push(stall(get_features(), 1));
    seeds.push(("first_request_one_byte", one_byte, outcome(0, true, &[])));

    // A whole GET_QUEUE_NUM with 40 descriptors, more than the message layer's 32: dropped
    // before the layer reads it (its reads would have retried for good).
    let mut forty = msg(GET_QUEUE_NUM, Body::Empty);
    forty.fds = Fds::Many(40);
    let i = negotiated_then(Step::Message(forty));
    seeds.push(("forty_fds", i, outcome(6, true, &negotiated)));

    // After the negotiation: a header then silence, and a memory table's body cut short
    // (its memfd sent with the header).
    let features = msg(SET_FEATURES, Body::U64(FEATURES | PROTOCOL_FEATURES_BIT));
    let i = negotiated_then(stall(features, HEADER_LEN as u16));
    seeds.push(("header_then_silence", i, outcome(6, true, &negotiated)));
    let i = negotiated_then(stall(mem_table(), HEADER_LEN as u16 + 20));
    seeds.push(("body_cut_short", i, outcome(6, true, &negotiated)));

    // A whole start-up, each message in two writes cut after its header (its descriptors
    // with the header), or after its first byte for the header-only ones: served as whole.
    let mut m = negotiate();
    m.push(mem_table());
    m.extend(start_queue(0));
    m.extend(start_queue(1));
    let handled = m.len();
    let mut i = vhost(Vec::new());
    i.steps = m
        .into_iter()
        .map(|m| split(m, HEADER_LEN as u16 - 1, false))
        .collect();
    let mut replies = negotiated.to_vec();
    replies.extend([SET_MEM_TABLE, SET_VRING_ENABLE, SET_VRING_ENABLE]);
    seeds.push((
        "messages_in_two_pieces",
        i,
        outcome(handled, false, &replies),
    ));

    // Descriptors with the first 4 bytes of a header: its first read would stop short.
    let call = msg(SET_VRING_CALL, Body::U64(0));
    let i = negotiated_then(split(call, 3, false));
    seeds.push(("fds_cutting_a_header", i, outcome(6, true, &negotiated)));
    // Descriptors with the second half of a memory table's body: the layer's body read
    // meets them with no room, and fails.
    let i = negotiated_then(split(mem_table(), HEADER_LEN as u16 + 19, true));
    seeds.push(("fds_inside_a_body", i, outcome(6, true, &negotiated)));
    seeds
}
