//! The crate's one error type.

use hal::HalError;

use crate::pci::Bdf;

/// Everything the runtime and the probe logic can fail with. Codes are stable
/// (see [`FirmwareError::code`]); a program's FAIL verdict prints the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(target_os = "none", derive(defmt::Format))]
#[non_exhaustive]
pub enum FirmwareError {
    /// A register block did not fit its bus window, or an array index was out of range.
    #[error("register access: {0}")]
    Hal(#[from] HalError),

    /// The blob does not start with the flattened-devicetree magic 0xd00dfeed.
    #[error("device tree: bad magic {found:#010x}")]
    FdtBadMagic {
        /// The first word of the blob.
        found: u32,
    },
    /// The blob is shorter than its header (or one of its blocks) says.
    #[error("device tree: truncated ({len} bytes available)")]
    FdtTruncated {
        /// Bytes available.
        len: usize,
    },
    /// The blob's format version is one this parser cannot read (it needs version 16 or a
    /// later one that is backward compatible with 16).
    #[error("device tree: unsupported version {version} (last compatible {last_compatible})")]
    FdtVersion {
        /// The header's `version`.
        version: u32,
        /// The header's `last_comp_version`.
        last_compatible: u32,
    },
    /// The structure block is malformed at this offset (bad token, unterminated name,
    /// property outside the strings block, unbalanced nodes, too deep nesting).
    #[error("device tree: malformed structure block at offset {offset:#x}")]
    FdtMalformed {
        /// Byte offset in the structure block.
        offset: usize,
    },
    /// A property has a length or cell count the caller cannot use.
    #[error("device tree: property `{name}` is malformed")]
    FdtBadProperty {
        /// The property name.
        name: &'static str,
    },

    /// The identity map needs more translation tables than the runtime reserved.
    #[error("page tables: more than {available} tables needed")]
    PageTablesExhausted {
        /// Tables available.
        available: usize,
    },
    /// A region to map as normal memory is empty after rounding to 2 MiB, or lies outside the
    /// mapped address space.
    #[error("memory region {base:#x}+{size:#x} cannot be mapped")]
    RegionNotMappable {
        /// Start of the region.
        base: u64,
        /// Size of the region.
        size: u64,
    },
    /// The runtime does not support running at this exception level (or in this mode, e.g.
    /// EL2 with HCR_EL2.E2H set).
    #[error("unsupported exception level EL{el}")]
    UnsupportedExceptionLevel {
        /// The exception level.
        el: u8,
    },

    /// A register window the program wants to use is not mapped as Device memory (it
    /// overlaps RAM or lies beyond the identity map).
    #[error("{base:#x}+{size:#x} is not mapped as Device memory")]
    NotDeviceMemory {
        /// Start of the window.
        base: u64,
        /// Size of the window.
        size: u64,
    },

    /// A buffer range is not free RAM: not inside the Normal-mapped part of a RAM region, or
    /// overlapping the device tree (which the program keeps reading).
    #[error("{base:#x}+{size:#x} is not free RAM mapped as Normal memory")]
    NotFreeRam {
        /// Start of the range.
        base: u64,
        /// Size of the range.
        size: u64,
    },

    /// The host bridge has no 32-bit memory window to place BARs in.
    #[error("the PCI host bridge has no 32-bit memory window")]
    PciNoMemoryWindow,
    /// Enumeration found more bridges than bus numbers the host bridge decodes.
    #[error("PCI bus numbers exhausted behind {bridge}")]
    PciBusNumbersExhausted {
        /// The bridge that needed a secondary bus.
        bridge: Bdf,
    },
    /// Enumeration found more functions than the runtime keeps.
    #[error("more than {capacity} PCI functions")]
    PciTooManyFunctions {
        /// How many are kept.
        capacity: usize,
    },
    /// A bus, device or function number outside the ECAM window or the PCI limits.
    #[error("PCI address {bus:#x}:{device:#x}.{function:#x} is outside the ECAM window")]
    PciAddressOutOfRange {
        /// Bus number.
        bus: u16,
        /// Device number.
        device: u8,
        /// Function number.
        function: u8,
    },
    /// No function with this vendor and device ID was found.
    #[error("no PCI function {vendor:04x}:{device:04x} found")]
    PciDeviceNotFound {
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
    },
    /// A BAR reads back zero after writing all-ones: it is not implemented.
    #[error("BAR{index} of {bdf} is not implemented")]
    PciBarNotImplemented {
        /// The function.
        bdf: Bdf,
        /// BAR index.
        index: u8,
    },
    /// A BAR index past the header's BARs, or the upper half of a 64-bit BAR at the end.
    #[error("BAR{index} of {bdf} does not exist")]
    PciBarIndex {
        /// The function.
        bdf: Bdf,
        /// BAR index.
        index: u8,
    },
    /// A BAR is not the kind the caller can assign (I/O, 64-bit, legacy below-1-MiB).
    #[error("BAR{index} of {bdf} is {found}, expected 32-bit memory")]
    PciUnexpectedBarKind {
        /// The function.
        bdf: Bdf,
        /// BAR index.
        index: u8,
        /// What it is.
        found: &'static str,
    },
    /// The memory window has no naturally aligned room left for a BAR of this size.
    #[error("no room for {size:#x} bytes in the PCI memory window")]
    PciWindowExhausted {
        /// The BAR size.
        size: u64,
    },
    /// A BAR did not read back the address written to it.
    #[error("BAR{index} of {bdf}: wrote {wrote:#010x}, read back {read:#010x}")]
    PciBarReadback {
        /// The function.
        bdf: Bdf,
        /// BAR index.
        index: u8,
        /// Address written.
        wrote: u32,
        /// Value read back.
        read: u32,
    },
    /// The command register did not take the enable bits.
    #[error("command register of {bdf}: wanted bits {wanted:#06x}, read {read:#06x}")]
    PciCommandReadback {
        /// The function.
        bdf: Bdf,
        /// Bits that should be set.
        wanted: u16,
        /// Value read back.
        read: u16,
    },

    /// The edu identification register holds an unexpected value.
    #[error("edu identification register is {found:#010x}, expected {expected:#010x}")]
    EduIdentification {
        /// Value read.
        found: u32,
        /// Value expected.
        expected: u32,
    },
    /// The edu liveness register did not return the bitwise NOT of a written pattern.
    #[error("edu liveness: wrote {wrote:#010x}, read {read:#010x}, expected {expected:#010x}")]
    EduLiveness {
        /// Pattern written.
        wrote: u32,
        /// Value read back.
        read: u32,
        /// Its bitwise NOT.
        expected: u32,
    },

    /// Anything from the SMMU driver (`smmuv3-faults`).
    #[error("SMMU: {0}")]
    Smmu(#[from] smmu_driver::SmmuError),
    /// A GIC register did not settle (RWP, ChildrenAsleep).
    #[error("GIC: {register} did not settle")]
    GicTimeout {
        /// The register and bit waited for.
        register: &'static str,
    },
    /// No redistributor frame of the GIC's region reports this PE's affinity.
    #[error("GIC: no redistributor for affinity {affinity:#x}")]
    GicRedistributorNotFound {
        /// The PE's affinity (Aff3.Aff2.Aff1.Aff0).
        affinity: u32,
    },
    /// An INTID that is not an SPI the distributor implements.
    #[error("INTID {intid} is not an implemented SPI")]
    InterruptOutOfRange {
        /// The INTID.
        intid: u32,
    },
    /// A PCI function's INTx route was asked for, but it sits behind a bridge: each bridge
    /// swizzles the pin (PCI-to-PCI Bridge spec §9.1), which this firmware does not walk.
    #[error(
        "PCI function on bus {bus} is behind a bridge (root bus {root_bus}): its INTx route is unknown"
    )]
    PciIntxBehindBridge {
        /// The function's bus.
        bus: u8,
        /// The host bridge's (root) bus.
        root_bus: u8,
    },
    /// edu was asked for a DMA while one was running.
    #[error("edu: a DMA is still running")]
    EduBusy,
    /// An edu DMA did not finish.
    #[error("edu: DMA did not complete")]
    EduDmaTimeout,
    /// A DMA edu would refuse or clamp: the buffer side must end strictly inside
    /// 0x40000..0x41000 (QEMU 7.2 aborts otherwise), the memory side below 2^28.
    #[error(
        "edu: DMA of {len:#x} bytes at buffer offset {offset:#x} / IOVA {iova:#x} is out of range"
    )]
    EduDmaRange {
        /// Offset in edu's buffer.
        offset: u64,
        /// Length.
        len: u64,
        /// Memory-side address.
        iova: u64,
    },
    /// An SMMU event that belongs to no transfer in flight.
    #[error("unexpected SMMU event {id:#04x} at IOVA {iova:#x}")]
    UnexpectedEvent {
        /// EventID.
        id: u8,
        /// Its InputAddr (0 if none).
        iova: u64,
    },
    /// A transfer kept faulting.
    #[error("transfer at IOVA {iova:#x} still faulting after {attempts} attempts")]
    RetransmitLimit {
        /// First IOVA of the transfer.
        iova: u64,
        /// Attempts made.
        attempts: u32,
    },
    /// The pager has no frame to give and nothing it may evict.
    #[error("pager: no frame free and nothing evictable")]
    PagerExhausted,
    /// A scenario parameter is out of range.
    #[error("scenario: {what}")]
    BadScenario {
        /// Which parameter.
        what: &'static str,
    },

    /// The generic timer's system counter does not advance (ZynqMP: IOU_SCNTRS was not
    /// enabled by the FSBL or `psu_init`), so no bounded wait could ever end.
    #[error("the system counter (CNTPCT_EL0) does not advance")]
    CounterStopped,
    /// A linker-script region is not where the platform description says, or the runtime did
    /// not map it as the platform requires.
    #[error("linker region {name} at {base:#x}+{size:#x} does not match the platform")]
    LinkerRegionMismatch {
        /// The region (output section name).
        name: &'static str,
        /// Its start.
        base: u64,
        /// Its size.
        size: u64,
    },

    /// The zDMA driver failed (`zynqmp-smmu-faults` without an SMMU).
    #[error("zDMA: {0}")]
    Dma(#[from] dma_engine::DmaError),
    /// The shared pager (`boards::pager`) failed (`smmuv3-faults`).
    #[error("pager: {0}")]
    Board(#[from] boards::BoardError),
    /// A zDMA copy left a byte that is not its source's (offset from the first destination
    /// byte; negative or past the length: a guard byte the copy must not touch).
    #[error(
        "zDMA channel {channel} copy {copy}: byte {offset} is {found:#04x}, expected {expected:#04x}"
    )]
    ZdmaMismatch {
        /// Channel index.
        channel: u8,
        /// Copy number.
        copy: u32,
        /// Offset from the first destination byte.
        offset: i64,
        /// The byte that should be there.
        expected: u8,
        /// The byte found.
        found: u8,
    },
    /// A zDMA copy finished but TOTAL_BYTE counted another length.
    #[error("zDMA channel {channel} copy {copy}: {counted} bytes counted, {expected} expected")]
    ZdmaByteCount {
        /// Channel index.
        channel: u8,
        /// Copy number.
        copy: u32,
        /// The copy's length.
        expected: u32,
        /// What the channel counted.
        counted: u32,
    },
}

