use proptest::prelude::*;

use super::*;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// What a stage-1 walk (Arm ARM D8.2, 4 KiB granule, start at level 1) yields for a VA.
#[derive(Debug, PartialEq, Eq)]
struct Walk {
    pa: u64,
    attr_index: u64,
    /// Bits 53 (PXN) and 54 (UXN/XN).
    xn: (bool, bool),
    /// AP[2:1].
    ap: u64,
    shareability: u64,
    access_flag: bool,
    /// 1, 2 or 3.
    level: u32,
}

fn pa_of(t: &Table) -> u64 {
    t as *const Table as u64
}

/// An independent walker: decodes descriptors by the field positions of D8.3.
fn walk(tables: &[Table], va: u64) -> Option<Walk> {
    if va >> VA_BITS != 0 {
        return None; // outside the TTBR0 range: translation fault
    }
    let leaf = |desc: u64, level: u32, block_bits: u32| Walk {
        pa: (desc & 0x0000_ffff_ffff_f000 & !((1u64 << block_bits) - 1))
            | (va & ((1u64 << block_bits) - 1)),
        attr_index: (desc >> 2) & 7,
        xn: (desc >> 53 & 1 == 1, desc >> 54 & 1 == 1),
        ap: (desc >> 6) & 3,
        shareability: (desc >> 8) & 3,
        access_flag: desc >> 10 & 1 == 1,
        level,
    };
    let l1 = tables[0].0[((va >> 30) & 511) as usize];
    match l1 & 3 {
        0b01 => Some(leaf(l1, 1, 30)),
        0b11 => {
            let next = l1 & 0x0000_ffff_ffff_f000;
            let table = tables.iter().find(|t| pa_of(t) == next)?;
            let l2 = table.0[((va >> 21) & 511) as usize];
            match l2 & 3 {
                0b01 => Some(leaf(l2, 2, 21)),
                0b11 => {
                    let next = l2 & 0x0000_ffff_ffff_f000;
                    let table = tables.iter().find(|t| pa_of(t) == next)?;
                    let l3 = table.0[((va >> 12) & 511) as usize];
                    // At level 3, 0b11 is a page; anything else faults.
                    (l3 & 3 == 0b11).then(|| leaf(l3, 3, 12))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

fn build(
    normal: &[MemRegion],
    pa_bits: u32,
    regime: Regime,
    n: usize,
) -> (Vec<Table>, Result<MapSummary>) {
    build_with_nc(normal, &[], pa_bits, regime, n)
}

fn build_with_nc(
    normal: &[MemRegion],
    non_cacheable: &[MemRegion],
    pa_bits: u32,
    regime: Regime,
    n: usize,
) -> (Vec<Table>, Result<MapSummary>) {
    let mut tables = vec![Table::EMPTY; n];
    let r = build_identity_map(&mut tables, pa_of, normal, non_cacheable, pa_bits, regime);
    (tables, r)
}

#[test]
fn descriptors_match_the_architecture_encoding() {
    // Device block at 0, EL1: valid | AttrIndx 0 | AF (bit 10) | PXN (53) | UXN (54).
    assert_eq!(
        block_descriptor(0, MemoryKind::Device, Regime::El1),
        0x0060_0000_0000_0401
    );
    // Normal block at 1 GiB, EL1: AttrIndx 1 (bits 4:2 = 0b001), SH = 0b11 (bits 9:8), AF.
    assert_eq!(
        block_descriptor(0x4000_0000, MemoryKind::Normal, Regime::El1),
        0x4000_0705
    );
    // EL2/EL3: AP[1] (bit 6) is RES1; device XN is bit 54 only.
    assert_eq!(
        block_descriptor(0x4000_0000, MemoryKind::Normal, Regime::El2),
        0x4000_0745
    );
    assert_eq!(
        block_descriptor(0xff00_0000, MemoryKind::Device, Regime::El3),
        0x0040_0000_ff00_0441
    );
    assert_eq!(table_descriptor(0x4009_3000), 0x4009_3003);
    // Non-cacheable block at EL3: AttrIndx 2 (bits 4:2 = 0b010), AP[1] RES1, SH = 0b10
    // (outer), AF, XN (54).
    assert_eq!(
        block_descriptor(0x1100_0000, MemoryKind::NormalNonCacheable, Regime::El3),
        0x0040_0000_1100_0649
    );
    // At EL1 both PXN and UXN.
    assert_eq!(
        block_descriptor(0x1100_0000, MemoryKind::NormalNonCacheable, Regime::El1),
        0x0060_0000_1100_0609
    );
    // Attr0 0x00 (Device-nGnRnE), Attr1 0xff (write-back RW-allocate), Attr2 0x44 (NC).
    assert_eq!(MAIR, 0x0044_ff00);
}

#[test]
fn tcr_values_match_the_register_layout() {
    // T0SZ 25 (0x19), IRGN0/ORGN0 = WBWA (bits 8, 10), SH0 = inner (13:12), EPD1 (23),
    // TG1 = 4K (0b10 at 31:30), IPS = 44 bits (0b100 at 34:32).
    assert_eq!(tcr(Regime::El1, 44), 0x4_8080_3519);
    // TCR_EL3 with 40-bit PA: PS = 0b010 at 18:16, RES1 bits 31 and 23.
    assert_eq!(tcr(Regime::El3, 40), 0x8082_3519);
    assert_eq!(tcr(Regime::El2, 48), 0x8085_3519);
    assert_eq!(ps_encoding(52), 5, "52-bit output needs LPA2; capped at 48");
    assert_eq!(pa_bits_from_parange(4), Some(44));
    assert_eq!(pa_bits_from_parange(7), None);
    assert_eq!(
        Regime::for_el(0),
        Err(FirmwareError::UnsupportedExceptionLevel { el: 0 })
    );
}

#[test]
fn qemu_virt_map() {
    let ram = [MemRegion::new(0x4000_0000, 256 * MIB)];
    let (tables, summary) = build(&ram, 44, Regime::El1, 4);
    assert_eq!(
        summary.unwrap(),
        MapSummary {
            tables: 2,
            mapped_limit: 1 << 39
        }
    );
    let device = |va| {
        let w = walk(&tables, va).unwrap();
        assert_eq!(w.pa, va);
        assert_eq!(w.attr_index, ATTR_DEVICE, "{va:#x}");
        assert_eq!(w.xn, (true, true), "{va:#x}");
        assert!(w.access_flag);
        assert_eq!(w.ap, 0);
    };
    let normal = |va| {
        let w = walk(&tables, va).unwrap();
        assert_eq!(w.pa, va);
        assert_eq!(w.attr_index, ATTR_NORMAL, "{va:#x}");
        assert_eq!(w.xn, (false, false));
        assert_eq!(w.shareability, 0b11);
        assert_eq!(w.level, 2);
    };
    device(0x0900_0000); // PL011
    device(0x0905_0000); // SMMUv3
    device(0x1000_0000); // PCIe 32-bit window
    device(0x3fff_ffff);
    normal(0x4000_0000); // device tree
    normal(0x4008_0000); // image
    normal(0x4fff_fff8);
    device(0x5000_0000);
    device(0x40_1000_0000); // high ECAM
    device(0x7f_ffff_fff8);
    assert_eq!(walk(&tables, 1 << 39), None);
}

#[test]
fn guard_pages_fault_and_everything_around_them_keeps_its_mapping() {
    // QEMU virt: the image's GiB already has a level-2 table.
    let ram = [MemRegion::new(0x4000_0000, 256 * MIB)];
    let (mut tables, summary) = build(&ram, 44, Regime::El1, 4);
    let before: Vec<_> = [0x4024_8000u64, 0x4024_a000, 0x4024_c000, 0x4040_0000]
        .iter()
        .map(|&va| walk(&tables, va).map(|w| (w.pa, w.attr_index, w.xn, w.ap)))
        .collect();
    // Two guards in one 2 MiB block share one level-3 table.
    let guards = [0x4024_9000, 0x4024_b000];
    let summary = unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &guards).unwrap();
    assert_eq!(summary.tables, 3);
    for g in guards {
        assert_eq!(walk(&tables, g), None, "{g:#x} is a guard");
        assert_eq!(walk(&tables, g + 0xff8), None);
    }
    let after: Vec<_> = [0x4024_8000u64, 0x4024_a000, 0x4024_c000, 0x4040_0000]
        .iter()
        .map(|&va| walk(&tables, va).map(|w| (w.pa, w.attr_index, w.xn, w.ap)))
        .collect();
    assert_eq!(
        before, after,
        "the pages around the guards keep their attributes"
    );
    assert_eq!(walk(&tables, 0x4024_a000).unwrap().level, 3);
    assert_eq!(walk(&tables, 0x4040_0000).unwrap().level, 2);

    // The ZynqMP at EL3: DDR from 0 in whole-GiB level-1 blocks, split twice.
    let ddr = [MemRegion::new(0, 2 * GIB)];
    let (mut tables, summary) = build(&ddr, 40, Regime::El3, 4);
    let summary = summary.unwrap();
    assert_eq!(walk(&tables, 0x10_0000).unwrap().level, 1);
    let summary = unmap_guard_pages(&mut tables, pa_of, summary, &[0x10_0000]).unwrap();
    assert_eq!(summary.tables, 3);
    assert_eq!(walk(&tables, 0x10_0000), None);
    let next = walk(&tables, 0x10_1000).unwrap();
    assert_eq!(
        (next.pa, next.attr_index, next.level),
        (0x10_1000, ATTR_NORMAL, 3)
    );
    assert_eq!(walk(&tables, 0x20_0000).unwrap().level, 2);
    assert_eq!(walk(&tables, GIB).unwrap().level, 1);

    // Out of tables, or a guard that is no page of the map: errors, not panics.
    let (mut tables, summary) = build(&ram, 44, Regime::El1, 2);
    assert!(matches!(
        unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &[0x4024_9000]),
        Err(FirmwareError::PageTablesExhausted { .. })
    ));
    let (mut tables, summary) = build(&ram, 44, Regime::El1, 4);
    assert!(unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &[0x4024_9008]).is_err());
    let (mut tables, summary) = build(&ram, 44, Regime::El1, 4);
    assert!(unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &[1 << 39]).is_err());
}

#[test]
fn split_blocks_keep_their_descriptor_bits() {
    // EL1, QEMU virt: the guard's 2 MiB block (level-2 entry 1 of the RAM GiB, Normal:
    // AttrIndx 1 (0x4) | SH inner (0x300) | AF (0x400) | valid = 0x705) becomes a table of
    // pages: the same bits plus bit 1 (0x707), the guard's entry 0 (D8.3 descriptor formats).
    let ram = [MemRegion::new(0x4000_0000, 256 * MIB)];
    let (mut tables, summary) = build(&ram, 44, Regime::El1, 4);
    let block = tables[1].0[1];
    assert_eq!(block, 0x4020_0705);
    // The rest of that GiB stays Device (AttrIndx 0, AF, PXN and UXN) in 2 MiB blocks.
    assert_eq!(tables[1].0[200], 0x0060_0000_5900_0401);
    unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &[0x4024_9000]).unwrap();
    assert_eq!(tables[1].0[1], pa_of(&tables[2]) | 0b11);
    for (k, &e) in tables[2].0.iter().enumerate() {
        let expected = if k == 0x49 {
            0
        } else {
            0x4020_0707 + k as u64 * 0x1000
        };
        assert_eq!(e, expected, "page {k}");
    }

    // EL3, ZynqMP: a 1 GiB level-1 block (Normal, AP[1] RES1 (0x40): 0x745) split into
    // 2 MiB blocks with the same bits, the first of them into pages (0x747).
    let ddr = [MemRegion::new(0, 2 * GIB)];
    let (mut tables, summary) = build(&ddr, 40, Regime::El3, 4);
    assert_eq!(tables[0].0[0], 0x745);
    unmap_guard_pages(&mut tables, pa_of, summary.unwrap(), &[0x10_0000]).unwrap();
    assert_eq!(tables[0].0[0], pa_of(&tables[1]) | 0b11);
    assert_eq!(tables[1].0[0], pa_of(&tables[2]) | 0b11);
    for (j, &e) in tables[1].0.iter().enumerate().skip(1) {
        assert_eq!(e, 0x745 + j as u64 * L2_BLOCK, "block {j}");
    }
    for (k, &e) in tables[2].0.iter().enumerate() {
        let expected = if k == 0x100 {
            0
        } else {
            0x747 + k as u64 * 0x1000
        };
        assert_eq!(e, expected, "page {k}");
    }
}

