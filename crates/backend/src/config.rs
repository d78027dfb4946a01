//! A device's configuration, as the command line (or the program that builds the device)
//! chose it, and the limits it is checked against.

use std::io;
use std::sync::Arc;

use super::error::Error;
use super::poll::BusyPoll;

/// Where frames go, as chosen on the command line (or, for `Socket`, by the program that
/// builds the device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    Tap(String),
    Null {
        size: usize,
    },
    Echo,
    /// One connected unix datagram socket per pair (`host::socket`): the host side is whoever
    /// holds the other ends.
    Socket(HostSockets),
}

/// The sockets of [`IoMode::Socket`], one per pair, shared by the configuration's copies:
/// the device works on duplicates of them. Two are equal when they are the same sockets.
#[derive(Clone, Debug)]
pub struct HostSockets(Arc<[std::os::unix::net::UnixDatagram]>);

impl HostSockets {
    pub fn new(sockets: Vec<std::os::unix::net::UnixDatagram>) -> HostSockets {
        HostSockets(sockets.into())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A duplicate of pair `pair`'s socket (the same open file).
    pub fn duplicate(&self, pair: u16) -> io::Result<std::os::unix::net::UnixDatagram> {
        self.0
            .get(pair as usize)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no socket for the pair"))?
            .try_clone()
    }
}

impl PartialEq for HostSockets {
    fn eq(&self, other: &HostSockets) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for HostSockets {}

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub pairs: u16,
    pub io: IoMode,
    pub mac: [u8; 6],
    /// The MTU to start with, set on the TAP's interface ([`MIN_MTU`] up to what the device
    /// carries, [`Shared::max_mtu`]). None: the TAP's MTU as it is, or 1500 without a TAP.
    /// The frontend may change it (NET_SET_MTU).
    pub mtu: Option<u16>,
    /// How each queue busy-polls before sleeping: auto by default (`virtnet ctl` changes it).
    pub busy_poll: BusyPoll,
    /// Hold a data queue's call a few microseconds while its driver is busy and holding
    /// gathers more completions (`hold`); the driver's NOTF_COAL settings win.
    pub hold_calls: bool,
    /// A slow device on purpose (the control-queue benchmark): wait this long before answering
    /// each control command. The `experiments` feature.
    #[cfg(feature = "experiments")]
    pub ctrl_delay_us: u32,
    /// Used entries written before `used.idx` is published (batched used publish; 1 = every entry).
    pub used_batch: u16,
    /// While busy polling the tx ring, also poll the host side for rx (rx polled from the tx path).
    pub poll_rx_from_tx: bool,
    /// Pin every data worker to this CPU (the contended case of the busy-polling benchmark).
    pub worker_cpu: Option<usize>,
    /// The file where pinned workers of several backends list themselves (CPU, process,
    /// thread), so that auto busy polling tells the other backends' workers on its CPU from
    /// other tasks (`crate::siblings::Board`). None: only this process's workers are known.
    pub worker_board: Option<std::path::PathBuf>,
    /// A send buffer for the TAP in bytes (TUNSETSNDBUF): how much of the guest's tx the
    /// kernel may hold before the TAP pushes back. None keeps the kernel's, unlimited
    /// (INT_MAX), which QEMU sets too: a limit makes Linux copy every written frame into an skb
    /// charged to the TAP instead of building it in place (358 against 316 ns per 64-byte
    /// write, Intel Xeon, Linux 6.18).
    pub tap_sndbuf: Option<i32>,
    /// How guest tx is written into the TAP: a burst per `io_uring_enter` (the default, where
    /// the kernel allows it) or a `writev` system call per frame.
    pub tap_io: TapIo,
    /// Each worker thread (the pairs' and the control queue's) allows itself only the system
    /// calls it needs (`virtnet_sys::sandbox::WORKER_SYSCALLS`); any other kills the process.
    /// On by default, in tests and benchmarks too, so that every worker path they reach runs
    /// under the filter that ships (a call missing from the list kills the test process: a
    /// loud failure). Off only where the process is not ours to restrict: `virtnet backend
    /// --sandbox off`, and the fuzz targets, whose workers run inside libFuzzer's process,
    /// where the sanitizers' and libFuzzer's own crash reports run on the crashing thread
    /// (and open files, start a symbolizer).
    pub seccomp: bool,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            pairs: 1,
            io: IoMode::Null { size: 64 },
            mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
            mtu: None,
            busy_poll: BusyPoll::Auto,
            hold_calls: true,
            #[cfg(feature = "experiments")]
            ctrl_delay_us: 0,
            used_batch: vring::DEFAULT_USED_BATCH,
            poll_rx_from_tx: true,
            worker_cpu: None,
            worker_board: None,
            tap_sndbuf: None,
            tap_io: TapIo::default(),
            seccomp: true,
        }
    }
}

/// How guest tx frames are written into the TAP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TapIo {
    /// One `writev` system call per frame.
    Syscalls,
    /// A burst of up to 64 frames per `io_uring_enter` (one writev each, in order); where the
    /// kernel has no usable io_uring, the port falls back to `Syscalls`.
    #[default]
    Uring,
}

impl std::str::FromStr for TapIo {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "syscalls" => Ok(TapIo::Syscalls),
            "uring" => Ok(TapIo::Uring),
            _ => Err(format!("expected syscalls or uring, not {s:?}")),
        }
    }
}

/// The most queue pairs a device may have: vhost-user names a virtqueue in SET_VRING_KICK,
/// CALL and ERR by 8 bits, so the control queue after `2 * pairs` data queues must be at most
/// virtqueue 255.
pub const MAX_PAIRS: u16 = 127;

/// The smallest MTU, and the largest, that the config space may hold (VIRTIO 1.2 5.1.4.1).
pub const MIN_MTU: u16 = 68;
pub const MAX_MTU: u16 = 65535;

/// `mtu` as an MTU the device takes: in [`MIN_MTU`]..=`max`.
pub(crate) fn check_mtu(mtu: u64, max: u16) -> Result<u16, Error> {
    u16::try_from(mtu)
        .ok()
        .filter(|m| (MIN_MTU..=max).contains(m))
        .ok_or(Error::OutOfRange {
            what: "MTU",
            value: mtu,
            min: MIN_MTU.into(),
            max: max.into(),
        })
}

pub(crate) fn check_pairs(pairs: u16) -> io::Result<()> {
    if pairs == 0 || pairs > MAX_PAIRS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("queue pairs must be 1..={MAX_PAIRS}"),
        ));
    }
    Ok(())
}
