//! Swap for tests and benchmarks: a swap file that is always switched off and removed, sysctl
//! changes that are always restored, a lock that serialises swap users across processes, and
//! an eviction helper that really empties the swap cache.
//!
//! Everything here restores state in `Drop`, so it also happens when a test panics (unwinding).
//! It cannot happen when the process is killed with SIGKILL; the file names start with
//! `linux-glue-swap-` and carry the process id so that leftovers can be recognised.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hal::{AlignedRange, VirtAddr};

use crate::pagemap;
use crate::sys::{self, PAGE};
use crate::{GlueError, Result};

/// A counter from /proc/vmstat (e.g. `pswpin`, `pswpout`, `pgmajfault`).
pub fn vmstat(key: &str) -> Result<u64> {
    let text = fs::read_to_string("/proc/vmstat").map_err(|e| GlueError::Unavailable {
        feature: "/proc/vmstat",
        why: e.to_string(),
    })?;
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(' ')
            && k == key
        {
            return v.trim().parse().map_err(|_| GlueError::Malformed {
                what: "vmstat line",
                detail: line.to_string(),
            });
        }
    }
    Err(GlueError::Unavailable {
        feature: "vmstat counter",
        why: format!("no {key} in /proc/vmstat"),
    })
}

/// Sets a sysctl under /proc/sys and restores the old value when dropped.
#[derive(Debug)]
pub struct SysctlGuard {
    path: PathBuf,
    old: String,
}

impl SysctlGuard {
    /// Sets `name` (dotted, e.g. `vm.page-cluster`) to `value`.
    pub fn set(name: &str, value: &str) -> Result<Self> {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let old = fs::read_to_string(&path)
            .map_err(|e| GlueError::Unavailable {
                feature: "sysctl",
                why: format!("{name}: {e}"),
            })?
            .trim()
            .to_string();
        fs::write(&path, value).map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => GlueError::PermissionDenied {
                what: "writing a sysctl",
            },
            _ => GlueError::Unavailable {
                feature: "sysctl",
                why: format!("{name}: {e}"),
            },
        })?;
        Ok(Self { path, old })
    }

    /// The value before the change.
    pub fn old_value(&self) -> &str {
        &self.old
    }
}

impl Drop for SysctlGuard {
    fn drop(&mut self) {
        let _ = fs::write(&self.path, &self.old);
    }
}

/// An exclusive lock shared by every swap user on the machine (tests and benchmarks, in any
/// process): `flock` on a file in the temporary directory. Held until dropped.
#[derive(Debug)]
pub struct SwapLock {
    _file: File,
}

impl SwapLock {
    /// Blocks until the lock is free.
    pub fn acquire() -> Result<Self> {
        let path = std::env::temp_dir().join("linux-glue-swap.lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| GlueError::Unavailable {
                feature: "swap lock file",
                why: e.to_string(),
            })?;
        loop {
            // SAFETY: flock on an fd we own.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                break;
            }
            if sys::errno() != libc::EINTR {
                return Err(sys::os_error("flock"));
            }
        }
        Ok(Self { _file: file })
    }
}

/// A swap file with a unique name, enabled on creation, switched off and deleted on drop.
#[derive(Debug)]
pub struct SwapFile {
    path: PathBuf,
    active: bool,
}

static SWAP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes the version-1 swap header: `union swap_header` in include/linux/swap.h (`info`:
/// 1024 boot bytes, then version (1024), last_page (1028), nr_badpages (1032), uuid[16]
/// (1036), volume_name[16] (1052); the magic `SWAPSPACE2` in the last 10 bytes of the first
/// page). The UUID stays zero; the volume name says who made the file.
fn write_swap_header(f: &mut File, pages: u64) -> std::io::Result<()> {
    let mut page = vec![0u8; PAGE as usize];
    page[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    let last = u32::try_from(pages - 1).unwrap_or(u32::MAX);
    page[1028..1032].copy_from_slice(&last.to_ne_bytes());
    let tag = b"linux-glue-swap";
    page[1052..1052 + tag.len()].copy_from_slice(tag);
    page[PAGE as usize - 10..].copy_from_slice(b"SWAPSPACE2");
    f.seek(SeekFrom::Start(0))?;
    f.write_all(&page)?;
    f.sync_all()
}

fn swapon(path: &Path) -> Result<(), i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: a valid NUL-terminated path; flags 0 (default priority, no discard).
    let rc = unsafe { libc::swapon(c.as_ptr(), 0) };
    if rc == 0 { Ok(()) } else { Err(sys::errno()) }
}

fn swapoff(path: &Path) -> Result<(), i32> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::swapoff(c.as_ptr()) };
    if rc == 0 { Ok(()) } else { Err(sys::errno()) }
}

