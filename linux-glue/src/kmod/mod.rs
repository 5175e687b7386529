//! The user-space half of the kernel-module ABI, and two backends for it: the real device
//! ([`RealModule`], `real.rs`: the module in `linux-glue/kernel`) and an in-process fake
//! ([`FakeModule`], `fake.rs`) that plays the module's part byte-for-byte (it decodes the same
//! `#[repr(C)]` argument structs and writes the same shared table and ring layouts), so the
//! user-space half is tested on any host; `cargo xtask kernel-test` runs it against the real
//! module in a guest.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hal::{AlignedRange, PageSize, VirtAddr};

use crate::abi::{
    self, ABI_VERSION, AbiHeader, AbiStruct, DmaArgs, DmaAttachArgs, FaultInArgs,
    InvalidationRecord, PageStateEntry, RegisterArgs, ResolveArgs, RingSetupArgs, UnregisterArgs,
    VersionArgs,
};
use crate::registry::Access;
use crate::resolver::FaultKind;
use crate::sys::{PAGE, PAGE_SHIFT};
use crate::{GlueError, Result};

mod device_fault;
mod fake;
mod real;

pub use device_fault::DeviceFault;
pub use fake::{FAKE_PFN_BASE, FakeModule};
pub use real::RealModule;

/// Words (u64) of the ring header (192 bytes).
const RING_HEADER_WORDS: usize = size_of::<abi::RingHeader>() / 8;
const RING_DROPPED: usize = 2;
const RING_PRODUCER: usize = 8;
const RING_CONSUMER: usize = 16;
/// Words per ring record (48 bytes).
const RECORD_WORDS: usize = size_of::<InvalidationRecord>() / 8;
/// Words of the table header (32 bytes).
const TABLE_HEADER_WORDS: usize = size_of::<abi::TableHeader>() / 8;
const TABLE_GENERATION: usize = 3;

/// Heap memory standing in for module memory mapped into user space.
#[derive(Debug)]
struct HeapBlock(Box<[AtomicU64]>);

impl HeapBlock {
    fn new(words: usize) -> Arc<Self> {
        Arc::new(Self((0..words).map(|_| AtomicU64::new(0)).collect()))
    }
}

#[derive(Debug)]
enum Owner {
    Mmap,
    Heap(#[allow(dead_code)] Arc<HeapBlock>),
}

/// Memory shared with the module (an mmap of the device, or the fake's heap block), accessed
/// only through 64-bit atomics.
#[derive(Debug)]
pub struct SharedMemory {
    ptr: NonNull<u64>,
    words: usize,
    owner: Owner,
}

// SAFETY: the memory stays valid for the lifetime of the value (munmap only in Drop, or kept
// alive by the Arc), and it is only accessed through atomic operations, so sharing across
// threads cannot cause data races.
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    fn heap(block: Arc<HeapBlock>) -> Self {
        let words = block.0.len();
        let ptr = NonNull::from(&block.0[..]).cast::<u64>();
        Self {
            ptr,
            words,
            owner: Owner::Heap(block),
        }
    }

    /// The word at index `i`, if in bounds.
    fn word(&self, i: usize) -> Option<&AtomicU64> {
        if i >= self.words {
            return None;
        }
        // SAFETY: in bounds (checked); the mapping is 8-byte aligned (page-aligned mmap or an
        // AtomicU64 slice) and outlives `&self`; all accesses are atomic.
        Some(unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(i)) })
    }

    fn load(&self, i: usize, order: Ordering) -> u64 {
        self.word(i).map_or(0, |w| w.load(order))
    }

    fn store(&self, i: usize, v: u64, order: Ordering) {
        if let Some(w) = self.word(i) {
            w.store(v, order);
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.words * 8
    }

    /// Always false (mappings are never empty).
    pub fn is_empty(&self) -> bool {
        self.words == 0
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        if let Owner::Mmap = self.owner {
            // SAFETY: this value owns the mapping created by `RealModule::map` with this length.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.words * 8) };
        }
    }
}

