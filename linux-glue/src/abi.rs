//! The kernel-module ABI: what the user-space half and the nprdma kernel module exchange.
//!
//! On a board (or a host that can load modules) the job user space approximates here is done
//! in the kernel: an `mmu_interval_notifier` per registered region plus `hmm_range_fault` for
//! fault-in (our design after the NP-RDMA abstract, docs/protocol.md §0). The module exposes:
//!
//! - a character device (`DEVICE_NODE`) with the ioctls below;
//! - per region, a **page-state table** (mmap'd read-only): a [`TableHeader`] followed by one
//!   [`PageStateEntry`] (a u64) per 4 KiB page, `{present, writable, huge, version}`; the
//!   version is bumped on every invalidation and every remap, and the header's `generation` on
//!   any invalidation in the region (the optimistic check, option B of docs/protocol.md §0);
//! - one **invalidation event ring** per open file (mmap'd): a [`RingHeader`] followed by
//!   `entries` [`InvalidationRecord`]s. The module writes a record at `producer % entries`, then
//!   publishes it with a release store of `producer + 1`; user space reads up to `producer`
//!   (acquire) and releases slots with a release store of `consumer`. When the ring is full the
//!   module drops the event and increments `dropped` (never overwrites), so user space that sees
//!   `dropped` change must rescan its tables.
//!
//! Every ioctl argument starts with an [`AbiHeader`] carrying the ABI version and the struct
//! size the caller was built with. The module answers a version it does not speak with
//! `EPROTO` (except for `IOC_VERSION`, which always reports the module's version) and a size it
//! does not expect with `EINVAL`. Semantic failures are reported in the `status` field as
//! [`crate::GlueError::code`] values (0 = success).
//!
//! All structs are `#[repr(C)]` with explicit padding, so their layout is the same for a C
//! module on any 64-bit Linux target; the size and offset assertions below pin it. The module
//! (linux-glue/kernel) takes its layouts from `linux-glue/kernel/nprdma_abi.h`, whose
//! `_Static_assert`s pin the same numbers; the test `tests/kernel_abi.rs` compiles that header
//! in user space and compares every size, offset and constant with this file.
//!
//! ABI 2 (the first the real module speaks) added [`IOC_RESOLVE`] (a page's frame, mapping
//! order and fault kind), the causes the MMU notifier reports ([`cause::CLEARED`],
//! [`cause::PROTECTION`], [`cause::RELEASED`]), [`RECORD_NONBLOCKING`], and made the
//! page-state table a read-only mapping (the ring stays read-write: user space writes
//! `consumer`).
//!
//! ABI 3 added device DMA behind an IOMMU ([`FEATURE_DMA`]): [`IOC_DMA_ATTACH`] gives the
//! open file the module's DMA device (QEMU's `edu`) in an unmanaged IOMMU domain where IOVA =
//! the process's virtual address, every page of a registered region mapped either to its
//! frame (present in the table) or to the file's scratch page (absent); [`IOC_DMA`] runs one
//! transfer between a registered buffer and the device and reports the page versions seen
//! before and after it, so user space re-sends a transfer that may have used the scratch
//! page (NP-RDMA's scheme; docs/linux-glue.md, "The IOMMU half").

use std::mem::offset_of;
use std::sync::atomic::AtomicU64;

use crate::sys::{IOC_READ, IOC_WRITE, ioc};

/// The ABI version this crate speaks.
pub const ABI_VERSION: u32 = 4;
/// The module's character device.
pub const DEVICE_NODE: &str = "/dev/nprdma-glue";
/// ioctl type byte. Unassigned in Documentation/userspace-api/ioctl/ioctl-number.rst as read
/// (the 0xD0-0xDA row is empty); reserve it there before the module goes upstream.
pub const IOCTL_MAGIC: u8 = 0xD7;

/// Leads every ioctl argument.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AbiHeader {
    /// [`ABI_VERSION`] of the caller.
    pub abi_version: u32,
    /// `size_of` the whole argument struct as the caller knows it.
    pub struct_size: u32,
}

