//! Bitstream-shaped files: a valid `.bit` header and configuration data that begins the
//! way UG570 describes (padding, bus-width pattern, sync word, type 1 packets). They exercise
//! the parser, the `.bin` conversion and the image builder; loaded into a device they would
//! configure nothing, and nothing here claims otherwise.

use crate::bit::{BUS_WIDTH_WORDS, DUMMY_WORD, NOOP, PREAMBLE, SYNC_WORD};

/// The fields and data of a test file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestBitstream {
    /// Field 'a'.
    pub design: String,
    /// Field 'b'.
    pub part: String,
    /// Field 'c'.
    pub date: String,
    /// Field 'd'.
    pub time: String,
    /// Field 'e'.
    pub data: Vec<u8>,
}

impl TestBitstream {
    /// A test file for `part` with 16 padding words and `words` payload words.
    pub fn for_part(part: &str, words: usize) -> Self {
        Self {
            design: "nprdma_test;UserID=0XFFFFFFFF;Version=test".into(),
            part: part.into(),
            date: "2026/12/07".into(),
            time: "16:30:00".into(),
            data: config_data(16, words),
        }
    }

    /// The four text fields in file order.
    pub fn fields(&self) -> [&str; 4] {
        [&self.design, &self.part, &self.date, &self.time]
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        write_bit(&self.fields(), &self.data)
    }
}

/// Configuration data: `pad` dummy words, the bus-width pattern, two dummy words, the sync
/// word (at word `pad + 4`), a NOOP, then `words` words of type 1 NOOP packets interleaved
/// with a counter pattern (so a byte-order mistake shows).
pub fn config_data(pad: usize, words: usize) -> Vec<u8> {
    let mut w: Vec<u32> = vec![DUMMY_WORD; pad];
    w.extend(BUS_WIDTH_WORDS);
    w.extend([DUMMY_WORD, DUMMY_WORD, SYNC_WORD, NOOP]);
    for i in 0..words as u32 {
        w.push(if i % 2 == 0 {
            NOOP
        } else {
            0x0102_0304u32.wrapping_add(i.wrapping_mul(0x0404_0404))
        });
    }
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

/// Writes a `.bit` file: the preamble, fields 'a'-'d' (each NUL-terminated, 16-bit
/// length) and 'e' (32-bit length) with `data`.
pub fn write_bit(fields: &[&str; 4], data: &[u8]) -> Vec<u8> {
    let mut out = PREAMBLE.to_vec();
    for (key, text) in [b'a', b'b', b'c', b'd'].into_iter().zip(fields) {
        out.push(key);
        let len = u16::try_from(text.len() + 1).unwrap_or(u16::MAX);
        out.extend(len.to_be_bytes());
        out.extend(text.as_bytes());
        out.push(0);
    }
    out.push(b'e');
    out.extend(u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend(data);
    out
}
