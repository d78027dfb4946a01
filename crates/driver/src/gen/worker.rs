//! One queue pair's thread of `virtnet gen`: the loop of each mode.

use std::sync::atomic::{fence, AtomicBool, Ordering::Acquire, Ordering::Relaxed};
use std::time::{Duration, Instant};

use vnet::NetHdr;

use super::tcp_sink::{SinkCounts, TcpSink};
use super::{window, GenConfig, Histogram, Mode};
use crate::{Count, DriverError, Frames, PollMode, QueuePair};

/// What a pair's thread hands back.
pub(super) struct WorkerResult {
    pub histogram: Histogram,
    pub cpu_ns: u64,
    pub lost: u64,
    /// Window mode: windows sent.
    pub windows: u64,
    /// tcp-sink mode: what the sink counted.
    pub tcp: SinkCounts,
}

/// How long an rr frame may take before it counts as lost.
const RR_LOSS_TIMEOUT: Duration = Duration::from_millis(200);
/// How long a window's ack may take before the window counts as lost: longer than an rr
/// frame's, a window being many frames.
const WINDOW_LOSS_TIMEOUT: Duration = Duration::from_secs(1);
/// Frames per rx poll round: the ring is refilled after each round, so a round much shorter
/// than the ring keeps the device supplied with buffers (Linux's NAPI weight is 64; DPDK
/// refills every 32).
const RX_BUDGET: usize = 64;

/// How long a sleeping thread waits before re-checking the stop flag.
const IDLE_WAIT_MS: i32 = 10;

/// One pair's thread, sending `frame` behind `hdr` (tx modes), until `stop`. With `lost` set
/// as well the device is gone: what it holds is taken back here instead of drained.
pub(super) fn worker(
    mut p: QueuePair,
    cfg: &GenConfig,
    frame: Vec<u8>,
    hdr: NetHdr,
    stop: &AtomicBool,
    lost: &AtomicBool,
    round_trips: &crate::counters::Counter,
) -> Result<WorkerResult, DriverError> {
    let mut histogram = Histogram::default();
    let mut lost_frames = 0;
    let mut windows = 0;
    let mut tcp = SinkCounts::default();
    let started = Instant::now();
    let mode = if cfg.busy_poll {
        PollMode::Busy
    } else {
        PollMode::Napi
    };
    let rx_poll = move |rx: &mut crate::RxQueue, budget: usize| rx.poll(budget, mode, Count);
    match cfg.mode {
        Mode::TxOnly => {
            while !stop.load(Relaxed) {
                transmit_burst(&mut p, &frame, hdr, cfg.burst)?;
                if p.tx.is_stopped() {
                    wait_tx(&mut p, cfg)?;
                }
            }
        }
        Mode::RxOnly => {
            while !stop.load(Relaxed) {
                let n = rx_poll(&mut p.rx, RX_BUDGET)?;
                if n < RX_BUDGET && !cfg.busy_poll && !spin_rx(&mut p, cfg.spin)? {
                    p.rx.wait(IDLE_WAIT_MS);
                }
            }
        }
        Mode::Io => {
            use std::os::fd::AsRawFd;
            while !stop.load(Relaxed) {
                let sent = transmit_burst(&mut p, &frame, hdr, cfg.burst)?;
                let got = rx_poll(&mut p.rx, RX_BUDGET)?;
                if sent == 0 && got < RX_BUDGET && !cfg.busy_poll {
                    let fds = [p.rx.call_fd().as_raw_fd(), p.tx.call_fd().as_raw_fd()];
                    let ready = virtnet_sys::poll_readable(&fds, IDLE_WAIT_MS);
                    if ready & 1 != 0 {
                        p.rx.ack_interrupt();
                    }
                    if ready & 2 != 0 {
                        p.tx.ack_interrupt();
                        p.tx.reclaim(usize::MAX)?;
                    }
                }
            }
        }
        Mode::Rr => {
            let mut seq: u64 = 0;
            let mut frame = frame;
            'frames: while !stop.load(Relaxed) {
                if let Some(pause) = cfg.on_off.and_then(|s| s.off_for(started.elapsed())) {
                    // Between bursts: no traffic at all (re-checking the stop flag now and then).
                    std::thread::sleep(pause.min(Duration::from_millis(IDLE_WAIT_MS as u64)));
                    continue;
                }
                seq += 1;
                frame[42..50].copy_from_slice(&seq.to_le_bytes());
                while !p.tx.send(&frame, hdr)? {
                    // A device that stopped completing must not keep us past the stop.
                    if stop.load(Relaxed) {
                        break 'frames;
                    }
                    wait_tx(&mut p, cfg)?;
                }
                let sent_at = Instant::now();
                p.tx.flush();
                let deadline = sent_at + RR_LOSS_TIMEOUT;
                let mut back = false;
                while !back && !stop.load(Relaxed) {
                    let n = p.rx.poll(
                        64,
                        PollMode::Napi,
                        Frames(|f: &[u8]| {
                            if f.len() >= 50 && f[42..50] == seq.to_le_bytes() {
                                back = true;
                            }
                        }),
                    )?;
                    if back {
                        histogram.record(sent_at.elapsed().as_nanos() as u64);
                        round_trips.add(1);
                        break;
                    }
                    if Instant::now() >= deadline {
                        lost_frames += 1;
                        break;
                    }
                    if n == 0 && !cfg.busy_poll {
                        p.rx.wait(1);
                    }
                }
            }
        }
        Mode::Window => {
            let mut frame = frame;
            let mut number: u64 = 0;
            'windows: while !stop.load(Relaxed) {
                number += 1;
                window::stamp(&mut frame, number);
                let sent_at = Instant::now();
                let mut sent = 0;
                while sent < cfg.window {
                    if p.tx.send(&frame, hdr)? {
                        sent += 1;
                        if sent % cfg.burst.max(1) == 0 {
                            p.tx.flush();
                        }
                        continue;
                    }
                    p.tx.flush();
                    // A device that stopped completing must not keep us past the stop; a
                    // window cut short is not counted.
                    if stop.load(Relaxed) {
                        break 'windows;
                    }
                    wait_tx(&mut p, cfg)?;
                }
                p.tx.flush();
                windows += 1;
                // Wait for the ack, even past the stop (up to the loss timeout), so that every
                // window sent is either acked or lost; not once the device is gone.
                let deadline = sent_at + WINDOW_LOSS_TIMEOUT;
                let mut acked = false;
                loop {
                    let n = p.rx.poll(
                        RX_BUDGET,
                        mode,
                        Frames(|f: &[u8]| acked |= window::acked(f) == Some(number)),
                    )?;
                    if acked {
                        histogram.record(sent_at.elapsed().as_nanos() as u64);
                        round_trips.add(1);
                        break;
                    }
                    if lost.load(Relaxed) {
                        break 'windows;
                    }
                    if Instant::now() >= deadline {
                        lost_frames += 1;
                        break;
                    }
                    if n == 0 && !cfg.busy_poll {
                        p.rx.wait(1);
                    }
                }
            }
        }
        Mode::TcpSink => {
            // Our address is the one our frames come from.
            let mac = frame[6..12].try_into().expect("an Ethernet header");
            let mut sink = TcpSink::new(mac);
            let mut replies = Vec::new();
            'sink: while !stop.load(Relaxed) {
                let n =
                    p.rx.poll(RX_BUDGET, mode, Frames(|f: &[u8]| sink.on_frame(f)))?;
                sink.take_replies(&mut replies);
                for r in replies.drain(..) {
                    while !p.tx.send(&r, NetHdr::default())? {
                        if stop.load(Relaxed) {
                            break 'sink;
                        }
                        wait_tx(&mut p, cfg)?;
                    }
                }
                p.tx.flush();
                if n < RX_BUDGET && !cfg.busy_poll && !spin_rx(&mut p, cfg.spin)? {
                    p.rx.wait(IDLE_WAIT_MS);
                }
            }
            tcp = sink.counts();
        }
    }
    // Pairs with the Release store of the stop flag this thread saw: `lost` was set before.
    fence(Acquire);
    if lost.load(Relaxed) {
        // What the device completed or filled before it went is in our memory: take it, so
        // that only frames it never finished count as abandoned. Nobody will complete or fill
        // the rest: the next connection starts on fresh rings.
        p.tx.reclaim(usize::MAX)?;
        if cfg.mode != Mode::TxOnly {
            while rx_poll(&mut p.rx, RX_BUDGET)? == RX_BUDGET {}
        }
        p.tx.abandon();
        p.rx.abandon();
        return Ok(WorkerResult {
            histogram,
            cpu_ns: virtnet_sys::thread_cpu_ns(),
            lost: lost_frames,
            windows,
            tcp,
        });
    }
    // Let the device finish what it took, so our counters and the peer's agree.
    p.tx.drain(Duration::from_secs(1))?;
    if cfg.mode != Mode::TxOnly {
        let idle_until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < idle_until {
            if rx_poll(&mut p.rx, RX_BUDGET)? == 0 {
                if cfg.busy_poll {
                    std::thread::sleep(Duration::from_millis(1));
                } else {
                    p.rx.wait(2);
                }
            }
        }
    }
    Ok(WorkerResult {
        histogram,
        cpu_ns: virtnet_sys::thread_cpu_ns(),
        lost: lost_frames,
        windows,
        tcp,
    })
}