impl AbiHeader {
    /// A header for struct `T` at [`ABI_VERSION`].
    pub const fn for_struct<T>() -> Self {
        Self {
            abi_version: ABI_VERSION,
            struct_size: size_of::<T>() as u32,
        }
    }
}

/// `IOC_VERSION`: handshake.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VersionArgs {
    /// In.
    pub hdr: AbiHeader,
    /// Out: the version the module speaks.
    pub module_version: u32,
    /// Out: feature bits (`FEATURE_*`).
    pub features: u32,
}

/// Module feature: fault-in reports huge (2 MiB) blocks.
pub const FEATURE_HUGE: u32 = 1 << 0;
/// Module feature: the event ring is available.
pub const FEATURE_RING: u32 = 1 << 1;
/// Module feature: `IOC_RESOLVE` returns frames (ABI 2).
pub const FEATURE_RESOLVE: u32 = 1 << 2;
/// Module feature: `IOC_DMA_ATTACH` and `IOC_DMA` exist (ABI 3; whether a device is bound is
/// the attach's answer).
pub const FEATURE_DMA: u32 = 1 << 3;

/// Device access: read (device reads memory).
pub const ACCESS_READ: u32 = 1;
/// Device access: write (device writes memory; implies read).
pub const ACCESS_WRITE: u32 = 2;

/// `IOC_REGISTER`: register `[addr, addr + len)` without pinning.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegisterArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: first byte (4 KiB aligned).
    pub addr: u64,
    /// In: length (multiple of 4 KiB).
    pub len: u64,
    /// In: `ACCESS_READ` or `ACCESS_WRITE`.
    pub access: u32,
    /// In: reserved, 0.
    pub flags: u32,
    /// Out: region id (never 0).
    pub region_id: u64,
    /// Out: mmap offset of the page-state table.
    pub table_offset: u64,
    /// Out: number of table entries (pages).
    pub table_entries: u64,
    /// Out: 0 or an error code.
    pub status: u32,
    /// Padding, 0.
    pub reserved: u32,
}

/// `IOC_UNREGISTER`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnregisterArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: the region.
    pub region_id: u64,
    /// Out: 0 or an error code.
    pub status: u32,
    /// Padding, 0.
    pub reserved: u32,
}

/// Fault-in flag: do not fault, only report (refresh the table from the page tables).
pub const FAULT_IN_QUERY_ONLY: u32 = 1 << 0;

/// `IOC_FAULT_IN`: fault in `[addr, addr + len)` of a region and map it for the device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultInArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: the region.
    pub region_id: u64,
    /// In: first byte (4 KiB aligned).
    pub addr: u64,
    /// In: length (multiple of 4 KiB).
    pub len: u64,
    /// In: `ACCESS_READ` or `ACCESS_WRITE`.
    pub access: u32,
    /// In: `FAULT_IN_*`.
    pub flags: u32,
    /// Out: pages now present and mapped.
    pub pages_mapped: u64,
    /// Out: minor faults taken.
    pub minor_faults: u32,
    /// Out: major faults taken.
    pub major_faults: u32,
    /// Out: 2 MiB blocks mapped as one unit.
    pub huge_blocks: u32,
    /// Out: 0 or an error code.
    pub status: u32,
}

/// Resolution kinds in [`ResolveArgs::kind`].
pub mod kind {
    /// The page was already mapped: no fault was taken.
    pub const PRESENT: u32 = 0;
    /// A minor fault made it present.
    pub const MINOR: u32 = 1;
    /// A major fault (I/O: swap-in, a file read) made it present.
    pub const MAJOR: u32 = 2;
    /// Query only: the CPU does not map the page.
    pub const ABSENT: u32 = 3;
}

