//! A register-accurate model of the Arm CoreLink MMU-500 (SMMUv2), configured as the ZynqMP's.
//!
//! Modelled (sources in `regs.rs` and `docs/mmu500.md`):
//!
//! - the register map: global space GR0 (page 0), GR1 (page 1) and context banks at
//!   `(NUMPAGE + n) * PAGESIZE` (ZynqMP: 4 KiB pages, 16 banks at +0x1_0000), with the
//!   identification registers of the ZynqMP (UG1087 SIDR1 = 0x30000F10);
//! - stream matching: SMR ID/MASK/VALID, S2CR translate/bypass/fault; an unmatched stream
//!   faults (sGFSR.USF, sGFSYNR1 = stream) or bypasses per sCR0.USFCFG; a stream matched by
//!   two SMRs is a stream match conflict (sGFSR.SMCF); sCR0.CLIENTPD bypasses everything;
//! - stage-1 translation of AArch64 (CBA2R.VA64) contexts with a 4 KiB granule, walked in the
//!   simulated DRAM with `smmu_driver::walk` (T0SZ from TCR, output size from TCR2.PASIZE,
//!   TTBR0, access flag faults unless SCTLR.AFFD);
//! - a TLB ([`tlb::Tlb`]) tagged with VMID and ASID (not with the bank, as on MMU-500) that
//!   keeps translations until TLBIVA/TLBIVAL/TLBIVAA/TLBIASID/
//!   TLBIALL (context) or TLBIALLNSNH/TLBIVMID (global) **and** the matching TLBSYNC /
//!   sTLBGSYNC: an invalidation takes effect at the sync, and TLBSTATUS/sTLBGSTATUS read
//!   active for a configurable number of reads after it;
//! - context faults: FSR (TF, AFF, PF, ASF, EF; W1C), FAR, FSYNR0 (PLVL, WNR, PNU, IND,
//!   PTWF, AFR), CBFRSYNRA (stream). A fault while FSR is non-zero sets FSR.MULTI and is not
//!   recorded;
//! - terminate (SCTLR.CFCFG = 0): the master gets SLVERR with CFRE = 1, or reads of zero and
//!   dropped writes with CFRE = 0. With HUPCF = 0 every later transaction of the context is
//!   terminated too while FSR holds a fault;
//! - stall (CFCFG = 1): the transaction is held and FSR.SS set. While SS is set, later
//!   transactions of the context are held behind it if HUPCF = 0; with HUPCF = 1 they proceed,
//!   and one that faults is held (and sets MULTI). RESUME is **ignored while FSR has any bit
//!   other than SS** (MMU-500 behaviour, docs/mmu500.md §8); an accepted RESUME clears SS
//!   and retries (TnR = 0) or terminates (TnR = 1) the recorded transaction, and releases the
//!   held ones for retry. Writing 1 to FSR.SS does not clear it;
//! - weaker implementations ([`FaultReporting`]): syndrome registers that read as zero, no
//!   MULTI (a newer fault replaces the record) and no stall, as simpler models of the
//!   ZynqMP's SMMU behave;
//! - interrupts: the context interrupt is asserted while FSR is non-zero (SS included) and
//!   SCTLR.CFIE is set; the global one while sGFSR is non-zero and sCR0.GFIE; the ZynqMP has
//!   one line for all ([`Mmu500::interrupt_line`]).
//!
//! Not modelled: stage 2 and nested contexts (a transaction routed to one raises a global
//! fault), AArch32 formats, 16/64 KiB granules, walk caches, TLB capacity, secure state and
//! the secure/non-secure register banking, address translation operations (ATOS), the
//! performance monitors, MMU-500 prefetching, and time (a stall lasts until RESUME, however
//! long). sACR.CACHE_LOCK is modelled only as far as drivers meet it: on r2p0 and later it is
//! set after reset and context-bank ACTLR writes are ignored while it is set (Linux
//! `arm_mmu500_reset`).
//!
//! Files: `config` (geometry, IDRs, [`FaultReporting`]), `access` (the register map: GR0, GR1
//! and context banks), `regs` (offsets and bits), `tlb`; this file holds the state, the
//! translation of a transaction, faults, stalls and RESUME.

