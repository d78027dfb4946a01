//! A frontend or a ctl client that connects and holds on must not starve the others: an idle
//! first frontend is dropped after `FIRST_REQUEST_TIMEOUT` so the next one is served, and ctl
//! clients beyond `MAX_CTL_CLIENTS` are closed at once while the others keep working.

use std::io::Read;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use testkit::inproc::{connect, echo_backend, echo_round, temp_dir};
use testkit::recovery::{self, Baseline};
use virtnet_backend::ctl::{self, Request, MAX_CTL_CLIENTS};
use virtnet_backend::session::FIRST_REQUEST_TIMEOUT;
use vring::Features;

#[test]
fn an_idle_first_frontend_does_not_keep_the_next_one_waiting() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("idlefirst");
    let base = Baseline::take(&exclusive, &b);
    let idle = UnixStream::connect(&b.socket).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let mut p = connect(&b, Features::VERSION_1 | vnet::feature::MRG_RXBUF);
    let waited = start.elapsed();
    assert!(
        waited < FIRST_REQUEST_TIMEOUT + Duration::from_secs(2),
        "served after {waited:?}"
    );
    // The idle one was closed: it reads end of file.
    let mut buf = [0u8; 1];
    idle.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    assert_eq!((&idle).read(&mut buf).unwrap(), 0);
    // And the frontend served after it moves frames.
    assert_eq!(echo_round(&mut p, 10, 100).len(), 10);
    drop((p, idle));
    recovery::assert_recovered(&b, &base);
}

#[test]
fn ctl_clients_beyond_the_bound_are_closed_and_the_others_still_served() {
    let exclusive = recovery::exclusive();
    let b = echo_backend("ctlbound");
    let dir = temp_dir("ctlbound-ctl");
    let path = dir.0.join("ctl.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let d = b.device.clone();
    std::thread::spawn(move || ctl::serve_ctl(d, listener));
    let base = Baseline::take(&exclusive, &b);
    // Clients that connect and say nothing hold their threads.
    let held: Vec<UnixStream> = (0..MAX_CTL_CLIENTS)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // One more is closed at once.
    let mut extra = UnixStream::connect(&path).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(extra.read(&mut buf).unwrap(), 0, "closed without an answer");
    // Once the held ones go, a client is answered again.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    let answer = loop {
        match ctl::request(&path, &Request::Stats) {
            Ok(a) if a.contains("queues") => break a,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("no answer: {other:?}"),
        }
    };
    assert!(answer.contains("\"device\""), "{answer}");
    // The client threads are gone with their clients: descriptors back, backend idle.
    drop(extra);
    recovery::assert_recovered(&b, &base);
}
