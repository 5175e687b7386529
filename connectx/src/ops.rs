//! The functions the library installs in providers' tables: the context's data-path
//! operations (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` and `ibv_poll_cq` are
//! inline functions that call through `ctx->ops`, verbs.h), `verbs_context::create_qp_ex`
//! (the inline `ibv_create_qp_ex`, which rdma_cm uses), and the builder functions of every
//! `ibv_qp_ex` ("new post send" API, which perftest 4.5 uses by default).
//!
//! Every function catches panics (a panic must not cross `extern "C"`) and returns the
//! provider's error convention instead.

use core::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use crate::engine::call::this_thread;
use crate::engine::poll::{cq_ctl, process_wc};
use crate::engine::records::{QpCtl, SrqCtl};
use crate::engine::wr_batch::{BatchCell, ExBuilder, ExSpan, FirstData, ProviderBuilder};
use crate::registry;
use crate::sys::*;

pub(crate) fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            crate::log::once("internal error (panic) in a wrapped verbs call; the call failed");
            fallback
        }
    }
}

/// `ctx->ops.post_send`.
///
/// # Safety
/// Called by the inline `ibv_post_send` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guarded(libc::EIO, || {
        let Some(ctl) = registry::qp(qp as usize) else {
            // SAFETY: a live QP of a context whose ops we wrapped.
            let ctx = unsafe { (*qp).context } as usize;
            return match registry::ctx(ctx).and_then(|r| r.orig.post_send) {
                // SAFETY: forwarded unchanged.
                Some(f) => unsafe { f(qp, wr, bad) },
                None => libc::EINVAL,
            };
        };
        if ctl.ctx.passthrough().is_some() {
            return match ctl.ctx.orig.post_send {
                // SAFETY: forwarded unchanged.
                Some(f) => unsafe { f(qp, wr, bad) },
                None => libc::EINVAL,
            };
        }
        let mut side = ctl.send.lock();
        // SAFETY: the application's list and out-pointer.
        unsafe { ctl.post_send_list(&mut side, wr, bad) }
    })
}

/// `ctx->ops.post_recv`.
///
/// # Safety
/// Called by the inline `ibv_post_recv` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guarded(libc::EIO, || {
        let Some(ctl) = registry::qp(qp as usize) else {
            // SAFETY: a live QP of a context whose ops we wrapped.
            let ctx = unsafe { (*qp).context } as usize;
            return match registry::ctx(ctx).and_then(|r| r.orig.post_recv) {
                // SAFETY: forwarded unchanged.
                Some(f) => unsafe { f(qp, wr, bad) },
                None => libc::EINVAL,
            };
        };
        if ctl.ctx.passthrough().is_some() {
            return match ctl.ctx.orig.post_recv {
                // SAFETY: forwarded unchanged.
                Some(f) => unsafe { f(qp, wr, bad) },
                None => libc::EINVAL,
            };
        }
        // SAFETY: the application's list and out-pointer.
        unsafe { ctl.post_recv_list(wr, bad) }
    })
}

/// `ctx->ops.post_srq_recv`.
///
/// # Safety
/// Called by the inline `ibv_post_srq_recv` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guarded(libc::EIO, || {
        // SAFETY: a live SRQ.
        let ctx = unsafe { (*srq).context } as usize;
        let Some(rec) = registry::ctx(ctx) else {
            return libc::EINVAL;
        };
        let Some(orig) = rec.orig.post_srq_recv else {
            return libc::EOPNOTSUPP;
        };
        if rec.passthrough().is_some() {
            // SAFETY: forwarded unchanged.
            return unsafe { orig(srq, wr, bad) };
        }
        let Some(s) = registry::srq_or_insert(srq as usize, || {
            // The SRQ's own SGE limit (the application chose it at creation, often below the
            // device's): a split receive must fit it, or the provider refuses the post.
            let mut attr = ibv_srq_attr::default();
            let max_sge = {
                let _g = crate::engine::call::RealCall::enter();
                // SAFETY: a live SRQ and a writable attribute struct.
                match unsafe { (rec.engine.real.query_srq)(srq, &mut attr) } {
                    0 => attr.max_sge.min(rec.caps.max_sge),
                    _ => rec.caps.max_sge,
                }
            };
            Some(SrqCtl {
                engine: rec.engine.clone(),
                ctx,
                orig_post: orig,
                max_sge: max_sge as usize,
                track: crate::spin::SpinLock::new(crate::completion::RecvTracker::with_tag(
                    crate::engine::call::random_u64(),
                )),
            })
        }) else {
            return libc::ENOMEM;
        };
        let post = s.orig_post;
        // SAFETY: the live SRQ and a well-formed list built by post_recv_common.
        let poster = |w, b| unsafe { post(srq, w, b) };
        // SAFETY: the application's list and out-pointer.
        unsafe {
            crate::engine::post_recv::post_recv_common(
                &s.engine,
                ctx,
                s.max_sge,
                |wr_id, w| {
                    let mut t = s.track.lock();
                    let seq = t.record(wr_id, w);
                    (seq, t.wr_id_of(seq))
                },
                |seq| s.track.lock().unrecord(seq),
                poster,
                wr,
                bad,
            )
        }
    })
}

