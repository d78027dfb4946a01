//! The backend's control plane: a unix socket for `virtnet ctl` (one JSON request per line,
//! one JSON answer per line) and a Prometheus `/metrics` endpoint over plain HTTP (one request
//! per connection). Both serve their clients through [`endpoint`]: concurrently, a bounded
//! number at once, each request and answer under a deadline.
//!
//! Requests: `{"cmd":"stats"}` and `{"cmd":"set-busy-poll","us":50,"queue":1}` (`us`: a
//! timeout in microseconds, 0 off, or `"auto"`; `queue` optional: all queues). A switch
//! (`crate::switch::ctl`) also takes `ports`, `fdb`, `port-add` and `port-remove`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::endpoint::{self, Bound, Client};
use super::metrics::{prometheus, QueueReport};
use super::{BusyPoll, Device};

/// The most `virtnet ctl` clients served at once. One more is served too: the client that
/// has waited longest is closed to make room.
pub const MAX_CTL_CLIENTS: usize = 16;

/// How long a ctl client may wait before sending a request (its first, or its next).
pub const CTL_IDLE: Duration = Duration::from_secs(30);

/// How long a ctl request may take, from its first byte to its newline.
pub const CTL_REQUEST: Duration = Duration::from_secs(5);

/// The longest ctl request line: a longer one is refused, and its client closed.
pub const MAX_CTL_REQUEST: usize = 64 * 1024;

/// The most /metrics clients served at once (a Prometheus server scrapes with one or two),
/// and, as for ctl, one more served by closing the one that has waited longest.
pub const MAX_METRICS_CLIENTS: usize = 8;

/// How long a /metrics client has from connecting to the end of its request head.
pub const HTTP_HEAD: Duration = Duration::from_secs(5);

/// The longest HTTP request head taken; a longer one is answered 431.
pub const MAX_HTTP_HEAD: usize = 8 * 1024;

/// How long writing one answer may take, whole, on either endpoint: a client that reads it
/// too slowly or not at all is closed then.
pub const ANSWER: Duration = Duration::from_secs(5);

const CTL: Bound = Bound {
    what: "ctl",
    thread: "virtnet-ctl",
    max_clients: MAX_CTL_CLIENTS,
};

const METRICS: Bound = Bound {
    what: "metrics",
    thread: "virtnet-metrics",
    max_clients: MAX_METRICS_CLIENTS,
};

#[derive(Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Stats,
    SetBusyPoll {
        us: BusyPoll,
        queue: Option<usize>,
    },
    /// A switch's ports: their queues, workers and counters.
    Ports,
    /// A switch's MAC table.
    Fdb,
    /// Adds a port to a switch: `spec` as `virtnet switch --port` takes it.
    PortAdd {
        spec: String,
    },
    /// Removes a switch's port.
    PortRemove {
        name: String,
    },
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
        Ok(_) => {
            serde_json::json!({ "error": "a switch's request; this is a backend" }).to_string()
        }
        Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }).to_string(),
    }
}

/// Serves `virtnet ctl` clients on `listener`, each on a thread named `virtnet-ctl`, at most
/// [`MAX_CTL_CLIENTS`] at once. Returns only if the listener fails for good.
pub fn serve_ctl(device: Arc<Device>, listener: UnixListener) {
    serve_lines(listener, move |line| answer(&device, line));
}

/// Serves ctl clients on `listener` as [`serve_ctl`] does, each request line answered by
/// `answer` (a JSON line): the device's requests, or a switch's.
pub fn serve_lines(
    listener: UnixListener,
    answer: impl Fn(&str) -> String + Send + Sync + 'static,
) {
    endpoint::serve(listener.incoming(), CTL, move |client| {
        serve_ctl_client(&answer, client)
    });
}

