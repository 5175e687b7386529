//! A small spin lock for the data path's short critical sections.
//!
//! The data path takes a few locks per work request (a QP's send side and completion
//! tracker, a CQ's stash). They are held for a few hundred instructions and almost never
//! contended, so what counts is the cost of an uncontended lock and unlock: here one atomic
//! compare-and-swap and one plain store (x86 release stores are plain moves), where
//! `std::sync::Mutex` pays two atomic read-modify-writes (its unlock swaps to learn about
//! sleepers). That difference matters under emulation, where every atomic read-modify-write
//! is a helper call (QEMU's multi-threaded TCG), and providers make the same choice for their
//! queue locks (rdma-core's mlx5 and rxe use spin locks).
//!
//! A waiter spins briefly, then yields its CPU between attempts (so that a holder that was
//! preempted gets to run), then naps: the send lock is also held while the library waits for
//! a peer on a first touch.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicBool, Ordering};

/// A spin lock around `T`.
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through the lock (a guard, or `data` under the caller's
// proof of holding it), which gives one thread at a time exclusive access.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: moving the lock moves the value; no thread holds it then.
unsafe impl<T: Send> Send for SpinLock<T> {}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T> SpinLock<T> {
    /// A free lock around `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Locks; the guard unlocks.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        self.raw_lock();
        SpinGuard {
            lock: self,
            _value: PhantomData,
        }
    }

    /// Locks if the lock is free; `None` otherwise.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            .then_some(SpinGuard {
                lock: self,
                _value: PhantomData,
            })
    }

    /// Locks without a guard (for a lock held across calls, such as an `ibv_wr_*` batch);
    /// [`raw_unlock`](Self::raw_unlock) ends it.
    #[inline]
    pub(crate) fn raw_lock(&self) {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            // Wait for the lock to look free before trying again (no stores while it is held).
            while self.locked.load(Ordering::Relaxed) {
                spins = spins.saturating_add(1);
                if spins < 100 {
                    core::hint::spin_loop();
                } else if spins < 1100 {
                    std::thread::yield_now();
                } else {
                    // A long hold: the holder is waiting for the network (a first touch of a
                    // peer's window). Nap rather than burn a CPU.
                    std::thread::sleep(std::time::Duration::from_micros(50));
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    /// Ends a [`raw_lock`](Self::raw_lock).
    ///
    /// # Safety
    /// The caller holds the lock through `raw_lock` and no reference from
    /// [`data`](Self::data) outlives this call.
    #[inline]
    pub(crate) unsafe fn raw_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }

    /// The value, for the holder of a [`raw_lock`](Self::raw_lock).
    ///
    /// # Safety
    /// The caller holds the lock and no other reference to the value is live.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub(crate) unsafe fn data(&self) -> &mut T {
        // SAFETY: per the contract.
        unsafe { &mut *self.value.get() }
    }
}

/// Holds a [`SpinLock`]; unlocks when dropped.
pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    /// A guard hands out `&T` and `&mut T`, so it may be shared between threads only when `T`
    /// may (`&SpinLock<T>` alone would make it `Sync` for any `T: Send`, as `std`'s
    /// `MutexGuard` is not).
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: the guard holds the lock; its references end with it.
        unsafe { self.lock.raw_unlock() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Whether `T` is `Sync`, decided at compile time (a method found through auto-ref only
    /// when the `Sync` one does not apply).
    struct Probe<T>(PhantomData<T>);
    trait SyncYes {
        fn is_sync(&self) -> bool {
            true
        }
    }
    impl<T: Sync> SyncYes for Probe<T> {}
    trait SyncNo {
        fn is_sync(&self) -> bool {
            false
        }
    }
    impl<T> SyncNo for &Probe<T> {}

    #[test]
    fn a_guard_is_shareable_only_when_its_value_is() {
        let cell = Probe::<SpinGuard<'static, core::cell::Cell<u32>>>(PhantomData);
        assert!(!(&cell).is_sync(), "two threads could reach one Cell");
        let plain = Probe::<SpinGuard<'static, u32>>(PhantomData);
        assert!(plain.is_sync());
    }

    #[test]
    fn excludes_across_threads() {
        let l = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = l.lock();
                        // A read-modify-write that loses updates without exclusion.
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 80_000);
    }

    #[test]
    fn raw_lock_is_held_until_raw_unlock() {
        let l = SpinLock::new(1u32);
        l.raw_lock();
        assert!(l.locked.load(Ordering::Relaxed));
        // SAFETY: held through raw_lock.
        unsafe {
            *l.data() += 1;
            l.raw_unlock();
        }
        assert_eq!(*l.lock(), 2);
    }
}
