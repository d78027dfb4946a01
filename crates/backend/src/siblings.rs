//! The workers pinned to each CPU, so that one worker's contention check can tell the time its
//! siblings (other workers, which busy-poll under the same policy and end a poll as soon as
//! another task wants the CPU) took its CPU from the time other tasks did. Busy polling pays
//! between siblings (experiment 3b: two workers on one CPU, 10× the transactions of polling
//! off on AMD EPYC); it must stop for anything else.
//!
//! - **In this process**, each worker opens its own /proc/thread-self/schedstat before seccomp
//!   forbids opening, and puts it here; the others read it with `pread`, which the filter
//!   allows.
//! - **In other processes** (several backends, each serving one VM, with their workers pinned
//!   to one CPU): a worker under seccomp cannot open another's schedstat, so a thread of this
//!   process that is not filtered, the watcher, opens them for it. Each pinned worker takes a
//!   slot on a [`Board`], a small file that every backend of the same user shares (by default
//!   [`Board::default_path`]), and writes its CPU, process and thread there; the slot stays
//!   its own while its open file description holds a lock on it, so a process that dies gives
//!   it up. While this process has a worker on the board, the watcher reads the board every
//!   [`WATCH_EVERY`], opens /proc/PID/task/TID/schedstat of each live slot of another process
//!   (a thread named `virtnet-pair…`), and puts it beside this process's workers. Without it,
//!   auto in one backend took the other's polls for contention: one backed off, waited behind
//!   the other's polls at each wake-up, found contention again, and got a fifth of the
//!   other's transactions (`scripts/poll-contended.sh`; docs/PERFORMANCE-HISTORY.md, 2026-12-03
//!   14:06 and 17:04 UTC, Intel Xeon family 6 model 167).
//!
//! What is on the board is believed only as far as that: another process of the same user
//! can write anything there, and the worst it can do is make this worker count some thread
//! of a virtnet worker's name as a sibling, which changes only whether it polls.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use virtnet_sys::{Sched, SchedStat};

/// How often the watcher reads the board: a worker of another backend counts as a sibling
/// this long after it starts, at the latest (the contention check needs two intervals of
/// [`crate::poll::CHECK_EVERY`] in a row; a back-off this causes ends at its next check).
pub const WATCH_EVERY: Duration = Duration::from_millis(100);

/// A worker of this process: its schedstat, and its slot on the board if it has one.
#[derive(Debug)]
struct Member {
    stat: SchedStat,
    slot: Option<u64>,
}

/// What this process knows of pinned workers: its own, while they live, and the other
/// processes' the watcher found.
struct Registry {
    own: Vec<(usize, Weak<Member>)>,
    others: Vec<Other>,
    /// Whether the watcher runs.
    watching: bool,
}

/// Another process's worker: its slot, what the slot said when the watcher opened its
/// schedstat, and that schedstat.
struct Other {
    slot: u64,
    who: Slot,
    stat: SchedStat,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    own: Vec::new(),
    others: Vec::new(),
    watching: false,
});

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    fn own_members(&self) -> impl Iterator<Item = (usize, Arc<Member>)> + '_ {
        self.own
            .iter()
            .filter_map(|(c, w)| Some((*c, w.upgrade()?)))
    }
}

/// One worker's place in the registry and on the board; it leaves both when dropped.
#[derive(Debug)]
pub struct Sibling {
    cpu: Option<usize>,
    own: Arc<Member>,
    _board: Option<Board>,
}

