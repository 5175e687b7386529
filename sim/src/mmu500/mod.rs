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

/// The model's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mmu500Config {
    /// Context banks (IDR1.NUMCB), 1..=128.
    pub context_banks: usize,
    /// Stream-match groups (IDR0.NUMSMRG), 1..=128.
    pub stream_match_groups: usize,
    /// Stream ID bits (IDR0.NUMSIDB), 1..=16.
    pub stream_id_bits: u8,
    /// 64 KiB register pages (IDR1.PAGESIZE) instead of 4 KiB.
    pub page_64k: bool,
    /// log2 of the global pages (NUMPAGENDXB + 1), 1..=8.
    pub global_pages_log2: u8,
    /// Implementation revision (IDR7): major, minor.
    pub revision: (u8, u8),
    /// Coherent table walks (IDR0.CTTW).
    pub coherent_walk: bool,
    /// How many reads of TLBSTATUS / sTLBGSTATUS report a sync still active.
    pub sync_latency_reads: u32,
    /// How much of a fault the model reports and honours ([`FaultReporting::FULL`] for an
    /// MMU-500; [`FaultReporting::WEAKEST`] for what simpler models of it do).
    pub reporting: FaultReporting,
}

/// Which parts of the fault architecture the model implements. An MMU-500 implements all of
/// them; third-party models of the ZynqMP's SMMU implement less, and a driver must still
/// never report a transfer done with wrong data when they do (docs/mmu500.md, "Fault
/// attribution").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultReporting {
    /// The syndrome registers are written with a recorded fault: FAR, FSYNR0 and
    /// CBFRSYNRA (IHI 0062 SMMU_CBn_FAR, SMMU_CBn_FSYNR0, SMMU_CBFRSYNRAn). Without them
    /// they read as zero and a fault shows only as its FSR bit.
    pub syndromes: bool,
    /// A fault while FSR is non-zero sets FSR.MULTI and is not recorded (IHI 0062
    /// SMMU_CBn_FSR). Without it, the newer fault's FSR bit replaces the recorded one and
    /// nothing says that a fault was lost.
    pub multi: bool,
    /// SCTLR.CFCFG = 1 stalls a faulting transaction (IHI 0062 SMMU_CBn_SCTLR). Without it
    /// every fault is terminated as with CFCFG = 0.
    pub stall: bool,
}

impl FaultReporting {
    /// Everything, as the MMU-500 does.
    pub const FULL: FaultReporting = FaultReporting {
        syndromes: true,
        multi: true,
        stall: true,
    };

    /// Nothing beyond the FSR fault bits: no syndromes, no MULTI, no stall.
    pub const WEAKEST: FaultReporting = FaultReporting {
        syndromes: false,
        multi: false,
        stall: false,
    };
}

