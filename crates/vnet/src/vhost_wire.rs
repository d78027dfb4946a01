//! The one piece of the vhost-user wire format written by hand (vhost-user spec, "Message
//! Specification"): SET_STATUS, GET_STATUS and NET_SET_MTU, which rust-vmm `vhost` 0.18
//! neither sends (frontend) nor dispatches (backend), and whose header type it keeps private.
//! A message is a header of three native-endian u32 (request code, flags, payload size) and
//! the payload.

use vhost::vhost_user::message::FrontendReq;

/// Bytes in a message header.
pub const HDR_LEN: usize = 12;
/// The flags' version field: every message carries version 1.
pub const VERSION_1: u32 = 0x1;

/// A whole message: `code` with `flags` (version included) and `payload`.
pub fn encode(code: FrontendReq, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HDR_LEN + payload.len());
    m.extend_from_slice(&u32::from(code).to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
    m.extend_from_slice(payload);
    m
}

/// A header's request code, flags and payload size.
pub fn decode_header(hdr: &[u8; HDR_LEN]) -> (u32, u32, u32) {
    let word =
        |i: usize| u32::from_ne_bytes([hdr[4 * i], hdr[4 * i + 1], hdr[4 * i + 2], hdr[4 * i + 3]]);
    (word(0), word(1), word(2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_decodes_to_what_was_encoded() {
        let m = encode(
            FrontendReq::SET_STATUS,
            VERSION_1 | 0x8,
            &15u64.to_ne_bytes(),
        );
        assert_eq!(m.len(), HDR_LEN + 8);
        let hdr: [u8; HDR_LEN] = m[..HDR_LEN].try_into().unwrap();
        assert_eq!(decode_header(&hdr), (39, 0x9, 8));
        assert_eq!(m[HDR_LEN..], 15u64.to_ne_bytes());
    }
}
