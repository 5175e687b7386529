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
//! "Type 1 Packet Header Format"; a NOOP is the type 1 header 0x20000000).
//!
//! **The device.** The parser walks the packets after the sync word to the write of the
//! configuration IDCODE register ([`find_idcode`]), which UG570 requires before any write
//! to the frame data register FDRI ("IDCODE Register (01100)") and which the device checks
//! against its own IDCODE ("Device ID Check (Step 5)"); [`BitFile::check_part`] compares it
//! with the board's. The sample KU040 bitstream of UG570's "Bitstream Composition" shows it:
//! `30018001` (type 1, write, register 0x0C, one word) and the IDCODE.

use boards::zynqmp::pl::Part;

use crate::error::PartName;
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
/// A type 1 NOOP packet (UG570, "Configuration Packets").
pub const NOOP: u32 = 0x2000_0000;
/// The configuration IDCODE register's address (UG570, "Configuration Registers",
/// "IDCODE Register (01100)").
pub const REG_IDCODE: u32 = 0x0c;
/// The frame data input register's address (UG570, "Configuration Registers", FDRI 00010).
pub const REG_FDRI: u32 = 0x02;
/// The IDCODE's version (revision) field, ignored when IDCODEs are compared
/// (`boards::zynqmp::pl::Part::idcode`).
pub const IDCODE_REVISION_MASK: u32 = 0xf000_0000;
/// The write opcode of a packet header, bits \[28:27\] (UG570, "Type 1 Packet Header
/// Format": 00 NOOP, 01 read, 10 write, 11 reserved).
pub const OP_WRITE: u32 = 0b10;

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

