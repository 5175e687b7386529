//! The page-state table: per 4 KiB page of a registered region, a present bit, a permission
//! bit, the backing frame and a version.
//!
//! The idea is our reconstruction of the NP-RDMA paper's approach (docs/protocol.md §0: a
//! per-MR `{present, version}` table plus an MR-wide generation, with the invalidation order
//! "bump version, clear present, then unmap"). The concrete encoding is ours: a page's version
//! *is* the table generation at which the page last changed. One 8-byte snapshot of the
//! generation is then enough for a transfer to check any number of pages later (instead of
//! recording every page's version), and the fast path "generation unchanged" is one compare.
//!
//! Huge pages (2 MiB, 1 GiB blocks) are entered as one mapping that fills all their 4 KiB
//! slots; invalidating any part of one invalidates all of it, because the hardware maps (and
//! Linux splits or frees) it as a unit. The table covers one contiguous region and keeps
//! its entries in caller-provided storage (an array or a static on the target, a `Vec` on the
//! host), so large regions need no large stack values.

use hal::{PageSize, PhysAddr, VirtAddr};

use crate::types::{Access, FaultReason, Generation, RequestStatus};
use crate::wire::{StateLookupRequest, StateLookupResponse};
use crate::{ProtocolError, Result};

/// Granule of the table.
pub const PAGE_SHIFT: u32 = 12;
const PAGE: u64 = 1 << PAGE_SHIFT;

const PRESENT: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
const SIZE_SHIFT: u32 = 2;
const SIZE_MASK: u64 = 0b11 << SIZE_SHIFT;
const FRAME_MASK: u64 = !(PAGE - 1);

/// One 4 KiB slot of the table: 16 bytes (version, then frame | flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PageEntry {
    version: u64,
    /// Frame address of this 4 KiB slot in bits 63:12; bit 0 present, bit 1 writable,
    /// bits 3:2 the size of the mapping the slot belongs to (0 4K, 1 2M, 2 1G).
    word: u64,
}

impl PageEntry {
    /// An entry that was never mapped.
    pub const ABSENT: PageEntry = PageEntry {
        version: 0,
        word: 0,
    };

    /// Whether the page is present.
    pub const fn present(&self) -> bool {
        self.word & PRESENT != 0
    }

    /// Whether the page may be written.
    pub const fn writable(&self) -> bool {
        self.word & WRITABLE != 0
    }

    /// The page's version (generation of its last change).
    pub const fn version(&self) -> Generation {
        Generation(self.version)
    }

    /// The size of the mapping the slot belongs to (4 KiB when absent).
    pub const fn size(&self) -> PageSize {
        match (self.word & SIZE_MASK) >> SIZE_SHIFT {
            1 => PageSize::Size2M,
            2 => PageSize::Size1G,
            _ => PageSize::Size4K,
        }
    }

    const fn size_code(size: PageSize) -> u64 {
        match size {
            PageSize::Size4K => 0,
            PageSize::Size2M => 1,
            PageSize::Size1G => 2,
        }
    }

    fn frame(&self) -> PhysAddr {
        PhysAddr::new(self.word & FRAME_MASK)
    }
}

/// What [`PageStateTable::lookup`] reports for one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageState {
    /// Whether the page is present.
    pub present: bool,
    /// Whether it may be written.
    pub writable: bool,
    /// Its version.
    pub version: Generation,
    /// The size of the mapping it belongs to.
    pub size: PageSize,
    /// When present: the physical address the looked-up address translates to.
    pub frame: Option<PhysAddr>,
}

/// A failed [`PageStateTable::check`]: the first offending address and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFault {
    /// First address of the range that fails.
    pub addr: VirtAddr,
    /// Why it fails.
    pub reason: FaultReason,
}

/// The result of [`PageStateTable::invalidate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Invalidation {
    /// The table's generation afterwards.
    pub generation: Generation,
    /// 4 KiB slots that went from present to absent (a huge page counts all of its slots).
    pub pages_dropped: usize,
}

