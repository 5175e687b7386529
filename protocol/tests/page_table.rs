//! The page-state table against docs/protocol.md §3 and a reference model.

use hal::{PageSize, PhysAddr, VirtAddr};
use proptest::prelude::*;
use protocol::wire::StateLookupRequest;
use protocol::{
    Access, FaultReason, Generation, PageEntry, PageFault, PageStateTable, ProtocolError,
    RequestStatus,
};

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
/// A 2 MiB-aligned region of 8 MiB (4 huge pages, 2048 small ones).
const BASE: u64 = 0x4000_0000;
const LEN: u64 = 8 << 20;

fn table() -> PageStateTable<Vec<PageEntry>> {
    PageStateTable::new(
        VirtAddr::new(BASE),
        LEN,
        vec![PageEntry::ABSENT; (LEN / K4) as usize],
    )
    .unwrap()
}

fn va(offset: u64) -> VirtAddr {
    VirtAddr::new(BASE + offset)
}

#[test]
fn construction_errors() {
    let storage = || vec![PageEntry::ABSENT; 4];
    assert_eq!(
        PageStateTable::new(VirtAddr::new(0x1001), 4 * K4, storage()).err(),
        Some(ProtocolError::Misaligned {
            value: 0x1001,
            align: K4
        })
    );
    assert_eq!(
        PageStateTable::new(VirtAddr::new(0x1000), 100, storage()).err(),
        Some(ProtocolError::Misaligned {
            value: 100,
            align: K4
        })
    );
    assert_eq!(
        PageStateTable::new(VirtAddr::new(0x1000), 0, storage()).err(),
        Some(ProtocolError::EmptyRegion)
    );
    assert_eq!(
        PageStateTable::new(VirtAddr::new(0x1000), 5 * K4, storage()).err(),
        Some(ProtocolError::StorageTooSmall { needed: 5, got: 4 })
    );
    assert_eq!(
        PageStateTable::new(VirtAddr::new(u64::MAX - K4 + 1), 2 * K4, storage()).err(),
        Some(ProtocolError::AddressOverflow)
    );
    // A fixed array works as storage too (the no_std case).
    let t = PageStateTable::new(VirtAddr::new(0x1000), 4 * K4, [PageEntry::ABSENT; 4]).unwrap();
    assert_eq!(t.len(), 4 * K4);
}

#[test]
fn small_page_life_cycle() {
    let mut t = table();
    assert_eq!(t.generation(), Generation(0));
    let s = t.lookup(va(0x3123)).unwrap();
    assert!(!s.present && s.frame.is_none());

    let g1 = t
        .mark_present(
            va(0x3000),
            PageSize::Size4K,
            PhysAddr::new(0x8765_4000),
            true,
        )
        .unwrap();
    assert_eq!(g1, Generation(1));
    let s = t.lookup(va(0x3123)).unwrap();
    assert!(s.present && s.writable);
    assert_eq!(s.version, Generation(1));
    assert_eq!(s.size, PageSize::Size4K);
    assert_eq!(s.frame, Some(PhysAddr::new(0x8765_4123)));
    // Neighbours are untouched.
    assert!(!t.lookup(va(0x4000)).unwrap().present);
    assert_eq!(t.lookup(va(0x2fff)).unwrap().version, Generation(0));

    let inv = t.invalidate(va(0x3800), 1).unwrap();
    assert_eq!((inv.generation, inv.pages_dropped), (Generation(2), 1));
    let s = t.lookup(va(0x3000)).unwrap();
    assert!(!s.present);
    assert_eq!(s.version, Generation(2));

    // Invalidating absent pages changes nothing, not even the generation.
    let inv = t.invalidate(va(0), LEN).unwrap();
    assert_eq!((inv.generation, inv.pages_dropped), (Generation(2), 0));
}

#[test]
fn invalidation_outside_the_region_is_clamped() {
    let mut t = table();
    t.mark_present(va(0), PageSize::Size4K, PhysAddr::new(0x1000), true)
        .unwrap();
    t.mark_present(va(LEN - K4), PageSize::Size4K, PhysAddr::new(0x2000), true)
        .unwrap();
    // A range from below the region to far beyond it (Linux notifiers may cover more).
    let inv = t.invalidate(VirtAddr::new(0), u64::MAX).unwrap();
    assert_eq!(inv.pages_dropped, 2);
    // Entirely outside: nothing.
    let inv = t.invalidate(VirtAddr::new(BASE + LEN), K4).unwrap();
    assert_eq!(inv.pages_dropped, 0);
}

