//! The `null` port: guest tx is dropped, guest rx is filled with one generated frame over and
//! over, as fast as the guest posts buffers. It measures the data path without a host below.

use vnet::NetHdr;
use vring::{Error as RingError, Gather, GuestMemory};

use super::{Port, Sent};

#[derive(Debug)]
pub struct NullPort {
    /// Frame bytes after the header, at least 60 (a minimal Ethernet frame).
    size: usize,
    pair: u16,
    /// The frame, header first, for a header of `hdr_len` bytes.
    frame: Vec<u8>,
    hdr_len: usize,
}

impl NullPort {
    pub fn new(size: usize, pair: u16) -> NullPort {
        let mut port = NullPort {
            size,
            pair,
            frame: Vec::new(),
            hdr_len: 0,
        };
        port.build_frame(vnet::HDR_LEN);
        port
    }

    /// A broadcast frame of the IEEE local experimental ethertype from a MAC naming the pair.
    fn build_frame(&mut self, hdr_len: usize) {
        let mut f = vec![0u8; hdr_len + self.size.max(60)];
        let h = NetHdr {
            num_buffers: 1,
            ..NetHdr::default()
        }
        .to_bytes();
        f[..hdr_len].copy_from_slice(&h[..hdr_len]);
        let eth = &mut f[hdr_len..];
        eth[..6].copy_from_slice(&[0xff; 6]);
        eth[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, self.pair as u8]);
        eth[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
        self.frame = f;
        self.hdr_len = hdr_len;
    }
}

impl Port for NullPort {
    /// Bursts: dropping a frame costs nothing, and the tx path's work per call is then spread
    /// over many frames.
    fn tx_batch(&self) -> usize {
        vring::memory::MAX_URING_BATCH
    }

    /// Guest tx is dropped unread.
    fn send(
        &mut self,
        _mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        sent.resize(sent.len() + frames.len(), Sent::Taken);
        Ok(())
    }

    /// The generated frame, rebuilt when the header length changes.
    fn repeated_frame(&mut self, hdr_len: usize) -> Option<&mut [u8]> {
        if self.hdr_len != hdr_len {
            self.build_frame(hdr_len);
        }
        Some(&mut self.frame)
    }

    fn readable(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use testkit::Pair;
    use vnet::feature;
    use vring::Features;

    use super::*;
    use crate::queue::QueueId;
    use crate::rx::RxPath;
    use crate::testing::{post_rx, setup, shared, used};

    #[test]
    fn rx_is_filled_with_the_generated_frame_up_to_the_room_given() {
        let f = Features::VERSION_1.union(feature::MRG_RXBUF);
        let mut s = setup(QueueId::Rx(0), f);
        post_rx(&mut s.driver, 10, 256);
        let mut port = NullPort::new(64, 3);
        let mut rx = RxPath::with_queue(s.runtime);
        let got = rx.receive(&mut port, &shared(), 6).unwrap();
        assert_eq!((got.frames, got.bytes), (6, 6 * 64));
        let got = rx.receive(&mut port, &shared(), 6).unwrap();
        assert_eq!(got.frames, 4, "only 4 buffers left");
        assert_eq!(rx.receive(&mut port, &shared(), 6).unwrap().frames, 0);
        rx.queue_mut().unwrap().flush();
        let used = used(&mut s.driver);
        assert_eq!(used.len(), 10);
        assert!(used
            .iter()
            .all(|&(_, len)| len as usize == vnet::HDR_LEN + 64));
        // Broadcast, from a MAC that names the pair.
        let mut eth = [0u8; 12];
        s.mem
            .read(
                Pair::buf(0, 0)
                    .addr
                    .checked_add(vnet::HDR_LEN as u64)
                    .unwrap(),
                &mut eth,
            )
            .unwrap();
        assert_eq!(eth, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 3]);
    }
}