impl SwapFile {
    /// Creates a swap file of `bytes` in `dir` and enables it. Needs CAP_SYS_ADMIN and a file
    /// system that supports swap files.
    pub fn create(dir: &Path, bytes: u64) -> Result<Self> {
        let pages = bytes / PAGE;
        if pages < 16 {
            return Err(GlueError::InvalidArgument {
                what: "swap file smaller than 64 KiB",
            });
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "linux-glue-swap-{}-{stamp}-{}.swap",
            std::process::id(),
            SWAP_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let mut me = Self {
            path,
            active: false,
        };
        let mut f = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(&me.path)
            .map_err(|e| GlueError::Unavailable {
                feature: "swap file",
                why: format!("create: {e}"),
            })?;
        let _ = f.set_permissions(fs::Permissions::from_mode(0o600));
        // SAFETY: fallocate on an fd we own, for the requested length.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, (pages * PAGE) as libc::off_t) };
        if rc != 0 {
            f.set_len(pages * PAGE)
                .map_err(|e| GlueError::Unavailable {
                    feature: "swap file",
                    why: format!("size: {e}"),
                })?;
        }
        write_swap_header(&mut f, pages).map_err(|e| GlueError::Unavailable {
            feature: "swap file",
            why: format!("header: {e}"),
        })?;
        if let Err(first) = swapon(&me.path) {
            // Some file systems refuse preallocated (unwritten) extents: write real zeros.
            let zeros = vec![0u8; 1 << 20];
            let mut left = pages * PAGE - PAGE;
            let _ = f.seek(SeekFrom::Start(PAGE));
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                if f.write_all(&zeros[..n]).is_err() {
                    break;
                }
                left -= n as u64;
            }
            let _ = f.sync_all();
            swapon(&me.path).map_err(|e| GlueError::Unavailable {
                feature: "swapon",
                why: format!("errno {first}, after zero-fill errno {e}"),
            })?;
        }
        me.active = true;
        Ok(me)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether /proc/swaps lists this file.
    pub fn is_listed(&self) -> bool {
        listed(&self.path)
    }

    /// Switches the swap off and removes the file now (same as dropping, with errors).
    pub fn remove(mut self) -> Result<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        let mut result = Ok(());
        if self.active {
            // swapoff brings every swapped page back into memory first; it may take a while.
            if let Err(e) = swapoff(&self.path) {
                result = Err(GlueError::Os {
                    op: "swapoff",
                    errno: e,
                });
            } else {
                self.active = false;
            }
        }
        match fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                if result.is_ok() {
                    result = Err(GlueError::Os {
                        op: "remove swap file",
                        errno: e.raw_os_error().unwrap_or(0),
                    });
                }
            }
        }
        result
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Whether /proc/swaps lists `path`.
pub fn listed(path: &Path) -> bool {
    let Ok(text) = fs::read_to_string("/proc/swaps") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines()
        .skip(1)
        .any(|l| l.split_whitespace().next() == Some(&*want))
}

/// Everything a swap experiment needs, torn down in the right order on drop: the sysctl is
/// restored first, then the swap is switched off and its file removed, then the lock released.
#[derive(Debug)]
pub struct SwapLab {
    page_cluster: Option<SysctlGuard>,
    swap: SwapFile,
    _lock: SwapLock,
}

impl SwapLab {
    /// Takes the swap lock, creates and enables a `bytes` swap file in `dir`, and sets
    /// `vm.page-cluster` to `page_cluster` if given (0 disables swap read-ahead, so that each
    /// major fault reads exactly one page).
    pub fn open(dir: &Path, bytes: u64, page_cluster: Option<u32>) -> Result<Self> {
        let lock = SwapLock::acquire()?;
        let swap = SwapFile::create(dir, bytes)?;
        let page_cluster = match page_cluster {
            Some(v) => Some(SysctlGuard::set("vm.page-cluster", &v.to_string())?),
            None => None,
        };
        Ok(Self {
            page_cluster,
            swap,
            _lock: lock,
        })
    }

    /// The swap file.
    pub fn swap(&self) -> &SwapFile {
        &self.swap
    }

