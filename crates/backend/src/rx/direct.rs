//! Reading a host frame straight into the guest's rx buffers: once the guest has posted enough
//! for the largest frame, one readv (or a port's equivalent) fills them, with no copy in this
//! process; the buffers stay posted from one frame to the next.

use std::io;

use vnet::feature;
use vring::{Error as RingError, GuestMemory, Reader, Segment, Writer, MAX_IOVECS};

use super::copy::post_overflow;
use super::{Direct, RxPath, MAX_MERGED_BUFFERS};
use crate::shared::Shared;

impl RxPath {
    /// Reads one frame (header first) with `read` straight into the guest's buffers, with no
    /// copy in this process, once enough are posted for a frame of `max_frame` bytes: one
    /// chain without MRG_RXBUF, else as many merged buffers as it takes. The buffers stay
    /// posted from one frame to the next; a frame uses the oldest ones (so IN_ORDER holds),
    /// and one the receive filter refuses uses none. `read` gets the posted buffers' writable
    /// segments and `tail`, where whatever they cannot hold lands: with MRG_RXBUF that part is
    /// copied into more buffers, else (or when the guest has no more) the frame is dropped and
    /// counted, as [`RxPath::deliver`] does with a frame too long for its buffers.
    ///
    /// A ring error (a buffer outside memory, one with no writable bytes) is returned, to break
    /// the queue. The caller has checked that the queue is usable.
    pub fn receive_direct<F>(
        &mut self,
        shared: &Shared,
        max_frame: usize,
        tail: &mut [u8],
        read: F,
    ) -> Result<Direct, RingError>
    where
        F: FnOnce(&GuestMemory, &[Segment], &mut [u8]) -> Result<io::Result<usize>, RingError>,
    {
        let Some(rx) = self.queue.as_mut() else {
            return Ok(Direct::NoRoom);
        };
        let features = rx.features();
        let mergeable = features.contains(feature::MRG_RXBUF);
        let hdr_len = vnet::hdr_len(features);
        let max_buffers = MAX_MERGED_BUFFERS.min(rx.size() as usize);
        let mut segments: usize = self.posted.iter().map(|c| c.writable().len()).sum();
        // Post buffers for the largest frame, within what one readv takes (the tail last).
        let mut limited = false;
        while self.posted_bytes < max_frame as u64 {
            if (!mergeable && !self.posted.is_empty()) || self.posted.len() == max_buffers {
                limited = true;
                break;
            }
            let mut c = self.spare.pop().unwrap_or_default();
            if !rx.pop_into(&mut c)? {
                self.spare.push(c);
                break;
            }
            let n = c.writable().len();
            if c.writable_len() == 0 {
                return Err(RingError::NoWritableBytes { head: c.head() });
            }
            if segments + n > MAX_IOVECS - 1 {
                rx.undo_pop(1);
                self.spare.push(c);
                limited = true;
                break;
            }
            segments += n;
            self.posted_bytes += c.writable_len();
            self.posted.push_back(c);
        }
        // The header and the Ethernet header must land in guest buffers (the filter reads the
        // destination there, and num_buffers is written there).
        let least = (hdr_len + 14) as u64;
        if (self.posted_bytes < max_frame as u64 && !limited) || self.posted_bytes < least {
            // The guest has not posted enough (yet): read through the caller's buffer, which
            // can wait for more without holding these.
            self.unpost();
            return Ok(Direct::NoRoom);
        }
        self.segs.clear();
        for c in &self.posted {
            self.segs.extend_from_slice(c.writable());
        }
        let n = match read(rx.memory(), &self.segs, tail)? {
            // End of file: a TAP never has one, but then nothing was read either.
            Ok(0) => return Ok(Direct::Empty),
            Ok(n) => n,
            // WouldBlock: nothing waits. Another error (the TAP going down): nothing read
            // either, and the fd says when to try again.
            Err(_) => return Ok(Direct::Empty),
        };
        let in_guest = (n as u64).min(self.posted_bytes) as usize;
        let mut dst = [0u8; 6];
        let dst_len = in_guest.saturating_sub(hdr_len).min(6);
        let mut r = Reader::new(rx.memory(), &self.segs);
        r.skip(hdr_len as u64)?;
        r.read_exact(&mut dst[..dst_len])?;
        if !shared.accepts(&dst[..dst_len]) {
            rx.counters().filtered.add(1);
            // The bytes landed in buffers that stay posted: marked all the same, so that
            // during a migration the destination's memory is the source's.
            rx.log_write(&self.segs, in_guest as u64);
            return Ok(Direct::Dropped);
        }
        if n > in_guest {
            // Longer than the posted buffers: copy the rest into more, if the guest has them.
            let over = &tail[..n - in_guest];
            if !mergeable || !post_overflow(rx, &mut self.posted, &mut self.spare, over)? {
                rx.counters().dropped.add(1);
                rx.log_write(&self.segs, in_guest as u64);
                return Ok(Direct::Dropped);
            }
        }
        // The frame takes the oldest buffers it fills.
        let mut left = n as u64;
        let mut used = 0usize;
        for c in &self.posted {
            if left == 0 {
                break;
            }
            left -= left.min(c.writable_len());
            used += 1;
        }
        if hdr_len == vnet::HDR_LEN {
            // num_buffers: the TAP leaves those two bytes unwritten. 1 without MRG_RXBUF.
            let count = (used as u16).to_le_bytes();
            let at = vnet::NUM_BUFFERS_OFFSET as usize;
            Writer::at(rx.memory(), &self.segs, at as u64)?.write_all(&count)?;
        }
        if !features.contains(feature::GUEST_CSUM) {
            // The TAP marks a frame a NIC checked DATA_VALID whatever its offloads: a guest
            // without GUEST_CSUM gets flags zero (VIRTIO 1.2 5.1.6.4.1).
            Writer::new(rx.memory(), &self.segs).write_all(&[0])?;
        }
        let mut left = n as u64;
        for i in 0..used {
            let c = self.posted.pop_front().expect("counted above");
            let take = left.min(c.writable_len());
            rx.add_used_written(&c, take as u32, i + 1 == used)?;
            left -= take;
            self.posted_bytes = self.posted_bytes.saturating_sub(c.writable_len());
            self.spare.push(c);
        }
        Ok(Direct::Delivered(n))
    }
}
