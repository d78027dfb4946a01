//! Client mode (`virtnet_backend::serve_client`) against hostile listening frontends: one
//! that accepts and sends garbage, one that hangs up at each step of the handshake, one that
//! accepts and never speaks, one that starts a request and stops, and one that never accepts
//! at all. Each time the backend connects again after its back-off (never sooner: the
//! frontend is not hammered; never much later: nothing hangs), its thread takes next to no
//! CPU time (it does not spin), and a good frontend listening at the same path afterwards is
//! served. The process's descriptors come back to what they were, and no thread is left.
//!
//! The tests measure the process, so they take [`recovery::exclusive`] and run one at a time.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testkit::inproc::{accept_backend, echo_round, temp_dir, thread_cpu_ticks, TempDir, WANTED};
use testkit::recovery::{self, Exclusive, Usage};
use virtnet_backend::session::{
    FIRST_REQUEST_TIMEOUT, MESSAGE_DEADLINE, RECONNECT_FIRST, RECONNECT_MAX,
};
use virtnet_backend::{BackendConfig, Device, IoMode};

/// The name of the thread running `serve_client`.
const CLIENT_THREAD: &str = "virtnet-client";

/// CPU time the client thread may take over a hostile phase of a few seconds, in clock ticks
/// (100 a second): connecting, resetting the device and being refused cost a few; a thread
/// that spins takes a hundred a second.
const HOSTILE_TICKS: u64 = 10;

/// How much later than its back-off a connection may come (a loaded machine's scheduling).
const SLACK: Duration = Duration::from_secs(1);

/// `serve_client` on a thread of its own.
struct Client {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<std::io::Result<()>>,
}

impl Client {
    fn start(device: &Arc<Device>, path: &Path) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let (d, p, s) = (device.clone(), path.to_path_buf(), stop.clone());
        let thread = std::thread::Builder::new()
            .name(CLIENT_THREAD.into())
            .spawn(move || virtnet_backend::serve_client(d, &p, s))
            .unwrap();
        Client { stop, thread }
    }

    /// Stops it within `within`; `listener` (where it connects) is closed first, so that a
    /// connection it holds ends.
    fn stop(self, listener: UnixListener, within: Duration) {
        self.stop.store(true, Relaxed);
        drop(listener);
        let stopped = Instant::now();
        while !self.thread.is_finished() {
            assert!(
                stopped.elapsed() < within,
                "the client did not stop within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        self.thread.join().unwrap().unwrap();
    }
}

/// The next connection on `listener` within `within`, and when it came.
fn accept_within(listener: &UnixListener, within: Duration) -> (UnixStream, Instant) {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + within;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return (s, Instant::now());
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("no connection from the backend within {within:?}: {e}"),
        }
    }
}

/// Reads `s` until the backend closes it, within `within`; when it did.
fn closed_within(s: &mut UnixStream, within: Duration) -> Instant {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Instant::now(),
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Instant::now(),
            Err(e) => panic!("the backend kept the connection for {within:?}: {e}"),
        }
    }
}

/// One request: code, flags (version 1), payload size, payload.
fn request(code: u32, payload: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = [code, 1, payload.len() as u32]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
    m.extend_from_slice(payload);
    m
}

/// A device, and the process's usage after a good frontend was served by a client that was
/// then stopped: what every case must come back to.
struct Setup {
    _exclusive: Exclusive,
    device: Arc<Device>,
    path: PathBuf,
    base: Usage,
    _dir: TempDir,
}

fn setup(tag: &str) -> Setup {
    let exclusive = recovery::exclusive();
    let dir = temp_dir(tag);
    let path = dir.0.join("frontend.sock");
    let device = Device::new(BackendConfig {
        io: IoMode::Echo,
        ..Default::default()
    })
    .unwrap();
    let listener = UnixListener::bind(&path).unwrap();
    let client = Client::start(&device, &path);
    serve_good_frontend(&listener, Duration::from_secs(5));
    client.stop(listener, Duration::from_secs(5));
    let _ = std::fs::remove_file(&path);
    Setup {
        _exclusive: exclusive,
        device,
        path,
        base: Usage::steady(),
        _dir: dir,
    }
}

