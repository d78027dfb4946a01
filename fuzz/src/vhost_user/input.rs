//! The `vhost_user` input: the host port, messages built field by field or raw (and what each
//! becomes on the wire), sent whole, in two pieces or cut short, the guest traffic between
//! them ([`super::traffic`]), and the encoding the seed tests write (`crate::encode`).

use arbitrary::Arbitrary;
use virtnet_backend::IoMode;

use super::protocol::{code, HEADER_LEN, MAX_BODY, NEED_REPLY, VERSION_1};
use super::traffic::GuestOp;
use crate::encode::{variant, Encode};
use crate::encode_struct;

/// Every memfd the harness sends is this big.
pub const MEMFD_PAGES: u8 = 16;
pub(super) const PAGE: u64 = 4096;

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
    /// `n % 64` copies of one eventfd: from 33 on, more than the message layer takes.
    Many(u8),
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

/// The host port behind every pair of the device.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// Guest tx comes back on guest rx.
    Echo,
    /// Guest tx is dropped; guest rx is filled with a generated frame of `n % (MAX_NULL_FRAME
    /// + 1)` bytes after the header (at least 60).
    Null(u16),
}

/// The largest null frame, after the header: a jumbo frame.
pub const MAX_NULL_FRAME: u16 = 9000;

impl Port {
    pub fn io_mode(self) -> IoMode {
        match self {
            Port::Echo => IoMode::Echo,
            Port::Null(n) => IoMode::Null {
                size: (n % (MAX_NULL_FRAME + 1)) as usize,
            },
        }
    }
}

/// One step of the hostile frontend: a message on the socket, or its guest's traffic.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Message(Message),
    Guest(GuestOp),
    /// The first `cut % len` bytes of the message (with its descriptors), then nothing more:
    /// the backend must drop the connection at its deadline, and the steps end. No byte at
    /// all (silence) only before the connection has spoken: after, silence is idling, which
    /// the backend waits out for good, so at least one byte goes.
    Stall {
        message: Message,
        cut: u16,
    },
    /// The message in two writes, the first of `1 + at % (len - 1)` bytes, its descriptors
    /// with the first or (`fds_later`) the second: handled as a whole message, or the
    /// connection dropped when the layer could not read it so (descriptors inside its
    /// header or its body).
    Split {
        message: Message,
        at: u16,
        fds_later: bool,
    },
}

/// A whole `vhost_user` input.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct VhostInput {
    /// Queue pairs `1 + pairs % 2`.
    pub pairs: u8,
    pub port: Port,
    pub steps: Vec<Step>,
    /// Raw bytes sent after the steps, before the frontend hangs up.
    pub tail: Option<Vec<u8>>,
}
encode_struct!(VhostInput {
    pairs,
    port,
    steps,
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
            Fds::Auto => variant(0, 5, out),
            Fds::None => variant(1, 5, out),
            Fds::Eventfd => variant(2, 5, out),
            Fds::Memfds(n) => (variant(3, 5, out), n.encode(out)).1,
            Fds::Many(n) => (variant(4, 5, out), n.encode(out)).1,
        }
    }
}

impl Encode for Port {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Port::Echo => variant(0, 2, out),
            Port::Null(n) => (variant(1, 2, out), n.encode(out)).1,
        }
    }
}

impl Encode for Step {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Step::Message(m) => (variant(0, 4, out), m.encode(out)).1,
            Step::Guest(g) => (variant(1, 4, out), g.encode(out)).1,
            Step::Stall { message, cut } => {
                variant(2, 4, out);
                message.encode(out);
                cut.encode(out);
            }
            Step::Split {
                message,
                at,
                fds_later,
            } => {
                variant(3, 4, out);
                message.encode(out);
                at.encode(out);
                fds_later.encode(out);
            }
        }
    }
}

/// The bytes of one message: header and body.
pub(super) fn wire(m: &Message) -> Vec<u8> {
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
