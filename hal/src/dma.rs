//! DMA memory: the trait drivers allocate descriptor rings, page tables and buffers through
//! (after virtio-drivers' `Hal`), a page-bitmap allocator usable without `std`, and a host
//! implementation whose memory doubles as the simulated DRAM that device models read by
//! physical address.

use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use crate::addr::{PageSize, PhysAddr};
use crate::{HalError, Result};

/// Size of the allocation unit.
pub const DMA_PAGE: usize = 4096;

/// Which way data moves; decides cache maintenance on non-coherent systems.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DmaDirection {
    /// The CPU writes, the device reads (descriptors, transmit buffers, page tables).
    ToDevice,
    /// The device writes, the CPU reads (completions, receive buffers, event queues).
    FromDevice,
    /// Both.
    Bidirectional,
}

/// A DMA-able region: CPU-visible memory with a bus address the device uses.
///
/// The region is not `Clone`: freeing it consumes the only handle. The device may read or write
/// the memory at any time, so every access is a relaxed atomic one (aligned u64s whole).
#[derive(Debug)]
pub struct DmaRegion {
    cpu: NonNull<u8>,
    bus: PhysAddr,
    len: usize,
    direction: DmaDirection,
}

// SAFETY: the region is plain memory shared with a device; all accesses through this type are
// volatile copies, and ownership (who frees it) follows the value.
unsafe impl Send for DmaRegion {}

impl DmaRegion {
    /// Builds a region.
    ///
    /// # Safety
    /// `cpu` must point to `len` bytes of memory that stay valid until the region is handed back
    /// to the allocator that made it, and the device must see that memory at `bus`. `cpu` must
    /// be at least 8-byte aligned ([`read_u64`](Self::read_u64) and
    /// [`write_u64`](Self::write_u64) rely on it; allocators hand out 4 KiB-aligned regions).
    pub unsafe fn from_raw_parts(
        cpu: NonNull<u8>,
        bus: PhysAddr,
        len: usize,
        direction: DmaDirection,
    ) -> Self {
        Self {
            cpu,
            bus,
            len,
            direction,
        }
    }

    /// The address the device uses.
    pub fn bus_addr(&self) -> PhysAddr {
        self.bus
    }

    /// The CPU pointer. Accesses through it must be volatile or otherwise synchronised with the
    /// device.
    pub fn cpu_ptr(&self) -> NonNull<u8> {
        self.cpu
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never, for regions from an allocator).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The direction the region was allocated for.
    pub fn direction(&self) -> DmaDirection {
        self.direction
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(HalError::PhysOutOfRange {
                addr: self.bus.as_u64().wrapping_add(offset as u64),
                len: len as u64,
            }),
        }
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: in bounds (checked); the memory is valid per `from_raw_parts`, and every
        // access to it is one of `shared`'s.
        unsafe { shared::store(self.cpu.as_ptr().add(offset), data) };
        Ok(())
    }

    /// Copies from the region at `offset` into `out`.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as for `write_bytes`.
        unsafe { shared::load(self.cpu.as_ptr().add(offset), out) };
        Ok(())
    }

    /// Writes a naturally aligned little-endian u64 (one store, so a device never sees half).
    pub fn write_u64(&self, offset: usize, value: u64) -> Result<()> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(HalError::Misaligned {
                value: offset as u64,
                align: 8,
            });
        }
        // SAFETY: in bounds (checked); `offset` is a multiple of 8 (checked) and `cpu` is 8-byte
        // aligned per `from_raw_parts`, so the address is too. One 8-byte store.
        unsafe { shared::store(self.cpu.as_ptr().add(offset), &value.to_le_bytes()) };
        Ok(())
    }

    /// Reads a naturally aligned little-endian u64.
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(HalError::Misaligned {
                value: offset as u64,
                align: 8,
            });
        }
        let mut bytes = [0; 8];
        // SAFETY: as for `write_u64`: one 8-byte load.
        unsafe { shared::load(self.cpu.as_ptr().add(offset), &mut bytes) };
        Ok(u64::from_le_bytes(bytes))
    }
}

/// Accesses to memory a device shares with the CPU.
///
/// Relaxed atomic loads and stores, 8 bytes at a time where the address is 8-byte aligned and
/// byte by byte elsewhere. On AArch64 and x86-64 they compile to the plain loads and stores a
/// volatile access would (an aligned 8-byte access is single-copy atomic: Arm ARM K.a B2.2.1),
/// so a device never sees half of an aligned u64. Unlike volatile accesses they are also
/// defined when a device model in another thread touches the same bytes at the same time, as
/// the host simulations do (`cargo +nightly miri test -p hal` checks it). Both sides use the
/// same access sizes for the same aligned words, as the memory model asks.
pub(crate) mod shared {
    use super::*;

