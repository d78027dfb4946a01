//! Eventfds shared with the peer: the kick, call and err eventfds a vhost-user frontend sends
//! the backend, and those our driver sends its backend. Both ends hold the same open file
//! description, so the peer can clear `O_NONBLOCK` on it and fill or drain the counter
//! behind our back.
//!
//! - [`PeerEventFd::adopt`] takes only an eventfd (checked through `/proc/self/fd`) and sets
//!   `O_NONBLOCK`.
//! - [`PeerEventFd::take`] reads with `preadv2(RWF_NOWAIT)`, which cannot block whatever the
//!   file's flags.
//! - [`PeerEventFd::signal`] writes, non-blocking unless the peer cleared the flag. Linux has
//!   no non-blocking-per-call write for eventfds (`pwritev2(RWF_NOWAIT)` fails with
//!   EOPNOTSUPP): the write blocks when the peer has both cleared `O_NONBLOCK` and filled the
//!   counter to its maximum. The writing thread is then interrupted by the stall watchdog
//!   within two of its periods (250 ms each), and the write fails with
//!   [`io::ErrorKind::Interrupted`]. That handle never writes again (later calls fail at once),
//!   and the caller treats the fd as hostile: the backend breaks the queue.
//!   Every thread that writes a peer fd is watched, from its first such write to its exit.
//!
//! The watchdog is one thread per process. It wakes only while some watched thread has used a
//! peer fd in the last second, so an idle process does not wake at all.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::Duration;

/// How often the watchdog looks while peer fds are in use; a write blocked for two periods
/// is interrupted.
pub const WATCHDOG_PERIOD: Duration = Duration::from_millis(250);

/// Periods without any peer-fd write before the watchdog sleeps until the next one.
const IDLE_PERIODS: u32 = 4;

/// An eventfd shared with the peer. Reads never block; writes are watched (see the module
/// docs), and once a write has blocked this handle never writes again.
#[derive(Debug)]
pub struct PeerEventFd {
    fd: OwnedFd,
    /// A write through this handle blocked and was interrupted: the peer made the fd blocking
    /// and filled it, so every later write would stall as long again.
    blocked: AtomicBool,
}

