//! The `ctrl_queue` target: the backend's control-queue device
//! (`virtnet_backend::ctrlq::process_commands`, spec 5.1.6.5) facing a careless or hostile
//! driver, without the control thread.
//!
//! The driver posts commands through a `DriverQueue`: known commands with data of any length,
//! raw class/command/data bytes, and commands longer than the device reads, each cut into
//! readable buffers of arbitrary lengths and followed by writable buffers of arbitrary lengths
//! (possibly none). Between posts the device processes what is pending. The driver may also
//! turn hostile and write descriptors, avail entries and raw bytes behind the queue's back.
//! After every step the harness checks:
//!
//! - nothing panics;
//! - while the driver is honest, the queue never breaks, every posted chain comes back used
//!   exactly once, and its writable bytes are exactly what a spec-level model of the commands
//!   predicts: the ack (OK or ERR) in the last writable byte, a VQ_NOTF_COAL GET reply before
//!   it, nothing else touched (nothing at all without a writable byte); the used length and the
//!   device state (active pairs, receive filter, MAC, per-queue coalescing) match the model;
//! - whatever the driver does, the active pairs stay within 1..=pairs, and once the control
//!   queue is broken the metrics say so, the error eventfd was signalled, and no later command
//!   is processed or published; the data queues are never marked broken.

use std::sync::Arc;

use arbitrary::Arbitrary;
use virtnet_backend::{ctrlq, BackendConfig, IoMode, Shared};
use virtnet_backend::{QueueId, QueueRuntime};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vring::{
    Buf, Chain, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, IndirectArea,
    QueueConfig,
};

use crate::encode::{variant, Encode};
use crate::encode_struct;
use crate::mem::{self, peek16, poke16, Placement, DATA, DRV_INDIRECT};
use crate::rings::{RawDesc, Scribble};

/// The device and its control queue.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtrlSetup {
    /// Queue pairs `1 + pairs % 4`.
    pub pairs: u8,
    /// Control queue size `1 << (size_log2 % 4)`: 1 to 8.
    pub size_log2: u8,
    pub event_idx: bool,
    /// INDIRECT_DESC: chains of more than one buffer go in an indirect table.
    pub indirect: bool,
}
encode_struct!(CtrlSetup {
    pairs,
    size_log2,
    event_idx,
    indirect
});

/// The device-readable bytes of a command.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Command `KNOWN[which % 8]` with `data` as its data bytes, whatever their length.
    Known { which: u8, data: Vec<u8> },
    /// Command `KNOWN[which % 8]` with data of exactly the length it needs, from `data`
    /// (zero-padded).
    Exact { which: u8, data: Vec<u8> },
    /// Any bytes.
    Raw(Vec<u8>),
    /// `MAX_COMMAND + 1 + extra` zero bytes: longer than the device reads.
    Long(u8),
}

impl Encode for Payload {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Payload::Known { which, data } => {
                (variant(0, 4, out), which.encode(out), data.encode(out)).0
            }
            Payload::Exact { which, data } => {
                (variant(1, 4, out), which.encode(out), data.encode(out)).0
            }
            Payload::Raw(b) => (variant(2, 4, out), b.encode(out)).0,
            Payload::Long(n) => (variant(3, 4, out), n.encode(out)).0,
        }
    }
}

/// The device's command size limit (`ctrlq::MAX_COMMAND`).
pub const MAX_COMMAND: usize = 4096;

/// (class, command, data bytes) of every command the device implements (spec 5.1.6.5).
pub const KNOWN: [(u8, u8, usize); 8] = [
    (0, 0, 1),  // RX PROMISC
    (0, 1, 1),  // RX ALLMULTI
    (1, 1, 6),  // MAC ADDR_SET
    (4, 0, 2),  // MQ VQ_PAIRS_SET
    (6, 0, 8),  // NOTF_COAL TX_SET
    (6, 1, 8),  // NOTF_COAL RX_SET
    (6, 2, 12), // NOTF_COAL VQ_SET
    (6, 3, 4),  // NOTF_COAL VQ_GET
];

