//! Stream table entries and context descriptors (IHI0070 §5.2 STE, §5.4 CD), for the one
//! configuration this driver uses: stage 1 only, one CD per stream
//! (S1CDMax = 0), AArch64 4 KiB-granule tables through TTB0.
//!
//! Each dword with packed fields is a `bitfield` view ([`SteDword0`], [`SteDword1`],
//! [`CdDword0`], [`CdDword1`]); whole-dword fields (the CD's MAIR) are plain `u64`s, and
//! the driver encodes with them. Field positions were cross-checked against Linux
//! `arm-smmu-v3.h` (`STRTAB_STE_*`, `CTXDESC_CD_*`). The tests spell every expected dword
//! out bit by bit from the architecture's tables, so the views' positions are pinned there.

use bitfield::bitfield;
use hal::PhysAddr;

use super::caps::ips_encoding;
use crate::{Result, SmmuError};

bitfield! {
    /// STE dword 0 (IHI0070 §5.2): validity, Config and where the stage-1 CDs are.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct SteDword0(pub u64);
    impl Debug;
    /// V, bit 0 (IHI0070 §5.2): the STE is valid.
    pub valid, set_valid: 0;
    /// Config, bits \[3:1\] (IHI0070 §5.2): what the stream does
    /// ([`SteDword0::CONFIG_ABORT`], [`SteDword0::CONFIG_BYPASS`],
    /// [`SteDword0::CONFIG_STAGE1`]; 0b0xx all abort, 0b110/0b111 involve stage 2).
    pub u8, config, set_config: 3, 1;
    /// S1Fmt, bits \[5:4\] (IHI0070 §5.2): format of the CD table (0: linear, a single CD
    /// when S1CDMax = 0).
    pub u8, s1_fmt, set_s1_fmt: 5, 4;
    /// S1ContextPtr, bits \[51:6\] (IHI0070 §5.2): bits \[51:6\] of the CD's (or CD
    /// table's) physical address.
    pub u64, s1_context_ptr, set_s1_context_ptr: 51, 6;
    /// S1CDMax, bits \[63:59\] (IHI0070 §5.2): log2 of the number of CDs (0: one CD, no
    /// substreams).
    pub u8, s1_cd_max, set_s1_cd_max: 63, 59;
}

impl SteDword0 {
    /// Config 0b000: abort every transaction, record nothing (IHI0070 §5.2).
    pub const CONFIG_ABORT: u8 = 0b000;
    /// Config 0b100: bypass both stages.
    pub const CONFIG_BYPASS: u8 = 0b100;
    /// Config 0b101: stage-1 translation, stage 2 bypassed.
    pub const CONFIG_STAGE1: u8 = 0b101;
}

bitfield! {
    /// STE dword 1 (IHI0070 §5.2): how CDs are fetched and the stream's stage-1 controls.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct SteDword1(pub u64);
    impl Debug;
    /// S1DSS, bits \[1:0\] (IHI0070 §5.2): what non-substream traffic does when
    /// S1CDMax > 0.
    pub u8, s1_dss, set_s1_dss: 1, 0;
    /// S1CIR, bits \[3:2\] (IHI0070 §5.2): inner cacheability of CD fetches (0
    /// non-cacheable, 1 write-back read-allocate).
    pub u64, s1_cir, set_s1_cir: 3, 2;
    /// S1COR, bits \[5:4\] (IHI0070 §5.2): outer cacheability of CD fetches.
    pub u64, s1_cor, set_s1_cor: 5, 4;
    /// S1CSH, bits \[7:6\] (IHI0070 §5.2): shareability of CD fetches (2 outer, 3 inner).
    pub u64, s1_csh, set_s1_csh: 7, 6;
    /// S1STALLD, bit 27 (IHI0070 §5.2): stage-1 stalls disabled, the stream never stalls
    /// (only legal with IDR0.STALL_MODEL = 0b00).
    pub s1_stall_disable, set_s1_stall_disable: 27;
    /// EATS, bits \[29:28\] (IHI0070 §5.2): ATS enable.
    pub u8, eats, set_eats: 29, 28;
    /// STRW, bits \[31:30\] (IHI0070 §5.2): stream world (0: Non-secure EL1).
    pub u8, strw, set_strw: 31, 30;
    /// SHCFG, bits \[45:44\] (IHI0070 §5.2): shareability for bypass (1: use the
    /// incoming attribute).
    pub u8, shcfg, set_shcfg: 45, 44;
}