/// Page state of one region `[base, base + len)`, one entry per 4 KiB page.
#[derive(Debug)]
pub struct PageStateTable<S> {
    base: VirtAddr,
    pages: usize,
    generation: Generation,
    entries: S,
}

impl<S: AsRef<[PageEntry]> + AsMut<[PageEntry]>> PageStateTable<S> {
    /// A table for `[base, base + len)` with every page absent, kept in `storage` (which
    /// needs at least `len / 4 KiB` entries). `base` and `len` must be 4 KiB-aligned.
    pub fn new(base: VirtAddr, len: u64, mut storage: S) -> Result<Self> {
        if !base.as_u64().is_multiple_of(PAGE) {
            return Err(ProtocolError::Misaligned {
                value: base.as_u64(),
                align: PAGE,
            });
        }
        if !len.is_multiple_of(PAGE) {
            return Err(ProtocolError::Misaligned {
                value: len,
                align: PAGE,
            });
        }
        if len == 0 {
            return Err(ProtocolError::EmptyRegion);
        }
        // The end (one past the last byte) must be representable: every range computation
        // uses it.
        base.as_u64()
            .checked_add(len)
            .ok_or(ProtocolError::AddressOverflow)?;
        let pages =
            usize::try_from(len >> PAGE_SHIFT).map_err(|_| ProtocolError::AddressOverflow)?;
        let got = storage.as_ref().len();
        let slots = storage
            .as_mut()
            .get_mut(..pages)
            .ok_or(ProtocolError::StorageTooSmall { needed: pages, got })?;
        slots.fill(PageEntry::ABSENT);
        Ok(Self {
            base,
            pages,
            generation: Generation(0),
            entries: storage,
        })
    }

    /// First address of the region.
    pub fn base(&self) -> VirtAddr {
        self.base
    }

    /// Length of the region in bytes.
    pub fn len(&self) -> u64 {
        (self.pages as u64) << PAGE_SHIFT
    }

    /// Always false: a table covers at least one page.
    pub fn is_empty(&self) -> bool {
        self.pages == 0
    }

    /// The current generation: take it as the snapshot for a later [`check`](Self::check).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Records that `[addr, addr + size)` is now backed by `frame` (a fault-in or a remap).
    ///
    /// `addr` and `frame` must be aligned to `size`, and the page must lie in the region.
    /// Every slot it covers gets a new version, even if it was present (a remap is a change).
    /// A larger mapping that only partly overlaps the page is invalidated as a whole first.
    /// Returns the new generation.
    pub fn mark_present(
        &mut self,
        addr: VirtAddr,
        size: PageSize,
        frame: PhysAddr,
        writable: bool,
    ) -> Result<Generation> {
        if !addr.is_aligned(size) {
            return Err(ProtocolError::Misaligned {
                value: addr.as_u64(),
                align: size.bytes(),
            });
        }
        if !frame.is_aligned(size) {
            return Err(ProtocolError::Misaligned {
                value: frame.as_u64(),
                align: size.bytes(),
            });
        }
        let first =
            self.slot_range(addr.as_u64(), size.bytes())
                .ok_or(ProtocolError::OutOfRegion {
                    addr: addr.as_u64(),
                    len: size.bytes(),
                })?;
        let (lo, hi) = self.expand_to_mappings(first.0, first.1);
        let generation = self.bump();
        let word_flags = PRESENT
            | if writable { WRITABLE } else { 0 }
            | (PageEntry::size_code(size) << SIZE_SHIFT);
        let slots = self.slots_mut();
        for (i, entry) in slots.iter_mut().enumerate().take(hi + 1).skip(lo) {
            if i >= first.0 && i <= first.1 {
                let frame_of_slot = frame.as_u64() + (((i - first.0) as u64) << PAGE_SHIFT);
                *entry = PageEntry {
                    version: generation.0,
                    word: frame_of_slot | word_flags,
                };
            } else if entry.present() {
                *entry = PageEntry {
                    version: generation.0,
                    word: 0,
                };
            }
        }
        Ok(generation)
    }

