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
const MAC_TABLE_SET: u8 = vn::VIRTIO_NET_CTRL_MAC_TABLE_SET as u8;
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

/// Addresses a MAC_TABLE_SET list keeps (QEMU's `MAC_TABLE_ENTRIES`). A longer list
/// overflows: the filter then takes every address of that kind, as QEMU's does, which stays
/// correct (the guest's stack filters again) where dropping would not.
pub const MAC_TABLE_ENTRIES: usize = 64;

/// One list of MAC_TABLE_SET (spec 5.1.6.5.2): unicast or multicast addresses the driver
/// wants besides its own, up to [`MAC_TABLE_ENTRIES`], or overflowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MacTable {
    macs: [[u8; 6]; MAC_TABLE_ENTRIES],
    len: u8,
    overflow: bool,
}

impl Default for MacTable {
    fn default() -> MacTable {
        MacTable {
            macs: [[0; 6]; MAC_TABLE_ENTRIES],
            len: 0,
            overflow: false,
        }
    }
}

impl MacTable {
    /// The list of `macs`; overflowed when longer than [`MAC_TABLE_ENTRIES`].
    pub fn new(macs: &[[u8; 6]]) -> MacTable {
        let mut t = MacTable::default();
        if macs.len() > MAC_TABLE_ENTRIES {
            t.overflow = true;
        } else {
            t.macs[..macs.len()].copy_from_slice(macs);
            t.len = macs.len() as u8;
        }
        t
    }

    /// The addresses kept (none once overflowed).
    pub fn macs(&self) -> &[[u8; 6]] {
        &self.macs[..self.len as usize]
    }

    pub fn overflowed(&self) -> bool {
        self.overflow
    }

    /// Whether the list takes `mac`: it holds it, or overflowed.
    pub fn accepts(&self, mac: &[u8; 6]) -> bool {
        self.overflow || self.macs().contains(mac)
    }

    fn encode_into(&self, v: &mut Vec<u8>) {
        v.extend((self.len as u32).to_le_bytes());
        self.macs().iter().for_each(|m| v.extend(m));
    }
}

/// MAC_TABLE_SET's two lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MacTables {
    pub unicast: MacTable,
    pub multicast: MacTable,
}

