//! Memory barriers.
//!
//! On aarch64 these are the real `dsb`/`dmb`/`isb` instructions (through `aarch64-cpu`). On other
//! architectures (host tests) they are a compiler fence plus, with the `std` feature, an entry
//! in the thread's [`journal`](crate::journal), so a test can assert that a barrier came
//! between the write of a queue entry and the doorbell that publishes it.
//!
//! Which barrier when (Arm ARM B2.3, and Linux's `writel` = `wmb` + `writel_relaxed`):
//! - descriptors/queue entries in normal memory, then an MMIO doorbell: [`Barrier::DsbSt`]
//!   (Linux uses `dma_wmb`/`wmb`; a DSB ST also covers a non-coherent observer).
//! - after writing page tables or an STE/CD the SMMU will walk: [`Barrier::DsbIshSt`] on
//!   coherent walks, [`Barrier::DsbSt`] otherwise.
//! - after reading an MMIO status that says DMA data is ready, before reading the data:
//!   [`Barrier::DsbLd`].
//! - after changing a system register: [`Barrier::Isb`].

/// The barrier kinds drivers use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Barrier {
    /// `dsb sy`: full system, all accesses.
    DsbSy,
    /// `dsb st`: full system, stores.
    DsbSt,
    /// `dsb ld`: full system, loads.
    DsbLd,
    /// `dsb ish`: inner shareable, all accesses.
    DsbIsh,
    /// `dsb ishst`: inner shareable, stores.
    DsbIshSt,
    /// `dmb sy`: full system ordering, all accesses.
    DmbSy,
    /// `dmb ishst`: inner shareable ordering, stores.
    DmbIshSt,
    /// `isb`: context synchronization.
    Isb,
}

/// Executes (or, off-target, records) a barrier.
#[inline]
pub fn issue(kind: Barrier) {
    imp::issue(kind)
}

/// `dsb st`: the usual barrier between filling a queue and ringing its doorbell.
#[inline]
pub fn dsb_st() {
    issue(Barrier::DsbSt)
}

/// `dsb sy`.
#[inline]
pub fn dsb_sy() {
    issue(Barrier::DsbSy)
}

/// `isb`.
#[inline]
pub fn isb() {
    issue(Barrier::Isb)
}

#[cfg(target_arch = "aarch64")]
mod imp {
    use super::Barrier;
    use aarch64_cpu::asm::barrier;

    #[inline]
    pub fn issue(kind: Barrier) {
        match kind {
            Barrier::DsbSy => barrier::dsb(barrier::SY),
            Barrier::DsbSt => barrier::dsb(barrier::ST),
            Barrier::DsbLd => barrier::dsb(barrier::LD),
            Barrier::DsbIsh => barrier::dsb(barrier::ISH),
            Barrier::DsbIshSt => barrier::dsb(barrier::ISHST),
            Barrier::DmbSy => barrier::dmb(barrier::SY),
            Barrier::DmbIshSt => barrier::dmb(barrier::ISHST),
            Barrier::Isb => barrier::isb(barrier::SY),
        }
        #[cfg(any(test, feature = "std"))]
        crate::journal::record(crate::journal::Event::Barrier(kind));
    }
}

#[cfg(not(target_arch = "aarch64"))]
mod imp {
    use super::Barrier;
    use core::sync::atomic::{Ordering, compiler_fence, fence};

    #[inline]
    pub fn issue(kind: Barrier) {
        // The host's own ordering: what a model in another thread may rely on.
        match kind {
            Barrier::Isb => compiler_fence(Ordering::SeqCst),
            _ => fence(Ordering::SeqCst),
        }
        #[cfg(any(test, feature = "std"))]
        crate::journal::record(crate::journal::Event::Barrier(kind));
    }
}
