//! Our vhost-user frontend against a scripted backend: a thread that answers GET_FEATURES and
//! GET_PROTOCOL_FEATURES with what the test offers, takes every other request without a reply
//! (no REPLY_ACK is offered), and records each request's code and payload. Cases no real
//! backend of ours produces: PROTOCOL_FEATURES without any protocol feature the frontend uses,
//! a queue index vhost-user cannot name, a device without MRG_RXBUF, bytes sent unasked.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use vnet::feature;
use vring::Features;

use testkit::inproc::{temp_dir, TempDir};
use virtnet_driver::frontend::Connection;
use virtnet_driver::{DriverConfig, NetDriver, DEFAULT_FEATURES};

const GET_FEATURES: u32 = 1;
const SET_VRING_CALL: u32 = 13;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_VRING_ENABLE: u32 = 18;
const F_PROTOCOL_FEATURES: u64 = 1 << 30;
const PROTOCOL_MQ: u64 = 1 << 0;
const PROTOCOL_LOG_SHMFD: u64 = 1 << 1;

/// Serves one frontend on `s` until it closes; returns its requests, (code, payload).
fn scripted(mut s: UnixStream, features: u64, protocol: u64) -> Vec<(u32, Vec<u8>)> {
    let mut log = Vec::new();
    loop {
        let mut h = [0u8; 12];
        if s.read_exact(&mut h).is_err() {
            return log; // The frontend closed.
        }
        let code = u32::from_le_bytes(h[0..4].try_into().unwrap());
        let size = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        let mut body = vec![0u8; size];
        s.read_exact(&mut body).unwrap();
        let answer = match code {
            GET_FEATURES => Some(features),
            GET_PROTOCOL_FEATURES => Some(protocol),
            _ => None,
        };
        if let Some(v) = answer {
            let mut r = Vec::new();
            r.extend_from_slice(&code.to_le_bytes());
            r.extend_from_slice(&(0x1u32 | 0x4).to_le_bytes()); // Version 1, a reply.
            r.extend_from_slice(&8u32.to_le_bytes());
            r.extend_from_slice(&v.to_le_bytes());
            s.write_all(&r).unwrap();
        }
        log.push((code, body));
    }
}

/// A scripted backend's thread: it returns the requests it took.
type Script = JoinHandle<Vec<(u32, Vec<u8>)>>;

/// A scripted backend listening on a socket of its own, in a directory removed with the
/// returned guard.
fn listening(tag: &str, features: u64, protocol: u64) -> (TempDir, PathBuf, Script) {
    let dir = temp_dir(tag);
    let path = dir.0.join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let backend = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        scripted(s, features, protocol)
    });
    (dir, path, backend)
}

/// PROTOCOL_FEATURES negotiated, but none of the protocol features the frontend uses (only
/// LOG_SHMFD offered): rings start disabled all the same (vhost-user spec, "Ring states"), so
/// starting a queue must enable it.
#[test]
fn rings_are_enabled_whenever_protocol_features_is_negotiated() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let offered = Features::VERSION_1.0 | F_PROTOCOL_FEATURES;
    let backend = std::thread::spawn(move || scripted(theirs, offered, PROTOCOL_LOG_SHMFD));
    let v1 = Features::VERSION_1;
    let mut conn = Connection::from_stream(ours, 1, 8, v1, v1, 1 << 20).unwrap();
    assert!(conn.features.contains(Features(F_PROTOCOL_FEATURES)));
    conn.start_queue(0).unwrap();
    drop(conn);
    let codes: Vec<u32> = backend.join().unwrap().iter().map(|r| r.0).collect();
    assert!(
        codes.contains(&SET_VRING_ENABLE),
        "queue 0 never enabled: {codes:?}"
    );
}

