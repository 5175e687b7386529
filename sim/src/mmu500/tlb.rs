//! The model's TLB: successful stage-1 translations, tagged as MMU-500 tags them, with the
//! VMID of the context bank that filled them and the ASID (or global, for nG = 0 leaves), kept
//! until an invalidation *and its sync* remove them.
//!
//! The tag is the VMID and ASID, not the bank: two non-secure banks with the same VMID and ASID
//! share entries, and a non-secure context's TLBIALL removes every unlocked entry tagged with
//! the bank's VMID (MMU-500 TRM, SMMU_CBn_TLBIALL; Intel's Agilex HPS register map of its
//! MMU-500 describes the register the same way). Stage-1 banks with stage 2 bypass usually all
//! have VMID 0, so their ASIDs must differ.
//!
//! An invalidation covers the entries cached when it was written, not entries filled after
//! it (from a table entry software had not updated yet), and it takes effect only when its
//! sync is seen complete: the selectors below return the entries an operation names, and
//! [`Tlb::remove`] drops them later (IHI0062 TLBSYNC/TLBSTATUS).
//!
//! Only valid translations are cached, never faults (Arm ARM DDI0487 D8.16 R_XCLRD).
//! A leaf that would raise an access-flag fault is not cached either. Walk caches
//! (intermediate table entries) are not modelled: every miss walks from TTBR0.

use hal::Iova;
use smmu_driver::walk::Leaf;

/// One cached translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlbEntry {
    /// Its identity, given by [`Tlb::insert`].
    pub id: u64,
    /// The context bank whose walk filled it (for diagnostics: it is not part of the tag).
    pub context: usize,
    /// VMID of that bank when it was filled.
    pub vmid: u16,
    /// ASID, `None` for a global (nG = 0) entry.
    pub asid: Option<u16>,
    /// The leaf as walked.
    pub leaf: Leaf,
}

impl TlbEntry {
    fn covers(&self, iova: u64) -> bool {
        let base = self.leaf.base.as_u64();
        iova >= base && iova - base < self.leaf.size.bytes()
    }
}

/// A TLB without capacity limit: nothing is ever evicted except by invalidation, so a missing
/// invalidation always leaves a stale entry (the worst case silicon allows).
#[derive(Clone, Debug, Default)]
pub struct Tlb {
    entries: Vec<TlbEntry>,
    next_id: u64,
}

impl Tlb {
    /// The entry translating `iova` for `vmid` and `asid`, whichever bank filled it.
    pub fn lookup(&self, vmid: u16, asid: u16, iova: Iova) -> Option<Leaf> {
        self.entries
            .iter()
            .find(|e| e.vmid == vmid && e.asid.is_none_or(|a| a == asid) && e.covers(iova.as_u64()))
            .map(|e| e.leaf)
    }

    /// Caches a translation (its `id` is assigned here).
    pub fn insert(&mut self, entry: TlbEntry) {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push(TlbEntry { id, ..entry });
    }

    /// TLBIVA/TLBIVAL (`asid` = `Some`) or TLBIVAA/TLBIVAAL (`None`): every entry of the
    /// VMID covering `va` with that ASID, and global entries covering it.
    pub fn select_va(&self, vmid: u16, va: u64, asid: Option<u16>) -> Vec<u64> {
        self.select(|e| {
            e.vmid == vmid && e.covers(va) && (asid.is_none() || e.asid.is_none() || e.asid == asid)
        })
    }

    /// TLBIASID: every non-global entry of the VMID with `asid`.
    pub fn select_asid(&self, vmid: u16, asid: u16) -> Vec<u64> {
        self.select(|e| e.vmid == vmid && e.asid == Some(asid))
    }

    /// A context bank's TLBIALL, or TLBIVMID: every entry of the VMID.
    pub fn select_vmid(&self, vmid: u16) -> Vec<u64> {
        self.select(|e| e.vmid == vmid)
    }

    /// TLBIALLNSNH: everything.
    pub fn select_all(&self) -> Vec<u64> {
        self.select(|_| true)
    }

    fn select(&self, matches: impl Fn(&TlbEntry) -> bool) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|e| matches(e))
            .map(|e| e.id)
            .collect()
    }

    /// Drops the entries with these ids (those still cached); returns how many.
    pub fn remove(&mut self, ids: &[u64]) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| !ids.contains(&e.id));
        before - self.entries.len()
    }

    /// Cached entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry (for tests).
    pub fn entries(&self) -> &[TlbEntry] {
        &self.entries
    }
}
