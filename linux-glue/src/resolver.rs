//! Fault resolution on the real Linux mm: what an SMMU fault handler asks for.
//!
//! `FaultResolver` (the SMMU crates' trait) is implemented on top of [`Resolver::resolve`]
//! where both crates meet; this type has no dependency on it.

use std::sync::Arc;

use hal::{AlignedRange, PageSize, PhysAddr, VirtAddr};

use crate::glue::{Inner, check_access};
use crate::registry::Access;
use crate::sys::{HUGE_2M, PAGE, PAGE_SHIFT};
use crate::vma::Backing;
use crate::{GlueError, Result};

/// What the kernel had to do to make the page available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Nothing: the page was already mapped with the access needed.
    AlreadyPresent,
    /// A minor fault: no I/O (zero-fill, page cache hit, swap cache hit, COW, PTE upgrade).
    Minor,
    /// A major fault: the page was read from a file or the swap device.
    Major,
}

/// The answer to "make `addr` accessible for `access`, and tell me where it is".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// The 4 KiB page asked about.
    pub addr: VirtAddr,
    /// The unit the device may map in one go: the 4 KiB page, or the naturally aligned 2 MiB
    /// block (PMD-mapped THP, or a hugetlbfs page) when it lies wholly inside the region, so
    /// that the SMMU can use a block descriptor.
    pub mapping: AlignedRange<VirtAddr>,
    /// Physical address of `mapping.start()`, when PFNs are visible (CAP_SYS_ADMIN).
    pub frame: Option<PhysAddr>,
    /// Size of `mapping`.
    pub size: PageSize,
    /// What the kernel had to do (this thread's fault counters across the fault-in).
    pub kind: FaultKind,
    /// Whether a huge page backs the page (also when it is too close to the region's edge for
    /// `mapping` to be the whole block).
    pub huge: bool,
    /// The access the page was faulted for (a read of private writable memory is faulted for
    /// write when `GlueConfig::stable_frames` is on).
    pub faulted_for: Access,
}

/// Resolves device faults against the registered regions of a [`crate::Glue`].
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

/// The likely cost of resolving a page (see [`Resolver::likely_cost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Likely {
    /// Mapped already: at most a permission upgrade.
    Present,
    /// A fault without I/O (zero-fill of anonymous memory).
    Minor,
    /// A read from the swap device.
    Major,
    /// A file page that may or may not be in the page cache.
    Unknown,
}

/// A page handed out earlier and not invalidated since (see [`Resolver::lookup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackedPage {
    /// The 4 KiB page.
    pub addr: VirtAddr,
    /// Its frame when it was handed out (None without CAP_SYS_ADMIN).
    pub frame: Option<PhysAddr>,
    /// It was handed out as part of a 2 MiB block.
    pub huge: bool,
}

/// Bounded retries when an invalidation races with a resolution.
const RETRIES: u32 = 8;

impl Resolver {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    /// The no-fault check: whether the page containing `addr` was handed out by
    /// [`Resolver::resolve`] or [`crate::Glue::fault_in`] and no invalidation has been
    /// delivered for it since. No system call: one table read under the registry lock.
    ///
    /// This is exactly as current as the invalidation sources: userfaultfd events arrive
    /// before (REMOVE) or right after (UNMAP, REMAP) the change, but reclaim, migration and
    /// copy-on-write are only noticed by the next reclaim scan. Use `resolve` when the frame
    /// must be guaranteed present now.
    pub fn lookup(&self, addr: VirtAddr) -> Option<TrackedPage> {
        let page = addr.align_down(PageSize::Size4K).as_u64();
        let reg = self.inner.lock();
        let r = reg.lookup(page).ok()?;
        let (pfn, huge) = r.tracked.entry(r.index_of(page))?;
        Some(TrackedPage {
            addr: VirtAddr::new(page),
            frame: pfn.map(|p| PhysAddr::new(p << PAGE_SHIFT)),
            huge,
        })
    }

    /// The registered region containing `addr`: its range and the access it was registered
    /// for. One table read under the registry lock, no system call.
    pub fn region_of(&self, addr: VirtAddr) -> Option<(AlignedRange<VirtAddr>, Access)> {
        let reg = self.inner.lock();
        let r = reg.lookup(addr.as_u64()).ok()?;
        Some((r.range, r.access))
    }

    /// What resolving the page containing `addr` would likely cost, from one pagemap read:
    /// already handed out or mapped → [`Likely::Present`]; a swap entry → [`Likely::Major`];
    /// not mapped in anonymous memory (zero-fill) → [`Likely::Minor`]; not mapped in a file
    /// mapping (page cache hit or disk read, which user space cannot tell) → [`Likely::Unknown`].
    pub fn likely_cost(&self, addr: VirtAddr) -> Result<Likely> {
        let page = addr.align_down(PageSize::Size4K).as_u64();
        if self.lookup(addr).is_some() {
            return Ok(Likely::Present);
        }
        let (backing, hugetlb) = {
            let reg = self.inner.lock();
            let r = reg.lookup(page)?;
            let v = r.vma_at(page);
            (v.map(|v| v.backing), v.is_some_and(|v| v.hugetlb()))
        };
        let (entries, _) = self.inner.entries(page, 1)?;
        let entry = entries.first().copied().unwrap_or_default();
        Ok(if entry.present() {
            Likely::Present
        } else if entry.swapped() {
            Likely::Major
        } else if matches!(backing, Some(Backing::Anonymous)) || hugetlb {
            // Zero fill, or a page from the hugetlb pool (never swapped).
            Likely::Minor
        } else {
            Likely::Unknown
        })
    }

