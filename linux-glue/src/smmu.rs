//! The SMMU fault path's [`FaultResolver`] on the real Linux mm.
//!
//! The model is the ExaNeSt one (Psistakis, arXiv 2511.21018 and 2511.19258, whose SMMU
//! context walks the process's tables): the device uses process virtual addresses, so an IOVA *is* a
//! virtual address of this process, and one SMMU stream (or context) serves this process.
//! Resolving a fault means faulting the page in through Linux and handing its frame to the
//! SMMU driver, which maps it in the context's table. Frames are visible only with
//! CAP_SYS_ADMIN (pagemap hides PFNs otherwise); without them `resolve` fails with
//! [`NO_FRAME`] and the handler aborts the transfer rather than map a wrong address.

use hal::{Iova, PageSize, VirtAddr};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultResolver, RegisteredRegion, ResolveError, ResolveEstimate,
    ResolvedPage, StreamId,
};
use smmu_driver::pagetable::{Attributes, Permissions};

use crate::registry::Access;
use crate::resolver::{FaultKind, Likely, Resolver};

/// [`ResolveError`] code: the page was made present but its frame is not visible (no
/// CAP_SYS_ADMIN).
pub const NO_FRAME: u32 = 0x6c00_0001;
/// [`ResolveError`] code: base for a [`crate::GlueError`]; the low 16 bits are its code.
pub const GLUE_ERROR_BASE: u32 = 0x6c01_0000;

/// Expected cost of a minor fault, for the stall decision: this machine's measured p50 for
/// an anonymous first touch (docs/linux-glue.md), in line with NP-RDMA's 3.5-5.7 us.
pub const MINOR_FAULT_NS: u64 = 6_000;
/// Expected cost when the page is already mapped (a PTE lookup and, at most, an upgrade).
pub const PRESENT_NS: u64 = 1_000;

/// Resolves SMMU faults of one stream against this process's registered regions.
#[derive(Clone, Debug)]
pub struct SmmuResolver {
    resolver: Resolver,
    stream: StreamId,
}

impl SmmuResolver {
    /// Resolves faults of `stream` (the device context bound to this process).
    pub fn new(resolver: Resolver, stream: StreamId) -> Self {
        Self { resolver, stream }
    }
}

fn va(iova: Iova) -> VirtAddr {
    VirtAddr::new(iova.as_u64())
}

impl FaultResolver for SmmuResolver {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        if stream != self.stream {
            return None;
        }
        let (range, access) = self.resolver.region_of(va(iova))?;
        Some(RegisteredRegion {
            stream,
            start: Iova::new(range.start().as_u64()),
            len: range.len(),
            writable: access == Access::Write,
        })
    }

    fn estimate(&self, _stream: StreamId, iova: Iova, _access: AccessKind) -> ResolveEstimate {
        match self.resolver.likely_cost(va(iova)) {
            Ok(Likely::Present) => ResolveEstimate::Minor {
                expected_ns: PRESENT_NS,
            },
            Ok(Likely::Minor) => ResolveEstimate::Minor {
                expected_ns: MINOR_FAULT_NS,
            },
            Ok(Likely::Major) => ResolveEstimate::Major,
            Ok(Likely::Unknown) | Err(_) => ResolveEstimate::Unknown,
        }
    }

    fn resolve(
        &mut self,
        _stream: StreamId,
        iova: Iova,
        access: AccessKind,
    ) -> Result<ResolvedPage, ResolveError> {
        let want = match access {
            AccessKind::Read => Access::Read,
            AccessKind::Write => Access::Write,
        };
        let r = self
            .resolver
            .resolve(va(iova), want)
            .map_err(|e| ResolveError(GLUE_ERROR_BASE | (e.code() & 0xffff)))?;
        let frame = r.frame.ok_or(ResolveError(NO_FRAME))?;
        // Writable for the device only if the region was registered for device writes: a
        // read may be faulted in for write (stable frames), which must not widen the
        // device's rights.
        let registered_for_write = self
            .resolver
            .region_of(va(iova))
            .is_some_and(|(_, access)| access == Access::Write);
        let writable = r.faulted_for == Access::Write && registered_for_write;
        let permissions = if writable {
            Permissions::READ_WRITE
        } else {
            Permissions::READ_ONLY
        };
        // The SMMU's tables map 4 KiB pages and 2 MiB blocks (`FaultResolver`): a 1 GiB
        // hugetlb page is handed out as the 2 MiB block of it that holds the faulting address.
        let (frame, size) = match r.size {
            PageSize::Size1G => {
                let block = PageSize::Size2M.bytes();
                let offset = iova
                    .as_u64()
                    .checked_sub(r.mapping.start().as_u64())
                    .ok_or(ResolveError(NO_FRAME))?
                    & !(block - 1);
                let frame = frame
                    .checked_add(offset)
                    .map_err(|_| ResolveError(NO_FRAME))?;
                (frame, PageSize::Size2M)
            }
            size => (frame, size),
        };
        Ok(ResolvedPage {
            frame,
            size,
            attributes: Attributes::normal(permissions),
            cost: match r.kind {
                FaultKind::Major => FaultCost::Major,
                FaultKind::Minor | FaultKind::AlreadyPresent => FaultCost::Minor,
            },
        })
    }
}
