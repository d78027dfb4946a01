//! A `virtnet gen` run across connections: connect, start a session, hand the caller a rate line
//! each second, and with `--reconnect` connect again when the backend goes away; then the report.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::options::{check_options, driver_config};
use super::report::Totals;
use super::session::{Session, SessionEnd};
use super::{GenConfig, GenError, GenReport, Histogram, Mode, PairReport, Rates, Reconnect};
use crate::{DriverConfig, NetDriver};

/// `--reconnect`'s back-off: the first attempt this long after the loss, the wait between
/// attempts doubling up to [`RECONNECT_MAX`]. A refused connect to a unix socket costs next
/// to nothing, so the cap is low: the gap is at most that much longer than the outage.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(100);
pub const RECONNECT_MAX: Duration = Duration::from_millis(500);

/// While disconnected (`--reconnect`): when to try next, and since when.
struct Retry {
    since: Instant,
    next: Instant,
    wait: Duration,
    last_error: String,
}

/// Connects, runs the traffic for `config.duration`, calling `on_second` with each
/// one-second rate line, and returns the report.
///
/// The backend closing the connection (its vhost-user socket reaching end of file: the
/// process exited or was killed) ends the run with [`GenError::ConnectionLost`], or with
/// `config.reconnect` the pairs' threads stop, the frames in flight are abandoned with the
/// rings, and the run connects again (after [`RECONNECT_FIRST`], doubling up to
/// [`RECONNECT_MAX`]) until the limit, renegotiates, and resumes the same traffic on fresh
/// rings; its counters go on across connections.
pub fn run(config: &GenConfig, on_second: &mut dyn FnMut(&Rates)) -> Result<GenReport, GenError> {
    check_options(config)?;
    if config.queues == 0 {
        return Err(GenError::Options("--queues must be at least 1".into()));
    }
    let dcfg = driver_config(config);
    let round_trips: Vec<Arc<crate::counters::Counter>> = (0..config.queues)
        .map(|_| Arc::new(crate::counters::Counter::default()))
        .collect();
    let driver = NetDriver::connect(&config.socket, &dcfg)?;
    let features = driver.features();
    let pairs = driver.pairs();
    let mut session = Some(Session::start(driver, config, &round_trips)?);
    let started = Instant::now();
    // What the connections before this one counted, per pair.
    let mut done = vec![PairReport::default(); pairs as usize];
    let mut hist = Histogram::default();
    let mut ctrl = None;
    let mut ctrl_cpu_ns = 0;
    let mut gso = session.as_ref().and_then(|s| s.gso);
    let mut reconnects: Vec<Reconnect> = Vec::new();
    let mut retry: Option<Retry> = None;
    let mut fold = |end: SessionEnd, done: &mut Vec<PairReport>| {
        for (p, e) in done.iter_mut().zip(end.pairs) {
            p.rx.accumulate(&e.rx);
            p.tx.accumulate(&e.tx);
            p.dim = e.dim.or(p.dim);
            p.cpu_s += e.cpu_ns as f64 / 1e9;
            p.lost += e.lost;
            p.windows += e.windows;
            p.tcp.add(&e.tcp);
        }
        hist.merge(&end.histogram);
        ctrl = end.ctrl.or(ctrl);
        ctrl_cpu_ns += end.ctrl_cpu_ns;
        end.error
    };
    let totals = |session: &Option<Session>, done: &[PairReport]| {
        let mut t = Totals::default();
        for p in done {
            t.rx.accumulate(&p.rx);
            t.tx.accumulate(&p.tx);
        }
        for (rx, tx) in session.iter().flat_map(|s| s.counters()) {
            t.rx.accumulate(&rx);
            t.tx.accumulate(&tx);
        }
        t.round_trips = round_trips.iter().map(|c| c.get()).sum();
        t
    };
    let mut seconds = Vec::new();
    let mut last = totals(&session, &done);
    let mut last_at = started;
    let first = last.clone();
    let end = started + config.duration;
    let mut broken = None;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let tick = (last_at + Duration::from_secs(1)).min(end);
        if let Some(s) = &session {
            if s.driver
                .connection()
                .wait_closed(tick.saturating_duration_since(now))
            {
                let lost_at = Instant::now();
                let after_s = (lost_at - started).as_secs_f64();
                let Some(s) = session.take() else {
                    unreachable!("matched just above")
                };
                let before: u64 = done.iter().map(|p| p.tx.abandoned).sum();
                if let Some(e) = fold(s.finish(true), &mut done) {
                    return Err(e);
                }
                if config.reconnect.is_none() {
                    return Err(GenError::ConnectionLost { after_s });
                }
                let abandoned = done.iter().map(|p| p.tx.abandoned).sum::<u64>() - before;
                tracing::warn!(
                    after_s,
                    abandoned,
                    "the backend closed the connection; reconnecting"
                );
                reconnects.push(Reconnect {
                    lost_at_s: after_s,
                    gap_s: None,
                    attempts: 0,
                    abandoned,
                });
                retry = Some(Retry {
                    since: lost_at,
                    next: lost_at + RECONNECT_FIRST,
                    wait: RECONNECT_FIRST,
                    last_error: String::new(),
                });
                continue;
            }
        } else if let (Some(r), Some(limit)) = (retry.as_mut(), config.reconnect) {
            if now < r.next {
                std::thread::sleep(r.next.min(tick) - now);
            } else {
                let Some(rc) = reconnects.last_mut() else {
                    unreachable!("a retry follows a loss")
                };
                rc.attempts += 1;
                let dcfg = DriverConfig {
                    connect_wait: Duration::ZERO,
                    ..dcfg.clone()
                };
                let attempt = NetDriver::connect(&config.socket, &dcfg)
                    .map_err(GenError::from)
                    .and_then(|d| Session::start(d, config, &round_trips));
                match attempt {
                    Ok(s) => {
                        let gap = r.since.elapsed();
                        rc.gap_s = Some(gap.as_secs_f64());
                        tracing::info!(
                            gap_ms = gap.as_millis() as u64,
                            attempts = rc.attempts,
                            "connected again"
                        );
                        gso = s.gso.or(gso);
                        session = Some(s);
                        retry = None;
                    }
                    Err(e) => {
                        r.last_error = e.to_string();
                        if r.since.elapsed() + r.wait > limit {
                            return Err(GenError::ReconnectFailed {
                                lost_at_s: rc.lost_at_s,
                                attempts: rc.attempts,
                                limit_s: limit.as_secs_f64(),
                                last: r.last_error.clone(),
                            });
                        }
                        r.next = Instant::now() + r.wait;
                        r.wait = (r.wait * 2).min(RECONNECT_MAX);
                    }
                }
            }
        }
        let now = Instant::now();
        if now < tick {
            continue;
        }
        let t = totals(&session, &done);
        let line = Rates::between(
            &last,
            &t,
            (now - last_at).as_secs_f64(),
            (now - started).as_secs_f64(),
        );
        on_second(&line);
        seconds.push(line);
        if let Some(b) = t.tx.broken.clone().or(t.rx.broken.clone()) {
            broken = Some(b);
            break;
        }
        if session.as_ref().is_some_and(|s| s.any_thread_finished()) {
            break;
        }
        last = t;
        last_at = now;
    }
    let elapsed = started.elapsed();
    let end_totals = totals(&session, &done);
    let (features, pairs) = session.as_ref().map_or((features, pairs), |s| {
        (s.driver.features(), s.driver.pairs())
    });
    if let Some(s) = session.take() {
        if let Some(e) = fold(s.finish(false), &mut done) {
            return Err(e);
        }
    }
    if let Some(reason) = broken {
        return Err(GenError::Broken { reason });
    }
    let summary = Rates::between(
        &first,
        &end_totals,
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64(),
    );
    let cpu_s: f64 = done.iter().map(|p| p.cpu_s).sum();
    for (i, p) in done.iter_mut().enumerate() {
        p.pair = i as u16;
        p.round_trips = round_trips[i].get();
    }
    Ok(GenReport {
        config: config.clone(),
        features: features.to_string(),
        pairs,
        gso,
        seconds,
        summary,
        elapsed_s: elapsed.as_secs_f64(),
        per_pair: done,
        latency: matches!(config.mode, Mode::Rr | Mode::Window).then(|| hist.latency()),
        ctrl,
        cpu_pct: cpu_s / elapsed.as_secs_f64().max(1e-9) * 100.0,
        ctrl_cpu_s: ctrl_cpu_ns as f64 / 1e9,
        reconnects,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_socket_is_a_clear_error() {
        let cfg = GenConfig {
            socket: "/nonexistent/virtnet.sock".into(),
            connect_wait: Duration::from_millis(50),
            ..Default::default()
        };
        let err = run(&cfg, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot connect to /nonexistent/virtnet.sock"),
            "{err}"
        );
    }
}
