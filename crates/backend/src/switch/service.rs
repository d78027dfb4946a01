//! `virtnet switch` running: its workers, its uplink, and its guest ports, each a full virtnet
//! device served on its own vhost-user socket, added and removed while the others run.
//!
//! - A worker per CPU given (`--cpus`), serving the queue pairs of every port: pair `p` of a
//!   port goes to worker `(first + p) % workers`, `first` turning with each port added, so
//!   that ports spread. Each worker has a queue of the uplink TAP: the frames its ports send
//!   out, and the frames the host sends in (read by the worker's [`UplinkPort`]).
//! - A port is a [`Device`] whose pairs are [`GuestPort`]s and whose rx queues are
//!   [`Sink`]s, into which any worker forwards; its socket is served by a thread of its own
//!   (or, `client`, connected to the frontend's).
//! - An aging thread removes MAC table entries not seen for the table's age.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::core::{Out, Scratch, SwitchCore};
use super::fdb::FdbConfig;
use super::flow::Inbound;
use super::forward::PortConfig;
use super::guest::GuestPort;
use super::mac::Mac;
use super::port::PortId;
use super::sink::Sink;
use super::tap::{self, UplinkCounters, UplinkQueue};
use super::uplink::UplinkPort;
use super::SwitchError;
use crate::config::BackendConfig;
use crate::host::{Control, NoControl};
use crate::pair::Pair;
use crate::shared::Shared;
use crate::thread::{PairHandle, WorkerHandle};
use crate::worker::{self, WorkerConfig};
use crate::Device;
use virtnet_sys::tap::TapQueue;

/// The uplink's port number; guests get the numbers after it.
pub const UPLINK: PortId = match PortId::new(0) {
    Some(p) => p,
    None => unreachable!(),
};

/// How long [`Switch::remove_port`] waits for the port's serving thread: its session stops
/// the port's queues (each within 5 s, `Device::stop_all_queues`), which they already are.
pub const REMOVE_WAIT: Duration = Duration::from_secs(5);

/// The most MAC addresses learned behind the uplink (the host and its LAN).
pub const UPLINK_LEARN_LIMIT: usize = 4096;

/// How a switch runs.
#[derive(Clone, Debug)]
pub struct SwitchConfig {
    /// One worker per entry, pinned to the CPU it names (or not pinned).
    pub workers: Vec<Option<usize>>,
    /// The TAP of the uplink, if any.
    pub uplink: Option<String>,
    pub fdb: FdbConfig,
    /// What every port's device starts from (busy polling, call holding, the sandbox); each
    /// port sets its pairs and MAC.
    pub device: BackendConfig,
}

/// A guest port as the operator asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PortSpec {
    pub name: String,
    pub socket: PathBuf,
    pub mac: [u8; 6],
    pub queues: u16,
    /// Connect to a frontend listening at `socket` rather than listen there.
    pub client: bool,
    /// Port security: the guest sends from its MAC only.
    pub spoof_check: bool,
}

impl std::str::FromStr for PortSpec {
    type Err = String;

    /// `name=vm1,socket=/run/vm1.sock[,mac=52:54:00:..,queues=N,client,spoof-check=off]`.
    /// Without `mac`, one of QEMU's prefix (52:54:00) derived from the name.
    fn from_str(s: &str) -> Result<PortSpec, String> {
        let (mut name, mut socket, mut mac, mut queues) = (None, None, None, 1u16);
        let (mut client, mut spoof_check) = (false, true);
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            match key {
                "name" if !value.is_empty() => name = Some(value.to_string()),
                "socket" if !value.is_empty() => socket = Some(PathBuf::from(value)),
                "mac" => {
                    mac = Some(vnet::parse_mac(value).ok_or(format!("mac={value}: not a MAC"))?)
                }
                "queues" => {
                    queues = value
                        .parse()
                        .ok()
                        .filter(|&q| crate::config::check_pairs(q).is_ok())
                        .ok_or(format!("queues={value}: 1 to {}", crate::config::MAX_PAIRS))?
                }
                "client" if value.is_empty() => client = true,
                "spoof-check" if value == "on" || value == "off" => spoof_check = value == "on",
                _ => {
                    return Err(format!(
                    "{part}: unknown (name=, socket=, mac=, queues=, client, spoof-check=on|off)"
                ))
                }
            }
        }
        let name = name.ok_or("a port needs name=")?;
        if name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(format!(
                "name={name}: up to 64 letters, digits, '-', '_', '.'"
            ));
        }
        let socket = socket.ok_or("a port needs socket=")?;
        let mac = mac.unwrap_or_else(|| {
            let h = name.bytes().fold(0xcbf2_9ce4u32, |h, b| {
                (h ^ b as u32).wrapping_mul(0x0100_0193)
            });
            let [a, b, c, _] = h.to_be_bytes();
            [0x52, 0x54, 0x00, a, b, c]
        });
        Ok(PortSpec {
            name,
            socket,
            mac,
            queues,
            client,
            spoof_check,
        })
    }
}

