//! Guest memory's regions: mapping them (anonymous, our own memfds, or the files a frontend
//! sends in its memory table), checking them (a RAM file, inside its file, no overlap), and
//! memories built from another with a region added or removed (memory hotplug).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;

use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;

#[cfg(loom)]
use super::LoomViews;
use super::{fault, GuestAddress, GuestMemory, MAX_REGIONS};
use crate::Error;

/// Describes one region when building a [`GuestMemory`] from file descriptors, as a vhost-user
/// backend receives them in `SET_MEM_TABLE`.
#[derive(Debug)]
pub struct RegionSource {
    pub guest_addr: GuestAddress,
    pub size: u64,
    /// The frontend's virtual address of the region start, which vhost-user ring addresses use.
    pub user_addr: u64,
    pub file: File,
    /// Offset of the region's first byte in `file`.
    pub mmap_offset: u64,
}

/// What a frontend needs to share one region of its memory with a backend.
#[derive(Debug, Clone, Copy)]
pub struct RegionInfo<'a> {
    pub guest_addr: GuestAddress,
    pub size: u64,
    pub user_addr: u64,
    pub host_addr: u64,
    /// The backing file, for memfd-backed memory; `None` for anonymous memory.
    pub file: Option<&'a File>,
    pub file_offset: u64,
}

/// One region as translation sees it: the hot fields inline, the mapping shared. Memories
/// built from another (a region added or removed while queues run) share the mappings of the
/// regions they keep, so that nothing is mapped twice and the old memory stays valid for
/// whoever still holds it.
#[derive(Clone, Debug)]
pub(super) struct Region {
    pub(super) guest: u64,
    pub(super) len: u64,
    pub(super) user_addr: u64,
    pub(super) host: NonNull<u8>,
    pub(super) mapping: Arc<Mapping>,
}

/// A mapping and, for a peer's file, its SIGBUS registration.
#[derive(Debug)]
pub(super) struct Mapping {
    /// Released before `mmap` unmaps (fields drop in order).
    pub(super) fault: Option<fault::Registration>,
    pub(super) mmap: MmapRegion<()>,
}

impl Region {
    /// `peer`: the file is the peer's, which may shrink it (see [`fault`]).
    fn new(
        guest: GuestAddress,
        user_addr: u64,
        mmap: MmapRegion<()>,
        peer: bool,
    ) -> Result<Region, Error> {
        let host = NonNull::new(mmap.as_ptr()).ok_or(Error::InvalidMemory {
            reason: "mapping at address 0",
        })?;
        let len = mmap.size() as u64;
        if len == 0 || guest.0.checked_add(len).is_none() {
            return Err(Error::InvalidMemory {
                reason: "region size is 0 or overflows",
            });
        }
        let fault = if peer {
            Some(fault::Registration::new(host.as_ptr(), mmap.size())?)
        } else {
            None
        };
        Ok(Region {
            guest: guest.0,
            len,
            user_addr,
            host,
            mapping: Arc::new(Mapping { fault, mmap }),
        })
    }

    /// Maps a region a frontend sent, after checking it (see [`GuestMemory::from_sources`]).
    fn from_source(s: RegionSource) -> Result<Region, Error> {
        let len = usize::try_from(s.size)
            .ok()
            .filter(|&l| l > 0 && s.guest_addr.0.checked_add(s.size).is_some())
            .ok_or(Error::InvalidMemory {
                reason: "region size is 0 or overflows",
            })?;
        s.user_addr
            .checked_add(s.size)
            .ok_or(Error::InvalidMemory {
                reason: "region user address overflows",
            })?;
        // Mapping past the end of the file would map pages that fault with SIGBUS on first
        // access: refuse it here. (A frontend that shrinks the file later is handled by
        // `fault`.)
        let (file_len, page) = check_ram_file(&s.file)?;
        // On hugetlbfs the kernel rounds the mapping up to whole huge pages but refuses to
        // unmap (or to map over, as the SIGBUS handler does) a length that is not a multiple
        // of one: such a region would leak its mapping and make a shrunk file fatal.
        if !s.size.is_multiple_of(page) || !s.mmap_offset.is_multiple_of(page) {
            return Err(Error::InvalidMemory {
                reason: "region size or offset is not a multiple of the file's page size",
            });
        }
        if s.mmap_offset
            .checked_add(s.size)
            .is_none_or(|end| end > file_len)
        {
            return Err(Error::InvalidMemory {
                reason: "region extends past the end of its file",
            });
        }
        let fo = FileOffset::new(s.file, s.mmap_offset);
        let mmap = MmapRegion::from_file(fo, len).map_err(mmap_error)?;
        Region::new(s.guest_addr, s.user_addr, mmap, true)
    }
}

