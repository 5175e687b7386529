//! Configuration packets after the sync word, walked to the device's IDCODE.
//!
//! Xilinx UG570 (*UltraScale Architecture Configuration*), "Configuration Packets": after
//! the sync word every 32-bit word is a packet header or one of a write's data words. The
//! configuration logic wants a write of the device's IDCODE to the IDCODE register before
//! any write to the frame data register FDRI ("IDCODE Register (01100)") and refuses a
//! bitstream formatted for another device ("Device ID Check (Step 5)"). The sample KU040
//! bitstream of "Bitstream Composition" shows the write: `30018001` (type 1, write,
//! register 0x0C, one word), then the IDCODE. [`find_idcode`] finds it for
//! [`crate::bit::parse`]; the comparison with the board's device is
//! [`crate::bit::BitFile::check_part`].

use crate::{BitstreamError, Result};

/// A type 1 NOOP packet (UG570, "Configuration Packets").
pub const NOOP: u32 = 0x2000_0000;
/// The configuration IDCODE register's address (UG570, "Configuration Registers",
/// "IDCODE Register (01100)").
pub const REG_IDCODE: u32 = 0x0c;
/// The frame data input register's address (UG570, "Configuration Registers", FDRI 00010).
pub const REG_FDRI: u32 = 0x02;
/// The write opcode of a packet header, bits \[28:27\] (UG570, "Type 1 Packet Header
/// Format": 00 NOOP, 01 read, 10 write, 11 reserved).
pub const OP_WRITE: u32 = 0b10;
/// The type 1 header writing one word to the IDCODE register (UG570, "Bitstream
/// Composition": `30018001`).
pub const WRITE_IDCODE: u32 = 0x3001_8001;
/// The type 1 header writing zero words to FDRI, which a type 2 header after it continues
/// (UG570, "Type 2 Packet Header Format").
pub const WRITE_FDRI: u32 = 0x3000_4000;
/// A type 2 write header without its word count (bits \[26:0\]).
pub const TYPE2_WRITE: u32 = 0x5000_0000;

/// The big-endian word at byte `at` of `data`, if `data` holds all of it.
pub(crate) fn word_at(data: &[u8], at: usize) -> Option<u32> {
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
    use proptest::prelude::*;

    use super::*;

    /// The sync word (`bit::SYNC_WORD`, UG570 "Configuration Sequence").
    const SYNC_WORD: u32 = 0xaa99_5566;

    fn words(w: &[u32]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_be_bytes()).collect()
    }

    /// The sync word, a NOOP, then `packets`.
    fn stream(packets: &[u32]) -> Vec<u8> {
        let mut w = vec![SYNC_WORD, NOOP];
        w.extend_from_slice(packets);
        words(&w)
    }

    /// The IDCODE and its offset, or the error, of [`stream`]`(packets)`.
    fn walk(packets: &[u32]) -> Result<(u32, usize)> {
        find_idcode(&stream(packets), 0)
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
        assert_eq!(walk(&ku040), Ok((0x0382_2093, 8 + 4 * 21)));
        // A read carries no data words in the stream; a type 2 write continues its type 1's
        // register.
        let id = 0x0473_8093;
        assert_eq!(walk(&[0x2801_8001, WRITE_IDCODE, id]), Ok((id, 16)));
        assert_eq!(walk(&[0x3001_8000, TYPE2_WRITE | 1, id]), Ok((id, 16)));
        assert_eq!(
            walk(&[0x3001_2001, WRITE_IDCODE, WRITE_IDCODE, 5]),
            Ok((5, 20)),
            "a header word written as data is data"
        );
    }

    #[test]
    fn a_missing_idcode_or_a_broken_packet_is_an_error() {
        let p = |packets: &[u32]| walk(packets).map(|(id, _)| id);
        // No IDCODE before the frame data, or before the end (the sync word and a NOOP are
        // the 8 bytes before the packets).
        assert_eq!(
            p(&[NOOP, WRITE_FDRI, TYPE2_WRITE | 2, 1, 2]),
            Err(BitstreamError::NoIdcode { at: 12, fdri: true })
        );
        assert_eq!(
            p(&[NOOP, 0x3000_8001, 7]),
            Err(BitstreamError::NoIdcode {
                at: 20,
                fdri: false
            })
        );
        // Truncated packets: a write whose words run past the end.
        assert_eq!(
            p(&[0x3001_2003, 1]),
            Err(BitstreamError::PacketPastEnd {
                at: 8,
                words: 3,
                len: 16
            })
        );
        assert_eq!(
            p(&[NOOP, WRITE_IDCODE]),
            Err(BitstreamError::PacketPastEnd {
                at: 12,
                words: 1,
                len: 16
            })
        );
        assert_eq!(
            p(&[WRITE_FDRI, TYPE2_WRITE | 0x07ff_ffff]),
            Err(BitstreamError::NoIdcode { at: 8, fdri: true }),
            "frame data before the IDCODE, whatever its length"
        );
        assert_eq!(
            p(&[0x3000_8000, TYPE2_WRITE | 0x07ff_ffff]),
            Err(BitstreamError::PacketPastEnd {
                at: 12,
                words: 0x07ff_ffff,
                len: 16
            })
        );
        // Headers the walk cannot follow.
        for (packets, at, word) in [
            (&[0x0102_0304u32][..], 8, 0x0102_0304),
            (&[NOOP, 0x6000_0000], 12, 0x6000_0000),
            (&[0x3800_0000], 8, 0x3800_0000),
            (&[0x3001_8002, 1, 2], 8, 0x3001_8002),
        ] {
            assert_eq!(
                p(packets),
                Err(BitstreamError::BadPacket { at, word }),
                "{packets:x?}"
            );
        }
        // A type 2 header with no type 1 before it (`bit::find_sync` already wants a type 1
        // header right after the sync word).
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
                Just(0x0473_8093),
            ], 0..64),
        ) {
            let data = stream(&packets);
            match find_idcode(&data, 0) {
                Ok((idcode, at)) => {
                    prop_assert!(at >= 12 && at + 4 <= data.len());
                    prop_assert_eq!(word_at(&data, at), Some(idcode));
                    let header = word_at(&data, at - 4).unwrap_or(0);
                    prop_assert_eq!((header >> 27) & 0b11, OP_WRITE);
                }
                Err(e) => prop_assert!(
                    matches!(
                        e,
                        BitstreamError::NoIdcode { .. }
                            | BitstreamError::BadPacket { .. }
                            | BitstreamError::PacketPastEnd { .. }
                    ),
                    "{e:?}"
                ),
            }
        }
    }
}
