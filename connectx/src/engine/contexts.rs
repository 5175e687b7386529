//! Opening and closing a device context: the library saves the provider's data-path
//! operations and installs its own (crate::ops, crate::cq_ex); at close it forgets what the
//! application left open in the context.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::config::Mode;
use crate::engine::Engine;
use crate::engine::call::{RealCall, lock};
use crate::engine::records::{CtxRec, DevCaps};
use crate::registry;
use crate::sys::*;

impl Engine {
    /// Called after the provider opened `ctx`: saves and wraps its data-path operations.
    ///
    /// # Safety
    /// `ctx` is a context the provider just returned, not yet used by the application.
    pub(crate) unsafe fn on_open(self: &Arc<Self>, ctx: *mut ibv_context) {
        if ctx.is_null() || self.cfg.mode == Mode::Off {
            return;
        }
        let mut attr = ibv_device_attr::zeroed();
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: live context; `attr` is writable.
            unsafe { (self.real.query_device)(ctx, &mut attr) }
        };
        let caps = if rc == 0 {
            DevCaps {
                max_sge: attr.max_sge.max(1) as u32,
                max_qp_wr: attr.max_qp_wr.max(1) as u32,
                max_cqe: attr.max_cqe.max(1) as u32,
                atomics: attr.atomic_cap != IBV_ATOMIC_NONE,
            }
        } else {
            DevCaps {
                max_sge: 1,
                max_qp_wr: 1,
                max_cqe: 1,
                atomics: false,
            }
        };
        // SAFETY: live context.
        let c = unsafe { &mut *ctx };
        let orig = c.ops;
        let (vctx, orig_create_qp_ex, orig_create_cq_ex) = if c.abi_compat == VERBS_ABI_IS_EXTENDED
        {
            let off = core::mem::offset_of!(verbs_context, context);
            // SAFETY: an extended context is the last field of its verbs_context (verbs.h
            // verbs_get_ctx), so the verbs_context starts `off` bytes before it.
            let v = unsafe { &mut *(ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
            // verbs.h verbs_get_ctx_op: a field exists if `sz` reaches back to it.
            let has = |field_off: usize| v.sz >= core::mem::size_of::<verbs_context>() - field_off;
            let qp_ex = if has(core::mem::offset_of!(verbs_context, create_qp_ex)) {
                v.create_qp_ex
            } else {
                None
            };
            let cq_ex = if has(core::mem::offset_of!(verbs_context, create_cq_ex)) {
                v.create_cq_ex
            } else {
                None
            };
            if qp_ex.is_some() || cq_ex.is_some() {
                (v as *mut verbs_context as usize, qp_ex, cq_ex)
            } else {
                (0, None, None)
            }
        } else {
            (0, None, None)
        };
        let rec = Arc::new(CtxRec {
            engine: self.clone(),
            ctx: ctx as usize,
            orig,
            orig_create_qp_ex,
            orig_create_cq_ex,
            vctx,
            caps,
            passthrough: std::sync::OnceLock::new(),
        });
        if !caps.atomics {
            self.note("device has no atomics: regions with remote access are registered in pass-through (pinned)");
        }
        registry::add_ctx(rec);
        c.ops.post_send = Some(crate::ops::wrapped_post_send);
        c.ops.post_recv = Some(crate::ops::wrapped_post_recv);
        c.ops.poll_cq = Some(crate::ops::wrapped_poll_cq);
        c.ops.post_srq_recv = orig
            .post_srq_recv
            .map(|_| crate::ops::wrapped_post_srq_recv as PostSrqRecvFn);
        if vctx != 0 && orig_create_qp_ex.is_some() {
            // SAFETY: checked above that the verbs_context is large enough to hold this field.
            unsafe {
                (*(vctx as *mut verbs_context)).create_qp_ex =
                    Some(crate::engine::qp::wrapped_create_qp_ex);
            }
        }
        if vctx != 0 && orig_create_cq_ex.is_some() {
            // SAFETY: as above.
            unsafe {
                (*(vctx as *mut verbs_context)).create_cq_ex =
                    Some(crate::cq_ex::wrapped_create_cq_ex);
            }
        }
    }

    /// Called before the provider closes `ctx`: forgets what the application left open in it,
    /// then restores its operations.
    ///
    /// Closing a context with QPs and MRs still open is allowed (the kernel destroys them
    /// with it), but the library's records of them must go first, while the context is alive:
    /// a later eviction would otherwise deregister a window of a freed context, and their pins
    /// would stay counted against the budget.
    ///
    /// # Safety
    /// `ctx` is a live context about to be closed.
    pub(crate) unsafe fn on_close(&self, ctx: *mut ibv_context) {
        let c = ctx as usize;
        for q in registry::qps_of(self)
            .into_iter()
            .filter(|q| q.ctx.ctx == c)
        {
            self.on_destroy_qp(q.qp as *mut ibv_qp);
        }
        for s in registry::srqs_of(self).into_iter().filter(|s| s.ctx == c) {
            let windows = s.track.lock().drain();
            self.release(&windows);
        }
        let (regions, passthrough): (Vec<usize>, Vec<usize>) = {
            let st = lock(&self.state);
            (
                st.by_mr
                    .iter()
                    .filter(|(_, id)| st.regions.get(id).is_some_and(|r| r.ctx == c))
                    .map(|(mr, _)| *mr)
                    .collect(),
                st.passthrough_mrs.keys().copied().collect(),
            )
        };
        for mr in regions {
            // SAFETY: a live MR of the live context (the application registered it there and
            // has not deregistered it).
            if unsafe { self.dereg_mr(mr as *mut ibv_mr) } != 0 {
                self.forget_region_of_mr(mr);
            }
        }
        for mr in passthrough {
            // SAFETY: pass-through MRs in the map are live (removed at their deregistration).
            if unsafe { (*(mr as *mut ibv_mr)).context } as usize != c {
                continue;
            }
            let removed = lock(&self.state).passthrough_mrs.remove(&mr);
            if let Some(len) = removed {
                // Left to the kernel's cleanup at close, like the application's other objects.
                self.forget_mr(mr as *mut ibv_mr);
                self.counters()
                    .passthrough_bytes
                    .fetch_sub(len, Ordering::Relaxed);
            }
        }
        if let Some(rec) = registry::remove_ctx(c) {
            // SAFETY: still live (closed after this returns).
            unsafe {
                (*ctx).ops = rec.orig;
                if rec.vctx != 0 {
                    let v = rec.vctx as *mut verbs_context;
                    if rec.orig_create_qp_ex.is_some() {
                        (*v).create_qp_ex = rec.orig_create_qp_ex;
                    }
                    if rec.orig_create_cq_ex.is_some() {
                        (*v).create_cq_ex = rec.orig_create_cq_ex;
                    }
                }
            }
        }
        // A helper batch that may still use this context's objects has ended once the gate
        // is free: the provider's close comes after it.
        drop(lock(&self.helper_gate));
    }
}
