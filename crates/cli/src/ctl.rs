//! `virtnet ctl`: talks to a running backend's, or switch's, control socket.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use virtnet_backend::ctl::{request, Request};

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The backend's --ctl socket.
    #[arg(long)]
    socket: PathBuf,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Subcommand)]
enum CtlCommand {
    /// Print per-queue counters as JSON.
    Stats,
    /// Set busy polling of one queue or of all: `auto`, `off`, or a timeout in microseconds
    /// (0 = off).
    SetBusyPoll {
        us: virtnet_backend::BusyPoll,
        #[arg(long)]
        queue: Option<usize>,
    },
    /// A switch's ports: queues, workers, counters, and the uplink's.
    Ports,
    /// A switch's MAC table.
    Fdb,
    /// Add a port to a running switch (SPEC as `virtnet switch --port` takes it).
    PortAdd { spec: String },
    /// Remove a switch's port.
    PortRemove { name: String },
}

pub fn run(args: CtlArgs) -> Result<(), Box<dyn std::error::Error>> {
    let req = match args.command {
        CtlCommand::Stats => Request::Stats,
        CtlCommand::SetBusyPoll { us, queue } => Request::SetBusyPoll { us, queue },
        CtlCommand::Ports => Request::Ports,
        CtlCommand::Fdb => Request::Fdb,
        CtlCommand::PortAdd { spec } => Request::PortAdd { spec },
        CtlCommand::PortRemove { name } => Request::PortRemove { name },
    };
    let answer =
        request(&args.socket, &req).map_err(|e| format!("{}: {e}", args.socket.display()))?;
    let v: serde_json::Value = serde_json::from_str(&answer)?;
    if let Some(e) = v.get("error") {
        return Err(format!("backend refused: {e}").into());
    }
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}
