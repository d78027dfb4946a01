//! Copying a frame into the guest's rx buffers: from a buffer of ours, merged over as many
//! buffers as it takes ([`deliver`]); in pieces, the rest straight from another guest's memory
//! ([`deliver_pieces`], a switch forwarding between guests); the same frame into one buffer
//! each in bursts ([`deliver_burst`], the null generator); and the rest of a frame read
//! straight into posted buffers that did not hold it ([`post_overflow`]).

use std::collections::VecDeque;

use vnet::feature;
use vring::{Chain, Error as RingError, GuestMemory, Reader, Tail, Writer};

use super::{
    Delivery, BURST, KEEP_SEGMENTS, MAX_FRAME_SEGMENTS, MAX_MERGED_BUFFERS, PREFETCH_LINES,
};
use crate::queue::QueueRuntime;
use crate::shared::Shared;

pub(super) fn deliver_burst(
    shared: &Shared,
    rx: &mut QueueRuntime,
    frame: &mut [u8],
    chains: &mut Vec<Chain>,
    max: usize,
    grown: &mut bool,
) -> Result<usize, RingError> {
    let features = rx.features();
    let hdr_len = vnet::hdr_len(features);
    if !shared.accepts(frame.get(hdr_len..).unwrap_or(&[])) {
        return Ok(0);
    }
    if features.contains(feature::MRG_RXBUF) && frame.len() >= vnet::HDR_LEN {
        // Each frame takes one buffer.
        frame[vnet::NUM_BUFFERS_OFFSET as usize..vnet::HDR_LEN]
            .copy_from_slice(&1u16.to_le_bytes());
    }
    let max = max.min(BURST);
    if chains.len() < max {
        chains.resize_with(max, Chain::new);
    }
    if !rx.try_avail_pending()? {
        return Ok(0);
    }
    let mut n = 0;
    while n < max {
        if !rx.pop_into(&mut chains[n])? {
            break;
        }
        *grown |= chains[n].segments().len() > KEEP_SEGMENTS;
        match chains[n].writable().first() {
            Some(s) if s.len as usize >= frame.len() => n += 1,
            _ => {
                rx.undo_pop(1);
                break;
            }
        }
    }
    // Whole frames, as many ahead as keep about PREFETCH_LINES cache lines in flight.
    let lines = frame.len().div_ceil(64).max(1);
    let ahead = if 2 * lines <= PREFETCH_LINES {
        (PREFETCH_LINES / lines).min(BURST)
    } else {
        0
    };
    let prefetch =
        |q: &QueueRuntime, c: &Chain| q.memory().prefetch_write(c.writable()[0].addr, frame.len());
    for c in &chains[..n.min(ahead)] {
        prefetch(rx, c);
    }
    for i in 0..n {
        if ahead > 0 && i + ahead < n {
            prefetch(rx, &chains[i + ahead]);
        }
        let c = &chains[i];
        rx.memory().write(c.writable()[0].addr, &frame[..])?;
        rx.add_used_written(c, frame.len() as u32, true)?;
    }
    Ok(n)
}

/// How the chains popped for one frame came out.
enum Popped {
    /// The frame fits the first this many chains.
    Fits(usize),
    /// Too few buffers posted yet: nothing consumed.
    NoRoom,
    /// No buffers the guest can post will hold it: nothing consumed, dropped and counted.
    Dropped,
}

/// How many buffers a frame may take in a queue: several (at most this many) with MRG_RXBUF,
/// else one. Read once for a batch of frames, not per frame.
#[derive(Clone, Copy)]
struct Merge {
    mergeable: bool,
    max_buffers: usize,
}

impl Merge {
    fn of(rx: &QueueRuntime) -> Merge {
        Merge {
            mergeable: rx.features().contains(feature::MRG_RXBUF),
            max_buffers: MAX_MERGED_BUFFERS.min(rx.size() as usize),
        }
    }
}