    /// Copies `out.len()` bytes from `src` into `out`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `out.len()` bytes, and those bytes accessed only through
    /// this module (or not concurrently).
    pub(crate) unsafe fn load(src: *const u8, out: &mut [u8]) {
        let mut at = 0;
        while at < out.len() {
            // SAFETY: `at < out.len()`, within the caller's range.
            let p = unsafe { src.add(at) }.cast_mut();
            if p.cast::<u64>().is_aligned() && out.len() - at >= 8 {
                // SAFETY: 8 valid, aligned bytes of the range, accessed only atomically.
                let word = unsafe { AtomicU64::from_ptr(p.cast()) }.load(Ordering::Relaxed);
                out[at..at + 8].copy_from_slice(&word.to_ne_bytes());
                at += 8;
            } else {
                // SAFETY: a valid byte of the range, accessed only atomically.
                out[at] = unsafe { AtomicU8::from_ptr(p) }.load(Ordering::Relaxed);
                at += 1;
            }
        }
    }

    /// Copies `data` to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `data.len()` bytes, and those bytes accessed only
    /// through this module (or not concurrently).
    pub(crate) unsafe fn store(dst: *mut u8, data: &[u8]) {
        let mut at = 0;
        while at < data.len() {
            // SAFETY: `at < data.len()`, within the caller's range.
            let p = unsafe { dst.add(at) };
            if p.cast::<u64>().is_aligned() && data.len() - at >= 8 {
                let mut word = [0; 8];
                word.copy_from_slice(&data[at..at + 8]);
                // SAFETY: 8 valid, aligned bytes of the range, accessed only atomically.
                unsafe { AtomicU64::from_ptr(p.cast()) }
                    .store(u64::from_ne_bytes(word), Ordering::Relaxed);
                at += 8;
            } else {
                // SAFETY: a valid byte of the range, accessed only atomically.
                unsafe { AtomicU8::from_ptr(p) }.store(data[at], Ordering::Relaxed);
                at += 1;
            }
        }
    }
}

/// A free the allocator refused because the region is not one it handed out (another
/// allocator's, or already freed). The region comes back untouched, so freeing into the wrong
/// allocator loses nothing: the caller can still free it into the right one.
#[derive(Debug)]
pub struct RefusedFree {
    /// Why: [`HalError::DmaUnknownRegion`].
    pub error: HalError,
    /// The region, as it was passed in.
    pub region: DmaRegion,
}

impl From<RefusedFree> for HalError {
    /// Gives the region up for the error, for callers that can only report. Its memory is never
    /// released, so this leaks it, but nothing can reuse it under a live pointer either.
    fn from(refused: RefusedFree) -> Self {
        refused.error
    }
}

/// An allocator of DMA memory.
///
/// # Implementation safety
/// A region returned by [`allocate`](DmaMemory::allocate) must be zeroed, 4 KiB aligned (CPU
/// pointer and bus address), exclusively owned until freed, and visible to devices at its bus
/// address. [`sync_for_device`](DmaMemory::sync_for_device) must make CPU writes visible to the
/// device and [`sync_for_cpu`](DmaMemory::sync_for_cpu) device writes to the CPU.
pub unsafe trait DmaMemory {
    /// Allocates `pages` zeroed 4 KiB pages, physically contiguous.
    fn allocate(&self, pages: usize, direction: DmaDirection) -> Result<DmaRegion>;
    /// Returns a region to the allocator. A region it did not hand out is refused and given
    /// back in the error.
    fn free(&self, region: DmaRegion) -> core::result::Result<(), RefusedFree>;
    /// Makes CPU writes in `region` visible to the device (cache clean on non-coherent
    /// systems). Coherent implementations only need a store barrier.
    fn sync_for_device(&self, _region: &DmaRegion) {
        crate::barrier::dsb_st();
    }
    /// Makes device writes in `region` visible to the CPU (cache invalidate on non-coherent
    /// systems).
    fn sync_for_cpu(&self, _region: &DmaRegion) {
        crate::barrier::issue(crate::barrier::Barrier::DsbLd);
    }
}

