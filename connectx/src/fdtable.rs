//! The helper thread's own file-descriptor table.
//!
//! While two threads share a descriptor table, Linux takes and drops a reference on the file
//! at every system call that names a descriptor: the reference-free lookup is kept for a table
//! with a single user (`__fget_light` in fs/file.c). A single-threaded application whose
//! provider rings its doorbell with a system call (rxe's `ibv_post_send` ends in a `write` to
//! the context's command descriptor) would pay two more atomic operations on every post only
//! because the library started its helper thread. In the rxe guest under TCG (docs/connectx.md
//! §11) a `write` of one byte cost about 2,100 TSC cycles in a single-threaded process, about
//! 2,650 beside an idle second thread, and about 2,300 when that thread had a table of its own
//! (the remainder is glibc's cancellation bookkeeping, which any second thread switches on).
//!
//! So the helper leaves the process's table (`unshare(CLONE_FILES)`) and empties its private
//! copy at once: it must not keep the application's files open (a socket the application
//! closes must really close). For each batch of work it *borrows* the descriptors it needs,
//! the command descriptors of the library's contexts, from the process's table with
//! `pidfd_getfd(2)`, at the same numbers, so that rdma-core's calls from the helper (which
//! name `ibv_context::cmd_fd`) reach the same open files; the batch's end closes them again.
//!
//! Needs Linux 5.9 (`pidfd_open` 5.3, `pidfd_getfd` 5.6, `close_range` 5.9); where any of them
//! is missing or refused (a seccomp filter), [`PrivateTable::detach`] says why and the helper
//! keeps sharing the table, as it did before.

use core::cell::Cell;
use core::ffi::c_int;

use crate::engine::errno;

thread_local! {
    /// The pidfd of this thread's private table, if it has one (for [`write_stderr`]).
    static OWN_PIDFD: Cell<c_int> = const { Cell::new(-1) };
}

/// Why a thread could not get a table of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetachError {
    /// A probe failed before anything changed: the thread still shares the process's table.
    Unsupported(&'static str),
    /// The thread left the process's table but cannot borrow from it (a failure after the
    /// probes passed): it must not make verbs calls.
    Stranded(&'static str),
}

/// The calling thread's private descriptor table (see the module documentation).
#[derive(Debug)]
pub struct PrivateTable {
    /// A pidfd of this process, in the private table: the source of borrowed descriptors.
    pidfd: c_int,
}

fn pidfd_open() -> c_int {
    // SAFETY: pidfd_open(2) takes a pid and flags and only returns a new descriptor.
    unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) as c_int }
}

fn pidfd_getfd(pidfd: c_int, target: c_int) -> c_int {
    // SAFETY: pidfd_getfd(2) duplicates a descriptor of the process into this thread's table.
    unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0) as c_int }
}

fn close_range(first: u32, last: u32) -> c_int {
    // SAFETY: close_range(2) closes descriptors of the calling thread's table only.
    unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) as c_int }
}

fn close(fd: c_int) {
    // SAFETY: closes a descriptor of the calling thread's table that its caller owns (one it
    // opened or borrowed, or a copy in a table it just made its own).
    unsafe {
        libc::close(fd);
    }
}

impl PrivateTable {
    /// Gives the calling thread a descriptor table of its own, empty but for a pidfd.
    ///
    /// Probes first, in the shared table, that the kernel allows every call this needs; a
    /// failing probe changes nothing ([`DetachError::Unsupported`]).
    pub fn detach() -> Result<Self, DetachError> {
        if !shares_process_table() {
            // Borrowing reads the first thread's table, which is not this thread's.
            return Err(DetachError::Unsupported(
                "started by a thread with a descriptor table of its own",
            ));
        }
        let probe = pidfd_open();
        if probe < 0 {
            return Err(DetachError::Unsupported("pidfd_open(2) is not available"));
        }
        let copy = pidfd_getfd(probe, probe);
        close(probe);
        if copy < 0 {
            return Err(DetachError::Unsupported("pidfd_getfd(2) is not available"));
        }
        close(copy);
        // An empty range: succeeds where close_range(2) exists, and closes nothing.
        if close_range(u32::MAX, u32::MAX) != 0 {
            return Err(DetachError::Unsupported("close_range(2) is not available"));
        }
        // SAFETY: unshare(2) with CLONE_FILES only gives this thread a copy of its table.
        if unsafe { libc::unshare(libc::CLONE_FILES) } != 0 {
            return Err(DetachError::Unsupported("unshare(CLONE_FILES) was refused"));
        }
        // From here on the thread is alone in its table: every copy of the application's
        // descriptors goes. (The probe above makes a failure here all but impossible; then the
        // loop is the slow way to the same end.)
        if close_range(0, u32::MAX) != 0 {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `limit` is writable.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
            let top = limit.rlim_cur.min(1 << 20) as c_int;
            for fd in 0..top {
                close(fd);
            }
        }
        // (A pidfd opened before the unshare would stay in the process's table too, where
        // nothing could close it; a failure here cannot reach the log, only doctor.)
        let fresh = pidfd_open();
        if fresh < 0 {
            return Err(DetachError::Stranded(
                "pidfd_open(2) failed in the private table",
            ));
        }
        // Keep 0, 1 and 2 free: standard-stream writes on this thread (a panic message) then
        // fail with EBADF. (Only a command descriptor the application opened at 0, 1 or 2 is
        // borrowed there, and only during a batch.)
        // SAFETY: fcntl(2) F_DUPFD_CLOEXEC on our own descriptor.
        let pidfd = unsafe { libc::fcntl(fresh, libc::F_DUPFD_CLOEXEC, 3) };
        close(fresh);
        if pidfd < 0 {
            return Err(DetachError::Stranded("no descriptor above 2 for the pidfd"));
        }
        let mut table = Self { pidfd: -1 };
        table.set_pidfd(pidfd);
        Ok(table)
    }