/// The transport to the module: ioctls with byte arguments and shared-memory maps.
pub trait ModuleBackend: Send + Sync {
    /// Issues ioctl `cmd` with `arg` as the in/out argument. `Err(errno)` on failure.
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32>;
    /// Maps `len` bytes of module memory at mmap offset `offset`, readable and writable (the
    /// event ring: user space writes its `consumer`).
    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory>;
    /// Maps module memory that user space only reads (page-state tables). By default the same
    /// as [`ModuleBackend::map`]; the real module refuses writable mappings of tables.
    fn map_read_only(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        self.map(offset, len)
    }
}

impl<T: ModuleBackend + ?Sized> ModuleBackend for Arc<T> {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        (**self).ioctl(cmd, arg)
    }
    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        (**self).map(offset, len)
    }
    fn map_read_only(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        (**self).map_read_only(offset, len)
    }
}

/// A region registered with the module, with its page-state table mapped.
#[derive(Debug)]
pub struct ModuleRegion {
    /// The module's id for it.
    pub id: u64,
    /// The registered range.
    pub range: AlignedRange<VirtAddr>,
    /// The access registered.
    pub access: Access,
    table: SharedMemory,
    entries: u64,
}

/// Versions of a range's pages at one moment, for the optimistic check after a DMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The region's generation then.
    pub generation: u64,
    /// First page.
    pub start: VirtAddr,
    /// The version of each page then.
    pub versions: Vec<u32>,
    /// Whether every page was present then (and, with `writable`, mapped for device
    /// writes): a snapshot of pages already invalid can never be valid for a DMA.
    pub present: bool,
    /// Whether every page was mapped for device writes then.
    pub writable: bool,
}

impl ModuleRegion {
    /// The table entry of the page containing `addr`.
    pub fn entry(&self, addr: VirtAddr) -> Option<PageStateEntry> {
        let i = self.index(addr)?;
        Some(PageStateEntry(
            self.table.load(TABLE_HEADER_WORDS + i, Ordering::Acquire),
        ))
    }

    fn index(&self, addr: VirtAddr) -> Option<usize> {
        let off = addr.as_u64().checked_sub(self.range.start().as_u64())?;
        let i = off >> PAGE_SHIFT;
        (i < self.entries).then_some(i as usize)
    }

    /// The region's invalidation generation.
    pub fn generation(&self) -> u64 {
        self.table.load(TABLE_GENERATION, Ordering::Acquire)
    }

    /// Records the versions of `range`'s pages (generation first, so that a concurrent
    /// invalidation shows up as a generation change).
    pub fn snapshot(&self, range: AlignedRange<VirtAddr>) -> Result<Snapshot> {
        let generation = self.generation();
        // Capped by the table: a range longer than the region fails below, and must not first
        // try to reserve memory for every page it names.
        let mut versions = Vec::with_capacity(range.page_count().min(self.entries) as usize);
        let (mut present, mut writable) = (true, true);
        for p in range.pages() {
            let e = self
                .entry(p)
                .ok_or(GlueError::NotRegistered { addr: p.as_u64() })?;
            versions.push(e.version());
            present &= e.present();
            writable &= e.writable();
        }
        Ok(Snapshot {
            generation,
            start: range.start(),
            versions,
            present,
            writable: present && writable,
        })
    }

    /// Whether no page of `snap` was invalidated since (option B of docs/protocol.md §0): every
    /// page present when the snapshot was taken, then the generation fast path, or a per-page
    /// version comparison with every page still present.
    pub fn still_valid(&self, snap: &Snapshot) -> bool {
        if !snap.present {
            return false;
        }
        if self.generation() == snap.generation {
            return true;
        }
        snap.versions.iter().enumerate().all(|(i, &v)| {
            let addr = VirtAddr::new(snap.start.as_u64() + ((i as u64) << PAGE_SHIFT));
            self.entry(addr)
                .is_some_and(|e| e.present() && e.version() == v)
        })
    }
}

/// Snapshots [`ModuleClient::ensure_present`] takes before it gives up on a range that keeps
/// being invalidated right after its fault-in.
const ENSURE_RETRIES: u32 = 8;

