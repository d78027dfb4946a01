//! `virtnet gen`: a traffic generator on our driver, to measure any vhost-user-net backend
//! (ours, DPDK's vhost PMD).
//!
//! One thread per queue pair runs one of five modes: `txonly` (send as fast as the device
//! takes frames), `rxonly` (receive what the device produces), `io` (both at once), `rr`
//! (round trips through an echoing backend, one frame in flight per pair, with a latency
//! histogram; with [`OnOff`], in bursts) and `window` (a windowed stream: a window of frames,
//! then wait for the host side's ack, [`window`]). Threads sleep on the call eventfds when
//! idle, NAPI-style, unless busy polling is asked for. Rates are sampled once a second from
//! the lock-free queue counters.
//!
//! With [`GsoConfig`] (`--gso tcp|udp`), txonly sends TSO or USO super-frames ([`frames`]):
//! one frame of up to 64 KiB that the device cuts into MSS-sized segments, to measure a
//! backend's offload path without a guest. Rates count super-frames and their bytes.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::Release};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use vnet::{feature, NetHdr};
use vring::Features;

use crate::counters::CountersSnapshot;
use crate::ctrl::{CtrlMode, CtrlSnapshot};
use crate::dim::{DimCounters, DimDispatch, DimSnapshot, RxDim, DEFAULT_PROFILE, RX_PROFILES};
use crate::offload::TxOffloads;
use crate::{DriverConfig, DriverError, NetDriver, TxPolicy, DEFAULT_FEATURES};
pub mod frames;
mod histogram;
pub mod tcp_sink;
pub mod window;
mod worker;

use frames::{Flow, Proto};
pub use histogram::Histogram;
use worker::{worker, WorkerResult};

/// What each pair's thread does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    TxOnly,
    RxOnly,
    Io,
    Rr,
    /// A window of frames, then wait for the host side's ack ([`window`]).
    Window,
    /// The receiving end of TCP connections from the host side ([`tcp_sink`]).
    #[serde(rename = "tcp-sink")]
    TcpSink,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "txonly" => Ok(Mode::TxOnly),
            "rxonly" => Ok(Mode::RxOnly),
            "io" => Ok(Mode::Io),
            "rr" => Ok(Mode::Rr),
            "window" => Ok(Mode::Window),
            "tcp-sink" => Ok(Mode::TcpSink),
            _ => Err(format!(
                "unknown mode {s:?} (txonly, rxonly, io, rr, window or tcp-sink)"
            )),
        }
    }
}

/// Super-frames to send (`--gso`): which segmentation offload, and the segment size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GsoConfig {
    /// TCP (TSO: HOST_TSO4, or HOST_TSO6 with `ipv6`) or UDP (USO: HOST_USO).
    pub proto: Proto,
    /// Payload bytes per segment; None: what fills the device's MTU (1500 when it gives
    /// none): 1448 for TCP over IPv4, with the timestamp option, as Linux sends.
    pub mss: Option<u16>,
    pub ipv6: bool,
}

/// Traffic in bursts (`--on-off`, rr): requests go for `on`, then none for `off`, over and
/// over from when the pair's traffic starts (afresh after a reconnect), as an application that
/// talks in spurts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct OnOff {
    #[serde(serialize_with = "as_secs")]
    pub on: Duration,
    #[serde(serialize_with = "as_secs")]
    pub off: Duration,
}

impl OnOff {
    /// At `t` into the run: None while on; while off, how long until the next on phase.
    pub fn off_for(&self, t: Duration) -> Option<Duration> {
        let period = (self.on + self.off).as_nanos();
        if self.off.is_zero() || period == 0 {
            return None;
        }
        let phase = t.as_nanos() % period;
        (phase >= self.on.as_nanos()).then(|| Duration::from_nanos((period - phase) as u64))
    }
}

/// `ON:OFF` in milliseconds, as `2:8`.
impl std::str::FromStr for OnOff {
    type Err = String;
    fn from_str(s: &str) -> Result<OnOff, String> {
        let ms = |v: &str| {
            v.trim()
                .parse::<f64>()
                .ok()
                .and_then(|m| Duration::try_from_secs_f64(m / 1e3).ok())
        };
        match s.split_once(':').map(|(a, b)| (ms(a), ms(b))) {
            Some((Some(on), Some(off))) if !on.is_zero() => Ok(OnOff { on, off }),
            _ => Err(format!(
                "on/off {s:?}: ON:OFF in milliseconds, ON above zero (e.g. 2:8)"
            )),
        }
    }
}

