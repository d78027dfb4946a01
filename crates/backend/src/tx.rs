//! Guest transmit (VIRTIO 1.2 5.1.6.2): taking the frames the guest made available on its tx
//! queue and passing them to the host port, up to the turn's weight.
//!
//! [`TxPath`] owns a pair's tx queue and the tx policy, the same for every port: a port whose
//! host builds packets from the virtio-net header (a TAP's kernel) gets each header copied out
//! of guest memory once and checked ([`check_header`]), then that copy and the frame after it,
//! never the guest's header read again (a port that classifies frames, the switch's, gets
//! their first bytes in the same copy: [`Port::tx_prefix`]); a header a driver must not send
//! is refused before the port, counted by reason. A frame the port pushes back stays on the
//! ring, with the frames after it, and tx waits until the port is writable.

use arrayvec::ArrayVec;
use vnet::{NetHdr, TxHdrError};
use vring::{Chain, Error as RingError, Features, Gather, GuestMemory, Reader, Tail};

use super::host::{Port, Sent};
use super::queue::{break_queue, notify, QueueRuntime};
use super::turn::Turn;

/// Frames handed to a port at once, at most (its `tx_batch`, up to this).
const MAX_BATCH: usize = vring::memory::MAX_URING_BATCH;

/// How many frames ahead of its header check a frame's first bytes are prefetched.
const PREFETCH_AHEAD: usize = 8;

/// The most of each frame's first bytes a port may want copied with its header
/// ([`Port::tx_prefix`]).
pub const MAX_TX_PREFIX: usize = 64;

/// A tx frame's virtio-net header, copied out of guest memory once and checked, then the
/// frame's first bytes the port asked for, copied in the same read: the bytes the port gets
/// (never the guest's, read again).
#[derive(Clone, Copy, Debug)]
pub struct TxHead {
    bytes: [u8; vnet::HDR_LEN + MAX_TX_PREFIX],
    len: u8,
}

impl Default for TxHead {
    fn default() -> TxHead {
        TxHead {
            bytes: [0; vnet::HDR_LEN + MAX_TX_PREFIX],
            len: 0,
        }
    }
}

impl TxHead {
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The first [`vnet::HDR_LEN`] bytes, whatever the header's length.
    fn fixed(&self) -> &[u8; vnet::HDR_LEN] {
        let (fixed, _) = self
            .bytes
            .split_first_chunk()
            .unwrap_or((&[0; vnet::HDR_LEN], &[]));
        fixed
    }
}

/// What [`check_header`] found: the frame after the bytes copied (the header checked), or
/// why the header must not reach the port.
pub type Checked<'c> = Result<Tail<'c>, TxHdrError>;

/// Copies the virtio-net header at the start of `chain`'s readable part, and up to `prefix`
/// (at most [`MAX_TX_PREFIX`]) of the frame's first bytes after it in the same read, into
/// `head`, and checks the header's copy against the negotiated `features` and the frame after
/// it. The tail is the frame after the bytes copied. The outer error is a ring error (a
/// segment outside memory breaks the queue); the inner one, a header the port must not get.
/// (`head` is written in place: returned by value, its copies cost more than the read.)
pub fn check_header<'c>(
    mem: &GuestMemory,
    chain: &'c Chain,
    features: Features,
    prefix: usize,
    head: &mut TxHead,
) -> Result<Checked<'c>, RingError> {
    let mut body = Tail::default();
    Ok(check_into(mem, chain, features, prefix, head, &mut body)?.map(|()| body))
}