/// One page resolved by the module ([`ModuleClient::resolve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleResolution {
    /// The CPU mapping that holds the page: the 4 KiB page, or the naturally aligned 2 MiB block
    /// when a PMD maps it and the block lies inside the region (map it as one block).
    pub mapping: AlignedRange<VirtAddr>,
    /// `Size4K` or `Size2M`: the size of `mapping`.
    pub size: PageSize,
    /// Frame number of `mapping.start()` (physical address `pfn << 12`).
    pub pfn: u64,
    /// What the module had to do; `None` for a query-only call that found the page unmapped.
    pub kind: Option<FaultKind>,
    /// The page's table version afterwards.
    pub version: u32,
}

impl ModuleResolution {
    /// Physical address of `mapping.start()`.
    pub fn frame(&self) -> u64 {
        self.pfn << PAGE_SHIFT
    }
}

/// Result of a module fault-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModuleFaultIn {
    /// Pages present and mapped afterwards.
    pub pages_mapped: u64,
    /// Minor faults.
    pub minor_faults: u32,
    /// Major faults.
    pub major_faults: u32,
    /// 2 MiB blocks mapped.
    pub huge_blocks: u32,
}

/// The module's DMA device as [`ModuleClient::dma_attach`] found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaDevice {
    /// The IOMMU domain's page sizes.
    pub pgsize_bitmap: u64,
    /// The last IOVA the domain translates.
    pub aperture_end: u64,
    /// `domain << 16 | bus << 8 | devfn`.
    pub pci_address: u32,
}

/// Direction of a device transfer ([`ModuleClient::dma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaDirection {
    /// The device reads memory into its buffer.
    ToDevice,
    /// The device writes its buffer to memory.
    FromDevice,
}

impl DmaDirection {
    /// The access the transfer needs of the memory side.
    pub fn access(self) -> Access {
        match self {
            Self::ToDevice => Access::Read,
            Self::FromDevice => Access::Write,
        }
    }
}

/// One transfer as the module reports it ([`ModuleClient::dma`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaOutcome {
    /// Pages touched (1 or 2).
    pub pages: u32,
    /// Bit i: page i was present when the transfer started.
    pub present_before: u32,
    /// Table versions at the start.
    pub version_before: [u32; 2],
    /// Table versions at the completion.
    pub version_after: [u32; 2],
    /// Start to completion interrupt, ns.
    pub elapsed_ns: u64,
    /// The device may have used the scratch page: fault in and re-send.
    pub stale: bool,
}

/// The user-space half: registration, fault-in, table checks and the event ring.
#[derive(Debug)]
pub struct ModuleClient<B: ModuleBackend> {
    backend: B,
    module_version: u32,
    features: u32,
    ring: Option<(SharedMemory, u32)>,
    dropped_seen: u64,
}

fn access_bits(a: Access) -> u32 {
    match a {
        Access::Read => abi::ACCESS_READ,
        Access::Write => abi::ACCESS_WRITE,
    }
}

/// The error a module `status` code stands for, with the context the caller has.
pub fn status_error(code: u32, region: u64, addr: u64, len: u64) -> GlueError {
    match code {
        1 => GlueError::Misaligned {
            value: addr | len,
            align: PAGE,
        },
        2 => GlueError::Overflow { start: addr, len },
        3 => GlueError::EmptyRange,
        4 => GlueError::Unmapped { addr },
        5 => GlueError::NotWritable { addr },
        6 => GlueError::NotReadable { addr },
        7 => GlueError::AlreadyRegistered { existing: region },
        8 => GlueError::UnknownRegion { id: region },
        9 => GlueError::NotRegistered { addr },
        10 => GlueError::RegionGone { id: region, addr },
        11 => GlueError::UnsupportedMapping {
            addr,
            reason: "refused by the module",
        },
        // The module retries for HMM_RANGE_DEFAULT_TIMEOUT (1 s) and does not count.
        20 => GlueError::Contended { retries: 0 },
        21 => GlueError::InvalidArgument {
            what: "argument refused by the module",
        },
        22 => GlueError::HwPoison { addr },
        other => GlueError::Malformed {
            what: "module status",
            detail: format!("code {other}"),
        },
    }
}