#[test]
fn mark_present_checks_alignment_and_bounds() {
    let mut t = table();
    assert_eq!(
        t.mark_present(va(0x800), PageSize::Size4K, PhysAddr::new(0), true),
        Err(ProtocolError::Misaligned {
            value: BASE + 0x800,
            align: K4
        })
    );
    assert_eq!(
        t.mark_present(va(0x1000), PageSize::Size2M, PhysAddr::new(0), true),
        Err(ProtocolError::Misaligned {
            value: BASE + 0x1000,
            align: M2
        })
    );
    assert_eq!(
        t.mark_present(va(0), PageSize::Size2M, PhysAddr::new(0x1000), true),
        Err(ProtocolError::Misaligned {
            value: 0x1000,
            align: M2
        })
    );
    assert_eq!(
        t.mark_present(va(LEN), PageSize::Size4K, PhysAddr::new(0), true),
        Err(ProtocolError::OutOfRegion {
            addr: BASE + LEN,
            len: K4
        })
    );
    // A 1 GiB block does not fit an 8 MiB region.
    assert!(matches!(
        t.mark_present(
            VirtAddr::new(0x4000_0000),
            PageSize::Size1G,
            PhysAddr::new(0),
            true
        ),
        Err(ProtocolError::OutOfRegion { .. })
    ));
    assert_eq!(t.generation(), Generation(0), "failed calls change nothing");
    assert!(matches!(
        t.lookup(va(LEN)),
        Err(ProtocolError::OutOfRegion { .. })
    ));
}

#[test]
fn huge_page_is_one_unit() {
    let mut t = table();
    let frame = PhysAddr::new(0x1_2340_0000);
    let g = t
        .mark_present(va(M2), PageSize::Size2M, frame, true)
        .unwrap();
    for offset in [M2, M2 + 0x1234, 2 * M2 - 1] {
        let s = t.lookup(va(offset)).unwrap();
        assert!(s.present);
        assert_eq!(s.size, PageSize::Size2M);
        assert_eq!(s.version, g);
        assert_eq!(s.frame, Some(PhysAddr::new(frame.as_u64() + offset - M2)));
    }
    assert!(!t.lookup(va(M2 - 1)).unwrap().present);
    assert!(!t.lookup(va(2 * M2)).unwrap().present);

    // Invalidating one 4 KiB page in the middle drops the whole 2 MiB page.
    let inv = t.invalidate(va(M2 + 0x10_0000), K4).unwrap();
    assert_eq!(inv.pages_dropped, 512);
    assert!(!t.lookup(va(M2)).unwrap().present);
    assert!(!t.lookup(va(2 * M2 - K4)).unwrap().present);
}

#[test]
fn small_mapping_inside_a_huge_page_splits_it_conservatively() {
    let mut t = table();
    t.mark_present(va(0), PageSize::Size2M, PhysAddr::new(0x4000_0000), true)
        .unwrap();
    let g = t
        .mark_present(va(0x5000), PageSize::Size4K, PhysAddr::new(0x9000), false)
        .unwrap();
    let s = t.lookup(va(0x5000)).unwrap();
    assert!(s.present && !s.writable);
    assert_eq!(
        (s.size, s.frame, s.version),
        (PageSize::Size4K, Some(PhysAddr::new(0x9000)), g)
    );
    // The rest of the old huge page is gone (and changed), not silently kept as 4 KiB pages.
    for offset in [0, 0x4000, 0x6000, M2 - K4] {
        let s = t.lookup(va(offset)).unwrap();
        assert!(!s.present, "offset {offset:#x}");
        assert_eq!(s.version, g);
    }
}

#[test]
fn huge_mapping_over_small_pages_replaces_them() {
    let mut t = table();
    t.mark_present(
        va(2 * M2 + 0x3000),
        PageSize::Size4K,
        PhysAddr::new(0x7000),
        true,
    )
    .unwrap();
    let g = t
        .mark_present(va(2 * M2), PageSize::Size2M, PhysAddr::new(0x20_0000), true)
        .unwrap();
    let s = t.lookup(va(2 * M2 + 0x3000)).unwrap();
    assert_eq!(
        (s.size, s.frame, s.version),
        (PageSize::Size2M, Some(PhysAddr::new(0x20_3000)), g)
    );
}

#[test]
fn a_region_whose_end_is_past_the_address_space_is_refused() {
    let top = VirtAddr::new(0xffff_ffff_ffff_f000);
    assert_eq!(
        PageStateTable::new(top, K4, vec![PageEntry::ABSENT; 1]).err(),
        Some(ProtocolError::AddressOverflow)
    );
    // One page lower, the end is 2^64 - 4096: representable, and the table works.
    let below = VirtAddr::new(0xffff_ffff_ffff_e000);
    let mut t = PageStateTable::new(below, K4, vec![PageEntry::ABSENT; 1]).unwrap();
    t.mark_present(below, PageSize::Size4K, PhysAddr::new(0x7000), true)
        .unwrap();
    let snap = t.generation();
    assert_eq!(t.check(below, K4, Access::Write, snap), Ok(()));
    assert_eq!(
        t.check(below, K4 + 1, Access::Write, snap)
            .unwrap_err()
            .reason,
        FaultReason::OutOfRegion
    );
    assert_eq!(t.invalidate(below, K4).unwrap().pages_dropped, 1);
}

