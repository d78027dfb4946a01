//! `virtnet`: the virtio-net data plane's command line.
//!
//! - `virtnet bench`: the measurement experiments of the `bench` crate, as tables (or, with
//!   `--json`, one JSON document);
//! - `virtnet backend`: the vhost-user-net device ([`backend`]); the binary invoked as
//!   `virtnet-backend` (a link, the name contrib/qemu's vhost-user descriptor gives) runs it;
//! - `virtnet ctl`: a running backend's control socket ([`ctl`]);
//! - `virtnet gen`: traffic from our driver against any vhost-user-net backend ([`gen`]).

#![forbid(unsafe_code)]

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Instant;

mod backend;
mod ctl;
mod gen;
mod switch;

use bench::experiments::{self, ExperimentReport, Options, Report};
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "virtnet",
    version,
    about = "virtio-net data plane: backend, driver, benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the measurements: the ring engine against rust-vmm virtio-queue, then one experiment
    /// per technique (event index, batched used publish, busy polling, rx from tx, control
    /// queue interrupts, tx completion), busy polling across loads, and guest to guest
    /// through `virtnet switch`; `--list` names them.
    Bench(BenchArgs),
    /// Serve a vhost-user-net device to QEMU, DPDK virtio-user or our driver.
    ///
    /// Under systemd it takes its socket by socket activation (LISTEN_FDS) and reports
    /// readiness to NOTIFY_SOCKET (READY=1, STOPPING=1); SIGTERM or SIGINT stops it cleanly.
    Backend(backend::BackendArgs),
    /// Switch frames between guests, each on a vhost-user port, and a TAP uplink: a learning
    /// L2 switch in one process, one copy per frame from guest to guest.
    Switch(switch::SwitchArgs),
    /// Query or tune a running backend or switch through its control socket.
    Ctl(ctl::CtlArgs),
    /// Generate traffic with our driver against a vhost-user-net backend and report rates.
    Gen(gen::GenArgs),
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// A few seconds in all, for CI: short runs, so counts are meaningful but times are rough.
    #[arg(long)]
    quick: bool,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long)]
    json: bool,
    /// Run only these experiments, by number (see --list), e.g. `--only 0,2`.
    #[arg(long, value_delimiter = ',', value_name = "N,M")]
    only: Vec<u32>,
    /// Repeats of each measurement (interleaved); medians are reported.
    #[arg(long, value_name = "N")]
    repeats: Option<u32>,
    /// List the experiments and exit.
    #[arg(long)]
    list: bool,
    /// Draw the busy-poll sweep (experiment 3): latency and device CPU against the timeout.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<std::path::PathBuf>,
}

/// Logs go to stderr; RUST_LOG overrides the default level. Coloured only on a terminal
/// (a file or journald would keep the escape codes) and without NO_COLOR (no-color.org).
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .try_init();
}

fn report(what: &str, r: Result<(), Box<dyn std::error::Error>>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virtnet {what}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // Invoked as `virtnet-backend` (what QEMU's vhost-user interop descriptor names, and what
    // management software runs with --print-capabilities, --socket-path or --fd), run the
    // backend subcommand.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|n| n == "virtnet-backend")
        .unwrap_or(false);
    if invoked_as {
        argv.insert(1, "backend".into());
    }
    let cli = Cli::parse_from(argv);
    // The bench runs backends in-process: their connection notices would drown its tables.
    init_logging(match cli.command {
        Command::Bench(_) | Command::Gen(_) => "warn",
        _ => "info",
    });
    match cli.command {
        Command::Bench(args) => match bench_command(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("virtnet bench: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Backend(args) => report("backend", backend::run(args)),
        Command::Ctl(args) => report("ctl", ctl::run(args)),
        Command::Gen(args) => report("gen", gen::run(args)),
        Command::Switch(args) => report("switch", switch::run(args)),
    }
}

fn bench_command(args: &BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    if args.list {
        for e in experiments::ALL {
            println!("{:>2}  {:<8} {}", e.id, e.name, e.summary);
        }
        return Ok(());
    }
    let selected = experiments::select(&args.only)?;
    let options = Options {
        quick: args.quick,
        repeats: args.repeats,
    };
    // Progress goes to stderr, and only to a terminal: it must never mix with the output.
    let show_progress = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut stdout = std::io::stdout().lock();
    for e in selected {
        let mut progress = |msg: &str| {
            if show_progress {
                eprint!("\r\x1b[2K{} {}: {msg}", e.id, e.name);
                let _ = std::io::stderr().flush();
            }
        };
        let outcome = (e.run)(&options, &mut progress)?;
        if show_progress {
            eprint!("\r\x1b[2K");
        }
        if !args.json {
            writeln!(stdout, "== {} {}: {}\n", e.id, e.name, e.summary)?;
            for t in &outcome.tables {
                writeln!(stdout, "{t}")?;
            }
        }
        reports.push(ExperimentReport {
            id: e.id,
            name: e.name,
            results: outcome.json,
        });
    }
    if let Some(path) = &args.plot {
        let svg = reports
            .iter()
            .find(|r| r.id == 3)
            .and_then(|r| bench::plot::busy_poll_svg(&r.results))
            .ok_or("--plot draws experiment 3 (busy polling): run it too")?;
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("busy-poll plot written to {}", path.display());
    }
    if args.json {
        let report = Report {
            tool: "virtnet bench",
            version: env!("CARGO_PKG_VERSION"),
            quick: args.quick,
            experiments: reports,
        };
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        writeln!(
            stdout,
            "Done in {:.1} s. Figures from a shared 2-vCPU machine vary from run to run; \
             see docs/PERFORMANCE.md.",
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(())
}