/// [`check_header`], the tail written into `body`: the tx path's, inline, with its arrays.
/// (A tail returned in the nested `Result` went through the stack in odd-sized pieces, and
/// was reloaded before the stores that wrote it completed.) Inlined into the loop of the
/// batch: as a call it cost 37 instructions a frame more in the switch's bench (callgrind).
#[inline(always)]
fn check_into<'c>(
    mem: &GuestMemory,
    chain: &'c Chain,
    features: Features,
    prefix: usize,
    head: &mut TxHead,
    body: &mut Tail<'c>,
) -> Result<Result<(), TxHdrError>, RingError> {
    let hdr_len = vnet::hdr_len(features);
    let total = chain.readable_len() as usize;
    if total < hdr_len {
        return Ok(Err(TxHdrError::Short));
    }
    let take = prefix.min(MAX_TX_PREFIX).min(total - hdr_len);
    let len = hdr_len + take;
    head.len = len as u8;
    let mut r = Reader::new(mem, chain.readable());
    r.read_exact(&mut head.bytes[..len])?;
    // Parsed in place (a copy to a header-sized array first made every field's load wait for
    // the copy's stores); a 10-byte header has no `num_buffers`.
    let mut hdr = NetHdr::from_bytes(head.fixed());
    if hdr_len < vnet::HDR_LEN {
        hdr.num_buffers = 0;
    }
    if let Err(why) = hdr.check_tx(features, total - hdr_len) {
        return Ok(Err(why));
    }
    if prefix > 0 {
        // The header in HDR_LEN bytes, `num_buffers` zero (as a TAP takes it), then the
        // frame's first bytes.
        const NUM_BUFFERS: usize = vnet::NUM_BUFFERS_OFFSET as usize;
        if hdr_len < vnet::HDR_LEN {
            // A 10-byte header (no VERSION_1 nor MRG_RXBUF): the frame moves up.
            head.bytes.copy_within(hdr_len..len, vnet::HDR_LEN);
        }
        head.bytes[NUM_BUFFERS..vnet::HDR_LEN].fill(0);
        head.len = (vnet::HDR_LEN + take) as u8;
    }
    *body = r.tail();
    Ok(Ok(()))
}

/// Why the frames of a batch were sent only up to one: its header refused (it goes after
/// them, counted), or unreadable (the ring error, after them).
type Stop = Option<Result<TxHdrError, RingError>>;

/// One batch of frames going to a port: each header checked (if the port's host trusts
/// it), then the frames up to the first refused one sent.
struct Send<'p, 'm> {
    port: &'p mut dyn Port,
    mem: &'m GuestMemory,
    features: Features,
    checks: bool,
    prefix: usize,
}

impl Send<'_, '_> {
    /// Sends the frames of `chains` (at most [`MAX_BATCH`]) up to the first whose header is
    /// refused or unreadable; returns how many were offered, why it stopped there, and the
    /// port's result (the outcomes in `sent`).
    fn run(
        self,
        chains: &[Chain],
        heads: &mut [TxHead],
        sent: &mut Vec<Sent>,
    ) -> (usize, Stop, Result<(), RingError>) {
        // `frames` is filled for the frames there are (arrays of MAX_BATCH, zeroed whole, cost
        // more than the checks of a short batch), each as its header is checked. `heads` is the
        // tx path's, kept between batches: a head's bytes past its length are never read, so
        // it is not zeroed for each frame (17 instructions a frame fewer in the switch's
        // bench, callgrind).
        let mut frames = ArrayVec::<Gather<'_>, MAX_BATCH>::new();
        let chains = &chains[..chains.len().min(MAX_BATCH).min(heads.len())];
        let mut cut = chains.len();
        let mut stop = None;
        if self.checks {
            chains
                .iter()
                .take(PREFETCH_AHEAD)
                .for_each(|c| self.prefetch(c));
        }
        for (k, (c, head)) in chains.iter().zip(heads.iter_mut()).enumerate() {
            head.len = 0;
            let mut body = Tail::new(c.readable());
            if self.checks {
                if let Some(c) = chains.get(k + PREFETCH_AHEAD) {
                    self.prefetch(c);
                }
                match check_into(self.mem, c, self.features, self.prefix, head, &mut body) {
                    Ok(Ok(())) => {}
                    Ok(Err(why)) => {
                        (cut, stop) = (k, Some(Ok(why)));
                        break;
                    }
                    Err(e) => {
                        (cut, stop) = (k, Some(Err(e)));
                        break;
                    }
                }
            }
            // The frames offered only: up to the first refused or unreadable.
            frames.push(Gather::new(head.as_bytes(), body));
        }
        let result = if cut > 0 {
            self.port.send(self.mem, &frames, sent)
        } else {
            Ok(())
        };
        (cut, stop, result)
    }

    /// Asks for the lines [`check_header`] will read of `chain` (its header and the prefix,
    /// in its first segment), which the guest's CPU last wrote: their transfers overlap the
    /// checks of the frames before it instead of each waiting in turn. Inlined: LLVM left it
    /// a call, 9 instructions a frame more.
    #[inline(always)]
    fn prefetch(&self, chain: &Chain) {
        if let Some(s) = chain.readable().first() {
            let want = vnet::HDR_LEN + self.prefix;
            self.mem.prefetch_read(s.addr, (s.len as usize).min(want));
        }
    }
}

/// The tx queue of one pair and whether it waits for its port.
#[derive(Debug, Default)]
pub struct TxPath {
    queue: Option<QueueRuntime>,
    /// The port pushed back ([`Sent::Busy`]): the frame stays on the tx ring, and tx does not
    /// run (nor take kicks) until the port is writable.
    waits_port: bool,
    /// The frames of one batch and what became of each, kept for their allocations.
    chains: Vec<Chain>,
    /// Each frame's checked header and first bytes, for one batch at a time.
    heads: Vec<TxHead>,
    sent: Vec<Sent>,
}

