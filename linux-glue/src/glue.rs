//! [`Glue`]: registration, page state, fault-in, invalidation events and the reclaim scan.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hal::{AlignedRange, PageSize, PhysAddr, VirtAddr};

use crate::classify;
use crate::faultin::{self, FaultInMethod};
use crate::pagemap::{self, PageState, PagemapEntry, PagemapReader, StateSource};
use crate::registry::{self, Access, Invalidate, RangeSet, RegionId, Registry};
use crate::resolver::{FaultKind, Resolver};
use crate::sys::{self, FaultCounters, HUGE_2M, PAGE, PAGE_SHIFT};
use crate::uffd::{Uffd, UffdEvent};
use crate::vma::{self, Backing, ThpMode, VmaInfo};
use crate::{GlueError, Result};

/// Where VMAs are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmaSource {
    /// PROCMAP_QUERY when the kernel has it (6.11+), the maps text otherwise.
    Auto,
    /// Always parse /proc/self/maps.
    MapsText,
}

/// Which interface answers page-state queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatePreference {
    /// pagemap (plus kpageflags/PAGEMAP_SCAN) when readable, mincore otherwise.
    Auto,
    /// Always mincore (residency only).
    Mincore,
}

/// Configuration of a [`Glue`].
#[derive(Clone, Debug)]
pub struct GlueConfig {
    /// Where VMAs come from.
    pub vma_source: VmaSource,
    /// Read /proc/self/smaps at registration for `THPeligible`, VmFlags and KernelPageSize,
    /// where it is needed: always when the VMAs come from the maps text, and with
    /// PROCMAP_QUERY (which already gives the page size) only for a range holding a file
    /// mapping of 4 KiB pages (which may be a device mapping, `VM_IO`/`VM_PFNMAP`, that
    /// registration refuses); ranges of anonymous, shmem and hugetlb memory skip it.
    pub read_smaps: bool,
    /// Which interface answers page-state queries.
    pub state_source: StatePreference,
    /// How pages are faulted in.
    pub fault_in: FaultInMethod,
    /// Start the userfaultfd monitor (REMOVE/UNMAP/REMAP events).
    pub invalidation_events: bool,
    /// Fail registration of memory the monitor cannot watch (regular file mappings, or when
    /// userfaultfd is unavailable) instead of registering it with the reclaim scan as the only
    /// source of invalidations.
    pub require_events: bool,
    /// Run the reclaim scan every `scan_interval` on the monitor thread.
    pub scan_interval: Option<Duration>,
    /// Resolve device reads of private writable memory by faulting for write, so the frame
    /// handed out cannot be replaced by a later copy-on-write (which userfaultfd does not
    /// report). With `false`, a read of untouched anonymous memory maps the shared zero page.
    pub stable_frames: bool,
}

impl Default for GlueConfig {
    fn default() -> Self {
        Self {
            vma_source: VmaSource::Auto,
            read_smaps: true,
            state_source: StatePreference::Auto,
            fault_in: FaultInMethod::Auto,
            invalidation_events: true,
            require_events: false,
            scan_interval: None,
            stable_frames: true,
        }
    }
}

/// What this kernel and process allow, probed once by [`Glue::with_callback`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// A userfaultfd context with REMOVE/UNMAP/REMAP events is open.
    pub userfaultfd: bool,
    /// PROCMAP_QUERY works (6.11+).
    pub procmap_query: bool,
    /// /proc/self/pagemap is readable.
    pub pagemap: bool,
    /// PAGEMAP_SCAN works (6.7+).
    pub pagemap_scan: bool,
    /// pagemap shows PFNs (CAP_SYS_ADMIN).
    pub pfn_visible: bool,
    /// /proc/kpageflags is readable (root).
    pub kpageflags: bool,
    /// MADV_POPULATE_READ/WRITE work (5.14+).
    pub populate: bool,
    /// The system THP mode.
    pub thp_mode: ThpMode,
}

/// A snapshot of one registered region.
#[derive(Clone, Debug)]
pub struct RegionInfo {
    /// Its id.
    pub id: RegionId,
    /// The registered range.
    pub range: AlignedRange<VirtAddr>,
    /// The access registered.
    pub access: Access,
    /// The VMAs at registration, clipped to the range.
    pub vmas: Vec<VmaInfo>,
    /// Parts still mapped at the registered addresses.
    pub live: Vec<(VirtAddr, VirtAddr)>,
    /// Parts watched by the userfaultfd monitor.
    pub monitored: Vec<(VirtAddr, VirtAddr)>,
    /// Pages handed out (resolved or faulted in) and not invalidated since.
    pub tracked_pages: u64,
    /// Bytes of the sparse table that tracks them (4 KiB per 2 MiB of the region holding a
    /// tracked page; nothing for untouched parts).
    pub tracked_table_bytes: u64,
}