#[test]
fn small_pa_size_leaves_the_rest_unmapped() {
    let ram = [MemRegion::new(0x4000_0000, 256 * MIB)];
    let (tables, summary) = build(&ram, 36, Regime::El1, 2);
    assert_eq!(summary.unwrap().mapped_limit, 1 << 36);
    assert!(walk(&tables, (1 << 36) - 8).is_some());
    assert_eq!(walk(&tables, 1 << 36), None);
}

#[test]
fn whole_gigabytes_use_level_1_blocks() {
    // ZynqMP-like: 2 GiB of DDR at 0, more at 32 GiB.
    let ram = [
        MemRegion::new(0, 2 * GIB),
        MemRegion::new(0x8_0000_0000, 2 * GIB),
    ];
    let (tables, summary) = build(&ram, 40, Regime::El3, 1);
    assert_eq!(summary.unwrap().tables, 1);
    let w = walk(&tables, 0x7fff_fff0).unwrap();
    assert_eq!((w.level, w.attr_index, w.ap), (1, ATTR_NORMAL, 0b01));
    let w = walk(&tables, 0xff00_0000).unwrap();
    assert_eq!(
        (w.level, w.attr_index, w.xn),
        (1, ATTR_DEVICE, (false, true))
    );
    assert_eq!(
        walk(&tables, 0x8_7fff_fff0).unwrap().attr_index,
        ATTR_NORMAL
    );
    assert_eq!(
        walk(&tables, 0x8_8000_0000).unwrap().attr_index,
        ATTR_DEVICE
    );
}