    /// Records that `[addr, addr + len)` is no longer backed (reclaim, swap-out, migration,
    /// munmap). The range may be unaligned and may reach outside the region: partial pages
    /// count as whole pages, a huge page touched anywhere is dropped whole, and the part
    /// outside the region is ignored. Only pages that were present change (and get a new
    /// version); if none was, the generation stays as it is.
    ///
    /// Call this *before* the memory is reused, and unmap the IOVA (or remap it to the
    /// scratch page) after it returns: then any access that hit the old frame or the scratch
    /// page happened after the version bump and fails a later [`check`](Self::check).
    pub fn invalidate(&mut self, addr: VirtAddr, len: u64) -> Result<Invalidation> {
        let unchanged = Invalidation {
            generation: self.generation,
            pages_dropped: 0,
        };
        if len == 0 {
            return Ok(unchanged);
        }
        let start = addr.as_u64().max(self.base.as_u64());
        let end = addr.as_u64().saturating_add(len).min(self.end());
        if start >= end {
            return Ok(unchanged);
        }
        let base = self.base.as_u64();
        let first = usize::try_from((start - base) >> PAGE_SHIFT)
            .map_err(|_| ProtocolError::AddressOverflow)?;
        let last = usize::try_from((end - 1 - base) >> PAGE_SHIFT)
            .map_err(|_| ProtocolError::AddressOverflow)?;
        let (lo, hi) = self.expand_to_mappings(first, last);
        let dropped = self
            .slots()
            .iter()
            .take(hi + 1)
            .skip(lo)
            .filter(|entry| entry.present())
            .count();
        if dropped == 0 {
            return Ok(unchanged);
        }
        let generation = self.bump();
        for entry in self.slots_mut().iter_mut().take(hi + 1).skip(lo) {
            if entry.present() {
                *entry = PageEntry {
                    version: generation.0,
                    word: 0,
                };
            }
        }
        Ok(Invalidation {
            generation,
            pages_dropped: dropped,
        })
    }

    /// The state of the page holding `addr`.
    pub fn lookup(&self, addr: VirtAddr) -> Result<PageState> {
        let out = ProtocolError::OutOfRegion {
            addr: addr.as_u64(),
            len: 1,
        };
        let (slot, _) = self.slot_range(addr.as_u64(), 1).ok_or(out)?;
        let entry = self.slots().get(slot).ok_or(out)?;
        Ok(PageState {
            present: entry.present(),
            writable: entry.writable(),
            version: entry.version(),
            size: entry.size(),
            frame: entry
                .present()
                .then(|| PhysAddr::new(entry.frame().as_u64() | (addr.as_u64() & (PAGE - 1)))),
        })
    }

    /// Checks that an access of `len` bytes at `addr` is valid *and* that none of its pages
    /// changed since the generation `since` (taken with [`generation`](Self::generation) when
    /// the transfer validated its pages). Reports the first offending address: outside the
    /// region, not present, no write permission, or changed (version newer than `since`).
    pub fn check(
        &self,
        addr: VirtAddr,
        len: u64,
        access: Access,
        since: Generation,
    ) -> core::result::Result<(), PageFault> {
        if len == 0 {
            return Ok(());
        }
        let start = addr.as_u64();
        if start < self.base.as_u64() || start >= self.end() {
            return Err(PageFault {
                addr,
                reason: FaultReason::OutOfRegion,
            });
        }
        // Page by page in address order: the pages inside the region first, then the first
        // byte past its end, so the first failing address is the one reported.
        let access_end = start.saturating_add(len);
        let inside = access_end.min(self.end()) - start;
        let Some((first, last)) = self.slot_range(start, inside) else {
            return Err(PageFault {
                addr,
                reason: FaultReason::OutOfRegion,
            });
        };
        let past_end = (access_end > self.end()).then(|| PageFault {
            addr: VirtAddr::new(self.end()),
            reason: FaultReason::OutOfRegion,
        });
        for (i, entry) in self.slots().iter().enumerate().take(last + 1).skip(first) {
            let slot_addr = self.base.as_u64() + ((i as u64) << PAGE_SHIFT);
            let at = VirtAddr::new(slot_addr.max(addr.as_u64()));
            let reason = if !entry.present() {
                Some(FaultReason::NotPresent)
            } else if entry.version() > since {
                Some(FaultReason::PageChanged)
            } else if access == Access::Write && !entry.writable() {
                Some(FaultReason::Permission)
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(PageFault { addr: at, reason });
            }
        }
        past_end.map_or(Ok(()), Err)
    }