impl Sibling {
    /// Registers the calling thread's `own` schedstat, as pinned to `cpu` (None: not pinned,
    /// so no other worker is known to share its CPU, and it knows of none), and when pinned
    /// takes a slot on the board at `board` (None: only this process's workers are known).
    pub fn join(cpu: Option<usize>, own: SchedStat, board: Option<&Path>) -> Sibling {
        // Under the lock: the watcher must not take the new slot for another process's.
        let mut reg = registry();
        let board = cpu.zip(board).and_then(|(cpu, path)| {
            let joined = Board::join(path, cpu).map_err(|e| {
                tracing::warn!(
                    path = %path.display(), error = %e,
                    "no board of pinned workers: other backends' polls will count as contention"
                )
            });
            if joined.is_ok() && !reg.watching {
                match spawn_watcher(path) {
                    Ok(()) => reg.watching = true,
                    Err(e) => tracing::warn!(error = %e, "cannot start the board's watcher"),
                }
            }
            joined.ok()
        });
        let own = Arc::new(Member {
            stat: own,
            slot: board.as_ref().map(|b| b.slot),
        });
        if let Some(cpu) = cpu {
            reg.own.retain(|(_, w)| w.strong_count() > 0);
            reg.own.push((cpu, Arc::downgrade(&own)));
        }
        Sibling {
            cpu,
            own,
            _board: board,
        }
    }

    /// This worker's figures, and the nanoseconds the other workers pinned to its CPU have
    /// run so far (a sum over those known now: it drops when one leaves).
    pub fn sample(&self) -> Option<(Sched, u64)> {
        let own = self.own.stat.sample()?;
        let Some(cpu) = self.cpu else {
            return Some((own, 0));
        };
        let reg = registry();
        let here = reg
            .own_members()
            .filter(|(c, m)| *c == cpu && !Arc::ptr_eq(m, &self.own))
            .filter_map(|(_, m)| m.stat.sample());
        let elsewhere = reg
            .others
            .iter()
            .filter(|o| o.who.cpu == cpu)
            .filter_map(|o| o.stat.sample());
        let siblings = here
            .chain(elsewhere)
            .map(|s| s.ran_ns)
            .fold(0u64, u64::saturating_add);
        Some((own, siblings))
    }
}

/// Starts the thread that keeps [`Registry::others`] up to date with the board at `path`;
/// it ends once no worker of this process is on the board. It runs where the worker that
/// started it is pinned, for a few microseconds per reading (a 4 KiB `pread` and a lock
/// query per used slot): the only cost of the board to a pinned worker that is idle.
fn spawn_watcher(path: &Path) -> io::Result<()> {
    let file = Board::open(path)?;
    std::thread::Builder::new()
        .name("virtnet-board".into())
        .spawn(move || loop {
            std::thread::sleep(WATCH_EVERY);
            let mut reg = registry();
            if !reg.own_members().any(|(_, m)| m.slot.is_some()) {
                reg.others.clear();
                reg.watching = false;
                return;
            }
            watch(&file, &mut reg);
        })?;
    Ok(())
}

/// One reading of the board: keeps the other processes' workers whose slot still holds
/// what it held, and opens the schedstat of those new since.
fn watch(file: &File, reg: &mut Registry) {
    let mut buf = [0u8; BOARD_BYTES as usize];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    let live =
        |slot: u64| virtnet_sys::range_locked(file, slot * SLOT_BYTES, SLOT_BYTES).unwrap_or(false);
    let ours: Vec<u64> = reg.own_members().filter_map(|(_, m)| m.slot).collect();
    let mut kept = Vec::new();
    for (record, slot) in buf[..n].chunks_exact(SLOT_BYTES as usize).zip(0u64..) {
        let Some(w) = Slot::parse(record) else {
            continue;
        };
        if ours.contains(&slot) || !live(slot) {
            continue;
        }
        if let Some(i) = reg.others.iter().position(|o| o.slot == slot && o.who == w) {
            kept.push(reg.others.swap_remove(i));
            continue;
        }
        if !w.is_worker_thread() {
            continue;
        }
        if let Ok(stat) = SchedStat::open_thread(w.pid, w.tid) {
            kept.push(Other { slot, who: w, stat });
        }
    }
    reg.others = kept;
}