/// `ctx->ops.poll_cq`: hands out stashed completions first, then the provider's, rewritten.
///
/// # Safety
/// Called by the inline `ibv_poll_cq` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_poll_cq(
    cq: *mut ibv_cq,
    n: c_int,
    wc: *mut ibv_wc,
) -> c_int {
    guarded(-1, || {
        let Some(cqc) = cq_ctl(cq as usize) else {
            return -1;
        };
        if n <= 0 || wc.is_null() {
            // SAFETY: forwarded; the provider validates.
            return unsafe { (cqc.orig_poll)(cq, n, wc) };
        }
        let want = n as usize;
        let mut inner = cqc.stash.lock();
        // Another thread's extended-CQ session holds the provider's CQ lock: hand out what
        // the stash has and leave the provider to that session (see poll_into_stash).
        let provider_busy = inner.ex.provider_open();
        let crate::engine::records::CqInner { stash, last_qp, .. } = &mut *inner;
        let mut count = 0usize;
        while count < want {
            let Some(w) = stash.pop_front() else { break };
            // SAFETY: `count < n`, inside the application's array.
            unsafe { wc.add(count).write(w) };
            count += 1;
        }
        while count < want && !provider_busy {
            let ask = want - count;
            // SAFETY: the tail of the application's array, `ask` entries.
            let k = unsafe { (cqc.orig_poll)(cq, ask as c_int, wc.add(count)) };
            if k < 0 {
                return if count > 0 { count as c_int } else { k };
            }
            let k = k as usize;
            let mut kept = 0usize;
            for i in 0..k {
                // SAFETY: an entry the provider just wrote, rewritten in place (no copy: most
                // completions are delivered where they are).
                let w = unsafe { &mut *wc.add(count + i) };
                if process_wc(cqc.ctx, w, last_qp) {
                    if kept != i {
                        // SAFETY: `count + kept < count + i`, both inside the array.
                        unsafe { wc.add(count + kept).write(wc.add(count + i).read()) };
                    }
                    kept += 1;
                }
            }
            count += kept;
            if k < ask {
                break;
            }
        }
        count as c_int
    })
}

/// Installs the library's builder functions in a QP's `ibv_qp_ex`.
///
/// # Safety
/// `qpx` is the provider's `ibv_qp_ex` of a live QP, not in use by the application yet.
pub(crate) unsafe fn wrap_qp_ex(qpx: *mut ibv_qp_ex) {
    // SAFETY: per the contract.
    let q = unsafe { &mut *qpx };
    q.wr_atomic_cmp_swp = Some(ex_atomic_cmp_swp);
    q.wr_atomic_fetch_add = Some(ex_atomic_fetch_add);
    q.wr_bind_mw = Some(ex_bind_mw);
    q.wr_local_inv = Some(ex_local_inv);
    q.wr_rdma_read = Some(ex_rdma_read);
    q.wr_rdma_write = Some(ex_rdma_write);
    q.wr_rdma_write_imm = Some(ex_rdma_write_imm);
    q.wr_send = Some(ex_send);
    q.wr_send_imm = Some(ex_send_imm);
    q.wr_send_inv = Some(ex_send_inv);
    q.wr_send_tso = Some(ex_send_tso);
    q.wr_set_ud_addr = Some(ex_set_ud_addr);
    q.wr_set_xrc_srqn = Some(ex_set_xrc_srqn);
    q.wr_set_inline_data = Some(ex_set_inline_data);
    q.wr_set_inline_data_list = Some(ex_set_inline_data_list);
    q.wr_set_sge = Some(ex_set_sge);
    q.wr_set_sge_list = Some(ex_set_sge_list);
    q.wr_start = Some(ex_start);
    q.wr_complete = Some(ex_complete);
    q.wr_abort = Some(ex_abort);
    q.wr_atomic_write = Some(ex_atomic_write);
}

