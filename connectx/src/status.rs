//! The per-process status page and `nprdma doctor`'s data.
//!
//! Every process running with the library keeps one 4 KiB page of counters and pass-through
//! reasons. In the preloaded library the page is a shared mapping of the file
//! `$NPRDMA_STATUS_DIR/<pid>.status` (default directory `/dev/shm/nprdma-<uid>`, created mode
//! 0700; the file is created mode 0600 on the first verbs call and removed at exit), so other
//! processes, `nprdma doctor` among them, read the live values without talking to the process.
//! A file whose process is gone (or whose pid now belongs to another process, told apart by
//! the start time in /proc/<pid>/stat) is reported as stale.
//!
//! The layout is `#[repr(C)]` [`StatusPage`]; every field is an atomic, so writers never tear a
//! value and readers need no lock.

use std::fs::File;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::config::{Config, Mode};
use crate::error::{ConnectxError, Result};
pub use crate::status_modes::{DeviceReport, MrMode, MrReport, SelfTest};

/// `NPRDMAST` as a little-endian u64.
pub const STATUS_MAGIC: u64 = u64::from_le_bytes(*b"NPRDMAST");
/// Layout version of the status page.
pub const STATUS_VERSION: u32 = 3;
/// Number of pass-through reasons kept.
pub const MAX_REASONS: usize = 12;
/// Bytes per reason (NUL-padded UTF-8).
pub const REASON_LEN: usize = 160;

/// Mode codes in the page.
const MODE_UNPINNED: u32 = 1;
const MODE_OFF: u32 = 2;

/// The counters, shared with readers.
#[repr(C)]
#[derive(Debug, Default)]
pub struct Counters {
    /// Bytes the application registered (virtual regions).
    pub registered_bytes: AtomicU64,
    /// Bytes registered in pass-through (pinned by the provider as usual).
    pub passthrough_bytes: AtomicU64,
    /// Bytes the library keeps pinned now (windows, directories, scratch).
    pub pinned_bytes: AtomicU64,
    /// Highest `pinned_bytes` so far.
    pub pinned_peak: AtomicU64,
    /// Windows registered now.
    pub windows: AtomicU64,
    /// Window registrations so far.
    pub window_registrations: AtomicU64,
    /// Windows evicted so far.
    pub evictions: AtomicU64,
    /// Virtual regions registered now.
    pub regions: AtomicU64,
    /// Remote leases granted to peers so far.
    pub leases_granted: AtomicU64,
    /// Requests to peers' directories so far (first touch of a remote window).
    pub remote_requests: AtomicU64,
    /// Work requests the library failed on the application's behalf (synthesized errors).
    pub synthesized_errors: AtomicU64,
    /// Application work requests translated.
    pub work_requests: AtomicU64,
    /// Work requests served by pinning their ranges as plain verbs would, outside the budget
    /// (fallback.rs).
    pub fallback_pins: AtomicU64,
    /// Bytes those fallback pins hold now.
    pub fallback_bytes: AtomicU64,
    /// MRs the library registered with on-demand paging (ODP mode), now.
    pub odp_mrs: AtomicU64,
    /// Their bytes (also counted in `passthrough_bytes`: they are the provider's own MRs).
    pub odp_bytes: AtomicU64,
}

/// The page.
#[repr(C)]
#[derive(Debug)]
pub struct StatusPage {
    magic: AtomicU64,
    version: AtomicU32,
    pid: AtomicU32,
    start_time: AtomicU64,
    mode: AtomicU32,
    reason_count: AtomicU32,
    budget: AtomicU64,
    window: AtomicU64,
    /// The counters.
    pub counters: Counters,
    reasons: [[AtomicU64; REASON_LEN / 8]; MAX_REASONS],
    /// `NPRDMA_MODE` (codes of [`RegMode`](crate::config::RegMode): 1 auto, 2 odp,
    /// 3 windows, 4 off).
    reg_mode: AtomicU32,
    _pad: AtomicU32,
    /// The mode per device and per MR.
    pub modes: crate::status_modes::Modes,
}

const _: () = assert!(core::mem::size_of::<StatusPage>() <= 4096);

