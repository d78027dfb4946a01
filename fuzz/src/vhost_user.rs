//! The `vhost_user` target: the backend's vhost-user protocol handler (rust-vmm `vhost`'s
//! message layer dispatching to `virtnet_backend::vhost::Connection`) facing a hostile
//! frontend, through a real unix socket pair and the same per-request loop as the backend's
//! accept loop (`virtnet_backend::Session::serve_one`).
//!
//! The input is a list of messages: a request code (one of those the spec defines, most of the
//! time), header flags, a body built field by field (memory tables, ring addresses, ring
//! states, config ranges) or raw, a header size that usually matches the body and sometimes
//! does not, and the file descriptors a real frontend attaches (memfds for memory tables,
//! eventfds for kick/call/err, a socket for the backend channel) or others. Each message goes
//! out in one `sendmsg`, then the backend handles one request. An optional tail of raw bytes
//! ends the stream (a truncated or garbage message before the frontend hangs up). The
//! harness checks:
//!
//! - nothing panics and nothing hangs (libFuzzer's `-timeout`);
//! - every reply the backend sends is a well-formed reply to the request just sent, at most
//!   one per request;
//! - the device state stays in bounds (active pairs in 1..=pairs);
//! - if the connection is still open after the messages, it answers a fresh GET_FEATURES
//!   with the device's features; once it closes, the frontend sees the socket closed, and a
//!   new connection to the same device answers GET_FEATURES correctly (the workers survived
//!   the stop of every queue).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use arbitrary::Arbitrary;
use virtnet_backend::{BackendConfig, Device, IoMode, Session};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;
use vring::{GuestAddress, GuestMemory};

use crate::encode::{variant, Encode};
use crate::encode_struct;

/// vhost-user request codes (spec, "Front-end message types").
pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_INFLIGHT_FD: u32 = 32;
    pub const ADD_MEM_REG: u32 = 37;
    pub const SET_DEVICE_STATE_FD: u32 = 42;
    /// The highest code the spec defines (GET_SHMEM_CONFIG).
    pub const LAST: u32 = 44;
}

/// Header flags: version 1 in the low bits, then REPLY and NEED_REPLY.
pub const VERSION_1: u32 = 0x1;
pub const REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;
pub const HEADER_LEN: usize = 12;
/// The message layer's body limit.
pub const MAX_BODY: usize = 0x1000;
/// VHOST_USER_F_PROTOCOL_FEATURES.
pub const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;
/// VHOST_USER_VRING_NOFD_MASK: the kick/call/err message carries no fd.
pub const NOFD: u64 = 0x100;
/// Every memfd the harness sends is this big.
pub const MEMFD_PAGES: u8 = 16;
const PAGE: u64 = 4096;

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Code `1 + n % LAST`: one the spec defines.
    Known(u8),
    Raw(u32),
}

impl Request {
    pub fn code(self) -> u32 {
        match self {
            Request::Known(n) => 1 + n as u32 % code::LAST,
            Request::Raw(c) => c,
        }
    }
    /// The `Known` request for `code`.
    pub fn of(code: u32) -> Request {
        Request::Known((code - 1) as u8)
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flags {
    /// Version 1.
    Plain,
    /// Version 1 and NEED_REPLY (answered when REPLY_ACK is negotiated).
    NeedReply,
    Raw(u32),
}

impl Flags {
    pub fn bits(self) -> u32 {
        match self {
            Flags::Plain => VERSION_1,
            Flags::NeedReply => VERSION_1 | NEED_REPLY,
            Flags::Raw(f) => f,
        }
    }
}

/// A memory region: page-granular, against memfds of `MEMFD_PAGES` pages, or raw.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Region {
    Pages {
        guest_page: u16,
        pages: u8,
        user_page: u16,
        offset_pages: u8,
    },
    Raw {
        guest: u64,
        size: u64,
        user: u64,
        offset: u64,
    },
}

impl Region {
    /// guest_phys_addr, memory_size, userspace_addr, mmap_offset.
    pub fn fields(self) -> [u64; 4] {
        match self {
            Region::Pages {
                guest_page,
                pages,
                user_page,
                offset_pages,
            } => [
                guest_page as u64 * PAGE,
                pages as u64 * PAGE,
                user_page as u64 * PAGE,
                offset_pages as u64 * PAGE,
            ],
            Region::Raw {
                guest,
                size,
                user,
                offset,
            } => [guest, size, user, offset],
        }
    }
}

/// A ring address in the frontend's address space: `page * 4096 + offset`, so it can land
/// inside a `Region::Pages`.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserAddr {
    pub page: u16,
    pub offset: u16,
}
encode_struct!(UserAddr { page, offset });

