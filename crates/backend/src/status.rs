//! VHOST_USER_SET_STATUS and VHOST_USER_GET_STATUS (protocol feature STATUS).
//!
//! rust-vmm `vhost` 0.18 knows both request codes but does not dispatch them: its handler
//! answers them like unknown requests, and we would close the connection. So the serving loop
//! peeks at each request header first and handles these two here, framed by
//! [`vnet::vhost_wire`]. The codes, flags and the u64 payload are the crate's.
//!
//! The status is the virtio device status byte (virtio spec 2.1). GET_STATUS adds NEEDS_RESET
//! while any queue of the device is broken, so a frontend learns that the device stopped a
//! queue on hostile input and must be reset.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserU64};

use vnet::vhost_wire::{self, HDR_LEN};

/// The device status bit that asks the driver for a reset.
pub const NEEDS_RESET: u8 = 0x40;

const U64_LEN: usize = std::mem::size_of::<VhostUserU64>();

/// What [`handle_next`] did with the request waiting on the socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Handled {
    /// Not a status request (or its header has not fully arrived): left for the crate.
    No,
    /// A status request, answered.
    Yes,
    /// A malformed status request: the connection must close.
    Close(&'static str),
}

/// The status state of one connection, and what was negotiated for it.
#[derive(Debug, Default)]
pub struct Status {
    /// The last SET_STATUS value.
    pub status: u8,
    /// SET_STATUS requests taken on this connection.
    pub sets: u64,
}

