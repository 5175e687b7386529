//! The node software around the NPE drivers of the board: what a driver asks of its node
//! ([`NpeHost`]: the memory manager's view of a page, resolutions, page versions), the TLB
//! maintenance of every context bank over the shared table, and the fault service's tally.

use std::collections::HashMap;
use std::sync::Arc;

use boards::zynqmp::pl::NpeInstance;
use dma_engine::npe::{FaultClass, NpeHost};
use hal::Iova;
use hal::dma::HostDma;
use protocol::{Access, FaultReason, Generation};
use smmu_driver::SmmuError;
use smmu_driver::fault::{FaultDecision, FaultOutcome, FaultResolver, FaultVisitor, TakenFault};
use smmu_driver::pagetable::{Invalidations, PageTable, TlbMaintenance};
use smmu_driver::v2::ContextBank;

use super::{BoardPager, PAGE, ServiceCounts, Smmu};

/// A resolution the NPE driver asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub engine: usize,
    pub pdid: u16,
    pub va: u64,
    pub access: Access,
}

/// Page versions for the driver's write check (docs/dma-engine.md §5.2): a generation that
/// grows at each invalidation, and the generation of each page's last one.
#[derive(Debug, Default)]
pub(super) struct Versions {
    pub generation: u64,
    pub invalidated: HashMap<u64, u64>,
}

/// The node as engine `engine`'s driver sees it.
pub(super) struct Host<'a, 'd> {
    pub npe: NpeInstance,
    pub engine: usize,
    pub pager: &'a BoardPager<'d>,
    pub table: &'a PageTable<Arc<HostDma>>,
    pub versions: &'a Versions,
    pub requests: &'a mut Vec<Request>,
}

impl NpeHost for Host<'_, '_> {
    fn classify(&mut self, pdid: u16, va: u64, access: Access) -> FaultClass {
        let write = access == Access::Write;
        let stream = self.npe.stream_of(pdid, write);
        let iova = Iova::new(va);
        let Some(region) = self.pager.region(stream, iova) else {
            return FaultClass::Denied(FaultReason::OutOfRegion);
        };
        if write && !region.writable {
            return FaultClass::Denied(FaultReason::Permission);
        }
        match self.table.translate(iova) {
            Ok(Some(_)) => FaultClass::Present,
            _ => FaultClass::Resolvable,
        }
    }

    fn request_resolution(&mut self, pdid: u16, va: u64, access: Access) {
        let req = Request {
            engine: self.engine,
            pdid,
            va,
            access,
        };
        if !self.requests.contains(&req) {
            self.requests.push(req);
        }
    }

    fn snapshot(&self, _pdid: u16) -> Generation {
        Generation(self.versions.generation)
    }

    fn check(
        &self,
        pdid: u16,
        va: u64,
        len: u64,
        since: Generation,
    ) -> core::result::Result<(), FaultReason> {
        let stream = self.npe.stream_of(pdid, true);
        let end = va.checked_add(len).ok_or(FaultReason::OutOfRegion)?;
        let mut page = va & !(PAGE - 1);
        while page < end {
            if self.pager.region(stream, Iova::new(page.max(va))).is_none() {
                return Err(FaultReason::OutOfRegion);
            }
            if !matches!(self.table.translate(Iova::new(page)), Ok(Some(_))) {
                return Err(FaultReason::NotPresent);
            }
            if self.versions.invalidated.get(&page).copied().unwrap_or(0) > since.0 {
                return Err(FaultReason::PageChanged);
            }
            page += PAGE;
        }
        Ok(())
    }
}

/// TLB maintenance of every bank over the shared table (each caches it under its ASID).
pub(super) struct AllBanks<'a> {
    pub smmu: &'a mut Smmu,
    pub banks: &'a [ContextBank],
}

impl TlbMaintenance for AllBanks<'_> {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> smmu_driver::Result<()> {
        for &cb in self.banks {
            self.smmu.tlb(cb)?.invalidate_now(invalidations)?;
        }
        Ok(())
    }
}

/// Counts what the fault service did; services every record (one address space, every
/// record is its own transfer's).
pub(super) struct Tally<'a>(pub &'a mut ServiceCounts);

impl FaultVisitor for Tally<'_> {
    fn wants(&mut self, _fault: &TakenFault) -> bool {
        true
    }

    fn done(&mut self, fault: &TakenFault, outcome: Option<&FaultOutcome>) {
        if fault.lost {
            self.0.lost += 1;
        }
        if fault.record.is_some() {
            self.0.records += 1;
        }
        match outcome.map(|o| &o.decision) {
            Some(FaultDecision::Resume) => self.0.resumed += 1,
            Some(FaultDecision::TerminateAndRetransmit) => self.0.retransmit += 1,
            Some(FaultDecision::Abort(_)) => self.0.aborted += 1,
            None => {}
        }
    }
}

/// The protocol's reason for a refusal of the fault path.
pub(super) fn reason_of(e: &SmmuError) -> FaultReason {
    match e {
        SmmuError::WriteToReadOnlyRegion { .. } => FaultReason::Permission,
        _ => FaultReason::OutOfRegion,
    }
}
