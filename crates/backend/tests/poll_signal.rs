//! A busy poll ends when a signal is pending for its thread: the worker (echo io, a fixed
//! poll of one second) polls after a transaction; SIGUSR2, which the worker blocks as the
//! backend blocks SIGTERM and SIGINT in every thread, is raised at its thread; the poll ends
//! at once, counted as a signal exit, not a timeout (or, when another task took the CPU and
//! ended the poll first, the next poll ends at once for the signal still pending).
//!
//! In a binary of its own: it blocks a signal for the threads it starts.

use std::time::{Duration, Instant};

use testkit::inproc::{connect, echo_round, start_backend};
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use vring::Features;

/// The thread id of this process's thread `name`.
fn tid_of(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let e = e.ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == name).then(|| e.file_name().to_str()?.parse().ok())?
    })
}

/// Blocks SIGUSR2 in the calling thread, and so in the threads it starts afterwards.
fn block_sigusr2() {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    // SAFETY: as above; SIGUSR2 is a valid signal.
    unsafe { libc::sigaddset(&mut set, libc::SIGUSR2) };
    // SAFETY: `set` is initialised; the old mask is not wanted.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    assert_eq!(r, 0);
}

#[test]
fn a_pending_signal_ends_a_busy_poll() {
    block_sigusr2();
    let b = start_backend(
        "poll-signal",
        BackendConfig {
            io: IoMode::Echo,
            busy_poll: BusyPoll::Fixed(1_000_000),
            ..Default::default()
        },
    );
    let mut p = connect(&b, Features::VERSION_1 | vnet::feature::MRG_RXBUF);
    assert_eq!(echo_round(&mut p, 1, 60).len(), 1);
    let tx = b.device.counters(1);
    assert!(testkit::eventually(Duration::from_secs(5), || {
        tx.busy_poll_entries.get() > 0
    }));
    let tid = tid_of("virtnet-pair0").expect("the pair's worker thread");
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: signals a thread of this process with a signal it blocks.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, libc::SIGUSR2) };
    assert_eq!(r, 0);
    // Within 800 ms of `t`, the poll ended for the signal.
    let ended_for_it = |t: Instant| {
        testkit::eventually(Duration::from_millis(800), || {
            tx.busy_poll_exit_signal.get() > 0
        }) && t.elapsed() < Duration::from_millis(800)
    };
    let mut ended = ended_for_it(Instant::now());
    if !ended && tx.busy_poll_exit_yield.get() > 0 {
        // Another task wanted the CPU (a loaded machine): the poll ended for that before the
        // signal came. The signal stays pending, so the next poll, after the next
        // transaction, ends for it at once.
        let entries = tx.busy_poll_entries.get();
        let t = Instant::now();
        assert_eq!(echo_round(&mut p, 1, 60).len(), 1);
        assert!(testkit::eventually(Duration::from_secs(5), || {
            tx.busy_poll_entries.get() > entries
        }));
        ended = ended_for_it(t);
    }
    assert!(ended, "the one-second poll did not end for the signal");
    assert_eq!(tx.busy_poll_timeouts.get(), 0);
    // The signal stays pending (nobody takes SIGUSR2): traffic still flows.
    assert_eq!(echo_round(&mut p, 4, 60).len(), 4);
    drop(p);
}
