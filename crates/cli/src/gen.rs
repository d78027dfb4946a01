//! `virtnet gen`: the traffic generator on our driver ([`virtnet_driver::gen`]), against any
//! vhost-user-net backend.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use virtnet_driver::gen::frames::Proto;
use virtnet_driver::gen::{self, GenConfig, GsoConfig, Mode, OnOff};
use virtnet_driver::CtrlMode;

#[derive(Debug, Args)]
pub struct GenArgs {
    /// The backend's vhost-user socket.
    #[arg(long)]
    socket: PathBuf,
    /// txonly, rxonly, io (both at once), rr (round trips through an echoing backend),
    /// window (a window of frames, then wait for the host side's ack before the next: a
    /// backend whose host side acknowledges, as `virtnet bench` experiment 4b's peer does) or
    /// tcp-sink (the receiving end of TCP connections to 198.18.0.1 from the host side,
    /// acknowledging what arrives in order, from the device's MAC address and with no ARP; asks
    /// for GUEST_TSO4, so a TAP passes the sender's super-frames whole).
    #[arg(long, default_value = "txonly")]
    mode: Mode,
    /// With --mode window: frames per window, at most --queue-size.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// With --mode rr: send in bursts, ON milliseconds of round trips then OFF of silence,
    /// e.g. 2:8.
    #[arg(long, value_name = "ON:OFF")]
    on_off: Option<OnOff>,
    /// Frame size in bytes, Ethernet header included (no FCS): 60 to 1518; with --gso the
    /// super-frame's size, up to 65549 (65589 with --ipv6), e.g. 65000.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Send TSO (tcp) or USO (udp) super-frames of --size bytes for the device to segment
    /// (txonly): tcp needs CSUM and HOST_TSO4 (HOST_TSO6 with --ipv6), udp needs CSUM and
    /// HOST_USO; the run stops with an error when the device does not offer them. With
    /// rxonly: take such super-frames whole (asks for GUEST_CSUM and GUEST_TSO4/6 or
    /// GUEST_USO4/6), as a guest receiving from a guest that sends them.
    #[arg(long, value_name = "tcp|udp")]
    gso: Option<Proto>,
    /// With --gso: payload bytes per segment (the header's gso_size). Default: what fills
    /// the device's MTU (1500 if it gives none): 1448 for TCP over IPv4 (its header carries
    /// timestamps, as Linux's does), 1472 for UDP over IPv4.
    #[arg(long, requires = "gso")]
    mss: Option<u16>,
    /// With --gso: IPv6 super-frames instead of IPv4.
    #[arg(long, requires = "gso")]
    ipv6: bool,
    /// Queue pairs, one thread each (more than one needs MQ and the control queue).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Spin on the rings instead of sleeping on the call eventfds.
    #[arg(long)]
    busy_poll: bool,
    /// Without --busy-poll: poll the ring for up to this many microseconds before each
    /// sleep (0: sleep at once). Worth about one wake-up's cost when the device is fast.
    #[arg(long, default_value_t = 0)]
    spin_us: u64,
    /// Do not ask for VIRTIO_F_IN_ORDER. By default it is taken when the device offers it:
    /// used buffers are then reclaimed in the order they were posted, one used element read
    /// per batch the device reports on rx and none on tx (the used index says it all), and
    /// descriptors and buffers reused in ring order. For A/B runs.
    #[arg(long)]
    no_in_order: bool,
    /// How control commands wait for their answer: irq (sleep) or poll (spin).
    #[arg(long, default_value = "irq")]
    ctrl: CtrlMode,
    /// Dynamic interrupt moderation of the rx queues through VQ_NOTF_COAL.
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    dim: String,
    /// Print the report as one JSON document on stdout (rate lines go to stderr).
    #[arg(long)]
    json: bool,
    /// Entries per virtqueue.
    #[arg(long, default_value_t = 256)]
    queue_size: u16,
    /// Frames per transmit burst.
    #[arg(long, default_value_t = 32)]
    burst: usize,
    /// Publish the avail index once per tx burst or rx refill instead of per buffer (for
    /// devices that poll the rings).
    #[arg(long)]
    avail_per_burst: bool,
    /// The frames' destination MAC (default: the device's own): another guest's, on a switch.
    #[arg(long, value_parser = parse_mac)]
    dst_mac: Option<[u8; 6]>,
    /// The frames' source MAC (default 02:00:00:00:00:01): a switch port's own, under port
    /// security.
    #[arg(long, value_parser = parse_mac)]
    src_mac: Option<[u8; 6]>,
    /// Seconds to keep retrying the connection.
    #[arg(long, default_value_t = 2.0)]
    connect_wait: f64,
    /// Survive a backend restart, as QEMU's reconnect= does: when the backend closes the
    /// connection (exits or is killed), keep the counters, connect again after 100 ms
    /// doubling to 0.5 s, renegotiate, and resume the same traffic on fresh rings (frames in
    /// flight on the old ones are abandoned and counted). The summary lists each loss, its
    /// gap and attempts. Without it a lost connection ends the run with an error.
    #[arg(long)]
    reconnect: bool,
    /// With --reconnect: seconds after a loss to keep trying before the run fails.
    #[arg(long, default_value_t = 30.0, requires = "reconnect")]
    reconnect_limit: f64,
}

fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    vnet::parse_mac(s).ok_or_else(|| format!("{s}: expected six hex bytes like 52:54:00:12:34:56"))
}

fn seconds(s: f64, what: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|_| format!("--{what} {s} is not a duration"))
}

pub fn run(args: GenArgs) -> Result<(), Box<dyn std::error::Error>> {
    let config = GenConfig {
        socket: args.socket,
        mode: args.mode,
        size: args.size,
        gso: args.gso.map(|proto| GsoConfig {
            proto,
            mss: args.mss,
            ipv6: args.ipv6,
        }),
        dst_mac: args.dst_mac,
        src_mac: args.src_mac,
        queues: args.queues,
        duration: seconds(args.duration, "duration")?,
        busy_poll: args.busy_poll,
        spin: Duration::from_micros(args.spin_us),
        in_order: !args.no_in_order,
        ctrl: args.ctrl,
        dim: args.dim == "on",
        queue_size: args.queue_size,
        burst: args.burst.max(1),
        window: args.window,
        on_off: args.on_off,
        avail_per_burst: args.avail_per_burst,
        connect_wait: seconds(args.connect_wait, "connect-wait")?,
        reconnect: if args.reconnect {
            Some(seconds(args.reconnect_limit, "reconnect-limit")?)
        } else {
            None
        },
    };
    let json = args.json;
    // Rate lines are the progress: on stdout, or on stderr when stdout carries the JSON.
    let mut on_second = |r: &gen::Rates| {
        let line = r.render();
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
            let _ = std::io::stdout().flush();
        }
    };
    let report = gen::run(&config, &mut on_second)?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", report.render())?;
    }
    Ok(())
}
