//! What an SMMUv2 says about itself in IDR0, IDR1, IDR2 and IDR7.

use tock_registers::LocalRegisterCopy;

use super::regs::{IDR0, IDR1, IDR2, IDR7};
use crate::{Result, SmmuError};

/// Most context banks the driver manages (Linux `ARM_SMMU_MAX_CBS` is 128 too).
pub const MAX_CONTEXT_BANKS: usize = 128;
/// Most stream-match groups the driver manages (Linux `ARM_SMMU_MAX_SMES`).
pub const MAX_STREAM_MATCH_GROUPS: usize = 128;

/// Capabilities decoded from the identification registers (IHI0062 `SMMU_IDR0..2`, `IDR7`;
/// field positions as Linux `ARM_SMMU_ID0_*`, `ID1_*`, `ID2_*`, `ID7_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Stream-match register groups (IDR0.NUMSMRG; 48 on ZynqMP).
    pub stream_match_groups: u16,
    /// Stream ID bits (IDR0.NUMSIDB; 15 on ZynqMP).
    pub stream_id_bits: u8,
    /// Extended (16-bit, S2CR-valid) stream IDs (IDR0.EXIDS).
    pub extended_stream_ids: bool,
    /// Stream matching (SMRs) is implemented (IDR0.SMS); otherwise stream indexing.
    pub stream_matching: bool,
    /// Stage-1 translation (IDR0.S1TS).
    pub stage1: bool,
    /// Stage-2 translation (IDR0.S2TS).
    pub stage2: bool,
    /// Nested translation (IDR0.NTS).
    pub nested: bool,
    /// Table walks are cache coherent (IDR0.CTTW).
    pub coherent_walk: bool,
    /// Address translation operations exist (IDR0.ATOSNS = 0).
    pub translation_ops: bool,
    /// Context interrupts (IDR0.NUMIRPT).
    pub context_interrupts: u8,
    /// Context banks (IDR1.NUMCB; 16 on ZynqMP).
    pub context_banks: u16,
    /// Stage-2-only context banks; they are numbered first (IDR1.NUMS2CB; 0 on ZynqMP).
    pub stage2_only_banks: u16,
    /// Register page size in bytes (IDR1.PAGESIZE: 4 KiB or 64 KiB).
    pub page_size: usize,
    /// Pages of global space; the context banks start after them (2^(NUMPAGENDXB + 1)).
    pub global_pages: usize,
    /// Input address size in bits (IDR2.IAS).
    pub input_bits: u8,
    /// Output address size in bits (IDR2.OAS).
    pub output_bits: u8,
    /// Upstream bus address size in bits (IDR2.UBS; 64 for encoding 0xF).
    pub upstream_bits: u8,
    /// AArch64 4 KiB granule tables (IDR2.PTFS_4K).
    pub aarch64_4k: bool,
    /// AArch64 16 KiB granule tables.
    pub aarch64_16k: bool,
    /// AArch64 64 KiB granule tables.
    pub aarch64_64k: bool,
    /// 16-bit VMIDs (IDR2.VMID16).
    pub vmid16: bool,
    /// Implementation revision (IDR7 MAJOR, MINOR): MMU-500 rMAJORpMINOR.
    pub revision: (u8, u8),
}

/// IPS-style size encoding (IDR2.IAS/OAS, TCR2.PASIZE): 0 = 32, 1 = 36, 2 = 40, 3 = 42,
/// 4 = 44, 5 = 48 bits (Linux `arm_smmu_id_size_to_bits`, which maps anything larger to 48).
pub const fn size_to_bits(encoding: u32) -> u8 {
    match encoding {
        0 => 32,
        1 => 36,
        2 => 40,
        3 => 42,
        4 => 44,
        _ => 48,
    }
}

/// The IPS encoding of an address size (the inverse of [`size_to_bits`], rounding up).
pub const fn bits_to_size(bits: u8) -> u32 {
    match bits {
        0..=32 => 0,
        33..=36 => 1,
        37..=40 => 2,
        41..=42 => 3,
        43..=44 => 4,
        _ => 5,
    }
}

