//! The liveness oracle: after the hostile frontend has gone, a well-behaved one connects to the
//! same device (a new session, as the accept loop opens one), sets up every queue pair as QEMU
//! does, each request acknowledged (REPLY_ACK), and runs an honest driver on them. Within
//! [`DEADLINE`] a frame must move both ways on every pair, and the device must call for it:
//!
//! - echo port: the one tx frame sent comes back used, and on rx, byte for byte (the header's
//!   `num_buffers` is the device's, 1);
//! - null port: the tx frame comes back used, and the generated frame arrives on rx whole, its
//!   `num_buffers` buffers adding up to its length.
//!
//! A protocol thread that still answers while a worker is hung or spinning on a frame, a queue
//! left stopped or broken for the next frontend, or a lost call fails here.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet_backend::{Device, IoMode};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vnet::feature;
use vring::{Buf, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig, RingAddresses};

use super::input::{Port, MAX_NULL_FRAME};
use super::protocol::{
    code, protocol_feature, HEADER_LEN, NEED_REPLY, PROTOCOL_FEATURES_BIT, VERSION_1,
};
use super::{assert_answers_get_features, check_replies, Conn};

/// How long the honest frontend waits for its frames.
pub const DEADLINE: Duration = Duration::from_secs(1);

const QUEUE_SIZE: u16 = 64;
/// The honest guest's memory: virtqueue `i`'s rings at page `i` (descriptors, avail at +0x400,
/// used at +0x800), each pair's tx frame in a page from `TX_FRAMES`, its rx buffers from
/// `RX_BUFFERS`.
const MEM_SIZE: usize = 0x1_0000;
const TX_FRAMES: u64 = 0x4000;
const RX_BUFFERS: u64 = 0x8000;
const RX_POSTED: u32 = 8;
const RX_BUF: u32 = 2048;
// The null port's largest frame fits the buffers posted.
const _: () = assert!(MAX_NULL_FRAME as u32 + vnet::HDR_LEN as u32 <= RX_POSTED * RX_BUF);
const _: () = assert!(RX_BUFFERS + 2 * (RX_POSTED * RX_BUF) as u64 <= MEM_SIZE as u64);

fn rings(vq: usize) -> RingAddresses {
    let page = GuestAddress(vq as u64 * 0x1000);
    RingAddresses {
        desc: page,
        avail: GuestAddress(page.0 + 0x400),
        used: GuestAddress(page.0 + 0x800),
    }
}

fn rx_buffer(pair: usize, token: u32) -> GuestAddress {
    GuestAddress(RX_BUFFERS + (pair as u32 * RX_POSTED * RX_BUF + token * RX_BUF) as u64)
}

/// The echo frame of `pair`: a plain header, then a broadcast frame from a MAC naming the pair.
fn tx_frame(pair: usize) -> Vec<u8> {
    let mut f = vec![0u8; vnet::HDR_LEN];
    f.extend([0xff; 6]);
    f.extend([0x02, 0, 0, 0, 1, pair as u8]);
    f.extend(0x88b5u16.to_be_bytes());
    f.extend((0..50).map(|i| i ^ pair as u8));
    f
}

/// One virtqueue of the honest frontend.
struct Vq {
    driver: DriverQueue<u32>,
    kick: EventFd,
    call: EventFd,
    /// Whether the device called since the guest started waiting (spurious calls count too:
    /// the spec allows them).
    called: bool,
    /// Used entries, as (token, length).
    used: Vec<(u32, u32)>,
}

impl Vq {
    fn kick(&mut self) {
        if self.driver.kick_prepare() {
            self.kick.write(1).expect("kick");
        }
    }
}

struct Honest<'a> {
    device: &'a Device,
    port: Port,
    conn: Conn,
    mem: Arc<GuestMemory>,
    vqs: Vec<Vq>,
}

