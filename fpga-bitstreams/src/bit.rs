//! Xilinx `.bit` files.
//!
//! **The header.** Xilinx documents the configuration data (below) but not the `.bit` file
//! header Vivado puts in front of it. What this parser expects comes from how open-source
//! tools read it (their sources, read for the format and not copied): OpenOCD
//! (`src/pld/xilinx_bit.c`: a 13-byte unknown header, then fields 'a' to 'e'), Xilinx's own
//! PYNQ (`pynq/pl.py`, which reads the same fields from Vivado bitstreams) and the FPGA FAQ's
//! "Tell me about bit files". The layout:
//!
//! | bytes | content |
//! |---|---|
//! | 2 | 0x0009, big-endian: the length of the next field |
//! | 9 | 0F F0 0F F0 0F F0 0F F0 00 |
//! | 2 | 0x0001 |
//! | 1 + 2 + n | 'a', n big-endian, the design name (Vivado adds `;UserID=...;Version=...`), NUL-terminated |
//! | 1 + 2 + n | 'b', n, the part, NUL-terminated |
//! | 1 + 2 + n | 'c', n, the date, NUL-terminated |
//! | 1 + 2 + n | 'd', n, the time, NUL-terminated |
//! | 1 + 4 + n | 'e', n as a 32-bit big-endian length, the configuration data |
//!
//! **The configuration data** (Xilinx UG570, *UltraScale Architecture Configuration*,
//! chapter 9 "Configuration Details"): 32-bit big-endian words; padding 0xFFFFFFFF (dummy
//! words) and the bus-width detection pattern 0x000000BB, 0x11220044 ("Bus Width Auto
//! Detection"); then the sync word 0xAA995566 ("Configuration Sequence", "Synchronization"),
//! before which the configuration logic ignores everything; then configuration packets
//! ("Configuration Packets"), the first of them a type 1 packet (header bits [31:29] = 001,
//! "Type 1 Packet Header Format"; a NOOP is the type 1 header 0x20000000), which
//! [`crate::packets`] walks to the device's IDCODE; [`BitFile::check_part`] compares it with
//! the board's.

use boards::zynqmp::pl::Part;

use crate::error::PartName;
use crate::packets::find_idcode;
use crate::{BitstreamError, Result};

/// The first 13 bytes of every `.bit` file.
pub const PREAMBLE: [u8; 13] = [
    0x00, 0x09, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x0f, 0xf0, 0x00, 0x00, 0x01,
];
/// The sync word (UG570, "Configuration Sequence").
pub const SYNC_WORD: u32 = 0xaa99_5566;
/// A dummy (padding) word.
pub const DUMMY_WORD: u32 = 0xffff_ffff;
/// The bus-width detection pattern's two words (UG570, "Bus Width Auto Detection").
pub const BUS_WIDTH_WORDS: [u32; 2] = [0x0000_00bb, 0x1122_0044];
/// The IDCODE's version (revision) field, ignored when IDCODEs are compared
/// (`boards::zynqmp::pl::Part::idcode`).
pub const IDCODE_REVISION_MASK: u32 = 0xf000_0000;

/// A parsed `.bit` file, borrowing from its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BitFile<'a> {
    /// Field 'a' without its NUL.
    pub design: &'a str,
    /// Field 'b': the part.
    pub part: &'a str,
    /// Field 'c': the date.
    pub date: &'a str,
    /// Field 'd': the time.
    pub time: &'a str,
    /// Field 'e': the configuration data, exactly as long as declared.
    pub data: &'a [u8],
    /// Offset of the sync word in `data`.
    pub sync_offset: usize,
    /// The IDCODE the configuration data writes ([`find_idcode`]).
    pub idcode: u32,
    /// Offset of that IDCODE word in `data`.
    pub idcode_offset: usize,
}

impl<'a> BitFile<'a> {
    /// The design name without Vivado's `;UserID=...;Version=...` suffixes.
    pub fn design_name(&self) -> &'a str {
        self.design.split(';').next().unwrap_or(self.design)
    }

    /// Checks that the bitstream is for the board's `part`: the header names it
    /// ([`part_matches`]), and the configuration data writes its device's IDCODE, the
    /// revision bits \[31:28\] aside (what tells a bitstream built for another device,
    /// whatever its header says).
    pub fn check_part(&self, part: &Part) -> Result<()> {
        if !part_matches(self.part, part) {
            let mut expected = [0u8; 48];
            let n = part.write_name(&mut expected).unwrap_or(0);
            return Err(BitstreamError::WrongPart {
                found: cut(self.part),
                expected: cut(core::str::from_utf8(&expected[..n]).unwrap_or("")),
            });
        }
        if (self.idcode ^ part.idcode) & !IDCODE_REVISION_MASK != 0 {
            return Err(BitstreamError::IdcodeMismatch {
                expected: part.idcode,
                found: self.idcode,
            });
        }
        Ok(())
    }
}

