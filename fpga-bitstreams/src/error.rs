//! The crate's one error type.

/// A part name as read from a header, cut to 48 bytes.
pub type PartName = heapless::String<48>;

/// Everything that can be wrong with a bitstream, a manifest or a load.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BitstreamError {
    /// The file ends inside the header or before the declared bitstream length.
    #[error("truncated: {needed} bytes needed at offset {at}, the file has {len}")]
    Truncated {
        /// Where the missing field starts.
        at: usize,
        /// Bytes the field needs.
        needed: usize,
        /// The file's length.
        len: usize,
    },
    /// The first 13 bytes are not the .bit preamble (length 9, 0x0FF0 x4, 0x00, length 1).
    #[error("not a .bit file: the 13-byte preamble differs")]
    BadPreamble,
    /// A field key other than the expected one.
    #[error("field key {found:#04x} at offset {at}, expected '{}'", *expected as char)]
    UnexpectedKey {
        /// Offset of the key byte.
        at: usize,
        /// The byte found.
        found: u8,
        /// The key expected there.
        expected: u8,
    },
    /// A text field is empty, not NUL-terminated, or not ASCII.
    #[error("field '{}' is not NUL-terminated ASCII text", *key as char)]
    BadText {
        /// The field's key.
        key: u8,
    },
    /// Bytes follow the declared bitstream.
    #[error("the header declares {declared} bitstream bytes but {actual} follow")]
    LengthMismatch {
        /// Length from field 'e'.
        declared: u32,
        /// Bytes after field 'e'.
        actual: usize,
    },
    /// The bitstream is not a whole number of 32-bit words.
    #[error("bitstream length {len} is not a multiple of 4")]
    UnalignedLength {
        /// Its length.
        len: usize,
    },
    /// No word-aligned sync word 0xAA995566 after only padding and bus-width words.
    #[error("no sync word 0xAA995566 in the bitstream's first {searched} bytes")]
    NoSyncWord {
        /// Bytes searched.
        searched: usize,
    },
    /// The word after the sync word is not a type 1 configuration packet header.
    #[error("word {word:#010x} after the sync word is not a type 1 packet header")]
    BadPacketAfterSync {
        /// The word.
        word: u32,
    },
    /// The bitstream was built for another part than the board's.
    #[error("bitstream built for part {found}, the board needs {expected}")]
    WrongPart {
        /// The header's part.
        found: PartName,
        /// The board's part.
        expected: PartName,
    },
    /// An output buffer of the wrong size.
    #[error("buffer of {given} bytes, {needed} needed")]
    BufferSize {
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        given: usize,
    },
    /// A manifest line that does not parse.
    #[cfg(any(test, feature = "std"))]
    #[error("manifest line {line}: {what}")]
    ManifestSyntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: std::string::String,
    },
    /// A manifest that parses but does not fit the board, the driver or the files.
    #[cfg(any(test, feature = "std"))]
    #[error("manifest: {what}")]
    ManifestMismatch {
        /// What differs.
        what: std::string::String,
    },
    /// The driver refuses the design the manifest declares.
    #[error("design: {0}")]
    Design(#[from] dma_engine::DmaError),
    /// A file or sysfs/configfs operation failed.
    #[cfg(any(test, feature = "std"))]
    #[error("{what}: {kind}")]
    Io {
        /// What was being done, with the path.
        what: std::string::String,
        /// The error's kind.
        kind: std::io::ErrorKind,
    },
    /// No FPGA manager under the sysfs class directory.
    #[cfg(any(test, feature = "std"))]
    #[error("no FPGA manager under {root}")]
    NoFpgaManager {
        /// The class directory searched.
        root: std::string::String,
    },
    /// A state string Linux's fpga-mgr.c does not define.
    #[cfg(any(test, feature = "std"))]
    #[error("unknown FPGA manager state {0:?}")]
    UnknownState(std::string::String),
    /// The kernel has neither interface for loading a bitstream by name.
    #[cfg(any(test, feature = "std"))]
    #[error(
        "{manager} has no `firmware` attribute and there is no overlay directory {configfs}: neither Xilinx's sysfs loader nor configfs overlays are available"
    )]
    NoLoadInterface {
        /// The manager's sysfs directory.
        manager: std::string::String,
        /// The configfs overlay directory looked for.
        configfs: std::string::String,
    },
    /// The manager reports an error state after the load.
    #[cfg(any(test, feature = "std"))]
    #[error("the FPGA manager is in state {state:?} after the load")]
    LoadFailed {
        /// The state string.
        state: std::string::String,
    },
}

/// Result with [`BitstreamError`].
pub type Result<T = ()> = core::result::Result<T, BitstreamError>;

#[cfg(any(test, feature = "std"))]
impl BitstreamError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<std::string::String>, e: &std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            kind: e.kind(),
        }
    }
}
