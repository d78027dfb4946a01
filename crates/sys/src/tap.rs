//! The host side of the backend: a Linux TAP device with a virtio-net header on every frame
//! (IFF_VNET_HDR) and one file descriptor per queue pair (IFF_MULTI_QUEUE).
//!
//! ioctls on /dev/net/tun, and frame I/O. Transmit is zero copy: [`TapQueue::write_frame`] hands
//! the checked header copy and the chain's segments after it to vring's
//! `GuestMemory::writev_gather`, which checks them and writes them with one writev. So is receive, when the guest has posted buffers for the largest frame:
//! [`TapQueue::read_frame`] reads with one readv straight into them; [`TapQueue::read`] reads
//! into a buffer of ours, for the frames that must wait for more buffers.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use vring::{Gather, GuestMemory, Segment};

use super::{ioctl_ptr, ioctl_val};

/// Offloads the TAP may hand us, following what the guest accepts (TUNSETOFFLOAD).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapOffloads {
    pub csum: bool,
    pub tso4: bool,
    pub tso6: bool,
    pub ecn: bool,
    /// UDP segmentation (TUN_F_USO4 and TUN_F_USO6: Linux takes both or neither).
    pub uso: bool,
}

/// What the running kernel's TAP driver takes, found by trying (TUNSETOFFLOAD refuses bits it
/// does not know, "a way to test for new features").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapSupport {
    /// TUN_F_USO4/6 (Linux 6.2): the TAP hands out UDP_L4 GSO frames, and takes them, since
    /// `virtio_net_hdr_to_skb` learned VIRTIO_NET_HDR_GSO_UDP_L4 in the same release.
    pub uso: bool,
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

    /// Writes one frame (virtio-net header first) from `buf`, as if the guest sent it.
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        (&self.file).write(buf)
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
            if o.uso {
                f |= libc::TUN_F_USO4 | libc::TUN_F_USO6;
            }
        }
        self.set_offload_bits(f)
    }

    fn set_offload_bits(&self, f: libc::c_uint) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        unsafe {
            ioctl_val(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                f as libc::c_ulong,
            )
        }
    }

    /// Probes what this kernel's TAP takes, leaving the queue with no offloads (as a new one).
    pub fn probe(&self) -> TapSupport {
        let uso = self
            .set_offload_bits(libc::TUN_F_CSUM | libc::TUN_F_USO4 | libc::TUN_F_USO6)
            .is_ok();
        let _ = self.set_offload_bits(0);
        TapSupport { uso }
    }

    /// Sets the device's send buffer (TUNSETSNDBUF, every queue): the bytes of written frames
    /// the kernel may hold before writes return EAGAIN.
    pub fn set_sndbuf(&self, bytes: i32) -> io::Result<()> {
        let mut v = bytes as libc::c_int;
        // SAFETY: TUNSETSNDBUF takes a pointer to an int, and `v` is one.
        unsafe { ioctl_ptr(self.file.as_raw_fd(), libc::TUNSETSNDBUF, &mut v) }
    }

    /// Writes one frame, `frame`'s head (the virtio-net header, a checked copy) and then its
    /// body of `mem`. Returns the bytes written; the inner error is the TAP's (WouldBlock when
    /// its queue is full), the outer one the guest's (see `GuestMemory::writev_gather`).
    pub fn write_frame(
        &self,
        mem: &GuestMemory,
        frame: Gather<'_>,
    ) -> Result<io::Result<usize>, vring::Error> {
        mem.writev_gather(self.file.as_fd(), frame)
    }

    /// Reads one frame (virtio-net header first) scattered over `segs` of `mem`, then `tail`
    /// for what they cannot hold. Returns its length; WouldBlock (inner) when no frame is
    /// waiting. The kernel copies what fits of a frame longer than `segs` and `tail` together,
    /// returns that length and drops the rest (Linux 6.18), so callers size them for the
    /// largest frame.
    pub fn read_frame(
        &self,
        mem: &GuestMemory,
        segs: &[Segment],
        tail: &mut [u8],
    ) -> Result<io::Result<usize>, vring::Error> {
        mem.readv_with_tail(self.file.as_fd(), segs, tail)
    }

    /// The largest MTU the kernel lets a TAP interface have: Linux's tun sets `max_mtu` to
    /// 65535 less the link-layer header (14 bytes of Ethernet).
    pub const MAX_MTU: u16 = 65535 - 14;

    /// The MTU of this TAP's interface (SIOCGIFMTU).
    ///
    /// Interface ioctls name the interface, and names are per network namespace: this asks
    /// through a socket made in the calling thread's namespace, which must be the one the TAP
    /// was opened in (as for a process that never changes namespace).
    pub fn mtu(&self) -> io::Result<u16> {
        let mut ifr = self.interface_request()?;
        // SAFETY: SIOCGIFMTU takes a pointer to an ifreq, and `ifr` is one.
        unsafe {
            ioctl_ptr(
                self.control_socket()?.as_raw_fd(),
                libc::SIOCGIFMTU,
                &mut ifr,
            )?
        };
        // SAFETY: SIOCGIFMTU filled the union's `ifru_mtu` member; every int is valid.
        let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
        u16::try_from(mtu)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("interface MTU {mtu}")))
    }

    /// Sets the MTU of this TAP's interface (SIOCSIFMTU, what `ip link set DEV mtu N` does),
    /// which every queue of the device shares. The kernel refuses a value outside 68..=
    /// [`TapQueue::MAX_MTU`] (EINVAL), and a caller without CAP_NET_ADMIN (EPERM). The same
    /// namespace rule as [`TapQueue::mtu`] applies.
    pub fn set_mtu(&self, mtu: u16) -> io::Result<()> {
        let mut ifr = self.interface_request()?;
        ifr.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        // SAFETY: SIOCSIFMTU takes a pointer to an ifreq, and `ifr` is one.
        unsafe {
            ioctl_ptr(
                self.control_socket()?.as_raw_fd(),
                libc::SIOCSIFMTU,
                &mut ifr,
            )
        }
    }

    /// An ifreq naming this TAP's interface, the rest zero.
    fn interface_request(&self) -> io::Result<libc::ifreq> {
        // The kernel gave the name at open, so it fits; check rather than cut it.
        if self.name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "bad TAP name"));
        }
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(self.name.bytes()) {
            *d = s as libc::c_char;
        }
        Ok(ifr)
    }

    /// A socket to carry interface ioctls (any socket does; QEMU uses an AF_INET one too).
    fn control_socket(&self) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: socket takes three ints and touches no memory of ours.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made by socket, so nothing else in the process owns it.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }
}

impl AsRawFd for TapQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for TapQueue {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.file.as_fd()
    }
}
