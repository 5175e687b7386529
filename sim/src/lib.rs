//! Register-accurate device models for nprdma, behind the `hal` register seam.
//!
//! Drivers run unchanged against these models: every register access of a driver goes
//! through a [`hal::regs::RegisterBus`] that is a [`soc::Window`] into a simulated machine
//! here and an MMIO window on silicon. The models follow the architecture documents closely
//! enough that a driver mistake fails a test the way it would fail on silicon (a TLB that keeps
//! stale entries until invalidated and synced, a RESUME that is ignored while FSR is not
//! cleared, W1C status registers, AXI errors for terminated transactions).
//!
//! - [`bus`]: what a DMA master model sees of the interconnect: [`bus::MasterPort`] (read,
//!   write, stall tickets), [`bus::DmaMaster`] (a model that makes progress in `step`).
//! - [`memory`]: the simulated DRAM ([`hal::dma::HostDma`]), accessed by physical address.
//! - [`mmu500`]: the Arm CoreLink MMU-500 (SMMUv2) with the ZynqMP configuration.
//! - [`zdma`]: a ZynqMP zDMA channel (simple mode).
//! - [`mistakes`]: a register-bus wrapper that makes known driver mistakes on the bus, so
//!   tests show the models catch them without test switches inside the driver.
//! - [`soc`]: a ZynqMP: DRAM, the MMU-500, GDMA and ADMA channels whose memory traffic goes
//!   through the MMU-500 with their stream IDs, and register windows for drivers.
//!
//! The virtual QFDB (`docs/virtual-qfdb.md`): [`npe`] (our PL RDMA engine's model), [`axi`]
//! (the SMMU seam of master models), [`link`] (ExaNet links), [`qfdb`] (topology),
//! [`node_memory`] (memory limit, reclaim, swap), [`des`] (the seeded discrete-event core,
//! in model time) and [`vqfdb`] (node software, workloads, strategies, verified runs).
//!
//! In the ZynqMP models above time is not modelled. A DMA master moves data in [`soc::ZynqMpSoc::run_until_blocked`],
//! which runs after every register write until every master is idle, done, or held by a
//! stalled SMMU transaction; a RESUME write releases the hold and the masters continue within
//! that write. Runs are deterministic (no threads, masters in a fixed order).
//!
//! What is and is not modelled: `docs/mmu500.md`.

pub mod bus;
mod error;
pub mod memory;
pub mod mistakes;
pub mod mmu500;
pub mod soc;
pub mod zdma;

// The virtual QFDB (issue 6): engine model, link, topology, node memory, event core, runs.
pub mod axi;
pub mod des;
pub mod link;
pub mod node_memory;
pub mod npe;
pub mod qfdb;
pub mod vqfdb;

pub use error::{Integrity, Result, SimError};
