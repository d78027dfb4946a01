//! The crate's one error type.
//!
//! Variants fall in three kinds ([`ErrorKind`]): the peer broke the ring protocol (the queue is
//! then broken until reset), the configuration handed to us was invalid, or this side asked for
//! something that cannot be done (a full queue, a chain too long for one vectored I/O call).

/// What went wrong, and whose fault it was (see [`Error::kind`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // ---- The driver broke the ring (seen by the device side).
    #[error("avail index {avail_idx} is more than the queue size {size} ahead of {last_avail}")]
    AvailIdxOutOfRange {
        avail_idx: u16,
        last_avail: u16,
        size: u16,
    },
    #[error("avail ring entry holds head {head}, outside the queue of size {size}")]
    HeadOutOfRange { head: u16, size: u16 },
    #[error("descriptor {index} links to {next}, outside a table of {size} entries")]
    NextOutOfRange { index: u16, next: u16, size: u32 },
    #[error("chain from head {head} is longer than {max} descriptors (a loop)")]
    ChainLoop { head: u16, max: u32 },
    #[error("descriptor {index} is indirect, but INDIRECT_DESC was not negotiated")]
    IndirectNotNegotiated { index: u16 },
    #[error("descriptor {index} is indirect and also has NEXT set")]
    IndirectWithNext { index: u16 },
    #[error("indirect table entry {index} is itself indirect")]
    NestedIndirect { index: u16 },
    #[error(
        "indirect table at descriptor {index} has length {len}, not a non-zero multiple of 16"
    )]
    IndirectBadLength { index: u16, len: u32 },
    #[error("indirect table at descriptor {index} has {entries} entries, more than {max}")]
    IndirectTooLarge { index: u16, entries: u32, max: u32 },
    #[error("indirect table at descriptor {index} ({addr:#x}, {len} bytes) is outside memory")]
    IndirectOutOfMemory { index: u16, addr: u64, len: u32 },
    #[error("descriptor {index} buffer ({addr:#x}, {len} bytes) is outside memory")]
    BufferOutOfMemory { index: u16, addr: u64, len: u32 },
    #[error("descriptor {index} is device-readable but follows a device-writable one")]
    ReadableAfterWritable { index: u16 },
    #[error("chain from head {head} has more than {max} segments")]
    ChainTooLong { head: u16, max: usize },
    #[error("chain from head {head} has no device-writable bytes, where the device writes")]
    NoWritableBytes { head: u16 },

    // ---- The device broke the ring (seen by the driver side).
    #[error("used index {used_idx} is more than the queue size {size} ahead of {last_used}")]
    UsedIdxOutOfRange {
        used_idx: u16,
        last_used: u16,
        size: u16,
    },
    #[error("used element id {id} is outside the queue of size {size}")]
    UsedIdOutOfRange { id: u32, size: u16 },
    #[error("used element id {id} is not a chain in flight")]
    UsedIdNotInFlight { id: u32 },
    #[error("used element {id} reports {len} bytes written into {max} writable bytes")]
    UsedLenTooLarge { id: u32, len: u32, max: u32 },
    /// IN_ORDER: the element at the next used place names the last chain of a batch longer
    /// than what the used index covers: the device used a chain before those made available
    /// ahead of it, or skipped ahead past what it published.
    #[error(
        "used element id {id} ends an in-order batch of {batch} chains, but the used index \
         covers only {used}: the device broke IN_ORDER"
    )]
    UsedIdOutOfOrder { id: u32, batch: u32, used: u16 },

    /// Every call after a protocol violation, until reset.
    #[error("queue is broken: {reason}")]
    Broken { reason: Box<Error> },

    // ---- Invalid configuration.
    #[error("queue size {size} is not a power of two between 1 and 32768")]
    InvalidQueueSize { size: u32 },
    #[error("{what} at {addr:#x} is not aligned to {align}")]
    Misaligned {
        what: &'static str,
        addr: u64,
        align: u64,
    },
    #[error("{what} ({addr:#x}, {len} bytes) is not inside one memory region")]
    RingOutOfMemory {
        what: &'static str,
        addr: u64,
        len: u64,
    },
    #[error("address range {addr:#x} + {len} is outside guest memory")]
    AddressOutOfRange { addr: u64, len: u64 },
    #[error("invalid memory table: {reason}")]
    InvalidMemory { reason: &'static str },
    #[error("mapping memory failed: {reason}")]
    Mmap { reason: String },
    #[error("features {bits:#x} were acknowledged but never offered")]
    UnofferedFeatures { bits: u64 },
    #[error("vring base {base:#x} is not a position in a split ring (16 bits)")]
    InvalidVringBase { base: u32 },

    // ---- This side's request cannot be met now.
    #[error("chain needs {needed} descriptors but only {free} are free")]
    QueueFull { needed: usize, free: u16 },
    #[error("a chain needs at least one buffer")]
    EmptyChain,
    /// A legal chain, but one vectored I/O call takes fewer segments (`memory::MAX_IOVECS`).
    #[error("{count} segments are more than one vectored I/O call takes ({max})")]
    TooManySegments { count: usize, max: usize },
    /// A read past the end of a chain (`cursor::Reader`): callers check a chain's length
    /// before they read a header from it.
    #[error("{wanted} bytes wanted from a chain with {left} left")]
    ShortChain { wanted: u64, left: u64 },
}

