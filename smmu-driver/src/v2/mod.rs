//! SMMUv2 / CoreLink MMU-500 driver (the ZynqMP's SMMU), for stage-1 contexts with
//! stall-and-resume or terminate-and-retransmit fault handling.
//!
//! What it does, and the sources it follows (register-level detail in [`regs`]):
//!
//! - **Probe** ([`SmmuV2::probe`]): IDR0/1/2/7 into [`Capabilities`]; refuses an SMMU without
//!   stage 1, AArch64 4 KiB tables or stream matching, or a window too small for
//!   `2 * NUMPAGE * PAGESIZE` (IHI0062 `SMMU_IDR1`).
//! - **Reset** ([`SmmuV2::reset`]): first a transaction left stalled by a previous owner is
//!   terminated (FSR cleared, then RESUME.TnR = 1; Linux does not do this), then Linux's
//!   `arm_smmu_device_reset` order:
//!   clear sGFSR, invalidate every SMR and fault every S2CR, disable every context bank and
//!   clear its FSR, the MMU-500 sACR/ACTLR set-up (only when the board says the SMMU is one,
//!   [`Implementation`]), TLBIALLH + TLBIALLNSNH, a global sync, then
//!   sCR0 with global fault reporting and the unmatched-stream policy (`USFCFG`).
//! - **Stream matching** ([`SmmuV2::attach`]): one SMR/S2CR group per [`StreamMatch`] (ID +
//!   don't-care mask), overlap-checked so no stream can match two groups (a stream match
//!   conflict on silicon). S2CR is written before the SMR becomes valid, and an SMR is
//!   invalidated before its S2CR changes (Linux `arm_smmu_write_sme`), so a matching stream
//!   never sees a half-written group.
//! - **Context banks** ([`SmmuV2::alloc_context`]): CBA2R (VA64) -> CBAR (stage 1, stage 2
//!   bypass) -> TCR2 -> TCR -> TTBR0/TTBR1 -> MAIR0/1 -> SCTLR last (Linux
//!   `arm_smmu_write_context_bank`; TCR before the TTBRs because it says how to read their ASID
//!   bits). SCTLR carries M, TRE, AFE, ASIDPNE, CFRE and CFIE as Linux does, plus CFCFG (stall)
//!   and HUPCF as [`ContextConfig`] asks.
//! - **TLB maintenance** ([`ContextTlb`], implementing [`crate::pagetable::TlbMaintenance`]): TLBIVAL / TLBIVA
//!   per changed entry (`(VA >> 12) | ASID << 48`), TLBIASID when the list overflowed, then
//!   TLBSYNC and TLBSTATUS.SACTIVE polled with [`hal::delay::poll_until`] and a timeout
//!   (Linux: one second, "SMMU may be deadlocked").
//! - **Faults**: [`SmmuV2::take_global_fault`] (sGFSR), [`SmmuV2::take_context_fault`]
//!   (FSR, FSYNR0, FAR, CBFRSYNRA into a [`crate::fault::FaultRecord`]; CFIE masked while a
//!   stall is pending; FSR cleared by writing back exactly the bits read, never a
//!   read-modify-write, *before* any RESUME), [`SmmuV2::resume`] (RESUME.TnR, a check that the
//!   stall was released, CFIE restored) and [`SmmuV2::service_context`], which runs the shared
//!   [`crate::fault::FaultHandler`] with its policy (`StandardPolicy::Hybrid`: stall and
//!   resume a minor fault within the stall budget, otherwise terminate and have the master
//!   retransmit, never resume a stream that is not stall-tolerant).
//!
//! The stall sequence and why each step is there is in `docs/mmu500.md`.

mod caps;
mod fault;
pub mod regs;
mod tlb;

#[cfg(test)]
mod tests;

use hal::PhysAddr;
use hal::delay::DelayNs;
use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};

pub use caps::{
    Capabilities, MAX_CONTEXT_BANKS, MAX_STREAM_MATCH_GROUPS, bits_to_size, size_to_bits,
};
pub use fault::{
    ContextFault, FSR_FAULT_BITS, FSR_MULTI, FSR_SS, FSR_W1C, GlobalFault, ResumeAction,
    ServicedFault, decode_context_fault,
};
pub use tlb::{ContextTlb, tlbiva_value};

use crate::fault::{SmmuFlavour, SmmuId, StreamFaultConfig, StreamId};
use crate::walk::WalkConfig;
use crate::{Result, SmmuError};
use regs::{
    ACTLR, CBA2R, CBAR, ContextBankRegs, Gr0, Gr1, RESUME, S2CR, SACR, SCR0, SCTLR, SMR, TCR, TCR2,
    TLBSTATUS, TTBR,
};