/// One worker of the switch.
#[derive(Debug)]
struct Lane {
    worker: Arc<WorkerHandle>,
    uplink: Option<Arc<Mutex<UplinkQueue>>>,
    /// The uplink's reading side on this worker.
    _uplink_pair: Option<PairHandle>,
}

/// A guest port of the running switch.
#[derive(Debug)]
struct Member {
    id: PortId,
    spec: PortSpec,
    device: Arc<Device>,
    stop: Arc<AtomicBool>,
    serving: Option<JoinHandle<()>>,
}

/// The running switch.
#[derive(Debug)]
pub struct Switch {
    core: Arc<SwitchCore>,
    lanes: Vec<Lane>,
    uplink: Option<(String, Arc<UplinkCounters>)>,
    config: SwitchConfig,
    ports: Mutex<BTreeMap<String, Member>>,
    /// The worker of the next port's first pair.
    next_lane: Mutex<usize>,
    stop: Arc<AtomicBool>,
}

/// A port as `virtnet ctl ports` shows it.
#[derive(Debug, Serialize)]
pub struct PortReport {
    pub port: u16,
    #[serde(flatten)]
    pub spec: PortSpec,
    /// Each pair's worker, by pair.
    pub workers: Vec<String>,
    pub queues: Vec<crate::metrics::QueueReport>,
    pub drops: Option<super::forward::PortCountersSnapshot>,
}

impl Switch {
    /// Starts the workers and the uplink; no guest port yet.
    pub fn start(config: SwitchConfig) -> io::Result<Arc<Switch>> {
        let core = Arc::new(SwitchCore::new(config.fdb).map_err(invalid)?);
        let n = config.workers.len().max(1);
        let taps = match &config.uplink {
            Some(name) => Some(tap::open(name, n)?),
            None => None,
        };
        let counters = Arc::new(UplinkCounters::default());
        if config.uplink.is_some() {
            core.add_port(UPLINK, PortConfig::uplink(UPLINK_LEARN_LIMIT), Out::Uplink)
                .map_err(invalid)?;
        }
        if config.device.seccomp {
            virtnet_sys::peer_fd::prepare_watchdog()?;
        }
        let mut lanes = Vec::new();
        let mut taps = taps.map(Vec::into_iter);
        for k in 0..n {
            let wc = WorkerConfig {
                cpu: config.workers.get(k).copied().flatten(),
                ..WorkerConfig::of(&config.device)
            };
            let wake = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?;
            let worker = worker::spawn(format!("virtnet-switch{k}"), wake, wc)?;
            let mut lane = Lane {
                worker,
                uplink: None,
                _uplink_pair: None,
            };
            if let Some(tap) = taps.as_mut().and_then(Iterator::next) {
                let writer = TapQueue::open_clone(&tap)?;
                let queue = Arc::new(Mutex::new(UplinkQueue::new(writer, counters.clone())));
                let port =
                    UplinkPort::new(UPLINK, tap, core.clone(), queue.clone(), counters.clone());
                let shared = Arc::new(Shared::with_wakes(
                    BackendConfig {
                        pairs: 1,
                        ..config.device.clone()
                    },
                    Box::new(NoControl),
                    vec![lane.worker.wake().try_clone()?],
                )?);
                lane._uplink_pair =
                    Some(lane.worker.add_pair(Pair::new(0, Box::new(port), shared)));
                lane.uplink = Some(queue);
            }
            lanes.push(lane);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let switch = Arc::new(Switch {
            core,
            lanes,
            uplink: config.uplink.clone().map(|n| (n, counters)),
            config,
            ports: Mutex::default(),
            next_lane: Mutex::new(0),
            stop,
        });
        let aging = Arc::downgrade(&switch);
        std::thread::Builder::new()
            .name("virtnet-fdb-age".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                match aging.upgrade() {
                    Some(s) if !s.stop.load(Relaxed) => {
                        s.core.age();
                    }
                    _ => return,
                }
            })?;
        Ok(switch)
    }

