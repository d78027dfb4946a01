//! The control queue against our backend slowed down on purpose (`ctrl_delay_us`, seed 004's
//! "device does not respond in time"): many submitters at once, each getting its own answer,
//! and timeouts that leave the queue usable.

use testkit::inproc;

use std::sync::Arc;
use std::time::Duration;

use inproc::*;
use virtnet_backend::{BackendConfig, IoMode};
use virtnet_driver::{CtrlError, CtrlMode, DriverConfig, NetDriver, Reply};
use vnet::ctrl::{Coalesce, Command};

fn slow_backend(tag: &str, pairs: u16, delay_us: u32) -> Backend {
    start_backend(
        tag,
        BackendConfig {
            pairs,
            io: IoMode::Echo,
            ctrl_delay_us: delay_us,
            ..Default::default()
        },
    )
}

fn connect(b: &Backend, mode: CtrlMode, timeout: Duration) -> NetDriver {
    let cfg = DriverConfig {
        pairs: 1,
        ctrl: Some(mode),
        ctrl_timeout: timeout,
        ..Default::default()
    };
    NetDriver::connect(&b.socket, &cfg).expect("connect")
}

/// 64 threads each issue 100 VQ_NOTF_COAL commands (SET then GET of its own queue, with
/// values unique to the thread and the round), all in flight together against a device that
/// takes 0.5 ms per command. Every answer must be the one for its own command.
#[test]
fn sixty_four_threads_times_a_hundred_commands_none_lost_or_swapped() {
    let b = slow_backend("ctrl-64", 32, 500);
    let d = connect(&b, CtrlMode::Irq, Duration::from_secs(60));
    let ctrl = d.ctrl().unwrap().clone();
    assert_eq!(ctrl.vq(), 64);
    let threads: Vec<_> = (0..64u16)
        .map(|t| {
            let ctrl = ctrl.clone();
            std::thread::spawn(move || {
                for round in 0..50u32 {
                    let coal = Coalesce {
                        max_packets: t as u32 * 1000 + round,
                        max_usecs: round,
                    };
                    let set = ctrl.execute(Command::VqNotfCoalSet { vqn: t, coal });
                    assert_eq!(set, Ok(Reply::Ack), "thread {t} round {round}");
                    let got = ctrl.vq_coalesce(t);
                    assert_eq!(got, Ok(coal), "thread {t} round {round}: swapped or lost");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a submitter failed");
    }
    let c = ctrl.counters();
    // 6400 commands plus the VQ_PAIRS_SET at connect.
    assert_eq!((c.submitted, c.completed), (6401, 6401), "{c:?}");
    assert_eq!(
        (c.timeouts, c.refused, c.no_ack, c.poll_spins),
        (0, 0, 0, 0)
    );
    // The submitters really were concurrent: many commands in flight at once.
    assert!(c.max_in_flight >= 16, "{c:?}");
    let r = b.device.reports();
    assert_eq!(r[64].kind, "ctrl");
    assert_eq!(r[64].counters.ctrl_commands, 6401);
    for (t, q) in r[..64].iter().enumerate() {
        assert_eq!(q.coalesce_max_packets, t as u32 * 1000 + 49);
    }
}

/// The polling mode gives the same answers, one command at a time.
#[test]
fn polling_mode_serialises_and_gets_the_same_answers() {
    let b = slow_backend("ctrl-poll", 4, 200);
    let d = connect(&b, CtrlMode::Poll, Duration::from_secs(30));
    let ctrl = d.ctrl().unwrap().clone();
    let threads: Vec<_> = (0..8u16)
        .map(|t| {
            let ctrl = ctrl.clone();
            std::thread::spawn(move || {
                for round in 0..10u32 {
                    let coal = Coalesce {
                        max_packets: t as u32 * 100 + round,
                        max_usecs: 1,
                    };
                    ctrl.execute(Command::VqNotfCoalSet { vqn: t, coal })
                        .unwrap();
                    assert_eq!(ctrl.vq_coalesce(t), Ok(coal));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = ctrl.counters();
    assert_eq!((c.submitted, c.completed, c.interrupts), (161, 161, 0));
    assert!(c.poll_spins > c.completed, "the submitter spun: {c:?}");
}

/// A device that does not answer in time: the command fails with a clear timeout, the queue
/// is not wedged, and the late answer does not pass for the next command's.
#[test]
fn a_slow_answer_times_out_clearly_and_the_queue_goes_on() {
    let b = slow_backend("ctrl-timeout", 1, 600_000);
    let d = connect(&b, CtrlMode::Irq, Duration::from_millis(100));
    let ctrl = d.ctrl().unwrap().clone();
    let first = Coalesce {
        max_packets: 11,
        max_usecs: 11,
    };
    let err = ctrl
        .execute(Command::VqNotfCoalSet {
            vqn: 0,
            coal: first,
        })
        .unwrap_err();
    assert!(matches!(err, CtrlError::Timeout { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("no answer within 100ms"), "{msg}");
    // Next command, given time: the device answers the first (late) and then this one.
    let second = Coalesce {
        max_packets: 22,
        max_usecs: 22,
    };
    let r = ctrl.execute_timeout(
        Command::VqNotfCoalSet {
            vqn: 1,
            coal: second,
        },
        Duration::from_secs(10),
    );
    assert_eq!(r, Ok(Reply::Ack));
    let got = ctrl
        .execute_timeout(Command::VqNotfCoalGet { vqn: 1 }, Duration::from_secs(10))
        .unwrap();
    assert_eq!(
        got,
        Reply::Coalesce(second),
        "its own answer, not the late one"
    );
    let c = ctrl.counters();
    assert_eq!((c.timeouts, c.late_completions), (1, 1), "{c:?}");
    // The timed-out command did reach the device.
    assert_eq!(
        (
            b.device.reports()[0].coalesce_max_packets,
            b.device.reports()[1].coalesce_max_packets
        ),
        (11, 22)
    );
}

/// Dropping the driver while commands are in flight fails them cleanly.
#[test]
fn dropping_the_driver_fails_commands_in_flight() {
    let b = slow_backend("ctrl-drop", 1, 300_000);
    let d = connect(&b, CtrlMode::Irq, Duration::from_secs(10));
    let ctrl: Arc<_> = d.ctrl().unwrap().clone();
    let p = ctrl.submit(Command::RxAllmulti(true)).unwrap();
    drop(ctrl);
    drop(d);
    assert_eq!(p.wait(Duration::from_secs(5)), Err(CtrlError::Closed));
}
