//! Our driver against our backend, in one process, over a real vhost-user unix socket.

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use virtnet::backend::{self, BackendConfig, Device, IoMode};
use virtnet::driver::{RxQueue, TxQueue};
use virtnet::frontend::Connection;
use virtnet::net::NetHdr;
use vring::Features;

struct Backend {
    device: Arc<Device>,
    socket: PathBuf,
    _dir: TempDir,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("virtnet-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

fn start_backend(tag: &str, config: BackendConfig) -> Backend {
    let dir = temp_dir(tag);
    let socket = dir.0.join("vhost.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let device = Device::new(config).unwrap();
    let d = device.clone();
    std::thread::spawn(move || backend::serve(d, listener, Arc::new(AtomicBool::new(false))));
    Backend {
        device,
        socket,
        _dir: dir,
    }
}

const WANTED: Features = Features(
    Features::VERSION_1.0
        | Features::RING_EVENT_IDX.0
        | Features::RING_INDIRECT_DESC.0
        | Features::NET_MRG_RXBUF.0
        | Features::NET_MQ.0,
);

struct Pair {
    conn: Connection,
    rx: RxQueue,
    tx: TxQueue,
}

fn connect(b: &Backend, wanted: Features) -> Pair {
    let mut conn = Connection::connect(
        &b.socket,
        2,
        256,
        wanted,
        Features::VERSION_1,
        16 << 20,
        Duration::from_secs(5),
    )
    .unwrap();
    let mem = conn.mem.clone();
    let rx = RxQueue::new(&conn.queues[0], &mem, &mut conn.alloc, 1536).unwrap();
    let tx = TxQueue::new(&conn.queues[1], &mem, &mut conn.alloc, 4096).unwrap();
    conn.start_queue(0).unwrap();
    conn.start_queue(1).unwrap();
    Pair { conn, rx, tx }
}

fn frame(i: u32, len: usize) -> Vec<u8> {
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
fn echo_round(p: &mut Pair, count: u32, len: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < count as usize && Instant::now() < deadline {
        while sent < count && p.tx.send(&frame(sent, len), NetHdr::default()).unwrap() {
            sent += 1;
        }
        p.tx.flush();
        p.rx.poll(64, |f| got.push(f.to_vec())).unwrap();
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

#[test]
fn echo_returns_every_frame_byte_for_byte_and_counters_agree() {
    let b = start_backend(
        "echo",
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut p = connect(&b, WANTED);
    assert!(p
        .conn
        .features
        .contains(Features::RING_EVENT_IDX | Features::NET_MRG_RXBUF));
    let n = 5000;
    let got = echo_round(&mut p, n, 100);
    assert_eq!(got.len(), n as usize);
    for (i, f) in got.iter().enumerate() {
        assert!(f == &frame(i as u32, 100), "frame {i} differs");
    }
    // A frame larger than one 1536-byte rx buffer is merged over several.
    let big = echo_round(&mut p, 1, 1514 + 1000);
    assert_eq!(big.len(), 1);
    assert!(
        big[0] == frame(0, 2514),
        "merged frame differs (len {})",
        big[0].len()
    );

    let r = b.device.reports();
    let (rx, tx) = (&r[0].counters, &r[1].counters);
    assert_eq!(tx.packets, n as u64 + 1);
    assert_eq!(rx.packets, n as u64 + 1);
    assert_eq!(p.tx.counters.packets, tx.packets);
    assert_eq!(p.rx.counters.packets, rx.packets);
    assert_eq!(tx.bytes, p.tx.counters.bytes);
    assert_eq!(rx.bytes, p.rx.counters.bytes);
    // Batching and event idx keep notifications well below one per frame.
    assert!(rx.batches_flushed < rx.packets, "{rx:?}");
    assert!(r.iter().all(|q| q.broken.is_none()));
}

#[test]
fn null_generates_rx_frames_and_drops_tx() {
    let b = start_backend(
        "null",
        BackendConfig {
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let mut p = connect(&b, WANTED);
    let mut got = 0usize;
    let mut sizes_ok = true;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < 10_000 && Instant::now() < deadline {
        got += p.rx.poll(256, |f| sizes_ok &= f.len() == 60).unwrap();
        if got < 10_000 {
            p.rx.wait(10);
        }
    }
    assert!(got >= 10_000 && sizes_ok);
    for i in 0..100 {
        while !p.tx.send(&frame(i, 64), NetHdr::default()).unwrap() {
            p.tx.wait_wake(10).unwrap();
        }
    }
    p.tx.flush();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.device.reports()[1].counters.packets < 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.device.reports()[1].counters.packets, 100);
    assert_eq!(b.device.reports()[1].counters.bytes, 6400);
}

#[test]
fn flag_mode_without_event_idx_or_indirect_works_too() {
    let b = start_backend(
        "flags",
        BackendConfig {
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut p = connect(&b, Features::VERSION_1 | Features::NET_MRG_RXBUF);
    assert!(!p.conn.features.contains(Features::RING_EVENT_IDX));
    let got = echo_round(&mut p, 2000, 64);
    assert_eq!(got.len(), 2000);
    assert!(got[1999] == frame(1999, 64));
}