mod access;
mod config;
mod regs;
pub mod tlb;

use std::collections::{HashMap, VecDeque};

use hal::model::RegisterModel;
use hal::regs::AccessWidth;
use hal::{Iova, PhysAddr};
use smmu_driver::walk::{self, AccessRequest, WalkConfig, WalkFault};

use crate::bus::{Access, AxiResponse, StallState, StallTicket};
use crate::memory::Memory;
use crate::{Result, SimError};
use regs::*;
use tlb::{Tlb, TlbEntry};

pub use config::{FaultReporting, Mmu500Config};

/// What the SMMU does with a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Translation {
    /// Go ahead at this physical address.
    Phys(PhysAddr),
    /// Terminated silently: reads return zeros, writes are dropped, the master sees OKAY.
    RazWi,
    /// Terminated with an error response.
    Abort(AxiResponse),
    /// Held until RESUME.
    Stalled(StallTicket),
}

/// Event counters of the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mmu500Stats {
    /// Transactions presented.
    pub transactions: u64,
    /// TLB hits.
    pub tlb_hits: u64,
    /// Table walks.
    pub walks: u64,
    /// Context faults (recorded or not).
    pub context_faults: u64,
    /// Faults that set MULTI instead of being recorded.
    pub multi: u64,
    /// Transactions stalled with a recorded fault.
    pub stalls: u64,
    /// Transactions held behind a stall.
    pub held: u64,
    /// Transactions terminated (faults, terminate-mode HUPCF = 0, RESUME TnR = 1).
    pub terminated: u64,
    /// RESUME writes accepted.
    pub resumes_accepted: u64,
    /// RESUME writes ignored because FSR still had bits other than SS.
    pub resumes_ignored: u64,
    /// RESUME writes with nothing stalled.
    pub resumes_without_stall: u64,
    /// Global faults (recorded or MULTI).
    pub global_faults: u64,
    /// TLB entries removed by invalidations.
    pub tlb_invalidated: u64,
    /// Invalidation operations written (TLBI* registers).
    pub tlbi_ops: u64,
    /// TLB syncs (context and global).
    pub syncs: u64,
    /// Accesses to offsets the model does not implement, or with a width it does not support.
    pub unknown_accesses: u64,
}

/// Unsupported accesses kept with their offsets ([`Mmu500::unknown_accesses`]).
const MAX_UNKNOWN_LOGGED: usize = 1024;

/// TLB entries an invalidation named when it was written: removed when its sync is seen
/// complete (see the `tlb` module).
type Doomed = Vec<u64>;

#[derive(Clone, Debug)]
struct ContextBank {
    cbar: u32,
    cba2r: u32,
    cbfrsynra: u32,
    sctlr: u32,
    actlr: u32,
    tcr2: u32,
    ttbr0: u64,
    ttbr1: u64,
    tcr: u32,
    contextidr: u32,
    mair0: u32,
    mair1: u32,
    par: u64,
    fsr: u32,
    far: u64,
    fsynr0: u32,
    fsynr1: u32,
    /// Invalidations written since the last TLBSYNC.
    pending: Doomed,
    /// Invalidations a TLBSYNC covers, applied when TLBSTATUS reads idle.
    syncing: Doomed,
    sync_reads: u32,
    stalled: Option<StallTicket>,
    held: VecDeque<StallTicket>,
}

