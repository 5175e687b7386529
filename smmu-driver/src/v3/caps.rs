//! What an SMMUv3 says about itself in IDR0, IDR1, IDR3, IDR5 and AIDR, and which
//! configurations the driver refuses because of it.

use tock_registers::LocalRegisterCopy;

use super::regs::{AIDR, IDR0, IDR1, IDR3, IDR5};
use crate::{Result, SmmuError};

/// The stall model (IDR0.STALL_MODEL, IHI0070 §6.3.1 and §3.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StallModel {
    /// 0b00: a context chooses stall (CD.S = 1) or terminate (CD.S = 0).
    StallAndTerminate,
    /// 0b01: terminate only. CD.S = 1 and STE.S1STALLD = 1 are ILLEGAL, CMD_RESUME and
    /// CMD_STALL_TERM raise CERROR_ILL (§4.7.1). QEMU 7.2 (`smmuv3_init_regs`).
    TerminateOnly,
    /// 0b10: stall forced; CD.S = 0 is ILLEGAL.
    StallForced,
}

/// Raw identification register values, as read (for logs and for [`Capabilities::decode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IdRegisters {
    /// SMMU_IDR0.
    pub idr0: u32,
    /// SMMU_IDR1.
    pub idr1: u32,
    /// SMMU_IDR3.
    pub idr3: u32,
    /// SMMU_IDR5.
    pub idr5: u32,
    /// SMMU_AIDR.
    pub aidr: u32,
}

impl IdRegisters {
    /// What QEMU 7.2's `virt` SMMUv3 reports (`smmuv3_init_regs` in `hw/arm/smmuv3.c`; read
    /// back by our own probe): IDR0 0x0d40101a, IDR1 0x02730010, IDR3 0x1404, IDR5 0x74, AIDR 1.
    pub const QEMU_7_2: IdRegisters = IdRegisters {
        idr0: 0x0d40_101a,
        idr1: 0x0273_0010,
        idr3: 0x1404,
        idr5: 0x74,
        aidr: 1,
    };
}

/// Capabilities decoded from the identification registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Stage-1 translation (IDR0.S1P).
    pub stage1: bool,
    /// Stage-2 translation (IDR0.S2P).
    pub stage2: bool,
    /// AArch64 translation tables (IDR0.TTF is AArch64 or both).
    pub aarch64_tables: bool,
    /// Coherent access to tables and queues (IDR0.COHACC).
    pub coherent: bool,
    /// Broadcast TLB maintenance (IDR0.BTM).
    pub broadcast_tlb: bool,
    /// Hardware access-flag / dirty updates (IDR0.HTTU != 0).
    pub hardware_access_flag: bool,
    /// 16-bit ASIDs (IDR0.ASID16); otherwise 8-bit.
    pub asid16: bool,
    /// MSIs (IDR0.MSI).
    pub msi: bool,
    /// Little-endian table walks possible (IDR0.TTENDIAN is mixed or little).
    pub little_endian_tables: bool,
    /// The stall model.
    pub stall_model: StallModel,
    /// Terminated transactions always abort (IDR0.TERM_MODEL = 1): CD.A must be 1.
    pub abort_only: bool,
    /// Two-level stream tables (IDR0.ST_LEVEL).
    pub two_level_stream_table: bool,
    /// StreamID bits (IDR1.SIDSIZE).
    pub sid_bits: u8,
    /// SubstreamID bits (IDR1.SSIDSIZE; 0: no substreams).
    pub ssid_bits: u8,
    /// log2 of the largest command queue (IDR1.CMDQS).
    pub cmdq_log2_max: u8,
    /// log2 of the largest event queue (IDR1.EVENTQS).
    pub eventq_log2_max: u8,
    /// Table and queue bases are fixed (IDR1.TABLES_PRESET / QUEUES_PRESET): the driver
    /// cannot place its own.
    pub preset_bases: bool,
    /// Range invalidation and the TTL hint (IDR3.RIL).
    pub range_invalidation: bool,
    /// Output address size in bits (IDR5.OAS).
    pub output_bits: u8,
    /// 4 KiB granule (IDR5.GRAN4K).
    pub granule_4k: bool,
    /// Most stalled transactions at once (IDR5.STALL_MAX).
    pub stall_max: u16,
    /// Architecture minor revision (AIDR: 0 = SMMUv3.0, 1 = v3.1, ...).
    pub minor_version: u8,
    /// The registers these were decoded from.
    pub raw: IdRegisters,
}

