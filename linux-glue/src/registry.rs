//! Registered regions and what happens to them: pure bookkeeping, no system calls.
//!
//! Kept free of I/O so that event clipping, gone-ranges and the tracked-page table are tested
//! against reference models.

use std::collections::BTreeMap;

use hal::{AlignedRange, PageSize, VirtAddr};

use crate::pagemap::PagemapEntry;
use crate::sys::{PAGE, PAGE_SHIFT};
use crate::uffd::UffdEvent;
use crate::vma::VmaInfo;
use crate::{GlueError, Result};

/// What the device will do with the memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// The device only reads it (CPU read fault is enough).
    Read,
    /// The device writes it (needs a private, writable, dirty page).
    Write,
}

/// Identifies a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionId(pub u64);

/// Why a range stopped being valid for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidationCause {
    /// `madvise(MADV_DONTNEED / MADV_FREE / MADV_REMOVE)` (userfaultfd REMOVE, sent before the
    /// pages are zapped).
    Removed,
    /// `munmap` (userfaultfd UNMAP, sent after the unmap).
    Unmapped,
    /// `mremap` moved the pages to `to` (userfaultfd REMAP). The registration stays bound to the
    /// old addresses, like a memory region stays bound to its virtual range.
    Remapped {
        /// Where the first page of the range now lives.
        to: VirtAddr,
    },
    /// The page was reclaimed to swap (pagemap scan: the PTE now holds a swap entry).
    SwappedOut,
    /// The page is no longer mapped and has no swap entry (file page reclaimed, or dropped by
    /// something the userfaultfd monitor does not see).
    Dropped,
    /// The page is mapped to a different frame (migration, compaction, KSM, COW, THP collapse,
    /// or a swap-out and swap-in between two scans). Needs visible PFNs (root).
    FrameChanged,
}

/// "This range of a registered region must no longer be used by the device": the user-space
/// stand-in for an MMU-notifier `invalidate_range_start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidate {
    /// The region it belongs to.
    pub region: RegionId,
    /// The pages (clipped to the region).
    pub range: AlignedRange<VirtAddr>,
    /// Why.
    pub cause: InvalidationCause,
}

/// A sorted set of disjoint, non-adjacent half-open ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    pub(crate) fn from_range(start: u64, end: u64) -> Self {
        let mut s = Self::default();
        s.insert(start, end);
        s
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().copied()
    }

    pub(crate) fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.ranges {
            if b < s {
                out.push((a, b));
            } else if a > e {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !placed {
            out.push((s, e));
        }
        self.ranges = out;
    }

    pub(crate) fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b <= start || a >= end {
                out.push((a, b));
                continue;
            }
            if a < start {
                out.push((a, start));
            }
            if b > end {
                out.push((end, b));
            }
        }
        self.ranges = out;
    }

    pub(crate) fn contains(&self, addr: u64) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= addr && addr < b)
    }

    /// The parts of `[start, end)` in the set.
    pub(crate) fn intersect(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.ranges
            .iter()
            .filter_map(|&(a, b)| {
                let s = a.max(start);
                let e = b.min(end);
                (s < e).then_some((s, e))
            })
            .collect()
    }

    pub(crate) fn overlaps(&self, start: u64, end: u64) -> bool {
        !self.intersect(start, end).is_empty()
    }
}

/// Pages handed to the device (by resolve or fault-in), with the frame they had then. The
/// reclaim scan checks exactly these pages. Sparse: one chunk of 512 slots (4 KiB, 2 MiB of
/// region) per 2 MiB of the region that holds a tracked page, allocated when its first page is
/// tracked and freed when its last one is untracked, so the table grows with the pages handed
/// out, never with the untouched part of the region (8 bytes per tracked page, 2 MiB per GiB
/// touched).
#[derive(Debug, Default)]
pub(crate) struct Tracked {
    chunks: BTreeMap<u64, Chunk>,
    count: u64,
}

/// Slots per chunk.
const CHUNK: u64 = 512;

#[derive(Debug)]
struct Chunk {
    slots: Box<[u64; CHUNK as usize]>,
    used: u32,
}

const TRACKED: u64 = 1 << 63;
const TRACKED_HUGE: u64 = 1 << 62;
const PFN_BITS: u64 = (1 << 55) - 1;

