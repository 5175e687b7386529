//! SMMUv2 fault handling: global faults (sGFSR), context faults (FSR, FAR, FSYNR0,
//! CBFRSYNRA), RESUME, and the fault path tying them to the shared [`FaultHandler`].
//!
//! # The stall sequence, and why
//!
//! MMU-500 keeps the context interrupt asserted while FSR.SS is set, and ignores a RESUME
//! write while FSR holds any bit other than SS (Linux `arm_smmu_context_fault` since the
//! 2025 stall fixes; docs/mmu500.md §8). So for a stalled fault:
//!
//! 1. read FSR, FSYNR0, FSYNR1, FAR, CBFRSYNRA;
//! 2. mask SCTLR.CFIE: the shared ZynqMP line (SPI 155) would otherwise storm until RESUME;
//! 3. write FSR back with exactly the bits read (W1C): this must happen *before* RESUME, and a
//!    read-modify-write could clear a fault recorded between the read and the write;
//! 4. decide, terminate first if the decision is not to resume (a slow resolution must not
//!    hold the stall), fix the mapping, invalidate and sync the TLB;
//! 5. write RESUME (TnR = retry or terminate), check that the stall was released (FSR.SS
//!    clear, or a new fault recorded after it), then restore CFIE. MULTI (a fault with no
//!    record) is cleared first; a fault bit already in FSR before RESUME is a record nobody
//!    took, so RESUME would be ignored: [`SmmuV2::resume`] then writes nothing and returns
//!    [`SmmuError::ResumeIgnored`], and the caller takes that record (step 1) and resumes
//!    again.
//!
//! A terminated fault needs steps 1, 3 and 4 only; the master saw an abort (SCTLR.CFRE) and
//! retransmits.

use hal::Iova;
use hal::barrier::Barrier;
use hal::delay::DelayNs;
use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};

use super::regs::{FSR, FSYNR0, RESUME, SGFSR};
use super::tlb::ContextTlb;
use super::{ContextBank, SmmuV2};
use crate::fault::{
    AccessKind, FaultControl, FaultDecision, FaultEstimate, FaultHandler, FaultKind, FaultPolicy,
    FaultRecord, FaultResolver, FaultSource, RawSyndrome, ResolvedPage, SmmuId, StallTag, StreamId,
    TakenFault,
};
use crate::pagetable::PageTable;
use crate::{Result, SmmuError};

/// FSR fault bits 8:1 (TF, AFF, PF, EF, TLBMCF, TLBLKF, ASF, UUT).
pub const FSR_FAULT_BITS: u32 = 0x1fe;
/// FSR.SS: a transaction is stalled.
pub const FSR_SS: u32 = 1 << 30;
/// FSR.MULTI: a further fault was not recorded.
pub const FSR_MULTI: u32 = 1 << 31;
/// Every W1C bit of FSR (Linux `ARM_SMMU_FSR_FAULT`), written at reset and allocation.
pub const FSR_W1C: u32 = FSR_FAULT_BITS | FSR_SS | FSR_MULTI;

const _: () = assert!(
    FSR::TF::SET.value
        | FSR::AFF::SET.value
        | FSR::PF::SET.value
        | FSR::EF::SET.value
        | FSR::TLBMCF::SET.value
        | FSR::TLBLKF::SET.value
        | FSR::ASF::SET.value
        | FSR::UUT::SET.value
        == FSR_FAULT_BITS
);
const _: () = assert!(FSR::SS::SET.value == FSR_SS && FSR::MULTI::SET.value == FSR_MULTI);

/// What RESUME does with the stalled transaction (RESUME.TnR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResumeAction {
    /// Retry it (TnR = 0): it is translated again.
    Retry,
    /// Terminate it (TnR = 1): the master gets an abort.
    Terminate,
}

