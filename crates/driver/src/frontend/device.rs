//! What the driver asks of the connected device beyond its queues: its status (SET_STATUS,
//! GET_STATUS), its MTU (NET_SET_MTU), its config space (GET_CONFIG), and whether it is still
//! there (the socket closing). rust-vmm's `Frontend` cannot send SET_STATUS, GET_STATUS or
//! NET_SET_MTU, so they are framed by hand (`vnet::vhost_wire`) on a clone of its socket.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use vhost::vhost_user::message::{FrontendReq, VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::VhostUserFrontend;
use vnet::vhost_wire;

use super::{req, Connection, FrontendError};

impl Connection {
    /// Whether the STATUS protocol feature was negotiated: SET_STATUS and GET_STATUS work.
    pub fn has_status(&self) -> bool {
        self.protocol.contains(VhostUserProtocolFeatures::STATUS)
    }

    /// Sends SET_STATUS with `value` (waiting for the backend's ack with REPLY_ACK). Without
    /// the STATUS protocol feature, only remembers it. DPDK's vhost library starts a device
    /// that negotiated STATUS only once DRIVER_OK is set.
    pub fn set_status(&mut self, value: u8) -> Result<(), FrontendError> {
        self.status = value;
        if !self.has_status() {
            return Ok(());
        }
        match self.send_u64(FrontendReq::SET_STATUS, "SET_STATUS", value.into())? {
            Some(code) if code != 0 => Err(FrontendError::Status {
                request: "SET_STATUS",
                reason: format!("the backend refused status {value:#x} (reply {code})"),
            }),
            _ => Ok(()),
        }
    }

    /// Sends `req` (one we frame ourselves, see `vhost_wire`) with a u64 payload, asking for
    /// an ack when REPLY_ACK was negotiated; returns the ack's code then, None without it.
    fn send_u64(
        &mut self,
        req: FrontendReq,
        name: &'static str,
        value: u64,
    ) -> Result<Option<u64>, FrontendError> {
        let ack = self.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        let need_reply = if ack {
            VhostUserHeaderFlag::NEED_REPLY.bits()
        } else {
            0
        };
        let msg = vhost_wire::encode(
            req,
            vhost_wire::VERSION_1 | need_reply,
            &value.to_ne_bytes(),
        );
        self.raw.write_all(&msg)?;
        Ok(if ack {
            Some(self.reply(req, name)?)
        } else {
            None
        })
    }

    /// Tells the backend the MTU the driver is given (NET_SET_MTU, what QEMU sends for
    /// `host_mtu`), and with REPLY_ACK waits for its answer: an error if it refused. Needs the
    /// MTU protocol feature.
    pub fn set_mtu(&mut self, mtu: u16) -> Result<(), FrontendError> {
        let refused = |reason: String| FrontendError::Status {
            request: "NET_SET_MTU",
            reason,
        };
        if !self.protocol.contains(VhostUserProtocolFeatures::MTU) {
            return Err(refused(
                "the MTU protocol feature was not negotiated".into(),
            ));
        }
        match self.send_u64(FrontendReq::NET_SET_MTU, "NET_SET_MTU", mtu.into())? {
            Some(code) if code != 0 => Err(refused(format!(
                "the backend refused MTU {mtu} (reply {code})"
            ))),
            _ => Ok(()),
        }
    }

    /// Waits up to `timeout` for the backend to close the connection, and returns whether it
    /// did: end of file or an error on the vhost-user socket, which is how a backend that
    /// exited or was killed shows (its kick and call eventfds do not: an eventfd has no peer,
    /// so kicks still succeed and calls just stop). After the handshake a backend sends
    /// nothing unasked, so a readable socket means it closed; bytes it sends anyway are read
    /// and dropped (up to 4 KiB a call, so that a close after them still shows on a later
    /// call), and the wait sleeps out its time.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        if !virtnet_sys::wait_readable(self.raw.as_raw_fd(), ms) {
            return false;
        }
        match virtnet_sys::recv_now(&self.raw, &mut [0u8; 4096]) {
            Ok(0) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => true,
            Ok(_) => {
                std::thread::sleep(timeout);
                false
            }
        }
    }

    /// The status last set with [`Connection::set_status`].
    pub fn status(&self) -> u8 {
        self.status
    }

    /// Asks the backend for the device status (GET_STATUS): what it took from SET_STATUS,
    /// plus NEEDS_RESET if it stopped a queue. None without the STATUS protocol feature.
    pub fn get_status(&mut self) -> Result<Option<u8>, FrontendError> {
        if !self.has_status() {
            return Ok(None);
        }
        let msg = vhost_wire::encode(FrontendReq::GET_STATUS, vhost_wire::VERSION_1, &[]);
        self.raw.write_all(&msg)?;
        let v = self.reply(FrontendReq::GET_STATUS, "GET_STATUS")?;
        u8::try_from(v)
            .map(Some)
            .map_err(|_| FrontendError::Status {
                request: "GET_STATUS",
                reason: format!("status {v:#x} does not fit a byte"),
            })
    }

    /// Reads the reply to `code` (named `request` in errors): a header with REPLY set and a
    /// u64 payload, which it returns.
    fn reply(&mut self, code: FrontendReq, request: &'static str) -> Result<u64, FrontendError> {
        let mut hdr = [0u8; vhost_wire::HDR_LEN];
        self.raw.read_exact(&mut hdr)?;
        let (got, flags, size) = vhost_wire::decode_header(&hdr);
        if got != u32::from(code) || flags & VhostUserHeaderFlag::REPLY.bits() == 0 || size != 8 {
            return Err(FrontendError::Status {
                request,
                reason: format!("unexpected reply: request {got}, flags {flags:#x}, size {size}"),
            });
        }
        let mut v = [0u8; 8];
        self.raw.read_exact(&mut v)?;
        Ok(u64::from_ne_bytes(v))
    }

    /// Reads `len` bytes of the device config space at `offset`.
    pub fn get_config(&mut self, offset: u32, len: u32) -> Result<Vec<u8>, FrontendError> {
        use vhost::vhost_user::message::VhostUserConfigFlags;
        let buf = vec![0u8; len as usize];
        let (_, data) = self
            .frontend
            .get_config(offset, len, VhostUserConfigFlags::WRITABLE, &buf)
            .map_err(req("GET_CONFIG"))?;
        Ok(data)
    }
}