    /// The page-cluster value that will be restored, if it was changed.
    pub fn saved_page_cluster(&self) -> Option<&str> {
        self.page_cluster.as_ref().map(|g| g.old_value())
    }
}

/// Where the pages of a range ended up after [`evict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Eviction {
    /// Pages swapped out and not in the swap cache: the next touch reads the device.
    pub on_device: u64,
    /// Pages swapped out but still in the swap cache: the next touch is a minor fault.
    pub in_swap_cache: u64,
    /// Pages still mapped.
    pub present: u64,
    /// Rounds of MADV_PAGEOUT used.
    pub rounds: u32,
}

/// [`evict`] gives up after this many rounds in a row in which only mapped pages were left and
/// none of them went.
const STALLED_ROUNDS: u32 = 10;

/// Pushes the anonymous pages of `range` out to swap and out of the swap cache.
///
/// `MADV_PAGEOUT` writes dirty anonymous pages to swap but leaves them in the swap cache
/// (reclaim finds them under writeback), so a later touch is a minor fault and `pswpin` does
/// not move. Once writeback has finished, faulting such a page back in *for read* maps it
/// clean with its swap slot kept; a second `MADV_PAGEOUT` then frees it without writing. Pages
/// in the swap cache are told apart with mincore(2), which counts swap-cache pages as resident.
pub fn evict(range: AlignedRange<VirtAddr>) -> Result<Eviction> {
    let (start, len, count) = (range.start().as_u64(), range.len(), range.page_count());
    let pm = pagemap::PagemapReader::open()?;
    let pageout = |s: u64, l: u64| {
        sys::madvise(s, l, libc::MADV_PAGEOUT).map_err(|errno| GlueError::Os {
            op: "MADV_PAGEOUT",
            errno,
        })
    };
    pageout(start, len)?;
    let mut report = Eviction::default();
    // Mapped pages left and the rounds since that number last fell while nothing waited in
    // the swap cache: a page the kernel keeps mapped (pinned, or busy elsewhere) would
    // otherwise cost every remaining round. Pages in the swap cache may only be waiting for
    // writeback (slow under load), so rounds with any of them never count as stalled.
    let (mut present_before, mut stalled) = (u64::MAX, 0u32);
    for round in 1..=60u32 {
        let entries = pm.entries(start, count)?;
        let resident = pagemap::mincore(start, count)?;
        let mut cached = Vec::new();
        let mut present = Vec::new();
        report = Eviction {
            rounds: round,
            ..Default::default()
        };
        for (i, e) in entries.iter().enumerate() {
            let addr = start + i as u64 * PAGE;
            if e.present() {
                report.present += 1;
                present.push(addr);
            } else if e.swapped() && resident.get(i).copied().unwrap_or(false) {
                report.in_swap_cache += 1;
                cached.push(addr);
            } else if e.swapped() {
                report.on_device += 1;
            }
        }
        if cached.is_empty() && present.is_empty() {
            break;
        }
        stalled = if cached.is_empty() && report.present >= present_before {
            stalled + 1
        } else {
            0
        };
        present_before = present_before.min(report.present);
        if stalled >= STALLED_ROUNDS {
            break;
        }
        // Let writeback of the previous round finish before re-mapping and dropping.
        std::thread::sleep(Duration::from_millis(if round < 4 { 5 } else { 30 }));
        for &a in &cached {
            let _ = sys::madvise(a, PAGE, libc::MADV_POPULATE_READ);
        }
        for &a in cached.iter().chain(present.iter()) {
            let _ = pageout(a, PAGE);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_swap_header_follows_union_swap_header() {
        let path = std::env::temp_dir().join(format!("linux-glue-header-{}", std::process::id()));
        let mut f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        write_swap_header(&mut f, 16).unwrap();
        let page = fs::read(&path).unwrap();
        fs::remove_file(&path).unwrap();
        let u32_at = |at: usize| u32::from_ne_bytes(page[at..at + 4].try_into().unwrap());
        assert_eq!(page.len(), PAGE as usize);
        assert_eq!((u32_at(1024), u32_at(1028), u32_at(1032)), (1, 15, 0));
        assert!(
            page[1036..1052].iter().all(|&b| b == 0),
            "the UUID is left zero"
        );
        assert_eq!(&page[1052..1068], b"linux-glue-swap\0", "the volume name");
        assert_eq!(&page[PAGE as usize - 10..], b"SWAPSPACE2");
    }
}