/// Outcome of [`Glue::fault_in`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultInReport {
    /// The range faulted in.
    pub range: AlignedRange<VirtAddr>,
    /// Minor faults taken (this thread's `ru_minflt` delta).
    pub minor_faults: u64,
    /// Major faults taken (this thread's `ru_majflt` delta): the page had to be read from
    /// a file or swap device.
    pub major_faults: u64,
    /// Pages present afterwards.
    pub pages_present: u64,
    /// 2 MiB blocks of the range mapped by one PMD afterwards.
    pub huge_blocks: u64,
    /// How the pages were faulted in.
    pub method: FaultInMethod,
}

/// Counters of the monitor and scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlueStats {
    /// userfaultfd messages read.
    pub uffd_events: u64,
    /// Invalidations delivered (from either source).
    pub invalidations: u64,
    /// Page faults delivered to the monitor (none are expected; each was released at once).
    pub unexpected_faults: u64,
    /// Malformed userfaultfd messages.
    pub malformed: u64,
    /// Reclaim scans run.
    pub scans: u64,
    /// Registrations that read /proc/self/smaps (see [`GlueConfig::read_smaps`]).
    pub smaps_reads: u64,
}

#[derive(Default)]
struct Counters {
    uffd_events: AtomicU64,
    invalidations: AtomicU64,
    unexpected_faults: AtomicU64,
    malformed: AtomicU64,
    scans: AtomicU64,
    smaps_reads: AtomicU64,
}

/// The callback that receives invalidations.
pub(crate) type Sink = Box<dyn Fn(Invalidate) + Send + Sync>;

/// State shared by the [`Glue`], its [`Resolver`]s and the monitor thread. The userfaultfd is
/// deliberately not in here: it must close when the `Glue` drops even if resolvers live on,
/// or threads unmapping registered memory would wait forever for a reader.
pub(crate) struct Inner {
    pub(crate) config: GlueConfig,
    pub(crate) caps: Capabilities,
    registry: Mutex<Registry>,
    pub(crate) pagemap: Option<PagemapReader>,
    maps: Option<File>,
    sink: Sink,
    counters: Counters,
}

/// Registration without pinning, page state, fault-in and invalidations on the real Linux mm.
///
/// One `Glue` per process (or per independent user) is the intended use; each owns a
/// userfaultfd context and a monitor thread. Dropping it stops the monitor and closes the
/// context, which unregisters every range from userfaultfd.
pub struct Glue {
    inner: Arc<Inner>,
    uffd: Option<Arc<Uffd>>,
    monitor: Option<(JoinHandle<()>, OwnedFd)>,
}

impl std::fmt::Debug for Glue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Glue")
            .field("caps", &self.inner.caps)
            .finish_non_exhaustive()
    }
}

impl Glue {
    /// Opens the glue with invalidations delivered on a channel.
    pub fn new(config: GlueConfig) -> Result<(Self, Receiver<Invalidate>)> {
        let (tx, rx) = mpsc::channel();
        let glue = Self::with_callback(config, move |inv| {
            let _ = tx.send(inv);
        })?;
        Ok((glue, rx))
    }

    /// Opens the glue with invalidations delivered to `callback` (called on the monitor thread,
    /// or on the thread calling [`Glue::scan_for_reclaim`]; it must not block for long: threads
    /// unmapping registered memory wait until the monitor has read their event).
    pub fn with_callback(
        config: GlueConfig,
        callback: impl Fn(Invalidate) + Send + Sync + 'static,
    ) -> Result<Self> {
        if sys::system_page_size() != PAGE {
            return Err(GlueError::Unavailable {
                feature: "linux-glue",
                why: format!(
                    "base page size is {} bytes; only 4 KiB is supported",
                    sys::system_page_size()
                ),
            });
        }
        let pagemap = PagemapReader::open().ok();
        let maps = File::open("/proc/self/maps").ok();
        let procmap_query = maps.as_ref().is_some_and(|m| {
            let probe = 0u64;
            vma::procmap_query(m, &probe as *const u64 as u64).is_ok()
        });
        let pfn_visible = pagemap.as_ref().is_some_and(|p| {
            let probe = 0u64;
            let addr = &probe as *const u64 as u64;
            p.entries(addr, 1)
                .ok()
                .and_then(|e| e.first().and_then(|e| e.pfn()))
                .is_some()
        });
        let uffd = if config.invalidation_events {
            match Uffd::open() {
                Ok(u) => Some(Arc::new(u)),
                Err(e) if config.require_events => return Err(e),
                Err(_) => None,
            }
        } else {
            None
        };
        let caps = Capabilities {
            userfaultfd: uffd.is_some(),
            procmap_query,
            pagemap: pagemap.is_some(),
            pagemap_scan: pagemap.as_ref().is_some_and(|p| p.has_scan()),
            pfn_visible,
            kpageflags: pagemap.as_ref().is_some_and(|p| p.has_kpageflags()),
            populate: faultin::populate_supported(),
            thp_mode: vma::thp_mode(),
        };
        let inner = Arc::new(Inner {
            config,
            caps,
            registry: Mutex::new(Registry::default()),
            pagemap,
            maps,
            sink: Box::new(callback),
            counters: Counters::default(),
        });
        let monitor = if uffd.is_some() || inner.config.scan_interval.is_some() {
            let stop = sys::eventfd()?;
            let stop_fd = stop.as_raw_fd();
            let inner2 = Arc::clone(&inner);
            let uffd2 = uffd.clone();
            let handle = std::thread::Builder::new()
                .name("linux-glue-monitor".into())
                .spawn(move || monitor_loop(inner2, uffd2, stop_fd))
                .map_err(|e| GlueError::Os {
                    op: "spawn monitor thread",
                    errno: e.raw_os_error().unwrap_or(0),
                })?;
            Some((handle, stop))
        } else {
            None
        };
        Ok(Self {
            inner,
            uffd,
            monitor,
        })
    }

