//! The engines under test, a `DriverQueue` and a `DeviceQueue` on one queue, and the model
//! they are checked against after every operation.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use vring::{
    Buf, Chain, DeviceQueue, DriverQueue, Error, Features, GuestAddress, GuestMemory, IndirectArea,
    QueueConfig, RingAddresses, Segment, DEFAULT_USED_BATCH,
};

use crate::ops::{BufSpec, Op, Setup, DATA_BASE, INDIRECT_BASE, MEM_SIZE, RING_BASE};

/// A chain as the driver added it.
#[derive(Debug)]
struct Added {
    out: Vec<Buf>,
    in_: Vec<Buf>,
    ndescs: u16,
}

/// The engines under test and the model they are checked against.
pub struct Harness {
    s: Setup,
    pub driver: DriverQueue<u64>,
    device: DeviceQueue,

    next_token: u64,
    /// Chains the driver added and has not reclaimed, by token.
    in_flight: HashMap<u64, Added>,
    descs_in_flight: u16,
    /// Added, not yet popped (every add publishes).
    avail: VecDeque<u64>,
    /// Popped, not yet used.
    held: Vec<(u64, Chain)>,
    /// Used elements written but not published, then published but not reclaimed.
    written: VecDeque<(u64, u32)>,
    published: VecDeque<(u64, u32)>,
    batch: u16,
    /// Running totals (they do not wrap).
    added_total: u64,
    popped_total: u64,
    published_total: u64,
    reclaimed_total: u64,
    /// Chains added since the last kick_prepare.
    added_since_kick: u64,
    /// `published_total` at the device's last notification decision.
    last_decision: Option<u64>,
    /// The device waits for a kick (it went to sleep after enable_notification said empty).
    device_asleep: bool,
    /// The driver waits for a notification, which must come once `published_total` reaches
    /// this.
    driver_waiting_for: Option<u64>,
    /// With callbacks enabled: the `published_total` at which the driver has asked to be
    /// notified (by enable_cb*, or by get_used moving `used_event`), and whether it has
    /// re-read the used index since asking.
    armed_for: Option<u64>,
    rechecked: bool,
    /// The flags each side has set, for the exact flag-mode predictions.
    device_no_notify: bool,
    driver_no_interrupt: bool,
}

impl Harness {
    pub fn new(s: Setup) -> Harness {
        let mut features = Features::EMPTY;
        if s.event_idx {
            features = features | Features::RING_EVENT_IDX;
        }
        if s.indirect {
            features = features | Features::RING_INDIRECT_DESC;
        }
        if s.in_order {
            features = features | Features::IN_ORDER;
        }
        let mem = Arc::new(GuestMemory::anonymous(&[(GuestAddress(0), MEM_SIZE)]).unwrap());
        let rings = RingAddresses::contiguous(RING_BASE, s.size);
        assert!(RING_BASE.0 + RingAddresses::contiguous_len(s.size) <= INDIRECT_BASE.0);
        assert!(INDIRECT_BASE.0 + IndirectArea::bytes_needed(s.size, s.max_chain) <= DATA_BASE);
        let config = QueueConfig::new(s.size as u32, rings, features).unwrap();
        let area = IndirectArea {
            addr: INDIRECT_BASE,
            max_chain: s.max_chain,
        };
        let mut driver = DriverQueue::activate(&config, mem.clone(), Some(area)).unwrap();
        driver.set_fifo_reuse(s.fifo_reuse);
        let device = DeviceQueue::activate(&config, mem, vring::RingPosition::START).unwrap();
        let mut h = Harness {
            batch: DEFAULT_USED_BATCH.min(s.size),
            s,
            driver,
            device,
            next_token: 0,
            in_flight: HashMap::new(),
            descs_in_flight: 0,
            avail: VecDeque::new(),
            held: Vec::new(),
            written: VecDeque::new(),
            published: VecDeque::new(),
            added_total: 0,
            popped_total: 0,
            published_total: 0,
            reclaimed_total: 0,
            added_since_kick: 0,
            last_decision: None,
            device_asleep: false,
            driver_waiting_for: None,
            armed_for: Some(1),
            rechecked: false,
            device_no_notify: false,
            driver_no_interrupt: false,
        };
        h.run_prefix();
        h
    }

