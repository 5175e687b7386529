//! Registration: `ibv_reg_mr` (a virtual region with its directory), its pass-through form,
//! `ibv_dereg_mr` and `ibv_rereg_mr`.

use core::ffi::{c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::directory::{DirHeader, DmaBuf, LeaseBook};
use crate::engine::call::{RealCall, errno, lock, random_u64, set_errno};
use crate::engine::records::CtxRec;
use crate::engine::region::{Provider, Region};
use crate::engine::{Engine, State};
use crate::status::MrMode;
use crate::sys::*;
use crate::translate::Geometry;

/// Directory entries a region may have (its directory stays ≤ 1 MiB + 8 KiB).
const MAX_WINDOWS_PER_REGION: u64 = 1 << 17;

impl Engine {
    /// `ibv_reg_mr*` for a context we manage. Returns the MR the application sees, or NULL
    /// with errno set.
    ///
    /// # Safety
    /// `pd` is a live PD of a context opened through the library.
    pub(crate) unsafe fn reg_mr(
        self: &Arc<Self>,
        rec: &CtxRec,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        iova: u64,
        access: u32,
    ) -> *mut ibv_mr {
        let passthrough = |why: &str, mode: MrMode| -> *mut ibv_mr {
            self.note(why);
            // SAFETY: forwarded unchanged.
            let mr = unsafe { self.real_reg(pd, addr, len, iova, access) };
            self.status.page().modes.set_mr_mode(mr as usize, mode);
            mr
        };
        let (through, fallback) = (MrMode::PassThrough, MrMode::PinnedFallback);
        if let Some(why) = rec.passthrough() {
            return passthrough(why, through);
        }
        if access & IBV_ACCESS_ON_DEMAND != 0 {
            return passthrough(
                "ODP region (IBV_ACCESS_ON_DEMAND) is already unpinned: pass-through",
                through,
            );
        }
        if access & IBV_ACCESS_MW_BIND != 0 {
            return passthrough(
                "region with IBV_ACCESS_MW_BIND: memory windows need the real MR: pass-through",
                through,
            );
        }
        if access & IBV_ACCESS_ZERO_BASED != 0 {
            return passthrough(
                "zero-based region (IBV_ACCESS_ZERO_BASED): pass-through",
                through,
            );
        }
        if crate::transport::pd_passes_through(pd as usize, access) {
            return passthrough(
                "region with remote access in a PD with a UC QP: pass-through (transport.rs)",
                fallback,
            );
        }
        // SAFETY: the caller's contract (crate::odp: the ODP mode, where it applies).
        if let Some(mr) = unsafe { self.register_odp(rec, pd, addr, len, iova, access) } {
            return mr;
        }
        let exported = access
            & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)
            != 0;
        if exported && !rec.caps.atomics {
            return passthrough(
                "device has no atomics: regions with remote access are registered in pass-through (pinned)",
                fallback,
            );
        }
        // The checks plain verbs makes (ibv_reg_mr(3)): remote write/atomic need local write.
        if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
            && access & IBV_ACCESS_LOCAL_WRITE == 0
        {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        let va = addr as u64;
        let len64 = len as u64;
        if len == 0 || va.checked_add(len64).is_none() || iova.checked_add(len64).is_none() {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        if !range_is_mapped(va, len64, access & IBV_ACCESS_LOCAL_WRITE != 0) {
            set_errno(libc::EFAULT);
            return core::ptr::null_mut();
        }

        // Window size: the configured one, or larger so that the directory stays bounded.
        let mut shift = self.cfg.window.trailing_zeros();
        while len64.div_ceil(1 << shift) + 1 > MAX_WINDOWS_PER_REGION {
            shift += 1;
        }
        let geom = Geometry {
            iova,
            len: len64,
            window_shift: shift,
        };
        let mut header = DirHeader::for_region(
            exported,
            iova,
            len64,
            shift as u8,
            geom.window_count() as u32,
        );
        header.instance = random_u64();
        if iova < header.dir_len.next_multiple_of(4096) {
            return passthrough(
                "region whose IOVA range overlaps the directory at IOVA 0: pass-through",
                fallback,
            );
        }
        let Some(dir) = DmaBuf::new(header.dir_len as usize) else {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        };
        // Peers aim out-of-region accesses at `dir_len`: it must be the registered length.
        header.dir_len = dir.len() as u64;
        dir.write(0, &header.encode());
        let ring_pinned = {
            let start = header.ticket_off() / 4096 * 4096;
            let end = (header.ticket_off() + header.ring_len()).next_multiple_of(4096);
            if header.ring_len() == 0 {
                0
            } else {
                end - start
            }
        };
        let dir_pinned = dir.len() as u64 + ring_pinned;

        let mut st = lock(&self.state);
        {
            let State { regions, cache, .. } = &mut *st;
            let mut prov = Provider {
                real: &self.real,
                regions,
            };
            if cache.charge_fixed(dir_pinned, &mut prov).is_err() {
                set_errno(libc::ENOMEM);
                return core::ptr::null_mut();
            }
        }
        // The directory is read-only to peers; only the ring MR below may be written (and its
        // ticket word incremented) remotely.
        let dir_access = if exported {
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
        } else {
            IBV_ACCESS_LOCAL_WRITE
        };
        let mr = {
            let _g = RealCall::enter();
            // SAFETY: `dir` is our own mapping of `dir.len()` bytes; registered at IOVA 0.
            unsafe { (self.real.reg_mr_iova2)(pd, dir.as_ptr().cast(), dir.len(), 0, dir_access) }
        };
        if mr.is_null() {
            let e = errno();
            st.cache.uncharge_fixed(dir_pinned);
            set_errno(if e == 0 { libc::ENOMEM } else { e });
            return core::ptr::null_mut();
        }
        let mut ring_mr: *mut ibv_mr = core::ptr::null_mut();
        if exported {
            ring_mr = {
                let _g = RealCall::enter();
                // SAFETY: the ring lies inside our own mapping `dir`; registered at IOVA = its
                // offset, so peers address it with the directory's offsets.
                unsafe {
                    (self.real.reg_mr_iova2)(
                        pd,
                        dir.as_ptr().add(header.ticket_off() as usize).cast(),
                        header.ring_len() as usize,
                        header.ticket_off(),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
                    )
                }
            };
            if ring_mr.is_null() {
                let e = errno();
                {
                    let _g = RealCall::enter();
                    // SAFETY: the directory MR just registered, not yet known to anyone.
                    unsafe { (self.real.dereg_mr)(mr) };
                }
                st.cache.uncharge_fixed(dir_pinned);
                set_errno(if e == 0 { libc::ENOMEM } else { e });
                return core::ptr::null_mut();
            }
            // SAFETY: the provider returned a valid MR.
            header.ring_rkey = unsafe { (*ring_mr).rkey };
            dir.write(0, &header.encode());
        }
        // SAFETY: the provider returned a valid MR; the application sees its addr/length as the
        // region's (restored before the real deregistration, which reads them).
        let lkey = unsafe {
            (*mr).addr = addr;
            (*mr).length = len;
            (*mr).lkey
        };
        let id = st.next_region;
        st.next_region += 1;
        st.regions.insert(
            id,
            Region {
                id,
                ctx: rec.ctx,
                pd: pd as usize,
                va,
                len: len64,
                iova,
                access,
                geom,
                header,
                dir,
                dir_mr: mr as usize,
                ring_mr: ring_mr as usize,
                dir_pinned,
                leases: LeaseBook::new(usize::from(header.lease_cap)),
                generation: 0,
                stall_since: None,
                served: 0,
                owner_pid: crate::engine::call::pid(),
            },
        );
        st.by_mr.insert(mr as usize, id);
        st.by_lkey.insert((rec.ctx, lkey), id);
        self.counters()
            .registered_bytes
            .fetch_add(len64, Ordering::Relaxed);
        self.publish(&st);
        drop(st);
        let page = self.status.page();
        page.modes
            .add_mr(mr as usize, va, len64, lkey, MrMode::Windows);
        if exported {
            self.ensure_helper();
        }
        mr
    }

    /// Registers in pass-through, counting the bytes.
    ///
    /// # Safety
    /// As `ibv_reg_mr_iova2`.
    pub(crate) unsafe fn real_reg(
        &self,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        iova: u64,
        access: u32,
    ) -> *mut ibv_mr {
        let mr = {
            let _g = RealCall::enter();
            // SAFETY: forwarded unchanged.
            unsafe { (self.real.reg_mr_iova2)(pd, addr, len, iova, access) }
        };
        if !mr.is_null() {
            self.counters()
                .passthrough_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            lock(&self.state)
                .passthrough_mrs
                .insert(mr as usize, len as u64);
            // SAFETY: the provider's fresh MR.
            let lkey = unsafe { (*mr).lkey };
            let page = self.status.page();
            page.modes.add_mr(
                mr as usize,
                addr as u64,
                len as u64,
                lkey,
                MrMode::PassThrough,
            );
        }
        mr
    }

    /// Whether `mr` is a virtual region of this engine.
    pub(crate) fn owns_mr(&self, mr: *mut ibv_mr) -> bool {
        lock(&self.state).by_mr.contains_key(&(mr as usize))
    }

    /// `ibv_dereg_mr`.
    ///
    /// # Safety
    /// `mr` is an MR returned by a registration of this engine (virtual or pass-through).
    pub(crate) unsafe fn dereg_mr(&self, mr: *mut ibv_mr) -> c_int {
        self.before_dereg(mr);
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.get(&(mr as usize)).copied() else {
            let len = st.passthrough_mrs.remove(&(mr as usize));
            drop(st);
            let _g = RealCall::enter();
            // SAFETY: a pass-through MR, forwarded.
            let rc = unsafe { (self.real.dereg_mr)(mr) };
            if rc == 0 {
                self.forget_mr(mr);
            }
            if rc == 0
                && let Some(len) = len
            {
                self.counters()
                    .passthrough_bytes
                    .fetch_sub(len, Ordering::Relaxed);
            }
            return rc;
        };
        // Also when the deregistration below fails: the windows are gone either way.
        self.drop_region_windows(&mut st, id);
        let Some(region) = st.regions.get(&id) else {
            return libc::EINVAL;
        };
        let (va, len, dir_ptr, dir_len, lkey, ctx) = (
            region.va,
            region.len,
            region.dir.as_ptr(),
            region.dir.len(),
            // SAFETY: the directory MR is live until the real deregistration below.
            unsafe { (*mr).lkey },
            region.ctx,
        );
        // SAFETY: restore what the provider registered, so libibverbs' dofork bookkeeping in
        // ibv_dereg_mr sees the directory's range, not the application's.
        unsafe {
            (*mr).addr = dir_ptr.cast();
            (*mr).length = dir_len;
        }
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: the directory MR, registered by us.
            unsafe { (self.real.dereg_mr)(mr) }
        };
        if rc != 0 {
            // Still registered (e.g. EBUSY: memory windows bound): keep the region usable.
            // SAFETY: the MR is still live.
            unsafe {
                (*mr).addr = va as *mut c_void;
                (*mr).length = len as usize;
            }
            return rc;
        }
        if let Some(r) = st.regions.remove(&id) {
            if r.ring_mr != 0 {
                let _g = RealCall::enter();
                // SAFETY: the region's ring MR, registered by us, deregistered once; its
                // memory (`r.dir`) is unmapped only when `r` is dropped below.
                unsafe { (self.real.dereg_mr)(r.ring_mr as *mut ibv_mr) };
            }
            st.cache.uncharge_fixed(r.dir_pinned);
        }
        st.by_mr.remove(&(mr as usize));
        st.by_lkey.remove(&(ctx, lkey));
        self.counters()
            .registered_bytes
            .fetch_sub(len, Ordering::Relaxed);
        self.publish(&st);
        drop(st);
        self.forget_mr(mr);
        0
    }

    /// Forgets the region of `mr` whose deregistration failed while its context closes (the
    /// kernel destroys it with the context): its directory pin, keys and bytes are no longer
    /// counted. Its windows went in the failed [`dereg_mr`](Self::dereg_mr).
    pub(super) fn forget_region_of_mr(&self, mr: usize) {
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.remove(&mr) else {
            return;
        };
        st.by_lkey.retain(|_, r| *r != id);
        if let Some(r) = st.regions.remove(&id) {
            st.cache.uncharge_fixed(r.dir_pinned);
            self.counters()
                .registered_bytes
                .fetch_sub(r.len, Ordering::Relaxed);
        }
        self.publish(&st);
        drop(st);
        self.forget_mr(mr as *mut ibv_mr);
    }

    /// `ibv_rereg_mr` on a virtual region.
    ///
    /// # Safety
    /// `mr` is a virtual region of this engine; `pd`/`addr` as in `ibv_rereg_mr`.
    pub(crate) unsafe fn rereg_mr(
        &self,
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> c_int {
        let supported =
            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
        if flags == 0 || flags & !supported != 0 {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.get(&(mr as usize)).copied() else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        let Some(r) = st.regions.get(&id) else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            access as u32
        } else {
            r.access
        };
        let (new_va, new_len) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (addr as u64, len as u64)
        } else {
            (r.va, r.len)
        };
        if new_len == 0
            || new_va.checked_add(new_len).is_none()
            || (new_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
                && new_access & IBV_ACCESS_LOCAL_WRITE == 0)
        {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        if !range_is_mapped(new_va, new_len, new_access & IBV_ACCESS_LOCAL_WRITE != 0) {
            set_errno(libc::EFAULT);
            return IBV_REREG_MR_ERR_INPUT;
        }
        let exported = new_access
            & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)
            != 0;
        // A new translation keeps the IOVA the region had (ibv_rereg_mr(3) sets iova = addr).
        let new_iova = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            new_va
        } else {
            r.iova
        };
        let geom = Geometry {
            iova: new_iova,
            len: new_len,
            window_shift: r.geom.window_shift,
        };
        let mut header = DirHeader::for_region(
            exported,
            new_iova,
            new_len,
            r.header.window_shift,
            geom.window_count() as u32,
        );
        header.instance = random_u64();
        // The directory cannot grow (the application holds its MR): refuse what does not fit,
        // and a directory that was registered without remote rights cannot gain them.
        if header.dir_len > r.dir.len() as u64
            || (exported && !r.header.exported)
            || new_iova < (r.dir.len() as u64)
        {
            set_errno(libc::EOPNOTSUPP);
            return IBV_REREG_MR_ERR_INPUT;
        }
        header.dir_len = r.dir.len() as u64;
        let region_ctx = r.ctx;
        let ring_mr = r.ring_mr;
        if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            // SAFETY: the directory MR, live.
            let old_lkey = unsafe { (*mr).lkey };
            let rc = {
                let _g = RealCall::enter();
                // SAFETY: our directory MR; only the PD changes.
                unsafe {
                    (self.real.rereg_mr)(
                        mr,
                        IBV_REREG_MR_CHANGE_PD,
                        pd,
                        core::ptr::null_mut(),
                        0,
                        0,
                    )
                }
            };
            if rc != 0 {
                return rc;
            }
            if ring_mr != 0 {
                let rc = {
                    let _g = RealCall::enter();
                    // SAFETY: the region's ring MR; only the PD changes, as for the directory.
                    unsafe {
                        (self.real.rereg_mr)(
                            ring_mr as *mut ibv_mr,
                            IBV_REREG_MR_CHANGE_PD,
                            pd,
                            core::ptr::null_mut(),
                            0,
                            0,
                        )
                    }
                };
                if rc != 0 {
                    return rc;
                }
            }
            // The provider may have given the MR new keys (ibv_rereg_mr(3); mlx5 can): SGEs
            // carry the new lkey from now on.
            // SAFETY: as above.
            let new_lkey = unsafe { (*mr).lkey };
            if new_lkey != old_lkey {
                st.by_lkey.remove(&(region_ctx, old_lkey));
                st.by_lkey.insert((region_ctx, new_lkey), id);
            }
        }
        // The region stays, with new windows; its lease book is renewed below.
        self.drop_region_windows(&mut st, id);
        let old_len;
        {
            let Some(r) = st.regions.get_mut(&id) else {
                return IBV_REREG_MR_ERR_CMD;
            };
            old_len = r.len;
            if flags & IBV_REREG_MR_CHANGE_PD != 0 {
                r.pd = pd as usize;
            }
            r.va = new_va;
            r.len = new_len;
            r.iova = new_iova;
            r.access = new_access;
            r.geom = geom;
            r.header = header;
            r.leases = LeaseBook::new(usize::from(header.lease_cap));
            r.generation += 1;
            // Clear the ring and entries (tickets and the served count restart at 0), then
            // publish the new header.
            r.served = 0;
            r.stall_since = None;
            if exported && r.ring_mr != 0 {
                // SAFETY: the ring MR is live (its keys may have changed with its PD).
                header.ring_rkey = unsafe { (*(r.ring_mr as *mut ibv_mr)).rkey };
                r.header = header;
            }
            r.dir.write(0, &vec![0u8; r.dir.len()]);
            r.dir.write(0, &header.encode());
            // SAFETY: the directory MR is live; the application sees the new range.
            unsafe {
                (*mr).addr = new_va as *mut c_void;
                (*mr).length = new_len as usize;
            }
        }
        let c = self.counters();
        c.registered_bytes.fetch_sub(old_len, Ordering::Relaxed);
        c.registered_bytes.fetch_add(new_len, Ordering::Relaxed);
        self.publish(&st);
        0
    }
}

/// Whether `[va, va + len)` is mapped readable (and writable if `write`), per /proc/self/maps
/// (linux-glue). Registration without pinning must still fail where plain verbs fails.
fn range_is_mapped(va: u64, len: u64, write: bool) -> bool {
    let Some(end) = va.checked_add(len) else {
        return false;
    };
    let Ok(vmas) = linux_glue::vma::maps_in_range(va, end) else {
        // Cannot tell: do not refuse what plain verbs might accept.
        return true;
    };
    let mut at = va;
    for v in vmas {
        let (s, e) = (v.start.as_u64(), v.end.as_u64());
        if s > at {
            return false;
        }
        if !v.readable || (write && !v.writable) {
            return false;
        }
        at = at.max(e);
        if at >= end {
            return true;
        }
    }
    at >= end
}