impl StatusPage {
    fn init(&self, cfg: &Config) {
        self.version.store(STATUS_VERSION, Ordering::Relaxed);
        self.pid.store(std::process::id(), Ordering::Relaxed);
        self.start_time.store(
            process_start_time(std::process::id()).unwrap_or(0),
            Ordering::Relaxed,
        );
        self.mode.store(
            match cfg.mode {
                Mode::Unpinned => MODE_UNPINNED,
                Mode::Off => MODE_OFF,
            },
            Ordering::Relaxed,
        );
        self.budget.store(cfg.budget, Ordering::Relaxed);
        self.window.store(cfg.window, Ordering::Relaxed);
        self.reg_mode.store(
            match cfg.reg_mode {
                crate::config::RegMode::Auto => 1,
                crate::config::RegMode::Odp => 2,
                crate::config::RegMode::Windows => 3,
                crate::config::RegMode::Off => 4,
            },
            Ordering::Relaxed,
        );
        self.magic.store(STATUS_MAGIC, Ordering::Release);
    }

    /// Records a pass-through reason (each distinct text once; the first [`MAX_REASONS`]).
    pub fn add_reason(&self, text: &str) {
        if self.reasons().iter().any(|r| r == text) {
            return;
        }
        let i = self.reason_count.load(Ordering::Acquire) as usize;
        if i >= MAX_REASONS {
            return;
        }
        let mut bytes = [0u8; REASON_LEN];
        let mut n = text.len().min(REASON_LEN - 1);
        while !text.is_char_boundary(n) {
            n -= 1;
        }
        bytes[..n].copy_from_slice(&text.as_bytes()[..n]);
        for (w, chunk) in self.reasons[i].iter().zip(bytes.chunks(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        self.reason_count.store(i as u32 + 1, Ordering::Release);
    }

    /// The reasons recorded so far.
    pub fn reasons(&self) -> Vec<String> {
        let n = (self.reason_count.load(Ordering::Acquire) as usize).min(MAX_REASONS);
        self.reasons[..n]
            .iter()
            .map(|words| {
                let mut bytes = Vec::with_capacity(REASON_LEN);
                for w in words {
                    bytes.extend_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
                }
                let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
                String::from_utf8_lossy(&bytes[..end]).into_owned()
            })
            .collect()
    }

    /// Sets the pinned gauge and raises the peak.
    pub fn set_pinned(&self, bytes: u64) {
        self.counters.pinned_bytes.store(bytes, Ordering::Relaxed);
        self.counters
            .pinned_peak
            .fetch_max(bytes, Ordering::Relaxed);
    }

    /// A snapshot as a report.
    pub fn report(&self) -> Report {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Report {
            pid: self.pid.load(Ordering::Relaxed),
            mode: match self.mode.load(Ordering::Relaxed) {
                MODE_UNPINNED => ReportMode::Unpinned,
                MODE_OFF => ReportMode::Off,
                _ => ReportMode::Unknown,
            },
            reasons: self.reasons(),
            budget: self.budget.load(Ordering::Relaxed),
            window: self.window.load(Ordering::Relaxed),
            registered_bytes: get(&c.registered_bytes),
            passthrough_bytes: get(&c.passthrough_bytes),
            pinned_bytes: get(&c.pinned_bytes),
            pinned_peak: get(&c.pinned_peak),
            windows: get(&c.windows),
            window_registrations: get(&c.window_registrations),
            evictions: get(&c.evictions),
            regions: get(&c.regions),
            leases_granted: get(&c.leases_granted),
            remote_requests: get(&c.remote_requests),
            synthesized_errors: get(&c.synthesized_errors),
            work_requests: get(&c.work_requests),
            fallback_pins: get(&c.fallback_pins),
            fallback_bytes: get(&c.fallback_bytes),
            odp_mrs: get(&c.odp_mrs),
            odp_bytes: get(&c.odp_bytes),
            reg_mode: match self.reg_mode.load(Ordering::Relaxed) {
                1 => "auto",
                2 => "odp",
                3 => "windows",
                4 => "off",
                _ => "unknown",
            },
            devices: self.modes.devices(),
            mrs: self.modes.mrs().0,
            mrs_unlisted: self.modes.mrs().1,
            alive: true,
        }
    }
}

/// Where a page lives.
#[derive(Debug)]
pub enum PageStore {
    /// A heap page (tests, or when the status file cannot be created).
    Heap(Box<StatusPage>),
    /// A shared mapping of the status file.
    File {
        /// The mapping.
        ptr: *mut StatusPage,
        /// The file's path (removed on drop by the process that created it).
        path: PathBuf,
        /// That process: a child made by `fork()` has a private copy of the page instead
        /// ([`PageStore::privatize_after_fork`]) and never removes its parent's file.
        owner: u32,
    },
}

// SAFETY: the mapping is only accessed through atomics; the pointer stays valid until drop.
unsafe impl Send for PageStore {}
// SAFETY: as above.
unsafe impl Sync for PageStore {}

impl PageStore {
    /// A zeroed heap page initialised from `cfg`.
    pub fn heap(cfg: &Config) -> Self {
        let page = Box::new(StatusPage {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            start_time: AtomicU64::new(0),
            mode: AtomicU32::new(0),
            reason_count: AtomicU32::new(0),
            budget: AtomicU64::new(0),
            window: AtomicU64::new(0),
            counters: Counters::default(),
            reasons: Default::default(),
            reg_mode: AtomicU32::new(0),
            _pad: AtomicU32::new(0),
            modes: Default::default(),
        });
        page.init(cfg);
        PageStore::Heap(page)
    }

    /// The status file of this process in `cfg.status_dir`, mapped shared.
    ///
    /// The directory is created mode 0700 if missing, then opened without following a
    /// symbolic link and checked ([`check_dir`](crate::status_file::check_dir)): it must belong to this user and must not be
    /// writable by others unless it has the sticky bit. The file is created with
    /// `O_CREAT | O_EXCL | O_NOFOLLOW` relative to that open directory, so a symbolic link or a
    /// file someone planted under this pid's name is never opened, truncated or written; a
    /// leftover entry of that name (a crashed process with the same pid) is unlinked first,
    /// which the sticky bit refuses for another user's entry. Any refusal is an error here,
    /// and the caller keeps a private page instead (the process runs on, doctor does not see
    /// it).
    pub fn file(cfg: &Config) -> Result<Self> {
        let dir = &cfg.status_dir;
        let err = |why: String| ConnectxError::Status {
            path: dir.display().to_string(),
            why,
        };
        if let Some(parent) = dir.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| err(e.to_string()))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(err(e.to_string())),
        }
        let dir_fd = crate::status_file::open_checked_dir(dir).map_err(err)?;
        let name = format!("{}.status", std::process::id());
        let file = crate::status_file::create_exclusive(&dir_fd, &name).map_err(err)?;
        file.set_len(4096).map_err(|e| err(e.to_string()))?;
        let ptr = map(&file, true).ok_or_else(|| err("mmap failed".into()))?;
        // SAFETY: `ptr` maps 4096 zeroed bytes of the file, page-aligned; StatusPage is at most
        // 4096 bytes of atomics, for which all-zero is a valid value.
        let page = unsafe { &*ptr };
        page.init(cfg);
        Ok(PageStore::File {
            ptr,
            path: dir.join(name),
            owner: std::process::id(),
        })
    }