/// A control command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// MQ VQ_PAIRS_SET: use the first `n` queue pairs.
    VqPairsSet(u16),
    RxPromisc(bool),
    RxAllmulti(bool),
    MacAddrSet([u8; 6]),
    /// MAC_TABLE_SET: the unicast and the multicast addresses to take besides the device's
    /// (boxed: some 800 bytes, where the other commands are a few).
    MacTableSet(Box<MacTables>),
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
    #[error("MAC_TABLE_SET's lists take {want} data bytes, got {got}")]
    MacTableLength { want: usize, got: usize },
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
            Command::MacTableSet(ref t) => {
                v.extend([CLASS_MAC, MAC_TABLE_SET]);
                t.unicast.encode_into(&mut v);
                t.multicast.encode_into(&mut v);
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
            (CLASS_MAC, MAC_TABLE_SET) => {
                let (unicast, rest) = mac_list(data, data.len())?;
                let (multicast, rest) = mac_list(rest, data.len())?;
                if !rest.is_empty() {
                    return Err(DecodeError::MacTableLength {
                        want: data.len() - rest.len(),
                        got: data.len(),
                    });
                }
                Command::MacTableSet(Box::new(MacTables { unicast, multicast }))
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

/// One list of a MAC_TABLE_SET command at the start of `b` (a le32 count, then that many
/// 6-byte addresses), and the bytes after it; `total` is the command's data length, for the
/// error.
fn mac_list(b: &[u8], total: usize) -> Result<(MacTable, &[u8]), DecodeError> {
    let short = |want: usize| DecodeError::MacTableLength {
        want: total - b.len() + want,
        got: total,
    };
    let (count, rest) = b.split_first_chunk::<4>().ok_or_else(|| short(4))?;
    let count = u32::from_le_bytes(*count) as usize;
    let len = count
        .checked_mul(6)
        .filter(|&n| n <= rest.len())
        .ok_or_else(|| short(4usize.saturating_add(count.saturating_mul(6))))?;
    let (macs, rest) = rest.split_at(len);
    let table = if count > MAC_TABLE_ENTRIES {
        MacTable {
            overflow: true,
            ..MacTable::default()
        }
    } else {
        let mut t = MacTable::default();
        for (m, b) in t.macs.iter_mut().zip(macs.chunks_exact(6)) {
            m.copy_from_slice(b);
        }
        t.len = count as u8;
        t
    };
    Ok((table, rest))
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
            Command::MacTableSet(Box::new(MacTables {
                unicast: MacTable::new(&[[2, 0, 0, 0, 0, 7]]),
                multicast: MacTable::new(&[[0x33, 0x33, 0, 0, 0, 1], [1, 0, 0x5e, 0, 0, 0xfb]]),
            })),
            Command::MacTableSet(Box::default()),
            Command::NotfCoalTx(coal),
            Command::NotfCoalRx(coal),
            Command::VqNotfCoalSet { vqn: 5, coal },
            Command::VqNotfCoalGet { vqn: 5 },
        ] {
            assert_eq!(Command::decode(&c.encode()), Ok(c.clone()));
        }
        // Spec layout of MAC_TABLE_SET: le32 count and addresses, unicast then multicast.
        let t = Command::MacTableSet(Box::new(MacTables {
            unicast: MacTable::default(),
            multicast: MacTable::new(&[[1, 2, 3, 4, 5, 6]]),
        }));
        assert_eq!(t.encode(), [1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 2, 3, 4, 5, 6]);
        // Spec layout of VQ_NOTF_COAL SET: vqn, reserved, max_packets, max_usecs.
        let b = Command::VqNotfCoalSet { vqn: 5, coal }.encode();
        assert_eq!(b, [6, 2, 5, 0, 0, 0, 16, 0, 0, 0, 50, 0, 0, 0]);
    }

    /// A list longer than the table keeps nothing and takes every address of its kind, as
    /// QEMU's; its bytes are still skipped exactly, to the multicast list after it.
    #[test]
    fn a_mac_table_list_past_64_entries_overflows() {
        let mut b = vec![1, 0];
        b.extend(65u32.to_le_bytes());
        (0..65u8).for_each(|i| b.extend([2, 0, 0, 0, 1, i]));
        b.extend(1u32.to_le_bytes());
        b.extend([1, 0, 0x5e, 0, 0, 1]);
        let Ok(Command::MacTableSet(t)) = Command::decode(&b) else {
            panic!("refused");
        };
        let MacTables { unicast, multicast } = *t;
        assert!(unicast.overflowed() && unicast.macs().is_empty());
        assert!(unicast.accepts(&[2, 0, 0, 0, 9, 9]));
        assert_eq!(multicast.macs(), &[[1, 0, 0x5e, 0, 0, 1]]);
        assert!(!multicast.accepts(&[1, 0, 0x5e, 0, 0, 2]));
    }

    #[test]
    fn malformed_mac_tables_are_refused() {
        let table = |v: &[u8]| {
            let mut b = vec![1, 0];
            b.extend(v);
            Command::decode(&b)
        };
        let bad =
            |r: Result<Command, DecodeError>| matches!(r, Err(DecodeError::MacTableLength { .. }));
        // No multicast list; a count past the bytes; a count that overflows; bytes after.
        assert!(bad(table(&[0, 0, 0, 0])));
        assert!(bad(table(&[2, 0, 0, 0, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0])));
        assert!(bad(table(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])));
        assert!(bad(table(&[0, 0, 0, 0, 0, 0, 0, 0, 7])));
        assert!(table(&[0, 0, 0, 0, 0, 0, 0, 0]).is_ok());
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
