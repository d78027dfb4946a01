//! `virtnet switch`: many vhost-user ports (each a guest's virtio-net device) and a TAP
//! uplink in one process, as a learning L2 switch: a frame goes from one guest's tx buffers
//! into another's rx buffers with one copy, without the kernel.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Args;
use virtnet_backend::switch::{self, FdbConfig, PortSpec, Switch, SwitchConfig};
use virtnet_backend::{ctl, BackendConfig, IoMode};

#[derive(Debug, Args)]
#[command(after_help = "\
Two QEMU guests on one switch, with the host reachable through a TAP uplink:

  virtnet switch --uplink tap=vsw0 \\
      --port name=vm1,socket=/run/vm1.sock,mac=52:54:00:00:00:01 \\
      --port name=vm2,socket=/run/vm2.sock,mac=52:54:00:00:00:02 --ctl /run/vsw.ctl
  ip addr add 10.0.0.254/24 dev vsw0; ip link set vsw0 up
  qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=1G,share=on \\
      -numa node,memdev=mem -chardev socket,id=c1,path=/run/vm1.sock \\
      -netdev vhost-user,id=n1,chardev=c1 \\
      -device virtio-net-pci,netdev=n1,mac=52:54:00:00:00:01
  (the same for vm2 with /run/vm2.sock and its MAC)

Each guest's MAC must be its port's (port security drops frames from any other source
unless spoof-check=off). `virtnet ctl --socket /run/vsw.ctl ports` shows the ports, their
queues' workers and counters; `fdb` the MAC table; `port-add` and `port-remove` change the
ports at run time.")]
pub struct SwitchArgs {
    /// A guest port: `name=NAME,socket=PATH[,mac=MAC][,queues=N][,client][,spoof-check=off]`
    /// (repeatable). The socket is listened on (created, and removed on exit), or with
    /// `client` connected to (a frontend listening there). Without `mac`, one derived from
    /// the name.
    #[arg(long = "port", value_name = "SPEC")]
    ports: Vec<String>,
    /// The uplink: `tap=NAME` (or NAME), a TAP created or attached to, one queue per worker:
    /// the host's stack, or a bridge it joins.
    #[arg(long, value_name = "tap=NAME")]
    uplink: Option<String>,
    /// The workers' CPUs, e.g. `0,1` or `0-1`: one worker pinned to each. Default: one
    /// worker, not pinned (or --workers of them).
    #[arg(long, value_name = "LIST", conflicts_with = "workers")]
    cpus: Option<String>,
    /// Unpinned workers.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// Seconds a learned MAC stays in the table without a frame from it.
    #[arg(long, default_value_t = 300)]
    mac_age: u64,
    /// Busy polling before each worker sleeps: `auto`, `off`, or microseconds.
    #[arg(long, default_value = "auto")]
    busy_poll: virtnet_backend::BusyPoll,
    /// Hold a queue's interrupt while the driver is busy (`auto`) or never (`off`).
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    hold_calls: String,
    /// Control socket for `virtnet ctl`.
    #[arg(long)]
    ctl: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (per port).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Least privilege, as `virtnet backend --sandbox`.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    sandbox: String,
}

/// `0,2-3` as CPU numbers.
fn cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let bad = || format!("--cpus {s}: expected numbers and ranges like 0,2-3");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b || b - a >= 1024 {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(out)
}

pub fn run(args: SwitchArgs) -> Result<(), Box<dyn std::error::Error>> {
    let signals = virtnet_sys::signals::TerminationSignals::block()?;
    let sandbox = args.sandbox == "on";
    if sandbox {
        virtnet_sys::sandbox::drop_privileges()?;
    }
    if let Err(e) = virtnet_sys::raise_nofile_limit() {
        tracing::warn!(error = %e, "cannot raise the open file limit");
    }
    let specs = args
        .ports
        .iter()
        .map(|s| PortSpec::from_str(s).map_err(|e| format!("--port {s}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let workers = match &args.cpus {
        Some(list) => cpu_list(list)?.into_iter().map(Some).collect(),
        None => vec![None; args.workers as usize],
    };
    let uplink = args
        .uplink
        .as_deref()
        .map(|u| u.strip_prefix("tap=").unwrap_or(u).to_string());
    let config = SwitchConfig {
        workers,
        uplink,
        fdb: FdbConfig {
            age: Duration::from_secs(args.mac_age),
            ..FdbConfig::default()
        },
        device: BackendConfig {
            io: IoMode::Echo,
            busy_poll: args.busy_poll,
            hold_calls: args.hold_calls == "auto",
            worker_board: Some(virtnet_backend::siblings::Board::default_path()),
            seccomp: sandbox,
            ..BackendConfig::default()
        },
    };
    let switch = Switch::start(config).map_err(|e| format!("cannot start the switch: {e}"))?;
    for spec in specs {
        let name = spec.name.clone();
        switch
            .add_port(spec)
            .map_err(|e| format!("port {name}: {e}"))?;
    }
    if let Some(path) = &args.ctl {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        let s = switch.clone();
        std::thread::Builder::new()
            .name("ctl-accept".into())
            .spawn(move || ctl::serve_lines(l, move |line| switch::ctl::answer(&s, line)))?;
    }
    if let Some(addr) = &args.metrics {
        let l = TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let s = switch.clone();
        std::thread::Builder::new()
            .name("metrics-accept".into())
            .spawn(move || ctl::serve_metrics_with(l, move || switch::ctl::prometheus(&s)))?;
    }
    let notifier = virtnet_sys::activation::Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable: no readiness notification");
        None
    });
    let notify = |state: &str| {
        if let Some(n) = &notifier {
            if let Err(e) = n.notify(state) {
                tracing::warn!(error = %e, state, "cannot notify systemd");
            }
        }
    };
    tracing::info!(ports = args.ports.len(), "virtnet switch ready");
    notify("READY=1");
    let sig = signals.wait()?;
    notify("STOPPING=1");
    tracing::info!(signal = sig, "stopping");
    std::thread::spawn(move || {
        if let Ok(sig) = signals.wait() {
            std::process::exit(128 + sig);
        }
    });
    let stopped = switch.shutdown();
    if let Some(path) = &args.ctl {
        let _ = std::fs::remove_file(path);
    }
    tracing::info!(queues = stopped, "stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_take_numbers_and_ranges_and_refuse_the_rest() {
        assert_eq!(cpu_list("0,2-3").unwrap(), [0, 2, 3]);
        assert_eq!(cpu_list("1").unwrap(), [1]);
        for bad in ["", "a", "3-1", "0-", "0-5000"] {
            assert!(cpu_list(bad).is_err(), "{bad}");
        }
    }
}