/// What a transaction whose stream matches no SMR gets (sCR0.USFCFG).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnmatchedStreams {
    /// Fault it: a global fault (sGFSR.USF) and an abort to the master (USFCFG = 1). The
    /// safe default: a misconfigured master cannot reach memory.
    Fault,
    /// Let it through untranslated (USFCFG = 0).
    Bypass,
}

/// Which SMMUv2 implementation the driver runs on, as the board says: it decides whether the
/// driver writes the IMPLEMENTATION DEFINED registers (sACR at GR0 0x010, the context banks'
/// ACTLR), whose meaning is the implementation's.
///
/// The registers cannot tell: IDR7 (MAJOR, MINOR) is a revision of whatever implementation it
/// is, and IHI0062 leaves its contents IMPLEMENTATION DEFINED. Linux decides from the firmware
/// description: the device-tree compatible `"arm,mmu-500"` (or the ACPI IORT model
/// `CORELINK_MMU500`) selects the model `ARM_MMU500` (`arm-smmu.c`, `arm_smmu_of_match`),
/// `arm_smmu_impl_init` (`arm-smmu-impl.c`) then installs `arm_mmu500_impl`, whose reset
/// (`arm_mmu500_reset`) makes the sACR and ACTLR writes; IDR7.MAJOR is read only there, for
/// the CACHE_LOCK rule of r2p0+. So does this driver: the board names the implementation (the
/// ZynqMP: `boards::zynqmp::SMMU`, zynqmp.dtsi `compatible = "arm,mmu-500"`), and
/// [`Capabilities::revision`] (IDR7) is used only once it says MMU-500.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Implementation {
    /// An SMMUv2 the driver knows nothing more about: architected registers only.
    Generic,
    /// Arm CoreLink MMU-500: at reset sACR.SMTNMB_TLBEN and S2CRB_TLBEN set and, from r2p0
    /// (IDR7.MAJOR >= 2), CACHE_LOCK cleared; then ACTLR.CPRE cleared in every bank (the
    /// next-page prefetcher, errata 841119 and 826419), as Linux `arm_mmu500_reset`.
    Mmu500,
}

/// Driver settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverConfig {
    /// Instance number reported in [`SmmuId`].
    pub instance: u8,
    /// The implementation (the board knows it; the default, [`Implementation::Generic`],
    /// writes no IMPLEMENTATION DEFINED register).
    pub implementation: Implementation,
    /// Policy for unmatched streams.
    pub unmatched: UnmatchedStreams,
    /// TLB sync timeout in microseconds (Linux waits one second).
    pub sync_timeout_us: u64,
    /// How long to wait for a RESUME to release the stalled transaction, in microseconds.
    pub resume_timeout_us: u64,
    /// Poll interval in microseconds.
    pub poll_interval_us: u32,
    /// Above this many TLBIVA writes in one invalidation, invalidate the whole ASID instead.
    pub max_tlbi_per_sync: u32,
}

impl DriverConfig {
    /// Defaults: a generic SMMUv2, unmatched streams fault, 1 s TLB sync timeout, 10 ms
    /// resume check, 1 us polls, at most 512 TLBIVAs per sync.
    pub const DEFAULT: DriverConfig = DriverConfig {
        instance: 0,
        implementation: Implementation::Generic,
        unmatched: UnmatchedStreams::Fault,
        sync_timeout_us: 1_000_000,
        resume_timeout_us: 10_000,
        poll_interval_us: 1,
        max_tlbi_per_sync: 512,
    };
}

impl Default for DriverConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// An SMR match: a stream matches when it equals `id` in every bit not set in `mask`
/// (IHI0062 `SMMU_SMRn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamMatch {
    /// Stream ID to match.
    pub id: u16,
    /// Bits to ignore.
    pub mask: u16,
}

impl StreamMatch {
    /// Matches exactly one stream.
    pub const fn exact(id: u16) -> StreamMatch {
        StreamMatch { id, mask: 0 }
    }

    /// Whether `stream` matches.
    pub const fn matches(&self, stream: u32) -> bool {
        (stream ^ self.id as u32) & !(self.mask as u32) & 0xffff == 0
    }

    /// Whether some stream would match both (Linux `arm_smmu_find_sme` overlap rule).
    pub const fn overlaps(&self, other: &StreamMatch) -> bool {
        (self.id ^ other.id) & !(self.mask | other.mask) == 0
    }
}

/// A context bank allocated by [`SmmuV2::alloc_context`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextBank(u16);

impl ContextBank {
    /// The bank's index (its register page is `NUMPAGE + index`; its ASID by default).
    pub const fn index(self) -> u16 {
        self.0
    }
}

/// A stream-match group in use, from [`SmmuV2::attach`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamMatchIndex(u16);