impl UserAddr {
    pub fn get(self) -> u64 {
        self.page as u64 * PAGE + self.offset as u64
    }
}

#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Body {
    Empty,
    /// VhostUserU64: features, or a ring index and the NOFD flag for kick/call/err.
    U64(u64),
    /// VhostUserVringState: index, num (size, base, enable).
    State {
        index: u32,
        num: u32,
    },
    /// VhostUserVringAddr.
    Addr {
        index: u32,
        flags: u32,
        desc: UserAddr,
        used: UserAddr,
        avail: UserAddr,
        log: u64,
    },
    /// VhostUserMemory: the region count, padding, the regions.
    MemTable(Vec<Region>),
    /// VhostUserConfig for GET_CONFIG: offset, size, flags, then `size` zero bytes.
    ConfigRead {
        offset: u8,
        size: u8,
    },
    Raw(Vec<u8>),
}

impl Body {
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Body::Empty => {}
            Body::U64(v) => b.extend(v.to_le_bytes()),
            Body::State { index, num } => {
                b.extend(index.to_le_bytes());
                b.extend(num.to_le_bytes());
            }
            Body::Addr {
                index,
                flags,
                desc,
                used,
                avail,
                log,
            } => {
                b.extend(index.to_le_bytes());
                b.extend(flags.to_le_bytes());
                for v in [desc.get(), used.get(), avail.get(), *log] {
                    b.extend(v.to_le_bytes());
                }
            }
            Body::MemTable(regions) => {
                b.extend((regions.len() as u32).to_le_bytes());
                b.extend(0u32.to_le_bytes());
                for r in regions {
                    for v in r.fields() {
                        b.extend(v.to_le_bytes());
                    }
                }
            }
            Body::ConfigRead { offset, size } => {
                b.extend((*offset as u32).to_le_bytes());
                b.extend((*size as u32).to_le_bytes());
                b.extend(0u32.to_le_bytes());
                b.resize(b.len() + *size as usize, 0);
            }
            Body::Raw(r) => b.extend(r),
        }
        b
    }
}

/// What the header's size field says.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// The body's length.
    Body,
    /// `n`; the body is cut or zero-padded to it. Above `MAX_BODY` only the header is sent
    /// (the message layer refuses it before reading on).
    Raw(u16),
}

/// The file descriptors attached to a message.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fds {
    /// What a real frontend attaches: a memfd per region of a memory table, an eventfd for
    /// kick/call/err (none when the body says NOFD), one memfd where the message takes a
    /// file, a socket for the backend channel.
    Auto,
    None,
    Eventfd,
    /// `n % 4` memfds.
    Memfds(u8),
}

#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub request: Request,
    pub flags: Flags,
    pub body: Body,
    pub size: Size,
    pub fds: Fds,
}
encode_struct!(Message {
    request,
    flags,
    body,
    size,
    fds
});

/// A whole `vhost_user` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct VhostInput {
    /// Queue pairs `1 + pairs % 2`.
    pub pairs: u8,
    pub messages: Vec<Message>,
    /// Raw bytes sent after the messages, before the frontend hangs up.
    pub tail: Option<Vec<u8>>,
}
encode_struct!(VhostInput {
    pairs,
    messages,
    tail
});

impl Encode for Request {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Known(n) => (variant(0, 2, out), n.encode(out)).1,
            Request::Raw(c) => (variant(1, 2, out), c.encode(out)).1,
        }
    }
}

impl Encode for Flags {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Flags::Plain => variant(0, 3, out),
            Flags::NeedReply => variant(1, 3, out),
            Flags::Raw(f) => (variant(2, 3, out), f.encode(out)).1,
        }
    }
}

impl Encode for Region {
    fn encode(&self, out: &mut Vec<u8>) {
        match *self {
            Region::Pages {
                guest_page,
                pages,
                user_page,
                offset_pages,
            } => {
                variant(0, 2, out);
                guest_page.encode(out);
                pages.encode(out);
                user_page.encode(out);
                offset_pages.encode(out);
            }
            Region::Raw {
                guest,
                size,
                user,
                offset,
            } => {
                variant(1, 2, out);
                [guest, size, user, offset]
                    .iter()
                    .for_each(|v| v.encode(out));
            }
        }
    }
}

