//! Extended CQs (`ibv_create_cq_ex`): the same completion rules as `ibv_poll_cq`
//! (completion.rs) behind the poll-session interface.
//!
//! `ibv_start_poll`, `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` functions are
//! inline functions of verbs.h that call through the `ibv_cq_ex`'s own pointers, so the
//! library replaces those pointers when the CQ is created (through `verbs_context::
//! create_cq_ex`, which the inline `ibv_create_cq_ex` calls). A session then shows, in
//! order, first the completions the library stashed while it waited for its own work
//! requests (answered from the stored `ibv_wc`), then the provider's, with the library's
//! sequence numbers turned back into the application's `wr_id`s and the library's own
//! completions skipped.
//!
//! The library asks the provider for `IBV_WC_EX_WITH_QP_NUM` on top of the application's flags:
//! it needs the QP of every completion. Stashed completions have no timestamps (the stash
//! holds `ibv_wc`s): their timestamp readers return 0.

use core::ffi::{c_int, c_void};

use crate::engine::cq_session::{CqExFns, Current, Held, Session};
use crate::engine::poll::{process_wc, show_stashed};
use crate::engine::records::{CqCtl, CqInner};
use crate::registry;
use crate::sys::*;

/// `verbs_context::create_cq_ex`.
///
/// # Safety
/// Called by the inline `ibv_create_cq_ex` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    crate::ops::guarded(core::ptr::null_mut(), || {
        let Some(rec) = registry::ctx(ctx as usize) else {
            crate::engine::call::set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        let Some(orig) = rec.orig_create_cq_ex else {
            crate::engine::call::set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        };
        if attr.is_null() || rec.passthrough().is_some() {
            // SAFETY: forwarded unchanged.
            return unsafe { orig(ctx, attr) };
        }
        // SAFETY: the application's attributes, read and passed on as a copy.
        let mut a = unsafe { *attr };
        a.wc_flags |= IBV_WC_EX_WITH_QP_NUM;
        // SAFETY: a valid attribute copy.
        let mut cq = unsafe { orig(ctx, &mut a) };
        if cq.is_null() {
            // SAFETY: as asked (the provider refused the extra flag).
            cq = unsafe { orig(ctx, attr) };
        }
        if cq.is_null() {
            return cq;
        }
        // SAFETY: a CQ just created by the provider, not yet seen by the application.
        unsafe { wrap(&rec, cq) };
        cq
    })
}

/// Replaces the poll functions of `cq` and records the provider's.
///
/// # Safety
/// `cq` is a live extended CQ of `rec`'s context that the application has not used yet.
unsafe fn wrap(rec: &crate::engine::records::CtxRec, cq: *mut ibv_cq_ex) {
    // SAFETY: per the contract.
    let c = unsafe { &mut *cq };
    let (Some(start_poll), Some(next_poll), Some(end_poll), Some(orig_poll)) =
        (c.start_poll, c.next_poll, c.end_poll, rec.orig.poll_cq)
    else {
        crate::log::once(
            "an extended CQ without poll functions is left alone: completions of managed QPs on it carry the library's sequence numbers",
        );
        return;
    };
    if c.read_qp_num.is_none() {
        crate::log::once(
            "an extended CQ cannot report QP numbers: its completions are passed on unchanged",
        );
    }
    let fns = CqExFns {
        start_poll,
        next_poll,
        end_poll,
        read_opcode: c.read_opcode,
        read_vendor_err: c.read_vendor_err,
        read_byte_len: c.read_byte_len,
        read_imm_data: c.read_imm_data,
        read_qp_num: c.read_qp_num,
        read_src_qp: c.read_src_qp,
        read_wc_flags: c.read_wc_flags,
        read_slid: c.read_slid,
        read_sl: c.read_sl,
        read_dlid_path_bits: c.read_dlid_path_bits,
        read_completion_ts: c.read_completion_ts,
        read_cvlan: c.read_cvlan,
        read_flow_tag: c.read_flow_tag,
        read_tm_info: c.read_tm_info,
        read_completion_wallclock_ns: c.read_completion_wallclock_ns,
    };
    let made = registry::cq_or_insert(cq as usize, || {
        Some(CqCtl {
            cq: cq as usize,
            ctx: rec.ctx,
            orig_poll,
            ex: Some(fns),
            stash: crate::spin::SpinLock::new(CqInner::default()),
        })
    });
    if made.is_none() {
        return;
    }
    c.start_poll = Some(start_poll_w);
    c.next_poll = Some(next_poll_w);
    c.end_poll = Some(end_poll_w);
    // Readers the provider has: the application may only call those (as with plain verbs).
    macro_rules! wrap_reader {
        ($($f:ident => $w:ident),* $(,)?) => {
            $(if c.$f.is_some() {
                c.$f = Some($w);
            })*
        };
    }
    wrap_reader!(
        read_opcode => read_opcode_w,
        read_vendor_err => read_vendor_err_w,
        read_byte_len => read_byte_len_w,
        read_imm_data => read_imm_data_w,
        read_qp_num => read_qp_num_w,
        read_src_qp => read_src_qp_w,
        read_wc_flags => read_wc_flags_w,
        read_slid => read_slid_w,
        read_sl => read_sl_w,
        read_dlid_path_bits => read_dlid_path_bits_w,
        read_completion_ts => read_completion_ts_w,
        read_cvlan => read_cvlan_w,
        read_flow_tag => read_flow_tag_w,
        read_tm_info => read_tm_info_w,
        read_completion_wallclock_ns => read_completion_wallclock_ns_w,
    );
}

