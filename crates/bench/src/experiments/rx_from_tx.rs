//! Experiment 4, rx polled from the tx path (seed 003): the backend busy-polls its tx ring for
//! [`BUSY_POLL_US`], the seed's `poll-us`; with `poll_rx_from_tx` it also moves host-side rx
//! frames while it does.
//!
//! - 4: null io makes the host side an endless source of rx frames, so the traffic is
//!   bidirectional: our driver (`gen io`, sleeping on interrupts) transmits 1500 B frames and
//!   receives 1500 B frames. A host side that always has a frame leaves the poll nothing to
//!   find, though: rx runs in every turn anyway.
//! - 4b, the seed's case: a stream whose sender waits for the other side. The driver (`gen
//!   window`, sleeping on interrupts) sends a window of [`WINDOW`] frames of 1500 B, then
//!   waits for an ack before the next window. The backend's host port is a unix datagram
//!   socket ([`IoMode::Socket`]) whose other end a peer thread holds: it reads the frames and
//!   answers every [`WINDOW`]-th with an ack frame, from its own thread, as the remote end of
//!   a TCP connection behind a TAP would. The ack reaches the backend while its worker
//!   busy-polls the tx ring for the next window: without `poll_rx_from_tx` nothing looks at
//!   the socket until the poll times out (vhost_net before the seed), with it the ack goes to
//!   the guest at once.

use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use virtnet_backend::config::HostSockets;
use virtnet_backend::{BackendConfig, BusyPoll, IoMode};
use virtnet_driver::gen::window::Acker;
use virtnet_driver::gen::{GenReport, Mode};

use super::common::{count, gen_config, run_gen, run_gen_on, spread, LocalBackend, SeedComparison};
use super::{Experiment, Options, Outcome, Progress};
use crate::summary::Summary;
use crate::table::Table;
use crate::BenchError;

pub const EXPERIMENT: Experiment = Experiment {
    id: 4,
    name: "rx-from-tx",
    summary: "seed 003: backend polls rx from its tx busy-poll loop on/off, bidirectional Gbit/s; a windowed stream acked from another thread",
    run,
};

/// Seed: TCP_STREAM, 19842.95 -> 37373.10 Mbps, off -> on; its mean latency 6.50 -> 3.43 us.
pub const SEED_GBPS: (f64, f64) = (19.84295, 37.37310);
pub const SEED_LATENCY_US: (f64, f64) = (6.50, 3.43);
pub const FRAME: usize = 1500;
/// The busy-poll timeout, as the seed's test set it (poll-us=100us). The off row pays about
/// one timeout a window (4b), so a shorter one shrinks what the switch can gain: at 50 us,
/// 1.39–1.70x against 1.82–2.25x at 100 (AMD EPYC family 26 model 2; docs/PERFORMANCE-HISTORY.md,
/// 2026-12-04 21:46 UTC, seed experiment 4 at a 100 us poll).
pub const BUSY_POLL_US: u32 = 100;
/// 4b: frames per window, a quarter of the queue (256), so a window always fits.
pub const WINDOW: usize = 64;
/// 4b: where the peer thread runs when pinning (the driver's CPU; see [`WindowResults`]).
pub const PEER_CPU: usize = 0;

#[derive(Debug, Serialize)]
pub struct Run {
    pub secs: f64,
    pub tx_gbps: f64,
    pub rx_gbps: f64,
    pub interrupts_per_packet: f64,
    pub device_busy_poll_hits: u64,
    pub device_kicks: u64,
}

#[derive(Debug, Serialize)]
pub struct ModeResult {
    pub poll_rx_from_tx: bool,
    pub total_gbps: Summary,
    pub tx_gbps: Summary,
    pub rx_gbps: Summary,
    pub interrupts_per_packet: Summary,
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct Results {
    pub frame: usize,
    pub busy_poll_us: u32,
    pub secs_per_run: f64,
    pub repeats: u32,
    pub modes: Vec<ModeResult>,
    pub seed: SeedComparison,
    /// 4b.
    pub window: WindowResults,
}

/// How the backend polls in one row of 4b.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WindowSetting {
    pub label: &'static str,
    #[serde(rename = "busy_poll_us")]
    pub busy_poll: BusyPoll,
    pub poll_rx_from_tx: bool,
}

