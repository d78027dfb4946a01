//! The thread of a worker and its command channel: how the protocol thread hands a worker the
//! pairs it serves, starts and stops their queues, and shuts it down.
//!
//! A worker sleeps in epoll; a command is a message on a channel plus a write to the worker's
//! wake eventfd, and a flag that the worker's busy-poll loop checks without a syscall. A data
//! worker serves one or more queue pairs, each in a slot of its own ([`PairHandle`]): a
//! backend runs a worker per pair; a switch runs a few workers for the pairs of all its ports.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::epoll::{Epoll, EpollEvent};
use vmm_sys_util::eventfd::EventFd;

use super::error::Error;
use vring::RingPosition;

use super::pair::Pair;
use super::queue::{QueueId, QueueRuntime};

/// The name of each pair's worker thread, followed by the pair's number (how the board of
/// pinned workers, `crate::siblings`, recognises another backend's worker).
pub const PAIR_THREAD: &str = "virtnet-pair";

/// Requests from the protocol thread to a worker. `slot` names one of a data worker's pairs
/// (the control queue's worker has one queue and ignores it).
#[derive(Debug)]
pub enum Command {
    /// Serve `pair` in `slot` from now on.
    AddPair {
        slot: u32,
        pair: Box<Pair>,
    },
    /// Stop serving the pair in `slot` (its queues stopped as at GET_VRING_BASE).
    RemovePair {
        slot: u32,
    },
    Start {
        slot: u32,
        queue: Box<QueueRuntime>,
    },
    /// Stop queue `queue`, flushing its batch; the reply is where it stood (None if it was not
    /// running).
    Stop {
        slot: u32,
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
    /// The next slot a pair gets.
    next_slot: AtomicU32,
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
            next_slot: AtomicU32::new(0),
            wake,
            pending,
            shutting_down,
            thread: Some(thread),
        })
    }

    /// The wake-up eventfd the worker watches (a device's control commands write it so that
    /// the worker re-checks).
    pub fn wake(&self) -> &EventFd {
        &self.wake
    }

    fn send(&self, cmd: Command) {
        // The worker only goes away at shutdown, after which nobody sends.
        let _ = self.tx.send(cmd);
        self.pending.store(true, SeqCst);
        // A non-blocking eventfd fails only when its counter would overflow, and then it is
        // readable already: the worker wakes either way.
        let _ = self.wake.write(1);
    }

    /// The worker's thread's name.
    pub fn name(&self) -> &str {
        self.thread
            .as_ref()
            .and_then(|t| t.thread().name())
            .unwrap_or("")
    }

    /// Whether the worker's thread has ended. Before the handle is dropped it ends only if
    /// the worker could not start, or its loop failed or panicked, and its queues no longer
    /// run: what the hostile-input tests check that the input did not do.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Starts queue `q` on the worker's queue (a worker of one queue: the control queue's).
    pub fn start(&self, q: QueueRuntime) {
        self.start_in(0, q);
    }

    fn start_in(&self, slot: u32, q: QueueRuntime) {
        self.send(Command::Start {
            slot,
            queue: Box::new(q),
        });
    }

    /// Stops queue `queue` and returns where it stood (None if it was not running), waiting at
    /// most 5 s; Err if the worker did not answer in time.
    pub fn stop(&self, queue: QueueId) -> Result<Option<RingPosition>, StopTimedOut> {
        self.stop_in(0, queue)
    }

    fn stop_in(&self, slot: u32, queue: QueueId) -> Result<Option<RingPosition>, StopTimedOut> {
        let (reply, answer) = mpsc::channel();
        self.send(Command::Stop { slot, queue, reply });
        answer
            .recv_timeout(STOP_TIMEOUT)
            .map_err(|_| StopTimedOut(queue))
    }

    /// Hands `pair` to this data worker, in a slot of its own: the handle through which its
    /// queues start and stop, and which takes the pair back when dropped.
    pub fn add_pair(self: &Arc<WorkerHandle>, pair: Pair) -> PairHandle {
        let slot = self.next_slot.fetch_add(1, SeqCst);
        self.send(Command::AddPair {
            slot,
            pair: Box::new(pair),
        });
        PairHandle {
            worker: self.clone(),
            slot,
        }
    }
}

/// A queue pair's place on its data worker: how the protocol layer starts and stops the
/// pair's queues. Dropping it takes the pair off the worker (its queues stopped); the worker
/// itself ends with its last handle.
#[derive(Debug)]
pub struct PairHandle {
    worker: Arc<WorkerHandle>,
    slot: u32,
}

impl PairHandle {
    pub fn start(&self, q: QueueRuntime) {
        self.worker.start_in(self.slot, q);
    }

    /// Stops queue `queue` of the pair, as [`WorkerHandle::stop`].
    pub fn stop(&self, queue: QueueId) -> Result<Option<RingPosition>, StopTimedOut> {
        self.worker.stop_in(self.slot, queue)
    }

    /// Whether the worker's thread has ended (see [`WorkerHandle::is_finished`]).
    pub fn is_finished(&self) -> bool {
        self.worker.is_finished()
    }

    /// The worker serving the pair.
    pub fn worker(&self) -> &Arc<WorkerHandle> {
        &self.worker
    }
}

impl Drop for PairHandle {
    fn drop(&mut self) {
        // The worker's last pair: the worker shuts down with its handle, the pair with it.
        if Arc::strong_count(&self.worker) > 1 {
            self.worker.send(Command::RemovePair { slot: self.slot });
        }
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
