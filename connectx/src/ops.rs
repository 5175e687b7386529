//! The functions the library installs in providers' tables: the context's data-path
//! operations (`ibv_post_send`, `ibv_post_recv`, `ibv_post_srq_recv` and `ibv_poll_cq` are
//! inline functions that call through `ctx->ops`, verbs.h), `verbs_context::create_qp_ex`
//! (the inline `ibv_create_qp_ex`, which rdma_cm uses), and the builder functions of every
//! `ibv_qp_ex` ("new post send" API, which perftest 4.5 uses by default).
//!
//! Every function catches panics (a panic must not cross `extern "C"`) and returns the
//! provider's error convention instead.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::engine::{Engine, QpCtl, SrqCtl, cq_ctl, process_wc};
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
            Some(SrqCtl {
                engine: rec.engine.clone(),
                ctx,
                orig_post: orig,
                max_sge: rec.caps.max_sge as usize,
                track: crate::spin::SpinLock::new(crate::completion::RecvTracker::new()),
            })
        }) else {
            return libc::ENOMEM;
        };
        let post = s.orig_post;
        // SAFETY: the live SRQ and a well-formed list built by post_recv_common.
        let poster = |w, b| unsafe { post(srq, w, b) };
        // SAFETY: the application's list and out-pointer.
        unsafe {
            crate::engine::post_recv_common(
                &s.engine,
                ctx,
                s.max_sge,
                |wr_id, w| s.track.lock().record(wr_id, w),
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
        let crate::engine::CqInner { stash, last_qp, .. } = &mut *inner;
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

/// `verbs_context::create_qp_ex`.
///
/// # Safety
/// Called by the inline `ibv_create_qp_ex` with the application's arguments.
pub(crate) unsafe extern "C" fn wrapped_create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guarded(core::ptr::null_mut(), || {
        let Some(rec) = registry::ctx(ctx as usize) else {
            crate::engine::set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        };
        let Some(orig) = rec.orig_create_qp_ex else {
            crate::engine::set_errno(libc::EOPNOTSUPP);
            return core::ptr::null_mut();
        };
        if attr.is_null() || rec.passthrough().is_some() {
            // SAFETY: forwarded unchanged.
            return unsafe { orig(ctx, attr) };
        }
        // SAFETY: the application's attributes.
        let app = unsafe { *attr };
        let mut a = app;
        Engine::widen_caps(&rec, &mut a.cap);
        // SAFETY: a valid attribute copy.
        let mut qp = unsafe { orig(ctx, &mut a) };
        if qp.is_null() {
            // The device may refuse the wider queue: fall back to what was asked.
            a = app;
            // SAFETY: as above.
            qp = unsafe { orig(ctx, &mut a) };
        }
        if qp.is_null() {
            return qp;
        }
        let with_ex = a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0 && a.send_ops_flags != 0;
        // SAFETY: a QP just created on this context.
        unsafe {
            rec.engine
                .on_create_qp(&rec, qp, a.cap, a.sq_sig_all != 0, with_ex);
            (*attr).cap = report_caps(app.cap, a.cap);
        }
        qp
    })
}

/// The capabilities the application sees: what it asked for where the library widened the
/// queue for itself, the provider's values elsewhere.
pub(crate) fn report_caps(asked: ibv_qp_cap, real: ibv_qp_cap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: asked.max_send_wr.min(real.max_send_wr),
        max_recv_wr: real.max_recv_wr,
        max_send_sge: asked.max_send_sge.min(real.max_send_sge),
        max_recv_sge: asked.max_recv_sge.min(real.max_recv_sge),
        max_inline_data: real.max_inline_data,
    }
}

// ---------------------------------------------------------------- ibv_qp_ex builder

/// Where a recorded WR's data is: a span of `sges`, or a span of inline `pieces`.
#[derive(Clone, Copy, Default)]
struct ExSpan {
    inline: bool,
    start: usize,
    len: usize,
}

/// The builder state of a QP between `wr_start` and `wr_complete`, in flat vectors that the QP
/// keeps between batches (a warm builder path allocates nothing).
#[derive(Default)]
pub(crate) struct ExBuilder {
    wrs: Vec<ibv_send_wr>,
    spans: Vec<ExSpan>,
    sges: Vec<ibv_sge>,
    /// Inline pieces: (offset in `data`, length).
    pieces: Vec<(usize, usize)>,
    /// Copies of inline data (the API copies at the call).
    data: Vec<u8>,
    out_sges: Vec<ibv_sge>,
    out_spans: Vec<(usize, usize)>,
    unsupported: Option<&'static str>,
}