impl TxPath {
    /// The tx queue, if one runs.
    pub fn queue(&self) -> Option<&QueueRuntime> {
        self.queue.as_ref()
    }

    pub fn queue_mut(&mut self) -> Option<&mut QueueRuntime> {
        self.queue.as_mut()
    }

    /// Takes over `q`, a queue the frontend (re)started; returns the one it replaces.
    pub fn start(&mut self, q: QueueRuntime) -> Option<QueueRuntime> {
        self.waits_port = false;
        self.queue.replace(q)
    }

    /// Gives back the tx queue, stopped.
    pub fn stop(&mut self) -> Option<QueueRuntime> {
        // The longest chains the guest sent stay allocated in them.
        self.chains = Vec::new();
        self.waits_port = false;
        self.queue.take()
    }

    /// Whether tx waits for the port to take frames again.
    pub fn waits_port(&self) -> bool {
        self.waits_port
    }

    /// Whether the tx ring has frames the port can take now; false on a queue that is not
    /// usable (a ring error breaks it).
    pub fn pending(&mut self) -> bool {
        !self.waits_port && self.queue.as_mut().is_some_and(QueueRuntime::avail_pending)
    }

    /// Passes the guest's tx frames to `port`, up to the weight: pop, check, send, complete.
    pub fn turn(&mut self, port: &mut dyn Port) -> Turn {
        let mut turn = Turn::default();
        let Some(tx) = self.queue.as_mut().filter(|q| q.usable()) else {
            // Broken while it waited (a call write interrupted, its memory faulted): it waits
            // for nothing now, and a writable port, still watched, would wake the worker for
            // ever.
            self.waits_port = false;
            return turn;
        };
        if self.waits_port {
            if !port.writable() {
                return turn;
            }
            self.waits_port = false;
        }
        let features = tx.features();
        let hdr_len = vnet::hdr_len(features);
        let checks = port.checks_tx_headers();
        let prefix = port.tx_prefix();
        let batch = port.tx_batch().clamp(1, MAX_BATCH);
        if self.chains.len() < batch {
            self.chains.resize_with(batch, Chain::new);
        }
        if self.heads.len() < batch {
            self.heads.resize_with(batch, TxHead::default);
        }
        let mut bytes = 0u64;
        let result: Result<(), RingError> = 'turn: loop {
            if turn.at_weight(bytes, tx) {
                break Ok(());
            }
            let want = batch.min(super::turn::WEIGHT_PACKETS - turn.frames);
            let mut popped = 0;
            let mut pop_error = None;
            tx.prefetch_avail(want);
            // The element the batch's frames complete into (one with IN_ORDER).
            tx.prefetch_used(1);
            while popped < want {
                match tx.pop_into(&mut self.chains[popped]) {
                    Ok(true) => popped += 1,
                    Ok(false) => break,
                    Err(e) => {
                        pop_error = Some(e);
                        break;
                    }
                }
            }
            if popped == 0 {
                break pop_error.map_or(Ok(()), Err);
            }
            let chains = &self.chains[..popped];
            self.sent.clear();
            let (cut, stop, sent) = {
                // No Arc clone of the memory: its locked refcount update per batch would wait
                // for the stores to shared memory before it to drain.
                let mem: &GuestMemory = tx.memory();
                let send = Send {
                    port: &mut *port,
                    mem,
                    features,
                    checks,
                    prefix,
                };
                send.run(chains, &mut self.heads, &mut self.sent)
            };
            if cut > 0 && batch > 1 {
                tx.counters().host_batches.add(1);
            }
            for (i, (chain, s)) in chains.iter().zip(&self.sent).enumerate() {
                match *s {
                    Sent::Taken => {}
                    Sent::Dropped => tx.counters().dropped.add(1),
                    Sent::Refused(why) => {
                        tx.counters().dropped.add(1);
                        tx.counters().hdr_refused(&why);
                    }
                    Sent::Busy => {
                        // Not now: this frame and the ones after it stay on tx until the port
                        // is writable.
                        tx.undo_pop((popped - i) as u16);
                        tx.counters().host_pushback.add(1);
                        self.waits_port = true;
                        break 'turn Ok(());
                    }
                }
                if let Err(e) = tx.add_used_read(chain.head()) {
                    break 'turn Err(e);
                }
                turn.frames += 1;
                bytes += chain.readable_len().saturating_sub(hdr_len as u64);
            }
            // The port's error is about the frame after those it reported.
            if let Err(e) = sent {
                break Err(e);
            }
            let tried = self.sent.len().min(cut);
            if tried == cut {
                match stop {
                    // Refused: consumed after the frames before it, counted by reason.
                    Some(Ok(why)) => {
                        tx.counters().dropped.add(1);
                        tx.counters().hdr_refused(&why);
                        if let Err(e) = tx.add_used_read(chains[cut].head()) {
                            break 'turn Err(e);
                        }
                        turn.frames += 1;
                        tx.undo_pop((popped - cut - 1) as u16);
                        continue;
                    }
                    Some(Err(e)) => break Err(e),
                    None => {}
                }
            }
            if let Some(e) = pop_error {
                break Err(e);
            }
            if tried < popped {
                // Frames the port did not try (and those after a refusal) stay on the ring
                // for the next round.
                tx.undo_pop((popped - tried) as u16);
                if tried == 0 {
                    // The port took none (its ring failed, say): try again next turn rather
                    // than spin here.
                    break Ok(());
                }
            }
        };
        let c = tx.counters();
        c.packets.add(turn.frames as u64);
        c.bytes.add(bytes);
        match result {
            Ok(()) => {
                if turn.frames > 0 {
                    notify(tx);
                }
            }
            Err(e) => break_queue(tx, &e.into()),
        }
        turn
    }
}