impl<B: ModuleBackend> ModuleClient<B> {
    /// Connects: the version handshake. [`GlueError::AbiVersion`] if the module speaks another
    /// version.
    pub fn connect(backend: B) -> Result<Self> {
        let mut v = VersionArgs {
            hdr: AbiHeader::for_struct::<VersionArgs>(),
            ..Default::default()
        };
        backend
            .ioctl(abi::IOC_VERSION, v.as_bytes_mut())
            .map_err(|errno| GlueError::Os {
                op: "nprdma-glue IOC_VERSION",
                errno,
            })?;
        if v.module_version != ABI_VERSION {
            return Err(GlueError::AbiVersion {
                ours: ABI_VERSION,
                theirs: v.module_version,
            });
        }
        Ok(Self {
            backend,
            module_version: v.module_version,
            features: v.features,
            ring: None,
            dropped_seen: 0,
        })
    }

    /// Feature bits the module reported.
    pub fn features(&self) -> u32 {
        self.features
    }

    fn call<T: AbiStruct>(&self, cmd: u32, arg: &mut T) -> Result<()> {
        self.backend
            .ioctl(cmd, arg.as_bytes_mut())
            .map_err(|errno| match errno {
                libc::EPROTO => GlueError::AbiVersion {
                    ours: ABI_VERSION,
                    theirs: self.module_version,
                },
                libc::EINVAL => GlueError::AbiSize {
                    what: T::NAME,
                    expected: size_of::<T>() as u32,
                    got: 0,
                },
                errno => GlueError::Os {
                    op: "nprdma-glue ioctl",
                    errno,
                },
            })
    }

    /// Registers `[addr, addr + len)` and maps its page-state table.
    pub fn register(&self, addr: VirtAddr, len: u64, access: Access) -> Result<ModuleRegion> {
        let mut a = RegisterArgs {
            hdr: AbiHeader::for_struct::<RegisterArgs>(),
            addr: addr.as_u64(),
            len,
            access: access_bits(access),
            ..Default::default()
        };
        self.call(abi::IOC_REGISTER, &mut a)?;
        if a.status != 0 {
            return Err(status_error(a.status, a.region_id, addr.as_u64(), len));
        }
        // The module holds the region now: a reply this side cannot use gives it back.
        self.finish_register(&a, addr, len, access)
            .inspect_err(|_| {
                self.release_region(a.region_id);
            })
    }

    /// The region from a successful `IOC_REGISTER` reply: its table mapped and checked.
    fn finish_register(
        &self,
        a: &RegisterArgs,
        addr: VirtAddr,
        len: u64,
        access: Access,
    ) -> Result<ModuleRegion> {
        let range = AlignedRange::new(addr, len, PageSize::Size4K)?;
        if a.table_entries != range.page_count() {
            return Err(GlueError::Malformed {
                what: "RegisterArgs reply",
                detail: format!(
                    "{} table entries for {} pages",
                    a.table_entries,
                    range.page_count()
                ),
            });
        }
        let bytes = size_of::<abi::TableHeader>() as u64 + 8 * a.table_entries;
        let table = self.backend.map_read_only(a.table_offset, bytes)?;
        let hdr = table.load(0, Ordering::Acquire).to_ne_bytes();
        let version = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        if version != ABI_VERSION {
            return Err(GlueError::AbiVersion {
                ours: ABI_VERSION,
                theirs: version,
            });
        }
        Ok(ModuleRegion {
            id: a.region_id,
            range,
            access,
            table,
            entries: a.table_entries,
        })
    }

    /// Unregisters region `id` on a path that already has an error to report (best effort:
    /// a failure here would only hide that error).
    fn release_region(&self, id: u64) {
        let mut a = UnregisterArgs {
            hdr: AbiHeader::for_struct::<UnregisterArgs>(),
            region_id: id,
            ..Default::default()
        };
        let _ = self.call(abi::IOC_UNREGISTER, &mut a);
    }

    /// Unregisters a region (its table mapping is dropped with it).
    pub fn unregister(&self, region: ModuleRegion) -> Result<()> {
        let mut a = UnregisterArgs {
            hdr: AbiHeader::for_struct::<UnregisterArgs>(),
            region_id: region.id,
            ..Default::default()
        };
        self.call(abi::IOC_UNREGISTER, &mut a)?;
        if a.status != 0 {
            return Err(status_error(
                a.status,
                region.id,
                region.range.start().as_u64(),
                region.range.len(),
            ));
        }
        Ok(())
    }