/// Slots on a board: pinned workers of every backend of one user at once.
const SLOTS: u64 = 256;
/// A slot: the worker's CPU plus one (0: never used), its process id and its thread id, as
/// little-endian u32s, and four bytes unused.
const SLOT_BYTES: u64 = 16;
const BOARD_BYTES: u64 = SLOTS * SLOT_BYTES;

/// What a slot says.
#[derive(PartialEq, Eq)]
struct Slot {
    cpu: usize,
    pid: u32,
    tid: u32,
}

impl Slot {
    fn parse(record: &[u8]) -> Option<Slot> {
        let word = |i: usize| u32::from_le_bytes(record[i..i + 4].try_into().unwrap_or_default());
        Some(Slot {
            cpu: word(0).checked_sub(1)? as usize,
            pid: word(4),
            tid: word(8),
        })
    }

    fn record(&self) -> [u8; SLOT_BYTES as usize] {
        let mut rec = [0u8; SLOT_BYTES as usize];
        rec[0..4].copy_from_slice(&(self.cpu as u32 + 1).to_le_bytes());
        rec[4..8].copy_from_slice(&self.pid.to_le_bytes());
        rec[8..12].copy_from_slice(&self.tid.to_le_bytes());
        rec
    }

    /// Whether the thread is there and has a data worker's name (`crate::thread::PAIR_THREAD`): a slot
    /// another process wrote cannot name just any thread.
    fn is_worker_thread(&self) -> bool {
        std::fs::read(format!("/proc/{}/task/{}/comm", self.pid, self.tid))
            .is_ok_and(|name| name.starts_with(crate::thread::PAIR_THREAD.as_bytes()))
    }
}

/// Why a board file was refused, as an error.
fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("refused: {why}"))
}

/// One worker's slot on the shared file of pinned workers, its own while this open file
/// description holds a lock on it ([`virtnet_sys::try_lock_range`]).
#[derive(Debug)]
pub struct Board {
    _file: File,
    slot: u64,
}

impl Board {
    /// The board of this user's backends: in /dev/shm, which is memory.
    pub fn default_path() -> PathBuf {
        PathBuf::from(format!(
            "/dev/shm/virtnet-workers-{}",
            virtnet_sys::effective_uid()
        ))
    }

    /// Opens the board, creating it if there is none (O_EXCL, mode 0600), else the file that
    /// is there, never through a symbolic link (O_NOFOLLOW) and without waiting on a FIFO or
    /// taking a terminal (O_NONBLOCK, O_NOCTTY). Refuses, by what the open descriptor says
    /// (fstat: no race with a file swapped in at the path), anything but a regular file of
    /// this user that others cannot write and that has no other name: /dev/shm is everyone's,
    /// and the board is written to (its length set, slots written), so a file put there by
    /// another user, or a link to another file of ours (a guest's memory file), must not be.
    fn open(path: &Path) -> io::Result<File> {
        let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
        let mut options = File::options();
        options.read(true).write(true).custom_flags(flags);
        // Created by another backend between the two opens, or removed: try again.
        let mut tries = 0;
        let file = loop {
            tries += 1;
            match options.clone().create_new(true).mode(0o600).open(path) {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            match options.open(path) {
                Ok(f) => break f,
                Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 3 => {}
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Err(refused("a symbolic link (not followed)".into()));
                }
                Err(e) => return Err(e),
            }
        };
        let meta = file.metadata()?;
        let me = virtnet_sys::effective_uid();
        let why = if !meta.file_type().is_file() {
            Some(format!("not a regular file ({:?})", meta.file_type()))
        } else if meta.uid() != me {
            Some(format!(
                "owned by uid {}, not by this user ({me})",
                meta.uid()
            ))
        } else if meta.mode() & 0o022 != 0 {
            Some(format!(
                "writable by others (mode {:o})",
                meta.mode() & 0o7777
            ))
        } else if meta.nlink() != 1 {
            Some(format!("a file with {} names (a hard link)", meta.nlink()))
        } else {
            None
        };
        if let Some(why) = why {
            return Err(refused(why));
        }
        if meta.len() < BOARD_BYTES {
            file.set_len(BOARD_BYTES)?;
        }
        Ok(file)
    }