impl FirmwareError {
    /// A stable numeric code (0 is never used).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::FdtBadMagic { .. } => 10,
            Self::FdtTruncated { .. } => 11,
            Self::FdtVersion { .. } => 12,
            Self::FdtMalformed { .. } => 13,
            Self::FdtBadProperty { .. } => 14,
            Self::PageTablesExhausted { .. } => 20,
            Self::RegionNotMappable { .. } => 21,
            Self::UnsupportedExceptionLevel { .. } => 22,
            Self::NotDeviceMemory { .. } => 23,
            Self::NotFreeRam { .. } => 24,
            Self::PciBusNumbersExhausted { .. } => 30,
            Self::PciTooManyFunctions { .. } => 31,
            Self::PciAddressOutOfRange { .. } => 32,
            Self::PciDeviceNotFound { .. } => 33,
            Self::PciBarNotImplemented { .. } => 34,
            Self::PciBarIndex { .. } => 35,
            Self::PciUnexpectedBarKind { .. } => 36,
            Self::PciWindowExhausted { .. } => 37,
            Self::PciBarReadback { .. } => 38,
            Self::PciCommandReadback { .. } => 39,
            Self::PciNoMemoryWindow => 50,
            Self::EduIdentification { .. } => 40,
            Self::EduLiveness { .. } => 41,
            Self::Smmu(_) => 60,
            Self::GicTimeout { .. } => 61,
            Self::InterruptOutOfRange { .. } => 62,
            Self::EduBusy => 63,
            Self::EduDmaTimeout => 64,
            Self::EduDmaRange { .. } => 65,
            Self::PciIntxBehindBridge { .. } => 66,
            Self::GicRedistributorNotFound { .. } => 67,
            Self::UnexpectedEvent { .. } => 70,
            Self::RetransmitLimit { .. } => 71,
            Self::PagerExhausted => 72,
            Self::BadScenario { .. } => 73,
            Self::CounterStopped => 80,
            Self::LinkerRegionMismatch { .. } => 81,
            Self::Dma(_) => 90,
            Self::ZdmaMismatch { .. } => 91,
            Self::ZdmaByteCount { .. } => 92,
            Self::Board(_) => 93,
        }
    }
}

/// Result with [`FirmwareError`].
pub type Result<T = ()> = core::result::Result<T, FirmwareError>;