    /// What this kernel and process allow.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// Monitor and scan counters.
    pub fn stats(&self) -> GlueStats {
        self.inner.stats()
    }

    /// A resolver sharing this glue's registry (cheap to clone, usable from any thread).
    pub fn resolver(&self) -> Resolver {
        Resolver::new(Arc::clone(&self.inner))
    }

    /// Registers `[addr, addr + len)` for device `access` without pinning.
    ///
    /// Validates the range against the process's mappings and records the VMAs and their
    /// properties. Touches no page: the cost is O(VMAs in the range) (one PROCMAP_QUERY ioctl
    /// or maps line per VMA, the smaps entries up to the range where they are needed, see
    /// [`GlueConfig::read_smaps`], and one UFFDIO_REGISTER per anonymous/shmem VMA).
    pub fn register(&self, addr: VirtAddr, len: u64, access: Access) -> Result<RegionId> {
        let range = AlignedRange::new(addr, len, PageSize::Size4K)?;
        let (start, end) = (range.start().as_u64(), range.end().as_u64());
        let vmas = self.inner.vmas_in(start, end)?;
        validate_coverage(&vmas, start, end, access)?;

        let mut reg = self.inner.lock();
        reg.check_free(start, end)?;
        let mut monitored = RangeSet::default();
        if let Some(uffd) = &self.uffd {
            for v in &vmas {
                if !matches!(v.backing, Backing::Anonymous | Backing::Shmem) && !v.hugetlb() {
                    continue;
                }
                let (s, e) = (v.start.as_u64(), v.end.as_u64());
                match uffd.register_wp(s, e - s) {
                    Ok(()) => monitored.insert(s, e),
                    // The VMA type cannot be registered (EINVAL) or another context owns it
                    // (EBUSY): the reclaim scan is the only source for it.
                    Err(e) if e == libc::EINVAL || e == libc::EBUSY => {}
                    Err(e) => {
                        for (s, e) in monitored.iter() {
                            let _ = uffd.unregister(s, e - s);
                        }
                        return Err(if e == libc::ENOMEM {
                            GlueError::Unmapped { addr: s }
                        } else {
                            GlueError::Os {
                                op: "UFFDIO_REGISTER",
                                errno: e,
                            }
                        });
                    }
                }
            }
        }
        if self.inner.config.require_events
            && let Some(v) = vmas.iter().find(|v| !monitored.contains(v.start.as_u64()))
        {
            if let Some(uffd) = &self.uffd {
                for (s, e) in monitored.iter() {
                    let _ = uffd.unregister(s, e - s);
                }
            }
            return Err(GlueError::Unavailable {
                feature: "userfaultfd events for this mapping",
                why: format!(
                    "{:?} mapping at {:#x} cannot be registered with userfaultfd",
                    v.backing, v.start
                ),
            });
        }
        reg.insert(range, access, vmas, monitored)
    }

    /// Deregisters a region: forgets it and unregisters its monitored parts from userfaultfd.
    /// Touches no page. Parts already unmapped are skipped.
    pub fn deregister(&self, id: RegionId) -> Result<()> {
        let mut reg = self.inner.lock();
        let region = reg.remove(id)?;
        if let Some(uffd) = &self.uffd {
            for (s, e) in region.uffd.iter() {
                // ENOMEM/EINVAL: the VMA went away in the meantime; nothing to undo.
                let _ = uffd.unregister(s, e - s);
            }
        }
        Ok(())
    }