bitfield! {
    /// CD dword 0 (IHI0070 §5.4): the TTB0 walk's configuration, fault behaviour and ASID.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct CdDword0(pub u64);
    impl Debug;
    /// T0SZ, bits \[5:0\] (IHI0070 §5.4): the input size of TTB0 is 64 - T0SZ bits.
    pub u8, t0sz, set_t0sz: 5, 0;
    /// TG0, bits \[7:6\] (IHI0070 §5.4): TTB0 granule (0: 4 KiB).
    pub u8, tg0, set_tg0: 7, 6;
    /// IR0, bits \[9:8\] (IHI0070 §5.4): inner cacheability of TTB0 walks (0
    /// non-cacheable, 1 write-back write-allocate).
    pub u64, ir0, set_ir0: 9, 8;
    /// OR0, bits \[11:10\] (IHI0070 §5.4): outer cacheability of TTB0 walks.
    pub u64, or0, set_or0: 11, 10;
    /// SH0, bits \[13:12\] (IHI0070 §5.4): shareability of TTB0 walks (2 outer, 3 inner).
    pub u64, sh0, set_sh0: 13, 12;
    /// EPD0, bit 14 (IHI0070 §5.4): TTB0 walks disabled.
    pub epd0, set_epd0: 14;
    /// ENDI, bit 15 (IHI0070 §5.4): big-endian tables.
    pub endi, set_endi: 15;
    /// EPD1, bit 30 (IHI0070 §5.4): TTB1 walks disabled.
    pub epd1, set_epd1: 30;
    /// V, bit 31 (IHI0070 §5.4): the CD is valid.
    pub valid, set_valid: 31;
    /// IPS, bits \[34:32\] (IHI0070 §5.4): intermediate (output) physical size, in the
    /// IDR5.OAS encoding.
    pub u64, ips, set_ips: 34, 32;
    /// AFFD, bit 35 (IHI0070 §5.4): Access flag faults disabled.
    pub affd, set_affd: 35;
    /// AA64, bit 41 (IHI0070 §5.4): AArch64 translation tables.
    pub aa64, set_aa64: 41;
    /// HD, bit 42 (IHI0070 §5.4): hardware update of the dirty state.
    pub hd, set_hd: 42;
    /// HA, bit 43 (IHI0070 §5.4): hardware update of the Access flag.
    pub ha, set_ha: 43;
    /// S, bit 44 (IHI0070 §5.4): faulting transactions stall.
    pub stall, set_stall: 44;
    /// R, bit 45 (IHI0070 §5.4): fault events are recorded.
    pub record, set_record: 45;
    /// A, bit 46 (IHI0070 §5.4): terminated transactions abort (1) or complete RAZ/WI (0).
    pub abort, set_abort: 46;
    /// ASET, bit 47 (IHI0070 §5.4): the ASID is not shared with the PEs' broadcast TLB
    /// maintenance.
    pub aset, set_aset: 47;
    /// ASID, bits \[63:48\] (IHI0070 §5.4).
    pub u16, asid, set_asid: 63, 48;
}

bitfield! {
    /// CD dword 1 (IHI0070 §5.4): the TTB0 address.
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct CdDword1(pub u64);
    impl Debug;
    /// TTB0, bits \[51:4\] (IHI0070 §5.4): bits \[51:4\] of the TTB0 table's physical
    /// address.
    pub u64, ttb0, set_ttb0: 51, 4;
}

/// Size of an STE and of a CD in bytes.
pub const STRUCT_BYTES: usize = 64;

/// Cacheability and shareability of the SMMU's own accesses to its structures (CD fetches,
/// table walks), one setting for all of them, the one SMMU_CR1 gives table and queue
/// accesses (IHI0070 §6.3.11), decided by IDR0.COHACC (§6.3.1; §3.15): an SMMU that cannot
/// access memory coherently gets non-cacheable outer-shareable attributes (cache 0,
/// shareability 2), a coherent one write-back inner shareable (1, 3). Linux does the same
/// for the CD's TTB0 walks (`arm_smmu_domain_finalise` passes `coherent_walk` =
/// `ARM_SMMU_FEAT_COHERENCY` to io-pgtable, `arm_64_lpae_alloc_pgtable_s1` turns it into
/// IRGN0/ORGN0/SH0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WalkAttributes {
    /// Inner and outer cacheability: 0 non-cacheable, 1 write-back (read-allocate for STE
    /// S1CIR/S1COR and CR1, write-allocate for CD IR0/OR0).
    pub cache: u64,
    /// Shareability: 2 outer, 3 inner.
    pub shareability: u64,
}