fn cut(s: &str) -> PartName {
    let mut out = PartName::new();
    for c in s.chars() {
        if out.push(c).is_err() {
            break;
        }
    }
    out
}

/// Whether a header's part names `part`. Vivado writes the part without separators for
/// 7-series devices (`7z020clg484`) and with them for others **\[I\]**, so both are compared
/// case-insensitively with an optional `xc` prefix and without `-`: the header must name the
/// device and the package, and if it names more, that must be the speed grade and
/// temperature.
pub fn part_matches(header: &str, part: &Part) -> bool {
    let norm = |s: &'_ str| {
        let mut out = heapless::String::<64>::new();
        let s = s.trim();
        let s = s
            .strip_prefix("xc")
            .or_else(|| s.strip_prefix("XC"))
            .unwrap_or(s);
        for c in s.chars().filter(|c| *c != '-') {
            if out.push(c.to_ascii_lowercase()).is_err() {
                return None;
            }
        }
        Some(out)
    };
    let (Some(h), Some(dev), Some(pkg), Some(grade)) = (
        norm(header),
        norm(part.device),
        norm(part.package),
        norm(part.grade),
    ) else {
        return false;
    };
    let Some(rest) = h.strip_prefix(dev.as_str()) else {
        return false;
    };
    let Some(rest) = rest.strip_prefix(pkg.as_str()) else {
        return false;
    };
    rest.is_empty() || rest == grade.as_str()
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            None => Err(BitstreamError::Truncated {
                at: self.at,
                needed: n,
                len: self.bytes.len(),
            }),
        }
    }

    fn key(&mut self, expected: u8) -> Result<()> {
        let at = self.at;
        let found = self.take(1)?[0];
        if found == expected {
            Ok(())
        } else {
            Err(BitstreamError::UnexpectedKey {
                at,
                found,
                expected,
            })
        }
    }

    fn text(&mut self, key: u8) -> Result<&'a str> {
        self.key(key)?;
        let len = self.take(2)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let field = self.take(len)?;
        let Some((&0, text)) = field.split_last() else {
            return Err(BitstreamError::BadText { key });
        };
        if text.is_empty() || !text.iter().all(|b| b.is_ascii() && *b != 0) {
            return Err(BitstreamError::BadText { key });
        }
        core::str::from_utf8(text).map_err(|_| BitstreamError::BadText { key })
    }
}

/// Parses and validates a `.bit` file.
pub fn parse(bytes: &[u8]) -> Result<BitFile<'_>> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(PREAMBLE.len())? != PREAMBLE {
        return Err(BitstreamError::BadPreamble);
    }
    let design = r.text(b'a')?;
    let part = r.text(b'b')?;
    let date = r.text(b'c')?;
    let time = r.text(b'd')?;
    r.key(b'e')?;
    let len = r.take(4)?;
    let declared = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
    let rest = bytes.len() - r.at;
    if (declared as usize) > rest {
        return Err(BitstreamError::Truncated {
            at: r.at,
            needed: declared as usize,
            len: bytes.len(),
        });
    }
    if (declared as usize) < rest {
        return Err(BitstreamError::LengthMismatch {
            declared,
            actual: rest,
        });
    }
    let data = r.take(declared as usize)?;
    let sync_offset = find_sync(data)?;
    let (idcode, idcode_offset) = find_idcode(data, sync_offset)?;
    Ok(BitFile {
        design,
        part,
        date,
        time,
        data,
        sync_offset,
        idcode,
        idcode_offset,
    })
}

/// Padding words a bitstream may have before its sync word, at most (ours: Vivado writes a
/// few dozen; a limit keeps a corrupt file from being searched to its end).
pub const MAX_WORDS_BEFORE_SYNC: usize = 1024;