/// A global fault, as sGFSR and its syndrome registers reported it (already cleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalFault {
    /// sGFSR as read.
    pub gfsr: u32,
    /// sGFAR.
    pub gfar: u64,
    /// sGFSYNR0.
    pub gfsynr0: u32,
    /// sGFSYNR1 (stream ID in 15:0).
    pub gfsynr1: u32,
    /// sGFSYNR2.
    pub gfsynr2: u32,
}

impl GlobalFault {
    /// The stream of the faulting transaction (sGFSYNR1\[15:0\]).
    pub fn stream(&self) -> StreamId {
        StreamId(self.gfsynr1 & 0xffff)
    }

    /// An unmatched stream was blocked (sGFSR.USF; Linux "Blocked unknown Stream ID").
    pub fn unidentified_stream(&self) -> bool {
        self.gfsr & SGFSR::USF::SET.value != 0
    }

    /// Further global faults were not recorded.
    pub fn multi(&self) -> bool {
        self.gfsr & SGFSR::MULTI::SET.value != 0
    }
}

/// A context fault as read from the bank (FSR already cleared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextFault {
    /// The context bank.
    pub context: ContextBank,
    /// FSR as read.
    pub fsr: u32,
    /// FSYNR0.
    pub fsynr0: u32,
    /// FSYNR1.
    pub fsynr1: u32,
    /// FAR.
    pub far: u64,
    /// CBFRSYNRA.
    pub cbfrsynra: u32,
    /// The decoded fault; `None` when FSR held only MULTI (faults happened, none recorded).
    pub record: Option<FaultRecord>,
}

impl ContextFault {
    /// FSR.MULTI was set: at least one further fault's syndrome was lost. Masters of the
    /// context that saw an abort must retransmit even without a record of their own.
    pub fn multi(&self) -> bool {
        self.fsr & FSR_MULTI != 0
    }

    /// FSR.SS was set: the recorded transaction is stalled.
    pub fn stalled(&self) -> bool {
        self.fsr & FSR_SS != 0
    }
}

/// What [`SmmuV2::service_context`] did with one context fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServicedFault {
    /// The fault as read.
    pub fault: ContextFault,
    /// The final decision (`None` if there was no record, only MULTI).
    pub decision: Option<FaultDecision>,
    /// What the handler found out (`None` without a record).
    pub estimate: Option<FaultEstimate>,
    /// The page mapped, if any.
    pub mapped: Option<ResolvedPage>,
}

impl ServicedFault {
    /// The faulting stream, if recorded.
    pub fn stream(&self) -> Option<StreamId> {
        self.fault.record.map(|r| r.stream)
    }

    /// Whether the transaction was resumed (retried).
    pub fn resumed(&self) -> bool {
        self.decision == Some(FaultDecision::Resume)
    }
}

/// Decodes a context bank's fault registers into a [`FaultRecord`]; `None` if FSR has no
/// fault bit. The kind follows the first of TF, AFF, PF, ASF, EF that is set; TLB conflicts,
/// lock faults and unsupported upstream transactions are [`FaultKind::Unknown`]. The level is
/// FSYNR0.PLVL for walk faults. `stream_mask` keeps the implemented stream ID bits.
#[allow(clippy::too_many_arguments)]
pub fn decode_context_fault(
    smmu: SmmuId,
    context: u16,
    fsr: u32,
    fsynr0: u32,
    fsynr1: u32,
    far: u64,
    cbfrsynra: u32,
    stream_mask: u32,
) -> Option<FaultRecord> {
    if fsr & FSR_FAULT_BITS == 0 {
        return None;
    }
    let has = |f: u32| fsr & f != 0;
    let kind = if has(FSR::TF::SET.value) {
        FaultKind::Translation
    } else if has(FSR::AFF::SET.value) {
        FaultKind::AccessFlag
    } else if has(FSR::PF::SET.value) {
        FaultKind::Permission
    } else if has(FSR::ASF::SET.value) {
        FaultKind::AddressSize
    } else if has(FSR::EF::SET.value) {
        FaultKind::External
    } else {
        FaultKind::Unknown
    };
    let level = match kind {
        FaultKind::Unknown => None,
        _ => Some((fsynr0 & FSYNR0::PLVL::SET.value) as u8),
    };
    let access = if fsynr0 & FSYNR0::WNR::SET.value != 0 {
        AccessKind::Write
    } else {
        AccessKind::Read
    };
    Some(FaultRecord {
        smmu,
        stream: StreamId(cbfrsynra & stream_mask),
        iova: Iova::new(far),
        access,
        kind,
        level,
        stall: has(FSR_SS).then_some(StallTag(u32::from(context))),
        syndrome: RawSyndrome([
            u64::from(fsr),
            u64::from(fsynr0) | u64::from(fsynr1) << 32,
            far,
            u64::from(cbfrsynra),
        ]),
    })
}

