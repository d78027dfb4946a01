//! What a user sees after a hostile case, as one check: the process's threads are alive and
//! idle (its workers under their seccomp filter, when the device has it on, as by default), a
//! fresh connection moves frames within a second, and the process holds no more descriptors,
//! threads or memory than before the case.
//!
//! The check applies to what a test runs in its process ([`Served`]): a backend
//! ([`Backend`], a fresh connection echoed on its pair) or a switch ([`SwitchPorts`], fresh
//! connections on two of its ports exchanging frames).
//!
//! ```no_run
//! use testkit::{inproc, recovery};
//!
//! let exclusive = recovery::exclusive();
//! let b = inproc::echo_backend("tag");
//! let base = recovery::Baseline::take(&exclusive, &b);
//! // ... the hostile case, its connections closed ...
//! recovery::assert_recovered(&b, &base);
//! ```
//!
//! Descriptors, memory and threads are the process's, and the threads are found by name, so
//! a test that measures them must be the only one running in its test binary while it does.
//! [`exclusive`] serialises such tests within one binary (a binary of a single test, like
//! `backend/tests/idle.rs`, needs nothing more); a [`Baseline`] can only be taken under it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use virtnet_backend::QueueId;

use vnet::NetHdr;

use crate::inproc::{
    connect, echo_round_within, frame, tap_rx_packets, thread_cpu_ticks, thread_seccomp, Backend,
    SERVE_THREAD, WANTED,
};

mod switch;
pub use switch::SwitchPorts;

/// What the check looks at: the threads and sockets a test runs in its own process.
pub trait Served {
    /// Panics unless every one of its threads still runs (a panic on hostile input ends
    /// one) and, when it was configured with the seccomp filter, its workers run under it.
    fn assert_alive(&self);
    /// The names of its threads (as /proc shows them), each idle with nothing to do.
    fn threads(&self) -> Vec<String>;
    /// The sockets it listens on, each serving one frontend at a time.
    fn sockets(&self) -> Vec<PathBuf>;
    /// Fresh connections move [`FRESH_FRAMES`] within [`FRESH_WITHIN`] of starting to
    /// connect, and are then closed.
    fn assert_fresh_connection_moves_frames(&self);
}

impl Served for Backend {
    fn assert_alive(&self) {
        assert_backend_alive(self);
    }
    fn threads(&self) -> Vec<String> {
        backend_threads(self)
    }
    fn sockets(&self) -> Vec<PathBuf> {
        vec![self.socket.clone()]
    }
    fn assert_fresh_connection_moves_frames(&self) {
        assert_backend_moves_frames(self);
    }
}

/// The right to measure the process: while it is held, no other test of this binary that
/// takes it runs. Take it first in the test, before its backend exists, so that it is
/// released last: the backend's drop (which ends its threads) then happens under it too.
#[derive(Debug)]
pub struct Exclusive {
    _guard: MutexGuard<'static, ()>,
}

/// Waits until no other test of this binary holds [`Exclusive`]. A test that failed while
/// holding it does not stop the others.
pub fn exclusive() -> Exclusive {
    static LOCK: Mutex<()> = Mutex::new(());
    Exclusive {
        _guard: LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
    }
}

/// What the process holds, read from /proc/self.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Open descriptors (counting the one that lists them).
    pub fds: usize,
    pub threads: usize,
    /// Resident memory, in KiB.
    pub rss_kib: u64,
}

impl Usage {
    pub fn now() -> Usage {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
        };
        Usage {
            fds: std::fs::read_dir("/proc/self/fd")
                .expect("/proc/self/fd")
                .count(),
            threads: field("Threads:") as usize,
            rss_kib: field("VmRSS:"),
        }
    }

    /// The usage once `b` has closed every connection made before this call, and our
    /// driver's threads have ended.
    ///
    /// A connection just dropped is still being closed by the backend (its session's socket,
    /// its queues' eventfds, its memory table's memfd). Each socket serves one frontend at a
    /// time, so a probe connection that gets an answer proves the ones before it closed; the
    /// probes stay open while the usage is read, so that every reading counts them alike. Our
    /// driver's handshake watchdog thread (with a clone of its socket) ends a little after
    /// the handshake, so descriptors and threads must then stay unchanged for [`SETTLE`].
    pub fn settled(b: &(impl Served + ?Sized)) -> Usage {
        let probes: Vec<UnixStream> = b.sockets().iter().map(|s| answered_probe(s)).collect();
        let usage = Usage::steady();
        drop(probes);
        usage
    }

    /// The usage once descriptors and threads have stayed unchanged for [`SETTLE`] (or after
    /// [`SETTLE_LIMIT`]): for a backend with no listening socket to probe, a client-mode one,
    /// whose thread the caller has stopped.
    pub fn steady() -> Usage {
        let give_up = Instant::now() + SETTLE_LIMIT;
        let mut last = Usage::now();
        let mut since = Instant::now();
        while since.elapsed() < SETTLE && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
            let now = Usage::now();
            if (now.fds, now.threads) != (last.fds, last.threads) {
                since = Instant::now();
            }
            last = now;
        }
        last
    }
}