/// The provider's current completion as an `ibv_wc` with what the completion rules need.
///
/// # Safety
/// A provider session is open on `cq` and has a current completion.
unsafe fn provider_current(cq: *mut ibv_cq_ex, fns: &CqExFns) -> ibv_wc {
    // SAFETY: per the contract.
    unsafe {
        let status = (*cq).status;
        ibv_wc {
            wr_id: (*cq).wr_id,
            status,
            // A successful completion's opcode tells a receive from a send (process_wc); an
            // error completion's is undefined and not read.
            opcode: match fns.read_opcode {
                Some(f) if status == IBV_WC_SUCCESS => f(cq),
                _ => 0,
            },
            qp_num: fns.read_qp_num.map_or(0, |f| f(cq)),
            ..Default::default()
        }
    }
}

/// Moves the provider's session to the next completion the application should see, starting
/// at the current one. Returns 0 with it shown, or the provider's `next_poll` result (ENOENT
/// when it ran out).
///
/// # Safety
/// A provider session is open on `cq` with a current completion; `cqc` is its record.
unsafe fn settle_provider(
    cq: *mut ibv_cq_ex,
    cqc: &CqCtl,
    fns: &CqExFns,
    inner: &mut CqInner,
) -> c_int {
    loop {
        // SAFETY: per the contract.
        let mut w = unsafe { provider_current(cq, fns) };
        let known = fns.read_qp_num.is_some();
        if !known || process_wc(cqc.ctx, &mut w, &mut inner.last_qp) {
            // SAFETY: the application's CQ; the rewritten wr_id is what it should read.
            unsafe { (*cq).wr_id = w.wr_id };
            inner.ex.current = Current::Provider;
            return 0;
        }
        // The library's own, or a part of a split WR: not shown.
        // SAFETY: the provider session is open.
        let rc = unsafe { (fns.next_poll)(cq) };
        if rc != 0 {
            inner.ex.current = Current::Idle;
            return rc;
        }
    }
}

/// Starts the provider's session (for a session that began with stashed completions) and
/// settles on its first completion the application should see.
///
/// # Safety
/// `cq` is the live extended CQ of `cqc`; no provider session is open.
unsafe fn open_provider(
    cq: *mut ibv_cq_ex,
    cqc: &CqCtl,
    fns: &CqExFns,
    inner: &mut CqInner,
) -> c_int {
    let mut attr = inner.ex.attr;
    // SAFETY: per the contract.
    let rc = unsafe { (fns.start_poll)(cq, &mut attr) };
    if rc != 0 {
        inner.ex.current = Current::Idle;
        return rc;
    }
    inner.ex.provider_open = true;
    // SAFETY: the provider's session is open with a current completion.
    unsafe { settle_provider(cq, cqc, fns, inner) }
}

