use std::vec::Vec;

use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::journal::{self, Event};

use super::*;
use crate::walk::{WalkConfig, WalkFault, walk};

const ARENA: u64 = 0x8000_0000;

fn dma() -> HostDma {
    HostDma::new(PhysAddr::new(ARENA), 256).unwrap()
}

/// Records every break-before-make call and what the walker saw at that moment.
struct RecordingTlb<'a> {
    dma: &'a HostDma,
    root: PhysAddr,
    probe: Iova,
    calls: Vec<Invalidations>,
    /// Walk result for `probe` at each call.
    seen: Vec<core::result::Result<Leaf, WalkFault>>,
    /// Whether a store barrier was issued since the operation started, at each call.
    barrier_before: Vec<bool>,
    fail: bool,
}

impl<'a> RecordingTlb<'a> {
    fn new(dma: &'a HostDma, root: PhysAddr, probe: Iova) -> Self {
        Self {
            dma,
            root,
            probe,
            calls: Vec::new(),
            seen: Vec::new(),
            barrier_before: Vec::new(),
            fail: false,
        }
    }
}

impl TlbMaintenance for RecordingTlb<'_> {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()> {
        self.calls.push(*invalidations);
        self.seen
            .push(walk(self.root, self.probe, &WalkConfig::SMMU_48, |pa| {
                self.dma.read_phys_u64(pa)
            }));
        self.barrier_before
            .push(journal::take().contains(&Event::Barrier(Barrier::DsbSt)));
        if self.fail {
            Err(SmmuError::Hal(hal::HalError::Timeout { waited_us: 1 }))
        } else {
            Ok(())
        }
    }
}

/// Attributes used by the encoding tests: AttrIndx 1, inner shareable, nG, AP[1], AF, UXN+PXN.
fn rw() -> Attributes {
    Attributes::normal(Permissions::READ_WRITE)
}

fn device_walk(dma: &HostDma, root: PhysAddr, iova: u64) -> core::result::Result<Leaf, WalkFault> {
    walk(root, Iova::new(iova), &WalkConfig::SMMU_48, |pa| {
        dma.read_phys_u64(pa)
    })
}

/// Follows table descriptors by hand (no walker): the descriptor at `level` for `iova`.
fn raw_descriptor(dma: &HostDma, root: PhysAddr, iova: u64, level: u8) -> u64 {
    let mut table = root.as_u64();
    for l in 0..=level {
        let idx = (iova >> (12 + 9 * (3 - l as u64))) & 0x1ff;
        let d = dma.read_phys_u64(PhysAddr::new(table + idx * 8)).unwrap();
        if l == level {
            return d;
        }
        assert_eq!(d & 0b11, 0b11, "level {l} must hold a table descriptor");
        table = d & 0x0000_ffff_ffff_f000;
    }
    unreachable!()
}

