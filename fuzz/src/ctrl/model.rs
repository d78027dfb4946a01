//! The spec-level model of the control-queue device (VIRTIO 1.2 5.1.6.5): the state the
//! commands leave, and the answer each command gets.

use virtnet_backend::{BackendConfig, Shared};

use super::input::{KNOWN, MAX_COMMAND};

/// What the model says the device does with one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Answer {
    pub(super) ok: bool,
    pub(super) reply: Option<[u8; 8]>,
}

/// The device state as the spec says the commands leave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Model {
    pairs: u16,
    active_pairs: u16,
    promisc: bool,
    allmulti: bool,
    mac: [u8; 6],
    /// MAC_TABLE_SET's unicast and multicast lists; None: overflowed (more than 64).
    tables: [Option<Vec<[u8; 6]>>; 2],
    /// (max_packets, max_usecs) per data queue.
    coalesce: Vec<(u32, u32)>,
}

impl Model {
    pub(super) fn new(config: &BackendConfig) -> Model {
        Model {
            pairs: config.pairs,
            active_pairs: config.pairs,
            promisc: true,
            allmulti: false,
            mac: config.mac,
            tables: [Some(Vec::new()), Some(Vec::new())],
            coalesce: vec![(0, 0); 2 * config.pairs as usize],
        }
    }

    pub(super) fn of(shared: &Shared) -> Model {
        let data_queues = 2 * shared.pairs() as usize;
        let (promisc, allmulti) = shared.filter();
        Model {
            pairs: shared.pairs(),
            active_pairs: shared.active_pairs(),
            promisc,
            allmulti,
            mac: shared.mac(),
            tables: {
                let (u, m) = shared.mac_tables();
                [u, m].map(|t| (!t.overflowed()).then(|| t.macs().to_vec()))
            },
            coalesce: shared.tunables()[..data_queues]
                .iter()
                .map(|m| (m.coalesce().max_packets, m.coalesce().max_usecs))
                .collect(),
        }
    }

    /// Applies a command with `writable` device-writable bytes; `None`: no ack at all.
    pub(super) fn apply(&mut self, cmd: &[u8], writable: u64) -> Option<Answer> {
        if writable == 0 {
            return None;
        }
        const ERR: Answer = Answer {
            ok: false,
            reply: None,
        };
        const OK: Answer = Answer {
            ok: true,
            reply: None,
        };
        if cmd.len() > MAX_COMMAND || cmd.len() < 2 {
            return Some(ERR);
        }
        let (class, command, data) = (cmd[0], cmd[1], &cmd[2..]);
        if (class, command) == (1, 0) {
            // MAC_TABLE_SET: two lists, each a le32 count and that many addresses, exactly.
            let mut lists = [None, None];
            let mut at = 0usize;
            for list in &mut lists {
                let Some(count) = data.get(at..at + 4) else {
                    return Some(ERR);
                };
                let n = u32::from_le_bytes(count.try_into().unwrap()) as usize;
                at += 4;
                let Some(macs) = data.get(at..).filter(|m| m.len() / 6 >= n) else {
                    return Some(ERR);
                };
                *list = Some((n <= 64).then(|| {
                    macs[..6 * n]
                        .chunks(6)
                        .map(|m| m.try_into().unwrap())
                        .collect()
                }));
                at += 6 * n;
            }
            if at != data.len() {
                return Some(ERR);
            }
            self.tables = lists.map(|l| l.unwrap_or_default());
            return Some(OK);
        }
        let Some(&(_, _, need)) = KNOWN.iter().find(|k| (k.0, k.1) == (class, command)) else {
            return Some(ERR);
        };
        if data.len() != need {
            return Some(ERR);
        }
        let u16_at = |i: usize| u16::from_le_bytes([data[i], data[i + 1]]);
        let u32_at =
            |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
        let data_queues = 2 * self.pairs as usize;
        match (class, command) {
            (0, 0) => self.promisc = data[0] != 0,
            (0, 1) => self.allmulti = data[0] != 0,
            (1, 1) => self.mac.copy_from_slice(data),
            (4, 0) => {
                let n = u16_at(0);
                if n == 0 || n > self.pairs {
                    return Some(ERR);
                }
                self.active_pairs = n;
            }
            (6, 0) | (6, 1) => {
                let first = if command == 0 { 1 } else { 0 };
                for q in (first..data_queues).step_by(2) {
                    self.coalesce[q] = (u32_at(0), u32_at(4));
                }
            }
            (6, 2) => {
                let vqn = u16_at(0) as usize;
                if vqn >= data_queues {
                    return Some(ERR);
                }
                self.coalesce[vqn] = (u32_at(4), u32_at(8));
            }
            (6, 3) => {
                let vqn = u16_at(0) as usize;
                if writable < 9 || vqn >= data_queues {
                    return Some(ERR);
                }
                let (p, u) = self.coalesce[vqn];
                let mut reply = [0u8; 8];
                reply[..4].copy_from_slice(&p.to_le_bytes());
                reply[4..].copy_from_slice(&u.to_le_bytes());
                return Some(Answer {
                    ok: true,
                    reply: Some(reply),
                });
            }
            _ => unreachable!("KNOWN lists only these"),
        }
        Some(OK)
    }
}
