//! The warm path of a send: a WR whose SGE lies in the QP's held window (or one registered
//! window) and whose remote range lies in a known peer window is translated with one lookup and
//! posted without a batch; holds are moved, retired and surrendered here (docs/connectx.md §3).

use core::ffi::c_int;
use std::sync::atomic::Ordering;

use crate::completion::{NO_WAITER, Origin, WinList};
use crate::engine::State;
use crate::engine::call::lock;
use crate::engine::records::{Batch, LocalHold, QpCtl, SendSide};
use crate::sys::*;
use crate::window::{WindowId, WindowUse};

/// All ones if `a < b`, else zero (the borrow of `a - b`, computed without a comparison, so
/// that or-ing several of them leaves one branch; see [`QpCtl::try_post_held`]).
#[inline(always)]
fn miss_below(a: u64, b: u64) -> u64 {
    ((u128::from(a).wrapping_sub(u128::from(b))) >> 64) as u64
}

/// Opcodes of the held-window path with a remote range (a bit per `ibv_wr_opcode`).
const HELD_REMOTE_OPS: u32 =
    1 << IBV_WR_RDMA_WRITE | 1 << IBV_WR_RDMA_WRITE_WITH_IMM | 1 << IBV_WR_RDMA_READ;

/// Opcodes of the held-window path without one.
const HELD_LOCAL_OPS: u32 = 1 << IBV_WR_SEND | 1 << IBV_WR_SEND_WITH_IMM;

/// What the warm path found for a WR: the peer window's key for its remote range and the
/// local window's key (and id) for its SGE.
#[derive(Clone, Copy)]
pub(crate) struct WarmKeys {
    pub(super) remote: Option<u32>,
    pub(super) local: Option<(u32, WindowUse)>,
    /// The local key is the QP's hold's: nothing was pinned for this WR.
    held: bool,
}

impl WarmKeys {
    /// Whether the WR may be posted without a record, keeping the application's `wr_id` and
    /// flags (its completion then passes through unchanged): it holds no local window (inline
    /// data, no SGE, or an SGE outside the library's regions), so nothing waits for its
    /// completion, and no recorded unsignaled WR before it waits for a later recorded
    /// completion. Its peer window needs no record either: leases end only at a later lease
    /// grant on this QP, which RC executes after it (docs/connectx.md §5).
    #[inline]
    pub(super) fn unrecorded(&self, side: &SendSide) -> bool {
        (self.local.is_none() || self.held) && side.signals.is_idle()
    }

    /// The window pinned for this WR alone (released by its record).
    #[inline]
    pub(super) fn pinned_window(&self) -> Option<WindowUse> {
        if self.held {
            None
        } else {
            self.local.map(|(_, w)| w)
        }
    }
}

pub(super) fn is_atomic(op: u32) -> bool {
    matches!(op, IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD)
}

/// A provider WR built (and recorded, if it needs a record) by the warm-cache path, not yet
/// posted. Built in place by [`QpCtl::fast_build`] (moving a 128-byte WR around costs a
/// `memcpy` call, which emulators run slowly).
pub(crate) struct FastWr {
    pub(crate) wr: ibv_send_wr,
    pub(crate) sge: ibv_sge,
    pub(crate) has_sge: bool,
    /// Its record's sequence number; 0 when it has none.
    pub(crate) seq: u64,
}

impl FastWr {
    pub(crate) const fn new() -> Self {
        Self {
            wr: ibv_send_wr::zeroed(),
            sge: ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            has_sge: false,
            seq: 0,
        }
    }
}