impl Encode for Body {
    fn encode(&self, out: &mut Vec<u8>) {
        const N: u32 = 7;
        match self {
            Body::Empty => variant(0, N, out),
            Body::U64(v) => (variant(1, N, out), v.encode(out)).1,
            Body::State { index, num } => {
                variant(2, N, out);
                index.encode(out);
                num.encode(out);
            }
            Body::Addr {
                index,
                flags,
                desc,
                used,
                avail,
                log,
            } => {
                variant(3, N, out);
                index.encode(out);
                flags.encode(out);
                desc.encode(out);
                used.encode(out);
                avail.encode(out);
                log.encode(out);
            }
            Body::MemTable(r) => (variant(4, N, out), r.encode(out)).1,
            Body::ConfigRead { offset, size } => {
                variant(5, N, out);
                offset.encode(out);
                size.encode(out);
            }
            Body::Raw(r) => (variant(6, N, out), r.encode(out)).1,
        }
    }
}

impl Encode for Size {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Size::Body => variant(0, 2, out),
            Size::Raw(n) => (variant(1, 2, out), n.encode(out)).1,
        }
    }
}

impl Encode for Fds {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Fds::Auto => variant(0, 4, out),
            Fds::None => variant(1, 4, out),
            Fds::Eventfd => variant(2, 4, out),
            Fds::Memfds(n) => (variant(3, 4, out), n.encode(out)).1,
        }
    }
}

/// What a run did, for the seed tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Messages the backend handled before the connection closed (all of them if it did not).
    pub handled: usize,
    pub closed: bool,
    /// Replies received, by request code.
    pub replies: Vec<u32>,
}

/// Whatever is attached to one message; dropped once sent (the backend has its own copies).
enum Attached {
    Memfd(GuestMemory),
    Eventfd(EventFd),
    Socket(UnixStream),
}

impl Attached {
    fn memfd() -> Attached {
        let size = MEMFD_PAGES as usize * PAGE as usize;
        Attached::Memfd(GuestMemory::memfd(&[(GuestAddress(0), size)]).expect("memfd"))
    }
    fn raw_fd(&self) -> RawFd {
        match self {
            Attached::Memfd(m) => m.regions().next().unwrap().file.unwrap().as_raw_fd(),
            Attached::Eventfd(e) => e.as_raw_fd(),
            Attached::Socket(s) => s.as_raw_fd(),
        }
    }
}

fn attachments(m: &Message) -> Vec<Attached> {
    let eventfd = || Attached::Eventfd(EventFd::new(0).expect("eventfd"));
    match m.fds {
        Fds::None => Vec::new(),
        Fds::Eventfd => vec![eventfd()],
        Fds::Memfds(n) => (0..n % 4).map(|_| Attached::memfd()).collect(),
        Fds::Auto => match (m.request.code(), &m.body) {
            (code::SET_MEM_TABLE, Body::MemTable(r)) => {
                r.iter().take(8).map(|_| Attached::memfd()).collect()
            }
            (code::SET_VRING_KICK | code::SET_VRING_CALL | code::SET_VRING_ERR, b) => match b {
                Body::U64(v) if v & NOFD != 0 => Vec::new(),
                _ => vec![eventfd()],
            },
            (
                code::SET_LOG_BASE
                | code::SET_LOG_FD
                | code::SET_INFLIGHT_FD
                | code::ADD_MEM_REG
                | code::SET_DEVICE_STATE_FD,
                _,
            ) => vec![Attached::memfd()],
            (code::SET_BACKEND_REQ_FD, _) => {
                vec![Attached::Socket(UnixStream::pair().expect("socketpair").0)]
            }
            _ => Vec::new(),
        },
    }
}

/// The bytes of one message: header and body.
fn wire(m: &Message) -> Vec<u8> {
    let mut body = m.body.bytes();
    let size = match m.size {
        Size::Body => body.len() as u32,
        Size::Raw(n) => n as u32,
    };
    if size as usize > MAX_BODY {
        body.clear();
    } else {
        body.resize(size as usize, 0);
    }
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend(m.request.code().to_le_bytes());
    b.extend(m.flags.bits().to_le_bytes());
    b.extend(size.to_le_bytes());
    b.extend(body);
    b
}

/// A connection of the backend: the frontend's socket end and the backend's session.
struct Conn {
    frontend: UnixStream,
    session: Session,
}

impl Conn {
    fn open(device: &Arc<Device>) -> Conn {
        let (frontend, backend_end) = UnixStream::pair().expect("socketpair");
        frontend.set_nonblocking(true).unwrap();
        let session = Session::new(device, backend_end).expect("session");
        Conn { frontend, session }
    }