    /// Asks the module to fault in and map `range` of `region`.
    pub fn fault_in(
        &self,
        region: &ModuleRegion,
        range: AlignedRange<VirtAddr>,
        access: Access,
    ) -> Result<ModuleFaultIn> {
        let mut a = FaultInArgs {
            hdr: AbiHeader::for_struct::<FaultInArgs>(),
            region_id: region.id,
            addr: range.start().as_u64(),
            len: range.len(),
            access: access_bits(access),
            ..Default::default()
        };
        self.call(abi::IOC_FAULT_IN, &mut a)?;
        if a.status != 0 {
            return Err(status_error(a.status, region.id, a.addr, a.len));
        }
        Ok(ModuleFaultIn {
            pages_mapped: a.pages_mapped,
            minor_faults: a.minor_faults,
            major_faults: a.major_faults,
            huge_blocks: a.huge_blocks,
        })
    }

    /// The pre-post check (docs/protocol.md §0): reads the table for `range`, faults in only the
    /// runs of pages that are absent (or not writable, for `Write`), and returns a snapshot to
    /// validate after the DMA with [`ModuleRegion::still_valid`].
    pub fn ensure_present(
        &self,
        region: &ModuleRegion,
        range: AlignedRange<VirtAddr>,
        access: Access,
    ) -> Result<Snapshot> {
        let mut run: Option<(u64, u64)> = None;
        let mut runs = Vec::new();
        for p in range.pages() {
            let e = region
                .entry(p)
                .ok_or(GlueError::NotRegistered { addr: p.as_u64() })?;
            let ok = e.present() && (access == Access::Read || e.writable());
            let a = p.as_u64();
            match (ok, run) {
                (false, Some((s, e))) if e == a => run = Some((s, a + PAGE)),
                (false, Some(r)) => {
                    runs.push(r);
                    run = Some((a, a + PAGE));
                }
                (false, None) => run = Some((a, a + PAGE)),
                (true, Some(r)) => {
                    runs.push(r);
                    run = None;
                }
                (true, None) => {}
            }
        }
        runs.extend(run);
        for (s, e) in runs {
            let r = AlignedRange::new(VirtAddr::new(s), e - s, PageSize::Size4K)?;
            self.fault_in(region, r, access)?;
        }
        // An invalidation between the fault-in and the snapshot (reclaim, migration) leaves
        // pages absent in it: fault them in again, a bounded number of times.
        for retry in 0..ENSURE_RETRIES {
            let snap = region.snapshot(range)?;
            let usable = match access {
                Access::Read => snap.present,
                Access::Write => snap.writable,
            };
            if usable {
                return Ok(snap);
            }
            if retry + 1 < ENSURE_RETRIES {
                self.fault_in(region, range, access)?;
            }
        }
        Err(GlueError::Contended {
            retries: ENSURE_RETRIES,
        })
    }