/// 4b's rows: before the seed, after it, and auto (with rx polled from tx, the default).
pub const WINDOW_SETTINGS: [WindowSetting; 3] = [
    WindowSetting {
        label: "off",
        busy_poll: BusyPoll::Fixed(BUSY_POLL_US),
        poll_rx_from_tx: false,
    },
    WindowSetting {
        label: "on",
        busy_poll: BusyPoll::Fixed(BUSY_POLL_US),
        poll_rx_from_tx: true,
    },
    WindowSetting {
        label: "auto",
        busy_poll: BusyPoll::Auto,
        poll_rx_from_tx: true,
    },
];

/// What the peer thread of 4b counted: frames read, acks written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PeerCounts {
    pub frames: u64,
    pub acks: u64,
}

/// One run of 4b.
#[derive(Debug, Serialize)]
pub struct WindowRun {
    pub secs: f64,
    pub tx_gbps: f64,
    pub interrupts_per_packet: f64,
    /// The driver: windows sent, acks received for them, windows given up on (no ack within
    /// a second), and frames sent.
    pub windows: u64,
    pub acks: u64,
    pub lost: u64,
    pub frames: u64,
    /// Each window's time, from its first frame sent to its ack received, in microseconds.
    pub window_p50_us: f64,
    pub window_mean_us: f64,
    pub peer: PeerCounts,
    /// The backend's worker (tx and rx queues summed).
    pub busy_poll_entries: u64,
    pub busy_poll_hits: u64,
    pub busy_poll_timeouts: u64,
    pub busy_poll_skipped: u64,
    pub busy_poll_contended: u64,
    pub device_tx_packets: u64,
    pub device_rx_packets: u64,
}

#[derive(Debug, Serialize)]
pub struct WindowResult {
    #[serde(flatten)]
    pub setting: WindowSetting,
    pub tx_gbps: Summary,
    pub window_mean_us: Summary,
    pub interrupts_per_packet: Summary,
    pub runs: Vec<WindowRun>,
}

#[derive(Debug, Serialize)]
pub struct WindowResults {
    pub frame: usize,
    pub window: usize,
    pub secs_per_run: f64,
    /// The driver's threads on CPU 0, the worker on CPU 1, the peer on [`PEER_CPU`]: the
    /// driver's, which is idle while the driver waits for the ack, so the peer never takes
    /// the worker's CPU, whose polling is what is measured. Left to the scheduler, the peer
    /// could wake on the worker's CPU and stop its poll by preempting it.
    pub pinned: bool,
    pub peer_cpu: Option<usize>,
    pub settings: Vec<WindowResult>,
    pub seed: SeedComparison,
    pub seed_latency: SeedComparison,
}

fn one(on: bool, secs: f64) -> Result<Run, BenchError> {
    let b = LocalBackend::start(
        "rxfromtx",
        BackendConfig {
            io: IoMode::Null { size: FRAME },
            busy_poll: BusyPoll::Fixed(BUSY_POLL_US),
            poll_rx_from_tx: on,
            ..Default::default()
        },
    )?;
    let mut cfg = gen_config(&b.socket, Mode::Io, secs);
    cfg.size = FRAME;
    let r = run_gen(cfg)?;
    Ok(Run {
        secs: r.elapsed_s,
        tx_gbps: r.summary.tx_gbps,
        rx_gbps: r.summary.rx_gbps,
        interrupts_per_packet: r.summary.interrupts_per_packet,
        device_busy_poll_hits: b.counter("tx", |c| c.busy_poll_hits)
            + b.counter("rx", |c| c.busy_poll_hits),
        device_kicks: b.counter("tx", |c| c.kicks) + b.counter("rx", |c| c.kicks),
    })
}

