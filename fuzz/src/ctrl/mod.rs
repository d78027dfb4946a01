//! The `ctrl_queue` target: the backend's control-queue device
//! (`virtnet_backend::fuzzing::process_commands`, spec 5.1.6.5) facing a careless or hostile
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
//!
//! [`input`] holds the input types and the command bytes they stand for, [`model`] what the
//! spec says each command does; this file posts, processes and checks.

mod input;
mod model;

pub use input::{CtrlInput, CtrlOp, CtrlSetup, Payload, KNOWN, MAX_COMMAND};

use std::sync::Arc;

use virtnet_backend::{fuzzing, BackendConfig, IoMode, Shared};
use virtnet_backend::{QueueId, QueueRuntime};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vring::{
    Buf, Chain, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, IndirectArea,
    QueueConfig,
};

use crate::mem::{self, peek16, poke16, Placement, DATA, DRV_INDIRECT};
use model::Model;

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
    let shared = fuzzing::shared(config).expect("device state");
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
    let device = DeviceQueue::activate(&qconfig, memory.clone(), vring::RingPosition::START)
        .expect("device queue");
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    let err = EventFd::new(EFD_NONBLOCK).unwrap();
    let mut rt = fuzzing::queue_runtime(
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
                let was_broken = rt.ring_broken().is_some();
                let state_before = Model::of(&shared);
                let n = fuzzing::process_commands(&shared, &mut rt, &mut chain);
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
    out.broken = rt.ring_broken().map(|e| e.to_string());
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
    let pairs = shared.pairs();
    let active = shared.active_pairs();
    assert!(
        (1..=pairs).contains(&active),
        "{active} active pairs of {pairs}"
    );
    let broken = rt.ring_broken().is_some();
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
