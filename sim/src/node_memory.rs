//! Per-node memory: frames under a memory limit, a reclaim policy and a swap device.
//!
//! The model covers one process's registered buffers on one node (a contiguous virtual range,
//! 4 KiB pages). Each page is in one of four states:
//!
//! | state | meaning | a fault on it is |
//! |---|---|---|
//! | `Fresh` | never touched | minor (zero fill) |
//! | `Resident` | mapped in a frame | — |
//! | `Cached` | unmapped by reclaim, data still in its frame (Linux: inactive list / swap cache) | minor |
//! | `Swapped` | written to the swap device, frame reused | major (a swap-device read) |
//!
//! Reclaim policy (ours, after Linux's two-list design): pages taken away from the process
//! ("deactivated": by the background reclaim the `fault_rate` knob drives, or by CLOCK under
//! the limit) first go to an inactive list, ordered by when they were taken away, and keep
//! their frame. Frames in use (resident plus inactive) never exceed `limit_pages`; when a
//! frame is needed at the limit, the oldest inactive page is written to swap and its frame
//! freed; with no inactive page, CLOCK
//! (second chance on the referenced bit) picks a resident unpinned page, which the caller must
//! unmap first. Pinned pages are never reclaimed and may exceed the limit (so pin-all can show
//! what it costs).
//!
//! The swap device is a FIFO with a bandwidth and a per-request latency; its default (50 µs,
//! 2 GB/s) is our assumption for the QFDB's M.2 SSD (the QFDB paper names the SSD,
//! not its speed), chosen so that a major fault costs about NP-RDMA's 60 µs
//! (the NP-RDMA paper's abstract) together with the CPU's 5 µs; docs/virtual-qfdb.md lists
//! both papers.
//!
//! Data is real: frames live in the node's simulated DRAM (`HostDma`), swapped pages in the
//! swap device's own store. All times are model time.

use std::collections::BTreeSet;
use std::sync::Arc;

use hal::dma::HostDma;
use hal::{Iova, PageSize, PhysAddr};
use smmu_driver::fault::{
    AccessKind, FaultCost, FaultResolver, RegisteredRegion, ResolveError, ResolveEstimate,
    ResolvedPage, StreamId,
};
use smmu_driver::pagetable::{Attributes, Permissions};

use crate::des::ModelTime;
use crate::vqfdb::{SimError, VqResult};

/// Bytes per page.
pub const PAGE: u64 = 4096;
const NO_PAGE: u32 = u32::MAX;

/// The swap device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapParams {
    /// Latency of one request, overlapping with others.
    pub latency: ModelTime,
    /// Transfer rate in bits per second (requests are served one after another at this rate).
    pub bandwidth_bps: u64,
    /// How long a deactivated page stays in memory before reclaim writes it to swap and frees
    /// its frame (kswapd's aging under pressure; ours: 200 µs). A fault before then is minor,
    /// after it major.
    pub writeback_after: ModelTime,
}

impl Default for SwapParams {
    /// 50 µs and 2 GB/s: an assumption for an M.2 SSD (see the module documentation).
    fn default() -> Self {
        Self {
            latency: ModelTime::from_ns(50_000),
            bandwidth_bps: 16_000_000_000,
            writeback_after: ModelTime::from_ns(200_000),
        }
    }
}

/// State of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Never touched.
    Fresh,
    /// Mapped in `frame`.
    Resident {
        /// Frame index.
        frame: u32,
    },
    /// Unmapped; the data is still in `frame`.
    Cached {
        /// Frame index.
        frame: u32,
    },
    /// On the swap device in `slot`.
    Swapped {
        /// Swap slot.
        slot: u32,
    },
}

#[derive(Clone, Copy, Debug)]
struct PageInfo {
    state: PageState,
    referenced: bool,
    pinned: bool,
    /// When it was last deactivated.
    deactivated_at: ModelTime,
}

