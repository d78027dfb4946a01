//! The device side of the control virtqueue (spec 5.1.6.5): MQ VQ_PAIRS_SET, the receive
//! filter (RX promisc/allmulti, MAC_ADDR_SET, MAC_TABLE_SET) and notification coalescing (NOTF_COAL,
//! VQ_NOTF_COAL SET/GET), on a thread of its own.
//!
//! Each command answers in its own chain: a reply (VQ_NOTF_COAL GET) at the start of the
//! writable part and the ack in its last byte. A command the device cannot decode or apply is
//! acked ERR; only a chain the ring engine refuses breaks the queue. `ctrl_delay_us` (the
//! `experiments` feature) makes the device slow on purpose, for the benchmark of polling
//! against interrupt-driven completion.

use std::os::fd::AsRawFd;
use std::sync::Arc;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vring::{Chain, GuestMemory, Reader, Writer};

use super::error::Error;
use super::queue::{
    break_queue, install_queue, notify, retire_queue, FaultWatch, QueueId, QueueRuntime,
};
use super::shared::Shared;
use super::thread::{wait_events, Command, Inbox};
use vnet::ctrl::{self, Coalesce, Command as CtrlCommand};

/// Commands are a few bytes, MAC_TABLE_SET's lists up to some 680 addresses (a driver lists
/// its multicast groups and extra unicast addresses: a few); anything longer is refused
/// without reading it all.
const MAX_COMMAND: u64 = 4096;
/// Commands answered per turn: then the thread looks at its own requests (a queue stop)
/// before it goes on, however fast the guest adds commands.
pub(crate) const CTRL_WEIGHT: usize = 64;

const EV_WAKE: u64 = 0;
const EV_KICK: u64 = 1;

/// The control queue's worker thread.
#[derive(Debug)]
pub struct CtrlWorker {
    shared: Arc<Shared>,
    inbox: Inbox,
    epoll: Epoll,
    queue: Option<QueueRuntime>,
    chain: Chain,
    faults: FaultWatch,
}

/// Handles the commands pending on the control queue `q`, at most [`CTRL_WEIGHT`]; returns how
/// many. Each gets its ack at once; a chain the ring engine refuses breaks the queue (and nothing more is done on
/// it until the frontend restarts it). The control thread calls this on every wake-up; the
/// control-queue fuzz target calls it without the thread (`fuzzing::process_commands`).
pub(crate) fn process_commands(shared: &Shared, q: &mut QueueRuntime, chain: &mut Chain) -> usize {
    if !q.usable() {
        return 0;
    }
    let mut done = 0;
    while done < CTRL_WEIGHT {
        // Control commands are rare and latency-bound: answer each one at once.
        q.set_used_batch(1);
        match q.pop_into(chain) {
            Ok(true) => {}
            Ok(false) => return done,
            Err(e) => {
                break_queue(q, &e.into());
                return done;
            }
        }
        #[cfg(feature = "experiments")]
        if shared.config().ctrl_delay_us > 0 {
            let delay = shared.config().ctrl_delay_us as u64;
            std::thread::sleep(std::time::Duration::from_micros(delay));
        }
        let result = CtrlWorker::answer(shared, q.memory(), chain);
        let c = &q.counters();
        c.ctrl_commands.add(1);
        let (written, refused) = result;
        if let Some(e) = refused {
            tracing::debug!(error = %e, "control command refused");
            c.ctrl_errors.add(1);
        }
        if let Err(e) = q.add_used_written(chain, written, true) {
            break_queue(q, &e.into());
            return done;
        }
        notify(q);
        done += 1;
    }
    done
}

impl CtrlWorker {
    pub fn new(shared: Arc<Shared>, inbox: Inbox) -> std::io::Result<CtrlWorker> {
        Ok(CtrlWorker {
            shared,
            inbox,
            epoll: Epoll::new()?,
            queue: None,
            chain: Chain::new(),
            faults: FaultWatch::default(),
        })
    }