impl ContextBank {
    fn new() -> Self {
        ContextBank {
            cbar: 0,
            cba2r: 0,
            cbfrsynra: 0,
            sctlr: SCTLR_RESET,
            actlr: ACTLR_RESET,
            tcr2: 0,
            ttbr0: 0,
            ttbr1: 0,
            tcr: 0,
            contextidr: 0,
            mair0: 0,
            mair1: 0,
            par: 0,
            fsr: 0,
            far: 0,
            fsynr0: 0,
            fsynr1: 0,
            pending: Vec::new(),
            syncing: Vec::new(),
            sync_reads: 0,
            stalled: None,
            held: VecDeque::new(),
        }
    }

    fn abort_or_razwi(&self) -> Translation {
        if self.sctlr & SCTLR_CFRE != 0 {
            Translation::Abort(AxiResponse::SlvErr)
        } else {
            Translation::RazWi
        }
    }
}

/// A held transaction's fate, reported once to its master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TicketState {
    Held,
    Released(StallState),
}

/// The MMU-500 model (see the module docs).
#[derive(Debug)]
pub struct Mmu500 {
    config: Mmu500Config,
    scr0: u32,
    sacr: u32,
    sgfsr: u32,
    sgfar: u64,
    sgfsynr: [u32; 3],
    smr: Vec<u32>,
    s2cr: Vec<u32>,
    banks: Vec<ContextBank>,
    tlb: Tlb,
    global_pending: Doomed,
    global_syncing: Doomed,
    global_sync_reads: u32,
    tickets: HashMap<StallTicket, TicketState>,
    next_ticket: u64,
    stats: Mmu500Stats,
    unknown: Vec<(usize, bool)>,
}

