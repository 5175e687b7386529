//! Unit tests of decoding and programming against a plain register file. Behaviour against a
//! register-accurate MMU-500 (stalls, W1C, TLBs) is tested in the `sim` crate.

use std::collections::HashMap;

use hal::delay::NoDelay;
use hal::journal::{self, Event};
use hal::model::{ModelBus, RecordingBus, RegisterModel};
use hal::regs::AccessWidth;
use hal::{Iova, PhysAddr};

use super::*;
use crate::fault::{AccessKind, FaultKind, StallTag};

/// IDR0 built from the ZynqMP facts (UG1087, zynqmp.dtsi): S1TS, S2TS, NTS, SMS, 16 context
/// interrupts, 15 stream ID bits, 48 stream-match groups.
const ZYNQMP_IDR0: u32 =
    (1 << 30) | (1 << 29) | (1 << 28) | (1 << 27) | (16 << 16) | (15 << 9) | 48;
/// UG1087 SMMU_SIDR1 reset value.
const ZYNQMP_IDR1: u32 = 0x3000_0f10;
/// IAS = OAS = UBS = 48 bits (encoding 5), AArch64 4K and 64K granules, 16-bit VMIDs.
const ZYNQMP_IDR2: u32 = 0x5 | (0x5 << 4) | (0x5 << 8) | (1 << 12) | (1 << 14) | (1 << 15);
const ZYNQMP_IDR7: u32 = 0x21;

/// Remembers what was written; IDRs preset; everything else reads back as written.
struct RegFile {
    regs: HashMap<usize, u64>,
    size: usize,
}

impl RegFile {
    fn zynqmp() -> Self {
        let mut regs = HashMap::new();
        regs.insert(0x20, u64::from(ZYNQMP_IDR0));
        regs.insert(0x24, u64::from(ZYNQMP_IDR1));
        regs.insert(0x28, u64::from(ZYNQMP_IDR2));
        regs.insert(0x3c, u64::from(ZYNQMP_IDR7));
        RegFile {
            regs,
            size: 0x2_0000,
        }
    }
    fn get(&self, offset: usize) -> u64 {
        self.regs.get(&offset).copied().unwrap_or(0)
    }
}

impl RegisterModel for RegFile {
    fn size(&self) -> usize {
        self.size
    }
    fn read(&mut self, offset: usize, _width: AccessWidth) -> u64 {
        self.get(offset)
    }
    fn write(&mut self, offset: usize, _width: AccessWidth, value: u64) {
        if !matches!(offset, 0x20 | 0x24 | 0x28 | 0x3c) {
            self.regs.insert(offset, value);
        }
    }
}

/// The ZynqMP's SMMU is an MMU-500.
const MMU500: DriverConfig = DriverConfig {
    implementation: Implementation::Mmu500,
    ..DriverConfig::DEFAULT
};

fn driver(bus: &ModelBus<RegFile>) -> SmmuV2<&ModelBus<RegFile>, NoDelay> {
    let mut smmu = SmmuV2::probe(bus, NoDelay::default(), MMU500).unwrap();
    smmu.reset().unwrap();
    smmu
}

/// The offsets `reset` writes on the ZynqMP register file with `implementation`.
fn reset_writes(implementation: Implementation) -> Vec<usize> {
    let model = ModelBus::new(RegFile::zynqmp());
    let bus = RecordingBus::new("smmu", &model);
    let config = DriverConfig {
        implementation,
        ..DriverConfig::DEFAULT
    };
    let mut smmu = SmmuV2::probe(&bus, NoDelay::default(), config).unwrap();
    assert_eq!(smmu.implementation(), implementation);
    journal::start();
    smmu.reset().unwrap();
    journal::stop()
        .into_iter()
        .filter_map(|e| match e {
            Event::Write { offset, .. } => Some(offset),
            _ => None,
        })
        .collect()
}