impl BatchCell {
    /// Empties the builder; a provider batch the builder had begun is aborted.
    ///
    /// # Safety
    /// The caller's batch is open; `qpx` is its QP.
    unsafe fn reset(&self, qpx: *mut ibv_qp_ex) {
        // SAFETY: per the contract.
        let b = unsafe { self.get() };
        // SAFETY: the batch's live QP, per the contract.
        unsafe { restore_inline_setter(qpx, b) };
        if b.provider_open {
            b.provider_open = false;
            if let Some(p) = self.provider {
                // SAFETY: the provider batch this batch began on its live QP.
                unsafe { (p.abort)(qpx) };
            }
        }
        b.clear();
    }
}

/// The QP record of the batch open on `qpx`, if one is. (`ibv_qp_ex` begins with its
/// `ibv_qp`, so both have the same address.)
#[inline]
fn open_batch(qpx: *mut ibv_qp_ex) -> Option<registry::Hot<QpCtl>> {
    let ctl = registry::qp(qpx as usize)?;
    ctl.builder.is_open().then_some(ctl)
}

/// Runs `f` on the builder of `qpx`'s open batch (nothing if none is open: a call outside
/// `ibv_wr_start`/`ibv_wr_complete` is the application's error, which plain providers do not
/// check either).
fn with_builder(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut ExBuilder)) {
    with_builder_then(qpx, false, |_, b| f(b));
}

/// [`with_builder`] for a data setter: a WR that [`forward_early`] handed over is taken back
/// first ([`take_back_early`]).
fn with_builder_for_data(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut ExBuilder)) {
    with_builder_then(qpx, true, |_, b| f(b));
}

/// Puts the library's inline setter back, takes an early WR back if `take_back`, runs `f` on
/// the batch's QP record and builder.
#[inline]
fn with_builder_then(qpx: *mut ibv_qp_ex, take_back: bool, f: impl FnOnce(&QpCtl, &mut ExBuilder)) {
    guarded((), || {
        if let Some(ctl) = open_batch(qpx) {
            // SAFETY: the batch is open and its calls are serialized.
            let b = unsafe { ctl.builder.get() };
            // SAFETY: as above; `qpx` is the batch's QP.
            unsafe {
                if take_back {
                    take_back_early(&ctl, b, qpx);
                } else {
                    restore_inline_setter(qpx, b);
                }
            }
            f(&ctl, b);
        }
    })
}

/// Starts a new WR with the QP's current `wr_id` and `wr_flags`; one the provider can take as
/// it is goes to the provider at once ([`forward_early`]).
#[inline]
fn begin(qpx: *mut ibv_qp_ex, opcode: u32, setup: impl FnOnce(&mut ibv_send_wr)) {
    // SAFETY: the application's live ibv_qp_ex.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    with_builder_then(qpx, false, |ctl, b| {
        b.begin(wr_id, flags, opcode, setup);
        // SAFETY: the batch of `ctl` is open (serialized calls), `b` its builder, `qpx` its QP.
        unsafe { forward_early(ctl, b, qpx) };
    });
}

/// Puts the library's `wr_set_inline_data` back into the QP if [`forward_early`] had put the
/// provider's there.
///
/// # Safety
/// `qpx` is the live QP of the open batch whose builder is `b`.
#[inline]
unsafe fn restore_inline_setter(qpx: *mut ibv_qp_ex, b: &mut ExBuilder) {
    if b.inline_swapped {
        b.inline_swapped = false;
        // SAFETY: per the contract; the batch's calls are serialized.
        unsafe { (*qpx).wr_set_inline_data = Some(ex_set_inline_data) };
    }
}

