//! VHOST_USER_SET_STATUS and VHOST_USER_GET_STATUS (protocol feature STATUS), which rust-vmm
//! `vhost` 0.18 does not dispatch: the session hands them here ([`super::intercept`]).
//!
//! The status is the virtio device status byte (virtio spec 2.1). GET_STATUS adds NEEDS_RESET
//! while any queue of the device is broken, so a frontend learns that the device stopped a
//! queue on hostile input and must be reset.

use std::io;
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::{FrontendReq, VhostUserU64};

use super::intercept::{reply_u64, Handled, Header};

/// The device status bit that asks the driver for a reset.
pub const NEEDS_RESET: u8 = 0x40;

const U64_LEN: usize = std::mem::size_of::<VhostUserU64>();

/// The status state of one connection, and what was negotiated for it.
#[derive(Debug, Default)]
pub struct Status {
    /// The last SET_STATUS value.
    pub status: u8,
    /// SET_STATUS requests taken on this connection.
    pub sets: u64,
}

impl Status {
    /// Whether `hdr` is a request of this module's.
    pub fn handles(hdr: &Header) -> bool {
        hdr.is(FrontendReq::SET_STATUS) || hdr.is(FrontendReq::GET_STATUS)
    }

    /// Takes and answers the SET_STATUS or GET_STATUS request whose header is `hdr` (see
    /// [`Status::handles`]); the STATUS protocol feature was acknowledged. `reply_ack`:
    /// REPLY_ACK was too; `needs_reset`: whether a queue is broken now. A malformed status
    /// request closes the connection.
    pub fn handle(
        &mut self,
        stream: &UnixStream,
        hdr: &Header,
        reply_ack: bool,
        needs_reset: impl FnOnce() -> bool,
    ) -> io::Result<Handled> {
        let set = hdr.is(FrontendReq::SET_STATUS);
        if !hdr.flags_valid() {
            return Ok(Handled::Close("status request with bad flags"));
        }
        // SET_STATUS carries the status; GET_STATUS nothing (QEMU) or a u64 we ignore (DPDK).
        let size = hdr.size as usize;
        if (set && size != U64_LEN) || size > U64_LEN {
            return Ok(Handled::Close("status request of the wrong size"));
        }
        let payload = hdr.take(stream)?;
        let req = if set {
            FrontendReq::SET_STATUS
        } else {
            FrontendReq::GET_STATUS
        };
        if set {
            let value = u64::from_ne_bytes(payload[..].try_into().expect("checked: 8 bytes"));
            let Ok(status) = u8::try_from(value) else {
                return Ok(Handled::Close("SET_STATUS beyond one byte"));
            };
            tracing::debug!(status, "SET_STATUS");
            self.status = status;
            self.sets += 1;
            if reply_ack && hdr.need_reply() {
                reply_u64(stream, req, 0)?;
            }
        } else {
            let reset = if needs_reset() { NEEDS_RESET } else { 0 };
            reply_u64(stream, req, u64::from(self.status | reset))?;
        }
        Ok(Handled::Yes)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    use vnet::vhost_wire::{self, encode as request, HDR_LEN};

    fn reply_value(frontend: &UnixStream) -> (u32, u32, u64) {
        let mut hdr = [0u8; HDR_LEN];
        (&*frontend).read_exact(&mut hdr).unwrap();
        let (code, flags, size) = vhost_wire::decode_header(&hdr);
        assert_eq!(size, 8);
        let mut v = [0u8; U64_LEN];
        (&*frontend).read_exact(&mut v).unwrap();
        (code, flags, u64::from_ne_bytes(v))
    }

    /// What the session does with a status request waiting on `backend`.
    fn handle_next(s: &mut Status, backend: &UnixStream, broken: bool) -> Handled {
        let hdr = Header::peek(backend).unwrap().expect("a whole header");
        assert!(Status::handles(&hdr), "{hdr:?}");
        s.handle(backend, &hdr, true, || broken).unwrap()
    }

    #[test]
    fn set_then_get_reports_the_status_and_needs_reset() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mut s = Status::default();
        let set = request(FrontendReq::SET_STATUS, 0x1 | 0x8, &15u64.to_ne_bytes());
        (&frontend).write_all(&set).unwrap();
        assert_eq!(handle_next(&mut s, &backend, false), Handled::Yes);
        assert_eq!(reply_value(&frontend), (39, 0x5, 0), "REPLY_ACK success");
        (&frontend)
            .write_all(&request(FrontendReq::GET_STATUS, 0x1, &[]))
            .unwrap();
        assert_eq!(handle_next(&mut s, &backend, false), Handled::Yes);
        assert_eq!(reply_value(&frontend), (40, 0x5, 15));
        (&frontend)
            .write_all(&request(FrontendReq::GET_STATUS, 0x1, &[]))
            .unwrap();
        assert_eq!(handle_next(&mut s, &backend, true), Handled::Yes);
        assert_eq!(reply_value(&frontend).2, 15 | NEEDS_RESET as u64);
        assert_eq!(s.sets, 1);
    }

    #[test]
    fn malformed_status_requests_close_the_connection() {
        let cases: [(FrontendReq, u32, &[u8]); 5] = [
            (FrontendReq::SET_STATUS, 0x1, &[1, 2, 3, 4]),
            (FrontendReq::SET_STATUS, 0x1, &256u64.to_ne_bytes()),
            (FrontendReq::SET_STATUS, 0x1 | 0x4, &1u64.to_ne_bytes()),
            (FrontendReq::GET_STATUS, 0x2, &[]),
            (FrontendReq::GET_STATUS, 0x1, &[0; 16]),
        ];
        for (code, flags, payload) in cases {
            let (frontend, backend) = UnixStream::pair().unwrap();
            (&frontend)
                .write_all(&request(code, flags, payload))
                .unwrap();
            let got = handle_next(&mut Status::default(), &backend, false);
            assert!(
                matches!(got, Handled::Close(_)),
                "{code:?} {flags:#x}: {got:?}"
            );
        }
    }
}
