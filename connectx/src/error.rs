//! The crate's error type.

/// What can go wrong inside the library. Errors that reach an application through a verbs
/// call are turned into that call's convention (an errno, NULL + errno, or a work completion
/// status) by [`ConnectxError::errno`]; the numeric [`code`](ConnectxError::code)s are stable
/// and appear in the log and in `nprdma doctor`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectxError {
    /// An environment variable has a value we cannot use.
    #[error("bad value {value:?} for {name}: {why}")]
    Config {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A libibverbs symbol could not be resolved.
    #[error("libibverbs has no symbol {symbol}")]
    MissingSymbol {
        /// The symbol and version.
        symbol: &'static str,
    },
    /// The pinned-memory budget cannot hold what is needed right now.
    #[error(
        "pinned-memory budget of {budget} bytes cannot hold {needed} more bytes ({pinned} pinned, nothing evictable)"
    )]
    BudgetExhausted {
        /// The budget.
        budget: u64,
        /// Bytes pinned now.
        pinned: u64,
        /// Bytes asked for.
        needed: u64,
    },
    /// The provider refused a registration.
    #[error("the provider refused to register {len} bytes at {addr:#x}: errno {errno}")]
    RegistrationFailed {
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
        /// The provider's errno.
        errno: i32,
    },
    /// The application passed something plain verbs would reject.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A memory range is not (fully) mapped with the needed protection.
    #[error("{len} bytes at {addr:#x} are not mapped with the needed protection")]
    BadAddress {
        /// Address.
        addr: u64,
        /// Length.
        len: u64,
    },
    /// A remote directory did not answer within the deadline.
    #[error("the peer's nprdma directory did not answer within {millis} ms")]
    RemoteTimeout {
        /// The deadline.
        millis: u64,
    },
    /// A remote directory is malformed (a peer without the library, or corruption).
    #[error("remote key {rkey:#x} has no valid nprdma directory: {why}")]
    NoRemoteDirectory {
        /// The application's remote key.
        rkey: u32,
        /// What was wrong.
        why: &'static str,
    },
    /// The status file could not be created or read.
    #[error("status file {path}: {why}")]
    Status {
        /// Path.
        path: String,
        /// What failed.
        why: String,
    },
    /// The operation is not supported on unpinned memory.
    #[error("not supported on unpinned memory: {0}")]
    Unsupported(&'static str),
}

impl ConnectxError {
    /// Stable numeric code (log and doctor output).
    pub fn code(&self) -> u16 {
        match self {
            ConnectxError::Config { .. } => 1,
            ConnectxError::MissingSymbol { .. } => 2,
            ConnectxError::BudgetExhausted { .. } => 3,
            ConnectxError::RegistrationFailed { .. } => 4,
            ConnectxError::InvalidArgument(_) => 5,
            ConnectxError::BadAddress { .. } => 6,
            ConnectxError::RemoteTimeout { .. } => 7,
            ConnectxError::NoRemoteDirectory { .. } => 8,
            ConnectxError::Status { .. } => 9,
            ConnectxError::Unsupported(_) => 10,
        }
    }

    /// The errno a verbs call reports for this error (what plain verbs would report for the
    /// same cause: ENOMEM for memory limits, EINVAL for bad arguments, EFAULT for bad
    /// addresses).
    pub fn errno(&self) -> i32 {
        match self {
            ConnectxError::BudgetExhausted { .. } => libc::ENOMEM,
            ConnectxError::RegistrationFailed { errno, .. } => *errno,
            ConnectxError::InvalidArgument(_) | ConnectxError::Config { .. } => libc::EINVAL,
            ConnectxError::BadAddress { .. } => libc::EFAULT,
            ConnectxError::RemoteTimeout { .. } => libc::ETIMEDOUT,
            ConnectxError::Unsupported(_) => libc::EOPNOTSUPP,
            ConnectxError::MissingSymbol { .. } => libc::ENOSYS,
            ConnectxError::NoRemoteDirectory { .. } | ConnectxError::Status { .. } => libc::EIO,
        }
    }
}

/// Result with [`ConnectxError`].
pub type Result<T> = core::result::Result<T, ConnectxError>;