/// Finds the sync word: word-aligned, preceded only by dummy words and the bus-width
/// pattern, and followed by a type 1 packet header.
pub fn find_sync(data: &[u8]) -> Result<usize> {
    if !data.len().is_multiple_of(4) {
        return Err(BitstreamError::UnalignedLength { len: data.len() });
    }
    let words = data
        .chunks_exact(4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    for (i, word) in words.enumerate().take(MAX_WORDS_BEFORE_SYNC) {
        match word {
            SYNC_WORD => {
                let next = data.get(4 * i + 4..4 * i + 8);
                let Some(next) = next else {
                    return Err(BitstreamError::Truncated {
                        at: 4 * i + 4,
                        needed: 4,
                        len: data.len(),
                    });
                };
                let next = u32::from_be_bytes([next[0], next[1], next[2], next[3]]);
                if next >> 29 != 0b001 {
                    return Err(BitstreamError::BadPacketAfterSync { word: next });
                }
                return Ok(4 * i);
            }
            DUMMY_WORD => {}
            w if BUS_WIDTH_WORDS.contains(&w) => {}
            _ => break,
        }
    }
    Err(BitstreamError::NoSyncWord {
        searched: data.len().min(4 * MAX_WORDS_BEFORE_SYNC),
    })
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::pl::XCZU9EG_ZCU102;
    use proptest::prelude::*;

    use super::*;
    use crate::packets::word_at;
    use crate::testbit::{TestBitstream, write_bit};

    /// Another device's IDCODE: the XCZU7EV's, as Xilinx's `JTAG_SIME2` simulation model
    /// gives it.
    const XCZU7EV_IDCODE: u32 = 0x0473_0093;

    fn sample() -> Vec<u8> {
        TestBitstream::for_part(&XCZU9EG_ZCU102, 256).bytes()
    }

    #[test]
    fn a_valid_file_parses_with_every_field() {
        let bytes = sample();
        let bit = parse(&bytes).unwrap();
        assert_eq!(bit.design_name(), "nprdma_test");
        assert!(bit.design.contains(";UserID="));
        assert_eq!(bit.part, "xczu9eg-ffvb1156-2-e");
        assert_eq!((bit.date, bit.time), ("2026/12/07", "16:30:00"));
        assert_eq!(
            &bit.data[bit.sync_offset..bit.sync_offset + 4],
            &SYNC_WORD.to_be_bytes()
        );
        assert_eq!(bit.idcode, 0x0473_8093);
        assert_eq!(bit.idcode_offset, bit.sync_offset + 12);
        bit.check_part(&XCZU9EG_ZCU102).unwrap();
    }

    #[test]
    fn parts_match_in_both_spellings_and_nothing_else() {
        let p = &XCZU9EG_ZCU102;
        for ok in [
            "xczu9eg-ffvb1156-2-e",
            "zu9egffvb1156",
            "XCZU9EG-FFVB1156",
            "zu9eg-ffvb1156-2-e",
        ] {
            assert!(part_matches(ok, p), "{ok}");
        }
        for bad in [
            "xczu7ev-ffvc1156-2-e",
            "xczu9eg-ffvc900-2-e",
            "xczu9eg",
            "xczu9eg-ffvb1156-1-e",
            "xczu9eg-ffvb1156-2-i",
            "",
        ] {
            assert!(!part_matches(bad, p), "{bad}");
        }
        let bytes = TestBitstream::new("xczu7ev-ffvc1156-2-e", XCZU7EV_IDCODE, 64).bytes();
        let err = parse(&bytes).unwrap().check_part(p).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bitstream built for part xczu7ev-ffvc1156-2-e, the board needs xczu9eg-ffvb1156-2-e"
        );
    }

    #[test]
    fn every_malformation_has_its_error() {
        let good = sample();
        // Truncated anywhere: a typed error, the right kind in the header and the data.
        for cut in [0, 5, 13, 20, 60, good.len() - 1] {
            let e = parse(&good[..cut]).unwrap_err();
            assert!(
                matches!(e, BitstreamError::Truncated { .. }),
                "{cut}: {e:?}"
            );
        }
        let mut bad = good.clone();
        bad[3] ^= 1;
        assert_eq!(parse(&bad), Err(BitstreamError::BadPreamble));
        let mut bad = good.clone();
        bad[13] = b'x';
        assert_eq!(
            parse(&bad),
            Err(BitstreamError::UnexpectedKey {
                at: 13,
                found: b'x',
                expected: b'a'
            })
        );
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(matches!(
            parse(&trailing),
            Err(BitstreamError::LengthMismatch { .. })
        ));
        // Sync word missing, unaligned, or followed by garbage.
        let t = TestBitstream::for_part(&XCZU9EG_ZCU102, 64);
        let mut data = t.data.clone();
        let at = data
            .windows(4)
            .position(|w| w == SYNC_WORD.to_be_bytes())
            .unwrap();
        data[at] = 0xab;
        assert!(matches!(
            parse(&write_bit(&t.fields(), &data)),
            Err(BitstreamError::NoSyncWord { .. })
        ));
        let mut data = t.data.clone();
        data[at + 4] = 0x40;
        assert_eq!(
            parse(&write_bit(&t.fields(), &data)),
            Err(BitstreamError::BadPacketAfterSync { word: 0x4000_0000 })
        );
        let mut data = t.data.clone();
        data.push(0);
        assert_eq!(
            parse(&write_bit(&t.fields(), &data)),
            Err(BitstreamError::UnalignedLength { len: data.len() })
        );
        let mut fields = t.fields();
        fields[1] = "";
        assert_eq!(
            parse(&write_bit(&fields, &t.data)),
            Err(BitstreamError::BadText { key: b'b' })
        );
    }

    #[test]
    fn a_wrong_idcode_is_refused_and_the_revision_is_ignored() {
        let name = "xczu9eg-ffvb1156-2-e";
        let check = |idcode: u32| {
            let bytes = TestBitstream::new(name, idcode, 8).bytes();
            parse(&bytes).unwrap().check_part(&XCZU9EG_ZCU102)
        };
        // The header names the board's part, the data is for another device.
        let err = check(XCZU7EV_IDCODE).unwrap_err();
        assert_eq!(
            err,
            BitstreamError::IdcodeMismatch {
                expected: 0x0473_8093,
                found: XCZU7EV_IDCODE
            }
        );
        assert_eq!(err.code(), 20);
        assert_eq!(
            err.to_string(),
            "bitstream built for device IDCODE 0x04730093, the board's device is 0x04738093 (revision bits 31:28 ignored)"
        );
        for rev in 0..16u32 {
            assert_eq!(check(0x0473_8093 | rev << 28), Ok(()), "revision {rev}");
        }
        for bit in 0..28 {
            assert!(
                matches!(
                    check(0x0473_8093 ^ 1 << bit),
                    Err(BitstreamError::IdcodeMismatch { .. })
                ),
                "bit {bit}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Random bytes never panic the parser.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&bytes);
        }

        /// Random headers with random bytes after a valid preamble never panic either.
        #[test]
        fn random_after_the_preamble_never_panics(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = PREAMBLE.to_vec();
            bytes.push(b'a');
            bytes.extend(tail);
            let _ = parse(&bytes);
        }

        /// A valid file with bytes flipped, cut or inserted parses or fails with a typed
        /// error; if it parses, its fields lie inside the file.
        #[test]
        fn mutated_files_never_panic(
            len in 1usize..64,
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in proptest::option::of(any::<prop::sample::Index>()),
            insert in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            let mut bytes = TestBitstream::for_part(&XCZU9EG_ZCU102, len).bytes();
            for (i, b) in flips {
                let i = i.index(bytes.len());
                bytes[i] ^= b;
            }
            if let Some((i, b)) = insert {
                let i = i.index(bytes.len());
                bytes.insert(i, b);
            }
            if let Some(c) = cut {
                let c = c.index(bytes.len());
                bytes.truncate(c);
            }
            if let Ok(bit) = parse(&bytes) {
                prop_assert!(bit.sync_offset + 8 <= bit.data.len());
                prop_assert_eq!(bit.data.len() % 4, 0);
                prop_assert!(bit.idcode_offset > bit.sync_offset + 4);
                prop_assert!(bit.idcode_offset + 4 <= bit.data.len());
                prop_assert_eq!(word_at(bit.data, bit.idcode_offset), Some(bit.idcode));
                let _ = bit.check_part(&XCZU9EG_ZCU102);
            }
        }

        /// Valid files round-trip: parse, write back the same fields and data, same bytes.
        #[test]
        fn valid_files_round_trip(
            design in "[a-z_]{1,24}",
            part in "[a-z0-9-]{1,24}",
            words in 0usize..200,
            pad in 0usize..20,
            idcode in any::<u32>(),
        ) {
            let t = TestBitstream {
                design: format!("{design};UserID=0XFFFFFFFF"),
                part,
                date: "2026/01/01".into(),
                time: "00:00:01".into(),
                data: crate::testbit::config_data(pad, Some(idcode), words),
            };
            let bytes = t.bytes();
            let bit = parse(&bytes).unwrap();
            let again = write_bit(&[bit.design, bit.part, bit.date, bit.time], bit.data);
            prop_assert_eq!(bit.sync_offset, 4 * (pad + 4));
            prop_assert_eq!(bit.idcode, idcode);
            prop_assert_eq!(&again, &bytes);
        }
    }
}
