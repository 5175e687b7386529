//! SMMUv2 / MMU-500 registers: fields (tock-registers) and register blocks (`hal`).
//!
//! Sources, for every register below:
//! - Arm IHI0062 (SMMU architecture version 2.0), chapters "Global Address Space 0", "Global
//!   Address Space 1" and "Translation Context Address Space" (register by register name);
//! - Arm DDI0517 (CoreLink MMU-500 TRM) for the MMU-500 implementation registers (sACR,
//!   ACTLR) and for what MMU-500 does not honour;
//! - Xilinx UG1087 (Zynq UltraScale+ register reference), module `SMMU_GPV`, whose register
//!   names are given as "UG1087 `NAME`";
//! - Linux `drivers/iommu/arm/arm-smmu/arm-smmu.h` (macro names given as "Linux `NAME`"),
//!   which was read to check every offset and bit position.
//!
//! The driver never relies on a bit that only one of these sources names.

pub use fields::*;

/// Register fields. Every register and field has a doc comment; the helper items
/// `register_bitfields!` generates have none, hence the `allow`.
#[allow(missing_docs)]
pub mod fields {
    use tock_registers::register_bitfields;

    register_bitfields![u32,
        /// sCR0, Secure/Non-secure configuration register 0 (GR0 0x000; IHI0062 `SMMU_sCR0`,
        /// UG1087 `SMMU_SCR0`, Linux `ARM_SMMU_GR0_sCR0`).
        pub SCR0 [
            /// 1: the SMMU is bypassed entirely (client port disable).
            CLIENTPD OFFSET(0) NUMBITS(1) [],
            /// Global fault report enable: a global fault returns an abort to the master.
            GFRE OFFSET(1) NUMBITS(1) [],
            /// Global fault interrupt enable.
            GFIE OFFSET(2) NUMBITS(1) [],
            /// Extended stream IDs (16-bit SMR.ID with the valid bit moved to S2CR).
            EXIDENABLE OFFSET(3) NUMBITS(1) [],
            /// Global configuration fault report enable.
            GCFGFRE OFFSET(4) NUMBITS(1) [],
            /// Global configuration fault interrupt enable.
            GCFGFIE OFFSET(5) NUMBITS(1) [],
            /// Stall disable override (MMU-500 does not honour it: DDI0517 §2.3.4).
            STALLD OFFSET(8) NUMBITS(1) [],
            /// Global stall enable override (not honoured by MMU-500 either).
            GSE OFFSET(9) NUMBITS(1) [],
            /// Unidentified stream fault configuration: 1 = unmatched streams fault, 0 = bypass.
            USFCFG OFFSET(10) NUMBITS(1) [],
            /// VMID private namespace enable.
            VMIDPNE OFFSET(11) NUMBITS(1) [],
            /// Private TLB maintenance (ignore broadcast TLB maintenance).
            PTM OFFSET(12) NUMBITS(1) [],
            /// Force broadcast of TLB maintenance.
            FB OFFSET(13) NUMBITS(1) [],
            /// Barrier shareability upgrade.
            BSU OFFSET(14) NUMBITS(2) [],
            /// 16-bit VMIDs.
            VMID16EN OFFSET(31) NUMBITS(1) []
        ],
        /// sACR, auxiliary configuration (GR0 0x010; MMU-500 implementation defined, DDI0517;
        /// Linux `ARM_MMU500_ACR_*` in arm-smmu-impl.c).
        pub SACR [
            /// Unmatched streams may allocate bypass TLB entries.
            SMTNMB_TLBEN OFFSET(8) NUMBITS(1) [],
            /// Bypass S2CRs may allocate TLB entries.
            S2CRB_TLBEN OFFSET(10) NUMBITS(1) [],
            /// r2p0 onwards: must be clear before context-bank ACTLR writes stick.
            CACHE_LOCK OFFSET(26) NUMBITS(1) []
        ],
        /// IDR0, identification register 0 (GR0 0x020; IHI0062 `SMMU_IDR0`, UG1087 `SMMU_SIDR0`,
        /// Linux `ARM_SMMU_ID0_*`).
        pub IDR0 [
            /// Number of stream mapping register groups.
            NUMSMRG OFFSET(0) NUMBITS(8) [],
            /// Extended stream IDs supported.
            EXIDS OFFSET(8) NUMBITS(1) [],
            /// Number of stream ID bits.
            NUMSIDB OFFSET(9) NUMBITS(4) [],
            /// Coherent translation table walks.
            CTTW OFFSET(14) NUMBITS(1) [],
            /// Number of context interrupts.
            NUMIRPT OFFSET(16) NUMBITS(8) [],
            /// AArch32 short-descriptor tables not supported.
            PTFS_NO_AARCH32S OFFSET(24) NUMBITS(1) [],
            /// AArch32 tables not supported at all.
            PTFS_NO_AARCH32 OFFSET(25) NUMBITS(1) [],
            /// 1: address translation operations are NOT supported.
            ATOSNS OFFSET(26) NUMBITS(1) [],
            /// Stream matching supported (SMR groups exist).
            SMS OFFSET(27) NUMBITS(1) [],
            /// Nested translation supported.
            NTS OFFSET(28) NUMBITS(1) [],
            /// Stage 2 translation supported.
            S2TS OFFSET(29) NUMBITS(1) [],
            /// Stage 1 translation supported.
            S1TS OFFSET(30) NUMBITS(1) []
        ],
        /// IDR1 (GR0 0x024; `SMMU_IDR1`, UG1087 `SMMU_SIDR1`, reset 0x30000F10 on ZynqMP).
        pub IDR1 [
            /// Number of context banks.
            NUMCB OFFSET(0) NUMBITS(8) [],
            /// Number of stage-2-only context banks (they come first).
            NUMS2CB OFFSET(16) NUMBITS(8) [],
            /// log2(number of global pages) - 1.
            NUMPAGENDXB OFFSET(28) NUMBITS(3) [],
            /// Register page size: 0 = 4 KiB, 1 = 64 KiB.
            PAGESIZE OFFSET(31) NUMBITS(1) []
        ],
        /// IDR2 (GR0 0x028; `SMMU_IDR2`, Linux `ARM_SMMU_ID2_*`).
        pub IDR2 [
            /// Input address size (encoding as IPS: 0 = 32 ... 5 = 48 bits).
            IAS OFFSET(0) NUMBITS(4) [],
            /// Output address size.
            OAS OFFSET(4) NUMBITS(4) [],
            /// Upstream bus address size.
            UBS OFFSET(8) NUMBITS(4) [],
            /// AArch64 4 KiB granule supported.
            PTFS_4K OFFSET(12) NUMBITS(1) [],
            /// AArch64 16 KiB granule supported.
            PTFS_16K OFFSET(13) NUMBITS(1) [],
            /// AArch64 64 KiB granule supported.
            PTFS_64K OFFSET(14) NUMBITS(1) [],
            /// 16-bit VMIDs supported.
            VMID16 OFFSET(15) NUMBITS(1) []
        ],
        /// IDR7 (GR0 0x03C; implementation revision, Linux `ARM_SMMU_ID7_*`).
        pub IDR7 [
            /// Minor revision (the `p` of rNpM).
            MINOR OFFSET(0) NUMBITS(4) [],
            /// Major revision (the `r`).
            MAJOR OFFSET(4) NUMBITS(4) []
        ],
        /// sGFSR, global fault status, write-1-to-clear (GR0 0x048; `SMMU_sGFSR`; Linux names
        /// only USF, the other bits are from IHI0062).
        pub SGFSR [
            /// Invalid context fault.
            ICF OFFSET(0) NUMBITS(1) [],
            /// Unidentified stream fault (no SMR matched and sCR0.USFCFG = 1).
            USF OFFSET(1) NUMBITS(1) [],
            /// Stream match conflict fault (several SMRs matched).
            SMCF OFFSET(2) NUMBITS(1) [],
            /// Unimplemented context bank fault.
            UCBF OFFSET(3) NUMBITS(1) [],
            /// Unimplemented context interrupt fault.
            UCIF OFFSET(4) NUMBITS(1) [],
            /// Configuration access fault.
            CAF OFFSET(5) NUMBITS(1) [],
            /// External fault.
            EF OFFSET(6) NUMBITS(1) [],
            /// Permission fault.
            PF OFFSET(7) NUMBITS(1) [],
            /// Unsupported upstream transaction.
            UUT OFFSET(8) NUMBITS(1) [],
            /// Another global fault happened while sGFSR was non-zero.
            MULTI OFFSET(31) NUMBITS(1) []
        ],
        /// sGFSYNR1 (GR0 0x054): bits 15:0 hold the stream ID of a global fault.
        pub SGFSYNR1 [
            /// The offending stream ID.
            STREAMID OFFSET(0) NUMBITS(16) []
        ],
        /// SMR(n), stream match register (GR0 0x800 + 4n; `SMMU_SMRn`, UG1087 `SMMU_SMRn`:
        /// VALID 31, MASK 30:16, ID 14:0 on ZynqMP; Linux `ARM_SMMU_SMR_*`).
        pub SMR [
            /// Stream ID to match (bit 15 is reserved without EXIDS).
            ID OFFSET(0) NUMBITS(15) [],
            /// Stream ID bits to ignore (1 = don't care). 15 bits without EXIDS.
            MASK OFFSET(16) NUMBITS(15) [],
            /// The entry takes part in matching (without EXIDS).
            VALID OFFSET(31) NUMBITS(1) []
        ],
        /// S2CR(n), stream-to-context register (GR0 0xC00 + 4n; `SMMU_S2CRn`, UG1087 reset
        /// TYPE = fault; Linux `ARM_SMMU_S2CR_*`).
        pub S2CR [
            /// Context bank for TYPE = translate.
            CBNDX OFFSET(0) NUMBITS(8) [],
            /// Valid bit of the entry when EXIDS is enabled.
            EXIDVALID OFFSET(10) NUMBITS(1) [],
            /// What matched streams get.
            TYPE OFFSET(16) NUMBITS(2) [
                /// Translate through context bank CBNDX.
                Translate = 0,
                /// Bypass the SMMU.
                Bypass = 1,
                /// Fault every transaction.
                Fault = 2
            ],
            /// Privilege override.
            PRIVCFG OFFSET(24) NUMBITS(2) []
        ],
        /// CBAR(n), context bank attribute register (GR1 0x000 + 4n; `SMMU_CBARn`,
        /// Linux `ARM_SMMU_CBAR_*`).
        pub CBAR [
            /// VMID (stage 2, 8-bit VMID mode).
            VMID OFFSET(0) NUMBITS(8) [],
            /// Stage-1 bypass shareability (Linux uses 3 = non-shareable).
            BPSHCFG OFFSET(8) NUMBITS(2) [],
            /// Stage-1 memory attribute for stage-2 bypass (Linux uses 0xF, write-back).
            MEMATTR OFFSET(12) NUMBITS(4) [],
            /// Context type.
            TYPE OFFSET(16) NUMBITS(2) [
                /// Stage 2 only.
                S2Translate = 0,
                /// Stage 1 translation, stage 2 bypass.
                S1TranslateS2Bypass = 1,
                /// Stage 1 translation, stage 2 fault.
                S1TranslateS2Fault = 2,
                /// Nested.
                Nested = 3
            ],
            /// Interrupt index (SMMUv1 only; SMMUv2 uses the context bank's own interrupt).
            IRPTNDX OFFSET(24) NUMBITS(8) []
        ],
        /// CBFRSYNRA(n), context bank fault restricted syndrome A (GR1 0x400 + 4n;
        /// Linux `ARM_SMMU_GR1_CBFRSYNRA`): the stream ID of the recorded fault.
        pub CBFRSYNRA [
            /// Stream ID.
            SID OFFSET(0) NUMBITS(16) []
        ],
        /// CBA2R(n), context bank attribute register 2 (GR1 0x800 + 4n; Linux `ARM_SMMU_CBA2R_*`).
        pub CBA2R [
            /// AArch64 (VMSAv8-64) descriptor format.
            VA64 OFFSET(0) NUMBITS(1) [],
            /// Monitor context.
            MONC OFFSET(1) NUMBITS(1) [],
            /// 16-bit VMID.
            VMID16 OFFSET(16) NUMBITS(16) []
        ],
        /// SCTLR, context bank system control (CB 0x000; `SMMU_CBn_SCTLR`, UG1087 reset 0x100;
        /// Linux `ARM_SMMU_SCTLR_*`; IHI0062 for the fault-model bits).
        pub SCTLR [
            /// Translation enable.
            M OFFSET(0) NUMBITS(1) [],
            /// TEX remap enable.
            TRE OFFSET(1) NUMBITS(1) [],
            /// Access flag enable (AArch32 AP\[0\] meaning).
            AFE OFFSET(2) NUMBITS(1) [],
            /// Access flag fault disable.
            AFFD OFFSET(3) NUMBITS(1) [],
            /// Big-endian translation tables.
            E OFFSET(4) NUMBITS(1) [],
            /// Context fault report enable: 1 = return an abort to the master on terminate.
            CFRE OFFSET(5) NUMBITS(1) [],
            /// Context fault interrupt enable.
            CFIE OFFSET(6) NUMBITS(1) [],
            /// Context fault configuration: 0 = terminate, 1 = stall.
            CFCFG OFFSET(7) NUMBITS(1) [],
            /// Hit under previous context fault: 1 = later transactions proceed independently.
            HUPCF OFFSET(8) NUMBITS(1) [],
            /// Write permission implies XN.
            WXN OFFSET(9) NUMBITS(1) [],
            /// Unprivileged write permission implies XN.
            UWXN OFFSET(10) NUMBITS(1) [],
            /// ASID private namespace.
            ASIDPNE OFFSET(12) NUMBITS(1) []
        ],
        /// ACTLR, context bank auxiliary control (CB 0x004; MMU-500, DDI0517; reset 0x3 on ZynqMP).
        pub ACTLR [
            /// Cache misses in the TLB.
            CMTLB OFFSET(0) NUMBITS(1) [],
            /// Next-page prefetcher (Linux clears it: MMU-500 errata 841119 and 826419).
            CPRE OFFSET(1) NUMBITS(1) []
        ],
        /// RESUME, transaction resume (CB 0x008; Linux `ARM_SMMU_RESUME_TERMINATE`).
        pub RESUME [
            /// Terminate, not retry: 0 = retry the stalled transaction, 1 = terminate it.
            TNR OFFSET(0) NUMBITS(1) [
                /// Retry the stalled transaction.
                Retry = 0,
                /// Terminate it (abort to the master).
                Terminate = 1
            ]
        ],
        /// TCR2, translation control 2 (CB 0x010; Linux `ARM_SMMU_TCR2_*`).
        pub TCR2 [
            /// Physical address size (IPS encoding).
            PASIZE OFFSET(0) NUMBITS(4) [],
            /// 16-bit ASIDs.
            AS OFFSET(4) NUMBITS(1) [],
            /// Top byte ignore, TTBR0 region.
            TBI0 OFFSET(5) NUMBITS(1) [],
            /// Top byte ignore, TTBR1 region.
            TBI1 OFFSET(6) NUMBITS(1) [],
            /// Non-secure table walks (secure contexts).
            NSCFG0 OFFSET(14) NUMBITS(1) [],
            /// Sign extension position (Linux writes 7, "upstream").
            SEP OFFSET(15) NUMBITS(3) []
        ],
        /// TCR, translation control (CB 0x030; Linux `ARM_SMMU_TCR_*`). Written before the TTBRs.
        pub TCR [
            /// Size offset of the TTBR0 region: input bits = 64 - T0SZ.
            T0SZ OFFSET(0) NUMBITS(6) [],
            /// Disable walks through TTBR0.
            EPD0 OFFSET(7) NUMBITS(1) [],
            /// Inner cacheability of walks through TTBR0.
            IRGN0 OFFSET(8) NUMBITS(2) [],
            /// Outer cacheability of walks through TTBR0.
            ORGN0 OFFSET(10) NUMBITS(2) [],
            /// Shareability of walks through TTBR0.
            SH0 OFFSET(12) NUMBITS(2) [],
            /// Granule of TTBR0: 0 = 4 KiB, 1 = 64 KiB, 2 = 16 KiB.
            TG0 OFFSET(14) NUMBITS(2) [],
            /// Size offset of the TTBR1 region.
            T1SZ OFFSET(16) NUMBITS(6) [],
            /// The ASID comes from TTBR1.
            A1 OFFSET(22) NUMBITS(1) [],
            /// Disable walks through TTBR1.
            EPD1 OFFSET(23) NUMBITS(1) [],
            /// Extended address enable (AArch32 LPAE contexts only).
            EAE OFFSET(31) NUMBITS(1) []
        ],
        /// FSR, context fault status, write-1-to-clear (CB 0x058; UG1087 `SMMU_CBn_FSR`;
        /// Linux `ARM_SMMU_FSR_*`).
        pub FSR [
            /// Translation fault.
            TF OFFSET(1) NUMBITS(1) [],
            /// Access flag fault.
            AFF OFFSET(2) NUMBITS(1) [],
            /// Permission fault.
            PF OFFSET(3) NUMBITS(1) [],
            /// External fault.
            EF OFFSET(4) NUMBITS(1) [],
            /// TLB match conflict fault.
            TLBMCF OFFSET(5) NUMBITS(1) [],
            /// TLB lock fault.
            TLBLKF OFFSET(6) NUMBITS(1) [],
            /// Address size fault.
            ASF OFFSET(7) NUMBITS(1) [],
            /// Unsupported upstream transaction.
            UUT OFFSET(8) NUMBITS(1) [],
            /// Format of the syndrome (read-only).
            FORMAT OFFSET(9) NUMBITS(2) [],
            /// Stall status: a transaction of this context is stalled, waiting for RESUME.
            SS OFFSET(30) NUMBITS(1) [],
            /// Another fault happened while FSR was non-zero; its syndrome was not recorded.
            MULTI OFFSET(31) NUMBITS(1) []
        ],
        /// FSYNR0, context fault syndrome 0 (CB 0x068; IHI0062; Linux `ARM_SMMU_FSYNR0_WNR`).
        pub FSYNR0 [
            /// Lookup level of the fault.
            PLVL OFFSET(0) NUMBITS(2) [],
            /// Write, not read.
            WNR OFFSET(4) NUMBITS(1) [],
            /// Privileged (1) or unprivileged (0) transaction.
            PNU OFFSET(5) NUMBITS(1) [],
            /// Instruction fetch.
            IND OFFSET(6) NUMBITS(1) [],
            /// Non-secure attribute.
            NSATTR OFFSET(8) NUMBITS(1) [],
            /// The fault happened during a table walk.
            PTWF OFFSET(10) NUMBITS(1) [],
            /// An abort was returned to the master.
            AFR OFFSET(11) NUMBITS(1) [],
            /// Stage-1 context bank index (stage-2 faults of nested contexts).
            S1CBNDX OFFSET(16) NUMBITS(8) []
        ],
        /// TLBSTATUS (CB 0x7F4) and sTLBGSTATUS (GR0 0x074): bit 0 is set while a sync is running.
        pub TLBSTATUS [
            /// SACTIVE / GSACTIVE: a TLB synchronisation is in progress.
            ACTIVE OFFSET(0) NUMBITS(1) []
        ]
    ];