/// Hands the WR just begun to the provider's own builder at its opcode call when it needs
/// nothing of the library whatever inline data follows: [`handover`], with the peer window
/// covering the QP's whole inline limit from the remote address, and the
/// provider's batch not begun yet (so that [`take_back_early`] can abort it). The QP's
/// `wr_set_inline_data` then is the provider's own until the next call of the batch, so the
/// inline payload goes straight to the provider (perftest's pattern on mlx5: start, opcode,
/// inline data, complete).
///
/// # Safety
/// The batch of `ctl` is open (its send lock held), `b` is its builder and `qpx` its QP.
#[inline(always)]
unsafe fn forward_early(ctl: &QpCtl, b: &mut ExBuilder, qpx: *mut ibv_qp_ex) {
    if b.provider_open || ctl.max_inline_data == 0 {
        return;
    }
    // SAFETY: per the contract.
    let Some((p, key)) = (unsafe { handover(ctl, b, u64::from(ctl.max_inline_data)) }) else {
        return;
    };
    // SAFETY: the application's live ibv_qp_ex, serialized by the batch; the provider's
    // functions of this QP, in the order the API prescribes (start, then the opcode). The
    // provider reads `wr_id` and `wr_flags` at the opcode call: they are still what the
    // application set for this WR.
    unsafe {
        (p.start)(qpx);
        p.opcode(qpx, &b.first.wr, key);
    }
    b.provider_open = true;
    b.first.active = false;
    b.last_forwarded = true;
    b.early = true;
    b.inline_swapped = true;
    // SAFETY: as above.
    unsafe { (*qpx).wr_set_inline_data = Some(p.set_inline_data) };
}

/// Before a data setter other than the provider's inline one, for a WR that
/// [`forward_early`] handed over: aborts the provider's batch (which holds that WR alone) and
/// takes the WR back into the library's builder, so the setter applies to it there. (Had the
/// application given the WR inline data through the provider already, this setter is its
/// second one, which verbs leaves undefined: the last one wins.)
///
/// # Safety
/// The batch of `ctl` is open, `b` is its builder and `qpx` its QP.
unsafe fn take_back_early(ctl: &QpCtl, b: &mut ExBuilder, qpx: *mut ibv_qp_ex) {
    // SAFETY: per the contract.
    unsafe { restore_inline_setter(qpx, b) };
    if !b.early {
        return;
    }
    b.early = false;
    b.last_forwarded = false;
    if b.provider_open {
        b.provider_open = false;
        if let Some(p) = ctl.builder.provider {
            // SAFETY: the provider batch that forward_early began on this live QP.
            unsafe { (p.abort)(qpx) };
        }
    }
    // `first.wr` kept the application's fields (remote key and address untranslated).
    b.first.data = FirstData::None;
    if b.spilled {
        // A setter since (`ibv_wr_set_ud_addr`, say) moved the batch to the general form
        // while the WR was the provider's: it goes where `spill` would have put it.
        b.wrs.push(b.first.wr);
        b.spans.push(ExSpan::default());
    } else {
        b.first.active = true;
    }
}

fn unsupported(qpx: *mut ibv_qp_ex, what: &'static str) {
    crate::log::once(what);
    with_builder(qpx, |b| b.unsupported = Some(what));
}

unsafe extern "C" fn ex_start(qpx: *mut ibv_qp_ex) {
    guarded((), || {
        let Some(ctl) = registry::qp(qpx as usize) else {
            return;
        };
        // A second start on this thread without complete/abort restarts the batch; another
        // thread's batch is waited for (at the lock).
        let restart =
            ctl.builder.is_open() && ctl.builder.owner.load(Ordering::Relaxed) == this_thread();
        if !restart {
            ctl.send.raw_lock();
            ctl.builder.owner.store(this_thread(), Ordering::Relaxed);
            ctl.builder.open.store(true, Ordering::Release);
        }
        // SAFETY: this batch holds the send lock now; `qpx` is its QP.
        unsafe { ctl.builder.reset(qpx) };
    })
}

/// Ends the open batch of `ctl`'s QP: clears the builder, lowers the flag, releases the send
/// lock.
pub(crate) fn close_batch(ctl: &QpCtl) {
    // SAFETY: the batch is still open (it holds the send lock); an `ibv_qp_ex` starts with its
    // `ibv_qp`, so the QP's address is its `ibv_qp_ex`'s.
    unsafe { ctl.builder.reset(ctl.qp as *mut ibv_qp_ex) };
    ctl.builder.open.store(false, Ordering::Relaxed);
    // SAFETY: the batch took the lock in `ex_start` (open_batch_lock) and ends here.
    unsafe { ctl.send.raw_unlock() };
}

