//! The fault path shared by every SMMU flavour.
//!
//! An SMMU driver turns what its hardware reports (an SMMUv3 event record, an SMMUv2 context
//! bank's FSR/FAR/FSYNR0/CBFRSYNRA) into a [`FaultRecord`]. The [`FaultHandler`] then:
//!
//! 1. [`decide`](FaultHandler::decide)s: it refuses faults no mapping can fix (address size,
//!    external, unknown), faults outside every [`RegisteredRegion`] of the stream and writes
//!    to read-only regions; it notices faults that are already fixed (the table maps the page
//!    with enough permission: a duplicate record, or a fault taken during a
//!    break-before-make window); otherwise it asks the [`FaultResolver`] how costly making
//!    the page present will be. A [`FaultPolicy`] turns that into one [`FaultDecision`].
//! 2. The driver acts on the decision's *first half*: for `TerminateAndRetransmit` and `Abort`
//!    it terminates a stalled transaction now (SMMUv2 `RESUME.TnR = 1`, SMMUv3 `CMD_RESUME`
//!    abort), so a slow resolution never holds the stall.
//! 3. [`fix`](FaultHandler::fix) has the resolver make the page present and maps it (or
//!    changes its permissions), returning the TLB invalidations the driver must issue.
//! 4. The driver invalidates and syncs, then resumes (`RESUME.TnR = 0`, `CMD_RESUME` retry)
//!    or tells the DMA master to retransmit.
//!
//! [`FaultHandler::handle`] does 1 and 3 in one call, for transactions that are not stalled
//! (QEMU's SMMUv3 never stalls: `smmuv3_init_regs` in QEMU `hw/arm/smmuv3.c` sets
//! IDR0.STALL_MODEL = 0b01) or when the driver does not care.
//!
//! Rules the handler enforces whatever the policy says:
//! - a fault outside every registered region is never mapped: the transfer is aborted with
//!   [`SmmuError::OutsideRegisteredRegion`](crate::SmmuError::OutsideRegisteredRegion), and nothing else is touched, so other transfers
//!   carry on;
//! - a write to a read-only region is aborted with [`SmmuError::WriteToReadOnlyRegion`](crate::SmmuError::WriteToReadOnlyRegion);
//! - `Resume` is only possible for a transaction that is stalled on a stream marked
//!   stall-tolerant. PCIe streams never are (IHI0070 §3.12.1: PCIe streams must use the
//!   terminate model).

pub mod attribution;
mod cost;
mod handler;
mod policy;
mod region;
mod service;

use hal::{Iova, PageSize, PhysAddr};

pub use attribution::{Attribution, InFlightAccess, Unattributed, attribute};
pub use cost::{Capacity, CostDecisions, CostPolicy, StallCosts};
pub use handler::{FaultHandler, FaultOutcome, FaultPlan, FaultStats, FixOutcome, RangeResolution};
pub use policy::{
    FaultDecision, FaultEstimate, FaultPolicy, PolicyInput, StandardPolicy, StreamFaultConfig,
    abort_reason,
};
pub use region::{RegionSet, RegisteredRegion};
pub use service::{FaultControl, FaultSource, FaultVisitor, TakenFault};

use crate::pagetable::Attributes;

/// A stream ID (SMMUv3 StreamID; SMMUv2 the ID matched by the SMRs, from CBFRSYNRA).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// Which SMMU architecture produced a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SmmuFlavour {
    /// SMMUv3 (QEMU `virt`).
    V3,
    /// SMMUv2 (the ZynqMP's MMU-500).
    V2,
}

/// Which SMMU instance produced a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmmuId {
    /// Architecture.
    pub flavour: SmmuFlavour,
    /// Instance number on the platform (0 for the only one).
    pub instance: u8,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// A read (SMMUv3 RnW = 1, SMMUv2 FSYNR0.WNR = 0).
    Read,
    /// A write.
    Write,
}

/// What went wrong, in the terms both SMMU flavours share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum FaultKind {
    /// No valid translation (SMMUv3 `F_TRANSLATION` 0x10, SMMUv2 FSR.TF).
    Translation,
    /// The translation forbids the access (`F_PERMISSION` 0x13, FSR.PF).
    Permission,
    /// AF = 0 with access-flag faults enabled (`F_ACCESS` 0x12, FSR.AFF).
    AccessFlag,
    /// Address beyond the input or output address size (`F_ADDR_SIZE` 0x11, FSR.ASF).
    AddressSize,
    /// External abort, e.g. on the table walk (`F_WALK_EABT`, FSR.EF).
    External,
    /// Anything else (configuration errors, TLB conflicts, implementation defined).
    Unknown,
}

