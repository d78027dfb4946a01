//! virtnet's OS interfaces, the only `unsafe` code outside the ring engine's guest memory: the
//! system calls of the data path. TAP ioctls and frame I/O ([`tap`], whose vectored I/O into guest
//! memory is vring's `GuestMemory::writev_to` and `readv_from`), the eventfds shared with the peer
//! ([`peer_fd`]: checked on adoption, reads that cannot block, writes a watchdog interrupts when
//! the peer makes them block), opening the inherited listening socket, systemd's socket activation
//! and readiness notification ([`activation`]), a vhost-user socket looked at without reading
//! it and a connect that does not wait ([`socket`]), and the per-thread scheduler and CPU-time readings
//! and file-range locks used by busy polling (the board of pinned workers) and the benchmarks.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;

pub mod activation;
pub mod peer_fd;
pub mod sandbox;
pub mod signals;
pub mod socket;
pub mod tap;

pub use peer_fd::PeerEventFd;

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

/// Sets or clears `O_NONBLOCK` on the open file description of `fd` (shared by every
/// descriptor of it, in this process and in a peer that holds one).
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL takes no argument and touches no memory.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL takes an int argument and touches no memory.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The listening unix socket this process inherited as descriptor `fd` (`--fd N` of the
/// vhost-user backend program conventions).
///
/// Adopting a descriptor by its number is unsound in general: if something else in the process
/// owns that number, there are then two owners, and the second close closes whatever reuses
/// the number. So this takes no ownership of `fd`. It duplicates it (`F_DUPFD_CLOEXEC`) and
/// owns the copy, a new descriptor that nothing else can hold; that is sound whoever owns
/// `fd`, and however often it is called (if another owner closes `fd` meanwhile, the copy is of
/// whatever then has the number: still checked, still ours alone). The inherited descriptor stays open, and unowned, for
/// the life of the process: one descriptor, in a process that listens on it until it exits.
///
/// Refuses 0, 1 and 2 (stdio, which the standard library owns, and never the vhost-user
/// socket), a number that is not open, and anything but a listening (`SO_ACCEPTCONN`)
/// `AF_UNIX` stream socket; a refused copy is closed again.
pub fn unix_listener_from_fd(fd: RawFd) -> io::Result<UnixListener> {
    let refuse = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("fd {fd}: {why}"));
    if (0..=2).contains(&fd) {
        return Err(refuse("is stdio, not an inherited socket"));
    }
    // SAFETY: F_DUPFD_CLOEXEC takes an int (the lowest number for the copy) and touches no
    // memory; on a number that is not open it fails with EBADF.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("fd {fd}: {e}")));
    }
    // SAFETY: `copy` was just made by fcntl, so nothing else in the process owns it.
    let copy = unsafe { OwnedFd::from_raw_fd(copy) };
    let opt = |name| socket_option(copy.as_fd(), name);
    match (
        opt(libc::SO_DOMAIN),
        opt(libc::SO_TYPE),
        opt(libc::SO_ACCEPTCONN),
    ) {
        (Ok(libc::AF_UNIX), Ok(libc::SOCK_STREAM), Ok(1)) => Ok(UnixListener::from(copy)),
        _ => Err(refuse("is not a listening unix stream socket")),
    }
}

/// An int-valued SOL_SOCKET option of `fd`.
fn socket_option(fd: BorrowedFd<'_>, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are valid for writes of the sizes given; the kernel writes at
    // most `len` bytes into `value`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(value)
}

/// Raises the soft limit on open files to the hard limit, and returns it: a device of many
/// pairs holds several descriptors per queue (kick, call, err, TAP, epoll, timers), more than
/// the usual soft limit of 1024 allows at 127 pairs.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit; raising the soft limit up to the hard one is
        // always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
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