impl Capabilities {
    /// Decodes the raw identification registers.
    pub fn decode(idr0: u32, idr1: u32, idr2: u32, idr7: u32) -> Capabilities {
        let id0 = LocalRegisterCopy::<u32, IDR0::Register>::new(idr0);
        let id1 = LocalRegisterCopy::<u32, IDR1::Register>::new(idr1);
        let id2 = LocalRegisterCopy::<u32, IDR2::Register>::new(idr2);
        let id7 = LocalRegisterCopy::<u32, IDR7::Register>::new(idr7);
        let ubs = id2.read(IDR2::UBS);
        Capabilities {
            stream_match_groups: id0.read(IDR0::NUMSMRG) as u16,
            stream_id_bits: id0.read(IDR0::NUMSIDB) as u8,
            extended_stream_ids: id0.is_set(IDR0::EXIDS),
            stream_matching: id0.is_set(IDR0::SMS),
            stage1: id0.is_set(IDR0::S1TS),
            stage2: id0.is_set(IDR0::S2TS),
            nested: id0.is_set(IDR0::NTS),
            coherent_walk: id0.is_set(IDR0::CTTW),
            translation_ops: !id0.is_set(IDR0::ATOSNS),
            context_interrupts: id0.read(IDR0::NUMIRPT) as u8,
            context_banks: id1.read(IDR1::NUMCB) as u16,
            stage2_only_banks: id1.read(IDR1::NUMS2CB) as u16,
            page_size: if id1.is_set(IDR1::PAGESIZE) {
                0x1_0000
            } else {
                0x1000
            },
            global_pages: 1 << (id1.read(IDR1::NUMPAGENDXB) + 1),
            input_bits: size_to_bits(id2.read(IDR2::IAS)),
            output_bits: size_to_bits(id2.read(IDR2::OAS)),
            upstream_bits: if ubs == 0xf { 64 } else { size_to_bits(ubs) },
            aarch64_4k: id2.is_set(IDR2::PTFS_4K),
            aarch64_16k: id2.is_set(IDR2::PTFS_16K),
            aarch64_64k: id2.is_set(IDR2::PTFS_64K),
            vmid16: id2.is_set(IDR2::VMID16),
            revision: (id7.read(IDR7::MAJOR) as u8, id7.read(IDR7::MINOR) as u8),
        }
    }

    /// Checks that the driver can work with this SMMU: stage 1 with AArch64 4 KiB tables, stream
    /// matching, at least one stage-1 context bank, a register window of at least
    /// `window_bytes`. (Extended stream IDs are left disabled, sCR0.EXIDENABLE = 0, which keeps
    /// the SMR layout with VALID in bit 31 that the driver programs.)
    pub fn check_usable(&self, window_bytes: usize) -> Result<()> {
        let unsupported = |what| Err(SmmuError::Unsupported { what });
        if !self.stage1 {
            return unsupported("stage-1 translation (IDR0.S1TS)");
        }
        if !self.aarch64_4k {
            return unsupported("AArch64 4 KiB granule tables (IDR2.PTFS_4K)");
        }
        if !self.stream_matching {
            return unsupported("stream matching (IDR0.SMS)");
        }
        if self.context_banks <= self.stage2_only_banks {
            return unsupported("a stage-1 capable context bank (IDR1.NUMCB > NUMS2CB)");
        }
        if self.stream_match_groups == 0 {
            return unsupported("stream-match groups (IDR0.NUMSMRG = 0)");
        }
        if self.window_bytes() > window_bytes {
            return Err(SmmuError::InvalidConfig {
                what: "the register window is smaller than 2 * NUMPAGE * PAGESIZE",
            });
        }
        Ok(())
    }

    /// Size of the whole register window: global space plus as many context bank pages.
    pub fn window_bytes(&self) -> usize {
        2 * self.global_pages * self.page_size
    }

    /// Context banks the driver manages (at most [`MAX_CONTEXT_BANKS`]).
    pub fn usable_context_banks(&self) -> usize {
        (self.context_banks as usize).min(MAX_CONTEXT_BANKS)
    }

    /// Stream-match groups the driver manages (at most [`MAX_STREAM_MATCH_GROUPS`]).
    pub fn usable_stream_match_groups(&self) -> usize {
        (self.stream_match_groups as usize).min(MAX_STREAM_MATCH_GROUPS)
    }

    /// Byte offset of global register page `page` in the window.
    pub fn global_page_offset(&self, page: usize) -> usize {
        page * self.page_size
    }

    /// Byte offset of context bank `index` in the window: `(NUMPAGE + index) * PAGESIZE`
    /// (Linux `ARM_SMMU_CB(smmu, n) = numpage + n`; IHI0062 `SMMU_IDR1`).
    pub fn context_bank_offset(&self, index: usize) -> usize {
        (self.global_pages + index) * self.page_size
    }

    /// Mask of the implemented stream ID bits.
    pub fn stream_id_mask(&self) -> u32 {
        match self.stream_id_bits {
            0 => 0,
            b if b >= 16 => 0xffff,
            b => (1u32 << b) - 1,
        }
    }
}
