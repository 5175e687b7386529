//! The crate's one error type.

use hal::{HalError, Iova, PhysAddr};

use crate::fault::FaultKind;

/// Errors of the SMMU drivers, their translation tables and the fault path.
///
/// Codes are stable (see [`SmmuError::code`]): fault-path errors end up in transfer status
/// words and logs, so a number never changes meaning. New variants get new numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SmmuError {
    /// The hardware seam failed (DMA memory, physical access, timeout).
    #[error("hal: {0}")]
    Hal(#[from] HalError),
    /// An IOVA, frame or length is not aligned to the granule the operation needs.
    #[error("{value:#x} is not aligned to {align:#x}")]
    Misaligned {
        /// The offending address or length.
        value: u64,
        /// The required alignment in bytes.
        align: u64,
    },
    /// An IOVA range lies (partly) outside the table's input address space.
    #[error("IOVA range {iova}+{len:#x} is outside the {bits}-bit input address space")]
    IovaOutOfRange {
        /// First IOVA of the range.
        iova: Iova,
        /// Length of the range in bytes.
        len: u64,
        /// Input address size of the table.
        bits: u8,
    },
    /// An output address does not fit the configured output address size (it would raise an
    /// Address size fault instead of translating).
    #[error("output address {phys} exceeds the {bits}-bit output address size")]
    OutputAddressOutOfRange {
        /// The frame asked for.
        phys: PhysAddr,
        /// The configured output address size.
        bits: u8,
    },
    /// The IOVA (or part of the block) is already mapped; map never replaces a live mapping.
    #[error("IOVA {iova} is already mapped")]
    AlreadyMapped {
        /// The first mapped IOVA found.
        iova: Iova,
    },
    /// The table has used every table page it may allocate.
    #[error("translation table memory exhausted ({tables} tables in use)")]
    TableMemoryExhausted {
        /// Tables in use when the allocation failed.
        tables: usize,
    },
    /// A descriptor in our own tables is not one we could have written (reserved encoding, or
    /// a table address outside our table memory). The table was modified behind our back.
    #[error("corrupt descriptor {descriptor:#x} at {at}")]
    CorruptTable {
        /// Physical address of the descriptor.
        at: PhysAddr,
        /// Its value.
        descriptor: u64,
    },
    /// The mapping size is not one the tables support (4 KiB pages and 2 MiB blocks only).
    #[error("unsupported mapping size {bytes:#x}")]
    UnsupportedPageSize {
        /// The size asked for.
        bytes: u64,
    },
    /// A MAIR attribute index outside 0..=7.
    #[error("MAIR index {index} is out of range 0..=7")]
    InvalidMairIndex {
        /// The index asked for.
        index: u8,
    },
    /// A configuration value is out of its documented range.
    #[error("invalid configuration: {what}")]
    InvalidConfig {
        /// Which value.
        what: &'static str,
    },
    /// A region overlaps one already registered for the same stream.
    #[error("region {start}+{len:#x} overlaps a registered region of stream {stream:#x}")]
    RegionOverlap {
        /// Stream of the region.
        stream: u32,
        /// First IOVA of the rejected region.
        start: Iova,
        /// Its length.
        len: u64,
    },
    /// The region set is full.
    #[error("no room for another registered region ({capacity} in use)")]
    RegionCapacity {
        /// Capacity of the set.
        capacity: usize,
    },
    /// No registered region of this stream contains the IOVA: the fault is never resolved by
    /// mapping; the transfer is aborted.
    #[error("stream {stream:#x}: IOVA {iova} is outside every registered region")]
    OutsideRegisteredRegion {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
    },
    /// A write to a region registered read-only.
    #[error("stream {stream:#x}: write to read-only region at IOVA {iova}")]
    WriteToReadOnlyRegion {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
    },
    /// A fault no mapping can fix (address size, external abort on the walk, unknown).
    #[error("stream {stream:#x}: unrecoverable {kind:?} fault at IOVA {iova}")]
    UnrecoverableFault {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
        /// What the SMMU reported.
        kind: FaultKind,
    },
    /// The transaction was terminated and the policy does not allow retransmission (or a
    /// stall-only stream saw a terminated transaction): the transfer's data is lost.
    #[error(
        "stream {stream:#x}: transaction at IOVA {iova} terminated and cannot be retransmitted"
    )]
    TransferLost {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
    },
    /// The fault resolver could not make the page present.
    #[error("stream {stream:#x}: resolver failed for IOVA {iova} (resolver code {code})")]
    ResolveFailed {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
        /// The resolver's own error code.
        code: u32,
    },
    /// The resolver returned a page that does not satisfy the fault (misaligned frame, outside
    /// the region, not writable for a write, unsupported size).
    #[error("stream {stream:#x}: resolver returned an unusable page for IOVA {iova}")]
    ResolverContract {
        /// The faulting stream.
        stream: u32,
        /// The faulting IOVA.
        iova: Iova,
    },
}

impl SmmuError {
    /// A stable numeric code for logs and status words (0 is never used: it means success).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::Misaligned { .. } => 2,
            Self::IovaOutOfRange { .. } => 3,
            Self::OutputAddressOutOfRange { .. } => 4,
            Self::AlreadyMapped { .. } => 5,
            Self::TableMemoryExhausted { .. } => 6,
            Self::CorruptTable { .. } => 7,
            Self::UnsupportedPageSize { .. } => 8,
            Self::InvalidMairIndex { .. } => 9,
            Self::InvalidConfig { .. } => 10,
            Self::RegionOverlap { .. } => 11,
            Self::RegionCapacity { .. } => 12,
            Self::OutsideRegisteredRegion { .. } => 13,
            Self::WriteToReadOnlyRegion { .. } => 14,
            Self::UnrecoverableFault { .. } => 15,
            Self::TransferLost { .. } => 16,
            Self::ResolveFailed { .. } => 17,
            Self::ResolverContract { .. } => 18,
        }
    }
}

/// Result with [`SmmuError`].
pub type Result<T = ()> = core::result::Result<T, SmmuError>;
