//! `virtnet backend`: the vhost-user-net device, following the vhost-user spec's "Backend
//! program conventions" (--socket-path, --fd, --print-capabilities), as a service: systemd
//! socket activation and readiness (`virtnet_sys::activation`), SIGTERM, and client mode
//! (--client: the backend connects to a listening frontend, and reconnects).
//!
//! Invoked as `virtnet-backend` (a link to the binary, which QEMU's vhost-user interop
//! descriptor names: contrib/), `virtnet` runs this subcommand.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use virtnet_backend::{ctl, BackendConfig, Device, IoMode};
use virtnet_sys::activation::{self, Notifier};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IoKind {
    /// Forward to and from the TAP device given with --tap.
    Tap,
    /// Drop guest tx; fill guest rx with generated frames of --size bytes.
    Null,
    /// Loop guest tx back to guest rx.
    Echo,
}

#[derive(Debug, Args)]
pub struct BackendArgs {
    /// The vhost-user socket: listen for frontends on this path (the socket file is created,
    /// and removed on exit), or with --client connect to a frontend listening there. Without
    /// it or --fd, the socket systemd passed (socket activation, LISTEN_FDS).
    #[arg(long, conflicts_with = "fd")]
    socket_path: Option<PathBuf>,
    /// Listen on this inherited, listening unix socket instead (left open and in place on
    /// exit).
    #[arg(long)]
    fd: Option<i32>,
    /// Connect to the frontend listening at --socket-path (QEMU `-chardev
    /// socket,path=P,server=on`) instead of listening; connect again whenever the connection
    /// ends or nothing listens there yet, after 100 ms doubling to 5 s (reset by a connection
    /// that lasted 1 s).
    #[arg(long, requires = "socket_path")]
    client: bool,
    /// Print the backend's capabilities as JSON and exit.
    #[arg(long)]
    print_capabilities: bool,
    /// TAP device to create or attach to (implies --io tap).
    #[arg(long)]
    tap: Option<String>,
    /// Where frames go.
    #[arg(long, value_enum)]
    io: Option<IoKind>,
    /// Frame size of the null generator, in bytes (Ethernet header included).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Queue pairs (1 to 127: vhost-user names a virtqueue in 8 bits, the control queue last).
    #[arg(long, default_value_t = 1)]
    queues: u16,
    #[arg(long, default_value = "52:54:00:12:34:56")]
    mac: String,
    /// MTU of the device (68 to 65535; at most 65521 on a TAP), set on the TAP's interface
    /// and reported to the driver in the config space. Default: the TAP's MTU as it is, or
    /// 1500 without a TAP. The frontend may change it (VHOST_USER_NET_SET_MTU: QEMU's
    /// `host_mtu`).
    #[arg(long, value_parser = clap::value_parser!(u16).range(68..))]
    mtu: Option<u16>,
    /// Busy polling before each worker sleeps: `auto` (the worker decides from the gaps
    /// between frames and how its CPU is shared), `off`, or a fixed timeout in microseconds
    /// (0 = off). `virtnet ctl set-busy-poll` changes it live.
    #[arg(long, default_value = "auto")]
    busy_poll: virtnet_backend::BusyPoll,
    /// Hold a queue's interrupt a few microseconds while the driver is busy and holding lets
    /// it cover more completions (`auto`), or never (`off`). The driver's own coalescing
    /// (NOTF_COAL, `ethtool -C`) always wins.
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    hold_calls: String,
    /// A fixed busy-poll timeout in microseconds: the same as `--busy-poll US`.
    #[arg(long, conflicts_with = "busy_poll", value_parser = clap::value_parser!(u32).range(..=1_000_000))]
    busy_poll_us: Option<u32>,
    /// Answer each control-queue command only after this many microseconds (a slow device,
    /// for the control-queue benchmark).
    #[arg(long, default_value_t = 0)]
    ctrl_delay_us: u32,
    /// Used entries written before the used index is published (1 = every entry).
    #[arg(long, default_value_t = 64)]
    used_batch: u16,
    /// While busy polling tx, do not poll the TAP for rx (rx polling from the tx path off).
    #[arg(long)]
    no_poll_rx_from_tx: bool,
    /// Pin the data workers to this CPU. Auto busy polling shares it with the pinned workers
    /// of this user's other backends, found on /dev/shm/virtnet-workers-UID.
    #[arg(long)]
    worker_cpu: Option<usize>,
    /// A send buffer for the TAP in bytes (TUNSETSNDBUF): guest tx the kernel may hold before
    /// the TAP pushes back and frames wait on the tx ring. Default: the kernel's, unlimited
    /// (as QEMU's); a limit costs about 13% per frame written.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    tap_sndbuf: Option<i32>,
    /// How guest tx is written into the TAP: `uring`, a burst of frames per io_uring_enter
    /// (one writev each, in order; where the kernel refuses io_uring, system calls), or
    /// `syscalls`, one writev system call per frame.
    #[arg(long, default_value = "uring")]
    tap_io: virtnet_backend::TapIo,
    /// Control socket for `virtnet ctl`.
    #[arg(long)]
    ctl: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Least privilege (on): drop every capability but CAP_NET_ADMIN and set no_new_privs at
    /// start, and give each worker thread a seccomp allow-list (opening a file fails, any
    /// other system call outside it kills the process). `off` for debugging.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    sandbox: String,
}

/// Where the frontends come from.
enum Frontends {
    /// Accept them on a listening socket (--socket-path, --fd, or systemd's).
    Listen(UnixListener),
    /// Connect to the one listening at this path (--client).
    Connect(PathBuf),
}