fn word_at(data: &[u8], at: usize) -> Option<u32> {
    let w = data.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

/// Walks the configuration packets after the sync word at `sync_offset` to the write of
/// the IDCODE register; returns the IDCODE and its offset in `data`.
///
/// Packet headers (UG570, "Configuration Packets"): bits \[31:29\] the type, \[28:27\]
/// the opcode. Type 1 ("Type 1 Packet Header Format"): register address \[26:13\], word
/// count \[10:0\]. Type 2 ("Type 2 Packet Header Format"): word count \[26:0\], for the
/// register of the type 1 packet before it. A write's data words follow its header; NOOP
/// and read headers have none in the stream (a read's words come out of the device). The
/// walk ends at the IDCODE write (one word), at the first write to FDRI
/// ([`BitstreamError::NoIdcode`]: UG570 requires the IDCODE first), or at the end of the
/// data; a header it cannot follow is [`BitstreamError::BadPacket`], a write running past
/// the end [`BitstreamError::PacketPastEnd`]. Each step moves at least one word on, so the
/// walk ends for every input.
pub fn find_idcode(data: &[u8], sync_offset: usize) -> Result<(u32, usize)> {
    let mut at = sync_offset.saturating_add(4);
    let mut type1_reg = None;
    while let Some(header) = word_at(data, at) {
        let opcode = (header >> 27) & 0b11;
        let (reg, words) = match (header >> 29, type1_reg) {
            (0b001, _) => {
                let reg = (header >> 13) & 0x3fff;
                type1_reg = Some(reg);
                (reg, header & 0x7ff)
            }
            (0b010, Some(reg)) => (reg, header & 0x07ff_ffff),
            _ => return Err(BitstreamError::BadPacket { at, word: header }),
        };
        let payload = at + 4;
        match opcode {
            OP_WRITE => {
                if reg == REG_FDRI {
                    return Err(BitstreamError::NoIdcode { at, fdri: true });
                }
                // At most 2^27 - 1 words: no overflow in 4 * words on 32 or 64 bits.
                let end = payload.checked_add(4 * words as usize);
                let Some(end) = end.filter(|&e| e <= data.len()) else {
                    return Err(BitstreamError::PacketPastEnd {
                        at,
                        words,
                        len: data.len(),
                    });
                };
                if reg == REG_IDCODE && words > 1 {
                    return Err(BitstreamError::BadPacket { at, word: header });
                }
                if reg == REG_IDCODE
                    && words == 1
                    && let Some(idcode) = word_at(data, payload)
                {
                    return Ok((idcode, payload));
                }
                at = end;
            }
            0b11 => return Err(BitstreamError::BadPacket { at, word: header }),
            _ => at = payload,
        }
    }
    Err(BitstreamError::NoIdcode {
        at: data.len(),
        fdri: false,
    })
}

#[cfg(test)]
mod tests {
    use boards::zynqmp::pl::XCZU9EG_ZCU102;
    use proptest::prelude::*;

    use super::*;
    use crate::testbit::{TYPE2_WRITE, TestBitstream, WRITE_FDRI, WRITE_IDCODE, write_bit};

    /// Another device's IDCODE: the XCZU7EV's, as Xilinx's `JTAG_SIME2` simulation model
    /// gives it.
    const XCZU7EV_IDCODE: u32 = 0x0473_0093;

    fn sample() -> Vec<u8> {
        TestBitstream::for_part(&XCZU9EG_ZCU102, 256).bytes()
    }

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// A file for the ZCU102's part whose configuration data is the padding, the sync word,
    /// a NOOP and then `packets`.
    fn with_packets(packets: &[u32]) -> Vec<u8> {
        let mut data = crate::testbit::config_data(0, None, 0);
        data.truncate(data.len() - 12); // the NOOP and the empty FDRI write
        data.extend(words(packets));
        let t = TestBitstream::for_part(&XCZU9EG_ZCU102, 0);
        write_bit(&t.fields(), &data)
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
    fn the_idcode_write_is_found_among_other_packets() {
        // UG570, "Bitstream Composition": the sample KU040 bitstream's packets from the sync
        // word to its IDCODE write (TIMER, WBSTAR, CMD NULL, CMD RCRC, FAR, an unused
        // register, COR0, COR1), then frame data.
        let ku040 = [
            NOOP,
            0x3002_2001,
            0,
            0x3002_0001,
            0,
            0x3000_8001,
            0,
            NOOP,
            0x3000_8001,
            7,
            NOOP,
            NOOP,
            0x3000_2001,
            0,
            0x3002_6001,
            0,
            0x3001_2001,
            0x0200_3fe5,
            0x3001_c001,
            0,
            WRITE_IDCODE,
            0x0382_2093,
            NOOP,
            WRITE_FDRI,
            TYPE2_WRITE | 2,
            1,
            2,
        ];
        let bytes = with_packets(&ku040);
        let bit = parse(&bytes).unwrap();
        assert_eq!((bit.idcode, bit.idcode_offset), (0x0382_2093, 24 + 4 * 21));
        assert_eq!(
            bit.check_part(&XCZU9EG_ZCU102),
            Err(BitstreamError::IdcodeMismatch {
                expected: 0x0473_8093,
                found: 0x0382_2093
            })
        );
        // A read carries no data words in the stream; a type 2 write continues its type 1's
        // register.
        let id = XCZU9EG_ZCU102.idcode;
        let bit_of = |p: &[u32]| {
            let bytes = with_packets(p);
            parse(&bytes).map(|b| (b.idcode, b.idcode_offset))
        };
        assert_eq!(bit_of(&[0x2801_8001, WRITE_IDCODE, id]), Ok((id, 32)));
        assert_eq!(bit_of(&[0x3001_8000, TYPE2_WRITE | 1, id]), Ok((id, 32)));
        assert_eq!(
            bit_of(&[0x3001_2001, WRITE_IDCODE, WRITE_IDCODE, 5]),
            Ok((5, 36)),
            "a header word written as data is data"
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

    #[test]
    fn a_missing_idcode_or_a_broken_packet_is_an_error() {
        let fields = TestBitstream::for_part(&XCZU9EG_ZCU102, 0);
        let fields = fields.fields();
        // No IDCODE before the frame data: the FDRI header is word 23 of the data.
        let data = crate::testbit::config_data(16, None, 8);
        assert_eq!(
            parse(&write_bit(&fields, &data)),
            Err(BitstreamError::NoIdcode { at: 92, fdri: true })
        );
        let p = |packets: &[u32]| parse(&with_packets(packets)).map(|b| b.idcode);
        // ... or before the end (the data is 6 words before the packets).
        assert_eq!(
            p(&[NOOP, 0x3000_8001, 7]),
            Err(BitstreamError::NoIdcode {
                at: 36,
                fdri: false
            })
        );
        // Truncated packets: a write whose words run past the end.
        assert_eq!(
            p(&[0x3001_2003, 1]),
            Err(BitstreamError::PacketPastEnd {
                at: 24,
                words: 3,
                len: 32
            })
        );
        assert_eq!(
            p(&[NOOP, WRITE_IDCODE]),
            Err(BitstreamError::PacketPastEnd {
                at: 28,
                words: 1,
                len: 32
            })
        );
        assert_eq!(
            p(&[WRITE_FDRI, TYPE2_WRITE | 0x07ff_ffff]),
            Err(BitstreamError::NoIdcode { at: 24, fdri: true }),
            "frame data before the IDCODE, whatever its length"
        );
        assert_eq!(
            p(&[0x3000_8000, TYPE2_WRITE | 0x07ff_ffff]),
            Err(BitstreamError::PacketPastEnd {
                at: 28,
                words: 0x07ff_ffff,
                len: 32
            })
        );
        // Headers the walk cannot follow.
        for (packets, at, word) in [
            (&[0x0102_0304u32][..], 24, 0x0102_0304),
            (&[NOOP, 0x6000_0000], 28, 0x6000_0000),
            (&[0x3800_0000], 24, 0x3800_0000),
            (&[0x3001_8002, 1, 2], 24, 0x3001_8002),
        ] {
            assert_eq!(
                p(packets),
                Err(BitstreamError::BadPacket { at, word }),
                "{packets:x?}"
            );
        }
        // A type 2 header with no type 1 before it (find_idcode on its own: parse's sync
        // check already wants a type 1 header first).
        let data = words(&[SYNC_WORD, TYPE2_WRITE | 1, 5]);
        assert_eq!(
            find_idcode(&data, 0),
            Err(BitstreamError::BadPacket {
                at: 4,
                word: TYPE2_WRITE | 1
            })
        );
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

        /// The packet walk over random words after the sync word, most of them type 1 and
        /// type 2 headers with small word counts so that the walk goes deep: a typed error or
        /// an IDCODE inside the data, never a panic.
        #[test]
        fn random_packets_never_panic(
            packets in proptest::collection::vec(prop_oneof![
                any::<u32>(),
                (0u32..4, 0u32..32, 0u32..4).prop_map(|(op, reg, n)| 0x2000_0000 | op << 27 | reg << 13 | n),
                (0u32..4, 0u32..8).prop_map(|(op, n)| 0x4000_0000 | op << 27 | n),
                (0u32..4).prop_map(|n| 0x3001_8000 | n),
                Just(WRITE_FDRI),
                Just(XCZU9EG_ZCU102.idcode),
            ], 0..64),
        ) {
            let bytes = with_packets(&packets);
            match parse(&bytes) {
                Ok(bit) => {
                    prop_assert!(bit.idcode_offset + 4 <= bit.data.len());
                    prop_assert_eq!(word_at(bit.data, bit.idcode_offset), Some(bit.idcode));
                    let header = word_at(bit.data, bit.idcode_offset - 4).unwrap_or(0);
                    prop_assert_eq!((header >> 27) & 0b11, OP_WRITE);
                }
                Err(e) => prop_assert!(
                    matches!(
                        e,
                        BitstreamError::NoIdcode { .. }
                            | BitstreamError::BadPacket { .. }
                            | BitstreamError::PacketPastEnd { .. }
                            | BitstreamError::BadPacketAfterSync { .. }
                    ),
                    "{e:?}"
                ),
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
