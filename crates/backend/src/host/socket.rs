//! The `socket` port: guest frames to and from one end of a connected unix datagram socket,
//! one frame per message with the virtio-net header first, as a TAP with IFF_VNET_HDR hands
//! them over. Whoever holds the other end is the host side. Its frames arrive when it sends
//! them, from its own thread, on an fd the worker polls and sleeps on as it does a TAP's:
//! `virtnet bench` puts there a peer that acknowledges the guest's stream (experiment 4b), as
//! the remote end of a TCP connection behind a TAP would.
//!
//! tx writes each frame straight from guest memory (one writev, one message); a frame the
//! socket cannot take yet (its send buffer is full) is pushed back, and waits on the tx ring
//! until the socket is writable, as with a TAP. Headers are not checked: no kernel builds a
//! packet from them here, the peer reads them.
//!
//! rx reads one message per readv, as the rx path asks. A message longer than the largest frame
//! the guest can expect (an MTU's, or 64 KiB with receive offloads) is dropped and counted by
//! the rx path: a kernel TAP never hands out one, and a read cuts a datagram to the buffers it
//! is given, so a longer one must not pass either whole or cut.
//!
//! The socket is held as a `File`, so that its frame I/O makes a TAP's system calls (read,
//! readv, writev, poll), the ones the workers' seccomp filter allows.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;

use vring::{Error as RingError, Gather, GuestMemory, Segment};

use super::{send_each, Port, Sent};

#[derive(Debug)]
pub struct SocketPort {
    socket: File,
}

impl SocketPort {
    /// The port over `socket`, which must be connected (one end of a socket pair, say). It is
    /// made non-blocking, which every handle on the same open file then is.
    pub fn new(socket: UnixDatagram) -> io::Result<SocketPort> {
        socket.peer_addr()?;
        socket.set_nonblocking(true)?;
        Ok(SocketPort {
            socket: File::from(OwnedFd::from(socket)),
        })
    }
}

impl Port for SocketPort {
    /// Asking whether a message waits is a poll(2), as for a TAP.
    fn poll_every(&self) -> u32 {
        8
    }

