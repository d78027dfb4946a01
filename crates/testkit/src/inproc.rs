//! An in-process backend on a unix socket, and our driver connected to it.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use virtnet_driver::{Frames, PollMode};

use virtnet_backend::{BackendConfig, Device, IoMode};
use virtnet_driver::frontend::Connection;
use virtnet_driver::{RxQueue, TxQueue};
use vnet::feature;
use vnet::NetHdr;
use vring::Features;

/// A backend serving on `socket` from a thread of its own ([`SERVE_THREAD`]). Dropping it
/// ends that thread, and with it the device and its workers (unless something else holds the
/// device), so that an earlier test's backend does not live on in the test process: tests
/// that read the process's fds, memory or threads' CPU time ([`crate::recovery`]) see only
/// their own.
#[derive(Debug)]
pub struct Backend {
    pub device: Arc<Device>,
    pub socket: PathBuf,
    /// The TAP its frames go to, for a TAP backend: (network namespace, TAP name).
    pub tap: Option<(String, String)>,
    /// Tells the accept loop to return at its next accept.
    stop: Arc<AtomicBool>,
    serve: Option<JoinHandle<io::Result<()>>>,
    _dir: TempDir,
}

/// The name of the thread that accepts and serves frontends.
pub const SERVE_THREAD: &str = "virtnet-serve";

/// How long dropping a [`Backend`] waits for its accept loop, which returns only once the
/// connection it serves (if any) has closed.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

impl Backend {
    /// Whether the thread serving frontends still runs: it ends only when the backend is
    /// dropped, or when serving a connection panicked.
    pub fn is_serving(&self) -> bool {
        self.serve.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        // The accept loop checks the flag after each accept: a connection wakes it.
        let _ = UnixStream::connect(&self.socket);
        let Some(serve) = self.serve.take() else {
            return;
        };
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        while !serve.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if serve.is_finished() {
            // A panic there was the test's business while it ran (`is_serving`), not here.
            let _ = serve.join();
        }
        // Else a connection is still open somewhere and the thread is left to end with it.
    }
}

