//! Circular-queue index arithmetic and naturally aligned DMA memory for the stream table and
//! the queues.
//!
//! Index format (IHI0070 §3.5 and SMMU_CMDQ_PROD/CONS, §6.3.27-28): the low `log2` bits are
//! the entry index, bit `log2` is the wrap flag. Empty: PROD == CONS (index and wrap equal);
//! full: same index, different wrap.

use core::ops::Deref;

use hal::dma::{DMA_PAGE, DmaDirection, DmaMemory, DmaRegion};
use hal::{HalError, PhysAddr};

use crate::{Result, SmmuError};

/// Index arithmetic of a queue of `2^log2` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    log2: u8,
}

impl Ring {
    /// A ring of `2^log2` entries (`log2` <= 19, the architectural maximum of IDR1.CMDQS and
    /// IDR1.EVENTQS).
    pub fn new(log2: u8) -> Result<Ring> {
        if log2 > 19 {
            return Err(SmmuError::InvalidConfig {
                what: "queue log2 size must be <= 19",
            });
        }
        Ok(Ring { log2 })
    }

    /// log2 of the number of entries.
    pub fn log2(&self) -> u8 {
        self.log2
    }

    /// Number of entries.
    pub fn entries(&self) -> u32 {
        1 << self.log2
    }

    /// Mask of index and wrap flag: the bits of a PROD/CONS value that matter.
    pub fn mask(&self) -> u32 {
        (1 << (self.log2 + 1)) - 1
    }

    /// The entry index of a PROD/CONS value.
    pub fn index(&self, value: u32) -> u32 {
        value & (self.entries() - 1)
    }

    /// The wrap flag of a PROD/CONS value.
    pub fn wrap(&self, value: u32) -> bool {
        value & self.entries() != 0
    }

    /// The value after `value` (index + 1, toggling the wrap flag at the end).
    pub fn next(&self, value: u32) -> u32 {
        value.wrapping_add(1) & self.mask()
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self, prod: u32, cons: u32) -> bool {
        (prod & self.mask()) == (cons & self.mask())
    }

    /// Whether the queue is full.
    pub fn is_full(&self, prod: u32, cons: u32) -> bool {
        self.index(prod) == self.index(cons) && self.wrap(prod) != self.wrap(cons)
    }

    /// Entries between `cons` and `prod` (0..=2^log2).
    pub fn used(&self, prod: u32, cons: u32) -> u32 {
        prod.wrapping_sub(cons) & self.mask()
    }
}

/// DMA memory of `bytes` bytes whose bus address is aligned to `align` (a power of two): the
/// SMMU aligns queue and linear stream-table bases to their size (IHI0070 §6.3.24, §6.3.26),
/// so a base that is not would make it read the wrong memory. Over-allocates when `align`
/// exceeds the allocator's 4 KiB alignment.
#[derive(Debug)]
pub struct AlignedDma {
    region: DmaRegion,
    offset: usize,
    bytes: usize,
}

impl AlignedDma {
    /// Allocates and zeroes.
    pub fn new<M: Deref<Target: DmaMemory>>(
        dma: &M,
        bytes: usize,
        align: usize,
        direction: DmaDirection,
    ) -> Result<AlignedDma> {
        if bytes == 0 || !align.is_power_of_two() {
            return Err(SmmuError::InvalidConfig {
                what: "aligned DMA needs a non-zero size and a power-of-two alignment",
            });
        }
        let slack = align.saturating_sub(DMA_PAGE);
        let total = bytes
            .checked_add(slack)
            .ok_or(SmmuError::InvalidConfig {
                what: "aligned DMA size overflows",
            })?
            .div_ceil(DMA_PAGE);
        let region = dma.allocate(total, direction)?;
        let bus = region.bus_addr().as_u64();
        let aligned = bus.next_multiple_of(align as u64);
        let offset = (aligned - bus) as usize;
        if offset + bytes > region.len() {
            // Cannot happen with the slack above; refuse rather than overrun.
            dma.free(region).map_err(HalError::from)?;
            return Err(SmmuError::InvalidConfig {
                what: "aligned DMA region too small",
            });
        }
        Ok(AlignedDma {
            region,
            offset,
            bytes,
        })
    }