#[test]
fn unaligned_regions_are_rounded_inward() {
    let ram = [MemRegion::new(0x4010_0000, 4 * MIB)];
    let (tables, summary) = build(&ram, 44, Regime::El1, 2);
    summary.unwrap();
    assert_eq!(walk(&tables, 0x401f_ffff).unwrap().attr_index, ATTR_DEVICE);
    assert_eq!(walk(&tables, 0x4020_0000).unwrap().attr_index, ATTR_NORMAL);
    assert_eq!(walk(&tables, 0x403f_ffff).unwrap().attr_index, ATTR_NORMAL);
    assert_eq!(walk(&tables, 0x4040_0000).unwrap().attr_index, ATTR_DEVICE);
}

#[test]
fn impossible_maps_are_errors() {
    // Two partial GiBs need two level-2 tables.
    let ram = [
        MemRegion::new(0x4000_0000, 2 * MIB),
        MemRegion::new(0x8000_0000, 2 * MIB),
    ];
    let (_, r) = build(&ram, 44, Regime::El1, 2);
    assert_eq!(r, Err(FirmwareError::PageTablesExhausted { available: 2 }));
    let (_, r) = build(&ram, 44, Regime::El1, 0);
    assert_eq!(r, Err(FirmwareError::PageTablesExhausted { available: 0 }));

    for bad in [
        MemRegion::new(0x4010_0000, MIB), // nothing left after rounding
        MemRegion::new(1 << 39, 2 * MIB), // beyond the VA range
        MemRegion::new(u64::MAX - MIB, 2 * MIB),
    ] {
        let (_, r) = build(&[bad], 44, Regime::El1, 4);
        assert_eq!(
            r,
            Err(FirmwareError::RegionNotMappable {
                base: bad.base,
                size: bad.size
            })
        );
    }
}

