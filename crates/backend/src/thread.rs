//! The thread of a worker and its command channel: how the protocol thread starts and stops
//! queues on a worker, and shuts it down.
//!
//! A worker sleeps in epoll; a command is a message on a channel plus a write to the worker's
//! wake eventfd, and a flag that the worker's busy-poll loop checks without a syscall.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::EventFd;

use super::error::Error;
use vring::RingPosition;

use super::queue::{QueueId, QueueRuntime};

/// The name of each pair's worker thread, followed by the pair's number (how the board of
/// pinned workers, `crate::siblings`, recognises another backend's worker).
pub const PAIR_THREAD: &str = "virtnet-pair";

/// Requests from the protocol thread to a worker.
#[derive(Debug)]
pub enum Command {
    Start(Box<QueueRuntime>),
    /// Stop queue `queue`, flushing its batch; the reply is its next avail index (None if it
    /// was not running).
    Stop {
        queue: QueueId,
        reply: mpsc::Sender<Option<RingPosition>>,
    },
    Shutdown,
}

/// The worker's end of the channel.
#[derive(Debug)]
pub struct Inbox {
    commands: mpsc::Receiver<Command>,
    /// Written with every command: the worker watches it in epoll.
    pub wake: EventFd,
    pending: Arc<AtomicBool>,
    shutting_down: Arc<AtomicBool>,
}

impl Inbox {
    /// Whether a shutdown is on its way, without a syscall (for busy polling).
    pub fn shutting_down(&self) -> bool {
        self.shutting_down
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether commands are waiting, without a syscall (for busy polling).
    pub fn pending(&self) -> bool {
        self.pending.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the pending flag: true if commands may be waiting.
    pub fn take_pending(&self) -> bool {
        self.pending.swap(false, SeqCst)
    }

    /// The next waiting command, if any.
    pub fn next(&self) -> Option<Command> {
        self.commands.try_recv().ok()
    }
}

/// Sleeps in `epoll` until an event comes; returns how many are in `events`. A signal
/// interrupting the wait is no event; any other failure is the worker's end.
pub fn wait_events(epoll: &Epoll, events: &mut [EpollEvent]) -> Result<usize, Error> {
    match epoll.wait(-1, events) {
        Ok(n) => Ok(n),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(Error::host("waiting in epoll")(e)),
    }
}

/// How long a stop may take before the worker counts as hung.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A worker that did not answer a stop request within [`STOP_TIMEOUT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the worker of queue {0} did not stop it within 5 s")]
pub struct StopTimedOut(pub QueueId);

/// The protocol thread's end of a worker.
#[derive(Debug)]
pub struct WorkerHandle {
    tx: mpsc::Sender<Command>,
    wake: EventFd,
    pending: Arc<AtomicBool>,
    shutting_down: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl WorkerHandle {
    /// Starts thread `name` running `body` on the worker's end of a new channel, woken
    /// through `wake`.
    pub fn spawn<F>(name: String, wake: EventFd, body: F) -> std::io::Result<WorkerHandle>
    where
        F: FnOnce(Inbox) + Send + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicBool::new(false));
        let shutting_down = Arc::new(AtomicBool::new(false));
        let inbox = Inbox {
            commands: rx,
            wake: wake.try_clone()?,
            pending: pending.clone(),
            shutting_down: shutting_down.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || body(inbox))?;
        Ok(WorkerHandle {
            tx,
            wake,
            pending,
            shutting_down,
            thread: Some(thread),
        })
    }

    fn send(&self, cmd: Command) {
        // The worker only goes away at shutdown, after which nobody sends.
        let _ = self.tx.send(cmd);
        self.pending.store(true, SeqCst);
        // A non-blocking eventfd fails only when its counter would overflow, and then it is
        // readable already: the worker wakes either way.
        let _ = self.wake.write(1);
    }

    /// Whether the worker's thread has ended. Before the handle is dropped it ends only if
    /// the worker could not start, or its loop failed or panicked, and its queues no longer
    /// run: what the hostile-input tests check that the input did not do.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    pub fn start(&self, q: QueueRuntime) {
        self.send(Command::Start(Box::new(q)));
    }

    /// Stops queue `queue` and returns its next avail index (None if it was not running),
    /// waiting at most 5 s; Err if the worker did not answer in time.
    pub fn stop(&self, queue: QueueId) -> Result<Option<RingPosition>, StopTimedOut> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::Stop { queue, reply });
        answer
            .recv_timeout(STOP_TIMEOUT)
            .map_err(|_| StopTimedOut(queue))
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.shutting_down.store(true, SeqCst);
        self.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
