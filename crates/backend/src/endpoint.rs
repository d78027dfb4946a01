//! The clients of the local endpoints (`virtnet ctl`'s unix socket, /metrics over TCP): each
//! served on a thread of its own, a bounded number at once, every request and answer under a
//! deadline, so that neither clients that never read nor clients that never send lock the
//! others out.
//!
//! - **A new client is always served.** When the bound is reached, the client that has waited
//!   longest (since it was accepted or last answered: idle, or stalled in a read or a write)
//!   is shut down (`shutdown(Both)` on a clone of its socket kept here), which ends its
//!   thread at once. Threads running a client stay bounded: the served, plus as many evicted
//!   ones on their way out at most ([`ENDING_WAIT`]).
//! - **A deadline covers a whole request or a whole answer,** not each system call: before
//!   each read or write the socket's timeout is set to the time left, so a peer that trickles
//!   bytes cannot stretch it.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::session::accept_failed;

/// A connected stream socket, as an endpoint serves it: unix (ctl) or TCP (/metrics).
pub trait Socket: Read + Write + Send + Sized + 'static {
    fn try_clone(&self) -> io::Result<Self>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

macro_rules! socket {
    ($t:ty) => {
        impl Socket for $t {
            fn try_clone(&self) -> io::Result<Self> {
                <$t>::try_clone(self)
            }
            fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                <$t>::shutdown(self, how)
            }
            fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$t>::set_read_timeout(self, timeout)
            }
            fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
                <$t>::set_write_timeout(self, timeout)
            }
        }
    };
}
socket!(UnixStream);
socket!(TcpStream);

/// An endpoint's bound on its clients.
#[derive(Clone, Copy, Debug)]
pub struct Bound {
    /// The endpoint, as logs name it ("ctl", "metrics").
    pub what: &'static str,
    /// The name of each client's thread (Linux keeps its first 15 bytes).
    pub thread: &'static str,
    /// The most clients served at once (at least 1).
    pub max_clients: usize,
}

/// How long the accept loop waits when as many evicted clients' threads are still ending as
/// clients are served. Their sockets are shut down, so they end at once unless the machine is
/// starved; a client that comes meanwhile is closed after this wait.
pub const ENDING_WAIT: Duration = Duration::from_secs(1);

/// Evictions are logged at most once per this long, with their count.
const EVICTION_LOG_EVERY: Duration = Duration::from_secs(10);

/// Serves each client of `incoming` with `serve_client` on a thread of its own (named
/// `bound.thread`), at most `bound.max_clients` at once; when a client comes with the bound
/// reached, the one that has waited longest is shut down. Returns when `incoming` ends.
pub fn serve<S: Socket>(
    incoming: impl Iterator<Item = io::Result<S>>,
    bound: Bound,
    serve_client: impl Fn(&mut Client<S>) + Send + Sync + 'static,
) {
    let registry = Arc::new(Registry::new(bound));
    let serve_client = Arc::new(serve_client);
    for socket in incoming {
        let socket = match socket {
            Ok(s) => s,
            Err(e) => {
                accept_failed(&e);
                continue;
            }
        };
        let Some(slot) = Registry::admit(&registry, &socket) else {
            continue;
        };
        let serve_client = serve_client.clone();
        let spawned = std::thread::Builder::new()
            .name(bound.thread.into())
            .spawn(move || {
                let mut client = Client {
                    socket,
                    deadline: Instant::now(),
                    slot,
                };
                serve_client(&mut client);
            });
        // A thread that did not start dropped its client, and the slot with it.
        if let Err(e) = spawned {
            tracing::warn!(error = %e, endpoint = bound.what, "cannot start a client's thread");
        }
    }
}

/// One client, as its thread serves it: reads and writes go to its socket, each bounded by
/// the deadline last set with [`Client::deadline_in`] (the time of accepting until then).
pub struct Client<S: Socket> {
    /// Declared before the slot: dropped (closed) before the slot deregisters the client.
    socket: S,
    deadline: Instant,
    slot: Slot<S>,
}

impl<S: Socket> Client<S> {
    /// What comes next (a request, an answer) must be read or written within `limit` of now.
    pub fn deadline_in(&mut self, limit: Duration) {
        self.deadline = Instant::now() + limit;
    }

