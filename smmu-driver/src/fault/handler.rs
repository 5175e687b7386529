//! Ties resolver, policy and page table together.

use core::ops::Deref;

use hal::dma::DmaMemory;
use hal::{Iova, PageSize};

use super::attribution::InFlightAccess;
use super::policy::recoverable;
use super::{
    AccessKind, FaultCost, FaultDecision, FaultEstimate, FaultKind, FaultPolicy, FaultRecord,
    FaultResolver, PolicyInput, RawSyndrome, ResolvedPage, SmmuId, StreamFaultConfig, abort_reason,
};
use crate::pagetable::Attributes;
use crate::pagetable::{Invalidations, PageTable, TlbInvalidation, TlbMaintenance};
use crate::walk::{self, Leaf};
use crate::{Result, SmmuError};

/// A fault with what was found out about it and what to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    /// The fault.
    pub record: FaultRecord,
    /// What the handler found out.
    pub estimate: FaultEstimate,
    /// What to do (after the handler's overrides).
    pub decision: FaultDecision,
}

/// What [`FaultHandler::fix`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixOutcome {
    /// The page mapped (or re-permissioned), or `None` if the page was already present.
    pub mapped: Option<ResolvedPage>,
    /// Invalidations the driver must issue (and sync) before resuming or retransmitting.
    pub invalidations: Invalidations,
}

/// The result of [`FaultHandler::handle`]: the final decision, after a failed fix turned it
/// into an abort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultOutcome {
    /// What to do with the transaction.
    pub decision: FaultDecision,
    /// What the handler found out.
    pub estimate: FaultEstimate,
    /// The page mapped, if any.
    pub mapped: Option<ResolvedPage>,
    /// Invalidations to issue (and sync) before resuming or retransmitting.
    pub invalidations: Invalidations,
}

/// Counters for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Records decided.
    pub faults: u64,
    /// Decided `Resume`.
    pub resumed: u64,
    /// Decided `TerminateAndRetransmit`.
    pub retransmitted: u64,
    /// Decided `Abort`.
    pub aborted: u64,
    /// Faults found already fixed.
    pub spurious: u64,
    /// Resolutions that were minor.
    pub minor: u64,
    /// Resolutions that were major.
    pub major: u64,
    /// Fixes that failed (resolver error, bad page, table error).
    pub fix_failures: u64,
    /// Policy decisions the handler overrode.
    pub policy_overrides: u64,
    /// Pages of suspect transfers looked at by [`FaultHandler::resolve_range`].
    pub range_pages: u64,
}

/// What [`FaultHandler::resolve_range`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeResolution {
    /// Pages looked at.
    pub pages: u32,
    /// Pages that were made present and mapped (the others were already mapped).
    pub mapped: u32,
    /// Of those, the minor resolutions.
    pub minor: u32,
    /// Of those, the major resolutions.
    pub major: u32,
    /// The first page the fault path refused (outside every region, a write to a read-only
    /// region, a failed resolution): the transfer that needs the range must fail with it.
    /// Pages after it were not looked at.
    pub abort: Option<SmmuError>,
}

/// The fault handler: one per SMMU (or per context), generic over the policy.
#[derive(Clone, Debug)]
pub struct FaultHandler<P> {
    policy: P,
    stats: FaultStats,
}