    /// A snapshot of a region.
    pub fn region(&self, id: RegionId) -> Result<RegionInfo> {
        let reg = self.inner.lock();
        let r = reg.get(id)?;
        let pairs = |s: &RangeSet| {
            s.iter()
                .map(|(a, b)| (VirtAddr::new(a), VirtAddr::new(b)))
                .collect()
        };
        Ok(RegionInfo {
            id: r.id,
            range: r.range,
            access: r.access,
            vmas: r.vmas.clone(),
            live: pairs(&r.live),
            monitored: pairs(&r.uffd),
            tracked_pages: r.tracked.count(),
            tracked_table_bytes: r.tracked.allocated_bytes(),
        })
    }

    /// The state of every 4 KiB page of `range` (registered or not), in one batch.
    pub fn page_states(&self, range: AlignedRange<VirtAddr>) -> Result<Vec<PageState>> {
        self.inner.page_states(range)
    }

    /// Faults in `range` (touch-ahead) for `access`; it must lie in one registered region.
    pub fn fault_in(&self, range: AlignedRange<VirtAddr>, access: Access) -> Result<FaultInReport> {
        self.inner.fault_in(range, access)
    }

    /// Compares the pages handed out (by resolve or fault-in) with what pagemap shows now and
    /// delivers an invalidation for each page that was swapped out, dropped (or unmapped) or
    /// moved to another frame. This is how reclaim is noticed: the kernel tells user space
    /// nothing about it. If part of the state cannot be read, the rest is still scanned and
    /// what was found is delivered to the sink before the first error is returned.
    pub fn scan_for_reclaim(&self) -> Result<Vec<Invalidate>> {
        self.inner.scan_for_reclaim()
    }
}

impl Drop for Glue {
    fn drop(&mut self) {
        if let Some((handle, stop)) = self.monitor.take() {
            sys::eventfd_signal(&stop);
            let _ = handle.join();
        }
        // Closing the context (the last Arc) unregisters every range and releases any thread
        // still waiting for an event to be read (fs/userfaultfd.c, userfaultfd_release).
        self.uffd.take();
    }
}

/// Checks that the VMAs cover `[start, end)` without holes and allow `access`.
/// Whether VMAs that PROCMAP_QUERY described still need smaps: a file mapping of 4 KiB pages
/// may be a device mapping (`VM_IO`/`VM_PFNMAP`, only smaps' VmFlags say so). Anonymous and
/// shmem memory cannot be, and hugetlb's page size came with the query; their THP
/// eligibility stays unknown (resolution then checks each 2 MiB block).
fn smaps_needed(vmas: &[VmaInfo]) -> bool {
    vmas.iter().any(|v| {
        !matches!(v.backing, Backing::Anonymous | Backing::Shmem) && v.page_size == PageSize::Size4K
    })
}

/// `(start, end, an absent page is filled without I/O, shared)` of a VMA, for
/// [`Inner::predict_faults`]: private anonymous memory is zero-filled, and hugetlb pages come
/// from the huge page pool (they are never swapped, mm/hugetlb.c).
pub(crate) fn vma_kind(v: &VmaInfo) -> (u64, u64, bool, bool) {
    (
        v.start.as_u64(),
        v.end.as_u64(),
        (v.backing == Backing::Anonymous && !v.shared) || v.hugetlb(),
        v.shared,
    )
}

fn validate_coverage(vmas: &[VmaInfo], start: u64, end: u64, access: Access) -> Result<()> {
    let mut cur = start;
    for v in vmas {
        let (s, e) = (v.start.as_u64(), v.end.as_u64());
        if s > cur {
            return Err(GlueError::Unmapped { addr: cur });
        }
        let at = s.max(start);
        if v.backing == Backing::Special {
            return Err(GlueError::UnsupportedMapping {
                addr: at,
                reason: "special mapping (vDSO/vvar, VM_IO or VM_PFNMAP)",
            });
        }
        if !v.readable {
            return Err(GlueError::NotReadable { addr: at });
        }
        if access == Access::Write && !v.writable {
            return Err(GlueError::NotWritable { addr: at });
        }
        let huge = v.page_size.bytes();
        if huge > PAGE && (at % huge != 0 || e.min(end) % huge != 0) {
            return Err(GlueError::Misaligned {
                value: at,
                align: huge,
            });
        }
        cur = e;
        if cur >= end {
            return Ok(());
        }
    }
    Err(GlueError::Unmapped { addr: cur })
}

