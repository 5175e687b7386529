//! The crate's one error type.

/// Errors of the protocol crate.
///
/// Codes are stable ([`ProtocolError::code`]) because they cross the wire boundary (decoders
/// report them to peers' logs) and the C ABI of the server-path library. Ranges: 1–19 wire
/// encoding, 20–29 page-state table, 30–49 transfer state machines. 0 is never used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ProtocolError {
    /// The buffer ends before the message does.
    #[error("message truncated: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes the message needs (the header, or the length the header declares).
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// The magic number is not ours: a foreign or misaligned message.
    #[error("bad magic {found:#010x}")]
    BadMagic {
        /// The magic that was found.
        found: u32,
    },
    /// The header's version is one this implementation does not speak.
    #[error("unsupported protocol version {found}")]
    UnsupportedVersion {
        /// The version in the header.
        found: u8,
    },
    /// The declared length is impossible, or not the length of the declared message type.
    #[error("bad message length {declared} (expected {expected})")]
    BadLength {
        /// Length in the header.
        declared: usize,
        /// Length the type requires (or the minimum length).
        expected: usize,
    },
    /// The declared length exceeds the largest message a peer may send.
    #[error("message of {declared} bytes exceeds the maximum of {max}")]
    Oversized {
        /// Length in the header.
        declared: usize,
        /// The largest allowed length.
        max: usize,
    },
    /// The CRC-32C trailer does not match the message.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum {
        /// The CRC in the trailer.
        stored: u32,
        /// The CRC of the bytes received.
        computed: u32,
    },
    /// The message type code is not defined in this version.
    #[error("unknown message type {code}")]
    UnknownType {
        /// The type code.
        code: u8,
    },
    /// A field holds a value its type does not allow (enum code, reserved bits, zero count...).
    #[error("invalid field at byte offset {offset}")]
    BadField {
        /// Offset of the field from the start of the message.
        offset: usize,
    },
    /// The output buffer is too small for the encoded message.
    #[error("output buffer too small: {needed} bytes needed, {got} available")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The message belongs to another session (connection incarnation).
    #[error("message for session {found:#x}, expected {expected:#x}")]
    WrongSession {
        /// The session this endpoint runs.
        expected: u32,
        /// The session in the message.
        found: u32,
    },
    /// The two peers' version ranges do not overlap.
    #[error(
        "no common protocol version: ours {local_min}..={local_max}, peer's {peer_min}..={peer_max}"
    )]
    NoCommonVersion {
        /// Our lowest version.
        local_min: u8,
        /// Our highest version.
        local_max: u8,
        /// The peer's lowest version.
        peer_min: u8,
        /// The peer's highest version.
        peer_max: u8,
    },
    /// The peers disagree on a parameter that must be equal (e.g. the block size).
    #[error("peer parameter mismatch: {field}")]
    ParameterMismatch {
        /// Which parameter.
        field: &'static str,
    },
    /// An address, length or frame is not aligned as required.
    #[error("{value:#x} is not aligned to {align:#x}")]
    Misaligned {
        /// The offending value.
        value: u64,
        /// The required alignment.
        align: u64,
    },
    /// An address range lies (partly) outside the region a table covers.
    #[error("range {addr:#x}+{len:#x} is outside the region")]
    OutOfRegion {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// The storage given to a page-state table has fewer entries than the region has pages.
    #[error("page-state storage too small: {needed} entries needed, {got} given")]
    StorageTooSmall {
        /// Entries needed.
        needed: usize,
        /// Entries given.
        got: usize,
    },
    /// A region of zero length was given.
    #[error("empty region")]
    EmptyRegion,
    /// Address arithmetic overflowed 64 bits.
    #[error("address arithmetic overflowed")]
    AddressOverflow,
    /// No room for another open transfer (back-pressure: retry after completions drain).
    #[error("transfer window full ({open} open)")]
    WindowFull {
        /// Transfers currently open.
        open: usize,
    },
    /// A local call named a transfer this endpoint never had.
    #[error("unknown transfer {tid}")]
    UnknownTransfer {
        /// The transfer id.
        tid: u32,
    },
    /// A block index (range) lies outside its transfer.
    #[error("block {block} out of range for transfer {tid} of {count} blocks")]
    BlockOutOfRange {
        /// The transfer id.
        tid: u32,
        /// The first offending block index.
        block: u64,
        /// Blocks in the transfer.
        count: u32,
    },
    /// A transfer has more blocks than this endpoint (or the peer) supports.
    #[error("transfer of {blocks} blocks exceeds the maximum of {max}")]
    TooManyBlocks {
        /// Blocks requested.
        blocks: u64,
        /// The maximum.
        max: u64,
    },
    /// A transfer of zero bytes was submitted.
    #[error("empty transfer")]
    EmptyTransfer,
    /// A configuration value is out of range.
    #[error("invalid configuration: {field}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
    },
    /// An event does not fit the block's state (e.g. a source fault on a block never issued).
    #[error("event does not fit the state of block {block} of transfer {tid}")]
    InvalidBlockState {
        /// The transfer id.
        tid: u32,
        /// The block index.
        block: u32,
    },
    /// The peer described one transfer in two incompatible ways (e.g. two block counts).
    #[error("inconsistent description of transfer {tid}")]
    InconsistentTransfer {
        /// The transfer id.
        tid: u32,
    },
    /// A block's payload length does not match the block size.
    #[error("block {block} of transfer {tid} has bad length {len}")]
    BadBlockLength {
        /// The transfer id.
        tid: u32,
        /// The block index.
        block: u32,
        /// The length carried.
        len: u32,
    },
}

