//! Atomic views of guest memory: the ring parts (indices, flags, event fields, descriptors,
//! used elements) are only ever read and written through these, with a checked address and
//! alignment, and under loom through loom's own atomics.

#[cfg(not(loom))]
use std::ptr::NonNull;
use std::sync::Arc;

use super::{out_of_range, GuestAddress, GuestMemory, HostSpan};
use crate::sync::{AtomicU16, AtomicU32, AtomicU64};
use crate::Error;

impl GuestMemory {
    /// An atomic view of `count` elements of `T` at `addr`, which must be aligned for `T` and
    /// lie inside one region. The view borrows the memory.
    pub fn atomic_slice<T: SharedAtomic>(
        &self,
        addr: GuestAddress,
        count: usize,
    ) -> Result<&[T], Error> {
        let span = self.checked_atomic_span::<T>(addr, count)?;
        #[cfg(loom)]
        {
            let _ = span;
            let view = self.loom_view::<T>(addr, count)?;
            // SAFETY: `loom_views` holds an `Arc` of every storage it handed out and never
            // drops one while `self` lives, so the slice outlives the `&self` borrow.
            Ok(unsafe { &*Arc::as_ptr(&view) })
        }
        #[cfg(not(loom))]
        // SAFETY: `checked_atomic_span` guarantees `count * size_of::<T>()` bytes at `span.ptr`
        // inside a mapping that lives as long as `&self`, aligned for `T`. Atomic integers have
        // no invalid bit patterns and tolerate concurrent access from the peer.
        Ok(unsafe { std::slice::from_raw_parts(span.ptr as *const T, count) })
    }

    /// Like [`GuestMemory::atomic_slice`], but the view keeps the memory alive by itself, so a
    /// running queue can hold it.
    pub(crate) fn shared_slice<T: SharedAtomic>(
        self: &Arc<Self>,
        addr: GuestAddress,
        count: usize,
    ) -> Result<SharedSlice<T>, Error> {
        let span = self.checked_atomic_span::<T>(addr, count)?;
        #[cfg(loom)]
        {
            let _ = span;
            Ok(SharedSlice {
                view: self.loom_view::<T>(addr, count)?,
                _mem: Arc::clone(self),
            })
        }
        #[cfg(not(loom))]
        {
            let ptr =
                NonNull::new(span.ptr as *mut T).ok_or_else(|| out_of_range(addr, span.len))?;
            Ok(SharedSlice {
                ptr,
                len: count,
                _mem: Arc::clone(self),
            })
        }
    }

    /// The loom storage of `count` `T`s at `addr`: the existing one, or one made from the
    /// memory's current bytes.
    #[cfg(loom)]
    fn loom_view<T: SharedAtomic>(
        &self,
        addr: GuestAddress,
        count: usize,
    ) -> Result<Arc<[T]>, Error> {
        let size = T::BYTES;
        let mut views = self.loom_views.0.lock().unwrap_or_else(|p| p.into_inner());
        let found = views
            .iter()
            .find(|(a, s, c, _)| *a == addr.0 && *s == size && *c == count)
            .and_then(|(_, _, _, v)| v.downcast_ref::<Arc<[T]>>().cloned());
        if let Some(view) = found {
            return Ok(view);
        }
        let mut bytes = vec![0u8; count * size];
        self.read(addr, &mut bytes)?;
        let view: Arc<[T]> = bytes.chunks(size).map(T::from_le).collect();
        views.push((addr.0, size, count, Arc::new(Arc::clone(&view))));
        Ok(view)
    }

    fn checked_atomic_span<T: SharedAtomic>(
        &self,
        addr: GuestAddress,
        count: usize,
    ) -> Result<HostSpan, Error> {
        let size = T::BYTES;
        let bytes = count
            .checked_mul(size)
            .ok_or_else(|| out_of_range(addr, usize::MAX))?;
        let span = self.host_span(addr, bytes)?;
        // Guest alignment is what the spec talks about, but host alignment is what makes the
        // atomic reference valid; regions are page-aligned in both spaces in practice.
        if !addr.0.is_multiple_of(size as u64) || !(span.ptr as usize).is_multiple_of(size) {
            return Err(Error::Misaligned {
                what: "atomic access",
                addr: addr.0,
                align: size as u64,
            });
        }
        Ok(span)
    }
}

/// The atomic integer types that may overlay shared memory.
pub trait SharedAtomic: sealed::Sealed + Sync + Send + 'static {}
impl SharedAtomic for AtomicU16 {}
impl SharedAtomic for AtomicU32 {}
impl SharedAtomic for AtomicU64 {}

mod sealed {
    pub trait Sealed {
        /// Bytes of the integer in shared memory (under loom, the atomic object is larger).
        const BYTES: usize;
        /// Under loom: a new atomic holding the little-endian integer in `bytes`.
        #[cfg(loom)]
        fn from_le(bytes: &[u8]) -> Self;
    }
    macro_rules! sealed {
        ($($a:ident: $int:ident),*) => {$(
            impl Sealed for crate::sync::$a {
                const BYTES: usize = std::mem::size_of::<$int>();
                #[cfg(loom)]
                fn from_le(bytes: &[u8]) -> Self {
                    let mut b = [0u8; std::mem::size_of::<$int>()];
                    b.copy_from_slice(bytes);
                    crate::sync::$a::new($int::from_le_bytes(b))
                }
            }
        )*};
    }
    sealed!(AtomicU16: u16, AtomicU32: u32, AtomicU64: u64);
}

/// An owned, checked atomic view of a ring part: `len` aligned `T`s inside a mapping that the
/// embedded `Arc` keeps alive. Only [`GuestMemory::shared_slice`] makes one.
#[cfg(not(loom))]
pub(crate) struct SharedSlice<T: SharedAtomic> {
    ptr: NonNull<T>,
    len: usize,
    _mem: Arc<GuestMemory>,
}

/// Under loom: the view's storage, shared with every other view of the same ring part.
#[cfg(loom)]
pub(crate) struct SharedSlice<T: SharedAtomic> {
    view: Arc<[T]>,
    _mem: Arc<GuestMemory>,
}

impl<T: SharedAtomic> SharedSlice<T> {
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> &[T] {
        #[cfg(loom)]
        return &self.view;
        #[cfg(not(loom))]
        // SAFETY: the constructor checked bounds and alignment; `_mem` keeps the mapping alive
        // for as long as `self`, and atomics are valid for any bit pattern and shared access.
        unsafe {
            std::slice::from_raw_parts(self.ptr.as_ptr(), self.len)
        }
    }
}

impl<T: SharedAtomic> std::fmt::Debug for SharedSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSlice")
            .field("len", &self.as_slice().len())
            .finish()
    }
}

// SAFETY: a `SharedSlice` only gives out `&T` with `T: Sync` (atomics), and the mapping is owned
// through an `Arc<GuestMemory>`, which is Send + Sync.
#[cfg(not(loom))]
unsafe impl<T: SharedAtomic> Send for SharedSlice<T> {}
// SAFETY: as above.
#[cfg(not(loom))]
unsafe impl<T: SharedAtomic> Sync for SharedSlice<T> {}
