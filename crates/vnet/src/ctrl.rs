//! The control virtqueue's commands (spec 5.1.6.5), as the driver encodes them and the device
//! decodes them. A command chain is: device-readable `class, command, data`; device-writable
//! `reply` (only VQ_NOTF_COAL GET has one) then the one-byte `ack`.

use virtio_bindings::virtio_net as vn;

pub const OK: u8 = vn::VIRTIO_NET_OK as u8;
pub const ERR: u8 = vn::VIRTIO_NET_ERR as u8;
const CLASS_RX: u8 = vn::VIRTIO_NET_CTRL_RX as u8;
const RX_PROMISC: u8 = vn::VIRTIO_NET_CTRL_RX_PROMISC as u8;
const RX_ALLMULTI: u8 = vn::VIRTIO_NET_CTRL_RX_ALLMULTI as u8;
const CLASS_MAC: u8 = vn::VIRTIO_NET_CTRL_MAC as u8;
const MAC_ADDR_SET: u8 = vn::VIRTIO_NET_CTRL_MAC_ADDR_SET as u8;
const CLASS_MQ: u8 = vn::VIRTIO_NET_CTRL_MQ as u8;
const MQ_VQ_PAIRS_SET: u8 = vn::VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET as u8;
const CLASS_NOTF_COAL: u8 = vn::VIRTIO_NET_CTRL_NOTF_COAL as u8;
const COAL_TX_SET: u8 = vn::VIRTIO_NET_CTRL_NOTF_COAL_TX_SET as u8;
const COAL_RX_SET: u8 = vn::VIRTIO_NET_CTRL_NOTF_COAL_RX_SET as u8;
const COAL_VQ_SET: u8 = vn::VIRTIO_NET_CTRL_NOTF_COAL_VQ_SET as u8;
const COAL_VQ_GET: u8 = vn::VIRTIO_NET_CTRL_NOTF_COAL_VQ_GET as u8;

/// Notification coalescing parameters: hold used-buffer notifications until `max_packets`
/// completions or `max_usecs` microseconds, whichever comes first. Zero in both: off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Coalesce {
    pub max_packets: u32,
    pub max_usecs: u32,
}

impl Coalesce {
    /// No holding: without a time bound (max_usecs 0) a held notification could wait
    /// forever, and with max_packets 1 every completion is due at once.
    pub fn is_off(&self) -> bool {
        self.max_usecs == 0 || self.max_packets == 1
    }
    fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.max_packets.to_le_bytes());
        b[4..].copy_from_slice(&self.max_usecs.to_le_bytes());
        b
    }
    fn from_bytes(b: &[u8]) -> Coalesce {
        let u = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Coalesce {
            max_packets: u(0),
            max_usecs: u(4),
        }
    }
}

/// A control command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// MQ VQ_PAIRS_SET: use the first `n` queue pairs.
    VqPairsSet(u16),
    RxPromisc(bool),
    RxAllmulti(bool),
    MacAddrSet([u8; 6]),
    /// NOTF_COAL TX_SET / RX_SET: every tx (rx) queue.
    NotfCoalTx(Coalesce),
    NotfCoalRx(Coalesce),
    /// VQ_NOTF_COAL SET / GET: one virtqueue, by its index.
    VqNotfCoalSet {
        vqn: u16,
        coal: Coalesce,
    },
    VqNotfCoalGet {
        vqn: u16,
    },
}

/// Why the device refused to decode a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("command is {0} bytes, shorter than its header")]
    Short(usize),
    #[error("unknown command class {class} command {command}")]
    Unknown { class: u8, command: u8 },
    #[error("class {class} command {command} needs {want} data bytes, got {got}")]
    BadLength {
        class: u8,
        command: u8,
        want: usize,
        got: usize,
    },
}