    register_bitfields![u64,
        /// TTBR0/TTBR1, AArch64 format (CB 0x020 / 0x028; Linux `ARM_SMMU_TTBRn_ASID`).
        pub TTBR [
            /// Table base address (bits 47:0; low bits below the table alignment are zero).
            BADDR OFFSET(0) NUMBITS(48) [],
            /// ASID (AArch64 format).
            ASID OFFSET(48) NUMBITS(16) []
        ],
        /// TLBIVA / TLBIVAL, AArch64 format (CB 0x600 / 0x620): VA >> 12 in the low bits, ASID
        /// in 63:48 (Linux `arm_smmu_tlb_inv_range_s1`; IHI0062 `SMMU_CBn_TLBIVA`).
        pub TLBIVA [
            /// VA\[55:12\].
            ADDRESS OFFSET(0) NUMBITS(44) [],
            /// ASID.
            ASID OFFSET(48) NUMBITS(16) []
        ]
    ];
}

hal::register_block! {
    /// Global register space 0 (page 0 of the SMMU window).
    pub struct Gr0 {
        /// sCR0 (IHI0062 `SMMU_sCR0`, UG1087 `SMMU_SCR0`).
        (0x000 => pub scr0: Rw u32, SCR0::Register),
        /// sACR (MMU-500, DDI0517; UG1087 `SMMU_SACR`).
        (0x010 => pub sacr: Rw u32, SACR::Register),
        /// IDR0 (`SMMU_IDR0`, UG1087 `SMMU_SIDR0`).
        (0x020 => pub idr0: Ro u32, IDR0::Register),
        /// IDR1 (`SMMU_IDR1`, UG1087 `SMMU_SIDR1`).
        (0x024 => pub idr1: Ro u32, IDR1::Register),
        /// IDR2 (`SMMU_IDR2`, UG1087 `SMMU_SIDR2`).
        (0x028 => pub idr2: Ro u32, IDR2::Register),
        /// IDR7 (`SMMU_IDR7`, UG1087 `SMMU_SIDR7`).
        (0x03c => pub idr7: Ro u32, IDR7::Register),
        /// sGFAR, global faulting address (`SMMU_sGFAR`).
        (0x040 => pub sgfar: Ro u64),
        /// sGFSR, global fault status, W1C (`SMMU_sGFSR`).
        (0x048 => pub sgfsr: Rw u32, SGFSR::Register),
        /// sGFSYNR0 (`SMMU_sGFSYNR0`).
        (0x050 => pub sgfsynr0: Ro u32),
        /// sGFSYNR1 (`SMMU_sGFSYNR1`): the stream ID.
        (0x054 => pub sgfsynr1: Ro u32, SGFSYNR1::Register),
        /// sGFSYNR2 (`SMMU_sGFSYNR2`).
        (0x058 => pub sgfsynr2: Ro u32),
        /// TLBIVMID: invalidate by VMID (`SMMU_TLBIVMID`).
        (0x064 => pub tlbivmid: Wo u32),
        /// TLBIALLNSNH: invalidate all non-secure non-hyp entries (`SMMU_TLBIALLNSNH`).
        (0x068 => pub tlbiallnsnh: Wo u32),
        /// TLBIALLH: invalidate all hyp entries (`SMMU_TLBIALLH`).
        (0x06c => pub tlbiallh: Wo u32),
        /// sTLBGSYNC: start a global TLB sync (`SMMU_sTLBGSYNC`).
        (0x070 => pub stlbgsync: Wo u32),
        /// sTLBGSTATUS: GSACTIVE while the global sync runs (`SMMU_sTLBGSTATUS`).
        (0x074 => pub stlbgstatus: Ro u32, TLBSTATUS::Register),
        /// SMR0..127 (`SMMU_SMRn`); IDR0.NUMSMRG of them exist (48 on ZynqMP).
        (0x800 => pub smr: [Rw u32, SMR::Register; 128, stride 4]),
        /// S2CR0..127 (`SMMU_S2CRn`).
        (0xc00 => pub s2cr: [Rw u32, S2CR::Register; 128, stride 4]),
    }
    size = 0x1000;
}