impl QpCtl {
    /// The commonest warm WR in the fewest steps: posted alone, on an RC QP, a SEND or an RDMA
    /// WRITE or READ (with or without immediate) whose one SGE is inline or lies in the QP's
    /// held window, whose remote range (if any) lies in the remembered peer window, with no
    /// recorded unsignaled WR before it. It needs no record (see [`LocalHold`] and
    /// [`WarmKeys::unrecorded`]): the application's fields with the window keys go to the
    /// provider in the QP's template WR ([`HeldWr`](crate::engine::records::HeldWr)). `None`, having changed nothing, for
    /// anything else
    /// ([`fast_build`](Self::fast_build) and the general path decide those).
    ///
    /// # Safety
    /// `app` is the application's WR at `app_ptr`; `bad` is writable.
    #[inline(always)]
    pub(super) unsafe fn try_post_held(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        app_ptr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> Option<c_int> {
        // The conditions are folded into a few tests: an emulator ends a translation block at
        // every branch, and this runs once per WR. LLVM splits `a & b` of comparisons back
        // into a branch each on x86, so each condition is an integer that is zero when it
        // holds (see `miss_below`), and the integers are or-ed.
        let op_bit = 1u32.checked_shl(app.opcode).unwrap_or(0);
        let ops_miss = (op_bit & (HELD_REMOTE_OPS | HELD_LOCAL_OPS)).wrapping_sub(1) >> 31;
        let miss = self.held_off
            | app.next as u64
            | u64::from(app.num_sge as u32 ^ 1)
            | u64::from(side.signals.unsignaled())
            | u64::from(ops_miss);
        // (Nothing is queued in `side.batch` between posts: it is taken and put back empty.)
        debug_assert!(side.batch.is_empty());
        if miss != 0 || app.sg_list.is_null() {
            return None;
        }
        // SAFETY: the application's one-entry SGE array (checked non-null above).
        let app_sge = unsafe { *app.sg_list };
        let len = u64::from(app_sge.length);
        let end = app_sge.addr.wrapping_add(len);
        let mut lkey = app_sge.lkey;
        if app.send_flags & IBV_SEND_INLINE == 0 {
            let h = side.hold.as_ref()?;
            let miss = !miss_below(app_sge.addr, end) // empty or wrapping
                | u64::from(h.lkey ^ app_sge.lkey)
                | miss_below(app_sge.addr, h.lo)
                | miss_below(h.hi, end)
                | (h.epoch ^ self.engine.hold_epoch.load(Ordering::Acquire));
            if miss != 0 {
                return None;
            }
            lkey = h.wlkey;
        } else if len == 0 {
            return None;
        }
        let raddr = app.remote_addr();
        let mut rkey = app.rdma_rkey();
        if op_bit & HELD_REMOTE_OPS != 0 {
            let h = side.hot_remote.as_ref()?;
            let rend = raddr.wrapping_add(len);
            let miss = !miss_below(raddr, rend) // empty or wrapping
                | u64::from(h.rkey ^ rkey)
                | miss_below(raddr, h.lo)
                | miss_below(h.hi, rend);
            if miss != 0 {
                return None;
            }
            rkey = h.wkey;
        }
        // The WR goes out from the QP's own template, whose other fields stay zero: only what
        // these opcodes use is written (half the stores of copying the application's WR; the
        // SGE pointer was set when the QP was created, and `num_sge` is always 1).
        let held = &mut side.held;
        held.sge = ibv_sge {
            addr: app_sge.addr,
            length: app_sge.length,
            lkey,
        };
        let wr = &mut held.wr;
        debug_assert!(core::ptr::eq(wr.sg_list, &held.sge) && wr.num_sge == 1);
        wr.wr_id = app.wr_id;
        wr.opcode = app.opcode;
        wr.send_flags = app.send_flags;
        wr.imm_data = app.imm_data;
        wr.wr[0] = raddr;
        wr.wr[1] = u64::from(rkey);
        // The provider reports a failure in the application's `bad` (pointing at the template;
        // corrected below), which saves a local.
        // SAFETY: a live QP and one well-formed WR whose SGE (in the same template, under the
        // send lock) outlives the call; `held_post` is the provider's (`held_off` is zero);
        // `bad` is writable.
        let mut rc = unsafe { (self.held_post)(self.qp as *mut ibv_qp, wr, bad) };
        if rc == libc::ENOMEM {
            // The send queue may be full of the library's own WRs (sq_room.rs).
            let mut waiting = None;
            while rc == libc::ENOMEM && self.wait_for_send_room(&mut waiting) {
                // SAFETY: as above.
                rc = unsafe { (self.held_post)(self.qp as *mut ibv_qp, wr, bad) };
            }
        }
        if rc != 0 {
            // SAFETY: `bad` is writable.
            unsafe { *bad = app_ptr };
        }
        Some(rc)
    }

    /// The warm-cache path of [`translate_send`](Self::translate_send): at most one SGE,
    /// inside one registered window, and a remote range inside one window this QP holds a
    /// lease on. One lock of the engine, no allocation. Returns false (having changed nothing)
    /// when the WR needs the general path.
    pub(super) fn fast_send(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        app_ptr: usize,
        batch: &mut Batch,
    ) -> bool {
        let mut fast = FastWr::new();
        if !self.fast_build(side, app, &mut fast) {
            return false;
        }
        let sges = if fast.has_sge {
            core::slice::from_ref(&fast.sge)
        } else {
            &[]
        };
        batch.push(fast.wr, sges, app_ptr, fast.seq);
        true
    }

    /// Posts one fast-path WR built on the stack (the application posted a single WR).
    ///
    /// # Safety
    /// `app_wr` is the application's WR `fast` was built from; `bad` is writable.
    #[inline]
    pub(super) unsafe fn post_one(
        &self,
        fast: &mut FastWr,
        app_wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        (fast.wr.sg_list, fast.wr.num_sge) = if fast.has_sge {
            (&mut fast.sge as *mut ibv_sge, 1)
        } else {
            (core::ptr::null_mut(), 0)
        };
        fast.wr.next = core::ptr::null_mut();
        // SAFETY: one well-formed WR whose SGE outlives the call; forwarded contract.
        unsafe { self.post_recorded(&mut fast.wr, fast.seq, app_wr, bad) }
    }

    /// Posts one warm WR, recorded as sequence `seq` (0: not recorded). On a provider error,
    /// forgets its record and releases its window, as [`flush`](Self::flush) does, and points
    /// `*bad` at `app_wr`.
    ///
    /// # Safety
    /// `wr` is one well-formed provider WR (`next` null) whose SGEs outlive the call; `bad` is
    /// writable.
    #[inline]
    pub(super) unsafe fn post_recorded(
        &self,
        wr: *mut ibv_send_wr,
        seq: u64,
        app_wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        let mut waiting = None;
        let rc = loop {
            let rc = match self.orig_post_send() {
                Some(post) => {
                    let mut provider_bad: *mut ibv_send_wr = core::ptr::null_mut();
                    // SAFETY: a live QP and one well-formed WR (the caller's contract).
                    unsafe { post(self.qp as *mut ibv_qp, wr, &mut provider_bad) }
                }
                None => libc::EOPNOTSUPP,
            };
            if rc == 0 {
                return 0;
            }
            // The send queue may be full of the library's own WRs (sq_room.rs).
            if rc != libc::ENOMEM || !self.wait_for_send_room(&mut waiting) {
                break rc;
            }
        };
        if seq != 0 {
            let windows = self.track.lock().send.unrecord_after(seq - 1);
            self.engine.release(&windows);
        }
        // SAFETY: `bad` is writable.
        unsafe { *bad = app_wr };
        rc
    }

    /// Builds the provider WR of the warm-cache path and records it (see
    /// [`fast_send`](Self::fast_send)); false, having changed nothing, when the WR needs the
    /// general path.
    #[inline]
    pub(super) fn fast_build(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        out: &mut FastWr,
    ) -> bool {
        let Some(keys) = self.warm_keys(side, app) else {
            return false;
        };
        let has_sge = app.num_sge == 1;
        if has_sge {
            // SAFETY: the application's one-entry SGE array (checked by warm_keys).
            out.sge = unsafe { *app.sg_list };
            if let Some((lkey, _)) = keys.local {
                out.sge.lkey = lkey;
            }
        }
        out.has_sge = has_sge;
        // Only the fields these opcodes use (the rest of `out.wr` stays zero).
        let w = &mut out.wr;
        w.opcode = app.opcode;
        w.imm_data = app.imm_data;
        w.qp_type_xrc_remote_srqn = app.qp_type_xrc_remote_srqn;
        w.wr = app.wr;
        if let Some(wkey) = keys.remote {
            if is_atomic(app.opcode) {
                w.set_atomic_rkey(wkey);
            } else {
                w.set_rdma_rkey(wkey);
            }
        }
        (out.seq, out.wr.wr_id, out.wr.send_flags) = if keys.unrecorded(side) {
            (0, app.wr_id, app.send_flags)
        } else {
            self.record_warm(side, app, keys.pinned_window())
        };
        true
    }

    /// The keys of a warm WR (at most one SGE, inside a registered window; a remote range
    /// inside one peer window this QP holds a key for; an opcode the fast path knows): the
    /// peer window's key and the local window's key, whose window is pinned in flight (the
    /// last step). `None`, having changed nothing, when the WR needs the general path.
    #[inline]
    pub(super) fn warm_keys(&self, side: &mut SendSide, app: &ibv_send_wr) -> Option<WarmKeys> {
        let op = app.opcode;
        let (has_remote, atomic) = match op {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => (true, false),
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => (true, true),
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => (false, false),
            _ => return None,
        };
        if app.num_sge < 0 || app.num_sge > 1 || (app.num_sge == 1 && app.sg_list.is_null()) {
            return None;
        }
        let sge = if app.num_sge == 1 {
            // SAFETY: the application's one-entry SGE array.
            Some(unsafe { *app.sg_list })
        } else {
            None
        };
        let mut keys = WarmKeys {
            remote: None,
            local: None,
            held: false,
        };
        if has_remote {
            let rlen = if atomic {
                8
            } else {
                sge.map_or(0, |s| u64::from(s.length))
            };
            if rlen == 0 || self.qp_type != IBV_QPT_RC {
                return None;
            }
            let (raddr, rkey) = if atomic {
                (app.remote_addr(), app.atomic_rkey())
            } else {
                (app.remote_addr(), app.rdma_rkey())
            };
            keys.remote = Some(side.remote_window_key(rkey, raddr, rlen)?);
        }
        if let Some(s) = sge
            && s.length > 0
            && app.send_flags & IBV_SEND_INLINE == 0
        {
            let end = s.addr.checked_add(u64::from(s.length))?;
            if let Some(h) = side.hold
                && h.lkey == s.lkey
                && s.addr >= h.lo
                && end <= h.hi
                && h.epoch == self.engine.hold_epoch.load(Ordering::Acquire)
            {
                keys.local = Some((h.wlkey, h.used));
                keys.held = true;
                return Some(keys);
            }
            let mut st = lock(&self.engine.state);
            if let Some(id) = st.by_lkey.get(&(self.ctx.ctx, s.lkey)).copied() {
                let r = st.regions.get(&id)?;
                if !r.geom.contains(s.addr, u64::from(s.length)) {
                    return None;
                }
                let index = r.geom.window_of(s.addr);
                if r.geom.window_of(end - 1) != index {
                    return None;
                }
                let (lo, hi) = r.geom.window_range(index);
                let wid = WindowId { region: id, index };
                let (k, used) = st.cache.lookup_and_pin(wid)?;
                keys.local = Some((k.lkey, used));
                if self.qp_type == IBV_QPT_RC {
                    self.move_hold(side, &mut st, s.lkey, (lo, hi), k.lkey, wid);
                }
            }
        }
        Some(keys)
    }

    /// Moves this QP's hold to window `wid` (just pinned for a WR about to be recorded, so
    /// the old hold, retired before that record, is released by its completion). Keeps the
    /// old hold if the new one does not fit in the holds' share of the budget, unless the old
    /// one is stale.
    fn move_hold(
        &self,
        side: &mut SendSide,
        st: &mut State,
        lkey: u32,
        (lo, hi): (u64, u64),
        wlkey: u32,
        wid: WindowId,
    ) {
        let epoch = self.engine.hold_epoch.load(Ordering::Acquire);
        let old = side.hold.take();
        let old_bytes = old.map_or(0, |h| h.bytes);
        let bytes = st.cache.spec(wid).map_or(0, |sp| sp.pinned_bytes());
        let fits = st.held_bytes.saturating_sub(old_bytes) + bytes <= st.cache.budget() / 4;
        if fits && let Some(used) = st.cache.add_inflight(wid) {
            if let Some(o) = old {
                self.retire_hold(st, o);
            }
            st.held_bytes += bytes;
            side.hold = Some(LocalHold {
                lkey,
                lo,
                hi,
                wlkey,
                used,
                bytes,
                epoch,
            });
        } else if let Some(o) = old {
            if o.epoch == epoch {
                side.hold = Some(o);
            } else {
                self.retire_hold(st, o);
            }
        }
    }

    /// Ends hold `h` (taken off its QP's side already): its window is released after a WR
    /// posted from now on completes ([`LocalHold`]).
    fn retire_hold(&self, st: &mut State, h: LocalHold) {
        st.held_bytes = st.held_bytes.saturating_sub(h.bytes);
        // A window deregistered since (the region was deregistered or re-registered) took the
        // hold's in-flight count with it.
        if st.cache.use_of(h.used.id) == Some(h.used) {
            let mut w = WinList::new();
            w.push(h.used);
            self.track.lock().send.retire(w);
        }
    }

    /// Ends this QP's hold, if any, and posts a barrier after everything posted so far (a
    /// zero-length RDMA WRITE, which touches no memory and checks no key, IBA vol. 1 C9-88)
    /// whose completion releases the retired windows. Returns whether a barrier was posted.
    pub(crate) fn surrender_hold(&self, side: &mut SendSide) -> bool {
        if let Some(h) = side.hold.take() {
            let mut st = lock(&self.engine.state);
            self.retire_hold(&mut st, h);
        }
        if self.qp_type != IBV_QPT_RC {
            return false;
        }
        // A barrier is needed unless the newest record is one of the library's own WRs (an
        // earlier barrier, say), which are signaled: its completion releases every marker.
        // (Whether an application WR after the markers is signaled is not known for sure: a
        // refused post may have reset the signal run.)
        let needed = {
            let t = self.track.lock();
            t.send.has_retired() && !t.send.newest_is_internal()
        };
        if !needed {
            return false;
        }
        let Some(post) = self.orig_post_send() else {
            return false;
        };
        let mut wr = ibv_send_wr::zeroed();
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        let seq = {
            let mut t = self.track.lock();
            let seq = t
                .send
                .record(Origin::Internal { token: NO_WAITER }, WinList::new());
            wr.wr_id = t.send.wr_id_of(seq);
            seq
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; one well-formed WR without SGEs.
        let rc = unsafe { post(self.qp as *mut ibv_qp, &mut wr, &mut bad) };
        if rc != 0 {
            // Not posted (the send queue is full, or the QP was reset): the retired windows
            // wait for the next WR that completes, or for the QP's destruction.
            self.track.lock().send.unrecord_after(seq - 1);
            return false;
        }
        // The barrier is signaled: it ends any unsignaled run before it.
        side.signals.must_signal(true, 1);
        true
    }

    /// Records a warm WR (holding `window` in flight, if any); returns its sequence number, the
    /// provider `wr_id` and the send flags to post it with.
    #[inline]
    pub(super) fn record_warm(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        window: Option<WindowUse>,
    ) -> (u64, u64, u32) {
        let mut windows = WinList::new();
        if let Some(w) = window {
            windows.push(w);
        }
        let wants = app.send_flags & IBV_SEND_SIGNALED != 0 || self.sq_sig_all;
        let signal = side.signals.must_signal(wants, self.signal_every);
        let mut t = self.track.lock();
        let flags = if signal {
            app.send_flags | IBV_SEND_SIGNALED
        } else {
            app.send_flags & !IBV_SEND_SIGNALED
        };
        let group = t.send.next_group();
        let seq = t.send.record(
            Origin::App {
                wr_id: app.wr_id,
                group,
                last: true,
                wants_completion: wants,
                byte_len: 0,
            },
            windows,
        );
        (seq, t.send.wr_id_of(seq), flags)
    }
}