/// Whether `vmas` (sorted, as `vmas_in` gives them) map all of `[start, end)` so that a CPU
/// access of kind `access` cannot fault for a missing or forbidding VMA.
fn check_touchable(vmas: &[VmaInfo], start: u64, end: u64, access: Access) -> Result<()> {
    let mut cur = start;
    for v in vmas {
        let (s, e) = (v.start.as_u64(), v.end.as_u64());
        if e <= cur {
            continue;
        }
        if s > cur {
            break;
        }
        if v.backing == Backing::Special {
            return Err(GlueError::UnsupportedMapping {
                addr: cur,
                reason: "special mapping (vDSO/vvar, VM_IO or VM_PFNMAP)",
            });
        }
        if !v.readable {
            return Err(GlueError::NotReadable { addr: cur });
        }
        if access == Access::Write && !v.writable {
            return Err(GlueError::NotWritable { addr: cur });
        }
        cur = e;
        if cur >= end {
            return Ok(());
        }
    }
    Err(GlueError::Unmapped { addr: cur })
}

impl Inner {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding the lock leaves consistent bookkeeping (updates are applied
        // in place, never half-way through a multi-step change), so poisoning is ignored.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stats(&self) -> GlueStats {
        let c = &self.counters;
        GlueStats {
            uffd_events: c.uffd_events.load(Ordering::Relaxed),
            invalidations: c.invalidations.load(Ordering::Relaxed),
            unexpected_faults: c.unexpected_faults.load(Ordering::Relaxed),
            malformed: c.malformed.load(Ordering::Relaxed),
            scans: c.scans.load(Ordering::Relaxed),
            smaps_reads: c.smaps_reads.load(Ordering::Relaxed),
        }
    }

    fn deliver(&self, invs: &[Invalidate]) {
        for inv in invs {
            self.counters.invalidations.fetch_add(1, Ordering::Relaxed);
            (self.sink)(*inv);
        }
    }

    /// The VMAs overlapping `[start, end)`, clipped to it, with smaps properties if enabled.
    fn vmas_in(&self, start: u64, end: u64) -> Result<Vec<VmaInfo>> {
        let queried = match (&self.maps, self.caps.procmap_query, self.config.vma_source) {
            (Some(maps), true, VmaSource::Auto) => vma::query_in_range(maps, start, end).ok(),
            _ => None,
        };
        let from_query = queried.is_some();
        let mut vmas = match queried {
            Some(v) => v,
            None => vma::maps_in_range(start, end)?,
        };
        vma::clip(&mut vmas, start, end);
        if self.config.read_smaps && (!from_query || smaps_needed(&vmas)) {
            self.counters.smaps_reads.fetch_add(1, Ordering::Relaxed);
            if let Ok(smaps) = vma::smaps_in_range(start, end) {
                vma::apply_smaps(&mut vmas, &smaps);
            }
        }
        Ok(vmas)
    }

    /// pagemap entries, or presence-only entries from mincore.
    pub(crate) fn entries(
        &self,
        addr: u64,
        count: u64,
    ) -> Result<(Vec<PagemapEntry>, StateSource)> {
        match (&self.pagemap, self.config.state_source) {
            (Some(p), StatePreference::Auto) => Ok((p.entries(addr, count)?, StateSource::Pagemap)),
            _ => {
                let present = pagemap::mincore(addr, count)?;
                let e = present
                    .into_iter()
                    .map(|p| PagemapEntry(if p { 1 << 63 } else { 0 }))
                    .collect();
                Ok((e, StateSource::Mincore))
            }
        }
    }

    fn page_states(&self, range: AlignedRange<VirtAddr>) -> Result<Vec<PageState>> {
        let (start, count) = (range.start().as_u64(), range.page_count());
        let (entries, source) = self.entries(start, count)?;
        let huge_runs = match (&self.pagemap, source) {
            (Some(p), StateSource::Pagemap) if p.has_scan() => {
                p.scan_ranges(start, range.end().as_u64(), pagemap::PAGE_IS_HUGE)?
            }
            _ => Vec::new(),
        };
        let flags = match (&self.pagemap, source) {
            (Some(p), StateSource::Pagemap) => p.kpageflags_of(&entries),
            _ => vec![None; entries.len()],
        };
        let mut huge = pagemap::RunCursor::new(&huge_runs);
        let mut out = Vec::with_capacity(entries.len());
        for (i, (e, flags)) in entries.iter().zip(flags).enumerate() {
            let addr = start + ((i as u64) << PAGE_SHIFT);
            let in_huge_run = huge.contains(addr);
            out.push(PageState {
                addr: VirtAddr::new(addr),
                present: e.present(),
                swapped: e.swapped(),
                guard: e.guard(),
                frame: e.pfn().map(|p| PhysAddr::new(p << PAGE_SHIFT)),
                soft_dirty: e.soft_dirty(),
                exclusive: e.exclusive(),
                file_or_shared: e.file_or_shared(),
                huge: in_huge_run || (huge_runs.is_empty() && flags.is_some_and(|f| f.hugetlb())),
                thp: flags.is_some_and(|f| f.thp()),
                zero_page: flags.is_some_and(|f| f.zero_page()),
                source,
            });
        }
        Ok(out)
    }

