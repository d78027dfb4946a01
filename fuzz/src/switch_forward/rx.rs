//! One rx queue of a guest port: the driver's end (buffers posted, frames taken back and
//! checked), and what the model expects of it (the frames it should hold, in order, and its
//! counters), kept as the port's `Sink` puts a batch's frames into the ring.

use std::collections::VecDeque;

use vnet::{NetHdr, HDR_LEN};
use vring::{Buf, DriverQueue, GuestAddress, GuestMemory};

use super::model::{Fate, Ring, RxMode};

/// An rx queue's counters as the model keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RxCounts {
    pub(super) packets: u64,
    pub(super) bytes: u64,
    pub(super) dropped: u64,
    pub(super) rx_missed: u64,
    pub(super) filtered: u64,
}

/// One rx queue: the driver's end, and what the model expects of it.
pub(super) struct RxQueue {
    pub(super) driver: Option<DriverQueue<u32>>,
    /// Tokens the driver got back, to post again.
    pub(super) free: Vec<u32>,
    pub(super) lens: [u32; 2],
    pub(super) readable_at: Option<u32>,
    /// Where token t's buffer is: `data + t * stride`.
    pub(super) data: u64,
    pub(super) stride: u64,
    pub(super) ring: Ring,
    /// Frames the ring should hold, in order: header (with `num_buffers`) and bytes, and
    /// whether it may be missing (see [`RxQueue::broke`]).
    pub(super) want: VecDeque<(NetHdr, Vec<u8>, bool)>,
    /// Where the frames of the batch being forwarded start in `want`.
    pub(super) group: usize,
    /// The frames the sink passes as sent, gathered into a chunk that goes into the ring at
    /// once: at the end of a batch, or before a frame it resolves.
    pub(super) chunk: Vec<(NetHdr, Vec<u8>)>,
    pub(super) counts: RxCounts,
}

impl RxQueue {
    /// Posts the free buffers, in token order.
    pub(super) fn post(&mut self) {
        let Some(driver) = self.driver.as_mut() else {
            return;
        };
        let mut free = std::mem::take(&mut self.free);
        free.sort_unstable();
        for t in free {
            let addr = GuestAddress(self.data + t as u64 * self.stride);
            let len = self.lens[t as usize % 2];
            let readable = Some(t) == self.readable_at;
            let added = if readable {
                driver.add(&[Buf::new(addr, len.max(1))], &[], t)
            } else {
                driver.add(&[], &[Buf::new(addr, len)], t)
            };
            if added.is_err() {
                self.free.push(t);
                continue;
            }
            self.ring.posted.push_back(if readable { 0 } else { len });
        }
        driver.kick_prepare();
    }

    /// Offers one frame, as sent or resolved, to the ring: what became of it, counted (the
    /// frames delivered are left to the caller, which counts them when the sink does).
    pub(super) fn offer(&mut self, hdr: &NetHdr, bytes: &[u8], mode: &RxMode) -> Fate {
        if !mode.accepts(bytes) {
            self.counts.filtered += 1;
            return Fate::Filtered;
        }
        let fate = self.ring.offer((HDR_LEN + bytes.len()) as u64);
        match fate {
            Fate::Delivered(n) => {
                let h = NetHdr {
                    num_buffers: n as u16,
                    ..*hdr
                };
                self.want.push_back((h, bytes.to_vec(), false));
            }
            Fate::TooLarge => self.counts.dropped += 1,
            Fate::NoRoom => self.counts.rx_missed += 1,
            Fate::Filtered | Fate::Gone => {}
            Fate::Broke => self.broke(),
        }
        fate
    }

    /// Puts the chunk into the ring, as the sink does: once a frame finds no room the rest
    /// of the chunk finds none either; the frames are counted once all are in, so not at all
    /// when the ring breaks. Whether it broke.
    pub(super) fn end_chunk(&mut self, mode: &RxMode) -> bool {
        let (mut packets, mut bytes, mut missed) = (0, 0, false);
        let chunk = std::mem::take(&mut self.chunk);
        let n = chunk.len() as u64;
        for (h, b) in chunk {
            if missed {
                self.counts.rx_missed += 1;
                continue;
            }
            match self.offer(&h, &b, mode) {
                Fate::Delivered(_) => {
                    packets += 1;
                    bytes += b.len() as u64;
                }
                Fate::NoRoom => missed = true,
                Fate::Broke => {
                    // The whole chunk is missed, the frames put in before the break too.
                    self.counts.rx_missed += n;
                    return true;
                }
                _ => {}
            }
        }
        self.counts.packets += packets;
        self.counts.bytes += bytes;
        false
    }

    /// The ring broke while the sink delivered a batch's frames: the frames before, in the
    /// ring's buffers and used, are published only if the device's used batch filled
    /// (`vring::DEFAULT_USED_BATCH`) before the break, as the sink calls the guest (and
    /// publishes) only on a ring that works. A broken ring's driver must reset the device,
    /// so they may be missing, the last of them first.
    fn broke(&mut self) {
        for w in self.want.iter_mut().skip(self.group) {
            w.2 = true;
        }
    }

    /// Takes every frame the driver got back and checks it against what the model expects.
    pub(super) fn check(&mut self, mem: &GuestMemory, what: &str) -> usize {
        let Some(driver) = self.driver.as_mut() else {
            return 0;
        };
        let mut got = 0;
        loop {
            let mut bytes = Vec::new();
            let mut buffers = 0usize;
            let mut need = 1usize;
            let mut parsed = false;
            while buffers < need {
                let used = driver.get_used().expect("an honest device");
                let Some((t, len)) = used else {
                    assert_eq!(buffers, 0, "{what}: a frame's buffers were not all used");
                    assert!(
                        self.want.iter().all(|w| w.2),
                        "{what}: frames missing: {:?}",
                        self.want.iter().map(|w| w.0).collect::<Vec<_>>()
                    );
                    self.want.clear();
                    return got;
                };
                self.free.push(t);
                let at = self.data + t as u64 * self.stride;
                assert!(len <= self.lens[t as usize % 2], "{what}: used length");
                let mut b = vec![0u8; len as usize];
                mem.read(GuestAddress(at), &mut b).expect("a posted buffer");
                bytes.extend(b);
                buffers += 1;
                // The header (and its num_buffers) may span buffers.
                if !parsed {
                    need = match bytes.get(..HDR_LEN) {
                        Some(h) => {
                            parsed = true;
                            u16::from_le_bytes([h[10], h[11]]).max(1) as usize
                        }
                        None => buffers + 1,
                    };
                }
            }
            let mut h = [0u8; HDR_LEN];
            h.copy_from_slice(&bytes[..HDR_LEN]);
            let hdr = NetHdr::from_bytes(&h);
            let Some((want_hdr, want, _)) = self.want.pop_front() else {
                panic!("{what}: a frame the model did not send there: {hdr:?}, {bytes:02x?}");
            };
            assert_eq!(hdr, want_hdr, "{what}: frame {got}'s header");
            assert!(
                bytes[HDR_LEN..] == want[..],
                "{what}: frame {got}'s bytes differ: got {} bytes, want {}",
                bytes.len() - HDR_LEN,
                want.len()
            );
            got += 1;
        }
    }
}