    /// Makes the page at `addr` of `region` present for `access` and returns its frame, the
    /// CPU mapping's size and the fault taken (`IOC_RESOLVE`). With `query_only` nothing is
    /// faulted: an unmapped page comes back with `kind: None`.
    pub fn resolve(
        &self,
        region: &ModuleRegion,
        addr: VirtAddr,
        access: Access,
        query_only: bool,
    ) -> Result<ModuleResolution> {
        let mut a = ResolveArgs {
            hdr: AbiHeader::for_struct::<ResolveArgs>(),
            region_id: region.id,
            addr: addr.as_u64(),
            access: access_bits(access),
            flags: if query_only {
                abi::FAULT_IN_QUERY_ONLY
            } else {
                0
            },
            ..Default::default()
        };
        self.call(abi::IOC_RESOLVE, &mut a)?;
        if a.status != 0 {
            return Err(status_error(a.status, region.id, a.addr, PAGE));
        }
        let kind = match a.kind {
            abi::kind::PRESENT => Some(FaultKind::AlreadyPresent),
            abi::kind::MINOR => Some(FaultKind::Minor),
            abi::kind::MAJOR => Some(FaultKind::Major),
            abi::kind::ABSENT => None,
            other => {
                return Err(GlueError::Malformed {
                    what: "ResolveArgs reply",
                    detail: format!("kind {other}"),
                });
            }
        };
        let size = match a.order {
            0 => PageSize::Size4K,
            9 => PageSize::Size2M,
            other => {
                return Err(GlueError::Malformed {
                    what: "ResolveArgs reply",
                    detail: format!("mapping order {other}"),
                });
            }
        };
        let mapping = if kind.is_some() {
            AlignedRange::new(VirtAddr::new(a.mapping_start), size.bytes(), size)?
        } else {
            AlignedRange::new(addr, PAGE, PageSize::Size4K)?
        };
        if kind.is_some() && !mapping.contains(addr) {
            return Err(GlueError::Malformed {
                what: "ResolveArgs reply",
                detail: format!("mapping {mapping:?} does not hold {addr:?}"),
            });
        }
        Ok(ModuleResolution {
            mapping,
            size,
            pfn: a.pfn,
            kind,
            version: a.version,
        })
    }

    /// Takes the module's DMA device for this open file (`IOC_DMA_ATTACH`, ABI 3): an IOMMU
    /// domain of its own where IOVA = virtual address. `Os { errno: ENODEV }` when no device is
    /// bound, `EBUSY` when another file holds it, `EALREADY` when this one does.
    pub fn dma_attach(&self) -> Result<DmaDevice> {
        let mut a = DmaAttachArgs {
            hdr: AbiHeader::for_struct::<DmaAttachArgs>(),
            ..Default::default()
        };
        self.call(abi::IOC_DMA_ATTACH, &mut a)?;
        if a.status != 0 {
            return Err(status_error(a.status, 0, 0, 0));
        }
        Ok(DmaDevice {
            pgsize_bitmap: a.pgsize_bitmap,
            aperture_end: a.aperture_end,
            pci_address: a.pci_address,
        })
    }

    /// One device transfer between `[addr, addr + len)` of `region` and the device's buffer at
    /// `dev_offset` (`IOC_DMA`), as it ran: pages absent at the start hit the scratch page, and
    /// [`DmaOutcome::stale`] says so. No fault-in here: see [`ModuleClient::dma_resend`].
    pub fn dma(
        &self,
        region: &ModuleRegion,
        addr: VirtAddr,
        len: u32,
        direction: DmaDirection,
        dev_offset: u32,
    ) -> Result<DmaOutcome> {
        let mut a = DmaArgs {
            hdr: AbiHeader::for_struct::<DmaArgs>(),
            region_id: region.id,
            addr: addr.as_u64(),
            len,
            direction: match direction {
                DmaDirection::ToDevice => abi::DMA_TO_DEVICE,
                DmaDirection::FromDevice => abi::DMA_FROM_DEVICE,
            },
            dev_offset,
            ..Default::default()
        };
        self.call(abi::IOC_DMA, &mut a)?;
        if a.status != 0 {
            return Err(status_error(
                a.status,
                region.id,
                addr.as_u64(),
                u64::from(len),
            ));
        }
        if !(1..=2).contains(&a.pages) {
            return Err(GlueError::Malformed {
                what: "DmaArgs reply",
                detail: format!("{} pages", a.pages),
            });
        }
        Ok(DmaOutcome {
            pages: a.pages,
            present_before: a.present_before,
            version_before: a.version_before,
            version_after: a.version_after,
            elapsed_ns: a.elapsed_ns,
            stale: a.stale != 0,
        })
    }

