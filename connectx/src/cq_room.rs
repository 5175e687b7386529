//! Room in the application's CQs for the library's hidden completions.
//!
//! The library's own work requests (directory reads, lease requests, barriers) and the signals
//! it forces on unsignaled runs complete on the QP's send CQ, which the application sized for
//! its own completions only: without room for them a CQ sized exactly for the application
//! overruns (IBA vol. 1, §11.6.2: CQ overrun is an affiliated asynchronous error; the CQ and
//! its QPs are lost). So when a QP the library manages is created, its send CQ gets room for
//! the QP's send-queue depth as the provider granted it (widened by `Engine::widen_caps`):
//! every completion of that QP the application does not count belongs to a send-queue entry,
//! and an entry is free again only once its completion (or a later one) is polled, so that
//! many hidden completions at most are ever queued for it. The CQ is resized with
//! `ibv_resize_cq` to the size the application got plus the room of all its QPs (not its
//! current size plus the room: rxe rounds every size up to 2^n - 1, and growing the rounded
//! size again would double the CQ with every QP). The room goes when the QP is destroyed.
//! Where the device's `max_cqe` or the provider refuses, the CQ keeps its size, which is said
//! in the log and by `nprdma doctor`.
//!
//! The application sees the CQ's `cqe` as the provider reports it after the resize: a
//! provider may already round a CQ up (rxe adds one entry, mlx5 rounds to a power of two), so
//! `cqe` was never exactly the size asked for; `ibv_resize_cq` by the application itself works
//! on top of the library's room (its new size plus the room is asked for).

use core::ffi::c_int;
use std::sync::Mutex;

use crate::engine::Engine;
use crate::engine::call::{RealCall, lock};
use crate::engine::records::CtxRec;
use crate::fasthash::FastMap;
use crate::sys::*;

/// Per CQ, the size the application got (`cqe` before the library's first resize, or what
/// it last asked `ibv_resize_cq` for) and the room its managed QPs need; per QP, its CQ and
/// the room it needs.
#[derive(Default)]
struct Room {
    cqs: FastMap<usize, CqRoom>,
    qps: FastMap<usize, (usize, u32)>,
}

#[derive(Clone, Copy)]
struct CqRoom {
    base: u32,
    room: u32,
}

static ROOM: Mutex<Option<Room>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Room) -> T) -> T {
    f(lock(&ROOM).get_or_insert_with(Room::default))
}

/// Gives `cq` room for `hidden` more completions of the QP `qp` (just created on `rec`'s
/// context). The CQ is resized to its application size plus the room of all its QPs, only
/// when its current size is smaller: a provider that rounds up (rxe to 2^n - 1 entries)
/// may already have the room.
///
/// # Safety
/// `cq` is null or a live CQ of `rec`'s context.
pub(crate) unsafe fn add_qp(eng: &Engine, rec: &CtxRec, qp: usize, cq: *mut ibv_cq, hidden: u32) {
    if cq.is_null() || hidden == 0 {
        return;
    }
    // SAFETY: a live CQ.
    let cur = unsafe { (*cq).cqe }.max(0) as u32;
    let target = with(|r| {
        let c = r
            .cqs
            .entry(cq as usize)
            .or_insert(CqRoom { base: cur, room: 0 });
        c.room = c.room.saturating_add(hidden);
        r.qps.insert(qp, (cq as usize, hidden));
        c.base.saturating_add(c.room)
    });
    if cur >= target {
        return;
    }
    let want = target.min(rec.caps.max_cqe.max(cur));
    if want < target {
        eng.note("a completion queue could not be given room for the library's hidden completions (the device's max_cqe): an application that fills it exactly may see it overrun");
    }
    if want == cur {
        return;
    }
    // SAFETY: a live CQ; a larger size keeps every completion it holds.
    if unsafe { resize(eng, cq, want) } != 0 {
        eng.note("ibv_resize_cq refused to give a completion queue room for the library's hidden completions: an application that fills it exactly may see it overrun");
    }
}

/// Takes back the room a destroyed QP needed: the CQ shrinks to its application size when
/// none of its QPs needs room any more (best effort: a provider refuses a size below what the
/// CQ holds, and the CQ then keeps its size).
///
/// # Safety
/// `qp` was destroyed; its CQ, if recorded, is still live (a CQ cannot be destroyed while a QP
/// uses it).
pub(crate) unsafe fn remove_qp(eng: &Engine, qp: usize) {
    let Some((cq, base)) = with(|r| {
        let (cq, hidden) = r.qps.remove(&qp)?;
        let c = r.cqs.get_mut(&cq)?;
        c.room = c.room.saturating_sub(hidden);
        (c.room == 0).then_some((cq, c.base))
    }) else {
        return;
    };
    let cq = cq as *mut ibv_cq;
    // SAFETY: a live CQ (above).
    let cur = unsafe { (*cq).cqe }.max(0) as u32;
    if cur > base {
        // SAFETY: a live CQ; the provider refuses a size below what it holds.
        let _ = unsafe { resize(eng, cq, base) };
    }
}

/// The room the library keeps in `cq` (added to an application's own `ibv_resize_cq`).
pub(crate) fn room(cq: usize) -> u32 {
    with(|r| r.cqs.get(&cq).map_or(0, |c| c.room))
}

/// The application resized `cq` to `cqe` entries: its new application size.
pub(crate) fn resized(cq: usize, cqe: u32) {
    with(|r| {
        if let Some(c) = r.cqs.get_mut(&cq) {
            c.base = cqe;
        }
    });
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
