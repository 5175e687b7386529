//! The crate's one error type.
//!
//! Codes are stable: the kernel-module ABI ([`crate::abi`]) reports failures as these codes in
//! its `status` fields, so a code is never reused or renumbered.

use hal::HalError;

/// Errors of linux-glue. See [`GlueError::code`] for the stable numeric codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlueError {
    /// An address or length is not a multiple of the page size.
    #[error("{value:#x} is not aligned to {align:#x}")]
    Misaligned {
        /// The offending address or length.
        value: u64,
        /// The required alignment in bytes.
        align: u64,
    },
    /// `start + len` does not fit in the address space.
    #[error("range {start:#x} + {len:#x} overflows the address space")]
    Overflow {
        /// First byte.
        start: u64,
        /// Length in bytes.
        len: u64,
    },
    /// A range of zero bytes.
    #[error("empty range")]
    EmptyRange,
    /// Part of the range is not mapped in this process.
    #[error("address {addr:#x} is not mapped")]
    Unmapped {
        /// First unmapped address found.
        addr: u64,
    },
    /// Write access was asked for on a mapping without write permission.
    #[error("mapping at {addr:#x} is not writable")]
    NotWritable {
        /// Start of the offending mapping (or the page).
        addr: u64,
    },
    /// The mapping cannot be read (PROT_NONE or a guard region).
    #[error("mapping at {addr:#x} is not readable")]
    NotReadable {
        /// Start of the offending mapping (or the page).
        addr: u64,
    },
    /// The range overlaps a region that is already registered.
    #[error("range overlaps registered region {existing}")]
    AlreadyRegistered {
        /// Id of the region it overlaps.
        existing: u64,
    },
    /// No registered region has this id.
    #[error("no registered region with id {id}")]
    UnknownRegion {
        /// The id asked for.
        id: u64,
    },
    /// The address lies outside every registered region.
    #[error("address {addr:#x} is not in a registered region")]
    NotRegistered {
        /// The address asked for.
        addr: u64,
    },
    /// The address was registered, but that part was unmapped or moved away since.
    #[error("address {addr:#x} of region {id} was unmapped or moved")]
    RegionGone {
        /// The region.
        id: u64,
        /// The address asked for.
        addr: u64,
    },
    /// The mapping is of a kind this crate cannot serve (vDSO, PFNMAP/IO, ...).
    #[error("mapping at {addr:#x} cannot be used: {reason}")]
    UnsupportedMapping {
        /// Start of the mapping.
        addr: u64,
        /// Why.
        reason: &'static str,
    },
    /// A system call failed with an errno this crate has no better name for.
    #[error("{op} failed: errno {errno}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The errno value.
        errno: i32,
    },
    /// A kernel feature is missing, disabled or not permitted here.
    #[error("{feature} is not available: {why}")]
    Unavailable {
        /// The feature.
        feature: &'static str,
        /// Why (errno text or a note).
        why: String,
    },
    /// The nprdma kernel module is not loaded (its device node does not exist).
    #[error("kernel module not loaded: {path} does not exist")]
    ModuleNotLoaded {
        /// The device node that was looked for.
        path: String,
    },
    /// The two sides of the kernel-module ABI speak different versions.
    #[error("ABI version mismatch: this side speaks {ours}, the other side {theirs}")]
    AbiVersion {
        /// Our version.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// An ABI struct arrived with the wrong size.
    #[error("ABI struct {what} has size {got}, expected {expected}")]
    AbiSize {
        /// Which struct.
        what: &'static str,
        /// Size this side expects.
        expected: u32,
        /// Size that arrived.
        got: u32,
    },
    /// A record read from the kernel (procfs text, a uffd message, a ring entry) is malformed.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What kind of record.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The kernel refused for lack of privilege.
    #[error("permission denied: {what}")]
    PermissionDenied {
        /// What was refused.
        what: &'static str,
    },
    /// The invalidation ring overflowed; `lost` events were dropped and the page-state table
    /// must be rescanned.
    #[error("event ring overrun: {lost} events lost")]
    RingOverrun {
        /// Number of events lost.
        lost: u64,
    },
    /// The operation kept racing with invalidations and gave up after bounded retries.
    #[error("gave up after {retries} retries racing with invalidations")]
    Contended {
        /// Retries made.
        retries: u32,
    },
    /// An argument is out of its documented domain.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// Which argument and why.
        what: &'static str,
    },
    /// The page is hardware-poisoned.
    #[error("page at {addr:#x} is hardware-poisoned")]
    HwPoison {
        /// The page.
        addr: u64,
    },
    /// A setting (an environment variable) has a value that is not one of its choices.
    #[error("{name}={value:?} is not valid (expected {expected})")]
    BadSetting {
        /// The setting's name.
        name: &'static str,
        /// The value found.
        value: String,
        /// The values it takes.
        expected: &'static str,
    },
    /// The kernel backend was forced (`NPRDMA_BACKEND=kernel`) but the module's device is not
    /// usable: absent, not openable, or the ABI handshake failed.
    #[error("the kernel backend was asked for but {path} is not usable: {why}")]
    KernelBackendUnavailable {
        /// The device node probed.
        path: String,
        /// What opening it or the handshake answered.
        why: Box<GlueError>,
    },
}

impl GlueError {
    /// A stable numeric code for logs and the kernel-module ABI (0 means success and is never
    /// used).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Misaligned { .. } => 1,
            Self::Overflow { .. } => 2,
            Self::EmptyRange => 3,
            Self::Unmapped { .. } => 4,
            Self::NotWritable { .. } => 5,
            Self::NotReadable { .. } => 6,
            Self::AlreadyRegistered { .. } => 7,
            Self::UnknownRegion { .. } => 8,
            Self::NotRegistered { .. } => 9,
            Self::RegionGone { .. } => 10,
            Self::UnsupportedMapping { .. } => 11,
            Self::Os { .. } => 12,
            Self::Unavailable { .. } => 13,
            Self::ModuleNotLoaded { .. } => 14,
            Self::AbiVersion { .. } => 15,
            Self::AbiSize { .. } => 16,
            Self::Malformed { .. } => 17,
            Self::PermissionDenied { .. } => 18,
            Self::RingOverrun { .. } => 19,
            Self::Contended { .. } => 20,
            Self::InvalidArgument { .. } => 21,
            Self::HwPoison { .. } => 22,
            Self::BadSetting { .. } => 23,
            Self::KernelBackendUnavailable { .. } => 24,
        }
    }
}

impl From<HalError> for GlueError {
    fn from(e: HalError) -> Self {
        match e {
            HalError::Misaligned { value, align } => Self::Misaligned { value, align },
            HalError::AddressOverflow { base, offset } => Self::Overflow {
                start: base,
                len: offset,
            },
            HalError::EmptyRange => Self::EmptyRange,
            _ => Self::InvalidArgument {
                what: "address arithmetic",
            },
        }
    }
}

/// Result with [`GlueError`].
pub type Result<T, E = GlueError> = core::result::Result<T, E>;