    /// Answers a [`StateLookupRequest`] with the state of up to 64 pages from its offset.
    pub fn state_lookup(&self, request: &StateLookupRequest) -> StateLookupResponse {
        let mut response = StateLookupResponse {
            req_seq: request.req_seq,
            key: request.key,
            status: RequestStatus::Failed(FaultReason::OutOfRegion),
            page_shift: PAGE_SHIFT as u8,
            pages: 0,
            offset: request.offset & !(PAGE - 1),
            generation: self.generation,
            present: 0,
        };
        let first = request.offset >> PAGE_SHIFT;
        let Ok(first) = usize::try_from(first) else {
            return response;
        };
        if first >= self.pages {
            return response;
        }
        let count = (self.pages - first).min(64);
        for (bit, entry) in self.slots().iter().skip(first).take(count).enumerate() {
            if entry.present() {
                response.present |= 1 << bit;
            }
        }
        response.status = RequestStatus::Ok;
        response.pages = count as u8;
        response
    }

    fn end(&self) -> u64 {
        self.base.as_u64() + self.len()
    }

    fn slots(&self) -> &[PageEntry] {
        self.entries.as_ref().get(..self.pages).unwrap_or(&[])
    }

    fn slots_mut(&mut self) -> &mut [PageEntry] {
        let pages = self.pages;
        self.entries.as_mut().get_mut(..pages).unwrap_or(&mut [])
    }

    fn bump(&mut self) -> Generation {
        self.generation = Generation(self.generation.0.saturating_add(1));
        self.generation
    }

    /// First and last slot of `[addr, addr + len)` if it lies wholly in the region.
    fn slot_range(&self, addr: u64, len: u64) -> Option<(usize, usize)> {
        let last_byte = addr.checked_add(len.checked_sub(1)?)?;
        if addr < self.base.as_u64() || last_byte >= self.end() {
            return None;
        }
        let base = self.base.as_u64();
        let first = usize::try_from((addr - base) >> PAGE_SHIFT).ok()?;
        let last = usize::try_from((last_byte - base) >> PAGE_SHIFT).ok()?;
        Some((first, last))
    }

    /// Widens a slot range so that it covers every huge mapping it touches. A huge mapping
    /// that overlaps the range without being inside it must contain its first or last slot,
    /// because mappings are aligned blocks.
    fn expand_to_mappings(&self, first: usize, last: usize) -> (usize, usize) {
        let block = |slot: usize| -> Option<(usize, usize)> {
            let entry = self.slots().get(slot)?;
            if !entry.present() || entry.size() == PageSize::Size4K {
                return None;
            }
            let span = usize::try_from(entry.size().bytes() >> PAGE_SHIFT).ok()?;
            let addr = self.base.as_u64() + ((slot as u64) << PAGE_SHIFT);
            let block_start = addr & !(entry.size().bytes() - 1);
            let start =
                usize::try_from(block_start.checked_sub(self.base.as_u64())? >> PAGE_SHIFT).ok()?;
            Some((start, start + span - 1))
        };
        let (mut lo, mut hi) = (first, last);
        if let Some((s, e)) = block(first) {
            lo = lo.min(s);
            hi = hi.max(e);
        }
        if let Some((s, e)) = block(last) {
            lo = lo.min(s);
            hi = hi.max(e);
        }
        (lo, hi.min(self.pages.saturating_sub(1)))
    }
}
