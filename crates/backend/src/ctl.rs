//! The backend's control plane: a unix socket for `virtnet ctl` (one JSON request per line,
//! one JSON answer per line) and a Prometheus `/metrics` endpoint over plain HTTP.
//!
//! Requests: `{"cmd":"stats"}` and `{"cmd":"set-busy-poll","us":50,"queue":1}` (`us`: a
//! timeout in microseconds, 0 off, or `"auto"`; `queue` optional: all queues).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::metrics::{prometheus, QueueReport};
use super::session::accept_failed;
use super::{BusyPoll, Device};

#[derive(Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Stats,
    SetBusyPoll { us: BusyPoll, queue: Option<usize> },
}

#[derive(Debug, Deserialize, Serialize)]
pub struct StatsReply {
    pub device: super::DeviceReport,
    pub queues: Vec<QueueReportOwned>,
}

/// A queue report as it travels (owned strings, for deserialising on the ctl side).
#[derive(Debug, Deserialize, Serialize)]
pub struct QueueReportOwned {
    pub index: u16,
    pub kind: String,
    pub busy_poll: BusyPoll,
    pub busy_poll_us: u32,
    pub coalesce_max_packets: u32,
    pub coalesce_max_usecs: u32,
    pub broken: Option<String>,
    #[serde(flatten)]
    pub counters: std::collections::BTreeMap<String, u64>,
}

fn answer(device: &Device, line: &str) -> String {
    match serde_json::from_str::<Request>(line) {
        Ok(Request::Stats) => {
            let queues: Vec<QueueReport> = device.reports();
            serde_json::json!({ "device": device.device_report(), "queues": queues }).to_string()
        }
        Ok(Request::SetBusyPoll { us, queue }) => match device.set_busy_poll(us, queue) {
            Ok(()) => serde_json::json!({ "ok": true }).to_string(),
            Err(e) => serde_json::json!({ "error": e }).to_string(),
        },
        Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }).to_string(),
    }
}

fn serve_client(device: &Device, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    // Requests are short: cap a line at 64 KiB so a client cannot make us buffer forever.
    let reader = BufReader::new(stream.take(64 * 1024));
    for line in reader.lines() {
        let Ok(line) = line else { return };
        if out
            .write_all(format!("{}\n", answer(device, &line)).as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// The most `virtnet ctl` clients served at once; one more is closed at once.
pub const MAX_CTL_CLIENTS: usize = 16;

/// Serves `virtnet ctl` clients on `listener`, one thread per client, at most
/// [`MAX_CTL_CLIENTS`] at once.
pub fn serve_ctl(device: Arc<Device>, listener: UnixListener) {
    let clients = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                accept_failed(&e);
                continue;
            }
        };
        if clients.fetch_add(1, SeqCst) >= MAX_CTL_CLIENTS {
            clients.fetch_sub(1, SeqCst);
            tracing::warn!("too many ctl clients; closing the newest");
            continue;
        }
        let (d, c) = (device.clone(), clients.clone());
        let spawned = std::thread::Builder::new()
            .name("virtnet-ctl".into())
            .spawn(move || {
                serve_client(&d, stream);
                c.fetch_sub(1, SeqCst);
            });
        if spawned.is_err() {
            clients.fetch_sub(1, SeqCst);
        }
    }
}

/// Serves `GET /metrics` in the Prometheus text format; anything else gets a 404.
pub fn serve_metrics(device: Arc<Device>, listener: TcpListener) {
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                accept_failed(&e);
                continue;
            }
        };
        // One client at a time: neither a silent one nor one that never reads may hold the
        // endpoint for long.
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
        let mut buf = [0u8; 2048];
        let n = stream.read(&mut buf).unwrap_or(0);
        let head = String::from_utf8_lossy(&buf[..n]);
        let (status, body) =
            if head.starts_with("GET /metrics ") || head.starts_with("GET /metrics?") {
                ("200 OK", prometheus(&device.reports()))
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
        let _ = write!(
            stream,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

/// Client side: sends one request and returns the answer line.
pub fn request(socket: &std::path::Path, req: &Request) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(
        format!(
            "{}\n",
            serde_json::to_string(req).map_err(std::io::Error::other)?
        )
        .as_bytes(),
    )?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackendConfig, IoMode};

    #[test]
    fn requests_parse_and_answers_are_json() {
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"stats"}"#).unwrap(),
            Request::Stats
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"set-busy-poll","us":50}"#).unwrap(),
            Request::SetBusyPoll {
                us: BusyPoll::Fixed(50),
                queue: None
            }
        );
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"set-busy-poll","us":"auto"}"#).unwrap(),
            Request::SetBusyPoll {
                us: BusyPoll::Auto,
                queue: None
            }
        );
        let device = Device::new(BackendConfig {
            io: IoMode::Null { size: 64 },
            ..Default::default()
        })
        .unwrap();
        let a = answer(&device, r#"{"cmd":"set-busy-poll","us":20,"queue":1}"#);
        assert_eq!(a, r#"{"ok":true}"#);
        let a = answer(&device, r#"{"cmd":"set-busy-poll","us":0,"queue":0}"#);
        assert_eq!(a, r#"{"ok":true}"#);
        let stats: StatsReply =
            serde_json::from_str(&answer(&device, r#"{"cmd":"stats"}"#)).unwrap();
        assert_eq!(stats.queues.len(), 3);
        assert_eq!(stats.queues[2].kind, "ctrl");
        assert_eq!(stats.device.active_pairs, 1);
        assert_eq!(
            (stats.queues[0].busy_poll_us, stats.queues[1].busy_poll_us),
            (0, 20)
        );
        assert_eq!(
            (stats.queues[0].busy_poll, stats.queues[2].busy_poll),
            (BusyPoll::Off, BusyPoll::Auto),
            "the default is auto"
        );
        assert_eq!(stats.queues[1].counters["packets"], 0);
        assert!(
            answer(&device, r#"{"cmd":"set-busy-poll","us":20,"queue":9}"#).contains("no queue 9")
        );
        assert!(answer(&device, r#"{"cmd":"set-busy-poll","us":"often"}"#).contains("bad request"));
        assert!(answer(&device, "garbage").contains("bad request"));
    }
}
