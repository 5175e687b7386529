//! A QP's life: its capabilities widened for the library (and shown back as asked), its record
//! made at creation (through `ibv_create_qp`, crate::interpose, or the context's
//! `create_qp_ex`, here), `ibv_modify_qp`, and its destruction in two halves around the
//! provider's.

use core::ffi::c_int;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::completion::{RecvTracker, SendTracker};
use crate::engine::call::{RealCall, lock, random_u64};
use crate::engine::records::{AppView, CtxRec, QpCtl, SendSide, TrackLock, Trackers, no_post_send};
use crate::engine::{Engine, State};
use crate::fasthash::FastMap;
use crate::registry;
use crate::spin::SpinLock;
use crate::sys::*;
use crate::window::WindowId;

/// Extra send queue entries per QP for the library's own work requests and for splits.
const SQ_RESERVE: u32 = 16;

/// `verbs_context::create_qp_ex`.
///
/// # Safety
/// Called by the inline `ibv_create_qp_ex` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    crate::ops::guarded(core::ptr::null_mut(), || {
        let Some(rec) = registry::ctx(ctx as usize) else {
            crate::engine::call::set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        let Some(orig) = rec.orig_create_qp_ex else {
            crate::engine::call::set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        };
        if attr.is_null() || rec.passthrough().is_some() {
            // SAFETY: forwarded unchanged.
            return unsafe { orig(ctx, attr) };
        }
        // SAFETY: the application's attributes.
        let app = unsafe { *attr };
        let mut a = app;
        Engine::widen_caps(&rec, &mut a.cap);
        // SAFETY: a valid attribute copy.
        let mut qp = unsafe { orig(ctx, &mut a) };
        if qp.is_null() {
            // The device may refuse the wider queue: fall back to what was asked.
            a = app;
            // SAFETY: as above.
            qp = unsafe { orig(ctx, &mut a) };
        }
        if qp.is_null() {
            return qp;
        }
        let with_ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags != 0;
        // SAFETY: a QP just created on this context.
        unsafe {
            let shown = report_caps(app.cap, a.cap);
            rec.engine
                .on_create_qp(&rec, qp, a.cap, shown, a.sq_sig_all != 0, with_ex);
            (*attr).cap = shown;
        }
        qp
    })
}

/// The capabilities the application sees: what it asked for where the library widened the
/// queue for itself, the provider's values elsewhere.
pub(crate) fn report_caps(asked: ibv_qp_cap, real: ibv_qp_cap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: asked.max_send_wr.min(real.max_send_wr),
        max_recv_wr: real.max_recv_wr,
        max_send_sge: asked.max_send_sge.min(real.max_send_sge),
        max_recv_sge: asked.max_recv_sge.min(real.max_recv_sge),
        max_inline_data: real.max_inline_data,
    }
}

impl Engine {
    /// Widens a QP's requested capabilities for splits and the library's own WRs.
    pub(crate) fn widen_caps(rec: &CtxRec, cap: &mut ibv_qp_cap) {
        let c = rec.caps;
        cap.max_send_wr = cap
            .max_send_wr
            .saturating_add(cap.max_send_wr / 2 + SQ_RESERVE)
            .min(c.max_qp_wr.max(cap.max_send_wr));
        cap.max_send_sge = Self::widen_sge(rec, cap.max_send_sge);
        cap.max_recv_sge = Self::widen_sge(rec, cap.max_recv_sge);
    }

    /// An SGE limit of `n` widened for splits (each application SGE may cross a window
    /// boundary), within the device's limit.
    pub(crate) fn widen_sge(rec: &CtxRec, n: u32) -> u32 {
        n.max(1)
            .saturating_mul(2)
            .max(n.saturating_add(2))
            .min(rec.caps.max_sge.max(n))
    }

