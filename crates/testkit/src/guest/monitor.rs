//! QEMU's human monitor on a unix socket, as the tests drive it: one command at a time, and
//! the waits of a live migration on its source and its destination.

use std::path::Path;
use std::time::{Duration, Instant};

/// QEMU's human monitor on a unix socket
/// ([`GuestConfig::monitor`](super::GuestConfig::monitor)): one command at a time, its output
/// up to the next prompt.
#[derive(Debug)]
pub struct Monitor {
    stream: std::os::unix::net::UnixStream,
}

impl Monitor {
    /// Connects to the monitor at `path` (retrying while QEMU starts, up to `wait`) and reads
    /// its banner.
    pub fn connect(path: &Path, wait: Duration) -> Result<Monitor, String> {
        let deadline = Instant::now() + wait;
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("monitor {}: {e}", path.display()))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let mut m = Monitor { stream };
        m.until_prompt()?;
        Ok(m)
    }

    fn until_prompt(&mut self) -> Result<String, String> {
        use std::io::Read;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !out.ends_with(b"(qemu) ") {
            let n = self
                .stream
                .read(&mut buf)
                .map_err(|e| format!("monitor: {e}"))?;
            if n == 0 {
                return Err("monitor closed".to_string());
            }
            out.extend_from_slice(&buf[..n]);
        }
        out.truncate(out.len() - b"(qemu) ".len());
        // The monitor echoes the command with terminal escapes; keep the plain text.
        let text = String::from_utf8_lossy(&out)
            .replace('\r', "")
            .chars()
            .filter(|c| !c.is_control() || *c == '\n')
            .collect();
        Ok(text)
    }

    /// Runs `command`; what the monitor printed before its next prompt.
    pub fn command(&mut self, command: &str) -> Result<String, String> {
        use std::io::Write;
        self.stream
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|e| format!("monitor: {e}"))?;
        self.until_prompt()
    }

    /// Polls `info migrate` until the migration's status is "completed", up to `limit`; the
    /// last output. A failed or cancelled migration is an error at once.
    pub fn wait_migrated(&mut self, limit: Duration) -> Result<String, String> {
        let done = |s: &str| matches!(s, "completed" | "failed" | "cancelled");
        let every = Duration::from_millis(200);
        let (status, out) = self
            .poll_until("info migrate", "Migration status:", done, every, limit)
            .map_err(|out| format!("migration not done in {limit:?}:\n{out}"))?;
        match status.as_str() {
            "completed" => Ok(out),
            _ => Err(format!("migration {status}:\n{out}")),
        }
    }

    /// On a migration's destination: polls `info status` until the guest is no longer in
    /// "inmigrate", that is until this QEMU has loaded all the source sent, up to `limit`; the
    /// last status. The source reports "completed" once it has sent the last pages, which the
    /// destination may still be reading.
    pub fn wait_incoming(&mut self, limit: Duration) -> Result<String, String> {
        let loaded = |s: &str| !s.is_empty() && !s.contains("inmigrate");
        let every = Duration::from_millis(50);
        self.poll_until("info status", "VM status:", loaded, every, limit)
            .map(|(status, _)| status)
            .map_err(|out| format!("incoming migration not loaded in {limit:?}:\n{out}"))
    }

    /// Runs `command` every `every` until `done` accepts the value of its `label` line, up to
    /// `limit`: (that value, the output). Past `limit`, the last output is the error; a monitor
    /// that fails is one too.
    fn poll_until(
        &mut self,
        command: &str,
        label: &str,
        done: impl Fn(&str) -> bool,
        every: Duration,
        limit: Duration,
    ) -> Result<(String, String), String> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.command(command)?;
            let status = out
                .lines()
                .find_map(|l| l.trim().strip_prefix(label))
                .map(str::trim)
                .unwrap_or("");
            if done(status) {
                return Ok((status.to_string(), out));
            }
            if Instant::now() >= deadline {
                return Err(out);
            }
            std::thread::sleep(every);
        }
    }
}