/// A run's parameters.
#[derive(Clone, Debug, Serialize)]
pub struct GenConfig {
    pub socket: PathBuf,
    pub mode: Mode,
    /// Frame size in bytes (Ethernet header included, no FCS), as DPDK's --txpkts; with `gso`
    /// the super-frame's size.
    pub size: usize,
    /// Send TSO or USO super-frames (txonly only).
    pub gso: Option<GsoConfig>,
    pub queues: u16,
    #[serde(serialize_with = "as_secs")]
    pub duration: Duration,
    /// Spin on the rings instead of sleeping on the call eventfds.
    pub busy_poll: bool,
    /// Without `busy_poll`: before each sleep on a call eventfd, poll the ring for up to this
    /// long (zero: sleep at once). A sleep costs a wake-up (32-38 us across the CPUs of the
    /// AMD EPYC of docs/PERFORMANCE.md) during which a fast device may run dry.
    #[serde(serialize_with = "as_secs")]
    pub spin: Duration,
    /// Ask for VIRTIO_F_IN_ORDER (taken when the device offers it); off for A/B runs.
    pub in_order: bool,
    pub ctrl: CtrlMode,
    pub dim: bool,
    pub queue_size: u16,
    /// Frames per transmit burst (one kick decision per burst).
    pub burst: usize,
    /// Window mode: frames per window (at most `queue_size`).
    pub window: usize,
    /// rr: send in bursts rather than all the time.
    pub on_off: Option<OnOff>,
    /// Publish the avail index once per burst (tx) or refill (rx) rather than per buffer.
    #[cfg(feature = "experiments")]
    pub avail_per_burst: bool,
    /// How long to keep retrying the connection.
    #[serde(serialize_with = "as_secs")]
    pub connect_wait: Duration,
    /// When the backend closes the connection, connect again for up to this long after the
    /// loss (backing off from [`RECONNECT_FIRST`] to [`RECONNECT_MAX`] between attempts) and
    /// resume; None: the run ends with [`GenError::ConnectionLost`].
    #[serde(serialize_with = "as_opt_secs")]
    pub reconnect: Option<Duration>,
}

fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn as_opt_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            socket: PathBuf::new(),
            mode: Mode::TxOnly,
            size: 64,
            gso: None,
            queues: 1,
            duration: Duration::from_secs(10),
            busy_poll: false,
            spin: Duration::ZERO,
            in_order: true,
            ctrl: CtrlMode::Irq,
            dim: false,
            queue_size: 256,
            burst: 32,
            window: 64,
            on_off: None,
            #[cfg(feature = "experiments")]
            avail_per_burst: false,
            connect_wait: Duration::from_secs(2),
            reconnect: None,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error("{0}")]
    Driver(#[from] DriverError),
    #[error("invalid options: {0}")]
    Options(String),
    #[error("the device lacks {feature}, needed for {what}")]
    Negotiation {
        feature: &'static str,
        what: &'static str,
    },
    #[error("queue pair {pair}: {source}")]
    Queue { pair: u16, source: DriverError },
    #[error("the device broke a queue: {reason}")]
    Broken { reason: String },
    #[error("cannot start a thread: {0}")]
    Thread(String),
    #[error("the backend closed the connection {after_s:.1} s into the run")]
    ConnectionLost { after_s: f64 },
    #[error(
        "the backend closed the connection {lost_at_s:.1} s into the run, and {attempts} \
         attempts to connect again within {limit_s:.1} s failed; the last: {last}"
    )]
    ReconnectFailed {
        lost_at_s: f64,
        attempts: u32,
        limit_s: f64,
        last: String,
    },
}

/// Rates over one interval (per second) or over the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Seconds since the start, at the end of the interval.
    pub t_s: f64,
    pub tx_mpps: f64,
    pub rx_mpps: f64,
    pub tx_gbps: f64,
    pub rx_gbps: f64,
    /// Kicks (tx and rx refill) and interrupts (call eventfd reads) per packet moved.
    pub kicks_per_packet: f64,
    pub interrupts_per_packet: f64,
    /// rr: round trips per second.
    pub rtt_per_s: f64,
}