impl Payload {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Payload::Known { which, data } | Payload::Exact { which, data } => {
                let (class, command, need) = KNOWN[*which as usize % KNOWN.len()];
                let mut b = vec![class, command];
                b.extend(data);
                if matches!(self, Payload::Exact { .. }) {
                    b.resize(2 + need, 0);
                }
                b
            }
            Payload::Raw(b) => b.clone(),
            Payload::Long(n) => vec![0; MAX_COMMAND + 1 + *n as usize],
        }
    }
}

/// One step.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum CtrlOp {
    /// The driver posts a command: its bytes cut into readable buffers of the lengths in
    /// `cuts` (the rest in one last buffer), then writable buffers of the lengths in
    /// `writable`, and kicks.
    Post {
        payload: Payload,
        cuts: Vec<u8>,
        writable: Vec<u8>,
    },
    /// The device handles every pending command (the control thread woken by the kick).
    Process,

    // ---- The hostile driver: after any of these the model no longer applies.
    /// Descriptor `index % size` of the table.
    WriteDesc {
        index: u16,
        desc: RawDesc,
    },
    /// Puts `heads` on the avail ring from the current `avail.idx` and moves it past them.
    Publish(Vec<u16>),
    SetAvailIdx(u16),
    /// Raw bytes anywhere in region 0: rings, tables, buffers.
    Scribble(Scribble),
}

impl Encode for CtrlOp {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 6;
        match self {
            CtrlOp::Post {
                payload,
                cuts,
                writable,
            } => {
                variant(0, N, out);
                payload.encode(out);
                cuts.encode(out);
                writable.encode(out);
            }
            CtrlOp::Process => variant(1, N, out),
            CtrlOp::WriteDesc { index, desc } => {
                variant(2, N, out);
                index.encode(out);
                desc.encode(out);
            }
            CtrlOp::Publish(heads) => (variant(3, N, out), heads.encode(out)).1,
            CtrlOp::SetAvailIdx(v) => (variant(4, N, out), v.encode(out)).1,
            CtrlOp::Scribble(s) => (variant(5, N, out), s.encode(out)).1,
        }
    }
}

/// A whole `ctrl_queue` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct CtrlInput {
    pub setup: CtrlSetup,
    pub ops: Vec<CtrlOp>,
}
encode_struct!(CtrlInput { setup, ops });

/// What a run did, for the seed tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub oks: u64,
    pub errs: u64,
    /// Chains without a writable byte: used with length 0, no ack.
    pub unacked: u64,
    pub broken: Option<String>,
}

/// Each posted chain's buffers live in a slot of the data area of their own.
const SLOT: u64 = 8192;
/// Buffers a chain may have: the driver's indirect tables hold this many.
const MAX_CHAIN: u16 = 16;
const UNTOUCHED: u8 = 0xee;

/// What the model says the device does with one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Answer {
    ok: bool,
    reply: Option<[u8; 8]>,
}

/// The device state as the spec says the commands leave it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Model {
    pairs: u16,
    active_pairs: u16,
    promisc: bool,
    allmulti: bool,
    mac: [u8; 6],
    /// (max_packets, max_usecs) per data queue.
    coalesce: Vec<(u32, u32)>,
}

impl Model {
    fn new(config: &BackendConfig) -> Model {
        Model {
            pairs: config.pairs,
            active_pairs: config.pairs,
            promisc: true,
            allmulti: false,
            mac: config.mac,
            coalesce: vec![(0, 0); 2 * config.pairs as usize],
        }
    }

    fn of(shared: &Shared) -> Model {
        let data_queues = 2 * shared.config.pairs as usize;
        Model {
            pairs: shared.config.pairs,
            active_pairs: shared
                .active_pairs
                .load(std::sync::atomic::Ordering::Relaxed),
            promisc: shared.promisc.load(std::sync::atomic::Ordering::Relaxed),
            allmulti: shared.allmulti.load(std::sync::atomic::Ordering::Relaxed),
            mac: shared.mac(),
            coalesce: shared.tunables[..data_queues]
                .iter()
                .map(|m| (m.coalesce().max_packets, m.coalesce().max_usecs))
                .collect(),
        }
    }