/// SET_VRING_KICK/CALL/ERR name the vring in bits 0-7, bit 8 meaning "no fd": a queue index
/// above 255 (the control queue of a device that reports 128 pairs or more) cannot be named
/// and is refused, rather than sent as queue 0's.
#[test]
fn queue_indices_beyond_eight_bits_are_refused() {
    let offered = Features::VERSION_1.0 | F_PROTOCOL_FEATURES;
    let (_dir, path, backend) = listening("fe-index", offered, PROTOCOL_MQ);
    let v1 = Features::VERSION_1;
    let mut conn = Connection::open(&path, 1025, v1, v1, 1 << 20, Duration::from_secs(2)).unwrap();
    assert!(
        conn.setup_queue(255, 8).is_ok(),
        "the last index vhost-user names"
    );
    for index in [256, 512] {
        let e = conn.setup_queue(index, 8).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("8 bits")), "queue {index}");
    }
    conn.finish_handshake().unwrap();
    drop(conn);
    let calls: Vec<u64> = backend
        .join()
        .unwrap()
        .iter()
        .filter(|r| r.0 == SET_VRING_CALL)
        .map(|r| u64::from_le_bytes(r.1[..8].try_into().unwrap()))
        .collect();
    assert_eq!(calls, [255], "SET_VRING_CALL payloads");
}

/// A device that offers GUEST_TSO4 but not MRG_RXBUF (what `gen --mode tcp-sink` asks for):
/// the rx ring then takes 64 KiB buffers, and the shared memory is sized for them, not for
/// the mergeable buffers that were only wanted.
#[test]
fn memory_is_sized_for_the_rx_layout_negotiated() {
    let tso = feature::GUEST_CSUM | feature::GUEST_TSO4;
    let offered = Features::VERSION_1 | Features::RING_INDIRECT_DESC | tso;
    let (_dir, path, backend) = listening("fe-memory", offered.0 | F_PROTOCOL_FEATURES, 0);
    let config = DriverConfig {
        features: DEFAULT_FEATURES | tso,
        connect_wait: Duration::from_secs(2),
        ..Default::default()
    };
    assert!(config.features.contains(feature::MRG_RXBUF), "wanted");
    let negotiated = NetDriver::connect(&path, &config)
        .map(|d| d.features())
        .map_err(|e| e.to_string());
    backend.join().unwrap();
    let negotiated = negotiated.expect("connected");
    assert!(!negotiated.contains(feature::MRG_RXBUF));
    assert!(negotiated.contains(feature::GUEST_TSO4));
}

/// A backend that sends bytes unasked after the handshake, then closes: the close is seen
/// (the bytes are dropped, not left to hide every later end of file).
#[test]
fn a_close_after_bytes_sent_unasked_is_seen() {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let stray = theirs.try_clone().unwrap();
    let backend = std::thread::spawn(move || scripted(theirs, Features::VERSION_1.0, 0));
    let v1 = Features::VERSION_1;
    let conn = Connection::from_stream(ours, 1, 8, v1, v1, 1 << 20).unwrap();
    assert!(!conn.wait_closed(Duration::from_millis(10)), "still open");
    (&stray).write_all(b"unasked").unwrap();
    stray.shutdown(Shutdown::Write).unwrap();
    let calls = (1..=3).find(|_| conn.wait_closed(Duration::from_millis(10)));
    assert!(calls.is_some(), "the close went unseen");
    drop(conn);
    backend.join().unwrap();
}

/// A backend that negotiates, then never answers GET_CONFIG: the connect fails when the
/// handshake's deadline passes, and says so (not "GET_CONFIG failed" on the socket the
/// deadline shut down).
#[test]
fn a_backend_that_stops_answering_after_negotiation_times_the_handshake_out() {
    const PROTOCOL_CONFIG: u64 = 1 << 9;
    let offered = Features::VERSION_1 | feature::MAC;
    let (_dir, path, backend) = listening(
        "fe-config",
        offered.0 | F_PROTOCOL_FEATURES,
        PROTOCOL_CONFIG,
    );
    let config = DriverConfig {
        connect_wait: Duration::from_secs(2),
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let err = NetDriver::connect(&path, &config)
        .err()
        .map(|e| e.to_string());
    assert!(t0.elapsed() >= virtnet_driver::frontend::HANDSHAKE_TIMEOUT);
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("did not finish the vhost-user handshake")),
        "{err:?}"
    );
    let codes: Vec<u32> = backend.join().unwrap().iter().map(|r| r.0).collect();
    const GET_CONFIG: u32 = 24;
    assert_eq!(codes.last(), Some(&GET_CONFIG), "{codes:?}");
}
