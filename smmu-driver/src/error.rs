//! The crate's one error type.

use hal::{HalError, Iova, PhysAddr};

use crate::fault::FaultKind;

/// Errors of the SMMU drivers, their translation tables and the fault path.
///
/// Codes are stable (see [`SmmuError::code`]): fault-path errors end up in transfer status
/// words and logs, so a number never changes meaning. New variants get new numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
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
    /// The SMMU lacks a feature the driver needs (SMMUv2 probe).
    #[error("SMMU does not support {what}")]
    Unsupported {
        /// The missing feature.
        what: &'static str,
    },
    /// Every instance of a hardware resource is in use (context banks, stream-match groups).
    #[error("no free {what} (all {capacity} in use)")]
    ResourceExhausted {
        /// Which resource.
        what: &'static str,
        /// How many there are.
        capacity: u32,
    },
    /// A stream ID or mask has bits the SMMU does not implement.
    #[error("stream ID/mask {id:#x} exceeds the SMMU's {bits}-bit stream IDs")]
    StreamIdOutOfRange {
        /// The offending ID or mask.
        id: u32,
        /// Implemented stream ID bits.
        bits: u8,
    },
    /// A stream-match entry would match a stream another entry already matches (SMMUv2 SMR
    /// overlap: a stream-match conflict on silicon).
    #[error("stream match {id:#x}/{mask:#x} overlaps stream-match entry {index}")]
    StreamMatchConflict {
        /// Requested ID.
        id: u32,
        /// Requested mask.
        mask: u32,
        /// The entry it overlaps.
        index: u16,
    },
    /// A context bank index that does not exist or is not allocated by this driver.
    #[error("context bank {index} is not allocated")]
    UnknownContextBank {
        /// The index.
        index: u16,
    },
    /// A stream-match entry index that does not exist or is not in use.
    #[error("stream-match entry {index} is not in use")]
    UnknownStreamMatch {
        /// The index.
        index: u16,
    },
    /// A context bank still has streams routed to it.
    #[error("context bank {index} still has {streams} stream(s) attached")]
    ContextInUse {
        /// The context bank.
        index: u16,
        /// Streams attached.
        streams: u16,
    },
    /// A stream that must never stall (PCIe, or not declared stall-tolerant) was routed to a
    /// context bank that stalls on faults.
    #[error("stream {stream:#x} is not stall-tolerant and cannot use a stalling context")]
    StallOnIntolerantStream {
        /// The stream ID (SMR ID).
        stream: u32,
    },
    /// A TLB synchronisation did not complete in time (context bank index, or `None` for the
    /// global sync): the SMMU may be deadlocked; the TLB state is unknown.
    #[error("TLB sync did not complete (context {context:?})")]
    TlbSyncTimeout {
        /// The context bank, or `None` for sTLBGSYNC.
        context: Option<u16>,
    },
    /// RESUME was asked for a context bank with no stalled transaction.
    #[error("context bank {context} has no stalled transaction to resume")]
    NoStallPending {
        /// The context bank.
        context: u16,
    },
    /// RESUME was written but the stalled transaction was not released (FSR.SS stayed set):
    /// the SMMU ignored it, e.g. because FSR still held fault bits (docs/mmu500.md §8).
    #[error("context bank {context}: RESUME ignored, the transaction is still stalled")]
    StallNotReleased {
        /// The context bank.
        context: u16,
    },
    /// RESUME was not written because FSR holds a fault record besides SS (`fsr`, as read):
    /// MMU-500 ignores RESUME until those bits are cleared, and clearing them unread would
    /// lose the record. The stall is still pending (and CFIE masked): take the record
    /// (`SmmuV2::take_context_fault`), service it, then resume again.
    #[error(
        "context bank {context}: FSR {fsr:#010x} holds a fault record; RESUME would be ignored"
    )]
    ResumeIgnored {
        /// The context bank.
        context: u16,
        /// FSR as read.
        fsr: u32,
    },
    /// An ASID asked for is already another context bank's. Stage-1 banks share VMID 0, and
    /// MMU-500 tags TLB entries with the VMID and ASID only, so the two banks would hit each
    /// other's translations and invalidate each other's entries.
    #[error("ASID {asid} is already used by context bank {index}")]
    AsidInUse {
        /// The ASID asked for.
        asid: u16,
        /// The context bank that has it.
        index: u16,
    },
    /// SMMUv3: a CMD_SYNC was not consumed in time (IHI0070 §4.7.3); the commands before it
    /// may not have taken effect.
    #[error("SMMUv3 CMD_SYNC not consumed after {waited_us} us")]
    CommandSyncTimeout {
        /// How long was waited.
        waited_us: u64,
    },
    /// SMMUv3: the command queue stayed full.
    #[error("SMMUv3 command queue full for {waited_us} us")]
    CommandQueueFull {
        /// How long was waited.
        waited_us: u64,
    },
    /// SMMUv3: the SMMU refused a command (CMDQ_CONS.ERR, IHI0070 §7.1). The driver replaced
    /// it with a CMD_SYNC and restarted the queue; the command had no effect.
    #[error("SMMUv3 rejected command {opcode:#04x} at queue index {index} (CERROR {reason})")]
    CommandRejected {
        /// CMDQ_CONS.ERR: 1 illegal, 2 fetch abort, 3 ATC invalidation timeout.
        reason: u8,
        /// Opcode of the rejected command.
        opcode: u8,
        /// Its queue index.
        index: u32,
    },
    /// SMMUv3: an event record with an EventID the architecture does not define.
    #[error("SMMUv3 event record with unknown EventID {id:#04x}")]
    UnknownEvent {
        /// The EventID.
        id: u8,
    },
    /// SMMUv3: an event record whose fields contradict the SMMU's capabilities.
    #[error("SMMUv3 malformed event record {id:#04x}: {reason}")]
    MalformedEvent {
        /// The EventID.
        id: u8,
        /// What is wrong.
        reason: &'static str,
    },
    /// SMMUv3: a malformed record of a *stalled* transaction. Its stream and STAG are kept,
    /// because every stall must be answered (IHI0070 §3.12.2): `drain_events` terminates it.
    #[error(
        "SMMUv3 malformed record {id:#04x} of a stalled transaction (stream {stream:#x}, STAG {stag:#x}): {reason}"
    )]
    MalformedStalledEvent {
        /// The EventID.
        id: u8,
        /// What is wrong.
        reason: &'static str,
        /// The stream.
        stream: u32,
        /// The STAG to answer.
        stag: u16,
    },
    /// SMMUv3: an acknowledge register (CR0ACK, IRQ_CTRLACK) did not follow its control
    /// register in time.
    #[error("SMMUv3 {register} did not acknowledge")]
    AckTimeout {
        /// The register waited for.
        register: &'static str,
    },
    /// SMMUv3: the stream has no configuration installed by this driver.
    #[error("SMMUv3 stream {stream:#x} is not attached")]
    StreamNotAttached {
        /// The stream.
        stream: u32,
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
            Self::Unsupported { .. } => 19,
            Self::ResourceExhausted { .. } => 20,
            Self::StreamIdOutOfRange { .. } => 21,
            Self::StreamMatchConflict { .. } => 22,
            Self::UnknownContextBank { .. } => 23,
            Self::UnknownStreamMatch { .. } => 24,
            Self::ContextInUse { .. } => 25,
            Self::StallOnIntolerantStream { .. } => 26,
            Self::TlbSyncTimeout { .. } => 27,
            Self::NoStallPending { .. } => 28,
            Self::StallNotReleased { .. } => 29,
            Self::AsidInUse { .. } => 30,
            Self::ResumeIgnored { .. } => 31,
            // SMMUv3 driver: 40-49.
            Self::CommandSyncTimeout { .. } => 40,
            Self::CommandQueueFull { .. } => 41,
            Self::CommandRejected { .. } => 42,
            Self::UnknownEvent { .. } => 43,
            Self::MalformedEvent { .. } => 44,
            Self::AckTimeout { .. } => 45,
            Self::StreamNotAttached { .. } => 46,
            Self::MalformedStalledEvent { .. } => 47,
        }
    }
}

/// Result with [`SmmuError`].
pub type Result<T = ()> = core::result::Result<T, SmmuError>;
