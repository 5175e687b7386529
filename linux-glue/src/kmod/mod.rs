//! The user-space half of the kernel-module ABI, and two backends for it: the real device
//! ([`RealModule`]) and an in-process fake ([`FakeModule`]) that plays the module's part
//! byte-for-byte (it decodes the same `#[repr(C)]` argument structs and writes the same shared
//! table and ring layouts), so the user-space half is tested without a kernel module.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hal::{AlignedRange, PageSize, VirtAddr};

use crate::abi::{
    self, ABI_VERSION, AbiHeader, AbiStruct, FaultInArgs, InvalidationRecord, PageStateEntry,
    RegisterArgs, RingSetupArgs, UnregisterArgs, VersionArgs,
};
use crate::registry::Access;
use crate::sys::{self, PAGE, PAGE_SHIFT};
use crate::{GlueError, Result};

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
    /// Maps `len` bytes of module memory at mmap offset `offset`.
    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory>;
}

impl<T: ModuleBackend + ?Sized> ModuleBackend for Arc<T> {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        (**self).ioctl(cmd, arg)
    }
    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        (**self).map(offset, len)
    }
}

/// The real module behind its device node.
#[derive(Debug)]
pub struct RealModule {
    fd: OwnedFd,
}

impl RealModule {
    /// Opens [`abi::DEVICE_NODE`].
    pub fn open() -> Result<Self> {
        Self::open_at(abi::DEVICE_NODE)
    }

    /// Opens the module's device at `path`: [`GlueError::ModuleNotLoaded`] if it does not exist.
    pub fn open_at(path: &str) -> Result<Self> {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => Ok(Self { fd: f.into() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(GlueError::ModuleNotLoaded {
                path: path.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(GlueError::PermissionDenied {
                    what: "opening the nprdma-glue device",
                })
            }
            Err(e) => Err(GlueError::Os {
                op: "open nprdma-glue device",
                errno: e.raw_os_error().unwrap_or(0),
            }),
        }
    }
}

/// Whether `cmd` is one of the module's requests (its magic) with an argument of `len` bytes.
fn module_request_fits(cmd: u32, len: usize) -> bool {
    sys::ioc_type(cmd) == abi::IOCTL_MAGIC && sys::ioc_size(cmd) == len
}

impl ModuleBackend for RealModule {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        // The kernel copies as many bytes as the request encodes: refuse a buffer of any other
        // size, and requests that are not this module's.
        if !module_request_fits(cmd, arg.len()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: one of the module's requests (checked magic), whose argument is exactly
        // `arg.len()` bytes (checked size), a plain struct with no buffer the module writes
        // through (abi.rs); `arg` is live and writable for the call.
        unsafe { sys::ioctl_ptr(&self.fd, cmd, arg.as_mut_ptr()) }.map(|_| ())
    }

    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(GlueError::InvalidArgument {
                what: "module mapping length",
            });
        }
        // SAFETY: a new shared mapping of the device at a kernel-chosen address; nothing is
        // replaced. The module validates offset and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys::os_error("mmap nprdma-glue device"));
        }
        let ptr = NonNull::new(p.cast::<u64>()).ok_or(GlueError::Os {
            op: "mmap",
            errno: 0,
        })?;
        Ok(SharedMemory {
            ptr,
            words: (len / 8) as usize,
            owner: Owner::Mmap,
        })
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
        let table = self.backend.map(a.table_offset, bytes)?;
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

/// One region as the fake module sees it.
#[derive(Debug)]
struct FakeRegion {
    start: u64,
    pages: u64,
    access: u32,
    table: Arc<HeapBlock>,
}

#[derive(Debug, Default)]
struct FakeState {
    next_id: u64,
    next_offset: u64,
    regions: BTreeMap<u64, FakeRegion>,
    blocks: HashMap<u64, Arc<HeapBlock>>,
    ring: Option<(Arc<HeapBlock>, u32)>,
    seq: u64,
    huge: Vec<(u64, u64)>,
    swapped: Vec<(u64, u64)>,
}

/// An in-process stand-in for the kernel module, for testing the user-space half.
///
/// Memory is modelled, not real: pages become present when faulted in through the ABI and
/// absent when the test calls [`FakeModule::invalidate`] (the MMU-notifier path). Pages inside
/// [`FakeModule::back_with_huge_pages`] fault in as 2 MiB blocks; pages passed to
/// [`FakeModule::swap_out`] cost a major fault on their next fault-in.
#[derive(Debug)]
pub struct FakeModule {
    version: u32,
    state: Mutex<FakeState>,
}

impl Default for FakeModule {
    fn default() -> Self {
        Self::new()
    }
}

fn header_word(version: u32, size: usize) -> u64 {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&version.to_ne_bytes());
    b[4..].copy_from_slice(&(size as u32).to_ne_bytes());
    u64::from_ne_bytes(b)
}

