//! The fuzz targets' way in, compiled only with the `fuzzing` feature (which fuzz/ and the
//! switch's criterion bench enable): the parts of the device that `ctrl_queue`, `vhost_user`
//! and `switch_forward` drive directly, without the control thread, the accept loop or the
//! uplink's TAP, and a session's deadlines shortened. The shipped crate keeps each of them
//! crate-private; these wrappers add nothing to them but [`queue_pair`], a queue and its
//! driver's end as the harnesses build them.

use std::io;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use virtnet_sys::PeerEventFd;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::eventfd::EFD_NONBLOCK;
use vring::{
    Chain, DeviceQueue, DriverQueue, Features, GuestAddress, GuestMemory, QueueConfig,
    RingAddresses,
};

use crate::config::BackendConfig;
use crate::device::Device;
use crate::gate::Deadlines;
use crate::host::NoControl;
use crate::metrics::{QueueCounters, QueueTunables};
use crate::queue::{QueueId, QueueRuntime};
use crate::session::Session;
use crate::shared::Shared;
use crate::switch::core::{Scratch, SwitchCore};
use crate::switch::tap::UplinkCounters;
use crate::switch::PortId;

/// The device state of `config` alone: no port, no worker threads.
pub fn shared(config: BackendConfig) -> io::Result<Shared> {
    Shared::new(config, Box::new(NoControl))
}

/// A running queue, as the vhost-user layer hands one to a worker when the queue starts.
pub fn queue_runtime(
    id: QueueId,
    queue: DeviceQueue,
    kick: EventFd,
    call: Option<EventFd>,
    err: Option<EventFd>,
    counters: Arc<QueueCounters>,
    tunables: Arc<QueueTunables>,
) -> QueueRuntime {
    let adopt = |e: EventFd| PeerEventFd::from_eventfd(e).expect("an eventfd");
    QueueRuntime::new(
        id,
        queue,
        adopt(kick),
        call.map(adopt),
        err.map(adopt),
        counters,
        tunables,
    )
}

/// Queue `id` of `shared` at `at` in `mem` (descriptors, avail and used rings one after the
/// other), `size` entries, started with `features`: the driver's end of it, and the device's
/// as a worker runs it; with `signals`, call and error eventfds (a notification then costs a
/// write), else none.
pub fn queue_pair(
    shared: &Shared,
    mem: &Arc<GuestMemory>,
    id: QueueId,
    (at, size): (u64, u16),
    features: Features,
    signals: bool,
) -> (DriverQueue<u32>, QueueRuntime) {
    let eventfd = || EventFd::new(EFD_NONBLOCK).expect("an eventfd");
    let rings = RingAddresses::contiguous(GuestAddress(at), size);
    let config = QueueConfig::new(size as u32, rings, features).expect("queue config");
    let driver = DriverQueue::activate(&config, mem.clone(), None).expect("driver queue");
    let device = DeviceQueue::activate(&config, mem.clone(), vring::RingPosition::START)
        .expect("device queue");
    let rt = queue_runtime(
        id,
        device,
        eventfd(),
        signals.then(eventfd),
        signals.then(eventfd),
        shared.queue_counters(id).clone(),
        shared.queue_tunables(id).clone(),
    );
    (driver, rt)
}

/// One wake-up of the control thread: every command pending on `q`, handled; how many.
pub fn process_commands(shared: &Shared, q: &mut QueueRuntime, chain: &mut Chain) -> usize {
    crate::ctrlq::process_commands(shared, q, chain)
}

/// A session on `stream`, as the accept loop opens one per frontend (the device is reset).
pub fn open_session(device: &Arc<Device>, stream: UnixStream) -> io::Result<Session> {
    Session::new(device, stream)
}

/// Replaces the session's deadlines (the target's are milliseconds, so that an input that
/// stalls a message costs little).
pub fn set_deadlines(session: &mut Session, deadlines: Deadlines) {
    session.set_deadlines(deadlines)
}

/// One request of the session's loop; false once the connection has closed.
pub fn serve_one(session: &mut Session) -> bool {
    session.serve_one()
}

/// What the accept loop does when a connection's loop ends: close it, stop its queues.
pub fn close_session(session: &mut Session) {
    session.close()
}

/// What the uplink's worker does with a batch it read from the TAP (`UplinkPort::forward`
/// after the read): frame `k` is `arena[at..at + n]` for `spans[k] = (at, n)`, at most 64 of
/// them, each its 12-byte header then the frame; forwarded from port `id` of `core`, and
/// counted in `counters.into`. No queue of the TAP: a frame from the host never goes back
/// out of it.
pub fn uplink_forward(
    core: &SwitchCore,
    id: PortId,
    counters: &UplinkCounters,
    arena: &[u8],
    spans: &[(usize, usize)],
) {
    let mut sent = Vec::with_capacity(spans.len());
    crate::switch::uplink::forward_read(
        core,
        id,
        None,
        counters,
        (arena, spans),
        &mut Scratch::default(),
        &mut sent,
    )
}