/// Answers one ctl client's requests, one line each, until it closes or misses a deadline.
fn serve_ctl_client(answer: &dyn Fn(&str) -> String, client: &mut Client<UnixStream>) {
    let mut reader = BufReader::new(client);
    let mut line = Vec::new();
    loop {
        reader.get_mut().deadline_in(CTL_IDLE);
        if !matches!(reader.fill_buf(), Ok(b) if !b.is_empty()) {
            return;
        }
        // A request has started: the rest of its line is due by CTL_REQUEST.
        reader.get_mut().deadline_in(CTL_REQUEST);
        line.clear();
        let limit = MAX_CTL_REQUEST as u64;
        if (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .is_err()
        {
            return;
        }
        let too_long = line.len() >= MAX_CTL_REQUEST && line.last() != Some(&b'\n');
        let text = if too_long {
            serde_json::json!({ "error": format!("request longer than {MAX_CTL_REQUEST} bytes") })
                .to_string()
        } else {
            answer(&String::from_utf8_lossy(&line))
        };
        let client = reader.get_mut();
        client.deadline_in(ANSWER);
        if client.write_all(format!("{text}\n").as_bytes()).is_err() || too_long {
            return;
        }
        client.answered();
    }
}

/// Serves `GET /metrics` in the Prometheus text format (anything else gets a 404), each
/// client on a thread named `virtnet-metrics`, at most [`MAX_METRICS_CLIENTS`] at once.
/// Returns only if the listener fails for good.
pub fn serve_metrics(device: Arc<Device>, listener: TcpListener) {
    serve_metrics_with(listener, move || prometheus(&device.reports()));
}

/// Serves /metrics as [`serve_metrics`] does, the text rendered by `render` (a device's, or a
/// switch's).
pub fn serve_metrics_with(
    listener: TcpListener,
    render: impl Fn() -> String + Send + Sync + 'static,
) {
    endpoint::serve(listener.incoming(), METRICS, move |client| {
        serve_scrape(&render, client)
    });
}

/// One HTTP exchange: the request head by [`HTTP_HEAD`], the answer, and the connection
/// closed.
fn serve_scrape(render: &dyn Fn() -> String, client: &mut Client<TcpStream>) {
    client.deadline_in(HTTP_HEAD);
    let (status, body) = match read_head(client) {
        Ok(Head::Complete(head)) if asks_for_metrics(&head) => ("200 OK", render()),
        Ok(Head::Complete(_)) => ("404 Not Found", "not found\n".to_string()),
        Ok(Head::TooLong) => (
            "431 Request Header Fields Too Large",
            "request head too long\n".to_string(),
        ),
        // Closed before the end of its head, or too slow to send it.
        Ok(Head::Closed) | Err(_) => return,
    };
    client.deadline_in(ANSWER);
    let _ = write!(
        client,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// An HTTP request head as read.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Up to and with the empty line that ends it.
    Complete(Vec<u8>),
    /// [`MAX_HTTP_HEAD`] bytes without its end.
    TooLong,
    /// The client closed first.
    Closed,
}

/// Reads a request head from `r`. Bytes after its end (a body) may be read too, and dropped.
fn read_head(r: &mut impl Read) -> std::io::Result<Head> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        // The empty line that ends it may have begun in the bytes read before.
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head_end(&head[from..]) {
            head.truncate(from + end);
            return Ok(Head::Complete(head));
        }
        if head.len() >= MAX_HTTP_HEAD {
            return Ok(Head::TooLong);
        }
    }
}

/// Where the empty line ending a head ends in `bytes`, if it is there: CRLF CRLF, or bare
/// LFs, which RFC 9112 lets a server accept.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let find = |end: &[u8]| {
        let at = bytes.windows(end.len()).position(|w| w == end)?;
        Some(at + end.len())
    };
    [find(b"\r\n\r\n"), find(b"\n\n")]
        .into_iter()
        .flatten()
        .min()
}

/// Whether a request head is `GET /metrics` (with or without a query).
fn asks_for_metrics(head: &[u8]) -> bool {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, target) = (words.next(), words.next());
    let path = target.and_then(|t| t.split(|&b| b == b'?').next());
    method == Some(b"GET") && path == Some(b"/metrics")
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

    /// Hands out `bytes` a few at a time, as a slow client sends them.
    struct Chunks<'a>(&'a [u8], usize);
    impl Read for Chunks<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.1.min(self.0.len()).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn an_http_head_is_read_to_its_empty_line_in_any_pieces_and_bounded() {
        let get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        for piece in [1, 2, 3, 5, 1024] {
            let mut with_body = get.to_vec();
            with_body.extend_from_slice(b"body");
            let head = read_head(&mut Chunks(&with_body, piece)).unwrap();
            assert_eq!(head, Head::Complete(get.to_vec()), "pieces of {piece}");
        }
        let bare = b"GET /metrics?x=1 HTTP/1.0\nHost: x\n\n";
        assert_eq!(
            read_head(&mut Chunks(bare, 7)).unwrap(),
            Head::Complete(bare.to_vec())
        );
        let cut = b"GET /metrics HTTP/1.1\r\nHost: x\r\n";
        assert_eq!(read_head(&mut Chunks(cut, 4)).unwrap(), Head::Closed);
        let endless = [b'a'; MAX_HTTP_HEAD + 100];
        assert_eq!(
            read_head(&mut Chunks(&endless, 1000)).unwrap(),
            Head::TooLong
        );
    }

    #[test]
    fn only_get_metrics_asks_for_metrics() {
        assert!(asks_for_metrics(b"GET /metrics HTTP/1.1\r\n\r\n"));
        assert!(asks_for_metrics(b"GET /metrics?name=x HTTP/1.1\r\n\r\n"));
        assert!(!asks_for_metrics(b"GET /metricsx HTTP/1.1\r\n\r\n"));
        assert!(!asks_for_metrics(b"POST /metrics HTTP/1.1\r\n\r\n"));
        assert!(!asks_for_metrics(b"GET / HTTP/1.1\r\n\r\n"));
        assert!(!asks_for_metrics(b"\r\n\r\n"));
    }
}
