//! The `echo` port: each guest tx frame comes back on guest rx, header and all. Frames wait
//! here between the two, up to [`QUEUE_FRAMES`]; beyond, the port pushes back and guest tx
//! waits on its ring until rx has taken some, so nothing is lost between the two while both
//! run.

use std::collections::VecDeque;
use std::io;

use vring::{Error as RingError, Features, Gather, GuestMemory, Reader, Segment, Writer};

use super::{Port, Sent};

/// Frames that wait for guest rx, at most: as many as a ring of 256 holds.
pub const QUEUE_FRAMES: usize = 256;

/// The largest frame echoed: a 64 KiB GSO frame and its header; a longer one is cut.
const MAX_FRAME: usize = super::MAX_RX_FRAME;

#[derive(Debug, Default)]
pub struct EchoPort {
    /// Frames on their way back, oldest first.
    frames: VecDeque<Vec<u8>>,
    /// Buffers of frames already echoed, for the next ones.
    free: Vec<Vec<u8>>,
}

impl Port for EchoPort {
    /// Copies each frame (the header copy the tx path hands over, then the frame in guest
    /// memory); [`Sent::Busy`] once [`QUEUE_FRAMES`] wait.
    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        for f in frames {
            if self.frames.len() >= QUEUE_FRAMES {
                sent.push(Sent::Busy);
                break;
            }
            let mut buf = self.free.pop().unwrap_or_default();
            let body = (f.body.len() as usize).min(MAX_FRAME.saturating_sub(f.head.len()));
            buf.clear();
            buf.extend_from_slice(f.head);
            let at = buf.len();
            buf.resize(at + body, 0);
            if let Err(e) = Reader::from_tail(mem, f.body).read_exact(&mut buf[at..]) {
                self.free.push(buf);
                return Err(e);
            }
            self.frames.push_back(buf);
            sent.push(Sent::Taken);
        }
        Ok(())
    }

    /// The oldest frame waiting, into `segs` then `tail`; cut if both together are shorter.
    fn recv(
        &mut self,
        mem: &GuestMemory,
        segs: &[Segment],
        tail: &mut [u8],
    ) -> Result<io::Result<usize>, RingError> {
        let Some(frame) = self.frames.pop_front() else {
            return Ok(Err(io::ErrorKind::WouldBlock.into()));
        };
        let in_guest = Writer::new(mem, segs).write(&frame);
        let n = match in_guest {
            Ok(n) => n,
            Err(e) => {
                self.free.push(frame);
                return Err(e);
            }
        };
        let rest = &frame[n..];
        let k = rest.len().min(tail.len());
        tail[..k].copy_from_slice(&rest[..k]);
        let len = n + k;
        self.free.push(frame);
        Ok(Ok(len))
    }

    /// The frames waiting were the stopped queues' guest's: a next frontend does not get
    /// them.
    fn queue_stopped(&mut self) {
        self.free.extend(self.frames.drain(..));
    }

    /// Whatever the guest sent, up to [`MAX_FRAME`], whatever its features say.
    fn max_frame(&self, _features: Features, _mtu: u16) -> usize {
        MAX_FRAME
    }

    fn readable(&self) -> bool {
        !self.frames.is_empty()
    }

    fn writable(&self) -> bool {
        self.frames.len() < QUEUE_FRAMES
    }
}

#[cfg(test)]
mod tests {
    use testkit::Pair;
    use vnet::feature;
    use vring::Tail;

    use super::*;
    use crate::queue::QueueId;
    use crate::rx::RxPath;
    use crate::testing::{post_rx, setup, shared, used};

    #[test]
    fn a_frame_comes_back_on_rx_once_it_has_buffers_and_a_full_port_pushes_back() {
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
        let mut sent = Vec::new();
        let gather = Gather::new(&[], Tail::new(chain.readable()));
        port.send(tx.runtime.memory(), &[gather], &mut sent)
            .unwrap();
        assert_eq!(sent, [Sent::Taken]);
        assert!(port.readable());
        // No rx buffer yet: the frame waits in the port.
        assert_eq!(path.receive(&mut port, &s, 64).unwrap().frames, 0);
        assert!(port.readable());
        post_rx(&mut rx_driver, 1, 1024);
        assert_eq!(path.receive(&mut port, &s, 64).unwrap().frames, 1);
        let q = path.queue_mut().unwrap();
        q.flush();
        assert_eq!(used(&mut rx_driver), [(0, 200)]);
        let mut back = vec![0u8; 200];
        rx_mem.read(Pair::buf(0, 0).addr, &mut back).unwrap();
        // The header's num_buffers is the device's; the frame after it comes back as sent.
        assert_eq!(back[vnet::HDR_LEN..], frame[vnet::HDR_LEN..]);
        assert_eq!(u16::from_le_bytes([back[10], back[11]]), 1);
        // A full port pushes back, and takes frames again once rx has taken one.
        sent.clear();
        let many = vec![gather; QUEUE_FRAMES + 1];
        port.send(tx.runtime.memory(), &many, &mut sent).unwrap();
        assert_eq!(sent.len(), QUEUE_FRAMES + 1);
        assert_eq!(sent[QUEUE_FRAMES], Sent::Busy);
        assert!(!port.writable());
        post_rx(&mut rx_driver, 1, 1024);
        assert_eq!(path.receive(&mut port, &s, 64).unwrap().frames, 1);
        assert!(port.writable());
    }
}
