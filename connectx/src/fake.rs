//! An in-process fake verbs provider, for tests without RDMA hardware or kernel support.
//!
//! It implements the functions of [`RealVerbs`] and a context's data-path operations with
//! plain memory copies between registered regions of this process, following the checks an RC
//! responder and requester make (InfiniBand Architecture Specification vol. 1, §9.7.5 and
//! §10.6; rxe's `rxe_resp.c` and `rxe_req.c` behave the same way):
//!
//! - local SGEs need a registered lkey of the QP's PD, the range inside it, and local write
//!   rights when the NIC writes → else `IBV_WC_LOC_PROT_ERR`;
//! - remote accesses need an rkey of the responder's PD, the range inside it, the MR's and the
//!   responder QP's remote right → else `IBV_WC_REM_ACCESS_ERR`; zero-length remote accesses
//!   are not checked;
//! - a SEND or WRITE_WITH_IMM needs a posted receive (else `IBV_WC_RNR_RETRY_EXC_ERR` here,
//!   as with `rnr_retry` = 0) large enough (else `IBV_WC_REM_INV_REQ_ERR`);
//! - an error moves the requester's QP to the error state; from then on every WR completes with
//!   `IBV_WC_WR_FLUSH_ERR`, signaled or not, and so do its posted receives.
//!
//! Every registration counts the page-rounded bytes it pins per context (what `VmPin` counts
//! on Linux), the independent measure the budget tests compare against. Work requests execute
//! when posted, so completions are ready at once.

use core::ffi::{c_int, c_uint, c_void};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::sys::*;
use crate::window::pinned_bytes;

#[derive(Clone, Copy)]
struct Mr {
    ctx: usize,
    pd: usize,
    va: u64,
    len: u64,
    iova: u64,
    access: u32,
    /// An ODP MR (`IBV_ACCESS_ON_DEMAND`, nothing pinned): whether its device's ODP data
    /// path is the wrong one (crate::fake_odp).
    odp: Option<bool>,
}

struct Qp {
    pd: usize,
    send_cq: usize,
    recv_cq: usize,
    srq: usize,
    state: u32,
    dest_qpn: u32,
    /// The address vector last set (`IBV_QP_AV`).
    ah: ibv_ah_attr,
    access: u32,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    sq_sig_all: bool,
    cap: ibv_qp_cap,
    rq: VecDeque<(u64, Vec<ibv_sge>)>,
    builder: FakeBatch,
    /// WRs posted through this QP's own builder.
    built_posts: u64,
    /// The `wr_id` of the last WR posted on the QP.
    last_wr_id: u64,
    /// Send-queue slots in use: a WR holds its slot until the completion that retires it
    /// (its own, or that of a later signaled WR) is polled, as mlx5 frees send-queue entries
    /// when it polls their completion. A post beyond `cap.max_send_wr` fails with ENOMEM.
    sq_used: u32,
    /// WRs posted since the last one that made a completion.
    sq_unsignaled: u32,
}

/// Posted receives: (wr_id, SGEs).
type RecvQueue = VecDeque<(u64, Vec<ibv_sge>)>;

// SAFETY: the raw pointers in a queued builder WR are never dereferenced after the call that
// recorded them (the SGEs are owned copies); the fake's state is only touched under its mutex.
unsafe impl Send for Qp {}

#[derive(Default)]
struct Fake {
    mrs: FastMap<u32, Mr>,
    mr_keys: FastMap<usize, u32>,
    qps: FastMap<u32, Qp>,
    qpns: FastMap<usize, u32>,
    cqs: FastMap<usize, VecDeque<ibv_wc>>,
    /// Each CQ's depth (`cqe`): a completion that finds the CQ full overruns it.
    cq_depth: FastMap<usize, usize>,
    /// CQs that overran: a real provider reports IBV_EVENT_CQ_ERR and the CQ is unusable
    /// (IBA vol. 1, §11.6.2 "CQ overrun" is an affiliated asynchronous error); here
    /// ibv_poll_cq fails from then on.
    cq_overrun: FastMap<usize, ()>,
    /// Contexts whose CQ sizes are rounded up as rxe rounds them (2^n - 1 entries).
    round_cqs: FastMap<usize, ()>,
    /// Extended CQs and the completion their poll session shows.
    ex_cqs: FastMap<usize, Option<ibv_wc>>,
    /// Extended CQs inside a poll session: like rxe and mlx5, the session holds the CQ's lock
    /// from a successful start_poll to end_poll, and ibv_poll_cq waits for it.
    in_session: FastMap<usize, ()>,
    /// ibv_poll_cq calls that gave up waiting for a session (a deadlock in a real provider).
    poll_blocked: u64,
    /// Per CQ, parallel to `cqs`: for a send completion, its QP and the send-queue slots
    /// polling it frees.
    cq_slots: FastMap<usize, VecDeque<Option<(u32, u32)>>>,
    srqs: FastMap<usize, (usize, RecvQueue)>,
    pinned: FastMap<usize, u64>,
    peak: FastMap<usize, u64>,
    fail_next_reg: FastMap<usize, i32>,
    fail_next_destroy: FastMap<usize, i32>,
    /// Each SRQ's SGE limit (`max_sge` at creation).
    srq_max_sge: FastMap<usize, u32>,
    no_atomics: FastMap<usize, bool>,
    /// Each context's IPv4-mapped GID (port 1, index 1): RoCE v2 over IPv4, `::ffff:198.18.x.y` (RFC 2544's
    /// benchmarking range), one address per context as if each were a host of its own.
    gids: FastMap<usize, [u8; 16]>,
    next_gid: u32,
    next_key: u32,
    next_qpn: u32,
    posted: u64,
}

static FAKE: LazyLock<Mutex<Fake>> = LazyLock::new(|| {
    Mutex::new(Fake {
        next_key: 0x1000,
        next_qpn: 0x11,
        ..Default::default()
    })
});

fn fake() -> MutexGuard<'static, Fake> {
    match FAKE.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn set_errno(e: c_int) {
    crate::engine::call::set_errno(e);
}

/// The fake's function table.
pub fn real_verbs() -> RealVerbs {
    RealVerbs {
        open_device: fake_open_device,
        close_device: fake_close_device,
        query_device: fake_query_device,
        reg_mr: fake_reg_mr,
        reg_mr_iova: fake_reg_mr_iova,
        reg_mr_iova2: fake_reg_mr_iova2,
        reg_dmabuf_mr: None,
        rereg_mr: fake_rereg_mr,
        dereg_mr: fake_dereg_mr,
        create_qp: fake_create_qp,
        destroy_qp: fake_destroy_qp,
        modify_qp: fake_modify_qp,
        query_qp: fake_query_qp,
        resize_cq: fake_resize_cq,
        destroy_cq: fake_destroy_cq,
        destroy_srq: fake_destroy_srq,
        create_srq: fake_create_srq,
        query_srq: fake_query_srq,
        qp_to_qp_ex: fake_qp_to_qp_ex,
        alloc_pd: fake_alloc_pd,
        dealloc_pd: fake_dealloc_pd,
        create_cq: fake_create_cq,
        query_port: crate::fake_odp::fake_query_port,
        query_gid: fake_query_gid,
        get_device_name: crate::fake_odp::fake_get_device_name,
    }
}

/// Bytes registered (pinned) on `ctx` now.
pub fn pinned(ctx: *mut ibv_context) -> u64 {
    fake().pinned.get(&(ctx as usize)).copied().unwrap_or(0)
}

/// Highest value of [`pinned`] so far.
pub fn peak(ctx: *mut ibv_context) -> u64 {
    fake().peak.get(&(ctx as usize)).copied().unwrap_or(0)
}

/// Number of MRs registered on `ctx` now.
pub fn mr_count(ctx: *mut ibv_context) -> usize {
    fake()
        .mrs
        .values()
        .filter(|m| m.ctx == ctx as usize)
        .count()
}