#[test]
fn overlapping_regions_keep_everything_normal() {
    let ram = [
        MemRegion::new(0x4000_0000, GIB),
        MemRegion::new(0x7000_0000, 0x2000_0000), // overlaps the end of the first GiB
    ];
    let (tables, summary) = build(&ram, 44, Regime::El1, 4);
    summary.unwrap();
    for va in [0x4000_0000, 0x6fff_fff0, 0x7000_0000, 0x8fff_fff0] {
        assert_eq!(
            walk(&tables, va).unwrap().attr_index,
            ATTR_NORMAL,
            "{va:#x}"
        );
    }
    assert_eq!(walk(&tables, 0x9000_0000).unwrap().attr_index, ATTR_DEVICE);
}

#[test]
fn zynqmp_map_with_a_non_cacheable_dma_pool() {
    // The ZynqMP platform: DDR low 0..2 GiB, a 16 MiB pool at 0x1100_0000, EL3, 40 PA bits.
    let ram = [MemRegion::new(0, 2 * GIB)];
    let pool = [MemRegion::new(0x1100_0000, 16 * MIB)];
    let (tables, summary) = build_with_nc(&ram, &pool, 40, Regime::El3, 4);
    assert_eq!(
        summary.unwrap(),
        MapSummary {
            tables: 2,
            mapped_limit: 1 << 39
        }
    );
    let attrs = |va| {
        let w = walk(&tables, va).unwrap();
        assert_eq!(w.pa, va);
        (w.attr_index, w.xn, w.shareability, w.level)
    };
    // GiB 0 was split: the image below the pool stays write-back and executable.
    assert_eq!(attrs(0x1000_0000), (ATTR_NORMAL, (false, false), 0b11, 2));
    assert_eq!(attrs(0x10ff_fff8), (ATTR_NORMAL, (false, false), 0b11, 2));
    for va in [0x1100_0000, 0x1180_0000, 0x11ff_fff8] {
        assert_eq!(
            attrs(va),
            (ATTR_NORMAL_NC, (false, true), 0b10, 2),
            "{va:#x}"
        );
    }
    assert_eq!(attrs(0x1200_0000).0, ATTR_NORMAL);
    assert_eq!(attrs(0x3fff_fff8).0, ATTR_NORMAL);
    // GiB 1 is still one level-1 block.
    assert_eq!(attrs(0x4000_0000), (ATTR_NORMAL, (false, false), 0b11, 1));
    // GDMA, SMMU, UART: devices.
    for va in [0xfd50_0000, 0xfd80_0000, 0xff00_0000] {
        assert_eq!(attrs(va).0, ATTR_DEVICE, "{va:#x}");
    }
}