#[test]
fn only_an_mmu500_gets_the_implementation_defined_writes() {
    // sACR (GR0 0x010) and ACTLR (context bank + 0x004) are IMPLEMENTATION DEFINED: a
    // generic SMMUv2 gets neither.
    let actlr = |offset: usize| offset >= 0x1_0000 && offset % 0x1000 == 0x004;
    let generic = reset_writes(Implementation::Generic);
    assert!(
        !generic.contains(&0x010),
        "sACR written on a generic SMMUv2"
    );
    assert_eq!(generic.iter().filter(|&&o| actlr(o)).count(), 0, "ACTLR");
    assert!(generic.contains(&0x000), "sCR0 is still written");
    // The MMU-500 gets sACR once and ACTLR in each of its 16 banks.
    let mmu500 = reset_writes(Implementation::Mmu500);
    assert_eq!(mmu500.iter().filter(|&&o| o == 0x010).count(), 1);
    assert_eq!(mmu500.iter().filter(|&&o| actlr(o)).count(), 16);
    assert_eq!(
        DriverConfig::DEFAULT.implementation,
        Implementation::Generic
    );
}

#[test]
fn zynqmp_identification_decodes_to_the_documented_geometry() {
    let caps = Capabilities::decode(ZYNQMP_IDR0, ZYNQMP_IDR1, ZYNQMP_IDR2, ZYNQMP_IDR7);
    assert_eq!(caps.context_banks, 16);
    assert_eq!(caps.stage2_only_banks, 0);
    assert_eq!(caps.page_size, 0x1000);
    assert_eq!(caps.global_pages, 16, "NUMPAGENDXB = 3");
    assert_eq!(caps.window_bytes(), 0x2_0000, "zynqmp.dtsi reg size");
    // UG1087: CB n registers at 0xFD81_0000 + n * 0x1000, base 0xFD80_0000.
    assert_eq!(caps.context_bank_offset(0), 0x1_0000);
    assert_eq!(caps.context_bank_offset(15), 0x1_f000);
    assert_eq!(caps.stream_match_groups, 48);
    assert_eq!(caps.stream_id_bits, 15);
    assert_eq!(caps.stream_id_mask(), 0x7fff);
    assert!(caps.stage1 && caps.stage2 && caps.nested && caps.stream_matching);
    assert!(caps.aarch64_4k && !caps.aarch64_16k && caps.aarch64_64k);
    assert_eq!((caps.input_bits, caps.output_bits), (48, 48));
    assert_eq!(caps.revision, (2, 1));
    assert!(caps.check_usable(0x2_0000).is_ok());
    assert!(matches!(
        caps.check_usable(0x1_0000),
        Err(SmmuError::InvalidConfig { .. })
    ));
    let no_s1 = Capabilities::decode(ZYNQMP_IDR0 & !(1 << 30), ZYNQMP_IDR1, ZYNQMP_IDR2, 0);
    assert!(matches!(
        no_s1.check_usable(0x2_0000),
        Err(SmmuError::Unsupported { .. })
    ));
    let page64k = Capabilities::decode(ZYNQMP_IDR0, ZYNQMP_IDR1 | 1 << 31, ZYNQMP_IDR2, 0);
    assert_eq!(page64k.context_bank_offset(1), 17 * 0x1_0000);
}

#[test]
fn address_size_encodings_round_trip() {
    for (enc, bits) in [(0, 32), (1, 36), (2, 40), (3, 42), (4, 44), (5, 48)] {
        assert_eq!(size_to_bits(enc), bits);
        assert_eq!(bits_to_size(bits), enc);
    }
}

#[test]
fn context_fault_registers_decode_into_a_record() {
    let smmu = SmmuId {
        flavour: crate::fault::SmmuFlavour::V2,
        instance: 0,
    };
    // TF + SS; FSYNR0: PLVL = 3, WNR; FAR; CBFRSYNRA with a bit above the 15-bit SID.
    let r =
        decode_context_fault(smmu, 4, 0x4000_0002, 0x13, 7, 0x1234_5000, 0x1_14e8, 0x7fff).unwrap();
    assert_eq!(r.kind, FaultKind::Translation);
    assert_eq!(r.access, AccessKind::Write);
    assert_eq!(r.level, Some(3));
    assert_eq!(r.iova, Iova::new(0x1234_5000));
    assert_eq!(r.stream, StreamId(0x14e8));
    assert_eq!(r.stall, Some(StallTag(4)));
    assert_eq!(
        r.syndrome.0,
        [0x4000_0002, 0x7_0000_0013, 0x1234_5000, 0x1_14e8]
    );
    // PF without SS: a terminated read.
    let r = decode_context_fault(smmu, 0, 1 << 3, 0x2, 0, 0x10, 0x4d0, 0x7fff).unwrap();
    assert_eq!(
        (r.kind, r.access, r.stall),
        (FaultKind::Permission, AccessKind::Read, None)
    );
    // AFF, ASF, EF, TLBMCF.
    let kind = |fsr| {
        decode_context_fault(smmu, 0, fsr, 0, 0, 0, 0, 0x7fff)
            .unwrap()
            .kind
    };
    assert_eq!(kind(1 << 2), FaultKind::AccessFlag);
    assert_eq!(kind(1 << 7), FaultKind::AddressSize);
    assert_eq!(kind(1 << 4), FaultKind::External);
    assert_eq!(kind(1 << 5), FaultKind::Unknown);
    // Only SS or MULTI: no record.
    assert!(decode_context_fault(smmu, 0, FSR_SS | FSR_MULTI, 0, 0, 0, 0, 0x7fff).is_none());
}