/// A connection to `socket` on which GET_FEATURES has been answered, so the connections
/// before it have been closed. Panics if it is not answered within [`SETTLE_LIMIT`]: a
/// connection of the test's is still open, or the device hangs.
fn answered_probe(socket: &Path) -> UnixStream {
    // VHOST_USER_GET_FEATURES (1), version 1, no payload: a header of three u32.
    let request = [1u32, 1, 0].map(u32::to_ne_bytes).concat();
    let mut s = UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect the probe to {}: {e}", socket.display()));
    s.set_read_timeout(Some(SETTLE_LIMIT)).unwrap();
    s.write_all(&request).expect("send the probe's request");
    // The reply: the header, then the features as a u64.
    let mut reply = [0u8; 20];
    if let Err(e) = s.read_exact(&mut reply) {
        panic!(
            "{} did not answer a new connection ({e}): is one still open?",
            socket.display()
        );
    }
    s
}

/// How long descriptors and threads must stay unchanged to count as settled.
pub const SETTLE: Duration = Duration::from_millis(100);
/// How long a connection before the probe may take to close.
pub const SETTLE_LIMIT: Duration = Duration::from_secs(5);

/// Resident memory the process may gain across a case and still count as recovered.
///
/// The allocator keeps some of what it frees (per-thread arenas, chunks it does not trim), so
/// RSS moves between otherwise equal states: by at most 0.2 MiB across each of the cases in
/// backend/tests (debug and release, process RSS 3 to 5 MiB), including a thousand
/// reconnects. Leaks are found exactly by the descriptor count instead: the backend cannot
/// keep a connection's memory or queues without keeping its memfd or eventfds open. This
/// bound catches growth that holds no descriptor (per frame, per request, per bad chain), 40
/// times the noise, yet small beside what such growth reaches over a case.
pub const RSS_SLACK_KIB: u64 = 8 << 10;

/// A backend's threads' CPU over one idle second, in clock ticks (100 a second), at most: a
/// thread that spins takes tens to a hundred; one asleep in epoll or accept, none; a tick or
/// two of accounting noise is allowed.
pub const IDLE_TICKS: u64 = 2;

/// The frames a fresh connection must move, and within how long of starting to connect.
pub const FRESH_FRAMES: u32 = 32;
pub const FRESH_WITHIN: Duration = Duration::from_secs(1);

/// The process before a hostile case, with the backend or switch warmed up.
#[derive(Debug)]
pub struct Baseline<'a> {
    pub usage: Usage,
    _exclusive: &'a Exclusive,
}

impl<'a> Baseline<'a> {
    /// Serves well-behaved connections on `b` (its workers then have their epoll sets, the
    /// allocator its arenas), and measures once they are closed.
    pub fn take(exclusive: &'a Exclusive, b: &(impl Served + ?Sized)) -> Baseline<'a> {
        b.assert_fresh_connection_moves_frames();
        Baseline {
            usage: Usage::settled(b),
            _exclusive: exclusive,
        }
    }
}

/// The names of `b`'s threads: its pairs' workers, the control queue's worker (as
/// backend/src/device.rs names them), and the thread serving frontends.
pub fn backend_threads(b: &Backend) -> Vec<String> {
    let mut names: Vec<String> = (0..b.device.pairs())
        .map(|p| format!("virtnet-pair{p}"))
        .collect();
    names.push("virtnet-ctrlq".into());
    names.push(SERVE_THREAD.into());
    names
}

/// Whether this process has a thread named `name` (as /proc shows it: see [`comm`]).
pub fn thread_exists(name: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name))
}

