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
//!
//! The parts: what a run is asked to do ([`GenConfig`] and its checks, in `options`), one
//! connection's threads (`session`), the run across connections (`run`, with `--reconnect`),
//! and what it reports ([`GenReport`], in `report`).

use crate::DriverError;
pub mod frames;
mod histogram;
mod options;
mod report;
mod run;
mod session;
pub mod tcp_sink;
pub mod window;
mod worker;

pub use histogram::Histogram;
pub use options::{GenConfig, GsoConfig, Mode, OnOff};
pub use report::{GenReport, GsoSummary, Latency, PairReport, Rates, Reconnect};
pub use run::{run, RECONNECT_FIRST, RECONNECT_MAX};

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
