//! What virtnet's two halves share: the virtio-net definitions (VIRTIO 1.2 5.1) and the
//! piece of the vhost-user wire format that both write by hand.
//!
//! - here: the header in front of every frame, and the device configuration space;
//! - [`ctrl`]: the control-queue codec (5.1.6.5);
//! - [`vhost_wire`]: the framing of SET_STATUS / GET_STATUS;
//! - [`stats`]: the counter types and the [`counters!`] macro both halves count with;
//! - [`gso`]: what a frame becomes for a receiver without its sender's offloads (segments,
//!   completed checksums), over the arithmetic of [`csum`].

#![forbid(unsafe_code)]

pub mod csum;
pub mod ctrl;
pub mod feature;
pub mod gso;
pub mod stats;
pub mod vhost_wire;

use vring::Features;

/// `struct virtio_net_hdr_v1` (spec 5.1.6): 12 bytes, `num_buffers` last.
pub const HDR_LEN: usize = 12;
/// The legacy header without `num_buffers`, when neither VERSION_1 nor MRG_RXBUF is on.
pub const HDR_LEN_LEGACY: usize = 10;

/// `flags`: the checksum starts at `csum_start` and goes in at `csum_offset`.
pub const HDR_F_NEEDS_CSUM: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
pub const HDR_GSO_NONE: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_NONE as u8;
pub const HDR_GSO_TCPV4: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_TCPV4 as u8;
pub const HDR_GSO_TCPV6: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_TCPV6 as u8;
pub const HDR_GSO_UDP: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_UDP as u8;
pub const HDR_GSO_UDP_L4: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_UDP_L4 as u8;
/// `gso_type`'s ECN bit, beside the type.
pub const HDR_GSO_ECN: u8 = virtio_bindings::virtio_net::VIRTIO_NET_HDR_GSO_ECN as u8;

/// Why a transmitted frame's header is refused (VIRTIO 1.2 5.1.6.2.1, what a driver must
/// not send): a host that trusted it would hand the kernel a frame it has crashed on before.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxHdrError {
    /// Shorter than its header.
    #[error("the frame is shorter than its header")]
    Short,
    /// A flag other than NEEDS_CSUM (DATA_VALID and RSC_INFO are the device's to set).
    #[error("header flags {0:#04x}: only NEEDS_CSUM may be set on transmit")]
    Flags(u8),
    /// An offload the features did not negotiate: NEEDS_CSUM without CSUM, a GSO type without
    /// its HOST_* feature, the ECN bit without HOST_ECN.
    #[error("header asks for an offload that was not negotiated")]
    NotNegotiated,
    /// The checksum would start or land outside the frame.
    #[error("checksum at {start} + {offset} is outside a {len}-byte frame")]
    Csum { start: u16, offset: u16, len: usize },
    /// Longer than any frame a driver sends ([`MAX_TX_FRAME`]): Linux's TAP allocates such a
    /// frame linearly, and fails it with ENOBUFS, the back-pressure error, from about 4 MiB
    /// on, every time.
    #[error("a {len}-byte frame is longer than {MAX_TX_FRAME} bytes")]
    TooLong { len: usize },
    /// An unknown GSO type, a GSO frame with `gso_size` 0, or `hdr_len` past the frame.
    #[error("GSO type {gso_type:#04x}, size {gso_size}, header length {hdr_len}: invalid")]
    Gso {
        gso_type: u8,
        gso_size: u16,
        hdr_len: u16,
    },
}

/// The longest frame taken after its header: QEMU's NET_BUFSIZE (64 KiB and 4 KiB), above
/// which QEMU drops a frame too. The largest a driver sends is a GSO super-frame of 65,593
/// bytes (a 64 KiB IPv6 payload, its 40-byte header, an Ethernet header and a VLAN tag).
pub const MAX_TX_FRAME: usize = 65536 + 4096;

/// The header length for negotiated `features`.
pub fn hdr_len(features: Features) -> usize {
    if features.contains(Features::VERSION_1) || features.contains(feature::MRG_RXBUF) {
        HDR_LEN
    } else {
        HDR_LEN_LEGACY
    }
}

/// The fields of a virtio-net header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    pub num_buffers: u16,
}

