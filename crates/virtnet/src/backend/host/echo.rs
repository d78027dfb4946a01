//! The `echo` port: each guest tx frame comes back on guest rx, header and all. Guest tx
//! waits while rx has no room, so nothing is lost between the two.

use vring::{Chain, Error as RingError, GuestMemory};

use super::{Host, Received, Sent};
use crate::backend::device::Shared;
use crate::backend::rx::RxPath;
use crate::net;

/// The largest frame echoed: a 64 KiB GSO frame and its header.
const MAX_FRAME: usize = 65536 + net::HDR_LEN + 14 + 4;

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
        let n = read_chain(mem, chain, &mut self.bounce)?;
        match rx.deliver(shared, &mut self.bounce[..n]) {
            Ok(true) => {
                let hdr_len = rx.hdr_len();
                if let Some(q) = rx.queue.as_ref() {
                    let c = &q.metrics.counters;
                    q.metrics.add(&c.packets, 1);
                    q.metrics.add(&c.bytes, n.saturating_sub(hdr_len) as u64);
                }
                Ok(Sent::Taken)
            }
            Ok(false) => Ok(Sent::Later),
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

/// Copies the readable part of `chain` into `buf`; returns the bytes copied.
fn read_chain(mem: &GuestMemory, chain: &Chain, buf: &mut [u8]) -> Result<usize, RingError> {
    let mut n = 0;
    for s in chain.readable() {
        let k = (s.len as usize).min(buf.len() - n);
        mem.read(s.addr, &mut buf[n..n + k])?;
        n += k;
        if n == buf.len() {
            break;
        }
    }
    Ok(n)
}