impl Rates {
    fn between(a: &Totals, b: &Totals, secs: f64, t_s: f64) -> Rates {
        let tx = b.tx.since(&a.tx);
        let rx = b.rx.since(&a.rx);
        let pkts = (tx.packets + rx.packets).max(1) as f64;
        let per_s = |n: u64| n as f64 / secs.max(1e-9);
        Rates {
            t_s,
            tx_mpps: per_s(tx.packets) / 1e6,
            rx_mpps: per_s(rx.packets) / 1e6,
            tx_gbps: per_s(tx.bytes) * 8.0 / 1e9,
            rx_gbps: per_s(rx.bytes) * 8.0 / 1e9,
            kicks_per_packet: (tx.kicks + rx.kicks) as f64 / pkts,
            interrupts_per_packet: (tx.interrupts + rx.interrupts) as f64 / pkts,
            rtt_per_s: per_s(b.round_trips - a.round_trips),
        }
    }
}

/// Counters summed over pairs.
#[derive(Clone, Debug, Default)]
struct Totals {
    tx: CountersSnapshot,
    rx: CountersSnapshot,
    round_trips: u64,
}

/// Per-pair results.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PairReport {
    pub pair: u16,
    /// Summed over every connection of the run (see `GenConfig::reconnect`).
    pub tx: CountersSnapshot,
    pub rx: CountersSnapshot,
    /// The last connection's DIM.
    pub dim: Option<DimSnapshot>,
    /// CPU time of the pair's thread.
    pub cpu_s: f64,
    /// rr: answers received; window: acks received.
    pub round_trips: u64,
    /// Window: windows sent.
    pub windows: u64,
    /// tcp-sink: what the sink saw and answered.
    pub tcp: tcp_sink::SinkCounts,
    /// rr: frames that never came back within the loss timeout; window: windows that were not
    /// acknowledged within it.
    pub lost: u64,
}

/// Round-trip latency percentiles, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub samples: u64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

/// A whole run.
#[derive(Clone, Debug, Serialize)]
pub struct GenReport {
    pub config: GenConfig,
    pub features: String,
    pub pairs: u16,
    /// `--gso`: the super-frames sent.
    pub gso: Option<GsoSummary>,
    pub seconds: Vec<Rates>,
    pub summary: Rates,
    pub elapsed_s: f64,
    pub per_pair: Vec<PairReport>,
    pub latency: Option<Latency>,
    /// The last connection's control queue.
    pub ctrl: Option<CtrlSnapshot>,
    /// CPU time of the generator threads over the run, in percent of one CPU.
    pub cpu_pct: f64,
    /// CPU time spent on control commands outside the generator threads: the interrupt-mode
    /// reaper, or the polling-mode DIM worker, in seconds.
    pub ctrl_cpu_s: f64,
    /// Connections lost and made again (`reconnect`), in order.
    pub reconnects: Vec<Reconnect>,
}

/// What the super-frames of a `--gso` run were.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GsoSummary {
    pub proto: Proto,
    pub ipv6: bool,
    /// Payload bytes per segment (the header's gso_size).
    pub mss: u16,
    /// Ethernet, IP and L4 header bytes (the header's hdr_len).
    pub hdr_len: u16,
    /// Segments each super-frame makes.
    pub segments: u32,
}

/// The features to ask for: the defaults (without EVENT_IDX when busy polling, without
/// IN_ORDER when told), and the offloads that `gso` needs.
fn wanted_features(config: &GenConfig) -> Features {
    // A busy-polling driver needs no notifications: without EVENT_IDX the device skips the
    // event-index bookkeeping (as with DPDK's virtio-user, which never offers it).
    let mut f = if config.busy_poll {
        DEFAULT_FEATURES.difference(Features::RING_EVENT_IDX)
    } else {
        DEFAULT_FEATURES
    };
    if !config.in_order {
        f = f.difference(Features::IN_ORDER);
    }
    if config.mode == Mode::TcpSink {
        // The host side's super-frames come whole (the sink reads no checksum).
        f = f | feature::GUEST_CSUM | feature::GUEST_TSO4;
    }
    if let Some(g) = config.gso {
        f = f | feature::CSUM;
        f = f | match (g.proto, g.ipv6) {
            (Proto::Tcp, false) => feature::HOST_TSO4,
            (Proto::Tcp, true) => feature::HOST_TSO6,
            (Proto::Udp, _) => feature::HOST_USO,
        };
    }
    f
}