impl WalkAttributes {
    /// The attributes for an SMMU with (`true`) or without IDR0.COHACC.
    pub const fn new(coherent: bool) -> WalkAttributes {
        if coherent {
            WalkAttributes {
                cache: 1,
                shareability: 3,
            }
        } else {
            WalkAttributes {
                cache: 0,
                shareability: 2,
            }
        }
    }
}

/// A stream table entry: eight little-endian dwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamTableEntry(pub [u64; 8]);

/// What a stream does, decoded from STE.Config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamMode {
    /// V = 0.
    Invalid,
    /// Abort without recording.
    Abort,
    /// Bypass.
    Bypass,
    /// Stage-1 translation through a CD.
    Stage1,
    /// Anything else (stage 2, nested, reserved).
    Other,
}

impl StreamTableEntry {
    /// V = 1, Config = abort: every transaction of the stream is terminated and nothing is
    /// recorded (the state every STE starts in, as Linux does with `disable_bypass`).
    pub fn abort() -> StreamTableEntry {
        let mut dw0 = SteDword0(0);
        dw0.set_valid(true);
        dw0.set_config(SteDword0::CONFIG_ABORT);
        StreamTableEntry([dw0.0, 0, 0, 0, 0, 0, 0, 0])
    }

    /// V = 1, Config = bypass, incoming shareability.
    pub fn bypass() -> StreamTableEntry {
        let mut dw0 = SteDword0(0);
        dw0.set_valid(true);
        dw0.set_config(SteDword0::CONFIG_BYPASS);
        let mut dw1 = SteDword1(0);
        dw1.set_shcfg(1);
        StreamTableEntry([dw0.0, dw1.0, 0, 0, 0, 0, 0, 0])
    }

    /// Stage-1 translation through the single CD at `cd` (64-byte aligned, below 2^52).
    /// `s1stalld` from [`super::Capabilities::s1stalld_for`]; Non-secure EL1 stream world.
    ///
    /// CD fetches get the attributes SMMU_CR1 gives table walks ([`WalkAttributes`]): with
    /// `coherent` (IDR0.COHACC) write-back read-allocate inner shareable (S1CIR = S1COR = 1,
    /// S1CSH = 3, what Linux `arm_smmu_make_cdtable_ste` always writes), otherwise
    /// non-cacheable outer shareable (0, 0, 2), so the SMMU does not look for a CD in a cache
    /// it cannot snoop (mainline Linux does not yet do this for the STE; a 2025 patch on the
    /// linux-iommu list, "iommu/arm-smmu-v3: Maintain valid access attributes for
    /// non-coherent SMMU", makes the STE and CR1 follow COHACC the same way).
    pub fn stage1(cd: PhysAddr, s1stalld: bool, coherent: bool) -> Result<StreamTableEntry> {
        let addr = cd.as_u64();
        if !addr.is_multiple_of(STRUCT_BYTES as u64) || addr >> 52 != 0 {
            return Err(SmmuError::InvalidConfig {
                what: "CD address must be 64-byte aligned and below 2^52",
            });
        }
        let mut dw0 = SteDword0(0);
        dw0.set_valid(true);
        dw0.set_config(SteDword0::CONFIG_STAGE1);
        dw0.set_s1_fmt(0);
        dw0.set_s1_context_ptr(addr >> 6);
        dw0.set_s1_cd_max(0);
        let walk = WalkAttributes::new(coherent);
        let mut dw1 = SteDword1(0);
        dw1.set_s1_dss(0);
        dw1.set_s1_cir(walk.cache);
        dw1.set_s1_cor(walk.cache);
        dw1.set_s1_csh(walk.shareability);
        dw1.set_s1_stall_disable(s1stalld);
        dw1.set_strw(0);
        Ok(StreamTableEntry([dw0.0, dw1.0, 0, 0, 0, 0, 0, 0]))
    }

    /// The decoded Config.
    pub fn mode(&self) -> StreamMode {
        let dw0 = SteDword0(self.0[0]);
        if !dw0.valid() {
            return StreamMode::Invalid;
        }
        match dw0.config() {
            0b000..=0b011 => StreamMode::Abort,
            SteDword0::CONFIG_BYPASS => StreamMode::Bypass,
            SteDword0::CONFIG_STAGE1 => StreamMode::Stage1,
            _ => StreamMode::Other,
        }
    }
}