    /// NP-RDMA's send loop for one transfer: fault in the pages it touches (only the absent
    /// ones, [`ModuleClient::ensure_present`]), run it, and while the module says it may have
    /// used the scratch page, fault in again and re-send, up to `max_sends` transfers. Returns
    /// the clean outcome and how many transfers were re-sent; [`GlueError::Contended`] if every
    /// send was stale.
    pub fn dma_resend(
        &self,
        region: &ModuleRegion,
        addr: VirtAddr,
        len: u32,
        direction: DmaDirection,
        dev_offset: u32,
        max_sends: u32,
    ) -> Result<(DmaOutcome, u32)> {
        let first = addr.as_u64() & !(PAGE - 1);
        let end = (addr.as_u64() + u64::from(len.max(1)) + PAGE - 1) & !(PAGE - 1);
        let pages = AlignedRange::new(VirtAddr::new(first), end - first, PageSize::Size4K)?;
        for sent in 0..max_sends {
            self.ensure_present(region, pages, direction.access())?;
            let out = self.dma(region, addr, len, direction, dev_offset)?;
            if !out.stale {
                return Ok((out, sent));
            }
        }
        Err(GlueError::Contended { retries: max_sends })
    }

    /// Creates the event ring with `entries` records (a power of two) and maps it.
    pub fn setup_ring(&mut self, entries: u32) -> Result<()> {
        let mut a = RingSetupArgs {
            hdr: AbiHeader::for_struct::<RingSetupArgs>(),
            entries,
            ..Default::default()
        };
        self.call(abi::IOC_RING_SETUP, &mut a)?;
        if a.status != 0 {
            return Err(status_error(a.status, 0, 0, 0));
        }
        let expected = (size_of::<abi::RingHeader>()
            + entries as usize * size_of::<InvalidationRecord>()) as u64;
        if a.ring_bytes != expected {
            return Err(GlueError::Malformed {
                what: "RingSetupArgs reply",
                detail: format!("ring of {} bytes, expected {expected}", a.ring_bytes),
            });
        }
        let mem = self.backend.map(a.ring_offset, a.ring_bytes)?;
        let geometry = mem.load(1, Ordering::Acquire).to_ne_bytes();
        let got_entries = u32::from_ne_bytes([geometry[0], geometry[1], geometry[2], geometry[3]]);
        let entry_size = u32::from_ne_bytes([geometry[4], geometry[5], geometry[6], geometry[7]]);
        if got_entries != entries || entry_size as usize != size_of::<InvalidationRecord>() {
            return Err(GlueError::AbiSize {
                what: "InvalidationRecord",
                expected: size_of::<InvalidationRecord>() as u32,
                got: entry_size,
            });
        }
        self.dropped_seen = mem.load(RING_DROPPED, Ordering::Acquire);
        self.ring = Some((mem, entries));
        Ok(())
    }

    /// Appends every published record to `out` and releases their slots. If the module dropped
    /// events since the last call, the records read are still appended and
    /// [`GlueError::RingOverrun`] says how many were lost (rescan the tables).
    pub fn poll_invalidations(&mut self, out: &mut Vec<InvalidationRecord>) -> Result<usize> {
        let (mem, entries) = self.ring.as_ref().ok_or(GlueError::InvalidArgument {
            what: "ring not set up",
        })?;
        let entries = *entries as u64;
        let producer = mem.load(RING_PRODUCER, Ordering::Acquire);
        let mut consumer = mem.load(RING_CONSUMER, Ordering::Relaxed);
        if producer.wrapping_sub(consumer) > entries {
            return Err(GlueError::Malformed {
                what: "event ring",
                detail: format!(
                    "producer {producer} is more than {entries} ahead of consumer {consumer}"
                ),
            });
        }
        let mut n = 0;
        while consumer != producer {
            let slot = (consumer % entries) as usize;
            let base = RING_HEADER_WORDS + slot * RECORD_WORDS;
            let mut rec = InvalidationRecord::default();
            for (i, chunk) in rec.as_bytes_mut().chunks_exact_mut(8).enumerate() {
                chunk.copy_from_slice(&mem.load(base + i, Ordering::Relaxed).to_ne_bytes());
            }
            out.push(rec);
            consumer = consumer.wrapping_add(1);
            n += 1;
        }
        mem.store(RING_CONSUMER, consumer, Ordering::Release);
        let dropped = mem.load(RING_DROPPED, Ordering::Acquire);
        if dropped != self.dropped_seen {
            let lost = dropped.wrapping_sub(self.dropped_seen);
            self.dropped_seen = dropped;
            return Err(GlueError::RingOverrun { lost });
        }
        Ok(n)
    }
}
