//! The shadow of guest memory for the `device_queue` harness: region 0 as it should be,
//! following the driver's writes and those the model expects of the device, compared with
//! real memory after every step. Kept on the thread from one input to the next.

use std::cell::RefCell;
use std::sync::Arc;

use vring::{GuestAddress, GuestMemory};

use crate::mem::{self, REGION0, REGION1};

/// Guest memory and a shadow of its region 0: what the region should hold, the driver's
/// writes and those the model expects of the device. Kept from one run to the next on the
/// thread, and handed back as `mem::memory()` makes it, all zero: a fresh mapping and shadow
/// per run cost a page fault per page the final comparison reads, nine times the rest of a
/// run. A run that panics does not hand it back.
pub(super) struct Shadow {
    pub(super) mem: Arc<GuestMemory>,
    bytes: Vec<u8>,
    /// Memory as read for a comparison.
    now: Vec<u8>,
    /// The pages of region 0 that may hold other bytes than zero, a bit per page.
    dirty: u64,
}

const PAGE: u64 = 4096;
const _: () = assert!(REGION0.1 / PAGE <= 64 && REGION1.1 <= REGION0.1);

thread_local! {
    static KEPT: RefCell<Option<Shadow>> = const { RefCell::new(None) };
}

impl Shadow {
    /// The kept memory and shadow, or fresh ones.
    pub(super) fn take() -> Shadow {
        KEPT.with(|k| k.borrow_mut().take())
            .unwrap_or_else(|| Shadow {
                mem: mem::memory(),
                bytes: vec![0; REGION0.1 as usize],
                now: vec![0; REGION0.1 as usize],
                dirty: 0,
            })
    }

    /// Zeroes the pages written (memory equals the shadow: no check failed) and keeps both.
    pub(super) fn give_back(mut self) {
        const ZERO: [u8; PAGE as usize] = [0; PAGE as usize];
        for page in (0..REGION0.1 / PAGE).filter(|p| self.dirty & 1 << p != 0) {
            let at = page * PAGE;
            self.mem
                .write(GuestAddress(at), &ZERO)
                .expect("inside region 0");
            self.bytes[at as usize..][..PAGE as usize].fill(0);
        }
        self.dirty = 0;
        KEPT.with(|k| *k.borrow_mut() = Some(self));
    }

    fn mark(&mut self, addr: u64, len: usize) {
        for page in addr / PAGE..=(addr + len as u64 - 1) / PAGE {
            self.dirty |= 1 << page;
        }
    }

    /// Records bytes the device was right to write.
    pub(super) fn expect(&mut self, addr: u64, bytes: &[u8]) {
        self.bytes[addr as usize..][..bytes.len()].copy_from_slice(bytes);
        self.mark(addr, bytes.len());
    }

    /// Records bytes the driver wrote (clipped to region 0, as `poke` clips them).
    pub(super) fn driver_wrote(&mut self, addr: u64, len: usize) {
        if addr >= REGION0.1 || len == 0 {
            return;
        }
        let len = len.min((REGION0.1 - addr) as usize);
        let at = &mut self.bytes[addr as usize..][..len];
        self.mem
            .read(GuestAddress(addr), at)
            .expect("inside region 0");
        self.mark(addr, len);
    }

    /// Compares `len` bytes of region 0 at `addr` with the shadow.
    pub(super) fn check(&mut self, addr: u64, len: usize, what: &str) {
        let now = &mut self.now[..len];
        self.mem
            .read(GuestAddress(addr), now)
            .expect("inside region 0");
        let want = &self.bytes[addr as usize..][..len];
        // One memcmp: a loop of byte comparisons is slow under the fuzzer's instrumentation.
        if now != want {
            let i = (0..len)
                .find(|&i| now[i] != want[i])
                .expect("a byte differs");
            panic!(
                "{what}: the device wrote {:#04x} at {:#x}, where {:#04x} should be",
                now[i],
                addr + i as u64,
                want[i]
            );
        }
    }

    /// All of memory holds what the model says: the device wrote nowhere else.
    pub(super) fn check_all(&mut self) {
        self.check(REGION0.0, REGION0.1 as usize, "region 0");
        let now = &mut self.now[..REGION1.1 as usize];
        self.mem
            .read(GuestAddress(REGION1.0), now)
            .expect("region 1 is memory");
        assert!(*now == [0; REGION1.1 as usize], "region 1 written");
    }
}