    /// Records a QP the provider created.
    ///
    /// # Safety
    /// `qp` is a live QP just created on a context of `rec`.
    pub(crate) unsafe fn on_create_qp(
        self: &Arc<Self>,
        rec: &Arc<CtxRec>,
        qp: *mut ibv_qp,
        real_cap: ibv_qp_cap,
        app_cap: ibv_qp_cap,
        sq_sig_all: bool,
        with_ex: bool,
    ) {
        // SAFETY: live QP.
        let q = unsafe { &*qp };
        let qpx = if with_ex {
            // SAFETY: live QP created with send ops flags.
            unsafe { (self.real.qp_to_qp_ex)(qp) }
        } else {
            core::ptr::null_mut()
        };
        // The provider's own builder, saved before wrap_qp_ex replaces it in `qpx`.
        let provider = if qpx.is_null() {
            None
        } else {
            // SAFETY: the provider's ibv_qp_ex of this live QP.
            unsafe { crate::engine::wr_batch::ProviderBuilder::of(qpx) }
        };
        let ctl = Arc::new(QpCtl {
            engine: self.clone(),
            ctx: rec.clone(),
            qp: qp as usize,
            qp_num: q.qp_num,
            qp_type: q.qp_type,
            sq_sig_all,
            send_cq: q.send_cq as usize,
            recv_cq: q.recv_cq as usize,
            srq: q.srq as usize,
            pd: q.pd as usize,
            max_send_sge: real_cap.max_send_sge.max(1) as usize,
            max_recv_sge: real_cap.max_recv_sge.max(1) as usize,
            max_inline_data: real_cap.max_inline_data,
            signal_every: (real_cap.max_send_wr / 2).clamp(1, 64),
            held_off: u64::from(q.qp_type != IBV_QPT_RC || rec.orig.post_send.is_none()),
            held_post: rec.orig.post_send.unwrap_or(no_post_send),
            dest_qpn: AtomicU32::new(0),
            peer: Mutex::new(None),
            send: SpinLock::new(SendSide::default()),
            builder: crate::engine::wr_batch::BatchCell::new(provider),
            track: TrackLock::new(Trackers {
                send: SendTracker::with_tag(random_u64()),
                recv: RecvTracker::with_tag(random_u64()),
            }),
            internal_done: Mutex::new(FastMap::default()),
            next_token: AtomicU64::new(1),
            app_view: Mutex::new(AppView {
                cap: app_cap,
                access: None,
                max_rd_atomic: None,
                max_dest_rd_atomic: None,
            }),
        });
        // The template's SGE pointer is set once, now that the record has its final place.
        {
            let mut side = ctl.send.lock();
            let held = &mut side.held;
            held.wr.sg_list = &mut held.sge;
        }
        registry::add_qp(ctl);
        // SAFETY: the QP's send CQ, live while the QP is.
        unsafe {
            crate::cq_room::add_qp(self, rec, qp as usize, q.send_cq, real_cap.max_send_wr);
        }
        self.on_transport(q.pd as usize, q.qp_type);
        if !qpx.is_null() {
            // SAFETY: the provider's ibv_qp_ex of this QP; the application has not used it.
            unsafe { crate::ops::wrap_qp_ex(qpx) };
        }
    }

