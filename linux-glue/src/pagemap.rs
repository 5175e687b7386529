//! Page state from /proc/self/pagemap, /proc/kpageflags, the PAGEMAP_SCAN ioctl and mincore.
//!
//! Bit layouts are from Documentation/admin-guide/mm/pagemap.rst (Linux 6.x) and
//! include/uapi/linux/fs.h (`struct pm_scan_arg`, `PAGE_IS_*`, Linux 6.7+).

use std::fs::File;
use std::os::unix::fs::FileExt;

use hal::{PhysAddr, VirtAddr};

use crate::sys::{self, IOC_READ, IOC_WRITE, PAGE, PAGE_SHIFT, ioc};
use crate::{GlueError, Result};

/// One 64-bit /proc/self/pagemap entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PagemapEntry(pub u64);

impl PagemapEntry {
    const PFN_MASK: u64 = (1 << 55) - 1;
    /// Swap types from here on are not swap areas but the kernel's special non-present
    /// entries (device-private, migration, hwpoison, PTE markers), which pagemap also flags
    /// with bit 62 (`pte_to_pagemap_entry` in fs/proc/task_mmu.c sets PM_SWAP for every
    /// swap-format PTE). 32 types (MAX_SWAPFILES_SHIFT 5) minus 4 device-private, 3
    /// migration, 1 hwpoison and 1 PTE-marker type: MAX_SWAPFILES of an x86_64 kernel with
    /// all of them configured (include/linux/swap.h). A kernel with fewer has more swap
    /// areas, of which nobody configures 23.
    pub const FIRST_SPECIAL_SWAP_TYPE: u64 = 23;
    /// Bit 63: page present.
    pub fn present(self) -> bool {
        self.0 & (1 << 63) != 0
    }
    /// Bit 62 for a real swap area: the page is in swap (or in the swap cache). Not for a
    /// guard marker or a special entry (a page under migration), which pagemap flags alike.
    pub fn swapped(self) -> bool {
        self.swap_format() && !self.guard() && self.0 & 0x1f < Self::FIRST_SPECIAL_SWAP_TYPE
    }
    /// Bit 62 for a special entry: the page is in transit (migration) or otherwise
    /// unavailable (device-private, hwpoison); its frame is going away or gone.
    pub fn in_transit(self) -> bool {
        self.swap_format() && !self.guard() && self.0 & 0x1f >= Self::FIRST_SPECIAL_SWAP_TYPE
    }
    /// Bit 62 as the kernel sets it: any swap-format PTE (swap, migration, marker...).
    pub fn swap_format(self) -> bool {
        self.0 & (1 << 62) != 0
    }
    /// Bit 61: file page or shared anonymous.
    pub fn file_or_shared(self) -> bool {
        self.0 & (1 << 61) != 0
    }
    /// Bit 58: the PTE is a guard region (6.15+).
    pub fn guard(self) -> bool {
        self.0 & (1 << 58) != 0
    }
    /// Bit 57: the PTE is uffd-wp write-protected.
    pub fn uffd_wp(self) -> bool {
        self.0 & (1 << 57) != 0
    }
    /// Bit 56: the page is exclusively mapped.
    pub fn exclusive(self) -> bool {
        self.0 & (1 << 56) != 0
    }
    /// Bit 55: the PTE is soft-dirty.
    pub fn soft_dirty(self) -> bool {
        self.0 & (1 << 55) != 0
    }
    /// Bits 0-54 when present: the PFN. Zero (shown as `None`) without CAP_SYS_ADMIN.
    pub fn pfn(self) -> Option<u64> {
        if !self.present() {
            return None;
        }
        let pfn = self.0 & Self::PFN_MASK;
        (pfn != 0).then_some(pfn)
    }
    /// Bits 0-4 when swapped: the swap type (which swap area).
    pub fn swap_type(self) -> Option<u64> {
        self.swapped().then_some(self.0 & 0x1f)
    }
    /// Bits 5-54 when swapped: the offset in the swap area, in pages.
    pub fn swap_offset(self) -> Option<u64> {
        self.swapped().then_some((self.0 & Self::PFN_MASK) >> 5)
    }
}

/// One 64-bit /proc/kpageflags entry (bit numbers from pagemap.rst, "kpageflags").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct KPageFlags(pub u64);

