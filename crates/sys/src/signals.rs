//! SIGTERM and SIGINT for a service: blocked in every thread and taken, one at a time, by the
//! thread that waits for them (`sigwait`), so that shutting down is ordinary code rather than
//! a signal handler.

use std::io;

/// SIGTERM and SIGINT, blocked in the thread that made this and in every thread it starts
/// afterwards. Make it first thing in `main`, before any thread exists.
#[derive(Debug)]
pub struct TerminationSignals {
    set: libc::sigset_t,
}

impl TerminationSignals {
    pub fn block() -> io::Result<TerminationSignals> {
        // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
        unsafe {
            libc::sigemptyset(&mut set);
        }
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: as above.
            unsafe { libc::sigaddset(&mut set, sig) };
        }
        // SAFETY: `set` is initialised; the old mask is not wanted.
        let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(TerminationSignals { set })
    }

    /// Waits for the next SIGTERM or SIGINT sent to the process; its number.
    pub fn wait(&self) -> io::Result<libc::c_int> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised and `sig` writable; the signals are blocked, as
        // sigwait requires.
        let r = unsafe { libc::sigwait(&self.set, &mut sig) };
        if r != 0 {
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok(sig)
    }
}
