//! The `.bin` form of a bitstream, as Linux's FPGA manager loads it on the ZynqMP.
//!
//! Linux's `drivers/fpga/zynqmp-fpga.c` (`zynqmp_fpga_ops_write`) copies the image it is
//! given unchanged into a DMA buffer and passes it to the PMU firmware
//! (`zynqmp_pm_fpga_load`); it neither strips a header nor swaps bytes. The firmware expects
//! the configuration data without the `.bit` header and with every 32-bit word's bytes
//! reversed (little-endian words: the sync word reads `66 55 99 AA`). U-Boot's
//! `drivers/fpga/zynqmppl.c` says as much ("Bitstreams in binary format are swapped compare
//! to regular bitstream", `check_header`), and Xilinx's `bootgen -arch zynqmp
//! -process_bitstream bin` produces exactly that, which `cargo xtask image` checks against
//! Debian's bootgen.

use crate::bit::BitFile;
use crate::{BitstreamError, Result};

/// Size of the `.bin` of `bit`: its configuration data, whole.
pub fn bin_len(bit: &BitFile<'_>) -> usize {
    bit.data.len()
}

/// Writes the `.bin` of `bit` into `out`, which must be exactly [`bin_len`] bytes.
pub fn write_bin(bit: &BitFile<'_>, out: &mut [u8]) -> Result<()> {
    if out.len() != bit.data.len() {
        return Err(BitstreamError::BufferSize {
            needed: bit.data.len(),
            given: out.len(),
        });
    }
    // `parse` guarantees whole words; check again for a hand-made `BitFile`.
    if !bit.data.len().is_multiple_of(4) {
        return Err(BitstreamError::UnalignedLength {
            len: bit.data.len(),
        });
    }
    for (dst, src) in out.chunks_exact_mut(4).zip(bit.data.chunks_exact(4)) {
        dst.copy_from_slice(&[src[3], src[2], src[1], src[0]]);
    }
    Ok(())
}

/// The `.bin` of `bit` as a vector.
#[cfg(any(test, feature = "std"))]
pub fn to_bin(bit: &BitFile<'_>) -> Result<Vec<u8>> {
    let mut out = vec![0; bin_len(bit)];
    write_bin(bit, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bit::parse;
    use crate::testbit::TestBitstream;
    use boards::zynqmp::pl::XCZU9EG_ZCU102;

    #[test]
    fn words_are_byte_reversed_and_the_header_is_gone() {
        let bytes = TestBitstream::for_part(&XCZU9EG_ZCU102, 8).bytes();
        let bit = parse(&bytes).unwrap();
        let bin = to_bin(&bit).unwrap();
        assert_eq!(bin.len(), bit.data.len());
        assert_eq!(&bin[..4], &[0xff; 4]);
        let s = bit.sync_offset;
        assert_eq!(&bin[s..s + 4], &[0x66, 0x55, 0x99, 0xaa]);
        assert_eq!(&bin[s - 16..s - 8], &[0xbb, 0, 0, 0, 0x44, 0, 0x22, 0x11]);
        // Swapping twice gives the data back.
        let back = BitFile { data: &bin, ..bit };
        assert_eq!(to_bin(&back).unwrap(), bit.data);
    }

    #[test]
    fn a_wrong_buffer_is_an_error() {
        let bytes = TestBitstream::for_part(&XCZU9EG_ZCU102, 8).bytes();
        let bit = parse(&bytes).unwrap();
        let mut small = vec![0; bit.data.len() - 4];
        assert_eq!(
            write_bin(&bit, &mut small),
            Err(BitstreamError::BufferSize {
                needed: bit.data.len(),
                given: bit.data.len() - 4
            })
        );
        let odd = BitFile {
            data: &bit.data[..5],
            ..bit
        };
        assert_eq!(
            write_bin(&odd, &mut [0; 5]),
            Err(BitstreamError::UnalignedLength { len: 5 })
        );
    }
}