impl<B: RegisterBus, D: DelayNs> SmmuV2<B, D> {
    /// Takes a pending global fault: reads sGFSR and its syndrome and clears exactly the bits
    /// read. `None` if sGFSR is clear.
    pub fn take_global_fault(&mut self) -> Result<Option<GlobalFault>> {
        let gr0 = self.gr0()?;
        let gfsr = gr0.sgfsr().get();
        if gfsr == 0 {
            return Ok(None);
        }
        let fault = GlobalFault {
            gfsr,
            gfar: gr0.sgfar().get(),
            gfsynr0: gr0.sgfsynr0().get(),
            gfsynr1: gr0.sgfsynr1().get(),
            gfsynr2: gr0.sgfsynr2().get(),
        };
        gr0.sgfsr().set(gfsr);
        self.stats.global_faults += 1;
        Ok(Some(fault))
    }

    /// The allocated context banks whose FSR reports a fault (or MULTI): the banks a handler
    /// of the shared interrupt must look at.
    pub fn faulting_contexts(&self) -> impl Iterator<Item = ContextBank> + '_ {
        self.contexts().filter(move |&cb| {
            self.bank_regs(cb.index())
                .map(|r| r.fsr().get() & (FSR_FAULT_BITS | FSR_MULTI) != 0)
                .unwrap_or(false)
        })
    }

    /// Takes the fault recorded in a context bank: steps 1-3 of the stall sequence (module
    /// docs). `None` if FSR has neither a fault bit nor MULTI.
    pub fn take_context_fault(&mut self, cb: ContextBank) -> Result<Option<ContextFault>> {
        let state = *self.context(cb)?;
        let gr1 = self.gr1()?;
        let regs = self.bank_regs(cb.index())?;
        let fsr = regs.fsr().get();
        if fsr & (FSR_FAULT_BITS | FSR_MULTI) == 0 {
            return Ok(None);
        }
        let fsynr0 = regs.fsynr0().get();
        let fsynr1 = regs.fsynr1().get();
        let far = regs.far().get();
        let cbfrsynra = gr1.cbfrsynra(usize::from(cb.index()))?.get();
        let stalled = fsr & FSR_SS != 0;
        if stalled {
            self.write_sctlr(cb, state.sctlr & !Self::cfie_mask())?;
        }
        self.write_fsr_exact(cb, fsr)?;
        let record = decode_context_fault(
            self.smmu_id(),
            cb.index(),
            fsr,
            fsynr0,
            fsynr1,
            far,
            cbfrsynra,
            self.caps.stream_id_mask(),
        );
        let context = self.context_mut(cb)?;
        if stalled {
            // Also without a record (FSR = SS | MULTI): CFIE is masked above, and only a
            // RESUME can release the transaction and restore it.
            context.stall_pending = true;
        }
        if record.is_some() {
            self.stats.context_faults += 1;
        }
        if stalled && record.is_some() {
            self.stats.stalls += 1;
        }
        if fsr & FSR_MULTI != 0 {
            self.stats.multi += 1;
        }
        Ok(Some(ContextFault {
            context: cb,
            fsr,
            fsynr0,
            fsynr1,
            far,
            cbfrsynra,
            record,
        }))
    }

    /// Retries or terminates the stalled transaction of `cb` (step 5 of the stall sequence):
    /// RESUME, a bounded wait until FSR.SS clears, then CFIE is restored.
    ///
    /// MMU-500 ignores RESUME while FSR holds any bit but SS, so what FSR holds decides:
    ///
    /// - **a fault bit before RESUME** (a record nobody took): RESUME would be ignored, so it
    ///   is not written. The driver returns [`SmmuError::ResumeIgnored`] with the FSR it read
    ///   and changes nothing: the stall stays pending and CFIE masked. Clearing those bits
    ///   here would throw the record away (step 3 clears only bits that were read into a
    ///   record); the caller takes it with [`take_context_fault`](Self::take_context_fault),
    ///   services it, and resumes again.
    /// - **MULTI without a fault bit** (a transaction that faulted while this one was stalled:
    ///   held, not recorded): exactly MULTI is cleared, then RESUME. If MULTI shows up again
    ///   with SS still set, the RESUME was ignored (the fault came between the read and the
    ///   write): MULTI is cleared and RESUME written again.
    /// - **SS cleared**: released.
    /// - **a fault bit after RESUME**: the RESUME was accepted (SS cleared) and the retried or a
    ///   released held transaction faulted again; a fault is recorded only while FSR is zero, so
    ///   this record is new (docs/mmu500.md §2.2). Released; the new record raises the
    ///   interrupt once CFIE is restored.
    ///
    /// If the stall is not released in `resume_timeout_us` the driver returns
    /// [`SmmuError::StallNotReleased`] and leaves CFIE masked, so a wedged context does not
    /// storm the shared interrupt line; the stall stays pending and `resume` may be called
    /// again.
    pub fn resume(&mut self, cb: ContextBank, action: ResumeAction) -> Result<()> {
        let state = *self.context(cb)?;
        if !state.stall_pending {
            return Err(SmmuError::NoStallPending {
                context: cb.index(),
            });
        }
        let tnr = match action {
            ResumeAction::Retry => RESUME::TNR::Retry,
            ResumeAction::Terminate => RESUME::TNR::Terminate,
        };
        let offset = self.caps.context_bank_offset(usize::from(cb.index()));
        let regs = super::regs::ContextBankRegs::new(&self.bus, offset)?;
        let mut written = false;
        let fsr = regs.fsr().get();
        if fsr & FSR_SS != 0 && fsr & FSR_FAULT_BITS != 0 {
            return Err(SmmuError::ResumeIgnored {
                context: cb.index(),
                fsr,
            });
        }
        let mut multi = 0u64;
        let released = hal::delay::poll_until(
            &mut self.delay,
            self.config.resume_timeout_us,
            self.config.poll_interval_us,
            || {
                let fsr = regs.fsr().get();
                if fsr & FSR_SS == 0 || (written && fsr & FSR_FAULT_BITS != 0) {
                    return true;
                }
                let mut write = !written;
                if fsr & FSR_MULTI != 0 && fsr & FSR_FAULT_BITS == 0 {
                    // With HUPCF another transaction of the context faulted while this one
                    // was stalled: not recorded, it only set MULTI. Clear exactly that bit
                    // (W1C); then RESUME (again, if one was ignored because of it).
                    regs.fsr().set(FSR_MULTI);
                    multi += 1;
                    write = true;
                }
                if write {
                    // The FSR writes must reach the SMMU before RESUME.
                    regs.barrier(Barrier::DsbSt);
                    regs.resume().write(tnr);
                    written = true;
                }
                false
            },
        );
        self.stats.multi += multi;
        if written {
            match action {
                ResumeAction::Retry => self.stats.resumed += 1,
                ResumeAction::Terminate => self.stats.terminated += 1,
            }
        }
        {
            let context = self.context_mut(cb)?;
            if released.is_err() {
                return Err(SmmuError::StallNotReleased {
                    context: cb.index(),
                });
            }
            context.stall_pending = false;
        }
        self.write_sctlr(cb, state.sctlr)
    }

    /// Services one context fault of `cb` end to end:
    /// [`take_context_fault`](Self::take_context_fault), then the shared fault service
    /// ([`FaultHandler::service`]: decide with the stream's declared
    /// [`crate::fault::StreamFaultConfig`], terminate at once unless the decision is `Resume`,
    /// fix with this bank's TLB maintenance, TLBIVA + TLBSYNC, RESUME retry for `Resume`).
    ///
    /// For `TerminateAndRetransmit` the caller tells the DMA master to retransmit; for
    /// `Abort` it fails the transfer. A stalled transaction is never left stalled on an error
    /// path: it is terminated first. `None` when the bank has no fault.
    ///
    /// A caller with transfers in flight should attribute the record first
    /// ([`crate::fault::attribute`]) and service only an attributed one; this method services
    /// whatever the bank recorded.
    pub fn service_context<P, R, M>(
        &mut self,
        cb: ContextBank,
        handler: &mut FaultHandler<P>,
        resolver: &mut R,
        table: &mut PageTable<M>,
    ) -> Result<Option<ServicedFault>>
    where
        P: FaultPolicy,
        R: FaultResolver + ?Sized,
        M: core::ops::Deref<Target: hal::dma::DmaMemory>,
    {
        let Some(fault) = self.take_context_fault(cb)? else {
            return Ok(None);
        };
        let Some(record) = fault.record else {
            return Ok(Some(ServicedFault {
                fault,
                decision: None,
                estimate: None,
                mapped: None,
            }));
        };
        let outcome = handler.service(self, &record, resolver, table)?;
        Ok(Some(ServicedFault {
            fault,
            decision: Some(outcome.decision),
            estimate: Some(outcome.estimate),
            mapped: outcome.mapped,
        }))
    }

    /// The context bank `record` was recorded in: its stall tag, or the bank its stream is
    /// routed to.
    fn record_context(&self, record: &FaultRecord) -> Result<ContextBank> {
        if let Some(tag) = record.stall {
            let index = u16::try_from(tag.0)
                .map_err(|_| SmmuError::UnknownContextBank { index: u16::MAX })?;
            let cb = ContextBank(index);
            self.context(cb)?;
            return Ok(cb);
        }
        self.stream_context(record.stream)
            .ok_or(SmmuError::StreamNotAttached {
                stream: record.stream.0,
            })
    }
}

