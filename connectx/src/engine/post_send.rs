//! The general send path: each application WR is classified, planned (crate::translate),
//! given its peer leases and local windows, split where it must be, recorded and batched.

use core::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::completion::{Origin, WinList};
use crate::engine::State;
use crate::engine::call::lock;
use crate::engine::records::{Batch, PostFail, QpCtl, SendSide};
use crate::engine::warm::{FastWr, is_atomic};
use crate::sys::*;
use crate::translate::{PlanError, PlannedRemote, PlannedSge, RemoteClass, SgeClass};

impl QpCtl {
    /// Classifies an application SGE.
    fn classify_sge(&self, st: &State, sge: &ibv_sge, inline: bool) -> SgeClass {
        if inline || sge.length == 0 {
            return SgeClass::Keep(*sge);
        }
        let Some(id) = st.by_lkey.get(&(self.ctx.ctx, sge.lkey)) else {
            return SgeClass::Keep(*sge);
        };
        let Some(r) = st.regions.get(id) else {
            return SgeClass::Keep(*sge);
        };
        if r.geom.contains(sge.addr, u64::from(sge.length)) {
            SgeClass::Virtual {
                addr: sge.addr,
                len: sge.length,
                region: r.id,
                geom: r.geom,
            }
        } else {
            // Outside the region: point it past the directory so the NIC reports the local
            // protection error plain verbs would report.
            SgeClass::Keep(ibv_sge {
                addr: r.poison_addr(),
                length: sge.length,
                lkey: sge.lkey,
            })
        }
    }

    /// Translates and posts a list of application send WRs. Returns 0 or an errno with
    /// `*bad` set.
    ///
    /// # Safety
    /// `wr` is the application's well-formed list; `bad` is writable.
    #[inline(always)]
    pub(crate) unsafe fn post_send_list(
        &self,
        side: &mut SendSide,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        if !wr.is_null() {
            // SAFETY: the head of the application's list; forwarded contract.
            if let Some(rc) = unsafe { self.try_post_held(side, &*wr, wr, bad) } {
                return rc;
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_send_list_general(side, wr, bad) }
    }

    /// [`post_send_list`](Self::post_send_list) past the held-window path (out of line: the
    /// held path stays small where it is inlined).
    ///
    /// # Safety
    /// As `post_send_list`.
    #[inline(never)]
    unsafe fn post_send_list_general(
        &self,
        side: &mut SendSide,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        // The common warm case, one WR that the fast path can translate, is posted straight
        // from the stack: no batch to fill, link and clear.
        if !wr.is_null() && side.batch.is_empty() {
            // SAFETY: the head of the application's list (read in place, not copied).
            let app = unsafe { &*wr };
            let mut fast = FastWr::new();
            if app.next.is_null() && self.fast_build(side, app, &mut fast) {
                // SAFETY: forwarded contract.
                return unsafe { self.post_one(&mut fast, wr, bad) };
            }
        }
        // Reuse the QP's vectors (no allocation on a warm path); put them back afterwards.
        let mut batch = std::mem::take(&mut side.batch);
        batch.clear();
        // SAFETY: forwarded contract.
        let rc = unsafe { self.post_send_list_with(side, &mut batch, wr, bad) };
        batch.clear();
        side.batch = batch;
        rc
    }

    /// [`post_send_list`](Self::post_send_list) with a given batch.
    ///
    /// # Safety
    /// As `post_send_list`.
    pub(super) unsafe fn post_send_list_with(
        &self,
        side: &mut SendSide,
        batch: &mut Batch,
        wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: an element of the application's list.
            let app = unsafe { *cur };
            match self.translate_send(side, &app, cur as usize, batch) {
                Ok(()) => {}
                Err(PostFail::Errno(e, at)) => {
                    let at = if at == 0 { cur as usize } else { at };
                    if let Err(PostFail::Errno(e2, at2)) = self.flush(batch) {
                        // SAFETY: `bad` is writable.
                        unsafe { *bad = at2 as *mut ibv_send_wr };
                        return e2;
                    }
                    // SAFETY: as above.
                    unsafe { *bad = at as *mut ibv_send_wr };
                    return e;
                }
                Err(PostFail::Status(status)) => {
                    // The library could not carry this WR out: fail it like the provider would
                    // have and put the QP in error; later WRs are flushed by the provider.
                    if let Err(PostFail::Errno(e2, at2)) = self.flush(batch) {
                        // SAFETY: `bad` is writable.
                        unsafe { *bad = at2 as *mut ibv_send_wr };
                        return e2;
                    }
                    self.settle_send_queue(Duration::from_secs(2));
                    self.force_error();

                    self.synthesize(app.wr_id, app.opcode, status);
                }
            }
            cur = app.next;
        }
        match self.flush(batch) {
            Ok(()) => 0,
            Err(PostFail::Errno(e, at)) => {
                // SAFETY: `bad` is writable.
                unsafe { *bad = at as *mut ibv_send_wr };
                e
            }
            Err(PostFail::Status(_)) => libc::EIO,
        }
    }