pub fn run(args: BackendArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.print_capabilities {
        println!("{{\n  \"type\": \"net\"\n}}");
        return Ok(());
    }
    // Before any thread starts, so that SIGTERM and SIGINT reach only the thread waiting
    // for them, and so that the systemd variables are removed from the environment while
    // nothing else reads it.
    let signals = virtnet_sys::signals::TerminationSignals::block()?;
    let sandbox = args.sandbox == "on";
    if sandbox {
        // Before any other thread: capabilities are per thread, and threads inherit them.
        let kept = virtnet_sys::sandbox::drop_privileges()?;
        tracing::debug!(net_admin = kept.net_admin, "capabilities dropped");
    }
    let activated = activation::listener_from_systemd()?;
    let notifier = Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable: no readiness notification");
        None
    });
    match virtnet_sys::raise_nofile_limit() {
        Ok(n) => tracing::debug!(open_files = n, "open file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
    let io = match (args.io, &args.tap) {
        (None | Some(IoKind::Tap), Some(name)) => IoMode::Tap(name.clone()),
        (Some(IoKind::Tap), None) => return Err("--io tap needs --tap NAME".into()),
        (Some(IoKind::Null), _) => IoMode::Null { size: args.size },
        (Some(IoKind::Echo), _) => IoMode::Echo,
        (None, None) => return Err("choose --tap NAME or --io null|echo".into()),
    };
    let mac =
        vnet::parse_mac(&args.mac).ok_or("--mac: expected six hex bytes like 52:54:00:12:34:56")?;
    let config = BackendConfig {
        pairs: args.queues,
        io,
        mac,
        mtu: args.mtu,
        busy_poll: args
            .busy_poll_us
            .map_or(args.busy_poll, virtnet_backend::BusyPoll::fixed),
        hold_calls: args.hold_calls == "auto",
        ctrl_delay_us: args.ctrl_delay_us,
        used_batch: args.used_batch,
        poll_rx_from_tx: !args.no_poll_rx_from_tx,
        worker_cpu: args.worker_cpu,
        worker_board: Some(virtnet_backend::siblings::Board::default_path()),
        tap_sndbuf: args.tap_sndbuf,
        tap_io: args.tap_io,
        seccomp: sandbox,
    };
    let explicit = args.socket_path.is_some() || args.fd.is_some();
    if explicit && activated.is_some() {
        tracing::warn!("systemd passed a socket, but --socket-path or --fd says where to serve");
    }
    let frontends = match (&args.socket_path, args.fd, activated) {
        (Some(path), _, _) if args.client => Frontends::Connect(path.clone()),
        (Some(path), _, _) => {
            let _ = std::fs::remove_file(path);
            Frontends::Listen(
                UnixListener::bind(path)
                    .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?,
            )
        }
        (None, Some(fd), _) => Frontends::Listen(virtnet_sys::unix_listener_from_fd(fd)?),
        (None, None, Some(listener)) => Frontends::Listen(listener),
        (None, None, None) => {
            return Err(
                "give --socket-path PATH or --fd N, or start under systemd socket activation"
                    .into(),
            )
        }
    };
    let device = Device::new(config).map_err(|e| format!("cannot set up the device: {e}"))?;
    if let Some(path) = &args.ctl {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        let d = device.clone();
        // Its clients' threads are the `virtnet-ctl` ones.
        std::thread::Builder::new()
            .name("ctl-accept".into())
            .spawn(move || ctl::serve_ctl(d, l))?;
    }
    if let Some(addr) = &args.metrics {
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let d = device.clone();
        std::thread::Builder::new()
            .name("metrics-accept".into())
            .spawn(move || ctl::serve_metrics(d, l))?;
    }
    // SIGTERM or SIGINT: tell systemd, stop the queues (used batches published), remove the
    // sockets this process created, exit 0. A second one exits at once.
    let listening_path = args.socket_path.clone().filter(|_| !args.client);
    let created: Vec<PathBuf> = [listening_path, args.ctl.clone()]
        .into_iter()
        .flatten()
        .collect();
    let notifier = Arc::new(notifier);
    let n = notifier.clone();
    let d = device.clone();
    std::thread::Builder::new()
        .name("virtnet-signals".into())
        .spawn(move || {
            let Ok(sig) = signals.wait() else { return };
            tracing::info!(signal = sig, "stopping");
            std::thread::spawn(move || {
                if let Ok(sig) = signals.wait() {
                    std::process::exit(128 + sig);
                }
            });
            notify(&n, "STOPPING=1");
            let stopped = d.stop_all_queues();
            for path in &created {
                let _ = std::fs::remove_file(path);
            }
            tracing::info!(queues = stopped, "stopped");
            std::process::exit(0);
        })?;
    tracing::info!(pairs = args.queues, "virtnet backend ready");
    notify(&notifier, "READY=1");
    let stop = Arc::new(AtomicBool::new(false));
    match frontends {
        Frontends::Listen(listener) => virtnet_backend::serve(device, listener, stop)?,
        Frontends::Connect(path) => virtnet_backend::serve_client(device, &path, stop)?,
    }
    Ok(())
}

/// Sends `state` to systemd, if it asked for readiness notifications.
fn notify(notifier: &Option<Notifier>, state: &str) {
    if let Some(n) = notifier {
        if let Err(e) = n.notify(state) {
            tracing::warn!(error = %e, state, "cannot notify systemd");
        }
    }
}
