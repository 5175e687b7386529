//! Room in the application's CQs for the library's hidden completions.
//!
//! The library's own work requests (directory reads, lease requests, barriers) and the signals
//! it forces on unsignaled runs complete on the QP's send CQ, which the application sized for
//! its own completions only: without room for them a CQ sized exactly for the application
//! overruns (IBA vol. 1, §11.6.2: CQ overrun is an affiliated asynchronous error; the CQ and
//! its QPs are lost). So when a QP the library manages is created, its send CQ is grown with
//! `ibv_resize_cq` by the QP's send-queue depth as the provider granted it (widened by
//! `Engine::widen_caps`): every completion of that QP the application does not count belongs
//! to a send-queue entry, and an entry is free again only once its completion (or a later one)
//! is polled, so that many hidden completions at most are ever queued for it. The room goes
//! when the QP is destroyed. Where the device's `max_cqe` or the provider refuses, the CQ keeps
//! its size, which is said in the log and by `nprdma doctor`.
//!
//! The application sees the CQ's `cqe` as the provider reports it after the resize: a
//! provider may already round a CQ up (rxe adds one entry, mlx5 rounds to a power of two), so
//! `cqe` was never exactly the size asked for; `ibv_resize_cq` by the application itself works
//! on top of the library's room (its new size plus the room is asked for).

use core::ffi::c_int;
use std::sync::Mutex;

use crate::engine::{CtxRec, Engine, RealCall, lock};
use crate::fasthash::FastMap;
use crate::sys::*;

/// Per CQ, the entries the library added; per QP, its CQ and the entries it added.
#[derive(Default)]
struct Room {
    cqs: FastMap<usize, u32>,
    qps: FastMap<usize, (usize, u32)>,
}

static ROOM: Mutex<Option<Room>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Room) -> T) -> T {
    f(lock(&ROOM).get_or_insert_with(Room::default))
}

/// Grows `cq` by `hidden` entries for the QP `qp` (just created on `rec`'s context).
///
/// # Safety
/// `cq` is null or a live CQ of `rec`'s context.
pub(crate) unsafe fn add_qp(eng: &Engine, rec: &CtxRec, qp: usize, cq: *mut ibv_cq, hidden: u32) {
    if cq.is_null() || hidden == 0 {
        return;
    }
    // SAFETY: a live CQ.
    let cur = unsafe { (*cq).cqe }.max(0) as u32;
    let want = cur.saturating_add(hidden).min(rec.caps.max_cqe.max(cur));
    let added = want - cur;
    if added < hidden {
        eng.note("a completion queue could not be given room for the library's hidden completions (the device's max_cqe): an application that fills it exactly may see it overrun");
    }
    if added == 0 {
        return;
    }
    // SAFETY: a live CQ; a larger size keeps every completion it holds.
    if unsafe { resize(eng, cq, want) } != 0 {
        eng.note("ibv_resize_cq refused to give a completion queue room for the library's hidden completions: an application that fills it exactly may see it overrun");
        return;
    }
    with(|r| {
        *r.cqs.entry(cq as usize).or_insert(0) += added;
        r.qps.insert(qp, (cq as usize, added));
    });
}

/// Takes back the room a destroyed QP added to its CQ (best effort: a CQ that holds more
/// completions than the smaller size keeps its size).
///
/// # Safety
/// `qp` was destroyed; its CQ, if recorded, is still live (a CQ cannot be destroyed while a QP
/// uses it).
pub(crate) unsafe fn remove_qp(eng: &Engine, qp: usize) {
    let Some((cq, added)) = with(|r| {
        let (cq, added) = r.qps.remove(&qp)?;
        if let Some(n) = r.cqs.get_mut(&cq) {
            *n = n.saturating_sub(added);
        }
        Some((cq, added))
    }) else {
        return;
    };
    let cq = cq as *mut ibv_cq;
    // SAFETY: a live CQ (above).
    let cur = unsafe { (*cq).cqe }.max(0) as u32;
    if cur > added {
        // SAFETY: a live CQ; the provider refuses a size below what it holds.
        let _ = unsafe { resize(eng, cq, cur - added) };
    }
}

/// The entries the library added to `cq` (the application's `ibv_resize_cq` keeps them).
pub(crate) fn room(cq: usize) -> u32 {
    with(|r| r.cqs.get(&cq).copied().unwrap_or(0))
}

/// Forgets a destroyed CQ.
pub(crate) fn forget_cq(cq: usize) {
    with(|r| {
        r.cqs.remove(&cq);
        r.qps.retain(|_, (c, _)| *c != cq);
    });
}

/// # Safety
/// `cq` is a live CQ.
unsafe fn resize(eng: &Engine, cq: *mut ibv_cq, cqe: u32) -> c_int {
    let _g = RealCall::enter();
    // SAFETY: forwarded on a live CQ.
    unsafe { (eng.real.resize_cq)(cq, cqe.min(i32::MAX as u32) as c_int) }
}
