//! The window cache: which parts of the applications' (virtual) memory regions are registered
//! with the provider right now, and the pinned-memory budget they share.
//!
//! A *window* is one aligned chunk of a region's IOVA space (`window_size` bytes, clipped to
//! the region), registered as its own provider MR while the NIC may touch it. Registering pins
//! its pages (`ib_umem_get` with `FOLL_LONGTERM` in the kernel adds them to the process's
//! `VmPin`), so the budget counts the page-rounded size of every registered window plus the
//! library's own fixed pins (directories, scratch buffers). Nothing is registered that does not
//! fit: a window is evicted (deregistered, which unpins it) only when it is idle, meaning no
//! posted work request uses it (`inflight == 0`) and no peer holds a lease on it (`leases ==
//! 0`); least recently used first.
//!
//! Pure bookkeeping: the provider is behind [`Registrar`], so the policy is tested without a
//! device.

use crate::fasthash::FastMap;

/// Identifies a virtual memory region (one application registration).
pub type RegionId = u64;

/// Page size used for pinning arithmetic.
pub const PAGE: u64 = 4096;

/// One window: a region and the window's index in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WindowId {
    /// The region.
    pub region: RegionId,
    /// Index of the window in the region's IOVA space.
    pub index: u64,
}

/// One in-flight use of a window, counted on the registration it was taken on: giving it back
/// after the window was deregistered and registered again (its region re-registered, say)
/// must not end a use of the new registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WindowUse {
    /// The window.
    pub id: WindowId,
    /// Its registration ([`WindowCache::serial`]).
    pub serial: u64,
}

/// Where a window lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    /// Virtual address of its first byte.
    pub va: u64,
    /// IOVA of its first byte (what work requests use).
    pub iova: u64,
    /// Length in bytes (≥ 1).
    pub len: u64,
}

impl WindowSpec {
    /// Bytes the kernel pins for it: whole pages.
    pub fn pinned_bytes(&self) -> u64 {
        pinned_bytes(self.va, self.len)
    }
}

/// Bytes pinned by registering `len` bytes at `va`: every page they touch.
pub fn pinned_bytes(va: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    // In 128 bits: a range that ends in the last page of the address space still counts it.
    let first = u128::from(va) & !u128::from(PAGE - 1);
    let end = (u128::from(va) + u128::from(len) + u128::from(PAGE - 1)) & !u128::from(PAGE - 1);
    u64::try_from(end - first).unwrap_or(u64::MAX)
}

/// The provider's answer to a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys {
    /// Local key of the window's MR.
    pub lkey: u32,
    /// Remote key of the window's MR.
    pub rkey: u32,
    /// The provider's MR handle (a `struct ibv_mr *` in the library).
    pub handle: usize,
}

/// Registers and deregisters windows with the provider.
pub trait Registrar {
    /// Registers `spec` for window `id`; on failure returns the provider's errno.
    fn register(&mut self, id: WindowId, spec: &WindowSpec) -> Result<Keys, i32>;
    /// Deregisters a window registered before.
    fn deregister(&mut self, id: WindowId, keys: &Keys);
    /// Called just before an idle window is evicted (the directory marks it absent first).
    fn evicting(&mut self, id: WindowId);
}

/// Why a window could not be made available.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheError {
    /// The budget is full of windows that are in use.
    NoRoom {
        /// Bytes that were needed.
        needed: u64,
    },
    /// The provider refused the registration (errno).
    Provider(i32),
}

#[derive(Debug)]
struct Entry {
    spec: WindowSpec,
    keys: Keys,
    pinned: u64,
    inflight: u32,
    leases: u32,
    tick: u64,
    /// Which registration of the window this is (windows of a region registered again after
    /// a `rereg` or an eviction get a new one).
    serial: u64,
}

/// Counters of the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Windows registered so far.
    pub registrations: u64,
    /// Windows evicted to make room.
    pub evictions: u64,
    /// Lookups that found the window registered.
    pub hits: u64,
}

/// The cache. See the module documentation.
#[derive(Debug)]
pub struct WindowCache {
    budget: u64,
    pinned: u64,
    fixed: u64,
    peak: u64,
    windows: FastMap<WindowId, Entry>,
    tick: u64,
    stats: CacheStats,
}

