//! The one fault service: what every SMMU driver does with a fault record, written once.
//!
//! A driver takes records its own way (SMMUv2 reads a context bank's FSR and syndrome
//! registers, SMMUv3 drains its event queue); from the record on, the sequence is the same
//! for both, and [`FaultHandler::service`] runs it over the [`FaultControl`] a driver
//! implements:
//!
//! 1. **decide** ([`FaultHandler::decide_for`]): the stream's declared
//!    [`StreamFaultConfig`], the handler's classification, the policy. If deciding fails, a
//!    stalled transaction is terminated before the error is returned: a stall is always
//!    answered.
//! 2. **first half** ([`FaultHandler::first_half`]): a stalled transaction that will not be
//!    resumed is terminated now, so a slow resolution never holds the stall (and the master
//!    sees its abort and retransmits).
//! 3. **second half** ([`FaultHandler::second_half`]): make the page present and map it
//!    ([`FaultHandler::fix`] with the context's TLB maintenance), issue and complete the fix's
//!    invalidations, then retry a stalled transaction the policy resumes, only once the new
//!    mapping is certainly visible (otherwise it is terminated).
//!
//! Callers that model time (the virtual QFDB) run the three steps at different moments;
//! everyone else calls [`FaultHandler::service`], or [`FaultHandler::service_pending`], the
//! loop over what a [`FaultSource`] reports (SMMUv2: the context banks' FSRs; SMMUv3: the
//! event queue), with a [`FaultVisitor`] that says which records to service (attribution,
//! docs/mmu500.md §2.3) and hears what became of each.

use core::ops::Deref;

use hal::dma::DmaMemory;

use super::{
    FaultDecision, FaultHandler, FaultOutcome, FaultPlan, FaultPolicy, FaultRecord, FaultResolver,
    StreamFaultConfig, StreamId,
};
use crate::Result;
use crate::pagetable::{Invalidations, PageTable, TlbMaintenance};

/// What the fault service needs of an SMMU driver.
pub trait FaultControl {
    /// TLB maintenance of one translation context.
    type Tlb<'s>: TlbMaintenance
    where
        Self: 's;

    /// Retries (`retry`) or terminates the stalled transaction `record` describes. Called only
    /// for records with a stall tag.
    fn answer_stall(&mut self, record: &FaultRecord, retry: bool) -> Result<()>;

    /// What `stream` declared about faults (stall tolerance and budget).
    fn stream_config(&self, stream: StreamId) -> StreamFaultConfig;

    /// TLB maintenance of the context that translated `record`'s transaction.
    fn context_tlb(&mut self, record: &FaultRecord) -> Result<Self::Tlb<'_>>;
}

/// One fault as an SMMU reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakenFault {
    /// The decoded record; `None` when the SMMU said a fault happened but not which (SMMUv2
    /// FSR.MULTI alone; an SMMUv3 record that does not decode).
    pub record: Option<FaultRecord>,
    /// Other faults' records were lost (SMMUv2 FSR.MULTI; SMMUv3 event-queue overflow).
    pub lost: bool,
}

/// Where faults come from: the other half of the SMMU trait.
pub trait FaultSource: FaultControl {
    /// Takes the next fault the SMMU reported, `None` when none is pending. Taking it clears
    /// it from the SMMU (SMMUv2: FSR written back; SMMUv3: the queue entry consumed).
    fn take_fault(&mut self) -> Result<Option<TakenFault>>;
}

/// What the caller of [`FaultHandler::service_pending`] decides and learns.
pub trait FaultVisitor {
    /// Whether to service `fault`'s record. A record refused here is not decided on at all
    /// (nothing is looked up by its stream or address); a stalled transaction of it is
    /// terminated.
    fn wants(&mut self, fault: &TakenFault) -> bool;

    /// What became of `fault`: its outcome if it was serviced.
    fn done(&mut self, fault: &TakenFault, outcome: Option<&FaultOutcome>);
}

impl<P: FaultPolicy> FaultHandler<P> {
    /// Services at most `limit` pending faults of `smmu`, one by one: take, ask `visitor`,
    /// [`service`](Self::service) or terminate, tell `visitor`. Returns how many were taken.
    pub fn service_pending<S, R, M, V>(
        &mut self,
        smmu: &mut S,
        resolver: &mut R,
        table: &mut PageTable<M>,
        limit: usize,
        visitor: &mut V,
    ) -> Result<usize>
    where
        S: FaultSource + ?Sized,
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
        V: FaultVisitor + ?Sized,
    {
        for taken in 0..limit {
            let Some(fault) = smmu.take_fault()? else {
                return Ok(taken);
            };
            let outcome = match &fault.record {
                Some(record) if visitor.wants(&fault) => {
                    Some(self.service(smmu, record, resolver, table)?)
                }
                Some(record) => {
                    if record.is_stalled() {
                        smmu.answer_stall(record, false)?;
                    }
                    None
                }
                None => None,
            };
            visitor.done(&fault, outcome.as_ref());
        }
        Ok(limit)
    }