    /// Faults in `[addr, addr + len)` with the configured method; returns the method and the
    /// faults the calling thread took doing it. The faults are counted around the touch or
    /// populate alone: the checks before it read `/proc/self/maps` into fresh heap memory,
    /// whose own first-touch faults are not the range's.
    pub(crate) fn fault_in_raw(
        &self,
        addr: u64,
        len: u64,
        access: Access,
        count: bool,
    ) -> Result<(FaultInMethod, FaultCounters)> {
        let method = match self.config.fault_in {
            FaultInMethod::Auto if self.caps.populate => FaultInMethod::Populate,
            FaultInMethod::Auto => FaultInMethod::Touch,
            m => m,
        };
        if method == FaultInMethod::Touch {
            // The registration's VMA snapshot may be stale (userfaultfd reports neither a
            // file mapping's munmap nor any mprotect), and touching memory that is not
            // there, or not writable, is a SIGSEGV rather than an error: check the live
            // VMAs now.
            let end = addr
                .checked_add(len)
                .ok_or(GlueError::Overflow { start: addr, len })?;
            check_touchable(&self.vmas_in(addr, end)?, addr, end, access)?;
            // Guard markers (MADV_GUARD_INSTALL, 6.13+) sit inside a VMA, so the VMAs do
            // not show them; pagemap does (bit 58), where the process can read it.
            if let Some(pagemap) = &self.pagemap {
                let entries = pagemap.entries(addr, len.div_ceil(PAGE))?;
                if let Some(i) = entries.iter().position(|e| e.guard()) {
                    return Err(GlueError::NotReadable {
                        addr: addr + i as u64 * PAGE,
                    });
                }
            }
        }
        let before = if count {
            FaultCounters::now()
        } else {
            FaultCounters::default()
        };
        if method == FaultInMethod::Touch {
            // SAFETY: the whole range was just found mapped, readable and (for `access`
            // Write) writable in the live VMAs; a concurrent munmap/mprotect by the
            // application, or a file mapping past its file's end, is the residual risk
            // documented on FaultInMethod::Touch.
            unsafe { faultin::touch(addr, len, access) };
        } else {
            faultin::populate(addr, len, access)?;
        }
        let faults = if count {
            FaultCounters::now().since(before)
        } else {
            FaultCounters::default()
        };
        Ok((method, faults))
    }

    /// The fault each page of `count` pages from `addr` will take for `access`, from its state
    /// now (crate::classify); `vmas` are `(start, end, private anonymous, shared)` covering
    /// the range. `None` where pagemap is not the state source: the caller then counts
    /// faults with getrusage.
    pub(crate) fn predict_faults(
        &self,
        addr: u64,
        count: u64,
        access: Access,
        vmas: &[(u64, u64, bool, bool)],
    ) -> Result<Option<Vec<FaultKind>>> {
        let Some(p) = &self.pagemap else {
            return Ok(None);
        };
        if self.config.state_source != StatePreference::Auto {
            return Ok(None);
        }
        let entries = p.entries(addr, count)?;
        let vma_of = |a: u64| {
            vmas.iter()
                .find(|v| v.0 <= a && a < v.1)
                .map_or((false, false), |v| (v.2, v.3))
        };
        let page_addr = |i: usize| addr + ((i as u64) << PAGE_SHIFT);
        let need = entries
            .iter()
            .enumerate()
            .any(|(i, e)| classify::needs_residency(*e, vma_of(page_addr(i)).0));
        let resident = if need {
            Some(pagemap::mincore(addr, count)?)
        } else {
            None
        };
        Ok(Some(
            entries
                .iter()
                .enumerate()
                .map(|(i, e)| {
                    let (private_anon, shared) = vma_of(page_addr(i));
                    classify::kind(
                        classify::Before {
                            entry: *e,
                            resident: resident.as_ref().and_then(|r| r.get(i).copied()),
                            private_anon,
                            shared,
                        },
                        access,
                    )
                })
                .collect(),
        ))
    }