impl Mmu500Config {
    /// The ZynqMP MMU-500: 16 context banks, 48 stream-match groups, 15-bit stream IDs, 4 KiB
    /// register pages, 16 global pages (UG1087). The revision (r2p1) and
    /// non-coherent walks are **\[I\]**: not stated in our sources.
    pub const fn zynqmp() -> Self {
        Mmu500Config {
            context_banks: 16,
            stream_match_groups: 48,
            stream_id_bits: 15,
            page_64k: false,
            global_pages_log2: 4,
            revision: (2, 1),
            coherent_walk: false,
            sync_latency_reads: 2,
            reporting: FaultReporting::FULL,
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |what| Err(SimError::InvalidConfig { what });
        if !(1..=128).contains(&self.context_banks) {
            return bad("context_banks must be 1..=128");
        }
        if !(1..=128).contains(&self.stream_match_groups) {
            return bad("stream_match_groups must be 1..=128");
        }
        if !(1..=16).contains(&self.stream_id_bits) {
            return bad("stream_id_bits must be 1..=16");
        }
        if !(1..=8).contains(&self.global_pages_log2) {
            return bad("global_pages_log2 must be 1..=8");
        }
        if self.context_banks > self.global_pages() {
            return bad("context banks must fit the context bank space (one page each)");
        }
        Ok(())
    }

    /// Register page size in bytes.
    pub const fn page_size(&self) -> usize {
        if self.page_64k { 0x1_0000 } else { 0x1000 }
    }

    /// Pages of global space (NUMPAGE).
    pub const fn global_pages(&self) -> usize {
        1 << self.global_pages_log2
    }

    /// Size of the register window: global space plus as many context bank pages.
    pub const fn window_size(&self) -> usize {
        2 * self.global_pages() * self.page_size()
    }

    fn idr0(&self) -> u32 {
        // S1TS | S2TS | NTS | SMS; translation operations implemented (ATOSNS = 0);
        // one context interrupt per bank.
        let mut v = (1 << 30) | (1 << 29) | (1 << 28) | (1 << 27);
        v |= (self.context_banks as u32 & 0xff) << 16;
        v |= u32::from(self.stream_id_bits) << 9;
        v |= self.stream_match_groups as u32 & 0xff;
        if self.coherent_walk {
            v |= 1 << 14;
        }
        v
    }

    fn idr1(&self) -> u32 {
        // NUMSSDNDXB = 0xF as in the ZynqMP reset value 0x30000F10; no stage-2-only banks.
        let mut v = (self.context_banks as u32 & 0xff) | 0xf << 8;
        v |= (u32::from(self.global_pages_log2) - 1) << 28;
        if self.page_64k {
            v |= 1 << 31;
        }
        v
    }

    fn idr2(&self) -> u32 {
        // IAS = OAS = UBS = 48 bits (5), AArch64 4 KiB and 64 KiB granules, 16-bit VMIDs.
        5 | 5 << 4 | 5 << 8 | 1 << 12 | 1 << 14 | IDR2_VMID16
    }

    fn idr7(&self) -> u32 {
        u32::from(self.revision.0 & 0xf) << 4 | u32::from(self.revision.1 & 0xf)
    }
}

impl Default for Mmu500Config {
    fn default() -> Self {
        Self::zynqmp()
    }
}

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

    fn unknown(&mut self, offset: usize, write: bool) -> u64 {
        self.stats.unknown_accesses += 1;
        // The first ones only: a driver polling an unimplemented register must not grow
        // this without bound (the count goes on in the stats).
        if self.unknown.len() < MAX_UNKNOWN_LOGGED {
            self.unknown.push((offset, write));
        }
        0
    }

    fn read_gr0(&mut self, offset: usize, width: AccessWidth) -> u64 {
        let groups = self.config.stream_match_groups;
        let v = match offset {
            SCR0 => self.scr0,
            SACR => self.sacr,
            IDR0 => self.config.idr0(),
            IDR1 => self.config.idr1(),
            IDR2 => self.config.idr2(),
            IDR3..=IDR6 => 0,
            IDR7 => self.config.idr7(),
            SGFAR if width == AccessWidth::U64 => return self.sgfar,
            SGFAR => self.sgfar as u32,
            0x044 => (self.sgfar >> 32) as u32,
            SGFSR => self.sgfsr,
            SGFSYNR0 => self.sgfsynr[0],
            SGFSYNR1 => self.sgfsynr[1],
            SGFSYNR2 => self.sgfsynr[2],
            STLBGSTATUS => {
                if self.global_sync_reads > 0 {
                    self.global_sync_reads -= 1;
                    SYNC_ACTIVE
                } else {
                    // Seen idle: only now is the sync complete.
                    self.complete_global_sync();
                    0
                }
            }
            o if (SMR0..SMR0 + 4 * groups).contains(&o) => self.smr[(o - SMR0) / 4],
            o if (S2CR0..S2CR0 + 4 * groups).contains(&o) => self.s2cr[(o - S2CR0) / 4],
            o => return self.unknown(o, false),
        };
        u64::from(v)
    }

    /// Whether VMIDs are 16 bits wide: sCR0.VMID16EN, which IDR2.VMID16 makes writable.
    fn vmid16(&self) -> bool {
        self.config.idr2() & IDR2_VMID16 != 0 && self.scr0 & SCR0_VMID16EN != 0
    }