    pub fn core(&self) -> &Arc<SwitchCore> {
        &self.core
    }

    /// How the switch runs.
    pub fn config(&self) -> &SwitchConfig {
        &self.config
    }

    /// The workers, in order (`virtnet-switch<k>`).
    pub fn workers(&self) -> impl Iterator<Item = &Arc<WorkerHandle>> {
        self.lanes.iter().map(|l| &l.worker)
    }

    /// The uplink's TAP and its counters, if the switch has one.
    pub fn uplink(&self) -> Option<(&str, &UplinkCounters)> {
        self.uplink.as_ref().map(|(n, c)| (n.as_str(), &**c))
    }

    fn ports(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Member>> {
        self.ports.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a guest port and starts serving its socket; its device is returned.
    pub fn add_port(self: &Arc<Self>, spec: PortSpec) -> io::Result<Arc<Device>> {
        let mut ports = self.ports();
        if ports.contains_key(&spec.name) {
            return Err(invalid(format!("a port named {} exists", spec.name)));
        }
        let taken: Vec<usize> = ports.values().map(|m| m.id.index()).collect();
        let id = (1..super::MAX_PORTS)
            .find(|i| !taken.contains(i))
            .and_then(PortId::new)
            .ok_or_else(|| invalid("no free port number"))?;
        let first = {
            let mut next = self
                .next_lane
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let first = *next;
            *next = (first + spec.queues as usize) % self.lanes.len();
            first
        };
        let lanes: Vec<Arc<WorkerHandle>> = (0..self.lanes.len())
            .map(|k| self.lanes[(first + k) % self.lanes.len()].worker.clone())
            .collect();
        let sinks: Vec<Arc<Sink>> = (0..spec.queues)
            .map(|p| {
                let wake = lanes[p as usize % lanes.len()].wake().try_clone()?;
                Ok(Arc::new(Sink::new(wake)))
            })
            .collect::<io::Result<_>>()?;
        let config = BackendConfig {
            pairs: spec.queues,
            mac: spec.mac,
            ..self.config.device.clone()
        };
        let control: Box<dyn Control> = Box::new(SwitchControl {
            core: self.core.clone(),
            id,
            uplink: self.lanes[first].uplink.clone(),
        });
        let device = Device::on_workers(config, control, &lanes, |p, lane| {
            let k = (first + lane) % self.lanes.len();
            Box::new(GuestPort::new(
                id,
                self.core.clone(),
                sinks[p as usize].clone(),
                self.lanes[k].uplink.clone(),
            ))
        })?;
        let mac = Mac::new(spec.mac);
        let port_config = if spec.spoof_check {
            PortConfig::guest(mac)
        } else {
            PortConfig {
                address: super::forward::PortAddress::Unchecked(mac),
                learn_limit: 256,
            }
        };
        let out = Out::Guest {
            shared: device.shared().clone(),
            sinks: sinks.into(),
        };
        self.core.add_port(id, port_config, out).map_err(invalid)?;
        let stop = Arc::new(AtomicBool::new(false));
        let serving = match serve(&spec, &device, &stop) {
            Ok(t) => t,
            Err(e) => {
                self.core.remove_port(id);
                return Err(e);
            }
        };
        tracing::info!(port = %spec.name, id = id.index(), socket = %spec.socket.display(), "port added");
        ports.insert(
            spec.name.clone(),
            Member {
                id,
                spec,
                device: device.clone(),
                stop,
                serving: Some(serving),
            },
        );
        Ok(device)
    }

    /// Removes port `name`: no frame reaches it or leaves it from now on, its queues stop,
    /// its MAC table entries go, and its frontend is disconnected, as from a device that went
    /// away: the connection being served is closed (the frontend reads its end), a listening
    /// port's socket file is removed, a client port connects no more. Returns once the port's
    /// serving thread has ended, or after [`REMOVE_WAIT`] (the thread is left to end then).
    pub fn remove_port(&self, name: &str) -> io::Result<()> {
        let mut member = self
            .ports()
            .remove(name)
            .ok_or_else(|| invalid(format!("no port named {name}")))?;
        self.core.remove_port(member.id);
        member.device.stop_all_queues();
        member.stop.store(true, Relaxed);
        // After the stop: a session that starts meanwhile is refused, and the serving loop
        // then sees the stop.
        member.device.retire();
        if !member.spec.client {
            // Wake the accepting thread, which then sees the stop; the socket file goes.
            let _ = std::os::unix::net::UnixStream::connect(&member.spec.socket);
            let _ = std::fs::remove_file(&member.spec.socket);
        }
        if let Some(serving) = member.serving.take() {
            let deadline = Instant::now() + REMOVE_WAIT;
            while !serving.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            if serving.is_finished() {
                let _ = serving.join();
            } else {
                tracing::warn!(port = name, "the port's serving thread has not ended yet");
            }
        }
        tracing::info!(port = name, "port removed");
        Ok(())
    }

    /// Whether port `name`'s socket is still served (its thread has not ended); None without
    /// such a port.
    pub fn is_serving(&self, name: &str) -> Option<bool> {
        let ports = self.ports();
        let member = ports.get(name)?;
        Some(member.serving.as_ref().is_some_and(|t| !t.is_finished()))
    }

    /// Every port's device, by name.
    pub fn devices(&self) -> Vec<(String, Arc<Device>)> {
        self.ports()
            .iter()
            .map(|(n, m)| (n.clone(), m.device.clone()))
            .collect()
    }

    /// What `virtnet ctl ports` shows.
    pub fn reports(&self) -> Vec<PortReport> {
        self.ports()
            .values()
            .map(|m| PortReport {
                port: m.id.index() as u16,
                spec: m.spec.clone(),
                workers: m
                    .device
                    .pair_workers()
                    .map(|w| w.name().to_string())
                    .collect(),
                queues: m.device.reports(),
                drops: self.core.port_counters(m.id),
            })
            .collect()
    }

    /// Stops every port's queues (batches published, held calls sent) and the serving
    /// threads; returns how many queues were stopped.
    pub fn shutdown(&self) -> usize {
        self.stop.store(true, Relaxed);
        let names: Vec<String> = self.ports().keys().cloned().collect();
        let mut stopped = 0;
        for (_, d) in self.devices() {
            stopped += d.stop_all_queues();
        }
        for n in names {
            let _ = self.remove_port(&n);
        }
        stopped
    }
}

/// Serves `device` on its socket, from a thread of its own.
fn serve(
    spec: &PortSpec,
    device: &Arc<Device>,
    stop: &Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    let (device, stop, path) = (device.clone(), stop.clone(), spec.socket.clone());
    let name = format!("virtnet-port-{}", spec.name);
    if spec.client {
        return std::thread::Builder::new().name(name).spawn(move || {
            if let Err(e) = crate::session::serve_client(device, &path, stop) {
                tracing::error!(error = %e, "port stopped serving");
            }
        });
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::thread::Builder::new().name(name).spawn(move || {
        if let Err(e) = crate::session::serve(device, listener, stop) {
            tracing::error!(error = %e, "port stopped serving");
        }
    })
}

/// A guest port's control plane: no host device. An announcement after a migration (QEMU's
/// SEND_RARP) is forwarded as if the guest had sent it: its MAC moves to the port at once, and
/// the RARP floods to the other ports and out of the uplink.
#[derive(Debug)]
struct SwitchControl {
    core: Arc<SwitchCore>,
    id: PortId,
    uplink: Option<Arc<Mutex<UplinkQueue>>>,
}

impl Control for SwitchControl {
    fn announce(&self, frame: &[u8], _features: vring::Features) -> io::Result<bool> {
        let mut tap_head = vec![0u8; vnet::HDR_LEN];
        tap_head.extend_from_slice(frame);
        let inbound = Inbound {
            pieces: crate::rx::Pieces {
                hdr: vnet::NetHdr::default(),
                prefix: frame,
                rest: None,
            },
            tap_head: &tap_head,
        };
        let mut sent = Vec::new();
        self.core
            .forward(
                self.id,
                &[inbound],
                self.uplink.as_deref(),
                &mut Scratch::default(),
                &mut sent,
            )
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(sent.first() == Some(&crate::host::Sent::Taken))
    }
}

fn invalid(e: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

impl From<SwitchError> for io::Error {
    fn from(e: SwitchError) -> io::Error {
        invalid(e)
    }
}