impl Tracked {
    /// Records that page `index` of a region of `pages` pages was handed out with frame `pfn`
    /// (an index outside the region is ignored). An error (a chunk cannot be allocated) means
    /// the page is not tracked: the caller must not hand it out.
    pub(crate) fn track(
        &mut self,
        pages: u64,
        index: u64,
        pfn: Option<u64>,
        huge: bool,
    ) -> crate::Result<()> {
        if index >= pages {
            return Ok(());
        }
        let chunk = match self.chunks.entry(index / CHUNK) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let mut slots = Vec::new();
                slots.try_reserve_exact(CHUNK as usize).map_err(|_| {
                    crate::GlueError::InvalidArgument {
                        what: "no memory for the table of tracked pages",
                    }
                })?;
                slots.resize(CHUNK as usize, 0u64);
                let slots: Box<[u64; CHUNK as usize]> = slots
                    .into_boxed_slice()
                    .try_into()
                    .map_err(|_| crate::GlueError::InvalidArgument {
                        what: "tracked-page chunk size",
                    })?;
                v.insert(Chunk { slots, used: 0 })
            }
        };
        let slot = &mut chunk.slots[(index % CHUNK) as usize];
        if *slot == 0 {
            self.count += 1;
            chunk.used += 1;
        }
        *slot = TRACKED | if huge { TRACKED_HUGE } else { 0 } | (pfn.unwrap_or(0) & PFN_BITS);
        Ok(())
    }

    /// Forgets pages `[first, end)`; chunks left empty are freed.
    pub(crate) fn untrack(&mut self, first: u64, end: u64) {
        if first >= end {
            return;
        }
        let keys: Vec<u64> = self
            .chunks
            .range(first / CHUNK..=(end - 1) / CHUNK)
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let Some(chunk) = self.chunks.get_mut(&k) else {
                continue;
            };
            let lo = first.max(k * CHUNK) - k * CHUNK;
            let hi = end.min((k + 1) * CHUNK) - k * CHUNK;
            for slot in &mut chunk.slots[lo as usize..hi as usize] {
                if *slot != 0 {
                    *slot = 0;
                    chunk.used -= 1;
                    self.count -= 1;
                }
            }
            if chunk.used == 0 {
                self.chunks.remove(&k);
            }
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Bytes of chunks allocated (for tests and the benchmark).
    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.chunks.len() as u64 * CHUNK * 8
    }

    /// The frame recorded for page `index` (`Some(None)`: tracked, PFN not visible).
    pub(crate) fn get(&self, index: u64) -> Option<Option<u64>> {
        self.entry(index).map(|(pfn, _)| pfn)
    }

    /// The frame and the huge flag recorded for page `index`, if tracked.
    pub(crate) fn entry(&self, index: u64) -> Option<(Option<u64>, bool)> {
        let v = self.chunks.get(&(index / CHUNK))?.slots[(index % CHUNK) as usize];
        if v == 0 {
            return None;
        }
        let pfn = v & PFN_BITS;
        Some(((pfn != 0).then_some(pfn), v & TRACKED_HUGE != 0))
    }

    /// Runs of consecutive tracked page indices, as (first, count).
    pub(crate) fn runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (k, chunk) in &self.chunks {
            for (j, v) in chunk.slots.iter().enumerate() {
                if *v == 0 {
                    continue;
                }
                let i = k * CHUNK + j as u64;
                match out.last_mut() {
                    Some((s, n)) if *s + *n == i => *n += 1,
                    _ => out.push((i, 1)),
                }
            }
        }
        out
    }
}

/// What a reclaim scan concludes for one tracked page, given what pagemap shows now.
pub(crate) fn classify_change(
    tracked_pfn: Option<u64>,
    now: PagemapEntry,
    pfn_visible: bool,
) -> Option<InvalidationCause> {
    if now.present() {
        match (pfn_visible, tracked_pfn, now.pfn()) {
            (true, Some(then), Some(now_pfn)) if then != now_pfn => {
                Some(InvalidationCause::FrameChanged)
            }
            _ => None,
        }
    } else if now.swapped() {
        Some(InvalidationCause::SwappedOut)
    } else if now.in_transit() {
        // Under migration (or poisoned): the tracked frame is going away.
        Some(InvalidationCause::FrameChanged)
    } else {
        // Gone, including a guard marker installed over it (MADV_GUARD_INSTALL zaps the page
        // without a userfaultfd event).
        Some(InvalidationCause::Dropped)
    }
}