    /// Makes the page containing `addr` present for `access` and reports where it is.
    ///
    /// Follows the `mmu_interval_read_begin/retry` pattern: the region's invalidation sequence
    /// is sampled before the fault-in and checked after the frame is read; if an invalidation
    /// was processed in between, the resolution is redone. An invalidation processed after the
    /// check is delivered after this call returns, so a consumer that applies resolutions and
    /// invalidations in the order it receives them never keeps a stale frame, except after a
    /// `Removed` invalidation: userfaultfd reports only the start of a `madvise` zap, so a
    /// resolution made between the event and the zap can return a frame the zap frees, with no
    /// later event (docs/linux-glue.md, "Races"; the kernel module reports the end).
    pub fn resolve(&self, addr: VirtAddr, access: Access) -> Result<Resolution> {
        let inner = &self.inner;
        let page = addr.align_down(PageSize::Size4K).as_u64();
        for _ in 0..RETRIES {
            let (id, seq, eff, unit, huge_candidate, region_pages, region_start, vk) = {
                let reg = inner.lock();
                let r = reg.lookup(page)?;
                check_access(r, page, page + PAGE, access)?;
                let v = r.vma_at(page).ok_or(GlueError::Unmapped { addr: page })?;
                let eff = inner.effective_access(r, page, page + PAGE, access);
                let unit = v.page_size.bytes();
                // A 2 MiB block is a candidate when THP may back the VMA and the whole block
                // lies inside both the VMA and the region.
                let block = page & !(HUGE_2M - 1);
                let thp_possible = unit == PAGE
                    && v.thp_eligible != Some(false)
                    && matches!(
                        v.backing,
                        Backing::Anonymous | Backing::Shmem | Backing::File
                    );
                let inside = block >= v.start.as_u64().max(r.start())
                    && block + HUGE_2M <= v.end.as_u64().min(r.end());
                (
                    r.id,
                    r.seq,
                    eff,
                    unit,
                    thp_possible.then_some((block, inside)),
                    r.pages(),
                    r.start(),
                    crate::glue::vma_kind(v),
                )
            };

            // The kind from the page's state before (crate::classify); getrusage only where
            // pagemap is not the state source.
            let predicted = inner.predict_faults(page, 1, eff, &[vk])?;
            let (_, delta) = inner.fault_in_raw(page, PAGE, eff, predicted.is_none())?;
            let kind = match predicted.as_deref() {
                Some([k]) => *k,
                _ if delta.major > 0 => FaultKind::Major,
                _ if delta.minor > 0 => FaultKind::Minor,
                _ => FaultKind::AlreadyPresent,
            };

            let (entries, _) = inner.entries(page, 1)?;
            let entry = entries.first().copied().unwrap_or_default();
            if !entry.present() {
                // Reclaimed or zapped between the fault-in and the read: try again.
                continue;
            }
            let pfn = entry.pfn();

            let (huge, mapping, base_pfn) = if unit > PAGE {
                // hugetlbfs: the unit is the VMA's page size.
                let start = page & !(unit - 1);
                let off = (page - start) >> PAGE_SHIFT;
                let size = PageSize::from_bytes(unit).unwrap_or(PageSize::Size4K);
                (
                    true,
                    AlignedRange::new(VirtAddr::new(start), unit, size)?,
                    pfn.and_then(|p| p.checked_sub(off)),
                )
            } else if let Some((block, inside)) = huge_candidate {
                let huge = inner
                    .pagemap
                    .as_ref()
                    .is_some_and(|p| p.block_is_huge(block));
                if huge && inside {
                    let off = (page - block) >> PAGE_SHIFT;
                    (
                        true,
                        AlignedRange::new(VirtAddr::new(block), HUGE_2M, PageSize::Size2M)?,
                        pfn.and_then(|p| p.checked_sub(off)),
                    )
                } else {
                    (
                        huge,
                        AlignedRange::new(VirtAddr::new(page), PAGE, PageSize::Size4K)?,
                        pfn,
                    )
                }
            } else {
                (
                    false,
                    AlignedRange::new(VirtAddr::new(page), PAGE, PageSize::Size4K)?,
                    pfn,
                )
            };

            let mut reg = inner.lock();
            let r = reg.get_mut(id)?;
            if r.seq != seq {
                continue;
            }
            let first = (mapping.start().as_u64() - region_start) >> PAGE_SHIFT;
            let small_pages = mapping.len() >> PAGE_SHIFT;
            for i in 0..small_pages {
                let this = base_pfn.map(|b| b + i);
                r.tracked
                    .track(region_pages, first + i, this, small_pages > 1)?;
            }
            return Ok(Resolution {
                addr: VirtAddr::new(page),
                mapping,
                frame: base_pfn.map(|p| PhysAddr::new(p << PAGE_SHIFT)),
                size: mapping.page_size(),
                kind,
                huge,
                faulted_for: eff,
            });
        }
        Err(GlueError::Contended { retries: RETRIES })
    }
}