    /// Applies a command with `writable` device-writable bytes; `None`: no ack at all.
    fn apply(&mut self, cmd: &[u8], writable: u64) -> Option<Answer> {
        if writable == 0 {
            return None;
        }
        const ERR: Answer = Answer {
            ok: false,
            reply: None,
        };
        const OK: Answer = Answer {
            ok: true,
            reply: None,
        };
        if cmd.len() > MAX_COMMAND || cmd.len() < 2 {
            return Some(ERR);
        }
        let (class, command, data) = (cmd[0], cmd[1], &cmd[2..]);
        let Some(&(_, _, need)) = KNOWN.iter().find(|k| (k.0, k.1) == (class, command)) else {
            return Some(ERR);
        };
        if data.len() != need {
            return Some(ERR);
        }
        let u16_at = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let data_queues = 2 * self.pairs as usize;
        match (class, command) {
            (0, 0) => self.promisc = data[0] != 0,
            (0, 1) => self.allmulti = data[0] != 0,
            (1, 1) => self.mac.copy_from_slice(data),
            (4, 0) => {
                let n = u16_at(0);
                if n == 0 || n > self.pairs {
                    return Some(ERR);
                }
                self.active_pairs = n;
            }
            (6, 0) | (6, 1) => {
                let first = if command == 0 { 1 } else { 0 };
                for q in (first..data_queues).step_by(2) {
                    self.coalesce[q] = (u32_at(0), u32_at(4));
                }
            }
            (6, 2) => {
                let vqn = u16_at(0) as usize;
                if vqn >= data_queues {
                    return Some(ERR);
                }
                self.coalesce[vqn] = (u32_at(4), u32_at(8));
            }
            (6, 3) => {
                let vqn = u16_at(0) as usize;
                if writable < 9 || vqn >= data_queues {
                    return Some(ERR);
                }
                let (p, u) = self.coalesce[vqn];
                let mut reply = [0u8; 8];
                reply[..4].copy_from_slice(&p.to_le_bytes());
                reply[4..].copy_from_slice(&u.to_le_bytes());
                return Some(Answer {
                    ok: true,
                    reply: Some(reply),
                });
            }
            _ => unreachable!("KNOWN lists only these"),
        }
        Some(OK)
    }
}

/// A chain the driver posted and the device has not answered yet.
#[derive(Debug)]
struct Posted {
    slot: u64,
    cmd: Vec<u8>,
    readable: Vec<Buf>,
    writable: Vec<Buf>,
}

/// Cuts `total` bytes at the lengths in `cuts`, the rest in one last piece (if any is left).
fn cut(total: usize, cuts: &[u8]) -> Vec<usize> {
    let mut pieces = Vec::new();
    let mut left = total;
    for &c in cuts {
        let n = (c as usize).min(left);
        pieces.push(n);
        left -= n;
    }
    if left > 0 || pieces.is_empty() {
        pieces.push(left);
    }
    pieces
}