    /// Services one record end to end: [`decide_for`](Self::decide_for),
    /// [`first_half`](Self::first_half), [`second_half`](Self::second_half) (module docs).
    ///
    /// The outcome's decision tells the caller what its master must do: `Resume`, nothing
    /// (the transaction was retried); `TerminateAndRetransmit`, issue the transfer again;
    /// `Abort`, fail it (the error says why). `Err` is a failure of the driver itself.
    pub fn service<S, R, M>(
        &mut self,
        smmu: &mut S,
        record: &FaultRecord,
        resolver: &mut R,
        table: &mut PageTable<M>,
    ) -> Result<FaultOutcome>
    where
        S: FaultControl + ?Sized,
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
    {
        let plan = self.decide_for(smmu, record, resolver, table)?;
        self.first_half(smmu, &plan)?;
        self.second_half(smmu, &plan, resolver, table)
    }

    /// Step 1: decides with the stream's declared configuration. A stalled transaction is
    /// terminated if deciding fails.
    pub fn decide_for<S, R, M>(
        &mut self,
        smmu: &mut S,
        record: &FaultRecord,
        resolver: &R,
        table: &PageTable<M>,
    ) -> Result<FaultPlan>
    where
        S: FaultControl + ?Sized,
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
    {
        let stream = smmu.stream_config(record.stream);
        self.decide(record, &stream, resolver, table)
            .inspect_err(|_| {
                if record.is_stalled() {
                    // The decision's error is the one to report; the stall is answered
                    // whatever happens to the terminate.
                    let _ = smmu.answer_stall(record, false);
                }
            })
    }

    /// Step 2: terminates a stalled transaction that `plan` does not resume.
    pub fn first_half<S>(&mut self, smmu: &mut S, plan: &FaultPlan) -> Result<()>
    where
        S: FaultControl + ?Sized,
    {
        if plan.record.is_stalled() && plan.decision != FaultDecision::Resume {
            smmu.answer_stall(&plan.record, false)?;
        }
        Ok(())
    }

    /// Step 3: fixes the mapping, completes its invalidations, then retries a stalled
    /// transaction the plan resumes (or terminates it if the fix or the invalidation
    /// failed). A failed fix turns the decision into `Abort` with the fix's error.
    pub fn second_half<S, R, M>(
        &mut self,
        smmu: &mut S,
        plan: &FaultPlan,
        resolver: &mut R,
        table: &mut PageTable<M>,
    ) -> Result<FaultOutcome>
    where
        S: FaultControl + ?Sized,
        R: FaultResolver + ?Sized,
        M: Deref<Target: DmaMemory>,
    {
        let record = &plan.record;
        let mut outcome = FaultOutcome {
            decision: plan.decision,
            estimate: plan.estimate,
            mapped: None,
            invalidations: Invalidations::new(),
        };
        if let FaultDecision::Abort(_) = plan.decision {
            return Ok(outcome);
        }
        let resume_pending = record.is_stalled() && plan.decision == FaultDecision::Resume;
        let terminate = |smmu: &mut S| {
            if resume_pending {
                smmu.answer_stall(record, false)
            } else {
                Ok(())
            }
        };
        let fixed = smmu
            .context_tlb(record)
            .map(|mut tlb| self.fix(plan, resolver, table, &mut tlb));
        let fixed = match fixed {
            Ok(fixed) => fixed,
            Err(e) => {
                terminate(smmu)?;
                return Err(e);
            }
        };
        let fix = match fixed {
            Ok(fix) => fix,
            Err(e) => {
                terminate(smmu)?;
                outcome.decision = FaultDecision::Abort(e);
                return Ok(outcome);
            }
        };
        let invalidated = if fix.invalidations.is_empty() {
            Ok(())
        } else {
            smmu.context_tlb(record)
                .and_then(|mut tlb| tlb.invalidate_now(&fix.invalidations))
        };
        if resume_pending {
            // Retry only once the new mapping is certainly visible; otherwise terminate.
            smmu.answer_stall(record, invalidated.is_ok())?;
        }
        invalidated?;
        outcome.mapped = fix.mapped;
        outcome.invalidations = fix.invalidations;
        Ok(outcome)
    }
}