/// The host side of 4b: the other end of the backend's socket, on a thread of its own.
struct Peer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<PeerCounts, BenchError>>,
}

impl Peer {
    /// Reads the guest's frames from `socket` (one per message, virtio-net header first) and
    /// writes an ack (header first) after every `window`-th, until stopped.
    fn spawn(socket: UnixDatagram, window: usize, cpu: Option<usize>) -> Result<Peer, BenchError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let body = move || -> Result<PeerCounts, BenchError> {
            if let Some(cpu) = cpu {
                virtnet_sys::pin_thread(cpu).map_err(BenchError::io("pin the peer"))?;
            }
            // Short, so that the stop is seen soon once the stream has ended.
            socket
                .set_read_timeout(Some(Duration::from_millis(5)))
                .map_err(BenchError::io("set the peer's read timeout"))?;
            let mut acker = Acker::new(window);
            let mut buf = vec![0u8; 65536 + vnet::HDR_LEN + 18];
            let mut msg = Vec::new();
            loop {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        let frame = buf.get(vnet::HDR_LEN..n).unwrap_or_default();
                        if let Some(ack) = acker.on_frame(frame) {
                            msg.clear();
                            msg.extend_from_slice(&vnet::NetHdr::default().to_bytes());
                            msg.extend_from_slice(&ack);
                            socket.send(&msg).map_err(BenchError::io("send an ack"))?;
                        }
                    }
                    // Nothing for a while: the end, once the stream has stopped (what the
                    // device wrote before has been read by then).
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        if stopped.load(Relaxed) {
                            break;
                        }
                    }
                    Err(e) => return Err(BenchError::io("read a frame")(e)),
                }
            }
            Ok(PeerCounts {
                frames: acker.frames(),
                acks: acker.acks(),
            })
        };
        let thread = std::thread::Builder::new()
            .name("bench-peer".into())
            .spawn(body)
            .map_err(BenchError::io("start the peer"))?;
        Ok(Peer { stop, thread })
    }

    fn finish(self) -> Result<PeerCounts, BenchError> {
        self.stop.store(true, Relaxed);
        self.thread.join().map_err(|_| BenchError::PeerFailed)?
    }
}

fn window_one(s: WindowSetting, secs: f64, pinned: bool) -> Result<WindowRun, BenchError> {
    let (port, peer) = UnixDatagram::pair().map_err(BenchError::io("make a socket pair"))?;
    let b = LocalBackend::start(
        "window",
        BackendConfig {
            io: IoMode::Socket(HostSockets::new(vec![port])),
            busy_poll: s.busy_poll,
            poll_rx_from_tx: s.poll_rx_from_tx,
            worker_cpu: pinned.then_some(1),
            ..Default::default()
        },
    )?;
    let peer = Peer::spawn(peer, WINDOW, pinned.then_some(PEER_CPU))?;
    let mut cfg = gen_config(&b.socket, Mode::Window, secs);
    cfg.size = FRAME;
    cfg.window = WINDOW;
    let r = run_gen_on(cfg, pinned.then_some(0));
    // The peer stops whatever became of the run.
    let counts = peer.finish();
    let r: GenReport = r?;
    let counts = counts?;
    let both = |f: fn(&virtnet_backend::metrics::CountersSnapshot) -> u64| {
        b.counter("tx", f) + b.counter("rx", f)
    };
    let lat = r.latency.unwrap_or_default();
    let pair =
        |f: fn(&virtnet_driver::gen::PairReport) -> u64| -> u64 { r.per_pair.iter().map(f).sum() };
    Ok(WindowRun {
        secs: r.elapsed_s,
        tx_gbps: r.summary.tx_gbps,
        interrupts_per_packet: r.summary.interrupts_per_packet,
        windows: pair(|p| p.windows),
        acks: pair(|p| p.round_trips),
        lost: pair(|p| p.lost),
        frames: pair(|p| p.tx.packets),
        window_p50_us: lat.p50_us,
        window_mean_us: lat.mean_us,
        peer: counts,
        busy_poll_entries: both(|c| c.busy_poll_entries),
        busy_poll_hits: both(|c| c.busy_poll_hits),
        busy_poll_timeouts: both(|c| c.busy_poll_timeouts),
        busy_poll_skipped: both(|c| c.busy_poll_skipped),
        busy_poll_contended: both(|c| c.busy_poll_contended),
        device_tx_packets: b.counter("tx", |c| c.packets),
        device_rx_packets: b.counter("rx", |c| c.packets),
    })
}