impl Status {
    /// Handles the next request on `stream` if it is SET_STATUS or GET_STATUS. `negotiated`:
    /// the STATUS protocol feature was acknowledged (otherwise the request is left to the
    /// crate, which refuses it); `reply_ack`: REPLY_ACK was; `needs_reset`: whether a queue is
    /// broken now.
    pub fn handle_next(
        &mut self,
        stream: &UnixStream,
        negotiated: bool,
        reply_ack: bool,
        needs_reset: impl FnOnce() -> bool,
    ) -> io::Result<Handled> {
        let mut hdr = [0u8; HDR_LEN];
        if virtnet_sys::peek(stream, &mut hdr)? < HDR_LEN || !negotiated {
            return Ok(Handled::No);
        }
        let (code, flags, size) = vhost_wire::decode_header(&hdr);
        let set = code == u32::from(FrontendReq::SET_STATUS);
        if !set && code != u32::from(FrontendReq::GET_STATUS) {
            return Ok(Handled::No);
        }
        let flags = VhostUserHeaderFlag::from_bits_retain(flags);
        if flags.bits() & VhostUserHeaderFlag::VERSION.bits() != 0x1
            || flags.intersects(VhostUserHeaderFlag::REPLY | VhostUserHeaderFlag::RESERVED_BITS)
        {
            return Ok(Handled::Close("status request with bad flags"));
        }
        // SET_STATUS carries the status; GET_STATUS nothing (QEMU) or a u64 we ignore (DPDK).
        let expected = if set { U64_LEN } else { size as usize };
        if size as usize != expected || expected > U64_LEN {
            return Ok(Handled::Close("status request of the wrong size"));
        }
        let mut msg = [0u8; HDR_LEN + U64_LEN];
        (&*stream).read_exact(&mut msg[..HDR_LEN + expected])?;
        let req = if set {
            FrontendReq::SET_STATUS
        } else {
            FrontendReq::GET_STATUS
        };
        let reply = |value: u64| -> io::Result<()> {
            let flags = vhost_wire::VERSION_1 | VhostUserHeaderFlag::REPLY.bits();
            (&*stream).write_all(&vhost_wire::encode(req, flags, &value.to_ne_bytes()))
        };
        if set {
            let value = u64::from_ne_bytes(msg[HDR_LEN..].try_into().unwrap());
            let Ok(status) = u8::try_from(value) else {
                return Ok(Handled::Close("SET_STATUS beyond one byte"));
            };
            tracing::debug!(status, "SET_STATUS");
            self.status = status;
            self.sets += 1;
            if reply_ack && flags.contains(VhostUserHeaderFlag::NEED_REPLY) {
                reply(0)?;
            }
        } else {
            let reset = if needs_reset() { NEEDS_RESET } else { 0 };
            reply(u64::from(self.status | reset))?;
        }
        Ok(Handled::Yes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use vnet::vhost_wire::encode as request;

    fn reply_value(frontend: &UnixStream) -> (u32, u32, u64) {
        let mut hdr = [0u8; HDR_LEN];
        (&*frontend).read_exact(&mut hdr).unwrap();
        let (code, flags, size) = vhost_wire::decode_header(&hdr);
        assert_eq!(size, 8);
        let mut v = [0u8; U64_LEN];
        (&*frontend).read_exact(&mut v).unwrap();
        (code, flags, u64::from_ne_bytes(v))
    }

    #[test]
    fn set_then_get_reports_the_status_and_needs_reset() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mut s = Status::default();
        let set = request(FrontendReq::SET_STATUS, 0x1 | 0x8, &15u64.to_ne_bytes());
        (&frontend).write_all(&set).unwrap();
        assert_eq!(
            s.handle_next(&backend, true, true, || false).unwrap(),
            Handled::Yes
        );
        assert_eq!(reply_value(&frontend), (39, 0x5, 0), "REPLY_ACK success");
        (&frontend)
            .write_all(&request(FrontendReq::GET_STATUS, 0x1, &[]))
            .unwrap();
        assert_eq!(
            s.handle_next(&backend, true, true, || false).unwrap(),
            Handled::Yes
        );
        assert_eq!(reply_value(&frontend), (40, 0x5, 15));
        (&frontend)
            .write_all(&request(FrontendReq::GET_STATUS, 0x1, &[]))
            .unwrap();
        assert_eq!(
            s.handle_next(&backend, true, true, || true).unwrap(),
            Handled::Yes
        );
        assert_eq!(reply_value(&frontend).2, 15 | NEEDS_RESET as u64);
    }

    #[test]
    fn other_requests_and_unnegotiated_status_stay_on_the_socket() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mut s = Status::default();
        (&frontend)
            .write_all(&request(FrontendReq::GET_FEATURES, 0x1, &[]))
            .unwrap();
        assert_eq!(
            s.handle_next(&backend, true, true, || false).unwrap(),
            Handled::No
        );
        let mut left = [0u8; HDR_LEN];
        (&backend).read_exact(&mut left).unwrap();
        (&frontend)
            .write_all(&request(FrontendReq::GET_STATUS, 0x1, &[]))
            .unwrap();
        assert_eq!(
            s.handle_next(&backend, false, true, || false).unwrap(),
            Handled::No
        );
        (&backend).read_exact(&mut left).unwrap();
        assert_eq!(left[..4], 40u32.to_ne_bytes(), "left unread for the crate");
    }

    #[test]
    fn malformed_status_requests_close_the_connection() {
        let cases: [(FrontendReq, u32, &[u8]); 4] = [
            (FrontendReq::SET_STATUS, 0x1, &[1, 2, 3, 4]),
            (FrontendReq::SET_STATUS, 0x1, &256u64.to_ne_bytes()),
            (FrontendReq::SET_STATUS, 0x1 | 0x4, &1u64.to_ne_bytes()),
            (FrontendReq::GET_STATUS, 0x2, &[]),
        ];
        for (code, flags, payload) in cases {
            let (frontend, backend) = UnixStream::pair().unwrap();
            (&frontend)
                .write_all(&request(code, flags, payload))
                .unwrap();
            let got = Status::default()
                .handle_next(&backend, true, true, || false)
                .unwrap();
            assert!(
                matches!(got, Handled::Close(_)),
                "{code:?} {flags:#x}: {got:?}"
            );
        }
    }
}