#[test]
fn check_reports_each_reason() {
    let mut t = table();
    t.mark_present(va(0), PageSize::Size4K, PhysAddr::new(0x1000), true)
        .unwrap();
    t.mark_present(va(K4), PageSize::Size4K, PhysAddr::new(0x2000), false)
        .unwrap();
    let snap = t.generation();

    assert_eq!(t.check(va(0x10), 100, Access::Write, snap), Ok(()));
    assert_eq!(t.check(va(0x10), 2 * K4 - 0x10, Access::Read, snap), Ok(()));
    assert_eq!(
        t.check(va(0x10), 2 * K4 - 0x10, Access::Write, snap),
        Err(PageFault {
            addr: va(K4),
            reason: FaultReason::Permission
        })
    );
    assert_eq!(
        t.check(va(0x10), 3 * K4, Access::Read, snap),
        Err(PageFault {
            addr: va(2 * K4),
            reason: FaultReason::NotPresent
        })
    );
    // Page by page in order (docs/protocol.md §3.2): the absent last page comes before the
    // first byte past the region.
    assert_eq!(
        t.check(va(LEN - 8), 16, Access::Read, snap),
        Err(PageFault {
            addr: va(LEN - 8),
            reason: FaultReason::NotPresent
        })
    );
    t.mark_present(va(LEN - K4), PageSize::Size4K, PhysAddr::new(0x3000), true)
        .unwrap();
    let snap = t.generation();
    assert_eq!(
        t.check(va(LEN - 8), 16, Access::Read, snap),
        Err(PageFault {
            addr: va(LEN),
            reason: FaultReason::OutOfRegion
        })
    );
    assert_eq!(
        t.check(VirtAddr::new(BASE - 8), 16, Access::Read, snap),
        Err(PageFault {
            addr: VirtAddr::new(BASE - 8),
            reason: FaultReason::OutOfRegion
        })
    );
    assert_eq!(t.check(va(0), 0, Access::Write, snap), Ok(()));
}

#[test]
fn swap_out_and_back_in_is_caught_by_the_version_not_the_present_bit() {
    let mut t = table();
    t.mark_present(va(0), PageSize::Size4K, PhysAddr::new(0x1000), true)
        .unwrap();
    let snap = t.generation();
    // Reclaimed and faulted back in (to another frame) while a transfer relied on it.
    t.invalidate(va(0), K4).unwrap();
    t.mark_present(va(0), PageSize::Size4K, PhysAddr::new(0x5000), true)
        .unwrap();
    assert!(
        t.lookup(va(0)).unwrap().present,
        "the present bit alone would miss it"
    );
    assert_eq!(
        t.check(va(0), K4, Access::Write, snap),
        Err(PageFault {
            addr: va(0),
            reason: FaultReason::PageChanged
        })
    );
    // A snapshot taken after the change passes.
    assert_eq!(t.check(va(0), K4, Access::Write, t.generation()), Ok(()));
    // A change elsewhere does not disturb this page's check.
    let snap = t.generation();
    t.mark_present(va(8 * K4), PageSize::Size4K, PhysAddr::new(0x6000), true)
        .unwrap();
    assert_eq!(t.check(va(0), K4, Access::Write, snap), Ok(()));
}

#[test]
fn state_lookup_bitmap() {
    let mut t = table();
    for page in [0u64, 2, 63, 64] {
        t.mark_present(
            va(page * K4),
            PageSize::Size4K,
            PhysAddr::new(page * K4),
            true,
        )
        .unwrap();
    }
    let r = t.state_lookup(&StateLookupRequest {
        req_seq: 7,
        key: 3,
        offset: 0x10,
    });
    assert_eq!(
        (r.req_seq, r.key, r.status, r.page_shift, r.pages, r.offset),
        (7, 3, RequestStatus::Ok, 12, 64, 0)
    );
    assert_eq!(r.present, (1 << 0) | (1 << 2) | (1 << 63));
    assert_eq!(r.generation, t.generation());
    // From page 63: pages 63 and 64 are bits 0 and 1.
    let r = t.state_lookup(&StateLookupRequest {
        req_seq: 8,
        key: 3,
        offset: 63 * K4,
    });
    assert_eq!(r.present, 0b11);
    // The last 10 pages of the region.
    let r = t.state_lookup(&StateLookupRequest {
        req_seq: 9,
        key: 3,
        offset: LEN - 10 * K4,
    });
    assert_eq!(r.pages, 10);
    let r = t.state_lookup(&StateLookupRequest {
        req_seq: 10,
        key: 3,
        offset: LEN,
    });
    assert_eq!(
        (r.status, r.pages, r.present),
        (RequestStatus::Failed(FaultReason::OutOfRegion), 0, 0)
    );
}

