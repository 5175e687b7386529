//! The real module behind its device node (`linux-glue/kernel`, docs/linux-glue.md
//! "The kernel module").

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::ptr::NonNull;

use super::{ModuleBackend, Owner, SharedMemory};
use crate::abi;
use crate::sys;
use crate::{GlueError, Result};

/// The real module behind its device node: one open file is one module context, bound to
/// this process's mm (the module refuses it from any other process with `EBADF`).
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

    fn mmap(&self, offset: u64, len: u64, prot: libc::c_int) -> Result<SharedMemory> {
        if len == 0 || !len.is_multiple_of(8) {
            return Err(GlueError::InvalidArgument {
                what: "module mapping length",
            });
        }
        let (Ok(bytes), Ok(off)) = (usize::try_from(len), libc::off_t::try_from(offset)) else {
            return Err(GlueError::InvalidArgument {
                what: "module mapping beyond the address space",
            });
        };
        // SAFETY: a new shared mapping of the device at a kernel-chosen address; nothing is
        // replaced. The module validates offset, length and protection.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                prot,
                libc::MAP_SHARED,
                self.fd.as_raw_fd(),
                off,
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
            words: bytes / 8,
            owner: Owner::Mmap,
        })
    }
}

impl AsFd for RealModule {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for RealModule {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl IntoRawFd for RealModule {
    fn into_raw_fd(self) -> RawFd {
        self.fd.into_raw_fd()
    }
}

/// Whether `cmd` is one of the module's requests (its magic) with an argument of `len` bytes.
pub(super) fn module_request_fits(cmd: u32, len: usize) -> bool {
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
        self.mmap(offset, len, libc::PROT_READ | libc::PROT_WRITE)
    }

    /// Page-state tables: the module refuses a writable mapping of them (`EACCES`).
    fn map_read_only(&self, offset: u64, len: u64) -> Result<SharedMemory> {
        self.mmap(offset, len, libc::PROT_READ)
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
        assert!(module_request_fits(
            abi::IOC_RESOLVE,
            std::mem::size_of::<abi::ResolveArgs>()
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