#[derive(Debug)]
pub struct TempDir(pub PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("virtnet-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

pub fn start_backend(tag: &str, config: BackendConfig) -> Backend {
    let dir = temp_dir(tag);
    let socket = dir.0.join("vhost.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let device = Device::new(config).unwrap();
    let d = device.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let serve = std::thread::Builder::new()
        .name(SERVE_THREAD.into())
        .spawn(move || virtnet_backend::serve(d, listener, s))
        .unwrap();
    Backend {
        device,
        socket,
        tap: None,
        stop,
        serve: Some(serve),
        _dir: dir,
    }
}

/// A backend on the TAP `tap` of `ns` (its threads in the namespace), the rest as default.
/// Returns once the TAP passes frames: see [`wait_tap_up`].
pub fn tap_backend(ns: &crate::netns::NetNs, tag: &str, tap: &str) -> Backend {
    tap_backend_with(ns, tag, tap, BackendConfig::default())
}

/// Like [`tap_backend`], with `config` but for its `io`.
pub fn tap_backend_with(
    ns: &crate::netns::NetNs,
    tag: &str,
    tap: &str,
    config: BackendConfig,
) -> Backend {
    let config = BackendConfig {
        io: IoMode::Tap(tap.to_string()),
        ..config
    };
    let mut b = ns.run(|| start_backend(tag, config));
    wait_tap_up(ns, tap);
    b.tap = Some((ns.name().to_string(), tap.to_string()));
    b
}

/// Frames `tap` of network namespace `ns` received: what a backend wrote into it.
pub fn tap_rx_packets(ns: &str, tap: &str) -> u64 {
    let path = format!("/sys/class/net/{tap}/statistics/rx_packets");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "cat", &path])
        .output()
        .expect("ip netns exec");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{path} in {ns}: {out:?}"))
}

/// Waits (up to 5 s) until `tap`'s operational state in `ns` is up. A persistent TAP has no
/// carrier until a process attaches a queue (the backend, when it starts); the kernel then
/// turns its carrier on and, from its link-watch work, activates its queueing discipline,
/// which it rate-limits to once a second: until then the stack drops what it sends through
/// the TAP (QDISC_DROP). The operational state is set by the same work.
pub fn wait_tap_up(ns: &crate::netns::NetNs, tap: &str) {
    let state = format!("/sys/class/net/{tap}/operstate");
    let up = crate::eventually(Duration::from_secs(5), || {
        ns.exec(&["cat", &state]).is_ok_and(|s| s.trim() == "up")
    });
    assert!(
        up,
        "TAP {tap} did not come up: {:?}",
        ns.exec(&["cat", &state])
    );
}

/// A backend with one pair that echoes every frame back.
pub fn echo_backend(tag: &str) -> Backend {
    start_backend(
        tag,
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    )
}

pub const WANTED: Features = Features(
    Features::VERSION_1.0
        | Features::RING_EVENT_IDX.0
        | Features::RING_INDIRECT_DESC.0
        | feature::MRG_RXBUF.0
        | feature::MQ.0,
);

#[derive(Debug)]
pub struct Pair {
    pub conn: Connection,
    pub rx: RxQueue,
    pub tx: TxQueue,
}

pub fn connect(b: &Backend, wanted: Features) -> Pair {
    connect_rx(b, wanted, 1536)
}

/// Like [`connect`], with rx buffers of `rx_buf` bytes.
pub fn connect_rx(b: &Backend, wanted: Features, rx_buf: u32) -> Pair {
    connect_socket(&b.socket, wanted, rx_buf)
}

/// Our driver on the backend listening at `socket` (in this process or another), both queues
/// of pair 0 running, rx buffers of `rx_buf` bytes.
pub fn connect_socket(socket: &std::path::Path, wanted: Features, rx_buf: u32) -> Pair {
    let conn = Connection::connect(
        socket,
        2,
        256,
        wanted,
        Features::VERSION_1,
        16 << 20,
        Duration::from_secs(5),
    )
    .unwrap();
    start_pair(conn, rx_buf)
}

/// A listening frontend (as QEMU's `-chardev socket,server=on` for a backend in client mode):
/// waits up to `within` for a backend to connect to `listener`, then drives it as
/// [`connect_socket`] does. None if no backend connected in time.
pub fn accept_backend(
    listener: &UnixListener,
    wanted: Features,
    rx_buf: u32,
    within: Duration,
) -> Option<Pair> {
    listener.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + within;
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) => panic!("accept: {e}"),
        }
    };
    stream.set_nonblocking(false).unwrap();
    let conn =
        Connection::from_stream(stream, 2, 256, wanted, Features::VERSION_1, 16 << 20).unwrap();
    Some(start_pair(conn, rx_buf))
}

/// Both queues of pair 0 on `conn`, running, rx buffers of `rx_buf` bytes.
fn start_pair(mut conn: Connection, rx_buf: u32) -> Pair {
    let mem = conn.mem.clone();
    let rx = RxQueue::new(&conn.queues[0], &mem, &mut conn.alloc, rx_buf).unwrap();
    let tx = TxQueue::new(&conn.queues[1], &mem, &mut conn.alloc, 4096).unwrap();
    conn.start_queue(0).unwrap();
    conn.start_queue(1).unwrap();
    Pair { conn, rx, tx }
}

/// CPU time (user and system, in clock ticks, 100 a second) of this process's threads named
/// `name`, summed: how a test sees whether a worker spins.
pub fn thread_cpu_ticks(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After the parenthesised name: state, then 10 fields, then utime and stime.
        let Some(at) = stat.rfind(')') else { continue };
        let f: Vec<&str> = stat[at + 2..].split(' ').collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        total += ticks(11) + ticks(12);
    }
    total
}

/// The seccomp mode (0: none, 1: strict, 2: filter) of each of this process's threads named
/// `name`: a worker of a device with `BackendConfig::seccomp` runs in mode 2.
pub fn thread_seccomp(name: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let mode = status.lines().find_map(|l| l.strip_prefix("Seccomp:"))?;
            mode.trim().parse().ok()
        })
        .collect()
}

