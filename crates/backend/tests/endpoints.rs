//! The local endpoints under clients that never read and clients that never send, more of
//! them than the bound: a fresh `virtnet ctl` client, or a fresh scrape of /metrics, is
//! answered within `FRESH_WITHIN`, the serving threads are back to the bound or fewer, and once
//! the clients leave the process is as before (threads, descriptors, memory).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::inproc::{echo_backend, temp_dir, Backend, TempDir};
use testkit::recovery::{self, Baseline};
use virtnet_backend::ctl::{self, Request, MAX_CTL_CLIENTS, MAX_CTL_REQUEST, MAX_METRICS_CLIENTS};

/// How soon a fresh client must have its answer, whatever the others do.
const FRESH_WITHIN: Duration = Duration::from_secs(2);

/// The names `ctl::serve_ctl` and `ctl::serve_metrics` give their clients' threads.
const CTL_THREAD: &str = "virtnet-ctl";
const METRICS_THREAD: &str = "virtnet-metrics";

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

/// Waits up to a second for the threads named `name` to be `max` or fewer.
fn assert_threads_at_most(name: &str, max: usize) {
    let ok = testkit::eventually(Duration::from_secs(1), || threads_named(name) <= max);
    assert!(
        ok,
        "{} {name} threads, the bound is {max}",
        threads_named(name)
    );
}

/// `b`'s device served on a ctl socket in a directory of its own.
fn serve_ctl(b: &Backend, tag: &str) -> (PathBuf, TempDir) {
    let dir = temp_dir(tag);
    let path = dir.0.join("ctl.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let d = b.device.clone();
    std::thread::spawn(move || ctl::serve_ctl(d, listener));
    (path, dir)
}

/// `b`'s device served on /metrics at a port of 127.0.0.1.
fn serve_metrics(b: &Backend) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let d = b.device.clone();
    std::thread::spawn(move || ctl::serve_metrics(d, listener));
    addr
}

/// A fresh `virtnet ctl stats` is answered within [`FRESH_WITHIN`].
fn assert_fresh_ctl_client_answered(path: &Path) {
    let start = Instant::now();
    let answer = ctl::request(path, &Request::Stats).expect("a fresh ctl client");
    let took = start.elapsed();
    assert!(answer.contains("\"queues\""), "{answer}");
    assert!(took < FRESH_WITHIN, "a fresh ctl client waited {took:?}");
}

/// A fresh GET /metrics is answered within [`FRESH_WITHIN`].
fn assert_fresh_scrape_answered(addr: SocketAddr) {
    let start = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(FRESH_WITHIN)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("a fresh scrape");
    let took = start.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(
        answer.contains("# HELP virtnet_queue_packets_total "),
        "{answer}"
    );
    assert!(took < FRESH_WITHIN, "a fresh scrape waited {took:?}");
}

/// A ctl client that sends `stats` over and over and never reads: it writes until its socket
/// takes no more (the backend, stuck writing answers, has stopped reading) or is closed.
fn stats_and_never_read(path: &Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_nonblocking(true).unwrap();
    let requests = "{\"cmd\":\"stats\"}\n".repeat(64);
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        match (&s).write(requests.as_bytes()) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(_) => break,
        }
    }
    s
}