/// What a stage-1 context descriptor holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CdConfig {
    /// The context's ASID (tags its TLB entries).
    pub asid: u16,
    /// Level-0 (or start-level) table: `PageTable::root()`.
    pub ttb0: PhysAddr,
    /// Input address bits (25..=48): T0SZ = 64 - input_bits.
    pub input_bits: u8,
    /// Output address bits: CD.IPS (the smallest encoding that covers them).
    pub output_bits: u8,
    /// MAIR (CD dword 3).
    pub mair: u64,
    /// Stall on fault (CD.S).
    pub stall: bool,
    /// Record fault events (CD.R). QEMU 7.2 drops events silently with R = 0
    /// (`decode_cd`, `smmuv3_translate`).
    pub record: bool,
    /// Terminate with abort (CD.A); must be 1 when IDR0.TERM_MODEL = 1.
    pub abort: bool,
    /// The SMMU accesses memory coherently (IDR0.COHACC): TTB0 walk attributes
    /// ([`WalkAttributes`]).
    pub coherent: bool,
}

/// A context descriptor: eight little-endian dwords.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContextDescriptor(pub [u64; 8]);

impl ContextDescriptor {
    /// A valid stage-1 CD: AArch64, 4 KiB granule, TTB0 walks with the SMMU_CR1 table
    /// attributes ([`WalkAttributes`]: write-back write-allocate inner shareable with
    /// `coherent`, else non-cacheable outer shareable), TTB1 disabled, little-endian, AF
    /// faults enabled, no hardware AF/dirty updates, ASET = 1 (the ASID is private to the
    /// SMMU, IHI0070 §5.4 CD.ASET).
    pub fn stage1(config: &CdConfig) -> Result<ContextDescriptor> {
        if !(25..=48).contains(&config.input_bits) {
            return Err(SmmuError::InvalidConfig {
                what: "CD input size must be 25..=48 bits (T0SZ 16..=39)",
            });
        }
        let ips = ips_encoding(config.output_bits).ok_or(SmmuError::InvalidConfig {
            what: "CD output size must be at most 52 bits",
        })?;
        let ttb0 = config.ttb0.as_u64();
        if !ttb0.is_multiple_of(16) || ttb0 >> 52 != 0 || ttb0 >> config.output_bits != 0 {
            return Err(SmmuError::OutputAddressOutOfRange {
                phys: config.ttb0,
                bits: config.output_bits,
            });
        }
        let walk = WalkAttributes::new(config.coherent);
        let mut dw0 = CdDword0(0);
        dw0.set_t0sz(64 - config.input_bits);
        dw0.set_tg0(0);
        dw0.set_ir0(walk.cache);
        dw0.set_or0(walk.cache);
        dw0.set_sh0(walk.shareability);
        dw0.set_epd0(false);
        dw0.set_endi(false);
        dw0.set_epd1(true);
        dw0.set_valid(true);
        dw0.set_ips(ips);
        dw0.set_affd(false);
        dw0.set_aa64(true);
        dw0.set_hd(false);
        dw0.set_ha(false);
        dw0.set_stall(config.stall);
        dw0.set_record(config.record);
        dw0.set_abort(config.abort);
        dw0.set_aset(true);
        dw0.set_asid(config.asid);
        let mut dw1 = CdDword1(0);
        dw1.set_ttb0(ttb0 >> 4);
        Ok(ContextDescriptor([
            dw0.0,
            dw1.0,
            0,
            config.mair,
            0,
            0,
            0,
            0,
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abort_and_bypass_stes() {
        // V (bit 0) = 1, Config (bits 3:1) = 0b000: dword 0 = 0x1.
        assert_eq!(StreamTableEntry::abort().0, [0x1, 0, 0, 0, 0, 0, 0, 0]);
        // Config 0b100 -> bits 3:1 = 0b100 -> 0x8, plus V: 0x9. SHCFG [45:44] = 1: 1 << 44.
        assert_eq!(
            StreamTableEntry::bypass().0,
            [0x9, 1 << 44, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(StreamTableEntry::abort().mode(), StreamMode::Abort);
        assert_eq!(StreamTableEntry::bypass().mode(), StreamMode::Bypass);
        assert_eq!(StreamTableEntry([0; 8]).mode(), StreamMode::Invalid);
    }

    #[test]
    fn every_config_decodes_to_its_mode() {
        // Config is dword 0 [3:1] (IHI0070 §5.2): 0b0xx abort, 0b100 bypass, 0b101 stage 1,
        // 0b110 stage 2 and 0b111 nested (Other here). With V (bit 0) clear the STE is
        // invalid whatever Config says; bits outside V and Config do not change the mode.
        let modes = [
            StreamMode::Abort,
            StreamMode::Abort,
            StreamMode::Abort,
            StreamMode::Abort,
            StreamMode::Bypass,
            StreamMode::Stage1,
            StreamMode::Other,
            StreamMode::Other,
        ];
        for (config, mode) in (0u64..8).zip(modes) {
            let dw0 = config << 1;
            assert_eq!(
                StreamTableEntry([dw0 | 1, 0, 0, 0, 0, 0, 0, 0]).mode(),
                mode
            );
            assert_eq!(
                StreamTableEntry([dw0 | 1 | 0xffff_ffff_ffff_fff0, !0, 0, 0, 0, 0, 0, 0]).mode(),
                mode
            );
            assert_eq!(
                StreamTableEntry([dw0, 0, 0, 0, 0, 0, 0, 0]).mode(),
                StreamMode::Invalid
            );
        }
    }

    #[test]
    fn stage1_ste_matches_the_architecture_tables() {
        // CD at 0x4123_4540 (64-byte aligned).
        // dword 0: V = 1 (bit 0); Config = 0b101 at bits 3:1 -> 0b1010 = 0xa; S1Fmt = 0;
        //   S1ContextPtr = PA[51:6] at bits 51:6, i.e. the PA itself since its low 6 bits are
        //   zero: 0x4123_4540; S1CDMax = 0.  -> 0x4123_4540 | 0xa | 0x1 = 0x4123_454b.
        // dword 1: S1DSS = 0; S1CIR = 1 at bits 3:2 -> 0x4; S1COR = 1 at 5:4 -> 0x10;
        //   S1CSH = 3 at 7:6 -> 0xc0; S1STALLD at bit 27 -> 0x0800_0000 when set; STRW = 0.
        //   -> 0xd4 (+ 0x0800_0000).
        let cd = PhysAddr::new(0x4123_4540);
        let ste = StreamTableEntry::stage1(cd, false, true).unwrap();
        assert_eq!(ste.0, [0x4123_454b, 0xd4, 0, 0, 0, 0, 0, 0]);
        assert_eq!(ste.mode(), StreamMode::Stage1);
        let stalld = StreamTableEntry::stage1(cd, true, true).unwrap();
        assert_eq!(stalld.0[1], 0x0800_00d4);
        // Without IDR0.COHACC, CD fetches as CR1's table accesses: S1CIR = S1COR = 0
        // (non-cacheable), S1CSH = 2 (outer) at 7:6 -> 0x80.
        let nc = StreamTableEntry::stage1(cd, false, false).unwrap();
        assert_eq!(nc.0, [0x4123_454b, 0x80, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            StreamTableEntry::stage1(cd, true, false).unwrap().0[1],
            0x0800_0080
        );
        assert!(StreamTableEntry::stage1(PhysAddr::new(0x4123_4548), false, true).is_err());
        assert!(StreamTableEntry::stage1(PhysAddr::new(1 << 52), false, true).is_err());
    }

    #[test]
    fn stage1_cd_matches_the_architecture_tables() {
        // The QEMU configuration: ASID 0x0123, TTB0 0x4555_6000, 48-bit input, 44-bit output,
        // MAIR 0x0004_ff44, S = 0, R = 1, A = 1, IDR0.COHACC = 1.
        // dword 0, field by field (IHI0070 §5.4):
        //   T0SZ  [5:0]   = 64 - 48 = 16        -> 0x10
        //   TG0   [7:6]   = 0 (4 KiB)           -> 0
        //   IR0   [9:8]   = 1 (WBWA)            -> 0x100
        //   OR0   [11:10] = 1                   -> 0x400
        //   SH0   [13:12] = 3 (inner)           -> 0x3000
        //   EPD1  [30]    = 1                   -> 0x4000_0000
        //   V     [31]    = 1                   -> 0x8000_0000
        //   IPS   [34:32] = 4 (44 bits)         -> 0x4_0000_0000
        //   AA64  [41]    = 1                   -> 0x200_0000_0000
        //   R     [45]    = 1                   -> 0x2000_0000_0000
        //   A     [46]    = 1                   -> 0x4000_0000_0000
        //   ASET  [47]    = 1                   -> 0x8000_0000_0000
        //   ASID  [63:48] = 0x0123              -> 0x0123_0000_0000_0000
        //   sum: 0x0123_e204_c000_3510
        // dword 1: TTB0 [51:4] = PA >> 4 at bit 4, i.e. the PA: 0x4555_6000.
        // dword 3: MAIR.
        let cfg = CdConfig {
            asid: 0x0123,
            ttb0: PhysAddr::new(0x4555_6000),
            input_bits: 48,
            output_bits: 44,
            mair: 0x0004_ff44,
            stall: false,
            record: true,
            abort: true,
            coherent: true,
        };
        let cd = ContextDescriptor::stage1(&cfg).unwrap();
        assert_eq!(
            cd.0,
            [
                0x0123_e204_c000_3510,
                0x4555_6000,
                0,
                0x0004_ff44,
                0,
                0,
                0,
                0
            ]
        );
        // Without IDR0.COHACC the TTB0 walks are non-cacheable outer shareable: IR0 = OR0 = 0
        // (0x100 and 0x400 gone), SH0 = 2 -> 0x2000 instead of 0x3000.
        let nc = ContextDescriptor::stage1(&CdConfig {
            coherent: false,
            ..cfg
        })
        .unwrap();
        assert_eq!(nc.0[0], 0x0123_e204_c000_2010);
        assert_eq!(nc.0[1..], cd.0[1..]);
        // S = 1 adds bit 44; R = 0 removes bit 45; A = 0 removes bit 46.
        let stall = ContextDescriptor::stage1(&CdConfig { stall: true, ..cfg }).unwrap();
        assert_eq!(stall.0[0] ^ cd.0[0], 1 << 44);
        let quiet = ContextDescriptor::stage1(&CdConfig {
            record: false,
            abort: false,
            ..cfg
        })
        .unwrap();
        assert_eq!(cd.0[0] ^ quiet.0[0], (1 << 45) | (1 << 46));
        // 39-bit input: T0SZ = 25 = 0x19.
        let small = ContextDescriptor::stage1(&CdConfig {
            input_bits: 39,
            ..cfg
        })
        .unwrap();
        assert_eq!(small.0[0] & 0x3f, 25);
    }

    #[test]
    fn the_widest_values_fill_their_fields_exactly() {
        // The last 64-byte aligned CD below 2^52: S1ContextPtr [51:6] all ones, Config 0b101,
        // V -> 0x000f_ffff_ffff_ffc0 | 0xa | 0x1.
        let ste = StreamTableEntry::stage1(PhysAddr::new((1 << 52) - 64), true, true).unwrap();
        assert_eq!(
            ste.0,
            [0x000f_ffff_ffff_ffcb, 0x0800_00d4, 0, 0, 0, 0, 0, 0]
        );
        // ASID 0xffff, TTB0 0xffff_ffff_f000 (48-bit output: IPS = 0b101), 25-bit input
        // (T0SZ = 39 = 0x27), S, R and A set, IDR0.COHACC:
        //   T0SZ 0x27 | IR0 0x100 | OR0 0x400 | SH0 0x3000        -> 0x3527
        //   EPD1 bit 30 | V bit 31                              -> 0xc000_0000
        //   IPS 5 at [34:32]                                    -> 0x5_0000_0000
        //   AA64 41 | S 44 | R 45 | A 46 | ASET 47              -> 0xf200_0000_0000
        //   ASID [63:48]                                        -> 0xffff_0000_0000_0000
        let cd = ContextDescriptor::stage1(&CdConfig {
            asid: 0xffff,
            ttb0: PhysAddr::new(0xffff_ffff_f000),
            input_bits: 25,
            output_bits: 48,
            mair: !0,
            stall: true,
            record: true,
            abort: true,
            coherent: true,
        })
        .unwrap();
        assert_eq!(
            cd.0,
            [0xffff_f205_c000_3527, 0xffff_ffff_f000, 0, !0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn bad_cd_configurations_are_refused() {
        let cfg = CdConfig {
            asid: 1,
            ttb0: PhysAddr::new(0x4000_0000),
            input_bits: 48,
            output_bits: 44,
            mair: 0,
            stall: false,
            record: true,
            abort: true,
            coherent: true,
        };
        for bad in [
            CdConfig {
                input_bits: 24,
                ..cfg
            },
            CdConfig {
                input_bits: 49,
                ..cfg
            },
            CdConfig {
                ttb0: PhysAddr::new(0x4000_0008),
                ..cfg
            },
            CdConfig {
                ttb0: PhysAddr::new(1 << 44),
                ..cfg
            },
            CdConfig {
                output_bits: 53,
                ..cfg
            },
        ] {
            assert!(ContextDescriptor::stage1(&bad).is_err(), "{bad:?}");
        }
    }
}
