//! loom models of the notification protocol (test tier 3 of docs/ARCHITECTURE.md): no lost wake-up, no
//! double completion, in flag mode and in event-idx mode, on the kick side (driver to device)
//! and the interrupt side (device to driver).
//!
//! `tests/loom_engine.rs` runs the engine itself under loom (built with `--cfg loom`). This file
//! keeps the protocol written out by hand over loom atomics, so that each negative model can
//! remove one fence or re-check inside the protocol and show the deadlock that follows: the shared fields (`avail.idx`, `used.idx`, `avail.flags`, `used.flags`,
//! `used_event`, `avail_event`, ring entries) are loom `AtomicU16`/`AtomicU32`, accessed with the
//! same orderings, fences and order as the engine, and each model function names the engine
//! function it mirrors (`DriverQueue::add` in src/driver.rs, and so on). Event-idx decisions use
//! the crate's own `vring_need_event`. When the engine's protocol changes, change it here too.
//!
//! A kick or a call is a loom `Notify`, which has eventfd semantics: a notification sent while
//! nobody waits is kept until the next wait. A thread that waits forever makes loom report a
//! deadlock, and that is what a lost wake-up looks like here. Each negative model removes the
//! re-check or the fence that prevents it, and must fail with that deadlock.
//!
//! On loom and fences: loom treats SeqCst *accesses* as AcqRel (it would report false alarms),
//! but it models `fence(SeqCst)` (all SeqCst fences are totally ordered, and a fence later in
//! that order sees everything before the earlier one), which is what the engine uses: its
//! shared-memory accesses are Relaxed, Acquire or Release, and the store-then-load ordering on
//! each side comes from an explicit `fence(SeqCst)`. The positive models pass as written; no
//! workaround was needed.
//!
//! The state space is kept small: 2 or 3 chains, and a preemption bound of 3 (or
//! `LOOM_MAX_PREEMPTIONS` if set).

use loom::sync::atomic::{fence, AtomicU16, AtomicU32};
use loom::sync::Notify;
use loom::thread;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
// std's Arc, not loom's: loom's Arc calls into the scheduler when dropped, which panics
// again while a deadlock panic unwinds, and that aborts the negative models.
use std::sync::Arc;

use vring::layout::{AVAIL_F_NO_INTERRUPT, USED_F_NO_NOTIFY};
use vring::vring_need_event;

/// Ring slots: more than the chains of any model, so indices never wrap.
const QUEUE: usize = 4;
const MASK: u16 = QUEUE as u16 - 1;
/// What an avail or used ring entry holds before anyone writes it.
const EMPTY: u16 = 0xffff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Flags,
    EventIdx,
}

/// The protocol as the engine implements it, or with one piece removed (negative models).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    Correct,
    /// The side enabling notifications does not re-read the other side's index afterwards.
    NoRecheck,
    /// The side enabling notifications re-reads without the full fence before it.
    NoFence,
}

/// The shared part of a split ring: what lives in guest memory.
struct Ring {
    avail_flags: AtomicU16,
    avail_idx: AtomicU16,
    avail_ring: [AtomicU16; QUEUE],
    used_event: AtomicU16,
    used_flags: AtomicU16,
    used_idx: AtomicU16,
    used_ring: [AtomicU32; QUEUE],
    avail_event: AtomicU16,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            avail_flags: AtomicU16::new(0),
            avail_idx: AtomicU16::new(0),
            avail_ring: std::array::from_fn(|_| AtomicU16::new(EMPTY)),
            used_event: AtomicU16::new(0),
            used_flags: AtomicU16::new(0),
            used_idx: AtomicU16::new(0),
            used_ring: std::array::from_fn(|_| AtomicU32::new(EMPTY as u32)),
            avail_event: AtomicU16::new(0),
        }
    }
}

fn check(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(f);
}

// ---- Kick side: the driver exposes chains, the device consumes them.

/// The driver's kick-side state (`DriverQueue`).
struct KickDriver {
    event_idx: bool,
    avail_idx_shadow: u16,
    num_added: u16,
}

impl KickDriver {
    /// `DriverQueue::add`: write the ring entry, publish the index.
    fn add(&mut self, r: &Ring, head: u16) {
        r.avail_ring[(self.avail_idx_shadow & MASK) as usize].store(head, Relaxed);
        self.avail_idx_shadow = self.avail_idx_shadow.wrapping_add(1);
        self.num_added += 1;
        // Release: pairs with the device's acquire load of avail.idx.
        r.avail_idx.store(self.avail_idx_shadow, Release);
    }