impl StreamMatchIndex {
    /// The SMR/S2CR index.
    pub const fn index(self) -> u16 {
        self.0
    }
}

/// Where matched streams go (S2CR.TYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamRoute {
    /// Translate through a context bank.
    Translate(ContextBank),
    /// Bypass translation.
    Bypass,
    /// Fault every transaction.
    Fault,
}

/// What a context does with a faulting transaction (SCTLR.CFCFG).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultModel {
    /// Terminate it: with CFRE the master gets an abort (SLVERR) and may retransmit.
    Terminate,
    /// Stall it until software writes RESUME (retry or terminate). Only for streams that
    /// tolerate stalls; never PCIe (IHI0070 §3.12.1; docs/mmu500.md §8).
    Stall,
}

/// How to program a stage-1 context bank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// Physical address of the level-0 table ([`crate::pagetable::PageTable::root`]).
    pub table_root: PhysAddr,
    /// Input address size (TCR.T0SZ = 64 - bits), 25..=48.
    pub input_bits: u8,
    /// Output address size (TCR2.PASIZE), 32..=48, at most the SMMU's OAS.
    pub output_bits: u8,
    /// ASID, which no other allocated context may have ([`SmmuError::AsidInUse`]); `None`
    /// uses the context bank index, as Linux does, or the lowest free ASID above it.
    pub asid: Option<u16>,
    /// Terminate or stall.
    pub fault_model: FaultModel,
    /// SCTLR.HUPCF: later transactions of the context proceed while a fault is outstanding.
    /// With 0, MMU-500 stalls or terminates everything behind the fault (DDI0517 §2.3.4).
    pub hit_under_fault: bool,
    /// SCTLR.CFIE: raise the context interrupt on faults.
    pub fault_interrupt: bool,
    /// SCTLR.CFRE: a terminated transaction returns an abort to the master. Without it reads
    /// return zero and writes are dropped and the master never learns (IHI0062
    /// `SMMU_CBn_SCTLR`.CFRE).
    pub abort_on_fault: bool,
    /// MAIR (MAIR0 = low word, MAIR1 = high word).
    pub mair: u64,
    /// Table walks are cache coherent: walk with inner-shareable write-back attributes;
    /// otherwise outer-shareable non-cacheable (Linux io-pgtable-arm `coherent_walk`).
    pub coherent_walk: bool,
}

impl ContextConfig {
    /// A context for `table_root` translated with `walk`, Linux's defaults (CFRE, CFIE,
    /// HUPCF, the standard MAIR, non-coherent walks) and `fault_model`.
    pub fn new(table_root: PhysAddr, walk: &WalkConfig, fault_model: FaultModel) -> Self {
        ContextConfig {
            table_root,
            input_bits: walk.input_bits(),
            output_bits: walk.output_bits(),
            asid: None,
            fault_model,
            hit_under_fault: true,
            fault_interrupt: true,
            abort_on_fault: true,
            mair: crate::pagetable::STANDARD_MAIR,
            coherent_walk: false,
        }
    }
}

/// Driver counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct V2Stats {
    /// Context fault records taken.
    pub context_faults: u64,
    /// Of which with FSR.MULTI (faults whose syndrome was lost).
    pub multi: u64,
    /// Of which stalled (FSR.SS).
    pub stalls: u64,
    /// Global fault records taken.
    pub global_faults: u64,
    /// RESUME writes with TnR = retry.
    pub resumed: u64,
    /// RESUME writes with TnR = terminate.
    pub terminated: u64,
    /// TLBIVA/TLBIVAL writes.
    pub tlbi_va: u64,
    /// TLBIASID writes.
    pub tlbi_asid: u64,
    /// Completed TLB syncs.
    pub tlb_syncs: u64,
}

#[derive(Clone, Copy, Debug)]
struct ContextState {
    in_use: bool,
    asid: u16,
    sctlr: u32,
    fault_model: FaultModel,
    stall_pending: bool,
    streams: u16,
}

impl ContextState {
    const FREE: ContextState = ContextState {
        in_use: false,
        asid: 0,
        sctlr: 0,
        fault_model: FaultModel::Terminate,
        stall_pending: false,
        streams: 0,
    };
}

#[derive(Clone, Copy, Debug)]
struct StreamState {
    in_use: bool,
    matcher: StreamMatch,
    route: StreamRoute,
    fault: StreamFaultConfig,
}

impl StreamState {
    const FREE: StreamState = StreamState {
        in_use: false,
        matcher: StreamMatch::exact(0),
        route: StreamRoute::Fault,
        fault: StreamFaultConfig::NEVER_STALL,
    };
}

