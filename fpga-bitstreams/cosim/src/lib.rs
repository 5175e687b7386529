//! NPE's RTL (`fpga-bitstreams/rtl`, docs/npe-rtl.md), Verilated, behind the register seam.
//!
//! `build.rs` Verilates `npe_top` and compiles it with the `cc` crate; [`ffi`] is the C ABI of
//! the shim (one call per clock). [`System`] clocks any number of engines together: each
//! engine's queue port reaches its node's DRAM, its data port goes through the node's SMMU
//! (`sim::axi::AxiTranslate`: translate, terminate → SLVERR, stall → the response is held),
//! and the engines' link streams are connected to each other. [`CosimBus`] is the
//! `hal::RegisterBus` of one engine, so the NPE driver in `dma-engine` runs against the RTL
//! unchanged: [`board`] does that on two engines placed as the board description says, their
//! data ports behind sim's MMU-500 model ([`mmu500`]) that `smmu-driver` programs and whose
//! faults its fault service answers. [`rig`] and [`harness`] compare the RTL with the Rust
//! model at the engine level, each node's engine behind an MMU-500 of its own
//! ([`node_smmu`]: real tables, a terminating and a stalling domain, stalls answered by the
//! fault service).

mod axi_slave;
pub mod board;
mod error;
pub mod ffi;
pub mod harness;
pub mod mmu500;
pub mod node_smmu;
pub mod rig;
mod system;

pub use axi_slave::{AxiSlave, PortStats, WriteOrder};
pub use error::{CosimError, Result};
pub use system::{CosimBus, Flit, LinkHook, PortStreams, System};