    /// `DriverQueue::kick_prepare`.
    fn kick_prepare(&mut self, r: &Ring) -> bool {
        if self.num_added == 0 {
            return false;
        }
        // Pairs with the device's fence in enable_notification.
        fence(SeqCst);
        let new = self.avail_idx_shadow;
        let old = new.wrapping_sub(self.num_added);
        self.num_added = 0;
        if self.event_idx {
            vring_need_event(r.avail_event.load(Relaxed), new, old)
        } else {
            r.used_flags.load(Relaxed) & USED_F_NO_NOTIFY == 0
        }
    }
}

/// The device's kick-side state (`DeviceQueue`).
struct KickDevice {
    event_idx: bool,
    protocol: Protocol,
    last_avail: u16,
    avail_cache: u16,
    used_flags: u16,
}

impl KickDevice {
    /// `DeviceQueue::refresh_avail`.
    fn refresh_avail(&mut self, r: &Ring) -> bool {
        // Acquire: pairs with the driver's release store of avail.idx.
        let idx = r.avail_idx.load(Acquire);
        self.avail_cache = idx;
        idx != self.last_avail
    }

    /// `DeviceQueue::pop_into`, returning the head only.
    fn pop(&mut self, r: &Ring) -> Option<u16> {
        if self.last_avail == self.avail_cache && !self.refresh_avail(r) {
            return None;
        }
        let head = r.avail_ring[(self.last_avail & MASK) as usize].load(Relaxed);
        self.last_avail = self.last_avail.wrapping_add(1);
        Some(head)
    }

    /// `DeviceQueue::enable_notification`.
    fn enable_notification(&mut self, r: &Ring) -> bool {
        if self.event_idx {
            r.avail_event.store(self.avail_cache, Relaxed);
        } else if self.used_flags & USED_F_NO_NOTIFY != 0 {
            self.used_flags &= !USED_F_NO_NOTIFY;
            r.used_flags.store(self.used_flags, Relaxed);
        }
        if self.protocol != Protocol::NoFence {
            // Pairs with the driver's fence in kick_prepare.
            fence(SeqCst);
        }
        self.last_avail != self.avail_cache
            || (self.protocol != Protocol::NoRecheck && self.refresh_avail(r))
    }

    /// `DeviceQueue::disable_notification`.
    fn disable_notification(&mut self, r: &Ring) {
        if !self.event_idx && self.used_flags & USED_F_NO_NOTIFY == 0 {
            self.used_flags |= USED_F_NO_NOTIFY;
            r.used_flags.store(self.used_flags, Relaxed);
        }
    }
}

/// The driver adds `chains` chains, kicking when `kick_prepare` says so; the device sleeps
/// until kicked, then works like vhost's handle_tx: disable notifications, drain, enable and
/// re-check, sleep only if the re-check finds nothing. Every chain must be consumed, once and
/// in order: a device asleep with work pending is a deadlock.
fn kick_side(mode: Mode, protocol: Protocol, chains: u16) {
    check(move || {
        let event_idx = mode == Mode::EventIdx;
        let ring = Arc::new(Ring::new());
        let kick = Arc::new(Notify::new());
        let device = {
            let (ring, kick) = (ring.clone(), kick.clone());
            thread::spawn(move || {
                let mut dev = KickDevice {
                    event_idx,
                    protocol,
                    last_avail: 0,
                    avail_cache: 0,
                    used_flags: 0,
                };
                let mut consumed = 0;
                loop {
                    kick.wait();
                    dev.disable_notification(&ring);
                    loop {
                        while let Some(head) = dev.pop(&ring) {
                            assert_eq!(head, consumed, "chains come out once, in order");
                            consumed += 1;
                        }
                        if consumed == chains {
                            return;
                        }
                        if !dev.enable_notification(&ring) {
                            break; // Sleep.
                        }
                        dev.disable_notification(&ring);
                    }
                }
            })
        };
        let mut drv = KickDriver {
            event_idx,
            avail_idx_shadow: 0,
            num_added: 0,
        };
        for head in 0..chains {
            drv.add(&ring, head);
            if drv.kick_prepare(&ring) {
                kick.notify();
            }
        }
        device.join().unwrap();
    });
}

#[test]
fn kick_side_flags_no_lost_wakeup() {
    kick_side(Mode::Flags, Protocol::Correct, 3);
}

#[test]
fn kick_side_event_idx_no_lost_wakeup() {
    kick_side(Mode::EventIdx, Protocol::Correct, 3);
}

#[test]
#[should_panic(expected = "deadlock")]
fn kick_side_without_recheck_loses_a_wakeup() {
    kick_side(Mode::Flags, Protocol::NoRecheck, 2);
}