/// A good frontend on `listener` is connected to within `within` and moves frames.
fn serve_good_frontend(listener: &UnixListener, within: Duration) {
    let mut p = accept_backend(listener, WANTED, 1536, within)
        .unwrap_or_else(|| panic!("the backend did not connect within {within:?}"));
    assert_eq!(echo_round(&mut p, 32, 64).len(), 32, "frames");
}

/// The end of every case: the client thread took at most [`HOSTILE_TICKS`] since it started;
/// a good frontend that listens at the path instead of the hostile one is served within the
/// longest back-off; then, the client stopped, descriptors and threads are as they were.
fn finish(s: Setup, client: Client, hostile: UnixListener) {
    let ticks = thread_cpu_ticks(CLIENT_THREAD);
    assert!(
        ticks <= HOSTILE_TICKS,
        "the client thread took {ticks} ticks against a hostile frontend"
    );
    drop(hostile);
    std::fs::remove_file(&s.path).unwrap();
    let listener = UnixListener::bind(&s.path).unwrap();
    serve_good_frontend(&listener, RECONNECT_MAX + SLACK);
    client.stop(listener, Duration::from_secs(5));
    let now = Usage::steady();
    assert_eq!(
        now.fds, s.base.fds,
        "descriptors open, after the case and before"
    );
    assert!(
        now.threads <= s.base.threads,
        "{now:?}, before {:?}",
        s.base
    );
}

/// The waits before each connection after the first: RECONNECT_FIRST, doubling.
fn back_off(attempt: u32) -> Duration {
    (RECONNECT_FIRST * 2u32.pow(attempt)).min(RECONNECT_MAX)
}

/// Each connection came after the back-off that followed the one before it ended, and not
/// much later.
fn assert_backed_off(ended: &[Instant], came: &[Instant]) {
    for (i, (end, next)) in ended.iter().zip(&came[1..]).enumerate() {
        let gap = next.saturating_duration_since(*end);
        let want = back_off(i as u32);
        // Our accept may trail the backend's connect by a few milliseconds, and its close
        // our seeing it.
        assert!(
            gap + Duration::from_millis(20) >= want,
            "connection {} came {gap:?} after the last ended, before its back-off {want:?}",
            i + 1
        );
        assert!(
            gap <= want + SLACK,
            "connection {} came after {gap:?}",
            i + 1
        );
    }
}

#[test]
fn a_listener_sending_garbage_is_left_and_tried_again_with_back_off() {
    let s = setup("client-garbage");
    let listener = UnixListener::bind(&s.path).unwrap();
    let client = Client::start(&s.device, &s.path);
    let (mut ended, mut came) = (Vec::new(), Vec::new());
    for i in 0..5u8 {
        let (mut c, at) = accept_within(&listener, back_off(4) + SLACK);
        came.push(at);
        // A header no frontend sends (a body announced past the limit), then noise.
        let _ = c.write_all(&[0xf0 | i; 64]);
        ended.push(closed_within(&mut c, Duration::from_secs(2)));
    }
    assert_backed_off(&ended, &came);
    finish(s, client, listener);
}