/// The SMMUv2 driver: owns the register window `B` (an [`hal::regs::MmioBus`] on silicon, a
/// model bus on the host) and a delay `D` for bounded polls.
pub struct SmmuV2<B, D> {
    bus: B,
    delay: D,
    config: DriverConfig,
    caps: Capabilities,
    contexts: [ContextState; MAX_CONTEXT_BANKS],
    streams: [StreamState; MAX_STREAM_MATCH_GROUPS],
    stats: V2Stats,
}

impl<B, D> core::fmt::Debug for SmmuV2<B, D> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SmmuV2")
            .field("caps", &self.caps)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<B: RegisterBus, D: DelayNs> SmmuV2<B, D> {
    /// Reads the identification registers and checks the SMMU is usable. Writes nothing;
    /// call [`reset`](Self::reset) next.
    pub fn probe(bus: B, delay: D, config: DriverConfig) -> Result<Self> {
        let gr0 = Gr0::new(&bus, 0)?;
        let caps = Capabilities::decode(
            gr0.idr0().get(),
            gr0.idr1().get(),
            gr0.idr2().get(),
            gr0.idr7().get(),
        );
        caps.check_usable(bus.size())?;
        Ok(SmmuV2 {
            bus,
            delay,
            config,
            caps,
            contexts: [ContextState::FREE; MAX_CONTEXT_BANKS],
            streams: [StreamState::FREE; MAX_STREAM_MATCH_GROUPS],
            stats: V2Stats::default(),
        })
    }

    /// The probed capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The implementation the board named ([`DriverConfig::implementation`]).
    pub fn implementation(&self) -> Implementation {
        self.config.implementation
    }

    /// The driver settings.
    pub fn config(&self) -> &DriverConfig {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &V2Stats {
        &self.stats
    }

    /// The register bus.
    pub fn bus(&self) -> &B {
        &self.bus
    }

    /// The identity to put in fault records.
    pub fn smmu_id(&self) -> SmmuId {
        SmmuId {
            flavour: SmmuFlavour::V2,
            instance: self.config.instance,
        }
    }

    fn gr0(&self) -> Result<Gr0<'_, B>> {
        Ok(Gr0::new(&self.bus, 0)?)
    }

    fn gr1(&self) -> Result<Gr1<'_, B>> {
        Ok(Gr1::new(&self.bus, self.caps.global_page_offset(1))?)
    }

    fn bank_regs(&self, index: u16) -> Result<ContextBankRegs<'_, B>> {
        Ok(ContextBankRegs::new(
            &self.bus,
            self.caps.context_bank_offset(usize::from(index)),
        )?)
    }

    fn context(&self, cb: ContextBank) -> Result<&ContextState> {
        self.contexts
            .get(usize::from(cb.0))
            .filter(|c| c.in_use)
            .ok_or(SmmuError::UnknownContextBank { index: cb.0 })
    }

    fn context_mut(&mut self, cb: ContextBank) -> Result<&mut ContextState> {
        self.contexts
            .get_mut(usize::from(cb.0))
            .filter(|c| c.in_use)
            .ok_or(SmmuError::UnknownContextBank { index: cb.0 })
    }

    /// Resets the SMMU to a known state and enables it: every stream unmatched (so the
    /// unmatched policy applies), every context bank disabled, TLBs empty.
    ///
    /// A transaction left stalled by whoever ran before (a previous boot stage, a driver that
    /// crashed) is terminated first, so that its master gets an abort instead of waiting
    /// forever: see [`terminate_stale_stall`](Self::terminate_stale_stall). If one cannot be
    /// released, reset fails with [`SmmuError::StallNotReleased`].
    pub fn reset(&mut self) -> Result<()> {
        let groups = self.caps.usable_stream_match_groups();
        let banks = self.caps.usable_context_banks();
        for i in 0..banks {
            self.terminate_stale_stall(i as u16)?;
        }
        {
            let gr0 = self.gr0()?;
            // W1C: write back exactly what is set.
            let gfsr = gr0.sgfsr().get();
            gr0.sgfsr().set(gfsr);
            for i in 0..groups {
                gr0.smr(i)?.set(0);
                gr0.s2cr(i)?.write(S2CR::TYPE::Fault);
            }
        }
        let mmu500 = self.config.implementation == Implementation::Mmu500;
        if mmu500 {
            // sACR first: on r2p0+ the context banks' ACTLR writes do not take effect while
            // CACHE_LOCK is set (Linux arm_mmu500_reset).
            let gr0 = self.gr0()?;
            let mut sacr = gr0.sacr().get();
            if self.caps.revision.0 >= 2 {
                sacr &= !SACR::CACHE_LOCK::SET.value;
            }
            sacr |= (SACR::SMTNMB_TLBEN::SET + SACR::S2CRB_TLBEN::SET).value;
            gr0.sacr().set(sacr);
        }
        for i in 0..banks {
            let cb = self.bank_regs(i as u16)?;
            cb.sctlr().set(0);
            cb.fsr().set(FSR_W1C);
            if mmu500 {
                // MMU-500: the next-page prefetcher off (errata 841119, 826419; Linux
                // arm_mmu500_reset). ACTLR is a plain control register, so read-modify-write
                // is right here.
                let actlr = cb.actlr().get();
                cb.actlr().set(actlr & !ACTLR::CPRE::SET.value);
            }
        }
        {
            let gr0 = self.gr0()?;
            gr0.tlbiallh().set(0);
            gr0.tlbiallnsnh().set(0);
        }
        self.sync_global()?;
        let usfcfg = match self.config.unmatched {
            UnmatchedStreams::Fault => SCR0::USFCFG::SET,
            UnmatchedStreams::Bypass => SCR0::USFCFG::CLEAR,
        };
        let vmid16 = if self.caps.vmid16 {
            SCR0::VMID16EN::SET
        } else {
            SCR0::VMID16EN::CLEAR
        };
        let gr0 = self.gr0()?;
        gr0.barrier(hal::barrier::Barrier::DsbSt);
        gr0.scr0().write(
            SCR0::GFRE::SET
                + SCR0::GFIE::SET
                + SCR0::GCFGFRE::SET
                + SCR0::GCFGFIE::SET
                + SCR0::VMIDPNE::SET
                + SCR0::PTM::SET
                + usfcfg
                + vmid16
                + SCR0::CLIENTPD::CLEAR,
        );
        self.contexts = [ContextState::FREE; MAX_CONTEXT_BANKS];
        self.streams = [StreamState::FREE; MAX_STREAM_MATCH_GROUPS];
        Ok(())
    }

    /// Terminates a transaction stalled in bank `index` before this driver owned the SMMU
    /// (reset only; the bank's records are not wanted). Clearing FSR and disabling the bank,
    /// all Linux's `arm_smmu_device_reset` does, does not release a stall: only RESUME does
    /// (IHI0062 SMMU_CBn_RESUME, SMMU_CBn_FSR.SS), and MMU-500 ignores RESUME while FSR holds
    /// any bit but SS (the stall sequence in `fault.rs`). So, for a bank whose FSR shows SS, as
    /// Linux
    /// `qcom_tbu_halt` (`drivers/iommu/arm/arm-smmu/arm-smmu-qcom-debug.c`) does for a stall
    /// in its way:
    ///
    /// 1. SCTLR without CFCFG and CFIE: a held transaction the release lets retry, should it
    ///    fault again, is terminated rather than stalled, and nothing interrupts;
    /// 2. FSR written with exactly the bits read (W1C), before RESUME;
    /// 3. RESUME with TnR = 1, while SCTLR.CFRE is still what the bank had, so the master
    ///    gets an abort (not zeros) for the terminated transaction;
    /// 4. FSR.SS polled until clear; a fault bit or MULTI that appeared in between (RESUME
    ///    ignored) is cleared the same way and RESUME written again, until
    ///    `resume_timeout_us` (then [`SmmuError::StallNotReleased`]).
    ///
    /// The caller disables the bank afterwards.
    fn terminate_stale_stall(&mut self, index: u16) -> Result<()> {
        let offset = self.caps.context_bank_offset(usize::from(index));
        let regs = ContextBankRegs::new(&self.bus, offset)?;
        if regs.fsr().get() & FSR_SS == 0 {
            return Ok(());
        }
        let sctlr = regs.sctlr().get();
        regs.sctlr()
            .set(sctlr & !(SCTLR::CFCFG::SET.value | SCTLR::CFIE::SET.value));
        let mut terminated = 0u64;
        let released = hal::delay::poll_until(
            &mut self.delay,
            self.config.resume_timeout_us,
            self.config.poll_interval_us,
            || {
                let fsr = regs.fsr().get();
                if fsr & FSR_SS == 0 {
                    return true;
                }
                if terminated == 0 || fsr & (FSR_FAULT_BITS | FSR_MULTI) != 0 {
                    // W1C with exactly the bits read (SS is not cleared by a write).
                    regs.fsr().set(fsr);
                    regs.barrier(hal::barrier::Barrier::DsbSt);
                    regs.resume().write(RESUME::TNR::Terminate);
                    terminated += 1;
                }
                false
            },
        );
        self.stats.terminated += terminated;
        released
            .map(|_| ())
            .map_err(|_| SmmuError::StallNotReleased { context: index })
    }

    /// Global TLB sync: sTLBGSYNC, then poll sTLBGSTATUS.GSACTIVE.
    pub fn sync_global(&mut self) -> Result<()> {
        let gr0 = Gr0::new(&self.bus, 0)?;
        gr0.stlbgsync().set(0);
        hal::delay::poll_until(
            &mut self.delay,
            self.config.sync_timeout_us,
            self.config.poll_interval_us,
            || !gr0.stlbgstatus().is_set(TLBSTATUS::ACTIVE),
        )
        .map_err(|_| SmmuError::TlbSyncTimeout { context: None })?;
        self.stats.tlb_syncs += 1;
        Ok(())
    }

    /// Invalidates every non-secure TLB entry (TLBIALLNSNH) and waits for it.
    pub fn invalidate_all(&mut self) -> Result<()> {
        self.gr0()?.tlbiallnsnh().set(0);
        self.sync_global()
    }

    /// Allocates and programs a stage-1 context bank (see the module docs for the order).
    pub fn alloc_context(&mut self, config: &ContextConfig) -> Result<ContextBank> {
        if !(25..=48).contains(&config.input_bits) {
            return Err(SmmuError::InvalidConfig {
                what: "context input_bits must be 25..=48",
            });
        }
        if !(32..=48).contains(&config.output_bits) || config.output_bits > self.caps.output_bits {
            return Err(SmmuError::InvalidConfig {
                what: "context output_bits must be 32..=48 and at most the SMMU's OAS",
            });
        }
        let root = config.table_root.as_u64();
        if root & 0xfff != 0 || root >> config.output_bits != 0 {
            return Err(SmmuError::InvalidConfig {
                what: "table root must be 4 KiB aligned and within the output size",
            });
        }
        let first = usize::from(self.caps.stage2_only_banks);
        let banks = self.caps.usable_context_banks();
        let index = (first..banks).find(|&i| !self.contexts[i].in_use).ok_or(
            SmmuError::ResourceExhausted {
                what: "context bank",
                capacity: banks.saturating_sub(first) as u32,
            },
        )? as u16;
        let asid = self.free_asid(config.asid, index)?;

        let mut sctlr = SCTLR::M::SET + SCTLR::TRE::SET + SCTLR::AFE::SET + SCTLR::ASIDPNE::SET;
        if config.abort_on_fault {
            sctlr += SCTLR::CFRE::SET;
        }
        if config.fault_interrupt {
            sctlr += SCTLR::CFIE::SET;
        }
        if config.fault_model == FaultModel::Stall {
            sctlr += SCTLR::CFCFG::SET;
        }
        if config.hit_under_fault {
            sctlr += SCTLR::HUPCF::SET;
        }
        let (sh, rgn) = if config.coherent_walk {
            (3, 1) // inner shareable, write-back write-allocate
        } else {
            (2, 0) // outer shareable, non-cacheable
        };

        let gr1 = self.gr1()?;
        gr1.cba2r(usize::from(index))?.write(CBA2R::VA64::SET);
        gr1.cbar(usize::from(index))?
            .write(CBAR::TYPE::S1TranslateS2Bypass + CBAR::BPSHCFG.val(3) + CBAR::MEMATTR.val(0xf));
        let cb = self.bank_regs(index)?;
        cb.tcr2().write(
            TCR2::PASIZE.val(bits_to_size(config.output_bits)) + TCR2::AS::SET + TCR2::SEP.val(7),
        );
        cb.tcr().write(
            TCR::T0SZ.val(64 - u32::from(config.input_bits))
                + TCR::TG0.val(0)
                + TCR::SH0.val(sh)
                + TCR::ORGN0.val(rgn)
                + TCR::IRGN0.val(rgn)
                + TCR::EPD1::SET,
        );
        cb.ttbr0()
            .write(TTBR::BADDR.val(root) + TTBR::ASID.val(u64::from(asid)));
        cb.ttbr1().write(TTBR::ASID.val(u64::from(asid)));
        cb.mair0().set(config.mair as u32);
        cb.mair1().set((config.mair >> 32) as u32);
        cb.fsr().set(FSR_W1C);
        cb.barrier(hal::barrier::Barrier::DsbSt);
        cb.sctlr().write(sctlr);

        self.contexts[usize::from(index)] = ContextState {
            in_use: true,
            asid,
            sctlr: sctlr.value,
            fault_model: config.fault_model,
            stall_pending: false,
            streams: 0,
        };
        Ok(ContextBank(index))
    }

    /// The ASID for a new context in bank `index`: the one asked for, or by default the bank's
    /// index as Linux does (the lowest free ASID above it if an explicit ASID took it). An
    /// ASID must not be shared: every stage-1 bank has VMID 0 (CBAR.VMID is not written), and
    /// MMU-500 tags TLB entries with VMID and ASID, not with the bank (MMU-500 TRM,
    /// SMMU_CBn_TLBIALL and TLBIASID), so two banks with one ASID would translate through
    /// each other's cached entries.
    fn free_asid(&self, wanted: Option<u16>, index: u16) -> Result<u16> {
        let owner = |asid: u16| {
            self.contexts
                .iter()
                .position(|c| c.in_use && c.asid == asid)
                .map(|i| i as u16)
        };
        match wanted {
            Some(asid) => match owner(asid) {
                Some(index) => Err(SmmuError::AsidInUse { asid, index }),
                None => Ok(asid),
            },
            None => (index..=u16::MAX)
                .chain(0..index)
                .find(|&a| owner(a).is_none())
                .ok_or(SmmuError::ResourceExhausted {
                    what: "ASID",
                    capacity: 1 << 16,
                }),
        }
    }

    /// Disables a context bank and invalidates its ASID. Fails while streams are attached.
    /// A stalled transaction is terminated first.
    pub fn free_context(&mut self, cb: ContextBank) -> Result<()> {
        let state = *self.context(cb)?;
        if state.streams != 0 {
            return Err(SmmuError::ContextInUse {
                index: cb.0,
                streams: state.streams,
            });
        }
        if state.stall_pending {
            self.resume(cb, ResumeAction::Terminate)?;
        }
        {
            let regs = self.bank_regs(cb.0)?;
            regs.sctlr().set(0);
            regs.fsr().set(FSR_W1C);
        }
        self.invalidate_context(cb)?;
        self.contexts[usize::from(cb.0)] = ContextState::FREE;
        Ok(())
    }

    /// The ASID of an allocated context bank.
    pub fn context_asid(&self, cb: ContextBank) -> Result<u16> {
        Ok(self.context(cb)?.asid)
    }

    /// The fault model of an allocated context bank.
    pub fn context_fault_model(&self, cb: ContextBank) -> Result<FaultModel> {
        Ok(self.context(cb)?.fault_model)
    }

    /// Whether the driver has taken a stalled fault on `cb` that was not resumed yet.
    pub fn stall_pending(&self, cb: ContextBank) -> Result<bool> {
        Ok(self.context(cb)?.stall_pending)
    }

    /// The allocated context banks.
    pub fn contexts(&self) -> impl Iterator<Item = ContextBank> + '_ {
        self.contexts
            .iter()
            .enumerate()
            .filter(|(_, c)| c.in_use)
            .map(|(i, _)| ContextBank(i as u16))
    }

    /// Routes the streams `matcher` matches to `route`, declaring their fault tolerance.
    ///
    /// Fails if the ID or mask has unimplemented bits, if another group already matches one
    /// of the streams, if the context bank is not allocated, or if a stream that is not
    /// stall-tolerant would be routed to a stalling context.
    pub fn attach(
        &mut self,
        matcher: StreamMatch,
        route: StreamRoute,
        fault: StreamFaultConfig,
    ) -> Result<StreamMatchIndex> {
        let id_mask = self.caps.stream_id_mask();
        for v in [matcher.id, matcher.mask] {
            if u32::from(v) & !id_mask != 0 {
                return Err(SmmuError::StreamIdOutOfRange {
                    id: u32::from(v),
                    bits: self.caps.stream_id_bits,
                });
            }
        }
        if let StreamRoute::Translate(cb) = route {
            let state = self.context(cb)?;
            if state.fault_model == FaultModel::Stall && !fault.stall_tolerant {
                return Err(SmmuError::StallOnIntolerantStream {
                    stream: u32::from(matcher.id),
                });
            }
        }
        let groups = self.caps.usable_stream_match_groups();
        if let Some((i, _)) = self.streams[..groups]
            .iter()
            .enumerate()
            .find(|(_, s)| s.in_use && s.matcher.overlaps(&matcher))
        {
            return Err(SmmuError::StreamMatchConflict {
                id: u32::from(matcher.id),
                mask: u32::from(matcher.mask),
                index: i as u16,
            });
        }
        let index =
            (0..groups)
                .find(|&i| !self.streams[i].in_use)
                .ok_or(SmmuError::ResourceExhausted {
                    what: "stream-match group",
                    capacity: groups as u32,
                })?;
        let s2cr = match route {
            StreamRoute::Translate(cb) => S2CR::TYPE::Translate + S2CR::CBNDX.val(u32::from(cb.0)),
            StreamRoute::Bypass => S2CR::TYPE::Bypass + S2CR::CBNDX.val(0),
            StreamRoute::Fault => S2CR::TYPE::Fault + S2CR::CBNDX.val(0),
        };
        {
            let gr0 = self.gr0()?;
            gr0.s2cr(index)?.write(s2cr);
            gr0.smr(index)?.write(
                SMR::ID.val(u32::from(matcher.id))
                    + SMR::MASK.val(u32::from(matcher.mask))
                    + SMR::VALID::SET,
            );
        }
        self.streams[index] = StreamState {
            in_use: true,
            matcher,
            route,
            fault,
        };
        if let StreamRoute::Translate(cb) = route {
            self.context_mut(cb)?.streams += 1;
        }
        Ok(StreamMatchIndex(index as u16))
    }

    /// Removes a stream-match group: the SMR is invalidated first, then the S2CR faults.
    pub fn detach(&mut self, entry: StreamMatchIndex) -> Result<()> {
        let i = usize::from(entry.0);
        let state = *self
            .streams
            .get(i)
            .filter(|s| s.in_use)
            .ok_or(SmmuError::UnknownStreamMatch { index: entry.0 })?;
        {
            let gr0 = self.gr0()?;
            gr0.smr(i)?.set(0);
            gr0.s2cr(i)?.write(S2CR::TYPE::Fault);
        }
        self.streams[i] = StreamState::FREE;
        if let StreamRoute::Translate(cb) = state.route
            && let Ok(c) = self.context_mut(cb)
        {
            c.streams = c.streams.saturating_sub(1);
        }
        Ok(())
    }

    /// The context bank `stream` is translated in, if an attached stream-match entry routes
    /// it to one.
    pub fn stream_context(&self, stream: StreamId) -> Option<ContextBank> {
        self.streams
            .iter()
            .find(|s| s.in_use && s.matcher.matches(stream.0))
            .and_then(|s| match s.route {
                StreamRoute::Translate(cb) => Some(cb),
                _ => None,
            })
    }

    /// The fault tolerance declared for `stream` when it was attached
    /// ([`StreamFaultConfig::NEVER_STALL`] for unknown streams).
    pub fn stream_fault_config(&self, stream: StreamId) -> StreamFaultConfig {
        self.streams
            .iter()
            .find(|s| s.in_use && s.matcher.matches(stream.0))
            .map(|s| s.fault)
            .unwrap_or(StreamFaultConfig::NEVER_STALL)
    }

    /// The TLB maintenance handle of a context bank (for [`crate::pagetable::PageTable`]
    /// operations and [`crate::fault::FaultHandler::fix`]).
    pub fn tlb(&mut self, cb: ContextBank) -> Result<ContextTlb<'_, B, D>> {
        self.context(cb)?;
        Ok(ContextTlb::new(self, cb))
    }

    /// Invalidates every entry of the context's ASID (TLBIASID) and waits for it.
    pub fn invalidate_context(&mut self, cb: ContextBank) -> Result<()> {
        let asid = self.context(cb)?.asid;
        self.bank_regs(cb.0)?.tlbiasid().set(u32::from(asid));
        self.stats.tlbi_asid += 1;
        self.sync_context(cb)
    }

    /// Context TLB sync: TLBSYNC, then poll TLBSTATUS.SACTIVE.
    fn sync_context(&mut self, cb: ContextBank) -> Result<()> {
        let regs =
            ContextBankRegs::new(&self.bus, self.caps.context_bank_offset(usize::from(cb.0)))?;
        regs.tlbsync().set(0);
        hal::delay::poll_until(
            &mut self.delay,
            self.config.sync_timeout_us,
            self.config.poll_interval_us,
            || !regs.tlbstatus().is_set(TLBSTATUS::ACTIVE),
        )
        .map_err(|_| SmmuError::TlbSyncTimeout {
            context: Some(cb.0),
        })?;
        self.stats.tlb_syncs += 1;
        Ok(())
    }

    /// The SCTLR value the driver programmed (CFIE included), for tests and diagnostics.
    pub fn programmed_sctlr(&self, cb: ContextBank) -> Result<u32> {
        Ok(self.context(cb)?.sctlr)
    }

    /// Reads FSR without changing anything.
    pub fn read_fsr(&self, cb: ContextBank) -> Result<u32> {
        self.context(cb)?;
        Ok(self.bank_regs(cb.0)?.fsr().get())
    }

    fn write_fsr_exact(&self, cb: ContextBank, bits: u32) -> Result<()> {
        // W1C: write back exactly the bits that were read, so a fault recorded after the read
        // is not lost (never a read-modify-write of FSR).
        self.bank_regs(cb.0)?.fsr().set(bits);
        Ok(())
    }

    fn write_sctlr(&self, cb: ContextBank, value: u32) -> Result<()> {
        self.bank_regs(cb.0)?.sctlr().set(value);
        Ok(())
    }

    fn cfie_mask() -> u32 {
        SCTLR::CFIE::SET.value
    }
}