/// `IOC_RESOLVE` (ABI 2): make one page present for `access` and return its frame, as an
/// SMMU or a NIC needs it to map the page.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResolveArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: the region.
    pub region_id: u64,
    /// In: the page (4 KiB aligned, inside the region).
    pub addr: u64,
    /// In: `ACCESS_READ` or `ACCESS_WRITE`.
    pub access: u32,
    /// In: `FAULT_IN_QUERY_ONLY` or 0.
    pub flags: u32,
    /// Out: the frame number of `mapping_start`.
    pub pfn: u64,
    /// Out: the page, or the naturally aligned 2 MiB block that maps it (`order` 9).
    pub mapping_start: u64,
    /// Out: 0 (4 KiB) or 9 (2 MiB, the block lies inside the region).
    pub order: u32,
    /// Out: a [`kind`] value.
    pub kind: u32,
    /// Out: the page's table version afterwards.
    pub version: u32,
    /// Out: 0 or an error code.
    pub status: u32,
}

/// `IOC_RING_SETUP`: create the invalidation event ring of this open file.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingSetupArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: number of records, a power of two.
    pub entries: u32,
    /// In: reserved, 0.
    pub flags: u32,
    /// Out: mmap offset of the ring.
    pub ring_offset: u64,
    /// Out: bytes to map (header + records).
    pub ring_bytes: u64,
    /// Out: 0 or an error code.
    pub status: u32,
    /// Padding, 0.
    pub reserved: u32,
}

/// `IOC_DMA_ATTACH` (ABI 3): give this open file the module's DMA device in an IOMMU domain of
/// its own where IOVA = virtual address. Errnos: `ENODEV` no device is bound (or it sits behind
/// no IOMMU), `EBUSY` another open file holds it, `EALREADY` this one does. Every page of every
/// region of the file is then mapped for the device, to its frame or to the scratch page; the
/// tables' entries start absent (their versions bumped).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaAttachArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: reserved, 0.
    pub flags: u32,
    /// Out: 0 or an error code.
    pub status: u32,
    /// Out: the domain's page sizes (`iommu_domain.pgsize_bitmap`).
    pub pgsize_bitmap: u64,
    /// Out: the last IOVA the domain translates (`geometry.aperture_end`).
    pub aperture_end: u64,
    /// Out: the device's PCI address, `domain << 16 | bus << 8 | devfn`.
    pub pci_address: u32,
    /// Padding, 0.
    pub reserved: u32,
}

/// [`DmaArgs::direction`]: the device reads memory (RAM to the device's buffer).
pub const DMA_TO_DEVICE: u32 = 1;
/// [`DmaArgs::direction`]: the device writes memory (its buffer to RAM).
pub const DMA_FROM_DEVICE: u32 = 2;
/// The device's buffer (QEMU `edu`: 4 KiB at offset 0x40000 of its DMA space).
pub const DMA_BUFFER_BYTES: u32 = 4096;

/// `IOC_DMA` (ABI 3): one transfer between `[addr, addr + len)` of a region (IOVA = address)
/// and the device's buffer at `dev_offset`, waited for on the device's interrupt. Errnos:
/// `ENODEV` no device, `ENOTCONN` this file has not attached it, `ETIMEDOUT` no completion
/// within 5 s, `EINTR` a fatal signal (the transfer may still run; the module waits for it
/// before unmapping anything it could touch). Statuses: 8 unknown region, 9 the range is not
/// inside the region, 5 a device write to a read-only region or to a page present read-only
/// (fault it in for write first), 21 bad length, offset, direction or flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaArgs {
    /// In.
    pub hdr: AbiHeader,
    /// In: the region.
    pub region_id: u64,
    /// In: first byte (any alignment; the IOVA the device uses).
    pub addr: u64,
    /// In: bytes, 1 to [`DMA_BUFFER_BYTES`].
    pub len: u32,
    /// In: [`DMA_TO_DEVICE`] or [`DMA_FROM_DEVICE`].
    pub direction: u32,
    /// In: offset in the device's buffer; `dev_offset + len <= DMA_BUFFER_BYTES`.
    pub dev_offset: u32,
    /// In: reserved, 0.
    pub flags: u32,
    /// Out: pages the transfer touches (1 or 2).
    pub pages: u32,
    /// Out: bit i set = page i was present (mapped to its frame) when the transfer started.
    pub present_before: u32,
    /// Out: the pages' table versions when the transfer started.
    pub version_before: [u32; 2],
    /// Out: the pages' table versions at its completion.
    pub version_after: [u32; 2],
    /// Out: from the start to the completion interrupt, in ns of the kernel's clock.
    pub elapsed_ns: u64,
    /// Out: 1 = a page was absent at the start or changed before the completion: the device
    /// may have used the scratch page; fault in and re-send.
    pub stale: u32,
    /// Out: 0 or an error code.
    pub status: u32,
}