/// A first-fit allocator of contiguous page runs over a bitmap (one bit per page).
#[derive(Debug)]
pub struct PageBitmap<S> {
    words: S,
    pages: usize,
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> PageBitmap<S> {
    /// Manages `pages` pages with `words` as storage (all pages free).
    pub fn new(mut words: S, pages: usize) -> Result<Self> {
        if words.as_ref().len().saturating_mul(64) < pages {
            return Err(HalError::DmaExhausted {
                requested: pages.saturating_mul(DMA_PAGE),
            });
        }
        words.as_mut().fill(0);
        Ok(Self { words, pages })
    }

    fn is_used(&self, page: usize) -> bool {
        self.words.as_ref()[page / 64] & (1 << (page % 64)) != 0
    }

    fn set(&mut self, page: usize, used: bool) {
        let w = &mut self.words.as_mut()[page / 64];
        if used {
            *w |= 1 << (page % 64);
        } else {
            *w &= !(1 << (page % 64));
        }
    }

    /// Allocates `count` contiguous pages; returns the first page index.
    pub fn allocate(&mut self, count: usize) -> Result<usize> {
        if count == 0 {
            return Err(HalError::EmptyRange);
        }
        let mut run_start = 0;
        let mut run = 0;
        for page in 0..self.pages {
            if self.is_used(page) {
                run = 0;
                run_start = page + 1;
                continue;
            }
            run += 1;
            if run == count {
                for p in run_start..run_start + count {
                    self.set(p, true);
                }
                return Ok(run_start);
            }
        }
        Err(HalError::DmaExhausted {
            requested: count.saturating_mul(DMA_PAGE),
        })
    }

    /// Frees `count` pages from `first`; every one must be allocated.
    pub fn free(&mut self, first: usize, count: usize) -> Result<()> {
        let end = first
            .checked_add(count)
            .filter(|&e| e <= self.pages && count > 0);
        let Some(end) = end else {
            return Err(HalError::DmaUnknownRegion {
                bus: first.saturating_mul(DMA_PAGE) as u64,
            });
        };
        if (first..end).any(|p| !self.is_used(p)) {
            return Err(HalError::DmaUnknownRegion {
                bus: first.saturating_mul(DMA_PAGE) as u64,
            });
        }
        for p in first..end {
            self.set(p, false);
        }
        Ok(())
    }

    /// Pages currently allocated.
    pub fn used_pages(&self) -> usize {
        self.words
            .as_ref()
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum()
    }
}

/// A tiny spin lock for the `no_std` pool (single core firmware; no contention expected).
struct SpinLock<T> {
    locked: AtomicBool,
    value: core::cell::UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: core::cell::UnsafeCell::new(value),
        }
    }
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        // SAFETY: we hold the lock.
        let r = f(unsafe { &mut *self.value.get() });
        self.locked.store(false, Ordering::Release);
        r
    }
}

/// DMA memory from a fixed, identity-or-offset-mapped pool: firmware's allocator. `WORDS * 64`
/// pages at most.
pub struct PoolDma<const WORDS: usize> {
    cpu_base: NonNull<u8>,
    bus_base: PhysAddr,
    bitmap: SpinLock<PageBitmap<[u64; WORDS]>>,
}

// SAFETY: the pool's memory is owned by the pool (per `new`'s contract) and the bitmap is behind
// a lock.
unsafe impl<const WORDS: usize> Sync for PoolDma<WORDS> {}
// SAFETY: as above.
unsafe impl<const WORDS: usize> Send for PoolDma<WORDS> {}

impl<const WORDS: usize> PoolDma<WORDS> {
    /// A pool of `pages` pages at `cpu_base`, seen by devices at `bus_base`. Both ranges
    /// must end below the top of their address spaces (a region's end is always
    /// representable, as everywhere in this crate).
    ///
    /// # Safety
    /// `[cpu_base, cpu_base + pages * 4096)` must be memory used by nothing but the pool and
    /// the regions it hands out, and stay valid as long as the pool **or any region allocated
    /// from it** exists: a [`DmaRegion`] carries no lifetime and may outlive the pool (the
    /// firmware's pools are `'static` memory). It must be 4 KiB aligned, mapped so that the
    /// CPU and devices agree (coherent or non-cacheable), and visible to devices at
    /// `bus_base`.
    pub unsafe fn new(cpu_base: NonNull<u8>, bus_base: PhysAddr, pages: usize) -> Result<Self> {
        bus_base.require_aligned(PageSize::Size4K)?;
        if !(cpu_base.as_ptr() as usize).is_multiple_of(DMA_PAGE) {
            return Err(HalError::Misaligned {
                value: cpu_base.as_ptr() as u64,
                align: DMA_PAGE as u64,
            });
        }
        let len = pages
            .checked_mul(DMA_PAGE)
            .ok_or(HalError::AddressOverflow {
                base: bus_base.as_u64(),
                offset: u64::MAX,
            })?;
        bus_base.checked_add(len as u64)?;
        (cpu_base.as_ptr() as usize)
            .checked_add(len)
            .ok_or(HalError::AddressOverflow {
                base: cpu_base.as_ptr() as u64,
                offset: len as u64,
            })?;
        Ok(Self {
            cpu_base,
            bus_base,
            bitmap: SpinLock::new(PageBitmap::new([0; WORDS], pages)?),
        })
    }
}