    /// The VMID that tags a bank's TLB entries: CBA2R.VMID16 with 16-bit VMIDs, else CBAR.VMID
    /// (IHI0062D CBAR, CBA2R). Stage-1 banks with stage 2 bypass carry one too.
    fn bank_vmid(&self, bank: usize) -> u16 {
        let b = &self.banks[bank];
        if self.vmid16() {
            (b.cba2r >> CBA2R_VMID16_SHIFT) as u16
        } else {
            (b.cbar & CBAR_VMID_MASK) as u16
        }
    }

    /// The bits of an ASID that count in a bank: all 16 with TCR2.AS, else the low 8.
    fn asid_mask(&self, bank: usize) -> u16 {
        if self.banks[bank].tcr2 & TCR2_AS != 0 {
            0xffff
        } else {
            0xff
        }
    }

    fn write_gr0(&mut self, offset: usize, value: u64) {
        let v = value as u32;
        let groups = self.config.stream_match_groups;
        let id_mask = self.stream_mask();
        match offset {
            SCR0 => self.scr0 = v,
            SACR => self.sacr = v,
            SGFSR => self.sgfsr &= !v,
            SGFSRRESTORE => self.sgfsr = v,
            TLBIVMID => {
                let vmid = if self.vmid16() {
                    v as u16
                } else {
                    v as u8 as u16
                };
                let doomed = self.tlb.select_vmid(vmid);
                self.global_pending.extend(doomed);
                self.stats.tlbi_ops += 1;
            }
            TLBIALLNSNH => {
                let doomed = self.tlb.select_all();
                self.global_pending.extend(doomed);
                self.stats.tlbi_ops += 1;
            }
            // No hypervisor entries are ever cached.
            TLBIALLH => self.stats.tlbi_ops += 1,
            STLBGSYNC => {
                let pending = std::mem::take(&mut self.global_pending);
                self.global_syncing.extend(pending);
                self.global_sync_reads = self.config.sync_latency_reads;
                self.stats.syncs += 1;
            }
            o if (SMR0..SMR0 + 4 * groups).contains(&o) => {
                self.smr[(o - SMR0) / 4] = v & (SMR_VALID | id_mask << 16 | id_mask);
            }
            o if (S2CR0..S2CR0 + 4 * groups).contains(&o) => {
                self.s2cr[(o - S2CR0) / 4] = v & S2CR_WRITABLE;
            }
            o => {
                self.unknown(o, true);
            }
        }
    }

    fn read_gr1(&mut self, offset: usize) -> u64 {
        let n = self.banks.len();
        let v = match offset {
            o if (CBAR0..CBAR0 + 4 * n).contains(&o) => self.banks[(o - CBAR0) / 4].cbar,
            o if (CBFRSYNRA0..CBFRSYNRA0 + 4 * n).contains(&o) => {
                self.banks[(o - CBFRSYNRA0) / 4].cbfrsynra
            }
            o if (CBA2R0..CBA2R0 + 4 * n).contains(&o) => self.banks[(o - CBA2R0) / 4].cba2r,
            o => return self.unknown(o + self.config.page_size(), false),
        };
        u64::from(v)
    }

    fn write_gr1(&mut self, offset: usize, value: u64) {
        let v = value as u32;
        let n = self.banks.len();
        match offset {
            o if (CBAR0..CBAR0 + 4 * n).contains(&o) => {
                self.banks[(o - CBAR0) / 4].cbar = v & CBAR_WRITABLE
            }
            o if (CBA2R0..CBA2R0 + 4 * n).contains(&o) => {
                self.banks[(o - CBA2R0) / 4].cba2r = v & 0xffff_0003
            }
            o => {
                self.unknown(o + self.config.page_size(), true);
            }
        }
    }