#[test]
fn a_listener_hanging_up_at_each_step_of_the_handshake_is_tried_again_with_back_off() {
    const GET_FEATURES: u32 = 1;
    const SET_FEATURES: u32 = 2;
    const SET_OWNER: u32 = 3;
    const GET_PROTOCOL_FEATURES: u32 = 15;
    const SET_PROTOCOL_FEATURES: u32 = 16;
    // The handshake QEMU starts with, and whether each request has a reply.
    let handshake = [
        (GET_FEATURES, Vec::new(), true),
        (
            SET_FEATURES,
            (1u64 << 30 | 1 << 32).to_ne_bytes().to_vec(),
            false,
        ),
        (GET_PROTOCOL_FEATURES, Vec::new(), true),
        (SET_PROTOCOL_FEATURES, 0u64.to_ne_bytes().to_vec(), false),
        (SET_OWNER, Vec::new(), false),
    ];
    let s = setup("client-steps");
    let listener = UnixListener::bind(&s.path).unwrap();
    let client = Client::start(&s.device, &s.path);
    let (mut ended, mut came) = (Vec::new(), Vec::new());
    for steps in 0..=handshake.len() {
        let (mut c, at) = accept_within(&listener, back_off(5) + SLACK);
        came.push(at);
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for (code, payload, reply) in &handshake[..steps] {
            c.write_all(&request(*code, payload)).unwrap();
            if *reply {
                let mut r = [0u8; 20];
                c.read_exact(&mut r).expect("a reply");
                assert_eq!(r[..4], code.to_ne_bytes());
            }
        }
        // Hang up: the backend sees the end of the stream.
        drop(c);
        ended.push(Instant::now());
    }
    assert_backed_off(&ended, &came);
    finish(s, client, listener);
}

#[test]
fn a_listener_that_never_speaks_is_left_after_the_first_request_deadline() {
    let s = setup("client-silent");
    let listener = UnixListener::bind(&s.path).unwrap();
    let client = Client::start(&s.device, &s.path);
    let (mut c, at) = accept_within(&listener, Duration::from_secs(5));
    let end = closed_within(&mut c, FIRST_REQUEST_TIMEOUT + SLACK);
    let held = end - at;
    assert!(
        held + Duration::from_millis(100) >= FIRST_REQUEST_TIMEOUT,
        "left after {held:?}"
    );
    drop(c);
    // Not stable, since it never spoke: the back-off goes on from its first step.
    let (c, next) = accept_within(&listener, back_off(0) + SLACK);
    assert_backed_off(&[end], &[at, next]);
    drop(c);
    finish(s, client, listener);
}

#[test]
fn a_listener_that_starts_a_request_and_stops_is_left_after_the_message_deadline() {
    let s = setup("client-partial");
    let listener = UnixListener::bind(&s.path).unwrap();
    let client = Client::start(&s.device, &s.path);
    let (mut ended, mut came) = (Vec::new(), Vec::new());
    for cut in [1, 12] {
        let (mut c, at) = accept_within(&listener, back_off(1) + SLACK);
        came.push(at);
        // SET_FEATURES cut after `cut` of its 20 bytes.
        c.write_all(&request(2, &[0; 8])[..cut]).unwrap();
        let end = closed_within(&mut c, MESSAGE_DEADLINE + SLACK);
        assert!(end - at + Duration::from_millis(50) >= MESSAGE_DEADLINE);
        ended.push(end);
    }
    assert_backed_off(&ended, &came);
    finish(s, client, listener);
}

#[test]
fn a_listener_that_never_accepts_does_not_hold_the_backend() {
    let s = setup("client-backlog");
    let listener = UnixListener::bind(&s.path).unwrap();
    // A backlog of one connection (listen again to change it), never accepted.
    // SAFETY: listen takes integers and touches no memory.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let client = Client::start(&s.device, &s.path);
    // The first connection waits in the backlog, says nothing, and is left at the first
    // request's deadline; every connect after it finds the backlog full. A blocking connect
    // would wait there until the listener accepted: the client would not stop.
    std::thread::sleep(FIRST_REQUEST_TIMEOUT + back_off(0) + back_off(1) + SLACK);
    let ticks = thread_cpu_ticks(CLIENT_THREAD);
    assert!(
        ticks <= HOSTILE_TICKS,
        "the client thread took {ticks} ticks"
    );
    let stopped = Instant::now();
    client.stop.store(true, Relaxed);
    while !client.thread.is_finished() {
        assert!(
            stopped.elapsed() < SLACK,
            "the client is stuck connecting to a listener that never accepts"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    client.thread.join().unwrap().unwrap();
    let client = Client::start(&s.device, &s.path);
    finish(s, client, listener);
}
