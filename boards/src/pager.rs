//! The pager of the bare-metal programs: registered regions of virtual pages, a pool of
//! physical frames and a store, implementing [`FaultResolver`] for the shared SMMU fault path.
//! The board scenario and the firmware's SMMUv3 program both use it.
//!
//! Every virtual page is in one of three states:
//!
//! - **absent**: its data is only in the store. A DMA fault on it is *major*: the data must be
//!   copied into a free frame (like reading it back from swap);
//! - **resident, unmapped**: its data is in a frame but the SMMU table does not map it (like a
//!   page in the page cache, or one whose SMMU mapping was dropped). A fault is *minor*: only a
//!   mapping is needed;
//! - **resident, mapped**.
//!
//! [`Pager::evict`] is the memory-pressure path: unmap, invalidate the SMMU TLB through the
//! caller's [`TlbMaintenance`], write the frame back, free it. The frame is reused at once by
//! the next page-in (the free list is a stack), so a missing invalidation leaves the SMMU
//! translating the old IOVA to someone else's data, which byte checks catch. A test that
//! wants that mistake passes a [`TlbMaintenance`] that does nothing.
//!
//! Fixed capacity, no heap: `PAGES` virtual pages in at most [`MAX_REGIONS`] regions, `FRAMES`
//! frames of DMA memory, and a [`Store`] of `PAGES` pages: DMA memory, or plain memory the
//! caller lends (faster for the CPU to fill and compare).

use core::ops::Range;

use hal::dma::{DMA_PAGE, DmaDirection, DmaMemory, DmaRegion};
use hal::{Iova, PageSize, PhysAddr};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultResolver, RegionSet, RegisteredRegion, ResolveError,
    ResolveEstimate, ResolvedPage, StreamId,
};
use smmu_driver::pagetable::{Attributes, PageTable, Permissions, TlbMaintenance};

use crate::{BoardError, Result};

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
    /// As the store already holds them (a store the caller filled).
    Unchanged,
}

impl Fill {
    fn byte(self, iova: u64) -> Option<u8> {
        match self {
            Fill::Pattern(seed) => Some(pattern_byte(iova, seed)),
            Fill::Byte(b) => Some(b),
            Fill::Unchanged => None,
        }
    }
}

