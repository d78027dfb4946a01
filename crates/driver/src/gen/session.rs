//! One connection of a `virtnet gen` run: the device set up for the run (DIM, the frame to
//! send), a thread per queue pair, and what they counted when they stop.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::Release};
use std::sync::Arc;

use vnet::{feature, NetHdr};

use super::frames::{self, Flow};
use super::worker::{worker, WorkerResult};
use super::{tcp_sink, GenConfig, GenError, GsoSummary, Histogram, Mode};
use crate::counters::CountersSnapshot;
use crate::ctrl::CtrlSnapshot;
use crate::dim::{DimCounters, DimDispatch, DimSnapshot, RxDim, DEFAULT_PROFILE, RX_PROFILES};
use crate::offload::TxOffloads;
use crate::{DriverError, NetDriver};

/// The frame every transmit sends and its header: a UDP frame with no offload, or with
/// `gso` a super-frame whose segments fill `mtu` (or carry `gso.mss` payload bytes).
fn tx_frame(
    config: &GenConfig,
    dst: [u8; 6],
    src: [u8; 6],
    offloads: TxOffloads,
    mtu: u16,
) -> Result<(Vec<u8>, NetHdr, Option<GsoSummary>), GenError> {
    // In rxonly, `gso` says which super-frames to take whole: nothing is sent.
    let Some(g) = config.gso.filter(|_| config.mode == Mode::TxOnly) else {
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

type PairThread = std::thread::JoinHandle<Result<WorkerResult, DriverError>>;

/// One connection's part of a run: the connected device and a thread per pair.
pub(super) struct Session {
    pub driver: NetDriver,
    threads: Vec<(u16, PairThread)>,
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    dims: Vec<Arc<DimCounters>>,
    dim_dispatch: Option<DimDispatch>,
    reaper_cpu0: u64,
    pub gso: Option<GsoSummary>,
}

/// What one pair's thread counted on one connection.
pub(super) struct PairEnd {
    pub rx: CountersSnapshot,
    pub tx: CountersSnapshot,
    pub dim: Option<DimSnapshot>,
    pub cpu_ns: u64,
    /// rr frames or windows lost, and windows sent.
    pub lost: u64,
    pub windows: u64,
    pub tcp: tcp_sink::SinkCounts,
}

/// What a session leaves when it ends.
pub(super) struct SessionEnd {
    pub pairs: Vec<PairEnd>,
    pub histogram: Histogram,
    pub ctrl: Option<CtrlSnapshot>,
    pub ctrl_cpu_ns: u64,
    pub error: Option<GenError>,
}

impl Session {
    /// Sets the device up for `config` (DIM, the frame) and starts a thread per pair.
    pub(super) fn start(
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
        let dst = config
            .dst_mac
            .unwrap_or_else(|| driver.mac().unwrap_or([0x02, 0, 0, 0, 0, 0x02]));
        // Frames go out from 02:00:00:00:00:01; the TCP sink answers as a guest would, from
        // the address the device gives (config space `mac`) where it gives one.
        let src = match (config.src_mac, config.mode, driver.mac()) {
            (Some(mac), _, _) => mac,
            (None, Mode::TcpSink, Some(mac)) => mac,
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
    pub(super) fn counters(&self) -> Vec<(CountersSnapshot, CountersSnapshot)> {
        let c = self.driver.counters();
        c.iter()
            .map(|(rx, tx)| (rx.snapshot(), tx.snapshot()))
            .collect()
    }

    pub(super) fn any_thread_finished(&self) -> bool {
        self.threads.iter().any(|(_, t)| t.is_finished())
    }

    /// Stops the threads and collects what they counted. With `lost` the device is gone:
    /// the threads take their buffers back instead of draining them.
    pub(super) fn finish(self, lost: bool) -> SessionEnd {
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