impl<P: FaultPolicy> FaultHandler<P> {
    /// A handler with `policy`.
    pub fn new(policy: P) -> Self {
        Self {
            policy,
            stats: FaultStats::default(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The counters.
    pub fn stats(&self) -> &FaultStats {
        &self.stats
    }

    /// Classifies `record` and decides what to do with it. Reads the table and asks the
    /// resolver for its estimate; changes nothing.
    pub fn decide<R, M>(
        &mut self,
        record: &FaultRecord,
        stream: &StreamFaultConfig,
        resolver: &R,
        table: &PageTable<M>,
    ) -> Result<FaultPlan>
    where
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
    {
        self.stats.faults += 1;
        let estimate = estimate(record, resolver, table)?;
        let input = PolicyInput {
            record,
            stall_tolerant: stream.stall_tolerant,
            stalled: record.is_stalled(),
            estimate,
            stall_budget_ns: stream.stall_budget_ns,
        };
        let proposed = self.policy.decide(&input);
        let decision = match (abort_reason(record, &estimate), proposed) {
            (Some(required), FaultDecision::Abort(_)) => FaultDecision::Abort(required),
            (Some(required), _) => {
                self.stats.policy_overrides += 1;
                FaultDecision::Abort(required)
            }
            (None, FaultDecision::Resume) if !(input.stalled && input.stall_tolerant) => {
                self.stats.policy_overrides += 1;
                FaultDecision::TerminateAndRetransmit
            }
            (None, other) => other,
        };
        match decision {
            FaultDecision::Resume => self.stats.resumed += 1,
            FaultDecision::TerminateAndRetransmit => self.stats.retransmitted += 1,
            FaultDecision::Abort(_) => self.stats.aborted += 1,
        }
        Ok(FaultPlan {
            record: *record,
            estimate,
            decision,
        })
    }

    /// Makes the page of a `Resume` or `TerminateAndRetransmit` plan present and maps it.
    ///
    /// For an `Abort` plan it returns the abort's error and touches nothing. It re-checks the
    /// region (it may have been unregistered since [`decide`](Self::decide)) and the
    /// resolver's page (size, alignment, inside the region, allows the access, AF set).
    ///
    /// If the table maps something else at the IOVA (another frame, size or memory type),
    /// the old mapping is unmapped and invalidated through `tlb` before the new one is
    /// written (break-before-make). If only permissions differ they are changed in place.
    pub fn fix<R, M, T>(
        &mut self,
        plan: &FaultPlan,
        resolver: &mut R,
        table: &mut PageTable<M>,
        tlb: &mut T,
    ) -> Result<FixOutcome>
    where
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        let result = fix_inner(plan, resolver, table, tlb);
        match &result {
            Ok(FixOutcome { mapped: None, .. }) => self.stats.spurious += 1,
            Ok(FixOutcome {
                mapped: Some(page), ..
            }) => match page.cost {
                FaultCost::Minor => self.stats.minor += 1,
                FaultCost::Major => self.stats.major += 1,
            },
            Err(_) => {
                if !matches!(plan.decision, FaultDecision::Abort(_)) {
                    self.stats.fix_failures += 1;
                }
            }
        }
        result
    }

    /// [`decide`](Self::decide) then, unless aborting, [`fix`](Self::fix). A failed fix
    /// turns the decision into `Abort` with the fix's error.
    ///
    /// Use it for transactions that are not stalled. For a stalled transaction that will be
    /// terminated, call `decide`, terminate, then `fix`, so a slow resolution does not hold
    /// the stall.
    pub fn handle<R, M, T>(
        &mut self,
        record: &FaultRecord,
        stream: &StreamFaultConfig,
        resolver: &mut R,
        table: &mut PageTable<M>,
        tlb: &mut T,
    ) -> Result<FaultOutcome>
    where
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        let plan = self.decide(record, stream, resolver, table)?;
        let mut outcome = FaultOutcome {
            decision: plan.decision,
            estimate: plan.estimate,
            mapped: None,
            invalidations: Invalidations::new(),
        };
        if matches!(plan.decision, FaultDecision::Abort(_)) {
            return Ok(outcome);
        }
        match self.fix(&plan, resolver, table, tlb) {
            Ok(fixed) => {
                outcome.mapped = fixed.mapped;
                outcome.invalidations = fixed.invalidations;
            }
            Err(error) => outcome.decision = FaultDecision::Abort(error),
        }
        Ok(outcome)
    }
}

impl<P: FaultPolicy> FaultHandler<P> {
    /// Makes every page of `range` present for `access`, as if each had faulted without a
    /// stall: [`handle`](Self::handle) with a record that has no syndrome (an unprivileged
    /// data access), then the fix's invalidations through `tlb`.
    ///
    /// This is what a transfer that a fault could not be attributed to needs before it is
    /// sent again (see [`attribution`](super::attribution)): resending it alone could fault
    /// again with no usable record, for ever. Pages already mapped with enough permission
    /// are left as they are. The first page the fault path refuses ends the walk and is
    /// returned in [`RangeResolution::abort`], not as an `Err`: `Err` is kept for failures
    /// of the driver itself (table memory, TLB maintenance).
    #[allow(clippy::too_many_arguments)]
    pub fn resolve_range<R, M, T>(
        &mut self,
        smmu: SmmuId,
        range: &InFlightAccess,
        access: AccessKind,
        stream: &StreamFaultConfig,
        resolver: &mut R,
        table: &mut PageTable<M>,
        tlb: &mut T,
    ) -> Result<RangeResolution>
    where
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        let mut done = RangeResolution::default();
        if range.len == 0 {
            return Ok(done);
        }
        let page = PageSize::Size4K.bytes();
        let first = range.start.align_down(PageSize::Size4K).as_u64();
        let last =
            range
                .start
                .as_u64()
                .checked_add(range.len - 1)
                .ok_or(SmmuError::InvalidConfig {
                    what: "a transfer's range wraps around the address space",
                })?
                & !(page - 1);
        let mut at = first;
        loop {
            // The first page at the transfer's own address, the others at their start.
            let iova = Iova::new(at.max(range.start.as_u64()));
            let record = FaultRecord {
                smmu,
                stream: range.stream,
                iova,
                access,
                kind: FaultKind::Translation,
                level: None,
                stall: None,
                syndrome: RawSyndrome::default(),
            };
            self.stats.range_pages += 1;
            done.pages += 1;
            let outcome = self.handle(&record, stream, resolver, table, tlb)?;
            if let FaultDecision::Abort(error) = outcome.decision {
                done.abort = Some(error);
                return Ok(done);
            }
            if !outcome.invalidations.is_empty() {
                tlb.invalidate_now(&outcome.invalidations)?;
            }
            if let Some(page) = outcome.mapped {
                done.mapped += 1;
                match page.cost {
                    FaultCost::Minor => done.minor += 1,
                    FaultCost::Major => done.major += 1,
                }
            }
            if at == last {
                return Ok(done);
            }
            at += page;
        }
    }
}