/// A page the caller must unmap (SMMU and page-state table) before [`NodeMemory::evict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Victim {
    /// An inactive page: already unmapped; evict it directly.
    Cached(u64),
    /// A resident page chosen by CLOCK: unmap it, then evict it.
    Resident(u64),
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStats {
    /// Pages made resident from `Fresh` (zero fill).
    pub zero_fills: u64,
    /// Pages made resident from `Cached` (minor).
    pub reactivations: u64,
    /// Pages read back from swap (major).
    pub swap_ins: u64,
    /// Pages written to swap.
    pub swap_outs: u64,
    /// Pages deactivated (unmapped into the inactive list).
    pub deactivations: u64,
    /// Resident pages CLOCK reclaimed under the limit.
    pub clock_evictions: u64,
    /// Most frames in use at once.
    pub peak_frames: u64,
    /// Most resident (mapped) pages at once.
    pub peak_resident: u64,
}

#[derive(Debug)]
struct SwapDevice {
    params: SwapParams,
    slots: Vec<Option<Box<[u8]>>>,
    free: Vec<u32>,
    busy_until: ModelTime,
}

impl SwapDevice {
    /// Reserves the device for one page; returns when the request completes.
    fn reserve(&mut self, now: ModelTime) -> ModelTime {
        let start = now.max(self.busy_until);
        self.busy_until = start.after(ModelTime::transfer(PAGE, self.params.bandwidth_bps));
        self.busy_until.after(self.params.latency)
    }

    fn store(&mut self, data: Box<[u8]>) -> u32 {
        if let Some(slot) = self.free.pop() {
            if let Some(s) = self.slots.get_mut(slot as usize) {
                *s = Some(data);
            }
            return slot;
        }
        self.slots.push(Some(data));
        (self.slots.len() - 1) as u32
    }

    fn take(&mut self, slot: u32) -> Option<Box<[u8]>> {
        let data = self.slots.get_mut(slot as usize)?.take()?;
        self.free.push(slot);
        Some(data)
    }

    fn peek(&self, slot: u32) -> Option<&[u8]> {
        self.slots.get(slot as usize)?.as_deref()
    }
}

/// One node's memory for one registered range.
#[derive(Debug)]
pub struct NodeMemory {
    dram: Arc<HostDma>,
    frames_base: PhysAddr,
    frame_owner: Vec<u32>,
    free_frames: Vec<u32>,
    va_base: u64,
    pages: Vec<PageInfo>,
    limit: usize,
    used_frames: usize,
    resident: usize,
    /// Inactive (`Cached`) pages by (when deactivated, index): oldest first, whatever order
    /// they were deactivated in (background reclaim back-dates pages).
    inactive: BTreeSet<(ModelTime, u32)>,
    clock_hand: usize,
    swap: SwapDevice,
    stats: MemStats,
    streams: [StreamId; 2],
    minor_ns: u64,
    now: ModelTime,
}