pub fn measure(o: &Options, progress: Progress<'_>) -> Result<Results, BenchError> {
    let (secs, repeats) = if o.quick { (0.2, 1) } else { (1.0, 3) };
    let repeats = o.repeats.unwrap_or(repeats).max(1);
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    let mut window_runs: Vec<Vec<WindowRun>> = WINDOW_SETTINGS.iter().map(|_| Vec::new()).collect();
    for rep in 1..=repeats {
        for (i, on) in [false, true].into_iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] bidirectional, poll rx from tx {}",
                if on { "on" } else { "off" }
            ));
            runs[i].push(one(on, secs)?);
        }
        for (i, &s) in WINDOW_SETTINGS.iter().enumerate() {
            progress(&format!(
                "[{rep}/{repeats}] windowed stream, busy poll {}, poll rx from tx {}",
                s.busy_poll,
                if s.poll_rx_from_tx { "on" } else { "off" }
            ));
            window_runs[i].push(window_one(s, secs, pinned)?);
        }
    }
    let modes: Vec<ModeResult> = [false, true]
        .into_iter()
        .zip(runs)
        .map(|(on, runs)| ModeResult {
            poll_rx_from_tx: on,
            total_gbps: Summary::of_runs(runs.iter().map(|r| r.tx_gbps + r.rx_gbps)),
            tx_gbps: Summary::of_runs(runs.iter().map(|r| r.tx_gbps)),
            rx_gbps: Summary::of_runs(runs.iter().map(|r| r.rx_gbps)),
            interrupts_per_packet: Summary::of_runs(runs.iter().map(|r| r.interrupts_per_packet)),
            runs,
        })
        .collect();
    let seed = SeedComparison::new(
        "bidirectional Gbit/s",
        SEED_GBPS,
        (modes[0].total_gbps.median, modes[1].total_gbps.median),
    );
    let settings: Vec<WindowResult> = WINDOW_SETTINGS
        .iter()
        .zip(window_runs)
        .map(|(&setting, runs)| WindowResult {
            setting,
            tx_gbps: Summary::of_runs(runs.iter().map(|r| r.tx_gbps)),
            window_mean_us: Summary::of_runs(runs.iter().map(|r| r.window_mean_us)),
            interrupts_per_packet: Summary::of_runs(runs.iter().map(|r| r.interrupts_per_packet)),
            runs,
        })
        .collect();
    let (off, on) = (&settings[0], &settings[1]);
    let window = WindowResults {
        frame: FRAME,
        window: WINDOW,
        secs_per_run: secs,
        pinned,
        peer_cpu: pinned.then_some(PEER_CPU),
        seed: SeedComparison::new(
            "stream Gbit/s",
            SEED_GBPS,
            (off.tx_gbps.median, on.tx_gbps.median),
        ),
        seed_latency: SeedComparison::new(
            "mean latency us (seed: netperf's, per send; ours: per window, first frame to ack)",
            SEED_LATENCY_US,
            (off.window_mean_us.median, on.window_mean_us.median),
        ),
        settings,
    };
    Ok(Results {
        frame: FRAME,
        busy_poll_us: BUSY_POLL_US,
        secs_per_run: secs,
        repeats,
        modes,
        seed,
        window,
    })
}