/// Checks the size and mode before connecting.
fn check_options(config: &GenConfig) -> Result<(), GenError> {
    if config.on_off.is_some() && config.mode != Mode::Rr {
        return Err(GenError::Options("--on-off is for --mode rr".into()));
    }
    if config.mode == Mode::Window && !(1..=config.queue_size as usize).contains(&config.window) {
        return Err(GenError::Options(format!(
            "--window {} is outside 1..={} (the queue size)",
            config.window, config.queue_size
        )));
    }
    match config.gso {
        None if config.size < 60 || config.size > 1514 + 4 => Err(GenError::Options(format!(
            "--size {} is outside 60..=1518",
            config.size
        ))),
        None => Ok(()),
        Some(_) if config.mode != Mode::TxOnly => Err(GenError::Options(
            "--gso sends super-frames in --mode txonly only".into(),
        )),
        // The segment count is checked once the MTU is known (`tx_frame`).
        Some(g) => {
            let flow = Flow::benchmark([0; 6], [0; 6], g.proto, g.ipv6);
            if config.size > flow.max_len() {
                return Err(GenError::Options(format!(
                    "--size {} is larger than the {} bytes the IP length fields allow",
                    config.size,
                    flow.max_len()
                )));
            }
            Ok(())
        }
    }
}

/// The frame every transmit sends and its header: a UDP frame with no offload, or with
/// `gso` a super-frame whose segments fill `mtu` (or carry `gso.mss` payload bytes).
fn tx_frame(
    config: &GenConfig,
    dst: [u8; 6],
    src: [u8; 6],
    offloads: TxOffloads,
    mtu: u16,
) -> Result<(Vec<u8>, NetHdr, Option<GsoSummary>), GenError> {
    let Some(g) = config.gso else {
        return Ok((
            frames::udp4_frame(config.size, dst, src, &[]),
            NetHdr::default(),
            None,
        ));
    };
    let flow = Flow::benchmark(dst, src, g.proto, g.ipv6);
    let mss = g.mss.unwrap_or_else(|| flow.mss_for_mtu(mtu));
    let (frame, hdr) = flow.gso_frame(config.size, mss, offloads, |_| 0)?;
    let summary = GsoSummary {
        proto: g.proto,
        ipv6: g.ipv6,
        mss,
        hdr_len: hdr.hdr_len,
        segments: (config.size - flow.hdr_len()).div_ceil(mss as usize) as u32,
    };
    Ok((frame, hdr, Some(summary)))
}

/// `--reconnect`'s back-off: the first attempt this long after the loss, the wait between
/// attempts doubling up to [`RECONNECT_MAX`]. A refused connect to a unix socket costs next
/// to nothing, so the cap is low: the gap is at most that much longer than the outage.
pub const RECONNECT_FIRST: Duration = Duration::from_millis(100);
pub const RECONNECT_MAX: Duration = Duration::from_millis(500);

/// One lost connection (`--reconnect`) and how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Reconnect {
    /// Seconds from the start to when the loss was seen.
    pub lost_at_s: f64,
    /// Seconds from the loss until the queues ran again on a new connection; None if the
    /// run ended first.
    pub gap_s: Option<f64>,
    /// Connection attempts, the one that succeeded included.
    pub attempts: u32,
    /// tx frames in flight on the lost connection, abandoned with its rings.
    pub abandoned: u64,
}

/// The settings of the driver `run` connects with.
fn driver_config(config: &GenConfig) -> DriverConfig {
    let use_ctrl = config.queues > 1 || config.dim;
    DriverConfig {
        pairs: config.queues,
        queue_size: config.queue_size,
        features: wanted_features(config),
        ctrl: use_ctrl.then_some(config.ctrl),
        tx_buf_len: (config.size as u32 + 64).next_multiple_of(64).max(2048),
        connect_wait: config.connect_wait,
        tx: TxPolicy::default().with_busy_poll(config.busy_poll),
        #[cfg(feature = "experiments")]
        avail_per_burst: config.avail_per_burst,
        ..Default::default()
    }
}

type PairThread = std::thread::JoinHandle<Result<WorkerResult, DriverError>>;

/// One connection's part of a run: the connected device and a thread per pair.
struct Session {
    driver: NetDriver,
    threads: Vec<(u16, PairThread)>,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    dims: Vec<Arc<DimCounters>>,
    dim_dispatch: Option<DimDispatch>,
    reaper_cpu0: u64,
    gso: Option<GsoSummary>,
}