    /// A WRITE_WITH_IMM planned as several WRs because its local pieces exceed the QP's SGE
    /// limit becomes one WR again over its ranges pinned as plain verbs would pin them: the
    /// responder's completion reports the length of the last WRITE_WITH_IMM only, so a split
    /// would show the receiving application a `byte_len` plain verbs never show. A split
    /// across the peer's windows (a peer running the library) stays: no one remote key covers
    /// it (docs/connectx.md §6).
    fn one_write_with_imm(
        &self,
        parts: Vec<crate::translate::PlannedPart>,
        app_sges: &[ibv_sge],
        total: u64,
        pins: &mut WinList,
    ) -> Vec<crate::translate::PlannedPart> {
        let same_target = match (parts[0].remote, parts[parts.len() - 1].remote) {
            (Some(PlannedRemote::Keep { .. }), _) | (None, _) => true,
            (
                Some(PlannedRemote::Window { index: a, .. }),
                Some(PlannedRemote::Window { index: b, .. }),
            ) => a == b,
            _ => false,
        };
        if !same_target {
            self.engine.note("a WRITE_WITH_IMM across a peer's windows was split: the receiver's byte_len shows its last part only");
            return parts;
        }
        let remote = parts[0].remote;
        let (sges, p) = self.engine.pin_sges(
            self.ctx.ctx,
            app_sges,
            "a WRITE_WITH_IMM spanning more windows than its SGE limit was pinned as plain verbs would pin it (one WR, so the receiver's byte_len is the whole length)",
        );
        *pins = p;
        vec![crate::translate::PlannedPart {
            sges: sges.into_iter().map(PlannedSge::Keep).collect(),
            remote,
            len: total,
        }]
    }