#[test]
#[should_panic(expected = "deadlock")]
fn kick_side_without_fence_loses_a_wakeup() {
    kick_side(Mode::EventIdx, Protocol::NoFence, 2);
}

// ---- Interrupt side: the device returns used chains, the driver reclaims them.

/// The device's interrupt-side state (`DeviceQueue`).
struct CallDevice {
    event_idx: bool,
    next_used: u16,
    published_used: u16,
    signalled_used: u16,
    signalled_used_valid: bool,
}

impl CallDevice {
    /// `DeviceQueue::add_used` (the batch is flushed by the caller).
    fn add_used(&mut self, r: &Ring, head: u16) {
        r.used_ring[(self.next_used & MASK) as usize].store(head as u32, Relaxed);
        self.next_used = self.next_used.wrapping_add(1);
    }

    /// `DeviceQueue::flush`.
    fn flush(&mut self, r: &Ring) {
        let (old, new) = (self.published_used, self.next_used);
        if old == new {
            return;
        }
        // Release: pairs with the driver's acquire load of used.idx.
        r.used_idx.store(new, Release);
        self.published_used = new;
        if new.wrapping_sub(self.signalled_used) < new.wrapping_sub(old) {
            self.signalled_used_valid = false;
        }
    }

    /// `DeviceQueue::needs_notification`.
    fn needs_notification(&mut self, r: &Ring) -> bool {
        self.flush(r);
        if self.signalled_used_valid && self.signalled_used == self.published_used {
            return false;
        }
        // Pairs with the driver's fence in enable_cb (and get_used).
        fence(SeqCst);
        let need = if self.event_idx {
            let (old, valid) = (self.signalled_used, self.signalled_used_valid);
            !valid || vring_need_event(r.used_event.load(Relaxed), self.published_used, old)
        } else {
            r.avail_flags.load(Relaxed) & AVAIL_F_NO_INTERRUPT == 0
        };
        self.signalled_used = self.published_used;
        self.signalled_used_valid = true;
        need
    }
}

/// The driver's interrupt-side state (`DriverQueue`).
struct CallDriver {
    event_idx: bool,
    protocol: Protocol,
    avail_idx_shadow: u16,
    last_used: u16,
    used_cache: u16,
    avail_flags_shadow: u16,
}

impl CallDriver {
    fn in_flight(&self) -> u16 {
        self.avail_idx_shadow.wrapping_sub(self.last_used)
    }

    /// `DriverQueue::get_used`, returning the id only.
    fn get_used(&mut self, r: &Ring) -> Option<u32> {
        if self.last_used == self.used_cache {
            // Acquire: pairs with the device's release store of used.idx.
            let idx = r.used_idx.load(Acquire);
            self.used_cache = idx;
            if idx == self.last_used {
                return None;
            }
        }
        let id = r.used_ring[(self.last_used & MASK) as usize].load(Relaxed);
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx && self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT == 0 {
            r.used_event.store(self.last_used, Relaxed);
            // Pairs with the device's fence in needs_notification.
            fence(SeqCst);
        }
        Some(id)
    }

    /// `DriverQueue::disable_cb`.
    fn disable_cb(&mut self, r: &Ring) {
        if self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT != 0 {
            return;
        }
        self.avail_flags_shadow |= AVAIL_F_NO_INTERRUPT;
        if self.event_idx {
            r.used_event
                .store(self.last_used.wrapping_add(0x8000), Relaxed);
        } else {
            r.avail_flags.store(self.avail_flags_shadow, Relaxed);
        }
    }

    /// `DriverQueue::enable_cb`.
    fn enable_cb(&mut self, r: &Ring) -> bool {
        self.enable_cb_at(r, self.last_used, 0)
    }

    /// `DriverQueue::enable_cb_delayed`.
    fn enable_cb_delayed(&mut self, r: &Ring) -> bool {
        let bufs = (self.in_flight() as u32 * 3 / 4) as u16;
        self.enable_cb_at(r, self.last_used.wrapping_add(bufs), bufs)
    }

    /// `DriverQueue::enable_cb_at`.
    fn enable_cb_at(&mut self, r: &Ring, used_event: u16, bufs: u16) -> bool {
        if self.avail_flags_shadow & AVAIL_F_NO_INTERRUPT != 0 {
            self.avail_flags_shadow &= !AVAIL_F_NO_INTERRUPT;
            if !self.event_idx {
                r.avail_flags.store(self.avail_flags_shadow, Relaxed);
            }
        }
        if self.event_idx {
            r.used_event.store(used_event, Relaxed);
        }
        if self.protocol != Protocol::NoFence {
            // Pairs with the device's fence in needs_notification.
            fence(SeqCst);
        }
        let used_idx = if self.protocol == Protocol::NoRecheck {
            self.used_cache
        } else {
            r.used_idx.load(Acquire)
        };
        used_idx.wrapping_sub(self.last_used) > bufs
    }
}