pub(super) fn mmap_error(e: vm_memory::mmap::MmapRegionError) -> Error {
    Error::Mmap {
        reason: e.to_string(),
    }
}

impl GuestMemory {
    /// Private anonymous memory, for a driver and device in one process (tests, benchmarks).
    pub fn anonymous(layout: &[(GuestAddress, usize)]) -> Result<GuestMemory, Error> {
        let regions = layout
            .iter()
            .map(|&(guest, len)| {
                let mmap = MmapRegion::new(len).map_err(mmap_error)?;
                Ok((guest, guest.0, mmap))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Self::from_mappings(regions, false)
    }

    /// Memory backed by one memfd per region, shareable with another process through
    /// [`GuestMemory::regions`] (what a vhost-user frontend sends in `SET_MEM_TABLE`).
    /// Each region's user address is its host address, as in QEMU.
    pub fn memfd(layout: &[(GuestAddress, usize)]) -> Result<GuestMemory, Error> {
        let regions = layout
            .iter()
            .map(|&(guest, len)| {
                let file = memfd_create("virtnet-guest", len as u64)?;
                let mmap =
                    MmapRegion::from_file(FileOffset::new(file, 0), len).map_err(mmap_error)?;
                let user = mmap.as_ptr() as u64;
                Ok((guest, user, mmap))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Self::from_mappings(regions, false)
    }

    /// Maps regions received from a frontend. Every region is validated: a regular file on
    /// tmpfs or hugetlbfs, non-empty, inside its file, no address overflow, no overlap with
    /// another region in guest or user address space. Each mapping is registered with the
    /// SIGBUS handler of `memory/fault.rs`, so a file the peer shrinks later faults into private
    /// zeroes and [`GuestMemory::faulted`] instead of killing the process.
    pub fn from_sources(sources: Vec<RegionSource>) -> Result<GuestMemory, Error> {
        if sources.is_empty() || sources.len() > MAX_REGIONS {
            return Err(Error::InvalidMemory {
                reason: "region count is 0 or above 509",
            });
        }
        let regions = sources
            .into_iter()
            .map(Region::from_source)
            .collect::<Result<Vec<_>, Error>>()?;
        Self::from_regions(regions)
    }

    /// This memory with one more region a frontend sent (VHOST_USER_ADD_MEM_REG), checked as
    /// [`GuestMemory::from_sources`] checks its regions, and refused if it overlaps one of
    /// these or would make more than [`MAX_REGIONS`]. The regions kept share their mappings
    /// with `self`.
    pub fn with_region(&self, source: RegionSource) -> Result<GuestMemory, Error> {
        if self.regions.len() >= MAX_REGIONS {
            return Err(Error::InvalidMemory {
                reason: "more than 509 regions",
            });
        }
        let mut regions = self.regions.clone();
        regions.push(Region::from_source(source)?);
        Self::from_regions(regions)
    }

    /// This memory without the region at `guest_addr` of `size` bytes at the frontend's
    /// `user_addr` (VHOST_USER_REM_MEM_REG names a region by these three), or `None` if it was
    /// the only one. A region that is not exactly one of these is refused.
    pub fn without_region(
        &self,
        guest_addr: GuestAddress,
        size: u64,
        user_addr: u64,
    ) -> Result<Option<GuestMemory>, Error> {
        let i = self
            .regions
            .iter()
            .position(|r| r.guest == guest_addr.0 && r.len == size && r.user_addr == user_addr)
            .ok_or(Error::InvalidMemory {
                reason: "no such region to remove",
            })?;
        let mut regions = self.regions.clone();
        regions.remove(i);
        if regions.is_empty() {
            return Ok(None);
        }
        Self::from_regions(regions).map(Some)
    }

    /// Anonymous or our own memfds: regions in this process, not a peer's.
    fn from_mappings(
        mappings: Vec<(GuestAddress, u64, MmapRegion<()>)>,
        peer: bool,
    ) -> Result<Self, Error> {
        let regions = mappings
            .into_iter()
            .map(|(guest, user_addr, mmap)| Region::new(guest, user_addr, mmap, peer))
            .collect::<Result<Vec<_>, Error>>()?;
        Self::from_regions(regions)
    }

    /// Sorts `regions` and checks that they do not overlap, in guest or in user space.
    fn from_regions(mut regions: Vec<Region>) -> Result<Self, Error> {
        if regions.is_empty() || regions.len() > MAX_REGIONS {
            return Err(Error::InvalidMemory {
                reason: "region count is 0 or above 509",
            });
        }
        // Sorted, a region can only overlap its neighbour (in each space).
        let disjoint = |sorted: &[&Region], key: fn(&Region) -> u64| {
            sorted.windows(2).all(|w| key(w[0]) + w[0].len <= key(w[1]))
        };
        let mut by_user: Vec<&Region> = regions.iter().collect();
        by_user.sort_by_key(|r| r.user_addr);
        if !disjoint(&by_user, |r| r.user_addr) {
            return Err(Error::InvalidMemory {
                reason: "regions overlap in user space",
            });
        }
        regions.sort_by_key(|r| r.guest);
        let by_guest: Vec<&Region> = regions.iter().collect();
        if !disjoint(&by_guest, |r| r.guest) {
            return Err(Error::InvalidMemory {
                reason: "regions overlap in guest space",
            });
        }
        Ok(GuestMemory {
            regions,
            #[cfg(loom)]
            loom_views: LoomViews::default(),
        })
    }
}

/// Refuses a region file that cannot be guest RAM: anything but a regular file on tmpfs
/// (memfds, /dev/shm) or hugetlbfs, the filesystems QEMU's and DPDK's shared memory live on. A
/// file on a disk filesystem, a device node or a socket would make every ring access file I/O,
/// or something else altogether. Returns the file's length.
pub(super) fn check_ram_file(file: &File) -> Result<(u64, u64), Error> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;
    let os_error = |e: io::Error| Error::Mmap {
        reason: e.to_string(),
    };
    let meta = file.metadata().map_err(os_error)?;
    if !meta.is_file() {
        return Err(Error::InvalidMemory {
            reason: "region file is not a regular file",
        });
    }
    // SAFETY: statfs is plain old data; fstatfs fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable statfs; the descriptor is open for the call.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } < 0 {
        return Err(os_error(io::Error::last_os_error()));
    }
    match st.f_type as i64 {
        TMPFS_MAGIC => Ok((meta.len(), 1)),
        // f_bsize is the huge page size on hugetlbfs.
        HUGETLBFS_MAGIC => Ok((meta.len(), (st.f_bsize as u64).max(1))),
        _ => Err(Error::InvalidMemory {
            reason: "region file is not on tmpfs or hugetlbfs (not a memfd or shared memory)",
        }),
    }
}

/// An anonymous memory file of `size` bytes, sealed against shrinking, growing and further
/// sealing changes: the backend we share it with maps all of it, and a shrunk file would make
/// our own accesses past the new end fault (SIGBUS). QEMU seals its memfds the same way.
fn memfd_create(name: &str, size: u64) -> Result<File, Error> {
    use std::os::fd::FromRawFd;
    let os_error = |e: io::Error| Error::Mmap {
        reason: e.to_string(),
    };
    let cname = std::ffi::CString::new(name).map_err(|_| Error::Mmap {
        reason: "bad name".into(),
    })?;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: `cname` is a valid NUL-terminated string; the flags are valid.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    if fd < 0 {
        return Err(os_error(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(os_error)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: F_ADD_SEALS takes an int argument; `file` is a memfd that allows sealing.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(os_error(io::Error::last_os_error()));
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::fault_count;

    #[test]
    fn memfd_memory_cannot_be_resized_nor_unsealed() {
        let mem = GuestMemory::memfd(&[(GuestAddress(0), 8192)]).unwrap();
        let file = mem.regions().next().unwrap().file.unwrap();
        for len in [4096, 16384] {
            let e = file.set_len(len).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EPERM), "set_len({len})");
        }
        assert_eq!(file.metadata().unwrap().len(), 8192);
        // F_SEAL_SEAL: a peer holding the fd cannot lift or add seals either.
        // SAFETY: F_ADD_SEALS takes an int argument on a valid fd.
        let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_WRITE) };
        assert_eq!(r, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn overlapping_regions_are_refused() {
        let err = GuestMemory::anonymous(&[(GuestAddress(0), 8192), (GuestAddress(4096), 4096)]);
        assert!(matches!(err, Err(Error::InvalidMemory { .. })));
    }

    #[test]
    fn regions_from_fds_map_the_same_file() {
        let shared = GuestMemory::memfd(&[(GuestAddress(0), 8192)]).unwrap();
        let info = shared.regions().next().unwrap();
        let file = info.file.unwrap().try_clone().unwrap();
        let source = RegionSource {
            guest_addr: GuestAddress(0),
            size: 4096,
            user_addr: 0x7000_0000,
            file,
            mmap_offset: 4096,
        };
        let peer = GuestMemory::from_sources(vec![source]).unwrap();
        shared.write(GuestAddress(4096 + 7), b"hi").unwrap();
        let mut got = [0u8; 2];
        peer.read(GuestAddress(7), &mut got).unwrap();
        assert_eq!(&got, b"hi");
        let past_eof = RegionSource {
            guest_addr: GuestAddress(0),
            size: 8192,
            user_addr: 0,
            file: info.file.unwrap().try_clone().unwrap(),
            mmap_offset: 4096,
        };
        assert_eq!(
            GuestMemory::from_sources(vec![past_eof]).unwrap_err(),
            Error::InvalidMemory {
                reason: "region extends past the end of its file"
            }
        );
        let empty = GuestMemory::from_sources(vec![]);
        assert!(matches!(empty, Err(Error::InvalidMemory { .. })));
    }

    #[test]
    fn many_regions_are_searched_as_well_as_few_are_scanned() {
        // 40 regions of one page with a page gap between each, given out of order.
        let layout: Vec<_> = (0..40u64)
            .rev()
            .map(|i| (GuestAddress(0x10_0000 + i * 0x2000), 4096))
            .collect();
        let mem = GuestMemory::anonymous(&layout).unwrap();
        for i in 0..40u64 {
            let base = 0x10_0000 + i * 0x2000;
            assert!(mem.contains(GuestAddress(base), 4096), "region {i}");
            assert!(mem.contains(GuestAddress(base + 4095), 1));
            assert!(!mem.contains(GuestAddress(base + 4095), 2), "into the gap");
            assert!(!mem.contains(GuestAddress(base + 4096), 1), "the gap");
            mem.write(GuestAddress(base + 8), &i.to_le_bytes()).unwrap();
        }
        for i in 0..40u64 {
            let mut b = [0u8; 8];
            mem.read(GuestAddress(0x10_0000 + i * 0x2000 + 8), &mut b)
                .unwrap();
            assert_eq!(u64::from_le_bytes(b), i);
        }
        assert!(!mem.contains(GuestAddress(0), 1), "below the first");
        assert!(
            !mem.contains(GuestAddress(0x10_0000 + 40 * 0x2000), 1),
            "past the last"
        );
        assert!(!mem.contains(GuestAddress(u64::MAX), 1));
    }

    /// A region source of `pages` pages at `guest`, on a fresh memfd-like shm file.
    fn shm_source(tag: &str, guest: u64, user: u64, pages: u64) -> (RegionSource, File) {
        let file = shm_file(tag, pages * 4096);
        let peer = file.try_clone().unwrap();
        let s = RegionSource {
            guest_addr: GuestAddress(guest),
            size: pages * 4096,
            user_addr: user,
            file,
            mmap_offset: 0,
        };
        (s, peer)
    }

    #[test]
    fn a_region_added_is_reachable_and_the_others_keep_their_mappings() {
        let (first, _f1) = shm_source("add-a", 0, 0x7000_0000, 4);
        let mem = GuestMemory::from_sources(vec![first]).unwrap();
        mem.write(GuestAddress(16), b"old").unwrap();
        let (second, f2) = shm_source("add-b", 0x10_0000, 0x7100_0000, 2);
        let grown = mem.with_region(second).unwrap();
        // The new region is the file's memory; the old one is the same mapping in both.
        grown.write(GuestAddress(0x10_0000 + 5), b"new").unwrap();
        let mut back = [0u8; 3];
        std::os::unix::fs::FileExt::read_exact_at(&f2, &mut back, 5).unwrap();
        assert_eq!(&back, b"new");
        grown.read(GuestAddress(16), &mut back).unwrap();
        assert_eq!(&back, b"old");
        let host = |m: &GuestMemory| m.regions().next().unwrap().host_addr;
        assert_eq!(
            host(&mem),
            host(&grown),
            "the first region was mapped again"
        );
        assert_eq!(
            grown.user_to_guest(0x7100_0010),
            Some(GuestAddress(0x10_0010))
        );
        // The memory it grew from is untouched, and outlives the new one.
        assert!(!mem.contains(GuestAddress(0x10_0000), 1));
        drop(grown);
        mem.write(GuestAddress(16), b"yes").unwrap();
    }

    #[test]
    fn regions_that_overlap_or_do_not_fit_are_not_added() {
        let (first, _f) = shm_source("bad-a", 0x10_0000, 0x7000_0000, 4);
        let mem = GuestMemory::from_sources(vec![first]).unwrap();
        let refused = |s: RegionSource| match mem.with_region(s) {
            Err(Error::InvalidMemory { reason }) => reason,
            other => panic!("added: {other:?}"),
        };
        // Overlapping in guest space (the last page), in user space, or containing it.
        let (s, _f) = shm_source("bad-b", 0x10_3000, 0x7200_0000, 2);
        assert_eq!(refused(s), "regions overlap in guest space");
        let (s, _f) = shm_source("bad-c", 0x20_0000, 0x7000_1000, 1);
        assert_eq!(refused(s), "regions overlap in user space");
        let (s, _f) = shm_source("bad-d", 0x0, 0x7200_0000, 1024);
        assert_eq!(refused(s), "regions overlap in guest space");
        // Zero bytes, past the end of its file, an address range that wraps.
        let (mut s, _f) = shm_source("bad-e", 0x20_0000, 0x7200_0000, 1);
        s.size = 0;
        assert_eq!(refused(s), "region size is 0 or overflows");
        let (mut s, _f) = shm_source("bad-f", 0x20_0000, 0x7200_0000, 1);
        s.size = 2 * 4096;
        assert_eq!(refused(s), "region extends past the end of its file");
        let (mut s, _f) = shm_source("bad-g", u64::MAX - 4095, 0x7200_0000, 1);
        s.size = 8192;
        assert_eq!(refused(s), "region size is 0 or overflows");
        assert_eq!(mem.regions().count(), 1);
    }

    #[test]
    fn regions_are_removed_only_by_their_exact_address_size_and_user_address() {
        let (a, _fa) = shm_source("rem-a", 0, 0x7000_0000, 2);
        let (b, _fb) = shm_source("rem-b", 0x10_0000, 0x7100_0000, 2);
        let mem = GuestMemory::from_sources(vec![a])
            .unwrap()
            .with_region(b)
            .unwrap();
        let missing = |r: Result<Option<GuestMemory>, Error>| {
            matches!(
                r,
                Err(Error::InvalidMemory {
                    reason: "no such region to remove"
                })
            )
        };
        assert!(missing(mem.without_region(
            GuestAddress(0x10_0000),
            4096,
            0x7100_0000
        )));
        assert!(missing(mem.without_region(
            GuestAddress(0x10_1000),
            8192,
            0x7100_0000
        )));
        assert!(missing(mem.without_region(
            GuestAddress(0x10_0000),
            8192,
            0x7000_0000
        )));
        let one = mem
            .without_region(GuestAddress(0x10_0000), 8192, 0x7100_0000)
            .unwrap()
            .expect("one region left");
        assert!(!one.contains(GuestAddress(0x10_0000), 1));
        assert!(one.contains(GuestAddress(0), 8192));
        assert!(
            mem.contains(GuestAddress(0x10_0000), 8192),
            "the old memory keeps it"
        );
        let none = one
            .without_region(GuestAddress(0), 8192, 0x7000_0000)
            .unwrap();
        assert!(none.is_none(), "the last region went");
    }

    #[test]
    fn no_more_than_max_regions_are_added() {
        let file = shm_file("max", 4096);
        let source = |i: u64| RegionSource {
            guest_addr: GuestAddress(i * 4096),
            size: 4096,
            user_addr: 0x7000_0000 + i * 4096,
            file: file.try_clone().unwrap(),
            mmap_offset: 0,
        };
        let sources = (0..MAX_REGIONS as u64).map(source).collect();
        let full = GuestMemory::from_sources(sources).unwrap();
        assert_eq!(full.regions().count(), MAX_REGIONS);
        assert!(full.contains(GuestAddress(300 * 4096 + 10), 100));
        assert!(matches!(
            full.with_region(source(MAX_REGIONS as u64)),
            Err(Error::InvalidMemory {
                reason: "more than 509 regions"
            })
        ));
        let fewer = full
            .without_region(GuestAddress(7 * 4096), 4096, 0x7000_0000 + 7 * 4096)
            .unwrap()
            .unwrap();
        assert!(!fewer.contains(GuestAddress(7 * 4096), 1));
        assert!(fewer.with_region(source(MAX_REGIONS as u64)).is_ok());
    }

    /// A file of `len` bytes in `dir`, unlinked. (`testkit::pair::shm_memory` is the same for
    /// other crates' tests; a unit test here cannot use testkit.)
    fn unlinked_file(dir: &str, tag: &str, len: u64) -> File {
        let path = format!("{dir}/vring-test-{tag}-{}", std::process::id());
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(len).unwrap();
        file
    }

    /// A file on tmpfs that nobody sealed, as QEMU's `memory-backend-file` on /dev/shm makes.
    fn shm_file(tag: &str, len: u64) -> File {
        unlinked_file("/dev/shm", tag, len)
    }

    fn source(file: File, size: u64) -> RegionSource {
        RegionSource {
            guest_addr: GuestAddress(0),
            size,
            user_addr: 0x7000_0000,
            file,
            mmap_offset: 0,
        }
    }

    #[test]
    fn region_files_that_cannot_be_ram_are_refused() {
        // A regular file on the temporary directory's filesystem: a disk one on the machines
        // we run on (checked: the case says nothing where /tmp is tmpfs).
        let file = unlinked_file(std::env::temp_dir().to_str().unwrap(), "disk", 4096);
        // SAFETY: statfs is plain old data; fstatfs fills it.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is a writable statfs and the descriptor is open.
        assert_eq!(unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) }, 0);
        if st.f_type as i64 != 0x0102_1994 {
            let r = GuestMemory::from_sources(vec![source(file, 4096)]);
            assert!(matches!(r, Err(Error::InvalidMemory { .. })), "{r:?}");
        }
        let dev = File::open("/dev/zero").unwrap();
        let r = GuestMemory::from_sources(vec![source(dev, 4096)]);
        assert!(matches!(r, Err(Error::InvalidMemory { .. })), "{r:?}");
        let shm = shm_file("ok", 4096);
        assert!(GuestMemory::from_sources(vec![source(shm, 4096)]).is_ok());
    }

    #[test]
    fn a_file_shrunk_after_mapping_faults_into_private_zeroes_not_death() {
        let file = shm_file("shrink", 3 * 4096);
        let peer = file.try_clone().unwrap();
        let mem = GuestMemory::from_sources(vec![source(file, 3 * 4096)]).unwrap();
        mem.write(GuestAddress(2 * 4096 + 8), b"ring").unwrap();
        assert!(!mem.faulted());
        let before = fault_count();
        // The peer truncates its file: every page of the mapping is now past its end.
        peer.set_len(0).unwrap();
        let mut got = [0xffu8; 4];
        mem.read(GuestAddress(2 * 4096 + 8), &mut got).unwrap();
        assert_eq!(got, [0; 4], "the region now holds private zeroes");
        assert!(mem.faulted());
        assert!(fault_count() > before);
        // It stays usable memory of ours, and no longer reaches the peer's file.
        mem.write(GuestAddress(8), b"still").unwrap();
        peer.set_len(3 * 4096).unwrap();
        let mut back = [0u8; 5];
        std::os::unix::fs::FileExt::read_exact_at(&peer, &mut back, 8).unwrap();
        assert_eq!(back, [0; 5]);
        // A new memory on a fresh slot is not faulted.
        let other = shm_file("fresh", 4096);
        assert!(!GuestMemory::from_sources(vec![source(other, 4096)])
            .unwrap()
            .faulted());
    }
}

#[cfg(test)]
mod hugetlb_tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// A region on hugetlbfs whose size is not a whole number of huge pages would be mapped
    /// rounded up, and its munmap (MmapRegion's drop) would fail with EINVAL: the mapping would
    /// leak, and the SIGBUS handler's MAP_FIXED over [start, start + size) would fail too. It is
    /// refused. Needs huge pages reserved (vm.nr_hugepages; .ci/run reserves some): without, the
    /// test says so and checks nothing.
    #[test]
    fn a_hugetlbfs_region_that_is_not_whole_huge_pages_is_refused() {
        const HUGE: u64 = 2 << 20;
        // SAFETY: a valid NUL-terminated name and flags.
        let fd = unsafe { libc::memfd_create(c"hugetlb-test".as_ptr(), libc::MFD_HUGETLB) };
        if fd < 0 {
            eprintln!("skipped: no hugetlbfs");
            return;
        }
        // SAFETY: a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        if file.set_len(2 * HUGE).is_err() {
            eprintln!("skipped: no huge pages reserved (vm.nr_hugepages)");
            return;
        }
        let source = |size: u64, file: File| RegionSource {
            guest_addr: GuestAddress(0),
            size,
            user_addr: 0x7000_0000_0000,
            file,
            mmap_offset: 0,
        };
        let refused =
            GuestMemory::from_sources(vec![source(HUGE + 4096, file.try_clone().unwrap())]);
        assert!(
            refused.is_err(),
            "a region of 2 MiB + 4 KiB on hugetlbfs was mapped"
        );
        let whole = GuestMemory::from_sources(vec![source(HUGE, file)]);
        assert!(whole.is_ok(), "{:?}", whole.err());
    }
}