/// The IDR5.OAS / CD.IPS encoding of an address size (IHI0070 §6.3.6).
pub const fn oas_bits(encoding: u32) -> Option<u8> {
    match encoding {
        0 => Some(32),
        1 => Some(36),
        2 => Some(40),
        3 => Some(42),
        4 => Some(44),
        5 => Some(48),
        6 => Some(52),
        _ => None,
    }
}

/// The smallest IPS encoding that covers `bits` of output address (CD.IPS, IHI0070 §5.4).
pub const fn ips_encoding(bits: u8) -> Option<u64> {
    match bits {
        0..=32 => Some(0),
        33..=36 => Some(1),
        37..=40 => Some(2),
        41..=42 => Some(3),
        43..=44 => Some(4),
        45..=48 => Some(5),
        49..=52 => Some(6),
        _ => None,
    }
}

impl Capabilities {
    /// Decodes the identification registers and refuses an SMMU this driver cannot use: no
    /// stage 1, no AArch64 tables, no 4 KiB granule, big-endian-only walks, fixed table or
    /// queue bases, or a reserved OAS encoding.
    pub fn decode(raw: IdRegisters) -> Result<Capabilities> {
        let idr0 = LocalRegisterCopy::<u32, IDR0::Register>::new(raw.idr0);
        let idr1 = LocalRegisterCopy::<u32, IDR1::Register>::new(raw.idr1);
        let idr3 = LocalRegisterCopy::<u32, IDR3::Register>::new(raw.idr3);
        let idr5 = LocalRegisterCopy::<u32, IDR5::Register>::new(raw.idr5);
        let aidr = LocalRegisterCopy::<u32, AIDR::Register>::new(raw.aidr);
        let stall_model = match idr0.read(IDR0::STALL_MODEL) {
            0 => StallModel::StallAndTerminate,
            1 => StallModel::TerminateOnly,
            2 => StallModel::StallForced,
            _ => {
                return Err(SmmuError::Unsupported {
                    what: "reserved IDR0.STALL_MODEL encoding",
                });
            }
        };
        let caps = Capabilities {
            stage1: idr0.is_set(IDR0::S1P),
            stage2: idr0.is_set(IDR0::S2P),
            aarch64_tables: matches!(idr0.read(IDR0::TTF), 2 | 3),
            coherent: idr0.is_set(IDR0::COHACC),
            broadcast_tlb: idr0.is_set(IDR0::BTM),
            hardware_access_flag: idr0.read(IDR0::HTTU) != 0,
            asid16: idr0.is_set(IDR0::ASID16),
            msi: idr0.is_set(IDR0::MSI),
            little_endian_tables: matches!(idr0.read(IDR0::TTENDIAN), 0 | 2),
            stall_model,
            abort_only: idr0.is_set(IDR0::TERM_MODEL),
            two_level_stream_table: idr0.read(IDR0::ST_LEVEL) == 1,
            sid_bits: idr1.read(IDR1::SIDSIZE) as u8,
            ssid_bits: idr1.read(IDR1::SSIDSIZE) as u8,
            cmdq_log2_max: idr1.read(IDR1::CMDQS) as u8,
            eventq_log2_max: idr1.read(IDR1::EVENTQS) as u8,
            preset_bases: idr1.is_set(IDR1::TABLES_PRESET) || idr1.is_set(IDR1::QUEUES_PRESET),
            range_invalidation: idr3.is_set(IDR3::RIL),
            output_bits: oas_bits(idr5.read(IDR5::OAS)).ok_or(SmmuError::Unsupported {
                what: "reserved IDR5.OAS encoding",
            })?,
            granule_4k: idr5.is_set(IDR5::GRAN4K),
            stall_max: idr5.read(IDR5::STALL_MAX) as u16,
            minor_version: aidr.read(AIDR::ARCH_MINOR_REV) as u8,
            raw,
        };
        if !caps.stage1 {
            return Err(SmmuError::Unsupported {
                what: "stage-1 translation (IDR0.S1P = 0)",
            });
        }
        if !caps.aarch64_tables {
            return Err(SmmuError::Unsupported {
                what: "AArch64 translation tables (IDR0.TTF)",
            });
        }
        if !caps.granule_4k {
            return Err(SmmuError::Unsupported {
                what: "the 4 KiB granule (IDR5.GRAN4K = 0)",
            });
        }
        if !caps.little_endian_tables {
            return Err(SmmuError::Unsupported {
                what: "little-endian table walks (IDR0.TTENDIAN = big)",
            });
        }
        if caps.preset_bases {
            return Err(SmmuError::Unsupported {
                what: "driver-placed tables and queues (IDR1.TABLES_PRESET/QUEUES_PRESET)",
            });
        }
        Ok(caps)
    }

