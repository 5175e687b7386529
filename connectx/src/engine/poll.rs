//! Polling: the CQ records, what the application sees of each provider completion (the
//! completion rules of crate::completion applied to a QP's trackers), and polling a QP's CQs
//! while the library waits.

use core::ffi::c_int;
use std::sync::Arc;

use crate::completion::{NO_WAITER, Outcome};
use crate::engine::call::lock;
use crate::engine::cq_session::{CqExFns, Current, Held, Session};
use crate::engine::records::{CqCtl, CqInner, QpCtl};
use crate::registry;
use crate::spin::SpinLock;
use crate::sys::*;

/// The CQ record of `cq`, created on first use.
#[inline]
pub(crate) fn cq_ctl(cq: usize) -> Option<registry::Hot<CqCtl>> {
    registry::cq_or_insert(cq, || {
        // SAFETY: a live CQ the application or a QP refers to.
        let ctx = unsafe { (*(cq as *mut ibv_cq)).context } as usize;
        let rec = registry::ctx(ctx)?;
        Some(CqCtl {
            cq,
            ctx,
            ex: None,
            orig_poll: rec.orig.poll_cq?,
            stash: SpinLock::new(CqInner::default()),
        })
    })
}

/// Decides what the application sees of one provider completion; rewrites its `wr_id`.
/// Returns whether to deliver it.
#[inline]
pub(crate) fn process_wc(
    ctx: usize,
    wc: &mut ibv_wc,
    last: &mut Option<(u32, Arc<QpCtl>)>,
) -> bool {
    // Borrow the remembered QP rather than cloning its Arc (two atomic operations per
    // completion on the hot path).
    if !matches!(last, Some((n, _)) if *n == wc.qp_num) {
        match registry::qp_by_num(ctx, wc.qp_num) {
            registry::QpByNum::Live(q) => *last = Some((wc.qp_num, q)),
            registry::QpByNum::Destroyed(dead) => return process_wc_of_destroyed_qp(wc, &dead),
            registry::QpByNum::Unknown => return true,
        }
    }
    let Some((_, qpc)) = last.as_ref() else {
        return true;
    };
    translate_wc(qpc, wc)
}

/// [`process_wc`] for the QP `qpc` of the completion.
#[inline(always)]
fn translate_wc(qpc: &QpCtl, wc: &mut ibv_wc) -> bool {
    // A successful completion's opcode tells a receive from a send; an error completion's
    // opcode is undefined, so its wr_id decides: a receive record's, else the send side's
    // (a send the library did not record passes through unchanged).
    let receive = if wc.status == IBV_WC_SUCCESS {
        wc.opcode & IBV_WC_RECV != 0
    } else {
        qpc.owns_receive(wc.wr_id)
    };
    if receive {
        let found = if qpc.srq != 0 {
            registry::srq(qpc.srq).and_then(|s| s.track.lock().complete(wc.wr_id))
        } else {
            qpc.track.lock().recv.complete(wc.wr_id)
        };
        if let Some((wr_id, windows)) = found {
            qpc.engine.release(&windows);
            wc.wr_id = wr_id;
        }
        return true;
    }
    if !qpc.track.has_recorded_sends() {
        // A WR the library did not record (see TrackLock).
        return true;
    }
    let (released, outcome, byte_len) = {
        let mut t = qpc.track.lock();
        let (released, outcome) = t.send.complete(wc.wr_id, wc.status);
        (released, outcome, t.send.take_delivered_len())
    };
    if byte_len != 0 {
        wc.byte_len = byte_len;
    }

    qpc.engine.release(&released);
    match outcome {
        Outcome::Deliver { wr_id } => {
            wc.wr_id = wr_id;
            true
        }
        Outcome::Internal { token, status } => {
            if token != NO_WAITER {
                lock(&qpc.internal_done).insert(token, status);
            }
            false
        }
        Outcome::Suppress => false,
        Outcome::Unknown => true,
    }
}