impl KPageFlags {
    fn bit(self, n: u32) -> bool {
        self.0 & (1 << n) != 0
    }
    /// 4: DIRTY.
    pub fn dirty(self) -> bool {
        self.bit(4)
    }
    /// 5: LRU.
    pub fn lru(self) -> bool {
        self.bit(5)
    }
    /// 8: WRITEBACK.
    pub fn writeback(self) -> bool {
        self.bit(8)
    }
    /// 11: MMAP.
    pub fn mmap(self) -> bool {
        self.bit(11)
    }
    /// 12: ANON.
    pub fn anon(self) -> bool {
        self.bit(12)
    }
    /// 13: SWAPCACHE.
    pub fn swapcache(self) -> bool {
        self.bit(13)
    }
    /// 15: COMPOUND_HEAD.
    pub fn compound_head(self) -> bool {
        self.bit(15)
    }
    /// 16: COMPOUND_TAIL.
    pub fn compound_tail(self) -> bool {
        self.bit(16)
    }
    /// 17: HUGE (part of a hugetlbfs page).
    pub fn hugetlb(self) -> bool {
        self.bit(17)
    }
    /// 20: NOPAGE (no frame at this PFN).
    pub fn nopage(self) -> bool {
        self.bit(20)
    }
    /// 21: KSM.
    pub fn ksm(self) -> bool {
        self.bit(21)
    }
    /// 22: THP (part of a transparent huge page of any size).
    pub fn thp(self) -> bool {
        self.bit(22)
    }
    /// 24: ZERO_PAGE (the shared zero page or huge zero page).
    pub fn zero_page(self) -> bool {
        self.bit(24)
    }
}

/// Where a [`PageState`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateSource {
    /// /proc/self/pagemap (plus kpageflags and PAGEMAP_SCAN where available).
    Pagemap,
    /// mincore(2): residency only.
    Mincore,
}

/// The state of one 4 KiB page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageState {
    /// The page.
    pub addr: VirtAddr,
    /// Mapped in this process's page table (pagemap) or resident in memory (mincore, which also
    /// counts pages in the page cache or swap cache that are not mapped here).
    pub present: bool,
    /// Its PTE holds a swap entry of a swap area (not a guard marker or a page in transit).
    pub swapped: bool,
    /// A guard marker covers it (`MADV_GUARD_INSTALL`): any access faults (SIGSEGV).
    pub guard: bool,
    /// The physical frame, when present and the PFN is visible (CAP_SYS_ADMIN).
    pub frame: Option<PhysAddr>,
    /// Soft-dirty bit.
    pub soft_dirty: bool,
    /// Exclusively mapped by this process (a write will not copy it).
    pub exclusive: bool,
    /// A file page or shared anonymous memory.
    pub file_or_shared: bool,
    /// Mapped by a PMD (a 2 MiB THP) or part of a hugetlbfs page.
    pub huge: bool,
    /// Part of a transparent huge page of any size (kpageflags THP; needs root).
    pub thp: bool,
    /// The shared zero page (kpageflags ZERO_PAGE; needs root).
    pub zero_page: bool,
    /// Which interface answered.
    pub source: StateSource,
}

/// `struct page_region` (include/uapi/linux/fs.h).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct PageRegion {
    pub start: u64,
    pub end: u64,
    pub categories: u64,
}

/// `struct pm_scan_arg` (include/uapi/linux/fs.h).
#[repr(C)]
#[derive(Default)]
pub(crate) struct PmScanArg {
    pub size: u64,
    pub flags: u64,
    pub start: u64,
    pub end: u64,
    pub walk_end: u64,
    pub vec: u64,
    pub vec_len: u64,
    pub max_pages: u64,
    pub category_inverted: u64,
    pub category_mask: u64,
    pub category_anyof_mask: u64,
    pub return_mask: u64,
}
const _: () = assert!(size_of::<PageRegion>() == 24);
const _: () = assert!(size_of::<PmScanArg>() == 96);