#[test]
fn non_cacheable_regions_must_be_aligned_ram() {
    let ram = [MemRegion::new(0, 2 * GIB)];
    for bad in [
        MemRegion::new(0x1110_0000, 2 * MIB), // base not 2 MiB aligned
        MemRegion::new(0x1100_0000, 3 * MIB), // size not 2 MiB aligned
        MemRegion::new(0x1100_0000, 0),       // empty
        MemRegion::new(0x9000_0000, 2 * MIB), // not RAM
        MemRegion::new(0x7fe0_0000, 4 * MIB), // runs past the end of RAM
        MemRegion::new(u64::MAX - MIB, 2 * MIB), // overflows
    ] {
        let (_, r) = build_with_nc(&ram, &[bad], 40, Regime::El3, 4);
        assert_eq!(
            r,
            Err(FirmwareError::RegionNotMappable {
                base: bad.base,
                size: bad.size
            }),
            "{bad:x?}"
        );
    }
}

proptest! {
    /// With a non-cacheable part carved out of a RAM region, the walk says: non-cacheable
    /// exactly there, normal in the rest of RAM, device elsewhere.
    #[test]
    fn walk_agrees_with_non_cacheable_regions(
        regions in proptest::collection::vec((0u64..(32 * 512), 1u64..2048), 1..4),
        carve in (0u64..2048, 1u64..2048),
        probes in proptest::collection::vec(0u64..(1 << 36), 64),
    ) {
        let ram: Vec<MemRegion> = regions
            .iter()
            .map(|&(start, len)| MemRegion::new(start * L2_BLOCK, len * L2_BLOCK))
            .collect();
        // A sub-range of the first region, in 2 MiB units.
        let first = regions[0];
        let offset = carve.0 % first.1;
        let len = 1 + (carve.1 - 1) % (first.1 - offset);
        let nc = MemRegion::new((first.0 + offset) * L2_BLOCK, len * L2_BLOCK);
        // At most two partial GiBs per region and two for the carve-out: 8 level-2 tables.
        let (tables, summary) = build_with_nc(&ram, &[nc], 40, Regime::El1, 9);
        prop_assert!(summary.unwrap().tables <= 9);
        let edges = [nc.base, nc.base + nc.size - 1, nc.base + nc.size, nc.base.wrapping_sub(1)];
        for va in probes.into_iter().chain(edges) {
            let Some(w) = walk(&tables, va) else {
                prop_assert!(va >= 1 << 39);
                continue;
            };
            prop_assert_eq!(w.pa, va);
            let in_nc = va >= nc.base && va < nc.base + nc.size;
            let in_ram = ram.iter().any(|r| va >= r.base && va < r.base + r.size);
            let expected = if in_nc {
                ATTR_NORMAL_NC
            } else if in_ram {
                ATTR_NORMAL
            } else {
                ATTR_DEVICE
            };
            prop_assert_eq!(w.attr_index, expected, "va {:#x}", va);
        }
    }
}