    /// Runs until shut down, or until its epoll set fails (then no control queue can run).
    pub fn run(&mut self) -> Result<(), Error> {
        if self.shared.config().seccomp {
            virtnet_sys::sandbox::restrict_thread().map_err(Error::host(
                "installing the control worker's seccomp filter",
            ))?;
        }
        self.epoll
            .ctl(
                ControlOperation::Add,
                self.inbox.wake.as_raw_fd(),
                EpollEvent::new(EventSet::IN, EV_WAKE),
            )
            .map_err(Error::host("building the control worker's epoll set"))?;
        let mut events = vec![EpollEvent::default(); 4];
        loop {
            if self.inbox.take_pending() && !self.handle_commands() {
                return Ok(());
            }
            let processed = self.process();
            self.faults.check(self.queue.iter());
            if processed > 0 {
                continue;
            }
            if let Some(q) = self.queue.as_mut().filter(|q| q.usable()) {
                match q.enable_notification() {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => break_queue(q, &e.into()),
                }
            }
            let n = wait_events(&self.epoll, &mut events)?;
            for ev in &events[..n] {
                match ev.data() {
                    EV_WAKE => {
                        let _ = self.inbox.wake.read();
                    }
                    EV_KICK => self.queue.iter().for_each(QueueRuntime::take_kick),
                    _ => {}
                }
            }
            if let Some(q) = self.queue.as_mut() {
                q.disable_notification();
            }
        }
    }

    /// Applies start/stop requests; returns false on shutdown.
    fn handle_commands(&mut self) -> bool {
        while let Some(cmd) = self.inbox.next() {
            match cmd {
                Command::Start { queue, .. } => {
                    let q = install_queue(&self.epoll, *queue, EV_KICK);
                    if let Some(old) = self.queue.replace(q) {
                        retire_queue(&self.epoll, old);
                    }
                }
                Command::Stop { reply, .. } => {
                    let _ = reply.send(self.queue.take().map(|q| retire_queue(&self.epoll, q)));
                }
                Command::Shutdown => return false,
                // Pairs are data workers' business.
                Command::AddPair { .. } | Command::RemovePair { .. } => {}
            }
        }
        true
    }

    /// Handles every pending command; returns how many.
    fn process(&mut self) -> usize {
        match self.queue.as_mut() {
            Some(q) => process_commands(&self.shared, q, &mut self.chain),
            None => 0,
        }
    }

    /// Decodes, applies and acks one command chain. Returns the used length, which covers the
    /// ack in the last writable byte, and why the command was refused, if it was.
    fn answer(shared: &Shared, mem: &GuestMemory, chain: &Chain) -> (u32, Option<String>) {
        let writable = chain.writable_len();
        if writable == 0 {
            return (0, Some("no room for the ack".into()));
        }
        let (ack, reply) = match Self::read_command(mem, chain) {
            Ok(cmd) if (writable as usize) < cmd.reply_len() + 1 => (
                ctrl::ERR,
                Err(format!(
                    "{cmd:?} needs {} writable bytes",
                    cmd.reply_len() + 1
                )),
            ),
            Ok(cmd) => match Self::apply(shared, cmd) {
                Ok(reply) => (ctrl::OK, Ok(reply)),
                Err(e) => (ctrl::ERR, Err(e)),
            },
            Err(e) => (ctrl::ERR, Err(e)),
        };
        let segs = chain.writable();
        if let Ok(Some(r)) = &reply {
            if let Err(e) = Writer::new(mem, segs).write_all(r) {
                return (0, Some(e.to_string()));
            }
        }
        if let Err(e) = Writer::at(mem, segs, writable - 1).and_then(|mut w| w.write_all(&[ack])) {
            return (0, Some(e.to_string()));
        }
        // The chain's writable size is bounded by the engine's total-length check (u32).
        (writable as u32, reply.err())
    }