    /// Whether a context may ask to stall on faults (CD.S = 1).
    pub fn can_stall(&self) -> bool {
        self.stall_model != StallModel::TerminateOnly
    }

    /// Whether the terminate model is available (CD.S = 0).
    pub fn can_terminate(&self) -> bool {
        self.stall_model != StallModel::StallForced
    }

    /// Whether CMD_RESUME / CMD_STALL_TERM exist (anything but terminate-only; §4.7).
    pub fn has_resume(&self) -> bool {
        self.can_stall()
    }

    /// Largest ASID (255 without IDR0.ASID16).
    pub fn max_asid(&self) -> u16 {
        if self.asid16 {
            u16::MAX
        } else {
            u8::MAX as u16
        }
    }

    /// Checks a context's stall choice against the stall model: stall where STALL_MODEL is
    /// terminate-only, or terminate where it is stall-forced, would make the CD ILLEGAL
    /// (IHI0070 §5.4 CD.S).
    pub fn check_stall(&self, stall_on_fault: bool) -> Result<()> {
        match (self.stall_model, stall_on_fault) {
            (StallModel::TerminateOnly, true) => Err(SmmuError::Unsupported {
                what: "stall on fault (IDR0.STALL_MODEL = terminate only)",
            }),
            (StallModel::StallForced, false) => Err(SmmuError::Unsupported {
                what: "terminate on fault (IDR0.STALL_MODEL = stall forced)",
            }),
            _ => Ok(()),
        }
    }

