//! What a `virtnet gen` run reports: the rates of each second and of the whole run, each
//! pair's counters, the latency percentiles, the super-frames sent and the connections lost,
//! and their rendering as text.

use serde::Serialize;

use super::frames::Proto;
use super::{tcp_sink, GenConfig, Mode};
use crate::counters::CountersSnapshot;
use crate::ctrl::CtrlSnapshot;
use crate::dim::DimSnapshot;

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
    pub(super) fn between(a: &Totals, b: &Totals, secs: f64, t_s: f64) -> Rates {
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
pub(super) struct Totals {
    pub tx: CountersSnapshot,
    pub rx: CountersSnapshot,
    pub round_trips: u64,
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