    fn send(
        &mut self,
        mem: &GuestMemory,
        frames: &[Gather<'_>],
        sent: &mut Vec<Sent>,
    ) -> Result<(), RingError> {
        // The peer gone (ECONNREFUSED) or refusing the message (EMSGSIZE) drops the frame; a
        // full socket pushes back.
        send_each(frames, sent, |f| mem.writev_gather(self.socket.as_fd(), f))
    }

    fn recv(
        &mut self,
        mem: &GuestMemory,
        segs: &[Segment],
        tail: &mut [u8],
    ) -> Result<io::Result<usize>, RingError> {
        mem.readv_with_tail(self.socket.as_fd(), segs, tail)
    }

    fn readable(&self) -> bool {
        virtnet_sys::readable_now(self.socket.as_raw_fd())
    }

    fn writable(&self) -> bool {
        virtnet_sys::writable_now(self.socket.as_raw_fd())
    }

    fn fd(&self) -> Option<RawFd> {
        Some(self.socket.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use testkit::Pair;
    use vnet::feature;
    use vring::Features;

    use super::*;
    use crate::host::MAX_RX_FRAME;
    use crate::queue::QueueId;
    use crate::rx::{Received, RxPath};
    use crate::testing::{post_rx, setup, shared, used};

    fn port() -> (SocketPort, UnixDatagram) {
        let (ours, peer) = UnixDatagram::pair().unwrap();
        (SocketPort::new(ours).unwrap(), peer)
    }

    #[test]
    fn an_unconnected_socket_is_refused() {
        let e = SocketPort::new(UnixDatagram::unbound().unwrap()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    }

    #[test]
    fn a_device_takes_one_socket_per_pair() {
        let (a, _b) = UnixDatagram::pair().unwrap();
        let config = crate::BackendConfig {
            pairs: 2,
            io: crate::IoMode::Socket(crate::config::HostSockets::new(vec![a])),
            ..Default::default()
        };
        let e = crate::Device::new(config).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn a_guest_frame_is_one_message_header_first_and_a_full_socket_pushes_back() {
        let mut s = setup(QueueId::Tx(0), Features::VERSION_1);
        let (mut port, peer) = port();
        // A 12-byte header and a 1500-byte frame, in two buffers.
        let frame: Vec<u8> = (0..1512u32).map(|i| i as u8).collect();
        s.mem.write(Pair::buf(0, 0).addr, &frame[..12]).unwrap();
        s.mem.write(Pair::buf(1, 0).addr, &frame[12..]).unwrap();
        let mut sent = 0;
        let busy = loop {
            s.driver
                .add(&[Pair::buf(0, 12), Pair::buf(1, 1500)], &[], 0)
                .unwrap();
            let c = s.runtime.engine().pop().unwrap().unwrap();
            let mut out = Vec::new();
            let frame = [Gather::from(c.readable())];
            port.send(s.runtime.memory(), &frame, &mut out).unwrap();
            match out[..] {
                [Sent::Taken] => sent += 1,
                [other] => break other,
                _ => panic!("{out:?}"),
            }
            s.runtime.add_used(c.head(), 0).unwrap();
            s.runtime.flush();
            used(&mut s.driver);
            assert!(sent < 10_000, "the socket never filled");
        };
        assert_eq!(busy, Sent::Busy);
        assert!(!port.writable());
        let mut buf = vec![0u8; 4096];
        for _ in 0..sent {
            let n = peer.recv(&mut buf).unwrap();
            assert_eq!(buf[..n], frame[..]);
        }
        assert!(port.writable());
    }

    #[test]
    fn a_peer_message_lands_in_guest_rx_when_it_is_sent() {
        let f = Features::VERSION_1.union(feature::MRG_RXBUF);
        let mut s = setup(QueueId::Rx(0), f);
        let (mut port, peer) = port();
        post_rx(&mut s.driver, 4, 2048);
        let mut rx = RxPath::with_queue(s.runtime);
        let sh = shared();
        assert!(!port.readable());
        assert_eq!(rx.receive(&mut port, &sh, 64).unwrap(), Received::default());
        let mut msg = vec![0u8; vnet::HDR_LEN];
        msg.extend((0..64u8).map(|i| i ^ 0x5a));
        peer.send(&msg).unwrap();
        assert!(port.readable());
        let got = rx.receive(&mut port, &sh, 64).unwrap();
        assert_eq!((got.frames, got.bytes, got.dropped), (1, 64, 0));
        rx.queue_mut().unwrap().flush();
        assert_eq!(used(&mut s.driver), [(0, msg.len() as u32)]);
        let mut back = vec![0u8; msg.len()];
        s.mem.read(Pair::buf(0, 0).addr, &mut back).unwrap();
        assert_eq!(back[vnet::HDR_LEN..], msg[vnet::HDR_LEN..]);
        // num_buffers, which the sender leaves to the device.
        assert_eq!(u16::from_le_bytes([back[10], back[11]]), 1);
        assert!(!port.readable());
    }

    #[test]
    fn a_message_longer_than_the_largest_frame_is_dropped_and_counted() {
        let f = Features::VERSION_1.union(feature::MRG_RXBUF);
        let mut s = setup(QueueId::Rx(0), f);
        let (mut port, peer) = port();
        post_rx(&mut s.driver, 4, 2048);
        let counters = s.runtime.counters().clone();
        let mut rx = RxPath::with_queue(s.runtime);
        let sh = shared();
        // Longer than the MTU's frame (1530 bytes with its header), and than any frame.
        peer.send(&[0u8; 3000]).unwrap();
        peer.send(&vec![0u8; MAX_RX_FRAME + 100]).unwrap();
        let mut small = vec![0u8; vnet::HDR_LEN];
        small.extend([0xffu8; 60]);
        peer.send(&small).unwrap();
        for dropped in 1..=2 {
            let got = rx.receive(&mut port, &sh, 64).unwrap();
            assert_eq!((got.frames, got.dropped), (0, 1));
            assert_eq!(counters.dropped.get(), dropped);
        }
        let got = rx.receive(&mut port, &sh, 64).unwrap();
        assert_eq!(
            (got.frames, got.bytes),
            (1, 60),
            "the next message is whole"
        );
        rx.queue_mut().unwrap().flush();
        assert_eq!(used(&mut s.driver), [(0, small.len() as u32)]);
    }
}
