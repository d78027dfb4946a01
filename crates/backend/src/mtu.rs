//! VHOST_USER_NET_SET_MTU (protocol feature MTU; vhost-user spec, "Front-end message types"):
//! the frontend tells the device the MTU it gives the guest. QEMU sends it when its
//! `virtio-net-pci` has `host_mtu=N` and the guest acknowledged VIRTIO_NET_F_MTU, before it
//! starts the queues, and with REPLY_ACK waits for the answer: a refusal ("N Bytes MTU not
//! supported by the backend") leaves the device without a backend. rust-vmm `vhost` 0.18 does
//! not dispatch it: the session hands it here ([`super::intercept`]).
//!
//! The payload is a u64. A value in 68..=65535 (the spec's range for the config space's `mtu`,
//! VIRTIO 1.2 5.1.4.1) that the device can carry is applied ([`super::Shared::set_mtu`]: the
//! TAP's interface, then the config space) and acked 0; anything else, or a payload that is not
//! one u64, is refused with a non-zero ack, and the connection goes on. Flags that are not a
//! request's, or a payload beyond the message limit, close it, as for every other request.

use std::io;
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::FrontendReq;

use super::error::Error;
use super::intercept::{reply_u64, Handled, Header};

/// Takes and answers the NET_SET_MTU request whose header is `hdr`; the MTU protocol feature
/// was acknowledged. `reply_ack`: REPLY_ACK was too (the ack goes out only if the request
/// asks for it). `apply` checks the value and sets it on the device.
pub fn handle(
    stream: &UnixStream,
    hdr: &Header,
    reply_ack: bool,
    apply: impl FnOnce(u64) -> Result<u16, Error>,
) -> io::Result<Handled> {
    debug_assert!(hdr.is(FrontendReq::NET_SET_MTU));
    if !hdr.flags_valid() {
        return Ok(Handled::Close("NET_SET_MTU with bad flags"));
    }
    if !hdr.size_fits() {
        return Ok(Handled::Close("NET_SET_MTU larger than a message"));
    }
    let payload = hdr.take(stream)?;
    let outcome = match <[u8; 8]>::try_from(&payload[..]) {
        Ok(value) => apply(u64::from_ne_bytes(value)),
        Err(_) => Err(Error::Malformed {
            what: "NET_SET_MTU",
            why: "its payload is not one u64",
        }),
    };
    match &outcome {
        Ok(mtu) => tracing::info!(mtu, "NET_SET_MTU"),
        Err(e) => tracing::warn!(error = %e, "NET_SET_MTU refused"),
    }
    if reply_ack && hdr.need_reply() {
        reply_u64(
            stream,
            FrontendReq::NET_SET_MTU,
            u64::from(outcome.is_err()),
        )?;
    }
    Ok(Handled::Yes)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU16, Ordering::Relaxed};

    use super::*;
    use crate::config::check_mtu;

    use vnet::vhost_wire::{self, encode as request, HDR_LEN};

    /// The ack waiting on `frontend`: (code, flags, value).
    fn ack(frontend: &UnixStream) -> (u32, u32, u64) {
        let mut msg = [0u8; HDR_LEN + 8];
        (&*frontend).read_exact(&mut msg).unwrap();
        let (code, flags, size) = vhost_wire::decode_header(msg[..HDR_LEN].try_into().unwrap());
        assert_eq!(size, 8);
        (
            code,
            flags,
            u64::from_ne_bytes(msg[HDR_LEN..].try_into().unwrap()),
        )
    }

    /// Sends `payload` as NET_SET_MTU with `flags` and handles it against a device that
    /// carries up to 9000; returns what happened and the MTU the device has then.
    fn set_mtu(
        frontend: &UnixStream,
        backend: &UnixStream,
        flags: u32,
        payload: &[u8],
        mtu: &AtomicU16,
    ) -> Handled {
        (&*frontend)
            .write_all(&request(FrontendReq::NET_SET_MTU, flags, payload))
            .unwrap();
        let hdr = Header::peek(backend).unwrap().expect("a whole header");
        handle(backend, &hdr, true, |value| {
            let m = check_mtu(value, 9000)?;
            mtu.store(m, Relaxed);
            Ok(m)
        })
        .unwrap()
    }

    #[test]
    fn a_valid_mtu_is_applied_and_acked() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mtu = AtomicU16::new(1500);
        let got = set_mtu(&frontend, &backend, 0x1 | 0x8, &9000u64.to_ne_bytes(), &mtu);
        assert_eq!(got, Handled::Yes);
        assert_eq!(ack(&frontend), (20, 0x5, 0), "REPLY_ACK success");
        assert_eq!(mtu.load(Relaxed), 9000);
        // Without NEED_REPLY: applied, no ack.
        let got = set_mtu(&frontend, &backend, 0x1, &68u64.to_ne_bytes(), &mtu);
        assert_eq!(got, Handled::Yes);
        assert_eq!(mtu.load(Relaxed), 68);
        frontend.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let r = (&frontend).read(&mut byte);
        assert!(
            matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "{r:?}"
        );
    }

    #[test]
    fn a_bad_mtu_is_refused_and_the_connection_goes_on() {
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mtu = AtomicU16::new(1500);
        let bad: [&[u8]; 6] = [
            &67u64.to_ne_bytes(),
            &0u64.to_ne_bytes(),
            &9001u64.to_ne_bytes(),
            &(1u64 << 32 | 1500).to_ne_bytes(),
            &[0xdc, 0x05, 0, 0],
            &[0; 16],
        ];
        for payload in bad {
            let got = set_mtu(&frontend, &backend, 0x1 | 0x8, payload, &mtu);
            assert_eq!(got, Handled::Yes, "{payload:02x?}");
            assert_eq!(ack(&frontend), (20, 0x5, 1), "refused: {payload:02x?}");
            assert_eq!(mtu.load(Relaxed), 1500, "changed by {payload:02x?}");
        }
        // The stream is still in step: the next request is read whole.
        let got = set_mtu(&frontend, &backend, 0x1 | 0x8, &1280u64.to_ne_bytes(), &mtu);
        assert_eq!(got, Handled::Yes);
        assert_eq!(ack(&frontend), (20, 0x5, 0));
        assert_eq!(mtu.load(Relaxed), 1280);
    }

    #[test]
    fn bad_flags_or_an_oversized_payload_close_the_connection() {
        let mtu = AtomicU16::new(1500);
        for flags in [0x0, 0x1 | 0x4, 0x1 | 0x100] {
            let (frontend, backend) = UnixStream::pair().unwrap();
            let got = set_mtu(&frontend, &backend, flags, &9000u64.to_ne_bytes(), &mtu);
            assert!(matches!(got, Handled::Close(_)), "{flags:#x}: {got:?}");
        }
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mut msg = request(FrontendReq::NET_SET_MTU, 0x1, &[]);
        msg[8..12].copy_from_slice(&0x1001u32.to_ne_bytes());
        (&frontend).write_all(&msg).unwrap();
        let hdr = Header::peek(&backend).unwrap().unwrap();
        let got = handle(&backend, &hdr, true, |_| unreachable!("not applied")).unwrap();
        assert!(matches!(got, Handled::Close(_)), "{got:?}");
        assert_eq!(mtu.load(Relaxed), 1500);
    }
}
