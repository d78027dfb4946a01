//! The requests rust-vmm `vhost` 0.18 knows but does not dispatch to a backend, answered
//! before its message layer sees them: SET_STATUS and GET_STATUS ([`super::status`]),
//! NET_SET_MTU ([`super::mtu`]) and SEND_RARP ([`super::rarp`]). Its handler answers them like
//! unknown requests (an invalid message), and we would close the connection: a QEMU guest
//! with `host_mtu` would lose its backend at boot.
//!
//! The session peeks at each request header ([`Header::peek`]) once its gate has seen the
//! whole message on the socket; for one of these it takes the message off the socket here, framed by [`vnet::vhost_wire`], and otherwise leaves it
//! for the crate. The codes, flags and the u64 payloads are the crate's.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, MAX_MSG_SIZE};

use vnet::vhost_wire::{self, HDR_LEN};

/// What a handler did with the request waiting on the socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Not one of ours (or its header has not fully arrived): left for the crate.
    No,
    /// Ours, taken and answered (a refusal is an answer: the connection goes on).
    Yes,
    /// Ours but malformed beyond an answer: the connection must close.
    Close(&'static str),
}

/// A request header peeked at, not yet taken off the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub code: u32,
    /// The flags as sent (version, REPLY, NEED_REPLY, and perhaps reserved bits).
    pub flags: u32,
    /// The payload size the header announces (frontend input: not yet checked).
    pub size: u32,
}

impl Header {
    /// The next request's header, without consuming it; None when fewer than its 12 bytes
    /// are there, which past the session's gate (`super::gate`, which waits for the whole
    /// message) means the frontend has closed its end: the crate then reads to the end.
    pub fn peek(stream: &UnixStream) -> io::Result<Option<Header>> {
        let mut hdr = [0u8; HDR_LEN];
        if virtnet_sys::peek(stream, &mut hdr)? < HDR_LEN {
            return Ok(None);
        }
        let (code, flags, size) = vhost_wire::decode_header(&hdr);
        Ok(Some(Header { code, flags, size }))
    }

    pub fn is(&self, req: FrontendReq) -> bool {
        self.code == u32::from(req)
    }

    /// Version 1, and neither REPLY nor a reserved bit: the flags of a request.
    pub fn flags_valid(&self) -> bool {
        let flags = VhostUserHeaderFlag::from_bits_retain(self.flags);
        flags.bits() & VhostUserHeaderFlag::VERSION.bits() == 0x1
            && !flags.intersects(VhostUserHeaderFlag::REPLY | VhostUserHeaderFlag::RESERVED_BITS)
    }

    /// Whether the frontend asked for an ack (NEED_REPLY; it counts only with REPLY_ACK).
    pub fn need_reply(&self) -> bool {
        VhostUserHeaderFlag::from_bits_retain(self.flags).contains(VhostUserHeaderFlag::NEED_REPLY)
    }

    /// Takes the whole request off the socket and returns its payload: `size` bytes, which
    /// must be at most the message layer's limit (the caller checks it).
    pub fn take(&self, stream: &UnixStream) -> io::Result<Vec<u8>> {
        debug_assert!(self.size as usize <= MAX_MSG_SIZE);
        let mut msg = vec![0u8; HDR_LEN + self.size as usize];
        // Any fds attached to the message are dropped by the kernel: no control buffer.
        (&*stream).read_exact(&mut msg)?;
        msg.drain(..HDR_LEN);
        Ok(msg)
    }

    /// Whether the announced payload fits the message layer's limit (the crate closes the
    /// connection on larger ones, and so do we: its bytes cannot be taken as one message).
    pub fn size_fits(&self) -> bool {
        self.size as usize <= MAX_MSG_SIZE
    }
}

/// Sends the reply to `req`: a header with REPLY set and a u64 payload.
pub fn reply_u64(stream: &UnixStream, req: FrontendReq, value: u64) -> io::Result<()> {
    let flags = vhost_wire::VERSION_1 | VhostUserHeaderFlag::REPLY.bits();
    (&*stream).write_all(&vhost_wire::encode(req, flags, &value.to_ne_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peeked_header_stays_on_the_socket_until_taken() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let msg = vhost_wire::encode(FrontendReq::NET_SET_MTU, 0x1 | 0x8, &9000u64.to_ne_bytes());
        (&frontend).write_all(&msg).unwrap();
        let h = Header::peek(&backend).unwrap().unwrap();
        assert_eq!(Header::peek(&backend).unwrap(), Some(h), "peeking twice");
        assert!(h.is(FrontendReq::NET_SET_MTU) && h.flags_valid() && h.need_reply());
        assert_eq!(h.size, 8);
        assert_eq!(h.take(&backend).unwrap(), 9000u64.to_ne_bytes());
        (&frontend).write_all(&msg[..5]).unwrap();
        assert_eq!(Header::peek(&backend).unwrap(), None, "a partial header");
    }

    #[test]
    fn reply_and_reserved_flags_are_not_those_of_a_request() {
        let header = |flags: u32| Header {
            code: 20,
            flags,
            size: 8,
        };
        assert!(header(0x1).flags_valid());
        assert!(header(0x1 | 0x8).flags_valid());
        for bad in [0x0, 0x2, 0x1 | 0x4, 0x1 | 0x100] {
            assert!(!header(bad).flags_valid(), "{bad:#x}");
        }
    }
}
