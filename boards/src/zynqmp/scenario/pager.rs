//! A small pager: registered regions of virtual pages, a few physical frames, and a backing
//! store, implementing [`FaultResolver`] for the shared SMMU fault path.
//!
//! Every virtual page is in one of three states:
//!
//! - **absent**: its data is only in the backing store. A DMA fault on it is *major*: the data
//!   must be copied into a free frame (like reading it back from swap);
//! - **resident, unmapped**: its data is in a frame but the SMMU table does not map it (like a
//!   page in the page cache, or one whose SMMU mapping was dropped). A fault is *minor*: only a
//!   mapping is needed;
//! - **resident, mapped**.
//!
//! [`Pager::evict`] is the memory-pressure path: unmap, invalidate the SMMU TLB (TLBIVA +
//! TLBSYNC through the caller's [`TlbMaintenance`]), write the frame back, free it. The frame
//! is reused at once by the next page-in, so a missing invalidation leaves the SMMU
//! translating the old IOVA to someone else's data, which the scenario's byte checks catch.
//!
//! Fixed capacity, no heap: the store and the frames are DMA memory from the caller's
//! [`DmaMemory`].

use hal::dma::{DMA_PAGE, DmaDirection, DmaMemory, DmaRegion};
use hal::{Iova, PageSize, PhysAddr};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultResolver, RegionSet, RegisteredRegion, ResolveError,
    ResolveEstimate, ResolvedPage, StreamId,
};
use smmu_driver::pagetable::{Attributes, PageTable, Permissions, TlbMaintenance};

use crate::{BoardError, Result};

/// Most virtual pages a pager manages.
pub const MAX_PAGES: usize = 32;
/// Most frames.
pub const MAX_FRAMES: usize = 32;
/// Most registered regions.
pub const MAX_REGIONS: usize = 8;

const PAGE: u64 = DMA_PAGE as u64;
const CHUNK: usize = 256;

/// [`ResolveError`] codes of the pager.
pub mod resolve_codes {
    /// The IOVA is in no page of the pager.
    pub const UNKNOWN_PAGE: u32 = 1;
    /// No free frame.
    pub const NO_FRAME: u32 = 2;
    /// The DMA memory failed.
    pub const MEMORY: u32 = 3;
}

/// How a region's pages start out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fill {
    /// [`pattern_byte`] with this seed: every byte depends on its IOVA, so data from the
    /// wrong page or offset never matches.
    Pattern(u8),
    /// One byte value everywhere.
    Byte(u8),
}

impl Fill {
    fn byte(self, iova: u64) -> u8 {
        match self {
            Fill::Pattern(seed) => pattern_byte(iova, seed),
            Fill::Byte(b) => b,
        }
    }
}

/// The test pattern: a mix of the IOVA's bits and a seed.
pub fn pattern_byte(iova: u64, seed: u8) -> u8 {
    let x = (iova ^ u64::from(seed) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (iova as u8)
}

/// Where a virtual page's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Only in the backing store.
    Absent,
    /// In frame `frame`, mapped in the SMMU table or not.
    Resident {
        /// Frame index.
        frame: u16,
        /// The SMMU table maps it.
        mapped: bool,
    },
}

/// A virtual page. Whether it is mapped is not kept here but read from the page table when
/// it matters: the fault handler maps a resolved page after [`FaultResolver::resolve`]
/// returns, and may fail to (a table out of memory), which the pager never learns.
#[derive(Clone, Copy, Debug)]
struct Page {
    iova: u64,
    writable: bool,
    /// The frame holding its data, `None` while it is only in the store.
    frame: Option<u16>,
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PagerStats {
    /// Pages copied from the store into a frame.
    pub page_ins: u32,
    /// Pages written back and unmapped.
    pub evictions: u32,
    /// Minor resolutions (the page was resident).
    pub minor: u32,
    /// Major resolutions (the page had to be paged in).
    pub major: u32,
}

/// The pager (see the module docs).
pub struct Pager<'m, M: DmaMemory> {
    dma: &'m M,
    regions: RegionSet<MAX_REGIONS>,
    pages: heapless::Vec<Page, MAX_PAGES>,
    store: Option<DmaRegion>,
    frames: Option<DmaRegion>,
    frame_count: usize,
    free: heapless::Vec<u16, MAX_FRAMES>,
    minor_ns: u64,
    stats: PagerStats,
}

