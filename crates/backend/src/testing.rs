//! Unit-test scaffolding for the backend's parts: a device-side queue runtime on one end of a
//! [`testkit::Pair`], the test holding the driver end.

use std::sync::Arc;

use testkit::{pair, Pair};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vring::{DriverQueue, Features, GuestMemory};

use super::device::{BackendConfig, Shared};
use super::metrics::{QueueCounters, QueueTunables};
use super::queue::{QueueId, QueueRuntime};

/// The driver's end, the device's queue runtime, and the device's err eventfd.
pub struct Setup {
    pub driver: DriverQueue<u32>,
    pub mem: Arc<GuestMemory>,
    pub runtime: QueueRuntime,
    pub err: EventFd,
}

/// A queue of 16 with `features`, its device end as queue `id`.
pub fn setup(id: QueueId, features: Features) -> Setup {
    let Pair {
        mem,
        driver,
        device,
        ..
    } = pair(16, features, 16);
    let err = EventFd::new(EFD_NONBLOCK).unwrap();
    let runtime = QueueRuntime::new(
        id,
        device,
        EventFd::new(EFD_NONBLOCK).unwrap(),
        Some(EventFd::new(EFD_NONBLOCK).unwrap()),
        Some(err.try_clone().unwrap()),
        Arc::new(QueueCounters::default()),
        Arc::new(QueueTunables::default()),
    );
    Setup {
        driver,
        mem,
        runtime,
        err,
    }
}

/// Device state of one pair without workers or a TAP.
pub fn shared() -> Shared {
    Shared::new(BackendConfig::default(), Vec::new()).unwrap()
}

/// The driver posts `n` writable buffers of `len` bytes, tokens `0..n`.
pub fn post_rx(driver: &mut DriverQueue<u32>, n: u32, len: u32) {
    for i in 0..n {
        driver.add(&[], &[Pair::buf(i as u64, len)], i).unwrap();
    }
}

/// Every used entry the driver sees now, as (token, length).
pub fn used(driver: &mut DriverQueue<u32>) -> Vec<(u32, u32)> {
    std::iter::from_fn(|| driver.get_used().unwrap()).collect()
}