#[test]
fn page_descriptor_encoding_matches_the_architecture() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    let inv = pt
        .map(
            Iova::new(0x1234_5000),
            PhysAddr::new(0x4000_1000),
            PageSize::Size4K,
            &rw(),
            &mut tlb,
        )
        .unwrap();
    assert!(
        inv.is_empty(),
        "a map into an invalid entry needs no invalidation"
    );
    assert!(tlb.calls.is_empty());
    // valid+page 0b11 | AttrIndx 1 (0x4) | AP[1] (0x40) | SH=0b11 (0x300) | AF (0x400)
    // | nG (0x800) | PXN (bit 53) | UXN (bit 54) | OA 0x4000_1000.
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0x1234_5000, 3),
        0x0060_0000_4000_1f47
    );
    // Tables above: valid+table, no hierarchical restrictions.
    for level in 0..3 {
        assert_eq!(
            raw_descriptor(&dma, pt.root(), 0x1234_5000, level) & 0xfff,
            0x003
        );
        assert_eq!(raw_descriptor(&dma, pt.root(), 0x1234_5000, level) >> 48, 0);
    }

    let ro = Attributes::normal(Permissions::READ_ONLY);
    pt.map(
        Iova::new(0x1234_6000),
        PhysAddr::new(0x4000_2000),
        PageSize::Size4K,
        &ro,
        &mut tlb,
    )
    .unwrap();
    // AP[2] (0x80) added.
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0x1234_6000, 3),
        0x0060_0000_4000_2fc7
    );

    let plain = Attributes {
        mair_index: MairIndex::NORMAL_NON_CACHEABLE,
        shareability: Shareability::NonShareable,
        not_global: false,
        permissions: Permissions {
            writable: true,
            unprivileged: false,
            execute_never: false,
            accessed: false,
        },
    };
    pt.map(
        Iova::new(0x1234_7000),
        PhysAddr::new(0x4000_3000),
        PageSize::Size4K,
        &plain,
        &mut tlb,
    )
    .unwrap();
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0x1234_7000, 3),
        0x0000_0000_4000_3003
    );

    let dev = Attributes {
        mair_index: MairIndex::DEVICE_NGNRE,
        shareability: Shareability::OuterShareable,
        ..plain
    };
    pt.map(
        Iova::new(0x1234_8000),
        PhysAddr::new(0x4000_4000),
        PageSize::Size4K,
        &dev,
        &mut tlb,
    )
    .unwrap();
    // AttrIndx 2 (0x8), SH=0b10 (0x200).
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0x1234_8000, 3),
        0x0000_0000_4000_420b
    );
}

#[test]
fn block_descriptor_encoding_and_translation() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    pt.map(
        Iova::new(0x4000_0000),
        PhysAddr::new(0x8020_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    // Block: bit 1 clear -> low bits 0xf45.
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0x4000_0000, 2),
        0x0060_0000_8020_0f45
    );
    let leaf = device_walk(&dma, pt.root(), 0x4012_3456).unwrap();
    assert_eq!(leaf.size, PageSize::Size2M);
    assert_eq!(leaf.level, 2);
    assert_eq!(
        leaf.phys(Iova::new(0x4012_3456)),
        PhysAddr::new(0x8032_3456)
    );
    assert_eq!(leaf.attributes(), Some(rw()));
    assert_eq!(pt.translate(Iova::new(0x4012_3456)).unwrap(), Some(leaf));
    assert_eq!(pt.translate(Iova::new(0x4020_0000)).unwrap(), None);
    // Root, L1, L2: three tables.
    assert_eq!(pt.tables_in_use(), 3);
}