impl Command {
    /// The device-readable bytes: class, command, data.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        match *self {
            Command::VqPairsSet(n) => {
                v.extend([CLASS_MQ, MQ_VQ_PAIRS_SET]);
                v.extend(n.to_le_bytes());
            }
            Command::RxPromisc(on) => v.extend([CLASS_RX, RX_PROMISC, on as u8]),
            Command::RxAllmulti(on) => v.extend([CLASS_RX, RX_ALLMULTI, on as u8]),
            Command::MacAddrSet(mac) => {
                v.extend([CLASS_MAC, MAC_ADDR_SET]);
                v.extend(mac);
            }
            Command::NotfCoalTx(c) => {
                v.extend([CLASS_NOTF_COAL, COAL_TX_SET]);
                v.extend(c.to_bytes());
            }
            Command::NotfCoalRx(c) => {
                v.extend([CLASS_NOTF_COAL, COAL_RX_SET]);
                v.extend(c.to_bytes());
            }
            Command::VqNotfCoalSet { vqn, coal } => {
                v.extend([CLASS_NOTF_COAL, COAL_VQ_SET]);
                v.extend(vqn.to_le_bytes());
                v.extend([0, 0]);
                v.extend(coal.to_bytes());
            }
            Command::VqNotfCoalGet { vqn } => {
                v.extend([CLASS_NOTF_COAL, COAL_VQ_GET]);
                v.extend(vqn.to_le_bytes());
                v.extend([0, 0]);
            }
        }
        v
    }

    /// Device-writable bytes the device returns before the ack.
    pub fn reply_len(&self) -> usize {
        match self {
            Command::VqNotfCoalGet { .. } => 8,
            _ => 0,
        }
    }

    /// Decodes the device-readable bytes of a command.
    pub fn decode(b: &[u8]) -> Result<Command, DecodeError> {
        let [class, command, ref data @ ..] = *b else {
            return Err(DecodeError::Short(b.len()));
        };
        let need = |want: usize| {
            if data.len() == want {
                Ok(())
            } else {
                Err(DecodeError::BadLength {
                    class,
                    command,
                    want,
                    got: data.len(),
                })
            }
        };
        let u16_at = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]);
        Ok(match (class, command) {
            (CLASS_MQ, MQ_VQ_PAIRS_SET) => {
                need(2)?;
                Command::VqPairsSet(u16_at(0))
            }
            (CLASS_RX, RX_PROMISC) => {
                need(1)?;
                Command::RxPromisc(data[0] != 0)
            }
            (CLASS_RX, RX_ALLMULTI) => {
                need(1)?;
                Command::RxAllmulti(data[0] != 0)
            }
            (CLASS_MAC, MAC_ADDR_SET) => {
                need(6)?;
                let mut mac = [0u8; 6];
                mac.copy_from_slice(data);
                Command::MacAddrSet(mac)
            }
            (CLASS_NOTF_COAL, COAL_TX_SET) => {
                need(8)?;
                Command::NotfCoalTx(Coalesce::from_bytes(data))
            }
            (CLASS_NOTF_COAL, COAL_RX_SET) => {
                need(8)?;
                Command::NotfCoalRx(Coalesce::from_bytes(data))
            }
            (CLASS_NOTF_COAL, COAL_VQ_SET) => {
                need(12)?;
                Command::VqNotfCoalSet {
                    vqn: u16_at(0),
                    coal: Coalesce::from_bytes(&data[4..]),
                }
            }
            (CLASS_NOTF_COAL, COAL_VQ_GET) => {
                need(4)?;
                Command::VqNotfCoalGet { vqn: u16_at(0) }
            }
            _ => return Err(DecodeError::Unknown { class, command }),
        })
    }

    /// The reply bytes of a GET, for the device to write.
    pub fn encode_reply(coal: Coalesce) -> [u8; 8] {
        coal.to_bytes()
    }

    /// Decodes a GET's reply, on the driver side.
    pub fn decode_reply(b: &[u8; 8]) -> Coalesce {
        Coalesce::from_bytes(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_round_trips() {
        let coal = Coalesce {
            max_packets: 16,
            max_usecs: 50,
        };
        for c in [
            Command::VqPairsSet(3),
            Command::RxPromisc(true),
            Command::RxAllmulti(false),
            Command::MacAddrSet([2, 0, 0, 0, 0, 9]),
            Command::NotfCoalTx(coal),
            Command::NotfCoalRx(coal),
            Command::VqNotfCoalSet { vqn: 5, coal },
            Command::VqNotfCoalGet { vqn: 5 },
        ] {
            assert_eq!(Command::decode(&c.encode()), Ok(c));
        }
        // Spec layout of VQ_NOTF_COAL SET: vqn, reserved, max_packets, max_usecs.
        let b = Command::VqNotfCoalSet { vqn: 5, coal }.encode();
        assert_eq!(b, [6, 2, 5, 0, 0, 0, 16, 0, 0, 0, 50, 0, 0, 0]);
    }

    #[test]
    fn malformed_commands_are_refused() {
        assert_eq!(Command::decode(&[0]), Err(DecodeError::Short(1)));
        assert_eq!(
            Command::decode(&[99, 1]),
            Err(DecodeError::Unknown {
                class: 99,
                command: 1
            })
        );
        assert!(matches!(
            Command::decode(&[4, 0, 1]),
            Err(DecodeError::BadLength {
                want: 2,
                got: 1,
                ..
            })
        ));
    }
}