    /// One request, as `serve_connection` handles it; false: the connection closed.
    fn serve(&mut self) -> bool {
        self.session.serve_one()
    }

    /// What `serve_connection` does when its loop ends.
    fn close(&mut self) {
        self.session.close();
    }

    /// Everything the backend sent so far; `true` when it has closed its end, too.
    fn received(&mut self) -> (Vec<u8>, bool) {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.frontend.read(&mut buf) {
                // A close with our bytes still unread reaches us as a reset.
                Ok(0) => return (got, true),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
                Ok(n) => got.extend(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return (got, false),
                Err(e) => panic!("reading replies: {e}"),
            }
        }
    }
}

/// Splits what the backend sent after request `code` into replies, checking each.
fn check_replies(bytes: &[u8], code: u32, replies: &mut Vec<u32>) {
    let mut rest = bytes;
    let mut n = 0;
    while !rest.is_empty() {
        assert!(
            rest.len() >= HEADER_LEN,
            "truncated reply header: {rest:02x?}"
        );
        let word = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().unwrap());
        let (req, flags, size) = (word(0), word(4), word(8) as usize);
        assert_eq!(req, code, "a reply to another request");
        assert_eq!(flags, VERSION_1 | REPLY, "reply flags");
        assert!(size <= MAX_BODY, "reply body of {size} bytes");
        assert!(rest.len() >= HEADER_LEN + size, "truncated reply body");
        rest = &rest[HEADER_LEN + size..];
        replies.push(req);
        n += 1;
    }
    assert!(n <= 1, "{n} replies to one request {code}");
}

/// GET_FEATURES on an open connection must answer the device's features.
fn assert_answers_get_features(c: &mut Conn, device: &Device) {
    let m = Message {
        request: Request::of(code::GET_FEATURES),
        flags: Flags::Plain,
        body: Body::Empty,
        size: Size::Body,
        fds: Fds::None,
    };
    c.frontend.write_all(&wire(&m)).unwrap();
    assert!(c.serve(), "GET_FEATURES closed the connection");
    let (got, _) = c.received();
    let want = device.offered_features().0 | PROTOCOL_FEATURES_BIT;
    let mut reply = Vec::new();
    reply.extend(code::GET_FEATURES.to_le_bytes());
    reply.extend((VERSION_1 | REPLY).to_le_bytes());
    reply.extend(8u32.to_le_bytes());
    reply.extend(want.to_le_bytes());
    assert_eq!(got, reply, "GET_FEATURES reply");
}

fn check_bounds(device: &Device) {
    let r = device.device_report();
    assert!(
        (1..=r.pairs).contains(&r.active_pairs),
        "{} active pairs of {}",
        r.active_pairs,
        r.pairs
    );
}

/// The `vhost_user` fuzz target's body.
pub fn run(input: &VhostInput) -> Outcome {
    let device = Device::new(BackendConfig {
        pairs: 1 + (input.pairs % 2) as u16,
        io: IoMode::Null { size: 64 },
        ..BackendConfig::default()
    })
    .expect("device");
    let mut out = Outcome::default();
    let mut c = Conn::open(&device);
    for m in &input.messages {
        let bytes = wire(m);
        let attached = attachments(m);
        let fds: Vec<RawFd> = attached.iter().map(Attached::raw_fd).collect();
        // The socket buffer holds far more than one message and its reply.
        let sent = c.frontend.send_with_fds(&[&bytes[..]], &fds).expect("send");
        assert_eq!(sent, bytes.len());
        drop(attached);
        let open = c.serve();
        let (got, eof) = c.received();
        check_replies(&got, m.request.code(), &mut out.replies);
        check_bounds(&device);
        if !open {
            out.closed = true;
            assert!(
                eof || c.received().1,
                "the backend closed without closing its end"
            );
            break;
        }
        out.handled += 1;
    }
    if !out.closed {
        match &input.tail {
            None => assert_answers_get_features(&mut c, &device),
            Some(tail) => {
                c.frontend.set_nonblocking(false).unwrap();
                c.frontend.write_all(tail).unwrap();
                c.frontend.shutdown(Shutdown::Write).unwrap();
                c.frontend.set_nonblocking(true).unwrap();
                // Each request consumes bytes; at the end of the stream it closes.
                while c.serve() {}
                out.closed = true;
            }
        }
    }
    c.close();
    check_bounds(&device);
    // The next frontend finds the device serving.
    let mut next = Conn::open(&device);
    assert_answers_get_features(&mut next, &device);
    next.close();
    out
}
