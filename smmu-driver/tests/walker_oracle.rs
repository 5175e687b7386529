//! Cross-checks against an independent table builder: Google's `aarch64-paging` (0.12.3).
//!
//! Random pages, 2 MiB and 1 GiB blocks with random attributes are mapped with
//! `aarch64-paging` (its `TargetAllocator` lays the tables out at a chosen physical address),
//! the image is copied into simulated DRAM, and our walker must translate every mapped address
//! to the expected frame and decode the expected attributes, and fault on unmapped ones. The
//! same pages and 2 MiB blocks are mapped with our builder: its leaf descriptors must be bit
//! for bit the ones `aarch64-paging` wrote.

use std::collections::BTreeMap;

use aarch64_paging::descriptor::{El1Attributes, PhysicalAddress};
use aarch64_paging::paging::{Constraints, El1And0, MemoryRegion, RootTable, VaRange};
use aarch64_paging::target::TargetAllocator;
use hal::dma::HostDma;
use hal::{Iova, PageSize, PhysAddr};
use proptest::prelude::*;
use smmu_driver::pagetable::{
    Attributes, Invalidations, MairIndex, PageTable, PageTableConfig, Permissions, Shareability,
    TlbMaintenance,
};
use smmu_driver::walk::{WalkConfig, WalkFault, walk};

const ORACLE_BASE: u64 = 0x8000_0000;
const OURS_BASE: u64 = 0xc000_0000;
const GIB: u64 = 1 << 30;

/// Our attributes in `aarch64-paging`'s vocabulary (Arm ARM stage-1 leaf fields).
fn oracle_flags(a: &Attributes) -> El1Attributes {
    let mut f = El1Attributes::VALID;
    f |= match a.mair_index.get() {
        0 => El1Attributes::ATTRIBUTE_INDEX_0,
        1 => El1Attributes::ATTRIBUTE_INDEX_1,
        2 => El1Attributes::ATTRIBUTE_INDEX_2,
        _ => El1Attributes::ATTRIBUTE_INDEX_3,
    };
    f |= match a.shareability {
        Shareability::NonShareable => El1Attributes::empty(),
        Shareability::OuterShareable => El1Attributes::OUTER_SHAREABLE,
        Shareability::InnerShareable => El1Attributes::INNER_SHAREABLE,
    };
    if a.not_global {
        f |= El1Attributes::NON_GLOBAL;
    }
    let p = &a.permissions;
    if !p.writable {
        f |= El1Attributes::READ_ONLY;
    }
    if p.unprivileged {
        f |= El1Attributes::USER;
    }
    if p.accessed {
        f |= El1Attributes::ACCESSED;
    }
    if p.execute_never {
        f |= El1Attributes::UXN | El1Attributes::PXN;
    }
    f
}

fn attributes() -> impl Strategy<Value = Attributes> {
    (0u8..4, 0usize..3, any::<bool>(), any::<[bool; 4]>()).prop_map(|(m, sh, ng, p)| Attributes {
        mair_index: MairIndex::new(m).unwrap(),
        shareability: [
            Shareability::NonShareable,
            Shareability::OuterShareable,
            Shareability::InnerShareable,
        ][sh],
        not_global: ng,
        permissions: Permissions {
            writable: p[0],
            unprivileged: p[1],
            execute_never: p[2],
            accessed: p[3],
        },
    })
}

/// Input address -> (size, output address, attributes).
type Expected = BTreeMap<u64, (PageSize, u64, Attributes)>;