    /// The client has its answer: it counts as waiting since now, the last to be evicted.
    pub fn answered(&self) {
        let mut state = self.slot.registry.lock();
        if let Some(c) = state.served.iter_mut().find(|c| c.id == self.slot.id) {
            c.waiting_since = Instant::now();
        }
    }

    /// The time left before the deadline: an error once it has passed.
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                ErrorKind::TimedOut,
                "client deadline passed",
            ));
        }
        Ok(left)
    }
}

impl<S: Socket> Read for Client<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.socket.set_read_timeout(Some(self.left()?))?;
        self.socket.read(buf)
    }
}

impl<S: Socket> Write for Client<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.socket.set_write_timeout(Some(self.left()?))?;
        self.socket.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.socket.flush()
    }
}

impl<S: Socket> fmt::Debug for Client<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.slot.registry.bound.what)
            .field("id", &self.slot.id)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// An endpoint's clients.
struct Registry<S: Socket> {
    bound: Bound,
    state: Mutex<State<S>>,
    /// Notified when a client's thread ends.
    ended: Condvar,
}

struct State<S> {
    next_id: u64,
    /// The clients being served, in no order.
    served: Vec<Registered<S>>,
    /// Client threads that have not ended: the served, and evicted ones on their way out.
    threads: usize,
    /// Evictions not logged yet, and when the last log line was.
    unlogged: u64,
    logged_at: Option<Instant>,
}

struct Registered<S> {
    id: u64,
    /// When it was accepted or last answered: the longest waiting is evicted first.
    waiting_since: Instant,
    /// A clone of the client's socket, to shut it down.
    socket: S,
}

impl<S: Socket> Registry<S> {
    fn new(bound: Bound) -> Self {
        Registry {
            bound: Bound {
                max_clients: bound.max_clients.max(1),
                ..bound
            },
            state: Mutex::new(State {
                next_id: 0,
                served: Vec::new(),
                threads: 0,
                unlogged: 0,
                logged_at: None,
            }),
            ended: Condvar::new(),
        }
    }

    /// Nothing panics while holding the lock; should something, the state is still whole.
    fn lock(&self) -> MutexGuard<'_, State<S>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new client, evicting the one that has waited longest if the bound is
    /// reached. None: the client is to be closed (its socket cannot be cloned, or evicted
    /// clients' threads do not end).
    fn admit(this: &Arc<Self>, socket: &S) -> Option<Slot<S>> {
        let what = this.bound.what;
        let max = this.bound.max_clients;
        let socket = match socket.try_clone() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, endpoint = what, "cannot clone a client's socket");
                return None;
            }
        };
        let (mut state, _) = this
            .ended
            .wait_timeout_while(this.lock(), ENDING_WAIT, |s| s.threads >= 2 * max)
            .unwrap_or_else(PoisonError::into_inner);
        if state.threads >= 2 * max {
            drop(state);
            tracing::warn!(endpoint = what, "evicted clients' threads do not end");
            return None;
        }
        let oldest = if state.served.len() >= max {
            let served = &state.served;
            let i = (0..served.len()).min_by_key(|&i| served[i].waiting_since);
            i.map(|i| state.served.swap_remove(i))
        } else {
            None
        };
        let id = state.next_id;
        state.next_id += 1;
        state.served.push(Registered {
            id,
            waiting_since: Instant::now(),
            socket,
        });
        state.threads += 1;
        let log = if oldest.is_some() {
            state.evicted()
        } else {
            None
        };
        drop(state);
        if let Some(c) = oldest {
            let _ = c.socket.shutdown(Shutdown::Both);
        }
        if let Some(evicted) = log {
            tracing::warn!(
                endpoint = what,
                max_clients = max,
                evicted,
                "too many clients: the longest waiting closed to serve new ones"
            );
        }
        Some(Slot {
            registry: this.clone(),
            id,
        })
    }
}

impl<S> State<S> {
    /// Counts an eviction; returns how many to log, if one is due.
    fn evicted(&mut self) -> Option<u64> {
        self.unlogged += 1;
        let now = Instant::now();
        if self
            .logged_at
            .is_some_and(|t| now.duration_since(t) < EVICTION_LOG_EVERY)
        {
            return None;
        }
        self.logged_at = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }
}

