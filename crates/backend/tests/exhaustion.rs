//! A frontend that connects and holds on must not starve the others: an idle first frontend
//! is dropped after `FIRST_REQUEST_TIMEOUT` so the next one is served. (The ctl and /metrics
//! clients' bound is tests/endpoints.rs.)

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use testkit::inproc::{connect, echo_backend, echo_round};
use testkit::recovery::{self, Baseline};
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