impl ExBuilder {
    fn clear(&mut self) {
        self.wrs.clear();
        self.spans.clear();
        self.sges.clear();
        self.pieces.clear();
        self.data.clear();
        self.unsupported = None;
    }

    /// The provider SGE of entry `k` of `span`: the application's SGE, or one pointing at our
    /// copy of an inline piece.
    #[inline]
    fn sge(&self, span: ExSpan, k: usize) -> ibv_sge {
        if span.inline {
            let (off, len) = self.pieces[span.start + k];
            ibv_sge {
                addr: self.data.as_ptr() as u64 + off as u64,
                length: len as u32,
                lkey: 0,
            }
        } else {
            self.sges[span.start + k]
        }
    }

    fn set_sges(&mut self, list: &[ibv_sge]) {
        let start = self.sges.len();
        self.sges.extend_from_slice(list);
        if let Some(span) = self.spans.last_mut() {
            *span = ExSpan {
                inline: false,
                start,
                len: list.len(),
            };
        }
        if let Some(w) = self.wrs.last_mut() {
            w.send_flags &= !IBV_SEND_INLINE;
        }
    }

    #[inline]
    fn set_inline(&mut self, bufs: &[&[u8]]) {
        let start = self.pieces.len();
        for b in bufs {
            self.pieces.push((self.data.len(), b.len()));
            append_bytes(&mut self.data, b);
        }
        if let Some(span) = self.spans.last_mut() {
            *span = ExSpan {
                inline: true,
                start,
                len: bufs.len(),
            };
        }
        if let Some(w) = self.wrs.last_mut() {
            w.send_flags |= IBV_SEND_INLINE;
        }
    }
}

/// Appends `src` to `dst`. Inline payloads are small (a few to a few hundred bytes); a plain
/// word loop avoids a `memcpy` call per WR, which matters where the library runs under an
/// emulator (glibc's vectorized `memcpy` is slow under QEMU's TCG).
#[inline]
fn append_bytes(dst: &mut Vec<u8>, src: &[u8]) {
    if src.len() > 256 {
        dst.extend_from_slice(src);
        return;
    }
    dst.reserve(src.len());
    let start = dst.len();
    let words = src.len() / 8;
    // SAFETY: `reserve` made room for `src.len()` bytes after `start`; the reads stay inside
    // `src` and the writes inside that room; `set_len` covers exactly the bytes written.
    unsafe {
        let out = dst.as_mut_ptr().add(start);
        for i in 0..words {
            let w = core::ptr::read_unaligned(src.as_ptr().add(i * 8).cast::<u64>());
            core::ptr::write_unaligned(out.add(i * 8).cast::<u64>(), w);
        }
        for i in words * 8..src.len() {
            *out.add(i) = *src.get_unchecked(i);
        }
        dst.set_len(start + src.len());
    }
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

/// A QP's builder and whether a batch is open.
///
/// Like the providers (mlx5 takes the QP's lock in `wr_start` and drops it in `wr_complete`),
/// a batch holds its QP's send lock from `ibv_wr_start` to `ibv_wr_complete`/`ibv_wr_abort`:
/// the calls in between use the builder without locking (verbs requires the application to
/// serialize a batch's calls, whichever threads make them) and find it through the registry's
/// shared cache. `complete` posts with the lock it already holds.
#[derive(Default)]
pub(crate) struct BatchCell {
    /// Set while a batch holds the send lock.
    open: AtomicBool,
    /// The thread that opened the batch (`pthread_self`), to tell a second `ibv_wr_start` on
    /// the same thread (which restarts the batch) from another thread's (which waits).
    owner: AtomicUsize,
    builder: UnsafeCell<ExBuilder>,
}

// SAFETY: `builder` is used only by the open batch, which holds its QP's send lock (see the
// type's documentation); the raw pointers in its recorded WRs point only into its own vectors.
unsafe impl Sync for BatchCell {}
// SAFETY: as above.
unsafe impl Send for BatchCell {}

impl BatchCell {
    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The builder.
    ///
    /// # Safety
    /// The caller's batch is open (or the application serializes the batch's calls, as verbs
    /// requires) and no other reference to the builder is live.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self) -> &mut ExBuilder {
        // SAFETY: per the contract.
        unsafe { &mut *self.builder.get() }
    }
}