/// Makes the next registration on `ctx` fail with `errno`.
pub fn fail_next_registration(ctx: *mut ibv_context, errno: i32) {
    fake().fail_next_reg.insert(ctx as usize, errno);
}

/// Makes the next `ibv_destroy_qp` of `qp` fail with `errno` (as a QP still attached to a
/// multicast group fails with `EBUSY`), leaving the QP alive.
pub fn fail_next_destroy(qp: *mut ibv_qp, errno: i32) {
    fake().fail_next_destroy.insert(qp as usize, errno);
}

/// Work requests the fake has executed so far (all contexts).
pub fn posted() -> u64 {
    fake().posted
}

/// The null data path (benchmarks only), see [`set_null_data_path`].
static NULL_DATA_PATH: AtomicBool = AtomicBool::new(false);
/// Completions of the null data path, per CQ, oldest first.
static NULL_COMPLETIONS: LazyLock<crate::spin::SpinLock<FastMap<usize, VecDeque<ibv_wc>>>> =
    LazyLock::new(|| crate::spin::SpinLock::new(FastMap::default()));

/// Switches the null data path on or off (benchmarks only). While it is on, `ibv_post_send`
/// moves no data and checks nothing: every signaled WR completes at once with success, and
/// `ibv_poll_cq` hands those completions out; the fake's tables are not touched. The overhead
/// bench measures the library's own cost against it, after a warm-up on the full fake (whose
/// table lookups and copies cost several times the library's path and vary from run to run).
/// Switch only while no WR is outstanding: a WR posted on one path completes on that path.
pub fn set_null_data_path(on: bool) {
    NULL_DATA_PATH.store(on, Ordering::SeqCst);
    if !on {
        NULL_COMPLETIONS.lock().clear();
    }
}

/// `ibv_post_send` on the null data path.
///
/// # Safety
/// `qp` is a live QP and `wr` the caller's well-formed list.
unsafe fn null_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr) -> c_int {
    // SAFETY: a live QP.
    let (cq, qp_num) = unsafe { ((*qp).send_cq as usize, (*qp).qp_num) };
    let mut done = NULL_COMPLETIONS.lock();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: an element of the caller's list.
        let w = unsafe { &*cur };
        if w.send_flags & IBV_SEND_SIGNALED != 0 {
            done.entry(cq).or_default().push_back(ibv_wc {
                wr_id: w.wr_id,
                status: IBV_WC_SUCCESS,
                opcode: crate::completion::wc_opcode_of(w.opcode),
                qp_num,
                ..Default::default()
            });
        }
        cur = w.next;
    }
    0
}

/// `ibv_poll_cq` on the null data path.
///
/// # Safety
/// `wc` has room for `n` completions.
unsafe fn null_poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let mut done = NULL_COMPLETIONS.lock();
    let Some(queue) = done.get_mut(&(cq as usize)) else {
        return 0;
    };
    let mut i = 0;
    while i < n.max(0) as usize {
        let Some(w) = queue.pop_front() else {
            break;
        };
        // SAFETY: `i < n`, inside the caller's array.
        unsafe { wc.add(i).write(w) };
        i += 1;
    }
    i as c_int
}

static PLAIN_DEVICE: u8 = 0;
static NO_ATOMICS_DEVICE: u8 = 0;

/// A device handle for [`RealVerbs::open_device`] whose contexts report no atomic support.
pub fn device_without_atomics() -> *mut ibv_device {
    (&raw const NO_ATOMICS_DEVICE).cast_mut().cast()
}

/// A device handle for [`RealVerbs::open_device`].
pub fn device() -> *mut ibv_device {
    (&raw const PLAIN_DEVICE).cast_mut().cast()
}

fn alloc_zeroed<T>() -> *mut T {
    let layout = std::alloc::Layout::new::<T>();
    // SAFETY: non-zero-sized layout of a plain C struct for which all-zero is a valid value.
    unsafe { std::alloc::alloc_zeroed(layout).cast() }
}

fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: allocated by `alloc_zeroed::<T>` and freed once.
        unsafe { std::alloc::dealloc(p.cast(), std::alloc::Layout::new::<T>()) }
    }
}

unsafe extern "C" fn fake_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let v: *mut verbs_context = alloc_zeroed();
    // SAFETY: freshly allocated and zeroed.
    let vc = unsafe { &mut *v };
    vc.sz = core::mem::size_of::<verbs_context>();
    vc.create_qp_ex = Some(fake_create_qp_ex);
    vc.create_cq_ex = Some(fake_create_cq_ex);
    vc.query_device_ex = Some(fake_query_device_ex);
    vc.context.device = dev;
    vc.context.abi_compat = VERBS_ABI_IS_EXTENDED;
    vc.context.ops.post_send = Some(fake_post_send);
    vc.context.ops.post_recv = Some(fake_post_recv);
    vc.context.ops.poll_cq = Some(fake_poll_cq);
    vc.context.ops.post_srq_recv = Some(fake_post_srq_recv);
    vc.context.ops.req_notify_cq = Some(fake_req_notify_cq);
    let ctx = &mut vc.context as *mut ibv_context;
    // No command descriptor: the fake needs no kernel.
    vc.context.cmd_fd = -1;
    let mut f = fake();
    if dev == device_without_atomics() {
        f.no_atomics.insert(ctx as usize, true);
    }
    f.next_gid = f.next_gid.wrapping_add(1) & 0x1_ffff;
    let host = f.next_gid;
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12] = 198;
    gid[13] = 18 + (host >> 16) as u8;
    gid[14] = (host >> 8) as u8;
    gid[15] = host as u8;
    f.gids.insert(ctx as usize, gid);
    ctx
}

/// The IPv4-mapped GID of `ctx` (port 1, index 1), as `ibv_query_gid` reports it.
pub fn gid(ctx: *mut ibv_context) -> [u8; 16] {
    fake()
        .gids
        .get(&(ctx as usize))
        .copied()
        .unwrap_or_default()
}

/// `ibv_query_gid`, as rxe's table looks: index 0 a link-local GID, index 1 the context's
/// IPv4-mapped one ([`gid`]; `::ffff:192.0.2.1` for a context the fake did not open).
unsafe extern "C" fn fake_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    if port != 1 || !(0..2).contains(&index) || gid.is_null() {
        return libc::EINVAL;
    }
    let mut g = [0u8; 16];
    if index == 0 {
        g[..2].copy_from_slice(&[0xfe, 0x80]);
        g[15] = 1;
    } else {
        g = fake()
            .gids
            .get(&(ctx as usize))
            .copied()
            .unwrap_or([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1]);
    }
    // SAFETY: the caller's 16-byte GID.
    unsafe { *gid = g };
    0
}

unsafe extern "C" fn fake_close_device(ctx: *mut ibv_context) -> c_int {
    {
        // The kernel releases what the context still had (its MRs unpin with it), and the
        // context's address may be handed to the next context opened: nothing of this one may
        // be found under it.
        let mut guard = fake();
        let f = &mut *guard;
        let key = ctx as usize;
        f.mrs.retain(|_, m| m.ctx != key);
        let mrs = &f.mrs;
        f.mr_keys.retain(|_, k| mrs.contains_key(k));
        f.pinned.remove(&key);
        f.peak.remove(&key);
        f.no_atomics.remove(&key);
        f.gids.remove(&key);
        f.fail_next_reg.remove(&key);
    }
    let off = core::mem::offset_of!(verbs_context, context);
    // SAFETY: contexts are the last field of a verbs_context allocated in fake_open_device.
    let v = unsafe { ctx.cast::<u8>().sub(off).cast::<verbs_context>() };
    free(v);
    0
}