/// The `ctrl_queue` fuzz target's body.
pub fn run(input: &CtrlInput) -> Outcome {
    let s = input.setup;
    let config = BackendConfig {
        pairs: 1 + (s.pairs % 4) as u16,
        io: IoMode::Null { size: 64 },
        ..BackendConfig::default()
    };
    let mut model = Model::new(&config);
    let shared = Shared::new(config, Vec::new()).expect("device state");
    let size = 1u16 << (s.size_log2 % 4);
    let mut features = Features::EMPTY;
    if s.event_idx {
        features = features.union(Features::RING_EVENT_IDX);
    }
    if s.indirect {
        features = features.union(Features::RING_INDIRECT_DESC);
    }
    let rings = Placement::Separate.rings(size);
    let qconfig = QueueConfig::new(size as u32, rings, features).expect("queue config");
    let memory = mem::memory();
    let area = IndirectArea {
        addr: GuestAddress(DRV_INDIRECT),
        max_chain: MAX_CHAIN,
    };
    let mut driver: DriverQueue<usize> =
        DriverQueue::activate(&qconfig, memory.clone(), Some(area)).expect("driver queue");
    let device = DeviceQueue::activate(&qconfig, memory.clone(), 0).expect("device queue");
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let err = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut rt = QueueRuntime::new(
        QueueId::Ctrl,
        device,
        kick,
        Some(EventFd::new(EFD_NONBLOCK).unwrap()),
        Some(err.try_clone().unwrap()),
        shared.queue_counters(QueueId::Ctrl).clone(),
        shared.queue_tunables(QueueId::Ctrl).clone(),
    );
    let mut chain = Chain::new();

    let mut out = Outcome::default();
    let mut posted: Vec<Option<Posted>> = (0..size).map(|_| None).collect();
    let mut honest = true;
    let mut was_broken = false;
    for op in &input.ops {
        match op {
            CtrlOp::Post {
                payload,
                cuts,
                writable,
            } => {
                let Some(slot) = posted.iter().position(|p| p.is_none()) else {
                    continue;
                };
                let cmd = payload.bytes();
                let base = DATA + slot as u64 * SLOT;
                let mut at = base;
                let mut readable = Vec::new();
                let mut done = 0;
                for n in cut(cmd.len(), cuts) {
                    memory
                        .write(GuestAddress(at), &cmd[done..done + n])
                        .unwrap();
                    readable.push(Buf::new(GuestAddress(at), n as u32));
                    at += n as u64;
                    done += n;
                }
                let mut w = Vec::new();
                for &n in writable {
                    if at + n as u64 > base + SLOT {
                        break;
                    }
                    memory
                        .write(GuestAddress(at), &vec![UNTOUCHED; n as usize])
                        .unwrap();
                    w.push(Buf::new(GuestAddress(at), n as u32));
                    at += n as u64;
                }
                if readable.len() + w.len() > MAX_CHAIN as usize {
                    continue;
                }
                match driver.add(&readable, &w, slot) {
                    Ok(()) => {}
                    Err(e) if honest => {
                        // Refused for want of room: the honest driver waits.
                        assert!(
                            matches!(e, vring::Error::QueueFull { .. }),
                            "an honest driver's add failed: {e}"
                        );
                        continue;
                    }
                    Err(_) => continue,
                }
                driver.kick_prepare();
                posted[slot] = Some(Posted {
                    slot: slot as u64,
                    cmd,
                    readable,
                    writable: w,
                });
            }
            CtrlOp::Process => {
                let used_before = peek16(&memory, rings.used.0 + 2);
                let was_broken = rt.queue.broken().is_some();
                let state_before = Model::of(&shared);
                let n = ctrlq::process_commands(&shared, &mut rt, &mut chain);
                if was_broken {
                    assert_eq!(n, 0, "a broken control queue processed commands");
                    assert_eq!(
                        peek16(&memory, rings.used.0 + 2),
                        used_before,
                        "a broken control queue published used entries"
                    );
                    assert_eq!(
                        Model::of(&shared),
                        state_before,
                        "a broken queue changed state"
                    );
                }
                if honest {
                    reap(&mut driver, &memory, &mut posted, &mut model, &mut out);
                    assert_eq!(
                        Model::of(&shared),
                        model,
                        "device state differs from the model"
                    );
                } else {
                    // Hostile: whatever the driver queue makes of it, only bounds hold.
                    while let Ok(Some(_)) = driver.get_used() {}
                }
            }
            CtrlOp::WriteDesc { index, desc } => {
                honest = false;
                desc.write(&memory, rings.desc.0 + 16 * (*index % size) as u64);
            }
            CtrlOp::Publish(heads) => {
                honest = false;
                let idx = peek16(&memory, rings.avail.0 + 2);
                for (k, &h) in heads.iter().enumerate() {
                    let slot = idx.wrapping_add(k as u16) % size;
                    poke16(&memory, rings.avail.0 + 4 + 2 * slot as u64, h);
                }
                poke16(
                    &memory,
                    rings.avail.0 + 2,
                    idx.wrapping_add(heads.len() as u16),
                );
            }
            CtrlOp::SetAvailIdx(v) => {
                honest = false;
                poke16(&memory, rings.avail.0 + 2, *v);
            }
            CtrlOp::Scribble(sc) => {
                honest = false;
                sc.write(&memory);
            }
        }
        check_bounds(&shared, &rt, &err, honest, &mut was_broken);
    }
    out.broken = rt.queue.broken().map(|e| e.to_string());
    out
}