impl NetHdr {
    /// Checks a header the driver sent with a frame of `frame_len` bytes (after the header),
    /// against the negotiated `features`.
    #[inline]
    pub fn check_tx(&self, features: Features, frame_len: usize) -> Result<(), TxHdrError> {
        if frame_len > MAX_TX_FRAME {
            return Err(TxHdrError::TooLong { len: frame_len });
        }
        if self.flags & !HDR_F_NEEDS_CSUM != 0 {
            return Err(TxHdrError::Flags(self.flags));
        }
        if self.flags & HDR_F_NEEDS_CSUM != 0 {
            if !features.contains(feature::CSUM) {
                return Err(TxHdrError::NotNegotiated);
            }
            // The 16-bit checksum field lies at csum_start + csum_offset.
            if self.csum_start as usize + self.csum_offset as usize + 2 > frame_len {
                return Err(TxHdrError::Csum {
                    start: self.csum_start,
                    offset: self.csum_offset,
                    len: frame_len,
                });
            }
        }
        let bad_gso = TxHdrError::Gso {
            gso_type: self.gso_type,
            gso_size: self.gso_size,
            hdr_len: self.hdr_len,
        };
        let kind = self.gso_type & !HDR_GSO_ECN;
        let needs = match kind {
            HDR_GSO_NONE if self.gso_type & HDR_GSO_ECN != 0 => return Err(bad_gso),
            HDR_GSO_NONE => return Ok(()),
            HDR_GSO_TCPV4 => feature::HOST_TSO4,
            HDR_GSO_TCPV6 => feature::HOST_TSO6,
            HDR_GSO_UDP => feature::HOST_UFO,
            HDR_GSO_UDP_L4 => feature::HOST_USO,
            _ => return Err(bad_gso),
        };
        let ecn = self.gso_type & HDR_GSO_ECN != 0;
        if !features.contains(needs) || (ecn && !features.contains(feature::HOST_ECN)) {
            return Err(TxHdrError::NotNegotiated);
        }
        if self.gso_size == 0 || self.hdr_len as usize > frame_len {
            return Err(bad_gso);
        }
        // What Linux's virtio_net_hdr_to_skb refuses since 6.11 (and stable), after syzbot
        // reached WARNs in skb_checksum_help and __udp_gso_segment with such headers: USO
        // needs its checksum asked for, at udphdr.check, and no ECN; a TCP checksum asked for
        // lands at tcphdr.check.
        let csum = self.flags & HDR_F_NEEDS_CSUM != 0;
        let bad = match kind {
            HDR_GSO_UDP_L4 => !csum || self.csum_offset != 6 || ecn,
            HDR_GSO_TCPV4 | HDR_GSO_TCPV6 => csum && self.csum_offset != 16,
            _ => false,
        };
        if bad {
            return Err(bad_gso);
        }
        Ok(())
    }

    #[inline]
    pub fn to_bytes(self) -> [u8; HDR_LEN] {
        // Inlined, so that a caller's field just set (`num_buffers`) stays in a register:
        // called, the fields were loaded back from memory, two of them in one load that
        // waited for the separate stores it spans. In two stores, of 8 and 4 bytes: the copy
        // of the array that usually follows loads them back as they were stored (a store per
        // field made each of its loads wait for the stores it spans to complete).
        let lo = self.flags as u64
            | (self.gso_type as u64) << 8
            | (self.hdr_len as u64) << 16
            | (self.gso_size as u64) << 32
            | (self.csum_start as u64) << 48;
        let hi = self.csum_offset as u32 | (self.num_buffers as u32) << 16;
        let mut b = [0u8; HDR_LEN];
        b[..8].copy_from_slice(&lo.to_le_bytes());
        b[8..].copy_from_slice(&hi.to_le_bytes());
        b
    }

    #[inline]
    pub fn from_bytes(b: &[u8; HDR_LEN]) -> NetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
            num_buffers: u(10),
        }
    }
}

/// Offset of `num_buffers` in the header.
pub const NUM_BUFFERS_OFFSET: u64 = 10;

/// `struct virtio_net_config` (spec 5.1.4), the fields we serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    pub mac: [u8; 6],
    pub status: u16,
    pub max_virtqueue_pairs: u16,
    pub mtu: u16,
}

/// `status`: the link is up.
pub const NET_S_LINK_UP: u16 = virtio_bindings::virtio_net::VIRTIO_NET_S_LINK_UP as u16;

impl NetConfig {
    /// mac(6) status(2) max_virtqueue_pairs(2) mtu(2): the first 12 bytes of the layout.
    pub fn to_bytes(self) -> [u8; 12] {
        let mut b = [0u8; 12];
        b[0..6].copy_from_slice(&self.mac);
        b[6..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..10].copy_from_slice(&self.max_virtqueue_pairs.to_le_bytes());
        b[10..12].copy_from_slice(&self.mtu.to_le_bytes());
        b
    }
}

