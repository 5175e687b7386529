//! A QP's send queue: posting a built batch (waiting for room), the library's own signaled WRs
//! and waiting for them, moving the QP to error, and completions the library makes up.

use core::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::completion::{Origin, WinList, wc_opcode_of};
use crate::engine::call::{RealCall, lock};
use crate::engine::poll::cq_ctl;
use crate::engine::records::{Batch, PostFail, QpCtl};
use crate::sys::*;

impl QpCtl {
    pub(super) fn orig_post_send(&self) -> Option<PostSendFn> {
        self.ctx.orig.post_send
    }

    /// Posts the batch to the provider.
    pub(crate) fn flush(&self, batch: &mut Batch) -> Result<(), PostFail> {
        if batch.is_empty() {
            return Ok(());
        }
        let Some(post) = self.orig_post_send() else {
            return Err(PostFail::Errno(libc::EOPNOTSUPP, batch.app[0]));
        };
        let n = batch.wrs.len();
        let base = batch.wrs.as_mut_ptr();
        let sbase = batch.sges.as_mut_ptr();
        for i in 0..n {
            let (start, count) = batch.spans[i];
            batch.wrs[i].sg_list = if count == 0 {
                core::ptr::null_mut()
            } else {
                // SAFETY: `start + count <= sges.len()`, inside the vector.
                unsafe { sbase.add(start) }
            };
            batch.wrs[i].num_sge = count as c_int;
            batch.wrs[i].next = if i + 1 < n {
                // SAFETY: i + 1 < n, inside the vector.
                unsafe { base.add(i + 1) }
            } else {
                core::ptr::null_mut()
            };
        }
        // The first WR not yet posted; a full send queue is waited out (sq_room.rs).
        let mut from = 0;
        let mut waiting = None;
        let (rc, idx) = loop {
            let mut bad: *mut ibv_send_wr = core::ptr::null_mut();
            // SAFETY: `from < n`; a live QP and a well-formed list of WRs whose SGE arrays
            // outlive the call.
            let rc = unsafe { post(self.qp as *mut ibv_qp, base.add(from), &mut bad) };
            if rc == 0 {
                batch.clear();
                return Ok(());
            }
            let idx = if bad.is_null() {
                from
            } else {
                ((bad as usize).wrapping_sub(base as usize) / core::mem::size_of::<ibv_send_wr>())
                    .clamp(from, n - 1)
            };
            if rc == libc::ENOMEM && self.wait_for_send_room(&mut waiting) {
                from = idx;
                continue;
            }
            break (rc, idx);
        };
        // Forget the records of the WRs not posted (unrecorded ones, seq 0, have none).
        if let Some(first) = batch.seqs[idx..].iter().copied().find(|&q| q != 0) {
            let windows = self.track.lock().send.unrecord_after(first - 1);
            self.engine.release(&windows);
        }
        let app = batch.app[idx];
        batch.clear();
        Err(PostFail::Errno(rc, app))
    }

