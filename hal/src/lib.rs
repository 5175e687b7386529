//! The hardware seam of nprdma.
//!
//! Every driver in this workspace reaches hardware only through this crate, so the same driver
//! code runs on silicon (ZynqMP MMU-500, our PL engine), on QEMU (`virt` SMMUv3 + `edu`) and
//! against the register-accurate models in `sim`:
//!
//! - [`addr`]: physical, virtual and IO-virtual address newtypes with checked arithmetic, page
//!   sizes and aligned ranges.
//! - [`regs`]: the register seam. Drivers declare fields with tock-registers'
//!   `register_bitfields!` and register blocks with [`register_block!`]; every access goes
//!   through a [`regs::RegisterBus`], which is either an MMIO window ([`regs::MmioBus`]) or a
//!   device model that sees each read, write and barrier as it happens.
//! - [`barrier`] and [`sysreg`]: memory barriers and the few system registers drivers need;
//!   real instructions on aarch64, a recording fake elsewhere.
//! - [`dma`]: the DMA-memory trait (allocate, free, bus address, direction, cache sync).
//! - [`delay`]: timeouts on top of embedded-hal's `DelayNs`.
//! - the logging shim ([`error!`], [`warn!`], [`info!`], [`debug!`], [`trace!`]): `defmt` on
//!   the target, `log` on the host, nothing when neither feature is on.
//!
//! The crate is `no_std`. The `std` feature (implied by its own tests) adds host helpers: the
//! model bus, the access journal and heap-backed DMA memory.
#![cfg_attr(not(any(test, feature = "std")), no_std)]

#[cfg(all(feature = "log", feature = "defmt"))]
compile_error!("hal: enable at most one of the `log` and `defmt` features");

pub mod addr;
pub mod barrier;
pub mod delay;
pub mod dma;
mod error;
#[cfg(any(test, feature = "std"))]
pub mod journal;
#[macro_use]
mod logging;
#[cfg(any(test, feature = "std"))]
pub mod model;
pub mod regs;
pub mod sysreg;

pub use addr::{AlignedRange, Iova, PageSize, PhysAddr, VirtAddr};
pub use error::{HalError, Result};

/// Re-exports for the macros of this crate; not part of the API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "defmt")]
    pub use defmt;
    #[cfg(feature = "log")]
    pub use log;
    pub use tock_registers;
}