/// The shared header of the event ring. `producer` and `consumer` sit on their own 64-byte
/// lines so the two writers do not false-share.
#[repr(C)]
#[derive(Debug)]
pub struct RingHeader {
    /// Version and size of this header.
    pub hdr: AbiHeader,
    /// Number of records (power of two).
    pub entries: u32,
    /// `size_of::<InvalidationRecord>()`.
    pub entry_size: u32,
    /// Events dropped because the ring was full (module writes).
    pub dropped: AtomicU64,
    /// Padding to the producer line.
    pub reserved0: [u64; 5],
    /// Records published (module writes, release).
    pub producer: AtomicU64,
    /// Padding to the consumer line.
    pub reserved1: [u64; 7],
    /// Records consumed (user writes, release).
    pub consumer: AtomicU64,
    /// Padding to the end of the line.
    pub reserved2: [u64; 7],
}

/// Invalidation causes in [`InvalidationRecord::cause`].
pub mod cause {
    /// MADV_DONTNEED/FREE/REMOVE.
    pub const REMOVED: u32 = 1;
    /// munmap.
    pub const UNMAPPED: u32 = 2;
    /// mremap moved the range to `new_start`.
    pub const REMAPPED: u32 = 3;
    /// Reclaimed to swap.
    pub const SWAPPED_OUT: u32 = 4;
    /// Reclaimed without swap (file page dropped).
    pub const DROPPED: u32 = 5;
    /// Migrated / compacted / COW / KSM / THP collapse: a new frame (the user-space glue's
    /// reclaim scan). The module writes it only for `MMU_NOTIFY_MIGRATE` (`migrate_vma`).
    pub const FRAME_CHANGED: u32 = 6;
    /// The module's `MMU_NOTIFY_CLEAR` (and `MMU_NOTIFY_EXCLUSIVE`): the CPU's PTEs were
    /// cleared: `madvise(DONTNEED)`, reclaim, migration and compaction, COW, a THP split, ...
    /// (the notifier does not say which).
    pub const CLEARED: u32 = 7;
    /// The module's `MMU_NOTIFY_PROTECTION_VMA/PAGE` and `MMU_NOTIFY_SOFT_DIRTY`:
    /// `mprotect`, write-protection for fork's COW or for writeback, soft-dirty tracking.
    pub const PROTECTION: u32 = 8;
    /// The module's `MMU_NOTIFY_RELEASE`: the process's mm is gone (exit, exec).
    pub const RELEASED: u32 = 9;
    /// ABI 4: not an invalidation but an IOMMU fault the SMMU driver reported for the file's
    /// domain (arm-smmu / MMU-500 context faults): `start` = the IOVA (a virtual address of
    /// the process), `len` 0, `region_id` 0, `new_start` = the device's PCI requester ID,
    /// [`super::RECORD_DEVICE_WRITE`] for a write. Decoded by `kmod::DeviceFault`.
    pub const DEVICE_FAULT: u32 = 10;
}

/// [`InvalidationRecord::flags`]: the invalidation came from a context that may not block
/// (`mmu_notifier_range_blockable` false, e.g. the OOM reaper).
pub const RECORD_NONBLOCKING: u32 = 1 << 0;

/// [`InvalidationRecord::flags`] of a [`cause::DEVICE_FAULT`] record (ABI 4): the faulting
/// access was a write.
pub const RECORD_DEVICE_WRITE: u32 = 1 << 1;

