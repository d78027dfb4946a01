//! The host side of the backend: a Linux TAP device with a virtio-net header on every frame
//! (IFF_VNET_HDR) and one file descriptor per queue pair (IFF_MULTI_QUEUE).
//!
//! ioctls on /dev/net/tun, and readv/writev with iovecs that point straight into guest memory
//! (zero copy). Every iovec comes from `GuestMemory::host_span`, so it lies inside a live
//! mapping for the duration of the call.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use vring::memory::HostSpan;

use super::{ioctl_ptr, ioctl_val};

/// Offloads the TAP may hand us, following what the guest accepts (TUNSETOFFLOAD).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapOffloads {
    pub csum: bool,
    pub tso4: bool,
    pub tso6: bool,
    pub ecn: bool,
}

/// One queue (file descriptor) of a multi-queue TAP device, non-blocking.
#[derive(Debug)]
pub struct TapQueue {
    file: File,
    name: String,
}

impl TapQueue {
    /// Opens one more queue of TAP device `name`, creating the device if it does not exist.
    /// Every queue of one device is opened with the same call; the kernel adds one per open.
    pub fn open(name: &str) -> io::Result<TapQueue> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad TAP name"));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR | libc::IFF_MULTI_QUEUE;
        ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
        // SAFETY: TUNSETIFF takes a pointer to an ifreq, and `ifr` is one.
        unsafe { ioctl_ptr(file.as_raw_fd(), libc::TUNSETIFF, &mut ifr)? };
        let mut got = String::new();
        for &c in ifr.ifr_name.iter().take_while(|&&c| c != 0) {
            got.push(c as u8 as char);
        }
        Ok(TapQueue { file, name: got })
    }

    /// A second handle on the same queue, for control ioctls from another thread.
    pub fn open_clone(q: &TapQueue) -> io::Result<TapQueue> {
        Ok(TapQueue {
            file: q.file.try_clone()?,
            name: q.name.clone(),
        })
    }

    /// Reads one frame (virtio-net header first) into `buf`; WouldBlock when none waits.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        (&self.file).read(buf)
    }

    /// Attaches or detaches this queue (TUNSETQUEUE): a detached queue gets no frames.
    pub fn set_attached(&self, on: bool) -> io::Result<()> {
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        let flag = if on {
            libc::IFF_ATTACH_QUEUE
        } else {
            libc::IFF_DETACH_QUEUE
        };
        ifr.ifr_ifru.ifru_flags = flag as libc::c_short;
        // SAFETY: TUNSETQUEUE takes a pointer to an ifreq, and `ifr` is one.
        match unsafe { ioctl_ptr(self.file.as_raw_fd(), libc::TUNSETQUEUE, &mut ifr) } {
            // Attaching an attached queue (or detaching a detached one) is not an error for us.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            r => r,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the virtio-net header size the TAP prepends and expects (10 or 12).
    pub fn set_vnet_hdr_len(&self, len: usize) -> io::Result<()> {
        let mut v = len as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ takes a pointer to an int, and `v` is one.
        unsafe { ioctl_ptr(self.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &mut v) }
    }

    pub fn set_offloads(&self, o: TapOffloads) -> io::Result<()> {
        let mut f = 0;
        if o.csum {
            f |= libc::TUN_F_CSUM;
            if o.tso4 {
                f |= libc::TUN_F_TSO4;
            }
            if o.tso6 {
                f |= libc::TUN_F_TSO6;
            }
            if o.ecn && (o.tso4 || o.tso6) {
                f |= libc::TUN_F_TSO_ECN;
            }
        }
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        unsafe {
            ioctl_val(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                f as libc::c_ulong,
            )
        }
    }

    /// Writes one frame (virtio-net header first) gathered from `spans`. Returns the bytes
    /// written; WouldBlock when the TAP's queue is full.
    pub fn write_frame(&self, spans: &[HostSpan]) -> io::Result<usize> {
        self.vectored(libc::writev, spans)
    }

    /// Reads one frame (virtio-net header first) scattered into `spans`. Returns its length;
    /// WouldBlock when no frame is waiting. A frame longer than the spans is truncated by the
    /// kernel, so callers size the spans for the largest frame.
    pub fn read_frame(&self, spans: &[HostSpan]) -> io::Result<usize> {
        self.vectored(libc::readv, spans)
    }

    fn vectored(&self, op: VectoredIo, spans: &[HostSpan]) -> io::Result<usize> {
        let iov = iovecs(spans);
        // SAFETY: `op` is readv or writev; every iovec points into a live guest mapping (see
        // the module docs): writev only reads it, and readv writes the device-writable part of
        // a chain, which nothing else references meanwhile.
        let n = unsafe {
            op(
                self.file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

type VectoredIo =
    unsafe extern "C" fn(libc::c_int, *const libc::iovec, libc::c_int) -> libc::ssize_t;

impl AsRawFd for TapQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// Up to 64 iovecs on the stack cover any chain the data path builds (it caps chains at
/// `MAX_SPANS`); longer lists are cut, which only shortens the frame.
pub const MAX_SPANS: usize = 64;

fn iovecs(spans: &[HostSpan]) -> Vec<libc::iovec> {
    spans
        .iter()
        .take(MAX_SPANS)
        .map(|s| libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        })
        .collect()
}
