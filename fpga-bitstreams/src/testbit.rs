//! Bitstream-shaped files: a valid `.bit` header and configuration data that begins the
//! way UG570 describes (padding, bus-width pattern, sync word, type 1 packets, the IDCODE
//! write of the device, then frame data). They exercise the parser, the `.bin` conversion
//! and the image builder; their frame data is a counter pattern and there are no CRC or
//! start-up commands, so loaded into a device they would configure nothing, and nothing
//! here claims otherwise.

use boards::zynqmp::pl::Part;

use crate::bit::{BUS_WIDTH_WORDS, DUMMY_WORD, PREAMBLE, SYNC_WORD};
use crate::packets::{NOOP, TYPE2_WRITE, WRITE_FDRI, WRITE_IDCODE};

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
    /// A test file for `part` (its Vivado name in the header, its device's IDCODE in the
    /// data) with 16 padding words and `words` frame data words.
    pub fn for_part(part: &Part, words: usize) -> Self {
        let mut name = [0u8; 64];
        let n = part.write_name(&mut name).unwrap_or(0);
        Self::new(&String::from_utf8_lossy(&name[..n]), part.idcode, words)
    }

    /// A test file whose header names `part` and whose data writes `idcode`, with 16
    /// padding words and `words` frame data words.
    pub fn new(part: &str, idcode: u32, words: usize) -> Self {
        Self {
            design: "nprdma_test;UserID=0XFFFFFFFF;Version=test".into(),
            part: part.into(),
            date: "2026/12/07".into(),
            time: "16:30:00".into(),
            data: config_data(16, Some(idcode), words),
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
/// word (at word `pad + 4`), a NOOP, the IDCODE write of `idcode` (none if `None`), a NOOP,
/// then a write to FDRI (a type 1 header of zero words and a type 2 header) of `words`
/// words of a counter pattern (so a byte-order mistake shows). `words` is cut to the type
/// 2 word count's 27 bits.
pub fn config_data(pad: usize, idcode: Option<u32>, words: usize) -> Vec<u8> {
    let words = u32::try_from(words).unwrap_or(u32::MAX).min(0x07ff_ffff);
    let mut w: Vec<u32> = vec![DUMMY_WORD; pad];
    w.extend(BUS_WIDTH_WORDS);
    w.extend([DUMMY_WORD, DUMMY_WORD, SYNC_WORD, NOOP]);
    if let Some(id) = idcode {
        w.extend([WRITE_IDCODE, id]);
    }
    w.extend([NOOP, WRITE_FDRI, TYPE2_WRITE | words]);
    w.extend((0..words).map(|i| 0x0102_0304u32.wrapping_add(i.wrapping_mul(0x0404_0404))));
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
