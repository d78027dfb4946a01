//! What a driver must not send in a tx frame's virtio-net header (VIRTIO 1.2 5.1.6.2.1), as
//! the list of rules a header breaks, to check `vnet::NetHdr::check_tx` against: the check the
//! TAP port makes before the kernel sees a frame. The echo and null ports that this target
//! runs take any header, so the harness makes the check itself on the header of every tx chain
//! its guest posts, as the TAP port would read it.

use vnet::{
    feature, NetHdr, TxHdrError, HDR_F_NEEDS_CSUM, HDR_GSO_ECN, HDR_GSO_NONE, HDR_GSO_TCPV4,
    HDR_GSO_TCPV6, HDR_GSO_UDP, HDR_GSO_UDP_L4, MAX_TX_FRAME,
};
use vring::Features;

/// A rule of 5.1.6.2.1 that a header breaks, by the `TxHdrError` that names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A flag other than NEEDS_CSUM.
    Flags,
    /// NEEDS_CSUM without CSUM; a GSO type without its HOST_* feature; ECN without HOST_ECN.
    NotNegotiated,
    /// The 16-bit checksum field does not lie inside the frame.
    Csum,
    /// An unknown GSO type, ECN on no GSO, gso_size 0, or hdr_len past the frame; and what
    /// Linux refuses since 6.11: USO without NEEDS_CSUM, with its checksum elsewhere than
    /// udphdr.check, or with ECN; TSO with its checksum elsewhere than tcphdr.check.
    Gso,
    /// A frame longer than `vnet::MAX_TX_FRAME`.
    TooLong,
}

impl Fault {
    fn of(e: &TxHdrError) -> Option<Fault> {
        match e {
            TxHdrError::Short => None,
            TxHdrError::Flags(_) => Some(Fault::Flags),
            TxHdrError::NotNegotiated => Some(Fault::NotNegotiated),
            TxHdrError::Csum { .. } => Some(Fault::Csum),
            TxHdrError::Gso { .. } => Some(Fault::Gso),
            TxHdrError::TooLong { .. } => Some(Fault::TooLong),
        }
    }
}

/// Every rule `h` breaks, for a frame of `frame_len` bytes after the header.
pub fn faults(h: &NetHdr, features: Features, frame_len: usize) -> Vec<Fault> {
    let mut f = Vec::new();
    if frame_len > MAX_TX_FRAME {
        f.push(Fault::TooLong);
    }
    if h.flags & !HDR_F_NEEDS_CSUM != 0 {
        f.push(Fault::Flags);
    }
    if h.flags & HDR_F_NEEDS_CSUM != 0 {
        if !features.contains(feature::CSUM) {
            f.push(Fault::NotNegotiated);
        }
        if h.csum_start as usize + h.csum_offset as usize + 2 > frame_len {
            f.push(Fault::Csum);
        }
    }
    let ecn = h.gso_type & HDR_GSO_ECN != 0;
    let needs = match h.gso_type & !HDR_GSO_ECN {
        HDR_GSO_NONE => {
            if ecn {
                f.push(Fault::Gso);
            }
            return f;
        }
        HDR_GSO_TCPV4 => feature::HOST_TSO4,
        HDR_GSO_TCPV6 => feature::HOST_TSO6,
        HDR_GSO_UDP => feature::HOST_UFO,
        HDR_GSO_UDP_L4 => feature::HOST_USO,
        _ => {
            f.push(Fault::Gso);
            return f;
        }
    };
    if !features.contains(needs) || (ecn && !features.contains(feature::HOST_ECN)) {
        f.push(Fault::NotNegotiated);
    }
    if h.gso_size == 0 || h.hdr_len as usize > frame_len {
        f.push(Fault::Gso);
    }
    let csum = h.flags & HDR_F_NEEDS_CSUM != 0;
    let checksum_elsewhere = match h.gso_type & !HDR_GSO_ECN {
        HDR_GSO_UDP_L4 => !csum || h.csum_offset != 6 || ecn,
        HDR_GSO_TCPV4 | HDR_GSO_TCPV6 => csum && h.csum_offset != 16,
        _ => false,
    };
    if checksum_elsewhere {
        f.push(Fault::Gso);
    }
    f
}

/// `check_tx` accepts exactly the headers that break no rule, and names a rule the header
/// breaks when it refuses one.
pub fn assert_checked(h: &NetHdr, features: Features, frame_len: usize) {
    let broken = faults(h, features, frame_len);
    match h.check_tx(features, frame_len) {
        Ok(()) => assert!(
            broken.is_empty(),
            "check_tx passed {h:?} on a {frame_len}-byte frame with {features:?}, which breaks \
             {broken:?}"
        ),
        Err(e) => assert!(
            Fault::of(&e).is_some_and(|f| broken.contains(&f)),
            "check_tx refused {h:?} on a {frame_len}-byte frame with {features:?} as {e:?}; \
             the rules it breaks: {broken:?}"
        ),
    }
}