pub fn tables(r: &Results) -> Vec<Table> {
    let mut t = Table::new(
        format!(
            "4. Rx polled from the tx path (seed 003): backend null io, busy poll {} us; driver gen io, {} B both ways",
            r.busy_poll_us, r.frame
        ),
        &[
            "poll rx from tx",
            "total Gbit/s",
            "driver tx Gbit/s",
            "driver rx Gbit/s",
            "driver interrupts/packet",
        ],
    );
    for m in &r.modes {
        t.row(vec![
            if m.poll_rx_from_tx { "on" } else { "off" }.into(),
            m.total_gbps.display(2),
            m.tx_gbps.display(2),
            m.rx_gbps.display(2),
            count(m.interrupts_per_packet.median),
        ]);
    }
    t.note(format!(
        "{} of {:.2} s. No latency figure: a stream has no request to time (see experiment 3 for latency).",
        spread(r.repeats),
        r.secs_per_run
    ));
    t.note(r.seed.note(1));
    vec![t, window_table(r)]
}

fn window_table(r: &Results) -> Table {
    let w = &r.window;
    let mut t = Table::new(
        format!(
            "4b. Rx polled from the tx path, the seed's case: a windowed stream, driver gen window \
             ({} frames of {} B, then wait for the ack), acked by a peer thread through a socket port",
            w.window, w.frame
        ),
        &[
            "poll rx from tx",
            "busy poll us",
            "driver tx Gbit/s",
            "window us (mean)",
            "driver interrupts/packet",
            "poll hits/window",
            "poll timeouts/window",
        ],
    );
    for s in &w.settings {
        let per_window = |f: fn(&WindowRun) -> u64| {
            let windows: u64 = s.runs.iter().map(|r| r.windows).sum();
            count(s.runs.iter().map(f).sum::<u64>() as f64 / windows.max(1) as f64)
        };
        t.row(vec![
            s.setting.label.into(),
            s.setting.busy_poll.to_string(),
            s.tx_gbps.display(2),
            s.window_mean_us.display(1),
            count(s.interrupts_per_packet.median),
            per_window(|r| r.busy_poll_hits),
            per_window(|r| r.busy_poll_timeouts),
        ]);
    }
    t.note(format!(
        "{} of {:.2} s. The peer answers every {}th frame with a 60 B ack from its own thread; \
         off: the ack waits for the worker's tx poll to time out.",
        spread(r.repeats),
        w.secs_per_run,
        w.window
    ));
    t.note(if w.pinned {
        "driver threads and the peer on CPU 0 (the driver sleeps while the peer answers), worker on CPU 1."
    } else {
        "NOT pinned (fewer than 2 CPUs)."
    });
    t.note(w.seed.note(2));
    t.note(w.seed_latency.note(2));
    t
}

fn run(o: &Options, progress: Progress<'_>) -> Result<Outcome, BenchError> {
    let r = measure(o, progress)?;
    Outcome::new(tables(&r), &r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4b's counts close: every window sent is acked, by the peer and at the driver, and
    /// every frame reaches the peer.
    #[test]
    fn every_window_is_acked_and_every_frame_reaches_the_peer() {
        for s in &WINDOW_SETTINGS[..2] {
            let r = window_one(*s, 0.1, false).unwrap();
            assert!(r.windows > 0, "{}: {r:?}", s.label);
            assert_eq!((r.acks, r.lost), (r.windows, 0), "{}: {r:?}", s.label);
            assert_eq!(r.frames, r.windows * WINDOW as u64, "{}", s.label);
            assert_eq!(r.device_tx_packets, r.frames, "{}", s.label);
            assert_eq!(r.peer.frames, r.frames, "{}", s.label);
            assert_eq!(r.peer.acks, r.windows, "{}", s.label);
            assert_eq!(r.device_rx_packets, r.acks, "{}", s.label);
        }
    }
}