/// The calling process's effective user id.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The calling thread's id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// Whether an open file description other than `file`'s holds a lock on any of `len` bytes
/// of `file` from `start` (F_OFD_GETLK).
pub fn range_locked(file: &std::fs::File, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = ofd_lock(start, len)?;
    // SAFETY: `fl` is a valid flock for the duration of the call; F_OFD_GETLK writes it.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// A write lock on `len` bytes from `start`, for F_OFD_SETLK and F_OFD_GETLK.
fn ofd_lock(start: u64, len: u64) -> io::Result<libc::flock> {
    let too_far = || io::Error::new(io::ErrorKind::InvalidInput, "lock range too far");
    // SAFETY: flock is plain old data; all-zero is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::try_from(start).map_err(|_| too_far())?;
    fl.l_len = libc::off_t::try_from(len).map_err(|_| too_far())?;
    Ok(fl)
}

/// Takes an exclusive lock on `len` bytes of `file` from `start`, owned by its open file
/// description (F_OFD_SETLK), without waiting: false when another description holds a lock
/// there, in this process or another. The lock lasts until that description is closed, so a
/// process that dies gives it up.
pub fn try_lock_range(file: &std::fs::File, start: u64, len: u64) -> io::Result<bool> {
    let fl = ofd_lock(start, len)?;
    // SAFETY: `fl` is a valid flock for the duration of the call; F_OFD_SETLK reads it only.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// Whether `fd` is readable now (poll with a zero timeout): the cheap "does the TAP have a
/// frame" test of busy polling.
pub fn readable_now(fd: RawFd) -> bool {
    ready_now(fd, libc::POLLIN)
}

/// Whether `fd` is writable now (poll with a zero timeout): "does the TAP take frames again".
/// An fd in error (a deleted TAP: POLLERR, never POLLOUT again) counts as writable: the
/// write is tried and fails for good, rather than waited for.
pub fn writable_now(fd: RawFd) -> bool {
    ready_now(fd, libc::POLLOUT | libc::POLLERR | libc::POLLHUP)
}

/// After EPOLLERR or EPOLLHUP on `fd`: takes a socket's pending error (reading SO_ERROR clears
/// it; other fds refuse the option) and says whether `fd` still reports an error or a hang-up,
/// as a deleted TAP or a pipe without a reader does for good.
pub fn error_persists(fd: RawFd) -> bool {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` and `len` are valid for writes and `len` says how big `err` is.
    unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    revents_now(fd, 0) & (libc::POLLERR | libc::POLLHUP) != 0
}

fn ready_now(fd: RawFd, events: libc::c_short) -> bool {
    revents_now(fd, events) & events != 0
}

/// What `fd` reports now (poll with a zero timeout) of `events`, and errors and hang-ups.
fn revents_now(fd: RawFd, events: libc::c_short) -> libc::c_short {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: `p` is a valid pollfd for the duration of the call; nfds = 1.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r > 0 {
        p.revents
    } else {
        0
    }
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

/// Whether a signal is pending for the calling thread or the process (sigpending): one
/// that is blocked here and not yet taken, such as SIGTERM before the thread that waits for
/// it has it. Busy polling stops for it.
pub fn signal_pending() -> bool {
    // SAFETY: sigset_t is plain old data; sigpending fills it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t.
    if unsafe { libc::sigpending(&mut set) } < 0 {
        return false;
    }
    // SAFETY: sigset_t is plain old data: any of its bytes may be read.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&set as *const libc::sigset_t).cast::<u8>(),
            std::mem::size_of::<libc::sigset_t>(),
        )
    };
    bytes.iter().any(|&b| b != 0)
}

/// The calling thread's scheduler statistics (/proc/thread-self/schedstat: time on a CPU,
/// time spent runnable waiting for one, timeslices), opened once by the thread itself and
/// read again without opening, so that a worker under seccomp can read it.
#[derive(Debug)]
pub struct SchedStat(std::fs::File);

impl SchedStat {
    /// Opens the calling thread's file; an error when the kernel keeps no schedstats.
    pub fn open() -> io::Result<SchedStat> {
        SchedStat::open_path("/proc/thread-self/schedstat")
    }

    /// Opens the file of thread `tid` of process `pid`.
    pub fn open_thread(pid: u32, tid: u32) -> io::Result<SchedStat> {
        SchedStat::open_path(&format!("/proc/{pid}/task/{tid}/schedstat"))
    }

    fn open_path(path: &str) -> io::Result<SchedStat> {
        let s = SchedStat(std::fs::File::open(path)?);
        s.sample()
            .map(|_| s)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unreadable schedstat"))
    }

    /// The thread's figures so far.
    pub fn sample(&self) -> Option<Sched> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 96];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        let mut f = std::str::from_utf8(&buf[..n])
            .ok()?
            .split_ascii_whitespace()
            .map(str::parse::<u64>);
        Some(Sched {
            ran_ns: f.next()?.ok()?,
            waited_ns: f.next()?.ok()?,
            slices: f.next()?.ok()?,
        })
    }
}

/// One reading of a [`SchedStat`]: nanoseconds the thread has run on a CPU, nanoseconds it has
/// spent runnable waiting for one, and the times it has been given one, so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sched {
    pub ran_ns: u64,
    pub waited_ns: u64,
    pub slices: u64,
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
    recv(socket, buf, libc::MSG_PEEK)
}

/// Reads what `socket` holds now into `buf`, without waiting (`recv(MSG_DONTWAIT)`): 0 when
/// the peer closed, `WouldBlock` when nothing is there. File descriptors sent along are not
/// taken (the kernel closes them).
pub fn recv_now(socket: &std::os::unix::net::UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    recv(socket, buf, libc::MSG_DONTWAIT)
}

fn recv(
    socket: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
    flags: libc::c_int,
) -> io::Result<usize> {
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the kernel writes at most that.
        let r = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_counts_the_time_a_thread_waits_for_its_cpu() {
        // Two spinning threads pinned to one CPU: each waits while the other runs.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = |stop: std::sync::Arc<std::sync::atomic::AtomicBool>| {
            std::thread::spawn(move || {
                pin_thread(0).unwrap();
                let s = SchedStat::open().unwrap();
                let before = s.sample().unwrap();
                let t = std::time::Instant::now();
                while t.elapsed() < std::time::Duration::from_millis(200) {
                    std::hint::spin_loop();
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let after = s.sample().unwrap();
                assert!(after.slices > before.slices);
                assert!(
                    after.ran_ns - before.ran_ns > 20_000_000,
                    "{before:?} {after:?}"
                );
                after.waited_ns - before.waited_ns
            })
        };
        let (a, b) = (spin(stop.clone()), spin(stop));
        let waited = a.join().unwrap() + b.join().unwrap();
        assert!(waited > 20_000_000, "waited {waited} ns sharing one CPU");
    }

    #[test]
    fn a_blocked_signal_raised_is_pending_until_taken() {
        std::thread::spawn(|| {
            // SIGUSR2, blocked in this thread only, raised at it, and taken by sigwait.
            // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: `set` is a valid sigset_t.
            unsafe { libc::sigemptyset(&mut set) };
            // SAFETY: as above; SIGUSR2 is a valid signal.
            unsafe { libc::sigaddset(&mut set, libc::SIGUSR2) };
            // SAFETY: `set` is initialised; the old mask is not wanted.
            unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
            assert!(!signal_pending());
            // SAFETY: pthread_self has no preconditions.
            let me = unsafe { libc::pthread_self() };
            // SAFETY: signals this live thread with a signal it blocks.
            unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
            assert!(signal_pending());
            let mut sig = 0;
            // SAFETY: `set` is initialised and blocked; `sig` is writable.
            unsafe { libc::sigwait(&set, &mut sig) };
            assert_eq!(sig, libc::SIGUSR2);
            assert!(!signal_pending());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit() {
        let n = raise_nofile_limit().unwrap();
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((lim.rlim_cur, n), (lim.rlim_max, lim.rlim_max));
    }
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    fn refused(fd: RawFd) -> io::Error {
        unix_listener_from_fd(fd).expect_err("should be refused")
    }

    #[test]
    fn stdio_and_closed_numbers_are_refused() {
        for fd in [0, 1, 2] {
            assert_eq!(refused(fd).kind(), io::ErrorKind::InvalidInput, "fd {fd}");
        }
        for fd in [-1, 1 << 30] {
            let e = refused(fd).to_string();
            assert!(
                e.starts_with(&format!("fd {fd}: Bad file descriptor")),
                "{e}"
            );
        }
    }

    #[test]
    fn anything_but_a_listening_unix_stream_socket_is_refused_and_left_open() {
        let (mut rx, mut tx) = std::io::pipe().unwrap();
        let e = refused(tx.as_raw_fd());
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            e.to_string().contains("not a listening unix stream socket"),
            "{e}"
        );
        // The pipe is still ours and still open.
        tx.write_all(b"ok").unwrap();
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"ok");

        let (a, _b) = UnixStream::pair().unwrap();
        assert_eq!(refused(a.as_raw_fd()).kind(), io::ErrorKind::InvalidInput);
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(refused(tcp.as_raw_fd()).kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_listener_is_copied_not_taken() {
        let dir = std::env::temp_dir().join(format!("virtnet-sys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let original = UnixListener::bind(&path).unwrap();
        let copy = unix_listener_from_fd(original.as_raw_fd()).unwrap();
        assert_ne!(copy.as_raw_fd(), original.as_raw_fd());
        let _c = UnixStream::connect(&path).unwrap();
        copy.accept().unwrap();
        // Two calls make two independent copies, and closing them leaves the original working.
        let again = unix_listener_from_fd(original.as_raw_fd()).unwrap();
        drop((copy, again));
        let _c = UnixStream::connect(&path).unwrap();
        original.accept().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
