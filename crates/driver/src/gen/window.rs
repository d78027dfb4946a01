//! `virtnet gen --mode window`: a windowed stream, both its ends. The driver sends a window
//! of frames, each carrying the window's number, then waits for the host side to acknowledge
//! the window before it sends the next, as a TCP sender held by its window waits for the
//! receiver's ack. The host side ([`Acker`]) answers every `window`-th frame it gets with one
//! small ack frame ([`ack_frame`]) naming the window of that frame.
//!
//! The stream's pace is then set by how soon the ack reaches the driver: a device that busy
//! polls its tx ring without looking at the host side leaves the ack waiting for the poll to
//! end (the case of vhost_net before "rx busy polling in tx path", seed 003).

use super::frames;

/// Where a frame carries its window's number (8 bytes, little-endian): the start of the UDP
/// payload of [`frames::udp4_frame`], where rr frames carry their sequence number.
pub const NUMBER_AT: usize = frames::ETH_HLEN + 20 + frames::UDP_HDR_LEN;
/// What follows the window's number in an ack, and tells it from any other frame.
pub const ACK_MAGIC: [u8; 8] = *b"vnet-ack";
/// An ack's length: a minimal Ethernet frame (no FCS).
pub const ACK_LEN: usize = 60;

/// Writes window number `window` into `frame`.
pub fn stamp(frame: &mut [u8], window: u64) {
    frame[NUMBER_AT..NUMBER_AT + 8].copy_from_slice(&window.to_le_bytes());
}

/// The window number `frame` carries, if it is long enough to carry one.
pub fn number(frame: &[u8]) -> Option<u64> {
    let b = frame.get(NUMBER_AT..NUMBER_AT + 8)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

/// The ack of window `window`, from `src` to `dst`.
pub fn ack_frame(window: u64, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut payload = window.to_le_bytes().to_vec();
    payload.extend_from_slice(&ACK_MAGIC);
    frames::udp4_frame(ACK_LEN, dst, src, &payload)
}

/// The window `frame` acknowledges, if it is an ack.
pub fn acked(frame: &[u8]) -> Option<u64> {
    let magic = frame.get(NUMBER_AT + 8..NUMBER_AT + 16)?;
    (magic == ACK_MAGIC).then(|| number(frame)).flatten()
}

/// The host side's end: counts the frames it gets and says when to acknowledge.
#[derive(Clone, Debug)]
pub struct Acker {
    window: u64,
    frames: u64,
    acks: u64,
}

impl Acker {
    /// Acknowledges every `window`-th frame (at least every one).
    pub fn new(window: usize) -> Acker {
        Acker {
            window: window.max(1) as u64,
            frames: 0,
            acks: 0,
        }
    }

    /// Counts one frame (Ethernet header first). After every `window`-th, returns the ack to
    /// send back: to the frame's source from its destination, naming the frame's window
    /// (`u64::MAX` if it is too short to carry one).
    pub fn on_frame(&mut self, frame: &[u8]) -> Option<Vec<u8>> {
        self.frames += 1;
        if !self.frames.is_multiple_of(self.window) {
            return None;
        }
        self.acks += 1;
        let mac = |at: usize| -> [u8; 6] {
            frame
                .get(at..at + 6)
                .and_then(|m| m.try_into().ok())
                .unwrap_or([0xff; 6])
        };
        let window = number(frame).unwrap_or(u64::MAX);
        Some(ack_frame(window, mac(6), mac(0)))
    }

    /// Frames counted, and acks given, so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    pub fn acks(&self) -> u64 {
        self.acks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const DEVICE: [u8; 6] = [0x52, 0x54, 0, 0x12, 0x34, 0x56];

    #[test]
    fn every_window_th_frame_is_acked_with_its_window_back_to_its_sender() {
        let mut a = Acker::new(3);
        let mut f = frames::udp4_frame(1500, DEVICE, DRIVER, &[]);
        let mut acks = Vec::new();
        for w in 1..=4u64 {
            stamp(&mut f, w);
            for _ in 0..3 {
                acks.extend(a.on_frame(&f));
            }
        }
        assert_eq!((a.frames(), a.acks()), (12, 4));
        let windows: Vec<u64> = acks.iter().filter_map(|k| acked(k)).collect();
        assert_eq!(windows, [1, 2, 3, 4]);
        let k = &acks[0];
        assert_eq!(k.len(), ACK_LEN);
        assert_eq!((&k[..6], &k[6..12]), (&DRIVER[..], &DEVICE[..]));
    }

    #[test]
    fn only_acks_are_acks() {
        let mut f = frames::udp4_frame(1500, DEVICE, DRIVER, &[]);
        stamp(&mut f, 7);
        assert_eq!(number(&f), Some(7));
        assert_eq!(acked(&f), None, "a window's frame is no ack");
        assert_eq!(acked(&ack_frame(7, DRIVER, DEVICE)), Some(7));
        assert_eq!(acked(&[0u8; 20]), None);
        // A frame too short to carry a number is still counted, and acked as u64::MAX.
        let mut a = Acker::new(1);
        assert_eq!(acked(&a.on_frame(&[0u8; 20]).unwrap()), Some(u64::MAX));
    }
}