    fn fault_in(&self, range: AlignedRange<VirtAddr>, access: Access) -> Result<FaultInReport> {
        let (start, end) = (range.start().as_u64(), range.end().as_u64());
        for _ in 0..8 {
            let (id, seq, eff, vma_kinds) = {
                let reg = self.lock();
                let r = reg.lookup(start)?;
                if end > r.end() {
                    return Err(GlueError::NotRegistered { addr: r.end() });
                }
                if let Some(gone) = first_gone(&r.live, start, end) {
                    return Err(GlueError::RegionGone {
                        id: r.id.0,
                        addr: gone,
                    });
                }
                check_access(r, start, end, access)?;
                (
                    r.id,
                    r.seq,
                    self.effective_access(r, start, end, access),
                    r.vmas.iter().map(vma_kind).collect::<Vec<_>>(),
                )
            };
            let predicted = self.predict_faults(start, range.page_count(), eff, &vma_kinds)?;
            let (method, faults) =
                self.fault_in_raw(start, end - start, eff, predicted.is_none())?;
            let (entries, _) = self.entries(start, range.page_count())?;
            let huge: Vec<(u64, u64)> = match &self.pagemap {
                Some(p) if p.has_scan() => p.scan_ranges(start, end, pagemap::PAGE_IS_HUGE)?,
                _ => Vec::new(),
            };
            let mut reg = self.lock();
            let r = reg.get_mut(id)?;
            if r.seq != seq {
                continue;
            }
            let pages = r.pages();
            let first = r.index_of(start);
            let mut present = 0;
            let mut cursor = pagemap::RunCursor::new(&huge);
            for (i, e) in entries.iter().enumerate() {
                let addr = start + ((i as u64) << PAGE_SHIFT);
                let in_huge = cursor.contains(addr);
                if e.present() {
                    present += 1;
                    r.tracked.track(pages, first + i as u64, e.pfn(), in_huge)?;
                }
            }
            let huge_blocks = huge.iter().map(|&(s, e)| (e - s) / HUGE_2M).sum();
            let (minor_faults, major_faults) = match &predicted {
                Some(kinds) => {
                    let mut cursor = pagemap::RunCursor::new(&huge);
                    let blocks: Vec<Option<u64>> = (0..kinds.len())
                        .map(|i| {
                            let a = start + ((i as u64) << PAGE_SHIFT);
                            cursor.contains(a).then_some(a / HUGE_2M)
                        })
                        .collect();
                    classify::count(kinds, |i| blocks.get(i).copied().flatten())
                }
                None => (faults.minor, faults.major),
            };
            return Ok(FaultInReport {
                range,
                minor_faults,
                major_faults,
                pages_present: present,
                huge_blocks,
                method,
            });
        }
        Err(GlueError::Contended { retries: 8 })
    }

    /// The access to fault with: device reads of private writable memory fault for write when
    /// `stable_frames` is on (see [`GlueConfig::stable_frames`]).
    pub(crate) fn effective_access(
        &self,
        r: &registry::Region,
        start: u64,
        end: u64,
        access: Access,
    ) -> Access {
        if access == Access::Write || !self.config.stable_frames {
            return access;
        }
        let all_private_writable = r
            .vmas
            .iter()
            .filter(|v| v.start.as_u64() < end && v.end.as_u64() > start)
            .all(|v| v.writable && !v.shared);
        if all_private_writable {
            Access::Write
        } else {
            Access::Read
        }
    }

