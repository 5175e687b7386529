//! Polling: the CQ records, what the application sees of each provider completion (the
//! completion rules of crate::completion applied to a QP's trackers), and polling a QP's CQs
//! while the library waits.

use core::ffi::c_int;
use std::sync::Arc;

use crate::completion::{NO_WAITER, Outcome};
use crate::engine::call::lock;
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
            return unsafe { crate::cq_ex::advance_own_session(cqc, &mut inner) };
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
    /// windows it surrendered, [`Engine::revoke_holds`]): only while the QP is registered and
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