/// Pops chains of `rx` into `chains` from index `at` on until their writable bytes hold
/// `need` (merged when MRG_RXBUF is negotiated, else one chain must). Inlined into its two
/// callers: as a call, with the pop inlined into it, it cost 41 instructions a frame more.
#[inline(always)]
fn pop_for(
    rx: &mut QueueRuntime,
    merge: Merge,
    chains: &mut Vec<Chain>,
    at: usize,
    need: u64,
    grown: &mut bool,
) -> Result<Popped, RingError> {
    let Merge {
        mergeable,
        max_buffers,
    } = merge;
    let mut have = 0u64;
    let mut used = 0usize;
    let mut segments = 0usize;
    while have < need {
        if used == max_buffers {
            // More buffers than a frame may take, and still short: the frame cannot fit.
            rx.undo_pop(used as u16);
            rx.counters().dropped.add(1);
            return Ok(Popped::Dropped);
        }
        if chains.len() <= at + used {
            chains.push(Chain::new());
        }
        let c = &mut chains[at + used];
        if !rx.pop_into(c)? {
            rx.undo_pop(used as u16);
            return Ok(Popped::NoRoom);
        }
        let (len, n) = (c.writable_len(), c.segments().len());
        if len == 0 {
            return Err(RingError::NoWritableBytes { head: c.head() });
        }
        *grown |= n > KEEP_SEGMENTS;
        segments += n;
        if segments > MAX_FRAME_SEGMENTS {
            // Scattered over more segments than a frame may take: it cannot fit.
            rx.undo_pop(used as u16 + 1);
            rx.counters().dropped.add(1);
            return Ok(Popped::Dropped);
        }
        have += len;
        used += 1;
        if !mergeable && have < need {
            // Without mergeable buffers a frame must fit one chain: drop the frame and leave
            // the buffer for the next one.
            rx.undo_pop(1);
            rx.counters().dropped.add(1);
            return Ok(Popped::Dropped);
        }
    }
    Ok(Popped::Fits(used))
}

pub(super) fn deliver(
    shared: &Shared,
    rx: &mut QueueRuntime,
    frame: &mut [u8],
    chains: &mut Vec<Chain>,
    grown: &mut bool,
) -> Result<Delivery, RingError> {
    let features = rx.features();
    let hdr_len = vnet::hdr_len(features);
    if !shared.accepts(frame.get(hdr_len..).unwrap_or(&[])) {
        rx.counters().filtered.add(1);
        return Ok(Delivery::Dropped);
    }
    let used = match pop_for(rx, Merge::of(rx), chains, 0, frame.len() as u64, grown)? {
        Popped::Fits(used) => used,
        Popped::NoRoom => return Ok(Delivery::NoRoom),
        Popped::Dropped => return Ok(Delivery::Dropped),
    };
    if features.contains(feature::MRG_RXBUF) && frame.len() >= vnet::HDR_LEN {
        frame[vnet::NUM_BUFFERS_OFFSET as usize..vnet::HDR_LEN]
            .copy_from_slice(&(used as u16).to_le_bytes());
    }
    if !features.contains(feature::GUEST_CSUM) {
        if let Some(flags) = frame.first_mut() {
            // A TAP marks a frame a NIC checked DATA_VALID whatever its offloads: a guest
            // without GUEST_CSUM gets flags zero (VIRTIO 1.2 5.1.6.4.1).
            *flags = 0;
        }
    }
    // No Arc clone of the memory here: its locked refcount update would wait for this frame's
    // stores to shared memory to drain, once per frame (measured: most of the rx path's time).
    let mut rest: &[u8] = frame;
    for (i, c) in chains[..used].iter().enumerate() {
        let n = Writer::new(rx.memory(), c.writable()).write(rest)?;
        rest = &rest[n..];
        rx.add_used_written(c, n as u32, i + 1 == used)?;
    }
    Ok(Delivery::Delivered)
}

/// A frame to deliver in pieces: its virtio-net header in the receiving queue's format
/// (`num_buffers` is set here, and the flags cleared for a guest without GUEST_CSUM), the
/// first bytes of the frame (its headers, copied and checked once), then the rest of it, read
/// straight from another guest's memory: one copy from one guest's buffers into another's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pieces<'a> {
    pub hdr: vnet::NetHdr,
    pub prefix: &'a [u8],
    pub rest: Option<(&'a GuestMemory, Tail<'a>)>,
}

