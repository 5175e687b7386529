//! An owned memory mapping, for tests, benchmarks and examples.
//!
//! The library never maps memory for the application; this type exists so that the tests and
//! the benchmark can create anonymous, file-backed, huge-page-eligible or read-only mappings,
//! and can `madvise`, `munmap` and `mremap` them, without scattering raw `mmap` calls around.

use std::fs::File;
use std::os::fd::AsRawFd;

use hal::{AlignedRange, PageSize, VirtAddr};

use crate::sys::{self, PAGE};
use crate::{GlueError, Result};

/// Page protection of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// PROT_NONE.
    None,
    /// PROT_READ.
    Read,
    /// PROT_READ | PROT_WRITE.
    ReadWrite,
}

impl Protection {
    fn bits(self) -> i32 {
        match self {
            Protection::None => libc::PROT_NONE,
            Protection::Read => libc::PROT_READ,
            Protection::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        }
    }
}

/// `madvise` advice that tests and benchmarks apply to their own mappings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// MADV_HUGEPAGE: allow THP here when THP is in `madvise` mode.
    HugePage,
    /// MADV_NOHUGEPAGE: never THP here.
    NoHugePage,
    /// MADV_DONTNEED: drop the pages (anonymous private memory reads back as zero).
    DontNeed,
    /// MADV_FREE: lazily free anonymous pages.
    Free,
    /// MADV_PAGEOUT: reclaim the pages now (to swap for anonymous memory) (Linux 5.4+).
    PageOut,
    /// MADV_COLD: deactivate the pages (Linux 5.4+).
    Cold,
    /// MADV_RANDOM: no read-ahead for file mappings.
    Random,
    /// MADV_POPULATE_READ: fault in for read (Linux 5.14+).
    PopulateRead,
    /// MADV_POPULATE_WRITE: fault in for write (Linux 5.14+).
    PopulateWrite,
}

impl Advice {
    pub(crate) fn raw(self) -> i32 {
        match self {
            Advice::HugePage => libc::MADV_HUGEPAGE,
            Advice::NoHugePage => libc::MADV_NOHUGEPAGE,
            Advice::DontNeed => libc::MADV_DONTNEED,
            Advice::Free => libc::MADV_FREE,
            Advice::PageOut => libc::MADV_PAGEOUT,
            Advice::Cold => libc::MADV_COLD,
            Advice::Random => libc::MADV_RANDOM,
            Advice::PopulateRead => libc::MADV_POPULATE_READ,
            Advice::PopulateWrite => libc::MADV_POPULATE_WRITE,
        }
    }
}

/// An owned `mmap` region, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    addr: u64,
    len: u64,
}