    /// Translates one application send WR into provider WRs appended to `batch`.
    pub(crate) fn translate_send(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        app_ptr: usize,
        batch: &mut Batch,
    ) -> Result<(), PostFail> {
        if self.fast_send(side, app, app_ptr, batch) {
            return Ok(());
        }
        let op = app.opcode;
        let (has_remote, splittable, atomic) = match op {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => {
                (true, true, false)
            }
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => (true, false, true),
            _ => (false, false, false),
        };
        let n = app.num_sge.max(0) as usize;
        let inline = app.send_flags & IBV_SEND_INLINE != 0;
        // Refused before the list is read, as providers do (mlx5 checks num_sge against the
        // queue's SGE limit first): a bogus count must not make the library read past the
        // application's array. Inline data is copied, not described by SGEs the NIC reads,
        // so it is bounded only loosely.
        if n > 4096 || (!inline && n > self.max_send_sge) {
            return Err(PostFail::Errno(libc::EINVAL, app_ptr));
        }
        let app_sges: &[ibv_sge] = if n == 0 || app.sg_list.is_null() {
            &[]
        } else {
            // SAFETY: the application's SGE array of `num_sge` entries.
            unsafe { core::slice::from_raw_parts(app.sg_list, n) }
        };
        let classes: Vec<SgeClass> = {
            let st = lock(&self.engine.state);
            app_sges
                .iter()
                .map(|s| self.classify_sge(&st, s, inline))
                .collect()
        };
        let total: u64 = app_sges.iter().map(|s| u64::from(s.length)).sum();
        let (raddr, app_rkey) = if atomic {
            (app.remote_addr(), app.atomic_rkey())
        } else {
            (app.remote_addr(), app.rdma_rkey())
        };
        let remote_len = if atomic { 8 } else { total };
        let remote = if !has_remote {
            RemoteClass::None
        } else if remote_len == 0 || self.qp_type != IBV_QPT_RC {
            if remote_len > 0 {
                self.engine.note("RDMA on a non-RC QP: remote keys are not translated (a peer with the library will refuse the access)");
            }
            RemoteClass::Keep {
                addr: raddr,
                rkey: app_rkey,
            }
        } else {
            self.classify_remote(side, app_rkey, raddr, remote_len, batch)?
        };
        // Fallback pins of a SEND that windows cannot serve (fallback.rs), released with the
        // record of its (only) part.
        let mut pins = WinList::new();
        let parts = match crate::translate::plan(&classes, remote, splittable, self.max_send_sge) {
            Ok(p) => p,
            Err(PlanError::TooManySges { .. }) if !has_remote && !inline => {
                // A SEND is one message: over more windows than the queue has SGEs, its
                // ranges are pinned as plain verbs would have them.
                let (sges, p) = self.engine.pin_sges(
                    self.ctx.ctx,
                    app_sges,
                    "a SEND spanning more windows than its SGE limit was pinned as plain verbs would pin it",
                );
                pins = p;
                vec![crate::translate::PlannedPart {
                    sges: sges.into_iter().map(PlannedSge::Keep).collect(),
                    remote: None,
                    len: total,
                }]
            }
            Err(PlanError::TooManySges { .. }) => {
                return Err(PostFail::Errno(libc::EINVAL, app_ptr));
            }
            Err(PlanError::CrossesRemoteWindow) => {
                // A misaligned atomic: give it the region key at an invalid address so the
                // responder refuses it.
                return Err(PostFail::Status(IBV_WC_REM_INV_REQ_ERR));
            }
            Err(PlanError::RemoteOutsideRegion) => {
                // Not reached: `classify_remote` keeps an outside range as it is. Failed as
                // the responder would fail an access outside its region.
                return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
            }
        };
        let parts = if op == IBV_WR_RDMA_WRITE_WITH_IMM && parts.len() > 1 && !inline {
            self.one_write_with_imm(parts, app_sges, total, &mut pins)
        } else {
            parts
        };
        let wants = app.send_flags & IBV_SEND_SIGNALED != 0 || self.sq_sig_all;
        let group = self.track.lock().send.next_group();
        let count = parts.len();
        let write = !matches!(op, IBV_WR_RDMA_READ);
        for (i, part) in parts.into_iter().enumerate() {
            let first = i == 0;
            let last = i + 1 == count;
            let remote_target = match part.remote {
                None => None,
                Some(PlannedRemote::Keep { addr, rkey }) => Some((addr, rkey)),
                Some(PlannedRemote::Window { addr, index }) => {
                    match self.ensure_lease(side, app_rkey, index, write, batch) {
                        Ok(rkey) => Some((addr, rkey)),
                        Err(e) => {
                            if i > 0 {
                                // Earlier parts of this WR are on the wire, so it cannot be
                                // refused any more: it completes once, in error. Its parts
                                // may all have completed already (their successes are not
                                // reported), so wait for them: if one of them reported the
                                // WR's error, the QP error is all that is left to do;
                                // otherwise the caller fails the WR with a completion.
                                self.flush(batch)?;
                                self.settle_send_queue(Duration::from_secs(2));
                                if self.track.lock().send.reported(group) {
                                    self.force_error();
                                    return Ok(());
                                }
                                return Err(match e {
                                    PostFail::Status(s) => PostFail::Status(s),
                                    PostFail::Errno(..) => PostFail::Status(IBV_WC_GENERAL_ERR),
                                });
                            }
                            // Nothing of this WR is posted: the caller fails it alone (after
                            // posting the list's earlier WRs) like plain verbs would.
                            return Err(e);
                        }
                    }
                }
            };
            let (sges, mut windows) = self.local_windows(side, &part.sges, batch, true)?;
            if first {
                windows.extend(core::mem::take(&mut pins));
            }
            let mut w = *app;
            w.next = core::ptr::null_mut();
            w.opcode = match op {
                IBV_WR_RDMA_WRITE_WITH_IMM if !last => IBV_WR_RDMA_WRITE,
                other => other,
            };
            let mut flags =
                app.send_flags & !(IBV_SEND_SIGNALED | IBV_SEND_FENCE | IBV_SEND_SOLICITED);
            if first {
                flags |= app.send_flags & IBV_SEND_FENCE;
            }
            if last {
                flags |= app.send_flags & IBV_SEND_SOLICITED;
            }
            let signal = side.signals.must_signal(last && wants, self.signal_every);
            if signal {
                flags |= IBV_SEND_SIGNALED;
            }
            w.send_flags = flags;
            if let Some((addr, rkey)) = remote_target {
                if atomic {
                    w.set_atomic(addr, app.atomic_compare_add(), app.atomic_swap(), rkey);
                } else {
                    w.set_rdma(addr, rkey);
                }
            }
            let (seq, wr_id) = {
                let mut t = self.track.lock();
                let seq = t.send.record(
                    Origin::App {
                        wr_id: app.wr_id,
                        group,
                        last,
                        wants_completion: wants,
                        // A split READ's completion reports the whole WR's bytes.
                        byte_len: if last && count > 1 && op == IBV_WR_RDMA_READ {
                            u32::try_from(total).unwrap_or(u32::MAX)
                        } else {
                            0
                        },
                    },
                    windows,
                );
                (seq, t.send.wr_id_of(seq))
            };
            w.wr_id = wr_id;
            batch.push(w, &sges, app_ptr, seq);
        }
        self.engine
            .counters()
            .work_requests
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Posts `wr`, a single WR the library itself holds (the one WR of an `ibv_wr_*` batch,
    /// with its SGE or inline copy): a warm one is translated in place and posted as it is,
    /// anything else takes the general path. Returns 0 or an errno.
    ///
    /// # Safety
    /// `wr` is well formed with `next` null; its SGE list is the library's own and outlives
    /// the call.
    pub(crate) unsafe fn post_owned(&self, side: &mut SendSide, wr: &mut ibv_send_wr) -> c_int {
        let mut bad = core::ptr::null_mut();
        if side.batch.is_empty()
            && let Some(keys) = self.warm_keys(side, wr)
        {
            if let Some(wkey) = keys.remote {
                if is_atomic(wr.opcode) {
                    wr.set_atomic_rkey(wkey);
                } else {
                    wr.set_rdma_rkey(wkey);
                }
            }
            if let Some((lkey, _)) = keys.local {
                // SAFETY: the one SGE of `wr`, the library's own (the contract).
                unsafe { (*wr.sg_list).lkey = lkey };
            }
            // An unrecorded WR keeps the application's wr_id and flags.
            let mut seq = 0;
            if !keys.unrecorded(side) {
                let (s, wr_id, flags) = self.record_warm(side, wr, keys.pinned_window());
                (seq, wr.wr_id, wr.send_flags) = (s, wr_id, flags);
            }
            let wr: *mut ibv_send_wr = wr;
            // SAFETY: the contract; `bad` is a local.
            return unsafe { self.post_recorded(wr, seq, wr, &mut bad) };
        }
        let mut batch = std::mem::take(&mut side.batch);
        batch.clear();
        // SAFETY: a one-WR list (the contract); `bad` is a local.
        let rc = unsafe { self.post_send_list_with(side, &mut batch, wr, &mut bad) };
        batch.clear();
        side.batch = batch;
        rc
    }
}