    /// Keeps the pidfd at `pidfd`, where [`write_stderr`] also finds it.
    fn set_pidfd(&mut self, pidfd: c_int) {
        OWN_PIDFD.with(|p| p.set(pidfd));
        self.pidfd = pidfd;
    }

    /// Makes each of `fds` (numbers in the process's table) name the same open file in this
    /// thread's table until the returned [`Borrowed`] is dropped.
    ///
    /// A descriptor the process's table does not have (`EBADF`: closed behind the library's
    /// back) is skipped; if that is every one of them, the process's table is out of reach
    /// (its first thread exited) and the error is returned.
    pub fn borrow(&mut self, fds: &[c_int]) -> Result<Borrowed, i32> {
        let mut wanted: Vec<c_int> = fds.iter().copied().filter(|&fd| fd >= 0).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut held = Borrowed { fds: Vec::new() };
        if wanted.is_empty() {
            return Ok(held);
        }
        // The pidfd must not sit at a number to be borrowed.
        if wanted.binary_search(&self.pidfd).is_ok() {
            let above = wanted.last().copied().unwrap_or(0).saturating_add(1).max(3);
            // SAFETY: fcntl(2) F_DUPFD_CLOEXEC on our own descriptor.
            let moved = unsafe { libc::fcntl(self.pidfd, libc::F_DUPFD_CLOEXEC, above) };
            if moved < 0 {
                return Err(errno());
            }
            close(self.pidfd);
            self.set_pidfd(moved);
        }
        let mut missing = 0;
        for &fd in &wanted {
            let copy = pidfd_getfd(self.pidfd, fd);
            if copy < 0 {
                let e = errno();
                if e == libc::EBADF {
                    missing += 1;
                    continue;
                }
                return Err(e);
            }
            if copy != fd {
                // SAFETY: dup3(2) between descriptors of this thread's own table; `fd` is
                // free or a stale copy of ours.
                let rc = unsafe { libc::dup3(copy, fd, libc::O_CLOEXEC) };
                let e = errno();
                close(copy);
                if rc < 0 {
                    return Err(e);
                }
            }
            held.fds.push(fd);
        }
        if missing == wanted.len() {
            return Err(libc::EBADF);
        }
        Ok(held)
    }
}

impl Drop for PrivateTable {
    fn drop(&mut self) {
        OWN_PIDFD.with(|p| p.set(-1));
        close(self.pidfd);
    }
}

/// Descriptors borrowed for one batch of work; closed (in this thread's table only) on drop.
#[derive(Debug)]
pub struct Borrowed {
    fds: Vec<c_int>,
}

#[cfg(test)]
impl Borrowed {
    /// The numbers borrowed.
    pub fn fds(&self) -> &[c_int] {
        &self.fds
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        for &fd in &self.fds {
            close(fd);
        }
    }
}

/// Whether the calling thread has left the process's table through [`PrivateTable::detach`]
/// (a thread-local read, no system call).
pub fn on_private_table() -> bool {
    OWN_PIDFD.with(Cell::get) >= 0
}

/// Whether the calling thread uses the descriptor table of the process's first thread, the
/// table [`PrivateTable::borrow`] reads (a thread that called `unshare(CLONE_FILES)` does not).
/// True where the kernel cannot tell (no `kcmp(2)`).
pub fn shares_process_table() -> bool {
    // kcmp(2) with KCMP_FILES (2, include/uapi/linux/kcmp.h) compares two tasks' tables:
    // 0 is the same table.
    // SAFETY: kcmp only compares kernel objects of two tasks of this process.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::getpid(),
            libc::gettid(),
            2 as libc::c_int,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    r <= 0
}

