//! The hostile frontend's guest: its traffic on the rings the frontend set up, so that the
//! workers' tx path, the echo and null ports and the rx path (`deliver`, mergeable buffers,
//! tiny buffers) run on what the input says.
//!
//! The guest maps the memory table the frontend last sent again, from the same memfds (as the
//! backend maps it), and runs a `DriverQueue` on the rings the frontend last gave each
//! virtqueue, with the features the device negotiated. It follows what the frontend sent, not
//! what the backend accepted: its rings may be stale, overlapping, or out of step with the
//! device's, as a buggy guest's are. Through that driver it posts tx chains (any header, any
//! segmenting: zero-length buffers, buffers off the end of memory, writable buffers), rx chains
//! of any sizes and counts (readable buffers too), and kicks. The header of every tx chain is
//! also put through the TAP port's check, which the echo and null ports skip
//! ([`super::tx_header`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_backend::Device;
use vmm_sys_util::eventfd::EventFd;
use vring::memory::RegionSource;
use vring::{Buf, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses};

use super::input::{Body, Message, Port, Region, Size};
use super::protocol::{code, NOFD};
use super::traffic::{GuestOp, Segment};
use super::{tx_header, Attached};

/// How long [`GuestOp::Settle`] waits for the workers.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    /// A settle ends once no used buffer has come back for this long...
    pub quiet: Duration,
    /// ...or after this long in all, and never once the input has waited `per_input`...
    pub per_settle: Duration,
    pub per_input: Duration,
    /// ...or, if set, as soon as no chain is left where the device has work.
    pub early: bool,
}

/// While fuzzing: a settle costs a few hundred microseconds at most when the device has
/// nothing to do, and less when it has.
pub const FUZZING: Patience = Patience {
    quiet: Duration::from_micros(200),
    per_settle: Duration::from_millis(1),
    per_input: Duration::from_millis(3),
    early: true,
};

/// For the seed tests: every settle waits until the device has done all it will, with room
/// for a loaded machine, so that a seed's used buffers are the same on every run.
pub const SEEDS: Patience = Patience {
    quiet: Duration::from_millis(50),
    per_settle: Duration::from_secs(2),
    per_input: Duration::from_secs(10),
    early: false,
};

/// What a driver was built from; a change of any of them means a new driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    table: u32,
    num: u32,
    addrs: Option<[u64; 3]>,
    features: u64,
}

/// What the frontend set up for one virtqueue, and the guest's driver on it.
#[derive(Debug, Default)]
struct Vring {
    num: u32,
    /// desc, used, avail: the frontend's addresses, as SET_VRING_ADDR sent them.
    addrs: Option<[u64; 3]>,
    kick: Option<EventFd>,
    /// The driver, for the setup it was built from (None: that setup does not map).
    driver: Option<(Key, Option<DriverQueue<u32>>)>,
}

#[derive(Debug)]
pub(super) struct Guest {
    port: Port,
    /// The device's data pairs: virtqueues `0..2 * pairs` are rx and tx.
    pairs: usize,
    mem: Option<Arc<GuestMemory>>,
    /// Counts the memory tables mapped, so that drivers on an older one are rebuilt.
    table: u32,
    /// The data area (guest address, length) and the next free offset in it.
    data: (u64, u64),
    cursor: u64,
    vrings: Vec<Vring>,
    token: u32,
    /// Chains the drivers took, and used entries they got back.
    pub posted: usize,
    pub used: usize,
    patience: Patience,
    waited: Duration,
}

impl Guest {
    pub fn new(device: &Device, port: Port, patience: Patience) -> Guest {
        Guest {
            port,
            pairs: device.pairs() as usize,
            mem: None,
            table: 0,
            data: (0, 0),
            cursor: 0,
            vrings: (0..device.num_queues()).map(|_| Vring::default()).collect(),
            token: 0,
            posted: 0,
            used: 0,
            patience,
            waited: Duration::ZERO,
        }
    }