/// [`process_wc`] for a completion of a QP destroyed with recorded WRs outstanding (some
/// providers leave such completions in the CQ): its records still tell the application's
/// `wr_id`s from the library's own WRs, and release the windows `on_destroy_qp` has not taken
/// yet. The record is never cached in the CQ (a new QP may get the same number), and is
/// forgotten once none of its WRs can complete any more.
#[cold]
fn process_wc_of_destroyed_qp(wc: &mut ibv_wc, dead: &Arc<QpCtl>) -> bool {
    let shown = translate_wc(dead, wc);
    if dead.track.lock().is_settled() {
        registry::forget_gone_qp(dead);
    }
    shown
}

/// Polls the provider for `cq` once (up to 16 completions), processing them into the stash.
/// Returns how many provider completions there were, or a negative provider error.
pub(crate) fn poll_into_stash(cqc: &CqCtl) -> c_int {
    let mut buf = [ibv_wc::default(); 16];
    let mut inner = cqc.stash.lock();
    if inner.ex.provider_open() {
        // An extended-CQ poll session holds the provider's CQ lock until its end_poll:
        // ibv_poll_cq now would wait for that lock. This thread's own session is moved on
        // through the session interface; another thread's session hands the library's
        // completions over itself (process_wc), and the waiter waits for it.
        if inner.ex.owned_here() {
            // SAFETY: locked record; this thread owns the open provider session.
            return unsafe { advance_own_session(cqc, &mut inner) };
        }
        return 0;
    }
    let CqInner { stash, last_qp, .. } = &mut *inner;
    // SAFETY: a live CQ and a buffer of 16 entries.
    let n = unsafe { (cqc.orig_poll)(cqc.cq as *mut ibv_cq, 16, buf.as_mut_ptr()) };
    for wc in buf.iter_mut().take(n.max(0) as usize) {
        if process_wc(cqc.ctx, wc, last_qp) {
            stash.push_back(*wc);
        }
    }
    n
}

impl QpCtl {
    /// Polls this QP's CQs once into their stashes; returns whether anything completed.
    pub(crate) fn poll_own_cqs(&self) -> bool {
        let mut any = false;
        for cq in [self.send_cq, self.recv_cq] {
            if cq == 0 {
                continue;
            }
            if let Some(c) = cq_ctl(cq)
                && poll_into_stash(&c) > 0
            {
                any = true;
            }
            if self.send_cq == self.recv_cq {
                break;
            }
        }
        any
    }

    /// Polls this QP's CQs on behalf of a thread that does not own the QP (to bring back
    /// windows it surrendered, [`Engine::revoke_holds`](crate::engine::Engine::revoke_holds)): only while the QP is registered and
    /// its posting side is free, which keeps the QP, and so its CQs, alive meanwhile
    /// (`on_destroy_qp` unregisters it, then takes that lock, before the provider destroys
    /// it). Returns whether anything completed.
    pub(crate) fn poll_for_others(self: &Arc<Self>) -> bool {
        let Some(_side) = self.send.try_lock() else {
            return false;
        };
        self.is_registered() && self.poll_own_cqs()
    }

    /// Whether this record is still the registry's for its QP (not being destroyed).
    pub(crate) fn is_registered(self: &Arc<Self>) -> bool {
        registry::qp(self.qp).is_some_and(|r| core::ptr::eq(&*r, Arc::as_ptr(self)))
    }

    /// Whether `wr_id` is that of a receive this QP (or its SRQ) has outstanding.
    fn owns_receive(&self, wr_id: u64) -> bool {
        if self.srq != 0 {
            registry::srq(self.srq).is_some_and(|s| s.track.lock().contains(wr_id))
        } else {
            self.track.lock().recv.contains(wr_id)
        }
    }
}