unsafe extern "C" fn start_poll_w(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> c_int {
    crate::ops::guarded(libc::EIO, || {
        let Some(cqc) = crate::engine::poll::cq_ctl(cq as usize) else {
            return libc::EINVAL;
        };
        let Some(fns) = cqc.ex else {
            return libc::EINVAL;
        };
        let attr = if attr.is_null() {
            ibv_poll_cq_attr::default()
        } else {
            // SAFETY: the application's attributes.
            unsafe { *attr }
        };
        let mut guard = cqc.stash.lock();
        let inner = &mut *guard;
        if inner.ex.provider_open {
            // start_poll again without end_poll (the application's error, which would hang a
            // provider on its own CQ lock): end the open session first.
            crate::log::once("ibv_start_poll inside an open poll session: the old one was ended");
            // SAFETY: the provider's session is open.
            unsafe { (fns.end_poll)(cq) };
        }
        inner.ex = Session {
            active: true,
            current: Current::Idle,
            provider_open: false,
            owner: crate::engine::call::this_thread(),
            attr,
        };
        if let Some(w) = inner.stash.pop_front() {
            show_stashed(cq, &mut inner.ex, w);
            return 0;
        }
        // SAFETY: the live CQ of this record, no session open.
        let rc = unsafe { open_provider(cq, &cqc, &fns, inner) };
        inner.ex.active = rc == 0;
        if rc != 0 && inner.ex.provider_open {
            // Everything the provider had was the library's: the session ends here, and the
            // application (told ENOENT) will not call end_poll.
            // SAFETY: the provider's session is open.
            unsafe { (fns.end_poll)(cq) };
            inner.ex.provider_open = false;
        }
        rc
    })
}

unsafe extern "C" fn next_poll_w(cq: *mut ibv_cq_ex) -> c_int {
    crate::ops::guarded(libc::EIO, || {
        let Some(cqc) = crate::engine::poll::cq_ctl(cq as usize) else {
            return libc::EINVAL;
        };
        let Some(fns) = cqc.ex else {
            return libc::EINVAL;
        };
        let mut guard = cqc.stash.lock();
        let inner = &mut *guard;
        if !inner.ex.active {
            // next_poll outside a session (after ENOENT from start_poll, or after end_poll):
            // the application's error; refused without touching the provider's lock.
            crate::log::once("ibv_next_poll outside a poll session: refused with EINVAL");
            return libc::EINVAL;
        }
        // Stashed completions are older than anything the provider still has.
        if let Some(w) = inner.stash.pop_front() {
            show_stashed(cq, &mut inner.ex, w);
            return 0;
        }
        if !inner.ex.provider_open {
            // SAFETY: the live CQ of this record, no provider session open.
            return unsafe { open_provider(cq, &cqc, &fns, inner) };
        }
        // SAFETY: the provider's session is open.
        let rc = unsafe { (fns.next_poll)(cq) };
        if rc != 0 {
            inner.ex.current = Current::Idle;
            return rc;
        }
        // SAFETY: the provider's session is open with a current completion.
        unsafe { settle_provider(cq, &cqc, &fns, inner) }
    })
}

unsafe extern "C" fn end_poll_w(cq: *mut ibv_cq_ex) {
    crate::ops::guarded((), || {
        let Some(cqc) = crate::engine::poll::cq_ctl(cq as usize) else {
            return;
        };
        let Some(fns) = cqc.ex else {
            return;
        };
        let mut inner = cqc.stash.lock();
        if inner.ex.provider_open {
            // SAFETY: the provider's session is open.
            unsafe { (fns.end_poll)(cq) };
        }
        inner.ex = Session::default();
    })
}

/// Answers a reader: from the completion the library holds, or from the provider.
fn read<T: Default>(
    cq: *mut ibv_cq_ex,
    held: impl FnOnce(&Held) -> T,
    provider: impl FnOnce(&CqExFns) -> Option<T>,
) -> T {
    crate::ops::guarded(T::default(), || {
        let Some(cqc) = crate::engine::poll::cq_ctl(cq as usize) else {
            return T::default();
        };
        let Some(fns) = cqc.ex else {
            return T::default();
        };
        let current = cqc.stash.lock().ex.current;
        match current {
            Current::Held(h) => held(&h),
            Current::Provider | Current::Idle => provider(&fns).unwrap_or_default(),
        }
    })
}

macro_rules! reader {
    ($name:ident, $field:ident, $ty:ty, |$w:ident| $from_wc:expr) => {
        unsafe extern "C" fn $name(cq: *mut ibv_cq_ex) -> $ty {
            read(
                cq,
                |$w| $from_wc,
                // SAFETY: the provider's reader, on its CQ, inside the application's session.
                |f| f.$field.map(|g| unsafe { g(cq) }),
            )
        }
    };
}

reader!(read_opcode_w, read_opcode, u32, |h| h.wc.opcode);
reader!(read_vendor_err_w, read_vendor_err, u32, |h| h.wc.vendor_err);
reader!(read_byte_len_w, read_byte_len, u32, |h| h.wc.byte_len);
reader!(read_imm_data_w, read_imm_data, u32, |h| h.wc.imm_data);
reader!(read_qp_num_w, read_qp_num, u32, |h| h.wc.qp_num);
reader!(read_src_qp_w, read_src_qp, u32, |h| h.wc.src_qp);
reader!(read_wc_flags_w, read_wc_flags, u32, |h| h.wc.wc_flags);
reader!(read_slid_w, read_slid, u32, |h| u32::from(h.wc.slid));
reader!(read_sl_w, read_sl, u8, |h| h.wc.sl);
reader!(read_dlid_path_bits_w, read_dlid_path_bits, u8, |h| h
    .wc
    .dlid_path_bits);
reader!(read_completion_ts_w, read_completion_ts, u64, |h| h.ts);
reader!(read_cvlan_w, read_cvlan, u16, |h| h.cvlan);
reader!(read_flow_tag_w, read_flow_tag, u32, |h| h.flow_tag);
reader!(
    read_completion_wallclock_ns_w,
    read_completion_wallclock_ns,
    u64,
    |h| h.wallclock_ns
);

/// `struct ibv_wc_tm_info` (verbs.h): a 64-bit tag and a 32-bit private word.
const TM_INFO_BYTES: usize = 16;

unsafe extern "C" fn read_tm_info_w(cq: *mut ibv_cq_ex, info: *mut c_void) {
    let stashed = read(
        cq,
        |_| true,
        |f| {
            if let Some(g) = f.read_tm_info {
                // SAFETY: the provider's reader with the application's output struct.
                unsafe { g(cq, info) };
            }
            Some(false)
        },
    );
    if stashed && !info.is_null() {
        // SAFETY: the application's `struct ibv_wc_tm_info`; a stashed completion has none.
        unsafe { core::ptr::write_bytes(info.cast::<u8>(), 0, TM_INFO_BYTES) };
    }
}
