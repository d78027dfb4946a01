//! Child processes for tests: killed when the test ends (even on panic, and if the test process
//! itself is killed), with their output collected line by line and waited on with deadlines.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The output of a child, as lines (without `\r\n`), stdout and stderr interleaved in arrival
/// order.
#[derive(Debug, Default)]
pub struct OutputLog {
    state: Mutex<LogState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct LogState {
    lines: Vec<String>,
    open_streams: usize,
}

/// Why a wait on a child's output ended without a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitError {
    /// The deadline passed.
    Timeout,
    /// The child closed its output (it exited) before a line matched.
    Closed,
}

impl OutputLog {
    /// Waits until a line at index `from` or later satisfies `pred`; returns its index and text.
    pub fn wait_for(
        &self,
        from: usize,
        deadline: Instant,
        mut pred: impl FnMut(&str) -> bool,
    ) -> Result<(usize, String), WaitError> {
        let mut state = self.state.lock().unwrap();
        let mut next = from;
        loop {
            while next < state.lines.len() {
                if pred(&state.lines[next]) {
                    return Ok((next, state.lines[next].clone()));
                }
                next += 1;
            }
            if state.open_streams == 0 {
                return Err(WaitError::Closed);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(WaitError::Timeout);
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// Waits until the child has closed stdout and stderr, or the deadline passes.
    pub fn wait_closed(&self, deadline: Instant) -> bool {
        let mut state = self.state.lock().unwrap();
        while state.open_streams > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self.changed.wait_timeout(state, deadline - now).unwrap().0;
        }
        true
    }

    /// Lines logged so far.
    pub fn len(&self) -> usize {
        self.state.lock().unwrap().lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn lines(&self) -> Vec<String> {
        self.state.lock().unwrap().lines.clone()
    }

    pub fn lines_from(&self, from: usize) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state.lines[from.min(state.lines.len())..].to_vec()
    }

    /// The last `n` lines, joined, for error messages.
    pub fn tail(&self, n: usize) -> String {
        let state = self.state.lock().unwrap();
        let start = state.lines.len().saturating_sub(n);
        state.lines[start..].join("\n")
    }

    fn push(&self, line: String) {
        self.state.lock().unwrap().lines.push(line);
        self.changed.notify_all();
    }

    fn close_stream(&self) {
        self.state.lock().unwrap().open_streams -= 1;
        self.changed.notify_all();
    }

    /// Reads `stream` on a thread until EOF, appending lines (and copying them to `tee`).
    fn follow(self: &Arc<Self>, stream: impl Read + Send + 'static, tee: Option<Arc<Mutex<File>>>) {
        self.state.lock().unwrap().open_streams += 1;
        let log = Arc::clone(self);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if let Some(tee) = &tee {
                            let _ = tee.lock().unwrap().write_all(&buf);
                        }
                        while matches!(buf.last(), Some(b'\n' | b'\r')) {
                            buf.pop();
                        }
                        log.push(String::from_utf8_lossy(&buf).into_owned());
                    }
                }
            }
            log.close_stream();
        });
    }
}

/// A running child process, killed and reaped on drop.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    pub out: Arc<OutputLog>,
}

impl Proc {
    /// Spawns `cmd` with stdout and stderr collected (and copied to `tee` if given), stdin piped
    /// if `with_stdin`, else /dev/null.
    ///
    /// The child gets SIGKILL when the spawning thread exits (PR_SET_PDEATHSIG), so a test
    /// process killed by a timeout leaves no QEMU or testpmd spinning behind. The thread that
    /// spawns must therefore outlive the child: keep the `Proc` in the test's own thread.
    pub fn spawn(
        name: &str,
        mut cmd: Command,
        tee: Option<&Path>,
        with_stdin: bool,
    ) -> io::Result<Proc> {
        cmd.stdin(if with_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let die_with_parent = || {
            // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers; prctl is
            // async-signal-safe, as code between fork and exec must be.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: the closure runs in the forked child before exec, touches no memory of the
        // parent and takes no locks.
        unsafe {
            cmd.pre_exec(die_with_parent);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("spawning {name} ({cmd:?}): {e}")))?;
        let tee = match tee {
            Some(path) => Some(Arc::new(Mutex::new(File::create(path)?))),
            None => None,
        };
        let out = Arc::new(OutputLog::default());
        out.follow(child.stdout.take().expect("piped stdout"), tee.clone());
        out.follow(child.stderr.take().expect("piped stderr"), tee);
        let stdin = child.stdin.take();
        Ok(Proc {
            name: name.to_string(),
            child,
            stdin,
            out,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes `line` and a newline to the child's stdin.
    pub fn send_line(&mut self, line: &str) -> io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("{}: no stdin", self.name),
            )
        })?;
        stdin.write_all(format!("{line}\n").as_bytes())?;
        stdin.flush()
    }

    /// Closes the child's stdin (EOF).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for the child to exit, until `deadline`. Returns `None` if it is still running.
    pub fn wait_exit(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait() {
                // Let the readers drain what the child wrote last.
                self.out
                    .wait_closed(Instant::now() + Duration::from_secs(2));
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the child (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stdin = None;
        if self.try_wait().is_none() {
            self.kill();
        }
    }
}

/// Waits until `path` exists (a server's unix socket), failing early if `proc` exits.
pub fn wait_for_path(proc: &mut Proc, path: &Path, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if proc.try_wait().is_some() {
            proc.out
                .wait_closed(Instant::now() + Duration::from_secs(2));
            return Err(format!(
                "{} exited before creating {}:\n{}",
                proc.name(),
                path.display(),
                proc.out.tail(30)
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{} did not create {} within {limit:?}:\n{}",
                proc.name(),
                path.display(),
                proc.out.tail(30)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Runs `cmd` to completion with a time limit, returning (success, combined output).
pub fn run_with_timeout(name: &str, cmd: Command, limit: Duration) -> io::Result<(bool, String)> {
    let mut proc = Proc::spawn(name, cmd, None, false)?;
    match proc.wait_exit(Instant::now() + limit) {
        Some(status) => Ok((status.success(), proc.out.lines().join("\n"))),
        None => {
            proc.kill();
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{name} still running after {limit:?}: {}",
                    proc.out.tail(20)
                ),
            ))
        }
    }
}

/// Runs a short command and returns its output, or an error with the output if it failed.
pub fn run_checked(name: &str, cmd: Command, limit: Duration) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    match run_with_timeout(name, cmd, limit) {
        Ok((true, out)) => Ok(out),
        Ok((false, out)) => Err(format!("{shown} failed: {out}")),
        Err(e) => Err(format!("{shown}: {e}")),
    }
}