impl Mapping {
    fn map(len: u64, prot: Protection, flags: i32, fd: i32) -> Result<Self> {
        if len == 0 {
            return Err(GlueError::EmptyRange);
        }
        let len = len
            .checked_next_multiple_of(PAGE)
            .ok_or(GlueError::Overflow { start: 0, len })?;
        // SAFETY: a fresh mapping at a kernel-chosen address (no MAP_FIXED), so no existing
        // memory is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                prot.bits(),
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys::os_error("mmap"));
        }
        Ok(Self {
            addr: p as u64,
            len,
        })
    }

    /// A private anonymous mapping (MAP_NORESERVE: no commit charge, nothing touched).
    pub fn anonymous(len: u64, prot: Protection) -> Result<Self> {
        Self::map(
            len,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        )
    }

    /// A private anonymous mapping whose start is a multiple of `align` (a power of two), so that
    /// whole 2 MiB blocks fit for transparent huge pages.
    pub fn anonymous_aligned(len: u64, align: u64, prot: Protection) -> Result<Self> {
        if !align.is_power_of_two() || align < PAGE {
            return Err(GlueError::InvalidArgument {
                what: "alignment must be a power of two >= 4 KiB",
            });
        }
        let len = len
            .checked_next_multiple_of(PAGE)
            .ok_or(GlueError::Overflow { start: 0, len })?;
        let padded = len
            .checked_add(align)
            .ok_or(GlueError::Overflow { start: 0, len })?;
        let big = Self::anonymous(padded, prot)?;
        let start = big.addr.next_multiple_of(align);
        let head = start - big.addr;
        let tail = padded - head - len;
        // Trim the unaligned head and the tail; what remains is exactly [start, start + len).
        let whole = big;
        if head > 0 {
            unmap_raw(whole.addr, head)?;
        }
        if tail > 0 {
            unmap_raw(start + len, tail)?;
        }
        std::mem::forget(whole);
        Ok(Self { addr: start, len })
    }

    /// A private hugetlbfs mapping of 2 MiB pages (needs `vm.nr_hugepages` reserved).
    pub fn hugetlb_2m(len: u64) -> Result<Self> {
        const MAP_HUGE_2MB: i32 = 21 << libc::MAP_HUGE_SHIFT;
        let len = len
            .checked_next_multiple_of(2 << 20)
            .ok_or(GlueError::Overflow { start: 0, len })?;
        Self::map(
            len,
            Protection::ReadWrite,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | MAP_HUGE_2MB,
            -1,
        )
    }

    /// A shared anonymous mapping (shmem-backed).
    pub fn shared_anonymous(len: u64) -> Result<Self> {
        Self::map(
            len,
            Protection::ReadWrite,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
        )
    }

    /// A mapping of `file` from offset 0, shared or private.
    pub fn file(file: &File, len: u64, prot: Protection, shared: bool) -> Result<Self> {
        let kind = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        Self::map(len, prot, kind, file.as_raw_fd())
    }

    /// First address.
    pub fn addr(&self) -> VirtAddr {
        VirtAddr::new(self.addr)
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: mappings are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The mapping as a 4 KiB-aligned range.
    pub fn range(&self) -> Result<AlignedRange<VirtAddr>> {
        Ok(AlignedRange::new(self.addr(), self.len, PageSize::Size4K)?)
    }

    /// The address `offset` bytes in.
    pub fn at(&self, offset: u64) -> VirtAddr {
        VirtAddr::new(self.addr.wrapping_add(offset))
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(GlueError::InvalidArgument {
                what: "offset/length outside the mapping",
            }),
        }
    }

    /// `madvise` on `[offset, offset + len)` of this mapping.
    pub fn advise(&self, offset: u64, len: u64, advice: Advice) -> Result<()> {
        self.check(offset, len)?;
        sys::madvise(self.addr + offset, len, advice.raw()).map_err(|errno| GlueError::Os {
            op: "madvise",
            errno,
        })
    }

    /// `mprotect` the whole mapping.
    pub fn protect(&self, prot: Protection) -> Result<()> {
        // SAFETY: changes protection of memory this value owns; no Rust references into it are
        // handed out by this type.
        let rc = unsafe {
            libc::mprotect(
                self.addr as *mut libc::c_void,
                self.len as usize,
                prot.bits(),
            )
        };
        if rc != 0 {
            return Err(sys::os_error("mprotect"));
        }
        Ok(())
    }

    /// Writes `value` at `offset` (8-byte aligned) with a volatile store.
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(GlueError::Misaligned {
                value: offset,
                align: 8,
            });
        }
        // SAFETY: in bounds and aligned (checked); the memory is owned by this mapping and no
        // references into it exist. The caller must have mapped it writable, or the store faults
        // (a test bug, not memory unsafety).
        unsafe { std::ptr::write_volatile((self.addr + offset) as *mut u64, value) };
        Ok(())
    }

    /// Reads the u64 at `offset` (8-byte aligned) with a volatile load.
    pub fn read_u64(&self, offset: u64) -> Result<u64> {
        self.check(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(GlueError::Misaligned {
                value: offset,
                align: 8,
            });
        }
        // SAFETY: in bounds and aligned (checked); the memory is owned by this mapping.
        Ok(unsafe { std::ptr::read_volatile((self.addr + offset) as *const u64) })
    }

    /// Writes a distinct marker (`seed ^ page index`) into the first word of every page.
    pub fn stamp_pages(&self, seed: u64) -> Result<()> {
        for i in 0..self.len / PAGE {
            self.write_u64(i * PAGE, seed ^ i)?;
        }
        Ok(())
    }

    /// Unmaps `[offset, offset + len)` (page aligned), leaving a hole; the rest stays owned.
    pub fn unmap_part(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        if !offset.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(GlueError::Misaligned {
                value: offset | len,
                align: PAGE,
            });
        }
        unmap_raw(self.addr + offset, len)
    }

    /// Moves the mapping to a new address with `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` and
    /// returns it at its new place.
    pub fn move_elsewhere(self) -> Result<Mapping> {
        // Reserve a destination so that MREMAP_FIXED replaces only memory we own.
        let dest = Self::map(
            self.len,
            Protection::None,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        )?;
        // SAFETY: source and destination are both owned by this function (`self` and `dest`),
        // of equal length; MREMAP_FIXED atomically replaces the reservation.
        let p = unsafe {
            libc::mremap(
                self.addr as *mut libc::c_void,
                self.len as usize,
                self.len as usize,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dest.addr as *mut libc::c_void,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys::os_error("mremap"));
        }
        let moved = Mapping {
            addr: p as u64,
            len: self.len,
        };
        // Both old objects now describe memory that `moved` owns (or nothing): forget them.
        std::mem::forget(self);
        std::mem::forget(dest);
        Ok(moved)
    }

    /// Unmaps now (same as dropping, but reports errors).
    pub fn unmap(self) -> Result<()> {
        let r = unmap_raw(self.addr, self.len);
        std::mem::forget(self);
        r
    }
}

fn unmap_raw(addr: u64, len: u64) -> Result<()> {
    // SAFETY: callers pass ranges owned by a `Mapping` that no Rust reference points into.
    let rc = unsafe { libc::munmap(addr as *mut libc::c_void, len as usize) };
    if rc != 0 {
        return Err(sys::os_error("munmap"));
    }
    Ok(())
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = unmap_raw(self.addr, self.len);
    }
}