    fn read_command(mem: &GuestMemory, chain: &Chain) -> Result<CtrlCommand, String> {
        if chain.readable_len() > MAX_COMMAND {
            return Err(format!("command of {} bytes", chain.readable_len()));
        }
        let mut buf = vec![0u8; chain.readable_len() as usize];
        Reader::new(mem, chain.readable())
            .read_exact(&mut buf)
            .map_err(|e| e.to_string())?;
        CtrlCommand::decode(&buf).map_err(|e| e.to_string())
    }

    /// Applies a command to the device; returns the reply bytes of a GET.
    fn apply(shared: &Shared, cmd: CtrlCommand) -> Result<Option<[u8; 8]>, String> {
        let pairs = shared.pairs();
        let set_every = |of_pair: fn(u16) -> QueueId, coal: Coalesce| {
            (0..pairs).for_each(|p| shared.queue_tunables(of_pair(p)).set_coalesce(coal));
        };
        // VQ_NOTF_COAL names a data virtqueue by its index.
        let data_queue = |vqn: u16| match QueueId::from_index(vqn as usize, pairs) {
            Some(QueueId::Ctrl) | None => Err(format!("no data queue {vqn}")),
            Some(q) => Ok(shared.queue_tunables(q)),
        };
        match cmd {
            CtrlCommand::VqPairsSet(n) => {
                if n == 0 || n > pairs {
                    return Err(format!("VQ_PAIRS_SET {n}: the device has {pairs} pairs"));
                }
                shared.set_active_pairs(n).map_err(|e| e.to_string())?;
            }
            CtrlCommand::RxPromisc(on) => shared.set_promisc(on),
            CtrlCommand::RxAllmulti(on) => shared.set_allmulti(on),
            CtrlCommand::MacAddrSet(mac) => shared.set_mac(mac),
            CtrlCommand::MacTableSet(t) => shared.set_mac_tables(t.unicast, t.multicast),
            CtrlCommand::NotfCoalTx(c) => set_every(QueueId::Tx, c),
            CtrlCommand::NotfCoalRx(c) => set_every(QueueId::Rx, c),
            CtrlCommand::VqNotfCoalSet { vqn, coal } => data_queue(vqn)?.set_coalesce(coal),
            CtrlCommand::VqNotfCoalGet { vqn } => {
                let coal = data_queue(vqn)?.coalesce();
                return Ok(Some(CtrlCommand::encode_reply(coal)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use vnet::ctrl::Command as CtrlCommand;
    use vring::{Buf, Features, GuestAddress};

    use super::*;
    use crate::testing::{setup_sized, shared};

    #[test]
    fn a_turn_answers_at_most_the_weight_then_the_rest_next_turn() {
        let mut s = setup_sized(QueueId::Ctrl, Features::VERSION_1, 256);
        let cmd = CtrlCommand::RxPromisc(true).encode();
        let total = CTRL_WEIGHT as u32 + 10;
        for i in 0..total {
            let at = GuestAddress(0x20_0000 + 64 * i as u64);
            s.mem.write(at, &cmd).unwrap();
            let ack = Buf::new(GuestAddress(at.0 + 32), 1);
            s.driver
                .add(&[Buf::new(at, cmd.len() as u32)], &[ack], i)
                .unwrap();
        }
        let dev = shared();
        let mut chain = Chain::new();
        assert_eq!(
            process_commands(&dev, &mut s.runtime, &mut chain),
            CTRL_WEIGHT
        );
        assert_eq!(process_commands(&dev, &mut s.runtime, &mut chain), 10);
        assert_eq!(process_commands(&dev, &mut s.runtime, &mut chain), 0);
        assert_eq!(s.runtime.counters().ctrl_commands.get(), total as u64);
        assert_eq!(s.runtime.counters().ctrl_errors.get(), 0);
    }
}