/// Merges per-page findings (sorted by address) into maximal runs with one cause.
pub(crate) fn coalesce(pages: &[(u64, InvalidationCause)]) -> Vec<(u64, u64, InvalidationCause)> {
    let mut out: Vec<(u64, u64, InvalidationCause)> = Vec::new();
    for &(addr, cause) in pages {
        match out.last_mut() {
            Some((_, end, c)) if *end == addr && *c == cause => *end += PAGE,
            _ => out.push((addr, addr + PAGE, cause)),
        }
    }
    out
}

/// A registered region.
#[derive(Debug)]
pub(crate) struct Region {
    pub id: RegionId,
    pub range: AlignedRange<VirtAddr>,
    pub access: Access,
    pub vmas: Vec<VmaInfo>,
    /// Parts still mapped at their registered addresses.
    pub live: RangeSet,
    /// Live parts registered with the userfaultfd context.
    pub uffd: RangeSet,
    /// Bumped by every invalidation that touches the region (an `mmu_interval_notifier`
    /// sequence): a resolution that saw it change retries.
    pub seq: u64,
    pub tracked: Tracked,
}

impl Region {
    pub(crate) fn start(&self) -> u64 {
        self.range.start().as_u64()
    }
    pub(crate) fn end(&self) -> u64 {
        self.range.end().as_u64()
    }
    pub(crate) fn pages(&self) -> u64 {
        self.range.len() >> PAGE_SHIFT
    }
    pub(crate) fn index_of(&self, addr: u64) -> u64 {
        (addr - self.start()) >> PAGE_SHIFT
    }
    /// The VMA (as registered) containing `addr`.
    pub(crate) fn vma_at(&self, addr: u64) -> Option<&VmaInfo> {
        self.vmas
            .iter()
            .find(|v| v.start.as_u64() <= addr && addr < v.end.as_u64())
    }
}

/// All registered regions, keyed by id. Address lookups scan the regions (O(regions)):
/// memory registrations are few, and a region that was partly unmapped may overlap a newer one
/// registered over its gone part, which an interval index would have to special-case.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next_id: u64,
    regions: BTreeMap<u64, Region>,
}

impl Registry {
    /// Fails with the id of a region whose live part overlaps `[start, end)`.
    pub(crate) fn check_free(&self, start: u64, end: u64) -> Result<()> {
        for r in self.regions.values() {
            if r.live.overlaps(start, end) {
                return Err(GlueError::AlreadyRegistered { existing: r.id.0 });
            }
        }
        Ok(())
    }

    pub(crate) fn insert(
        &mut self,
        range: AlignedRange<VirtAddr>,
        access: Access,
        vmas: Vec<VmaInfo>,
        uffd: RangeSet,
    ) -> Result<RegionId> {
        let (s, e) = (range.start().as_u64(), range.end().as_u64());
        self.check_free(s, e)?;
        self.next_id += 1;
        let id = RegionId(self.next_id);
        self.regions.insert(
            id.0,
            Region {
                id,
                range,
                access,
                vmas,
                live: RangeSet::from_range(s, e),
                uffd,
                seq: 0,
                tracked: Tracked::default(),
            },
        );
        Ok(id)
    }

    pub(crate) fn remove(&mut self, id: RegionId) -> Result<Region> {
        self.regions
            .remove(&id.0)
            .ok_or(GlueError::UnknownRegion { id: id.0 })
    }

    pub(crate) fn get(&self, id: RegionId) -> Result<&Region> {
        self.regions
            .get(&id.0)
            .ok_or(GlueError::UnknownRegion { id: id.0 })
    }

    pub(crate) fn get_mut(&mut self, id: RegionId) -> Result<&mut Region> {
        self.regions
            .get_mut(&id.0)
            .ok_or(GlueError::UnknownRegion { id: id.0 })
    }