impl Pieces<'_> {
    /// The frame's length after its header.
    pub fn frame_len(&self) -> u64 {
        self.prefix.len() as u64 + self.rest.map_or(0, |(_, t)| t.len())
    }
}

/// Bytes of a frame's first buffer prefetched for writing while the others' buffers are
/// popped: its header and first bytes, what a short frame is.
const PREFETCH_FIRST: usize = 128;

/// Chains a round of [`deliver_pieces`] pops and prefetches before copying. Not the 64 the
/// chains are kept for: the prefetches of 64 frames at once waited on each other (the
/// first load after them took a third of the delivery's samples with testpmd's guests), and
/// 16 moved 1-4% more frames at 64 B in each of four paired runs, 1% at 1500 B (AMD EPYC
/// family 25 model 1; Intel not measured).
const ROUND: usize = 16;

/// Delivers `frames` (see [`Pieces`]) into `rx` in order, merging buffers as [`deliver`]
/// does, and says in `out` what became of each. In rounds of up to [`ROUND`] chains: the
/// buffers of a round's frames are popped and the first lines of each prefetched for writing,
/// then the frames are copied, so that the transfers of the lines the driver last touched
/// overlap instead of stalling one copy after the other. Once a frame finds no room, the
/// ones after it find none either.
pub(super) fn deliver_pieces(
    shared: &Shared,
    rx: &mut QueueRuntime,
    frames: &[&Pieces<'_>],
    chains: &mut Vec<Chain>,
    grown: &mut bool,
    out: &mut [Delivery],
) -> Result<(), RingError> {
    let out = &mut out[..frames.len()];
    let hdr_len = rx.hdr_len();
    let guest_csum = rx.features().contains(feature::GUEST_CSUM);
    let merge = Merge::of(rx);
    rx.prefetch_avail(frames.len());
    // Paired with testpmd's guests (`scripts/ab-pair.sh`), with the tx side's: 1.004, 1.010,
    // 1.023 this alone, 1.007, 1.018, 1.013 both (AMD EPYC family 25 model 1).
    rx.prefetch_used(frames.len());
    let mut next = 0;
    while next < frames.len() {
        // The chains each delivered frame of the round takes, in order.
        // Each delivered frame takes a chain or more, and a round starts frames while it has
        // taken fewer than ROUND: at most ROUND frames.
        let mut takes = [0u16; ROUND];
        let (first, mut at, mut delivered) = (next, 0, 0);
        while next < frames.len() && at < ROUND {
            let f = frames[next];
            out[next] = if !shared.accepts(f.prefix) {
                rx.counters().filtered.add(1);
                Delivery::Dropped
            } else {
                match pop_for(rx, merge, chains, at, hdr_len as u64 + f.frame_len(), grown)? {
                    Popped::Fits(used) => {
                        if let Some(s) = chains[at].writable().first() {
                            // No more lines than the frame writes: an owned line it does not
                            // write is a transfer for nothing, and one back when the guest
                            // next touches it.
                            // A header alone at the end of its line is read, not owned: left as
                            // it is when the buffer holds it already (`write_pieces`).
                            let want = hdr_len as u64 + f.frame_len();
                            let len = want.min(s.len as u64).min(PREFETCH_FIRST as u64);
                            rx.memory().prefetch_update(s.addr, hdr_len, len as usize);
                        }
                        takes[delivered] = used as u16;
                        delivered += 1;
                        at += used;
                        Delivery::Delivered
                    }
                    Popped::NoRoom => {
                        out[next..].fill(Delivery::NoRoom);
                        next = frames.len();
                        break;
                    }
                    Popped::Dropped => Delivery::Dropped,
                }
            };
            next += 1;
        }
        let mut takes = takes[..delivered].iter();
        let mut at = 0;
        for (f, _) in frames[first..next]
            .iter()
            .zip(&out[first..next])
            .filter(|(_, o)| **o == Delivery::Delivered)
        {
            let used = takes.next().map_or(0, |&n| n as usize);
            write_pieces(rx, f, hdr_len, guest_csum, &chains[at..at + used])?;
            at += used;
        }
    }
    Ok(())
}

/// Copies `f` into `chains`, popped for it, and adds them to the used ring. The header goes
/// out of registers ([`Writer::write_array`]); the frame's first bytes and the rest from
/// where they are. (A header staged on the stack with the first bytes, for one write, cost
/// more: the copy's wide loads waited for the header's narrow stores to complete.)
fn write_pieces(
    rx: &mut QueueRuntime,
    f: &Pieces<'_>,
    hdr_len: usize,
    guest_csum: bool,
    chains: &[Chain],
) -> Result<(), RingError> {
    let mut hdr = f.hdr;
    hdr.num_buffers = chains.len() as u16;
    if !guest_csum {
        // DATA_VALID (the uplink's kernel passes it on for a frame a NIC checked) is for a
        // guest with GUEST_CSUM: one without gets flags zero (VIRTIO 1.2 5.1.6.4.1).
        hdr.flags = 0;
    }
    let hdr = hdr.to_bytes();
    if let ([c], vnet::HDR_LEN) = (chains, hdr_len) {
        // Most frames: one buffer whose first segment holds the header and the first bytes,
        // written with one translation of its address (120 instructions fewer a frame at
        // 64 B than through the writer: callgrind, the switch's bench). A header alone at
        // the end of its line that the buffer already holds is not stored again: the line
        // stays in the guest's cache (DPDK's recycled mbufs; 6-15% more frames between
        // testpmd's guests, paired, AMD EPYC family 25 model 1).
        let writable = c.writable();
        let near = vnet::HDR_LEN + f.prefix.len();
        if let Some(s) = writable.first().filter(|s| s.len as usize >= near) {
            rx.memory().update_array_then(s.addr, hdr, f.prefix)?;
            let mut written = near as u64;
            if let Some((mem, t)) = f.rest {
                let mut w = Writer::at(rx.memory(), writable, written)?;
                let room = w.remaining();
                w.copy_from(&mut Reader::from_tail(mem, t), room)?;
                written += w.written();
            }
            return rx.add_used_written(c, written as u32, true);
        }
    }
    let mut head = &hdr[..hdr_len];
    let mut prefix = f.prefix;
    let mut rest = f.rest.map(|(mem, t)| Reader::from_tail(mem, t));
    for (i, c) in chains.iter().enumerate() {
        let mut w = Writer::new(rx.memory(), c.writable());
        if !head.is_empty() {
            // Whole in the first buffer, but for a guest that posts tiny ones.
            let k = if head.len() == vnet::HDR_LEN {
                w.write_array(hdr)?
            } else {
                w.write(head)?
            };
            head = &head[k..];
        }
        if !prefix.is_empty() {
            let k = w.write(prefix)?;
            prefix = &prefix[k..];
        }
        if let Some(r) = rest.as_mut() {
            let room = w.remaining();
            w.copy_from(r, room)?;
        }
        rx.add_used_written(c, w.written() as u32, i + 1 == chains.len())?;
    }
    Ok(())
}

/// Pops buffers after the posted ones for the `over` bytes of a frame that did not fit them,
/// and copies them in; false (nothing popped) if the guest has not posted enough.
pub(super) fn post_overflow(
    rx: &mut QueueRuntime,
    posted: &mut VecDeque<Chain>,
    spare: &mut Vec<Chain>,
    mut over: &[u8],
) -> Result<bool, RingError> {
    let mut popped = 0u16;
    let mut added = Vec::new();
    while !over.is_empty() {
        let mut c = spare.pop().unwrap_or_default();
        if posted.len() + added.len() == MAX_MERGED_BUFFERS || !rx.pop_into(&mut c)? {
            rx.undo_pop(popped);
            spare.push(c);
            spare.extend(added);
            return Ok(false);
        }
        popped += 1;
        if c.writable_len() == 0 {
            return Err(RingError::NoWritableBytes { head: c.head() });
        }
        let k = Writer::new(rx.memory(), c.writable()).write(over)?;
        over = &over[k..];
        added.push(c);
    }
    posted.extend(added);
    Ok(true)
}
