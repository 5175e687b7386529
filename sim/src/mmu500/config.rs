//! The model's configuration: geometry, identification registers and how much of the fault
//! architecture it implements.

use super::*;

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

    pub(super) fn validate(&self) -> Result<()> {
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

    pub(super) fn idr0(&self) -> u32 {
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

    pub(super) fn idr1(&self) -> u32 {
        // NUMSSDNDXB = 0xF as in the ZynqMP reset value 0x30000F10; no stage-2-only banks.
        let mut v = (self.context_banks as u32 & 0xff) | 0xf << 8;
        v |= (u32::from(self.global_pages_log2) - 1) << 28;
        if self.page_64k {
            v |= 1 << 31;
        }
        v
    }

    pub(super) fn idr2(&self) -> u32 {
        // IAS = OAS = UBS = 48 bits (5), AArch64 4 KiB and 64 KiB granules, 16-bit VMIDs.
        5 | 5 << 4 | 5 << 8 | 1 << 12 | 1 << 14 | IDR2_VMID16
    }

    pub(super) fn idr7(&self) -> u32 {
        u32::from(self.revision.0 & 0xf) << 4 | u32::from(self.revision.1 & 0xf)
    }
}

impl Default for Mmu500Config {
    fn default() -> Self {
        Self::zynqmp()
    }
}