/// Whose fault an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The peer broke the ring protocol; the queue is broken.
    Peer,
    /// The configuration (addresses, sizes, memory table, features) was invalid.
    Config,
    /// This side's request cannot be met: a full queue (transient), or a chain with more
    /// segments than one vectored I/O call takes. The queue is not broken.
    Usage,
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        use Error::*;
        match self {
            AvailIdxOutOfRange { .. }
            | HeadOutOfRange { .. }
            | NextOutOfRange { .. }
            | ChainLoop { .. }
            | IndirectNotNegotiated { .. }
            | IndirectWithNext { .. }
            | NestedIndirect { .. }
            | IndirectBadLength { .. }
            | IndirectTooLarge { .. }
            | IndirectOutOfMemory { .. }
            | BufferOutOfMemory { .. }
            | ReadableAfterWritable { .. }
            | ChainTooLong { .. }
            | NoWritableBytes { .. }
            | UsedIdxOutOfRange { .. }
            | UsedIdOutOfRange { .. }
            | UsedIdNotInFlight { .. }
            | UsedLenTooLarge { .. }
            | UsedIdOutOfOrder { .. }
            | Broken { .. } => ErrorKind::Peer,
            InvalidQueueSize { .. }
            | Misaligned { .. }
            | RingOutOfMemory { .. }
            | AddressOutOfRange { .. }
            | InvalidMemory { .. }
            | Mmap { .. }
            | UnofferedFeatures { .. }
            | InvalidVringBase { .. } => ErrorKind::Config,
            QueueFull { .. } | EmptyChain | TooManySegments { .. } | ShortChain { .. } => {
                ErrorKind::Usage
            }
        }
    }
}

/// A queue's broken state: the first protocol violation, kept until the queue is rebuilt.
#[derive(Debug, Default, Clone)]
pub(crate) struct Broken(Option<Error>);

impl Broken {
    /// Fails with `Error::Broken` once the queue is broken.
    #[inline]
    pub fn check(&self) -> Result<(), Error> {
        match &self.0 {
            None => Ok(()),
            Some(reason) => Err(Error::Broken {
                reason: Box::new(reason.clone()),
            }),
        }
    }

    /// Breaks the queue with `e`, and returns `e` for the caller to report.
    #[cold]
    pub fn set(&mut self, e: Error) -> Error {
        self.0 = Some(e.clone());
        e
    }

    pub fn get(&self) -> Option<&Error> {
        self.0.as_ref()
    }
}
