//! Receives: each application receive WR is planned over its windows (or pinned as plain verbs
//! would pin it, crate::fallback), recorded and posted, on a QP or an SRQ.

use core::ffi::c_int;
use std::sync::Arc;

use crate::completion::WinList;
use crate::engine::Engine;
use crate::engine::call::lock;
use crate::engine::records::QpCtl;
use crate::engine::windows::{acquire_after_revoking_holds, acquire_recv_windows};
use crate::sys::*;
use crate::translate::{PlannedSge, RemoteClass, SgeClass};

impl QpCtl {
    /// Translates and posts a list of receive WRs (on this QP, or on `srq`'s tracker).
    ///
    /// # Safety
    /// `wr` is the application's well-formed list; `bad` is writable.
    pub(crate) unsafe fn post_recv_list(
        &self,
        wr: *mut ibv_recv_wr,
        bad: *mut *mut ibv_recv_wr,
    ) -> c_int {
        let Some(post) = self.ctx.orig.post_recv else {
            return libc::EOPNOTSUPP;
        };
        let qp = self.qp as *mut ibv_qp;
        // SAFETY: a live QP and a well-formed list (built by post_recv_common).
        let poster = |w, b| unsafe { post(qp, w, b) };
        // SAFETY: forwarded contract.
        unsafe {
            post_recv_common(
                &self.engine,
                self.ctx.ctx,
                self.max_recv_sge,
                |wr_id, w| {
                    let mut t = self.track.lock();
                    let seq = t.recv.record(wr_id, w);
                    (seq, t.recv.wr_id_of(seq))
                },
                |seq| self.track.lock().recv.unrecord(seq),
                poster,
                wr,
                bad,
            )
        }
    }
}

/// Shared receive-posting logic of QPs and SRQs.
///
/// # Safety
/// `wr` is the application's well-formed list; `bad` is writable; `post` posts to the queue.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn post_recv_common(
    engine: &Arc<Engine>,
    ctx: usize,
    max_sge: usize,
    record: impl Fn(u64, WinList) -> (u64, u64),
    unrecord: impl Fn(u64) -> WinList,
    post: impl Fn(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let mut wrs: Vec<ibv_recv_wr> = Vec::new();
    let mut sges: Vec<Vec<ibv_sge>> = Vec::new();
    let mut apps: Vec<*mut ibv_recv_wr> = Vec::new();
    let mut seqs: Vec<u64> = Vec::new();
    let mut cur = wr;
    let mut fail: Option<(c_int, *mut ibv_recv_wr)> = None;
    while !cur.is_null() {
        // SAFETY: an element of the application's list.
        let app = unsafe { *cur };
        let n = app.num_sge.max(0) as usize;
        // Every application SGE becomes at least one SGE of the provider's WR, so a count
        // above the limit fails anyway; refuse it before reading the list, as the providers
        // do (rxe, mlx5), so that a bogus count cannot make the library read past the array.
        if n > max_sge {
            fail = Some((libc::EINVAL, cur));
            break;
        }
        let app_sges: &[ibv_sge] = if n == 0 || app.sg_list.is_null() {
            &[]
        } else {
            // SAFETY: the application's SGE array of `num_sge` entries.
            unsafe { core::slice::from_raw_parts(app.sg_list, n) }
        };
        let planned: Vec<PlannedSge> = {
            let st = lock(&engine.state);
            let mut v = Vec::new();
            for s in app_sges {
                let class = match st
                    .by_lkey
                    .get(&(ctx, s.lkey))
                    .and_then(|id| st.regions.get(id))
                {
                    Some(r) if s.length > 0 && r.geom.contains(s.addr, u64::from(s.length)) => {
                        SgeClass::Virtual {
                            addr: s.addr,
                            len: s.length,
                            region: r.id,
                            geom: r.geom,
                        }
                    }
                    Some(r) if s.length > 0 => SgeClass::Keep(ibv_sge {
                        addr: r.poison_addr(),
                        length: s.length,
                        lkey: s.lkey,
                    }),
                    _ => SgeClass::Keep(*s),
                };
                match crate::translate::plan(&[class], RemoteClass::None, false, usize::MAX) {
                    Ok(parts) => v.extend(parts.into_iter().flat_map(|p| p.sges)),
                    Err(_) => v.push(PlannedSge::Keep(*s)),
                }
            }
            v
        };
        // Windows that cannot serve the receive (more pieces than SGEs, or no room in the
        // budget) give way to pinning its ranges as plain verbs would (fallback.rs).
        let (sg, windows) = if planned.len() > max_sge {
            engine.pin_sges(
                ctx,
                app_sges,
                "a receive spanning more windows than its SGE limit was pinned as plain verbs would pin it",
            )
        } else {
            let mut windows = acquire_recv_windows(engine, &planned);
            if windows.is_none() {
                windows = acquire_after_revoking_holds(engine, &planned);
            }
            match windows {
                Some(w) => w,
                None => engine.pin_sges(
                    ctx,
                    app_sges,
                    "pinned-memory budget full of windows in use: a receive was pinned as plain verbs would pin it (outside the budget)",
                ),
            }
        };
        let (seq, wr_id) = record(app.wr_id, windows);
        let mut w = app;
        w.wr_id = wr_id;
        w.next = core::ptr::null_mut();
        wrs.push(w);
        sges.push(sg);
        apps.push(cur);
        seqs.push(seq);
        cur = app.next;
    }
    let n = wrs.len();
    if n > 0 {
        let base = wrs.as_mut_ptr();
        for i in 0..n {
            wrs[i].sg_list = sges[i].as_mut_ptr();
            wrs[i].num_sge = sges[i].len() as c_int;
            wrs[i].next = if i + 1 < n {
                // SAFETY: inside the vector.
                unsafe { base.add(i + 1) }
            } else {
                core::ptr::null_mut()
            };
        }
        let mut badp: *mut ibv_recv_wr = core::ptr::null_mut();
        let rc = post(base, &mut badp);
        if rc != 0 {
            let idx = if badp.is_null() {
                0
            } else {
                ((badp as usize).wrapping_sub(base as usize) / core::mem::size_of::<ibv_recv_wr>())
                    .min(n - 1)
            };
            for seq in &seqs[idx..] {
                let w = unrecord(*seq);
                engine.release(&w);
            }
            // SAFETY: `bad` is writable.
            unsafe { *bad = apps[idx] };
            return rc;
        }
    }
    match fail {
        Some((e, at)) => {
            // SAFETY: `bad` is writable.
            unsafe { *bad = at };
            e
        }
        None => 0,
    }
}