    /// Round trips that move every index close to the 16-bit wrap; checked only loosely,
    /// the model starts after them.
    fn run_prefix(&mut self) {
        if self.s.prefix_cb_disabled {
            self.driver.disable_cb();
            self.driver_no_interrupt = true;
            self.armed_for = None;
        }
        let b = BufSpec { slot: 0, len: 64 }.buf();
        for i in 0..self.s.prefix {
            let token = self.next_token;
            self.driver.add(&[], &[b], token).unwrap();
            self.driver.kick_prepare();
            let c = self.device.pop().unwrap().expect("a chain was added");
            self.device.add_used(c.head(), 1).unwrap();
            if self.s.prefix_notify.at(i) {
                self.device.needs_notification();
                self.last_decision = Some(i as u64 + 1);
            } else {
                self.device.flush();
            }
            assert_eq!(self.driver.get_used(), Ok(Some((token, 1))));
            self.next_token += 1;
        }
        let n = self.s.prefix as u64;
        self.added_total = n;
        self.popped_total = n;
        self.published_total = n;
        self.reclaimed_total = n;
        if self.armed_for.is_some() {
            self.armed_for = Some(n + 1);
        }
    }

    /// Whether the driver puts a chain of `bufs` buffers in an indirect table: when it has
    /// more than one buffer, fits the table, and is no longer than the queue (spec 2.7.5.3.1).
    fn model_uses_indirect(&self, bufs: usize) -> bool {
        let size = self.s.size as usize;
        self.s.indirect && bufs > 1 && bufs <= self.s.max_chain as usize && bufs <= size
    }

    fn publish(&mut self) {
        self.published_total += self.written.len() as u64;
        self.published.extend(self.written.drain(..));
    }

    pub fn run(&mut self, op: &Op) {
        match op {
            Op::Add { out, in_ } => self.add(out, in_),
            Op::KickPrepare => self.kick_prepare(),
            Op::GetUsed if self.driver_waiting_for.is_none() => self.get_used(),
            Op::DisableCb if self.driver_waiting_for.is_none() => {
                self.driver.disable_cb();
                self.driver_no_interrupt = true;
                self.armed_for = None;
                self.rechecked = false;
            }
            Op::EnableCb { wait } if self.driver_waiting_for.is_none() => {
                self.enable_cb(false, *wait)
            }
            Op::EnableCbDelayed { wait } if self.driver_waiting_for.is_none() => {
                self.enable_cb(true, *wait)
            }
            Op::Wait
                if self.driver_waiting_for.is_none()
                    && self.rechecked
                    && self.published_total == self.reclaimed_total =>
            {
                self.driver_waiting_for = self.armed_for;
            }
            Op::Pop if !self.device_asleep => self.pop(),
            Op::AddUsed { pick, len } if !self.device_asleep && !self.held.is_empty() => {
                // In order, the device uses the oldest chain it holds (popped first).
                let at = if self.s.in_order {
                    0
                } else {
                    pick.index(self.held.len())
                };
                let (token, chain) = self.held.remove(at);
                let len = (*len as u64 % (chain.writable_len() + 1)) as u32;
                self.add_used(token, &chain, len);
            }
            Op::Flush if !self.device_asleep => {
                self.device.flush();
                self.publish();
            }
            Op::NeedsNotification if !self.device_asleep => self.needs_notification(),
            Op::EnableNotification { sleep } if !self.device_asleep => {
                self.enable_notification(*sleep)
            }
            Op::DisableNotification if !self.device_asleep => {
                self.device.disable_notification();
                self.device_no_notify = true;
            }
            Op::SetUsedBatch(b) if !self.device_asleep => {
                self.device.set_used_batch(*b);
                self.batch = (*b).clamp(1, self.s.size);
            }
            // The side that would make this call is blocked, or has nothing to call it on.
            _ => {}
        }
        self.check_invariants();
    }