/// Sends up to `burst` copies of `frame` behind `hdr`; returns how many went.
fn transmit_burst(
    p: &mut QueuePair,
    frame: &[u8],
    hdr: NetHdr,
    burst: usize,
) -> Result<usize, DriverError> {
    let mut n = 0;
    // The frame never changes: tag it, so buffers that already hold it are not rewritten.
    while n < burst && p.tx.send_tagged(frame, hdr, 1)? {
        n += 1;
    }
    p.tx.flush();
    Ok(n)
}

/// Waits until the stopped tx queue has room: spinning on reclaim, or asleep on the
/// delayed tx interrupt (after reclaiming for up to `cfg.spin`).
fn wait_tx(p: &mut QueuePair, cfg: &GenConfig) -> Result<(), DriverError> {
    if cfg.busy_poll {
        p.tx.reclaim(usize::MAX)?;
        return Ok(());
    }
    let until = Instant::now() + cfg.spin;
    while p.tx.is_stopped() && Instant::now() < until {
        p.tx.reclaim(usize::MAX)?;
    }
    p.tx.wait_wake(IDLE_WAIT_MS)?;
    Ok(())
}

/// Before an rx sleep (callbacks on, the last poll short of its budget): polls with
/// callbacks off for up to `spin`; returns whether frames came, else leaves callbacks on
/// (after a last re-checking poll) for the sleep.
fn spin_rx(p: &mut QueuePair, spin: Duration) -> Result<bool, DriverError> {
    if spin.is_zero() {
        return Ok(false);
    }
    let until = Instant::now() + spin;
    while Instant::now() < until {
        if p.rx.poll(RX_BUDGET, PollMode::Busy, Count)? > 0 {
            return Ok(true);
        }
    }
    Ok(p.rx.poll(RX_BUDGET, PollMode::Napi, Count)? > 0)
}