/// What one pair's thread counted on one connection.
struct PairEnd {
    rx: CountersSnapshot,
    tx: CountersSnapshot,
    dim: Option<DimSnapshot>,
    cpu_ns: u64,
    /// rr frames or windows lost, and windows sent.
    lost: u64,
    windows: u64,
    tcp: tcp_sink::SinkCounts,
}

/// What a session leaves when it ends.
struct SessionEnd {
    pairs: Vec<PairEnd>,
    histogram: Histogram,
    ctrl: Option<CtrlSnapshot>,
    ctrl_cpu_ns: u64,
    error: Option<GenError>,
}

impl Session {
    /// Sets the device up for `config` (DIM, the frame) and starts a thread per pair.
    fn start(
        mut driver: NetDriver,
        config: &GenConfig,
        round_trips: &[Arc<crate::counters::Counter>],
    ) -> Result<Session, GenError> {
        let features = driver.features();
        if config.dim && !features.contains(feature::VQ_NOTF_COAL) {
            return Err(GenError::Negotiation {
                feature: "VQ_NOTF_COAL",
                what: "--dim on",
            });
        }
        let mut pairs = driver.take_pairs();
        let mut dims = Vec::new();
        let mut dim_dispatch = None;
        if config.dim {
            let Some(ctrl) = driver.ctrl().cloned() else {
                return Err(GenError::Negotiation {
                    feature: "CTRL_VQ",
                    what: "--dim on",
                });
            };
            // Start every rx queue at DIM's default profile, so device and DIM agree.
            for p in &pairs {
                driver.set_vq_coalesce(p.rx.vq(), RX_PROFILES[DEFAULT_PROFILE])?;
            }
            let dispatch = DimDispatch::for_queue(&ctrl);
            dim_dispatch = Some(dispatch.clone());
            for p in pairs.iter_mut() {
                let dim = RxDim::new(p.rx.vq(), dispatch.clone(), DEFAULT_PROFILE);
                dims.push(dim.counters.clone());
                p.rx.attach_dim(dim);
            }
        }
        let dst = driver.mac().unwrap_or([0x02, 0, 0, 0, 0, 0x02]);
        // Frames go out from 02:00:00:00:00:01; the TCP sink answers as a guest would, from
        // the address the device gives (config space `mac`) where it gives one.
        let src = match (config.mode, driver.mac()) {
            (Mode::TcpSink, Some(mac)) => mac,
            _ => [0x02, 0, 0, 0, 0, 0x01],
        };
        let offloads = TxOffloads::from_features(features);
        let mtu = driver.mtu().unwrap_or(1500);
        let (frame, hdr, gso) = tx_frame(config, dst, src, offloads, mtu)?;
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let reaper_cpu0 = driver.ctrl().map_or(0, |c| c.reaper_cpu_ns());
        let mut threads = Vec::new();
        for (p, rt) in pairs.into_iter().zip(round_trips) {
            let (stop_t, lost_t) = (stop.clone(), lost.clone());
            let (rt, cfg, frame) = (rt.clone(), config.clone(), frame.clone());
            let pair = p.pair;
            let spawned = std::thread::Builder::new()
                .name(format!("gen-pair{pair}"))
                .spawn(move || worker(p, &cfg, frame, hdr, &stop_t, &lost_t, &rt));
            match spawned {
                Ok(t) => threads.push((pair, t)),
                Err(e) => {
                    stop.store(true, Relaxed);
                    for (_, t) in threads {
                        let _ = t.join();
                    }
                    return Err(GenError::Thread(e.to_string()));
                }
            }
        }
        Ok(Session {
            driver,
            threads,
            stop,
            lost,
            dims,
            dim_dispatch,
            reaper_cpu0,
            gso,
        })
    }

    /// (rx, tx) counters of each pair now.
    fn counters(&self) -> Vec<(CountersSnapshot, CountersSnapshot)> {
        let c = self.driver.counters();
        c.iter()
            .map(|(rx, tx)| (rx.snapshot(), tx.snapshot()))
            .collect()
    }

    fn any_thread_finished(&self) -> bool {
        self.threads.iter().any(|(_, t)| t.is_finished())
    }