/// An Ethernet frame from `src_mac` carrying `data` in IPv4/UDP from the guest's address on
/// [`crate::netns::TapSpec::for_backend`]'s subnet (10.99.0.2, port 9000) to the TAP's
/// (10.99.0.1, port `port`), without a UDP checksum (allowed over IPv4).
pub fn udp_to_tap(dst_mac: [u8; 6], src_mac: [u8; 6], port: u16, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + data.len());
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + data.len()) as u16;
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[10, 99, 0, 2]);
    ip[16..20].copy_from_slice(&[10, 99, 0, 1]);
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u16::from_be_bytes([w[0], w[1]]) as u32)
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&9000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(data);
    f
}

pub fn frame(i: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..18].copy_from_slice(&i.to_le_bytes());
    for (k, b) in f[18..].iter_mut().enumerate() {
        *b = (k as u32 ^ i) as u8;
    }
    f
}

/// Sends `count` frames and collects what comes back, within a deadline.
pub fn echo_round(p: &mut Pair, count: u32, len: usize) -> Vec<Vec<u8>> {
    echo_round_within(p, count, len, Duration::from_secs(20))
}

/// Like [`echo_round`], giving up after `within`.
pub fn echo_round_within(p: &mut Pair, count: u32, len: usize, within: Duration) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + within;
    while got.len() < count as usize && Instant::now() < deadline {
        while sent < count && p.tx.send(&frame(sent, len), NetHdr::default()).unwrap() {
            sent += 1;
        }
        p.tx.flush();
        p.rx.poll(64, PollMode::Napi, Frames(|f: &[u8]| got.push(f.to_vec())))
            .unwrap();
        if got.len() < count as usize {
            if p.tx.is_stopped() {
                p.tx.wait_wake(10).unwrap();
            } else {
                p.rx.wait(10);
            }
        }
    }
    got
}

/// Acts as a hostile guest on `p`'s tx queue (size 256): publishes head 999 on its avail ring
/// and kicks. Returns why the backend broke tx, waiting up to 10 s (None if it did not).
pub fn break_tx_ring(b: &Backend, p: &Pair) -> Option<String> {
    let rings = p.conn.queues[1].config.rings();
    let mem = &p.conn.mem;
    mem.write(
        vring::GuestAddress(rings.avail.0 + 4),
        &999u16.to_le_bytes(),
    )
    .unwrap();
    mem.write(vring::GuestAddress(rings.avail.0 + 2), &1u16.to_le_bytes())
        .unwrap();
    p.conn.queues[1].kick.signal().unwrap();
    let broken = || b.device.reports()[1].counters.broken.clone();
    crate::eventually(Duration::from_secs(10), || broken().is_some());
    broken()
}

/// Acts as a hostile frontend on `p` (an echo backend's connection): clears O_NONBLOCK on its
/// rx call eventfd, which it shares with the backend, fills the counter to 2^64 - 2, then
/// sends frames, which the backend echoes to rx, until the worker's call blocks and the
/// watchdog's interrupt breaks rx. The driver does not poll rx meanwhile: its poll would read
/// the counter back to 0 (and so unblock the write). Returns why rx broke, waiting up to 10 s
/// (None if it did not).
pub fn block_rx_call(b: &Backend, p: &mut Pair) -> Option<String> {
    use std::os::fd::AsFd;
    // A frame round trip first: the backend has then taken the call fd (and set O_NONBLOCK on
    // it), which it may do after `connect` returns; and the poll re-enables rx callbacks.
    assert_eq!(echo_round(p, 1, 64).len(), 1, "no echo");
    // Fill the counter while the fd is still non-blocking (a call the device makes meanwhile
    // would make the write overflow: read it back and try again), then make it blocking.
    let call = &p.conn.queues[0].call;
    let saturate = call.to_eventfd().unwrap();
    while saturate.write(u64::MAX - 1).is_err() {
        call.take().unwrap();
    }
    virtnet_sys::set_nonblocking(call.as_fd(), false).unwrap();
    let broken = || b.device.reports()[0].counters.broken.clone();
    // The next frame used on rx makes the worker call.
    crate::eventually(Duration::from_secs(10), || {
        let _ = p.tx.send(&frame(0, 64), NetHdr::default());
        p.tx.flush();
        broken().is_some()
    });
    broken()
}
