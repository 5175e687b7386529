//! Stream table entries and context descriptors (IHI0070 §5.2 STE, §5.4 CD), for the one
//! configuration this driver uses: stage 1 only, one CD per stream
//! (S1CDMax = 0), AArch64 4 KiB-granule tables through TTB0.
//!
//! Field positions were cross-checked against Linux `arm-smmu-v3.h` (`STRTAB_STE_*`,
//! `CTXDESC_CD_*`). The tests spell every expected dword out bit by bit from the
//! architecture's tables.

use hal::PhysAddr;
use tock_registers::fields::FieldValue;
use tock_registers::register_bitfields;

use super::caps::ips_encoding;
use crate::{Result, SmmuError};

#[allow(missing_docs)]
mod fields {
    use super::register_bitfields;

    register_bitfields![u64,
        /// STE dword 0 (IHI0070 §5.2).
        pub STE0 [
            /// Valid.
            V OFFSET(0) NUMBITS(1) [],
            /// Config: what the stream does.
            CONFIG OFFSET(1) NUMBITS(3) [
                /// Abort every transaction, record nothing.
                Abort = 0b000,
                /// Bypass both stages.
                Bypass = 0b100,
                /// Stage-1 translation, stage 2 bypass.
                Stage1 = 0b101
            ],
            /// S1Fmt: CD table format (0 = linear / single CD).
            S1FMT OFFSET(4) NUMBITS(2) [],
            /// S1ContextPtr: CD physical address bits \[51:6\].
            S1CONTEXTPTR OFFSET(6) NUMBITS(46) [],
            /// S1CDMax: log2 of the number of CDs (0 = one CD, no substreams).
            S1CDMAX OFFSET(59) NUMBITS(5) []
        ],
        /// STE dword 1 (IHI0070 §5.2).
        pub STE1 [
            /// S1DSS: what non-substream traffic does when S1CDMax > 0.
            S1DSS OFFSET(0) NUMBITS(2) [],
            /// CD fetch inner cacheability (1 = write-back read-allocate).
            S1CIR OFFSET(2) NUMBITS(2) [],
            /// CD fetch outer cacheability.
            S1COR OFFSET(4) NUMBITS(2) [],
            /// CD fetch shareability (3 = inner).
            S1CSH OFFSET(6) NUMBITS(2) [],
            /// Stage-1 stall disable: the stream never stalls (only with STALL_MODEL = 0b00).
            S1STALLD OFFSET(27) NUMBITS(1) [],
            /// ATS enable.
            EATS OFFSET(28) NUMBITS(2) [],
            /// Stream world (0 = Non-secure EL1).
            STRW OFFSET(30) NUMBITS(2) [],
            /// Shareability config for bypass (1 = use incoming).
            SHCFG OFFSET(44) NUMBITS(2) []
        ],
        /// CD dword 0 (IHI0070 §5.4).
        pub CD0 [
            /// Input size of TTB0: 64 - T0SZ bits.
            T0SZ OFFSET(0) NUMBITS(6) [],
            /// TTB0 granule (0 = 4 KiB).
            TG0 OFFSET(6) NUMBITS(2) [],
            /// TTB0 walk inner cacheability (1 = write-back write-allocate).
            IR0 OFFSET(8) NUMBITS(2) [],
            /// TTB0 walk outer cacheability.
            OR0 OFFSET(10) NUMBITS(2) [],
            /// TTB0 walk shareability (3 = inner).
            SH0 OFFSET(12) NUMBITS(2) [],
            /// Disable TTB0 walks.
            EPD0 OFFSET(14) NUMBITS(1) [],
            /// Big-endian tables.
            ENDI OFFSET(15) NUMBITS(1) [],
            /// Disable TTB1 walks.
            EPD1 OFFSET(30) NUMBITS(1) [],
            /// Valid.
            V OFFSET(31) NUMBITS(1) [],
            /// Intermediate (output) physical size, IDR5.OAS encoding.
            IPS OFFSET(32) NUMBITS(3) [],
            /// Access-flag fault disable.
            AFFD OFFSET(35) NUMBITS(1) [],
            /// AArch64 tables.
            AA64 OFFSET(41) NUMBITS(1) [],
            /// Hardware dirty-state update.
            HD OFFSET(42) NUMBITS(1) [],
            /// Hardware access-flag update.
            HA OFFSET(43) NUMBITS(1) [],
            /// Stall on fault.
            S OFFSET(44) NUMBITS(1) [],
            /// Record fault events.
            R OFFSET(45) NUMBITS(1) [],
            /// Terminated transactions abort (1) or complete RAZ/WI (0).
            A OFFSET(46) NUMBITS(1) [],
            /// ASID not shared with the PEs' broadcast TLB maintenance.
            ASET OFFSET(47) NUMBITS(1) [],
            /// ASID.
            ASID OFFSET(48) NUMBITS(16) []
        ],
        /// CD dword 1 (IHI0070 §5.4).
        pub CD1 [
            /// TTB0 physical address bits \[51:4\].
            TTB0 OFFSET(4) NUMBITS(48) []
        ]
    ];
}
use fields::{CD0, CD1, STE0, STE1};

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
        let dw0 = STE0::V::SET + STE0::CONFIG::Abort;
        StreamTableEntry([dw0.value, 0, 0, 0, 0, 0, 0, 0])
    }

    /// V = 1, Config = bypass, incoming shareability.
    pub fn bypass() -> StreamTableEntry {
        let dw0 = STE0::V::SET + STE0::CONFIG::Bypass;
        let dw1: FieldValue<u64, STE1::Register> = STE1::SHCFG.val(1);
        StreamTableEntry([dw0.value, dw1.value, 0, 0, 0, 0, 0, 0])
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
        let dw0 = STE0::V::SET
            + STE0::CONFIG::Stage1
            + STE0::S1FMT.val(0)
            + STE0::S1CONTEXTPTR.val(addr >> 6)
            + STE0::S1CDMAX.val(0);
        let walk = WalkAttributes::new(coherent);
        let dw1 = STE1::S1DSS.val(0)
            + STE1::S1CIR.val(walk.cache)
            + STE1::S1COR.val(walk.cache)
            + STE1::S1CSH.val(walk.shareability)
            + STE1::S1STALLD.val(u64::from(s1stalld))
            + STE1::STRW.val(0);
        Ok(StreamTableEntry([dw0.value, dw1.value, 0, 0, 0, 0, 0, 0]))
    }

    /// The decoded Config.
    pub fn mode(&self) -> StreamMode {
        let dw0 = self.0[0];
        if dw0 & 1 == 0 {
            return StreamMode::Invalid;
        }
        match (dw0 >> 1) & 0b111 {
            0b000..=0b011 => StreamMode::Abort,
            0b100 => StreamMode::Bypass,
            0b101 => StreamMode::Stage1,
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
        let dw0 = CD0::T0SZ.val(u64::from(64 - config.input_bits))
            + CD0::TG0.val(0)
            + CD0::IR0.val(walk.cache)
            + CD0::OR0.val(walk.cache)
            + CD0::SH0.val(walk.shareability)
            + CD0::EPD0.val(0)
            + CD0::ENDI.val(0)
            + CD0::EPD1::SET
            + CD0::V::SET
            + CD0::IPS.val(ips)
            + CD0::AFFD.val(0)
            + CD0::AA64::SET
            + CD0::HD.val(0)
            + CD0::HA.val(0)
            + CD0::S.val(u64::from(config.stall))
            + CD0::R.val(u64::from(config.record))
            + CD0::A.val(u64::from(config.abort))
            + CD0::ASET::SET
            + CD0::ASID.val(u64::from(config.asid));
        let dw1: FieldValue<u64, CD1::Register> = CD1::TTB0.val(ttb0 >> 4);
        Ok(ContextDescriptor([
            dw0.value,
            dw1.value,
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
