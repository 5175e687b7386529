//! Faulting pages in: `MADV_POPULATE_READ/WRITE` (Linux 5.14+), or touching as a fallback.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::registry::Access;
use crate::sys::{self, PAGE};
use crate::{GlueError, Result};

/// How pages are faulted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultInMethod {
    /// `MADV_POPULATE_*` when the kernel has it, touching otherwise.
    Auto,
    /// Always `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE`. Errors come back as errno, never as
    /// a signal, and the page contents are never read or written by us.
    Populate,
    /// Touch each page from this thread: an atomic load for read, and for write a
    /// compare-and-swap of a word with its own value, retried until it succeeds. The CAS is a
    /// real store (so the kernel takes a write fault and breaks COW) that cannot lose a
    /// concurrent writer's update: if another thread changed the word in between, the CAS fails
    /// and is retried with the new value. (`fetch_add(0)` is not used: LLVM may lower an
    /// idempotent read-modify-write to a fenced load, which would not write-fault.) The live
    /// VMAs are checked just before the touch (the registration's snapshot may be stale), but
    /// a munmap or mprotect racing with the touch, or a file mapping past its file's end, still
    /// raises SIGSEGV/SIGBUS, which populate would report as an error; this is why it is only
    /// the fallback.
    Touch,
}

/// Faults in `[addr, addr + len)` (page aligned) with `MADV_POPULATE_*`.
pub(crate) fn populate(addr: u64, len: u64, access: Access) -> Result<()> {
    let advice = match access {
        Access::Read => libc::MADV_POPULATE_READ,
        Access::Write => libc::MADV_POPULATE_WRITE,
    };
    let mut tries = 0;
    loop {
        match sys::madvise(addr, len, advice) {
            Ok(()) => return Ok(()),
            // Interrupted or the fault needs a retry (mm/madvise.c restarts on -EINTR/-EAGAIN
            // only for fatal signals and lock drops): retry a bounded number of times.
            Err(e) if (e == libc::EINTR || e == libc::EAGAIN) && tries < 100 => tries += 1,
            Err(e) => return Err(populate_error(addr, access, e)),
        }
    }
}

/// Maps the errno of `MADV_POPULATE_*` (madvise(2)) to a typed error.
pub(crate) fn populate_error(addr: u64, access: Access, errno: i32) -> GlueError {
    match errno {
        libc::ENOMEM => GlueError::Unmapped { addr },
        libc::EFAULT => GlueError::UnsupportedMapping {
            addr,
            reason: match access {
                Access::Write => {
                    "populating for write would raise SIGSEGV/SIGBUS (not writable now, or file truncated)"
                }
                Access::Read => {
                    "populating for read would raise SIGSEGV/SIGBUS (not readable now, or file truncated)"
                }
            },
        },
        libc::EINVAL => GlueError::Unavailable {
            feature: "MADV_POPULATE_READ/WRITE",
            why: "EINVAL: kernel before 5.14, or a VM_PFNMAP/VM_IO mapping".into(),
        },
        libc::EHWPOISON => GlueError::HwPoison { addr },
        libc::EPERM => GlueError::PermissionDenied {
            what: "MADV_POPULATE",
        },
        errno => GlueError::Os {
            op: "madvise(MADV_POPULATE)",
            errno,
        },
    }
}

/// Faults in `[addr, addr + len)` by touching every page.
///
/// # Safety
/// The whole range must be mapped with the permissions `access` needs, for the duration of the
/// call, or the process receives SIGSEGV/SIGBUS.
pub(crate) unsafe fn touch(addr: u64, len: u64, access: Access) {
    let mut page = addr & !(PAGE - 1);
    while page < addr + len {
        match access {
            Access::Read => {
                // SAFETY: mapped and readable per the caller's contract. The page may be
                // read-only, which `from_ptr` alone does not allow; a Relaxed load of a
                // byte-sized atomic is the exception `core::sync::atomic` documents under
                // "Atomic accesses to read-only memory", and it is the only access made. An
                // atomic byte load cannot tear or race destructively with other accesses.
                let b = unsafe { AtomicU8::from_ptr(page as *mut u8) };
                std::hint::black_box(b.load(Ordering::Relaxed));
            }
            Access::Write => {
                // SAFETY: mapped and writable per the caller's contract; page-aligned, so the
                // word is 8-byte aligned. A CAS of the value with itself stores the same bytes,
                // and only succeeds if nobody changed them in between.
                let w = unsafe { AtomicU64::from_ptr(page as *mut u64) };
                // Guess 0 first: on a page that is not there yet the first access is then the
                // (write) CAS itself, one write fault instead of a read fault that maps the
                // zero page followed by a copy-on-write fault.
                let mut v = 0;
                while let Err(now) = w.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed)
                {
                    v = now;
                }
            }
        }
        page += PAGE;
    }
}

/// Whether `MADV_POPULATE_READ` works here (probed on a page of our own stack).
pub(crate) fn populate_supported() -> bool {
    let probe = 0u64;
    let page = (&probe as *const u64 as u64) & !(PAGE - 1);
    sys::madvise(page, PAGE, libc::MADV_POPULATE_READ).is_ok()
}