/// Reference model: per 4 KiB page, the mapping it belongs to (start page, pages, frame of the
/// start) and the model step at which it last changed.
#[derive(Clone, Default)]
struct Model {
    map: Vec<Option<(usize, usize, u64, bool)>>,
    changed_at: Vec<usize>,
}

#[derive(Clone, Debug)]
enum Op {
    Map4K {
        page: usize,
        frame: u64,
        writable: bool,
    },
    Map2M {
        huge: usize,
        frame: u64,
        writable: bool,
    },
    Invalidate {
        offset: u64,
        len: u64,
    },
}

const PAGES: usize = (LEN / K4) as usize;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..PAGES, 0u64..1 << 20, any::<bool>()).prop_map(|(page, f, writable)| Op::Map4K {
            page,
            frame: f * K4,
            writable
        }),
        (0..PAGES / 512, 0u64..1 << 10, any::<bool>()).prop_map(|(huge, f, writable)| Op::Map2M {
            huge,
            frame: f * M2,
            writable
        }),
        (0..LEN, 1..LEN / 2).prop_map(|(offset, len)| Op::Invalidate { offset, len }),
    ]
}

impl Model {
    fn new() -> Self {
        Self {
            map: vec![None; PAGES],
            changed_at: vec![0; PAGES],
        }
    }

    /// Drops whole mappings touching pages `lo..=hi`, recording the change at `step`.
    fn drop_mappings(&mut self, lo: usize, hi: usize, step: usize) -> usize {
        let mut doomed = Vec::new();
        for p in lo..=hi {
            if let Some((start, n, _, _)) = self.map[p] {
                doomed.push((start, n));
            }
        }
        let mut dropped = 0;
        for (start, n) in doomed {
            for p in start..start + n {
                if self.map[p].is_some() {
                    self.map[p] = None;
                    self.changed_at[p] = step;
                    dropped += 1;
                }
            }
        }
        dropped
    }

    fn map(&mut self, start: usize, n: usize, frame: u64, writable: bool, step: usize) {
        self.drop_mappings(start, start + n - 1, step);
        for p in start..start + n {
            self.map[p] = Some((start, n, frame, writable));
            self.changed_at[p] = step;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// After every operation the table agrees with the model page by page; and a snapshot
    /// taken at any earlier step passes `check` exactly for the pages that are present and
    /// did not change since.
    #[test]
    fn agrees_with_reference_model(ops in proptest::collection::vec(op(), 1..40), probe in 0..PAGES) {
        let mut t = table();
        let mut m = Model::new();
        let mut snapshots = vec![(0usize, t.generation())];
        for (i, op) in ops.iter().enumerate() {
            let step = i + 1;
            let before = t.generation();
            match *op {
                Op::Map4K { page, frame, writable } => {
                    t.mark_present(va(page as u64 * K4), PageSize::Size4K, PhysAddr::new(frame), writable).unwrap();
                    m.map(page, 1, frame, writable, step);
                }
                Op::Map2M { huge, frame, writable } => {
                    t.mark_present(va(huge as u64 * M2), PageSize::Size2M, PhysAddr::new(frame), writable).unwrap();
                    m.map(huge * 512, 512, frame, writable, step);
                }
                Op::Invalidate { offset, len } => {
                    let inv = t.invalidate(va(offset), len).unwrap();
                    let lo = (offset / K4) as usize;
                    let hi = (((offset + len - 1) / K4) as usize).min(PAGES - 1);
                    let dropped = m.drop_mappings(lo, hi, step);
                    prop_assert_eq!(inv.pages_dropped, dropped);
                    if dropped == 0 {
                        prop_assert_eq!(t.generation(), before);
                    }
                }
            }
            prop_assert!(t.generation() >= before);
            snapshots.push((step, t.generation()));
        }
        for p in (0..PAGES).step_by(61).chain([probe]) {
            let s = t.lookup(va(p as u64 * K4 + 0x10)).unwrap();
            match m.map[p] {
                None => prop_assert!(!s.present),
                Some((start, _, frame, writable)) => {
                    prop_assert!(s.present);
                    prop_assert_eq!(s.writable, writable);
                    prop_assert_eq!(s.frame, Some(PhysAddr::new(frame + (p - start) as u64 * K4 + 0x10)));
                }
            }
        }
        for &(step, snap) in &snapshots {
            let expect_ok = m.map[probe].is_some() && m.changed_at[probe] <= step;
            let got = t.check(va(probe as u64 * K4), K4, Access::Read, snap);
            prop_assert_eq!(got.is_ok(), expect_ok, "probe page {} snapshot at step {}: {:?}", probe, step, got);
        }
    }
}