impl NodeMemory {
    /// Memory for the virtual range `[va_base, va_base + pages * 4 KiB)` of `streams` (the
    /// engine's read and write streams of one protection domain), with
    /// `frames` frames carved from `dram` at `frames_base` (allocated by the caller) and a
    /// limit of `limit_pages` frames for unpinned pages. `minor_ns` is the resolver's estimate
    /// of a minor fault.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dram: Arc<HostDma>,
        frames_base: PhysAddr,
        frames: usize,
        va_base: u64,
        pages: usize,
        limit_pages: usize,
        swap: SwapParams,
        streams: [StreamId; 2],
        minor_ns: u64,
    ) -> VqResult<Self> {
        if !va_base.is_multiple_of(PAGE) || !frames_base.as_u64().is_multiple_of(PAGE) {
            return Err(SimError::Internal("node memory not page aligned".into()));
        }
        if limit_pages == 0 {
            return Err(SimError::Config(
                "--memory-limit must be at least one page".into(),
            ));
        }
        if frames < limit_pages.min(pages) {
            return Err(SimError::Internal(
                "fewer frames than the memory limit".into(),
            ));
        }
        Ok(Self {
            dram,
            frames_base,
            frame_owner: vec![NO_PAGE; frames],
            free_frames: (0..frames as u32).rev().collect(),
            va_base,
            pages: vec![
                PageInfo {
                    state: PageState::Fresh,
                    referenced: false,
                    pinned: false,
                    deactivated_at: ModelTime::ZERO,
                };
                pages
            ],
            limit: limit_pages,
            used_frames: 0,
            resident: 0,
            inactive: BTreeSet::new(),
            clock_hand: 0,
            swap: SwapDevice {
                params: swap,
                slots: Vec::new(),
                free: Vec::new(),
                busy_until: ModelTime::ZERO,
            },
            stats: MemStats::default(),
            streams,
            minor_ns,
            now: ModelTime::ZERO,
        })
    }

    /// Advances the memory's clock: inactive pages older than `writeback_after` are written
    /// to swap (at the moment they reached that age) and their frames freed.
    pub fn set_now(&mut self, now: ModelTime) -> VqResult<()> {
        self.now = self.now.max(now);
        let after = self.swap.params.writeback_after;
        while let Some(&(deactivated_at, idx)) = self.inactive.first() {
            let due = deactivated_at.after(after);
            if due > self.now {
                break;
            }
            // `evict` takes it off the list.
            self.evict(self.page_va(idx as usize), due)?;
        }
        Ok(())
    }

    /// First virtual address.
    pub fn va_base(&self) -> u64 {
        self.va_base
    }

    /// Pages in the range.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }

    /// The memory limit in pages.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Counters.
    pub fn stats(&self) -> &MemStats {
        &self.stats
    }

    /// Resident (mapped) pages now.
    pub fn resident_pages(&self) -> usize {
        self.resident
    }

    /// Frames in use now (resident and inactive).
    pub fn used_frames(&self) -> usize {
        self.used_frames
    }

    fn index(&self, va: u64) -> Option<usize> {
        let off = va.checked_sub(self.va_base)?;
        let idx = usize::try_from(off / PAGE).ok()?;
        (idx < self.pages.len()).then_some(idx)
    }

    /// The page-aligned address of page `index`.
    pub fn page_va(&self, index: usize) -> u64 {
        self.va_base + index as u64 * PAGE
    }

    /// Whether `va` lies in the range.
    pub fn contains(&self, va: u64) -> bool {
        self.index(va).is_some()
    }

    /// The state of the page holding `va`.
    pub fn state(&self, va: u64) -> Option<PageState> {
        Some(self.pages.get(self.index(va)?)?.state)
    }

    /// Whether the page holding `va` is mapped.
    pub fn is_resident(&self, va: u64) -> bool {
        matches!(self.state(va), Some(PageState::Resident { .. }))
    }

    /// Whether the page holding `va` is pinned.
    pub fn is_pinned(&self, va: u64) -> bool {
        self.index(va)
            .and_then(|i| self.pages.get(i))
            .is_some_and(|p| p.pinned)
    }

    /// The physical address of frame `frame`.
    pub fn frame_addr(&self, frame: u32) -> PhysAddr {
        PhysAddr::new(self.frames_base.as_u64() + u64::from(frame) * PAGE)
    }

    /// The resolver's estimate of a minor fault (what [`FaultResolver::estimate`] reports
    /// for one, as the policy sees it).
    pub fn estimate_minor(&self) -> smmu_driver::fault::FaultEstimate {
        smmu_driver::fault::FaultEstimate::Minor {
            expected_ns: self.minor_ns,
        }
    }

    /// What making the page resident would cost: `None` if it is resident already.
    pub fn fault_cost(&self, va: u64) -> Option<FaultCost> {
        match self.state(va)? {
            PageState::Resident { .. } => None,
            PageState::Fresh | PageState::Cached { .. } => Some(FaultCost::Minor),
            PageState::Swapped { .. } => Some(FaultCost::Major),
        }
    }

    /// Whether making the page holding `va` resident needs a free frame first.
    pub fn needs_frame(&self, va: u64) -> bool {
        matches!(
            self.state(va),
            Some(PageState::Fresh | PageState::Swapped { .. })
        )
    }

    /// Whether a frame can be taken without reclaiming (the limit is not reached).
    pub fn has_free_frame(&self) -> bool {
        self.used_frames < self.limit && !self.free_frames.is_empty()
    }

    /// Reserves the swap device for reading the page back at `now`; returns when the data
    /// is in memory. The caller calls [`make_resident`](Self::make_resident) at that time.
    pub fn reserve_swap_in(&mut self, now: ModelTime) -> ModelTime {
        self.swap.reserve(now)
    }

    /// Chooses what to reclaim so that a frame becomes free; `None` if nothing can be
    /// reclaimed (everything pinned).
    pub fn pick_victim(&mut self) -> Option<Victim> {
        if let Some(&(_, idx)) = self.inactive.first() {
            return Some(Victim::Cached(self.page_va(idx as usize)));
        }
        let n = self.pages.len();
        // Two sweeps: the first clears referenced bits, the second must find a page.
        for _ in 0..2 * n {
            let idx = self.clock_hand;
            self.clock_hand = (self.clock_hand + 1) % n.max(1);
            let Some(page) = self.pages.get_mut(idx) else {
                continue;
            };
            if page.pinned || !matches!(page.state, PageState::Resident { .. }) {
                continue;
            }
            if page.referenced {
                page.referenced = false;
                continue;
            }
            return Some(Victim::Resident(self.page_va(idx)));
        }
        None
    }

    /// Takes an inactive page off the reclaim path while a fault on it is being resolved (as
    /// Linux's fault handler holds the page lock, which reclaim skips): it is neither written
    /// back nor chosen as a victim, so the minor fault planned on it stays minor. Returns
    /// whether the page was inactive. [`make_resident`](Self::make_resident) ends the hold;
    /// [`release_hold`](Self::release_hold) gives the page back to reclaim if the resolution
    /// is dropped.
    pub fn hold_for_fault(&mut self, va: u64) -> bool {
        let Some(idx) = self.index(va) else {
            return false;
        };
        match self.pages.get(idx) {
            Some(p) if matches!(p.state, PageState::Cached { .. }) => {
                self.inactive.remove(&(p.deactivated_at, idx as u32))
            }
            _ => false,
        }
    }

    /// Gives a page [`hold_for_fault`](Self::hold_for_fault) held back to reclaim (the
    /// resolution was dropped); nothing if it is no longer inactive.
    pub fn release_hold(&mut self, va: u64) -> VqResult<()> {
        let Some(idx) = self.index(va) else {
            return Ok(());
        };
        if let Some(p) = self.pages.get(idx)
            && matches!(p.state, PageState::Cached { .. })
        {
            self.inactive.insert((p.deactivated_at, idx as u32));
        }
        // A page overdue for write-back goes now.
        self.set_now(self.now)
    }

    /// Ends the set-up that happens before model time starts: its swap writes leave the swap
    /// device free at time zero (they are not part of the run), and the counters start from
    /// the memory as set up (the peaks from what is resident and in use now).
    pub fn begin_run(&mut self) {
        self.swap.busy_until = ModelTime::ZERO;
        self.stats = MemStats {
            peak_frames: self.used_frames as u64,
            peak_resident: self.resident as u64,
            ..MemStats::default()
        };
    }

    /// Moves a resident page to the inactive list as of time `when` (at or before now; the
    /// caller unmapped it first). A page that would already have been written back by now is
    /// written back at once.
    pub fn deactivate_at(&mut self, va: u64, when: ModelTime) -> VqResult<()> {
        self.deactivate(va)?;
        let idx = self.index(va).ok_or_else(|| out_of_range(va))?;
        let when = when.min(self.now);
        if let Some(p) = self.pages.get_mut(idx) {
            self.inactive.remove(&(p.deactivated_at, idx as u32));
            p.deactivated_at = when;
            self.inactive.insert((when, idx as u32));
        }
        let due = when.after(self.swap.params.writeback_after);
        if due <= self.now {
            self.evict(va & !(PAGE - 1), due)?;
        }
        Ok(())
    }

    /// Moves a resident page to the inactive list (the caller unmapped it first).
    pub fn deactivate(&mut self, va: u64) -> VqResult<()> {
        let idx = self.index(va).ok_or_else(|| out_of_range(va))?;
        let page = self.pages.get_mut(idx).ok_or_else(|| out_of_range(va))?;
        match page.state {
            PageState::Resident { frame } if !page.pinned => {
                page.state = PageState::Cached { frame };
                page.referenced = false;
                page.deactivated_at = self.now;
                self.resident -= 1;
                self.inactive.insert((self.now, idx as u32));
                self.stats.deactivations += 1;
                Ok(())
            }
            _ => Err(SimError::Internal(format!(
                "deactivate of a page that is not resident and unpinned at {va:#x}"
            ))),
        }
    }

    /// Writes a reclaimed page to swap and frees its frame. A `Resident` victim must have
    /// been unmapped by the caller. The write occupies the swap device from `now`.
    pub fn evict(&mut self, va: u64, now: ModelTime) -> VqResult<()> {
        let idx = self.index(va).ok_or_else(|| out_of_range(va))?;
        let page = self
            .pages
            .get(idx)
            .copied()
            .ok_or_else(|| out_of_range(va))?;
        let frame = match page.state {
            PageState::Cached { frame } => {
                self.inactive.remove(&(page.deactivated_at, idx as u32));
                frame
            }
            PageState::Resident { frame } if !page.pinned => {
                self.resident -= 1;
                self.stats.clock_evictions += 1;
                frame
            }
            _ => {
                return Err(SimError::Internal(format!(
                    "evict of a page that holds no reclaimable frame at {va:#x}"
                )));
            }
        };
        let mut data = vec![0u8; PAGE as usize].into_boxed_slice();
        self.dram.read_phys(self.frame_addr(frame), &mut data)?;
        let _ = self.swap.reserve(now);
        let slot = self.swap.store(data);
        self.release_frame(frame);
        if let Some(p) = self.pages.get_mut(idx) {
            p.state = PageState::Swapped { slot };
            p.referenced = false;
        }
        self.stats.swap_outs += 1;
        Ok(())
    }

    fn release_frame(&mut self, frame: u32) {
        if let Some(owner) = self.frame_owner.get_mut(frame as usize) {
            *owner = NO_PAGE;
        }
        self.free_frames.push(frame);
        self.used_frames -= 1;
    }

    fn take_frame(&mut self, idx: usize, allow_over_limit: bool) -> VqResult<u32> {
        if self.used_frames >= self.limit && !allow_over_limit {
            return Err(SimError::Internal("frame taken at the memory limit".into()));
        }
        let frame = self.free_frames.pop().ok_or_else(|| {
            SimError::OutOfMemory(format!(
                "all {} frames of the node are in use",
                self.frame_owner.len()
            ))
        })?;
        if let Some(owner) = self.frame_owner.get_mut(frame as usize) {
            *owner = idx as u32;
        }
        self.used_frames += 1;
        self.stats.peak_frames = self.stats.peak_frames.max(self.used_frames as u64);
        Ok(frame)
    }

    /// Makes the page holding `va` resident and returns its frame address and what it cost.
    /// For `Fresh` and `Swapped` pages a frame must be free ([`has_free_frame`]), unless
    /// `pinning` (pinned pages may exceed the limit).
    ///
    /// [`has_free_frame`]: Self::has_free_frame
    pub fn make_resident(&mut self, va: u64, pinning: bool) -> VqResult<(PhysAddr, FaultCost)> {
        let idx = self.index(va).ok_or_else(|| out_of_range(va))?;
        let page = self
            .pages
            .get(idx)
            .copied()
            .ok_or_else(|| out_of_range(va))?;
        let (frame, cost) = match page.state {
            PageState::Resident { frame } => (frame, FaultCost::Minor),
            PageState::Cached { frame } => {
                self.inactive.remove(&(page.deactivated_at, idx as u32));
                self.stats.reactivations += 1;
                (frame, FaultCost::Minor)
            }
            PageState::Fresh => {
                let frame = self.take_frame(idx, pinning)?;
                self.dram
                    .write_phys(self.frame_addr(frame), &[0u8; PAGE as usize])?;
                self.stats.zero_fills += 1;
                (frame, FaultCost::Minor)
            }
            PageState::Swapped { slot } => {
                let frame = self.take_frame(idx, pinning)?;
                let data = self
                    .swap
                    .take(slot)
                    .ok_or_else(|| SimError::Internal(format!("swap slot {slot} is empty")))?;
                self.dram.write_phys(self.frame_addr(frame), &data)?;
                self.stats.swap_ins += 1;
                (frame, FaultCost::Major)
            }
        };
        if !matches!(page.state, PageState::Resident { .. }) {
            self.resident += 1;
            self.stats.peak_resident = self.stats.peak_resident.max(self.resident as u64);
        }
        if let Some(p) = self.pages.get_mut(idx) {
            p.state = PageState::Resident { frame };
            p.referenced = true;
            p.pinned |= pinning;
        }
        Ok((self.frame_addr(frame), cost))
    }

    /// Marks the page holding `va` as recently used (CLOCK's referenced bit).
    pub fn reference(&mut self, va: u64) {
        if let Some(p) = self.index(va).and_then(|i| self.pages.get_mut(i)) {
            p.referenced = true;
        }
    }

    /// Reads `out.len()` bytes at `va` wherever the data is (frame or swap), without
    /// changing any state: the harness's view for verification, not a modelled access.
    pub fn peek(&self, va: u64, out: &mut [u8]) -> VqResult<()> {
        let mut done = 0;
        while done < out.len() {
            let at = va + done as u64;
            let idx = self.index(at).ok_or_else(|| out_of_range(at))?;
            let off = (at % PAGE) as usize;
            let n = (PAGE as usize - off).min(out.len() - done);
            let chunk = out
                .get_mut(done..done + n)
                .ok_or_else(|| SimError::Internal("peek bounds".into()))?;
            match self.pages.get(idx).map(|p| p.state) {
                Some(PageState::Resident { frame } | PageState::Cached { frame }) => {
                    self.dram.read_phys(
                        PhysAddr::new(self.frame_addr(frame).as_u64() + off as u64),
                        chunk,
                    )?;
                }
                Some(PageState::Swapped { slot }) => {
                    let data = self
                        .swap
                        .peek(slot)
                        .ok_or_else(|| SimError::Internal(format!("swap slot {slot} is empty")))?;
                    chunk.copy_from_slice(data.get(off..off + n).unwrap_or(&[]));
                }
                Some(PageState::Fresh) | None => chunk.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `va` into resident pages (the CPU's store after its own fault
    /// handling made them resident).
    pub fn write_resident(&mut self, va: u64, data: &[u8]) -> VqResult<()> {
        let mut done = 0;
        while done < data.len() {
            let at = va + done as u64;
            let off = (at % PAGE) as usize;
            let n = (PAGE as usize - off).min(data.len() - done);
            let Some(PageState::Resident { frame }) = self.state(at) else {
                return Err(SimError::Internal(format!(
                    "CPU store to a non-resident page {at:#x}"
                )));
            };
            let chunk = data
                .get(done..done + n)
                .ok_or_else(|| SimError::Internal("write bounds".into()))?;
            self.dram.write_phys(
                PhysAddr::new(self.frame_addr(frame).as_u64() + off as u64),
                chunk,
            )?;
            self.reference(at);
            done += n;
        }
        Ok(())
    }
}

fn out_of_range(va: u64) -> SimError {
    SimError::Internal(format!(
        "address {va:#x} outside the node's registered memory"
    ))
}

/// The memory manager's side of the SMMU fault path: `FaultResolver` over the node memory.
/// `resolve` never reclaims (the caller frees a frame first, because reclaiming needs the page
/// table that the fault handler holds during `fix`).
impl FaultResolver for NodeMemory {
    fn region(&self, stream: StreamId, iova: Iova) -> Option<RegisteredRegion> {
        (self.streams.contains(&stream) && self.contains(iova.as_u64())).then(|| RegisteredRegion {
            stream,
            start: Iova::new(self.va_base),
            len: self.pages.len() as u64 * PAGE,
            writable: true,
        })
    }

    fn estimate(&self, _stream: StreamId, iova: Iova, _access: AccessKind) -> ResolveEstimate {
        match self.fault_cost(iova.as_u64()) {
            Some(FaultCost::Major) => ResolveEstimate::Major,
            _ => ResolveEstimate::Minor {
                expected_ns: self.minor_ns,
            },
        }
    }

    fn resolve(
        &mut self,
        stream: StreamId,
        iova: Iova,
        _access: AccessKind,
    ) -> Result<ResolvedPage, ResolveError> {
        if !self.streams.contains(&stream) {
            return Err(ResolveError(1));
        }
        let (frame, cost) = self
            .make_resident(iova.as_u64(), false)
            .map_err(|_| ResolveError(2))?;
        Ok(ResolvedPage {
            frame,
            size: PageSize::Size4K,
            attributes: Attributes::normal(Permissions::READ_WRITE),
            cost,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(frames: usize, pages: usize, limit: usize) -> NodeMemory {
        let dram = Arc::new(HostDma::new(PhysAddr::new(0x8000_0000), frames).unwrap());
        NodeMemory::new(
            dram,
            PhysAddr::new(0x8000_0000),
            frames,
            0x10_0000,
            pages,
            limit,
            SwapParams::default(),
            [StreamId(1), StreamId(2)],
            4_600,
        )
        .unwrap()
    }

    #[test]
    fn pages_go_fresh_resident_cached_swapped_and_back_with_their_data() {
        let mut m = memory(4, 8, 2);
        let va = 0x10_0000;
        assert_eq!(m.fault_cost(va), Some(FaultCost::Minor));
        let (_, cost) = m.make_resident(va, false).unwrap();
        assert_eq!(cost, FaultCost::Minor);
        m.write_resident(va + 10, b"hello").unwrap();
        m.deactivate(va).unwrap();
        assert_eq!(m.fault_cost(va), Some(FaultCost::Minor));
        assert_eq!(m.used_frames(), 1, "an inactive page keeps its frame");
        // Reactivating a cached page is minor and keeps the data.
        m.make_resident(va, false).unwrap();
        m.deactivate(va).unwrap();
        // Under pressure the inactive page is the victim and goes to swap.
        assert_eq!(m.pick_victim(), Some(Victim::Cached(va)));
        m.evict(va, ModelTime::ZERO).unwrap();
        assert_eq!(m.fault_cost(va), Some(FaultCost::Major));
        let mut out = [0u8; 5];
        m.peek(va + 10, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        let (_, cost) = m.make_resident(va, false).unwrap();
        assert_eq!(cost, FaultCost::Major);
        m.peek(va + 10, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert_eq!(m.stats().swap_outs, 1);
        assert_eq!(m.stats().swap_ins, 1);
    }

    fn us(x: u64) -> ModelTime {
        ModelTime::from_ns(x * 1000)
    }

    #[test]
    fn a_back_dated_page_is_written_back_when_its_own_age_is_reached() {
        let mut m = memory(8, 8, 8);
        let (a, b) = (0x10_0000, 0x10_0000 + PAGE);
        m.make_resident(a, false).unwrap();
        m.make_resident(b, false).unwrap();
        m.set_now(us(100)).unwrap();
        m.deactivate(a).unwrap(); // written back at 300 us
        m.deactivate_at(b, us(50)).unwrap(); // at 250 us, though deactivated after a
        assert_eq!(m.pick_victim(), Some(Victim::Cached(b)), "the oldest first");
        m.set_now(us(260)).unwrap();
        assert!(matches!(m.state(b), Some(PageState::Swapped { .. })));
        assert!(matches!(m.state(a), Some(PageState::Cached { .. })));
        m.set_now(us(300)).unwrap();
        assert!(matches!(m.state(a), Some(PageState::Swapped { .. })));
        assert_eq!(m.stats().swap_outs, 2);
    }

    #[test]
    fn a_page_reactivated_and_deactivated_again_ages_from_its_last_deactivation() {
        let mut m = memory(8, 8, 8);
        let (a, b) = (0x10_0000, 0x10_0000 + PAGE);
        m.make_resident(a, false).unwrap();
        m.make_resident(b, false).unwrap();
        m.deactivate(a).unwrap();
        m.set_now(us(10)).unwrap();
        m.deactivate(b).unwrap(); // written back at 210 us
        m.set_now(us(30)).unwrap();
        m.make_resident(a, false).unwrap(); // back before its write-back
        m.deactivate(a).unwrap(); // written back at 230 us
        m.set_now(us(215)).unwrap();
        assert!(matches!(m.state(b), Some(PageState::Swapped { .. })));
        assert!(matches!(m.state(a), Some(PageState::Cached { .. })));
        assert_eq!(m.pick_victim(), Some(Victim::Cached(a)));
        m.set_now(us(230)).unwrap();
        assert!(matches!(m.state(a), Some(PageState::Swapped { .. })));
        assert_eq!(
            m.pick_victim(),
            None,
            "nothing inactive or resident is left"
        );
        assert_eq!(m.stats().swap_outs, 2, "each page written back once");
    }

    #[test]
    fn a_page_held_for_its_fault_is_not_written_back_until_released() {
        let mut m = memory(8, 8, 8);
        let (a, b) = (0x10_0000, 0x10_0000 + PAGE);
        m.make_resident(a, false).unwrap();
        m.make_resident(b, false).unwrap();
        m.deactivate(a).unwrap();
        m.deactivate(b).unwrap();
        assert!(m.hold_for_fault(a));
        assert!(
            !m.hold_for_fault(0x10_0000 + 2 * PAGE),
            "a fresh page is not inactive"
        );
        assert_eq!(
            m.pick_victim(),
            Some(Victim::Cached(b)),
            "a held page is no victim"
        );
        m.set_now(us(300)).unwrap();
        assert!(
            matches!(m.state(a), Some(PageState::Cached { .. })),
            "still minor"
        );
        assert!(matches!(m.state(b), Some(PageState::Swapped { .. })));
        // The resolution completes: a minor fault, no swap read.
        assert_eq!(m.make_resident(a, false).unwrap().1, FaultCost::Minor);
        // A dropped resolution gives the page back to reclaim, overdue: written back at once.
        m.deactivate_at(a, us(300)).unwrap();
        assert!(m.hold_for_fault(a));
        m.set_now(us(600)).unwrap();
        assert!(matches!(m.state(a), Some(PageState::Cached { .. })));
        m.release_hold(a).unwrap();
        assert!(matches!(m.state(a), Some(PageState::Swapped { .. })));
    }

    #[test]
    fn the_run_starts_with_an_idle_swap_device_and_fresh_counters() {
        let mut m = memory(8, 8, 2);
        for p in 0..4 {
            let va = 0x10_0000 + p * PAGE;
            while !m.has_free_frame() {
                let Some(Victim::Resident(victim) | Victim::Cached(victim)) = m.pick_victim()
                else {
                    panic!("nothing to reclaim");
                };
                m.evict(victim, ModelTime::ZERO).unwrap();
            }
            m.make_resident(va, false).unwrap();
        }
        assert_eq!(m.stats().swap_outs, 2);
        m.begin_run();
        assert_eq!(m.stats().swap_outs, 0);
        assert_eq!(m.stats().peak_resident, 2);
        // A swap read at time zero waits for nothing set-up wrote.
        let ready = m.reserve_swap_in(ModelTime::ZERO);
        let alone = SwapParams::default();
        assert_eq!(
            ready,
            ModelTime::transfer(PAGE, alone.bandwidth_bps).after(alone.latency)
        );
    }

    #[test]
    fn clock_spares_referenced_and_pinned_pages() {
        let mut m = memory(4, 8, 3);
        let a = 0x10_0000;
        let b = a + PAGE;
        let c = a + 2 * PAGE;
        m.make_resident(a, true).unwrap(); // pinned
        m.make_resident(b, false).unwrap();
        m.make_resident(c, false).unwrap();
        assert!(!m.has_free_frame(), "limit of 3 frames reached");
        // b and c are referenced: the first sweep clears, the second picks b.
        assert_eq!(m.pick_victim(), Some(Victim::Resident(b)));
        m.reference(c);
        m.evict(b, ModelTime::ZERO).unwrap();
        assert!(m.has_free_frame());
        assert!(m.is_pinned(a));
        assert!(m.deactivate(a).is_err(), "pinned pages are never reclaimed");
    }

    #[test]
    fn swap_requests_queue_behind_each_other() {
        let mut m = memory(2, 2, 2);
        // One page takes 4096 B / 2 GB/s = 2.048 µs of device time plus 50 µs latency.
        let first = m.reserve_swap_in(ModelTime::ZERO);
        assert_eq!(first, ModelTime::from_ns(2_048 + 50_000));
        let second = m.reserve_swap_in(ModelTime::ZERO);
        assert_eq!(second, ModelTime::from_ns(2 * 2_048 + 50_000));
    }
}