/// Whether `s` reads end of file (or a reset) within 2 s: the backend closed it.
fn closed<S: Read>(s: &mut S) -> bool {
    let mut buf = [0u8; 4096];
    // Generous: on a loaded machine (another test's busy-polling peer on both CPUs) the
    // eviction has taken more than 2 s.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn ctl_clients_that_never_read_do_not_keep_a_fresh_one_waiting() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("ctlnoread");
    let (path, _dir) = serve_ctl(&b, "ctlnoread-ctl");
    let base = Baseline::take(&exclusive, &b);
    let mut stuck: Vec<UnixStream> = (0..2 * MAX_CTL_CLIENTS)
        .map(|_| stats_and_never_read(&path))
        .collect();
    assert_fresh_ctl_client_answered(&path);
    assert_threads_at_most(CTL_THREAD, MAX_CTL_CLIENTS);
    // The first ones, waiting longest, made room for the others: closed.
    assert!(
        closed(&mut stuck[0]),
        "the first stuck client is still open"
    );
    drop(stuck);
    assert_threads_at_most(CTL_THREAD, 0);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn ctl_clients_that_never_send_do_not_keep_a_fresh_one_waiting() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("ctlsilent");
    let (path, _dir) = serve_ctl(&b, "ctlsilent-ctl");
    let base = Baseline::take(&exclusive, &b);
    let mut silent: Vec<UnixStream> = (0..2 * MAX_CTL_CLIENTS)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    assert_fresh_ctl_client_answered(&path);
    assert_threads_at_most(CTL_THREAD, MAX_CTL_CLIENTS);
    silent[0].set_nonblocking(true).unwrap();
    assert!(
        closed(&mut silent[0]),
        "the first silent client is still open"
    );
    // The latest silent ones are still served.
    let last = silent.last_mut().unwrap();
    last.write_all(b"{\"cmd\":\"stats\"}\n").unwrap();
    last.set_read_timeout(Some(FRESH_WITHIN)).unwrap();
    assert!(last.read(&mut [0u8; 64]).unwrap() > 0, "no answer");
    drop(silent);
    assert_threads_at_most(CTL_THREAD, 0);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn a_ctl_request_longer_than_the_limit_is_refused_and_its_client_closed() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("ctllong");
    let (path, _dir) = serve_ctl(&b, "ctllong-ctl");
    let base = Baseline::take(&exclusive, &b);
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(FRESH_WITHIN)).unwrap();
    s.write_all(&vec![b' '; MAX_CTL_REQUEST + 1]).unwrap();
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).unwrap();
    assert!(answer.contains("request longer than"), "{answer}");
    // Closed with the rest of the request unread: a reset, or end of file.
    assert!(closed(&mut s), "still open after refusing the request");
    drop(s);
    assert_fresh_ctl_client_answered(&path);
    recovery::assert_recovered(&b, &base);
}

/// Half send a GET and never read the answer, half stop halfway through their request head.
/// (On loopback the kernel gives a TCP sender megabytes of buffer, more than /metrics of the
/// largest device, so the first kind cannot stall a writer here: the unit tests of
/// `endpoint` and the ctl tests above stall one.)
#[test]
fn scrapers_that_never_read_do_not_keep_a_fresh_one_waiting() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("metricsnoread");
    let addr = serve_metrics(&b);
    let base = Baseline::take(&exclusive, &b);
    let stuck: Vec<TcpStream> = (0..2 * MAX_METRICS_CLIENTS)
        .map(|i| {
            let mut s = TcpStream::connect(addr).unwrap();
            let head: &[u8] = if i % 2 == 0 {
                b"GET /metrics HTTP/1.1\r\n\r\n"
            } else {
                b"GET /metrics HTTP/1.1\r\nHost: a"
            };
            s.write_all(head).unwrap();
            s
        })
        .collect();
    assert_fresh_scrape_answered(addr);
    assert_threads_at_most(METRICS_THREAD, MAX_METRICS_CLIENTS);
    drop(stuck);
    assert_threads_at_most(METRICS_THREAD, 0);
    recovery::assert_recovered(&b, &base);
}

#[test]
fn scrapers_that_never_send_do_not_keep_a_fresh_one_waiting() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("metricssilent");
    let addr = serve_metrics(&b);
    let base = Baseline::take(&exclusive, &b);
    let mut silent: Vec<TcpStream> = (0..2 * MAX_METRICS_CLIENTS)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    assert_fresh_scrape_answered(addr);
    assert_threads_at_most(METRICS_THREAD, MAX_METRICS_CLIENTS);
    silent[0].set_nonblocking(true).unwrap();
    assert!(
        closed(&mut silent[0]),
        "the first silent scraper is still open"
    );
    drop(silent);
    assert_threads_at_most(METRICS_THREAD, 0);
    recovery::assert_recovered(&b, &base);
}
