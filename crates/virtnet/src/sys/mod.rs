//! The crate's only `unsafe` code: the OS interfaces of the data path. TAP ioctls and
//! zero-copy readv/writev ([`tap`]), adopting eventfds received from the frontend, and the
//! per-thread scheduler and CPU-time readings used by busy polling and the benchmarks.

use std::io;
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};

use vmm_sys_util::eventfd::EventFd;

pub mod tap;

/// # Safety
/// `req` must be an ioctl whose argument is a pointer to a `T`, and `arg` must point to a live,
/// initialised `T` for the duration of the call.
unsafe fn ioctl_ptr<T>(fd: RawFd, req: libc::Ioctl, arg: *mut T) -> io::Result<()> {
    // SAFETY: guaranteed by the caller (see above).
    let r = unsafe { libc::ioctl(fd, req, arg) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// # Safety
/// `req` must be an ioctl that takes its argument by value (no pointer).
unsafe fn ioctl_val(fd: RawFd, req: libc::Ioctl, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: guaranteed by the caller (see above).
    let r = unsafe { libc::ioctl(fd, req, arg) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adopts a file received from the frontend as an eventfd. A file that is not an eventfd
/// only makes later reads and writes fail.
pub fn eventfd_from_file(f: std::fs::File) -> EventFd {
    let raw = f.into_raw_fd();
    // SAFETY: `raw` was just released by the `File` that owned it; the EventFd owns it now.
    unsafe { EventFd::from_raw_fd(raw) }
}

/// Adopts an inherited listening unix socket (`--fd N` of the vhost-user backend program
/// conventions), after checking that it is one.
pub fn unix_listener_from_fd(fd: RawFd) -> io::Result<std::os::unix::net::UnixListener> {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `kind` and `len` are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 || kind != libc::SOCK_STREAM {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fd {fd} is not a stream socket"),
        ));
    }
    // SAFETY: the fd was inherited for us to own (the caller's contract with its parent), and
    // it is a stream socket.
    Ok(unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) })
}

/// Pins the calling thread to `cpu`.
pub fn pin_thread(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cpu number too large",
        ));
    }
    // SAFETY: cpu_set_t is plain old data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` was checked against CPU_SETSIZE, so the bit lies inside `set`.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size given; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is readable now (poll with a zero timeout): the cheap "does the TAP have a
/// frame" test of busy polling.
pub fn readable_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is a valid pollfd for the duration of the call; nfds = 1.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & libc::POLLIN != 0
}

/// Waits up to `timeout_ms` (negative: forever) for `fd` to become readable.
pub fn wait_readable(fd: RawFd, timeout_ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is a valid pollfd for the duration of the call; nfds = 1.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    r > 0 && p.revents & libc::POLLIN != 0
}

/// Involuntary context switches of the calling thread so far (getrusage RUSAGE_THREAD): it
/// grows when the scheduler took the CPU from us for another runnable task, which is our
/// "the CPU is wanted by others" signal for busy polling.
pub fn involuntary_switches() -> u64 {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if r < 0 {
        return 0;
    }
    ru.ru_nivcsw as u64
}

/// CPU time (user + system) consumed by the calling thread, in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r < 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Waits up to `timeout_ms` (negative: forever) for any of `fds` (at most 32) to become
/// readable. Returns a bit mask: bit `i` set when `fds[i]` is readable; 0 on timeout.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> u32 {
    let mut p = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 32];
    let n = fds.len().min(32);
    for (slot, &fd) in p.iter_mut().zip(&fds[..n]) {
        slot.fd = fd;
    }
    // SAFETY: `p` holds `n` valid pollfds for the duration of the call.
    let r = unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, timeout_ms) };
    if r <= 0 {
        return 0;
    }
    p[..n]
        .iter()
        .enumerate()
        .filter(|(_, q)| q.revents & libc::POLLIN != 0)
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// Copies up to `buf.len()` bytes waiting on `socket` into `buf` without consuming them
/// (`recv(MSG_PEEK)`); blocks until at least one byte is there, and may return fewer bytes
/// than are coming (MSG_WAITALL does not apply to peeks on unix sockets). 0: the peer closed.
pub fn peek(socket: &std::os::unix::net::UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the kernel writes at most that.
        let r = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