impl WindowCache {
    /// An empty cache that never pins more than `budget` bytes.
    pub fn new(budget: u64) -> Self {
        Self {
            budget,
            pinned: 0,
            fixed: 0,
            peak: 0,
            windows: FastMap::default(),
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    /// The budget.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes pinned now (windows and fixed pins).
    pub fn pinned(&self) -> u64 {
        self.pinned
    }

    /// Highest value `pinned` ever had.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Bytes of fixed pins (directories, scratch buffers).
    pub fn fixed(&self) -> u64 {
        self.fixed
    }

    /// Number of registered windows.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether no window is registered.
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The keys of a registered window, marking it used; `None` if it is not registered.
    pub fn lookup(&mut self, id: WindowId) -> Option<Keys> {
        let tick = self.next_tick();
        let entry = self.windows.get_mut(&id)?;
        entry.tick = tick;
        self.stats.hits += 1;
        Some(entry.keys)
    }

    /// Like [`lookup`](Self::lookup), and counts one more in-flight use (the data path's
    /// single call on a warm cache).
    #[inline]
    pub fn lookup_and_pin(&mut self, id: WindowId) -> Option<(Keys, WindowUse)> {
        let tick = self.next_tick();
        let entry = self.windows.get_mut(&id)?;
        entry.tick = tick;
        entry.inflight += 1;
        self.stats.hits += 1;
        Some((
            entry.keys,
            WindowUse {
                id,
                serial: entry.serial,
            },
        ))
    }

    /// Which registration of window `id` is current, if it is registered: an in-flight count
    /// taken on one registration is not given back to a later one.
    pub fn serial(&self, id: WindowId) -> Option<u64> {
        self.windows.get(&id).map(|e| e.serial)
    }

    /// A use of the current registration of window `id` (not counted), if it is registered.
    pub fn use_of(&self, id: WindowId) -> Option<WindowUse> {
        self.serial(id).map(|serial| WindowUse { id, serial })
    }

    /// Whether a window is registered (does not touch its recency).
    pub fn contains(&self, id: WindowId) -> bool {
        self.windows.contains_key(&id)
    }

    /// In-flight and lease counts of a window.
    pub fn refs(&self, id: WindowId) -> Option<(u32, u32)> {
        self.windows.get(&id).map(|e| (e.inflight, e.leases))
    }

    /// Makes sure the windows `ids` (with their specs) are all registered, evicting idle
    /// windows that are not among them if needed; registers none if they cannot all fit, and
    /// deregisters again the ones it registered if the provider refuses a later one. Returns
    /// their keys in order. Does not change in-flight or lease counts.
    pub fn ensure_all(
        &mut self,
        wanted: &[(WindowId, WindowSpec)],
        reg: &mut impl Registrar,
    ) -> Result<Vec<Keys>, CacheError> {
        let protect: Vec<WindowId> = wanted.iter().map(|(id, _)| *id).collect();
        let mut needed = 0u64;
        for (i, (id, spec)) in wanted.iter().enumerate() {
            let duplicate = wanted[..i].iter().any(|(other, _)| other == id);
            if !self.windows.contains_key(id) && !duplicate {
                needed += spec.pinned_bytes();
            }
        }
        self.make_room(needed, &protect, reg)?;
        let mut keys = Vec::with_capacity(wanted.len());
        let mut registered_here = Vec::new();
        for (id, spec) in wanted {
            if let Some(k) = self.lookup(*id) {
                keys.push(k);
                continue;
            }
            match reg.register(*id, spec) {
                Ok(k) => {
                    self.insert(*id, *spec, k);
                    registered_here.push(*id);
                    keys.push(k);
                }
                Err(errno) => {
                    // Nobody uses them yet: no directory entry, no count.
                    for id in registered_here {
                        self.remove(id, reg);
                    }
                    return Err(CacheError::Provider(errno));
                }
            }
        }
        Ok(keys)
    }

    /// Makes `id` registered and counts one more in-flight use of it.
    pub fn acquire(
        &mut self,
        id: WindowId,
        spec: &WindowSpec,
        reg: &mut impl Registrar,
    ) -> Result<(Keys, WindowUse), CacheError> {
        let keys = self.ensure_all(&[(id, *spec)], reg)?;
        let used = self.add_inflight(id);
        keys.first()
            .copied()
            .zip(used)
            .ok_or(CacheError::NoRoom { needed: 0 })
    }

    /// Counts one more in-flight use of a registered window; `None` if it is not registered.
    pub fn add_inflight(&mut self, id: WindowId) -> Option<WindowUse> {
        let e = self.windows.get_mut(&id)?;
        e.inflight += 1;
        Some(WindowUse {
            id,
            serial: e.serial,
        })
    }

    /// Ends one in-flight use: a no-op for a window that is gone (deregistered with its
    /// region, say) or was registered again since the use was taken.
    pub fn release(&mut self, used: WindowUse) {
        if let Some(e) = self.windows.get_mut(&used.id)
            && e.serial == used.serial
        {
            e.inflight = e.inflight.saturating_sub(1);
        }
    }

    /// Counts one more lease on a registered window; false if it is not registered.
    pub fn add_lease(&mut self, id: WindowId) -> bool {
        match self.windows.get_mut(&id) {
            Some(e) => {
                e.leases += 1;
                true
            }
            None => false,
        }
    }

    /// Ends one lease.
    pub fn remove_lease(&mut self, id: WindowId) {
        if let Some(e) = self.windows.get_mut(&id) {
            e.leases = e.leases.saturating_sub(1);
        }
    }

    /// Pins `bytes` for the library itself (a directory, a scratch buffer), evicting idle
    /// windows if needed.
    pub fn charge_fixed(&mut self, bytes: u64, reg: &mut impl Registrar) -> Result<(), CacheError> {
        self.make_room(bytes, &[], reg)?;
        self.fixed += bytes;
        self.add_pinned(bytes);
        Ok(())
    }

    /// Returns fixed pins.
    pub fn uncharge_fixed(&mut self, bytes: u64) {
        let bytes = bytes.min(self.fixed);
        self.fixed -= bytes;
        self.pinned -= bytes;
    }

    /// Deregisters every window of `region`, whatever its counts (the application deregistered
    /// the region). Returns how many there were.
    pub fn remove_region(&mut self, region: RegionId, reg: &mut impl Registrar) -> usize {
        let ids: Vec<WindowId> = self
            .windows
            .keys()
            .filter(|id| id.region == region)
            .copied()
            .collect();
        for id in &ids {
            self.remove(*id, reg);
        }
        ids.len()
    }

    /// Evicts idle windows (least recently used first, never one in `protect`) until `bytes`
    /// more fit in the budget.
    pub fn make_room(
        &mut self,
        bytes: u64,
        protect: &[WindowId],
        reg: &mut impl Registrar,
    ) -> Result<(), CacheError> {
        if self.pinned.saturating_add(bytes) <= self.budget {
            return Ok(());
        }
        // Check first that enough can be freed, so that nothing is evicted in vain.
        let freeable: u64 = self
            .windows
            .iter()
            .filter(|(id, e)| e.inflight == 0 && e.leases == 0 && !protect.contains(id))
            .map(|(_, e)| e.pinned)
            .sum();
        if self.pinned.saturating_sub(freeable).saturating_add(bytes) > self.budget {
            return Err(CacheError::NoRoom { needed: bytes });
        }
        // Least recently used first; eviction is rare next to lookups, so the order is found
        // by sorting here rather than maintained on every lookup.
        let mut order: Vec<(u64, WindowId)> = self
            .windows
            .iter()
            .filter(|(id, e)| e.inflight == 0 && e.leases == 0 && !protect.contains(id))
            .map(|(id, e)| (e.tick, *id))
            .collect();
        order.sort_unstable();
        for (_, id) in order {
            if self.pinned.saturating_add(bytes) <= self.budget {
                break;
            }
            let idle = self
                .windows
                .get(&id)
                .is_some_and(|e| e.inflight == 0 && e.leases == 0);
            if idle && !protect.contains(&id) {
                reg.evicting(id);
                self.remove(id, reg);
                self.stats.evictions += 1;
            }
        }
        Ok(())
    }

    fn insert(&mut self, id: WindowId, spec: WindowSpec, keys: Keys) {
        let tick = self.next_tick();
        let pinned = spec.pinned_bytes();
        self.windows.insert(
            id,
            Entry {
                spec,
                keys,
                pinned,
                inflight: 0,
                leases: 0,
                tick,
                serial: self.stats.registrations + 1,
            },
        );
        self.add_pinned(pinned);
        self.stats.registrations += 1;
    }

    fn remove(&mut self, id: WindowId, reg: &mut impl Registrar) {
        if let Some(e) = self.windows.remove(&id) {
            reg.deregister(id, &e.keys);
            self.pinned -= e.pinned;
        }
    }

    fn add_pinned(&mut self, bytes: u64) {
        self.pinned += bytes;
        self.peak = self.peak.max(self.pinned);
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// The spec a window was registered with.
    pub fn spec(&self, id: WindowId) -> Option<WindowSpec> {
        self.windows.get(&id).map(|e| e.spec)
    }

    /// Pinned bytes of `region`'s windows that hold at least one lease: what the region
    /// contributes to the owner's lease count, each window once however many lessees it has.
    pub fn leased_bytes_of(&self, region: RegionId) -> u64 {
        self.windows
            .iter()
            .filter(|(id, e)| id.region == region && e.leases > 0)
            .map(|(_, e)| e.spec.pinned_bytes())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A provider that records what is registered and can be told to fail.
    #[derive(Default)]
    struct FakeProvider {
        registered: std::collections::HashMap<WindowId, WindowSpec>,
        evicted: Vec<WindowId>,
        next_key: u32,
        fail_next: Option<i32>,
    }

    impl Registrar for FakeProvider {
        fn register(&mut self, id: WindowId, spec: &WindowSpec) -> Result<Keys, i32> {
            if let Some(e) = self.fail_next.take() {
                return Err(e);
            }
            assert!(
                self.registered.insert(id, *spec).is_none(),
                "double registration"
            );
            self.next_key += 1;
            Ok(Keys {
                lkey: self.next_key,
                rkey: self.next_key,
                handle: self.next_key as usize,
            })
        }
        fn deregister(&mut self, id: WindowId, _keys: &Keys) {
            assert!(self.registered.remove(&id).is_some(), "deregistered twice");
        }
        fn evicting(&mut self, id: WindowId) {
            self.evicted.push(id);
        }
    }

    fn spec(index: u64, len: u64) -> WindowSpec {
        WindowSpec {
            va: 0x10_0000 + index * len,
            iova: 0x10_0000 + index * len,
            len,
        }
    }

    fn wid(index: u64) -> WindowId {
        WindowId { region: 1, index }
    }

    #[test]
    fn pinned_bytes_count_whole_pages() {
        assert_eq!(pinned_bytes(0x1000, 4096), 4096);
        assert_eq!(pinned_bytes(0x1001, 4096), 8192);
        assert_eq!(pinned_bytes(0x1fff, 2), 8192);
        assert_eq!(pinned_bytes(0x1000, 1), 4096);
        assert_eq!(pinned_bytes(0x1000, 0), 0);
        // At the top of the address space the last page still counts.
        assert_eq!(pinned_bytes(u64::MAX - 10, 5), 4096);
        assert_eq!(pinned_bytes(u64::MAX - 4106, 100), 8192);
        assert_eq!(pinned_bytes(u64::MAX - 4095, 4096), 4096);
    }

    #[test]
    fn a_provider_refusal_part_way_leaves_nothing_registered() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(1 << 20);
        // Window 0 registers; window 1 is refused.
        struct FailSecond<'a>(&'a mut FakeProvider, u32);
        impl Registrar for FailSecond<'_> {
            fn register(&mut self, id: WindowId, spec: &WindowSpec) -> Result<Keys, i32> {
                self.1 += 1;
                if self.1 == 2 {
                    return Err(libc::ENOMEM);
                }
                self.0.register(id, spec)
            }
            fn deregister(&mut self, id: WindowId, keys: &Keys) {
                self.0.deregister(id, keys)
            }
            fn evicting(&mut self, id: WindowId) {
                self.0.evicting(id)
            }
        }
        let wanted = [(wid(0), spec(0, 4096)), (wid(1), spec(1, 4096))];
        let r = c.ensure_all(&wanted, &mut FailSecond(&mut p, 0));
        assert_eq!(r, Err(CacheError::Provider(libc::ENOMEM)));
        assert_eq!((c.len(), c.pinned()), (0, 0));
        assert!(p.registered.is_empty());
        // A window registered before the call stays.
        c.ensure_all(&wanted[..1], &mut p).unwrap();
        let r = c.ensure_all(
            &[(wid(0), spec(0, 4096)), (wid(2), spec(2, 4096))],
            &mut FailSecond(&mut p, 1),
        );
        assert_eq!(r, Err(CacheError::Provider(libc::ENOMEM)));
        assert_eq!((c.len(), c.pinned()), (1, 4096));
    }

    #[test]
    fn evicts_least_recently_used_idle_window() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(3 * 65536);
        for i in 0..3 {
            let (_, used) = c.acquire(wid(i), &spec(i, 65536), &mut p).unwrap();
            c.release(used);
        }
        // Touch window 0 so that window 1 is the least recently used.
        c.lookup(wid(0)).unwrap();
        c.acquire(wid(3), &spec(3, 65536), &mut p).unwrap();
        assert_eq!(p.evicted, vec![wid(1)]);
        assert!(!c.contains(wid(1)));
        assert_eq!(c.pinned(), 3 * 65536);
        assert_eq!(c.stats().evictions, 1);
    }

