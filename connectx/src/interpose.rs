//! The interposed libibverbs entry points, as functions of an [`Engine`].
//!
//! The preloaded library exports the real symbol names (module `hooks`), each a one-line call
//! into these functions with the process's engine; tests call them with an engine over the fake
//! provider. Each function behaves like the libibverbs function of the same name, including its
//! error convention.

use core::ffi::{c_int, c_uint, c_void};
use std::sync::Arc;

use crate::config::Mode;
use crate::engine::Engine;
use crate::engine::call::{RealCall, in_real_call, set_errno};
use crate::engine::records::CtxRec;
use crate::registry;
use crate::sys::*;

/// `ibv_open_device`.
///
/// # Safety
/// As `ibv_open_device`.
pub unsafe fn open_device(eng: &Arc<Engine>, dev: *mut ibv_device) -> *mut ibv_context {
    let ctx = {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.open_device)(dev) }
    };
    if !ctx.is_null() && eng.cfg.mode != Mode::Off {
        // SAFETY: a context just opened.
        unsafe { eng.on_open(ctx) };
    }
    ctx
}

/// `ibv_close_device`.
///
/// # Safety
/// As `ibv_close_device`.
pub unsafe fn close_device(eng: &Arc<Engine>, ctx: *mut ibv_context) -> c_int {
    // SAFETY: a live context about to be closed.
    unsafe { eng.on_close(ctx) };
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    unsafe { (eng.real.close_device)(ctx) }
}

/// `ibv_reg_mr_iova2`, the registration all others reduce to.
///
/// # Safety
/// As `ibv_reg_mr_iova2`.
pub unsafe fn reg_mr_iova2(
    eng: &Arc<Engine>,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    if eng.cfg.mode == Mode::Off {
        // SAFETY: forwarded.
        return unsafe { eng.real_reg(pd, addr, len, iova, access) };
    }
    // SAFETY: a live PD.
    let ctx = unsafe { (*pd).context } as usize;
    match registry::ctx(ctx) {
        // SAFETY: a live PD of a context we manage.
        Some(rec) => unsafe { eng.reg_mr(&rec, pd, addr, len, iova, access) },
        None => {
            eng.note("a context opened without the library (e.g. mlx5dv_open_device): its registrations pass through");
            // SAFETY: forwarded.
            unsafe { eng.real_reg(pd, addr, len, iova, access) }
        }
    }
}

/// `ibv_reg_dmabuf_mr`: always passes through (device memory, not pageable process memory).
///
/// # Safety
/// As `ibv_reg_dmabuf_mr`.
pub unsafe fn reg_dmabuf_mr(
    eng: &Arc<Engine>,
    pd: *mut ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let Some(f) = eng.real.reg_dmabuf_mr else {
        set_errno(libc::EOPNOTSUPP);
        return core::ptr::null_mut();
    };
    if eng.cfg.mode != Mode::Off {
        eng.note("dmabuf region (ibv_reg_dmabuf_mr): device memory, pass-through");
    }
    let mr = {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { f(pd, offset, len, iova, fd, access) }
    };
    if !mr.is_null() {
        eng.counters()
            .passthrough_bytes
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        crate::engine::call::lock(&eng.state)
            .passthrough_mrs
            .insert(mr as usize, len as u64);
        // SAFETY: the provider's fresh MR.
        let lkey = unsafe { (*mr).lkey };
        eng.status().page().modes.add_mr(
            mr as usize,
            offset,
            len as u64,
            lkey,
            crate::status::MrMode::PassThrough,
        );
    }
    mr
}

/// `ibv_rereg_mr`.
///
/// # Safety
/// As `ibv_rereg_mr`.
pub unsafe fn rereg_mr(
    eng: &Arc<Engine>,
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    if !mr.is_null() && eng.owns_mr(mr) {
        // SAFETY: a virtual region of this engine.
        return unsafe { eng.rereg_mr(mr, flags, pd, addr, len, access) };
    }
    // An MR the ODP mode registered stays on demand (crate::odp).
    let access = if !mr.is_null() && eng.is_odp_mr(mr) {
        access | IBV_ACCESS_ON_DEMAND as c_int
    } else {
        access
    };
    let rc = {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.rereg_mr)(mr, flags, pd, addr, len, access) }
    };
    // A pass-through MR given a new translation changes size: keep doctor's count of
    // pass-through bytes right.
    if rc == 0 && flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 && !mr.is_null() {
        let old = crate::engine::call::lock(&eng.state)
            .passthrough_mrs
            .insert(mr as usize, len as u64);
        if let Some(old) = old {
            let bytes = &eng.counters().passthrough_bytes;
            bytes.fetch_sub(old, std::sync::atomic::Ordering::Relaxed);
            bytes.fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        } else {
            // Not one of ours (registered before the library was loaded): nothing counted.
            crate::engine::call::lock(&eng.state)
                .passthrough_mrs
                .remove(&(mr as usize));
        }
    }
    rc
}