hal::register_block! {
    /// Global register space 1 (page 1 of the SMMU window): per-context-bank attributes.
    pub struct Gr1 {
        /// CBAR0..127 (`SMMU_CBARn`).
        (0x000 => pub cbar: [Rw u32, CBAR::Register; 128, stride 4]),
        /// CBFRSYNRA0..127 (`SMMU_CBFRSYNRAn`).
        (0x400 => pub cbfrsynra: [Ro u32, CBFRSYNRA::Register; 128, stride 4]),
        /// CBA2R0..127 (`SMMU_CBA2Rn`).
        (0x800 => pub cba2r: [Rw u32, CBA2R::Register; 128, stride 4]),
    }
    size = 0x1000;
}

hal::register_block! {
    /// One translation context bank (page NUMPAGE + n of the SMMU window; UG1087
    /// `SMMU_CBn_*` at 0xFD81_0000 + n * 0x1000 on ZynqMP).
    pub struct ContextBankRegs {
        /// SCTLR (`SMMU_CBn_SCTLR`).
        (0x000 => pub sctlr: Rw u32, SCTLR::Register),
        /// ACTLR (`SMMU_CBn_ACTLR`, MMU-500).
        (0x004 => pub actlr: Rw u32, ACTLR::Register),
        /// RESUME (`SMMU_CBn_RESUME`).
        (0x008 => pub resume: Wo u32, RESUME::Register),
        /// TCR2 (`SMMU_CBn_TCR2`).
        (0x010 => pub tcr2: Rw u32, TCR2::Register),
        /// TTBR0 (`SMMU_CBn_TTBR0`), 64-bit.
        (0x020 => pub ttbr0: Rw u64, TTBR::Register),
        /// TTBR1 (`SMMU_CBn_TTBR1`), 64-bit.
        (0x028 => pub ttbr1: Rw u64, TTBR::Register),
        /// TCR (`SMMU_CBn_TCR`).
        (0x030 => pub tcr: Rw u32, TCR::Register),
        /// CONTEXTIDR (`SMMU_CBn_CONTEXTIDR`).
        (0x034 => pub contextidr: Rw u32),
        /// MAIR0 (`SMMU_CBn_MAIR0`): attributes 0-3.
        (0x038 => pub mair0: Rw u32),
        /// MAIR1 (`SMMU_CBn_MAIR1`): attributes 4-7.
        (0x03c => pub mair1: Rw u32),
        /// FSR, W1C (`SMMU_CBn_FSR`).
        (0x058 => pub fsr: Rw u32, FSR::Register),
        /// FAR, faulting address (`SMMU_CBn_FAR`), 64-bit.
        (0x060 => pub far: Ro u64),
        /// FSYNR0 (`SMMU_CBn_FSYNR0`).
        (0x068 => pub fsynr0: Ro u32, FSYNR0::Register),
        /// FSYNR1 (`SMMU_CBn_FSYNR1`, implementation defined).
        (0x06c => pub fsynr1: Ro u32),
        /// TLBIVA (`SMMU_CBn_TLBIVA`), 64-bit: all levels.
        (0x600 => pub tlbiva: Wo u64, TLBIVA::Register),
        /// TLBIASID (`SMMU_CBn_TLBIASID`).
        (0x610 => pub tlbiasid: Wo u32),
        /// TLBIALL (`SMMU_CBn_TLBIALL`): every entry of the context bank.
        (0x618 => pub tlbiall: Wo u32),
        /// TLBIVAL (`SMMU_CBn_TLBIVAL`), 64-bit: last level only.
        (0x620 => pub tlbival: Wo u64, TLBIVA::Register),
        /// TLBSYNC (`SMMU_CBn_TLBSYNC`): start a context TLB sync.
        (0x7f0 => pub tlbsync: Wo u32),
        /// TLBSTATUS (`SMMU_CBn_TLBSTATUS`): SACTIVE while the sync runs.
        (0x7f4 => pub tlbstatus: Ro u32, TLBSTATUS::Register),
    }
    size = 0x1000;
}