// SAFETY: regions are carved from the pool the caller handed over; pages are zeroed on
// allocation and tracked by the bitmap so no two regions overlap.
unsafe impl<const WORDS: usize> DmaMemory for PoolDma<WORDS> {
    fn allocate(&self, pages: usize, direction: DmaDirection) -> Result<DmaRegion> {
        let first = self.bitmap.with(|b| b.allocate(pages))?;
        let offset = first * DMA_PAGE;
        let len = pages * DMA_PAGE;
        let bus = match self.bus_base.checked_add(offset as u64) {
            Ok(bus) => bus,
            Err(e) => {
                // Give the pages back: a failed allocation takes nothing.
                let _ = self.bitmap.with(|b| b.free(first, pages));
                return Err(e);
            }
        };
        // SAFETY: within the pool (the bitmap covers exactly the pool's pages).
        let cpu = unsafe { NonNull::new_unchecked(self.cpu_base.as_ptr().add(offset)) };
        // SAFETY: `cpu` is valid for `len` bytes and exclusively ours now.
        unsafe { core::ptr::write_bytes(cpu.as_ptr(), 0, len) };
        // SAFETY: the memory stays valid while the region exists (`new`'s contract), and the
        // bitmap gives these pages to this region alone until it is freed back.
        Ok(unsafe { DmaRegion::from_raw_parts(cpu, bus, len, direction) })
    }

    fn free(&self, region: DmaRegion) -> core::result::Result<(), RefusedFree> {
        let Some(first) = self.page_of(&region) else {
            return Err(RefusedFree::unknown(region));
        };
        let pages = region.len().div_ceil(DMA_PAGE);
        match self.bitmap.with(|b| b.free(first, pages)) {
            Ok(()) => Ok(()),
            Err(_) => Err(RefusedFree::unknown(region)),
        }
    }
}

impl<const WORDS: usize> PoolDma<WORDS> {
    /// The pool page `region` starts at, if it can be one of this pool's regions: page
    /// aligned at or above the base on the bus, and at the matching CPU address (a region of
    /// another allocator at the same bus addresses must not free pages of this one).
    fn page_of(&self, region: &DmaRegion) -> Option<usize> {
        let offset = region.bus_addr().offset_from(self.bus_base).ok()?;
        let offset = usize::try_from(offset).ok()?;
        let ours = self.cpu_base.as_ptr().wrapping_add(offset);
        (offset.is_multiple_of(DMA_PAGE) && core::ptr::eq(region.cpu_ptr().as_ptr(), ours))
            .then_some(offset / DMA_PAGE)
    }
}

impl RefusedFree {
    fn unknown(region: DmaRegion) -> Self {
        Self {
            error: HalError::DmaUnknownRegion {
                bus: region.bus_addr().as_u64(),
            },
            region,
        }
    }
}

#[cfg(any(test, feature = "std"))]
pub use host::HostDma;

#[cfg(any(test, feature = "std"))]
mod host {
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::sync::Mutex;
    use std::vec::Vec;

    use super::*;

    /// Heap-backed DMA memory for host tests and simulations.
    ///
    /// The arena is the simulated DRAM: it occupies `[base, base + size)` of a simulated physical
    /// address space, drivers get CPU pointers into it, and device models read and write it by
    /// physical address with [`HostDma::read_phys`] and friends, which fail (as a bus error
    /// would) outside the arena.
    pub struct HostDma {
        arena: NonNull<u8>,
        size: usize,
        base: PhysAddr,
        bitmap: Mutex<PageBitmap<Vec<u64>>>,
    }

    // SAFETY: the arena is owned by this value and freed only in Drop (and never while a region
    // is out); the allocator is behind a Mutex. Every access to arena bytes after allocation,
    // the CPU's through `DmaRegion` and the device's through `read_phys`/`write_phys`, is a
    // relaxed atomic one (`shared`), so concurrent accesses from several threads are not data
    // races; what the bytes mean is the protocol's business, as on hardware.
    unsafe impl Send for HostDma {}
    // SAFETY: as for Send.
    unsafe impl Sync for HostDma {}