    fn read_bank(&mut self, bank: usize, offset: usize, width: AccessWidth) -> u64 {
        let wide = width == AccessWidth::U64;
        if offset == CB_TLBSTATUS && self.banks[bank].sync_reads == 0 {
            // Seen idle: only now is the sync complete.
            self.complete_context_sync(bank);
            return 0;
        }
        let b = &mut self.banks[bank];
        let half = |v: u64, high: bool| if high { v >> 32 } else { v & 0xffff_ffff };
        let v: u64 = match offset {
            CB_SCTLR => b.sctlr.into(),
            CB_ACTLR => b.actlr.into(),
            CB_TCR2 => b.tcr2.into(),
            CB_TTBR0 if wide => b.ttbr0,
            CB_TTBR0 => half(b.ttbr0, false),
            0x024 => half(b.ttbr0, true),
            CB_TTBR1 if wide => b.ttbr1,
            CB_TTBR1 => half(b.ttbr1, false),
            0x02c => half(b.ttbr1, true),
            CB_TCR => b.tcr.into(),
            CB_CONTEXTIDR => b.contextidr.into(),
            CB_MAIR0 => b.mair0.into(),
            CB_MAIR1 => b.mair1.into(),
            CB_PAR if wide => b.par,
            CB_PAR => half(b.par, false),
            0x054 => half(b.par, true),
            CB_FSR => b.fsr.into(),
            CB_FAR if wide => b.far,
            CB_FAR => half(b.far, false),
            0x064 => half(b.far, true),
            CB_FSYNR0 => b.fsynr0.into(),
            CB_FSYNR1 => b.fsynr1.into(),
            CB_TLBSTATUS => {
                if b.sync_reads > 0 {
                    b.sync_reads -= 1;
                    SYNC_ACTIVE.into()
                } else {
                    0
                }
            }
            o => {
                let page = (self.config.global_pages() + bank) * self.config.page_size();
                return self.unknown(page + o, false);
            }
        };
        v
    }

    fn write_bank(&mut self, bank: usize, offset: usize, width: AccessWidth, value: u64) {
        let wide = width == AccessWidth::U64;
        let v = value as u32;
        let set_half = |reg: &mut u64, high: bool, v: u32| {
            if high {
                *reg = (*reg & 0xffff_ffff) | u64::from(v) << 32;
            } else {
                *reg = (*reg & !0xffff_ffff) | u64::from(v);
            }
        };
        let tlbi =
            |value: u64| -> (u64, u16) { ((value & ((1 << 44) - 1)) << 12, (value >> 48) as u16) };
        // An invalidation names the entries cached now; they go when its sync completes. It
        // names them by the bank's VMID (and the ASID it carries), so it also reaches entries
        // that another bank with the same tags filled.
        let vmid = self.bank_vmid(bank);
        let asid_mask = self.asid_mask(bank);
        let doomed = match offset {
            CB_TLBIVA | CB_TLBIVAL if wide => {
                let (va, asid) = tlbi(value);
                Some(self.tlb.select_va(vmid, va, Some(asid & asid_mask)))
            }
            CB_TLBIVAA | CB_TLBIVAAL if wide => {
                let (va, _) = tlbi(value);
                Some(self.tlb.select_va(vmid, va, None))
            }
            CB_TLBIASID => Some(self.tlb.select_asid(vmid, v as u16 & asid_mask)),
            CB_TLBIALL => Some(self.tlb.select_vmid(vmid)),
            _ => None,
        };
        if let Some(doomed) = doomed {
            self.banks[bank].pending.extend(doomed);
            self.stats.tlbi_ops += 1;
            return;
        }
        let b = &mut self.banks[bank];
        match offset {
            CB_SCTLR => b.sctlr = v,
            // Locked on r2p0+ until sACR.CACHE_LOCK is cleared.
            CB_ACTLR if self.sacr & SACR_CACHE_LOCK != 0 => {}
            CB_ACTLR => b.actlr = v,
            CB_RESUME => self.resume(bank, v),
            CB_TCR2 => b.tcr2 = v,
            CB_TTBR0 if wide => b.ttbr0 = value,
            CB_TTBR0 => set_half(&mut b.ttbr0, false, v),
            0x024 => set_half(&mut b.ttbr0, true, v),
            CB_TTBR1 if wide => b.ttbr1 = value,
            CB_TTBR1 => set_half(&mut b.ttbr1, false, v),
            0x02c => set_half(&mut b.ttbr1, true, v),
            CB_TCR => b.tcr = v,
            CB_CONTEXTIDR => b.contextidr = v,
            CB_MAIR0 => b.mair0 = v,
            CB_MAIR1 => b.mair1 = v,
            // W1C for the fault bits and MULTI; SS only clears through RESUME.
            CB_FSR => {
                b.fsr &= !(v & (FSR_FAULTS | FSR_MULTI));
                if b.fsr & (FSR_FAULTS | FSR_MULTI) == 0 {
                    b.fsr &= !FSR_FORMAT_AARCH64;
                }
            }
            CB_FSRRESTORE => {
                let restored = v & (FSR_FAULTS | FSR_MULTI);
                let format = if restored != 0 { FSR_FORMAT_AARCH64 } else { 0 };
                b.fsr = (b.fsr & FSR_SS) | restored | format;
            }
            CB_TLBSYNC => {
                let pending = std::mem::take(&mut b.pending);
                b.syncing.extend(pending);
                b.sync_reads = self.config.sync_latency_reads;
                self.stats.syncs += 1;
            }
            o => {
                // Includes 32-bit writes to the 64-bit TLBI registers (AArch32 formats are not
                // modelled): the invalidation is lost, as a wrong-width access would be.
                let page = (self.config.global_pages() + bank) * self.config.page_size();
                self.unknown(page + o, true);
            }
        }
    }