    fn add(&mut self, out: &[BufSpec], in_: &[BufSpec]) {
        let out: Vec<Buf> = out.iter().map(|b| b.buf()).collect();
        let in_: Vec<Buf> = in_.iter().map(|b| b.buf()).collect();
        let token = self.next_token;
        let got = self.driver.add(&out, &in_, token);
        let total = out.len() + in_.len();
        let needed = if self.model_uses_indirect(total) {
            1
        } else {
            total
        };
        let free = self.s.size - self.descs_in_flight;
        if total == 0 {
            assert_eq!(got, Err(Error::EmptyChain));
        } else if needed > free as usize {
            assert_eq!(got, Err(Error::QueueFull { needed, free }));
        } else {
            assert_eq!(got, Ok(()), "add of {total} buffers with {free} free");
            let ndescs = needed as u16;
            self.in_flight.insert(token, Added { out, in_, ndescs });
            self.descs_in_flight += ndescs;
            self.avail.push_back(token);
            self.next_token += 1;
            self.added_total += 1;
            self.added_since_kick += 1;
        }
    }

    fn kick_prepare(&mut self) {
        let kick = self.driver.kick_prepare();
        if !self.s.event_idx {
            let want = self.added_since_kick > 0 && !self.device_no_notify;
            assert_eq!(
                kick, want,
                "flag mode: {} added, NO_NOTIFY {}",
                self.added_since_kick, self.device_no_notify
            );
        }
        if self.device_asleep && !self.avail.is_empty() {
            assert!(
                kick,
                "lost wake-up: the device sleeps with {} chains added behind it and \
                 kick_prepare says no kick",
                self.avail.len()
            );
        }
        self.added_since_kick = 0;
        if kick {
            self.device_asleep = false;
        }
    }

    fn get_used(&mut self) {
        let pending = self.driver.used_pending();
        assert_eq!(pending, !self.published.is_empty(), "used_pending");
        let got = self.driver.get_used().expect("get_used");
        let want = self.published.pop_front();
        assert_eq!(got, want, "get_used");
        if let Some((token, _)) = want {
            let chain = self.in_flight.remove(&token).expect("token in flight");
            self.descs_in_flight -= chain.ndescs;
            self.reclaimed_total += 1;
            if self.armed_for.is_some() {
                // The next used entry is wanted now (event idx: used_event = last_used).
                self.armed_for = Some(self.reclaimed_total + 1);
            }
            self.rechecked = false;
        } else {
            self.rechecked = self.armed_for.is_some();
        }
    }

    fn enable_cb(&mut self, delayed: bool, wait: bool) {
        assert_eq!(self.driver.in_flight() as usize, self.in_flight.len());
        let (pending, bufs) = if delayed {
            let bufs = self.in_flight.len() as u64 * 3 / 4;
            (self.driver.enable_cb_delayed(), bufs)
        } else {
            (self.driver.enable_cb(), 0)
        };
        self.driver_no_interrupt = false;
        let unreclaimed = self.published_total - self.reclaimed_total;
        assert_eq!(
            pending,
            unreclaimed > bufs,
            "enable_cb (delayed {delayed}): {unreclaimed} used entries pending, waiting for \
             more than {bufs}"
        );
        self.armed_for = Some(self.reclaimed_total + bufs + 1);
        self.rechecked = !pending;
        if !pending && wait {
            self.driver_waiting_for = self.armed_for;
        }
    }

