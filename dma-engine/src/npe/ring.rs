//! A ring of fixed-size entries in DMA memory, as the driver sees it.

use hal::dma::{DmaDirection, DmaMemory, DmaRegion};

use crate::error::{DmaError, Result};

/// One queue: its memory, size and the driver's own index (the producer index for rings the
/// driver fills, the consumer index for rings it drains).
#[derive(Debug)]
pub(crate) struct Ring {
    region: DmaRegion,
    log2: u8,
    entry: usize,
    /// Driver-side index (free-running).
    pub(crate) index: u32,
    /// For producer rings: the consumer index last read from the engine.
    pub(crate) seen_head: u32,
}

impl Ring {
    pub(crate) fn new<D: DmaMemory + ?Sized>(
        dma: &D,
        log2: u8,
        entry: usize,
        direction: DmaDirection,
    ) -> Result<Self> {
        let bytes = (1usize << log2) * entry;
        let pages = bytes.div_ceil(hal::dma::DMA_PAGE);
        let region = dma.allocate(pages, direction)?;
        Ok(Self {
            region,
            log2,
            entry,
            index: 0,
            seen_head: 0,
        })
    }

    pub(crate) fn bus_addr(&self) -> u64 {
        self.region.bus_addr().as_u64()
    }

    pub(crate) fn log2(&self) -> u8 {
        self.log2
    }

    pub(crate) fn slots(&self) -> u32 {
        1 << self.log2
    }

    fn offset(&self, index: u32) -> usize {
        (index & (self.slots() - 1)) as usize * self.entry
    }

    /// Entries the driver produced that the engine has not consumed (producer rings).
    pub(crate) fn in_use(&self) -> u32 {
        self.index.wrapping_sub(self.seen_head)
    }

    /// Free entries (producer rings), from the last head read.
    pub(crate) fn free(&self) -> u32 {
        self.slots().saturating_sub(self.in_use())
    }

    pub(crate) fn write(&self, index: u32, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.entry {
            return Err(DmaError::BadEntry { what: "entry size" });
        }
        Ok(self.region.write_bytes(self.offset(index), bytes)?)
    }

    pub(crate) fn read(&self, index: u32, out: &mut [u8]) -> Result<()> {
        if out.len() != self.entry {
            return Err(DmaError::BadEntry { what: "entry size" });
        }
        Ok(self.region.read_bytes(self.offset(index), out)?)
    }

    /// Reads the entry at `index` if the engine has written it (its PHASE bit, bit 0 of the
    /// first byte, is the one expected for `index`); `false` if not yet. The PHASE byte is
    /// read first, then a load barrier, then the entry: Arm may satisfy loads from Normal
    /// memory out of order, and no byte of the entry may be older than the PHASE that
    /// announced it. (The rings are coherent or non-cacheable DMA memory, so no cache
    /// maintenance is needed, `hal::dma::DmaMemory`.)
    pub(crate) fn read_new(&self, index: u32, out: &mut [u8]) -> Result<bool> {
        let mut first = [0u8; 1];
        self.region.read_bytes(self.offset(index), &mut first)?;
        if (first[0] & 1 != 0) != self.expected_phase(index) {
            return Ok(false);
        }
        hal::barrier::issue(hal::barrier::Barrier::DsbLd);
        self.read(index, out)?;
        Ok(true)
    }

    /// The PHASE value the engine writes for `index`: 1 on the first pass through the ring,
    /// 0 on the second, and so on (§4).
    pub(crate) fn expected_phase(&self, index: u32) -> bool {
        (index >> self.log2) & 1 == 0
    }

    /// Hands the memory back.
    pub(crate) fn release<D: DmaMemory + ?Sized>(self, dma: &D) -> Result<()> {
        Ok(dma.free(self.region).map_err(hal::HalError::from)?)
    }
}