    fn decode(&self, offset: usize) -> Option<(Space, usize)> {
        let page_size = self.config.page_size();
        let page = offset / page_size;
        let within = offset % page_size;
        let global = self.config.global_pages();
        match page {
            0 => Some((Space::Gr0, within)),
            1 => Some((Space::Gr1, within)),
            p if p >= global && p - global < self.banks.len() => {
                Some((Space::Bank(p - global), within))
            }
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Space {
    Gr0,
    Gr1,
    Bank(usize),
}

impl Mmu500 {
    /// Whether `offset` (decoded) is one of the 64-bit registers, the only ones that take a
    /// 64-bit access (IHI0062): sGFAR, and per bank TTBR0/1, PAR, FAR and the
    /// address-based TLBIs. A 64-bit access anywhere else would also touch the next 32-bit
    /// register, which the model does not guess at: it is recorded as unsupported.
    fn wide_register(&self, offset: usize) -> bool {
        match self.decode(offset) {
            Some((Space::Gr0, o)) => o == SGFAR,
            Some((Space::Bank(_), o)) => matches!(
                o,
                CB_TTBR0
                    | CB_TTBR1
                    | CB_PAR
                    | CB_FAR
                    | CB_TLBIVA
                    | CB_TLBIVAA
                    | CB_TLBIVAL
                    | CB_TLBIVAAL
            ),
            _ => false,
        }
    }
}

impl RegisterModel for Mmu500 {
    fn size(&self) -> usize {
        self.config.window_size()
    }

    fn read(&mut self, offset: usize, width: AccessWidth) -> u64 {
        // Registers are 32-bit; the 64-bit ones also take 64-bit accesses. Anything else
        // (8/16-bit, misaligned) is ignored, as we assume MMU-500 does with non-word accesses
        // (docs/mmu500.md §8).
        if !matches!(width, AccessWidth::U32 | AccessWidth::U64)
            || !offset.is_multiple_of(width.bytes())
            || (width == AccessWidth::U64 && !self.wide_register(offset))
        {
            return self.unknown(offset, false);
        }
        match self.decode(offset) {
            Some((Space::Gr0, o)) => self.read_gr0(o, width),
            Some((Space::Gr1, o)) => self.read_gr1(o),
            Some((Space::Bank(b), o)) => self.read_bank(b, o, width),
            None => self.unknown(offset, false),
        }
    }

    fn write(&mut self, offset: usize, width: AccessWidth, value: u64) {
        if !matches!(width, AccessWidth::U32 | AccessWidth::U64)
            || !offset.is_multiple_of(width.bytes())
            || (width == AccessWidth::U64 && !self.wide_register(offset))
        {
            self.unknown(offset, true);
            return;
        }
        match self.decode(offset) {
            Some((Space::Gr0, o)) => self.write_gr0(o, value),
            Some((Space::Gr1, o)) => self.write_gr1(o, value),
            Some((Space::Bank(b), o)) => self.write_bank(b, o, width, value),
            None => {
                self.unknown(offset, true);
            }
        }
    }
}