/// The calling thread, as `pthread_self` names it. On x86_64 Linux that is the thread
/// pointer's self-reference at `%fs:0` (the TCB starts with a pointer to itself, x86-64 psABI
/// TLS layout, which glibc's `pthread_self` returns), read without a call.
#[inline]
pub(crate) fn this_thread() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: reads the word at %fs:0, which the x86-64 TLS ABI defines as the thread
        // control block's pointer to itself; no memory is written.
        unsafe {
            core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags));
        }
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as usize }
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
    guarded((), || {
        if let Some(ctl) = open_batch(qpx) {
            // SAFETY: the batch is open and its calls are serialized.
            f(unsafe { ctl.builder.get() });
        }
    })
}

/// Starts a new WR with the QP's current `wr_id` and `wr_flags`.
#[inline]
fn begin(qpx: *mut ibv_qp_ex, opcode: u32, setup: impl FnOnce(&mut ibv_send_wr)) {
    // SAFETY: the application's live ibv_qp_ex.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    with_builder(qpx, |b| {
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = wr_id;
        wr.send_flags = flags;
        wr.opcode = opcode;
        setup(&mut wr);
        b.wrs.push(wr);
        b.spans.push(ExSpan::default());
    });
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
        // SAFETY: this batch holds the send lock now.
        unsafe { ctl.builder.get() }.clear();
    })
}

/// Ends the open batch of `ctl`'s QP: clears the builder, lowers the flag, releases the send
/// lock.
pub(crate) fn close_batch(ctl: &QpCtl) {
    // SAFETY: the batch is still open (it holds the send lock).
    unsafe { ctl.builder.get() }.clear();
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
        if let Some(last) = b.wrs.last_mut() {
            last.wr[0] = ah as u64;
            last.wr[1] = u64::from(qpn) | (u64::from(qkey) << 32);
        }
    });
}

unsafe extern "C" fn ex_set_xrc_srqn(qpx: *mut ibv_qp_ex, srqn: u32) {
    with_builder(qpx, |b| {
        if let Some(last) = b.wrs.last_mut() {
            last.qp_type_xrc_remote_srqn = srqn;
        }
    });
}

unsafe extern "C" fn ex_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_builder(qpx, |b| b.set_sges(&[ibv_sge { addr, length, lkey }]));
}

unsafe extern "C" fn ex_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let sges: &[ibv_sge] = if n == 0 || list.is_null() {
        &[]
    } else {
        // SAFETY: the application's array of `n` SGEs, read during this call.
        unsafe { core::slice::from_raw_parts(list, n) }
    };
    with_builder(qpx, |b| b.set_sges(sges));
}

unsafe extern "C" fn ex_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let data: &[u8] = if len == 0 || addr.is_null() {
        &[]
    } else {
        // SAFETY: the application's buffer of `len` bytes, copied during this call (as the API
        // requires).
        unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) }
    };
    with_builder(qpx, |b| b.set_inline(&[data]));
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
    with_builder(qpx, |b| b.set_inline(&data));
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
    if b.wrs.is_empty() {
        return 0;
    }
    if b.wrs.len() == 1 && b.spans[0].len <= 1 {
        // The usual batch: one WR with at most one SGE or inline piece, posted from the stack.
        let span = b.spans[0];
        let mut sge = (span.len == 1).then(|| b.sge(span, 0));
        let w = &mut b.wrs[0];
        (w.sg_list, w.num_sge) = match sge.as_mut() {
            Some(s) => (s as *mut ibv_sge, 1),
            None => (core::ptr::null_mut(), 0),
        };
        w.next = core::ptr::null_mut();
        let wr: *mut ibv_send_wr = w;
        let mut bad = core::ptr::null_mut();
        // SAFETY: the open batch holds the send lock (taken in ex_start).
        let side = unsafe { ctl.send.data() };
        // SAFETY: one well-formed WR whose SGE (on this stack) and inline copy outlive the call.
        return unsafe { ctl.post_send_list(side, wr, &mut bad) };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_thread_is_pthread_self_and_differs_between_threads() {
        // SAFETY: no preconditions.
        assert_eq!(this_thread(), unsafe { libc::pthread_self() } as usize);
        let here = this_thread();
        let there = std::thread::spawn(this_thread).join().unwrap();
        assert_ne!(here, there);
    }

    #[test]
    fn append_bytes_copies_every_length() {
        for len in 0..300usize {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let mut dst = vec![0xeeu8; 3];
            append_bytes(&mut dst, &src);
            assert_eq!(&dst[..3], &[0xee; 3]);
            assert_eq!(&dst[3..], &src[..]);
        }
    }
}