proptest! {
    /// The walk of the built tables agrees with the region list for any address: identity,
    /// normal exactly inside the (2 MiB-rounded) regions, device elsewhere below 2^39.
    #[test]
    fn walk_agrees_with_the_region_list(
        regions in proptest::collection::vec((0u64..(32 * 512), 1u64..2048), 1..4),
        probes in proptest::collection::vec(0u64..(1 << 36), 64),
    ) {
        // Regions in units of 2 MiB below 32 GiB, so rounding is a no-op.
        let ram: Vec<MemRegion> = regions
            .iter()
            .map(|&(start, len)| MemRegion::new(start * L2_BLOCK, len * L2_BLOCK))
            .collect();
        let (tables, summary) = build(&ram, 40, Regime::El1, 8);
        let summary = summary.unwrap();
        prop_assert!(summary.tables <= 7);
        for va in probes.into_iter().chain(ram.iter().flat_map(|r| [r.base, r.base + r.size - 1, r.base + r.size])) {
            let w = walk(&tables, va).unwrap();
            prop_assert_eq!(w.pa, va);
            let inside = ram.iter().any(|r| va >= r.base && va < r.base + r.size);
            let expected = if inside { ATTR_NORMAL } else { ATTR_DEVICE };
            prop_assert_eq!(w.attr_index, expected, "va {:#x}", va);
            prop_assert!(w.access_flag);
        }
    }
}

#[test]
fn only_whole_2m_blocks_of_ram_count_as_normal() {
    // 3 MiB from 1 GiB: one whole block (the second one is cut by the end).
    let ram = [MemRegion {
        base: 0x4000_0000,
        size: 3 << 20,
    }];
    assert_eq!(normal_part(&ram[0]), Some((0x4000_0000, 0x4020_0000)));
    assert!(inside_normal(&ram, 0x4010_0000, 0x4020_0000));
    // An image at +2 MiB would be Device memory, execute-never.
    assert!(!inside_normal(&ram, 0x4020_0000, 0x4024_0000));
    // An unaligned start rounds up.
    let odd = MemRegion {
        base: 0x4010_0000,
        size: 4 << 20,
    };
    assert_eq!(normal_part(&odd), Some((0x4020_0000, 0x4040_0000)));
    assert_eq!(
        normal_part(&MemRegion {
            base: 0x4010_0000,
            size: 1 << 20
        }),
        None
    );
    assert_eq!(
        normal_part(&MemRegion {
            base: u64::MAX - 0xfff,
            size: 0x1000
        }),
        None
    );
}