    /// [`file`](Self::file), or a private heap page when the file cannot be had safely,
    /// with the reason to log and record: never an error for the application.
    pub fn file_or_heap(cfg: &Config) -> (Self, Option<String>) {
        match Self::file(cfg) {
            Ok(s) => (s, None),
            Err(e) => (
                Self::heap(cfg),
                Some(format!(
                    "{e}; status page kept private: nprdma doctor will not see this process"
                )),
            ),
        }
    }

    /// The page.
    pub fn page(&self) -> &StatusPage {
        match self {
            PageStore::Heap(b) => b,
            // SAFETY: the mapping lives until `self` is dropped.
            PageStore::File { ptr, .. } => unsafe { &**ptr },
        }
    }

    /// The status file's path, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            PageStore::Heap(_) => None,
            PageStore::File { path, owner, .. } => {
                (*owner == std::process::id()).then_some(path.as_path())
            }
        }
    }

    /// In a child made by `fork()` (from the fork handler, the child's only thread): the
    /// shared mapping of the parent's status file is replaced, at the same address, by a
    /// private anonymous page holding a copy of it with the child's pid, so the child's
    /// counters never reach the parent's page. The child has no status file of its own
    /// (doctor does not list it; `doctor::current()` in the child reads the copy). If the
    /// mapping cannot be replaced (an unmapped page would be worse) the shared one stays, and
    /// the caller is told (`false`).
    pub fn privatize_after_fork(&self) -> bool {
        let PageStore::File { ptr, .. } = self else {
            return true;
        };
        let mut copy = [0u8; 4096];
        // SAFETY: `ptr` maps 4096 readable bytes; a plain copy of them.
        unsafe { core::ptr::copy_nonoverlapping(ptr.cast::<u8>(), copy.as_mut_ptr(), 4096) };
        // SAFETY: replaces exactly the 4096-byte mapping this store owns, at its address, by
        // an anonymous private one (MAP_FIXED); the result is checked.
        let p = unsafe {
            libc::mmap(
                ptr.cast(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != ptr.cast() {
            return false;
        }
        // SAFETY: the new mapping is 4096 writable bytes at `ptr`.
        unsafe { core::ptr::copy_nonoverlapping(copy.as_ptr(), ptr.cast::<u8>(), 4096) };
        let page = self.page();
        page.pid.store(std::process::id(), Ordering::Relaxed);
        page.start_time.store(
            process_start_time(std::process::id()).unwrap_or(0),
            Ordering::Relaxed,
        );
        true
    }
}

impl Drop for PageStore {
    fn drop(&mut self) {
        if let PageStore::File { ptr, path, owner } = self {
            // SAFETY: `ptr` is the 4096-byte mapping created in `file` (or its private copy
            // after a fork), unmapped once.
            unsafe {
                libc::munmap(ptr.cast(), 4096);
            }
            if *owner == std::process::id() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

fn map(file: &File, writable: bool) -> Option<*mut StatusPage> {
    use std::os::fd::AsRawFd;
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: maps 4096 bytes of an open file that is at least that long; the result is checked.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            4096,
            prot,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p.cast())
}

/// The active mode as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportMode {
    /// Registrations are virtual, windows pinned on demand.
    Unpinned,
    /// `NPRDMA=off`: pass-through.
    Off,
    /// The page holds an unknown mode code.
    Unknown,
}

/// What `nprdma doctor` prints for one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The process.
    pub pid: u32,
    /// The active mode.
    pub mode: ReportMode,
    /// Why the library stepped aside, each reason once (empty if it never did).
    pub reasons: Vec<String>,
    /// The pinned-memory budget.
    pub budget: u64,
    /// The window size.
    pub window: u64,
    /// Bytes registered by the application as unpinned regions.
    pub registered_bytes: u64,
    /// Bytes registered in pass-through (pinned as usual).
    pub passthrough_bytes: u64,
    /// Bytes the library keeps pinned now.
    pub pinned_bytes: u64,
    /// Highest pinned value so far.
    pub pinned_peak: u64,
    /// Windows registered now.
    pub windows: u64,
    /// Window registrations so far.
    pub window_registrations: u64,
    /// Evictions so far.
    pub evictions: u64,
    /// Regions now.
    pub regions: u64,
    /// Leases granted to peers so far.
    pub leases_granted: u64,
    /// Requests to peers so far.
    pub remote_requests: u64,
    /// Errors synthesized so far.
    pub synthesized_errors: u64,
    /// Work requests translated so far.
    pub work_requests: u64,
    /// Work requests served by fallback pins so far.
    pub fallback_pins: u64,
    /// Bytes the fallback pins hold now.
    pub fallback_bytes: u64,
    /// MRs registered with on-demand paging by the library, now.
    pub odp_mrs: u64,
    /// Their bytes.
    pub odp_bytes: u64,
    /// `NPRDMA_MODE` (`auto`, `odp`, `windows`, `off`).
    pub reg_mode: &'static str,
    /// The mode chosen per device, with the ODP self-test's result.
    pub devices: Vec<DeviceReport>,
    /// The live MRs and how each is served (the first [`MAX_MRS`](crate::status_modes::MAX_MRS)).
    pub mrs: Vec<MrReport>,
    /// Live MRs beyond those listed.
    pub mrs_unlisted: u64,
    /// Whether the process still runs.
    pub alive: bool,
}

/// The start time of `pid` (clock ticks after boot, field 22 of /proc/<pid>/stat).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: fields after the last ')'.
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Reads one status file.
pub fn read_file(path: &Path) -> Result<Report> {
    let err = |why: String| ConnectxError::Status {
        path: path.display().to_string(),
        why,
    };
    // Only a regular file: opening a FIFO (or a device) someone left in the directory would
    // block doctor, or read something that is no status page. Not following a symbolic link
    // either, and not blocking on the open.
    let kind = std::fs::symlink_metadata(path).map_err(|e| err(e.to_string()))?;
    if !kind.file_type().is_file() {
        return Err(err("not a regular file".into()));
    }
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| err(e.to_string()))?
    };
    let len = file.metadata().map_err(|e| err(e.to_string()))?.len();
    if len < 4096 {
        return Err(err(format!("{len} bytes, not a status page")));
    }
    let ptr = map(&file, false).ok_or_else(|| err("mmap failed".into()))?;
    // SAFETY: a read-only 4096-byte mapping of the file; all-zero or any bytes are valid atomics.
    let page = unsafe { &*ptr };
    let version = page.version.load(Ordering::Relaxed);
    let result = if page.magic.load(Ordering::Acquire) != STATUS_MAGIC {
        // The magic is stored last: a library that is still setting its page up reads so too.
        Err(err(
            "not an nprdma status page (or one still being set up)".into()
        ))
    } else if version != STATUS_VERSION {
        Err(err(format!(
            "a status page of layout version {version}, written by another release of \
             libnprdma.so; this nprdma reads version {STATUS_VERSION}"
        )))
    } else {
        let mut r = page.report();
        let started = page.start_time.load(Ordering::Relaxed);
        r.alive = process_start_time(r.pid).is_some_and(|t| t == started);
        Ok(r)
    };
    // SAFETY: unmaps the mapping created above, once.
    unsafe {
        libc::munmap(ptr.cast(), 4096);
    }
    result
}

