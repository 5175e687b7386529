//! The crate's one error type.

use dma_engine::DmaError;
use hal::HalError;
use protocol::ProtocolError;
use smmu_driver::SmmuError;

/// Errors building or using a simulated machine and running the virtual QFDB. Messages are
/// one line each: the CLI prints them as they are. Codes are stable ([`SimError::code`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The hardware seam failed (e.g. the simulated DRAM could not be allocated).
    #[error("hal: {0}")]
    Hal(#[from] HalError),
    /// A model configuration is out of range.
    #[error("invalid model configuration: {what}")]
    InvalidConfig {
        /// What is wrong.
        what: &'static str,
    },
    /// A device index that the machine does not have.
    #[error("no such device: {what} {index}")]
    NoSuchDevice {
        /// Device kind.
        what: &'static str,
        /// Index asked for.
        index: usize,
    },
    /// Virtual QFDB: a knob is out of range or knobs contradict each other.
    #[error("{0}")]
    Config(String),
    /// The SMMU driver refused something.
    #[error("smmu: {0}")]
    Smmu(#[from] SmmuError),
    /// The protocol refused something.
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// A DMA engine driver (the NPE driver) refused something.
    #[error("npe driver: {0}")]
    Dma(#[from] DmaError),
    /// Node memory is exhausted (every frame pinned or in use).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// Transferred data did not match what was sent.
    #[error("DATA VERIFICATION FAILED: {0}")]
    Verification(String),
    /// A transfer was lost, aborted, duplicated or completed out of order.
    #[error("TRANSFER ACCOUNTING FAILED: {0}")]
    Accounting(String),
    /// The simulation reached a state that should be impossible (a model bug).
    #[error("internal simulator error: {0}")]
    Internal(String),
    /// A run ended with transfers lost, duplicated, reordered or corrupted: what the
    /// application's checks counted.
    #[error("TRANSFER INTEGRITY FAILED: {0}")]
    Integrity(Integrity),
}

/// What the application's checks count over a run (all 0 in a good one): every completion
/// and delivery is matched against the transfers posted, in order, and every delivered byte
/// against a checksum of what was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Integrity {
    /// Transfers posted that never completed or were never delivered.
    pub lost: u64,
    /// Completions or deliveries of a transfer already completed or delivered.
    pub duplicated: u64,
    /// Completions or deliveries that came after one of a later transfer of the same pair.
    pub reordered: u64,
    /// Transfers whose delivered bytes do not match what was sent (corruption no earlier
    /// check caught).
    pub corrupted: u64,
}

impl Integrity {
    /// Nothing lost, duplicated, reordered or corrupted.
    pub fn is_clean(&self) -> bool {
        *self == Self::default()
    }
}

impl core::fmt::Display for Integrity {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "{} lost, {} duplicated, {} reordered, {} corrupted",
            self.lost, self.duplicated, self.reordered, self.corrupted
        )
    }
}

impl SimError {
    /// A stable numeric code (0 is never used).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::InvalidConfig { .. } => 2,
            Self::NoSuchDevice { .. } => 3,
            Self::Config(_) => 4,
            Self::Smmu(_) => 5,
            Self::Protocol(_) => 6,
            Self::Dma(_) => 7,
            Self::OutOfMemory(_) => 8,
            Self::Verification(_) => 9,
            Self::Accounting(_) => 10,
            Self::Internal(_) => 11,
            Self::Integrity(_) => 12,
        }
    }
}

/// Result with [`SimError`].
pub type Result<T = ()> = core::result::Result<T, SimError>;