unsafe extern "C" fn ex_abort(qpx: *mut ibv_qp_ex) {
    guarded((), || {
        if let Some(ctl) = open_batch(qpx) {
            close_batch(&ctl);
        }
    })
}

unsafe extern "C" fn ex_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    begin(qpx, IBV_WR_RDMA_WRITE, |w| w.set_rdma(raddr, rkey));
}

unsafe extern "C" fn ex_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, imm: u32) {
    begin(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, |w| {
        w.set_rdma(raddr, rkey);
        w.imm_data = imm;
    });
}

unsafe extern "C" fn ex_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    begin(qpx, IBV_WR_RDMA_READ, |w| w.set_rdma(raddr, rkey));
}

unsafe extern "C" fn ex_send(qpx: *mut ibv_qp_ex) {
    begin(qpx, IBV_WR_SEND, |_| {});
}

unsafe extern "C" fn ex_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    begin(qpx, IBV_WR_SEND_WITH_IMM, |w| w.imm_data = imm);
}

unsafe extern "C" fn ex_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    begin(qpx, IBV_WR_SEND_WITH_INV, |w| w.imm_data = rkey);
}

unsafe extern "C" fn ex_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    begin(qpx, IBV_WR_LOCAL_INV, |w| w.imm_data = rkey);
}

unsafe extern "C" fn ex_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    raddr: u64,
    compare: u64,
    swap: u64,
) {
    begin(qpx, IBV_WR_ATOMIC_CMP_AND_SWP, |w| {
        w.set_atomic(raddr, compare, swap, rkey)
    });
}

unsafe extern "C" fn ex_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, add: u64) {
    begin(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD, |w| {
        w.set_atomic(raddr, add, 0, rkey)
    });
}

unsafe extern "C" fn ex_bind_mw(
    qpx: *mut ibv_qp_ex,
    _mw: *mut ibv_mw,
    _rkey: u32,
    _info: *const ibv_mw_bind_info,
) {
    unsupported(
        qpx,
        "ibv_wr_bind_mw on a QP the library manages is not supported: wr_complete fails with EOPNOTSUPP",
    );
}

unsafe extern "C" fn ex_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    unsupported(
        qpx,
        "ibv_wr_send_tso on a QP the library manages is not supported: wr_complete fails with EOPNOTSUPP",
    );
}

unsafe extern "C" fn ex_atomic_write(
    qpx: *mut ibv_qp_ex,
    _rkey: u32,
    _raddr: u64,
    _data: *const c_void,
) {
    unsupported(
        qpx,
        "ibv_wr_atomic_write on a QP the library manages is not supported: wr_complete fails with EOPNOTSUPP",
    );
}

unsafe extern "C" fn ex_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    with_builder(qpx, |b| {
        if let Some(last) = b.last_wr() {
            last.wr[0] = ah as u64;
            last.wr[1] = u64::from(qpn) | (u64::from(qkey) << 32);
        }
    });
}

unsafe extern "C" fn ex_set_xrc_srqn(qpx: *mut ibv_qp_ex, srqn: u32) {
    with_builder(qpx, |b| {
        if let Some(last) = b.last_wr() {
            last.qp_type_xrc_remote_srqn = srqn;
        }
    });
}

unsafe extern "C" fn ex_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_builder_for_data(qpx, |b| b.set_sges(&[ibv_sge { addr, length, lkey }]));
}

unsafe extern "C" fn ex_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let sges: &[ibv_sge] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: the application's array of `n` SGEs, read during this call.
        unsafe { core::slice::from_raw_parts(list, n) }
    };
    with_builder_for_data(qpx, |b| b.set_sges(sges));
}

