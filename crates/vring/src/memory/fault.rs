//! Guest memory that the peer shrinks under us. A region is a shared mapping of the peer's
//! file; if the peer truncates the file after we mapped it, our next access to a page past
//! the new end raises SIGBUS, whose default action kills the process (DPDK's vhost library
//! dies that way).
//!
//! Seals would prevent it, but only memfds can be sealed, and neither QEMU's
//! `memory-backend-file` (a file on tmpfs or hugetlbfs) nor DPDK's virtio-user memory is. So
//! every region received from a peer is registered here, and a SIGBUS handler catches faults
//! inside a registered region: it maps private anonymous memory over the whole region, in
//! place (`MAP_FIXED`), marks the region faulted and returns. The access that faulted then
//! completes on zero-filled memory, nothing is shared with the peer any more, and the caller
//! (the backend's worker, which polls [`fault_count`]) breaks every queue on that memory.
//!
//! A fault outside every registered region goes to the handler that was there before (the
//! standard library's stack-overflow handler, or the default action).
//!
//! The registry is a fixed array of slots, so the handler touches only atomics and calls only
//! `mmap`. A slot stays valid while the handler looks at it: the faulting thread is inside an
//! access to that region, so it holds the `GuestMemory`, whose region releases its slot before
//! it unmaps.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use crate::Error;

/// Regions that can be registered at once: four full vhost-user memory tables (509 regions
/// each), more than a backend holds at a time (one per connection, while a new one replaces
/// the old).
const SLOTS: usize = 2048;

struct Slot {
    /// 0 free, 1 taken.
    state: AtomicU8,
    start: AtomicUsize,
    /// 0 while the slot is being filled or emptied: no address is below it.
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    state: AtomicU8::new(0),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static REGISTRY: [Slot; SLOTS] = [FREE; SLOTS];

/// Faults handled so far, process-wide.
static FAULTS: AtomicU64 = AtomicU64::new(0);

/// The SIGBUS action before ours, called for faults that are not in guest memory.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// How many faults in guest memory this process has survived. A caller that remembers the
/// last value it saw learns, with one load, whether to check its memory
/// ([`super::GuestMemory::faulted`]).
#[inline]
pub fn fault_count() -> u64 {
    FAULTS.load(Ordering::Acquire)
}

/// A registered region; dropping it releases the slot (before the mapping goes).
#[derive(Debug)]
pub(super) struct Registration {
    slot: usize,
}

impl Registration {
    /// Registers `len` bytes at `start`, installing the handler on first use.
    pub(super) fn new(start: *mut u8, len: usize) -> Result<Registration, Error> {
        install_handler()?;
        let slot = REGISTRY
            .iter()
            .position(|s| {
                s.state
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(Error::InvalidMemory {
                reason: "too many guest memory regions mapped in this process",
            })?;
        let s = &REGISTRY[slot];
        s.faulted.store(false, Ordering::Relaxed);
        s.start.store(start as usize, Ordering::Relaxed);
        // Release: a handler that sees `end` sees `start` too.
        s.end.store(start as usize + len, Ordering::Release);
        Ok(Registration { slot })
    }

    /// Whether a fault replaced this region's memory.
    pub(super) fn faulted(&self) -> bool {
        REGISTRY[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = &REGISTRY[self.slot];
        s.end.store(0, Ordering::Release);
        s.start.store(0, Ordering::Relaxed);
        s.state.store(0, Ordering::Release);
    }
}

fn install_handler() -> Result<(), Error> {
    static INSTALL: Once = Once::new();
    static FAILED: AtomicBool = AtomicBool::new(false);
    INSTALL.call_once(|| {
        // SAFETY: sigaction is plain old data; all-zero is an empty mask and no flags.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: as above.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both point to valid sigactions; the handler only uses async-signal-safe
        // operations (atomics, mmap, and the previous handler).
        let r = unsafe { libc::sigaction(libc::SIGBUS, &action, &mut previous) };
        if r < 0 {
            FAILED.store(true, Ordering::Relaxed);
            return;
        }
        let _ = PREVIOUS.set(previous);
    });
    if FAILED.load(Ordering::Relaxed) {
        return Err(Error::Mmap {
            reason: "cannot install the SIGBUS handler for guest memory".into(),
        });
    }
    Ok(())
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let info_ref = unsafe { &*info };
    // SAFETY: for SIGBUS the kernel fills si_addr, the address that faulted.
    let addr = unsafe { info_ref.si_addr() } as usize;
    for s in &REGISTRY {
        let end = s.end.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Relaxed);
        if addr < start || addr >= end {
            continue;
        }
        // SAFETY: [start, end) is a live mapping of ours (see the module docs); replacing it
        // with anonymous memory of the same size and protection keeps every pointer into it
        // valid. The flags need no file and cannot fail for lack of memory (NORESERVE).
        let r = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                end - start,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            break;
        }
        s.faulted.store(true, Ordering::Release);
        FAULTS.fetch_add(1, Ordering::AcqRel);
        return;
    }
    // Not guest memory (or it could not be replaced): what would have happened without us.
    // Unset only in the moment between installing our handler and recording the previous
    // one: the default action then.
    match PREVIOUS.get() {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this
                // signature.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: a handler installed without SA_SIGINFO takes the signal number only.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Back to the default action: the access faults again on return and the
            // process dies with SIGBUS, as it would have without this handler.
            // SAFETY: all-zero is SIG_DFL with an empty mask.
            let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: `dfl` is a valid sigaction; sigaction is async-signal-safe.
            unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
        }
    }
}