/// A client's place in its registry, given back when its thread ends.
struct Slot<S: Socket> {
    registry: Arc<Registry<S>>,
    id: u64,
}

impl<S: Socket> Drop for Slot<S> {
    fn drop(&mut self) {
        let mut state = self.registry.lock();
        let gone = state
            .served
            .iter()
            .position(|c| c.id == self.id)
            .map(|i| state.served.swap_remove(i));
        state.threads -= 1;
        drop(state);
        self.registry.ended.notify_all();
        // Its socket's clone closes here, outside the lock.
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader};
    use std::net::TcpListener;
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    use super::*;

    /// Threads of this process named `name`.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
            })
            .count()
    }

    fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        f()
    }

    /// Serves clients on a TCP port of 127.0.0.1, with `max_clients` and threads named
    /// `thread`.
    fn tcp_endpoint(
        thread: &'static str,
        max_clients: usize,
        serve_client: impl Fn(&mut Client<TcpStream>) + Send + Sync + 'static,
    ) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let bound = Bound {
            what: "test",
            thread,
            max_clients,
        };
        std::thread::spawn(move || serve(listener.incoming(), bound, serve_client));
        addr
    }

    /// Answers each line with itself, within 10 s of waiting for it.
    fn echo_lines<S: Socket>(client: &mut Client<S>) {
        let mut reader = BufReader::new(client);
        loop {
            reader.get_mut().deadline_in(Duration::from_secs(10));
            let mut line = String::new();
            if !matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                return;
            }
            let client = reader.get_mut();
            client.deadline_in(Duration::from_secs(1));
            if client.write_all(line.as_bytes()).is_err() {
                return;
            }
            client.answered();
        }
    }

    /// Sends `line` on `s` and returns the answer line.
    fn ask(s: &TcpStream, line: &str) -> io::Result<String> {
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        (&mut &*s).write_all(line.as_bytes())?;
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer)?;
        Ok(answer)
    }

    fn reads_end_of_file(s: &TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        matches!((&mut &*s).read(&mut [0u8; 1]), Ok(0))
    }

    #[test]
    fn over_the_bound_a_new_client_is_served_and_the_longest_waiting_one_closed() {
        let addr = tcp_endpoint("ep-test-evict", 2, echo_lines);
        let a = TcpStream::connect(addr).unwrap();
        let b = TcpStream::connect(addr).unwrap();
        // Both accepted (a thread each) before a's answer: otherwise b may be accepted after
        // it and a be the one waiting longest.
        assert!(eventually(Duration::from_secs(2), || threads_named(
            "ep-test-evict"
        ) == 2));
        // a was accepted first, but its answer makes b the one waiting longest.
        assert_eq!(ask(&a, "a\n").unwrap(), "a\n");
        let c = TcpStream::connect(addr).unwrap();
        assert_eq!(ask(&c, "c\n").unwrap(), "c\n");
        assert!(reads_end_of_file(&b), "b was not closed");
        assert_eq!(ask(&a, "a again\n").unwrap(), "a again\n");
        assert!(eventually(Duration::from_secs(2), || threads_named(
            "ep-test-evict"
        ) == 2));
        drop((a, c));
        assert!(eventually(Duration::from_secs(2), || threads_named(
            "ep-test-evict"
        ) == 0));
    }

    #[test]
    fn threads_stay_bounded_under_a_flood_of_silent_clients() {
        const MAX: usize = 4;
        let addr = tcp_endpoint("ep-test-flood", MAX, echo_lines);
        let silent: Vec<TcpStream> = (0..100)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let start = Instant::now();
        let fresh = TcpStream::connect(addr).unwrap();
        assert_eq!(ask(&fresh, "fresh\n").unwrap(), "fresh\n");
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        assert!(eventually(Duration::from_secs(2), || threads_named(
            "ep-test-flood"
        ) <= MAX));
        assert!(reads_end_of_file(&silent[0]));
        drop((silent, fresh));
        assert!(eventually(Duration::from_secs(2), || threads_named(
            "ep-test-flood"
        ) == 0));
    }

    #[test]
    fn evicted_clients_whose_threads_do_not_end_hold_new_ones_back_rather_than_add_threads() {
        // Threads stuck elsewhere than on their socket: shutting it down does not end them.
        let addr = tcp_endpoint("ep-test-stuck", 1, |_| {
            std::thread::sleep(Duration::from_secs(3))
        });
        let a = TcpStream::connect(addr).unwrap();
        assert!(eventually(Duration::from_secs(1), || threads_named(
            "ep-test-stuck"
        ) == 1));
        let _b = TcpStream::connect(addr).unwrap();
        assert!(reads_end_of_file(&a), "a was not evicted");
        assert!(eventually(Duration::from_secs(1), || threads_named(
            "ep-test-stuck"
        ) == 2));
        // Twice the bound still running: the next client waits ENDING_WAIT, then is closed.
        let start = Instant::now();
        let c = TcpStream::connect(addr).unwrap();
        assert!(reads_end_of_file(&c), "c was not closed");
        let waited = start.elapsed();
        assert!(
            waited >= ENDING_WAIT - Duration::from_millis(100),
            "{waited:?}"
        );
        assert_eq!(threads_named("ep-test-stuck"), 2);
    }

    /// Serves one client on a unix socket with `serve_client`, which reports on `done`; the
    /// socket's directory is removed when the returned guard drops.
    fn unix_endpoint(
        tag: &str,
        serve_client: impl Fn(&mut Client<UnixStream>) + Send + Sync + 'static,
    ) -> (UnixStream, RemoveDir) {
        let dir = std::env::temp_dir().join(format!("virtnet-ep-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let bound = Bound {
            what: "test",
            thread: "ep-test-unix",
            max_clients: 1,
        };
        std::thread::spawn(move || serve(listener.incoming(), bound, serve_client));
        (UnixStream::connect(&path).unwrap(), RemoveDir(dir))
    }

    struct RemoveDir(std::path::PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn an_answer_is_written_whole_by_its_deadline_or_not_at_all_however_the_client_reads() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let (s, _dir) = unix_endpoint("answer", move |client| {
            let start = Instant::now();
            client.deadline_in(Duration::from_millis(300));
            // Far more than the socket buffers hold.
            let r = client.write_all(&vec![b'x'; 8 << 20]);
            let _ = tx.lock().unwrap().send((r.is_ok(), start.elapsed()));
        });
        // A reader that takes 1 KiB every 10 ms: each write makes progress, none waits long.
        let trickle = std::thread::spawn(move || {
            let mut buf = [0u8; 1024];
            let until = Instant::now() + Duration::from_secs(3);
            while Instant::now() < until && matches!((&s).read(&mut buf), Ok(n) if n > 0) {
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        let (written, took) = rx.recv_timeout(Duration::from_secs(2)).expect("no end");
        assert!(!written, "8 MiB written to a trickling reader");
        assert!(
            (Duration::from_millis(300)..Duration::from_secs(1)).contains(&took),
            "the answer gave up after {took:?}"
        );
        trickle.join().unwrap();
    }

    #[test]
    fn a_request_arrives_whole_by_its_deadline_or_not_at_all_however_the_client_sends() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let (mut s, _dir) = unix_endpoint("request", move |client| {
            let start = Instant::now();
            client.deadline_in(Duration::from_millis(300));
            let mut line = Vec::new();
            let r = BufReader::new(client).read_until(b'\n', &mut line);
            let _ = tx.lock().unwrap().send((r.is_ok(), start.elapsed()));
        });
        // A byte every 20 ms, never the newline.
        let until = Instant::now() + Duration::from_secs(2);
        let report = loop {
            if let Ok(r) = rx.try_recv() {
                break r;
            }
            assert!(Instant::now() < until, "the request never timed out");
            let _ = s.write_all(b"x");
            std::thread::sleep(Duration::from_millis(20));
        };
        let (read, took) = report;
        assert!(!read, "a request without its end was taken");
        assert!(
            (Duration::from_millis(300)..Duration::from_secs(1)).contains(&took),
            "the request gave up after {took:?}"
        );
    }
}