    /// Follows message `m`, sent with `attached`: a memory table is mapped, a virtqueue's size,
    /// rings and kick eventfd recorded. Whatever else was attached is dropped.
    pub fn sent(&mut self, m: &Message, attached: Vec<Attached>) {
        // The backend sees another body than the one built: nothing to follow.
        let bytes = m.body.bytes();
        if !matches!(m.size, Size::Body)
            && !matches!(m.size, Size::Raw(n) if n as usize == bytes.len())
        {
            return;
        }
        match (m.request.code(), &m.body) {
            (code::SET_MEM_TABLE, Body::MemTable(regions)) => self.map(regions, attached),
            (code::SET_VRING_NUM, &Body::State { index, num }) => {
                if let Some(v) = self.vrings.get_mut(index as usize) {
                    v.num = num;
                }
            }
            (
                code::SET_VRING_ADDR,
                &Body::Addr {
                    index,
                    desc,
                    used,
                    avail,
                    ..
                },
            ) => {
                if let Some(v) = self.vrings.get_mut(index as usize) {
                    v.addrs = Some([desc.get(), used.get(), avail.get()]);
                }
            }
            (code::SET_VRING_KICK, &Body::U64(v)) => {
                let Some(vring) = self.vrings.get_mut((v & 0xff) as usize) else {
                    return;
                };
                vring.kick = attached.into_iter().find_map(|a| match a {
                    Attached::Eventfd(e) if v & NOFD == 0 => Some(e),
                    _ => None,
                });
            }
            _ => {}
        }
    }

    /// Maps a memory table from the memfds sent with it, as the backend does; a table that
    /// does not map leaves the last one in place (the backend refuses it too).
    fn map(&mut self, regions: &[Region], attached: Vec<Attached>) {
        let files: Vec<_> = attached
            .iter()
            .filter_map(|a| match a {
                Attached::Memfd(m) => m.regions().next()?.file?.try_clone().ok(),
                _ => None,
            })
            .collect();
        if files.len() != attached.len() || files.len() != regions.len() {
            return;
        }
        let sources = regions
            .iter()
            .zip(files)
            .map(|(r, file)| {
                let [guest, size, user, offset] = r.fields();
                RegionSource {
                    guest_addr: GuestAddress(guest),
                    size,
                    user_addr: user,
                    file,
                    mmap_offset: offset,
                }
            })
            .collect();
        let Ok(mem) = GuestMemory::from_sources(sources) else {
            return;
        };
        let lowest = mem.regions().next().expect("a table has regions");
        let half = lowest.size / 2;
        self.data = (lowest.guest_addr.0 + half, lowest.size - half);
        self.cursor = 0;
        self.mem = Some(Arc::new(mem));
        self.table += 1;
    }

    pub fn apply(&mut self, device: &Device, op: &GuestOp) {
        let n = self.vrings.len();
        match op {
            GuestOp::Tx {
                queue,
                frame,
                readable,
                writable,
            } => {
                let Some(mem) = self.mem.clone() else { return };
                let features = negotiated(device);
                let hdr_len = vnet::hdr_len(features);
                let out = self.place(&mem, readable, &frame.bytes(hdr_len));
                let in_ = self.place(&mem, writable, &[]);
                check_header(&mem, &out, features);
                self.add(device, *queue as usize % n, &out, &in_);
            }
            GuestOp::Rx {
                queue,
                count,
                readable,
                writable,
            } => {
                let Some(mem) = self.mem.clone() else { return };
                for _ in 0..=count % 64 {
                    let out = self.place(&mem, readable, &[]);
                    let in_ = self.place(&mem, writable, &[]);
                    if !self.add(device, *queue as usize % n, &out, &in_) {
                        break;
                    }
                }
            }
            GuestOp::Kick(queue) => {
                let v = &mut self.vrings[*queue as usize % n];
                if let Some((_, Some(d))) = v.driver.as_mut() {
                    d.kick_prepare();
                }
                if let Some(k) = &v.kick {
                    // A kick the device has not read yet stays pending: nothing is lost.
                    let _ = k.write(1);
                }
            }
            GuestOp::Settle => self.settle(),
        }
    }

    /// The buffers of `segments`, with `bytes` written across the `Data` ones in order.
    fn place(&mut self, mem: &GuestMemory, segments: &[Segment], bytes: &[u8]) -> Vec<Buf> {
        let mut rest = bytes;
        segments
            .iter()
            .map(|s| match *s {
                Segment::Data(len) => {
                    let (base, size) = self.data;
                    if self.cursor + len as u64 > size {
                        self.cursor = 0;
                    }
                    let addr = GuestAddress(base + self.cursor);
                    self.cursor += len as u64;
                    let k = rest.len().min(len as usize);
                    // Bytes off the end of memory are not written: the device refuses the
                    // buffer anyway.
                    let _ = mem.write(addr, &rest[..k]);
                    rest = &rest[k..];
                    Buf::new(addr, len as u32)
                }
                Segment::Raw { addr, len } => Buf::new(GuestAddress(addr), len),
            })
            .collect()
    }