/// A thread's name as /proc shows it: Linux keeps its first 15 bytes (TASK_COMM_LEN, 16 with
/// the NUL), so `virtnet-port-vm1` is `virtnet-port-vm`.
pub fn comm(name: &str) -> String {
    let mut end = name.len().min(15);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

/// None of the threads of `b` has ended (a panic on hostile input would end one), and its
/// workers run under their seccomp filter if it has one.
pub fn assert_alive(b: &(impl Served + ?Sized)) {
    b.assert_alive();
}

/// None of the backend's threads has ended: its accept loop and every worker.
fn assert_backend_alive(b: &Backend) {
    assert!(b.is_serving(), "the backend's accept loop has ended");
    let queues = (0..b.device.pairs())
        .map(QueueId::Rx)
        .chain([QueueId::Ctrl]);
    for id in queues {
        assert!(
            !b.device.worker(id).is_finished(),
            "the worker of {id:?} has ended"
        );
    }
    // The names `assert_idle` reads are these threads'.
    for name in backend_threads(b) {
        assert!(thread_exists(&name), "no thread {name}");
    }
    // The case ran under the workers' seccomp filter, as the backend runs in production.
    if b.device.shared().config().seccomp {
        let workers = (0..b.device.pairs()).map(|p| format!("virtnet-pair{p}"));
        for name in workers.chain(["virtnet-ctrlq".to_string()]) {
            let modes = thread_seccomp(&name);
            assert!(
                modes.iter().all(|&m| m == 2),
                "{name}: seccomp modes {modes:?}"
            );
        }
    }
}

/// Each of the threads of `b` takes at most [`IDLE_TICKS`] over one second: nothing may be
/// running against it meanwhile. Its connections may be open, as a hostile case left them.
/// Threads of one name (a switch's ports' control-queue workers) are counted together.
pub fn assert_idle(b: &(impl Served + ?Sized)) {
    let mut names = b.threads();
    names.sort();
    names.dedup();
    std::thread::sleep(Duration::from_millis(200));
    let before: Vec<u64> = names.iter().map(|n| thread_cpu_ticks(n)).collect();
    std::thread::sleep(Duration::from_secs(1));
    for (name, before) in names.iter().zip(before) {
        let ticks = thread_cpu_ticks(name) - before;
        assert!(
            ticks <= IDLE_TICKS,
            "{name} took {ticks} ticks in 1 s with nothing to do"
        );
    }
}

/// Fresh connections to `b` move frames within [`FRESH_WITHIN`] of starting to connect, and
/// are then closed (see [`Served::assert_fresh_connection_moves_frames`]).
pub fn assert_fresh_connection_moves_frames(b: &(impl Served + ?Sized)) {
    b.assert_fresh_connection_moves_frames();
}

/// A new connection to `b` moves [`FRESH_FRAMES`] frames (echoed, or generated by a null
/// port; into the TAP, for a TAP backend) within [`FRESH_WITHIN`] of starting to connect, and
/// is then closed.
fn assert_backend_moves_frames(b: &Backend) {
    let start = Instant::now();
    let mut p = connect(b, WANTED);
    let got = match &b.tap {
        None => {
            let left = FRESH_WITHIN.saturating_sub(start.elapsed());
            echo_round_within(&mut p, FRESH_FRAMES, 64, left).len() as u64
        }
        Some((ns, tap)) => {
            let before = tap_rx_packets(ns, tap);
            for i in 0..FRESH_FRAMES {
                assert!(p.tx.send(&frame(i, 64), NetHdr::default()).unwrap());
            }
            p.tx.flush();
            let deadline = start + FRESH_WITHIN;
            let mut got = 0;
            while got < FRESH_FRAMES as u64 && Instant::now() < deadline {
                got = tap_rx_packets(ns, tap) - before;
            }
            got
        }
    };
    let took = start.elapsed();
    assert!(
        got >= FRESH_FRAMES as u64,
        "a fresh connection moved {got} of {FRESH_FRAMES} frames in {took:?}"
    );
    assert!(took <= FRESH_WITHIN, "a fresh connection took {took:?}");
}

/// What a user sees after a hostile case on `b` is what they saw at `base`: its threads
/// alive and idle, fresh connections moving frames within a second, as many
/// descriptors as at `base`, no more threads, and no more memory than [`RSS_SLACK_KIB`]
/// beyond. The case's own connections must be closed by now.
///
/// Descriptors must be exactly as many: nothing else in the process opens or closes any
/// while the tests that measure hold [`Exclusive`]. Threads are compared as no more: the test
/// harness's own come and go around the lock (one test's ends, the next one's starts).
pub fn assert_recovered(b: &(impl Served + ?Sized), base: &Baseline) {
    assert_alive(b);
    assert_idle(b);
    assert_fresh_connection_moves_frames(b);
    assert_alive(b);
    let now = Usage::settled(b);
    let was = base.usage;
    assert_eq!(
        now.fds, was.fds,
        "descriptors open, after the case and before"
    );
    assert!(
        now.threads <= was.threads,
        "{} threads, {} before the case",
        now.threads,
        was.threads
    );
    assert!(
        now.rss_kib <= was.rss_kib + RSS_SLACK_KIB,
        "resident memory {} KiB, {} KiB before the case",
        now.rss_kib,
        was.rss_kib
    );
}