#[test]
fn tlbiva_carries_the_page_number_and_the_asid() {
    assert_eq!(
        tlbiva_value(Iova::new(0x1234_5000), 7),
        0x0007_0000_0001_2345
    );
    assert_eq!(
        tlbiva_value(Iova::new(0x0000_ffff_ffff_f000), 0xffff),
        0xffff_000f_ffff_ffff
    );
}

#[test]
fn stream_matches_honour_the_mask() {
    let gdma = StreamMatch {
        id: 0x14e8,
        mask: 0x7,
    };
    assert!((0x14e8..=0x14ef).all(|s| gdma.matches(s)));
    assert!(!gdma.matches(0x14f0) && !gdma.matches(0x14e0));
    assert!(gdma.overlaps(&StreamMatch::exact(0x14ed)));
    assert!(!gdma.overlaps(&StreamMatch::exact(0x4d0)));
    // HPC0 with the TBU bits ignored (mask 0x7c00 as in the Linux binding example).
    let hpc0 = StreamMatch {
        id: 0x200,
        mask: 0x7c00,
    };
    assert!(hpc0.matches(0x1200) && !hpc0.matches(0x201));
}

#[test]
fn reset_enables_the_smmu_with_unmatched_streams_faulting() {
    let bus = ModelBus::new(RegFile::zynqmp());
    let _smmu = driver(&bus);
    let regs = bus.lock();
    // GFRE | GFIE | GCFGFRE | GCFGFIE | USFCFG | VMIDPNE | PTM | VMID16EN; CLIENTPD clear.
    assert_eq!(regs.get(0x0), 0x8000_1c36);
    for i in 0..48 {
        assert_eq!(regs.get(0x800 + 4 * i), 0, "SMR{i} invalid");
        assert_eq!(regs.get(0xc00 + 4 * i), 0x2_0000, "S2CR{i} faults");
    }
    // sACR: SMTNMB_TLBEN | S2CRB_TLBEN.
    assert_eq!(regs.get(0x10), (1 << 8) | (1 << 10));
}

#[test]
fn a_stall_context_is_programmed_as_linux_does_plus_cfcfg() {
    let bus = ModelBus::new(RegFile::zynqmp());
    let mut smmu = driver(&bus);
    let walk = crate::walk::WalkConfig::SMMU_48;
    let root = PhysAddr::new(0x4000_1000);
    let cb = smmu
        .alloc_context(&ContextConfig::new(root, &walk, FaultModel::Stall))
        .unwrap();
    assert_eq!(cb.index(), 0);
    let regs = bus.lock();
    let page = 0x1_0000;
    // M, TRE, AFE, CFRE, CFIE, CFCFG, HUPCF, ASIDPNE.
    assert_eq!(regs.get(page), 0x11e7);
    // T0SZ = 16, SH0 = outer shareable, non-cacheable walks, TG0 = 4K, EPD1.
    assert_eq!(regs.get(page + 0x30), 0x0080_2010);
    // PASIZE = 48 bits, AS, SEP = upstream.
    assert_eq!(regs.get(page + 0x10), 0x3_8015);
    assert_eq!(regs.get(page + 0x20), 0x4000_1000, "TTBR0 with ASID 0");
    assert_eq!(regs.get(page + 0x38), 0x0004_ff44, "MAIR0");
    // GR1: CBA2R.VA64, CBAR type 1 with BPSHCFG 3 and MEMATTR 0xF.
    assert_eq!(regs.get(0x1000 + 0x800), 1);
    assert_eq!(regs.get(0x1000), 0x1_f300);
}