/// `ibv_dereg_mr`.
///
/// # Safety
/// As `ibv_dereg_mr`.
pub unsafe fn dereg_mr(eng: &Arc<Engine>, mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: an MR of this process.
    unsafe { eng.dereg_mr(mr) }
}

/// The record of `pd`'s context if the library manages it (not off, not in pass-through).
///
/// # Safety
/// `pd` is null or a live PD.
unsafe fn managed_pd(eng: &Arc<Engine>, pd: *mut ibv_pd) -> Option<Arc<CtxRec>> {
    if pd.is_null() || eng.cfg.mode == Mode::Off {
        return None;
    }
    // SAFETY: a live PD (checked non-null).
    let ctx = unsafe { (*pd).context } as usize;
    registry::ctx(ctx).filter(|rec| rec.passthrough().is_none())
}

/// `ibv_create_qp`.
///
/// # Safety
/// As `ibv_create_qp`.
pub unsafe fn create_qp(
    eng: &Arc<Engine>,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let forward = |a: *mut ibv_qp_init_attr| {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.create_qp)(pd, a) }
    };
    // SAFETY: the application's PD.
    let Some(rec) = (unsafe { managed_pd(eng, pd) }).filter(|_| !attr.is_null()) else {
        return forward(attr);
    };
    // SAFETY: the application's attributes.
    let app = unsafe { *attr };
    let mut a = app;
    Engine::widen_caps(&rec, &mut a.cap);
    let mut qp = forward(&mut a);
    if qp.is_null() {
        a = app;
        qp = forward(&mut a);
    }
    if !qp.is_null() {
        // SAFETY: a QP just created on this context.
        unsafe {
            let shown = crate::engine::qp::report_caps(app.cap, a.cap);
            eng.on_create_qp(&rec, qp, a.cap, shown, a.sq_sig_all != 0, false);
            (*attr).cap = shown;
        }
    }
    qp
}

/// `ibv_destroy_qp`.
///
/// # Safety
/// As `ibv_destroy_qp`.
pub unsafe fn destroy_qp(eng: &Arc<Engine>, qp: *mut ibv_qp) -> c_int {
    let managed = eng.begin_destroy_qp(qp);
    let rc = {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.destroy_qp)(qp) }
    };
    if let Some(ctl) = managed {
        if rc == 0 {
            eng.finish_destroy_qp(ctl);
        } else {
            eng.abort_destroy_qp(ctl);
        }
    }
    rc
}

/// `ibv_modify_qp`.
///
/// # Safety
/// As `ibv_modify_qp`.
pub unsafe fn modify_qp(
    eng: &Arc<Engine>,
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    match registry::qp(qp as usize) {
        // SAFETY: a managed QP.
        Some(ctl) => unsafe { eng.modify_qp(&ctl, qp, attr, mask) },
        None => {
            let _g = RealCall::enter();
            // SAFETY: forwarded.
            unsafe { (eng.real.modify_qp)(qp, attr, mask) }
        }
    }
}

/// `ibv_query_qp`: what the provider reports, with the capabilities, access flags and
/// outstanding-read limits the application set where the library asked for more
/// ([`crate::engine::records::AppView`]).
///
/// # Safety
/// As `ibv_query_qp`.
pub unsafe fn query_qp(
    eng: &Arc<Engine>,
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let rc = {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.query_qp)(qp, attr, mask, init) }
    };
    if rc == 0
        && let Some(ctl) = registry::qp(qp as usize)
    {
        let view = *crate::engine::call::lock(&ctl.app_view);
        // SAFETY: the application's structs, just filled by the provider (null is left
        // alone).
        unsafe { view.apply(attr.as_mut(), init.as_mut()) };
    }
    rc
}