    /// The aligned bus address.
    pub fn bus(&self) -> PhysAddr {
        PhysAddr::new(self.region.bus_addr().as_u64() + self.offset as u64)
    }

    /// Usable size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether empty (never).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The underlying region (for cache maintenance).
    pub fn region(&self) -> &DmaRegion {
        &self.region
    }

    /// Writes an aligned u64 at byte `at` of the usable range.
    pub fn write_u64(&self, at: usize, value: u64) -> Result<()> {
        self.check(at, 8)?;
        Ok(self.region.write_u64(self.offset + at, value)?)
    }

    /// Reads an aligned u64 at byte `at` of the usable range.
    pub fn read_u64(&self, at: usize) -> Result<u64> {
        self.check(at, 8)?;
        Ok(self.region.read_u64(self.offset + at)?)
    }

    fn check(&self, at: usize, len: usize) -> Result<()> {
        match at.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(()),
            _ => Err(SmmuError::InvalidConfig {
                what: "access outside an SMMU table or queue",
            }),
        }
    }

    /// Returns the memory to `dma`.
    pub fn free<M: Deref<Target: DmaMemory>>(self, dma: &M) -> Result<()> {
        Ok(dma.free(self.region).map_err(HalError::from)?)
    }
}

#[cfg(test)]
mod tests {
    use hal::dma::HostDma;

    use super::*;

    #[test]
    fn index_wrap_full_and_empty() {
        // 8 entries: index bits 2:0, wrap bit 3.
        let r = Ring::new(3).unwrap();
        assert_eq!((r.entries(), r.mask()), (8, 0xf));
        assert!(r.is_empty(0, 0));
        assert!(r.is_full(0b1000, 0), "same index 0, wrap differs");
        assert!(!r.is_full(0b0111, 0));
        assert_eq!(r.used(0b1000, 0), 8);
        assert_eq!(
            r.used(0b0011, 0b1110),
            5,
            "cons 6 (wrap 1) .. prod 3 (wrap 0)"
        );
        assert_eq!(r.next(0b0111), 0b1000, "index 7 -> 0 toggles wrap");
        assert_eq!(r.next(0b1111), 0b0000);
        assert_eq!(r.index(0b1101), 5);
        assert!(r.wrap(0b1101));
        // Register values may carry other bits (ERR, OVFLG): masked away.
        assert!(r.is_empty(0x8000_0005, 0x0000_0005));
        assert!(Ring::new(20).is_err());
        let one = Ring::new(0).unwrap();
        assert!(
            one.is_full(1, 0) && one.next(1) == 0,
            "a 1-entry queue: wrap is bit 0"
        );
    }

    #[test]
    fn aligned_dma_is_aligned_and_bounded() {
        let dma = HostDma::new(PhysAddr::new(0x8000_1000), 256).unwrap();
        let dma = &dma;
        // A 1-page allocation first, so the next one is not 64 KiB aligned by chance.
        let _pad = dma.allocate(1, DmaDirection::ToDevice).unwrap();
        let q = AlignedDma::new(&dma, 0x1_0000, 0x1_0000, DmaDirection::FromDevice).unwrap();
        assert_eq!(q.bus().as_u64() % 0x1_0000, 0);
        q.write_u64(0xfff8, 7).unwrap();
        assert_eq!(q.read_u64(0xfff8).unwrap(), 7);
        assert!(q.write_u64(0x1_0000, 0).is_err(), "past the end");
        assert!(AlignedDma::new(&dma, 64, 48, DmaDirection::ToDevice).is_err());
        q.free(&dma).unwrap();
    }
}