#[test]
fn mapping_over_a_live_entry_is_refused_and_changes_nothing() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    pt.map(
        Iova::new(0x20_0000),
        PhysAddr::new(0x9000_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    assert_eq!(
        pt.map(
            Iova::new(0x20_1000),
            PhysAddr::new(0x1000),
            PageSize::Size4K,
            &rw(),
            &mut tlb
        ),
        Err(SmmuError::AlreadyMapped {
            iova: Iova::new(0x20_1000)
        })
    );
    pt.map(
        Iova::new(0x40_3000),
        PhysAddr::new(0x5000),
        PageSize::Size4K,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    assert_eq!(
        pt.map(
            Iova::new(0x40_3000),
            PhysAddr::new(0x6000),
            PageSize::Size4K,
            &rw(),
            &mut tlb
        ),
        Err(SmmuError::AlreadyMapped {
            iova: Iova::new(0x40_3000)
        })
    );
    // A block over a table holding a live page.
    assert_eq!(
        pt.map(
            Iova::new(0x40_0000),
            PhysAddr::new(0xa000_0000),
            PageSize::Size2M,
            &rw(),
            &mut tlb
        ),
        Err(SmmuError::AlreadyMapped {
            iova: Iova::new(0x40_3000)
        })
    );
    assert_eq!(
        device_walk(&dma, pt.root(), 0x40_3000).unwrap().output,
        PhysAddr::new(0x5000)
    );
    assert_eq!(
        device_walk(&dma, pt.root(), 0x20_1000)
            .unwrap()
            .phys(Iova::new(0x20_1000)),
        PhysAddr::new(0x9000_1000)
    );
    assert!(tlb.calls.is_empty());
}

#[test]
fn splitting_a_block_breaks_invalidates_then_makes() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let block = 0x60_0000u64;
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::new(block + 0x5000));
    pt.map(
        Iova::new(block),
        PhysAddr::new(0x9040_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    let tables = pt.tables_in_use();

    journal::start();
    let inv = pt
        .unmap(Iova::new(block + 0x3000), 0x1000, &mut tlb)
        .unwrap();
    journal::stop();

    // Exactly one break-before-make, for the whole block at level 2, leaf only.
    assert_eq!(tlb.calls.len(), 1);
    let runs: Vec<_> = tlb.calls[0].iter().copied().collect();
    assert_eq!(
        runs,
        [TlbInvalidation {
            start: Iova::new(block),
            count: 1,
            granule: PageSize::Size2M,
            leaf_only: true
        }]
    );
    assert_eq!(runs[0].level(), 2);
    // When the SMMU was asked to invalidate, the walker already saw the entry invalid (the
    // break), published with a store barrier.
    assert_eq!(tlb.seen[0], Err(WalkFault::Translation { level: 2 }));
    assert!(tlb.barrier_before[0]);
    // Everything in the block was covered by that invalidation: nothing more to report.
    assert!(inv.is_empty());

    // After: a level-3 table with 511 pages of the old block and one hole.
    assert_eq!(pt.tables_in_use(), tables + 1);
    assert_eq!(
        device_walk(&dma, pt.root(), block + 0x3000),
        Err(WalkFault::Translation { level: 3 })
    );
    for page in [0u64, 0x2000, 0x4000, 0x1f_f000] {
        let leaf = device_walk(&dma, pt.root(), block + page).unwrap();
        assert_eq!(leaf.size, PageSize::Size4K);
        assert_eq!(leaf.output, PhysAddr::new(0x9040_0000 + page));
        assert_eq!(leaf.attributes(), Some(rw()));
    }
    assert_eq!(
        raw_descriptor(&dma, pt.root(), block + 0x4000, 3),
        0x0060_0000_9040_4f47
    );
}

#[test]
fn protect_part_of_a_block_splits_it_with_the_new_permissions_built_in() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let block = 0x20_0000u64;
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::new(block));
    pt.map(
        Iova::new(block),
        PhysAddr::new(0x9000_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    let inv = pt
        .protect(
            Iova::new(block + 0x10_0000),
            0x10_0000,
            Permissions::READ_ONLY,
            &mut tlb,
        )
        .unwrap();
    assert!(inv.is_empty());
    assert_eq!(tlb.calls.len(), 1);
    assert!(
        device_walk(&dma, pt.root(), block + 0xf_f000)
            .unwrap()
            .writable()
    );
    assert!(
        !device_walk(&dma, pt.root(), block + 0x10_0000)
            .unwrap()
            .writable()
    );
    assert!(
        !device_walk(&dma, pt.root(), block + 0x1f_f000)
            .unwrap()
            .writable()
    );

    // Protecting with the permissions they already have changes nothing.
    let inv = pt
        .protect(
            Iova::new(block),
            0x20_0000,
            Permissions::READ_ONLY,
            &mut tlb,
        )
        .unwrap();
    // Only the first half was writable: one run of 256 pages.
    let runs: Vec<_> = inv.iter().copied().collect();
    assert_eq!(
        runs,
        [TlbInvalidation {
            start: Iova::new(block),
            count: 256,
            granule: PageSize::Size4K,
            leaf_only: true
        }]
    );
    let again = pt
        .protect(
            Iova::new(block),
            0x20_0000,
            Permissions::READ_ONLY,
            &mut tlb,
        )
        .unwrap();
    assert!(again.is_empty());
    assert_eq!(tlb.calls.len(), 1);
}

#[test]
fn whole_block_changes_need_one_block_invalidation_and_no_split() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    pt.map(
        Iova::new(0xa0_0000),
        PhysAddr::new(0x9000_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    let tables = pt.tables_in_use();
    let block_run = TlbInvalidation {
        start: Iova::new(0xa0_0000),
        count: 1,
        granule: PageSize::Size2M,
        leaf_only: true,
    };
    let inv = pt
        .protect(
            Iova::new(0xa0_0000),
            0x20_0000,
            Permissions::READ_ONLY,
            &mut tlb,
        )
        .unwrap();
    assert_eq!(inv.iter().copied().collect::<Vec<_>>(), [block_run]);
    assert_eq!(
        raw_descriptor(&dma, pt.root(), 0xa0_0000, 2),
        0x0060_0000_9000_0fc5
    );
    // Unmapping more than the block (the rest is unmapped) reports just the block.
    let inv = pt.unmap(Iova::new(0x80_0000), 0x80_0000, &mut tlb).unwrap();
    assert_eq!(inv.iter().copied().collect::<Vec<_>>(), [block_run]);
    assert!(tlb.calls.is_empty());
    assert_eq!(pt.tables_in_use(), tables);
    assert_eq!(pt.translate(Iova::new(0xa0_0000)).unwrap(), None);
}

#[test]
fn unmapping_pages_reports_coalesced_runs_of_exactly_the_mapped_pages() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    // Pages 0..8 and 10..12 mapped, 8 and 9 not.
    for p in (0..8).chain(10..12) {
        pt.map(
            Iova::new(p << 12),
            PhysAddr::new(0x1_0000_0000 + (p << 12)),
            PageSize::Size4K,
            &rw(),
            &mut tlb,
        )
        .unwrap();
    }
    let inv = pt.unmap(Iova::new(0x1000), 0x20_0000, &mut tlb).unwrap();
    let runs: Vec<_> = inv.iter().copied().collect();
    let run = |start: u64, count: u64| TlbInvalidation {
        start: Iova::new(start),
        count,
        granule: PageSize::Size4K,
        leaf_only: true,
    };
    assert_eq!(runs, [run(0x1000, 7), run(0xa000, 2)]);
    assert!(pt.translate(Iova::new(0)).unwrap().is_some());
    assert!(pt.translate(Iova::new(0x1000)).unwrap().is_none());
    // Unmapping again finds nothing valid.
    assert!(
        pt.unmap(Iova::new(0), 0x40_0000, &mut tlb)
            .unwrap()
            .iter()
            .count()
            == 1
    );
    assert!(
        pt.unmap(Iova::new(0), 0x40_0000, &mut tlb)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn too_many_scattered_runs_overflow_to_a_full_invalidation() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    for p in (0..2 * MAX_INVALIDATION_RUNS as u64 + 2).step_by(2) {
        pt.map(
            Iova::new(p << 12),
            PhysAddr::new(p << 12),
            PageSize::Size4K,
            &rw(),
            &mut tlb,
        )
        .unwrap();
    }
    let inv = pt.unmap(Iova::new(0), 0x20_0000, &mut tlb).unwrap();
    assert!(inv.overflowed());
    assert_eq!(inv.len(), MAX_INVALIDATION_RUNS);
    assert!(inv.covers(Iova::new(0x7_0000_0000)));
}

#[test]
fn a_block_replaces_an_empty_table_with_a_walk_cache_invalidation() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let block = 0x40_0000u64;
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::new(block + 0x8000));
    pt.map(
        Iova::new(block + 0x8000),
        PhysAddr::new(0x7000),
        PageSize::Size4K,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    pt.unmap(Iova::new(block + 0x8000), 0x1000, &mut tlb)
        .unwrap();
    let tables = pt.tables_in_use();
    let inv = pt
        .map(
            Iova::new(block),
            PhysAddr::new(0xb000_0000),
            PageSize::Size2M,
            &rw(),
            &mut tlb,
        )
        .unwrap();
    assert!(inv.is_empty());
    assert_eq!(tlb.calls.len(), 1);
    assert_eq!(
        tlb.calls[0].iter().copied().collect::<Vec<_>>(),
        [TlbInvalidation {
            start: Iova::new(block),
            count: 1,
            granule: PageSize::Size2M,
            leaf_only: false
        }]
    );
    assert_eq!(tlb.seen[0], Err(WalkFault::Translation { level: 2 }));
    assert_eq!(
        pt.tables_in_use(),
        tables - 1,
        "the level-3 table was freed"
    );
    let leaf = device_walk(&dma, pt.root(), block + 0x8000).unwrap();
    assert_eq!(
        (leaf.size, leaf.output),
        (PageSize::Size2M, PhysAddr::new(0xb000_0000))
    );
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dma = dma();
    let mut pt = PageTable::new(
        &dma,
        PageTableConfig {
            output_bits: 40,
            ..Default::default()
        },
    )
    .unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    let a = rw();
    assert_eq!(
        pt.map(
            Iova::new(0x1800),
            PhysAddr::new(0x1000),
            PageSize::Size4K,
            &a,
            &mut tlb
        ),
        Err(SmmuError::Misaligned {
            value: 0x1800,
            align: 0x1000
        })
    );
    assert_eq!(
        pt.map(
            Iova::new(0x20_0000),
            PhysAddr::new(0x1000),
            PageSize::Size2M,
            &a,
            &mut tlb
        ),
        Err(SmmuError::Misaligned {
            value: 0x1000,
            align: 0x20_0000
        })
    );
    assert_eq!(
        pt.map(
            Iova::new(0x4000_0000),
            PhysAddr::new(0),
            PageSize::Size1G,
            &a,
            &mut tlb
        ),
        Err(SmmuError::UnsupportedPageSize { bytes: 0x4000_0000 })
    );
    assert_eq!(
        pt.map(
            Iova::new(1 << 48),
            PhysAddr::new(0),
            PageSize::Size4K,
            &a,
            &mut tlb
        ),
        Err(SmmuError::IovaOutOfRange {
            iova: Iova::new(1 << 48),
            len: 0x1000,
            bits: 48
        })
    );
    assert_eq!(
        pt.map(
            Iova::new(0),
            PhysAddr::new(1 << 40),
            PageSize::Size4K,
            &a,
            &mut tlb
        ),
        Err(SmmuError::OutputAddressOutOfRange {
            phys: PhysAddr::new(1 << 40),
            bits: 40
        })
    );
    assert_eq!(
        pt.unmap(Iova::new(0xffff_ffff_f000), 0x2000, &mut tlb),
        Err(SmmuError::IovaOutOfRange {
            iova: Iova::new(0xffff_ffff_f000),
            len: 0x2000,
            bits: 48
        })
    );
    assert_eq!(
        pt.protect(Iova::new(0), 0x800, Permissions::READ_ONLY, &mut tlb),
        Err(SmmuError::Misaligned {
            value: 0x800,
            align: 0x1000
        })
    );
    assert!(pt.unmap(Iova::new(0), 0, &mut tlb).unwrap().is_empty());
    assert!(matches!(
        PageTable::new(
            &dma,
            PageTableConfig {
                chunk_pages: 65,
                ..Default::default()
            }
        ),
        Err(SmmuError::InvalidConfig { .. })
    ));
    assert!(matches!(
        PageTable::new(
            &dma,
            PageTableConfig {
                output_bits: 52,
                ..Default::default()
            }
        ),
        Err(SmmuError::InvalidConfig { .. })
    ));
}

#[test]
fn running_out_of_table_memory_changes_nothing() {
    let dma = dma();
    // Four table pages in all: root, L1, L2, one L3.
    let config = PageTableConfig {
        chunk_pages: 2,
        max_chunks: 2,
        ..Default::default()
    };
    let mut pt = PageTable::new(&dma, config).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    pt.map(
        Iova::new(0x20_0000),
        PhysAddr::new(0x9000_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    pt.map(
        Iova::new(0x40_0000),
        PhysAddr::new(0x9040_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    pt.map(
        Iova::new(0x1000),
        PhysAddr::new(0x1000),
        PageSize::Size4K,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    assert_eq!(pt.tables_in_use(), 4);
    // Splitting a block needs a fifth table.
    assert_eq!(
        pt.unmap(Iova::new(0x20_0000), 0x1000, &mut tlb),
        Err(SmmuError::TableMemoryExhausted { tables: 4 })
    );
    assert!(tlb.calls.is_empty());
    let leaf = device_walk(&dma, pt.root(), 0x20_0000).unwrap();
    assert_eq!(
        (leaf.size, leaf.output),
        (PageSize::Size2M, PhysAddr::new(0x9000_0000))
    );
    // A range that needs two splits fails as a whole, too.
    assert!(pt.unmap(Iova::new(0x2f_f000), 0x11_2000, &mut tlb).is_err());
    assert!(device_walk(&dma, pt.root(), 0x40_0000).is_ok());
    assert_eq!(pt.tables_in_use(), 4);
    // Whole-block operations still work.
    assert_eq!(
        pt.unmap(Iova::new(0x20_0000), 0x20_0000, &mut tlb)
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn a_failed_invalidation_leaves_the_block_broken_and_leaks_nothing() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    pt.map(
        Iova::new(0x20_0000),
        PhysAddr::new(0x9000_0000),
        PageSize::Size2M,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    let tables = pt.tables_in_use();
    tlb.fail = true;
    assert!(matches!(
        pt.unmap(Iova::new(0x20_0000), 0x1000, &mut tlb),
        Err(SmmuError::Hal(_))
    ));
    assert_eq!(pt.tables_in_use(), tables);
    // Broken: the whole block faults, which is safe (no stale or conflicting translation).
    assert_eq!(
        device_walk(&dma, pt.root(), 0x21_0000),
        Err(WalkFault::Translation { level: 2 })
    );
}

#[test]
fn table_writes_are_published_with_a_store_barrier() {
    let dma = dma();
    let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
    let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
    journal::start();
    pt.map(
        Iova::new(0x5000),
        PhysAddr::new(0x5000),
        PageSize::Size4K,
        &rw(),
        &mut tlb,
    )
    .unwrap();
    let events = journal::stop();
    // New tables are linked after a barrier, and the operation ends with one.
    let barriers = events
        .iter()
        .filter(|e| **e == Event::Barrier(Barrier::DsbSt))
        .count();
    assert!(barriers >= 2, "{events:?}");
    assert_eq!(events.last(), Some(&Event::Barrier(Barrier::DsbSt)));
}

#[test]
fn dropping_the_table_returns_its_memory() {
    let dma = dma();
    {
        let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
        let mut tlb = RecordingTlb::new(&dma, pt.root(), Iova::ZERO);
        pt.map(
            Iova::new(0x5000),
            PhysAddr::new(0x5000),
            PageSize::Size4K,
            &rw(),
            &mut tlb,
        )
        .unwrap();
        assert_eq!(dma.used_pages(), 16);
    }
    assert_eq!(dma.used_pages(), 0);
}

#[test]
fn invalidation_runs_merge_only_when_adjacent_and_alike() {
    let run = |start: u64, granule: PageSize, leaf_only: bool| TlbInvalidation {
        start: Iova::new(start),
        count: 1,
        granule,
        leaf_only,
    };
    let mut inv = Invalidations::new();
    inv.push(run(0x1000, PageSize::Size4K, true));
    inv.push(run(0x2000, PageSize::Size4K, true));
    inv.push(run(0x4000, PageSize::Size4K, true));
    inv.push(run(0x5000, PageSize::Size4K, false));
    inv.push(run(0x20_0000, PageSize::Size2M, true));
    inv.push(run(0x40_0000, PageSize::Size2M, true));
    let runs: Vec<_> = inv.iter().map(|r| (r.start.as_u64(), r.count)).collect();
    assert_eq!(
        runs,
        [(0x1000, 2), (0x4000, 1), (0x5000, 1), (0x20_0000, 2)]
    );
    assert!(inv.covers(Iova::new(0x5f_ffff)));
    assert!(!inv.covers(Iova::new(0x3000)));
    assert_eq!(
        inv.iter().nth(3).unwrap().addresses().collect::<Vec<_>>(),
        [Iova::new(0x20_0000), Iova::new(0x40_0000)]
    );
    assert_eq!(
        MairIndex::new(8),
        Err(SmmuError::InvalidMairIndex { index: 8 })
    );
}
