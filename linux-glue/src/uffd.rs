//! userfaultfd, used only for its non-cooperative events (REMOVE, UNMAP, REMAP).
//!
//! Layouts and numbers are written from include/uapi/linux/userfaultfd.h (Linux 6.x); they are
//! defined here rather than generated so that no bindgen/libclang is needed.
//!
//! Registration mode: `UFFDIO_REGISTER_MODE_WP` on anonymous and shmem memory, and no page is
//! ever write-protected. The kernel then never delivers a page fault for the range (a WP fault
//! needs a PTE whose uffd-wp bit is set, and without `UFFD_FEATURE_WP_UNPOPULATED` empty PTEs
//! are not marked), so the application's faults are served by the kernel exactly as before,
//! while the context still receives the events enabled with `UFFDIO_API`. MISSING mode would
//! route every first touch through the monitor thread, and MINOR mode only exists for shmem and
//! hugetlbfs. See docs/linux-glue.md for the side effects that remain.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::sys::{self, IOC_READ, IOC_WRITE, ioc};
use crate::{GlueError, Result};

/// `UFFD_API`.
pub(crate) const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: only user-mode faults are handled (allowed without privilege since
/// Linux 5.11).
pub(crate) const UFFD_USER_MODE_ONLY: i32 = 1;

/// `UFFD_FEATURE_EVENT_REMAP` (bit 2).
pub(crate) const FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// `UFFD_FEATURE_EVENT_REMOVE` (bit 3).
pub(crate) const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// `UFFD_FEATURE_EVENT_UNMAP` (bit 6).
pub(crate) const FEATURE_EVENT_UNMAP: u64 = 1 << 6;

/// `UFFDIO_REGISTER_MODE_MISSING`.
#[allow(dead_code)]
pub(crate) const REGISTER_MODE_MISSING: u64 = 1 << 0;
/// `UFFDIO_REGISTER_MODE_WP`.
pub(crate) const REGISTER_MODE_WP: u64 = 1 << 1;

/// `UFFD_EVENT_PAGEFAULT`.
pub(crate) const EVENT_PAGEFAULT: u8 = 0x12;
/// `UFFD_EVENT_FORK`.
pub(crate) const EVENT_FORK: u8 = 0x13;
/// `UFFD_EVENT_REMAP`.
pub(crate) const EVENT_REMAP: u8 = 0x14;
/// `UFFD_EVENT_REMOVE`.
pub(crate) const EVENT_REMOVE: u8 = 0x15;
/// `UFFD_EVENT_UNMAP`.
pub(crate) const EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_WP`.
pub(crate) const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct UffdioApi {
    pub api: u64,
    pub features: u64,
    pub ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct UffdioRange {
    pub start: u64,
    pub len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct UffdioRegister {
    pub range: UffdioRange,
    pub mode: u64,
    pub ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct UffdioWriteprotect {
    pub range: UffdioRange,
    pub mode: u64,
}

/// Size of `struct uffd_msg` (packed: 8-byte header + 24-byte union).
pub(crate) const MSG_SIZE: usize = 32;

const UFFDIO: u8 = 0xAA;
/// `USERFAULTFD_IOC_NEW` on /dev/userfaultfd: `_IO(0xAA, 0x00)`.
pub(crate) const USERFAULTFD_IOC_NEW: u32 = ioc(0, UFFDIO, 0x00, 0);
/// `UFFDIO_API`: `_IOWR(0xAA, 0x3F, struct uffdio_api)`.
pub(crate) const UFFDIO_API: u32 = ioc(IOC_READ | IOC_WRITE, UFFDIO, 0x3F, size_of::<UffdioApi>());
/// `UFFDIO_REGISTER`: `_IOWR(0xAA, 0x00, struct uffdio_register)`.
pub(crate) const UFFDIO_REGISTER: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x00,
    size_of::<UffdioRegister>(),
);
/// `UFFDIO_UNREGISTER`: `_IOR(0xAA, 0x01, struct uffdio_range)`.
pub(crate) const UFFDIO_UNREGISTER: u32 = ioc(IOC_READ, UFFDIO, 0x01, size_of::<UffdioRange>());
/// `UFFDIO_WAKE`: `_IOR(0xAA, 0x02, struct uffdio_range)`.
pub(crate) const UFFDIO_WAKE: u32 = ioc(IOC_READ, UFFDIO, 0x02, size_of::<UffdioRange>());
/// `UFFDIO_WRITEPROTECT`: `_IOWR(0xAA, 0x06, struct uffdio_writeprotect)`.
pub(crate) const UFFDIO_WRITEPROTECT: u32 = ioc(
    IOC_READ | IOC_WRITE,
    UFFDIO,
    0x06,
    size_of::<UffdioWriteprotect>(),
);

const _: () = assert!(size_of::<UffdioApi>() == 24);
const _: () = assert!(size_of::<UffdioRange>() == 16);
const _: () = assert!(size_of::<UffdioRegister>() == 32);
const _: () = assert!(size_of::<UffdioWriteprotect>() == 24);

/// A decoded `struct uffd_msg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UffdEvent {
    /// A page fault (never expected with WP-only registration and nothing protected).
    PageFault { address: u64, flags: u64 },
    /// A fork event (not enabled).
    Fork,
    /// `mremap` moved `[from, from + len)` to `to`.
    Remap { from: u64, to: u64, len: u64 },
    /// `madvise(DONTNEED/FREE/REMOVE)` on `[start, end)`; sent before the pages are zapped.
    Remove { start: u64, end: u64 },
    /// `munmap` (or an mremap shrink / MAP_FIXED replace) of `[start, end)`; sent after.
    Unmap { start: u64, end: u64 },
}

fn le_u64(b: &[u8; MSG_SIZE], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(w)
}

/// Decodes one message. The union starts at byte 8 (after `event`, `reserved1..3`).
pub(crate) fn parse_msg(b: &[u8; MSG_SIZE]) -> Result<UffdEvent> {
    let ev = match b[0] {
        EVENT_PAGEFAULT => UffdEvent::PageFault {
            flags: le_u64(b, 8),
            address: le_u64(b, 16),
        },
        EVENT_FORK => UffdEvent::Fork,
        EVENT_REMAP => UffdEvent::Remap {
            from: le_u64(b, 8),
            to: le_u64(b, 16),
            len: le_u64(b, 24),
        },
        EVENT_REMOVE => UffdEvent::Remove {
            start: le_u64(b, 8),
            end: le_u64(b, 16),
        },
        EVENT_UNMAP => UffdEvent::Unmap {
            start: le_u64(b, 8),
            end: le_u64(b, 16),
        },
        other => {
            return Err(GlueError::Malformed {
                what: "uffd_msg",
                detail: format!("unknown event {other:#x}"),
            });
        }
    };
    Ok(ev)
}

/// An open userfaultfd context with the three non-cooperative events enabled.
#[derive(Debug)]
pub(crate) struct Uffd {
    fd: OwnedFd,
}

impl Uffd {
    /// Opens a context (syscall first, /dev/userfaultfd second) and negotiates the API.
    pub(crate) fn open() -> Result<Self> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY;
        // SAFETY: userfaultfd(2) takes only flags.
        let raw = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
        let fd = if raw >= 0 {
            // SAFETY: a fresh fd owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(raw) }
        } else {
            let first = sys::errno();
            let dev = OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/userfaultfd")
                .map_err(|e| GlueError::Unavailable {
                    feature: "userfaultfd",
                    why: format!("syscall errno {first}, /dev/userfaultfd: {e}"),
                })?;
            // USERFAULTFD_IOC_NEW takes the flags as the (integer) argument.
            // SAFETY: the ioctl takes an int argument by value and returns a new fd.
            let raw = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if raw < 0 {
                return Err(GlueError::Unavailable {
                    feature: "userfaultfd",
                    why: format!(
                        "syscall errno {first}, USERFAULTFD_IOC_NEW errno {}",
                        sys::errno()
                    ),
                });
            }
            // SAFETY: a fresh fd owned by nobody else.
            unsafe { OwnedFd::from_raw_fd(raw) }
        };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_EVENT_REMAP | FEATURE_EVENT_REMOVE | FEATURE_EVENT_UNMAP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a `UffdioApi` (no addresses in it).
        unsafe { sys::ioctl_ptr(&fd, UFFDIO_API, &mut api) }.map_err(|errno| {
            GlueError::Unavailable {
                feature: "userfaultfd events REMOVE/UNMAP/REMAP",
                why: format!("UFFDIO_API errno {errno}"),
            }
        })?;
        Ok(Self { fd })
    }

    /// Registers `[start, start + len)` in WP mode. Errno on failure (EINVAL: the VMA type
    /// cannot be registered, e.g. a regular file mapping; EBUSY: another context has it).
    pub(crate) fn register_wp(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER takes a `UffdioRegister`; the range in it is only registered,
        // never written through.
        unsafe { sys::ioctl_ptr(&self.fd, UFFDIO_REGISTER, &mut reg) }.map(|_| ())
    }

    /// Unregisters `[start, start + len)`.
    pub(crate) fn unregister(&self, start: u64, len: u64) -> Result<(), i32> {
        let mut range = UffdioRange { start, len };
        // SAFETY: UFFDIO_UNREGISTER takes a `UffdioRange`, never written through.
        unsafe { sys::ioctl_ptr(&self.fd, UFFDIO_UNREGISTER, &mut range) }.map(|_| ())
    }

    /// Answers an unexpected fault: clears write protection (which also wakes the waiter) for
    /// a WP fault, or wakes the waiter otherwise.
    pub(crate) fn release_fault(&self, address: u64, flags: u64) {
        let page = address & !(sys::PAGE - 1);
        let range = UffdioRange {
            start: page,
            len: sys::PAGE,
        };
        if flags & PAGEFAULT_FLAG_WP != 0 {
            let mut wp = UffdioWriteprotect { range, mode: 0 };
            // SAFETY: UFFDIO_WRITEPROTECT takes a `UffdioWriteprotect`; mode 0 only clears
            // write protection of the range.
            let _ = unsafe { sys::ioctl_ptr(&self.fd, UFFDIO_WRITEPROTECT, &mut wp) };
        } else {
            let mut r = range;
            // SAFETY: UFFDIO_WAKE takes a `UffdioRange` and only wakes waiters.
            let _ = unsafe { sys::ioctl_ptr(&self.fd, UFFDIO_WAKE, &mut r) };
        }
    }

    /// Reads the pending messages into `out` (non-blocking). Returns how many were read.
    pub(crate) fn read_events(&self, out: &mut Vec<Result<UffdEvent>>) -> Result<usize> {
        let mut buf = [0u8; MSG_SIZE * 16];
        // SAFETY: reads at most buf.len() bytes into a live local buffer.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = sys::errno();
            if e == libc::EAGAIN || e == libc::EINTR {
                return Ok(0);
            }
            return Err(GlueError::Os {
                op: "read(userfaultfd)",
                errno: e,
            });
        }
        let n = n as usize;
        let mut count = 0;
        for chunk in buf[..n].chunks_exact(MSG_SIZE) {
            let mut msg = [0u8; MSG_SIZE];
            msg.copy_from_slice(chunk);
            out.push(parse_msg(&msg));
            count += 1;
        }
        Ok(count)
    }

    /// The fd, for poll.
    pub(crate) fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_encoding() {
        // Worked out by hand from asm-generic/ioctl.h: dir<<30 | size<<16 | type<<8 | nr.
        assert_eq!(UFFDIO_API, 0xC018_AA3F);
        assert_eq!(UFFDIO_REGISTER, 0xC020_AA00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010_AA01);
        assert_eq!(UFFDIO_WAKE, 0x8010_AA02);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xC018_AA06);
        assert_eq!(USERFAULTFD_IOC_NEW, 0x0000_AA00);
    }

    fn msg(event: u8, words: [u64; 3]) -> [u8; MSG_SIZE] {
        let mut b = [0u8; MSG_SIZE];
        b[0] = event;
        for (i, w) in words.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_ne_bytes());
        }
        b
    }

    #[test]
    fn messages_decode_per_the_uapi_union() {
        assert_eq!(
            parse_msg(&msg(EVENT_REMOVE, [0x1000, 0x3000, 0])).unwrap(),
            UffdEvent::Remove {
                start: 0x1000,
                end: 0x3000
            }
        );
        assert_eq!(
            parse_msg(&msg(EVENT_UNMAP, [0x5000, 0x9000, 0])).unwrap(),
            UffdEvent::Unmap {
                start: 0x5000,
                end: 0x9000
            }
        );
        assert_eq!(
            parse_msg(&msg(EVENT_REMAP, [0x1000, 0x8000, 0x2000])).unwrap(),
            UffdEvent::Remap {
                from: 0x1000,
                to: 0x8000,
                len: 0x2000
            }
        );
        assert_eq!(
            parse_msg(&msg(EVENT_PAGEFAULT, [PAGEFAULT_FLAG_WP, 0x7000, 0])).unwrap(),
            UffdEvent::PageFault {
                address: 0x7000,
                flags: PAGEFAULT_FLAG_WP
            }
        );
        assert!(matches!(
            parse_msg(&msg(0x99, [0; 3])),
            Err(GlueError::Malformed {
                what: "uffd_msg",
                ..
            })
        ));
    }
}
