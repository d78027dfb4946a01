//! Least privilege once the backend is set up: the capabilities it no longer needs dropped,
//! `no_new_privs` set, and a seccomp allow-list on the threads that touch guest memory.
//!
//! - [`drop_privileges`] keeps at most CAP_NET_ADMIN (NET_SET_MTU sets the TAP's MTU with
//!   SIOCSIFMTU; TUNSETQUEUE on a TAP owned by another user needs it too) and clears every
//!   other capability from the effective, permitted, inheritable and ambient sets and from the
//!   bounding set, then sets `no_new_privs`, so that nothing the process runs later gains one
//!   back. A process that has none (run as the TAP's owner, see README) loses nothing.
//! - [`restrict_thread`] installs [`WORKER_SYSCALLS`] on the calling thread: a data worker or
//!   the control queue's, the threads that parse what the guest writes. Opening a file fails
//!   with ENOENT (glibc's malloc may try, see `no_open_filter`); any other system call kills
//!   the process (SECCOMP_RET_KILL_PROCESS): a worker that makes one is either a bug or a
//!   compromised worker, and neither should go on. The protocol, `virtnet ctl`, metrics and
//!   signal threads are not filtered (they accept connections, map memory files, open sockets).

use std::collections::BTreeMap;
use std::io;

use caps::{CapSet, Capability, CapsHashSet};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// The system calls a worker makes once running (measured with strace over tx, rx, GSO, the
/// control queue and reconnections), and those its rare paths need:
/// - frames and notifications: readv, writev, io_uring_enter (a TAP's batched tx, through a
///   ring restricted to WRITEV on that TAP: io_uring's operations bypass seccomp, so the ring
///   is made unable to do anything else), read, write, preadv2 (eventfds read without
///   blocking), poll (is the TAP readable), epoll_wait/epoll_pwait, epoll_ctl (arming the TAP
///   and kicks), timerfd_settime (held calls), getrusage (busy polling's yield check), pread64
///   (its schedstat check), rt_sigpending (its signal check),
///   clock_gettime (when the vDSO cannot answer), close (a stopped queue's fds);
/// - memory: mmap, munmap, mremap, mprotect, madvise, brk (the allocator; a stopped queue's
///   guest memory unmapped here; the SIGBUS handler's anonymous mapping over a shrunk file);
/// - threads and signals: futex, sched_yield, rt_sigprocmask, rt_sigreturn (the watchdog's
///   interrupt and the SIGBUS handler return), rt_sigaction (the SIGBUS handler passing a
///   fault outside guest memory on), sigaltstack and exit (a thread ending), nanosleep and
///   clock_nanosleep (the control-queue benchmark's slow device), gettid, getpid;
/// - ioctl, for TUNSETQUEUE only (the control queue's VQ_PAIRS_SET attaches and detaches TAP
///   queues); fcntl, for F_GETFD only (the standard library's debug builds check that an fd
///   is open before closing it); getsockopt, for SOL_SOCKET / SO_ERROR only (a host port's fd
///   that reports EPOLLERR: `error_persists` takes a socket's pending error, and a deleted
///   TAP's fd refuses the option with ENOTSOCK). These three are added by `worker_filter`,
///   each with its arguments.
///
/// Keeping it complete: every worker path a test reaches runs under this filter (the
/// backend's `BackendConfig::seccomp` is on by default, in its unit and integration tests
/// too), so a call missing here kills the test process with SIGSYS; a new path is traced with
/// strace first. A call goes here only with the path that needs it named above, and
/// restricted by argument where the call can do more than that path needs (docs/
/// ARCHITECTURE.md, "Least privilege", has the method).
pub const WORKER_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_io_uring_enter,
    libc::SYS_preadv2,
    libc::SYS_pread64,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_ctl,
    libc::SYS_timerfd_settime,
    libc::SYS_getrusage,
    libc::SYS_clock_gettime,
    libc::SYS_close,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigpending,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigaction,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_nanosleep,
    libc::SYS_clock_nanosleep,
    libc::SYS_gettid,
    libc::SYS_getpid,
];