    fn pop(&mut self) {
        let got = self.device.pop().expect("pop");
        let want = self.avail.pop_front();
        let (chain, token) = match (got, want) {
            (None, None) => return,
            (Some(c), Some(t)) => (c, t),
            (got, want) => panic!("pop gave {got:?}, the model expects token {want:?}"),
        };
        let added = &self.in_flight[&token];
        let segs = |bufs: &[Buf]| -> Vec<Segment> {
            bufs.iter()
                .map(|b| Segment {
                    addr: b.addr,
                    len: b.len,
                })
                .collect()
        };
        assert_eq!(chain.readable(), segs(&added.out), "readable part");
        assert_eq!(chain.writable(), segs(&added.in_), "writable part");
        let sum = |bufs: &[Buf]| bufs.iter().map(|b| b.len as u64).sum::<u64>();
        assert_eq!(chain.readable_len(), sum(&added.out));
        assert_eq!(chain.writable_len(), sum(&added.in_));
        self.popped_total += 1;
        self.held.push((token, chain));
    }

    fn add_used(&mut self, token: u64, chain: &Chain, len: u32) {
        self.device.add_used(chain.head(), len).expect("add_used");
        self.written.push_back((token, len));
        if self.written.len() >= self.batch as usize {
            self.publish();
        }
    }

    fn needs_notification(&mut self) {
        let notify = self.device.needs_notification();
        self.publish();
        if !self.s.event_idx {
            if self.driver_no_interrupt {
                assert!(!notify, "flag mode: NO_INTERRUPT is set");
            } else if self.last_decision != Some(self.published_total) {
                assert!(notify, "flag mode: new used entries, NO_INTERRUPT clear");
            }
        }
        if let Some(target) = self.driver_waiting_for {
            assert!(
                notify || self.published_total < target,
                "lost interrupt: the driver waits for used index {target} (model count), \
                 {} are published, and the device decides not to notify",
                self.published_total
            );
        }
        self.last_decision = Some(self.published_total);
        if notify {
            self.driver_waiting_for = None;
        }
    }

    fn enable_notification(&mut self, sleep: bool) {
        let pending = self
            .device
            .enable_notification()
            .expect("enable_notification");
        self.publish();
        self.device_no_notify = false;
        assert_eq!(
            pending,
            !self.avail.is_empty(),
            "enable_notification re-check"
        );
        // A device holding chains finishes them before it waits.
        if !pending && sleep && self.held.is_empty() {
            self.device_asleep = true;
        }
    }

    fn check_invariants(&mut self) {
        assert_eq!(self.driver.broken(), None);
        assert_eq!(self.device.broken(), None);
        assert_eq!(
            self.driver.num_free(),
            self.s.size - self.descs_in_flight,
            "num_free"
        );
        assert_eq!(self.driver.in_flight() as usize, self.in_flight.len());
        assert!(
            !(self.device_asleep && !self.avail.is_empty() && self.added_since_kick == 0),
            "lost wake-up: the device sleeps with chains pending and no kick to come"
        );
    }

    /// Ends the run as a correct pair would: the driver kicks for what it added, the device
    /// completes everything and decides on a notification, the driver reclaims everything.
    pub fn drain(&mut self) {
        self.run(&Op::KickPrepare);
        // Nothing is pending for a device still asleep (checked above): wake it anyway.
        self.device_asleep = false;
        while !self.avail.is_empty() {
            self.pop();
        }
        for (token, chain) in std::mem::take(&mut self.held) {
            let len = (chain.writable_len() / 2) as u32;
            self.add_used(token, &chain, len);
        }
        self.run(&Op::NeedsNotification);
        if self.driver_waiting_for.is_some() {
            // Legitimately still waiting: it asked when nothing was in flight.
            assert!(self.published.is_empty());
            self.driver_waiting_for = None;
        }
        while !self.published.is_empty() {
            self.get_used();
        }
        self.get_used();
        self.check_invariants();
        assert!(self.in_flight.is_empty());
        assert_eq!(self.driver.num_free(), self.s.size);
        assert_eq!(self.device.pop(), Ok(None));
        assert_eq!(self.driver.get_used(), Ok(None));

        let (ds, vs) = (self.driver.stats(), self.device.stats());
        assert_eq!(ds.added, self.added_total);
        assert_eq!(ds.used, self.reclaimed_total);
        assert_eq!(vs.popped, self.popped_total);
        assert_eq!(vs.used, self.published_total);
        assert_eq!(self.added_total, self.reclaimed_total);
    }
}