/// One record of the event ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InvalidationRecord {
    /// Sequence number (0, 1, 2, ... per ring).
    pub seq: u64,
    /// The region.
    pub region_id: u64,
    /// First byte invalidated.
    pub start: u64,
    /// Bytes invalidated.
    pub len: u64,
    /// A [`cause`] value.
    pub cause: u32,
    /// `RECORD_*` bits.
    pub flags: u32,
    /// For `REMAPPED`: the new address of `start`; for `DEVICE_FAULT`: the device's PCI
    /// requester ID; otherwise 0.
    pub new_start: u64,
}

/// The header of a region's page-state table; entries follow it.
#[repr(C)]
#[derive(Debug)]
pub struct TableHeader {
    /// Version and size of this header.
    pub hdr: AbiHeader,
    /// The region.
    pub region_id: u64,
    /// Number of entries.
    pub entries: u64,
    /// Bumped on every invalidation in the region (module writes, release).
    pub generation: AtomicU64,
}

/// One page-state table entry: bit 0 present, bit 1 writable (mapped for device writes), bit 2
/// part of a 2 MiB block mapping, bits 32-63 the page's version. The module updates an entry
/// with one 64-bit store, so readers never see a torn entry.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageStateEntry(pub u64);

impl PageStateEntry {
    /// Bit 0.
    pub const PRESENT: u64 = 1 << 0;
    /// Bit 1.
    pub const WRITABLE: u64 = 1 << 1;
    /// Bit 2.
    pub const HUGE: u64 = 1 << 2;

    /// Builds an entry.
    pub const fn new(present: bool, writable: bool, huge: bool, version: u32) -> Self {
        Self(
            ((present as u64) * Self::PRESENT)
                | ((writable as u64) * Self::WRITABLE)
                | ((huge as u64) * Self::HUGE)
                | (version as u64) << 32,
        )
    }
    /// Present and mapped for the device.
    pub const fn present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }
    /// Mapped for device writes.
    pub const fn writable(self) -> bool {
        self.0 & Self::WRITABLE != 0
    }
    /// Part of a 2 MiB block mapping.
    pub const fn huge(self) -> bool {
        self.0 & Self::HUGE != 0
    }
    /// The page's version.
    pub const fn version(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// `IOC_VERSION = _IOWR(0xD7, 0x00, VersionArgs)`.
pub const IOC_VERSION: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x00,
    size_of::<VersionArgs>(),
);
/// `IOC_REGISTER = _IOWR(0xD7, 0x01, RegisterArgs)`.
pub const IOC_REGISTER: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x01,
    size_of::<RegisterArgs>(),
);
/// `IOC_UNREGISTER = _IOWR(0xD7, 0x02, UnregisterArgs)`.
pub const IOC_UNREGISTER: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x02,
    size_of::<UnregisterArgs>(),
);
/// `IOC_FAULT_IN = _IOWR(0xD7, 0x03, FaultInArgs)`.
pub const IOC_FAULT_IN: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x03,
    size_of::<FaultInArgs>(),
);
/// `IOC_RING_SETUP = _IOWR(0xD7, 0x04, RingSetupArgs)`.
pub const IOC_RING_SETUP: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x04,
    size_of::<RingSetupArgs>(),
);
/// `IOC_RESOLVE = _IOWR(0xD7, 0x05, ResolveArgs)` (ABI 2).
pub const IOC_RESOLVE: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x05,
    size_of::<ResolveArgs>(),
);

/// `IOC_DMA_ATTACH = _IOWR(0xD7, 0x06, DmaAttachArgs)` (ABI 3).
pub const IOC_DMA_ATTACH: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x06,
    size_of::<DmaAttachArgs>(),
);
/// `IOC_DMA = _IOWR(0xD7, 0x07, DmaArgs)` (ABI 3).
pub const IOC_DMA: u32 = ioc(
    IOC_READ | IOC_WRITE,
    IOCTL_MAGIC,
    0x07,
    size_of::<DmaArgs>(),
);