    /// Posts a chain on virtqueue `q`; false if the driver cannot take it.
    fn add(&mut self, device: &Device, q: usize, out: &[Buf], in_: &[Buf]) -> bool {
        let token = self.token;
        self.token = self.token.wrapping_add(1);
        let Some(d) = self.driver(device, q) else {
            return false;
        };
        let taken = d.add(out, in_, token).is_ok();
        self.posted += taken as usize;
        taken
    }

    /// The driver on virtqueue `q` as the frontend last set it up, built (and its rings
    /// initialised, whatever the device is doing with them) when that setup changed.
    fn driver(&mut self, device: &Device, q: usize) -> Option<&mut DriverQueue<u32>> {
        let mem = self.mem.clone()?;
        let features = negotiated(device);
        let v = &mut self.vrings[q];
        let key = Key {
            table: self.table,
            num: v.num,
            addrs: v.addrs,
            features: features.0,
        };
        if v.driver.as_ref().map(|(k, _)| *k) != Some(key) {
            v.driver = Some((key, build_driver(mem, v.num, v.addrs, features)));
        }
        v.driver.as_mut()?.1.as_mut()
    }

    /// Takes back used buffers as they come, until the device has had time to do what it can:
    /// nothing is left where the device has work (tx chains, and rx buffers behind the null
    /// port, which fills them unasked), or nothing came back for a while.
    fn settle(&mut self) {
        let left = self.patience.per_input.saturating_sub(self.waited);
        let limit = left.min(self.patience.per_settle);
        let start = Instant::now();
        let mut last = start;
        loop {
            if self.reap() {
                last = Instant::now();
            }
            if self.patience.early && !self.device_has_work() {
                break;
            }
            let now = Instant::now();
            if now - start >= limit || now - last >= self.patience.quiet {
                break;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        self.waited += start.elapsed();
    }

    /// Takes back every used buffer there is; whether there was any.
    fn reap(&mut self) -> bool {
        let before = self.used;
        for v in &mut self.vrings {
            if let Some((_, Some(d))) = v.driver.as_mut() {
                // A device that confuses the driver breaks it; the guest goes on without it.
                while let Ok(Some(_)) = d.get_used() {
                    self.used += 1;
                }
            }
        }
        self.used > before
    }

    /// Whether chains are in flight where the device would use them without the guest doing
    /// more: anywhere but the rx queues of the echo port, which wait for tx.
    fn device_has_work(&self) -> bool {
        self.vrings.iter().enumerate().any(|(i, v)| {
            let waits_for_tx = matches!(self.port, Port::Echo) && i < 2 * self.pairs && i % 2 == 0;
            let in_flight = match &v.driver {
                Some((_, Some(d))) => d.broken().is_none() && d.in_flight() > 0,
                _ => false,
            };
            in_flight && !waits_for_tx
        })
    }
}

/// The features the device negotiated (none before SET_FEATURES).
fn negotiated(device: &Device) -> Features {
    device.shared().features()
}

fn build_driver(
    mem: Arc<GuestMemory>,
    num: u32,
    addrs: Option<[u64; 3]>,
    features: Features,
) -> Option<DriverQueue<u32>> {
    let [desc, used, avail] = addrs?.map(|a| mem.user_to_guest(a));
    let rings = RingAddresses {
        desc: desc?,
        avail: avail?,
        used: used?,
    };
    let config = QueueConfig::new(num, rings, features).ok()?;
    DriverQueue::activate(&config, mem, None).ok()
}

/// Reads the header of a tx chain's readable buffers `out` as the TAP port does and puts it
/// through `check_tx` ([`tx_header::assert_checked`]). A chain the device would refuse
/// (a buffer outside memory) or that is shorter than its header never gets that far.
fn check_header(mem: &GuestMemory, out: &[Buf], features: Features) {
    let hdr_len = vnet::hdr_len(features);
    if out.iter().any(|b| !mem.contains(b.addr, b.len as u64)) {
        return;
    }
    let total: u64 = out.iter().map(|b| b.len as u64).sum();
    if total < hdr_len as u64 {
        return;
    }
    let mut hdr = [0u8; vnet::HDR_LEN];
    let mut at = 0;
    for b in out {
        if at == hdr_len {
            break;
        }
        let n = (b.len as usize).min(hdr_len - at);
        mem.read(b.addr, &mut hdr[at..at + n])
            .expect("a buffer inside memory reads");
        at += n;
    }
    let frame_len = (total - hdr_len as u64) as usize;
    tx_header::assert_checked(&vnet::NetHdr::from_bytes(&hdr), features, frame_len);
}