fn mappings() -> impl Strategy<Value = Expected> {
    let pages = prop::collection::btree_map(0u64..1024, (0u64..1 << 20, attributes()), 0..24);
    let blocks = prop::collection::btree_map(0u64..512, (0u64..1 << 11, attributes()), 0..6);
    let giant = prop::option::of((0u64..8, attributes()));
    (pages, blocks, giant).prop_map(|(pages, blocks, giant)| {
        let mut m = Expected::new();
        // Pages in the first 4 MiB, blocks in the second GiB, a 1 GiB block at 4 GiB.
        for (p, (f, a)) in pages {
            m.insert(p << 12, (PageSize::Size4K, 0x10_0000_0000 + (f << 12), a));
        }
        for (b, (f, a)) in blocks {
            m.insert(
                GIB + (b << 21),
                (PageSize::Size2M, 0x20_0000_0000 + (f << 21), a),
            );
        }
        if let Some((f, a)) = giant {
            m.insert(4 * GIB, (PageSize::Size1G, 0x40_0000_0000 + f * GIB, a));
        }
        m
    })
}

struct NoTlb;

impl TlbMaintenance for NoTlb {
    fn invalidate_now(&mut self, _: &Invalidations) -> smmu_driver::Result<()> {
        panic!("fresh maps never need break-before-make")
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn our_walker_reads_aarch64_paging_tables_and_our_builder_writes_the_same_leaves(expected in mappings()) {
        let mut oracle = RootTable::with_va_range(
            TargetAllocator::new(ORACLE_BASE),
            0,
            El1And0,
            VaRange::Lower,
        );
        for (&va, &(size, pa, attrs)) in &expected {
            let range = MemoryRegion::new(va as usize, (va + size.bytes()) as usize);
            oracle
                .map_range(&range, PhysicalAddress(pa as usize), oracle_flags(&attrs), Constraints::empty())
                .unwrap();
        }
        let image = oracle.translation().as_bytes();
        let oracle_dram = HostDma::new(PhysAddr::new(ORACLE_BASE), image.len() / 4096 + 1).unwrap();
        oracle_dram.write_phys(PhysAddr::new(ORACLE_BASE), &image).unwrap();
        let oracle_root = PhysAddr::new(oracle.to_physical().0 as u64);

        let ours_dram = HostDma::new(PhysAddr::new(OURS_BASE), 64).unwrap();
        let mut ours = PageTable::new(&ours_dram, PageTableConfig::default()).unwrap();
        for (&va, &(size, pa, attrs)) in &expected {
            if size != PageSize::Size1G {
                ours.map(Iova::new(va), PhysAddr::new(pa), size, &attrs, &mut NoTlb).unwrap();
            }
        }

        for (&va, &(size, pa, attrs)) in &expected {
            for offset in [0, 0x123, size.bytes() - 8] {
                let iova = Iova::new(va + offset);
                let leaf = walk(oracle_root, iova, &WalkConfig::SMMU_48, |a| oracle_dram.read_phys_u64(a)).unwrap();
                prop_assert_eq!(leaf.size, size);
                prop_assert_eq!(leaf.phys(iova), PhysAddr::new(pa + offset));
                prop_assert_eq!(leaf.attributes(), Some(attrs));
                if size != PageSize::Size1G {
                    let mine = walk(ours.root(), iova, &WalkConfig::SMMU_48, |a| ours_dram.read_phys_u64(a)).unwrap();
                    prop_assert_eq!(mine.descriptor, leaf.descriptor, "leaf for {:#x}", va);
                    prop_assert_eq!(mine.level, leaf.level);
                }
            }
        }
        // Unmapped neighbours fault in both.
        for probe in [0x40_0000u64, GIB - 0x1000, 2 * GIB, 5 * GIB, 1 << 40] {
            if expected.range(..=probe).next_back().is_some_and(|(&va, &(s, _, _))| probe < va + s.bytes()) {
                continue;
            }
            let theirs = walk(oracle_root, Iova::new(probe), &WalkConfig::SMMU_48, |a| oracle_dram.read_phys_u64(a));
            prop_assert!(matches!(theirs, Err(WalkFault::Translation { .. })), "{:#x}: {:?}", probe, theirs);
            let mine = walk(ours.root(), Iova::new(probe), &WalkConfig::SMMU_48, |a| ours_dram.read_phys_u64(a));
            prop_assert!(matches!(mine, Err(WalkFault::Translation { .. })), "{:#x}: {:?}", probe, mine);
        }
    }
}
