//! The model's own register map: offsets and bit positions, written independently of the
//! driver's definitions so that a wrong bit in either shows up as a failing test.
//!
//! Sources: Arm IHI0062 (SMMUv2) register descriptions by name, Xilinx UG1087 `SMMU_GPV`,
//! Linux `drivers/iommu/arm/arm-smmu/arm-smmu.h`.

// Global register space 0 (page 0).
pub const SCR0: usize = 0x000;
pub const SACR: usize = 0x010;
/// sACR bit 26 (MMU-500 r2p0+): while set, context-bank ACTLR writes do not take effect.
pub const SACR_CACHE_LOCK: u32 = 1 << 26;
pub const IDR0: usize = 0x020;
pub const IDR1: usize = 0x024;
pub const IDR2: usize = 0x028;
pub const IDR3: usize = 0x02c;
pub const IDR6: usize = 0x038;
pub const IDR7: usize = 0x03c;
pub const SGFAR: usize = 0x040;
pub const SGFSR: usize = 0x048;
pub const SGFSRRESTORE: usize = 0x04c;
pub const SGFSYNR0: usize = 0x050;
pub const SGFSYNR1: usize = 0x054;
pub const SGFSYNR2: usize = 0x058;
pub const TLBIVMID: usize = 0x064;
pub const TLBIALLNSNH: usize = 0x068;
pub const TLBIALLH: usize = 0x06c;
pub const STLBGSYNC: usize = 0x070;
pub const STLBGSTATUS: usize = 0x074;
pub const SMR0: usize = 0x800;
pub const S2CR0: usize = 0xc00;

// Global register space 1 (page 1).
pub const CBAR0: usize = 0x000;
pub const CBFRSYNRA0: usize = 0x400;
pub const CBA2R0: usize = 0x800;

// Context bank page.
pub const CB_SCTLR: usize = 0x000;
pub const CB_ACTLR: usize = 0x004;
pub const CB_RESUME: usize = 0x008;
pub const CB_TCR2: usize = 0x010;
pub const CB_TTBR0: usize = 0x020;
pub const CB_TTBR1: usize = 0x028;
pub const CB_TCR: usize = 0x030;
pub const CB_CONTEXTIDR: usize = 0x034;
pub const CB_MAIR0: usize = 0x038;
pub const CB_MAIR1: usize = 0x03c;
pub const CB_PAR: usize = 0x050;
pub const CB_FSR: usize = 0x058;
pub const CB_FSRRESTORE: usize = 0x05c;
pub const CB_FAR: usize = 0x060;
pub const CB_FSYNR0: usize = 0x068;
pub const CB_FSYNR1: usize = 0x06c;
pub const CB_TLBIVA: usize = 0x600;
pub const CB_TLBIVAA: usize = 0x608;
pub const CB_TLBIASID: usize = 0x610;
pub const CB_TLBIALL: usize = 0x618;
pub const CB_TLBIVAL: usize = 0x620;
pub const CB_TLBIVAAL: usize = 0x628;
pub const CB_TLBSYNC: usize = 0x7f0;
pub const CB_TLBSTATUS: usize = 0x7f4;

/// IDR2.VMID16: 16-bit VMIDs are supported.
pub const IDR2_VMID16: u32 = 1 << 15;

// sCR0 bits.
pub const SCR0_CLIENTPD: u32 = 1 << 0;
pub const SCR0_GFRE: u32 = 1 << 1;
pub const SCR0_GFIE: u32 = 1 << 2;
pub const SCR0_USFCFG: u32 = 1 << 10;
/// 16-bit VMIDs: the VMID comes from CBA2R.VMID16 instead of CBAR.VMID.
pub const SCR0_VMID16EN: u32 = 1 << 31;

// sGFSR bits.
pub const SGFSR_ICF: u32 = 1 << 0;
pub const SGFSR_USF: u32 = 1 << 1;
pub const SGFSR_SMCF: u32 = 1 << 2;
pub const SGFSR_UCBF: u32 = 1 << 3;
pub const SGFSR_MULTI: u32 = 1 << 31;

