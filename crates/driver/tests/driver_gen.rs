//! `virtnet gen`'s engine ([`virtnet_driver::gen::run`]) against our backend: every mode moves
//! traffic, its counters agree with the backend's, and failures are clear.

use testkit::inproc;

use std::time::Duration;

use inproc::*;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::gen::{self, GenConfig, GenError, Mode};
use virtnet_driver::CtrlMode;

fn config(b: &Backend, mode: Mode) -> GenConfig {
    GenConfig {
        socket: b.socket.clone(),
        mode,
        duration: Duration::from_millis(1200),
        ..Default::default()
    }
}

#[test]
fn txonly_and_rxonly_against_the_null_backend() {
    let b = start_backend(
        "gen-null",
        BackendConfig {
            io: IoMode::Null { size: 60 },
            ..Default::default()
        },
    );
    let mut lines = 0;
    let r = gen::run(&config(&b, Mode::TxOnly), &mut |_| lines += 1).unwrap();
    assert!(lines >= 1, "a rate line per second");
    assert!(r.summary.tx_mpps > 0.0, "{:?}", r.summary);
    let sent = r.per_pair[0].tx.packets;
    // After the drain every frame sent was consumed by the device.
    assert_eq!(b.device.reports()[1].counters.packets, sent);
    assert_eq!(r.per_pair[0].tx.bytes, sent * 64);
    assert!(r.summary.kicks_per_packet < 0.5, "{:?}", r.summary);
    std::thread::sleep(Duration::from_millis(50));

    let before = b.device.reports()[0].counters.packets;
    let r = gen::run(&config(&b, Mode::RxOnly), &mut |_| {}).unwrap();
    assert!(r.summary.rx_mpps > 0.0, "{:?}", r.summary);
    let delivered = b.device.reports()[0].counters.packets - before;
    let got = r.per_pair[0].rx.packets;
    // The device may still have filled buffers we had posted when we stopped polling.
    assert!(
        got <= delivered && delivered - got <= 256,
        "{got} of {delivered}"
    );
    assert!(got > 1000);
    std::thread::sleep(Duration::from_millis(50));

    // Busy polling with the avail index published once per burst, and the interrupt mode
    // polling a while before each sleep: the same agreement (busy polling takes no interrupt;
    // with the spin, frames still come whether a spin finds them or ends in a sleep).
    for busy in [true, false] {
        for mode in [Mode::TxOnly, Mode::RxOnly] {
            let mut cfg = config(&b, mode);
            if busy {
                cfg.busy_poll = true;
                cfg.avail_per_burst = true;
            } else {
                cfg.spin = Duration::from_micros(20);
            }
            let before = b.device.reports()[1].counters.packets;
            let r = gen::run(&cfg, &mut |_| {}).unwrap();
            let p = &r.per_pair[0];
            let q = if mode == Mode::TxOnly {
                assert_eq!(
                    b.device.reports()[1].counters.packets - before,
                    p.tx.packets
                );
                &p.tx
            } else {
                &p.rx
            };
            assert!(q.packets > 1000, "{mode:?}, busy {busy}: {}", q.packets);
            if busy {
                assert_eq!(q.interrupts, 0, "busy polling takes no interrupt");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn io_and_rr_against_the_echo_backend_on_two_pairs() {
    let b = start_backend(
        "gen-echo",
        BackendConfig {
            pairs: 2,
            io: IoMode::Echo,
            ..Default::default()
        },
    );
    let mut cfg = config(&b, Mode::Io);
    cfg.queues = 2;
    let r = gen::run(&cfg, &mut |_| {}).unwrap();
    assert_eq!(r.pairs, 2);
    for p in &r.per_pair {
        assert!(p.tx.packets > 0 && p.rx.packets > 0, "{p:?}");
        // Echo: everything sent comes back, or was dropped by the device for lack of
        // rx buffers (counted there).
        let dropped = b.device.reports()[2 * p.pair as usize].counters.dropped;
        assert!(p.rx.packets <= p.tx.packets);
        assert!(
            p.tx.packets - p.rx.packets <= dropped + 256,
            "{p:?} dropped {dropped}"
        );
    }
    assert!(r.ctrl.is_some(), "two pairs need the control queue");
    std::thread::sleep(Duration::from_millis(50));

    let mut cfg = config(&b, Mode::Rr);
    cfg.busy_poll = true;
    let r = gen::run(&cfg, &mut |_| {}).unwrap();
    let l = r.latency.expect("rr has latency");
    assert!(l.samples > 100, "{l:?}");
    assert!(l.min_us <= l.p50_us && l.p50_us <= l.p99_us && l.p99_us <= l.p999_us);
    assert!(l.p999_us <= l.max_us);
    assert_eq!(r.per_pair[0].lost, 0);
    // Every round trip is a frame received; the last one may land after the stop.
    let rx = r.per_pair[0].rx.packets;
    assert!(rx - l.samples <= 1, "{rx} frames, {} samples", l.samples);
}

#[test]
fn dim_runs_with_irq_and_poll_control_queues() {
    for ctrl in [CtrlMode::Irq, CtrlMode::Poll] {
        let b = start_backend(
            "gen-dim",
            BackendConfig {
                io: IoMode::Null { size: 60 },
                ..Default::default()
            },
        );
        let mut cfg = config(&b, Mode::RxOnly);
        cfg.dim = true;
        cfg.ctrl = ctrl;
        let r = gen::run(&cfg, &mut |_| {}).unwrap();
        let dim = r.per_pair[0].dim.expect("DIM attached");
        let c = r.ctrl.unwrap();
        // One command to set the starting profile, then one per DIM decision that applied
        // (the last one may still be in flight).
        assert!(c.completed > dim.applied, "{c:?} {dim:?}");
        assert_eq!(dim.failed, 0);
        assert_eq!(c.timeouts, 0);
        // The device runs the profile DIM believes in (unless a change is in flight).
        let dev = b.device.reports()[0].coalesce_max_packets;
        let profile = virtnet_driver::dim::RX_PROFILES[dim.profile as usize];
        if dim.decisions == dim.applied {
            assert_eq!(dev, profile.max_packets, "{ctrl:?} {dim:?}");
        }
    }
}

#[test]
fn no_backend_and_bad_options_are_clear_errors() {
    let dir = temp_dir("gen-none");
    let cfg = GenConfig {
        socket: dir.0.join("nobody.sock"),
        connect_wait: Duration::from_millis(100),
        ..Default::default()
    };
    let err = gen::run(&cfg, &mut |_| {}).unwrap_err();
    assert!(err.to_string().starts_with("cannot connect to "), "{err}");
    let cfg = GenConfig { size: 20, ..cfg };
    assert!(matches!(
        gen::run(&cfg, &mut |_| {}),
        Err(GenError::Options(_))
    ));
}