    /// Takes a free slot for the calling thread, pinned to `cpu`: an error when the file is
    /// refused or every slot is taken.
    pub fn join(path: &Path, cpu: usize) -> io::Result<Board> {
        if u32::try_from(cpu).map_or(true, |c| c == u32::MAX) {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "cpu number too large");
            return Err(e);
        }
        let file = Board::open(path)?;
        let me = Slot {
            cpu,
            pid: std::process::id(),
            tid: virtnet_sys::thread_id(),
        };
        for slot in 0..SLOTS {
            if virtnet_sys::try_lock_range(&file, slot * SLOT_BYTES, SLOT_BYTES)? {
                file.write_all_at(&me.record(), slot * SLOT_BYTES)?;
                return Ok(Board { _file: file, slot });
            }
        }
        Err(io::Error::other("every slot is taken"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until the calling thread has run `ms` milliseconds of CPU time.
    fn spin(ms: u64) {
        let t = virtnet_sys::thread_cpu_ns();
        while virtnet_sys::thread_cpu_ns() - t < ms * 1_000_000 {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_worker_sees_the_time_its_siblings_on_its_cpu_ran_and_not_the_others() {
        // Three threads: two "pinned to CPU 7" (only the registry's word: they run anywhere),
        // one to CPU 6. Each spins 50 ms of CPU time once registered, hands its registration
        // over, and lives on (a thread's schedstat reads only while it lives) until told to end.
        let (tx, rx) = std::sync::mpsc::channel();
        let done = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = [7, 7, 6]
            .into_iter()
            .enumerate()
            .map(|(i, cpu)| {
                let (tx, done) = (tx.clone(), done.clone());
                std::thread::spawn(move || {
                    let me = Sibling::join(Some(cpu), SchedStat::open().unwrap(), None);
                    spin(50);
                    tx.send((i, me)).unwrap();
                    done.wait();
                })
            })
            .collect();
        let mut workers: Vec<(usize, Sibling)> = rx.iter().take(3).collect();
        workers.sort_by_key(|(i, _)| *i);
        let mut workers = workers.into_iter().map(|(_, w)| w);
        let (a, b, c) = (
            workers.next().unwrap(),
            workers.next().unwrap(),
            workers.next().unwrap(),
        );
        let (own, siblings) = a.sample().unwrap();
        let b_ran = b.own.stat.sample().unwrap().ran_ns;
        assert!(own.ran_ns >= 40_000_000, "{own:?}");
        // b spins no more: its total is what a read just now sees, within a tick.
        assert!(siblings >= 40_000_000, "{siblings}");
        assert!(
            siblings.abs_diff(b_ran) < 5_000_000,
            "{siblings} against {b_ran}"
        );
        assert_eq!(c.sample().unwrap().1, 0, "alone on CPU 6");
        // One leaves: the other has no sibling any more.
        drop(b);
        assert_eq!(a.sample().unwrap().1, 0);
        // Not pinned: none known.
        let loose = Sibling::join(None, SchedStat::open().unwrap(), None);
        assert_eq!(loose.sample().unwrap().1, 0);
        done.wait();
        threads.into_iter().for_each(|t| t.join().unwrap());
    }

    fn board_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("virtnet-board-{}-{name}", std::process::id()))
    }

    fn slot_of(path: &Path, slot: u64) -> Option<Slot> {
        let all = std::fs::read(path).unwrap();
        let at = (slot * SLOT_BYTES) as usize;
        Slot::parse(&all[at..at + SLOT_BYTES as usize])
    }

    fn held(path: &Path, slot: u64) -> bool {
        let f = File::open(path).unwrap();
        virtnet_sys::range_locked(&f, slot * SLOT_BYTES, SLOT_BYTES).unwrap()
    }

    #[test]
    fn each_worker_takes_a_free_slot_and_leaves_it_when_it_goes() {
        let path = board_path("slots");
        let _ = std::fs::remove_file(&path);
        // Each join opens its own file description: to the locks, three processes.
        let a = Board::join(&path, 3).unwrap();
        let b = Board::join(&path, 3).unwrap();
        let c = Board::join(&path, 2).unwrap();
        assert_eq!((a.slot, b.slot, c.slot), (0, 1, 2));
        let s = slot_of(&path, 1).unwrap();
        assert_eq!(s.cpu, 3);
        assert_eq!(s.pid, std::process::id());
        assert_eq!(s.tid, virtnet_sys::thread_id());
        assert!(slot_of(&path, 3).is_none(), "never used");
        assert!(held(&path, 1) && !held(&path, 3));
        // b goes: its slot is free again, and the next worker takes it.
        drop(b);
        assert!(!held(&path, 1));
        let d = Board::join(&path, 4).unwrap();
        assert_eq!(d.slot, 1);
        assert_eq!(slot_of(&path, 1).unwrap().cpu, 4);
        drop((a, c, d));
        std::fs::remove_file(&path).unwrap();
    }

    /// Joining the board at `path` is refused, and the error says `what`.
    fn refused_with(path: &Path, what: &str) {
        let e = Board::join(path, 0).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }

    /// A file of ours, mode 0600, holding `bytes`: what a link put at the board's path would
    /// name (a guest's memory file, say).
    fn bystander(name: &str, bytes: &[u8]) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = board_path(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    }

    #[test]
    fn a_board_is_created_for_this_user_alone_and_then_shared() {
        let path = board_path("created");
        let _ = std::fs::remove_file(&path);
        let first = Board::join(&path, 0).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), virtnet_sys::effective_uid());
        assert_eq!(meta.len(), BOARD_BYTES);
        // The next worker opens the one that is there.
        let taken: Vec<Board> = (1..SLOTS).map(|_| Board::join(&path, 0).unwrap()).collect();
        // Full: every slot locked.
        assert!(Board::join(&path, 0).is_err());
        drop((first, taken));
        assert!(Board::join(&path, 0).is_ok(), "slots free again");
        assert!(Board::join(&path, u32::MAX as usize).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_symbolic_link_at_the_board_is_neither_followed_nor_written_through() {
        let path = board_path("symlink");
        let _ = std::fs::remove_file(&path);
        let target = bystander("symlink-target", b"a file of ours");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        refused_with(&path, "symbolic link");
        assert_eq!(std::fs::read(&target).unwrap(), b"a file of ours");
        // A link to nothing: nothing created where it points.
        let nowhere = board_path("symlink-nowhere");
        let _ = std::fs::remove_file(&nowhere);
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&nowhere, &path).unwrap();
        refused_with(&path, "symbolic link");
        assert!(!nowhere.exists(), "created through the link");
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&target).unwrap();
    }

