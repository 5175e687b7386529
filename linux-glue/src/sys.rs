//! Thin wrappers over the few system calls this crate makes, with errno captured.

use std::os::fd::AsRawFd;

use crate::{GlueError, Result};

/// The base page size this crate supports (x86-64 and arm64 with 4 KiB pages).
pub(crate) const PAGE: u64 = 4096;
/// log2 of [`PAGE`].
pub(crate) const PAGE_SHIFT: u32 = 12;
/// A PMD-mapped transparent huge page with 4 KiB base pages (2 MiB).
pub(crate) const HUGE_2M: u64 = 2 << 20;

/// The calling thread's errno.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `GlueError::Os` for `op` with the current errno.
pub(crate) fn os_error(op: &'static str) -> GlueError {
    GlueError::Os { op, errno: errno() }
}

/// Encodes an ioctl request number with the generic Linux layout
/// (include/uapi/asm-generic/ioctl.h: nr 0-7, type 8-15, size 16-29, direction 30-31), which
/// x86, arm64 and riscv use. mips, powerpc, sparc and alpha use another layout and are not
/// supported.
pub(crate) const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u32 {
    (dir << 30) | ((size as u32 & 0x3fff) << 16) | ((ty as u32) << 8) | nr as u32
}
/// The argument size a request number encodes (bits 16-29 of the generic layout).
pub(crate) const fn ioc_size(request: u32) -> usize {
    ((request >> 16) & 0x3fff) as usize
}
/// The type (magic) byte a request number encodes (bits 8-15).
pub(crate) const fn ioc_type(request: u32) -> u8 {
    (request >> 8) as u8
}
/// `_IOC_WRITE`: user space writes the argument.
pub(crate) const IOC_WRITE: u32 = 1;
/// `_IOC_READ`: user space reads the argument.
pub(crate) const IOC_READ: u32 = 2;

#[cfg(any(
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "powerpc",
    target_arch = "powerpc64",
    target_arch = "sparc64"
))]
compile_error!("linux-glue encodes ioctl numbers with the asm-generic layout only");

/// `ioctl(fd, request, arg)` with a pointer argument; returns the non-negative result or errno.
///
/// # Safety
/// `request` is one whose argument is a `T` (the kernel reads and writes at most the size the
/// request encodes, which must be at most `size_of::<T>()`); `arg` points to a live, writable
/// `T` for the duration of the call; and any address inside the `T` that the kernel writes
/// through (an output buffer) is valid for what the request writes there.
pub(crate) unsafe fn ioctl_ptr<T>(
    fd: &impl AsRawFd,
    request: u32,
    arg: *mut T,
) -> Result<i32, i32> {
    // SAFETY: the caller's contract above; no memory is retained after the call returns.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if rc < 0 { Err(errno()) } else { Ok(rc) }
}

/// `madvise(addr, len, advice)`; returns errno on failure.
///
/// Only advice values that never corrupt memory are passed by this crate's library paths
/// (populate, huge-page hints, pageout); DONTNEED is used by tests and benchmarks on memory
/// they own.
pub(crate) fn madvise(addr: u64, len: u64, advice: i32) -> Result<(), i32> {
    // SAFETY: madvise does not dereference the range from user space; the kernel validates it
    // and reports ENOMEM for unmapped parts. The advice values used here cannot make Rust
    // references dangle: callers own or do not reference the memory.
    let rc = unsafe { libc::madvise(addr as usize as *mut libc::c_void, len as usize, advice) };
    if rc == 0 { Ok(()) } else { Err(errno()) }
}

/// Per-thread fault counters from `getrusage(RUSAGE_THREAD)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FaultCounters {
    pub minor: u64,
    pub major: u64,
}

impl FaultCounters {
    /// Reads the calling thread's counters. Faults taken by GUP on behalf of this thread
    /// (MADV_POPULATE_*) are counted here too (mm/memory.c, `mm_account_fault`).
    pub(crate) fn now() -> Self {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: `usage` is a valid, writable rusage buffer; RUSAGE_THREAD is valid on Linux.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
        if rc != 0 {
            return Self::default();
        }
        // SAFETY: getrusage succeeded, so it initialised the whole struct (and it was zeroed).
        let usage = unsafe { usage.assume_init() };
        Self {
            minor: usage.ru_minflt as u64,
            major: usage.ru_majflt as u64,
        }
    }

    /// Faults between `earlier` and `self`.
    pub(crate) fn since(self, earlier: Self) -> Self {
        Self {
            minor: self.minor.saturating_sub(earlier.minor),
            major: self.major.saturating_sub(earlier.major),
        }
    }
}

/// The system page size as reported by sysconf.
pub(crate) fn system_page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v <= 0 { PAGE } else { v as u64 }
}

/// An eventfd used to wake the monitor thread for shutdown.
pub(crate) fn eventfd() -> Result<std::os::fd::OwnedFd> {
    // SAFETY: eventfd has no memory preconditions.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(os_error("eventfd"));
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// Writes 1 to an eventfd.
pub(crate) fn eventfd_signal(fd: &impl AsRawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd; failure (counter saturated) is
    // harmless because the reader only needs to see it readable.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}