/// How the driver waits for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// NAPI-style: poll with callbacks off, `enable_cb` and re-check, wait, disable on wake.
    EnableCb,
    /// The same with `enable_cb_delayed` (the tx completion path).
    EnableCbDelayed,
    /// Callbacks stay on; `get_used` moves `used_event` and its next call re-checks.
    CallbacksLeftOn,
}

/// `chains` chains are in flight, popped by the device, which completes them `batch` at a
/// time, publishing and deciding on a notification after each batch. The driver reclaims them
/// and waits as `waiter` says. Every chain must be reclaimed exactly once, in order: a driver
/// waiting with its completions published and no notification coming is a deadlock.
fn call_side(mode: Mode, protocol: Protocol, waiter: Waiter, chains: u16, batch: u16) {
    check(move || {
        let event_idx = mode == Mode::EventIdx;
        let ring = Arc::new(Ring::new());
        let call = Arc::new(Notify::new());
        let mut drv = CallDriver {
            event_idx,
            protocol,
            avail_idx_shadow: chains,
            last_used: 0,
            used_cache: 0,
            avail_flags_shadow: 0,
        };
        if waiter != Waiter::CallbacksLeftOn {
            // The driver starts polling, callbacks off (as after an interrupt).
            drv.disable_cb(&ring);
        }
        let device = {
            let (ring, call) = (ring.clone(), call.clone());
            thread::spawn(move || {
                let mut dev = CallDevice {
                    event_idx,
                    next_used: 0,
                    published_used: 0,
                    signalled_used: 0,
                    signalled_used_valid: false,
                };
                for head in 0..chains {
                    dev.add_used(&ring, head);
                    let done = head + 1;
                    if (done.is_multiple_of(batch) || done == chains)
                        && dev.needs_notification(&ring)
                    {
                        call.notify();
                    }
                }
            })
        };
        let mut reclaimed = 0;
        loop {
            while let Some(id) = drv.get_used(&ring) {
                assert_eq!(id, reclaimed as u32, "chains come back once, in order");
                reclaimed += 1;
            }
            if reclaimed == chains {
                break;
            }
            let pending = match waiter {
                Waiter::EnableCb => drv.enable_cb(&ring),
                Waiter::EnableCbDelayed => drv.enable_cb_delayed(&ring),
                // The get_used that just returned None was the re-check.
                Waiter::CallbacksLeftOn => false,
            };
            if pending {
                drv.disable_cb(&ring);
                continue;
            }
            call.wait();
            if waiter != Waiter::CallbacksLeftOn {
                drv.disable_cb(&ring);
            }
        }
        device.join().unwrap();
    });
}

#[test]
fn call_side_flags_no_lost_interrupt() {
    call_side(Mode::Flags, Protocol::Correct, Waiter::EnableCb, 3, 1);
}

#[test]
fn call_side_event_idx_no_lost_interrupt() {
    call_side(Mode::EventIdx, Protocol::Correct, Waiter::EnableCb, 3, 1);
}

#[test]
fn call_side_event_idx_batched_no_lost_interrupt() {
    call_side(Mode::EventIdx, Protocol::Correct, Waiter::EnableCb, 3, 2);
}

#[test]
fn call_side_flags_delayed_no_lost_interrupt() {
    call_side(
        Mode::Flags,
        Protocol::Correct,
        Waiter::EnableCbDelayed,
        3,
        1,
    );
}

#[test]
fn call_side_event_idx_delayed_no_lost_interrupt() {
    call_side(
        Mode::EventIdx,
        Protocol::Correct,
        Waiter::EnableCbDelayed,
        3,
        1,
    );
}

#[test]
fn call_side_event_idx_callbacks_left_on_no_lost_interrupt() {
    call_side(
        Mode::EventIdx,
        Protocol::Correct,
        Waiter::CallbacksLeftOn,
        3,
        1,
    );
}

#[test]
#[should_panic(expected = "deadlock")]
fn call_side_without_recheck_loses_an_interrupt() {
    call_side(Mode::Flags, Protocol::NoRecheck, Waiter::EnableCb, 2, 1);
}

#[test]
#[should_panic(expected = "deadlock")]
fn call_side_without_fence_loses_an_interrupt() {
    call_side(Mode::EventIdx, Protocol::NoFence, Waiter::EnableCb, 2, 1);
}