unsafe extern "C" fn ex_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let data: &[u8] = if len == 0 || addr.is_null() {
        &[]
    } else {
        // SAFETY: the application's buffer of `len` bytes, copied during this call (as the API
        // requires).
        unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) }
    };
    guarded((), || {
        let Some(ctl) = open_batch(qpx) else {
            return;
        };
        // SAFETY: the batch is open and its calls are serialized.
        let b = unsafe { ctl.builder.get() };
        if b.early {
            // The WR went to the provider at its opcode call (an application that kept this
            // function's address from before): its data goes there too.
            b.early = false;
            if let Some(p) = ctl.builder.provider {
                // SAFETY: the provider's setter for the WR it holds, on this live QP.
                unsafe { (p.set_inline_data)(qpx, data.as_ptr() as *mut c_void, data.len()) };
            }
            return;
        }
        // SAFETY: as above; `qpx` is the batch's QP.
        if !unsafe { forward_inline(&ctl, b, qpx, data) } {
            b.set_inline_one(data);
        }
    })
}

/// Whether the batch's pending WR (begun, no data yet) may go to the provider's own builder,
/// and then the provider's functions and the key for the WR's remote range: an RC QP, the
/// provider's builder at hand with this opcode (a SEND or an RDMA WRITE, with or without
/// immediate), nothing of the batch kept by the library before it, no recorded unsignaled WR
/// waiting for a later completion, and the `reach` bytes from a WRITE's remote address in the
/// peer window this QP used last (its key translated here).
///
/// # Safety
/// The batch of `ctl` is open (its send lock held) and `b` is its builder.
#[inline(always)]
unsafe fn handover<'a>(
    ctl: &'a QpCtl,
    b: &ExBuilder,
    reach: u64,
) -> Option<(&'a ProviderBuilder, u32)> {
    let p = ctl.builder.provider.as_ref()?;
    let f = &b.first;
    if !f.active || b.spilled || f.data != FirstData::None || ctl.qp_type != IBV_QPT_RC {
        return None;
    }
    // SAFETY: the open batch holds the send lock.
    let side = unsafe { ctl.send.data() };
    if !side.signals.is_idle() {
        return None;
    }
    let w = &f.wr;
    let op = 1u32.checked_shl(w.opcode).unwrap_or(0);
    if p.ops & op == 0 {
        return None;
    }
    let key = if op & (1 << IBV_WR_RDMA_WRITE | 1 << IBV_WR_RDMA_WRITE_WITH_IMM) != 0 {
        side.remote_window_key(w.rdma_rkey(), w.remote_addr(), reach)?
    } else {
        0
    };
    Some((p, key))
}

/// Hands the batch's pending WR (begun, no data yet), with `data` inline, to the provider's
/// own builder when it needs nothing of the library ([`handover`], with the data's length as
/// the reach; an empty WRITE stays the library's). Such a WR is not recorded (it holds
/// no window; see `WarmKeys::unrecorded` in the engine): it keeps the application's `wr_id`
/// and flags, and the provider copies the data. Returns whether it did.
///
/// # Safety
/// The batch of `ctl` is open (its send lock held), `b` is its builder and `qpx` its QP.
#[inline]
unsafe fn forward_inline(ctl: &QpCtl, b: &mut ExBuilder, qpx: *mut ibv_qp_ex, data: &[u8]) -> bool {
    let op = b.first.wr.opcode;
    // An empty WRITE goes the library's way (it checks no key, IBA vol. 1 C9-88).
    if data.is_empty() && matches!(op, IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM) {
        return false;
    }
    // SAFETY: per the contract.
    let Some((p, key)) = (unsafe { handover(ctl, b, data.len() as u64) }) else {
        return false;
    };
    let w = &b.first.wr;
    // SAFETY: the application's live ibv_qp_ex, serialized by the batch; the provider's
    // functions of this QP, called in the order the API prescribes (start, opcode, setter).
    unsafe {
        let q = &mut *qpx;
        if !b.provider_open {
            (p.start)(qpx);
            b.provider_open = true;
        }
        // The provider reads wr_id and wr_flags at the opcode call: give it the values the
        // application had set at its own opcode call.
        let (now_id, now_flags) = (q.wr_id, q.wr_flags);
        q.wr_id = w.wr_id;
        q.wr_flags = w.send_flags;
        p.opcode(qpx, w, key);
        (p.set_inline_data)(qpx, data.as_ptr() as *mut c_void, data.len());
        q.wr_id = now_id;
        q.wr_flags = now_flags;
    }
    b.first.active = false;
    b.last_forwarded = true;
    true
}

