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
    /// The configuration data writes another device's IDCODE than the board's (revision
    /// bits \[31:28\] ignored).
    #[error(
        "bitstream built for device IDCODE {found:#010x}, the board's device is {expected:#010x} (revision bits 31:28 ignored)"
    )]
    IdcodeMismatch {
        /// The board's device IDCODE.
        expected: u32,
        /// The IDCODE the configuration data writes.
        found: u32,
    },
    /// No write to the configuration IDCODE register before the first frame data (FDRI)
    /// write, or before the end of the configuration data.
    #[error(
        "no IDCODE write before {} at configuration data offset {at}",
        if *fdri { "the first frame data (FDRI) write" } else { "the end" }
    )]
    NoIdcode {
        /// Offset in the configuration data of the FDRI packet header, or its length.
        at: usize,
        /// Whether the walk stopped at an FDRI write (else at the end).
        fdri: bool,
    },
    /// A word where a packet header belongs that is not one the walk can follow: neither a
    /// type 1 nor a type 2 header, the reserved opcode, a type 2 header with no type 1
    /// before it, or an IDCODE write of more than one word.
    #[error("word {word:#010x} at configuration data offset {at} is not a valid packet header")]
    BadPacket {
        /// Offset of the word in the configuration data.
        at: usize,
        /// The word.
        word: u32,
    },
    /// A packet's word count runs past the end of the configuration data.
    #[error(
        "packet at configuration data offset {at} writes {words} words, past the end of the {len} bytes"
    )]
    PacketPastEnd {
        /// Offset of the packet header in the configuration data.
        at: usize,
        /// Its word count.
        words: u32,
        /// The configuration data's length.
        len: usize,
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
    /// Debian's `dtc` failed on an overlay or warned about it (warnings are errors).
    #[cfg(any(test, feature = "std"))]
    #[error("dtc on {file}: {message}")]
    Dtc {
        /// The source or blob dtc was given.
        file: std::string::String,
        /// dtc's diagnostics (stderr), or its exit status when it printed nothing.
        message: std::string::String,
    },
}

impl BitstreamError {
    /// A stable number per variant, for logs and exit codes; never reused, new variants
    /// take the next free number.
    pub const fn code(&self) -> u16 {
        match self {
            Self::Truncated { .. } => 1,
            Self::BadPreamble => 2,
            Self::UnexpectedKey { .. } => 3,
            Self::BadText { .. } => 4,
            Self::LengthMismatch { .. } => 5,
            Self::UnalignedLength { .. } => 6,
            Self::NoSyncWord { .. } => 7,
            Self::BadPacketAfterSync { .. } => 8,
            Self::WrongPart { .. } => 9,
            Self::BufferSize { .. } => 10,
            #[cfg(any(test, feature = "std"))]
            Self::ManifestSyntax { .. } => 11,
            #[cfg(any(test, feature = "std"))]
            Self::ManifestMismatch { .. } => 12,
            Self::Design(_) => 13,
            #[cfg(any(test, feature = "std"))]
            Self::Io { .. } => 14,
            #[cfg(any(test, feature = "std"))]
            Self::NoFpgaManager { .. } => 15,
            #[cfg(any(test, feature = "std"))]
            Self::UnknownState(_) => 16,
            #[cfg(any(test, feature = "std"))]
            Self::NoLoadInterface { .. } => 17,
            #[cfg(any(test, feature = "std"))]
            Self::LoadFailed { .. } => 18,
            #[cfg(any(test, feature = "std"))]
            Self::Dtc { .. } => 19,
            Self::IdcodeMismatch { .. } => 20,
            Self::NoIdcode { .. } => 21,
            Self::BadPacket { .. } => 22,
            Self::PacketPastEnd { .. } => 23,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_keeps_its_stable_code() {
        let s = || std::string::String::from("x");
        let all = [
            BitstreamError::Truncated {
                at: 0,
                needed: 1,
                len: 0,
            },
            BitstreamError::BadPreamble,
            BitstreamError::UnexpectedKey {
                at: 0,
                found: 0,
                expected: b'a',
            },
            BitstreamError::BadText { key: b'a' },
            BitstreamError::LengthMismatch {
                declared: 0,
                actual: 1,
            },
            BitstreamError::UnalignedLength { len: 1 },
            BitstreamError::NoSyncWord { searched: 0 },
            BitstreamError::BadPacketAfterSync { word: 0 },
            BitstreamError::WrongPart {
                found: PartName::new(),
                expected: PartName::new(),
            },
            BitstreamError::BufferSize {
                needed: 1,
                given: 0,
            },
            BitstreamError::ManifestSyntax { line: 1, what: s() },
            BitstreamError::ManifestMismatch { what: s() },
            BitstreamError::Design(dma_engine::DmaError::InvalidRegisterAccess),
            BitstreamError::Io {
                what: s(),
                kind: std::io::ErrorKind::NotFound,
            },
            BitstreamError::NoFpgaManager { root: s() },
            BitstreamError::UnknownState(s()),
            BitstreamError::NoLoadInterface {
                manager: s(),
                configfs: s(),
            },
            BitstreamError::LoadFailed { state: s() },
            BitstreamError::Dtc {
                file: s(),
                message: s(),
            },
            BitstreamError::IdcodeMismatch {
                expected: 1,
                found: 0,
            },
            BitstreamError::NoIdcode { at: 0, fdri: true },
            BitstreamError::BadPacket { at: 0, word: 0 },
            BitstreamError::PacketPastEnd {
                at: 0,
                words: 1,
                len: 0,
            },
        ];
        // Listed in code order: this pins every variant to its stable code (a renumbering
        // fails here), and so the codes are distinct and dense.
        let codes: std::vec::Vec<u16> = all.iter().map(BitstreamError::code).collect();
        assert_eq!(codes, (1..=all.len() as u16).collect::<std::vec::Vec<_>>());
    }
}
