//! Calls into libibverbs: the re-entry guard (a hook entered from inside a real libibverbs call
//! passes straight through), `errno`, the lock helper, random numbers.

use core::ffi::c_int;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

thread_local! {
    static IN_REAL: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as inside a call into libibverbs: hooks entered meanwhile (the
/// real `ibv_reg_mr` jumps through the PLT to `ibv_reg_mr_iova2`, which is ours) pass straight
/// through.
pub(crate) struct RealCall;

impl RealCall {
    /// Enters.
    pub(crate) fn enter() -> Self {
        IN_REAL.with(|c| c.set(c.get() + 1));
        RealCall
    }
}

impl Drop for RealCall {
    fn drop(&mut self) {
        IN_REAL.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Whether this thread is inside a real libibverbs call.
pub(crate) fn in_real_call() -> bool {
    IN_REAL.with(|c| c.get() > 0)
}

/// Starts a thread of the library's with every signal blocked (a thread inherits its
/// creator's mask): signals sent to the process are for the application's threads, whose
/// handlers must not run on the library's. Faults of the thread itself are still delivered.
pub(crate) fn spawn_quiet(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    // SAFETY: all-zero is a valid sigset_t, which sigfillset fills; pthread_sigmask changes
    // this thread's mask only, and the old mask is put back right after the spawn.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    spawned
}

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Reads `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// Locks a mutex, ignoring poisoning (a panic elsewhere must not wedge every later call).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A random u64 (directory instance numbers).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        u64::from_le_bytes(b)
    } else {
        // No getrandom (a very old kernel or a seccomp filter): the wall clock's nanoseconds,
        // the process ID and a stack address (ASLR) still tell two instances apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let here = &b as *const _ as u64;
        t ^ u64::from(std::process::id()).rotate_left(32) ^ here.rotate_left(17)
    }
}

/// The calling thread, as `pthread_self` names it. On x86_64 Linux that is the thread
/// pointer's self-reference at `%fs:0` (the TCB starts with a pointer to itself, x86-64 psABI
/// TLS layout, which glibc's `pthread_self` returns), read without a call.
#[inline]
pub(crate) fn this_thread() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: reads the word at %fs:0, which the x86-64 TLS ABI defines as the thread
        // control block's pointer to itself; no memory is written.
        unsafe {
            core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
        }
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as usize }
    }
}

/// This process's id, as last read; the fork handler's child side renews it (crate::fork) (0: not read yet).
static PID: AtomicU32 = AtomicU32::new(0);

/// The current process's id, without a system call after the first (the child handler
/// updates it).
pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// Reads the process id again (in a child made by `fork()`, crate::fork).
pub(crate) fn renew_pid() {
    PID.store(std::process::id(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_is_pthread_self_and_differs_between_threads() {
        // SAFETY: no preconditions.
        assert_eq!(this_thread(), unsafe { libc::pthread_self() } as usize);
        let here = this_thread();
        let there = std::thread::spawn(this_thread).join().unwrap();
        assert_ne!(here, there);
    }
}