unsafe extern "C" fn fake_query_device(ctx: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    let no_atomics = fake().no_atomics.contains_key(&(ctx as usize));
    // SAFETY: the caller's writable attribute struct.
    let a = unsafe { &mut *attr };
    *a = ibv_device_attr::zeroed();
    a.max_qp_wr = 16384;
    a.max_sge = 32;
    a.max_cqe = 65536;
    a.max_qp_rd_atom = 16;
    a.atomic_cap = if no_atomics { 0 } else { 1 };
    a.phys_port_cnt = 1;
    0
}

/// `verbs_context::query_device_ex`.
unsafe extern "C" fn fake_query_device_ex(
    ctx: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    if attr.is_null() || size < core::mem::size_of::<ibv_device_attr_ex>() {
        return libc::EINVAL;
    }
    let mut a = ibv_device_attr_ex::zeroed();
    // SAFETY: forwarded: a live context of the fake and a writable struct.
    let rc = unsafe { (fake_query_device)(ctx, &mut a.orig_attr) };
    if rc != 0 {
        return rc;
    }
    // SAFETY: a live context.
    a.odp_caps = crate::fake_odp::caps(crate::fake_odp::kind(unsafe { (*ctx).device }));
    // SAFETY: the caller's struct, checked to be large enough.
    unsafe { attr.write(a) };
    0
}

/// `ibv_alloc_pd`.
unsafe extern "C" fn fake_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    alloc_pd(ctx)
}

/// `ibv_dealloc_pd`.
unsafe extern "C" fn fake_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    dealloc_pd(pd);
    0
}

/// `ibv_create_cq`.
unsafe extern "C" fn fake_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    _cq_context: *mut c_void,
    _channel: *mut c_void,
    _vector: c_int,
) -> *mut ibv_cq {
    if cqe < 1 {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    create_cq_with(ctx, cqe as u32)
}

/// Allocates a protection domain on `ctx`.
pub fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    let pd: *mut ibv_pd = alloc_zeroed();
    // SAFETY: freshly allocated.
    unsafe { (*pd).context = ctx };
    pd
}

/// Frees a protection domain.
pub fn dealloc_pd(pd: *mut ibv_pd) {
    free(pd);
}

/// Creates a completion queue on `ctx`.
pub fn create_cq(ctx: *mut ibv_context) -> *mut ibv_cq {
    create_cq_with(ctx, 4096)
}

/// Creates a completion queue of exactly `cqe` entries on `ctx` (no rounding up): one more
/// completion overruns it.
pub fn create_cq_with(ctx: *mut ibv_context, cqe: u32) -> *mut ibv_cq {
    let cqe = rounded(&fake(), ctx as usize, cqe);
    let cq: *mut ibv_cq = alloc_zeroed();
    // SAFETY: freshly allocated.
    unsafe {
        (*cq).context = ctx;
        (*cq).cqe = cqe as c_int;
    }
    let mut f = fake();
    f.cqs.insert(cq as usize, VecDeque::new());
    f.cq_depth.insert(cq as usize, cqe as usize);
    cq
}

/// From now on, CQs of `ctx` are created and resized to 2^n - 1 entries, at least the size
/// asked for, as rxe sizes its queues (`rxe_queue.c`).
pub fn round_cq_sizes(ctx: *mut ibv_context) {
    fake().round_cqs.insert(ctx as usize, ());
}

fn rounded(f: &Fake, ctx: usize, cqe: u32) -> u32 {
    if f.round_cqs.contains_key(&ctx) {
        (cqe.saturating_add(1)).next_power_of_two() - 1
    } else {
        cqe
    }
}

/// Whether `cq` overran (a completion arrived while it was full).
pub fn cq_overran(cq: *mut ibv_cq) -> bool {
    fake().cq_overrun.contains_key(&(cq as usize))
}

/// `ibv_resize_cq`: at least `cqe` entries, never fewer than the completions it holds.
unsafe extern "C" fn fake_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let mut f = fake();
    let Some(held) = f.cqs.get(&(cq as usize)).map(VecDeque::len) else {
        return libc::EINVAL;
    };
    if cqe < 1 || (cqe as usize) < held || cqe > 65536 {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ of the fake.
    let cqe = rounded(&f, unsafe { (*cq).context } as usize, cqe as u32) as c_int;
    f.cq_depth.insert(cq as usize, cqe as usize);
    // SAFETY: a live CQ of the fake; the provider updates `cqe` as rxe and mlx5 do.
    unsafe { (*cq).cqe = cqe };
    0
}

/// Creates a shared receive queue in `pd`.
///
/// # Safety
/// `pd` is a live PD of the fake.
pub unsafe fn create_srq(pd: *mut ibv_pd) -> *mut ibv_srq {
    // SAFETY: forwarded contract.
    unsafe { create_srq_with(pd, 32) }
}

/// Creates a shared receive queue in `pd` taking receives of at most `max_sge` SGEs.
///
/// # Safety
/// `pd` is a live PD of the fake.
pub unsafe fn create_srq_with(pd: *mut ibv_pd, max_sge: u32) -> *mut ibv_srq {
    let srq: *mut ibv_srq = alloc_zeroed();
    // SAFETY: freshly allocated; `pd` is live.
    unsafe {
        (*srq).context = (*pd).context;
        (*srq).pd = pd;
    }
    let mut f = fake();
    f.srqs.insert(srq as usize, (pd as usize, VecDeque::new()));
    f.srq_max_sge.insert(srq as usize, max_sge);
    srq
}

unsafe extern "C" fn fake_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut (*attr).attr };
    if a.max_sge == 0 || a.max_sge > 32 {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    a.max_wr = a.max_wr.max(1024);
    // SAFETY: a live PD of the fake.
    unsafe { create_srq_with(pd, a.max_sge) }
}

unsafe extern "C" fn fake_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let f = fake();
    let Some(&max_sge) = f.srq_max_sge.get(&(srq as usize)) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attribute struct.
    unsafe {
        *attr = ibv_srq_attr {
            max_wr: 1024,
            max_sge,
            srq_limit: 0,
        };
    }
    0
}

unsafe extern "C" fn fake_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let mut f = fake();
    if f.cqs.remove(&(cq as usize)).is_none() {
        return libc::EINVAL;
    }
    f.cq_slots.remove(&(cq as usize));
    f.cq_depth.remove(&(cq as usize));
    f.cq_overrun.remove(&(cq as usize));
    if f.ex_cqs.remove(&(cq as usize)).is_some() {
        free(cq.cast::<ibv_cq_ex>());
    } else {
        free(cq);
    }
    0
}

/// `verbs_context::create_cq_ex`: an extended CQ over the same completion queue as
/// [`create_cq`]; `ibv_wc_read_qp_num` exists only if `IBV_WC_EX_WITH_QP_NUM` is asked for, as
/// providers may do.
unsafe extern "C" fn fake_create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: the caller's attributes.
    let a = unsafe { *attr };
    let cq: *mut ibv_cq_ex = alloc_zeroed();
    // SAFETY: freshly allocated.
    let c = unsafe { &mut *cq };
    c.context = ctx;
    c.cqe = a.cqe.max(1) as c_int;
    c.start_poll = Some(fake_start_poll);
    c.next_poll = Some(fake_next_poll);
    c.end_poll = Some(fake_end_poll);
    c.read_opcode = Some(fake_read_opcode);
    c.read_byte_len = Some(fake_read_byte_len);
    c.read_wc_flags = Some(fake_read_wc_flags);
    c.read_completion_ts = Some(fake_read_ts);
    if a.wc_flags & IBV_WC_EX_WITH_QP_NUM != 0 {
        c.read_qp_num = Some(fake_read_qp_num);
    }
    let mut f = fake();
    f.cqs.insert(cq as usize, VecDeque::new());
    f.cq_depth.insert(cq as usize, a.cqe.max(1) as usize);
    f.ex_cqs.insert(cq as usize, None);
    cq
}