    /// Whether an STE must set S1STALLD: only when the SMMU offers a choice (STALL_MODEL =
    /// 0b00) and the stream must never stall (PCIe: IHI0070 §3.12.1). With any other stall
    /// model S1STALLD = 1 makes the STE ILLEGAL (§5.2; QEMU: C_BAD_STE, `decode_ste`).
    pub fn s1stalld_for(&self, stall_tolerant: bool) -> bool {
        self.stall_model == StallModel::StallAndTerminate && !stall_tolerant
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_7_2_decodes_as_the_notes_say() {
        // IDR0 0x0d40101a = 0b0000_1101_0100_0000_0001_0000_0001_1010:
        //   bit 1 S1P, bits 3:2 TTF = 0b10 (AArch64), bit 4 COHACC, bit 12 ASID16,
        //   bits 22:21 TTENDIAN = 0b10 (LE), bits 25:24 STALL_MODEL = 0b01, bit 26 TERM_MODEL,
        //   bits 28:27 ST_LEVEL = 0b01.
        // IDR1 0x02730010: SIDSIZE = 0x10, EVENTQS = (0x02730010 >> 16) & 31 = 0x273 & 31 = 19,
        //   CMDQS = (0x02730010 >> 21) & 31 = 0x13 = 19.
        // IDR3 0x1404: bit 10 RIL. IDR5 0x74: OAS = 4 (44 bits), GRAN4K/16K/64K.
        let c = Capabilities::decode(IdRegisters::QEMU_7_2).unwrap();
        assert!(c.stage1 && !c.stage2 && c.aarch64_tables && c.coherent && c.asid16);
        assert!(!c.msi && !c.broadcast_tlb && !c.hardware_access_flag);
        assert_eq!(c.stall_model, StallModel::TerminateOnly);
        assert!(c.abort_only && c.two_level_stream_table && c.little_endian_tables);
        assert_eq!((c.sid_bits, c.ssid_bits), (16, 0));
        assert_eq!((c.cmdq_log2_max, c.eventq_log2_max), (19, 19));
        assert!(c.range_invalidation && c.granule_4k);
        assert_eq!(c.output_bits, 44);
        assert_eq!(c.minor_version, 1);
        assert!(!c.can_stall() && c.can_terminate() && !c.has_resume());
        assert_eq!(c.max_asid(), 0xffff);
    }

    #[test]
    fn stall_choices_follow_the_stall_model() {
        let qemu = Capabilities::decode(IdRegisters::QEMU_7_2).unwrap();
        assert!(matches!(
            qemu.check_stall(true),
            Err(SmmuError::Unsupported { .. })
        ));
        assert_eq!(qemu.check_stall(false), Ok(()));
        assert!(
            !qemu.s1stalld_for(false),
            "S1STALLD is ILLEGAL when STALL_MODEL = 0b01"
        );

        // STALL_MODEL = 0b00: both allowed; a PCIe stream gets S1STALLD.
        let both = IdRegisters {
            idr0: IdRegisters::QEMU_7_2.idr0 & !(0b11 << 24),
            ..IdRegisters::QEMU_7_2
        };
        let c = Capabilities::decode(both).unwrap();
        assert_eq!(c.stall_model, StallModel::StallAndTerminate);
        assert!(c.check_stall(true).is_ok() && c.check_stall(false).is_ok());
        assert!(c.s1stalld_for(false) && !c.s1stalld_for(true));

        // STALL_MODEL = 0b10: terminate refused.
        let forced = IdRegisters {
            idr0: (IdRegisters::QEMU_7_2.idr0 & !(0b11 << 24)) | (0b10 << 24),
            ..IdRegisters::QEMU_7_2
        };
        let c = Capabilities::decode(forced).unwrap();
        assert!(c.check_stall(false).is_err() && c.check_stall(true).is_ok());
        assert!(!c.s1stalld_for(false));

        let reserved = IdRegisters {
            idr0: IdRegisters::QEMU_7_2.idr0 | (0b11 << 24),
            ..IdRegisters::QEMU_7_2
        };
        assert!(Capabilities::decode(reserved).is_err());
    }

    #[test]
    fn unusable_smmus_are_refused() {
        let q = IdRegisters::QEMU_7_2;
        let cases = [
            (
                "no stage 1",
                IdRegisters {
                    idr0: q.idr0 & !(1 << 1),
                    ..q
                },
            ),
            (
                "AArch32 tables only",
                IdRegisters {
                    idr0: (q.idr0 & !(0b11 << 2)) | (0b01 << 2),
                    ..q
                },
            ),
            (
                "no 4K granule",
                IdRegisters {
                    idr5: q.idr5 & !(1 << 4),
                    ..q
                },
            ),
            (
                "big-endian walks only",
                IdRegisters {
                    idr0: q.idr0 | (0b11 << 21),
                    ..q
                },
            ),
            (
                "preset queues",
                IdRegisters {
                    idr1: q.idr1 | (1 << 29),
                    ..q
                },
            ),
            (
                "reserved OAS",
                IdRegisters {
                    idr5: (q.idr5 & !7) | 7,
                    ..q
                },
            ),
        ];
        for (what, regs) in cases {
            assert!(
                matches!(
                    Capabilities::decode(regs),
                    Err(SmmuError::Unsupported { .. })
                ),
                "{what}"
            );
        }
    }

    #[test]
    fn address_size_encodings() {
        // IHI0070 §6.3.6 OAS: 0 32, 1 36, 2 40, 3 42, 4 44, 5 48, 6 52.
        let table = [
            (0, 32),
            (1, 36),
            (2, 40),
            (3, 42),
            (4, 44),
            (5, 48),
            (6, 52),
        ];
        for (enc, bits) in table {
            assert_eq!(oas_bits(enc), Some(bits));
            assert_eq!(ips_encoding(bits), Some(u64::from(enc)));
        }
        assert_eq!(oas_bits(7), None);
        assert_eq!(
            ips_encoding(39),
            Some(2),
            "39 bits need the 40-bit encoding"
        );
        assert_eq!(ips_encoding(53), None);
    }
}
