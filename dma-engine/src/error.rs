//! The crate's one error type.

use hal::HalError;

/// Errors of the DMA engine drivers. Codes are stable (see [`DmaError::code`]): they end up in
/// transfer status words and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DmaError {
    /// The hardware seam failed (register window, timeout bookkeeping).
    #[error("hal: {0}")]
    Hal(#[from] HalError),
    /// The transfer cannot be programmed (length or address out of range).
    #[error("invalid transfer: {what}")]
    InvalidTransfer {
        /// What is wrong.
        what: &'static str,
    },
    /// The channel is still running a transfer.
    #[error("DMA channel busy")]
    Busy,
    /// A read of the source got an error response (an SMMU terminate, a decode error): the
    /// transfer stopped after `bytes` bytes and may be retransmitted once the cause is fixed.
    #[error("AXI read error after {bytes} bytes")]
    AxiRead {
        /// Bytes written to the destination before the error.
        bytes: u32,
    },
    /// A write of the destination got an error response.
    #[error("AXI write error after {bytes} bytes")]
    AxiWrite {
        /// Bytes written to the destination before the error.
        bytes: u32,
    },
    /// A descriptor fetch failed (scatter-gather mode).
    #[error("AXI error fetching a descriptor (ISR {isr:#x})")]
    DescriptorRead {
        /// The interrupt status read.
        isr: u32,
    },
    /// The channel saw a register access to an invalid address (ISR.INV_APB).
    #[error("invalid register access reported by the channel")]
    InvalidRegisterAccess,
    /// The transfer did not finish in time.
    #[error("DMA transfer did not finish within {waited_us} us ({bytes} bytes done)")]
    Timeout {
        /// How long was waited.
        waited_us: u64,
        /// Bytes transferred when giving up.
        bytes: u32,
    },
}

impl DmaError {
    /// A stable numeric code for logs and status words (0 is never used: it means success).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::InvalidTransfer { .. } => 2,
            Self::Busy => 3,
            Self::AxiRead { .. } => 4,
            Self::AxiWrite { .. } => 5,
            Self::DescriptorRead { .. } => 6,
            Self::InvalidRegisterAccess => 7,
            Self::Timeout { .. } => 8,
        }
    }

    /// Whether retransmitting the transfer may succeed: an AXI data error is what the master
    /// sees when the SMMU terminated one of its transactions.
    pub const fn is_retransmittable(&self) -> bool {
        matches!(self, Self::AxiRead { .. } | Self::AxiWrite { .. })
    }
}

/// Result with [`DmaError`].
pub type Result<T = ()> = core::result::Result<T, DmaError>;