#[cfg(test)]
mod tests {
    use testkit::Pair;
    use vnet::{feature, HDR_F_NEEDS_CSUM};
    use vring::Buf;

    use super::*;
    use crate::queue::QueueId;
    use crate::testing::setup;

    /// A tx chain: `hdr` then a `payload`-byte frame, the header split across two buffers.
    fn chain(hdr: NetHdr, payload: u32) -> (Chain, crate::testing::Setup) {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        let bytes = hdr.to_bytes();
        s.mem.write(Pair::buf(0, 0).addr, &bytes[..4]).unwrap();
        s.mem.write(Pair::buf(1, 0).addr, &bytes[4..]).unwrap();
        let bufs = [
            Pair::buf(0, 4),
            Pair::buf(1, vnet::HDR_LEN as u32 - 4),
            Pair::buf(2, payload),
        ];
        s.driver.add(&bufs, &[], 0).unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        (c, s)
    }

    #[test]
    fn a_tx_header_split_across_buffers_is_read_whole_and_checked() {
        let csum = NetHdr {
            flags: HDR_F_NEEDS_CSUM,
            csum_start: 14,
            csum_offset: 6,
            ..NetHdr::default()
        };
        let with_csum = Features::VERSION_1 | feature::CSUM;
        let (c, s) = chain(csum, 60);
        let mem = s.runtime.memory();
        let mut head = TxHead::default();
        let Ok(Ok(body)) = check_header(mem, &c, with_csum, 0, &mut head) else {
            panic!("refused");
        };
        assert_eq!(head.as_bytes(), &csum.to_bytes()[..]);
        assert_eq!(body.len(), 60, "the frame after the header");
        // Without CSUM negotiated, or with the checksum past the frame: refused.
        assert!(matches!(
            check_header(mem, &c, Features::VERSION_1, 0, &mut head),
            Ok(Err(TxHdrError::NotNegotiated))
        ));
        let (c, s) = chain(csum, 21);
        let mem = s.runtime.memory();
        assert!(matches!(
            check_header(mem, &c, with_csum, 0, &mut head),
            Ok(Err(TxHdrError::Csum { .. }))
        ));
    }

