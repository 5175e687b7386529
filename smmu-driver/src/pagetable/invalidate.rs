//! What a table change asks of the SMMU's TLBs.

use hal::{Iova, PageSize};

use crate::Result;

/// One run of TLB invalidations: the IOVAs `start + i * granule.bytes()` for `i < count`.
///
/// For each address, every TLB entry that translates it must go. With `leaf_only` that is all
/// (the changed descriptors were leaves at [`level`](Self::level); SMMUv3 `TLBI_NH_VA` with
/// Leaf=1 and TTL = level, SMMUv2 `TLBIVAL`). Without it, a table descriptor changed, so walk
/// caches holding it must go too (SMMUv3 Leaf=0, SMMUv2 `TLBIVA`).
///
/// One invalidation per address is enough for a block: a TLB entry for a 2 MiB block is hit by
/// any address inside it, so `granule` is the size of the entries that changed, not 4 KiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbInvalidation {
    /// First IOVA, aligned to `granule`.
    pub start: Iova,
    /// Number of consecutive entries (at least 1).
    pub count: u64,
    /// Size of each changed entry: 4 KiB for level-3 pages, 2 MiB for level-2 entries.
    pub granule: PageSize,
    /// Only leaf entries changed (no table descriptor was replaced or removed).
    pub leaf_only: bool,
}

impl TlbInvalidation {
    /// The translation table level of the changed entries (3 for 4 KiB, 2 for 2 MiB, 1 for
    /// 1 GiB): SMMUv3's TTL hint when `leaf_only`.
    pub fn level(&self) -> u8 {
        match self.granule {
            PageSize::Size4K => 3,
            PageSize::Size2M => 2,
            PageSize::Size1G => 1,
        }
    }

    /// Number of bytes covered.
    pub fn len(&self) -> u64 {
        self.count.saturating_mul(self.granule.bytes())
    }

    /// Whether the run is empty (never, for runs this crate reports).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether `iova` is covered.
    pub fn contains(&self, iova: Iova) -> bool {
        iova.as_u64()
            .checked_sub(self.start.as_u64())
            .is_some_and(|off| off < self.len())
    }

    /// The address of every entry: one TLBI per item. A run built by hand that would pass
    /// the top of the address space stops there (the runs this crate reports never do).
    pub fn addresses(&self) -> impl Iterator<Item = Iova> + '_ {
        let step = self.granule.bytes();
        (0..self.count).map_while(move |i| {
            i.checked_mul(step)
                .and_then(|off| self.start.as_u64().checked_add(off))
                .map(Iova::new)
        })
    }

    fn extends(&mut self, next: &TlbInvalidation) -> bool {
        let adjacent = self.start.as_u64().checked_add(self.len()) == Some(next.start.as_u64());
        if adjacent && self.granule == next.granule && self.leaf_only == next.leaf_only {
            match self.count.checked_add(next.count) {
                Some(count) => {
                    self.count = count;
                    true
                }
                None => false,
            }
        } else {
            false
        }
    }
}

/// Capacity of [`Invalidations`].
pub const MAX_INVALIDATION_RUNS: usize = 32;

/// The TLB invalidations an operation requires, as coalesced runs.
///
/// Adjacent runs of the same granule and kind merge, so unmapping a contiguous range is one
/// run. If more than [`MAX_INVALIDATION_RUNS`] separate runs arise (an unmap across many
/// scattered pages), [`overflowed`](Self::overflowed) is set: the list is then incomplete and
/// the caller must invalidate the whole ASID instead (SMMUv3 `TLBI_NH_ASID`, SMMUv2
/// `TLBIASID`), which is always correct, only broader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidations {
    runs: [Option<TlbInvalidation>; MAX_INVALIDATION_RUNS],
    len: usize,
    overflowed: bool,
}

impl Default for Invalidations {
    fn default() -> Self {
        Self::new()
    }
}

impl Invalidations {
    /// No invalidation needed.
    pub const fn new() -> Self {
        Self {
            runs: [None; MAX_INVALIDATION_RUNS],
            len: 0,
            overflowed: false,
        }
    }

    /// A list with one run.
    pub fn single(run: TlbInvalidation) -> Self {
        let mut list = Self::new();
        list.push(run);
        list
    }

    /// Adds a run, merging it with the last one if adjacent.
    pub fn push(&mut self, run: TlbInvalidation) {
        if run.count == 0 {
            return;
        }
        if let Some(Some(last)) = self.len.checked_sub(1).and_then(|i| self.runs.get_mut(i))
            && last.extends(&run)
        {
            return;
        }
        match self.runs.get_mut(self.len) {
            Some(slot) => {
                *slot = Some(run);
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    /// Appends every run of `other` (and its overflow).
    pub fn extend(&mut self, other: &Invalidations) {
        for run in other.iter() {
            self.push(*run);
        }
        self.overflowed |= other.overflowed;
    }

    /// The runs.
    pub fn iter(&self) -> impl Iterator<Item = &TlbInvalidation> + '_ {
        self.runs.iter().take(self.len).flatten()
    }

    /// Number of runs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing needs invalidating (and nothing overflowed).
    pub fn is_empty(&self) -> bool {
        self.len == 0 && !self.overflowed
    }

    /// More runs arose than fit: invalidate the whole ASID instead of the listed runs.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    /// Whether `iova`'s TLB entries are invalidated by this list (true for everything after an
    /// overflow).
    pub fn covers(&self, iova: Iova) -> bool {
        self.overflowed || self.iter().any(|r| r.contains(iova))
    }

    /// Forgets every run.
    pub fn clear(&mut self) {
        *self = Self::new();
    }
}

/// The SMMU side of break-before-make: the page table calls it between "break" and "make".
///
/// The SMMUv3 and SMMUv2 drivers implement it per context (ASID): issue the invalidations
/// and **wait until they have completed** (v3: `TLBI_NH_VA` per address, or `TLBI_NH_ASID` if
/// [`Invalidations::overflowed`], then `CMD_SYNC` and wait for it; v2: `TLBIVA`/`TLBIVAL`
/// or `TLBIASID`, then `TLBSYNC` and poll `TLBSTATUS.SACTIVE`). The table has already made the
/// break visible to the walker (one 64-bit store, then `DmaMemory::sync_for_device`) when
/// it calls this.
pub trait TlbMaintenance {
    /// Invalidates `invalidations` and returns once the invalidation is complete. An error
    /// means completion could not be confirmed (e.g. a sync timeout); the table then stops
    /// the operation with the broken entry left invalid, and the caller must treat the whole
    /// context as suspect (invalidate by ASID once the SMMU works again).
    fn invalidate_now(&mut self, invalidations: &Invalidations) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_built_run_past_the_top_of_the_address_space_stops_there() {
        let top = TlbInvalidation {
            start: Iova::new(u64::MAX - 0x2fff),
            count: 8,
            granule: PageSize::Size4K,
            leaf_only: true,
        };
        let addresses: Vec<u64> = top.addresses().map(|a| a.as_u64()).collect();
        assert_eq!(
            addresses,
            vec![u64::MAX - 0x2fff, u64::MAX - 0x1fff, u64::MAX - 0xfff]
        );
        // Merging two runs whose counts add past u64 leaves them apart.
        let mut first = TlbInvalidation {
            start: Iova::new(0),
            count: u64::MAX,
            granule: PageSize::Size4K,
            leaf_only: true,
        };
        let next = TlbInvalidation {
            start: Iova::new(u64::MAX),
            count: 2,
            ..first
        };
        assert!(!first.extends(&next));
        assert_eq!(first.count, u64::MAX);
    }
}
