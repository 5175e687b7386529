//! Property tests of the translation tables against a reference map.
//!
//! The reference is a `BTreeMap` from 4 KiB page to (frame, attributes). After every random
//! map/unmap/protect, every page of the window is translated by the *walker* reading table
//! memory through `HostDma` by physical address (as the SMMU does), and must agree with the
//! reference. The TLB invalidations the operation asked for (in its break-before-make calls
//! and in its return value) must cover every page whose translation changed and touch no
//! page that was unmapped before.

use std::collections::BTreeMap;

use hal::dma::HostDma;
use hal::{Iova, PageSize, PhysAddr};
use proptest::prelude::*;
use smmu_driver::SmmuError;
use smmu_driver::pagetable::{
    Attributes, Invalidations, MairIndex, PageTable, PageTableConfig, Permissions, Shareability,
    TlbInvalidation, TlbMaintenance,
};
use smmu_driver::walk::{WalkConfig, WalkFault, walk};

const PAGE: u64 = 0x1000;
const BLOCK: u64 = 0x20_0000;
/// Four 2 MiB blocks straddling a 1 GiB boundary, so two level-2 tables are involved.
const WINDOW: u64 = 0x4000_0000 - 2 * BLOCK;
const BLOCKS: u64 = 4;
const PAGES: u64 = BLOCKS * 512;
const PAGE_FRAMES: u64 = 0x1_0000_0000;
const BLOCK_FRAMES: u64 = 0x2_0000_0000;

type Reference = BTreeMap<u64, (u64, Attributes)>;

#[derive(Clone, Debug)]
enum Op {
    Map4K {
        page: u64,
        frame: u64,
        attrs: Attributes,
    },
    Map2M {
        block: u64,
        frame: u64,
        attrs: Attributes,
    },
    Unmap {
        page: u64,
        pages: u64,
    },
    Protect {
        page: u64,
        pages: u64,
        perms: Permissions,
    },
    Translate {
        page: u64,
    },
}

fn permissions() -> impl Strategy<Value = Permissions> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(w, u, x, a)| {
        Permissions {
            writable: w,
            unprivileged: u,
            execute_never: x,
            accessed: a,
        }
    })
}

fn attributes() -> impl Strategy<Value = Attributes> {
    (0u8..3, 0usize..3, any::<bool>(), permissions()).prop_map(|(m, sh, ng, p)| Attributes {
        mair_index: MairIndex::new(m).unwrap(),
        shareability: [
            Shareability::NonShareable,
            Shareability::OuterShareable,
            Shareability::InnerShareable,
        ][sh],
        not_global: ng,
        permissions: p,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PAGES, 0u64..4096, attributes()).prop_map(|(page, frame, attrs)| Op::Map4K { page, frame, attrs }),
        2 => (0..BLOCKS, 0u64..64, attributes()).prop_map(|(block, frame, attrs)| Op::Map2M { block, frame, attrs }),
        // Short ranges, and ranges crossing block boundaries.
        2 => (0..PAGES, 1u64..8).prop_map(|(page, pages)| Op::Unmap { page, pages }),
        1 => (0..PAGES, 1u64..1100).prop_map(|(page, pages)| Op::Unmap { page, pages }),
        2 => (0..PAGES, 1u64..8, permissions()).prop_map(|(page, pages, perms)| Op::Protect { page, pages, perms }),
        1 => (0..PAGES, 1u64..1100, permissions()).prop_map(|(page, pages, perms)| Op::Protect { page, pages, perms }),
        1 => (0..PAGES).prop_map(|page| Op::Translate { page }),
    ]
}

/// Records what the tables ask to invalidate in the middle of an operation.
#[derive(Default)]
struct Tlb {
    calls: Vec<Invalidations>,
}

impl TlbMaintenance for Tlb {
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> smmu_driver::Result<()> {
        self.calls.push(*invalidations);
        Ok(())
    }
}

fn iova(page: u64) -> u64 {
    WINDOW + page * PAGE
}

/// What the SMMU sees for every page of the window.
fn device_view(dma: &HostDma, root: PhysAddr) -> Reference {
    let mut seen = Reference::new();
    for page in 0..PAGES {
        match walk(root, Iova::new(iova(page)), &WalkConfig::SMMU_48, |pa| {
            dma.read_phys_u64(pa)
        }) {
            Ok(leaf) => {
                let attrs = leaf
                    .attributes()
                    .expect("the builder never writes reserved SH");
                seen.insert(page, (leaf.phys(Iova::new(iova(page))).as_u64(), attrs));
            }
            Err(WalkFault::Translation { .. }) => {}
            Err(other) => panic!("page {page}: unexpected walk fault {other:?}"),
        }
    }
    seen
}

/// Applies `op` to the reference; returns the result the tables must give.
fn apply(reference: &mut Reference, op: &Op) -> Result<(), SmmuError> {
    match *op {
        Op::Map4K { page, frame, attrs } => {
            if reference.contains_key(&page) {
                return Err(SmmuError::AlreadyMapped {
                    iova: Iova::new(iova(page)),
                });
            }
            reference.insert(page, (PAGE_FRAMES + frame * PAGE, attrs));
        }
        Op::Map2M {
            block,
            frame,
            attrs,
        } => {
            let first = block * 512;
            if let Some((&page, _)) = reference.range(first..first + 512).next() {
                return Err(SmmuError::AlreadyMapped {
                    iova: Iova::new(iova(page)),
                });
            }
            for i in 0..512 {
                reference.insert(first + i, (BLOCK_FRAMES + frame * BLOCK + i * PAGE, attrs));
            }
        }
        Op::Unmap { page, pages } => {
            for p in page..(page + pages).min(PAGES) {
                reference.remove(&p);
            }
        }
        Op::Protect { page, pages, perms } => {
            for p in page..(page + pages).min(PAGES) {
                if let Some((_, attrs)) = reference.get_mut(&p) {
                    attrs.permissions = perms;
                }
            }
        }
        Op::Translate { .. } => {}
    }
    Ok(())
}