/// A status file that could not be read, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The file.
    pub path: PathBuf,
    /// Why it was not read.
    pub why: String,
}

/// What a status directory holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// Each readable status page with its file, sorted by pid.
    pub reports: Vec<(PathBuf, Report)>,
    /// The `*.status` files that are not readable pages of this version, sorted by path.
    pub skipped: Vec<Skipped>,
}

/// Reads every `*.status` file in `dir` (`None`: the default directory of this uid). A
/// missing directory is an empty survey.
pub fn survey(dir: Option<&Path>) -> Survey {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| crate::config::default_status_dir(crate::config::current_uid()));
    let mut out = Survey::default();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        if !entry.file_name().to_string_lossy().ends_with(".status") {
            continue;
        }
        let path = entry.path();
        match read_file(&path) {
            Ok(r) => out.reports.push((path, r)),
            Err(ConnectxError::Status { why, .. }) => out.skipped.push(Skipped { path, why }),
            Err(e) => out.skipped.push(Skipped {
                path,
                why: e.to_string(),
            }),
        }
    }
    out.reports.sort_by_key(|(_, r)| r.pid);
    out.skipped.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The readable reports of [`survey`], sorted by pid.
pub fn scan(dir: Option<&Path>) -> Vec<Report> {
    survey(dir).reports.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_in_the_status_directory_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("nprdma-fifo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("99999.status");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a path this test owns.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening the FIFO for reading would block until a writer came: refused first.
        assert!(read_file(&fifo).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_page_is_readable_from_outside_and_removed_on_drop() {
        let dir = std::env::temp_dir().join(format!("nprdma-status-test-{}", std::process::id()));
        let mut cfg = Config::for_tests(16 << 20, 1 << 20);
        cfg.status_dir = dir.clone();
        let store = PageStore::file(&cfg).unwrap();
        let page = store.page();
        page.counters
            .registered_bytes
            .store(1 << 30, Ordering::Relaxed);
        page.set_pinned(3 << 20);
        page.set_pinned(1 << 20);
        page.add_reason("dmabuf MR: pass-through");
        page.add_reason("dmabuf MR: pass-through");
        page.add_reason("ünïcode reason");
        let path = store.path().unwrap().to_path_buf();
        let r = read_file(&path).unwrap();
        assert_eq!(r.pid, std::process::id());
        assert!(r.alive);
        assert_eq!(r.mode, ReportMode::Unpinned);
        assert_eq!(r.budget, 16 << 20);
        assert_eq!(r.registered_bytes, 1 << 30);
        assert_eq!((r.pinned_bytes, r.pinned_peak), (1 << 20, 3 << 20));
        assert_eq!(
            r.reasons,
            vec![
                "dmabuf MR: pass-through".to_string(),
                "ünïcode reason".into()
            ]
        );
        assert_eq!(scan(Some(&dir)), vec![r]);
        drop(store);
        assert!(!path.exists());
        assert!(scan(Some(&dir)).is_empty());
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn garbage_and_stale_files() {
        let dir = std::env::temp_dir().join(format!("nprdma-status-junk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("1.status");
        std::fs::write(&junk, vec![0u8; 4096]).unwrap();
        assert!(read_file(&junk).is_err());
        std::fs::write(&junk, b"short").unwrap();
        assert!(read_file(&junk).is_err());
        assert!(scan(Some(&dir)).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(process_start_time(u32::MAX), None);
        assert!(process_start_time(std::process::id()).is_some());
    }

    /// Writes `bytes` as `<name>.status` in `dir`.
    fn put(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let path = dir.join(format!("{name}.status"));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[test]
    fn a_survey_names_what_it_skipped_and_which_pages_are_of_exited_processes() {
        let dir = std::env::temp_dir().join(format!("nprdma-survey-{}", std::process::id()));
        let mut cfg = Config::for_tests(16 << 20, 1 << 20);
        cfg.status_dir = dir.clone();
        let store = PageStore::file(&cfg).unwrap();
        let live = std::fs::read(store.path().unwrap()).unwrap();
        // Layout: magic @0, version @8, pid @12, start time @16.
        let mut other_release = live.clone();
        other_release[8..12].copy_from_slice(&(STATUS_VERSION + 1).to_le_bytes());
        let newer = put(&dir, "other-release", &other_release);
        // The same pid with another start time: the process exited and its pid was reused.
        let mut exited = live.clone();
        let started = u64::from_le_bytes(live[16..24].try_into().unwrap());
        exited[16..24].copy_from_slice(&(started + 1).to_le_bytes());
        let stale = put(&dir, "exited", &exited);
        let junk = put(&dir, "junk", &[0u8; 4096]);

        let survey = survey(Some(&dir));
        let alive: Vec<_> = survey
            .reports
            .iter()
            .map(|(p, r)| (p.clone(), r.alive))
            .collect();
        assert!(alive.contains(&(store.path().unwrap().to_path_buf(), true)));
        assert!(alive.contains(&(stale, false)));
        assert_eq!(alive.len(), 2);
        assert_eq!(survey.skipped.len(), 2);
        let why = |p: &Path| {
            survey
                .skipped
                .iter()
                .find(|s| s.path == p)
                .map(|s| s.why.clone())
                .unwrap()
        };
        let other = format!("layout version {}", STATUS_VERSION + 1);
        assert!(why(&newer).contains(&other), "{}", why(&newer));
        assert!(why(&junk).contains("not an nprdma status page"));
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reasons_are_capped() {
        let store = PageStore::heap(&Config::for_tests(1 << 20, 4096));
        for i in 0..MAX_REASONS + 3 {
            store.page().add_reason(&format!("reason {i}"));
        }
        assert_eq!(store.page().reasons().len(), MAX_REASONS);
        let long = "x".repeat(500);
        let s2 = PageStore::heap(&Config::for_tests(1 << 20, 4096));
        s2.page().add_reason(&long);
        assert_eq!(s2.page().reasons()[0].len(), REASON_LEN - 1);
    }
}