/// Moves an extended CQ's session to its next completion (ENOENT when there is none).
fn fake_advance(cq: *mut ibv_cq_ex) -> c_int {
    let mut f = fake();
    let next = f.cqs.get_mut(&(cq as usize)).and_then(|q| q.pop_front());
    if next.is_some() {
        free_send_slots(&mut f, cq as usize);
    }
    let Some(cur) = f.ex_cqs.get_mut(&(cq as usize)) else {
        return libc::EINVAL;
    };
    *cur = next;
    match next {
        Some(w) => {
            f.in_session.insert(cq as usize, ());
            // SAFETY: the caller's live CQ.
            unsafe {
                (*cq).wr_id = w.wr_id;
                (*cq).status = w.status;
            }
            0
        }
        None => {
            // start_poll with nothing releases the lock at once; next_poll keeps it.
            libc::ENOENT
        }
    }
}

unsafe extern "C" fn fake_start_poll(cq: *mut ibv_cq_ex, _attr: *mut ibv_poll_cq_attr) -> c_int {
    {
        let mut f = fake();
        if f.in_session.contains_key(&(cq as usize)) {
            // A real provider would spin forever on its own CQ lock.
            f.poll_blocked += 1;
            return libc::EDEADLK;
        }
    }
    fake_advance(cq)
}

unsafe extern "C" fn fake_next_poll(cq: *mut ibv_cq_ex) -> c_int {
    fake_advance(cq)
}

unsafe extern "C" fn fake_end_poll(cq: *mut ibv_cq_ex) {
    let mut f = fake();
    f.in_session.remove(&(cq as usize));
    if let Some(cur) = f.ex_cqs.get_mut(&(cq as usize)) {
        *cur = None;
    }
}

/// How many WRs were posted through `qp`'s own `ibv_wr_*` builder (the provider's, not the
/// library's).
pub fn builder_posts(qp: *mut ibv_qp) -> u64 {
    let f = fake();
    f.qpns
        .get(&(qp as usize))
        .and_then(|n| f.qps.get(n))
        .map_or(0, |q| q.built_posts)
}

/// The `wr_id` the provider saw on the last WR posted on `qp` (0 before any).
pub fn last_wr_id(qp: *mut ibv_qp) -> u64 {
    let f = fake();
    f.qpns
        .get(&(qp as usize))
        .and_then(|n| f.qps.get(n))
        .map_or(0, |q| q.last_wr_id)
}

/// How many `ibv_poll_cq` calls gave up waiting for another thread's poll session (each would
/// have been a deadlock with a real provider's CQ lock).
pub fn poll_cq_blocked() -> u64 {
    fake().poll_blocked
}

fn fake_current(cq: *mut ibv_cq_ex) -> ibv_wc {
    fake()
        .ex_cqs
        .get(&(cq as usize))
        .copied()
        .flatten()
        .unwrap_or_default()
}

unsafe extern "C" fn fake_read_opcode(cq: *mut ibv_cq_ex) -> u32 {
    fake_current(cq).opcode
}

unsafe extern "C" fn fake_read_byte_len(cq: *mut ibv_cq_ex) -> u32 {
    fake_current(cq).byte_len
}

unsafe extern "C" fn fake_read_wc_flags(cq: *mut ibv_cq_ex) -> u32 {
    fake_current(cq).wc_flags
}

unsafe extern "C" fn fake_read_qp_num(cq: *mut ibv_cq_ex) -> u32 {
    fake_current(cq).qp_num
}

/// The fake's "timestamp": a recognizable function of the completion.
unsafe extern "C" fn fake_read_ts(cq: *mut ibv_cq_ex) -> u64 {
    let w = fake_current(cq);
    0x7500_0000_0000 | u64::from(w.qp_num) << 8 | u64::from(w.opcode)
}

unsafe extern "C" fn fake_destroy_srq(srq: *mut ibv_srq) -> c_int {
    let mut f = fake();
    if f.srqs.remove(&(srq as usize)).is_none() {
        return libc::EINVAL;
    }
    f.srq_max_sge.remove(&(srq as usize));
    drop(f);
    free(srq);
    0
}

unsafe extern "C" fn fake_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { fake_reg_mr_iova2(pd, addr, len, addr as u64, access as c_uint) }
}

unsafe extern "C" fn fake_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded.
    unsafe { fake_reg_mr_iova2(pd, addr, len, iova, access as c_uint) }
}

unsafe extern "C" fn fake_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    if pd.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: a live PD.
    let ctx = unsafe { (*pd).context } as usize;
    let mut f = fake();
    if let Some(e) = f.fail_next_reg.remove(&ctx) {
        set_errno(e);
        return core::ptr::null_mut();
    }
    if len == 0
        || (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
            && access & IBV_ACCESS_LOCAL_WRITE == 0)
    {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    if access & IBV_ACCESS_REMOTE_ATOMIC != 0 && f.no_atomics.contains_key(&ctx) {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    let odp = if access & IBV_ACCESS_ON_DEMAND != 0 {
        // SAFETY: a live context of the fake.
        match crate::fake_odp::kind(unsafe { (*(ctx as *mut ibv_context)).device }) {
            // A device without ODP refuses it (ib_check_mr_access, include/rdma/ib_verbs.h).
            None => {
                set_errno(libc::EOPNOTSUPP);
                return core::ptr::null_mut();
            }
            Some(k) => Some(k == crate::fake_odp::OdpKind::Broken),
        }
    } else {
        None
    };
    let key = f.next_key;
    f.next_key = f.next_key.wrapping_add(0x100 + 7);
    let mr: *mut ibv_mr = alloc_zeroed();
    // SAFETY: freshly allocated.
    unsafe {
        (*mr).context = ctx as *mut ibv_context;
        (*mr).pd = pd;
        (*mr).addr = addr;
        (*mr).length = len;
        (*mr).lkey = key;
        (*mr).rkey = key;
        (*mr).handle = key;
    }
    f.mrs.insert(
        key,
        Mr {
            ctx,
            pd: pd as usize,
            va: addr as u64,
            len: len as u64,
            iova,
            access,
            odp,
        },
    );
    f.mr_keys.insert(mr as usize, key);
    let p = f.pinned.entry(ctx).or_default();
    if odp.is_none() {
        *p += pinned_bytes(addr as u64, len as u64);
    }
    let now = *p;
    let peak = f.peak.entry(ctx).or_default();
    *peak = (*peak).max(now);
    mr
}

unsafe extern "C" fn fake_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    let mut f = fake();
    let Some(key) = f.mr_keys.get(&(mr as usize)).copied() else {
        return IBV_REREG_MR_ERR_INPUT;
    };
    let supported =
        IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS;
    if flags == 0 || flags & !supported != 0 {
        return IBV_REREG_MR_ERR_INPUT;
    }
    if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 && (addr.is_null() || len == 0) {
        return IBV_REREG_MR_ERR_INPUT;
    }
    // Like mlx5, which may give the MR a new mkey: the keys change (ibv_rereg_mr(3) says
    // they may), and the old ones are invalid from now on.
    let Some(mut m) = f.mrs.remove(&key) else {
        return IBV_REREG_MR_ERR_INPUT;
    };
    if flags & IBV_REREG_MR_CHANGE_PD != 0 {
        m.pd = pd as usize;
    }
    if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
        m.access = access as u32;
    }
    if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
        // The old pages are unpinned, the new ones pinned; the IOVA becomes the address.
        let p = f.pinned.entry(m.ctx).or_default();
        if m.odp.is_none() {
            *p -= pinned_bytes(m.va, m.len);
            *p += pinned_bytes(addr as u64, len as u64);
        }
        m.va = addr as u64;
        m.len = len as u64;
        m.iova = addr as u64;
        // SAFETY: a live MR.
        unsafe {
            (*mr).addr = addr;
            (*mr).length = len;
        }
    }
    let pd = (m.pd as *mut ibv_pd).cast::<ibv_pd>();
    let new_key = f.next_key;
    f.next_key = f.next_key.wrapping_add(0x100 + 7);
    f.mrs.insert(new_key, m);
    f.mr_keys.insert(mr as usize, new_key);
    // SAFETY: a live MR.
    unsafe {
        (*mr).pd = pd;
        (*mr).lkey = new_key;
        (*mr).rkey = new_key;
        (*mr).handle = new_key;
    }
    0
}

