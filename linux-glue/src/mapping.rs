//! An owned memory mapping, for tests, benchmarks and examples.
//!
//! The library never maps memory for the application; this type exists so that the tests and
//! the benchmark can create anonymous, file-backed, huge-page-eligible or read-only mappings,
//! and can `madvise`, `munmap` and `mremap` them, without scattering raw `mmap` calls around.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, MutexGuard};

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
///
/// [`unmap_part`](Mapping::unmap_part) leaves holes. The mapping gives those up: another
/// thread's `mmap` may land there, so nothing this type does afterwards (reads, writes, advice,
/// protection, unmapping on drop) touches a hole.
#[derive(Debug)]
pub struct Mapping {
    addr: u64,
    len: u64,
    /// Unmapped parts, as `(offset, end offset)`, in the order they were made.
    holes: Mutex<Vec<(u64, u64)>>,
}

impl Mapping {
    /// Takes ownership of `[addr, addr + len)`, which must be mapped and owned by nobody else.
    fn owning(addr: u64, len: u64) -> Self {
        Self {
            addr,
            len,
            holes: Mutex::new(Vec::new()),
        }
    }

    fn holes(&self) -> MutexGuard<'_, Vec<(u64, u64)>> {
        // The list is only ever pushed to whole: a panic elsewhere cannot leave it half-written.
        self.holes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The parts still owned, as `(offset, length)`, in address order.
    fn owned_parts(&self) -> Vec<(u64, u64)> {
        let mut holes = self.holes().clone();
        holes.sort_unstable();
        let mut parts = Vec::with_capacity(holes.len() + 1);
        let mut at = 0;
        for (start, end) in holes {
            if start > at {
                parts.push((at, start - at));
            }
            at = at.max(end);
        }
        if at < self.len {
            parts.push((at, self.len - at));
        }
        parts
    }

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
        Ok(Self::owning(p as u64, len))
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
        Ok(Self::owning(start, len))
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

