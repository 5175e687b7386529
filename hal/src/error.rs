//! The crate's one error type.

/// Errors of the hardware seam. Codes are stable (see [`HalError::code`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum HalError {
    /// Address arithmetic overflowed the 64-bit address space.
    #[error("address arithmetic overflowed: {base:#x} + {offset:#x}")]
    AddressOverflow {
        /// The starting address.
        base: u64,
        /// What was added to it.
        offset: u64,
    },
    /// An address or length is not aligned as required.
    #[error("{value:#x} is not aligned to {align:#x}")]
    Misaligned {
        /// The offending address or length.
        value: u64,
        /// The required alignment in bytes.
        align: u64,
    },
    /// A range of zero length was given where a non-empty one is required.
    #[error("empty range")]
    EmptyRange,
    /// A register block does not fit the bus window it was placed in.
    #[error("register block at {base:#x}+{size:#x} exceeds the bus window of {window:#x} bytes")]
    BlockOutsideWindow {
        /// Offset of the block in the window.
        base: usize,
        /// Size of the block.
        size: usize,
        /// Size of the window.
        window: usize,
    },
    /// A register array was indexed past its end.
    #[error("register index {index} out of range (array has {count} entries)")]
    RegisterIndex {
        /// The index asked for.
        index: usize,
        /// The number of registers in the array.
        count: usize,
    },
    /// A poll did not see its condition before the deadline.
    #[error("timed out after {waited_us} us")]
    Timeout {
        /// How long was waited, in microseconds.
        waited_us: u64,
    },
    /// DMA memory is exhausted (or the request is larger than the pool).
    #[error("DMA memory exhausted: {requested} bytes requested")]
    DmaExhausted {
        /// The size that could not be allocated.
        requested: usize,
    },
    /// A DMA region was freed that this allocator did not hand out (or freed twice).
    #[error("DMA region at {bus:#x} was not allocated here")]
    DmaUnknownRegion {
        /// Bus address of the region.
        bus: u64,
    },
    /// A physical access fell outside the memory that backs it.
    #[error("physical access {addr:#x}+{len:#x} is outside backed memory")]
    PhysOutOfRange {
        /// First byte of the access.
        addr: u64,
        /// Length of the access.
        len: u64,
    },
}

impl HalError {
    /// A stable numeric code for logs and ABI boundaries (0 is never used: it means success).
    pub const fn code(&self) -> u32 {
        match self {
            Self::AddressOverflow { .. } => 1,
            Self::Misaligned { .. } => 2,
            Self::EmptyRange => 3,
            Self::BlockOutsideWindow { .. } => 4,
            Self::RegisterIndex { .. } => 5,
            Self::Timeout { .. } => 6,
            Self::DmaExhausted { .. } => 7,
            Self::DmaUnknownRegion { .. } => 8,
            Self::PhysOutOfRange { .. } => 9,
        }
    }
}

/// Result with [`HalError`].
pub type Result<T = ()> = core::result::Result<T, HalError>;