/// Takes every used chain back and checks it against the model.
fn reap(
    driver: &mut DriverQueue<usize>,
    memory: &Arc<GuestMemory>,
    posted: &mut [Option<Posted>],
    model: &mut Model,
    out: &mut Outcome,
) {
    // The device answers in order, so applying the model in used order is applying it in
    // the order the device saw the commands.
    loop {
        let (slot, len) = match driver.get_used() {
            Ok(Some(u)) => u,
            Ok(None) => break,
            Err(e) => panic!("the device broke an honest driver's queue: {e}"),
        };
        let p = posted[slot]
            .take()
            .expect("a chain used twice, or one never posted");
        assert_eq!(p.slot, slot as u64);
        let writable: u64 = p.writable.iter().map(|b| b.len as u64).sum();
        let answer = model.apply(&p.cmd, writable);
        // What the writable bytes must hold now.
        let mut want = vec![UNTOUCHED; writable as usize];
        let want_len = match answer {
            None => {
                out.unacked += 1;
                0
            }
            Some(a) => {
                if a.ok {
                    out.oks += 1;
                } else {
                    out.errs += 1;
                }
                let last = want.len() - 1;
                want[last] = if a.ok { 0 } else { 1 };
                if let Some(r) = a.reply {
                    want[..8].copy_from_slice(&r);
                }
                // The used length covers the ack in the last writable byte.
                want.len() as u32
            }
        };
        let mut got = Vec::new();
        for b in &p.writable {
            let mut v = vec![0u8; b.len as usize];
            memory.read(b.addr, &mut v).unwrap();
            got.extend(v);
        }
        assert_eq!(
            got,
            want,
            "writable bytes of command {:02x?} ({answer:?})",
            &p.cmd[..p.cmd.len().min(16)]
        );
        assert_eq!(len, want_len, "used length of command {answer:?}");
        let mut cmd = Vec::new();
        for b in &p.readable {
            let mut v = vec![0u8; b.len as usize];
            memory.read(b.addr, &mut v).unwrap();
            cmd.extend(v);
        }
        assert_eq!(cmd, p.cmd, "the device wrote into a readable buffer");
    }
    assert!(
        posted.iter().all(Option::is_none),
        "the device left commands of an honest driver unanswered"
    );
}

/// What holds whatever the driver did.
fn check_bounds(
    shared: &Shared,
    rt: &QueueRuntime,
    err: &EventFd,
    honest: bool,
    was_broken: &mut bool,
) {
    let pairs = shared.config.pairs;
    let active = shared
        .active_pairs
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (1..=pairs).contains(&active),
        "{active} active pairs of {pairs}"
    );
    let broken = rt.queue.broken().is_some();
    assert_eq!(
        shared.queue_counters(QueueId::Ctrl).is_broken(),
        broken,
        "metrics and queue disagree on broken"
    );
    // The error eventfd is signalled once, when the queue breaks.
    let signalled = err.read().is_ok();
    assert_eq!(
        signalled,
        broken && !*was_broken,
        "error eventfd signalled: {signalled}, queue broken now: {broken}, before: {was_broken}"
    );
    *was_broken = broken;
    assert!(
        !honest || !broken,
        "an honest driver broke the control queue"
    );
    for id in QueueId::all(pairs).filter(|id| *id != QueueId::Ctrl) {
        let m = shared.queue_counters(id);
        assert!(
            !m.is_broken(),
            "data queue {id} broken by the control queue"
        );
    }
}