/// Writes `bytes` to the process's standard error from a thread with a private table (its own
/// descriptor 2 is closed). Returns false on other threads: they write to their own.
pub fn write_stderr(bytes: &[u8]) -> bool {
    let pidfd = OWN_PIDFD.with(Cell::get);
    if pidfd < 0 {
        return false;
    }
    let fd = pidfd_getfd(pidfd, 2);
    if fd >= 0 {
        // SAFETY: `bytes` is readable for its length; `fd` is ours until closed below.
        unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        close(fd);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipe() -> (c_int, c_int) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for two descriptors.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        (fds[0], fds[1])
    }

    /// Whether the pipe read by `fd` reaches its end of file within two seconds. (Another
    /// test's thread may hold a copy of every descriptor for the moment between its
    /// `unshare` and `close_range`; a copy that is kept never ends.)
    fn reaches_eof(fd: c_int) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            if read_now(fd) == Some(0) {
                return true;
            }
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A non-blocking read: Some(0) at end of file, None while a writer is still open.
    fn read_now(fd: c_int) -> Option<isize> {
        let mut b = [0u8; 16];
        // SAFETY: fcntl and read on a pipe descriptor this test owns.
        unsafe {
            libc::fcntl(fd, libc::F_SETFL, libc::O_NONBLOCK);
            let n = libc::read(fd, b.as_mut_ptr().cast(), b.len());
            (n >= 0).then_some(n)
        }
    }

    #[test]
    fn a_detached_thread_keeps_no_copy_of_the_process_files() {
        let (r, w) = pipe();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let table =
                PrivateTable::detach().expect("this kernel has pidfd_getfd and close_range");
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
            drop(table);
        });
        rx.recv().unwrap();
        // The thread detached after the pipe was made: had it kept its copy of `w`, the pipe
        // would stay open for writing and the read would find no end of file.
        close(w);
        assert!(reaches_eof(r), "the detached thread kept the pipe open");
        go_tx.send(()).unwrap();
        t.join().unwrap();
        close(r);
    }

    #[test]
    fn borrowed_descriptors_have_the_process_numbers_and_go_at_the_batch_end() {
        let pipes = [pipe(), pipe(), pipe()];
        let writers: Vec<c_int> = pipes.iter().map(|&(_, w)| w).collect();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let mut table = PrivateTable::detach().unwrap();
            // Put the pidfd at a number to be borrowed: the borrow must move it away.
            // SAFETY: fcntl(2) on this thread's own pidfd; the number is free in its table.
            let at = unsafe { libc::fcntl(table.pidfd, libc::F_DUPFD_CLOEXEC, writers[1]) };
            assert_eq!(at, writers[1]);
            close(table.pidfd);
            table.pidfd = at;
            {
                let b = table.borrow(&writers).unwrap();
                assert_eq!(b.fds().len(), writers.len());
                assert!(!writers.contains(&table.pidfd));
                for &fd in &writers {
                    // SAFETY: writes a byte through the borrowed number.
                    assert_eq!(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) }, 1);
                }
            }
            for &fd in &writers {
                // SAFETY: fcntl F_GETFD only asks whether the descriptor exists here.
                assert_eq!(unsafe { libc::fcntl(fd, libc::F_GETFD) }, -1);
            }
            // The pidfd still works after its move.
            assert_eq!(table.borrow(&writers[..1]).unwrap().fds(), &writers[..1]);
            done_tx.send(()).unwrap();
            end_rx.recv().unwrap();
        });
        done_rx.recv().unwrap();
        for &(r, w) in &pipes {
            assert_eq!(read_now(r), Some(1));
            close(w);
            assert!(reaches_eof(r), "the helper kept a borrowed descriptor");
            close(r);
        }
        end_tx.send(()).unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_borrow_skips_a_closed_descriptor_but_not_all_of_them() {
        let (r, w) = pipe();
        // Not open in any test's table (fd numbers are allocated lowest first).
        let closed: c_int = 999_999;
        let t = std::thread::spawn(move || {
            let mut table = PrivateTable::detach().unwrap();
            let b = table.borrow(&[closed, w, -1, w]).unwrap();
            assert_eq!(b.fds(), &[w]);
            drop(b);
            assert_eq!(table.borrow(&[closed]).unwrap_err(), libc::EBADF);
            assert!(table.borrow(&[]).unwrap().fds().is_empty());
        });
        t.join().unwrap();
        close(w);
        close(r);
    }

    #[test]
    fn a_thread_knows_whether_it_shares_the_process_table() {
        assert!(shares_process_table());
        std::thread::spawn(|| {
            assert!(shares_process_table());
            // SAFETY: gives this test thread a table of its own (a copy, closed at its end).
            assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0);
            assert!(!shares_process_table());
            // A thread started from here shares this table, not the process's: it must not
            // detach, since its borrows would read another table than its contexts'.
            let inner = std::thread::spawn(PrivateTable::detach).join().unwrap();
            assert!(
                matches!(inner, Err(DetachError::Unsupported(_))),
                "{inner:?}"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    fn stderr_from_a_detached_thread_reaches_the_process_descriptor() {
        assert!(!write_stderr(b""), "this thread shares the table");
        std::thread::spawn(|| {
            let table = PrivateTable::detach().unwrap();
            assert!(write_stderr(b""));
            drop(table);
            assert!(!write_stderr(b""));
        })
        .join()
        .unwrap();
    }
}
