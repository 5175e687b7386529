//! The crate's one error type.

use hal::HalError;

/// Errors building or using a simulated machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
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
}

impl SimError {
    /// A stable numeric code (0 is never used).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Hal(_) => 1,
            Self::InvalidConfig { .. } => 2,
            Self::NoSuchDevice { .. } => 3,
        }
    }
}

/// Result with [`SimError`].
pub type Result<T = ()> = core::result::Result<T, SimError>;