// Layout pins: a change here is an ABI break and needs ABI_VERSION + 1.
const _: () = {
    assert!(size_of::<AbiHeader>() == 8);
    assert!(size_of::<VersionArgs>() == 16);
    assert!(size_of::<RegisterArgs>() == 64);
    assert!(offset_of!(RegisterArgs, addr) == 8);
    assert!(offset_of!(RegisterArgs, len) == 16);
    assert!(offset_of!(RegisterArgs, access) == 24);
    assert!(offset_of!(RegisterArgs, region_id) == 32);
    assert!(offset_of!(RegisterArgs, table_offset) == 40);
    assert!(offset_of!(RegisterArgs, table_entries) == 48);
    assert!(offset_of!(RegisterArgs, status) == 56);
    assert!(size_of::<UnregisterArgs>() == 24);
    assert!(offset_of!(UnregisterArgs, status) == 16);
    assert!(size_of::<FaultInArgs>() == 64);
    assert!(offset_of!(FaultInArgs, region_id) == 8);
    assert!(offset_of!(FaultInArgs, access) == 32);
    assert!(offset_of!(FaultInArgs, pages_mapped) == 40);
    assert!(offset_of!(FaultInArgs, minor_faults) == 48);
    assert!(offset_of!(FaultInArgs, status) == 60);
    assert!(size_of::<ResolveArgs>() == 64);
    assert!(offset_of!(ResolveArgs, region_id) == 8);
    assert!(offset_of!(ResolveArgs, addr) == 16);
    assert!(offset_of!(ResolveArgs, access) == 24);
    assert!(offset_of!(ResolveArgs, pfn) == 32);
    assert!(offset_of!(ResolveArgs, mapping_start) == 40);
    assert!(offset_of!(ResolveArgs, order) == 48);
    assert!(offset_of!(ResolveArgs, kind) == 52);
    assert!(offset_of!(ResolveArgs, version) == 56);
    assert!(offset_of!(ResolveArgs, status) == 60);
    assert!(size_of::<RingSetupArgs>() == 40);
    assert!(offset_of!(RingSetupArgs, ring_offset) == 16);
    assert!(size_of::<RingHeader>() == 192);
    assert!(offset_of!(RingHeader, dropped) == 16);
    assert!(offset_of!(RingHeader, producer) == 64);
    assert!(offset_of!(RingHeader, consumer) == 128);
    assert!(size_of::<InvalidationRecord>() == 48);
    assert!(offset_of!(InvalidationRecord, cause) == 32);
    assert!(offset_of!(InvalidationRecord, new_start) == 40);
    assert!(size_of::<TableHeader>() == 32);
    assert!(offset_of!(TableHeader, generation) == 24);
    assert!(size_of::<PageStateEntry>() == 8);
    assert!(size_of::<DmaAttachArgs>() == 40);
    assert!(offset_of!(DmaAttachArgs, flags) == 8);
    assert!(offset_of!(DmaAttachArgs, status) == 12);
    assert!(offset_of!(DmaAttachArgs, pgsize_bitmap) == 16);
    assert!(offset_of!(DmaAttachArgs, aperture_end) == 24);
    assert!(offset_of!(DmaAttachArgs, pci_address) == 32);
    assert!(size_of::<DmaArgs>() == 80);
    assert!(offset_of!(DmaArgs, region_id) == 8);
    assert!(offset_of!(DmaArgs, addr) == 16);
    assert!(offset_of!(DmaArgs, len) == 24);
    assert!(offset_of!(DmaArgs, direction) == 28);
    assert!(offset_of!(DmaArgs, dev_offset) == 32);
    assert!(offset_of!(DmaArgs, flags) == 36);
    assert!(offset_of!(DmaArgs, pages) == 40);
    assert!(offset_of!(DmaArgs, present_before) == 44);
    assert!(offset_of!(DmaArgs, version_before) == 48);
    assert!(offset_of!(DmaArgs, version_after) == 56);
    assert!(offset_of!(DmaArgs, elapsed_ns) == 64);
    assert!(offset_of!(DmaArgs, stale) == 72);
    assert!(offset_of!(DmaArgs, status) == 76);
};

/// Plain-old-data ABI structs that may be viewed as bytes and rebuilt from bytes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, contain no padding (checked by the layout assertions above)
/// and every bit pattern is a valid value.
pub unsafe trait AbiStruct: Copy + Default {
    /// Name for error messages.
    const NAME: &'static str;