unsafe extern "C" fn fake_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let mut f = fake();
    let Some(&key) = f.mr_keys.get(&(mr as usize)) else {
        return libc::EINVAL;
    };
    f.mr_keys.remove(&(mr as usize));
    if let Some(m) = f.mrs.remove(&key)
        && m.odp.is_none()
    {
        let p = f.pinned.entry(m.ctx).or_default();
        *p -= pinned_bytes(m.va, m.len);
    }
    drop(f);
    free(mr);
    0
}

// The QP's attributes, spelled out: the two create paths fill them from different structs.
#[allow(clippy::too_many_arguments)]
fn new_qp(
    ctx: usize,
    pd: usize,
    send_cq: usize,
    recv_cq: usize,
    srq: usize,
    qp_type: u32,
    sq_sig_all: bool,
    cap: &mut ibv_qp_cap,
) -> *mut ibv_qp {
    if cap.max_send_wr > 16384
        || cap.max_recv_wr > 16384
        || cap.max_send_sge > 32
        || cap.max_recv_sge > 32
    {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    cap.max_inline_data = cap.max_inline_data.max(64);
    let qpx: *mut ibv_qp_ex = alloc_zeroed();
    let mut f = fake();
    let qpn = f.next_qpn;
    f.next_qpn += 1;
    // SAFETY: freshly allocated.
    unsafe {
        let q = &mut *qpx;
        q.qp_base.context = ctx as *mut ibv_context;
        q.qp_base.pd = pd as *mut ibv_pd;
        q.qp_base.send_cq = send_cq as *mut ibv_cq;
        q.qp_base.recv_cq = recv_cq as *mut ibv_cq;
        q.qp_base.srq = srq as *mut ibv_srq;
        q.qp_base.qp_num = qpn;
        q.qp_base.qp_type = qp_type;
        q.qp_base.state = IBV_QPS_RESET;
        q.wr_start = Some(fbuild_start);
        q.wr_rdma_write = Some(fbuild_rdma_write);
        q.wr_rdma_read = Some(fbuild_rdma_read);
        q.wr_rdma_write_imm = Some(fbuild_rdma_write_imm);
        q.wr_send = Some(fbuild_send);
        q.wr_send_imm = Some(fbuild_send_imm);
        q.wr_set_sge = Some(fbuild_set_sge);
        q.wr_set_inline_data = Some(fbuild_set_inline_data);
        q.wr_complete = Some(fbuild_complete);
        q.wr_abort = Some(fbuild_start);
    }
    f.qps.insert(
        qpn,
        Qp {
            pd,
            send_cq,
            recv_cq,
            srq,
            state: IBV_QPS_RESET,
            dest_qpn: 0,
            ah: ibv_ah_attr::default(),
            access: 0,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            sq_sig_all,
            cap: *cap,
            rq: VecDeque::new(),
            builder: FakeBatch::default(),
            built_posts: 0,
            last_wr_id: 0,
            sq_used: 0,
            sq_unsignaled: 0,
        },
    );
    f.qpns.insert(qpx as usize, qpn);
    qpx.cast()
}

unsafe extern "C" fn fake_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if pd.is_null() || attr.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: caller's live PD and attributes.
    let (a, ctx) = unsafe { (&mut *attr, (*pd).context as usize) };
    new_qp(
        ctx,
        pd as usize,
        a.send_cq as usize,
        a.recv_cq as usize,
        a.srq as usize,
        a.qp_type,
        a.sq_sig_all != 0,
        &mut a.cap,
    )
}

unsafe extern "C" fn fake_create_qp_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if attr.is_null() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: caller's attributes.
    let a = unsafe { &mut *attr };
    new_qp(
        ctx as usize,
        a.pd as usize,
        a.send_cq as usize,
        a.recv_cq as usize,
        a.srq as usize,
        a.qp_type,
        a.sq_sig_all != 0,
        &mut a.cap,
    )
}

unsafe extern "C" fn fake_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let mut f = fake();
    if let Some(e) = f.fail_next_destroy.remove(&(qp as usize)) {
        return e;
    }
    let Some(qpn) = f.qpns.remove(&(qp as usize)) else {
        return libc::EINVAL;
    };
    f.qps.remove(&qpn);
    drop(f);
    free(qp.cast::<ibv_qp_ex>());
    0
}

unsafe extern "C" fn fake_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: caller's attributes.
    let a = unsafe { *attr };
    let mut f = fake();
    let Some(qpn) = f.qpns.get(&(qp as usize)).copied() else {
        return libc::EINVAL;
    };
    let Some(q) = f.qps.get_mut(&qpn) else {
        return libc::EINVAL;
    };
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        q.access = a.qp_access_flags;
    }
    if mask & IBV_QP_DEST_QPN != 0 {
        q.dest_qpn = a.dest_qp_num;
    }
    if mask & IBV_QP_AV != 0 {
        q.ah = a.ah_attr;
    }
    if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
        q.max_rd_atomic = a.max_rd_atomic;
    }
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
        q.max_dest_rd_atomic = a.max_dest_rd_atomic;
    }
    if mask & IBV_QP_STATE != 0 {
        q.state = a.qp_state;
        // SAFETY: a live QP.
        unsafe { (*qp).state = a.qp_state };
        if a.qp_state == IBV_QPS_ERR {
            flush_rq(&mut f, qpn);
        } else if a.qp_state == IBV_QPS_RESET {
            // RESET discards the queue without completions (IBA 10.3.1).
            q.rq.clear();
        }
    }
    0
}

unsafe extern "C" fn fake_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() || init.is_null() {
        return libc::EINVAL;
    }
    let f = fake();
    let Some(q) = f.qpns.get(&(qp as usize)).and_then(|n| f.qps.get(n)) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller's structs.
    let (a, i) = unsafe { (&mut *attr, &mut *init) };
    a.qp_state = q.state;
    a.qp_access_flags = q.access;
    a.dest_qp_num = q.dest_qpn;
    a.ah_attr = q.ah;
    a.max_rd_atomic = q.max_rd_atomic;
    a.max_dest_rd_atomic = q.max_dest_rd_atomic;
    a.cap = q.cap;
    i.cap = q.cap;
    i.sq_sig_all = c_int::from(q.sq_sig_all);
    0
}

unsafe extern "C" fn fake_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    qp.cast()
}

/// Frees the send-queue slots that the completion just polled from `cq` retires.
fn free_send_slots(f: &mut Fake, cq: usize) {
    let Some(Some((qpn, n))) = f.cq_slots.get_mut(&cq).and_then(|d| d.pop_front()) else {
        return;
    };
    if let Some(q) = f.qps.get_mut(&qpn) {
        q.sq_used = q.sq_used.saturating_sub(n);
    }
}

/// Pushes a send completion of `qpn`: polling it frees the slots of every WR posted since the
/// previous one.
fn push_send_cq(f: &mut Fake, cq: usize, qpn: u32, wc: ibv_wc) {
    let n = f
        .qps
        .get_mut(&qpn)
        .map_or(0, |q| core::mem::take(&mut q.sq_unsignaled));
    if overruns(f, cq) {
        return;
    }
    if let Some(q) = f.cqs.get_mut(&cq) {
        q.push_back(wc);
        f.cq_slots.entry(cq).or_default().push_back(Some((qpn, n)));
    }
}

fn push_cq(f: &mut Fake, cq: usize, wc: ibv_wc) {
    if overruns(f, cq) {
        return;
    }
    if let Some(q) = f.cqs.get_mut(&cq) {
        q.push_back(wc);
        f.cq_slots.entry(cq).or_default().push_back(None);
    }
}