/// Whether `leaf` already allows `record`'s access: AF set, write permission for writes,
/// AP\[1\] for an unprivileged transaction, execute permission for a fetch (a leaf that
/// allows only a privileged read does not fix an unprivileged master's fault, and resuming
/// it would fault again for ever).
fn allows(leaf: &Leaf, record: &FaultRecord) -> bool {
    walk::check_access(leaf, &record.access_request(), true).is_ok()
}

/// Whether attributes a resolver handed out allow `record`'s access.
fn attributes_allow(attributes: &Attributes, record: &FaultRecord) -> bool {
    let p = &attributes.permissions;
    let request = record.access_request();
    p.accessed
        && (!request.write || p.writable)
        && (request.privileged || p.unprivileged)
        && !(request.instruction && p.execute_never)
}

fn estimate<R, M>(record: &FaultRecord, resolver: &R, table: &PageTable<M>) -> Result<FaultEstimate>
where
    R: FaultResolver + ?Sized,
    M: Deref<Target: DmaMemory>,
{
    if !recoverable(record.kind) {
        return Ok(FaultEstimate::Unrecoverable);
    }
    let Some(region) = resolver.region(record.stream, record.iova) else {
        return Ok(FaultEstimate::OutsideRegion);
    };
    if record.is_write() && !region.writable {
        return Ok(FaultEstimate::WriteToReadOnly);
    }
    if let Some(leaf) = table.translate(record.iova)?
        && allows(&leaf, record)
    {
        return Ok(FaultEstimate::Present {
            stale_tlb: record.kind == FaultKind::Permission,
        });
    }
    Ok(
        match resolver.estimate(record.stream, record.iova, record.access) {
            super::ResolveEstimate::Minor { expected_ns } => FaultEstimate::Minor { expected_ns },
            super::ResolveEstimate::Major => FaultEstimate::Major,
            super::ResolveEstimate::Unknown => FaultEstimate::Unknown,
        },
    )
}