/// The filter of [`restrict_thread`], as BPF.
fn worker_filter() -> io::Result<BpfProgram> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        WORKER_SYSCALLS.iter().map(|&nr| (nr, vec![])).collect();
    let tunsetqueue = arg_is(1, libc::TUNSETQUEUE)?;
    rules.insert(
        libc::SYS_ioctl,
        vec![SeccompRule::new(vec![tunsetqueue]).map_err(io::Error::other)?],
    );
    // F_GETFD: the standard library's debug builds check that an fd is open before closing it.
    let getfd = arg_is(1, libc::F_GETFD as u64)?;
    rules.insert(
        libc::SYS_fcntl,
        vec![SeccompRule::new(vec![getfd]).map_err(io::Error::other)?],
    );
    // SOL_SOCKET / SO_ERROR: reading a socket's pending error after EPOLLERR (`error_persists`).
    let so_error = vec![
        arg_is(1, libc::SOL_SOCKET as u64)?,
        arg_is(2, libc::SO_ERROR as u64)?,
    ];
    rules.insert(
        libc::SYS_getsockopt,
        vec![SeccompRule::new(so_error).map_err(io::Error::other)?],
    );
    // Opening a file: let through here, to be refused by `no_open_filter`.
    for nr in OPEN_SYSCALLS {
        rules.insert(nr, vec![]);
    }
    program(rules, SeccompAction::KillProcess, SeccompAction::Allow)
}

/// The calls that open a file by name (openat2 is left to the allow-list: neither glibc nor
/// the standard library makes it).
const OPEN_SYSCALLS: [libc::c_long; 2] = [libc::SYS_open, libc::SYS_openat];

/// The filter installed under [`worker_filter`]: opening a file fails with ENOENT rather than
/// killing the process (seccomp takes the stricter action of the two filters, and the other
/// lets these through). Not ours: glibc's malloc opens /proc/sys/vm/overcommit_memory the
/// first time any thread's heap shrinks, in whichever thread frees the memory, and takes a
/// failure as "not strict" (it then gives the pages back with madvise). A worker's free
/// killed a test process that way. Our own code opens nothing once filtered (its files are
/// opened before: the schedstat, the board); crosvm's device policies answer opens so too.
fn no_open_filter() -> io::Result<BpfProgram> {
    let rules = OPEN_SYSCALLS.iter().map(|&nr| (nr, vec![])).collect();
    let enoent = SeccompAction::Errno(libc::ENOENT as u32);
    program(rules, SeccompAction::Allow, enoent)
}

/// `rules` as BPF for this architecture: `on_match` for a call that matches one, `otherwise`
/// for the others.
fn program(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    otherwise: SeccompAction,
    on_match: SeccompAction,
) -> io::Result<BpfProgram> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| io::Error::other(format!("seccomp: {e:?}")))?;
    let filter = SeccompFilter::new(rules, otherwise, on_match, arch).map_err(io::Error::other)?;
    filter.try_into().map_err(io::Error::other)
}

/// A rule condition: argument `index` (its low 32 bits, as the kernel takes an int there)
/// equals `value`.
fn arg_is(index: u8, value: u64) -> io::Result<SeccompCondition> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, value)
        .map_err(io::Error::other)
}

/// Allows the calling thread only [`WORKER_SYSCALLS`] (and the three calls restricted by
/// argument) from now on, opening a file fails with ENOENT, and any other call kills the
/// process; sets `no_new_privs` for it, as seccomp requires without CAP_SYS_ADMIN.
///
/// First it makes sure the peer-fd watchdog runs (`peer_fd::prepare_watchdog`): a filtered
/// thread may neither start a thread nor install a signal handler, which its first peer-fd
/// write would otherwise do. A device starts the watchdog before its workers, so that the
/// watchdog is no worker's child (a pinned worker's affinity would be its); this is for
/// callers that run a worker alone.
pub fn restrict_thread() -> io::Result<()> {
    crate::peer_fd::prepare_watchdog()?;
    let (no_open, allowed) = (no_open_filter()?, worker_filter()?);
    // In this order: installing a filter is a call the allow-list forbids.
    seccompiler::apply_filter(&no_open).map_err(io::Error::other)?;
    seccompiler::apply_filter(&allowed).map_err(io::Error::other)
}