/// The tag a driver needs to resume or terminate a stalled transaction: SMMUv3 STAG
/// (event dword 1 bits 15:0); SMMUv2 the context bank index (RESUME is per bank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StallTag(pub u32);

/// The raw syndrome, for logs.
///
/// SMMUv3: the four dwords of the event record (IHI0070 §7.3). SMMUv2:
/// `[FSR, FSYNR0 | FSYNR1 << 32, FAR, CBFRSYNRA]` of the context bank (IHI0062 `SMMU_CBn_FSR`,
/// `SMMU_CBn_FSYNR0/1`, `SMMU_CBn_FAR`, `SMMU_CBFRSYNRAn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RawSyndrome(pub [u64; 4]);

/// One translation fault, as every SMMU flavour reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultRecord {
    /// The SMMU that reported it.
    pub smmu: SmmuId,
    /// The stream of the faulting transaction.
    pub stream: StreamId,
    /// The faulting input address (QEMU reports the exact byte address, not the page).
    pub iova: Iova,
    /// Read or write.
    pub access: AccessKind,
    /// What went wrong.
    pub kind: FaultKind,
    /// Lookup level, when the SMMU reports it (SMMUv2 FSYNR0.PLVL; SMMUv3 events do not).
    pub level: Option<u8>,
    /// `Some` if the transaction is stalled and waits for resume or terminate.
    pub stall: Option<StallTag>,
    /// The raw syndrome for logs.
    pub syndrome: RawSyndrome,
}

impl FaultRecord {
    /// Whether the transaction is stalled.
    pub fn is_stalled(&self) -> bool {
        self.stall.is_some()
    }

    /// Whether the transaction is a write.
    pub fn is_write(&self) -> bool {
        self.access == AccessKind::Write
    }

    /// The faulting access as the page tables judge it: read or write, and the privilege
    /// and instruction/data attributes the SMMU recorded in the raw syndrome (SMMUv2
    /// FSYNR0.PNU bit 5 and IND bit 6; SMMUv3 event PnU bit 33 and InD bit 34 of dword 1;
    /// 1 = privileged, instruction). A record made up without a syndrome reads as an
    /// unprivileged data access, the strictest data case.
    pub fn access_request(&self) -> crate::walk::AccessRequest {
        let word = self.syndrome.0[1];
        let (privileged, instruction) = match self.smmu.flavour {
            SmmuFlavour::V2 => (word & 1 << 5 != 0, word & 1 << 6 != 0),
            SmmuFlavour::V3 => {
                let dw1 = crate::v3::event::FaultDword1(word);
                (dw1.pnu(), dw1.ind())
            }
        };
        crate::walk::AccessRequest {
            write: self.is_write(),
            privileged,
            instruction,
        }
    }
}

/// How costly making a page present will be, as the resolver guesses before doing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResolveEstimate {
    /// The frame is resident (or can be taken from a free list): mapping it takes about
    /// `expected_ns`. Cheap enough to do while a transaction is stalled if within budget.
    Minor {
        /// Expected time to resolve, in nanoseconds.
        expected_ns: u64,
    },
    /// The data must be fetched (backing store, network): far too slow for a stall.
    Major,
    /// The resolver cannot tell.
    Unknown,
}

/// What resolving actually cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultCost {
    /// No data had to be fetched.
    Minor,
    /// Data had to be fetched.
    Major,
}

/// A page the resolver made present.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResolvedPage {
    /// Physical address of the page or block that contains the faulting IOVA, aligned to
    /// `size`. It will be mapped at the IOVA rounded down to `size`.
    pub frame: PhysAddr,
    /// Mapping size: 4 KiB or 2 MiB.
    pub size: PageSize,
    /// Attributes to map it with; must allow the faulting access and have AF set.
    pub attributes: Attributes,
    /// What it cost.
    pub cost: FaultCost,
}

/// A resolver's own failure, with its own code (carried into
/// [`SmmuError::ResolveFailed`](crate::SmmuError::ResolveFailed)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResolveError(pub u32);

/// The memory manager's side of the fault path.
///
/// Kept small: where are the registered regions, how costly is this fault, and make the page
/// present.
pub trait FaultResolver {
    /// The registered region of `stream` that contains `iova`, if any. Faults outside every
    /// region are aborted without calling the other methods.
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion>;

    /// A guess at what [`resolve`](Self::resolve) will cost, without doing it.
    fn estimate(&self, stream: StreamId, iova: Iova, access: AccessKind) -> ResolveEstimate;

    /// Makes the page for `iova` present with `access` allowed and returns its frame and
    /// mapping size. Called only for IOVAs inside a registered region, with an access the
    /// region allows.
    fn resolve(
        &mut self,
        stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError>;
}

#[cfg(test)]
mod tests;