/// Parses "52:54:00:12:34:56".
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for m in mac.iter_mut() {
        *m = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tx_headers_are_checked_against_the_features_and_the_frame() {
        let all = Features::VERSION_1
            | feature::CSUM
            | feature::HOST_TSO4
            | feature::HOST_TSO6
            | feature::HOST_ECN;
        let csum = NetHdr {
            flags: HDR_F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..NetHdr::default()
        };
        let tso = NetHdr {
            gso_type: HDR_GSO_TCPV4,
            gso_size: 1448,
            hdr_len: 66,
            ..csum
        };
        // What Linux's virtio_net sends passes.
        assert_eq!(NetHdr::default().check_tx(Features::VERSION_1, 60), Ok(()));
        assert_eq!(csum.check_tx(all, 60), Ok(()));
        assert_eq!(tso.check_tx(all, 9000), Ok(()));
        let tso_ecn = NetHdr {
            gso_type: HDR_GSO_TCPV6 | HDR_GSO_ECN,
            ..tso
        };
        assert_eq!(tso_ecn.check_tx(all, 9000), Ok(()));
        // What a driver must not send is refused, each for its reason.
        let flags = NetHdr {
            flags: 2,
            ..NetHdr::default()
        };
        assert_eq!(flags.check_tx(all, 60), Err(TxHdrError::Flags(2)));
        assert_eq!(
            csum.check_tx(Features::VERSION_1, 60),
            Err(TxHdrError::NotNegotiated)
        );
        assert!(matches!(
            csum.check_tx(all, 51),
            Err(TxHdrError::Csum { .. })
        ));
        assert_eq!(csum.check_tx(all, 52), Ok(()));
        assert_eq!(
            tso.check_tx(all.difference(feature::HOST_TSO4), 9000),
            Err(TxHdrError::NotNegotiated)
        );
        assert_eq!(
            tso_ecn.check_tx(all.difference(feature::HOST_ECN), 9000),
            Err(TxHdrError::NotNegotiated)
        );
        let udp = NetHdr {
            gso_type: HDR_GSO_UDP,
            ..tso
        };
        assert_eq!(udp.check_tx(all, 9000), Err(TxHdrError::NotNegotiated));
        for bad in [
            NetHdr { gso_size: 0, ..tso },
            NetHdr {
                hdr_len: 9001,
                ..tso
            },
            NetHdr { gso_type: 2, ..tso },
            NetHdr {
                gso_type: HDR_GSO_ECN,
                ..NetHdr::default()
            },
        ] {
            assert!(
                matches!(bad.check_tx(all, 9000), Err(TxHdrError::Gso { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn header_round_trips_in_spec_layout() {
        let h = NetHdr {
            flags: 1,
            gso_type: 3,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
            num_buffers: 2,
        };
        let b = h.to_bytes();
        assert_eq!(b, [1, 3, 54, 0, 0xa8, 0x05, 34, 0, 16, 0, 2, 0]);
        assert_eq!(NetHdr::from_bytes(&b), h);
    }

    #[test]
    fn header_length_follows_features() {
        assert_eq!(hdr_len(Features::VERSION_1), 12);
        assert_eq!(hdr_len(feature::MRG_RXBUF), 12);
        assert_eq!(hdr_len(Features::EMPTY), 10);
    }

    #[test]
    fn mac_parses_and_rejects_garbage() {
        assert_eq!(
            parse_mac("52:54:00:ab:cd:ef"),
            Some([0x52, 0x54, 0, 0xab, 0xcd, 0xef])
        );
        assert_eq!(parse_mac("52:54:00:ab:cd"), None);
        assert_eq!(parse_mac("52:54:00:ab:cd:ef:01"), None);
        assert_eq!(parse_mac("zz:54:00:ab:cd:ef"), None);
    }

    #[test]
    fn a_frame_past_the_largest_a_driver_sends_is_refused() {
        let plain = NetHdr::default();
        assert_eq!(plain.check_tx(Features::VERSION_1, MAX_TX_FRAME), Ok(()));
        let len = MAX_TX_FRAME + 1;
        assert_eq!(
            plain.check_tx(Features::VERSION_1, len),
            Err(TxHdrError::TooLong { len })
        );
        // The largest GSO super-frame: a 64 KiB IPv6 payload behind its headers and a VLAN tag.
        let largest = 65535 + 40 + 14 + 4;
        assert_eq!(plain.check_tx(Features::VERSION_1, largest), Ok(()));
    }

    /// The rules Linux added to virtio_net_hdr_to_skb in 2024 after syzbot reached
    /// WARNs in skb_checksum_help / __udp_gso_segment (fc8b2a619469, 89add40066f9).
    #[test]
    fn uso_and_tso_headers_the_kernel_now_refuses_are_refused() {
        let f = Features::VERSION_1 | feature::CSUM | feature::HOST_USO | feature::HOST_TSO4;
        let uso = NetHdr {
            flags: HDR_F_NEEDS_CSUM,
            gso_type: HDR_GSO_UDP_L4,
            hdr_len: 42,
            gso_size: 1400,
            csum_start: 34,
            csum_offset: 6,
            num_buffers: 0,
        };
        assert_eq!(uso.check_tx(f, 9000), Ok(()));
        let no_csum = NetHdr { flags: 0, ..uso };
        assert!(no_csum.check_tx(f, 9000).is_err(), "USO without NEEDS_CSUM");
        let bad_off = NetHdr {
            csum_offset: 16,
            ..uso
        };
        assert!(
            bad_off.check_tx(f, 9000).is_err(),
            "USO csum_offset not udphdr.check"
        );
        let tso = NetHdr {
            gso_type: HDR_GSO_TCPV4,
            hdr_len: 54,
            csum_offset: 6,
            ..uso
        };
        assert!(
            tso.check_tx(f, 9000).is_err(),
            "TSO csum_offset not tcphdr.check"
        );
    }
}