fn fix_inner<R, M, T>(
    plan: &FaultPlan,
    resolver: &mut R,
    table: &mut PageTable<M>,
    tlb: &mut T,
) -> Result<FixOutcome>
where
    R: FaultResolver + ?Sized,
    M: Deref<Target: DmaMemory>,
    T: TlbMaintenance + ?Sized,
{
    if let FaultDecision::Abort(error) = plan.decision {
        return Err(error);
    }
    let record = &plan.record;
    if let Some(error) = abort_reason(record, &plan.estimate) {
        return Err(error);
    }
    let stream = record.stream.0;
    let iova = record.iova;
    // The region may have gone since `decide`.
    let region = resolver
        .region(record.stream, iova)
        .ok_or(SmmuError::OutsideRegisteredRegion { stream, iova })?;
    if record.is_write() && !region.writable {
        return Err(SmmuError::WriteToReadOnlyRegion { stream, iova });
    }
    // Already fixed (a duplicate record, or fixed since `decide`)?
    if let Some(leaf) = table.translate(iova)?
        && allows(&leaf, record)
    {
        let mut invalidations = Invalidations::new();
        if record.kind == FaultKind::Permission {
            invalidations.push(TlbInvalidation {
                start: leaf.base,
                count: 1,
                granule: leaf.size,
                leaf_only: true,
            });
        }
        return Ok(FixOutcome {
            mapped: None,
            invalidations,
        });
    }

    let page = resolver
        .resolve(record.stream, iova, record.access)
        .map_err(|e| SmmuError::ResolveFailed {
            stream,
            iova,
            code: e.0,
        })?;
    let contract = SmmuError::ResolverContract { stream, iova };
    if page.size == PageSize::Size1G || !page.frame.is_aligned(page.size) {
        return Err(contract);
    }
    let base = iova.align_down(page.size);
    if !region.contains_range(base, page.size.bytes())
        || !attributes_allow(&page.attributes, record)
    {
        return Err(contract);
    }

    let invalidations = install(table, tlb, base, &page)?;
    Ok(FixOutcome {
        mapped: Some(page),
        invalidations,
    })
}

/// Maps `page` at `base`, replacing whatever is there.
fn install<M, T>(
    table: &mut PageTable<M>,
    tlb: &mut T,
    base: Iova,
    page: &ResolvedPage,
) -> Result<Invalidations>
where
    M: Deref<Target: DmaMemory>,
    T: TlbMaintenance + ?Sized,
{
    let mut tlb = DynTlb(tlb);
    let current = table.translate(base)?;
    let same_mapping = current.is_some_and(|leaf| {
        leaf.base == base
            && leaf.size == page.size
            && leaf.output == page.frame
            && leaf
                .attributes()
                .is_some_and(|a| !a.needs_break_before_make(&page.attributes))
    });
    if same_mapping {
        return table.protect(
            base,
            page.size.bytes(),
            page.attributes.permissions,
            &mut tlb,
        );
    }
    // Something else may be mapped in the range: break it and complete its invalidation
    // before making the new mapping. A 4 KiB page whose translation is absent has nothing
    // to break (the common fault: skipping the range walk saves about a third of the fault
    // path, see the SMMUv3 benchmark in docs/smmu-driver.md).
    if !(page.size == PageSize::Size4K && current.is_none()) {
        let broken = table.unmap(base, page.size.bytes(), &mut tlb)?;
        if !broken.is_empty() {
            tlb.invalidate_now(&broken)?;
        }
    }
    table.map(base, page.frame, page.size, &page.attributes, &mut tlb)
}

/// Lets an unsized `TlbMaintenance` be passed where `impl TlbMaintenance` is expected.
struct DynTlb<'a, T: TlbMaintenance + ?Sized>(&'a mut T);

impl<T: TlbMaintenance + ?Sized> TlbMaintenance for DynTlb<'_, T> {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()> {
        self.0.invalidate_now(invalidations)
    }
}