impl FakeModule {
    /// A fake speaking [`ABI_VERSION`].
    pub fn new() -> Self {
        Self::with_version(ABI_VERSION)
    }

    /// A fake speaking `version` (to test the mismatch path).
    pub fn with_version(version: u32) -> Self {
        Self {
            version,
            state: Mutex::new(FakeState {
                next_offset: 0x10000,
                ..Default::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes faults in `[start, start + len)` map whole 2 MiB blocks (a THP-backed range).
    pub fn back_with_huge_pages(&self, start: VirtAddr, len: u64) {
        self.lock()
            .huge
            .push((start.as_u64(), start.as_u64().saturating_add(len)));
    }

    /// Models reclaim to swap: invalidates the pages (cause SWAPPED_OUT) and makes their next
    /// fault-in a major fault.
    pub fn swap_out(&self, start: VirtAddr, len: u64) -> usize {
        self.lock()
            .swapped
            .push((start.as_u64(), start.as_u64().saturating_add(len)));
        self.invalidate(start, len, abi::cause::SWAPPED_OUT, 0)
    }

    /// The MMU-notifier path: for every registered region overlapping the range, clears the
    /// present bits and bumps the versions of the pages, bumps the generation and publishes one
    /// ring record (or counts it as dropped when the ring is full). Returns records published.
    pub fn invalidate(&self, start: VirtAddr, len: u64, cause: u32, new_start: u64) -> usize {
        let mut st = self.lock();
        let (s, e) = (start.as_u64(), start.as_u64().saturating_add(len));
        let mut records = Vec::new();
        for (&id, r) in &st.regions {
            let (rs, re) = (r.start, r.start + r.pages * PAGE);
            let (cs, ce) = (s.max(rs), e.min(re));
            if cs >= ce {
                continue;
            }
            for i in (cs - rs) >> PAGE_SHIFT..(ce - rs) >> PAGE_SHIFT {
                let w = &r.table.0[TABLE_HEADER_WORDS + i as usize];
                let old = PageStateEntry(w.load(Ordering::Relaxed));
                w.store(
                    PageStateEntry::new(false, false, false, old.version().wrapping_add(1)).0,
                    Ordering::Release,
                );
            }
            r.table.0[TABLE_GENERATION].fetch_add(1, Ordering::AcqRel);
            records.push(InvalidationRecord {
                region_id: id,
                start: cs,
                len: ce - cs,
                cause,
                new_start: if cause == abi::cause::REMAPPED {
                    new_start.wrapping_add(cs - s)
                } else {
                    0
                },
                ..Default::default()
            });
        }
        let mut published = 0;
        if let Some((ring, entries)) = st.ring.clone() {
            for mut rec in records {
                let producer = ring.0[RING_PRODUCER].load(Ordering::Relaxed);
                let consumer = ring.0[RING_CONSUMER].load(Ordering::Acquire);
                if producer.wrapping_sub(consumer) >= entries as u64 {
                    ring.0[RING_DROPPED].fetch_add(1, Ordering::AcqRel);
                    continue;
                }
                rec.seq = st.seq;
                st.seq += 1;
                let base = RING_HEADER_WORDS + (producer % entries as u64) as usize * RECORD_WORDS;
                for (i, chunk) in rec.as_bytes_mut().chunks_exact(8).enumerate() {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(chunk);
                    ring.0[base + i].store(u64::from_ne_bytes(w), Ordering::Relaxed);
                }
                ring.0[RING_PRODUCER].store(producer + 1, Ordering::Release);
                published += 1;
            }
        }
        published
    }

    fn alloc_offset(st: &mut FakeState, block: Arc<HeapBlock>) -> u64 {
        let off = st.next_offset;
        let bytes = (block.0.len() as u64 * 8).next_multiple_of(PAGE);
        st.next_offset += bytes.max(PAGE);
        st.blocks.insert(off, block);
        off
    }

    /// Checks the header and size of an argument and decodes it. `Err(errno)` as the module would.
    fn decode<T: AbiStruct>(&self, arg: &[u8], check_version: bool) -> Result<T, i32> {
        let hdr = T::header(arg).ok_or(libc::EINVAL)?;
        if arg.len() != size_of::<T>() || hdr.struct_size as usize != size_of::<T>() {
            return Err(libc::EINVAL);
        }
        if check_version && hdr.abi_version != self.version {
            return Err(libc::EPROTO);
        }
        T::from_bytes(arg).ok_or(libc::EINVAL)
    }

    fn encode<T: AbiStruct>(mut v: T, arg: &mut [u8]) {
        arg.copy_from_slice(v.as_bytes_mut());
    }

    fn do_register(&self, a: &mut RegisterArgs) {
        let mut st = self.lock();
        let (start, len) = (a.addr, a.len);
        a.status = if len == 0 {
            3
        } else if start % PAGE != 0 || len % PAGE != 0 {
            1
        } else if start.checked_add(len).is_none() {
            2
        } else if a.access != abi::ACCESS_READ && a.access != abi::ACCESS_WRITE {
            21
        } else if let Some((&id, _)) = st
            .regions
            .iter()
            .find(|(_, r)| start < r.start + r.pages * PAGE && r.start < start + len)
        {
            a.region_id = id;
            7
        } else {
            0
        };
        if a.status != 0 {
            return;
        }
        let pages = len / PAGE;
        let table = HeapBlock::new(TABLE_HEADER_WORDS + pages as usize);
        st.next_id += 1;
        let id = st.next_id;
        table.0[0].store(
            header_word(self.version, size_of::<abi::TableHeader>()),
            Ordering::Relaxed,
        );
        table.0[1].store(id, Ordering::Relaxed);
        table.0[2].store(pages, Ordering::Relaxed);
        let off = Self::alloc_offset(&mut st, Arc::clone(&table));
        st.regions.insert(
            id,
            FakeRegion {
                start,
                pages,
                access: a.access,
                table,
            },
        );
        a.region_id = id;
        a.table_offset = off;
        a.table_entries = pages;
    }

    fn do_fault_in(&self, a: &mut FaultInArgs) {
        let mut st = self.lock();
        let huge = st.huge.clone();
        let Some(r) = st.regions.get(&a.region_id) else {
            a.status = 8;
            return;
        };
        let (rs, re) = (r.start, r.start + r.pages * PAGE);
        let end = a.addr.checked_add(a.len);
        a.status = match end {
            _ if a.len == 0 => 3,
            _ if !a.addr.is_multiple_of(PAGE) || !a.len.is_multiple_of(PAGE) => 1,
            None => 2,
            Some(e) if a.addr < rs || e > re => 9,
            _ if a.access == abi::ACCESS_WRITE && r.access == abi::ACCESS_READ => 5,
            _ => 0,
        };
        if a.status != 0 {
            return;
        }
        let write = a.access == abi::ACCESS_WRITE;
        let table = Arc::clone(&r.table);
        let (mut minor, mut major, mut mapped) = (0u32, 0u32, 0u64);
        let mut blocks = std::collections::BTreeSet::new();
        let mut p = a.addr;
        while p < a.addr + a.len {
            let i = ((p - rs) >> PAGE_SHIFT) as usize;
            let w = &table.0[TABLE_HEADER_WORDS + i];
            let old = PageStateEntry(w.load(Ordering::Relaxed));
            let block = p & !(sys::HUGE_2M - 1);
            let in_huge = block >= rs
                && block + sys::HUGE_2M <= re
                && huge
                    .iter()
                    .any(|&(s, e)| s <= block && block + sys::HUGE_2M <= e);
            if !old.present() || (write && !old.writable()) {
                if let Some(pos) = st.swapped.iter().position(|&(s, e)| s <= p && p < e) {
                    major += 1;
                    let (s, e) = st.swapped[pos];
                    // Only this page comes back; the rest of the range stays swapped.
                    st.swapped.remove(pos);
                    if s < p {
                        st.swapped.push((s, p));
                    }
                    if p + PAGE < e {
                        st.swapped.push((p + PAGE, e));
                    }
                } else {
                    minor += 1;
                }
                w.store(
                    PageStateEntry::new(
                        true,
                        write || old.writable(),
                        in_huge,
                        old.version().wrapping_add(1),
                    )
                    .0,
                    Ordering::Release,
                );
            }
            if in_huge {
                blocks.insert(block);
            }
            mapped += 1;
            p += PAGE;
        }
        a.pages_mapped = mapped;
        a.minor_faults = minor;
        a.major_faults = major;
        a.huge_blocks = blocks.len() as u32;
    }

    fn do_ring_setup(&self, a: &mut RingSetupArgs) {
        let mut st = self.lock();
        if !a.entries.is_power_of_two() || a.entries > 1 << 16 {
            a.status = 21;
            return;
        }
        let words = RING_HEADER_WORDS + a.entries as usize * RECORD_WORDS;
        let ring = HeapBlock::new(words);
        ring.0[0].store(
            header_word(self.version, size_of::<abi::RingHeader>()),
            Ordering::Relaxed,
        );
        ring.0[1].store(
            header_word(a.entries, size_of::<InvalidationRecord>()),
            Ordering::Relaxed,
        );
        a.ring_offset = Self::alloc_offset(&mut st, Arc::clone(&ring));
        a.ring_bytes = (words * 8) as u64;
        st.ring = Some((ring, a.entries));
    }
}

impl ModuleBackend for FakeModule {
    fn ioctl(&self, cmd: u32, arg: &mut [u8]) -> Result<(), i32> {
        match cmd {
            abi::IOC_VERSION => {
                let mut v: VersionArgs = self.decode(arg, false)?;
                v.module_version = self.version;
                v.features = abi::FEATURE_HUGE | abi::FEATURE_RING;
                Self::encode(v, arg);
            }
            abi::IOC_REGISTER => {
                let mut a: RegisterArgs = self.decode(arg, true)?;
                self.do_register(&mut a);
                Self::encode(a, arg);
            }
            abi::IOC_UNREGISTER => {
                let mut a: UnregisterArgs = self.decode(arg, true)?;
                let mut st = self.lock();
                match st.regions.remove(&a.region_id) {
                    Some(r) => st.blocks.retain(|_, b| !Arc::ptr_eq(b, &r.table)),
                    None => a.status = 8,
                }
                drop(st);
                Self::encode(a, arg);
            }
            abi::IOC_FAULT_IN => {
                let mut a: FaultInArgs = self.decode(arg, true)?;
                self.do_fault_in(&mut a);
                Self::encode(a, arg);
            }
            abi::IOC_RING_SETUP => {
                let mut a: RingSetupArgs = self.decode(arg, true)?;
                self.do_ring_setup(&mut a);
                Self::encode(a, arg);
            }
            _ => return Err(libc::ENOTTY),
        }
        Ok(())
    }

    fn map(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        let st = self.lock();
        let block = st.blocks.get(&offset).ok_or(GlueError::InvalidArgument {
            what: "unknown mmap offset",
        })?;
        if len > block.0.len() as u64 * 8 {
            return Err(GlueError::InvalidArgument {
                what: "mmap length beyond the module object",
            });
        }
        Ok(SharedMemory::heap(Arc::clone(block)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_module_takes_only_its_own_requests_with_buffers_of_their_size() {
        let register = std::mem::size_of::<abi::RegisterArgs>();
        assert!(module_request_fits(abi::IOC_REGISTER, register));
        assert!(module_request_fits(
            abi::IOC_VERSION,
            std::mem::size_of::<abi::VersionArgs>()
        ));
        // A buffer smaller or larger than the request's argument would let the kernel copy
        // past it, or leave part of it unread.
        assert!(!module_request_fits(abi::IOC_REGISTER, 8));
        assert!(!module_request_fits(abi::IOC_REGISTER, register + 8));
        // Another driver's request of the same size.
        let foreign = sys::ioc(sys::IOC_READ | sys::IOC_WRITE, b'f', 1, register);
        assert!(!module_request_fits(foreign, register));
    }
}