#[test]
fn attach_refuses_what_silicon_would_misroute() {
    let bus = ModelBus::new(RegFile::zynqmp());
    let mut smmu = driver(&bus);
    let walk = crate::walk::WalkConfig::SMMU_48;
    let stall = smmu
        .alloc_context(&ContextConfig::new(
            PhysAddr::new(0x4000_0000),
            &walk,
            FaultModel::Stall,
        ))
        .unwrap();
    let tolerant = StreamFaultConfig::stall_tolerant(10_000);
    // PCIe (SID 0x4d0) must never stall.
    assert_eq!(
        smmu.attach(
            StreamMatch::exact(0x4d0),
            StreamRoute::Translate(stall),
            StreamFaultConfig::NEVER_STALL
        ),
        Err(SmmuError::StallOnIntolerantStream { stream: 0x4d0 })
    );
    assert_eq!(
        smmu.attach(StreamMatch::exact(0x8000), StreamRoute::Bypass, tolerant),
        Err(SmmuError::StreamIdOutOfRange {
            id: 0x8000,
            bits: 15
        })
    );
    let gdma = StreamMatch {
        id: 0x14e8,
        mask: 0x1,
    };
    let entry = smmu
        .attach(gdma, StreamRoute::Translate(stall), tolerant)
        .unwrap();
    assert_eq!(
        smmu.attach(
            StreamMatch::exact(0x14e9),
            StreamRoute::Translate(stall),
            tolerant
        ),
        Err(SmmuError::StreamMatchConflict {
            id: 0x14e9,
            mask: 0,
            index: 0
        })
    );
    assert_eq!(
        smmu.attach(
            StreamMatch::exact(1),
            StreamRoute::Translate(ContextBank(9)),
            tolerant
        ),
        Err(SmmuError::UnknownContextBank { index: 9 })
    );
    assert_eq!(smmu.stream_fault_config(StreamId(0x14e9)), tolerant);
    assert_eq!(
        smmu.stream_fault_config(StreamId(0x14ea)),
        StreamFaultConfig::NEVER_STALL
    );
    assert_eq!(
        smmu.free_context(stall),
        Err(SmmuError::ContextInUse {
            index: 0,
            streams: 1
        })
    );
    {
        let regs = bus.lock();
        assert_eq!(regs.get(0x800), 0x8001_14e8, "SMR0: VALID, MASK 1, ID");
        assert_eq!(regs.get(0xc00), 0, "S2CR0: translate via CB0");
    }
    smmu.detach(entry).unwrap();
    assert_eq!(
        smmu.detach(entry),
        Err(SmmuError::UnknownStreamMatch { index: 0 })
    );
    smmu.free_context(stall).unwrap();
    assert_eq!(
        smmu.resume(stall, ResumeAction::Retry),
        Err(SmmuError::UnknownContextBank { index: 0 })
    );
}

#[test]
fn s2cr_is_written_before_the_smr_becomes_valid_and_invalidated_after() {
    let model = ModelBus::new(RegFile::zynqmp());
    let bus = RecordingBus::new("smmu", &model);
    let mut smmu = SmmuV2::probe(&bus, NoDelay::default(), MMU500).unwrap();
    smmu.reset().unwrap();
    journal::start();
    let entry = smmu
        .attach(
            StreamMatch::exact(0x14e8),
            StreamRoute::Bypass,
            StreamFaultConfig::NEVER_STALL,
        )
        .unwrap();
    smmu.detach(entry).unwrap();
    let writes: Vec<(usize, u64)> = journal::stop()
        .into_iter()
        .filter_map(|e| match e {
            Event::Write { offset, value, .. } => Some((offset, value)),
            _ => None,
        })
        .collect();
    assert_eq!(
        writes,
        vec![
            (0xc00, 0x1_0000),
            (0x800, 0x8000_14e8),
            (0x800, 0),
            (0xc00, 0x2_0000)
        ]
    );
}
