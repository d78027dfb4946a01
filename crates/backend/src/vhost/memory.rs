//! A connection's memory and dirty log: the memory table (SET_MEM_TABLE), memory hotplug
//! (ADD_MEM_REG and REM_MEM_REG, with the protocol feature CONFIGURE_MEM_SLOTS), and the dirty
//! log of a live migration (SET_LOG_BASE with LOG_SHMFD, written while LOG_ALL is acked). Each
//! change is swapped in around a quiesce of the running queues (`Connection::requeue`).

use std::fs::File;
use std::sync::Arc;

use vhost::vhost_user::message::{
    VhostUserLog, VhostUserMemoryRegion, VhostUserSingleMemoryRegion,
};
use vhost::vhost_user::{Error as VuError, Result as VuResult};
use vhost::VhostUserMemoryRegionBase;
use vring::memory::{RegionSource, MAX_REGIONS};
use vring::{DirtyLog, GuestAddress, GuestMemory};

use super::{Connection, LOG_ALL};
use crate::error::Error;

/// A dirty log, and what identifies it: its file (device and inode), size and offset.
#[derive(Debug)]
pub(super) struct SharedLog {
    log: Arc<DirtyLog>,
    id: (u64, u64, u64, u64),
}

impl Connection {
    /// SET_MEM_TABLE: the frontend's whole table, each region checked and mapped
    /// (`GuestMemory::from_sources`), swapped in under the running queues.
    pub(super) fn memory_table(
        &mut self,
        ctx: &[VhostUserMemoryRegion],
        files: Vec<File>,
    ) -> VuResult<Option<Vec<VhostUserMemoryRegionBase>>> {
        if ctx.len() != files.len() {
            return Err(VuError::InvalidParam);
        }
        let sources = ctx
            .iter()
            .zip(files)
            .map(|(r, file)| RegionSource {
                guest_addr: GuestAddress(r.guest_phys_addr),
                size: r.memory_size,
                user_addr: r.user_addr,
                file,
                mmap_offset: r.mmap_offset,
            })
            .collect();
        let mem = GuestMemory::from_sources(sources).map_err(|e| {
            let e = Error::protocol("SET_MEM_TABLE")(e);
            tracing::warn!(error = %e, "memory table refused");
            VuError::InvalidParam
        })?;
        self.removed.clear();
        self.replace_memory(Some(mem))?;
        Ok(None)
    }

    /// ADD_MEM_REG (memory hotplug): one more region, or an ack for one another queue pair's
    /// table mapped already.
    pub(super) fn add_region(
        &mut self,
        region: &VhostUserSingleMemoryRegion,
        fd: File,
    ) -> VuResult<()> {
        // Copies: the message struct is packed.
        let (guest, size, user) = (region.guest_phys_addr, region.memory_size, region.user_addr);
        let key = (guest, size, user);
        if self.maps_region(key) {
            // The same region from another queue pair's table: mapped already.
            return Ok(());
        }
        let source = RegionSource {
            guest_addr: GuestAddress(guest),
            size,
            user_addr: user,
            file: fd,
            mmap_offset: region.mmap_offset,
        };
        let mem = match &self.mem {
            Some(mem) => mem.with_region(source),
            None => GuestMemory::from_sources(vec![source]),
        }
        .map_err(|e| {
            let e = Error::protocol("ADD_MEM_REG")(e);
            tracing::warn!(error = %e, guest, size, "memory region refused");
            VuError::InvalidParam
        })?;
        self.replace_memory(Some(mem))?;
        self.removed.retain(|k| *k != key);
        tracing::info!(guest, size, "memory region added");
        Ok(())
    }

    /// REM_MEM_REG: a region goes at its first removal; the other queue pairs' repeats are
    /// acked.
    pub(super) fn remove_region(&mut self, region: &VhostUserSingleMemoryRegion) -> VuResult<()> {
        let (guest, size, user) = (region.guest_phys_addr, region.memory_size, region.user_addr);
        let key = (guest, size, user);
        if !self.maps_region(key) && self.removed.contains(&key) {
            // Another queue pair's table removing it too: gone already.
            return Ok(());
        }
        let mem = self
            .mem
            .as_ref()
            .ok_or(vring::Error::InvalidMemory {
                reason: "no such region to remove",
            })
            .and_then(|mem| mem.without_region(GuestAddress(guest), size, user))
            .map_err(|e| {
                let e = Error::protocol("REM_MEM_REG")(e);
                tracing::warn!(error = %e, guest, size, "memory region not removed");
                VuError::InvalidParam
            })?;
        self.replace_memory(mem)?;
        if self.removed.len() >= MAX_REGIONS {
            self.removed.remove(0);
        }
        self.removed.push(key);
        tracing::info!(guest, size, "memory region removed");
        Ok(())
    }

    /// SET_LOG_BASE (LOG_SHMFD): the dirty log of a live migration, mapped and, while
    /// logging, handed to the running queues.
    pub(super) fn share_log(&mut self, log: &VhostUserLog, file: File) -> VuResult<()> {
        // The frontend waits for the reply (LOG_SHMFD), which the message layer sends only
        // when this succeeds: a refusal must close the connection.
        let (size, offset) = (log.mmap_size, log.mmap_offset);
        let id = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().map(|m| (m.dev(), m.ino(), size, offset))
        };
        if let (Ok(id), Some(current)) = (&id, &self.log) {
            if *id == current.id {
                // The same log again: QEMU sends it for every queue pair.
                return Ok(());
            }
        }
        let log = id
            .map_err(|e| Error::host("reading the dirty log's file")(e))
            .and_then(|id| {
                DirtyLog::from_file(file, size, offset)
                    .map(|log| SharedLog {
                        log: Arc::new(log),
                        id,
                    })
                    .map_err(Error::protocol("SET_LOG_BASE"))
            })
            .map_err(|e| {
                tracing::warn!(error = %e, size, offset, "dirty log refused");
                self.must_disconnect = true;
                VuError::InvalidParam
            })?;
        tracing::info!(size, offset, "dirty log shared");
        // Running queues that log move to the new log before the reply: the frontend reads
        // and frees the old one once it has it.
        if self.logging() {
            self.requeue(|c| c.log = Some(log))
        } else {
            self.log = Some(log);
            Ok(())
        }
    }

    /// Swaps the memory table (SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG) around a quiesce of
    /// the running queues ([`Connection::requeue`]). A queue whose rings the new memory no
    /// longer holds stays stopped until a table that holds them arrives, as does one whose
    /// kick and enable came before any memory.
    pub(super) fn replace_memory(&mut self, mem: Option<GuestMemory>) -> VuResult<()> {
        self.requeue(|c| c.mem = mem.map(Arc::new))
    }

    /// The log the queues mark, while logging is on: LOG_ALL acked and a log shared.
    pub(super) fn dirty_log(&self) -> Option<Arc<DirtyLog>> {
        if !self.acked_features.contains(LOG_ALL) {
            return None;
        }
        self.log.as_ref().map(|l| l.log.clone())
    }

    /// Whether the queues log their writes now.
    pub fn logging(&self) -> bool {
        self.dirty_log().is_some()
    }

    /// Whether the memory has the region `key` (guest address, size, user address), the key
    /// by which ADD_MEM_REG and REM_MEM_REG name one.
    pub(super) fn maps_region(&self, key: (u64, u64, u64)) -> bool {
        self.mem.as_ref().is_some_and(|m| {
            m.regions()
                .any(|r| (r.guest_addr.0, r.size, r.user_addr) == key)
        })
    }
}