    /// `[offset, offset + len)` lies inside the mapping and outside its holes.
    fn check(&self, offset: u64, len: u64) -> Result<()> {
        let end = match offset.checked_add(len) {
            Some(end) if end <= self.len => end,
            _ => {
                return Err(GlueError::InvalidArgument {
                    what: "offset/length outside the mapping",
                });
            }
        };
        match self
            .holes()
            .iter()
            .find(|&&(start, stop)| start < end && offset < stop)
        {
            Some(&(start, _)) => Err(GlueError::Unmapped {
                addr: self.addr + start.max(offset),
            }),
            None => Ok(()),
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

    /// `mprotect` the whole mapping (its holes excepted).
    pub fn protect(&self, prot: Protection) -> Result<()> {
        for (offset, len) in self.owned_parts() {
            // SAFETY: changes protection of memory this value owns; no Rust references into it
            // are handed out by this type.
            let rc = unsafe {
                libc::mprotect(
                    (self.addr + offset) as *mut libc::c_void,
                    len as usize,
                    prot.bits(),
                )
            };
            if rc != 0 {
                return Err(sys::os_error("mprotect"));
            }
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

    /// Writes a distinct marker (`seed ^ page index`) into the first word of every page (of
    /// every page still mapped, if there are holes).
    pub fn stamp_pages(&self, seed: u64) -> Result<()> {
        for (offset, len) in self.owned_parts() {
            for i in offset / PAGE..(offset + len) / PAGE {
                self.write_u64(i * PAGE, seed ^ i)?;
            }
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
        let mut holes = self.holes();
        unmap_raw(self.addr + offset, len)?;
        holes.push((offset, offset + len));
        Ok(())
    }

    /// Moves the mapping to a new address with `mremap(MREMAP_MAYMOVE | MREMAP_FIXED)` and
    /// returns it at its new place.
    pub fn move_elsewhere(self) -> Result<Mapping> {
        if !self.holes().is_empty() {
            // mremap moves one VMA; the holes split this mapping into several.
            return Err(GlueError::InvalidArgument {
                what: "a mapping with holes cannot move",
            });
        }
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
        let moved = Mapping::owning(p as u64, self.len);
        // Both old objects now describe memory that `moved` owns (or nothing): forget them.
        std::mem::forget(self);
        std::mem::forget(dest);
        Ok(moved)
    }

    /// Unmaps now (same as dropping, but reports errors).
    pub fn unmap(self) -> Result<()> {
        let r = self.unmap_owned();
        // Nothing is owned any more, whatever munmap said: drop must not try again.
        self.holes().push((0, self.len));
        r
    }

    /// Unmaps every part still owned; the first error, after trying them all.
    fn unmap_owned(&self) -> Result<()> {
        let mut result = Ok(());
        for (offset, len) in self.owned_parts() {
            let r = unmap_raw(self.addr + offset, len);
            if result.is_ok() {
                result = r;
            }
        }
        result
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
        let _ = self.unmap_owned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// These tests map pages at addresses they have just freed, and must not take each other's
    /// holes.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many times [`in_some_attempt`] tries a check that needs a freed address.
    const TRIES: usize = 4;

    /// Runs `attempt` until it succeeds, at most [`TRIES`] times; panics with every reason if it
    /// never did.
    ///
    /// Another thread of this binary can take a freed address before the test maps it again:
    /// the harness starts a thread per test, and Rust's runtime gives each new thread a small
    /// mapped signal stack. That spoils an attempt rarely and several in a row practically
    /// never, while memory that was never unmapped blocks every attempt. Each attempt sets up
    /// a fresh mapping.
    fn in_some_attempt(what: &str, mut attempt: impl FnMut() -> std::result::Result<(), String>) {
        let mut seen = Vec::new();
        for i in 0..TRIES {
            match attempt() {
                Ok(()) => return,
                Err(why) => {
                    eprintln!("{what}: attempt {i}: {why}");
                    seen.push(why);
                }
            }
        }
        panic!("{what}: failed on all {TRIES} attempts: {seen:#?}");
    }

    /// Maps one page at exactly `addr`, failing rather than replacing anything there.
    fn map_at(addr: u64) -> Option<u64> {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED && p as u64 == addr).then_some(addr)
    }

    #[test]
    fn a_hole_is_given_up_and_never_touched_again() {
        let _serial = serial();
        let m = Mapping::anonymous(4 * PAGE, Protection::ReadWrite).unwrap();
        m.stamp_pages(0x77).unwrap();
        m.unmap_part(PAGE, PAGE).unwrap();

        // Accesses into the hole are typed errors, not faults.
        assert_eq!(
            m.read_u64(PAGE + 8),
            Err(GlueError::Unmapped {
                addr: m.addr + PAGE + 8
            })
        );
        assert_eq!(
            m.write_u64(0, 1).and(m.write_u64(PAGE - 8, 1)),
            Ok(()),
            "the pages beside the hole stay usable"
        );
        assert!(matches!(
            m.advise(0, 2 * PAGE, Advice::DontNeed),
            Err(GlueError::Unmapped { .. })
        ));
        assert!(matches!(
            m.unmap_part(PAGE, PAGE),
            Err(GlueError::Unmapped { .. })
        ));
        // Stamping and protecting cover the rest and skip the hole.
        m.stamp_pages(0x99).unwrap();
        assert_eq!(m.read_u64(3 * PAGE).unwrap(), 0x99 ^ 3);
        m.protect(Protection::Read).unwrap();
        assert_eq!(m.read_u64(2 * PAGE).unwrap(), 0x99 ^ 2);

        drop(m);

        // Someone else's mapping lands in a hole; dropping the mapping leaves it alone.
        in_some_attempt("drop spares a foreign mapping in a hole", || {
            let m = Mapping::anonymous(3 * PAGE, Protection::ReadWrite).unwrap();
            m.unmap_part(PAGE, PAGE).unwrap();
            let foreign = map_at(m.addr + PAGE).ok_or("another thread took the hole first")?;
            // SAFETY: the page just mapped at `foreign`, owned by this test.
            unsafe { std::ptr::write_volatile(foreign as *mut u64, 0xf00d) };
            drop(m);
            // SAFETY: as above; it would fault had the drop unmapped it.
            let kept = unsafe { std::ptr::read_volatile(foreign as *const u64) };
            assert_eq!(kept, 0xf00d);
            unmap_raw(foreign, PAGE).unwrap();
            Ok(())
        });
    }

    #[test]
    fn a_mapping_with_holes_does_not_move_and_unmaps_only_what_it_owns() {
        let _serial = serial();
        in_some_attempt("a failed move frees the mapping", || {
            let m = Mapping::anonymous(3 * PAGE, Protection::ReadWrite).unwrap();
            m.unmap_part(0, PAGE).unwrap();
            let addr = m.addr;
            assert!(matches!(
                m.move_elsewhere(),
                Err(GlueError::InvalidArgument { .. })
            ));
            // The failed move dropped the mapping: the rest of it is free again.
            let freed = map_at(addr + PAGE).ok_or("the rest is still mapped")?;
            unmap_raw(freed, PAGE).unwrap();
            Ok(())
        });

        in_some_attempt("unmap frees the owned part and only that", || {
            let m = Mapping::anonymous(3 * PAGE, Protection::ReadWrite).unwrap();
            m.unmap_part(2 * PAGE, PAGE).unwrap();
            let (addr, hole) = (m.addr, m.addr + 2 * PAGE);
            let foreign = map_at(hole).ok_or("another thread took the hole first")?;
            m.unmap().unwrap();
            let freed = map_at(addr);
            // SAFETY: the page mapped at `foreign` above, still ours; it would fault had the
            // unmap taken it.
            unsafe { std::ptr::write_volatile(foreign as *mut u64, 1) };
            unmap_raw(foreign, PAGE).unwrap();
            unmap_raw(freed.ok_or("the owned part is still mapped")?, PAGE).unwrap();
            Ok(())
        });
    }
}
