//! DMA engine drivers for nprdma.
//!
//! - [`zdma`]: one channel of the ZynqMP's general-purpose DMA controllers (GDMA in the FPD,
//!   ADMA in the LPD; Xilinx UG1085 chapter "DMA Controller"), in simple (register) mode.
//!   Every ZynqMP has it, and its traffic goes through the MMU-500, so it is the DMA master the
//!   SMMU fault path is proven with before any PL engine exists.
//!
//! - [`npe`]: NPE, our PL RDMA engine (`docs/dma-engine.md`): channels running the
//!   unpinned-memory protocol, fault-aware scheduling, retransmission, in-order exactly-once
//!   completions.
//!
//! `no_std`, no heap. Every wait is bounded; an AXI error (for example a transaction the SMMU
//! terminated) is a typed error the caller can answer by retransmitting.
#![cfg_attr(not(test), no_std)]

mod error;
pub mod npe;
pub mod zdma;

pub use error::{DmaError, Result};