    impl std::fmt::Debug for HostDma {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HostDma")
                .field("base", &self.base)
                .field("size", &self.size)
                .finish()
        }
    }

    impl HostDma {
        /// An arena of `pages` pages at simulated physical address `base`.
        pub fn new(base: PhysAddr, pages: usize) -> Result<Self> {
            base.require_aligned(PageSize::Size4K)?;
            let size = pages
                .checked_mul(DMA_PAGE)
                .filter(|&s| s > 0)
                .ok_or(HalError::EmptyRange)?;
            base.checked_add(size as u64)?;
            let layout = Layout::from_size_align(size, DMA_PAGE)
                .map_err(|_| HalError::DmaExhausted { requested: size })?;
            // SAFETY: the layout has a non-zero size.
            let arena = NonNull::new(unsafe { alloc_zeroed(layout) })
                .ok_or(HalError::DmaExhausted { requested: size })?;
            let bitmap = PageBitmap::new(vec![0u64; pages.div_ceil(64)], pages)?;
            Ok(Self {
                arena,
                size,
                base,
                bitmap: Mutex::new(bitmap),
            })
        }

        /// First physical address of the arena.
        pub fn base(&self) -> PhysAddr {
            self.base
        }

        /// Size of the arena in bytes.
        pub fn size(&self) -> usize {
            self.size
        }

        /// Pages currently allocated.
        pub fn used_pages(&self) -> usize {
            self.bitmap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .used_pages()
        }

        /// The arena page `region` starts at, if it can be one of this arena's regions (in
        /// the arena on the bus, page aligned, and at the matching CPU address: a region of
        /// another allocator at the same bus addresses must not free pages of this one).
        fn page_of(&self, region: &DmaRegion) -> Option<usize> {
            let offset = self.offset_of(region.bus_addr(), region.len()).ok()?;
            let ours = self.arena.as_ptr().wrapping_add(offset);
            (offset.is_multiple_of(DMA_PAGE) && core::ptr::eq(region.cpu_ptr().as_ptr(), ours))
                .then_some(offset / DMA_PAGE)
        }

        fn offset_of(&self, addr: PhysAddr, len: usize) -> Result<usize> {
            let err = HalError::PhysOutOfRange {
                addr: addr.as_u64(),
                len: len as u64,
            };
            let off = addr.offset_from(self.base).map_err(|_| err)?;
            match off.checked_add(len as u64) {
                Some(end) if end <= self.size as u64 => Ok(off as usize),
                _ => Err(err),
            }
        }

        /// Device-side read of `out.len()` bytes at physical address `addr`.
        pub fn read_phys(&self, addr: PhysAddr, out: &mut [u8]) -> Result<()> {
            let off = self.offset_of(addr, out.len())?;
            // SAFETY: in bounds of the arena (checked); arena bytes are accessed only through
            // `shared` (see the `Sync` impl).
            unsafe { shared::load(self.arena.as_ptr().add(off), out) };
            Ok(())
        }

        /// Device-side write of `data` at physical address `addr`.
        pub fn write_phys(&self, addr: PhysAddr, data: &[u8]) -> Result<()> {
            let off = self.offset_of(addr, data.len())?;
            // SAFETY: as for `read_phys`.
            unsafe { shared::store(self.arena.as_ptr().add(off), data) };
            Ok(())
        }

        /// Device-side little-endian u64 read (e.g. a page-table walk).
        pub fn read_phys_u64(&self, addr: PhysAddr) -> Result<u64> {
            let mut b = [0u8; 8];
            self.read_phys(addr, &mut b)?;
            Ok(u64::from_le_bytes(b))
        }

        /// Device-side little-endian u64 write.
        pub fn write_phys_u64(&self, addr: PhysAddr, value: u64) -> Result<()> {
            self.write_phys(addr, &value.to_le_bytes())
        }
    }

    // SAFETY: regions come from the arena, zeroed on allocation, tracked by the bitmap so they
    // never overlap, 4 KiB aligned because the arena is; the model sees them at `bus`.
    unsafe impl DmaMemory for HostDma {
        fn allocate(&self, pages: usize, direction: DmaDirection) -> Result<DmaRegion> {
            let first = self
                .bitmap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .allocate(pages)?;
            let offset = first * DMA_PAGE;
            let len = pages * DMA_PAGE;
            // SAFETY: within the arena.
            let cpu = unsafe { NonNull::new_unchecked(self.arena.as_ptr().add(offset)) };
            // SAFETY: exclusively ours now, in bounds.
            unsafe { core::ptr::write_bytes(cpu.as_ptr(), 0, len) };
            // SAFETY: valid until freed: the arena is never deallocated while a region is out
            // (`Drop` leaks it then).
            Ok(unsafe {
                DmaRegion::from_raw_parts(
                    cpu,
                    self.base.checked_add(offset as u64)?,
                    len,
                    direction,
                )
            })
        }

        fn free(&self, region: DmaRegion) -> core::result::Result<(), RefusedFree> {
            let Some(first) = self.page_of(&region) else {
                return Err(RefusedFree::unknown(region));
            };
            let pages = region.len().div_ceil(DMA_PAGE);
            let freed = self
                .bitmap
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .free(first, pages);
            match freed {
                Ok(()) => Ok(()),
                Err(_) => Err(RefusedFree::unknown(region)),
            }
        }
    }

    impl Drop for HostDma {
        fn drop(&mut self) {
            if self.used_pages() > 0 {
                // Regions are still out: safe code may use them, so their memory must stay.
                // Leaked rather than freed (a test's or a model's lost pages, never reused).
                return;
            }
            // SAFETY: allocated in `new` with this exact layout (size checked there).
            unsafe {
                dealloc(
                    self.arena.as_ptr(),
                    Layout::from_size_align_unchecked(self.size, DMA_PAGE),
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_first_fit_and_errors() {
        let mut b = PageBitmap::new([0u64; 2], 100).unwrap();
        assert_eq!(b.allocate(3), Ok(0));
        assert_eq!(b.allocate(2), Ok(3));
        b.free(0, 3).unwrap();
        assert_eq!(b.allocate(4), Ok(5));
        assert_eq!(b.allocate(3), Ok(0));
        assert_eq!(b.free(0, 3), Ok(()));
        assert!(
            matches!(b.free(0, 3), Err(HalError::DmaUnknownRegion { .. })),
            "double free"
        );
        assert!(matches!(
            b.free(99, 5),
            Err(HalError::DmaUnknownRegion { .. })
        ));
        assert!(matches!(
            b.allocate(200),
            Err(HalError::DmaExhausted { .. })
        ));
        assert_eq!(b.allocate(0), Err(HalError::EmptyRange));
        assert_eq!(b.used_pages(), 6);
    }

    #[test]
    fn bitmap_errors_on_absurd_arguments_instead_of_overflowing() {
        assert_eq!(
            PageBitmap::new([0u64; 1], usize::MAX).err(),
            Some(HalError::DmaExhausted {
                requested: usize::MAX
            })
        );
        let mut b = PageBitmap::new([0u64; 1], 64).unwrap();
        assert_eq!(
            b.free(usize::MAX / 2, 1),
            Err(HalError::DmaUnknownRegion {
                bus: usize::MAX as u64
            })
        );
    }

    #[test]
    fn host_dma_regions_are_visible_by_physical_address() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 16).unwrap();
        let r = dma.allocate(2, DmaDirection::Bidirectional).unwrap();
        assert_eq!(r.bus_addr(), PhysAddr::new(0x8000_0000));
        r.write_u64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(
            dma.read_phys_u64(PhysAddr::new(0x8000_0008)).unwrap(),
            0x1122_3344_5566_7788
        );
        dma.write_phys(PhysAddr::new(0x8000_1000), b"hello")
            .unwrap();
        let mut out = [0u8; 5];
        r.read_bytes(0x1000, &mut out).unwrap();
        assert_eq!(&out, b"hello");
        assert!(
            r.write_bytes(0x1ffe, b"abc").is_err(),
            "past the end of the region"
        );
        assert!(r.write_u64(4, 0).is_err(), "misaligned");
        assert!(
            dma.read_phys_u64(PhysAddr::new(0x7fff_fff8)).is_err(),
            "below the arena"
        );
        assert!(
            dma.read_phys_u64(PhysAddr::new(0x8001_0000)).is_err(),
            "above the arena"
        );
        let r2 = dma.allocate(1, DmaDirection::ToDevice).unwrap();
        assert_eq!(r2.bus_addr(), PhysAddr::new(0x8000_2000));
        assert_eq!(dma.used_pages(), 3);
        dma.free(r).unwrap();
        dma.free(r2).unwrap();
        assert_eq!(dma.used_pages(), 0);
        assert!(matches!(
            dma.allocate(17, DmaDirection::ToDevice),
            Err(HalError::DmaExhausted { .. })
        ));
    }

    /// The device model runs in its own thread here, as in the simulations, and touches the
    /// bytes the driver reads and writes through its region at the same time. That must not
    /// be a data race (Rust's memory model, checked by `cargo +nightly miri test -p hal`).
    #[test]
    fn a_device_thread_and_the_cpu_may_touch_the_same_bytes_at_once() {
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 1).unwrap();
        let region = dma.allocate(1, DmaDirection::Bidirectional).unwrap();
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..rounds {
                    dma.write_phys_u64(PhysAddr::new(0x8000_0000), i).unwrap();
                    let mut bytes = [0u8; 24];
                    dma.read_phys(PhysAddr::new(0x8000_0008), &mut bytes)
                        .unwrap();
                    dma.write_phys(PhysAddr::new(0x8000_0021), &[i as u8; 3])
                        .unwrap();
                }
            });
            for i in 0..rounds {
                let seen = region.read_u64(0).unwrap();
                assert!(seen < rounds, "a torn or invented value: {seen:#x}");
                region.write_u64(8, i).unwrap();
                region.write_bytes(16, &[i as u8; 16]).unwrap();
                let mut tail = [0u8; 3];
                region.read_bytes(0x21, &mut tail).unwrap();
            }
        });
        dma.free(region).unwrap();
    }

    use std::alloc::Layout;

    /// The test binary's allocator: the system's, counting on each thread the frees of
    /// page-aligned blocks (arenas), so a test can see whether a drop freed its arena.
    struct CountingAlloc;

    std::thread_local! {
        static PAGE_ALIGNED_FREES: core::cell::Cell<usize> = const { core::cell::Cell::new(0) };
    }

    // SAFETY: forwards every call to the system allocator unchanged.
    unsafe impl core::alloc::GlobalAlloc for CountingAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract is the system allocator's.
            unsafe { std::alloc::System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as for alloc.
            unsafe { std::alloc::System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            if layout.align() == DMA_PAGE {
                // try_with: the thread's counter may already be gone while it exits.
                let _ = PAGE_ALIGNED_FREES.try_with(|n| n.set(n.get() + 1));
            }
            // SAFETY: as for alloc.
            unsafe { std::alloc::System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: as for alloc.
            unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: CountingAlloc = CountingAlloc;

    fn page_aligned_frees() -> usize {
        PAGE_ALIGNED_FREES.with(|n| n.get())
    }

    #[test]
    #[cfg_attr(miri, ignore = "leaks an arena on purpose")]
    fn host_dma_keeps_its_arena_while_a_region_is_out_and_frees_it_otherwise() {
        let before = page_aligned_frees();
        let dma = HostDma::new(PhysAddr::new(0x8000_0000), 4).unwrap();
        let region = dma.allocate(1, DmaDirection::Bidirectional).unwrap();
        drop(dma);
        assert_eq!(
            page_aligned_frees(),
            before,
            "the arena was freed under a live region"
        );
        // The region's memory is still the process's: writing it is fine (it leaked).
        // SAFETY: the region's CPU pointer covers its length, and the arena was kept.
        unsafe { core::ptr::write_bytes(region.cpu_ptr().as_ptr(), 0xa5, region.len()) };

        let idle = HostDma::new(PhysAddr::new(0x8000_0000), 4).unwrap();
        let r = idle.allocate(2, DmaDirection::Bidirectional).unwrap();
        idle.free(r).unwrap();
        drop(idle);
        assert_eq!(
            page_aligned_frees(),
            before + 1,
            "an idle arena must be freed"
        );
    }

    #[test]
    fn a_region_frees_only_into_its_own_allocator() {
        // Two allocators at the same bus addresses (as every node of the virtual QFDB).
        let a = HostDma::new(PhysAddr::new(0x8000_0000), 2).unwrap();
        let b = HostDma::new(PhysAddr::new(0x8000_0000), 2).unwrap();
        let ra = a.allocate(1, DmaDirection::Bidirectional).unwrap();
        let rb = b.allocate(1, DmaDirection::Bidirectional).unwrap();
        let bus = ra.bus_addr().as_u64();
        let RefusedFree { error, region: ra } = b.free(ra).expect_err("freed into b");
        assert_eq!(error, HalError::DmaUnknownRegion { bus });
        // Refused, and b's page stays rb's alone; the region itself came back, so it can still
        // go home.
        assert_eq!(b.used_pages(), 1);
        a.free(ra).unwrap();
        b.free(rb).unwrap();
        assert_eq!((a.used_pages(), b.used_pages()), (0, 0));
        // A double free is refused the same way.
        let r = a.allocate(1, DmaDirection::Bidirectional).unwrap();
        // SAFETY: a second handle to r's memory, used only to be freed (and refused).
        let twin =
            unsafe { DmaRegion::from_raw_parts(r.cpu_ptr(), r.bus_addr(), r.len(), r.direction()) };
        a.free(r).unwrap();
        let refused = a.free(twin).expect_err("double free");
        assert_eq!(refused.error, HalError::DmaUnknownRegion { bus });
    }

    #[test]
    fn a_pool_refuses_a_foreign_region_and_gives_it_back() {
        #[repr(align(4096))]
        struct Pages([u8; 4 * DMA_PAGE]);
        let mut low = Box::new(Pages([0; 4 * DMA_PAGE]));
        let mut high = Box::new(Pages([0; 4 * DMA_PAGE]));
        let low_base = NonNull::new(low.0.as_mut_ptr()).unwrap();
        let high_base = NonNull::new(high.0.as_mut_ptr()).unwrap();
        // SAFETY: each pool's buffer outlives it and every region, and is used only through it.
        let below = unsafe { PoolDma::<1>::new(low_base, PhysAddr::new(0x1000_0000), 4) }.unwrap();
        // SAFETY: as above.
        let above = unsafe { PoolDma::<1>::new(high_base, PhysAddr::new(0x2000_0000), 4) }.unwrap();
        let foreign = below.allocate(2, DmaDirection::ToDevice).unwrap();
        // Below `above`'s base on the bus: unknown to it, not an address overflow.
        let refused = above.free(foreign).expect_err("a region of another pool");
        assert_eq!(
            refused.error,
            HalError::DmaUnknownRegion { bus: 0x1000_0000 }
        );
        assert_eq!(refused.region.len(), 2 * DMA_PAGE, "given back whole");
        below.free(refused.region).unwrap();
        // Above the base, but at another CPU address: refused, given back, and `above` keeps
        // its books.
        let mine = above.allocate(1, DmaDirection::ToDevice).unwrap();
        let foreign = below.allocate(1, DmaDirection::ToDevice).unwrap();
        // SAFETY: a handle naming `below`'s memory at `above`'s bus address, only to be freed.
        let impostor = unsafe {
            DmaRegion::from_raw_parts(
                foreign.cpu_ptr(),
                mine.bus_addr(),
                DMA_PAGE,
                DmaDirection::ToDevice,
            )
        };
        let refused = above.free(impostor).expect_err("wrong CPU address");
        assert_eq!(refused.region.cpu_ptr(), foreign.cpu_ptr());
        above.free(mine).unwrap();
        below.free(foreign).unwrap();
        drop((below, above, low, high));
    }

    #[test]
    fn a_pool_reaching_past_the_top_of_the_bus_is_refused() {
        let mut backing = vec![0u64; 2 * DMA_PAGE / 8 + DMA_PAGE / 8];
        let at = backing.as_mut_ptr().cast::<u8>();
        let aligned = NonNull::new(at.wrapping_add(at.align_offset(DMA_PAGE))).unwrap();
        // Two pages from 2^64 - 4 KiB: the second would be at bus address 0.
        // SAFETY: two pages of `backing`, page aligned; no region outlives `backing`.
        let pool = unsafe { PoolDma::<1>::new(aligned, PhysAddr::new(0xffff_ffff_ffff_f000), 2) };
        assert!(matches!(pool, Err(HalError::AddressOverflow { .. })));
        // Two pages ending just below the top: every region's end is representable.
        // SAFETY: as above.
        let pool =
            unsafe { PoolDma::<1>::new(aligned, PhysAddr::new(0xffff_ffff_ffff_d000), 2) }.unwrap();
        let region = pool.allocate(2, DmaDirection::Bidirectional).unwrap();
        assert!(region.bus_addr().checked_add(region.len() as u64).is_ok());
        pool.free(region).unwrap();
        drop(backing);
    }

    #[test]
    fn pool_dma_zeroes_and_tracks() {
        #[repr(align(4096))]
        struct Pool([u8; 4 * DMA_PAGE]);
        let mut pool = Box::new(Pool([0xAA; 4 * DMA_PAGE]));
        let base = NonNull::new(pool.0.as_mut_ptr()).unwrap();
        // SAFETY: the pool buffer outlives `dma` and is used only through it.
        let dma = unsafe { PoolDma::<1>::new(base, PhysAddr::new(0x1000_0000), 4) }.unwrap();
        let r = dma.allocate(4, DmaDirection::FromDevice).unwrap();
        assert_eq!(r.read_u64(0x3ff8).unwrap(), 0, "allocation is zeroed");
        assert!(dma.allocate(1, DmaDirection::ToDevice).is_err());
        dma.free(r).unwrap();
        let _ = dma;
        drop(pool);
    }
}
