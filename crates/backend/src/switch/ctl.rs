//! A switch's answers on its `virtnet ctl` socket and its /metrics: the ports (their queues,
//! workers and counters), the MAC table, the uplink, and ports added and removed.

use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;

use super::service::{PortSpec, Switch};
use crate::ctl::Request;

/// The answer (one JSON line) to the ctl request `line`.
pub fn answer(switch: &Arc<Switch>, line: &str) -> String {
    let error = |e: String| serde_json::json!({ "error": e }).to_string();
    match serde_json::from_str::<Request>(line) {
        Ok(Request::Stats | Request::Ports) => serde_json::json!({
            "ports": switch.reports(),
            "uplink": switch.uplink().map(|(name, c)| serde_json::json!({
                "tap": name,
                "out": c.out.snapshot(),
                "in": c.into.snapshot(),
            })),
            "fdb": switch.core().fdb_counters(),
        })
        .to_string(),
        Ok(Request::Fdb) => serde_json::to_string(&switch.core().fdb_show())
            .unwrap_or_else(|e| error(e.to_string())),
        Ok(Request::PortAdd { spec }) => match PortSpec::from_str(&spec) {
            Ok(spec) => match switch.add_port(spec) {
                Ok(_) => serde_json::json!({ "ok": true }).to_string(),
                Err(e) => error(e.to_string()),
            },
            Err(e) => error(e),
        },
        Ok(Request::PortRemove { name }) => match switch.remove_port(&name) {
            Ok(()) => serde_json::json!({ "ok": true }).to_string(),
            Err(e) => error(e.to_string()),
        },
        Ok(Request::SetBusyPoll { us, queue }) => {
            for (_, d) in switch.devices() {
                if let Err(e) = d.set_busy_poll(us, queue) {
                    return error(e);
                }
            }
            serde_json::json!({ "ok": true }).to_string()
        }
        Err(e) => error(format!("bad request: {e}")),
    }
}

/// The switch's Prometheus text: each port's queues, labelled with the port's name, then the
/// switch's own drops per port and the MAC table's counters.
pub fn prometheus(switch: &Switch) -> String {
    let mut out = String::new();
    for (name, device) in switch.devices() {
        let text = crate::metrics::prometheus(&device.reports());
        for line in text.lines() {
            // `virtnet_x{queue="0",...} v` gains the port's label; HELP and TYPE lines are
            // kept once (the first port's).
            if line.starts_with('#') {
                if !out.contains(line) {
                    let _ = writeln!(out, "{line}");
                }
            } else if let Some((metric, rest)) = line.split_once('{') {
                let _ = writeln!(out, "{metric}{{port=\"{name}\",{rest}");
            } else {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    out
}
