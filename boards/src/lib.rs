//! Board descriptions for nprdma, and what runs on them.
//!
//! - [`zynqmp`]: the Zynq UltraScale+ MPSoC as the ZCU102 and the ExaNeSt QFDB (four MPSoCs)
//!   use it: memory map, the MMU-500's geometry and interrupt, stream IDs of the PL ports and
//!   of the GDMA/ADMA channels, UARTs; and [`zynqmp::scenario`], the SMMU fault scenario,
//!   written once and generic over the register buses so it runs against the `sim` models on
//!   the host and against MMIO in firmware.
//! - [`pager`]: the bare-metal programs' pager (frames, a store, registered regions), the
//!   [`smmu_driver::fault::FaultResolver`] of the scenario and of the firmware's programs.
//!
//! Values are marked in their docs: **\[C\]** stated by a source (named), **\[I\]** inferred
//! (how is said where the value is defined).
//!
//! `no_std`, no heap.
#![cfg_attr(not(test), no_std)]

mod error;
pub mod pager;
pub mod zynqmp;

pub use error::{BoardError, Result};