impl<M: DmaMemory> core::fmt::Debug for Pager<'_, M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pager")
            .field("pages", &self.pages.len())
            .field("free_frames", &self.free.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<'m, M: DmaMemory> Pager<'m, M> {
    /// A pager with `frames` frames (1..=[`MAX_FRAMES`]) and a store for [`MAX_PAGES`]
    /// pages, both from `dma`. `minor_ns` is what it estimates a minor fault costs.
    pub fn new(dma: &'m M, frames: usize, minor_ns: u64) -> Result<Self> {
        if !(1..=MAX_FRAMES).contains(&frames) {
            return Err(BoardError::PagerExhausted { what: "frames" });
        }
        let store = dma.allocate(MAX_PAGES, DmaDirection::Bidirectional)?;
        let frame_region = match dma.allocate(frames, DmaDirection::Bidirectional) {
            Ok(r) => r,
            Err(e) => {
                let _ = dma.free(store);
                return Err(e.into());
            }
        };
        let mut free = heapless::Vec::new();
        // A stack: frame 0 is handed out first, and a freed frame is the next one reused.
        for f in (0..frames as u16).rev() {
            free.push(f)
                .map_err(|_| BoardError::PagerExhausted { what: "frames" })?;
        }
        Ok(Pager {
            dma,
            regions: RegionSet::new(),
            pages: heapless::Vec::new(),
            store: Some(store),
            frames: Some(frame_region),
            frame_count: frames,
            free,
            minor_ns,
            stats: PagerStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &PagerStats {
        &self.stats
    }

    /// Free frames.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }

    /// Registers `pages` pages at `base` for `stream` and fills their store copy.
    pub fn add_region(
        &mut self,
        stream: StreamId,
        base: Iova,
        pages: usize,
        writable: bool,
        fill: Fill,
    ) -> Result<()> {
        base.require_aligned(PageSize::Size4K)?;
        if self.pages.len().saturating_add(pages) > MAX_PAGES {
            return Err(BoardError::PagerExhausted { what: "page slots" });
        }
        // Every check before any change: a refused region leaves nothing behind (no region
        // the fault path would grant, no page slots).
        let iova_of = |p: usize| base.as_u64().checked_add(p as u64 * PAGE);
        for p in 0..pages {
            let iova = iova_of(p).ok_or(BoardError::UnknownPage { iova: base })?;
            if self.find(iova).is_some() {
                return Err(BoardError::PagerExhausted {
                    what: "distinct IOVAs (regions of two streams overlap)",
                });
            }
        }
        self.regions.register(RegisteredRegion {
            stream,
            start: base,
            len: pages as u64 * PAGE,
            writable,
        })?;
        let first_slot = self.pages.len();
        let filled = (0..pages).try_for_each(|p| {
            self.pages
                .push(Page {
                    iova: iova_of(p).unwrap_or_default(),
                    writable,
                    frame: None,
                })
                .map_err(|_| BoardError::PagerExhausted { what: "page slots" })?;
            self.fill_store(self.pages.len() - 1, fill)
        });
        if filled.is_err() {
            self.pages.truncate(first_slot);
            self.regions.unregister(stream, base);
        }
        filled
    }

    fn store(&self) -> Result<&DmaRegion> {
        self.store
            .as_ref()
            .ok_or(BoardError::PagerExhausted { what: "store" })
    }

    fn frames(&self) -> Result<&DmaRegion> {
        self.frames
            .as_ref()
            .ok_or(BoardError::PagerExhausted { what: "frames" })
    }

    fn fill_store(&self, slot: usize, fill: Fill) -> Result<()> {
        let base = self.pages.get(slot).map(|p| p.iova).unwrap_or(0);
        let mut buf = [0u8; CHUNK];
        for chunk in 0..DMA_PAGE / CHUNK {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = fill.byte(base + (chunk * CHUNK + i) as u64);
            }
            self.store()?
                .write_bytes(slot * DMA_PAGE + chunk * CHUNK, &buf)?;
        }
        Ok(())
    }

    fn find(&self, iova: u64) -> Option<usize> {
        let page = iova & !(PAGE - 1);
        self.pages.iter().position(|p| p.iova == page)
    }

    fn slot(&self, iova: Iova) -> Result<usize> {
        self.find(iova.as_u64())
            .ok_or(BoardError::UnknownPage { iova })
    }

    /// Physical address of frame `frame`.
    pub fn frame_addr(&self, frame: u16) -> Result<PhysAddr> {
        if usize::from(frame) >= self.frame_count {
            return Err(BoardError::NoSuchFrame {
                frame,
                frames: self.frame_count as u16,
            });
        }
        Ok(self
            .frames()?
            .bus_addr()
            .checked_add(u64::from(frame) * PAGE)?)
    }

    /// Where the page holding `iova` is; whether it is mapped is read from `table`.
    pub fn residency<D>(&self, iova: Iova, table: &PageTable<D>) -> Result<Residency>
    where
        D: core::ops::Deref<Target: DmaMemory>,
    {
        let slot = self.slot(iova)?;
        Ok(match self.pages[slot].frame {
            None => Residency::Absent,
            Some(frame) => Residency::Resident {
                frame,
                mapped: table.translate(Iova::new(self.pages[slot].iova))?.is_some(),
            },
        })
    }

    /// The attributes a page is mapped with: normal write-back memory, read-only unless its
    /// region is writable.
    pub fn attributes(writable: bool) -> Attributes {
        Attributes::normal(if writable {
            Permissions::READ_WRITE
        } else {
            Permissions::READ_ONLY
        })
    }

    /// Copies a page from the store into a free frame (nothing if resident); returns the frame.
    fn page_in(&mut self, slot: usize) -> Result<u16> {
        if let Some(frame) = self.pages[slot].frame {
            return Ok(frame);
        }
        let frame = self
            .free
            .pop()
            .ok_or(BoardError::PagerExhausted { what: "free frame" })?;
        let mut buf = [0u8; CHUNK];
        for chunk in 0..DMA_PAGE / CHUNK {
            let at = chunk * CHUNK;
            self.store()?.read_bytes(slot * DMA_PAGE + at, &mut buf)?;
            self.frames()?
                .write_bytes(usize::from(frame) * DMA_PAGE + at, &buf)?;
        }
        self.dma.sync_for_device(self.frames()?);
        self.pages[slot].frame = Some(frame);
        self.stats.page_ins += 1;
        Ok(frame)
    }

    /// Brings the page of `iova` into a frame without mapping it: its next DMA fault is minor.
    pub fn make_resident(&mut self, iova: Iova) -> Result<()> {
        let slot = self.slot(iova)?;
        self.page_in(slot).map(|_| ())
    }

    /// Pages in and maps the page of `iova` now (no fault will be taken on it).
    pub fn map_now<D, T>(&mut self, iova: Iova, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance,
    {
        let slot = self.slot(iova)?;
        let frame = self.page_in(slot)?;
        let page = self.pages[slot];
        if table.translate(Iova::new(page.iova))?.is_some() {
            return Ok(());
        }
        table.map(
            Iova::new(page.iova),
            self.frame_addr(frame)?,
            PageSize::Size4K,
            &Self::attributes(page.writable),
            tlb,
        )?;
        Ok(())
    }

    /// Unmaps the page of `iova` if mapped and has the SMMU TLB invalidated before returning
    /// (the page table reports exactly which entry to invalidate).
    fn unmap_page<D, T>(&mut self, slot: usize, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance,
    {
        let iova = Iova::new(self.pages[slot].iova);
        if table.translate(iova)?.is_some() {
            let invalidations = table.unmap(iova, PAGE, tlb)?;
            tlb.invalidate_now(&invalidations)?;
        }
        Ok(())
    }

    /// Drops the SMMU mapping of a page but keeps its frame: the next fault is minor.
    pub fn unmap_keep<D, T>(
        &mut self,
        iova: Iova,
        table: &mut PageTable<D>,
        tlb: &mut T,
    ) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance,
    {
        let slot = self.slot(iova)?;
        self.unmap_page(slot, table, tlb)
    }

    /// Evicts the page of `iova`: unmap and invalidate, write the frame back to the store,
    /// free the frame. The next fault on it is major.
    pub fn evict<D, T>(&mut self, iova: Iova, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance,
    {
        let slot = self.slot(iova)?;
        self.unmap_page(slot, table, tlb)?;
        let Some(frame) = self.pages[slot].frame else {
            return Ok(());
        };
        self.dma.sync_for_cpu(self.frames()?);
        let mut buf = [0u8; CHUNK];
        for chunk in 0..DMA_PAGE / CHUNK {
            let at = chunk * CHUNK;
            self.frames()?
                .read_bytes(usize::from(frame) * DMA_PAGE + at, &mut buf)?;
            self.store()?.write_bytes(slot * DMA_PAGE + at, &buf)?;
        }
        self.pages[slot].frame = None;
        self.free
            .push(frame)
            .map_err(|_| BoardError::PagerExhausted { what: "free list" })?;
        self.stats.evictions += 1;
        Ok(())
    }

    /// Where the byte at `iova` lives: (region, offset).
    fn locate(&self, iova: u64) -> Result<(bool, usize)> {
        let slot = self.slot(Iova::new(iova))?;
        let offset = (iova & (PAGE - 1)) as usize;
        Ok(match self.pages[slot].frame {
            None => (false, slot * DMA_PAGE + offset),
            Some(frame) => (true, usize::from(frame) * DMA_PAGE + offset),
        })
    }

    /// CPU read of `out.len()` bytes at `iova` (from the frame if resident, else the store).
    pub fn read(&self, iova: Iova, out: &mut [u8]) -> Result<()> {
        self.dma.sync_for_cpu(self.frames()?);
        let mut done = 0;
        while done < out.len() {
            let at = iova.as_u64() + done as u64;
            let in_page = (PAGE - (at & (PAGE - 1))) as usize;
            let n = in_page.min(out.len() - done);
            let (in_frame, offset) = self.locate(at)?;
            let region = if in_frame {
                self.frames()?
            } else {
                self.store()?
            };
            region.read_bytes(offset, &mut out[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// CPU write of `data` at `iova`.
    pub fn write(&mut self, iova: Iova, data: &[u8]) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let at = iova.as_u64() + done as u64;
            let in_page = (PAGE - (at & (PAGE - 1))) as usize;
            let n = in_page.min(data.len() - done);
            let (in_frame, offset) = self.locate(at)?;
            let region = if in_frame {
                self.frames()?
            } else {
                self.store()?
            };
            region.write_bytes(offset, &data[done..done + n])?;
            done += n;
        }
        self.dma.sync_for_device(self.frames()?);
        Ok(())
    }

    /// CPU write of `len` bytes of `fill` at `iova`.
    pub fn fill(&mut self, iova: Iova, len: u64, fill: Fill) -> Result<()> {
        let mut buf = [0u8; CHUNK];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            let at = iova.as_u64() + done;
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = fill.byte(at + i as u64);
            }
            self.write(Iova::new(at), &buf[..n])?;
            done += n as u64;
        }
        Ok(())
    }

    /// Compares `len` bytes at `a` and `b`; returns the first differing offset with both
    /// bytes.
    pub fn first_difference(&self, a: Iova, b: Iova, len: u64) -> Result<Option<(u64, u8, u8)>> {
        let mut x = [0u8; CHUNK];
        let mut y = [0u8; CHUNK];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            self.read(Iova::new(a.as_u64() + done), &mut x[..n])?;
            self.read(Iova::new(b.as_u64() + done), &mut y[..n])?;
            if let Some(i) = (0..n).find(|&i| x[i] != y[i]) {
                return Ok(Some((done + i as u64, x[i], y[i])));
            }
            done += n as u64;
        }
        Ok(None)
    }

    /// Checks that `len` bytes at `iova` hold `fill`; returns the first offset that does not
    /// with (expected, found).
    pub fn first_difference_from(
        &self,
        iova: Iova,
        len: u64,
        fill: Fill,
    ) -> Result<Option<(u64, u8, u8)>> {
        let mut x = [0u8; CHUNK];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            let at = iova.as_u64() + done;
            self.read(Iova::new(at), &mut x[..n])?;
            if let Some(i) = (0..n).find(|&i| x[i] != fill.byte(at + i as u64)) {
                return Ok(Some((done + i as u64, fill.byte(at + i as u64), x[i])));
            }
            done += n as u64;
        }
        Ok(None)
    }

    /// Frames the pager owns.
    pub fn frame_count(&self) -> usize {
        self.frame_count
    }
}

impl<M: DmaMemory> Drop for Pager<'_, M> {
    fn drop(&mut self) {
        if let Some(r) = self.frames.take() {
            let _ = self.dma.free(r);
        }
        if let Some(r) = self.store.take() {
            let _ = self.dma.free(r);
        }
    }
}

impl<M: DmaMemory> FaultResolver for Pager<'_, M> {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        self.regions.find(stream, iova)
    }

    fn estimate(&self, _stream: StreamId, iova: Iova, _access: AccessKind) -> ResolveEstimate {
        match self.find(iova.as_u64()).map(|s| self.pages[s].frame) {
            Some(Some(_)) => ResolveEstimate::Minor {
                expected_ns: self.minor_ns,
            },
            Some(None) => ResolveEstimate::Major,
            None => ResolveEstimate::Unknown,
        }
    }

    fn resolve(
        &mut self,
        _stream: StreamId,
        iova: Iova,
        _access: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError> {
        let slot = self
            .find(iova.as_u64())
            .ok_or(ResolveError(resolve_codes::UNKNOWN_PAGE))?;
        let cost = match self.pages[slot].frame {
            None => FaultCost::Major,
            Some(_) => FaultCost::Minor,
        };
        let frame = self.page_in(slot).map_err(|e| {
            ResolveError(match e {
                BoardError::PagerExhausted { .. } => resolve_codes::NO_FRAME,
                _ => resolve_codes::MEMORY,
            })
        })?;
        let frame_addr = self
            .frame_addr(frame)
            .map_err(|_| ResolveError(resolve_codes::MEMORY))?;
        // The fault handler maps it next (or fails to: the page table tells which).
        match cost {
            FaultCost::Minor => self.stats.minor += 1,
            FaultCost::Major => self.stats.major += 1,
        }
        Ok(ResolvedPage {
            frame: frame_addr,
            size: PageSize::Size4K,
            attributes: Self::attributes(self.pages[slot].writable),
            cost,
        })
    }
}

#[cfg(test)]
mod tests {
    use hal::dma::HostDma;
    use smmu_driver::pagetable::{Invalidations, PageTableConfig};

    use super::*;

    struct NoTlb;
    impl TlbMaintenance for NoTlb {
        fn invalidate_now(&mut self, _: &Invalidations) -> smmu_driver::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_refused_region_leaves_no_region_and_no_pages_behind() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
        let mut pager = Pager::new(&dma, 4, 1_000).unwrap();
        let (a, b) = (StreamId(0x14e8), StreamId(0x14e9));
        pager
            .add_region(a, Iova::new(0x1000_1000), 1, false, Fill::Byte(1))
            .unwrap();
        // B's second page is A's page: refused before anything changed.
        assert!(
            pager
                .add_region(b, Iova::new(0x1000_0000), 2, true, Fill::Byte(2))
                .is_err()
        );
        assert_eq!(pager.region(b, Iova::new(0x1000_0000)), None);
        assert_eq!(pager.region(b, Iova::new(0x1000_1000)), None);
        assert!(pager.slot(Iova::new(0x1000_0000)).is_err());
        // A's page still holds A's data, and the slots are free for a good region.
        let mut byte = [0u8; 1];
        pager.read(Iova::new(0x1000_1000), &mut byte).unwrap();
        assert_eq!(byte, [1]);
        pager
            .add_region(
                b,
                Iova::new(0x2000_0000),
                MAX_PAGES - 1,
                true,
                Fill::Byte(3),
            )
            .unwrap();
    }

    #[test]
    fn a_frame_index_past_the_frames_is_an_error() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
        let pager = Pager::new(&dma, 4, 1_000).unwrap();
        assert!(pager.frame_addr(3).is_ok());
        assert_eq!(
            pager.frame_addr(4),
            Err(BoardError::NoSuchFrame {
                frame: 4,
                frames: 4
            })
        );
    }

    #[test]
    fn a_resolved_page_counts_as_mapped_only_once_the_table_maps_it() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
        let mut table = PageTable::new(&dma, PageTableConfig::default()).unwrap();
        let mut pager = Pager::new(&dma, 4, 1_000).unwrap();
        let stream = StreamId(0x14e8);
        let iova = Iova::new(0x1000_0000);
        pager
            .add_region(stream, iova, 1, true, Fill::Byte(7))
            .unwrap();
        // The fault handler resolves, then maps; here the mapping never happens (as when the
        // table runs out of memory), so the page is resident but not mapped.
        pager.resolve(stream, iova, AccessKind::Read).unwrap();
        assert_eq!(
            pager.residency(iova, &table).unwrap(),
            Residency::Resident {
                frame: 0,
                mapped: false
            }
        );
        // map_now must then really map it rather than trust a flag.
        pager.map_now(iova, &mut table, &mut NoTlb).unwrap();
        assert!(table.translate(iova).unwrap().is_some());
        assert_eq!(
            pager.residency(iova, &table).unwrap(),
            Residency::Resident {
                frame: 0,
                mapped: true
            }
        );
        pager.evict(iova, &mut table, &mut NoTlb).unwrap();
        assert!(table.translate(iova).unwrap().is_none());
        assert_eq!(pager.residency(iova, &table).unwrap(), Residency::Absent);
    }

    #[test]
    fn a_region_of_absurd_size_is_refused_and_the_pager_keeps_working() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 64).unwrap();
        let mut pager = Pager::new(&dma, 4, 1_000).unwrap();
        let stream = StreamId(0x14e8);
        pager
            .add_region(stream, Iova::new(0x1000_0000), 2, true, Fill::Byte(0x5a))
            .unwrap();
        // With two slots in use, 2 + usize::MAX pages must not overflow the capacity check.
        assert_eq!(
            pager.add_region(
                stream,
                Iova::new(0x2000_0000),
                usize::MAX,
                true,
                Fill::Byte(0)
            ),
            Err(BoardError::PagerExhausted { what: "page slots" })
        );
        let mut out = [0u8; 3];
        pager.read(Iova::new(0x1000_0fff), &mut out).unwrap();
        assert_eq!(out, [0x5a; 3]);
    }
}