    /// Stops the threads and collects what they counted. With `lost` the device is gone:
    /// the threads take their buffers back instead of draining them.
    fn finish(self, lost: bool) -> SessionEnd {
        self.lost.store(lost, Relaxed);
        // Release: a thread that sees the stop sees `lost` too (its fence before reading it).
        self.stop.store(true, Release);
        let mut end = SessionEnd {
            pairs: Vec::new(),
            histogram: Histogram::default(),
            ctrl: None,
            ctrl_cpu_ns: 0,
            error: None,
        };
        let mut results = Vec::new();
        for (pair, t) in self.threads {
            match t.join() {
                Ok(Ok(r)) => results.push((pair, r)),
                Ok(Err(e)) => {
                    end.error.get_or_insert(GenError::Queue { pair, source: e });
                }
                Err(_) => {
                    let e = GenError::Thread(format!("pair {pair}'s thread panicked"));
                    end.error.get_or_insert(e);
                }
            }
        }
        // After the joins: the counters include the drain (or what was abandoned).
        let counters = self.driver.counters();
        for (pair, r) in results {
            end.histogram.merge(&r.histogram);
            let (rx, tx) = &counters[pair as usize];
            let dim = self.dims.get(pair as usize).map(|d| d.snapshot());
            end.pairs.push(PairEnd {
                rx: rx.snapshot(),
                tx: tx.snapshot(),
                dim,
                cpu_ns: r.cpu_ns,
                lost: r.lost,
                windows: r.windows,
                tcp: r.tcp,
            });
        }
        end.ctrl = self.driver.ctrl().map(|c| c.counters());
        end.ctrl_cpu_ns = self
            .driver
            .ctrl()
            .map_or(0, |c| c.reaper_cpu_ns())
            .saturating_sub(self.reaper_cpu0)
            + self.dim_dispatch.map_or(0, |d| d.worker_cpu_ns());
        end
    }
}

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

impl GenReport {
    /// The human-readable summary.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let s = &self.summary;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "summary: {:?} {} B, {} pair(s), {:.1} s{}{}",
            self.config.mode,
            self.config.size,
            self.pairs,
            self.elapsed_s,
            if self.config.busy_poll {
                ", busy-poll"
            } else {
                ""
            },
            if self.config.dim { ", DIM on" } else { "" },
        );
        let _ = writeln!(
            o,
            "  tx {:>8.3} Mpps {:>7.3} Gbit/s   rx {:>8.3} Mpps {:>7.3} Gbit/s",
            s.tx_mpps, s.tx_gbps, s.rx_mpps, s.rx_gbps
        );
        if let Some(g) = &self.gso {
            let _ = writeln!(
                o,
                "  gso {}{}: {} segments of {} B per frame ({} B of headers), {:.3} M segments/s",
                match g.proto {
                    Proto::Tcp => "tcp",
                    Proto::Udp => "udp",
                },
                if g.ipv6 { " ipv6" } else { "" },
                g.segments,
                g.mss,
                g.hdr_len,
                s.tx_mpps * g.segments as f64
            );
        }
        let _ = writeln!(
            o,
            "  kicks/packet {:.4}   interrupts/packet {:.4}   cpu {:.0}%",
            s.kicks_per_packet, s.interrupts_per_packet, self.cpu_pct
        );
        for p in &self.per_pair {
            let _ = write!(
                o,
                "  pair {}: tx {} pkts ({} stops, {} kicks, {} irqs)  rx {} pkts ({} irqs, {} dropped)",
                p.pair, p.tx.packets, p.tx.stops, p.tx.kicks, p.tx.interrupts, p.rx.packets,
                p.rx.interrupts, p.rx.dropped
            );
            if let Some(d) = &p.dim {
                let _ = write!(
                    o,
                    "  dim profile {} ({} changes, {} failed)",
                    d.profile, d.applied, d.failed
                );
            }
            match self.config.mode {
                Mode::Rr => {
                    let _ = write!(o, "  lost {}", p.lost);
                }
                Mode::Window => {
                    let _ = write!(
                        o,
                        "  windows {} of {} frames: {} acked, {} lost",
                        p.windows, self.config.window, p.round_trips, p.lost
                    );
                }
                Mode::TcpSink => {
                    let t = &p.tcp;
                    let _ = write!(
                        o,
                        "  tcp: {} connections, {} segments, {} bytes in order, {} out of order, \
                         {} replies, {} frames ignored",
                        t.connections, t.segments, t.bytes, t.out_of_order, t.replies, t.ignored
                    );
                }
                _ => {}
            }
            let _ = writeln!(o);
        }
        if let Some(l) = &self.latency {
            let what = match self.config.mode {
                Mode::Window => "windows (first frame to ack)",
                _ => "round trips",
            };
            let _ = writeln!(
                o,
                "  {what} {} ({:.0}/s): min {:.1} us  p50 {:.1} us  p99 {:.1} us  p99.9 {:.1} us  max {:.1} us",
                l.samples, s.rtt_per_s, l.min_us, l.p50_us, l.p99_us, l.p999_us, l.max_us
            );
        }
        if !self.reconnects.is_empty() {
            let each: Vec<String> = self
                .reconnects
                .iter()
                .map(|r| {
                    let back = r.gap_s.map_or("not back by the end".into(), |g| {
                        format!("back after {g:.3} s")
                    });
                    format!(
                        "lost at {:.1} s, {back} ({} attempts, {} tx frames abandoned)",
                        r.lost_at_s, r.attempts, r.abandoned
                    )
                })
                .collect();
            let _ = writeln!(
                o,
                "  reconnects {}: {}",
                self.reconnects.len(),
                each.join("; ")
            );
        }
        if let Some(c) = &self.ctrl {
            let _ = writeln!(
                o,
                "  ctrl ({:?}): {} commands, {} interrupts, {} timeouts, {:.3} s CPU outside the pair threads",
                self.config.ctrl, c.completed, c.interrupts, c.timeouts, self.ctrl_cpu_s
            );
        }
        o
    }
}