/// Whether a completion arriving now overruns `cq` (it is full); marks it overrun, and the
/// completion is lost.
fn overruns(f: &mut Fake, cq: usize) -> bool {
    let (Some(q), Some(&depth)) = (f.cqs.get(&cq), f.cq_depth.get(&cq)) else {
        return false;
    };
    if q.len() < depth {
        return false;
    }
    f.cq_overrun.insert(cq, ());
    true
}

fn flush_rq(f: &mut Fake, qpn: u32) {
    let Some(q) = f.qps.get_mut(&qpn) else {
        return;
    };
    let cq = q.recv_cq;
    let entries: Vec<u64> = q.rq.drain(..).map(|(id, _)| id).collect();
    for wr_id in entries {
        push_cq(
            f,
            cq,
            ibv_wc {
                wr_id,
                status: IBV_WC_WR_FLUSH_ERR,
                qp_num: qpn,
                ..Default::default()
            },
        );
    }
}

/// Translates an lkey-described range to a virtual address, checking it (local side).
fn local_va(f: &Fake, pd: usize, sge: &ibv_sge, write: bool) -> Option<u64> {
    let m = f.mrs.get(&sge.lkey)?;
    let end = sge.addr.checked_add(u64::from(sge.length))?;
    if m.pd != pd || sge.addr < m.iova || end > m.iova + m.len {
        return None;
    }
    if write && m.access & IBV_ACCESS_LOCAL_WRITE == 0 {
        return None;
    }
    Some(m.va + (sge.addr - m.iova))
}

/// Translates a remote range, checking key, bounds and rights (responder side).
fn remote_va(f: &Fake, dest: &Qp, rkey: u32, addr: u64, len: u64, right: u32) -> Option<u64> {
    let m = f.mrs.get(&rkey)?;
    let end = addr.checked_add(len)?;
    if m.pd != dest.pd || addr < m.iova || end > m.iova + m.len {
        return None;
    }
    if m.access & right == 0 || dest.access & right == 0 {
        return None;
    }
    Some(m.va + (addr - m.iova))
}

fn gather(f: &Fake, pd: usize, sges: &[ibv_sge], inline: bool) -> Result<Vec<u8>, u32> {
    let mut out = Vec::new();
    for s in sges {
        if s.length == 0 {
            continue;
        }
        let va = if inline {
            s.addr
        } else {
            local_va(f, pd, s, false).ok_or(IBV_WC_LOC_PROT_ERR)?
        };
        // SAFETY: a range of a registered region (or inline data) of this process.
        out.extend_from_slice(unsafe {
            core::slice::from_raw_parts(va as *const u8, s.length as usize)
        });
    }
    Ok(out)
}

/// The first byte of the ODP MR `key` if its device's ODP data path is the wrong one
/// (crate::fake_odp).
fn broken_odp(f: &Fake, key: u32) -> Option<u64> {
    f.mrs
        .get(&key)
        .filter(|m| m.odp == Some(true))
        .map(|m| m.va)
}

/// A checked local target: address, length, and the first byte of its MR when the wrong
/// ODP data path places its bytes.
type Target = (u64, usize, Option<u64>);

fn scatter_targets(f: &Fake, pd: usize, sges: &[ibv_sge]) -> Result<Vec<Target>, u32> {
    let mut v = Vec::new();
    for s in sges {
        if s.length == 0 {
            continue;
        }
        let va = local_va(f, pd, s, true).ok_or(IBV_WC_LOC_PROT_ERR)?;
        v.push((va, s.length as usize, broken_odp(f, s.lkey)));
    }
    Ok(v)
}

fn scatter(targets: &[Target], data: &[u8]) -> bool {
    let cap: usize = targets.iter().map(|t| t.1).sum();
    if data.len() > cap {
        return false;
    }
    let mut off = 0;
    for (va, len, broken) in targets {
        if off >= data.len() {
            break;
        }
        let n = (*len).min(data.len() - off);
        match broken {
            // SAFETY: a checked range of a registered, writable ODP region of this process.
            Some(floor) => unsafe {
                crate::fake_odp::write_misplaced(*va, *floor, &data[off..off + n])
            },
            // SAFETY: a checked range of a registered, writable region of this process.
            None => unsafe { core::ptr::copy(data.as_ptr().add(off), *va as *mut u8, n) },
        }
        off += n;
    }
    true
}

/// Executes one send WR; returns the requester's completion status.
fn execute(f: &mut Fake, qpn: u32, wr: &ibv_send_wr, sges: &[ibv_sge]) -> u32 {
    let Some(q) = f.qps.get(&qpn) else {
        return IBV_WC_GENERAL_ERR;
    };
    let (pd, dest_qpn) = (q.pd, q.dest_qpn);
    let inline = wr.send_flags & IBV_SEND_INLINE != 0;
    let op = wr.opcode;
    let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
    let dest_ok = f
        .qps
        .get(&dest_qpn)
        .is_some_and(|d| d.state == IBV_QPS_RTR || d.state == IBV_QPS_RTS);
    if !dest_ok && op != IBV_WR_LOCAL_INV {
        return IBV_WC_RETRY_EXC_ERR;
    }
    match op {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => {
            let data = match gather(f, pd, sges, inline) {
                Ok(d) => d,
                Err(s) => return s,
            };
            if total > 0 {
                let Some(d) = f.qps.get(&dest_qpn) else {
                    return IBV_WC_RETRY_EXC_ERR;
                };
                let Some(va) = remote_va(
                    f,
                    d,
                    wr.rdma_rkey(),
                    wr.remote_addr(),
                    total,
                    IBV_ACCESS_REMOTE_WRITE,
                ) else {
                    return IBV_WC_REM_ACCESS_ERR;
                };
                match broken_odp(f, wr.rdma_rkey()) {
                    // SAFETY: a checked range of a registered, remotely writable ODP region.
                    Some(floor) => unsafe { crate::fake_odp::write_misplaced(va, floor, &data) },
                    // SAFETY: a checked range of a registered, remotely writable region.
                    None => unsafe { core::ptr::copy(data.as_ptr(), va as *mut u8, data.len()) },
                }
            }
            if op == IBV_WR_RDMA_WRITE_WITH_IMM {
                return deliver_recv(f, dest_qpn, qpn, &[], total, Some(wr.imm_data), true);
            }
            IBV_WC_SUCCESS
        }
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => {
            let data = match gather(f, pd, sges, inline) {
                Ok(d) => d,
                Err(s) => return s,
            };
            let imm = (op == IBV_WR_SEND_WITH_IMM).then_some(wr.imm_data);
            deliver_recv(f, dest_qpn, qpn, &data, total, imm, false)
        }
        IBV_WR_RDMA_READ => {
            let targets = match scatter_targets(f, pd, sges) {
                Ok(t) => t,
                Err(s) => return s,
            };
            if total == 0 {
                return IBV_WC_SUCCESS;
            }
            let Some(d) = f.qps.get(&dest_qpn) else {
                return IBV_WC_RETRY_EXC_ERR;
            };
            let Some(va) = remote_va(
                f,
                d,
                wr.rdma_rkey(),
                wr.remote_addr(),
                total,
                IBV_ACCESS_REMOTE_READ,
            ) else {
                return IBV_WC_REM_ACCESS_ERR;
            };
            let data = match broken_odp(f, wr.rdma_rkey()) {
                // SAFETY: a checked range of a registered, remotely readable ODP region.
                Some(floor) => unsafe {
                    crate::fake_odp::read_misplaced(va, floor, total as usize)
                },
                None => {
                    // SAFETY: a checked range of a registered, remotely readable region.
                    unsafe { core::slice::from_raw_parts(va as *const u8, total as usize) }.to_vec()
                }
            };
            scatter(&targets, &data);
            IBV_WC_SUCCESS
        }
        IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => {
            let targets = match scatter_targets(f, pd, sges) {
                Ok(t) => t,
                Err(s) => return s,
            };
            if total < 8 {
                return IBV_WC_LOC_LEN_ERR;
            }
            let raddr = wr.remote_addr();
            if !raddr.is_multiple_of(8) {
                return IBV_WC_REM_INV_REQ_ERR;
            }
            let Some(d) = f.qps.get(&dest_qpn) else {
                return IBV_WC_RETRY_EXC_ERR;
            };
            let Some(va) = remote_va(f, d, wr.atomic_rkey(), raddr, 8, IBV_ACCESS_REMOTE_ATOMIC)
            else {
                return IBV_WC_REM_ACCESS_ERR;
            };
            // SAFETY: an aligned, checked 8-byte range of a registered region; accessed
            // atomically as the library's own code does.
            let cell = unsafe { &*(va as *const AtomicU64) };
            let old = if op == IBV_WR_ATOMIC_FETCH_AND_ADD {
                cell.fetch_add(wr.atomic_compare_add(), Ordering::SeqCst)
            } else {
                match cell.compare_exchange(
                    wr.atomic_compare_add(),
                    wr.atomic_swap(),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(v) | Err(v) => v,
                }
            };
            scatter(&targets, &old.to_le_bytes());
            IBV_WC_SUCCESS
        }
        _ => IBV_WC_SUCCESS,
    }
}

