//! The `echo` port: each guest tx frame comes back on guest rx, header and all. Guest tx
//! waits while rx has no room, so nothing is lost between the two.

use vring::{Chain, Error as RingError, GuestMemory, Reader};

use super::{Host, Received, Sent};
use crate::rx::{Delivery, RxPath};
use crate::shared::Shared;

/// The largest frame echoed: a 64 KiB GSO frame and its header.
const MAX_FRAME: usize = 65536 + vnet::HDR_LEN + 14 + 4;

#[derive(Debug)]
pub struct EchoPort {
    /// One frame between the rings.
    bounce: Vec<u8>,
}

impl Default for EchoPort {
    fn default() -> Self {
        EchoPort {
            bounce: vec![0u8; MAX_FRAME],
        }
    }
}

impl Host for EchoPort {
    const LOOPBACK: bool = true;

    /// Copies the frame into rx buffers; `Later` when rx has no room (nothing consumed). An
    /// rx error breaks the rx queue only, and the tx frame is consumed.
    fn send(
        &mut self,
        mem: &GuestMemory,
        chain: &Chain,
        rx: &mut RxPath,
        shared: &Shared,
    ) -> Result<Sent, RingError> {
        // The frame, cut at the bounce buffer's size.
        let n = (chain.readable_len() as usize).min(self.bounce.len());
        Reader::new(mem, chain.readable()).read_exact(&mut self.bounce[..n])?;
        match rx.deliver(shared, &mut self.bounce[..n]) {
            Ok(Delivery::Delivered) => {
                let hdr_len = rx.hdr_len();
                if let Some(q) = rx.queue.as_ref() {
                    let c = &q.counters();
                    c.packets.add(1);
                    c.bytes.add(n.saturating_sub(hdr_len) as u64);
                }
                Ok(Sent::Taken)
            }
            // Counted by the rx path; the tx frame is consumed.
            Ok(Delivery::Dropped) => Ok(Sent::Taken),
            Ok(Delivery::NoRoom) => Ok(Sent::Later),
            Err(e) => {
                rx.fail(e);
                Ok(Sent::Taken) // The tx chain is consumed and dropped.
            }
        }
    }

    fn receive(&mut self, _: &mut RxPath, _: &Shared, _: usize) -> Result<Received, RingError> {
        Ok(Received::default()) // Driven from tx.
    }

    fn has_frames(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {

    use testkit::Pair;
    use vnet::feature;
    use vring::Features;

    use super::*;
    use crate::queue::QueueId;
    use crate::testing::{post_rx, setup, shared, used};

    #[test]
    fn a_frame_comes_back_on_rx_or_waits_for_room() {
        let f = Features::VERSION_1.union(feature::MRG_RXBUF);
        let mut tx = setup(QueueId::Tx(0), f);
        let rx = setup(QueueId::Rx(0), f);
        let (mut rx_driver, rx_mem) = (rx.driver, rx.mem);
        let mut path = RxPath::with_queue(rx.runtime);
        let frame: Vec<u8> = (0..200u8).collect();
        tx.mem.write(Pair::buf(0, 0).addr, &frame).unwrap();
        tx.driver.add(&[Pair::buf(0, 200)], &[], 7).unwrap();
        let chain = tx.runtime.engine().pop().unwrap().unwrap();
        let mut port = EchoPort::default();
        let s = shared();
        let send = |port: &mut EchoPort, path: &mut RxPath| {
            port.send(tx.runtime.memory(), &chain, path, &s)
        };
        assert_eq!(
            send(&mut port, &mut path),
            Ok(Sent::Later),
            "no rx buffer yet"
        );
        post_rx(&mut rx_driver, 1, 1024);
        assert_eq!(send(&mut port, &mut path), Ok(Sent::Taken));
        let q = path.queue.as_mut().unwrap();
        q.flush();
        assert_eq!(used(&mut rx_driver), [(0, 200)]);
        assert_eq!(q.counters().packets.get(), 1);
        let mut back = vec![0u8; 200];
        rx_mem.read(Pair::buf(0, 0).addr, &mut back).unwrap();
        // The header's num_buffers is the device's; the frame after it comes back as sent.
        assert_eq!(back[vnet::HDR_LEN..], frame[vnet::HDR_LEN..]);
        assert_eq!(u16::from_le_bytes([back[10], back[11]]), 1);
    }
}