/// What [`drop_privileges`] kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// CAP_NET_ADMIN is still effective (it was before).
    pub net_admin: bool,
}

/// Drops every capability but CAP_NET_ADMIN from all sets of the process (the bounding set
/// first, while CAP_SETPCAP allows it), and sets `no_new_privs`. Capabilities are per thread
/// in Linux: call it before the threads that should lose them exist, or from each.
pub fn drop_privileges() -> io::Result<Kept> {
    let err = |e: caps::errors::CapsError| io::Error::other(e.to_string());
    let net_admin =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_NET_ADMIN).map_err(err)?;
    let mut keep = CapsHashSet::new();
    if net_admin {
        keep.insert(Capability::CAP_NET_ADMIN);
    }
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).map_err(err)? {
        for c in caps::read(None, CapSet::Bounding).map_err(err)? {
            if !keep.contains(&c) {
                caps::drop(None, CapSet::Bounding, c).map_err(err)?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(err)?;
    caps::clear(None, CapSet::Inheritable).map_err(err)?;
    // Effective must stay within permitted: set it first, then shrink permitted.
    caps::set(None, CapSet::Effective, &keep).map_err(err)?;
    caps::set(None, CapSet::Permitted, &keep).map_err(err)?;
    set_no_new_privs()?;
    Ok(Kept { net_admin })
}

/// PR_SET_NO_NEW_PRIVS: execve can no longer grant privileges (setuid bits, file
/// capabilities) to this process or its children.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field of thread `tid`'s /proc status ("Seccomp", "NoNewPrivs").
    fn status(tid: libc::pid_t, field: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let line = s
            .lines()
            .find(|l| l.starts_with(&format!("{field}:")))
            .unwrap()
            .to_string();
        line.split_whitespace().nth(1).unwrap().to_string()
    }

    fn gettid() -> libc::pid_t {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() }
    }

    #[test]
    fn a_restricted_thread_makes_its_system_calls_and_is_in_filter_mode() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let e = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
            restrict_thread().unwrap();
            // What a worker does: eventfd reads and writes, memory, time, a futex wait.
            e.write(2).unwrap();
            assert_eq!(e.read().unwrap(), 2);
            drop(e);
            let v = vec![1u8; 1 << 22];
            std::thread::sleep(std::time::Duration::from_millis(1));
            tx.send((gettid(), v.iter().map(|&b| b as u64).sum::<u64>()))
                .unwrap();
            done_rx.recv().unwrap();
        });
        let (tid, sum) = rx.recv().unwrap();
        assert_eq!(sum, 1 << 22);
        assert_eq!(status(tid, "Seccomp"), "2", "filter mode");
        assert_eq!(status(tid, "NoNewPrivs"), "1");
        // Other threads are not filtered.
        assert_eq!(status(gettid(), "Seccomp"), "0");
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_restricted_thread_takes_a_socket_error_and_sees_a_pipe_in_error() {
        use std::net::UdpSocket;
        use std::os::fd::AsRawFd;
        // A UDP socket whose datagram went to a closed port: ICMP port unreachable leaves
        // ECONNREFUSED pending (EPOLLERR), which reading SO_ERROR clears.
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect(("127.0.0.1", port)).unwrap();
        udp.send(b"x").unwrap();
        let pending = std::time::Instant::now();
        while crate::revents_now(udp.as_raw_fd(), 0) & libc::POLLERR == 0 {
            assert!(pending.elapsed().as_secs() < 5, "no error pending");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // A pipe whose reader is gone: an error for good on its write end.
        let (rd, wr) = std::io::pipe().unwrap();
        drop(rd);
        std::thread::spawn(move || {
            restrict_thread().unwrap();
            // The socket's error is taken (getsockopt SOL_SOCKET/SO_ERROR passes the
            // filter); the pipe's stays (the kernel refuses SO_ERROR on it: ENOTSOCK).
            let socket_error = crate::error_persists(udp.as_raw_fd());
            let pipe_error = crate::error_persists(wr.as_raw_fd());
            (socket_error, pipe_error)
        })
        .join()
        .map(|errors| assert_eq!(errors, (false, true)))
        .unwrap();
    }

    /// A call a filtered thread may not make, by name (run in a child process, which it kills).
    fn forbidden(case: &str) -> libc::c_int {
        let (mut value, mut len) = (0 as libc::c_int, 4 as libc::socklen_t);
        match case {
            // SAFETY: socket takes integer arguments only.
            "socket" => unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) },
            // Another option than SO_ERROR.
            // SAFETY: `value` and `len` are valid for writes of the sizes given.
            "getsockopt" => unsafe {
                libc::getsockopt(
                    0,
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&mut value as *mut libc::c_int).cast(),
                    &mut len,
                )
            },
            // SAFETY: F_SETFL takes an int and touches no memory.
            "fcntl" => unsafe { libc::fcntl(0, libc::F_SETFL, 0) },
            _ => unreachable!("no case {case}"),
        }
    }

    /// Runs test `test` of this binary again in a child process, with `case` in its
    /// environment: how the child ended.
    fn in_child(test: &str, case: &str) -> std::process::Output {
        let exe = std::env::current_exe().unwrap();
        std::process::Command::new(exe)
            .args(["--exact", &format!("sandbox::tests::{test}"), "--nocapture"])
            .env("VIRTNET_SANDBOX_CHILD", case)
            .output()
            .unwrap()
    }

    fn child_case() -> Option<String> {
        std::env::var_os("VIRTNET_SANDBOX_CHILD").map(|c| c.to_string_lossy().into_owned())
    }

    #[test]
    fn a_system_call_outside_the_list_kills_the_process() {
        // In a child process: the filter's action is to kill it.
        if let Some(case) = child_case() {
            restrict_thread().unwrap();
            let r = forbidden(&case);
            std::process::exit(r); // Not reached.
        }
        for case in ["socket", "getsockopt", "fcntl"] {
            let out = in_child("a_system_call_outside_the_list_kills_the_process", case);
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(out.status.signal(), Some(libc::SIGSYS), "{case}: {out:?}");
        }
    }

    #[test]
    fn opening_a_file_fails_with_enoent_and_the_thread_goes_on() {
        std::thread::spawn(|| {
            restrict_thread().unwrap();
            let e = std::fs::File::open("/proc/self/status").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
            let e = std::fs::File::create("/tmp/virtnet-never-created").unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        })
        .join()
        .unwrap();
        assert!(!std::path::Path::new("/tmp/virtnet-never-created").exists());
    }

    /// glibc's malloc opens /proc/sys/vm/overcommit_memory the first time a thread's heap
    /// (a thread arena's, not the main one's) shrinks, in the thread that freed the memory: a
    /// filtered worker's free killed a test process with SIGSYS that way. In a fresh child,
    /// where nothing has shrunk a heap yet, a filtered thread frees enough at the top of its
    /// heap to shrink it, and lives.
    #[test]
    fn a_heap_shrinking_under_the_filter_does_not_kill() {
        if child_case().is_some() {
            let freed = std::thread::spawn(|| {
                // A first allocation: the thread's own arena (the process has one other).
                let first = Box::new(1u64);
                restrict_thread().unwrap();
                // 4 MiB in 64 KiB blocks (under the 128 KiB above which malloc maps them one
                // by one), on the arena's heap; freed last first, each into the top chunk.
                let mut blocks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 << 10]).collect();
                let sum: u64 = blocks.iter().map(|b| b[100] as u64).sum();
                while blocks.pop().is_some() {}
                sum + *first
            })
            .join()
            .unwrap();
            std::process::exit(if freed == 2017 { 0 } else { 1 });
        }
        let out = in_child("a_heap_shrinking_under_the_filter_does_not_kill", "heap");
        assert!(out.status.success(), "{out:?}");
    }
}