/// The test pattern: a mix of the IOVA's bits and a seed.
pub fn pattern_byte(iova: u64, seed: u8) -> u8 {
    let x = (iova ^ u64::from(seed) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (iova as u8)
}

/// Where absent pages live: page `n` of the pager's page slots at bytes `n * 4096..`.
#[derive(Debug)]
pub enum Store<'s> {
    /// DMA memory the pager allocates (and frees when dropped).
    Dma,
    /// Memory the caller lends, `PAGES * 4096` bytes.
    Memory(&'s mut [u8]),
}

#[derive(Debug)]
enum Backing<'s> {
    Dma(DmaRegion),
    Memory(&'s mut [u8]),
}

/// Where a virtual page's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Residency {
    /// Only in the store.
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

/// A region and its first page slot (its pages are consecutive slots).
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    pages: usize,
    first_slot: usize,
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
pub struct Pager<'m, 's, M: DmaMemory + ?Sized, const PAGES: usize, const FRAMES: usize> {
    dma: &'m M,
    regions: RegionSet<MAX_REGIONS>,
    spans: heapless::Vec<Span, MAX_REGIONS>,
    pages: heapless::Vec<Page, PAGES>,
    store: Option<Backing<'s>>,
    frames: Option<DmaRegion>,
    frame_count: usize,
    /// The page slot each frame holds.
    frame_slot: [Option<u16>; FRAMES],
    free: heapless::Vec<u16, FRAMES>,
    minor_ns: u64,
    stats: PagerStats,
}

impl<M: DmaMemory + ?Sized, const P: usize, const F: usize> core::fmt::Debug
    for Pager<'_, '_, M, P, F>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Pager")
            .field("pages", &self.pages.len())
            .field("free_frames", &self.free.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl<'m, 's, M: DmaMemory + ?Sized, const PAGES: usize, const FRAMES: usize>
    Pager<'m, 's, M, PAGES, FRAMES>
{
    /// A pager with `frames` frames (1..=`FRAMES`) from `dma` and a store for `PAGES` pages.
    /// `minor_ns` is what it estimates a minor fault costs.
    pub fn new(dma: &'m M, frames: usize, minor_ns: u64, store: Store<'s>) -> Result<Self> {
        if !(1..=FRAMES).contains(&frames) || FRAMES > usize::from(u16::MAX) {
            return Err(BoardError::PagerExhausted { what: "frames" });
        }
        if PAGES > usize::from(u16::MAX) {
            return Err(BoardError::PagerExhausted { what: "page slots" });
        }
        let store = match store {
            Store::Dma => Backing::Dma(dma.allocate(PAGES, DmaDirection::Bidirectional)?),
            Store::Memory(bytes) => {
                if bytes.len() != PAGES * DMA_PAGE {
                    return Err(BoardError::PagerExhausted {
                        what: "a store of PAGES pages",
                    });
                }
                Backing::Memory(bytes)
            }
        };
        let frame_region = match dma.allocate(frames, DmaDirection::Bidirectional) {
            Ok(r) => r,
            Err(e) => {
                if let Backing::Dma(r) = store {
                    let _ = dma.free(r);
                }
                return Err(e.into());
            }
        };
        let mut free = heapless::Vec::new();
        // A stack: frame 0 is handed out first, and a freed frame is the next one reused.
        for f in (0..frames as u16).rev() {
            let _ = free.push(f);
        }
        Ok(Pager {
            dma,
            regions: RegionSet::new(),
            spans: heapless::Vec::new(),
            pages: heapless::Vec::new(),
            store: Some(store),
            frames: Some(frame_region),
            frame_count: frames,
            frame_slot: [None; FRAMES],
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

    /// Frames the pager owns.
    pub fn frame_count(&self) -> usize {
        self.frame_count
    }

    /// Gives the frames (and a DMA store) back to the DMA memory, reporting a refusal, which
    /// dropping the pager cannot.
    pub fn release(mut self) -> Result<()> {
        if let Some(r) = self.frames.take() {
            self.dma.free(r).map_err(hal::HalError::from)?;
        }
        if let Some(Backing::Dma(r)) = self.store.take() {
            self.dma.free(r).map_err(hal::HalError::from)?;
        }
        Ok(())
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
        if self.pages.len().saturating_add(pages) > PAGES || self.spans.is_full() {
            return Err(BoardError::PagerExhausted { what: "page slots" });
        }
        // Every check before any change: a refused region leaves nothing behind (no region
        // the fault path would grant, no page slots).
        let len = (pages as u64)
            .checked_mul(PAGE)
            .ok_or(BoardError::UnknownPage { iova: base })?;
        let end = base
            .as_u64()
            .checked_add(len)
            .ok_or(BoardError::UnknownPage { iova: base })?;
        if self
            .spans
            .iter()
            .any(|s| base.as_u64() < s.start + s.pages as u64 * PAGE && s.start < end)
        {
            return Err(BoardError::PagerExhausted {
                what: "distinct IOVAs (regions of two streams overlap)",
            });
        }
        self.regions.register(RegisteredRegion {
            stream,
            start: base,
            len,
            writable,
        })?;
        let first_slot = self.pages.len();
        let filled = (0..pages).try_for_each(|p| {
            self.pages
                .push(Page {
                    iova: base.as_u64() + p as u64 * PAGE,
                    writable,
                    frame: None,
                })
                .map_err(|_| BoardError::PagerExhausted { what: "page slots" })?;
            self.fill_store(first_slot + p, fill)
        });
        if filled.is_err() {
            self.pages.truncate(first_slot);
            self.regions.unregister(stream, base);
            return filled;
        }
        let _ = self.spans.push(Span {
            start: base.as_u64(),
            pages,
            first_slot,
        });
        Ok(())
    }

    fn frames(&self) -> Result<&DmaRegion> {
        self.frames
            .as_ref()
            .ok_or(BoardError::PagerExhausted { what: "frames" })
    }

    fn store_read(&self, slot: usize, offset: usize, out: &mut [u8]) -> Result<()> {
        let at = slot * DMA_PAGE + offset;
        match &self.store {
            Some(Backing::Dma(r)) => Ok(r.read_bytes(at, out)?),
            Some(Backing::Memory(bytes)) => {
                let from = bytes
                    .get(at..at + out.len())
                    .ok_or(BoardError::PagerExhausted { what: "store" })?;
                out.copy_from_slice(from);
                Ok(())
            }
            None => Err(BoardError::PagerExhausted { what: "store" }),
        }
    }

    fn store_write(&mut self, slot: usize, offset: usize, data: &[u8]) -> Result<()> {
        let at = slot * DMA_PAGE + offset;
        match &mut self.store {
            Some(Backing::Dma(r)) => Ok(r.write_bytes(at, data)?),
            Some(Backing::Memory(bytes)) => {
                bytes
                    .get_mut(at..at + data.len())
                    .ok_or(BoardError::PagerExhausted { what: "store" })?
                    .copy_from_slice(data);
                Ok(())
            }
            None => Err(BoardError::PagerExhausted { what: "store" }),
        }
    }

    fn fill_store(&mut self, slot: usize, fill: Fill) -> Result<()> {
        if fill == Fill::Unchanged {
            return Ok(());
        }
        let base = self.pages.get(slot).map(|p| p.iova).unwrap_or(0);
        let mut buf = [0u8; CHUNK];
        for chunk in 0..DMA_PAGE / CHUNK {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = fill.byte(base + (chunk * CHUNK + i) as u64).unwrap_or(0);
            }
            self.store_write(slot, chunk * CHUNK, &buf)?;
        }
        Ok(())
    }

    /// The page slot holding `iova`.
    fn find(&self, iova: u64) -> Option<usize> {
        self.spans.iter().find_map(|s| {
            let page = iova.checked_sub(s.start)? / PAGE;
            (page < s.pages as u64).then(|| s.first_slot + page as usize)
        })
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

    /// The frame holding the page of `iova`, if it is resident.
    pub fn frame_of(&self, iova: Iova) -> Option<PhysAddr> {
        let frame = self.pages.get(self.find(iova.as_u64())?)?.frame?;
        self.frame_addr(frame).ok()
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
        if let Err(e) = self.copy_in(slot, frame) {
            // The frame holds nothing of value: it goes back to the free list.
            let _ = self.free.push(frame);
            return Err(e);
        }
        self.pages[slot].frame = Some(frame);
        self.frame_slot[usize::from(frame)] = Some(slot as u16);
        self.stats.page_ins += 1;
        Ok(frame)
    }

    /// Copies page slot `slot` from the store into `frame`.
    fn copy_in(&self, slot: usize, frame: u16) -> Result<()> {
        let mut buf = [0u8; CHUNK];
        for chunk in 0..DMA_PAGE / CHUNK {
            let at = chunk * CHUNK;
            self.store_read(slot, at, &mut buf)?;
            self.frames()?
                .write_bytes(usize::from(frame) * DMA_PAGE + at, &buf)?;
        }
        self.dma.sync_for_device(self.frames()?);
        Ok(())
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
        T: TlbMaintenance + ?Sized,
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
            &mut Dyn(tlb),
        )?;
        Ok(())
    }

    /// Unmaps the page of `slot` if mapped and has the SMMU TLB invalidated before returning
    /// (the page table reports exactly which entry to invalidate).
    fn unmap_page<D, T>(&mut self, slot: usize, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        let iova = Iova::new(self.pages[slot].iova);
        if table.translate(iova)?.is_some() {
            let invalidations = table.unmap(iova, PAGE, &mut Dyn(&mut *tlb))?;
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
        T: TlbMaintenance + ?Sized,
    {
        let slot = self.slot(iova)?;
        self.unmap_page(slot, table, tlb)
    }

    /// Evicts the page of `iova`: unmap and invalidate, write the frame back to the store,
    /// free the frame. The next fault on it is major.
    pub fn evict<D, T>(&mut self, iova: Iova, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        let slot = self.slot(iova)?;
        self.evict_slot(slot, table, tlb)
    }

    fn evict_slot<D, T>(&mut self, slot: usize, table: &mut PageTable<D>, tlb: &mut T) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
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
            self.store_write(slot, at, &buf)?;
        }
        self.pages[slot].frame = None;
        self.frame_slot[usize::from(frame)] = None;
        self.free
            .push(frame)
            .map_err(|_| BoardError::PagerExhausted { what: "free list" })?;
        self.stats.evictions += 1;
        Ok(())
    }

    /// Evicts one resident page whose IOVA lies in none of the `pinned` ranges, looking at
    /// the frames from `start` (modulo the frame count) on; `false` if there is none.
    pub fn evict_any<D, T>(
        &mut self,
        start: usize,
        pinned: &[Range<u64>],
        table: &mut PageTable<D>,
        tlb: &mut T,
    ) -> Result<bool>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        for i in 0..self.frame_count {
            let frame = (start % self.frame_count + i) % self.frame_count;
            let Some(slot) = self.frame_slot[frame].map(usize::from) else {
                continue;
            };
            let iova = self.pages[slot].iova;
            if pinned.iter().any(|r| r.contains(&iova)) {
                continue;
            }
            self.evict_slot(slot, table, tlb)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Evicts until `count` frames are free, never a page in `pinned`; `start` says where to
    /// look for each eviction (see [`evict_any`](Self::evict_any)).
    pub fn ensure_free<D, T>(
        &mut self,
        count: usize,
        mut start: impl FnMut() -> usize,
        pinned: &[Range<u64>],
        table: &mut PageTable<D>,
        tlb: &mut T,
    ) -> Result<()>
    where
        D: core::ops::Deref<Target: DmaMemory>,
        T: TlbMaintenance + ?Sized,
    {
        while self.free.len() < count {
            if !self.evict_any(start(), pinned, table, tlb)? {
                return Err(BoardError::PagerExhausted { what: "free frame" });
            }
        }
        Ok(())
    }

    /// Where the byte at `iova` lives: (in a frame, offset), the offset in the frames or in
    /// the store's page slot.
    fn locate(&self, iova: u64) -> Result<(bool, usize, usize)> {
        let slot = self.slot(Iova::new(iova))?;
        let offset = (iova & (PAGE - 1)) as usize;
        Ok(match self.pages[slot].frame {
            None => (false, slot, offset),
            Some(frame) => (true, slot, usize::from(frame) * DMA_PAGE + offset),
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
            match self.locate(at)? {
                (true, _, offset) => self
                    .frames()?
                    .read_bytes(offset, &mut out[done..done + n])?,
                (false, slot, offset) => self.store_read(slot, offset, &mut out[done..done + n])?,
            }
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
            match self.locate(at)? {
                (true, _, offset) => self.frames()?.write_bytes(offset, &data[done..done + n])?,
                (false, slot, offset) => self.store_write(slot, offset, &data[done..done + n])?,
            }
            done += n;
        }
        self.dma.sync_for_device(self.frames()?);
        Ok(())
    }

    /// CPU write of `len` bytes of `fill` at `iova` ([`Fill::Unchanged`] writes nothing).
    pub fn fill(&mut self, iova: Iova, len: u64, fill: Fill) -> Result<()> {
        if fill == Fill::Unchanged {
            return Ok(());
        }
        let mut buf = [0u8; CHUNK];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            let at = iova.as_u64() + done;
            for (i, b) in buf[..n].iter_mut().enumerate() {
                *b = fill.byte(at + i as u64).unwrap_or(0);
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
    /// with (expected, found). [`Fill::Unchanged`] expects nothing in particular.
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
            for (i, &found) in x[..n].iter().enumerate() {
                if let Some(expected) = fill.byte(at + i as u64)
                    && expected != found
                {
                    return Ok(Some((done + i as u64, expected, found)));
                }
            }
            done += n as u64;
        }
        Ok(None)
    }
}

impl<M: DmaMemory + ?Sized, const P: usize, const F: usize> Drop for Pager<'_, '_, M, P, F> {
    fn drop(&mut self) {
        if let Some(r) = self.frames.take() {
            let _ = self.dma.free(r);
        }
        if let Some(Backing::Dma(r)) = self.store.take() {
            let _ = self.dma.free(r);
        }
    }
}

impl<M: DmaMemory + ?Sized, const P: usize, const F: usize> FaultResolver
    for Pager<'_, '_, M, P, F>
{
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
        stream: StreamId,
        iova: Iova,
        _access: AccessKind,
    ) -> core::result::Result<ResolvedPage, ResolveError> {
        if self.regions.find(stream, iova).is_none() {
            return Err(ResolveError(resolve_codes::UNKNOWN_PAGE));
        }
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

/// Lets an unsized [`TlbMaintenance`] be passed where a sized one is expected.
struct Dyn<'a, T: TlbMaintenance + ?Sized>(&'a mut T);

impl<T: TlbMaintenance + ?Sized> TlbMaintenance for Dyn<'_, T> {
    fn invalidate_now(
        &mut self,
        invalidations: &smmu_driver::pagetable::Invalidations,
    ) -> smmu_driver::Result<()> {
        self.0.invalidate_now(invalidations)
    }
}

#[cfg(test)]
mod tests;