/// `PAGE_IS_PRESENT`.
pub(crate) const PAGE_IS_PRESENT: u64 = 1 << 3;
/// `PAGE_IS_HUGE`: PMD-mapped THP or hugetlb.
pub(crate) const PAGE_IS_HUGE: u64 = 1 << 6;
/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)`.
pub(crate) const PAGEMAP_SCAN: u32 = ioc(IOC_READ | IOC_WRITE, b'f', 16, size_of::<PmScanArg>());

/// Reader over this process's pagemap and (when permitted) the system's kpageflags.
#[derive(Debug)]
pub(crate) struct PagemapReader {
    pagemap: File,
    kpageflags: Option<File>,
    scan: bool,
}

impl PagemapReader {
    pub(crate) fn open() -> Result<Self> {
        let pagemap = File::open("/proc/self/pagemap").map_err(|e| GlueError::Unavailable {
            feature: "/proc/self/pagemap",
            why: e.to_string(),
        })?;
        let kpageflags = File::open("/proc/kpageflags").ok();
        let mut me = Self {
            pagemap,
            kpageflags,
            scan: false,
        };
        me.scan = me.probe_scan();
        Ok(me)
    }

    /// Whether PAGEMAP_SCAN works (Linux 6.7+): an empty-range scan must succeed.
    fn probe_scan(&self) -> bool {
        let probe = 0u64;
        let page = (&probe as *const u64 as u64) & !(PAGE - 1);
        let mut regions = [PageRegion::default(); 1];
        self.scan_raw(page, page + PAGE, PAGE_IS_PRESENT, &mut regions)
            .is_ok()
    }

    pub(crate) fn has_scan(&self) -> bool {
        self.scan
    }

    pub(crate) fn has_kpageflags(&self) -> bool {
        self.kpageflags.is_some()
    }

    /// Raw PAGEMAP_SCAN: regions in `[start, end)` whose categories include all of `mask`,
    /// reporting `mask` categories. Returns (regions filled, walk end).
    fn scan_raw(
        &self,
        start: u64,
        end: u64,
        mask: u64,
        out: &mut [PageRegion],
    ) -> Result<(usize, u64), i32> {
        let mut arg = PmScanArg {
            size: size_of::<PmScanArg>() as u64,
            start,
            end,
            vec: out.as_mut_ptr() as u64,
            vec_len: out.len() as u64,
            category_mask: mask,
            return_mask: mask,
            ..Default::default()
        };
        // SAFETY: PAGEMAP_SCAN takes a `PmScanArg`; its output vector is `out`, live and
        // `vec_len` entries long for the call.
        let n = unsafe { sys::ioctl_ptr(&self.pagemap, PAGEMAP_SCAN, &mut arg) }?;
        Ok((n as usize, arg.walk_end))
    }

    /// All sub-ranges of `[start, end)` whose pages have every category in `mask`.
    pub(crate) fn scan_ranges(&self, start: u64, end: u64, mask: u64) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let mut regions = [PageRegion::default(); 64];
        let mut cur = start;
        while cur < end {
            let (n, walk_end) = self
                .scan_raw(cur, end, mask, &mut regions)
                .map_err(|errno| GlueError::Os {
                    op: "PAGEMAP_SCAN",
                    errno,
                })?;
            for r in regions.iter().take(n) {
                out.push((r.start, r.end));
            }
            if walk_end <= cur {
                break;
            }
            cur = walk_end;
        }
        Ok(out)
    }

    /// The pagemap entries of `count` pages starting at `addr` (one pread per 64 Ki pages).
    pub(crate) fn entries(&self, addr: u64, count: u64) -> Result<Vec<PagemapEntry>> {
        let mut out = Vec::new();
        out.try_reserve_exact(count as usize)
            .map_err(|_| TOO_MANY_PAGES)?;
        let mut vpn = addr >> PAGE_SHIFT;
        let mut left = count;
        let mut buf = vec![0u8; 8 * count.min(65536) as usize];
        while left > 0 {
            let n = left.min(65536);
            let bytes = &mut buf[..8 * n as usize];
            let off = vpn.checked_mul(8).ok_or(GlueError::Overflow {
                start: addr,
                len: count * PAGE,
            })?;
            self.pagemap
                .read_exact_at(bytes, off)
                .map_err(|e| GlueError::Os {
                    op: "pread(/proc/self/pagemap)",
                    errno: e.raw_os_error().unwrap_or(0),
                })?;
            for w in bytes.chunks_exact(8) {
                let mut a = [0u8; 8];
                a.copy_from_slice(w);
                out.push(PagemapEntry(u64::from_ne_bytes(a)));
            }
            vpn += n;
            left -= n;
        }
        Ok(out)
    }

    /// The kpageflags of one PFN, if kpageflags is readable.
    pub(crate) fn kpageflags(&self, pfn: u64) -> Option<KPageFlags> {
        let f = self.kpageflags.as_ref()?;
        let mut a = [0u8; 8];
        f.read_exact_at(&mut a, pfn.checked_mul(8)?).ok()?;
        Some(KPageFlags(u64::from_ne_bytes(a)))
    }

    /// The kpageflags of every present entry (None for absent ones, or without kpageflags),
    /// reading runs of consecutive PFNs with one pread each.
    pub(crate) fn kpageflags_of(&self, entries: &[PagemapEntry]) -> Vec<Option<KPageFlags>> {
        let mut out = vec![None; entries.len()];
        let Some(f) = self.kpageflags.as_ref() else {
            return out;
        };
        let mut i = 0;
        let mut buf = Vec::new();
        while i < entries.len() {
            let Some(first) = entries[i].pfn() else {
                i += 1;
                continue;
            };
            let mut n = 1;
            while i + n < entries.len()
                && n < 4096
                && entries[i + n].pfn() == Some(first + n as u64)
            {
                n += 1;
            }
            buf.resize(8 * n, 0u8);
            let read = first
                .checked_mul(8)
                .is_some_and(|off| f.read_exact_at(&mut buf, off).is_ok());
            if read {
                for (k, w) in buf.chunks_exact(8).enumerate() {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(w);
                    out[i + k] = Some(KPageFlags(u64::from_ne_bytes(a)));
                }
            }
            i += n;
        }
        out
    }

    /// Whether the 2 MiB block at `block` is mapped as one huge page. PAGEMAP_SCAN's
    /// PAGE_IS_HUGE when available; otherwise all 512 PFNs present, contiguous and starting
    /// 2 MiB-aligned (needs visible PFNs), plus the kpageflags THP bit when readable.
    pub(crate) fn block_is_huge(&self, block: u64) -> bool {
        if self.scan {
            let mut regions = [PageRegion::default(); 1];
            return matches!(
                self.scan_raw(block, block + sys::HUGE_2M, PAGE_IS_HUGE, &mut regions),
                Ok((1, _)) if regions[0].start == block && regions[0].end == block + sys::HUGE_2M
            );
        }
        let Ok(entries) = self.entries(block, sys::HUGE_2M / PAGE) else {
            return false;
        };
        let Some(first) = entries.first().and_then(|e| e.pfn()) else {
            return false;
        };
        if first % (sys::HUGE_2M / PAGE) != 0 {
            return false;
        }
        let contiguous = entries
            .iter()
            .enumerate()
            .all(|(i, e)| e.pfn() == Some(first + i as u64));
        contiguous
            && self
                .kpageflags(first)
                .is_none_or(|f| f.thp() || f.hugetlb())
    }
}

/// Membership of ascending addresses in sorted, disjoint `[start, end)` runs, in one pass.
pub(crate) struct RunCursor<'a> {
    runs: &'a [(u64, u64)],
    at: usize,
}

impl<'a> RunCursor<'a> {
    pub(crate) fn new(runs: &'a [(u64, u64)]) -> Self {
        Self { runs, at: 0 }
    }

    /// Whether `addr` (not smaller than any address asked before) lies in a run.
    pub(crate) fn contains(&mut self, addr: u64) -> bool {
        while let Some(&(_, e)) = self.runs.get(self.at) {
            if addr < e {
                break;
            }
            self.at += 1;
        }
        self.runs.get(self.at).is_some_and(|&(s, _)| s <= addr)
    }
}

/// What a page-state query of more pages than this process can hold a buffer for returns
/// (the public query accepts any range, so the size must not abort the process).
const TOO_MANY_PAGES: GlueError = GlueError::InvalidArgument {
    what: "range has too many pages for a page-state buffer",
};

/// Residency of `count` pages from `addr` via mincore(2) (for a file mapping: whether each page
/// is in the page cache, mapped here or not). ENOMEM (unmapped) becomes
/// [`GlueError::Unmapped`].
pub fn mincore(addr: u64, count: u64) -> Result<Vec<bool>> {
    let mut vec = Vec::new();
    vec.try_reserve_exact(count as usize)
        .map_err(|_| TOO_MANY_PAGES)?;
    vec.resize(count as usize, 0u8);
    // SAFETY: `vec` has one byte per page of the range as mincore requires; mincore does not
    // access the range itself.
    let rc = unsafe {
        libc::mincore(
            addr as *mut libc::c_void,
            (count * PAGE) as usize,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        let e = sys::errno();
        if e == libc::ENOMEM {
            return Err(GlueError::Unmapped { addr });
        }
        return Err(GlueError::Os {
            op: "mincore",
            errno: e,
        });
    }
    Ok(vec.into_iter().map(|b| b & 1 != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pagemap_bits_per_pagemap_rst() {
        let present = PagemapEntry((1 << 63) | (1 << 56) | (1 << 55) | 0x1234);
        assert!(present.present() && !present.swapped());
        assert!(present.exclusive() && present.soft_dirty());
        assert_eq!(present.pfn(), Some(0x1234));
        assert_eq!(present.swap_type(), None);

        // Swap type 3 in bits 0-4, offset 0x42 in bits 5-54.
        let swapped = PagemapEntry((1 << 62) | (0x42 << 5) | 3);
        assert!(swapped.swapped() && !swapped.present());
        assert_eq!(swapped.pfn(), None);
        assert_eq!(swapped.swap_type(), Some(3));
        assert_eq!(swapped.swap_offset(), Some(0x42));

        // Present without CAP_SYS_ADMIN: PFN field zeroed.
        assert_eq!(PagemapEntry(1 << 63).pfn(), None);
        assert!(PagemapEntry(1 << 61).file_or_shared());
        assert!(PagemapEntry(1 << 58).guard());
        assert!(PagemapEntry(1 << 57).uffd_wp());
    }

    #[test]
    fn guard_markers_and_special_entries_are_not_swap() {
        // The kernel sets bit 62 for every swap-format PTE.
        let guard = PagemapEntry((1 << 62) | (1 << 58) | 31);
        assert!(guard.guard() && !guard.swapped() && !guard.in_transit());
        assert_eq!(guard.swap_type(), None);
        let migrating = PagemapEntry((1 << 62) | (0x777 << 5) | 29);
        assert!(migrating.in_transit() && !migrating.swapped());
        assert_eq!(migrating.swap_offset(), None);
        let last_area = PagemapEntry((1 << 62) | 22);
        assert!(last_area.swapped() && !last_area.in_transit());
    }

    #[test]
    fn kpageflags_bits_per_pagemap_rst() {
        let f = KPageFlags((1 << 22) | (1 << 15) | (1 << 12) | (1 << 11));
        assert!(f.thp() && f.compound_head() && f.anon() && f.mmap());
        assert!(!f.compound_tail() && !f.zero_page() && !f.hugetlb());
        assert!(KPageFlags(1 << 24).zero_page());
        assert!(KPageFlags(1 << 13).swapcache());
        assert!(KPageFlags(1 << 8).writeback());
    }

    proptest::proptest! {
        /// The one-pass cursor agrees with a linear search for every ascending address.
        #[test]
        fn run_cursor_matches_linear_search(
            bounds in proptest::collection::btree_set(0u64..200, 0..20),
            probes in proptest::collection::btree_set(0u64..220, 0..60),
        ) {
            let b: Vec<u64> = bounds.into_iter().collect();
            let runs: Vec<(u64, u64)> = b.chunks_exact(2).map(|c| (c[0], c[1])).collect();
            let mut cursor = RunCursor::new(&runs);
            for p in probes {
                let linear = runs.iter().any(|&(s, e)| s <= p && p < e);
                proptest::prop_assert_eq!(cursor.contains(p), linear, "addr {}", p);
            }
        }
    }

    #[test]
    fn pagemap_scan_number() {
        // _IOWR('f', 16, 96 bytes) = 3<<30 | 96<<16 | 0x66<<8 | 16.
        assert_eq!(PAGEMAP_SCAN, 0xC060_6610);
    }
}
