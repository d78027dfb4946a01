//! VHOST_USER_SEND_RARP (protocol feature RARP): after a live migration the frontend on the
//! destination asks the backend to announce the guest's MAC address, so that the switches
//! between learn its new port at once instead of when the guest next sends. We broadcast a
//! RARP request (ethertype 0x8035, RFC 903) from that MAC out of the TAP, the frame QEMU's
//! `qemu_announce_self` and DPDK's vhost library send. QEMU sends SEND_RARP only to a guest
//! without GUEST_ANNOUNCE, which we do not offer.
//!
//! rust-vmm `vhost` 0.18 knows the request code but does not dispatch it (it answers it as
//! an invalid message, which would close the connection), so the session takes it here, as
//! it does the status requests and NET_SET_MTU (`intercept.rs`).

use std::io;
use std::os::unix::net::UnixStream;

use vhost::vhost_user::message::FrontendReq;

use super::intercept::{reply_u64, Handled, Header};
use super::shared::Shared;

/// The RARP ethertype.
pub const ETH_P_RARP: u16 = 0x8035;
/// A RARP frame, padded to Ethernet's minimum (without its FCS).
pub const FRAME_LEN: usize = 60;

/// The broadcast RARP request announcing `mac`: sender and target hardware address `mac`,
/// both protocol addresses 0.0.0.0 (RFC 903 "request reverse", operation 3).
pub fn frame(mac: [u8; 6]) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETH_P_RARP.to_be_bytes());
    f[14..16].copy_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    f[16..18].copy_from_slice(&0x0800u16.to_be_bytes()); // protocol: IPv4
    f[18] = 6; // hardware address length
    f[19] = 4; // protocol address length
    f[20..22].copy_from_slice(&3u16.to_be_bytes()); // request reverse
    f[22..28].copy_from_slice(&mac); // sender hardware address; sender IP 0.0.0.0
    f[32..38].copy_from_slice(&mac); // target hardware address; target IP 0.0.0.0
    f
}

/// Handles SEND_RARP (`hdr`, peeked by the session, which has checked that the RARP protocol
/// feature was acknowledged): the announcement goes out of the device's port, or is only
/// logged without one. A frame the TAP refuses is logged, not an error of the frontend's.
/// With `reply_ack` and NEED_REPLY the frontend gets an ack (0 sent, 1 not).
pub fn handle(
    stream: &UnixStream,
    hdr: &Header,
    reply_ack: bool,
    shared: &Shared,
) -> io::Result<Handled> {
    if !hdr.flags_valid() {
        return Ok(Handled::Close("SEND_RARP with bad flags"));
    }
    if hdr.size != 8 {
        return Ok(Handled::Close("SEND_RARP of the wrong size"));
    }
    let payload = hdr.take(stream)?;
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&payload[..6]);
    let sent = match announce(shared, mac) {
        Ok(sent) => sent,
        Err(e) => {
            tracing::warn!(error = %e, "the RARP announcement could not be sent");
            false
        }
    };
    if reply_ack && hdr.need_reply() {
        reply_u64(stream, FrontendReq::SEND_RARP, u64::from(!sent))?;
    }
    Ok(Handled::Yes)
}

/// Announces `mac` after a live migration: a RARP broadcast from it out of the device's port,
/// as if the guest sent it. A port with nowhere to send it only logs; returns whether a frame
/// went out.
pub fn announce(shared: &Shared, mac: [u8; 6]) -> io::Result<bool> {
    let mac_text = mac.map(|b| format!("{b:02x}")).join(":");
    let control = shared.control();
    let sent = control.announce(&frame(mac), shared.features())?;
    if sent {
        let port = control.name().unwrap_or("the port");
        tracing::info!(mac = %mac_text, port, "SEND_RARP: RARP announcement sent");
    } else {
        tracing::info!(mac = %mac_text, "SEND_RARP: the port has nowhere to announce");
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use vnet::vhost_wire::{self, HDR_LEN};

    use super::*;
    use crate::testing::null_device;

    /// The session's step for the request waiting on `backend`: SEND_RARP handled, anything
    /// else left.
    fn handle_next(backend: &UnixStream, device: &crate::Device) -> io::Result<Handled> {
        match Header::peek(backend)? {
            Some(h) if h.is(FrontendReq::SEND_RARP) => handle(backend, &h, true, device.shared()),
            _ => Ok(Handled::No),
        }
    }

    #[test]
    fn the_announcement_is_a_broadcast_rarp_request_from_the_mac() {
        let mac = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];
        let f = frame(mac);
        assert_eq!(f[..6], [0xff; 6], "broadcast");
        assert_eq!(f[6..12], mac, "from the guest's MAC");
        assert_eq!(f[12..14], [0x80, 0x35], "RARP");
        assert_eq!(
            f[14..22],
            [0, 1, 8, 0, 6, 4, 0, 3],
            "Ethernet, IPv4, request reverse"
        );
        assert_eq!((&f[22..28], &f[28..32]), (&mac[..], &[0; 4][..]), "sender");
        assert_eq!((&f[32..38], &f[38..42]), (&mac[..], &[0; 4][..]), "target");
        assert_eq!(f[42..], [0; 18], "padding");
    }

    #[test]
    fn send_rarp_is_taken_and_acked_and_other_requests_are_left() {
        let device = null_device();
        let (frontend, backend) = UnixStream::pair().unwrap();
        let mac = [0x52, 0x54, 0, 1, 2, 3, 0, 0];
        let req = vhost_wire::encode(FrontendReq::SEND_RARP, 0x1 | 0x8, &mac);
        (&frontend).write_all(&req).unwrap();
        assert_eq!(handle_next(&backend, &device).unwrap(), Handled::Yes);
        // The ack: 1, nothing sent without a TAP (the null port only logs it).
        let mut reply = [0u8; HDR_LEN + 8];
        (&frontend).read_exact(&mut reply).unwrap();
        let (code, flags, size) = vhost_wire::decode_header(reply[..HDR_LEN].try_into().unwrap());
        assert_eq!((code, flags, size), (19, 0x5, 8));
        assert_eq!(u64::from_ne_bytes(reply[HDR_LEN..].try_into().unwrap()), 1);
        // Without NEED_REPLY (QEMU's): no answer; then another request stays where it is.
        let req = vhost_wire::encode(FrontendReq::SEND_RARP, 0x1, &mac);
        (&frontend).write_all(&req).unwrap();
        let other = vhost_wire::encode(FrontendReq::GET_FEATURES, 0x1, &[]);
        (&frontend).write_all(&other).unwrap();
        assert_eq!(handle_next(&backend, &device).unwrap(), Handled::Yes);
        assert_eq!(handle_next(&backend, &device).unwrap(), Handled::No);
        let mut left = [0u8; HDR_LEN];
        (&backend).read_exact(&mut left).unwrap();
        assert_eq!(
            left[..4],
            1u32.to_ne_bytes(),
            "GET_FEATURES left for the crate"
        );
    }

    #[test]
    fn malformed_send_rarp_closes_the_connection() {
        let device = null_device();
        for (flags, payload) in [
            (0x1u32, &[0u8; 6][..]),
            (0x1 | 0x4, &[0u8; 8][..]),
            (0x2, &[0u8; 8][..]),
        ] {
            let (frontend, backend) = UnixStream::pair().unwrap();
            let req = vhost_wire::encode(FrontendReq::SEND_RARP, flags, payload);
            (&frontend).write_all(&req).unwrap();
            let got = handle_next(&backend, &device).unwrap();
            assert!(matches!(got, Handled::Close(_)), "{flags:#x}: {got:?}");
        }
    }
}