impl ProtocolError {
    /// The configuration checks the sender and the receiver share: room for at least one
    /// transfer and one block, and blocks of at least one byte.
    pub(crate) const fn check_shape(
        transfers: usize,
        blocks: usize,
        block_size: u32,
    ) -> Result<()> {
        if transfers == 0 {
            Err(Self::InvalidConfig {
                field: "transfer capacity",
            })
        } else if blocks == 0 {
            Err(Self::InvalidConfig {
                field: "block capacity",
            })
        } else if block_size == 0 {
            Err(Self::InvalidConfig {
                field: "block_size",
            })
        } else {
            Ok(())
        }
    }

    /// A stable numeric code for logs, the wire and ABI boundaries (0 is never used).
    pub const fn code(&self) -> u32 {
        match self {
            Self::Truncated { .. } => 1,
            Self::BadMagic { .. } => 2,
            Self::UnsupportedVersion { .. } => 3,
            Self::BadLength { .. } => 4,
            Self::Oversized { .. } => 5,
            Self::BadChecksum { .. } => 6,
            Self::UnknownType { .. } => 7,
            Self::BadField { .. } => 8,
            Self::BufferTooSmall { .. } => 9,
            Self::WrongSession { .. } => 10,
            Self::NoCommonVersion { .. } => 11,
            Self::ParameterMismatch { .. } => 12,
            Self::Misaligned { .. } => 20,
            Self::OutOfRegion { .. } => 21,
            Self::StorageTooSmall { .. } => 22,
            Self::EmptyRegion => 23,
            Self::AddressOverflow => 24,
            Self::WindowFull { .. } => 30,
            Self::UnknownTransfer { .. } => 31,
            Self::BlockOutOfRange { .. } => 32,
            Self::TooManyBlocks { .. } => 33,
            Self::EmptyTransfer => 34,
            Self::InvalidConfig { .. } => 35,
            Self::InvalidBlockState { .. } => 36,
            Self::InconsistentTransfer { .. } => 37,
            Self::BadBlockLength { .. } => 38,
        }
    }
}

/// Result with [`ProtocolError`].
pub type Result<T = ()> = core::result::Result<T, ProtocolError>;