/// A frame must move on every pair of `device` for a well-behaved frontend; panics if not.
/// The connection is left open: the device is dropped next, which shuts its workers down,
/// and stopping each queue first would cost a third of the check.
pub(super) fn assert_live(device: &Arc<Device>, port: Port) {
    let mut h = Honest::set_up(device, port);
    h.send_frames();
    h.wait_for_frames();
    h.check_frames();
}

fn u64_body(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// VhostUserVringState.
fn state(index: u32, num: u32) -> Vec<u8> {
    let mut b = index.to_le_bytes().to_vec();
    b.extend(num.to_le_bytes());
    b
}

impl<'a> Honest<'a> {
    /// Connects and sets up every pair as QEMU does, with REPLY_ACK: every request after the
    /// negotiation must be acknowledged as done.
    fn set_up(device: &'a Arc<Device>, port: Port) -> Honest<'a> {
        let mut conn = Conn::open(device);
        assert_answers_get_features(&mut conn, device);
        let mut features = Features::VERSION_1 | feature::MRG_RXBUF;
        if device.pairs() > 1 {
            features = features | feature::MQ;
        }
        let mem = GuestMemory::memfd(&[(GuestAddress(0), MEM_SIZE)]).expect("memfd");
        let mut h = Honest {
            device,
            port,
            conn,
            mem: Arc::new(mem),
            vqs: Vec::new(),
        };
        let acked = features.0 | PROTOCOL_FEATURES_BIT;
        h.request(code::SET_FEATURES, false, &u64_body(acked), &[]);
        h.request(code::GET_PROTOCOL_FEATURES, false, &[], &[]);
        let protocol = protocol_feature::MQ
            | protocol_feature::REPLY_ACK
            | protocol_feature::MTU
            | protocol_feature::CONFIG;
        h.request(code::SET_PROTOCOL_FEATURES, false, &u64_body(protocol), &[]);
        h.acked(code::SET_OWNER, &[], &[]);
        let mem = h.mem.clone();
        let r = mem.regions().next().expect("one region");
        let mut table = 1u32.to_le_bytes().to_vec();
        table.extend(0u32.to_le_bytes());
        for v in [r.guest_addr.0, r.size, r.user_addr, r.file_offset] {
            table.extend(v.to_le_bytes());
        }
        let memfd = r.file.expect("a memfd region").as_raw_fd();
        h.acked(code::SET_MEM_TABLE, &table, &[memfd]);
        for vq in 0..2 * device.pairs() as usize {
            h.set_up_vq(vq, features);
        }
        h
    }

    /// The frontend's address of guest address `a`, as ring addresses are sent.
    fn user(&self, a: GuestAddress) -> u64 {
        let r = self.mem.regions().next().expect("one region");
        r.user_addr + (a.0 - r.guest_addr.0)
    }

    /// Everything virtqueue `vq` needs, its kick, then its enable, which starts it (under
    /// protocol features the rings start disabled).
    fn set_up_vq(&mut self, vq: usize, features: Features) {
        let r = rings(vq);
        let config = QueueConfig::new(QUEUE_SIZE as u32, r, features).expect("queue config");
        let driver = DriverQueue::activate(&config, self.mem.clone(), None).expect("driver");
        let i = vq as u32;
        self.acked(code::SET_VRING_NUM, &state(i, QUEUE_SIZE as u32), &[]);
        let mut addr = i.to_le_bytes().to_vec();
        addr.extend(0u32.to_le_bytes());
        for v in [self.user(r.desc), self.user(r.used), self.user(r.avail), 0] {
            addr.extend(v.to_le_bytes());
        }
        self.acked(code::SET_VRING_ADDR, &addr, &[]);
        self.acked(code::SET_VRING_BASE, &state(i, 0), &[]);
        let kick = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let call = EventFd::new(EFD_NONBLOCK).expect("eventfd");
        let index = u64_body(vq as u64);
        self.acked(code::SET_VRING_CALL, &index, &[call.as_raw_fd()]);
        self.acked(code::SET_VRING_KICK, &index, &[kick.as_raw_fd()]);
        self.acked(code::SET_VRING_ENABLE, &state(i, 1), &[]);
        self.vqs.push(Vq {
            driver,
            kick,
            call,
            called: false,
            used: Vec::new(),
        });
    }

    /// Sends request `code` and serves it; the reply's body, if the backend sent one.
    fn request(
        &mut self,
        code: u32,
        need_reply: bool,
        body: &[u8],
        fds: &[RawFd],
    ) -> Option<Vec<u8>> {
        let flags = VERSION_1 | if need_reply { NEED_REPLY } else { 0 };
        let mut bytes = Vec::with_capacity(HEADER_LEN + body.len());
        bytes.extend(code.to_le_bytes());
        bytes.extend(flags.to_le_bytes());
        bytes.extend((body.len() as u32).to_le_bytes());
        bytes.extend(body);
        let sent = self
            .conn
            .frontend
            .send_with_fds(&[&bytes[..]], fds)
            .expect("send");
        assert_eq!(sent, bytes.len());
        assert!(
            self.conn.serve(),
            "liveness: the backend closed the connection of an honest frontend at request {code}"
        );
        let (got, _) = self.conn.received();
        check_replies(&got, code, &mut Vec::new());
        (!got.is_empty()).then(|| got[HEADER_LEN..].to_vec())
    }

    /// Sends request `code` asking for an acknowledgement, which must say done.
    fn acked(&mut self, code: u32, body: &[u8], fds: &[RawFd]) {
        let reply = self.request(code, true, body, fds);
        assert_eq!(
            reply,
            Some(u64_body(0)),
            "liveness: the backend did not acknowledge an honest frontend's request {code} as \
             done"
        );
    }

    /// On every pair: rx buffers posted, then one tx frame; kicked as the driver decides.
    fn send_frames(&mut self) {
        for p in 0..self.device.pairs() as usize {
            let rx = &mut self.vqs[2 * p];
            for token in 0..RX_POSTED {
                let buf = Buf::new(rx_buffer(p, token), RX_BUF);
                rx.driver.add(&[], &[buf], token).expect("rx buffer posted");
            }
            rx.kick();
            let frame = tx_frame(p);
            let at = GuestAddress(TX_FRAMES + p as u64 * 0x1000);
            self.mem.write(at, &frame).expect("tx frame written");
            let tx = &mut self.vqs[2 * p + 1];
            let buf = Buf::new(at, frame.len() as u32);
            tx.driver.add(&[buf], &[], 0).expect("tx frame posted");
            tx.kick();
        }
    }

    /// The length of the first frame on rx of `pair` once all its buffers are used: the
    /// sum of `num_buffers` used lengths.
    fn rx_frame_len(&self, pair: usize) -> Option<u64> {
        let used = &self.vqs[2 * pair].used;
        let &(first, _) = used.first()?;
        let mut hdr = [0u8; vnet::HDR_LEN];
        self.mem
            .read(rx_buffer(pair, first), &mut hdr)
            .expect("rx buffer read");
        let n = vnet::NetHdr::from_bytes(&hdr).num_buffers as usize;
        (n >= 1 && used.len() >= n).then(|| used[..n].iter().map(|&(_, len)| len as u64).sum())
    }

    /// Whether `pair` has moved its frames and the device called for both.
    fn moved(&self, pair: usize) -> bool {
        let (rx, tx) = (&self.vqs[2 * pair], &self.vqs[2 * pair + 1]);
        !tx.used.is_empty() && tx.called && rx.called && self.rx_frame_len(pair).is_some()
    }

    /// Waits for the frames of every pair, taking used entries as the device calls.
    fn wait_for_frames(&mut self) {
        let epoll = Epoll::new().expect("epoll");
        for (i, vq) in self.vqs.iter().enumerate() {
            let ev = EpollEvent::new(EventSet::IN, i as u64);
            epoll
                .ctl(ControlOperation::Add, vq.call.as_raw_fd(), ev)
                .expect("epoll add");
        }
        let pairs = self.device.pairs() as usize;
        let mut events = vec![EpollEvent::default(); self.vqs.len()];
        let deadline = Instant::now() + DEADLINE;
        loop {
            for (i, vq) in self.vqs.iter_mut().enumerate() {
                let used = |vq: &mut Vq| {
                    vq.driver.get_used().unwrap_or_else(|e| {
                        panic!("liveness: the device broke the honest driver of vq {i}: {e}")
                    })
                };
                while let Some(u) = used(vq) {
                    vq.used.push(u);
                }
            }
            if (0..pairs).all(|p| self.moved(p)) {
                return;
            }
            let now = Instant::now();
            if now >= deadline {
                self.not_live();
            }
            // Timeouts in whole milliseconds; a call ends the wait at once.
            let ms = (deadline - now).as_millis().clamp(1, 10) as i32;
            let n = epoll.wait(ms, &mut events).or_else(|e| match e.kind() {
                std::io::ErrorKind::Interrupted => Ok(0),
                _ => Err(e),
            });
            for ev in &events[..n.expect("epoll wait")] {
                let vq = &mut self.vqs[ev.data() as usize];
                let _ = vq.call.read();
                vq.called = true;
            }
        }
    }

    fn not_live(&self) -> ! {
        let pairs = self.device.pairs() as usize;
        let stuck: Vec<_> = (0..pairs).filter(|&p| !self.moved(p)).collect();
        let vqs: Vec<_> = self
            .vqs
            .iter()
            .enumerate()
            .map(|(i, vq)| format!("vq {i}: used {:?}, called {}", vq.used, vq.called))
            .collect();
        let queues: Vec<_> = self
            .device
            .reports()
            .iter()
            .map(|r| {
                let c = &r.counters;
                format!(
                    "{} {}: packets {}, dropped {}, kicks {}, calls {}, broken {:?}",
                    r.kind, r.index, c.packets, c.dropped, c.kicks, c.calls, c.broken
                )
            })
            .collect();
        panic!(
            "liveness: pair(s) {stuck:?} of {pairs} moved no frame within {DEADLINE:?} for an \
             honest frontend ({:?} port); the guest saw {vqs:?}; the device: {queues:?}",
            self.port
        );
    }

    /// The frames that came back are the ones the port sends.
    fn check_frames(&self) {
        for p in 0..self.device.pairs() as usize {
            let rx = &self.vqs[2 * p];
            let len = self.rx_frame_len(p).expect("waited for");
            match self.port {
                Port::Echo => {
                    let sent = tx_frame(p);
                    assert_eq!(
                        len,
                        sent.len() as u64,
                        "liveness: echo frame length, pair {p}"
                    );
                    let mut got = vec![0u8; sent.len()];
                    self.mem
                        .read(rx_buffer(p, rx.used[0].0), &mut got)
                        .expect("rx read");
                    let (nb, hdr) = (vnet::NUM_BUFFERS_OFFSET as usize, vnet::HDR_LEN);
                    assert_eq!(got[nb..hdr], 1u16.to_le_bytes(), "num_buffers, pair {p}");
                    assert_eq!(
                        got[hdr..],
                        sent[hdr..],
                        "liveness: echo frame bytes, pair {p}"
                    );
                }
                Port::Null(_) => {
                    let IoMode::Null { size } = self.port.io_mode() else {
                        unreachable!("a null port")
                    };
                    let want = (vnet::HDR_LEN + size.max(60)) as u64;
                    assert_eq!(len, want, "liveness: null frame length, pair {p}");
                }
            }
            let tx = &self.vqs[2 * p + 1];
            assert_eq!(tx.used[0], (0, 0), "liveness: tx used entry, pair {p}");
        }
    }
}