/// Consumes a receive of `dest_qpn` for a message from `src_qpn`; returns the requester's
/// status.
fn deliver_recv(
    f: &mut Fake,
    dest_qpn: u32,
    src_qpn: u32,
    data: &[u8],
    total: u64,
    imm: Option<u32>,
    rdma_imm: bool,
) -> u32 {
    let Some(d) = f.qps.get_mut(&dest_qpn) else {
        return IBV_WC_RETRY_EXC_ERR;
    };
    let (dpd, dcq, dsrq) = (d.pd, d.recv_cq, d.srq);
    let entry = if dsrq != 0 {
        f.srqs.get_mut(&dsrq).and_then(|s| s.1.pop_front())
    } else {
        d.rq.pop_front()
    };
    let Some((wr_id, rsges)) = entry else {
        return IBV_WC_RNR_RETRY_EXC_ERR;
    };
    let mut wc = ibv_wc {
        wr_id,
        status: IBV_WC_SUCCESS,
        opcode: if rdma_imm {
            IBV_WC_RECV_RDMA_WITH_IMM
        } else {
            IBV_WC_RECV
        },
        byte_len: total as u32,
        imm_data: imm.unwrap_or(0),
        qp_num: dest_qpn,
        src_qp: src_qpn,
        wc_flags: if imm.is_some() { IBV_WC_WITH_IMM } else { 0 },
        ..Default::default()
    };
    let mut requester = IBV_WC_SUCCESS;
    if !rdma_imm {
        match scatter_targets(f, dpd, &rsges) {
            Ok(t) => {
                if !scatter(&t, data) {
                    wc.status = IBV_WC_LOC_LEN_ERR;
                    requester = IBV_WC_REM_INV_REQ_ERR;
                }
            }
            Err(s) => {
                wc.status = s;
                requester = IBV_WC_REM_OP_ERR;
            }
        }
    }
    push_cq(f, dcq, wc);
    requester
}

unsafe extern "C" fn fake_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if NULL_DATA_PATH.load(Ordering::Relaxed) {
        // SAFETY: forwarded.
        return unsafe { null_post_send(qp, wr) };
    }
    let mut f = fake();
    let Some(qpn) = f.qpns.get(&(qp as usize)).copied() else {
        return libc::EINVAL;
    };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: an element of the caller's list.
        let w = unsafe { *cur };
        let (state, cq, sig_all, max_sge, full) = match f.qps.get(&qpn) {
            Some(q) => (
                q.state,
                q.send_cq,
                q.sq_sig_all,
                q.cap.max_send_sge,
                q.sq_used >= q.cap.max_send_wr,
            ),
            None => return libc::EINVAL,
        };
        if full {
            // As rxe and mlx5 when the send queue has no free entry.
            // SAFETY: the caller's out-pointer.
            unsafe { *bad = cur };
            return libc::ENOMEM;
        }
        if (state != IBV_QPS_RTS && state != IBV_QPS_ERR)
            || w.num_sge < 0
            || (w.num_sge as u32 > max_sge && w.send_flags & IBV_SEND_INLINE == 0)
        {
            // SAFETY: the caller's out-pointer.
            unsafe { *bad = cur };
            return libc::EINVAL;
        }
        let sges: &[ibv_sge] = if w.num_sge == 0 || w.sg_list.is_null() {
            &[]
        } else {
            // SAFETY: the caller's SGE array, valid for the duration of the call.
            unsafe { core::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }
        };
        f.posted += 1;
        if let Some(q) = f.qps.get_mut(&qpn) {
            q.last_wr_id = w.wr_id;
            q.sq_used += 1;
            q.sq_unsignaled += 1;
        }
        let status = if state == IBV_QPS_ERR {
            IBV_WC_WR_FLUSH_ERR
        } else {
            execute(&mut f, qpn, &w, sges)
        };
        if status != IBV_WC_SUCCESS && state != IBV_QPS_ERR {
            if let Some(q) = f.qps.get_mut(&qpn) {
                q.state = IBV_QPS_ERR;
            }
            // SAFETY: a live QP.
            unsafe { (*qp).state = IBV_QPS_ERR };
            flush_rq(&mut f, qpn);
        }
        if status != IBV_WC_SUCCESS || sig_all || w.send_flags & IBV_SEND_SIGNALED != 0 {
            let opcode = crate::completion::wc_opcode_of(w.opcode);
            push_send_cq(
                &mut f,
                cq,
                qpn,
                ibv_wc {
                    wr_id: w.wr_id,
                    status,
                    opcode,
                    byte_len: if w.opcode == IBV_WR_RDMA_READ {
                        sges.iter().map(|s| s.length).sum()
                    } else {
                        0
                    },
                    qp_num: qpn,
                    ..Default::default()
                },
            );
        }
        cur = w.next;
    }
    0
}

fn copy_recv_list(wr: *mut ibv_recv_wr) -> Vec<(*mut ibv_recv_wr, u64, Vec<ibv_sge>)> {
    let mut v = Vec::new();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: an element of the caller's list.
        let w = unsafe { *cur };
        let sges = if w.num_sge <= 0 || w.sg_list.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's SGE array.
            unsafe { core::slice::from_raw_parts(w.sg_list, w.num_sge as usize) }.to_vec()
        };
        v.push((cur, w.wr_id, sges));
        cur = w.next;
    }
    v
}

unsafe extern "C" fn fake_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let list = copy_recv_list(wr);
    let mut f = fake();
    let Some(qpn) = f.qpns.get(&(qp as usize)).copied() else {
        return libc::EINVAL;
    };
    for (ptr, wr_id, sges) in list {
        let Some(q) = f.qps.get_mut(&qpn) else {
            return libc::EINVAL;
        };
        if q.state == IBV_QPS_RESET || q.srq != 0 || sges.len() as u32 > q.cap.max_recv_sge {
            // SAFETY: the caller's out-pointer.
            unsafe { *bad = ptr };
            return libc::EINVAL;
        }
        if q.state == IBV_QPS_ERR {
            let cq = q.recv_cq;
            push_cq(
                &mut f,
                cq,
                ibv_wc {
                    wr_id,
                    status: IBV_WC_WR_FLUSH_ERR,
                    qp_num: qpn,
                    ..Default::default()
                },
            );
        } else {
            q.rq.push_back((wr_id, sges));
        }
    }
    0
}