    #[test]
    fn busy_windows_are_never_evicted() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(2 * 65536);
        c.acquire(wid(0), &spec(0, 65536), &mut p).unwrap(); // in flight
        let (_, used) = c.acquire(wid(1), &spec(1, 65536), &mut p).unwrap();
        c.release(used);
        assert!(c.add_lease(wid(1))); // leased by a peer
        let err = c.acquire(wid(2), &spec(2, 65536), &mut p).unwrap_err();
        assert_eq!(err, CacheError::NoRoom { needed: 65536 });
        assert!(p.evicted.is_empty(), "nothing may be evicted in vain");
        c.remove_lease(wid(1));
        c.acquire(wid(2), &spec(2, 65536), &mut p).unwrap();
        assert_eq!(p.evicted, vec![wid(1)]);
    }

    #[test]
    fn a_window_registered_again_has_a_new_serial() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(65536);
        c.ensure_all(&[(wid(0), spec(0, 65536))], &mut p).unwrap();
        let first = c.serial(wid(0)).unwrap();
        // Window 1 evicts window 0; window 0 comes back as another registration.
        c.ensure_all(&[(wid(1), spec(1, 65536))], &mut p).unwrap();
        assert_eq!(c.serial(wid(0)), None);
        c.ensure_all(&[(wid(0), spec(0, 65536))], &mut p).unwrap();
        assert_ne!(c.serial(wid(0)), Some(first));
        assert_eq!(c.remove_region(1, &mut p), 1);
        assert_eq!(c.serial(wid(0)), None);
    }

    #[test]
    fn a_use_of_an_old_registration_ends_nothing_of_the_new_one() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(1 << 20);
        let (_, old) = c.acquire(wid(0), &spec(0, 4096), &mut p).unwrap();
        // The region is registered again (ibv_rereg_mr) and the window with it.
        c.remove_region(1, &mut p);
        let (_, new) = c.acquire(wid(0), &spec(0, 4096), &mut p).unwrap();
        assert_ne!(old, new);
        // A late completion of a WR posted on the old registration.
        c.release(old);
        assert_eq!(c.refs(wid(0)), Some((1, 0)), "the new use is still counted");
        c.release(new);
        assert_eq!(c.refs(wid(0)), Some((0, 0)));
    }

    #[test]
    fn a_regions_leased_bytes_count_each_leased_window_once_at_its_pinned_size() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(1 << 20);
        // A clipped last window (one page of a region's tail) and a whole one, in region 1; a
        // leased window of another region.
        let tail = WindowSpec {
            va: 0x20_0000,
            iova: 0x20_0000,
            len: 100,
        };
        let other = WindowId {
            region: 2,
            index: 0,
        };
        c.ensure_all(
            &[
                (wid(0), spec(0, 65536)),
                (wid(1), tail),
                (wid(2), spec(2, 65536)),
            ],
            &mut p,
        )
        .unwrap();
        c.ensure_all(&[(other, spec(9, 65536))], &mut p).unwrap();
        // Window 0 leased by two lessees, the tail by one, window 2 by none.
        assert!(c.add_lease(wid(0)) && c.add_lease(wid(0)) && c.add_lease(wid(1)));
        assert!(c.add_lease(other));
        assert_eq!(c.leased_bytes_of(1), 65536 + 4096);
        assert_eq!(c.leased_bytes_of(2), 65536);
        c.remove_lease(wid(0));
        assert_eq!(c.leased_bytes_of(1), 65536 + 4096, "still leased once");
        c.remove_lease(wid(0));
        assert_eq!(c.leased_bytes_of(1), 4096);
    }

    #[test]
    fn ensure_all_is_all_or_nothing_and_protects_its_own_windows() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(2 * 65536);
        c.ensure_all(&[(wid(0), spec(0, 65536))], &mut p).unwrap();
        // Wanting 0 and 1 must not evict 0 to make room for 1.
        c.ensure_all(
            &[(wid(0), spec(0, 65536)), (wid(1), spec(1, 65536))],
            &mut p,
        )
        .unwrap();
        assert!(c.contains(wid(0)) && c.contains(wid(1)));
        let err = c
            .ensure_all(
                &[
                    (wid(2), spec(2, 65536)),
                    (wid(3), spec(3, 65536)),
                    (wid(4), spec(4, 65536)),
                ],
                &mut p,
            )
            .unwrap_err();
        assert_eq!(err, CacheError::NoRoom { needed: 3 * 65536 });
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn provider_failure_is_reported_and_leaves_no_trace() {
        let mut p = FakeProvider {
            fail_next: Some(libc::EFAULT),
            ..Default::default()
        };
        let mut c = WindowCache::new(1 << 20);
        assert_eq!(
            c.acquire(wid(0), &spec(0, 4096), &mut p),
            Err(CacheError::Provider(libc::EFAULT))
        );
        assert_eq!((c.pinned(), c.len()), (0, 0));
    }

    #[test]
    fn fixed_pins_share_the_budget() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(4 * 4096);
        for i in 0..4 {
            let (_, used) = c.acquire(wid(i), &spec(i, 4096), &mut p).unwrap();
            c.release(used);
        }
        c.charge_fixed(8192, &mut p).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.pinned(), 4 * 4096);
        c.uncharge_fixed(8192);
        assert_eq!(c.pinned(), 2 * 4096);
    }

    #[test]
    fn removing_a_region_deregisters_busy_windows_too() {
        let mut p = FakeProvider::default();
        let mut c = WindowCache::new(1 << 20);
        let (_, gone) = c.acquire(wid(0), &spec(0, 4096), &mut p).unwrap();
        c.acquire(
            WindowId {
                region: 2,
                index: 0,
            },
            &spec(9, 4096),
            &mut p,
        )
        .unwrap();
        assert_eq!(c.remove_region(1, &mut p), 1);
        assert_eq!(p.registered.len(), 1);
        c.release(gone); // late completion of a WR on the gone window: harmless
        assert_eq!(c.pinned(), 4096);
    }

    /// A window of the property test: region 1 or 2, index 0..12.
    type Key = (u64, u64);

    #[derive(Clone, Debug)]
    enum Op {
        /// Acquire window `key` with this length and offset into its first page.
        Acquire(Key, u64, u64),
        /// Release one of the uses taken on `key` (the oldest).
        Release(Key),
        Lease(Key),
        Unlease(Key),
        Fixed(u64),
        Unfixed(u64),
        /// The provider refuses the next registration with ENOMEM.
        FailNext,
        /// The application deregisters a region: its windows go whatever their counts, and
        /// the uses taken on them become stale.
        RemoveRegion(u64),
        /// Release a stale use (a late completion on a window that is gone or was registered
        /// again since).
        ReleaseStale,
    }

    fn key() -> impl Strategy<Value = Key> {
        (1u64..3, 0u64..12)
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (key(), 1u64..40000, 0u64..4096).prop_map(|(k, l, o)| Op::Acquire(k, l, o)),
            3 => key().prop_map(Op::Release),
            2 => key().prop_map(Op::Lease),
            2 => key().prop_map(Op::Unlease),
            1 => (1u64..3).prop_map(|p| Op::Fixed(p * 4096)),
            1 => (1u64..3).prop_map(|p| Op::Unfixed(p * 4096)),
            1 => Just(Op::FailNext),
            1 => (1u64..3).prop_map(Op::RemoveRegion),
            1 => Just(Op::ReleaseStale),
        ]
    }

    fn wid_of((region, index): Key) -> WindowId {
        WindowId { region, index }
    }

    proptest! {
        /// Against a reference model: the pinned total is exactly the pages of what the
        /// provider has registered plus the fixed pins, never above the budget; busy windows
        /// are never deregistered (except with their region) and their counts are the model's;
        /// a refused acquire means the busy windows really fill the budget, or the provider
        /// refused and nothing new stayed registered; a stale use changes nothing.
        #[test]
        fn budget_is_never_exceeded(ops in proptest::collection::vec(op(), 1..250)) {
            let budget = 64 * 1024;
            let mut p = FakeProvider::default();
            let mut c = WindowCache::new(budget);
            let mut uses: std::collections::HashMap<Key, Vec<WindowUse>> = Default::default();
            let mut leases: std::collections::HashMap<Key, u32> = Default::default();
            let mut stale: Vec<WindowUse> = Vec::new();
            let mut specs: std::collections::HashMap<Key, WindowSpec> = Default::default();
            let mut fixed = 0u64;
            for op in ops {
                match op {
                    Op::Acquire(k, l, off) => {
                        // A window keeps its first geometry while its region lives.
                        let s = *specs.entry(k).or_insert(WindowSpec {
                            va: (k.0 << 32) + (k.1 << 20) + off,
                            iova: (k.1 << 20) + off,
                            len: l,
                        });
                        let before = p.registered.len();
                        let refused = p.fail_next.is_some() && !c.contains(wid_of(k));
                        match c.acquire(wid_of(k), &s, &mut p) {
                            Ok((_, used)) => uses.entry(k).or_default().push(used),
                            Err(CacheError::NoRoom { needed }) => {
                                let busy: u64 = p.registered.iter()
                                    .filter(|(id, _)| {
                                        let k = (id.region, id.index);
                                        uses.get(&k).is_some_and(|u| !u.is_empty())
                                            || leases.get(&k).copied().unwrap_or(0) > 0
                                    })
                                    .map(|(_, s)| s.pinned_bytes()).sum();
                                prop_assert!(busy + c.fixed() + needed > budget);
                            }
                            Err(CacheError::Provider(e)) => {
                                prop_assert!(refused);
                                prop_assert_eq!(e, libc::ENOMEM);
                                prop_assert!(p.registered.len() <= before);
                            }
                        }
                        p.fail_next = None;
                    }
                    Op::Release(k) => {
                        if let Some(u) = uses.get_mut(&k) && !u.is_empty() {
                            c.release(u.remove(0));
                        }
                    }
                    Op::Lease(k) => {
                        if c.add_lease(wid_of(k)) {
                            *leases.entry(k).or_default() += 1;
                        }
                    }
                    Op::Unlease(k) => {
                        if let Some(n) = leases.get_mut(&k) && *n > 0 {
                            *n -= 1;
                            c.remove_lease(wid_of(k));
                        }
                    }
                    Op::Fixed(b) => {
                        if c.charge_fixed(b, &mut p).is_ok() {
                            fixed += b;
                        }
                    }
                    Op::Unfixed(b) => {
                        c.uncharge_fixed(b);
                        fixed -= b.min(fixed);
                    }
                    Op::FailNext => p.fail_next = Some(libc::ENOMEM),
                    Op::RemoveRegion(r) => {
                        let gone = p.registered.keys().filter(|id| id.region == r).count();
                        prop_assert_eq!(c.remove_region(r, &mut p), gone);
                        for (k, u) in uses.iter_mut().filter(|(k, _)| k.0 == r) {
                            stale.append(u);
                            leases.remove(k);
                        }
                        leases.retain(|k, _| k.0 != r);
                        specs.retain(|k, _| k.0 != r);
                    }
                    Op::ReleaseStale => {
                        if let Some(u) = stale.pop() {
                            let k = (u.id.region, u.id.index);
                            let before = c.refs(u.id);
                            c.release(u);
                            prop_assert_eq!(c.refs(u.id), before, "a stale use counted on {:?}", k);
                        }
                    }
                }
                let registered: u64 = p.registered.values().map(|s| s.pinned_bytes()).sum();
                prop_assert_eq!(c.fixed(), fixed);
                prop_assert_eq!(c.pinned(), registered + c.fixed());
                prop_assert!(c.pinned() <= budget);
                prop_assert!(c.peak() <= budget);
                prop_assert_eq!(c.len(), p.registered.len());
                for (id, spec) in &p.registered {
                    let k = (id.region, id.index);
                    let n_uses = uses.get(&k).map_or(0, Vec::len) as u32;
                    let n_leases = leases.get(&k).copied().unwrap_or(0);
                    prop_assert_eq!(c.refs(*id), Some((n_uses, n_leases)));
                    prop_assert_eq!(c.spec(*id), Some(*spec));
                }
                for (k, u) in &uses {
                    if !u.is_empty() {
                        prop_assert!(p.registered.contains_key(&wid_of(*k)));
                    }
                }
                for (k, n) in &leases {
                    if *n > 0 {
                        prop_assert!(p.registered.contains_key(&wid_of(*k)));
                    }
                }
            }
        }
    }
}