    /// The page entries of `count` pages from `addr` for the reclaim scan: as
    /// [`entries`](Self::entries), except that pages no longer mapped read as absent (as
    /// pagemap shows them), where mincore refuses the whole range. A tracked page that was
    /// unmapped is gone from the device's point of view like a dropped one, and one unmapped
    /// page must not hide the state of the others.
    fn entries_for_scan(&self, addr: u64, count: u64) -> Result<Vec<PagemapEntry>> {
        match self.entries(addr, count) {
            Ok((entries, _)) => Ok(entries),
            Err(GlueError::Unmapped { .. }) => (0..count)
                .map(|i| match pagemap::mincore(addr + (i << PAGE_SHIFT), 1) {
                    Ok(present) => Ok(PagemapEntry(if present[0] { 1 << 63 } else { 0 })),
                    Err(GlueError::Unmapped { .. }) => Ok(PagemapEntry(0)),
                    Err(e) => Err(e),
                })
                .collect(),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn scan_for_reclaim(&self) -> Result<Vec<Invalidate>> {
        self.counters.scans.fetch_add(1, Ordering::Relaxed);
        let pfn_visible =
            self.caps.pfn_visible && self.config.state_source == StatePreference::Auto;
        let mut out = Vec::new();
        // A run that cannot be read is skipped, not the rest: what the scan found elsewhere is
        // delivered (and untracked) before the error is returned.
        let mut failed = None;
        {
            let mut reg = self.lock();
            for r in reg.regions_mut() {
                let mut lost = Vec::new();
                for (first, count) in r.tracked.runs() {
                    let addr = r.start() + (first << PAGE_SHIFT);
                    let entries = match self.entries_for_scan(addr, count) {
                        Ok(entries) => entries,
                        Err(e) => {
                            failed.get_or_insert(e);
                            continue;
                        }
                    };
                    for (i, e) in entries.iter().enumerate() {
                        let idx = first + i as u64;
                        let then = r.tracked.get(idx).flatten();
                        if let Some(cause) = registry::classify_change(then, *e, pfn_visible) {
                            lost.push((addr + ((i as u64) << PAGE_SHIFT), cause));
                        }
                    }
                }
                if lost.is_empty() {
                    continue;
                }
                r.seq += 1;
                for (s, e, cause) in registry::coalesce(&lost) {
                    r.tracked.untrack(r.index_of(s), r.index_of(e));
                    if let Ok(range) = AlignedRange::new(VirtAddr::new(s), e - s, PageSize::Size4K)
                    {
                        out.push(Invalidate {
                            region: r.id,
                            range,
                            cause,
                        });
                    }
                }
            }
        }
        self.deliver(&out);
        match failed {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    fn handle_event(&self, uffd: &Uffd, ev: UffdEvent) {
        self.counters.uffd_events.fetch_add(1, Ordering::Relaxed);
        if let UffdEvent::PageFault { address, flags } = ev {
            // Never expected (WP mode, nothing write-protected); release it so the faulting
            // thread cannot hang.
            self.counters
                .unexpected_faults
                .fetch_add(1, Ordering::Relaxed);
            uffd.release_fault(address, flags);
            return;
        }
        let (invs, moved) = {
            let mut reg = self.lock();
            let moved = match ev {
                UffdEvent::Remap { from, to, len } => reg
                    .uffd_pieces(from, from.saturating_add(len))
                    .into_iter()
                    .map(|(s, e)| (to.wrapping_add(s - from), e - s))
                    .collect(),
                _ => Vec::new(),
            };
            (reg.apply(&ev), moved)
        };
        // The kernel moves a userfaultfd registration along with its VMA (mremap); the
        // registration stays bound to the old addresses, so the moved pages are nobody's:
        // unregister them, or every later DONTNEED there waits for this monitor and the
        // application's own UFFDIO_REGISTER of that memory fails with EBUSY.
        for (start, len) in moved {
            // An error means the moved pages were unmapped again meanwhile: nothing is left
            // registered there.
            let _ = uffd.unregister(start, len);
        }
        self.deliver(&invs);
    }
}

/// The first address of `[start, end)` not in `live`, if any.
pub(crate) fn first_gone(live: &RangeSet, start: u64, end: u64) -> Option<u64> {
    let mut cur = start;
    for (s, e) in live.intersect(start, end) {
        if s > cur {
            return Some(cur);
        }
        cur = e;
    }
    (cur < end).then_some(cur)
}

/// Checks that `[start, end)` of region `r` may be faulted for `access`.
pub(crate) fn check_access(
    r: &registry::Region,
    start: u64,
    end: u64,
    access: Access,
) -> Result<()> {
    if access == Access::Write && r.access == Access::Read {
        return Err(GlueError::NotWritable { addr: start });
    }
    for v in r
        .vmas
        .iter()
        .filter(|v| v.start.as_u64() < end && v.end.as_u64() > start)
    {
        if access == Access::Write && !v.writable {
            return Err(GlueError::NotWritable {
                addr: v.start.as_u64().max(start),
            });
        }
    }
    Ok(())
}

fn monitor_loop(inner: Arc<Inner>, uffd: Option<Arc<Uffd>>, stop_fd: i32) {
    let interval = inner.config.scan_interval;
    let mut last_scan = Instant::now();
    let mut events = Vec::new();
    loop {
        let mut fds = [
            libc::pollfd {
                fd: stop_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: uffd.as_ref().map_or(-1, |u| u.raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = match interval {
            Some(d) => d
                .saturating_sub(last_scan.elapsed())
                .as_millis()
                .min(i32::MAX as u128) as i32,
            None => -1,
        };
        // SAFETY: `fds` is a live array of two pollfd structs; a negative fd is ignored by poll.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        if rc < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            break;
        }
        if fds[0].revents != 0 {
            break;
        }
        if let Some(u) = &uffd {
            if fds[1].revents & libc::POLLIN != 0 {
                loop {
                    events.clear();
                    match u.read_events(&mut events) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    for ev in events.drain(..) {
                        match ev {
                            Ok(ev) => inner.handle_event(u, ev),
                            Err(_) => {
                                inner.counters.malformed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            } else if fds[1].revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0 {
                break;
            }
        }
        if let Some(d) = interval
            && last_scan.elapsed() >= d
        {
            let _ = inner.scan_for_reclaim();
            last_scan = Instant::now();
        }
    }
}