    /// A port that asks for a prefix gets the header in 12 bytes (`num_buffers` zero), then
    /// the frame's first bytes, in one copy, whatever the header's length and however the
    /// chain is cut; the tail is the frame after them.
    #[test]
    fn a_prefix_comes_with_the_checked_header_in_one_copy() {
        let frame: Vec<u8> = (0..100u8).collect();
        for (features, hdr_len) in [(Features::VERSION_1, 12), (Features::EMPTY, 10)] {
            let mut s = setup(QueueId::Tx(0), features);
            let hdr = NetHdr {
                num_buffers: 0x7777,
                ..NetHdr::default()
            };
            let mut all = hdr.to_bytes()[..hdr_len].to_vec();
            all.extend(&frame);
            // Cut inside the header and inside the prefix.
            s.mem.write(Pair::buf(0, 0).addr, &all[..4]).unwrap();
            s.mem.write(Pair::buf(1, 0).addr, &all[4..40]).unwrap();
            s.mem.write(Pair::buf(2, 0).addr, &all[40..]).unwrap();
            let bufs = [
                Pair::buf(0, 4),
                Pair::buf(1, 36),
                Pair::buf(2, all.len() as u32 - 40),
            ];
            s.driver.add(&bufs, &[], 0).unwrap();
            let c = s.runtime.engine().pop().unwrap().unwrap();
            let mut head = TxHead::default();
            let got = check_header(s.runtime.memory(), &c, features, MAX_TX_PREFIX, &mut head);
            let Ok(Ok(body)) = got else {
                panic!("refused: {got:?}");
            };
            let mut want = NetHdr::default().to_bytes().to_vec();
            want.extend(&frame[..MAX_TX_PREFIX]);
            assert_eq!(head.as_bytes(), &want[..], "{hdr_len}-byte header");
            assert_eq!(body.len(), (frame.len() - MAX_TX_PREFIX) as u64);
            let mut rest = vec![0; body.len() as usize];
            Reader::from_tail(s.runtime.memory(), body)
                .read_exact(&mut rest)
                .unwrap();
            assert_eq!(rest, frame[MAX_TX_PREFIX..]);
        }
    }

    /// The tx path keeps its heads between batches, unzeroed: a head that held a longer
    /// frame's bytes gives the next frame's bytes only, with a 10-byte header's missing
    /// `num_buffers` zero, not the bytes the last frame left there.
    #[test]
    fn a_reused_head_holds_the_next_frames_bytes_only() {
        let mut head = TxHead::default();
        let long: Vec<u8> = (0..100u8).map(|b| b | 0x80).collect();
        let short: Vec<u8> = (0..20u8).collect();
        for (features, hdr_len, frame) in [
            (Features::VERSION_1, 12, &long),
            (Features::EMPTY, 10, &short),
        ] {
            let mut s = setup(QueueId::Tx(0), features);
            let mut all = NetHdr::default().to_bytes()[..hdr_len].to_vec();
            all.extend(frame);
            s.mem.write(Pair::buf(0, 0).addr, &all).unwrap();
            s.driver
                .add(&[Pair::buf(0, all.len() as u32)], &[], 0)
                .unwrap();
            let c = s.runtime.engine().pop().unwrap().unwrap();
            let got = check_header(s.runtime.memory(), &c, features, MAX_TX_PREFIX, &mut head);
            assert!(matches!(got, Ok(Ok(_))), "refused: {got:?}");
            let mut want = NetHdr::default().to_bytes().to_vec();
            want.extend(&frame[..frame.len().min(MAX_TX_PREFIX)]);
            assert_eq!(head.as_bytes(), &want[..], "{hdr_len}-byte header");
            // Without a prefix, the header as the guest wrote it, and nothing after it.
            let got = check_header(s.runtime.memory(), &c, features, 0, &mut head);
            assert!(matches!(got, Ok(Ok(_))), "refused: {got:?}");
            assert_eq!(head.as_bytes(), &all[..hdr_len]);
        }
    }

    #[test]
    fn a_tx_chain_shorter_than_its_header_is_refused() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        s.driver
            .add(&[Buf::new(Pair::buf(0, 0).addr, 8)], &[], 0)
            .unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        let got = check_header(
            s.runtime.memory(),
            &c,
            Features::VERSION_1,
            0,
            &mut TxHead::default(),
        );
        assert!(matches!(got, Ok(Err(TxHdrError::Short))));
    }

    /// A frame the TAP can never take for want of memory (Linux allocates a linear
    /// skb for it: ENOBUFS above about 4 MiB, every time) must not reach it.
    #[test]
    fn a_tx_frame_of_megabytes_is_refused() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        s.mem
            .write(Pair::buf(0, 0).addr, &[0u8; vnet::HDR_LEN])
            .unwrap();
        // 12-byte header, then 8 x 1 MiB segments over the same guest pages: 8 MiB.
        let mut bufs = vec![Pair::buf(0, vnet::HDR_LEN as u32)];
        bufs.extend((0..8).map(|_| Buf::new(Pair::buf(1, 0).addr, 1 << 20)));
        s.driver.add(&bufs, &[], 0).unwrap();
        let c = s.runtime.engine().pop().unwrap().unwrap();
        assert_eq!(c.readable_len(), (vnet::HDR_LEN + (8 << 20)) as u64);
        let got = check_header(
            s.runtime.memory(),
            &c,
            Features::VERSION_1,
            0,
            &mut TxHead::default(),
        );
        assert!(matches!(
            got,
            Ok(Err(TxHdrError::TooLong { len: 0x80_0000 }))
        ));
    }
}