unsafe extern "C" fn fake_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    _bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let list = copy_recv_list(wr);
    let mut f = fake();
    let max_sge = f.srq_max_sge.get(&(srq as usize)).copied().unwrap_or(0);
    // As rxe and mlx5: a receive with more SGEs than the SRQ takes is refused.
    if list.iter().any(|(_, _, sges)| sges.len() as u32 > max_sge) {
        return libc::EINVAL;
    }
    let Some(s) = f.srqs.get_mut(&(srq as usize)) else {
        return libc::EINVAL;
    };
    for (_, wr_id, sges) in list {
        s.1.push_back((wr_id, sges));
    }
    0
}

unsafe extern "C" fn fake_poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if NULL_DATA_PATH.load(Ordering::Relaxed) {
        // SAFETY: forwarded.
        return unsafe { null_poll_cq(cq, n, wc) };
    }
    // Wait for another thread's poll session to end, as the provider's CQ lock makes it.
    let mut f = fake();
    let mut deadline = None;
    while f.in_session.contains_key(&(cq as usize)) {
        let limit = *deadline
            .get_or_insert_with(|| std::time::Instant::now() + std::time::Duration::from_secs(2));
        if std::time::Instant::now() > limit {
            f.poll_blocked += 1;
            return -1;
        }
        drop(f);
        std::thread::sleep(std::time::Duration::from_millis(1));
        f = fake();
    }
    if !f.cqs.contains_key(&(cq as usize)) || f.cq_overrun.contains_key(&(cq as usize)) {
        return -1;
    }
    let mut i = 0;
    while i < n.max(0) as usize {
        let Some(w) = f.cqs.get_mut(&(cq as usize)).and_then(|q| q.pop_front()) else {
            break;
        };
        free_send_slots(&mut f, cq as usize);
        // SAFETY: `i < n`, inside the caller's array.
        unsafe { wc.add(i).write(w) };
        i += 1;
    }
    i as c_int
}

unsafe extern "C" fn fake_req_notify_cq(_cq: *mut ibv_cq, _solicited: c_int) -> c_int {
    0
}

// The provider's own `ibv_wr_*` builder, as providers have it: the opcode call reads the
// QP's `wr_id` and `wr_flags`; setters apply to the last WR; inline data is copied at the call
// and longer than the QP's `max_inline_data` fails the batch; `wr_complete` posts the batch
// (all of it or, on an error found before posting, nothing) and `wr_abort` discards it. The
// library hands warm inline WRs to it and leaves QPs it does not manage to it.

/// One WR of a fake builder batch.
struct Built {
    wr: ibv_send_wr,
    sges: Vec<ibv_sge>,
    inline: Option<Vec<u8>>,
}

/// A fake QP's open builder batch.
#[derive(Default)]
struct FakeBatch {
    wrs: Vec<Built>,
    /// The first error a call of the batch ran into (`wr_complete` returns it).
    error: Option<c_int>,
}

/// Runs `f` on the fake QP of `qpx` (nothing if the QP is unknown).
fn with_qp(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut Qp)) {
    let mut g = fake();
    if let Some(qpn) = g.qpns.get(&(qpx as usize)).copied()
        && let Some(q) = g.qps.get_mut(&qpn)
    {
        f(q);
    }
}

/// Runs `f` on the builder batch of `qpx` (nothing if the QP is unknown).
fn with_batch(qpx: *mut ibv_qp_ex, f: impl FnOnce(&mut FakeBatch, &ibv_qp_cap)) {
    with_qp(qpx, |q| f(&mut q.builder, &q.cap));
}

fn builder_push(qpx: *mut ibv_qp_ex, opcode: u32, rkey: u32, raddr: u64, imm: u32) {
    // SAFETY: a live fake QP.
    let (wr_id, flags) = unsafe { ((*qpx).wr_id, (*qpx).wr_flags) };
    with_batch(qpx, |b, _| {
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = wr_id;
        wr.send_flags = flags;
        wr.opcode = opcode;
        wr.imm_data = imm;
        wr.set_rdma(raddr, rkey);
        b.wrs.push(Built {
            wr,
            sges: Vec::new(),
            inline: None,
        });
    });
}

unsafe extern "C" fn fbuild_start(qpx: *mut ibv_qp_ex) {
    with_batch(qpx, |b, _| *b = FakeBatch::default());
}

unsafe extern "C" fn fbuild_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    builder_push(qpx, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}

unsafe extern "C" fn fbuild_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, imm: u32) {
    builder_push(qpx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}

unsafe extern "C" fn fbuild_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    builder_push(qpx, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

unsafe extern "C" fn fbuild_send(qpx: *mut ibv_qp_ex) {
    builder_push(qpx, IBV_WR_SEND, 0, 0, 0);
}

unsafe extern "C" fn fbuild_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    builder_push(qpx, IBV_WR_SEND_WITH_IMM, 0, 0, imm);
}

unsafe extern "C" fn fbuild_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    with_batch(qpx, |b, _| {
        if let Some(last) = b.wrs.last_mut() {
            last.sges = vec![ibv_sge { addr, length, lkey }];
            last.inline = None;
        }
    });
}

unsafe extern "C" fn fbuild_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    let data = if len == 0 || addr.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller's buffer of `len` bytes, copied now (as the API requires).
        unsafe { core::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec()
    };
    with_batch(qpx, |b, cap| {
        if data.len() > cap.max_inline_data as usize {
            b.error.get_or_insert(libc::EINVAL);
        }
        if let Some(last) = b.wrs.last_mut() {
            last.sges.clear();
            last.inline = Some(data);
        }
    });
}

unsafe extern "C" fn fbuild_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let mut batch = FakeBatch::default();
    with_batch(qpx, |b, _| batch = std::mem::take(b));
    if let Some(e) = batch.error {
        return e;
    }
    for mut built in batch.wrs {
        let wr = &mut built.wr;
        if let Some(data) = built.inline.as_mut() {
            wr.send_flags |= IBV_SEND_INLINE;
            built.sges = vec![ibv_sge {
                addr: data.as_mut_ptr() as u64,
                length: data.len() as u32,
                lkey: 0,
            }];
        }
        wr.sg_list = built.sges.as_mut_ptr();
        wr.num_sge = built.sges.len() as c_int;
        let mut bad = core::ptr::null_mut();
        // SAFETY: a live fake QP and a one-element list whose SGEs and data outlive the call.
        let rc = unsafe { fake_post_send(qpx.cast(), wr, &mut bad) };
        if rc != 0 {
            return rc;
        }
        with_qp(qpx, |q| q.built_posts += 1);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closing_a_context_releases_what_it_still_had() {
        let verbs = real_verbs();
        // SAFETY: the fake's device handle.
        let ctx = unsafe { (verbs.open_device)(device_without_atomics()) };
        let pd = alloc_pd(ctx);
        let mut buf = vec![0u8; 3 * 4096];
        // SAFETY: a live PD and a buffer that outlives the registration's use here.
        let mr = unsafe {
            (verbs.reg_mr)(
                pd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                IBV_ACCESS_LOCAL_WRITE as c_int,
            )
        };
        assert!(!mr.is_null());
        fail_next_registration(ctx, libc::ENOMEM);
        assert!(pinned(ctx) > 0);
        assert_eq!(mr_count(ctx), 1);
        // SAFETY: the MR is live until the close.
        let lkey = unsafe { (*mr).lkey };
        // SAFETY: closed once; the MR is not used through the library afterwards.
        assert_eq!(unsafe { (verbs.close_device)(ctx) }, 0);
        // The next context may be allocated at the same address: it must start clean.
        assert_eq!((pinned(ctx), peak(ctx), mr_count(ctx)), (0, 0, 0));
        let f = fake();
        assert!(!f.mrs.contains_key(&lkey), "the MR's key still works");
        assert!(!f.mr_keys.contains_key(&(mr as usize)));
        assert!(!f.no_atomics.contains_key(&(ctx as usize)));
        assert!(!f.fail_next_reg.contains_key(&(ctx as usize)));
        drop(f);
        free(pd);
    }
}
