//! The virtio-net feature bits (VIRTIO 1.2 5.1.3), named from `virtio-bindings`, the two bits
//! vhost-user adds to the feature word, and the names of every bit a virtio-net device
//! negotiates over vhost-user. The transport and ring bits are vring's
//! (`Features::VERSION_1`, `Features::RING_EVENT_IDX`, ...).

use vhost::vhost_user::message::VhostUserVirtioFeatures;
use virtio_bindings::virtio_net as net;
use vring::Features;

const fn bit(n: u32) -> Features {
    Features(1 << n)
}

pub const CSUM: Features = bit(net::VIRTIO_NET_F_CSUM);
pub const GUEST_CSUM: Features = bit(net::VIRTIO_NET_F_GUEST_CSUM);
pub const CTRL_GUEST_OFFLOADS: Features = bit(net::VIRTIO_NET_F_CTRL_GUEST_OFFLOADS);
pub const MTU: Features = bit(net::VIRTIO_NET_F_MTU);
pub const MAC: Features = bit(net::VIRTIO_NET_F_MAC);
pub const GUEST_TSO4: Features = bit(net::VIRTIO_NET_F_GUEST_TSO4);
pub const GUEST_TSO6: Features = bit(net::VIRTIO_NET_F_GUEST_TSO6);
pub const GUEST_ECN: Features = bit(net::VIRTIO_NET_F_GUEST_ECN);
pub const GUEST_UFO: Features = bit(net::VIRTIO_NET_F_GUEST_UFO);
pub const HOST_TSO4: Features = bit(net::VIRTIO_NET_F_HOST_TSO4);
pub const HOST_TSO6: Features = bit(net::VIRTIO_NET_F_HOST_TSO6);
pub const HOST_ECN: Features = bit(net::VIRTIO_NET_F_HOST_ECN);
pub const HOST_UFO: Features = bit(net::VIRTIO_NET_F_HOST_UFO);
pub const HOST_USO: Features = bit(net::VIRTIO_NET_F_HOST_USO);
pub const GUEST_USO4: Features = bit(net::VIRTIO_NET_F_GUEST_USO4);
pub const GUEST_USO6: Features = bit(net::VIRTIO_NET_F_GUEST_USO6);
pub const MRG_RXBUF: Features = bit(net::VIRTIO_NET_F_MRG_RXBUF);
pub const STATUS: Features = bit(net::VIRTIO_NET_F_STATUS);
pub const CTRL_VQ: Features = bit(net::VIRTIO_NET_F_CTRL_VQ);
pub const CTRL_RX: Features = bit(net::VIRTIO_NET_F_CTRL_RX);
pub const CTRL_VLAN: Features = bit(net::VIRTIO_NET_F_CTRL_VLAN);
pub const GUEST_ANNOUNCE: Features = bit(net::VIRTIO_NET_F_GUEST_ANNOUNCE);
pub const MQ: Features = bit(net::VIRTIO_NET_F_MQ);
pub const CTRL_MAC_ADDR: Features = bit(net::VIRTIO_NET_F_CTRL_MAC_ADDR);
pub const NOTF_COAL: Features = bit(net::VIRTIO_NET_F_NOTF_COAL);
pub const VQ_NOTF_COAL: Features = bit(net::VIRTIO_NET_F_VQ_NOTF_COAL);

/// vhost-user's bit 30, VHOST_USER_F_PROTOCOL_FEATURES: the backend has protocol features
/// (GET/SET_PROTOCOL_FEATURES), and its rings start disabled (vhost-user spec).
pub const PROTOCOL_FEATURES: Features = Features(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits());
/// vhost's bit 26, VHOST_F_LOG_ALL: log every write to guest memory (live migration).
pub const LOG_ALL: Features = Features(VhostUserVirtioFeatures::LOG_ALL.bits());

/// The net bits with their spec names, then vhost-user's, for display.
const NAMES: &[(Features, &str)] = &[
    (CSUM, "CSUM"),
    (GUEST_CSUM, "GUEST_CSUM"),
    (CTRL_GUEST_OFFLOADS, "CTRL_GUEST_OFFLOADS"),
    (MTU, "MTU"),
    (MAC, "MAC"),
    (GUEST_TSO4, "GUEST_TSO4"),
    (GUEST_TSO6, "GUEST_TSO6"),
    (GUEST_ECN, "GUEST_ECN"),
    (GUEST_UFO, "GUEST_UFO"),
    (HOST_TSO4, "HOST_TSO4"),
    (HOST_TSO6, "HOST_TSO6"),
    (HOST_ECN, "HOST_ECN"),
    (HOST_UFO, "HOST_UFO"),
    (HOST_USO, "HOST_USO"),
    (GUEST_USO4, "GUEST_USO4"),
    (GUEST_USO6, "GUEST_USO6"),
    (MRG_RXBUF, "MRG_RXBUF"),
    (STATUS, "STATUS"),
    (CTRL_VQ, "CTRL_VQ"),
    (CTRL_RX, "CTRL_RX"),
    (CTRL_VLAN, "CTRL_VLAN"),
    (GUEST_ANNOUNCE, "GUEST_ANNOUNCE"),
    (MQ, "MQ"),
    (CTRL_MAC_ADDR, "CTRL_MAC_ADDR"),
    (NOTF_COAL, "NOTF_COAL"),
    (VQ_NOTF_COAL, "VQ_NOTF_COAL"),
    (PROTOCOL_FEATURES, "PROTOCOL_FEATURES"),
    (LOG_ALL, "LOG_ALL"),
];

/// `f` by name, the net and vhost-user bits first ("MRG_RXBUF|STATUS|PROTOCOL_FEATURES|...
/// |VERSION_1"), then the transport and ring bits as vring names them, and any other bit by
/// number.
pub fn names(f: Features) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut rest = f;
    for &(bits, name) in NAMES {
        if f.contains(bits) {
            parts.push(name.to_string());
            rest = rest.difference(bits);
        }
    }
    if rest != Features::EMPTY {
        parts.push(rest.to_string());
    }
    parts.join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_bits_are_the_spec_numbers() {
        // Spot checks against the spec's numbering: a retyped table would drift from these.
        assert_eq!(MRG_RXBUF.0, 1 << 15);
        assert_eq!(CTRL_VQ.0, 1 << 17);
        assert_eq!(VQ_NOTF_COAL.0, 1 << 52);
        assert_eq!(PROTOCOL_FEATURES.0, 1 << 30);
        assert_eq!(LOG_ALL.0, 1 << 26);
    }

    #[test]
    fn vhost_user_bits_have_names() {
        assert_eq!(names(Features(1 << 30)), "PROTOCOL_FEATURES");
        assert_eq!(names(Features(1 << 26)), "LOG_ALL");
        let f = CTRL_VQ | PROTOCOL_FEATURES | Features::RING_EVENT_IDX;
        assert_eq!(names(f), "CTRL_VQ|PROTOCOL_FEATURES|RING_EVENT_IDX");
    }

    #[test]
    fn names_cover_net_ring_and_unknown_bits() {
        let f = MRG_RXBUF | MQ | Features::VERSION_1 | Features(1 << 63);
        assert_eq!(names(f), "MRG_RXBUF|MQ|VERSION_1|bit63");
        assert_eq!(names(Features::EMPTY), "");
    }
}