impl Mmu500 {
    /// A model in its reset state: sCR0.CLIENTPD set (everything bypassed until a driver
    /// enables it) **\[I\]**, every SMR invalid, every S2CR "fault" (UG1087 reset value),
    /// SCTLR = 0x100 and ACTLR = 0x3 in every context bank (UG1087).
    pub fn new(config: Mmu500Config) -> Result<Self> {
        config.validate()?;
        Ok(Mmu500 {
            config,
            scr0: SCR0_CLIENTPD,
            sacr: if config.revision.0 >= 2 {
                SACR_CACHE_LOCK
            } else {
                0
            },
            sgfsr: 0,
            sgfar: 0,
            sgfsynr: [0; 3],
            smr: vec![0; config.stream_match_groups],
            s2cr: vec![S2CR_TYPE_FAULT << S2CR_TYPE_SHIFT; config.stream_match_groups],
            banks: (0..config.context_banks)
                .map(|_| ContextBank::new())
                .collect(),
            tlb: Tlb::default(),
            global_pending: Vec::new(),
            global_syncing: Vec::new(),
            global_sync_reads: 0,
            tickets: HashMap::new(),
            next_ticket: 1,
            stats: Mmu500Stats::default(),
            unknown: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Mmu500Config {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &Mmu500Stats {
        &self.stats
    }

    /// The TLB.
    pub fn tlb(&self) -> &Tlb {
        &self.tlb
    }

    /// Offsets (and whether it was a write) the model did not implement, in order.
    pub fn unknown_accesses(&self) -> &[(usize, bool)] {
        &self.unknown
    }

    /// A context bank's FSR (for tests).
    pub fn fsr(&self, bank: usize) -> Option<u32> {
        self.banks.get(bank).map(|b| b.fsr)
    }

    /// A context bank's SCTLR.
    pub fn sctlr(&self, bank: usize) -> Option<u32> {
        self.banks.get(bank).map(|b| b.sctlr)
    }

    /// Whether a context bank has a stalled transaction (FSR.SS).
    pub fn stall_pending(&self, bank: usize) -> bool {
        self.banks.get(bank).is_some_and(|b| b.stalled.is_some())
    }

    /// Transactions held behind a stall in a context bank.
    pub fn held(&self, bank: usize) -> usize {
        self.banks.get(bank).map_or(0, |b| b.held.len())
    }

    /// sGFSR.
    pub fn global_fault_status(&self) -> u32 {
        self.sgfsr
    }

    /// A context bank's interrupt: FSR non-zero and SCTLR.CFIE.
    pub fn context_interrupt(&self, bank: usize) -> bool {
        self.banks
            .get(bank)
            .is_some_and(|b| b.fsr != 0 && b.sctlr & SCTLR_CFIE != 0)
    }

    /// The global fault interrupt: sGFSR non-zero and sCR0.GFIE.
    pub fn global_interrupt(&self) -> bool {
        self.sgfsr != 0 && self.scr0 & SCR0_GFIE != 0
    }

    /// The ZynqMP's single SMMU interrupt line (SPI 155): global or any context interrupt.
    pub fn interrupt_line(&self) -> bool {
        self.global_interrupt() || (0..self.banks.len()).any(|b| self.context_interrupt(b))
    }

    fn stream_mask(&self) -> u32 {
        (1u32 << self.config.stream_id_bits) - 1
    }

    fn new_ticket(&mut self) -> StallTicket {
        let t = StallTicket(self.next_ticket);
        self.next_ticket += 1;
        self.tickets.insert(t, TicketState::Held);
        t
    }

    /// Reports a held transaction's state; a final state is reported once.
    pub fn stall_state(&mut self, ticket: StallTicket) -> StallState {
        match self.tickets.get(&ticket).copied() {
            None => StallState::Unknown,
            Some(TicketState::Held) => StallState::Held,
            Some(TicketState::Released(state)) => {
                self.tickets.remove(&ticket);
                state
            }
        }
    }

    fn global_fault(&mut self, bit: u32, stream: u32, access: &Access) -> Translation {
        self.stats.global_faults += 1;
        if self.sgfsr == 0 {
            self.sgfsr = bit;
            self.sgfar = access.address;
            self.sgfsynr = [u32::from(access.write) << 1, stream, 0];
        } else {
            self.sgfsr |= SGFSR_MULTI;
        }
        if self.scr0 & SCR0_GFRE != 0 {
            Translation::Abort(AxiResponse::SlvErr)
        } else {
            Translation::RazWi
        }
    }

    /// Presents a transaction (see the module docs for the rules).
    pub fn translate(&mut self, access: &Access, memory: &Memory) -> Translation {
        self.stats.transactions += 1;
        let bypass = Translation::Phys(PhysAddr::new(access.address));
        if self.scr0 & SCR0_CLIENTPD != 0 {
            return bypass;
        }
        let id_mask = self.stream_mask();
        let stream = access.stream & id_mask;
        let mut matched = None;
        let mut conflict = false;
        for (i, &smr) in self.smr.iter().enumerate() {
            if smr & SMR_VALID == 0 {
                continue;
            }
            let id = smr & id_mask;
            let mask = (smr >> 16) & id_mask;
            if (stream ^ id) & !mask & id_mask == 0 {
                if matched.is_some() {
                    conflict = true;
                }
                matched.get_or_insert(i);
            }
        }
        if conflict {
            return self.global_fault(SGFSR_SMCF, stream, access);
        }
        let Some(group) = matched else {
            if self.scr0 & SCR0_USFCFG != 0 {
                return self.global_fault(SGFSR_USF, stream, access);
            }
            return bypass;
        };
        let s2cr = self.s2cr[group];
        match (s2cr >> S2CR_TYPE_SHIFT) & 3 {
            S2CR_TYPE_TRANSLATE => {}
            S2CR_TYPE_BYPASS => return bypass,
            // Fault type: reported as an unidentified stream (the exact global fault bit of
            // S2CR.TYPE = fault is not in our sources; docs/mmu500.md).
            _ => return self.global_fault(SGFSR_USF, stream, access),
        }
        let bank = (s2cr & 0xff) as usize;
        if bank >= self.banks.len() {
            return self.global_fault(SGFSR_UCBF, stream, access);
        }
        let b = &self.banks[bank];
        if (b.cbar >> CBAR_TYPE_SHIFT) & 3 != CBAR_TYPE_S1_S2BYPASS || b.cba2r & CBA2R_VA64 == 0 {
            // Stage 2, nested and AArch32 contexts are not modelled.
            return self.global_fault(SGFSR_ICF, stream, access);
        }
        self.translate_in_context(bank, stream, access, memory)
    }

    fn translate_in_context(
        &mut self,
        bank: usize,
        stream: u32,
        access: &Access,
        memory: &Memory,
    ) -> Translation {
        let b = &self.banks[bank];
        let sctlr = b.sctlr;
        if sctlr & SCTLR_M == 0 {
            return Translation::Phys(PhysAddr::new(access.address));
        }
        let hupcf = sctlr & SCTLR_HUPCF != 0;
        if !hupcf {
            if b.stalled.is_some() {
                // Everything of the context waits behind the stalled transaction.
                let t = self.new_ticket();
                self.banks[bank].held.push_back(t);
                self.stats.held += 1;
                return Translation::Stalled(t);
            }
            if b.fsr & FSR_FAULTS != 0 {
                // Terminate model with an outstanding fault: later transactions terminate.
                self.stats.terminated += 1;
                return b.abort_or_razwi();
            }
        }
        let asid = (b.ttbr0 >> 48) as u16 & self.asid_mask(bank);
        let vmid = self.bank_vmid(bank);
        let iova = Iova::new(access.address);
        let access_flag_faults = sctlr & SCTLR_AFFD == 0;
        let leaf = match self.tlb.lookup(vmid, asid, iova) {
            Some(leaf) => {
                self.stats.tlb_hits += 1;
                Ok(leaf)
            }
            None => {
                self.stats.walks += 1;
                let leaf = self.walk(bank, iova, memory);
                if let Ok(l) = leaf
                    && (!access_flag_faults || l.accessed())
                {
                    self.tlb.insert(TlbEntry {
                        id: 0,
                        context: bank,
                        vmid,
                        asid: l.not_global().then_some(asid),
                        leaf: l,
                    });
                }
                leaf
            }
        };
        let request = AccessRequest {
            write: access.write,
            privileged: access.privileged,
            instruction: access.instruction,
        };
        let result = leaf.and_then(|l| {
            walk::check_access(&l, &request, access_flag_faults).map(|()| l.phys(iova))
        });
        match result {
            Ok(pa) => Translation::Phys(pa),
            Err(fault) => self.context_fault(bank, stream, access, fault),
        }
    }

    fn walk(
        &self,
        bank: usize,
        iova: Iova,
        memory: &Memory,
    ) -> core::result::Result<walk::Leaf, WalkFault> {
        let b = &self.banks[bank];
        let start = WalkFault::Translation { level: 0 };
        if b.tcr & TCR_EPD0 != 0 || (b.tcr >> TCR_TG0_SHIFT) & 3 != 0 {
            // Walks through TTBR0 disabled, or a granule other than 4 KiB (not modelled).
            return Err(start);
        }
        let output_bits = size_bits(b.tcr2 & TCR2_PASIZE_MASK);
        let Ok(config) = WalkConfig::from_t0sz((b.tcr & TCR_T0SZ_MASK) as u8, output_bits) else {
            return Err(start);
        };
        let root = PhysAddr::new(b.ttbr0 & 0x0000_ffff_ffff_f000);
        walk::walk(root, iova, &config, |pa| memory.read_u64(pa))
    }

    fn context_fault(
        &mut self,
        bank: usize,
        stream: u32,
        access: &Access,
        fault: WalkFault,
    ) -> Translation {
        self.stats.context_faults += 1;
        let bit = match fault {
            WalkFault::Translation { .. } => FSR_TF,
            WalkFault::AccessFlag { .. } => FSR_AFF,
            WalkFault::Permission { .. } => FSR_PF,
            WalkFault::AddressSize { .. } => FSR_ASF,
            WalkFault::External { .. } => FSR_EF,
        };
        let reporting = self.config.reporting;
        let b = &mut self.banks[bank];
        let stall_mode = b.sctlr & SCTLR_CFCFG != 0 && reporting.stall;
        // Without MULTI a newer fault replaces the record, unless a stalled transaction owns
        // it (only its RESUME can release that one).
        let recorded = b.fsr == 0 || (!reporting.multi && b.stalled.is_none());
        if recorded && !reporting.syndromes {
            b.fsr = bit | FSR_FORMAT_AARCH64 | if stall_mode { FSR_SS } else { 0 };
            b.far = 0;
            b.fsynr0 = 0;
            b.fsynr1 = 0;
            b.cbfrsynra = 0;
        } else if recorded {
            let mut fsynr0 = u32::from(fault.level()) & 3;
            if access.write {
                fsynr0 |= FSYNR0_WNR;
            }
            if access.privileged {
                fsynr0 |= FSYNR0_PNU;
            }
            if access.instruction {
                fsynr0 |= FSYNR0_IND;
            }
            if matches!(fault, WalkFault::External { .. }) {
                fsynr0 |= FSYNR0_PTWF;
            }
            if !stall_mode && b.sctlr & SCTLR_CFRE != 0 {
                fsynr0 |= FSYNR0_AFR;
            }
            b.fsr = bit | FSR_FORMAT_AARCH64 | if stall_mode { FSR_SS } else { 0 };
            b.far = access.address;
            b.fsynr0 = fsynr0;
            b.fsynr1 = 0;
            b.cbfrsynra = stream;
        } else if reporting.multi {
            b.fsr |= FSR_MULTI;
            self.stats.multi += 1;
        }
        let b = &self.banks[bank];
        if stall_mode && (recorded || b.stalled.is_some()) {
            let t = self.new_ticket();
            let b = &mut self.banks[bank];
            if recorded {
                b.stalled = Some(t);
                self.stats.stalls += 1;
            } else {
                b.held.push_back(t);
                self.stats.held += 1;
            }
            return Translation::Stalled(t);
        }
        // Terminate model, or a stall-mode fault with FSR non-zero but nothing stalled
        // (fault bits left uncleared): nothing could ever release it, so it is terminated.
        self.stats.terminated += 1;
        self.banks[bank].abort_or_razwi()
    }

    fn resume(&mut self, bank: usize, value: u32) {
        let b = &mut self.banks[bank];
        let Some(ticket) = b.stalled else {
            self.stats.resumes_without_stall += 1;
            return;
        };
        if b.fsr & !(FSR_SS | FSR_FORMAT_AARCH64) != 0 {
            // MMU-500 ignores RESUME until FSR is cleared (docs/mmu500.md §8).
            self.stats.resumes_ignored += 1;
            return;
        }
        b.fsr &= !FSR_SS;
        b.stalled = None;
        let fate = if value & RESUME_TERMINATE != 0 {
            self.stats.terminated += 1;
            match b.abort_or_razwi() {
                Translation::Abort(r) => StallState::Terminated(r),
                _ => StallState::TerminatedSilently,
            }
        } else {
            StallState::Retry
        };
        let held: Vec<StallTicket> = b.held.drain(..).collect();
        self.tickets.insert(ticket, TicketState::Released(fate));
        for t in held {
            self.tickets
                .insert(t, TicketState::Released(StallState::Retry));
        }
        self.stats.resumes_accepted += 1;
    }

    /// The bank's sync is seen complete: its invalidations take effect.
    fn complete_context_sync(&mut self, bank: usize) {
        let doomed = std::mem::take(&mut self.banks[bank].syncing);
        self.stats.tlb_invalidated += self.tlb.remove(&doomed) as u64;
    }

    /// The global sync is seen complete: the global invalidations take effect.
    fn complete_global_sync(&mut self) {
        let doomed = std::mem::take(&mut self.global_syncing);
        self.stats.tlb_invalidated += self.tlb.remove(&doomed) as u64;
    }
}