unsafe extern "C" fn ex_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    list: *const ibv_data_buf,
) {
    let bufs: &[ibv_data_buf] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: the application's array of `n` buffers.
        unsafe { core::slice::from_raw_parts(list, n) }
    };
    let data: Vec<&[u8]> = bufs
        .iter()
        .map(|d| {
            if d.length == 0 || d.addr.is_null() {
                &[][..]
            } else {
                // SAFETY: each buffer as described by the application, copied during this call.
                unsafe { core::slice::from_raw_parts(d.addr.cast::<u8>(), d.length) }
            }
        })
        .collect();
    with_builder_for_data(qpx, |b| b.set_inline(&data));
}

unsafe extern "C" fn ex_complete(qpx: *mut ibv_qp_ex) -> c_int {
    guarded(libc::EIO, || {
        let Some(ctl) = open_batch(qpx) else {
            // No batch open: nothing to post.
            return if registry::qp(qpx as usize).is_some() {
                0
            } else {
                libc::EINVAL
            };
        };
        // The batch ends (and its lock is released) even if posting fails inside.
        let rc = guarded(libc::EIO, || post_batch(&ctl));
        close_batch(&ctl);
        rc
    })
}

/// Posts the open batch of `ctl`'s QP.
fn post_batch(ctl: &QpCtl) -> c_int {
    // SAFETY: the caller's batch is open.
    let b = unsafe { ctl.builder.get() };
    if let Some(what) = b.unsupported {
        ctl.engine.note(what);
        return libc::EOPNOTSUPP;
    }
    if b.provider_open {
        // The WRs handed to the provider come first; the library's own follow them.
        b.provider_open = false;
        if let Some(p) = ctl.builder.provider {
            // SAFETY: the provider batch this batch began on its live QP.
            let rc = unsafe { (p.complete)(ctl.qp as *mut ibv_qp_ex) };
            if rc != 0 {
                return rc;
            }
        }
    }

    if b.first.active {
        // The usual batch: one WR, posted from where it was built.
        let f = &mut b.first;
        let mut inline_sge;
        (f.wr.sg_list, f.wr.num_sge) = match f.data {
            FirstData::None => (core::ptr::null_mut(), 0),
            FirstData::Sge => (&mut f.sge as *mut ibv_sge, 1),
            FirstData::Inline(len) => {
                inline_sge = ibv_sge {
                    addr: f.inline.as_ptr() as u64,
                    length: len as u32,
                    lkey: 0,
                };
                (&mut inline_sge as *mut ibv_sge, 1)
            }
        };
        f.wr.next = core::ptr::null_mut();
        // SAFETY: the open batch holds the send lock (taken in ex_start).
        let side = unsafe { ctl.send.data() };
        // SAFETY: one well-formed WR whose SGE (here or in the builder) and inline copy are the
        // library's own and outlive the call.
        return unsafe { ctl.post_owned(side, &mut f.wr) };
    }
    if b.wrs.is_empty() {
        return 0;
    }
    // Lay the SGEs out per WR; inline SGEs point at our copies of the data.
    b.out_sges.clear();
    b.out_spans.clear();
    for span in &b.spans {
        let start = b.out_sges.len();
        for k in 0..span.len {
            let sge = b.sge(*span, k);
            b.out_sges.push(sge);
        }
        b.out_spans.push((start, span.len));
    }
    let n = b.wrs.len();
    let base = b.wrs.as_mut_ptr();
    let sbase = b.out_sges.as_mut_ptr();
    for (i, &(start, count)) in b.out_spans.iter().enumerate() {
        // SAFETY: `i < n`: one span per WR.
        let w = unsafe { &mut *base.add(i) };
        w.sg_list = if count == 0 {
            core::ptr::null_mut()
        } else {
            // SAFETY: inside `out_sges`.
            unsafe { sbase.add(start) }
        };
        w.num_sge = count as c_int;
        w.next = if i + 1 < n {
            // SAFETY: inside `wrs`.
            unsafe { base.add(i + 1) }
        } else {
            core::ptr::null_mut()
        };
    }
    let mut bad = core::ptr::null_mut();
    // SAFETY: the open batch holds the send lock (taken in ex_start).
    let side = unsafe { ctl.send.data() };
    // SAFETY: a well-formed list in the builder's buffers, which outlive the call.
    unsafe { ctl.post_send_list(side, base, &mut bad) }
}
