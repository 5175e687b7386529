//! The simulated DRAM: a [`HostDma`] arena at a physical base address. Drivers allocate from
//! it (it is their `DmaMemory`); models read and write it by physical address. An access
//! outside the arena gets a DECERR, as an unpopulated address would on the interconnect.

use std::sync::Arc;

use hal::PhysAddr;
use hal::dma::HostDma;

use crate::bus::AxiResponse;

/// Shared handle to the simulated DRAM.
#[derive(Clone, Debug)]
pub struct Memory {
    dram: Arc<HostDma>,
}

impl Memory {
    /// Wraps an arena.
    pub fn new(dram: Arc<HostDma>) -> Self {
        Memory { dram }
    }

    /// The arena (drivers' `DmaMemory`).
    pub fn dram(&self) -> &Arc<HostDma> {
        &self.dram
    }

    /// Device read.
    pub fn read(&self, addr: PhysAddr, buf: &mut [u8]) -> Result<(), AxiResponse> {
        self.dram
            .read_phys(addr, buf)
            .map_err(|_| AxiResponse::DecErr)
    }

    /// Device write.
    pub fn write(&self, addr: PhysAddr, data: &[u8]) -> Result<(), AxiResponse> {
        self.dram
            .write_phys(addr, data)
            .map_err(|_| AxiResponse::DecErr)
    }

    /// Little-endian u64 read (a table walk).
    pub fn read_u64(&self, addr: PhysAddr) -> Result<u64, AxiResponse> {
        self.dram
            .read_phys_u64(addr)
            .map_err(|_| AxiResponse::DecErr)
    }
}
