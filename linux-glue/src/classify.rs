//! Minor or major: what a fault-in does to each page, told from the page's state *before* it
//! (pagemap, plus mincore where that decides), not from the thread's `getrusage` counters,
//! which count every fault this thread takes (its own heap, the pagemap reader's buffers)
//! and cost two system calls per resolution.
//!
//! Per 4 KiB page (Documentation/admin-guide/mm/pagemap.rst for the bits; mm/mincore.c for
//! residency, which for a swap entry or an unmapped file/shmem page means "in the swap cache or
//! page cache"):
//!
//! | before the fault-in | kind |
//! |---|---|
//! | present, and a read, or a shared mapping, or mapped exclusively (bit 56) | no fault |
//! | present, a write to a private mapping, not exclusive (zero page, page cache, fork) | minor (copy-on-write) |
//! | swapped, resident (swap cache hit) | minor |
//! | swapped, not resident | major (read from the swap device) |
//! | absent, private anonymous | minor (zero fill) |
//! | absent, hugetlb | minor (from the huge page pool; hugetlb pages are never swapped) |
//! | absent, file or shmem, resident (page cache hit) | minor |
//! | absent, file or shmem, not resident | major (read from the file or the swap device) |
//!
//! Pages a fault-in maps as one huge block (THP, 2 MiB) were one fault: the absent pages of a
//! block count once. Residual error: a present, exclusive page whose PTE is write-protected
//! (after `mprotect` back to writable, or soft-dirty tracking) takes a minor fault for a write
//! that this reports as none; pagemap does not show PTE write permission.

use crate::pagemap::PagemapEntry;
use crate::registry::Access;
use crate::resolver::FaultKind;

/// What is known about one page before the fault-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Before {
    /// Its pagemap entry.
    pub entry: PagemapEntry,
    /// mincore's answer, when asked ([`needs_residency`]).
    pub resident: Option<bool>,
    /// An absent page is filled without I/O: private anonymous memory (zero fill) or hugetlb
    /// (the huge page pool).
    pub private_anon: bool,
    /// The VMA is a shared mapping (a write to a present page copies nothing).
    pub shared: bool,
}

/// Whether the kind of a page in this state depends on residency (mincore).
pub(crate) fn needs_residency(entry: PagemapEntry, private_anon: bool) -> bool {
    !entry.present() && (entry.swapped() || !private_anon)
}

/// The fault the page takes when faulted in for `access`.
pub(crate) fn kind(b: Before, access: Access) -> FaultKind {
    let e = b.entry;
    if e.present() {
        if access == Access::Write && !b.shared && !e.exclusive() {
            return FaultKind::Minor;
        }
        return FaultKind::AlreadyPresent;
    }
    if !e.swapped() && b.private_anon {
        return FaultKind::Minor;
    }
    // Unknown residency counts as not resident: the conservative answer for a device that
    // plans around the latency.
    if b.resident == Some(true) {
        FaultKind::Minor
    } else {
        FaultKind::Major
    }
}

/// Minor and major faults of a range: `kinds` per page, `in_block(i)` whether page `i` was
/// mapped as part of a huge block afterwards and `block_of(i)` its block, so that the absent
/// pages of one block count as one fault.
pub(crate) fn count(kinds: &[FaultKind], in_block: impl Fn(usize) -> Option<u64>) -> (u64, u64) {
    let (mut minor, mut major) = (0u64, 0u64);
    let mut last_block = None;
    for (i, k) in kinds.iter().enumerate() {
        if *k == FaultKind::AlreadyPresent {
            continue;
        }
        if let Some(b) = in_block(i) {
            if last_block == Some(b) {
                continue;
            }
            last_block = Some(b);
        }
        match k {
            FaultKind::Major => major += 1,
            _ => minor += 1,
        }
    }
    (minor, major)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const EXCLUSIVE: u64 = 1 << 56;

    fn b(bits: u64, resident: Option<bool>, private_anon: bool, shared: bool) -> Before {
        Before {
            entry: PagemapEntry(bits),
            resident,
            private_anon,
            shared,
        }
    }

    #[test]
    fn the_table_of_the_module_comment() {
        use FaultKind::*;
        let w = Access::Write;
        let r = Access::Read;
        // Present.
        assert_eq!(
            kind(b(PRESENT | EXCLUSIVE, None, true, false), w),
            AlreadyPresent
        );
        assert_eq!(kind(b(PRESENT, None, true, false), r), AlreadyPresent);
        assert_eq!(kind(b(PRESENT, None, false, true), w), AlreadyPresent);
        assert_eq!(
            kind(b(PRESENT, None, true, false), w),
            Minor,
            "zero page / COW"
        );
        // Swapped.
        assert_eq!(
            kind(b(SWAPPED, Some(true), true, false), w),
            Minor,
            "swap cache"
        );
        assert_eq!(kind(b(SWAPPED, Some(false), true, false), r), Major);
        // Absent.
        assert_eq!(kind(b(0, None, true, false), r), Minor, "zero fill");
        assert_eq!(kind(b(0, Some(true), false, true), r), Minor, "page cache");
        assert_eq!(kind(b(0, Some(false), false, false), r), Major, "file read");
        assert_eq!(
            kind(b(0, None, false, false), r),
            Major,
            "unknown: conservative"
        );
    }

    #[test]
    fn residency_is_asked_only_where_it_decides() {
        assert!(!needs_residency(PagemapEntry(PRESENT), false));
        assert!(!needs_residency(PagemapEntry(0), true));
        assert!(needs_residency(PagemapEntry(SWAPPED), true));
        assert!(needs_residency(PagemapEntry(0), false));
    }

    #[test]
    fn a_huge_block_counts_once() {
        use FaultKind::*;
        let kinds = vec![Minor; 1024];
        // Pages 0-511 one block, 512-1023 another.
        assert_eq!(count(&kinds, |i| Some(i as u64 / 512)), (2, 0));
        assert_eq!(count(&kinds, |_| None), (1024, 0));
        let mixed = [AlreadyPresent, Minor, Major, AlreadyPresent];
        assert_eq!(count(&mixed, |_| None), (1, 1));
    }
}