    /// The bytes of `self`.
    fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: Self is POD without padding (trait contract), so all size_of::<Self>() bytes
        // are initialised and any bytes written back form a valid Self.
        unsafe {
            std::slice::from_raw_parts_mut((self as *mut Self).cast::<u8>(), size_of::<Self>())
        }
    }

    /// Rebuilds a value from `bytes` (exactly `size_of::<Self>()` long).
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != size_of::<Self>() {
            return None;
        }
        // SAFETY: the length matches and every bit pattern is a valid Self (trait contract);
        // read_unaligned copes with any alignment of the byte buffer.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    /// The header at the start of the struct.
    fn header(bytes: &[u8]) -> Option<AbiHeader> {
        AbiHeader::from_bytes(bytes.get(..size_of::<AbiHeader>())?)
    }
}

// SAFETY: repr(C), two u32, no padding, any bits valid.
unsafe impl AbiStruct for AbiHeader {
    const NAME: &'static str = "AbiHeader";
}
// SAFETY: repr(C), layout pinned above without padding, integers only.
unsafe impl AbiStruct for VersionArgs {
    const NAME: &'static str = "VersionArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for RegisterArgs {
    const NAME: &'static str = "RegisterArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for UnregisterArgs {
    const NAME: &'static str = "UnregisterArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for FaultInArgs {
    const NAME: &'static str = "FaultInArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for RingSetupArgs {
    const NAME: &'static str = "RingSetupArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for ResolveArgs {
    const NAME: &'static str = "ResolveArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for DmaAttachArgs {
    const NAME: &'static str = "DmaAttachArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for DmaArgs {
    const NAME: &'static str = "DmaArgs";
}
// SAFETY: as above.
unsafe impl AbiStruct for InvalidationRecord {
    const NAME: &'static str = "InvalidationRecord";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_use_the_generic_encoding() {
        // dir=3 (read|write) << 30 | size << 16 | 0xD7 << 8 | nr, by hand.
        assert_eq!(IOC_VERSION, 0xC010_D700);
        assert_eq!(IOC_REGISTER, 0xC040_D701);
        assert_eq!(IOC_UNREGISTER, 0xC018_D702);
        assert_eq!(IOC_FAULT_IN, 0xC040_D703);
        assert_eq!(IOC_RING_SETUP, 0xC028_D704);
        assert_eq!(IOC_RESOLVE, 0xC040_D705);
        assert_eq!(IOC_DMA_ATTACH, 0xC028_D706);
        assert_eq!(IOC_DMA, 0xC050_D707);
    }

    #[test]
    fn entries_pack_per_the_documented_bits() {
        let e = PageStateEntry::new(true, false, true, 0xABCD_0001);
        assert_eq!(e.0, 0xABCD_0001_0000_0005);
        assert!(e.present() && !e.writable() && e.huge());
        assert_eq!(e.version(), 0xABCD_0001);
        assert_eq!(PageStateEntry::new(false, true, false, 0).0, 2);
    }

    #[test]
    fn structs_round_trip_through_bytes() {
        let mut a = FaultInArgs {
            hdr: AbiHeader::for_struct::<FaultInArgs>(),
            region_id: 7,
            addr: 0x7000_0000,
            len: 0x3000,
            access: ACCESS_WRITE,
            status: 5,
            ..Default::default()
        };
        let bytes = a.as_bytes_mut().to_vec();
        assert_eq!(bytes.len(), 64);
        // Little-endian hosts: region_id at offset 8, status at 60.
        assert_eq!(u64::from_ne_bytes(bytes[8..16].try_into().unwrap()), 7);
        assert_eq!(u32::from_ne_bytes(bytes[60..64].try_into().unwrap()), 5);
        assert_eq!(FaultInArgs::from_bytes(&bytes), Some(a));
        assert_eq!(FaultInArgs::from_bytes(&bytes[..63]), None);
        assert_eq!(
            FaultInArgs::header(&bytes),
            Some(AbiHeader {
                abi_version: ABI_VERSION,
                struct_size: 64
            })
        );
    }
}
