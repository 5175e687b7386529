//! Arm SMMU drivers for nprdma.
//!
//! Two SMMU flavours matter to the project: QEMU `virt`'s SMMUv3 (terminate only) and the
//! ZynqMP's MMU-500 (SMMUv2, can stall). Both walk the same VMSAv8-64 stage-1 tables and both
//! end in the same fault path, so those are shared:
//!
//! - [`pagetable`]: a context's stage-1 translation tables in DMA memory (4 KiB pages, 2 MiB
//!   blocks), with break-before-make and an exact report of the TLB invalidations each change
//!   needs.
//! - [`walk`]: an independent table walker over "read a u64 at a physical address", used to
//!   read the tables back and by the simulator's SMMU models.
//! - [`fault`]: [`fault::FaultRecord`], the [`fault::FaultResolver`] trait (the memory
//!   manager's side), [`fault::FaultPolicy`] (resume, terminate and retransmit, or abort)
//!   and [`fault::FaultHandler`] tying them to a page table.
//!
//! The register drivers are sibling modules ([`v2`] for SMMUv2/MMU-500, [`v3`] for
//! SMMUv3): they decode their hardware's fault reports into `FaultRecord`s and implement
//! [`pagetable::TlbMaintenance`] with their own invalidation commands.
//!
//! `no_std`; nothing here allocates from a heap. Design notes: `docs/smmu-driver.md`.
#![cfg_attr(not(test), no_std)]

// The SMMUv3 register model (`model` feature) is a host tool and uses std.
#[cfg(all(feature = "model", not(test)))]
extern crate std;

mod error;
pub mod fault;
pub mod pagetable;
pub mod v2;
pub mod v3;
pub mod walk;

pub use error::{Result, SmmuError};
