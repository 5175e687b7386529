//! The crate's one error type (zDMA and NPE drivers).

use hal::HalError;
use protocol::ProtocolError;

/// Errors of the DMA engine drivers (zDMA and NPE). Codes are stable (see [`DmaError::code`]): they end up in
/// transfer status words and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
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
    /// NPE: the protocol state machine refused a call (see the inner error).
    #[error("protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// NPE: `ID` does not identify an NPE.
    #[error("not an NPE: ID reads {id:#010x}")]
    NotAnNpe {
        /// The `ID` register's value.
        id: u32,
    },
    /// NPE: the engine implements another spec version.
    #[error("NPE spec version {found} is not supported (driver speaks 1)")]
    UnsupportedVersion {
        /// The engine's version.
        found: u32,
    },
    /// NPE: a configuration value is out of range.
    #[error("invalid NPE configuration: {what}")]
    InvalidConfig {
        /// What is wrong.
        what: &'static str,
    },
    /// NPE: the engine or the driver has fewer of something than the configuration asks for.
    #[error("{what}: {requested} requested, at most {max} available")]
    Capacity {
        /// Which resource.
        what: &'static str,
        /// How many were asked for.
        requested: u32,
        /// How many there are.
        max: u32,
    },
    /// NPE: a queue entry breaks a rule of docs/dma-engine.md §4.
    #[error("bad queue entry: {what}")]
    BadEntry {
        /// The rule broken.
        what: &'static str,
    },
    /// NPE: an inline message longer than 64 bytes.
    #[error("inline message of {len} bytes exceeds 64")]
    MessageTooLong {
        /// Its length.
        len: usize,
    },
    /// NPE back-pressure: the channel's transfer window is full. Poll completions and submit
    /// again; nothing was queued and nothing was lost.
    #[error("channel {channel} queue full ({open} transfers open)")]
    QueueFull {
        /// The channel.
        channel: u8,
        /// Transfers open on it.
        open: usize,
    },
    /// NPE: the channel index is not an open data channel.
    #[error("channel {channel} is not open")]
    NoSuchChannel {
        /// The channel.
        channel: u8,
    },
    /// NPE: the channel index is already open or reserved.
    #[error("channel {channel} is in use")]
    ChannelInUse {
        /// The channel.
        channel: u8,
    },
    /// NPE: no receive connection is open for that peer slot.
    #[error("peer slot {slot} is not open")]
    NoSuchPeer {
        /// The slot.
        slot: u8,
    },
    /// NPE: the peer slot already has a receive connection.
    #[error("peer slot {slot} is already open")]
    PeerInUse {
        /// The slot.
        slot: u8,
    },
    /// NPE: `CTRL.SOFT_RESET` did not clear itself.
    #[error("the engine did not finish its soft reset after {polls} reads of CTRL")]
    ResetStuck {
        /// Reads of CTRL made.
        polls: u32,
    },
    /// NPE: the loaded bitstream's manifest declares another spec version or register map
    /// than this driver implements (`npe::regmap::check_design`).
    #[error(
        "NPE design mismatch: engine version {engine_version}, manifest version {manifest_version} with register-map hash {manifest_hash:#010x}, driver hash {driver_hash:#010x}"
    )]
    DesignMismatch {
        /// `ID.VERSION` read from the engine.
        engine_version: u32,
        /// The version the manifest declares.
        manifest_version: u32,
        /// The register-map hash the manifest declares.
        manifest_hash: u32,
        /// The driver's `REGMAP_HASH`.
        driver_hash: u32,
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
            Self::Protocol(_) => 9,
            Self::NotAnNpe { .. } => 10,
            Self::UnsupportedVersion { .. } => 11,
            Self::InvalidConfig { .. } => 12,
            Self::Capacity { .. } => 13,
            Self::BadEntry { .. } => 14,
            Self::MessageTooLong { .. } => 15,
            Self::QueueFull { .. } => 16,
            Self::NoSuchChannel { .. } => 17,
            Self::ChannelInUse { .. } => 18,
            Self::NoSuchPeer { .. } => 19,
            Self::PeerInUse { .. } => 20,
            Self::ResetStuck { .. } => 21,
            Self::DesignMismatch { .. } => 22,
        }
    }

    /// Whether this is back-pressure (retry later) rather than a failure.
    pub const fn is_back_pressure(&self) -> bool {
        matches!(self, Self::QueueFull { .. })
    }

    /// Whether retransmitting the transfer may succeed: an AXI data error is what the master
    /// sees when the SMMU terminated one of its transactions.
    pub const fn is_retransmittable(&self) -> bool {
        matches!(self, Self::AxiRead { .. } | Self::AxiWrite { .. })
    }
}

/// Result with [`DmaError`].
pub type Result<T = ()> = core::result::Result<T, DmaError>;