impl Rates {
    /// One progress line.
    pub fn render(&self) -> String {
        format!(
            "{:>6.1} s  tx {:>7.3} Mpps {:>6.2} Gbit/s  rx {:>7.3} Mpps {:>6.2} Gbit/s  kicks/pkt {:.4}  irqs/pkt {:.4}{}",
            self.t_s,
            self.tx_mpps,
            self.tx_gbps,
            self.rx_mpps,
            self.rx_gbps,
            self.kicks_per_packet,
            self.interrupts_per_packet,
            if self.rtt_per_s > 0.0 {
                format!("  rtt/s {:.0}", self.rtt_per_s)
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!("rr".parse::<Mode>(), Ok(Mode::Rr));
        assert_eq!("window".parse::<Mode>(), Ok(Mode::Window));
        assert_eq!("tcp-sink".parse::<Mode>(), Ok(Mode::TcpSink));
        assert!("bogus".parse::<Mode>().is_err());
    }

    #[test]
    fn on_off_is_on_then_off_from_the_start_over_and_over() {
        let ms = Duration::from_millis;
        let s: OnOff = "2:8".parse().unwrap();
        assert_eq!((s.on, s.off), (ms(2), ms(8)));
        assert_eq!(s.off_for(ms(0)), None);
        assert_eq!(s.off_for(Duration::from_micros(1999)), None);
        assert_eq!(s.off_for(ms(2)), Some(ms(8)));
        assert_eq!(s.off_for(ms(7)), Some(ms(3)));
        assert_eq!(s.off_for(ms(10)), None, "the next period");
        assert_eq!(s.off_for(ms(23)), Some(ms(7)));
        let always: OnOff = "2:0".parse().unwrap();
        assert_eq!(always.off_for(ms(3)), None);
        assert_eq!(
            "0.5:1.5".parse::<OnOff>().unwrap().on,
            Duration::from_micros(500)
        );
        for bad in ["2", "0:8", "a:b", "-1:2", "2:-1"] {
            assert!(bad.parse::<OnOff>().is_err(), "{bad}");
        }
    }

    #[test]
    fn on_off_and_window_are_checked_before_connecting() {
        let bursts = GenConfig {
            on_off: Some("2:8".parse().unwrap()),
            ..Default::default()
        };
        assert!(check_options(&bursts).is_err(), "txonly in bursts");
        assert!(check_options(&GenConfig {
            mode: Mode::Rr,
            ..bursts
        })
        .is_ok());
        let window = |w| GenConfig {
            mode: Mode::Window,
            size: 1500,
            window: w,
            ..Default::default()
        };
        assert!(check_options(&window(64)).is_ok());
        assert!(check_options(&window(256)).is_ok());
        assert!(check_options(&window(0)).is_err());
        assert!(
            check_options(&window(257)).is_err(),
            "more than the queue holds"
        );
    }

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