    #[cfg(test)]
    pub(crate) fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.values()
    }

    pub(crate) fn regions_mut(&mut self) -> impl Iterator<Item = &mut Region> {
        self.regions.values_mut()
    }

    /// The region whose registered range contains `addr`: `Ok` if that part is live,
    /// `RegionGone` if it was unmapped or moved, `NotRegistered` otherwise.
    pub(crate) fn lookup(&self, addr: u64) -> Result<&Region> {
        let mut gone = None;
        for r in self.regions.values() {
            if r.start() <= addr && addr < r.end() {
                if r.live.contains(addr) {
                    return Ok(r);
                }
                gone = Some(r.id);
            }
        }
        match gone {
            Some(id) => Err(GlueError::RegionGone { id: id.0, addr }),
            None => Err(GlueError::NotRegistered { addr }),
        }
    }

    /// The parts of `[start, end)` this glue registered with its userfaultfd.
    pub(crate) fn uffd_pieces(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        self.regions
            .values()
            .flat_map(|r| r.uffd.intersect(start, end))
            .collect()
    }

    /// Applies a userfaultfd event: clips it to the live parts of registered regions, updates
    /// them and returns the invalidations to deliver (none for unregistered memory).
    pub(crate) fn apply(&mut self, ev: &UffdEvent) -> Vec<Invalidate> {
        let (start, end, kind) = match *ev {
            UffdEvent::Remove { start, end } => (start, end, 0),
            UffdEvent::Unmap { start, end } => (start, end, 1),
            UffdEvent::Remap { from, len, .. } => (from, from.saturating_add(len), 2),
            UffdEvent::PageFault { .. } | UffdEvent::Fork => return Vec::new(),
        };
        let mut out = Vec::new();
        for r in self.regions.values_mut() {
            let pieces = r.live.intersect(start, end);
            if pieces.is_empty() {
                continue;
            }
            r.seq += 1;
            for (s, e) in pieces {
                let cause = match *ev {
                    UffdEvent::Remap { from, to, .. } => InvalidationCause::Remapped {
                        to: VirtAddr::new(to.wrapping_add(s - from)),
                    },
                    UffdEvent::Unmap { .. } => InvalidationCause::Unmapped,
                    _ => InvalidationCause::Removed,
                };
                let (first, last) = ((s - r.start()) >> PAGE_SHIFT, (e - r.start()) >> PAGE_SHIFT);
                r.tracked.untrack(first, last);
                if kind != 0 {
                    r.live.remove(s, e);
                    r.uffd.remove(s, e);
                }
                if let Ok(range) = AlignedRange::new(VirtAddr::new(s), e - s, PageSize::Size4K) {
                    out.push(Invalidate {
                        region: r.id,
                        range,
                        cause,
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(s: u64, len: u64) -> AlignedRange<VirtAddr> {
        AlignedRange::new(VirtAddr::new(s), len, PageSize::Size4K).unwrap()
    }

    fn reg_with(regions: &[(u64, u64)]) -> Registry {
        let mut reg = Registry::default();
        for &(s, len) in regions {
            reg.insert(
                range(s, len),
                Access::Write,
                vec![],
                RangeSet::from_range(s, s + len),
            )
            .unwrap();
        }
        reg
    }

    #[test]
    fn events_are_clipped_to_registered_regions() {
        let mut reg = reg_with(&[(0x10000, 0x4000), (0x20000, 0x2000)]);
        // DONTNEED over [0xf000, 0x12000): only [0x10000, 0x12000) is registered.
        let inv = reg.apply(&UffdEvent::Remove {
            start: 0xf000,
            end: 0x12000,
        });
        assert_eq!(inv.len(), 1);
        assert_eq!(inv[0].region, RegionId(1));
        assert_eq!(inv[0].range, range(0x10000, 0x2000));
        assert_eq!(inv[0].cause, InvalidationCause::Removed);
        // Nothing registered there.
        assert!(
            reg.apply(&UffdEvent::Unmap {
                start: 0x30000,
                end: 0x40000
            })
            .is_empty()
        );
        // One event spanning both regions gives one invalidation each.
        let inv = reg.apply(&UffdEvent::Unmap {
            start: 0x13000,
            end: 0x21000,
        });
        assert_eq!(
            inv.iter().map(|i| (i.region, i.range)).collect::<Vec<_>>(),
            vec![
                (RegionId(1), range(0x13000, 0x1000)),
                (RegionId(2), range(0x20000, 0x1000))
            ]
        );
        // Unmapped parts are gone: lookups say so, and later events there are silent.
        assert!(matches!(
            reg.lookup(0x13000),
            Err(GlueError::RegionGone {
                id: 1,
                addr: 0x13000
            })
        ));
        assert!(reg.lookup(0x12000).is_ok());
        assert!(
            reg.apply(&UffdEvent::Remove {
                start: 0x13000,
                end: 0x14000
            })
            .is_empty()
        );
        assert!(matches!(
            reg.lookup(0x50000),
            Err(GlueError::NotRegistered { .. })
        ));
    }

    #[test]
    fn remap_reports_the_new_address_and_leaves_the_old_range_gone() {
        let mut reg = reg_with(&[(0x10000, 0x4000)]);
        let inv = reg.apply(&UffdEvent::Remap {
            from: 0x11000,
            to: 0x90000,
            len: 0x2000,
        });
        assert_eq!(inv.len(), 1);
        assert_eq!(inv[0].range, range(0x11000, 0x2000));
        assert_eq!(
            inv[0].cause,
            InvalidationCause::Remapped {
                to: VirtAddr::new(0x90000)
            }
        );
        assert!(reg.lookup(0x10000).is_ok());
        assert!(reg.lookup(0x11000).is_err());
        assert!(reg.lookup(0x13000).is_ok());
        // A remap starting before the region maps the clipped start onto the right target.
        let mut reg = reg_with(&[(0x10000, 0x4000)]);
        let inv = reg.apply(&UffdEvent::Remap {
            from: 0xe000,
            to: 0x80000,
            len: 0x4000,
        });
        assert_eq!(inv[0].range, range(0x10000, 0x2000));
        assert_eq!(
            inv[0].cause,
            InvalidationCause::Remapped {
                to: VirtAddr::new(0x82000)
            }
        );
    }

    #[test]
    fn overlapping_registration_is_refused_but_gone_parts_can_be_reused() {
        let mut reg = reg_with(&[(0x10000, 0x4000)]);
        let e = reg.insert(
            range(0x13000, 0x2000),
            Access::Read,
            vec![],
            RangeSet::default(),
        );
        assert_eq!(e, Err(GlueError::AlreadyRegistered { existing: 1 }));
        reg.apply(&UffdEvent::Unmap {
            start: 0x10000,
            end: 0x14000,
        });
        let id = reg
            .insert(
                range(0x10000, 0x4000),
                Access::Read,
                vec![],
                RangeSet::default(),
            )
            .unwrap();
        assert_eq!(id, RegionId(2));
        assert_eq!(reg.lookup(0x10000).unwrap().id, RegionId(2));
        assert!(reg.remove(RegionId(1)).is_ok());
        assert_eq!(reg.lookup(0x10000).unwrap().id, RegionId(2));
        assert!(matches!(
            reg.remove(RegionId(1)),
            Err(GlueError::UnknownRegion { id: 1 })
        ));
    }

    #[test]
    fn events_bump_the_sequence_and_untrack() {
        let mut reg = reg_with(&[(0x10000, 0x4000)]);
        let r = reg.get_mut(RegionId(1)).unwrap();
        r.tracked.track(4, 0, Some(7), false).unwrap();
        r.tracked.track(4, 1, Some(8), false).unwrap();
        r.tracked.track(4, 3, Some(9), false).unwrap();
        assert_eq!(r.tracked.runs(), vec![(0, 2), (3, 1)]);
        reg.apply(&UffdEvent::Remove {
            start: 0x11000,
            end: 0x12000,
        });
        let r = reg.get(RegionId(1)).unwrap();
        assert_eq!(r.seq, 1);
        assert_eq!(r.tracked.runs(), vec![(0, 1), (3, 1)]);
        assert_eq!(r.tracked.count(), 2);
        assert_eq!(r.tracked.get(3), Some(Some(9)));
    }

    #[test]
    fn change_classification() {
        let present = |pfn: u64| PagemapEntry((1 << 63) | pfn);
        assert_eq!(classify_change(Some(5), present(5), true), None);
        assert_eq!(
            classify_change(Some(5), present(6), true),
            Some(InvalidationCause::FrameChanged)
        );
        // Without visible PFNs only presence can be judged.
        assert_eq!(classify_change(None, PagemapEntry(1 << 63), false), None);
        assert_eq!(
            classify_change(Some(5), PagemapEntry((1 << 62) | 0x20), true),
            Some(InvalidationCause::SwappedOut)
        );
        assert_eq!(
            classify_change(None, PagemapEntry(0), false),
            Some(InvalidationCause::Dropped)
        );
        assert_eq!(
            coalesce(&[
                (0x1000, InvalidationCause::SwappedOut),
                (0x2000, InvalidationCause::SwappedOut),
                (0x3000, InvalidationCause::Dropped),
                (0x5000, InvalidationCause::Dropped),
            ]),
            vec![
                (0x1000, 0x3000, InvalidationCause::SwappedOut),
                (0x3000, 0x4000, InvalidationCause::Dropped),
                (0x5000, 0x6000, InvalidationCause::Dropped),
            ]
        );
    }

    proptest! {
        /// RangeSet against a bitmap over 64 pages.
        #[test]
        fn range_set_matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 0u64..64), 0..40)) {
            let mut set = RangeSet::default();
            let mut model = [false; 64];
            for (add, a, b) in ops {
                let (s, e) = (a.min(b), a.max(b));
                if add { set.insert(s, e) } else { set.remove(s, e) }
                for slot in model.iter_mut().take(e as usize).skip(s as usize) {
                    *slot = add;
                }
            }
            for (i, &m) in model.iter().enumerate() {
                prop_assert_eq!(set.contains(i as u64), m);
            }
            // Canonical form: sorted, disjoint, non-adjacent, non-empty.
            let v: Vec<_> = set.iter().collect();
            for w in v.windows(2) {
                prop_assert!(w[0].1 < w[1].0);
            }
            prop_assert!(v.iter().all(|(s, e)| s < e));
        }

        /// Event clipping against a per-page model: an invalidation is produced for exactly the
        /// registered, still-live pages the event covers.
        #[test]
        fn clipping_matches_a_page_model(
            regs in proptest::collection::vec((0u64..32, 1u64..8), 1..4),
            events in proptest::collection::vec((0u8..3, 0u64..48, 1u64..16), 1..12),
        ) {
            let mut reg = Registry::default();
            let mut owner = [0u64; 48]; // region id per page, 0 = none
            let mut live = [false; 48];
            for (s, len) in regs {
                let (s, len) = (s, len.min(48 - s));
                let r = range(s * PAGE, len * PAGE);
                if reg.insert(r, Access::Write, vec![], RangeSet::default()).is_ok() {
                    let id = reg.regions().map(|r| r.id.0).max().unwrap();
                    for p in s..s + len { owner[p as usize] = id; live[p as usize] = true; }
                }
            }
            for (kind, s, len) in events {
                let e = (s + len).min(48);
                let ev = match kind {
                    0 => UffdEvent::Remove { start: s * PAGE, end: e * PAGE },
                    1 => UffdEvent::Unmap { start: s * PAGE, end: e * PAGE },
                    _ => UffdEvent::Remap { from: s * PAGE, to: 0x100000, len: (e - s) * PAGE },
                };
                let inv = reg.apply(&ev);
                let mut got = [0u64; 48];
                for i in &inv {
                    for p in i.range.pages() { got[(p.as_u64() / PAGE) as usize] = i.region.0; }
                }
                for p in 0..48usize {
                    let expected = if (s as usize..e as usize).contains(&p) && live[p] { owner[p] } else { 0 };
                    prop_assert_eq!(got[p], expected, "page {}", p);
                }
                if kind != 0 {
                    for slot in live.iter_mut().take(e as usize).skip(s as usize) { *slot = false; }
                }
            }
        }
    }

    #[test]
    fn the_table_grows_with_tracked_pages_not_with_the_region() {
        let mut t = Tracked::default();
        // 2^50 pages (a 4 EiB region): a dense table would be 8 PiB.
        t.track(1 << 50, 0, Some(1), false).unwrap();
        t.track(1 << 50, (1 << 50) - 1, Some(2), false).unwrap();
        assert_eq!(t.allocated_bytes(), 2 * 4096, "two chunks");
        assert_eq!(t.runs(), vec![(0, 1), ((1 << 50) - 1, 1)]);
        // An index outside the region is ignored.
        t.track(4, 9, Some(1), false).unwrap();
        assert_eq!(t.count(), 2);
        // Untracking frees the chunk.
        t.untrack(0, 1);
        assert_eq!(t.allocated_bytes(), 4096);
        t.untrack(0, 1 << 50);
        assert_eq!((t.count(), t.allocated_bytes()), (0, 0));
        assert!(t.runs().is_empty());
    }

    #[test]
    fn runs_cross_chunk_boundaries() {
        let mut t = Tracked::default();
        for i in 510..515 {
            t.track(2048, i, None, false).unwrap();
        }
        t.track(2048, 1024, Some(5), true).unwrap();
        assert_eq!(t.runs(), vec![(510, 5), (1024, 1)]);
        assert_eq!(t.entry(1024), Some((Some(5), true)));
        assert_eq!(t.get(512), Some(None));
        assert_eq!(t.get(515), None);
        t.untrack(511, 513);
        assert_eq!(t.runs(), vec![(510, 1), (513, 2), (1024, 1)]);
        assert_eq!(t.count(), 4);
    }
}
