//! What a `virtnet gen` run is asked to do: the mode, the frames, the queues and how they wait
//! ([`GenConfig`]), the checks made before connecting, and the driver settings and features the
//! options ask for.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use vnet::feature;
use vring::Features;

use super::frames::{Flow, Proto};
use super::GenError;
use crate::ctrl::CtrlMode;
use crate::{DriverConfig, TxPolicy, DEFAULT_FEATURES};

/// What each pair's thread does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    TxOnly,
    RxOnly,
    Io,
    Rr,
    /// A window of frames, then wait for the host side's ack ([`window`](super::window)).
    Window,
    /// The receiving end of TCP connections from the host side ([`tcp_sink`](super::tcp_sink)).
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

/// Super-frames to send (`--gso`), or in rxonly to take whole: which segmentation offload,
/// and the segment size.
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
    /// Send TSO or USO super-frames (txonly), or take them whole (rxonly: GUEST_TSO or
    /// GUEST_USO asked for).
    pub gso: Option<GsoConfig>,
    /// The frames' destination MAC: default the device's own (config space), else
    /// 02:00:00:00:00:02; another guest's on a switch.
    pub dst_mac: Option<[u8; 6]>,
    /// The frames' source MAC: default 02:00:00:00:00:01 (the tcp sink: the device's); on a
    /// switch with port security, the port's.
    pub src_mac: Option<[u8; 6]>,
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
    /// loss (backing off from [`RECONNECT_FIRST`](super::RECONNECT_FIRST) to
    /// [`RECONNECT_MAX`](super::RECONNECT_MAX) between attempts) and resume; None: the run
    /// ends with [`GenError::ConnectionLost`].
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
            dst_mac: None,
            src_mac: None,
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
    if let (Some(g), Mode::RxOnly) = (config.gso, config.mode) {
        // Super-frames come whole, their checksums unfinished.
        f = f | feature::GUEST_CSUM;
        f = f | match (g.proto, g.ipv6) {
            (Proto::Tcp, false) => feature::GUEST_TSO4,
            (Proto::Tcp, true) => feature::GUEST_TSO6,
            (Proto::Udp, false) => feature::GUEST_USO4,
            (Proto::Udp, true) => feature::GUEST_USO6,
        };
    } else if let Some(g) = config.gso {
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
pub(super) fn check_options(config: &GenConfig) -> Result<(), GenError> {
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
        // rxonly: take super-frames whole (asks for the GUEST_ offload).
        Some(_) if config.mode == Mode::RxOnly => Ok(()),
        Some(_) if config.mode != Mode::TxOnly => Err(GenError::Options(
            "--gso is for --mode txonly (send super-frames) or rxonly (take them whole)".into(),
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

/// The settings of the driver `run` connects with.
pub(super) fn driver_config(config: &GenConfig) -> DriverConfig {
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
}