    /// `ibv_modify_qp` for a managed QP: keeps what the library needs (remote read, write and
    /// atomic rights on RC, at least one outstanding read) and notes the peer's QP number.
    ///
    /// # Safety
    /// As `ibv_modify_qp`.
    pub(crate) unsafe fn modify_qp(
        &self,
        ctl: &QpCtl,
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
    ) -> c_int {
        if attr.is_null() {
            let _g = RealCall::enter();
            // SAFETY: forwarded unchanged; the provider reports the error.
            return unsafe { (self.real.modify_qp)(qp, attr, mask) };
        }
        // SAFETY: the application passed a valid attribute struct.
        let app = unsafe { *attr };
        let mut a = app;
        if ctl.qp_type == IBV_QPT_RC {
            if mask & IBV_QP_ACCESS_FLAGS != 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
                if ctl.ctx.caps.atomics {
                    a.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
                }
            }
            if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 && a.max_dest_rd_atomic == 0 {
                a.max_dest_rd_atomic = 1;
            }
            if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 && a.max_rd_atomic == 0 {
                a.max_rd_atomic = 1;
            }
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            ctl.dest_qpn.store(a.dest_qp_num, Ordering::Release);
        }
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: `a` is a valid copy of the application's attributes.
            unsafe { (self.real.modify_qp)(qp, &mut a, mask) }
        };
        if rc == 0 {
            let mut view = lock(&ctl.app_view);
            if mask & IBV_QP_ACCESS_FLAGS != 0 {
                view.access = Some(app.qp_access_flags);
            }
            if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
                view.max_rd_atomic = Some(app.max_rd_atomic);
            }
            if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
                view.max_dest_rd_atomic = Some(app.max_dest_rd_atomic);
            }
        }
        if rc == 0
            && mask & IBV_QP_STATE != 0
            && (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_RESET)
        {
            self.drop_lessee(ctl.ctx.ctx, ctl.qp_num);
            self.forget_peer(ctl);
        }
        if rc == 0 && mask & IBV_QP_STATE != 0 && a.qp_state == IBV_QPS_RTR {
            self.meet_peer(ctl, &a, mask);
        }
        if rc == 0 && mask & IBV_QP_STATE != 0 && a.qp_state == IBV_QPS_RESET {
            // RESET discards the queued work requests without completions: the NIC touches
            // none of their buffers again, so their windows go. The records stay, for
            // completions already in the CQ (as when the QP is destroyed).
            // The peers' ends of this QP's connection ended its leases when it went to error
            // or reset (and the QP may be connected to another peer next): what it knew of
            // their regions (window keys, lease mirrors) is stale, so it is found out again
            // on next use.
            let windows = {
                let mut side = ctl.send.lock();
                side.remote.clear();
                side.hot_remote = None;
                ctl.track.lock().take_all_windows()
            };
            self.release(&windows);
        }
        rc
    }

    /// Ends every lease held through local QP `qp_num` (the connection is gone).
    pub(crate) fn drop_lessee(&self, ctx: usize, qp_num: u32) {
        let mut st = lock(&self.state);
        let State {
            regions,
            cache,
            leased_bytes,
            ..
        } = &mut *st;
        for r in regions.values_mut() {
            if r.ctx != ctx {
                continue;
            }
            for w in r.leases.drop_lessee(qp_num) {
                let id = WindowId {
                    region: r.id,
                    index: w,
                };
                let bytes = cache.spec(id).map_or(0, |s| s.pinned_bytes());
                cache.remove_lease(id);
                if cache.refs(id).is_some_and(|(_, l)| l == 0) {
                    *leased_bytes = leased_bytes.saturating_sub(bytes);
                }
            }
        }
    }

    /// Forgets a QP before the provider destroys it.
    /// Destroys the library's side of `qp` at once (a context being closed: the kernel
    /// destroys the QP with it).
    pub(crate) fn on_destroy_qp(&self, qp: *mut ibv_qp) {
        if let Some(ctl) = self.begin_destroy_qp(qp) {
            self.finish_destroy_qp(ctl);
        }
    }

    /// First half of `ibv_destroy_qp`, before the provider's: the data path no longer finds
    /// the QP. Its windows stay pinned until [`finish_destroy_qp`](Self::finish_destroy_qp):
    /// the NIC may still be executing its work requests.
    pub(crate) fn begin_destroy_qp(&self, qp: *mut ibv_qp) -> Option<Arc<QpCtl>> {
        registry::remove_qp(qp as usize)
    }

    /// The provider refused to destroy the QP (e.g. `EBUSY`): it is alive, and managed again.
    pub(crate) fn abort_destroy_qp(&self, ctl: Arc<QpCtl>) {
        registry::add_qp(ctl);
    }

    /// Second half of `ibv_destroy_qp`, once the provider has destroyed the QP: its leases,
    /// batch, windows, hold and scratch buffer go.
    pub(crate) fn finish_destroy_qp(&self, ctl: Arc<QpCtl>) {
        // SAFETY: the QP is destroyed; its send CQ cannot have been destroyed before it.
        unsafe { crate::cq_room::remove_qp(self, ctl.qp) };
        {
            // CQs remember the QP of their last completion: forget it (its number may be reused).
            for cq in [ctl.send_cq, ctl.recv_cq] {
                if let Some(c) = registry::cq(cq) {
                    let mut inner = c.stash.lock();
                    if inner
                        .last_qp
                        .as_ref()
                        .is_some_and(|(n, _)| *n == ctl.qp_num)
                    {
                        inner.last_qp = None;
                    }
                }
            }
            self.drop_lessee(ctl.ctx.ctx, ctl.qp_num);
            self.forget_peer(&ctl);
            if ctl.builder.is_open() {
                // Destroyed between ibv_wr_start and ibv_wr_complete (the application's
                // error): end the batch so that its lock is not held forever.
                crate::ops::close_batch(&ctl);
            }
            // Under the posting side's lock: a thread revoking holds that got it first has
            // finished (its marker and barrier are in the tracker now); one that comes later
            // finds the QP unregistered and leaves it alone.
            let (mut windows, settled, scratch, hold) = {
                let mut side = ctl.send.lock();
                let mut t = ctl.track.lock();
                let windows = t.take_all_windows();
                (
                    windows,
                    t.is_settled(),
                    side.scratch.take(),
                    side.hold.take(),
                )
            };
            if settled {
                registry::forget_gone_qp(&ctl);
            }
            if let Some(h) = hold {
                let mut st = lock(&self.state);
                st.held_bytes = st.held_bytes.saturating_sub(h.bytes);
                // Released only if still the same registration (WindowCache::release).
                windows.push(h.used);
            }
            self.release(&windows);
            if let Some(s) = scratch {
                self.free_scratch(s);
            }
        }
    }
}