// SMR / S2CR.
pub const SMR_VALID: u32 = 1 << 31;
pub const S2CR_TYPE_SHIFT: u32 = 16;
pub const S2CR_TYPE_TRANSLATE: u32 = 0;
pub const S2CR_TYPE_BYPASS: u32 = 1;
pub const S2CR_TYPE_FAULT: u32 = 2;
pub const S2CR_WRITABLE: u32 = 0xff | 1 << 10 | 3 << 16 | 3 << 24;

// CBAR / CBA2R.
pub const CBAR_TYPE_SHIFT: u32 = 16;
pub const CBAR_TYPE_S1_S2BYPASS: u32 = 1;
pub const CBAR_WRITABLE: u32 = 0xff03_f3ff;
pub const CBA2R_VA64: u32 = 1 << 0;
/// CBA2R.VMID16, bits [31:16].
pub const CBA2R_VMID16_SHIFT: u32 = 16;
/// CBAR.VMID (8-bit VMID mode), bits [7:0].
pub const CBAR_VMID_MASK: u32 = 0xff;

// SCTLR.
pub const SCTLR_M: u32 = 1 << 0;
pub const SCTLR_AFFD: u32 = 1 << 3;
pub const SCTLR_CFRE: u32 = 1 << 5;
pub const SCTLR_CFIE: u32 = 1 << 6;
pub const SCTLR_CFCFG: u32 = 1 << 7;
pub const SCTLR_HUPCF: u32 = 1 << 8;
/// UG1087 `SMMU_CBn_SCTLR` reset value (HUPCF set).
pub const SCTLR_RESET: u32 = 0x100;
/// UG1087 `SMMU_CBn_ACTLR` reset value.
pub const ACTLR_RESET: u32 = 0x3;

// TCR / TCR2.
pub const TCR_T0SZ_MASK: u32 = 0x3f;
pub const TCR_EPD0: u32 = 1 << 7;
pub const TCR_TG0_SHIFT: u32 = 14;
pub const TCR2_PASIZE_MASK: u32 = 0x7;
/// TCR2.AS: 16-bit ASIDs (0: the low 8 bits of TTBR0.ASID and of TLBI values count).
pub const TCR2_AS: u32 = 1 << 4;

// FSR.
pub const FSR_TF: u32 = 1 << 1;
pub const FSR_AFF: u32 = 1 << 2;
pub const FSR_PF: u32 = 1 << 3;
pub const FSR_EF: u32 = 1 << 4;
pub const FSR_ASF: u32 = 1 << 7;
/// Bits 8:1.
pub const FSR_FAULTS: u32 = 0x1fe;
pub const FSR_SS: u32 = 1 << 30;
pub const FSR_MULTI: u32 = 1 << 31;
/// FSR.FORMAT (bits 10:9): 0b10 for a fault recorded in an AArch64 context (Linux
/// `ARM_SMMU_CB_FSR_FORMAT`); shown with the fault, gone when the fault bits are cleared.
pub const FSR_FORMAT_AARCH64: u32 = 0b10 << 9;

// FSYNR0.
pub const FSYNR0_WNR: u32 = 1 << 4;
pub const FSYNR0_PNU: u32 = 1 << 5;
pub const FSYNR0_IND: u32 = 1 << 6;
pub const FSYNR0_PTWF: u32 = 1 << 10;
pub const FSYNR0_AFR: u32 = 1 << 11;

/// RESUME.TnR.
pub const RESUME_TERMINATE: u32 = 1 << 0;

/// TLBSTATUS.SACTIVE / sTLBGSTATUS.GSACTIVE.
pub const SYNC_ACTIVE: u32 = 1 << 0;

/// The address-size encoding of IDR2.IAS/OAS and TCR2.PASIZE: 0 = 32, 1 = 36, 2 = 40, 3 = 42,
/// 4 = 44, 5 = 48 bits.
pub fn size_bits(encoding: u32) -> u8 {
    match encoding {
        0 => 32,
        1 => 36,
        2 => 40,
        3 => 42,
        4 => 44,
        _ => 48,
    }
}