    /// Waits for the library's own WR `token`; returns its status.
    pub(crate) fn wait_internal(&self, token: u64, deadline: Instant) -> Option<u32> {
        let mut spins = 0u32;
        loop {
            if let Some(s) = lock(&self.internal_done).remove(&token) {
                return Some(s);
            }
            if !self.poll_own_cqs() {
                spins += 1;
                if Instant::now() >= deadline {
                    return None;
                }
                if spins > 64 {
                    std::thread::sleep(Duration::from_micros(20));
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// Posts one of the library's own WRs (signaled) and waits for it.
    pub(crate) fn internal(&self, wr: ibv_send_wr, sge: ibv_sge) -> Result<u32, PostFail> {
        let deadline = Instant::now() + self.internal_wait();
        self.internal_until(wr, Some(sge), deadline)
    }

    /// [`internal`](Self::internal) with at most one SGE and a deadline.
    fn internal_until(
        &self,
        mut wr: ibv_send_wr,
        mut sge: Option<ibv_sge>,
        deadline: Instant,
    ) -> Result<u32, PostFail> {
        let Some(post) = self.orig_post_send() else {
            return Err(PostFail::Errno(libc::EOPNOTSUPP, 0));
        };
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let (seq, wr_id) = {
            let mut t = self.track.lock();
            let seq = t.send.record(Origin::Internal { token }, WinList::new());
            (seq, t.send.wr_id_of(seq))
        };
        wr.wr_id = wr_id;
        wr.next = core::ptr::null_mut();
        (wr.sg_list, wr.num_sge) = match sge.as_mut() {
            Some(s) => (s as *mut ibv_sge, 1),
            None => (core::ptr::null_mut(), 0),
        };
        wr.send_flags = IBV_SEND_SIGNALED;
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; `wr` and `sge` outlive the call.
        let rc = unsafe { post(self.qp as *mut ibv_qp, &mut wr, &mut bad) };
        if rc != 0 {
            self.track.lock().send.unrecord_after(seq - 1);
            return Err(PostFail::Errno(rc, 0));
        }
        match self.wait_internal(token, deadline) {
            Some(status) => Ok(status),
            None => Err(PostFail::Status(IBV_WC_RETRY_EXC_ERR)),
        }
    }

    /// Moves the QP to the error state (the library failed a WR on the application's behalf;
    /// a failed WR leaves an RC QP in error on plain verbs too) and waits for the flushes.
    pub(crate) fn force_error(&self) {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..Default::default()
        };
        {
            let _g = RealCall::enter();
            // SAFETY: live QP; moving to ERR is valid from any state.
            unsafe {
                (self.engine.real.modify_qp)(self.qp as *mut ibv_qp, &mut a, IBV_QP_STATE);
            }
        }
        self.engine.drop_lessee(self.ctx.ctx, self.qp_num);
        self.drain_send_queue(Duration::from_secs(2));
    }

    /// Waits (bounded by `limit`) until everything posted on the send queue so far has
    /// completed, recorded or not (warm WRs that hold no window are not recorded, §3 of
    /// docs/connectx.md): posts a signaled zero-length RDMA WRITE of the library's own behind
    /// them and waits for it (the send queue completes in order). A zero-length RDMA operation
    /// checks no key or address (IBA vol. 1, C9-88), so it does nothing on a working RC QP; on
    /// a QP in error it is flushed like everything before it. Other QP types, which have no
    /// RDMA WRITE, or a failed post, wait for the recorded WRs only.
    pub(crate) fn settle_send_queue(&self, limit: Duration) {
        if self.qp_type == IBV_QPT_RC {
            let mut wr = ibv_send_wr::zeroed();
            wr.opcode = IBV_WR_RDMA_WRITE;
            if self
                .internal_until(wr, None, Instant::now() + limit)
                .is_ok()
            {
                return;
            }
        }
        self.drain_send_queue(limit);
    }

    /// Waits (bounded) until every recorded provider WR on the send queue has completed.
    pub(crate) fn drain_send_queue(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.track.lock().send.outstanding() > 0 && Instant::now() < deadline {
            if !self.poll_own_cqs() {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Adds a completion the library made up (status `status`) for application WR `wr_id`
    /// after everything posted before it.
    pub(crate) fn synthesize(&self, wr_id: u64, opcode: u32, status: u32) {
        self.settle_send_queue(Duration::from_secs(2));
        let wc = ibv_wc {
            wr_id,
            status,
            opcode: wc_opcode_of(opcode),
            qp_num: self.qp_num,
            ..Default::default()
        };
        if let Some(c) = cq_ctl(self.send_cq) {
            c.stash.lock().stash.push_back(wc);
        }
        self.engine
            .counters()
            .synthesized_errors
            .fetch_add(1, Ordering::Relaxed);
    }
}