impl<B: RegisterBus, D: DelayNs> FaultControl for SmmuV2<B, D> {
    type Tlb<'s>
        = ContextTlb<'s, B, D>
    where
        Self: 's;

    fn answer_stall(&mut self, record: &FaultRecord, retry: bool) -> Result<()> {
        let cb = self.record_context(record)?;
        let action = if retry {
            ResumeAction::Retry
        } else {
            ResumeAction::Terminate
        };
        self.resume(cb, action)
    }

    fn stream_config(&self, stream: StreamId) -> crate::fault::StreamFaultConfig {
        self.stream_fault_config(stream)
    }

    fn context_tlb(&mut self, record: &FaultRecord) -> Result<ContextTlb<'_, B, D>> {
        let cb = self.record_context(record)?;
        Ok(ContextTlb::new(self, cb))
    }
}

impl<B: RegisterBus, D: DelayNs> FaultSource for SmmuV2<B, D> {
    /// The fault of the first allocated context bank whose FSR reports one
    /// ([`SmmuV2::take_context_fault`]); FSR.MULTI marks others as lost.
    fn take_fault(&mut self) -> Result<Option<TakenFault>> {
        let Some(cb) = self.faulting_contexts().next() else {
            return Ok(None);
        };
        Ok(self.take_context_fault(cb)?.map(|fault| TakenFault {
            record: fault.record,
            lost: fault.multi(),
        }))
    }
}