    #[test]
    fn a_fifo_a_directory_or_a_hard_link_at_the_board_is_refused_at_once() {
        let path = board_path("fifo");
        let _ = std::fs::remove_file(&path);
        let made = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(made.unwrap().success(), "mkfifo");
        let t = std::time::Instant::now();
        refused_with(&path, "not a regular file");
        assert!(t.elapsed() < Duration::from_secs(1), "waited on the FIFO");
        std::fs::remove_file(&path).unwrap();

        let dir = board_path("dir");
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        assert!(Board::join(&dir, 0).is_err(), "a directory");
        std::fs::remove_dir(&dir).unwrap();

        // Another name of a file of ours: its length and bytes stay as they were.
        let path = board_path("hardlink");
        let _ = std::fs::remove_file(&path);
        let target = bystander("hardlink-target", b"a file of ours");
        std::fs::hard_link(&target, &path).unwrap();
        refused_with(&path, "hard link");
        assert_eq!(std::fs::read(&target).unwrap(), b"a file of ours");
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&target).unwrap();
    }

    #[test]
    fn a_board_that_others_may_write_or_that_another_user_owns_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let path = board_path("others");
        for mode in [0o620, 0o602, 0o666] {
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            refused_with(&path, "writable by others");
        }
        // Another user's (root can give a file away; others cannot make one).
        if virtnet_sys::effective_uid() == 0 {
            let _ = std::fs::remove_file(&path);
            let _ = bystander("others", b"");
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            refused_with(&path, "owned by uid 65534");
        } else {
            eprintln!("skipped the other user's board: needs root to chown");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_worker_whose_board_is_refused_goes_on_without_one() {
        let path = board_path("refused");
        let _ = std::fs::remove_file(&path);
        let target = bystander("refused-target", b"");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let me = Sibling::join(Some(3), SchedStat::open().unwrap(), Some(&path));
        assert!(me.own.slot.is_none() && me._board.is_none());
        assert!(me.sample().is_some());
        assert_eq!(std::fs::read(&target).unwrap(), b"");
        drop(me);
        std::fs::remove_file(&path).unwrap();
        std::fs::remove_file(&target).unwrap();
    }

    #[test]
    fn a_worker_counts_the_workers_of_other_processes_on_its_cpu_from_the_board() {
        // "Other processes' workers": threads of this one on the board, outside the registry.
        let path = board_path("watched");
        let _ = std::fs::remove_file(&path);
        let (tx, rx) = std::sync::mpsc::channel();
        let (leave_tx, leave_rx) = std::sync::mpsc::channel::<()>();
        let leave = Arc::new(Mutex::new(leave_rx));
        let threads: Vec<_> = [
            ("virtnet-pair7", 5),
            ("virtnet-pair8", 6),
            ("not-a-worker", 5),
        ]
        .into_iter()
        .map(|(name, cpu)| {
            let (tx, path, leave) = (tx.clone(), path.clone(), leave.clone());
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    let board = Board::join(&path, cpu).unwrap();
                    spin(50);
                    let ran = SchedStat::open().unwrap().sample().unwrap().ran_ns;
                    tx.send((name, (ran, virtnet_sys::thread_id()))).unwrap();
                    let _ = leave.lock().unwrap().recv();
                    drop(board);
                })
                .unwrap()
        })
        .collect();
        let ran: std::collections::HashMap<_, _> = rx.iter().take(3).collect();
        let (worker7, tid7) = ran["virtnet-pair7"];
        // A slot whose lock nobody holds (a worker that died) naming a live worker.
        let f = File::options().write(true).open(&path).unwrap();
        let dead = Slot {
            cpu: 5,
            pid: std::process::id(),
            tid: tid7,
        };
        f.write_all_at(&dead.record(), 10 * SLOT_BYTES).unwrap();

        let me = Sibling::join(Some(5), SchedStat::open().unwrap(), Some(&path));
        assert!(worker7 >= 40_000_000);
        // Within a few readings of the board: virtnet-pair7 alone (not the thread on CPU 6,
        // not the thread of another name, not the dead slot, not itself).
        assert!(
            within_readings(|| {
                let s = me.sample().unwrap().1;
                s.abs_diff(worker7) < 5_000_000
            }),
            "{:?} against {worker7}",
            me.sample()
        );
        // They leave: within a few readings, none is counted.
        drop(leave_tx);
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(within_readings(|| me.sample().unwrap().1 == 0));
        drop(me);
        std::fs::remove_file(&path).unwrap();
    }

    /// Whether `f` holds within twenty readings of the board.
    fn within_readings(f: impl Fn() -> bool) -> bool {
        (0..20).any(|_| {
            std::thread::sleep(WATCH_EVERY);
            f()
        })
    }
}