/// `ibv_resize_cq`: the application's new size, plus the room the library keeps in the CQ
/// for its hidden completions (module `cq_room`).
///
/// # Safety
/// As `ibv_resize_cq`.
pub unsafe fn resize_cq(eng: &Arc<Engine>, cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let room = crate::cq_room::room(cq as usize);
    let want = if cqe > 0 {
        cqe.saturating_add(room.min(i32::MAX as u32) as c_int)
    } else {
        cqe
    };
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    let mut rc = unsafe { (eng.real.resize_cq)(cq, want) };
    if rc != 0 && want != cqe {
        // Beyond the device's limit with the room: what the application asked for alone.
        // SAFETY: forwarded.
        rc = unsafe { (eng.real.resize_cq)(cq, cqe) };
    }
    if rc == 0 {
        crate::cq_room::resized(cq as usize, cqe.max(0) as u32);
    }
    rc
}

/// `ibv_destroy_cq`.
///
/// # Safety
/// As `ibv_destroy_cq`.
pub unsafe fn destroy_cq(eng: &Arc<Engine>, cq: *mut ibv_cq) -> c_int {
    // The record goes first: once the provider has freed the CQ, another thread may create
    // a new one at the same address, which must not find this record (it is put back if
    // the destroy fails).
    let rec = registry::remove_cq(cq as usize);
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    let rc = unsafe { (eng.real.destroy_cq)(cq) };
    if rc == 0 {
        crate::cq_room::forget_cq(cq as usize);
    }
    if rc != 0
        && let Some(rec) = rec
    {
        registry::restore_cq(cq as usize, rec);
    }
    rc
}

/// `ibv_create_srq`: with room for split receives, as for QPs ([`Engine::widen_caps`]).
///
/// # Safety
/// As `ibv_create_srq`.
pub unsafe fn create_srq(
    eng: &Arc<Engine>,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let forward = |a: *mut ibv_srq_init_attr| {
        let _g = RealCall::enter();
        // SAFETY: forwarded.
        unsafe { (eng.real.create_srq)(pd, a) }
    };
    // SAFETY: the application's PD.
    let Some(rec) = (unsafe { managed_pd(eng, pd) }).filter(|_| !attr.is_null()) else {
        return forward(attr);
    };
    // SAFETY: the application's attributes.
    let app = unsafe { *attr };
    let mut a = app;
    a.attr.max_sge = Engine::widen_sge(&rec, app.attr.max_sge);
    let mut srq = forward(&mut a);
    if srq.is_null() {
        a = app;
        srq = forward(&mut a);
    }
    if !srq.is_null() {
        // The application sees the limit it asked for (the room is the library's) and the
        // provider's other values.
        a.attr.max_sge = app.attr.max_sge.min(a.attr.max_sge);
        // SAFETY: the application's attributes, written back as the provider would.
        unsafe { *attr = a };
    }
    srq
}

/// `ibv_destroy_srq`.
///
/// # Safety
/// As `ibv_destroy_srq`.
pub unsafe fn destroy_srq(eng: &Arc<Engine>, srq: *mut ibv_srq) -> c_int {
    // As for CQs: the record goes before the provider frees the SRQ, so that a new SRQ at
    // the same address never records its receives in this one's record (whose windows are
    // released below).
    let rec = registry::remove_srq(srq as usize);
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    let rc = unsafe { (eng.real.destroy_srq)(srq) };
    match rec {
        Some(s) if rc == 0 => {
            let windows = s.track.lock().drain();
            eng.release(&windows);
        }
        Some(s) => registry::restore_srq(srq as usize, s),
        None => {}
    }
    rc
}

/// Whether a hook must forward untouched (we are inside a real libibverbs call).
pub(crate) fn nested() -> bool {
    in_real_call()
}

/// Puts a context the library manages in pass-through from now on (its application went
/// around the library, through direct verbs), saying why once in the log. Every later call on
/// it passes through unchanged, the held path's posts included.
pub fn enter_passthrough(ctx: *mut ibv_context, why: &'static str) {
    if let Some(rec) = registry::ctx(ctx as usize) {
        let _ = rec.passthrough.set(why);
        rec.engine.note(why);
    }
}