/// Shows a completion the library holds as the current one.
pub(crate) fn show_held(cq: *mut ibv_cq_ex, s: &mut Session, h: Held) {
    // SAFETY: the application's live CQ; these public fields are what the inline readers of
    // wr_id and status return.
    unsafe {
        (*cq).wr_id = h.wc.wr_id;
        (*cq).status = h.wc.status;
    }
    s.current = Current::Held(h);
}

/// Shows stashed completion `w` as the current one (a stashed `ibv_wc` has no timestamps).
pub(crate) fn show_stashed(cq: *mut ibv_cq_ex, s: &mut Session, w: ibv_wc) {
    show_held(
        cq,
        s,
        Held {
            wc: w,
            ..Held::default()
        },
    );
}

/// Everything the provider can say of its current completion.
///
/// # Safety
/// A provider session is open on `cq` and has a current completion.
pub(crate) unsafe fn provider_full(cq: *mut ibv_cq_ex, fns: &CqExFns) -> Held {
    // SAFETY: per the contract: the provider's own readers on its current completion.
    unsafe {
        let u32_of = |f: Option<CqExReadU32>| f.map_or(0, |g| g(cq));
        Held {
            wc: ibv_wc {
                wr_id: (*cq).wr_id,
                status: (*cq).status,
                opcode: u32_of(fns.read_opcode),
                vendor_err: u32_of(fns.read_vendor_err),
                byte_len: u32_of(fns.read_byte_len),
                imm_data: u32_of(fns.read_imm_data),
                qp_num: u32_of(fns.read_qp_num),
                src_qp: u32_of(fns.read_src_qp),
                wc_flags: u32_of(fns.read_wc_flags),
                pkey_index: 0,
                slid: u32_of(fns.read_slid) as u16,
                sl: fns.read_sl.map_or(0, |g| g(cq)),
                dlid_path_bits: fns.read_dlid_path_bits.map_or(0, |g| g(cq)),
            },
            ts: fns.read_completion_ts.map_or(0, |g| g(cq)),
            wallclock_ns: fns.read_completion_wallclock_ns.map_or(0, |g| g(cq)),
            cvlan: fns.read_cvlan.map_or(0, |g| g(cq)),
            flow_tag: u32_of(fns.read_flow_tag),
        }
    }
}

/// The library needs completions while the calling thread itself holds the provider's
/// session (it posts from inside its poll loop, and a first touch waits for the library's own
/// WRs): moves the provider's session forward through the session interface, stashing the
/// application's completions and handing over the library's. What the application was looking
/// at is kept, field by field, and stays what its readers return. Returns how many provider
/// completions it took.
///
/// # Safety
/// `inner` is `cqc`'s, locked; the calling thread owns the open provider session.
pub(crate) unsafe fn advance_own_session(cqc: &CqCtl, inner: &mut CqInner) -> c_int {
    let Some(fns) = cqc.ex else {
        return 0;
    };
    let cq = cqc.cq as *mut ibv_cq_ex;
    let shown = match inner.ex.current {
        // SAFETY: the provider's session is open on its current completion (whose wr_id
        // was already turned into the application's).
        Current::Provider => unsafe { provider_full(cq, &fns) },
        Current::Held(h) => h,
        Current::Idle => Held::default(),
    };
    let was_idle = matches!(inner.ex.current, Current::Idle);
    let mut taken = 0;
    while taken < 16 {
        // SAFETY: the provider's session is open (owned by this thread).
        if unsafe { (fns.next_poll)(cq) } != 0 {
            break;
        }
        taken += 1;
        // SAFETY: the session has a current completion.
        let mut h = unsafe { provider_full(cq, &fns) };
        if process_wc(cqc.ctx, &mut h.wc, &mut inner.last_qp) {
            inner.stash.push_back(h.wc);
        }
    }
    if !was_idle {
        // Even a next_poll that found nothing moved the provider past what the application
        // is looking at (and may have rewritten the CQ's public wr_id and status).
        show_held(cq, &mut inner.ex, shown);
    }
    taken
}
