//! Creating the status file (crate::status) safely in a directory other users may reach:
//! `/dev/shm` is writable by everyone, so the directory is opened without following a link and
//! checked, and the file is created exclusively relative to it, never through a link or over
//! someone else's file (docs/connectx.md §10).

use std::fs::File;
use std::path::Path;

/// Why a status directory is refused, from its owner and mode (`st_uid`, `st_mode`), for a
/// process of effective uid `euid`: it must be a directory of this user, not writable by
/// group or others unless the sticky bit keeps them from removing or renaming this user's
/// entries.
pub fn check_dir(uid: u32, mode: u32, euid: u32) -> core::result::Result<(), String> {
    if mode & libc::S_IFMT != libc::S_IFDIR {
        return Err("not a directory".into());
    }
    if uid != euid {
        return Err(format!(
            "owned by uid {uid}, not by this process's uid {euid}"
        ));
    }
    if mode & 0o022 != 0 && mode & libc::S_ISVTX == 0 {
        return Err(format!(
            "mode {:o}: writable by others without the sticky bit",
            mode & 0o7777
        ));
    }
    Ok(())
}

pub(crate) fn c_path(p: &Path) -> core::result::Result<std::ffi::CString, String> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())
}

/// Opens `dir` (never through a symbolic link as its last component) and checks it
/// ([`check_dir`]).
pub(crate) fn open_checked_dir(dir: &Path) -> core::result::Result<std::os::fd::OwnedFd, String> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let c = c_path(dir)?;
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        // With O_DIRECTORY Linux reports a final symbolic link as ENOTDIR, without as ELOOP.
        let link = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
        return Err(if link {
            "a symbolic link, not a directory: refused".into()
        } else {
            e.to_string()
        });
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid `stat`, which fstat fills.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a live descriptor and a `stat` to fill.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    check_dir(st.st_uid, st.st_mode, euid)?;
    Ok(fd)
}

/// Creates `name` in the checked directory `dir` with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode
/// 0600. An entry of that name is unlinked first (never followed) and the creation tried
/// once more; the new file is checked to be a regular file of this user with one link.
pub(crate) fn create_exclusive(
    dir: &std::os::fd::OwnedFd,
    name: &str,
) -> core::result::Result<File, String> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    let open = || {
        // SAFETY: a live directory descriptor and a NUL-terminated name; the result is checked.
        unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        }
    };
    let mut fd = open();
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
        // A leftover of a crashed process whose pid this one has now, or something planted:
        // remove the entry itself (unlinkat never follows a link).
        // SAFETY: as above.
        if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) } != 0 {
            return Err(format!(
                "{name} exists and cannot be removed: {}",
                std::io::Error::last_os_error()
            ));
        }
        fd = open();
    }
    if fd < 0 {
        return Err(format!("{name}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        if !meta.file_type().is_file() || meta.uid() != euid || meta.nlink() != 1 {
            return Err(format!("{name}: not a fresh regular file of this user"));
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::status::{PageStore, read_file};
    use std::os::unix::fs::DirBuilderExt;
    use std::path::PathBuf;

    /// A fresh directory for one test, mode 0700.
    fn scratch_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("nprdma-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        dir
    }

    fn cfg_in(dir: &Path) -> Config {
        let mut cfg = Config::for_tests(16 << 20, 1 << 20);
        cfg.status_dir = dir.to_path_buf();
        cfg
    }

    fn chmod(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_planted_symlink_is_never_followed_and_its_target_is_untouched() {
        let dir = scratch_dir("symlink-file");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.join(format!("{}.status", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let store = PageStore::file(&cfg_in(&dir)).unwrap();
        // The victim keeps its bytes and length: no truncation, no mapping of it.
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        let meta = std::fs::symlink_metadata(&planted).unwrap();
        assert!(
            meta.file_type().is_file(),
            "the status file is the link's target"
        );
        assert_eq!(meta.len(), 4096);
        assert_eq!(read_file(&planted).unwrap().pid, std::process::id());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlinked_status_directory_is_refused_and_the_page_kept_private() {
        let base = scratch_dir("symlink-dir");
        let real = base.join("elsewhere");
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&real)
            .unwrap();
        let link = base.join("status");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = PageStore::file(&cfg_in(&link)).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let (store, why) = PageStore::file_or_heap(&cfg_in(&link));
        assert!(store.path().is_none());
        assert!(why.unwrap().contains("kept private"));
        assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_directory_writable_by_others_needs_the_sticky_bit() {
        let dir = scratch_dir("world-writable");
        chmod(&dir, 0o777);
        let e = PageStore::file(&cfg_in(&dir)).unwrap_err();
        assert!(e.to_string().contains("without the sticky bit"), "{e}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        chmod(&dir, 0o1777);
        let store = PageStore::file(&cfg_in(&dir)).unwrap();
        assert!(store.path().is_some());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_foreign_owned_directory_is_refused() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let dir = scratch_dir("foreign-dir");
        let target = if euid == 0 {
            // As root: give the directory to another user (65534, nobody).
            let c = c_path(&dir).unwrap();
            // SAFETY: a path this test owns.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
            dir.clone()
        } else {
            // Otherwise the root directory is another user's.
            PathBuf::from("/")
        };
        let e = PageStore::file(&cfg_in(&target)).unwrap_err();
        assert!(e.to_string().contains("not by this process's uid"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(check_dir(0, libc::S_IFDIR | 0o700, 0).is_ok());
        assert!(check_dir(0, libc::S_IFREG | 0o600, 0).is_err());
    }

    #[test]
    fn a_foreign_owned_file_under_this_pid_is_replaced_never_written() {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        let dir = scratch_dir("foreign-file");
        let planted = dir.join(format!("{}.status", std::process::id()));
        std::fs::write(&planted, b"someone else's").unwrap();
        if euid == 0 {
            let c = c_path(&planted).unwrap();
            // SAFETY: a path this test owns.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        }
        // A second link keeps the planted inode reachable after its name is reused.
        let keep = dir.join("kept");
        std::fs::hard_link(&planted, &keep).unwrap();
        let store = PageStore::file(&cfg_in(&dir)).unwrap();
        assert_eq!(std::fs::read(&keep).unwrap(), b"someone else's");
        {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&planted).unwrap();
            assert_eq!(
                (meta.uid(), meta.mode() & 0o777, meta.len()),
                (euid, 0o600, 4096)
            );
        }
        assert_eq!(read_file(&planted).unwrap().pid, std::process::id());
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