impl PeerEventFd {
    /// A new eventfd of our own (non-blocking, close-on-exec), to share with a peer.
    pub fn new() -> io::Result<PeerEventFd> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new fd we own.
        let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` was just created and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(PeerEventFd::wrap(fd))
    }

    /// Adopts a file the peer sent. Refuses (InvalidInput) anything but an eventfd: a pipe, a
    /// socket or a regular file in its place would make reads and writes mean something else.
    pub fn adopt(file: File) -> io::Result<PeerEventFd> {
        let fd = OwnedFd::from(file);
        if !is_eventfd(fd.as_raw_fd()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the file is not an eventfd",
            ));
        }
        set_nonblocking(fd.as_fd())?;
        Ok(PeerEventFd::wrap(fd))
    }

    fn wrap(fd: OwnedFd) -> PeerEventFd {
        PeerEventFd {
            fd,
            blocked: AtomicBool::new(false),
        }
    }

    /// Takes over an eventfd made by `vmm-sys-util` (in-process peers, fuzzing), setting
    /// `O_NONBLOCK`.
    pub fn from_eventfd(e: vmm_sys_util::eventfd::EventFd) -> io::Result<PeerEventFd> {
        use std::os::fd::IntoRawFd;
        // SAFETY: `into_raw_fd` released the descriptor of an eventfd, which nothing else
        // owns now.
        let fd = unsafe { OwnedFd::from_raw_fd(e.into_raw_fd()) };
        set_nonblocking(fd.as_fd())?;
        Ok(PeerEventFd::wrap(fd))
    }

    /// A `vmm-sys-util` eventfd on another descriptor of the same eventfd, for APIs that take
    /// one (rust-vmm `vhost`'s frontend sends it to the backend).
    pub fn to_eventfd(&self) -> io::Result<vmm_sys_util::eventfd::EventFd> {
        let copy = self.fd.try_clone()?;
        use std::os::fd::IntoRawFd;
        // SAFETY: `copy` is a new descriptor of an eventfd that nothing else owns.
        Ok(unsafe { vmm_sys_util::eventfd::EventFd::from_raw_fd(copy.into_raw_fd()) })
    }

    /// Another descriptor of the same eventfd (to send to the peer, or to keep for a test).
    pub fn try_clone(&self) -> io::Result<PeerEventFd> {
        Ok(PeerEventFd::wrap(self.fd.try_clone()?))
    }

    /// Consumes the counter: its value, or 0 when nothing was signalled. Never blocks.
    pub fn take(&self) -> io::Result<u64> {
        let mut value = 0u64;
        let iov = libc::iovec {
            iov_base: (&mut value as *mut u64).cast(),
            iov_len: 8,
        };
        // SAFETY: `iov` describes the 8 writable bytes of `value`, live for the call; offset -1
        // means the file position, which eventfds ignore.
        let r = unsafe { libc::preadv2(self.fd.as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
        match r {
            8 => Ok(value),
            r if r >= 0 => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short read from an eventfd",
            )),
            _ => {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(0),
                    _ => Err(e),
                }
            }
        }
    }

    /// Adds 1 to the counter. Err(WouldBlock) when the counter is at its maximum: the peer
    /// has notifications it has not read, so nothing is lost. Err(Interrupted) when the write
    /// blocked and the watchdog interrupted it: the peer made this fd blocking and saturated
    /// it. From then on every call fails at once (BrokenPipe) without writing.
    pub fn signal(&self) -> io::Result<()> {
        if self.blocked.load(Ordering::Relaxed) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer made this eventfd block: no longer written",
            ));
        }
        let one = 1u64;
        let _watched = Watched::enter();
        // SAFETY: `one` is 8 readable bytes, live for the call.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if r == 8 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if r < 0 && e.kind() == io::ErrorKind::Interrupted {
            self.blocked.store(true, Ordering::Relaxed);
        }
        match e.kind() {
            _ if r >= 0 => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short write to an eventfd",
            )),
            _ => Err(e),
        }
    }
}

impl AsRawFd for PeerEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for PeerEventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Whether `fd` is an eventfd: its `/proc/self/fd` link names the eventfd anonymous inode.
fn is_eventfd(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|target| target.as_os_str() == "anon_inode:[eventfd]")
}

fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    crate::set_nonblocking(fd, true)
}

/// A thread's registration with the watchdog: odd `seq` while the thread is inside a peer-fd
/// write, bumped on every entry and exit.
#[derive(Debug)]
struct Watch {
    seq: AtomicU64,
    thread: libc::pthread_t,
}

/// The watched threads: every thread that has written a peer fd. A thread removes itself
/// (its [`Registration`] is a thread-local) before it exits, under this lock, so the
/// watchdog only signals threads that are alive.
static WATCHED: Mutex<Vec<Arc<Watch>>> = Mutex::new(Vec::new());

/// Set by the watchdog before it sleeps without a timeout; a watched write that sees it wakes
/// the watchdog.
static WATCHDOG_ASLEEP: AtomicBool = AtomicBool::new(false);

/// How many blocked writes the watchdog has interrupted, process-wide.
static INTERRUPTS: AtomicU64 = AtomicU64::new(0);

static WATCHDOG: OnceLock<std::thread::Thread> = OnceLock::new();

thread_local! {
    /// The calling thread's registration, made on its first peer-fd write and removed when
    /// the thread exits.
    static CURRENT: Registration = Registration::new();
}

/// A thread's place in [`WATCHED`]; `None` if the watchdog could not be set up.
struct Registration(Option<Arc<Watch>>);

impl Registration {
    fn new() -> Registration {
        if let Err(e) = install_interrupt_handler().and_then(|()| start_watchdog()) {
            // Writes still work; only a peer that makes them block is not interrupted.
            tracing::warn!(error = %e, "peer fd watchdog unavailable");
            return Registration(None);
        }
        let watch = Arc::new(Watch {
            seq: AtomicU64::new(0),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() },
        });
        WATCHED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(watch.clone());
        Registration(Some(watch))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(watch) = &self.0 {
            let mut list = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
            list.retain(|w| !Arc::ptr_eq(w, watch));
        }
    }
}

/// Starts the watchdog and installs its signal handler now, rather than on the first peer-fd
/// write: for threads that may not create threads or change signal actions later (a
/// sandboxed worker, `sandbox::restrict_thread`).
pub fn prepare_watchdog() -> io::Result<()> {
    install_interrupt_handler().and_then(|()| start_watchdog())
}

/// How many peer-fd writes the watchdog has interrupted in this process.
pub fn interrupted_writes() -> u64 {
    INTERRUPTS.load(Ordering::Relaxed)
}

/// The span of one watched write: `seq` is odd inside it.
struct Watched(Option<Arc<Watch>>);

impl Watched {
    fn enter() -> Watched {
        // None while the thread's locals are being destroyed, or without a watchdog.
        let w = CURRENT.try_with(|r| r.0.clone()).ok().flatten();
        if let Some(w) = &w {
            // SeqCst, paired with the watchdog's SeqCst store of WATCHDOG_ASLEEP and its
            // re-check of every seq: either it sees this odd seq, or we see it asleep.
            w.seq.fetch_add(1, Ordering::SeqCst);
            if WATCHDOG_ASLEEP.load(Ordering::SeqCst) {
                WATCHDOG_ASLEEP.store(false, Ordering::SeqCst);
                if let Some(t) = WATCHDOG.get() {
                    t.unpark();
                }
            }
        }
        Watched(w)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if let Some(w) = &self.0 {
            w.seq.fetch_add(1, Ordering::Release);
        }
    }
}

/// The signal that interrupts a blocked write: the first real-time signal, whose handler does
/// nothing. It is installed without SA_RESTART, so the write returns EINTR.
fn interrupt_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

extern "C" fn on_interrupt(_: libc::c_int) {}

fn install_interrupt_handler() -> io::Result<()> {
    static INSTALL: Once = Once::new();
    static FAILED: AtomicBool = AtomicBool::new(false);
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain old data; all-zero is an empty mask and no flags.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `action` is a valid sigaction whose handler is async-signal-safe (it does
        // nothing); the old action is not wanted.
        let r = unsafe { libc::sigaction(interrupt_signal(), &action, std::ptr::null_mut()) };
        FAILED.store(r < 0, Ordering::Relaxed);
    });
    if FAILED.load(Ordering::Relaxed) {
        return Err(io::Error::other(
            "cannot install the peer-fd interrupt handler",
        ));
    }
    Ok(())
}

fn start_watchdog() -> io::Result<()> {
    if WATCHDOG.get().is_some() {
        return Ok(());
    }
    static START: Mutex<()> = Mutex::new(());
    let _once = START.lock().unwrap_or_else(|p| p.into_inner());
    if WATCHDOG.get().is_none() {
        let t = std::thread::Builder::new()
            .name("virtnet-watchdog".into())
            .spawn(watchdog)?;
        let _ = WATCHDOG.set(t.thread().clone());
    }
    Ok(())
}

/// The watchdog: every period, a thread whose `seq` is odd and the same as one period ago
/// has been inside one write that long, and is sent the interrupt signal (again each period
/// until it leaves). After IDLE_PERIODS periods with no write at all it sleeps until a
/// watched write wakes it.
fn watchdog() {
    let mut last: Vec<(usize, u64)> = Vec::new();
    let mut idle = 0;
    loop {
        std::thread::sleep(WATCHDOG_PERIOD);
        let list = WATCHED.lock().unwrap_or_else(|p| p.into_inner());
        let mut moved = false;
        let mut seen = Vec::with_capacity(list.len());
        for w in list.iter() {
            let key = Arc::as_ptr(w) as usize;
            let seq = w.seq.load(Ordering::Acquire);
            let before = last.iter().find(|(k, _)| *k == key).map(|&(_, s)| s);
            if before != Some(seq) {
                moved = true;
            } else if seq % 2 == 1 {
                // SAFETY: the thread is registered, and it unregisters under the lock we
                // hold before it exits, so `thread` names a live thread.
                if unsafe { libc::pthread_kill(w.thread, interrupt_signal()) } == 0 {
                    INTERRUPTS.fetch_add(1, Ordering::Relaxed);
                }
            }
            seen.push((key, seq));
        }
        let stuck = seen.iter().any(|&(_, s)| s % 2 == 1);
        last = seen;
        idle = if moved || stuck { 0 } else { idle + 1 };
        if idle < IDLE_PERIODS {
            continue;
        }
        WATCHDOG_ASLEEP.store(true, Ordering::SeqCst);
        // Re-check after announcing the sleep: a write that entered before it saw the flag
        // shows here (see Watched::enter).
        let entered = list
            .iter()
            .zip(&last)
            .any(|(w, &(_, s))| w.seq.load(Ordering::SeqCst) != s);
        drop(list);
        if entered {
            WATCHDOG_ASLEEP.store(false, Ordering::SeqCst);
        } else {
            while WATCHDOG_ASLEEP.load(Ordering::SeqCst) {
                std::thread::park();
            }
        }
        idle = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_eventfds_are_adopted() {
        let (r, w) = pipe();
        drop(w);
        let e = PeerEventFd::adopt(r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let f = File::open("/proc/self/status").unwrap();
        assert!(PeerEventFd::adopt(f).is_err());
        let ours = PeerEventFd::new().unwrap();
        let theirs = PeerEventFd::adopt(File::from(ours.try_clone().unwrap().fd)).unwrap();
        theirs.signal().unwrap();
        assert_eq!(ours.take().unwrap(), 1);
    }

    #[test]
    fn reads_do_not_block_when_the_peer_clears_o_nonblock() {
        let e = PeerEventFd::new().unwrap();
        clear_nonblocking(&e);
        assert_eq!(e.take().unwrap(), 0);
        e.signal().unwrap();
        e.signal().unwrap();
        assert_eq!(e.take().unwrap(), 2);
    }

    #[test]
    fn a_saturated_non_blocking_counter_refuses_without_blocking() {
        let e = PeerEventFd::new().unwrap();
        saturate(&e);
        assert_eq!(e.signal().unwrap_err().kind(), io::ErrorKind::WouldBlock);
        assert_eq!(e.take().unwrap(), u64::MAX - 1);
        e.signal().unwrap();
    }

    #[test]
    fn a_blocked_write_is_interrupted_by_the_watchdog() {
        let e = PeerEventFd::new().unwrap();
        clear_nonblocking(&e);
        saturate(&e);
        let before = interrupted_writes();
        let t = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let r = e.signal();
            let took = started.elapsed();
            // It never writes again: no second stall.
            let started = std::time::Instant::now();
            let again = e.signal();
            (
                r.map_err(|e| e.kind()),
                took,
                again.map_err(|e| e.kind()),
                started.elapsed(),
            )
        });
        let (r, took, again, took_again) = t.join().unwrap();
        assert_eq!(r, Err(io::ErrorKind::Interrupted));
        assert!(took < 20 * WATCHDOG_PERIOD, "returned after {took:?}");
        assert!(interrupted_writes() > before);
        assert_eq!(again, Err(io::ErrorKind::BrokenPipe));
        assert!(
            took_again < WATCHDOG_PERIOD,
            "stalled again for {took_again:?}"
        );
    }

    fn pipe() -> (File, File) {
        let (r, w) = std::io::pipe().unwrap();
        (File::from(OwnedFd::from(r)), File::from(OwnedFd::from(w)))
    }

    fn clear_nonblocking(e: &PeerEventFd) {
        crate::set_nonblocking(e.as_fd(), false).unwrap();
    }

    /// Fills the counter to its maximum, 2^64 - 2, as a hostile peer would.
    fn saturate(e: &PeerEventFd) {
        let mut f = File::from(e.try_clone().unwrap().fd);
        f.write_all(&(u64::MAX - 1).to_ne_bytes()).unwrap();
    }
}