fn run(pt: &mut PageTable<&HostDma>, op: &Op, tlb: &mut Tlb) -> Result<Invalidations, SmmuError> {
    match *op {
        Op::Map4K { page, frame, attrs } => pt.map(
            Iova::new(iova(page)),
            PhysAddr::new(PAGE_FRAMES + frame * PAGE),
            PageSize::Size4K,
            &attrs,
            tlb,
        ),
        Op::Map2M {
            block,
            frame,
            attrs,
        } => pt.map(
            Iova::new(iova(block * 512)),
            PhysAddr::new(BLOCK_FRAMES + frame * BLOCK),
            PageSize::Size2M,
            &attrs,
            tlb,
        ),
        Op::Unmap { page, pages } => {
            let pages = pages.min(PAGES - page);
            pt.unmap(Iova::new(iova(page)), pages * PAGE, tlb)
        }
        Op::Protect { page, pages, perms } => {
            let pages = pages.min(PAGES - page);
            pt.protect(Iova::new(iova(page)), pages * PAGE, perms, tlb)
        }
        Op::Translate { .. } => Ok(Invalidations::new()),
    }
}

/// Pages of the window covered by `run`.
fn pages_of(run: &TlbInvalidation) -> impl Iterator<Item = u64> {
    let start = run.start.as_u64();
    let end = start + run.len();
    (start..end)
        .step_by(PAGE as usize)
        .filter(|a| (WINDOW..WINDOW + PAGES * PAGE).contains(a))
        .map(|a| (a - WINDOW) / PAGE)
}

fn check_invalidations(
    op: &Op,
    before: &Reference,
    after: &Reference,
    runs: &[TlbInvalidation],
    overflowed: bool,
) -> Result<(), TestCaseError> {
    let mut covered = BTreeMap::<u64, u32>::new();
    for run in runs {
        if run.leaf_only {
            for p in pages_of(run) {
                *covered.entry(p).or_default() += 1;
            }
        } else {
            // Only a block replacing an (empty) table drops a table descriptor.
            let Op::Map2M { block, .. } = *op else {
                return Err(TestCaseError::fail(format!(
                    "walk-cache invalidation {run:?} from {op:?}"
                )));
            };
            prop_assert_eq!(run.start.as_u64(), iova(block * 512));
            prop_assert_eq!((run.count, run.granule), (1, PageSize::Size2M));
            prop_assert!(
                before
                    .range(block * 512..block * 512 + 512)
                    .next()
                    .is_none()
            );
        }
    }
    for (page, old) in before {
        if after.get(page) != Some(old) && !overflowed {
            prop_assert!(
                covered.contains_key(page),
                "page {page} changed but was not invalidated by {op:?}"
            );
        }
    }
    for (page, times) in &covered {
        prop_assert!(
            before.contains_key(page),
            "page {page} was unmapped before but is invalidated by {op:?}"
        );
        prop_assert_eq!(*times, 1, "page {} invalidated twice", page);
    }
    Ok(())
}

/// 48 cases by default (about a second); `PROPTEST_CASES` raises it for a longer soak.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn tables_agree_with_the_reference_and_report_exact_invalidations(ops in prop::collection::vec(op(), 1..32)) {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 256).unwrap();
        let mut pt = PageTable::new(&dma, PageTableConfig::default()).unwrap();
        let mut reference = Reference::new();
        for op in &ops {
            let before = reference.clone();
            let expected = apply(&mut reference, op);
            let mut tlb = Tlb::default();
            let result = run(&mut pt, op, &mut tlb);
            match (&expected, &result) {
                (Ok(()), Ok(_)) => {}
                (Err(e), Err(r)) => prop_assert_eq!(e, r),
                _ => return Err(TestCaseError::fail(format!("{op:?}: expected {expected:?}, got {result:?}"))),
            }
            let seen = device_view(&dma, pt.root());
            prop_assert_eq!(&seen, &reference, "after {:?}", op);

            let mut runs: Vec<TlbInvalidation> = tlb.calls.iter().flat_map(|c| c.iter().copied()).collect();
            let mut overflowed = tlb.calls.iter().any(Invalidations::overflowed);
            if let Ok(returned) = &result {
                runs.extend(returned.iter().copied());
                overflowed |= returned.overflowed();
                if matches!(op, Op::Map4K { .. } | Op::Map2M { .. }) {
                    prop_assert!(returned.is_empty(), "a map reported {:?}", returned);
                }
            }
            check_invalidations(op, &before, &reference, &runs, overflowed)?;

            if let Op::Translate { page } = *op {
                let cpu = pt.translate(Iova::new(iova(page))).unwrap();
                prop_assert_eq!(cpu.map(|l| l.phys(Iova::new(iova(page))).as_u64()), reference.get(&page).map(|e| e.0));
            }
        }
    }
}
