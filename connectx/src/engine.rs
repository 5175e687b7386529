//! The library's state and everything that happens between an application's verbs call and the
//! provider: virtual registrations, the window cache, QP and CQ records, work-request
//! translation and completion rewriting. The design is docs/connectx.md.
//!
//! Locking order (never taken in the other direction): a QP's `send` lock → a CQ's lock → the
//! engine's `state` lock → a queue's tracker lock (a deregistration forgets its region in the
//! trackers under `state`) → the registry.

use core::ffi::{c_int, c_void};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::completion::{NO_WAITER, Origin, Outcome, RecvTracker, SendTracker, SignalRun, WinList};
use crate::config::{Config, Mode};
use crate::directory::{DirHeader, DmaBuf, LeaseBook};
use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::registry;
use crate::remote::RemoteRegion;
use crate::spin::SpinLock;
use crate::status::{Counters, PageStore};
use crate::sys::*;
use crate::translate::{Geometry, PlanError, PlannedRemote, PlannedSge, RemoteClass, SgeClass};
use crate::window::{
    CacheError, Keys, RegionId, Registrar, WindowCache, WindowId, WindowSpec, WindowUse,
};

/// Extra send queue entries per QP for the library's own work requests and for splits.
const SQ_RESERVE: u32 = 16;
/// Directory entries a region may have (its directory stays ≤ 1 MiB + 8 KiB).
const MAX_WINDOWS_PER_REGION: u64 = 1 << 17;

thread_local! {
    static IN_REAL: Cell<u32> = const { Cell::new(0) };
}

/// Marks the current thread as inside a call into libibverbs: hooks entered meanwhile (the
/// real `ibv_reg_mr` jumps through the PLT to `ibv_reg_mr_iova2`, which is ours) pass straight
/// through.
pub(crate) struct RealCall;

impl RealCall {
    /// Enters.
    pub(crate) fn enter() -> Self {
        IN_REAL.with(|c| c.set(c.get() + 1));
        RealCall
    }
}

impl Drop for RealCall {
    fn drop(&mut self) {
        IN_REAL.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Whether this thread is inside a real libibverbs call.
pub(crate) fn in_real_call() -> bool {
    IN_REAL.with(|c| c.get() > 0)
}

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// Reads `errno`.
pub(crate) fn errno() -> c_int {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// What a device can do, read once when its context is opened.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DevCaps {
    pub max_sge: u32,
    pub max_qp_wr: u32,
    /// The device's CQ size limit (`max_cqe`), the most a CQ is widened to.
    pub max_cqe: u32,
    pub atomics: bool,
}

/// An opened device context.
pub(crate) struct CtxRec {
    pub engine: Arc<Engine>,
    pub ctx: usize,
    pub orig: ibv_context_ops,
    pub orig_create_qp_ex: Option<CreateQpExFn>,
    pub orig_create_cq_ex: Option<CreateCqExFn>,
    pub vctx: usize,
    pub caps: DevCaps,
    /// Why this context is in pass-through, if it is (set once; read on every post).
    pub passthrough: std::sync::OnceLock<&'static str>,
}

// SAFETY: the saved operations are function pointers and opaque provider pointers that are
// never written after the context is opened; the rest is Sync.
unsafe impl Send for CtxRec {}
// SAFETY: as above.
unsafe impl Sync for CtxRec {}

impl CtxRec {
    pub(crate) fn passthrough(&self) -> Option<&'static str> {
        self.passthrough.get().copied()
    }
}

/// A virtual region: one application registration.
pub(crate) struct Region {
    pub id: RegionId,
    pub ctx: usize,
    pub pd: usize,
    pub va: u64,
    pub len: u64,
    pub iova: u64,
    pub access: u32,
    pub geom: Geometry,
    pub header: DirHeader,
    pub dir: DmaBuf,
    pub dir_mr: usize,
    /// The ring MR (crate::directory: the ticket word and request slots, the only part of the
    /// directory peers may write); 0 for a region without remote rights.
    pub ring_mr: usize,
    /// Pinned bytes of the directory and its ring MR (which pins its pages a second time,
    /// as the kernel counts them).
    pub dir_pinned: u64,
    pub leases: LeaseBook,
    pub generation: u64,
    pub stall_since: Option<Instant>,
    /// The next lease-ring ticket to serve. Kept here and only published to the directory's
    /// SERVED word (read-only to peers; the owner never takes its position from peer memory).
    pub served: u64,
    /// The process that registered the region: a child made by `fork()` does not serve its
    /// parent's regions (crate::fork).
    pub owner_pid: u32,
}

impl Region {
    /// Whether this process's helper serves the region's request ring.
    pub(crate) fn served_here(&self) -> bool {
        self.header.exported && self.owner_pid == crate::fork::pid()
    }

    /// Where window `index` lies.
    pub(crate) fn window_spec(&self, index: u64) -> WindowSpec {
        let (start, end) = self.geom.window_range(index);
        WindowSpec {
            va: self.va.wrapping_add(start - self.iova),
            iova: start,
            len: end - start,
        }
    }

    /// An address past the directory: an SGE or remote address pointed here with the region's
    /// key fails the NIC's bounds check, exactly like an out-of-region access on plain verbs.
    pub(crate) fn poison_addr(&self) -> u64 {
        self.dir.len() as u64
    }
}

/// Everything behind the engine's lock.
pub(crate) struct State {
    pub regions: FastMap<RegionId, Region>,
    pub by_mr: FastMap<usize, RegionId>,
    pub by_lkey: FastMap<(usize, u32), RegionId>,
    pub passthrough_mrs: FastMap<usize, u64>,
    pub cache: WindowCache,
    pub next_region: RegionId,
    /// Bytes of windows leased to peers.
    pub leased_bytes: u64,
    /// Bytes of windows QPs hold for their warm path ([`LocalHold`]); at most a quarter of
    /// the budget.
    pub held_bytes: u64,
}

/// The provider side of the window cache.
pub(crate) struct Provider<'a> {
    pub real: &'a RealVerbs,
    pub regions: &'a FastMap<RegionId, Region>,
}

impl Registrar for Provider<'_> {
    fn register(&mut self, id: WindowId, spec: &WindowSpec) -> Result<Keys, i32> {
        let r = self.regions.get(&id.region).ok_or(libc::EINVAL)?;
        let _g = RealCall::enter();
        set_errno(0);
        // SAFETY: `r.pd` is the live PD the application registered the region in; the window
        // lies inside the region, which the application keeps mapped while it is registered.
        let mr = unsafe {
            (self.real.reg_mr_iova2)(
                r.pd as *mut ibv_pd,
                spec.va as *mut c_void,
                spec.len as usize,
                spec.iova,
                r.access,
            )
        };
        if mr.is_null() {
            let e = errno();
            return Err(if e == 0 { libc::ENOMEM } else { e });
        }
        // SAFETY: the provider returned a valid MR.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Keys {
            lkey,
            rkey,
            handle: mr as usize,
        })
    }

    fn deregister(&mut self, _id: WindowId, keys: &Keys) {
        let _g = RealCall::enter();
        // SAFETY: `handle` is an MR this cache registered and has not deregistered.
        unsafe {
            (self.real.dereg_mr)(keys.handle as *mut ibv_mr);
        }
    }

    fn evicting(&mut self, id: WindowId) {
        if let Some(r) = self.regions.get(&id.region)
            && r.header.exported
        {
            r.dir.store(r.header.entry_off(id.index), 0);
        }
    }
}

/// Locks a mutex, ignoring poisoning (a panic elsewhere must not wedge every later call).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The library instance: one per process in the preloaded library, one per test otherwise.
pub struct Engine {
    pub(crate) real: RealVerbs,
    pub(crate) cfg: Config,
    pub(crate) state: Mutex<State>,
    pub(crate) status: PageStore,
    helper_started: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// Moves on when local holds must no longer be used ([`LocalHold`]): a region was
    /// deregistered or re-registered, or the budget needs the held windows back.
    pub(crate) hold_epoch: AtomicU64,
    /// A peer's lease was refused for want of room while windows were held: the helper
    /// thread takes the holds back.
    pub(crate) holds_wanted: AtomicBool,
    /// Held by the helper thread for a batch of work, by context tear-down (so that the
    /// provider never closes a context while a batch may still use its objects) and across
    /// `fork()` (crate::fork).
    pub(crate) helper_gate: Mutex<()>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cfg", &self.cfg).finish()
    }
}

impl Engine {
    /// An engine over `real` with configuration `cfg`, counting into `status`.
    pub fn new(real: RealVerbs, cfg: Config, status: PageStore) -> Arc<Self> {
        let engine = Arc::new(Self {
            real,
            state: Mutex::new(State {
                regions: FastMap::default(),
                by_mr: FastMap::default(),
                by_lkey: FastMap::default(),
                passthrough_mrs: FastMap::default(),
                cache: WindowCache::new(cfg.budget),
                next_region: 1,
                leased_bytes: 0,
                held_bytes: 0,
            }),
            cfg,
            status,
            helper_started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            hold_epoch: AtomicU64::new(1),
            holds_wanted: AtomicBool::new(false),
            helper_gate: Mutex::new(()),
        });
        crate::fork::register(&engine);
        engine
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.status.page().counters
    }

    /// The status page (counters, reasons).
    pub fn status(&self) -> &PageStore {
        &self.status
    }

    /// Logs a pass-through (or other notable) reason once and records it for doctor.
    pub(crate) fn note(&self, reason: &str) {
        // The log line once per process; the status page of every engine that met the reason
        // records it (one engine per process in use, several in the tests).
        crate::log::once(reason);
        static PAGE_WRITERS: Mutex<()> = Mutex::new(());
        let _serial = lock(&PAGE_WRITERS);
        self.status.page().add_reason(reason);
    }

    /// Publishes the cache's gauges to the status page.
    pub(crate) fn publish(&self, st: &State) {
        let page = self.status.page();
        page.set_pinned(st.cache.pinned());
        // The cache's own peak also covers moments between two publications.
        page.counters
            .pinned_peak
            .fetch_max(st.cache.peak(), Ordering::Relaxed);
        let c = &page.counters;
        c.windows.store(st.cache.len() as u64, Ordering::Relaxed);
        let s = st.cache.stats();
        c.window_registrations
            .store(s.registrations, Ordering::Relaxed);
        c.evictions.store(s.evictions, Ordering::Relaxed);
        c.regions.store(st.regions.len() as u64, Ordering::Relaxed);
    }

    /// Ends in-flight uses of windows.
    #[inline]
    pub(crate) fn release(&self, windows: &WinList) {
        if !windows.is_empty() {
            self.release_windows(windows);
        }
    }

    fn release_windows(&self, windows: &WinList) {
        let mut pins = false;
        {
            let mut st = lock(&self.state);
            for w in windows.iter() {
                if crate::fallback::is_pin(&w) {
                    pins = true;
                } else {
                    st.cache.release(w);
                }
            }
        }
        if pins {
            crate::fallback::unpin(windows);
        }
    }

    /// Deregisters every window of region `id` (`ibv_dereg_mr`, `ibv_rereg_mr`), under the
    /// state lock: their leases end, each leased window leaving the owner's lease count once
    /// at its pinned size; no hold of them is used from now on (their keys die here); and no
    /// record of a QP or SRQ refers to them any more.
    fn drop_region_windows(&self, st: &mut State, id: RegionId) {
        let State {
            regions,
            cache,
            leased_bytes,
            ..
        } = st;
        *leased_bytes = leased_bytes.saturating_sub(cache.leased_bytes_of(id));
        let mut prov = Provider {
            real: &self.real,
            regions,
        };
        self.hold_epoch.fetch_add(1, Ordering::AcqRel);
        cache.remove_region(id, &mut prov);
        self.forget_region_in_trackers(id);
    }

    /// Drops the windows of region `id` (just removed from the cache, under the state lock)
    /// from every record of its QPs and SRQs: completions arriving later must not release a
    /// new registration of the same window (`ibv_rereg_mr` keeps the region). Called under the
    /// state lock, so that no hold of the region can be retired into a tracker meanwhile.
    fn forget_region_in_trackers(&self, id: RegionId) {
        // Destroyed QPs too: one being destroyed may not have given up its windows yet.
        for q in registry::qps_of(self)
            .into_iter()
            .chain(registry::gone_qps_of(self))
        {
            let mut t = q.track.lock();
            t.send.forget_region(id);
            t.recv.forget_region(id);
        }
        for s in registry::srqs_of(self) {
            s.track.lock().forget_region(id);
        }
    }

    /// Takes back the windows QPs hold for their warm path ([`LocalHold`]) when the budget
    /// has no room: no hold is used from now on, and every QP whose posting side is free
    /// (`own`, whose side the caller holds, included) ends its hold and posts a barrier whose
    /// completion releases the window. Returns the QPs that posted one: polling their CQs
    /// brings the windows back.
    pub(crate) fn revoke_holds(
        self: &Arc<Self>,
        own: Option<(&QpCtl, &mut SendSide)>,
    ) -> Vec<Arc<QpCtl>> {
        // With nothing held, moving the epoch on would only cost every QP its next hold; the
        // QPs are still visited, for markers whose barrier was refused before.
        if lock(&self.state).held_bytes > 0 {
            self.hold_epoch.fetch_add(1, Ordering::AcqRel);
        }
        let mut posted = Vec::new();
        let own_qp = own.as_ref().map_or(0, |(q, _)| q.qp);
        let own_posted = match own {
            Some((q, side)) => q.surrender_hold(side),
            None => false,
        };
        for q in registry::qps_of(self) {
            if q.qp == own_qp {
                if own_posted {
                    posted.push(q);
                }
                continue;
            }
            // A side that is busy belongs to a thread that is posting: it sees the new epoch
            // and retires its hold itself. Holding the side keeps a registered QP alive (see
            // poll_for_others).
            let surrendered = match q.send.try_lock() {
                Some(mut side) => q.is_registered() && q.surrender_hold(&mut side),
                None => false,
            };
            if surrendered {
                posted.push(q);
            }
        }
        posted
    }

    /// Starts the helper thread that serves peers' lease requests (once).
    pub(crate) fn ensure_helper(self: &Arc<Self>) {
        if self.helper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        // The helper is born with every signal blocked (a thread inherits its creator's
        // mask): signals sent to the process are for the application's threads, whose
        // handlers must not run on the library's. Faults of the helper itself are still
        // delivered.
        // SAFETY: all-zero is a valid sigset_t, which sigfillset fills; pthread_sigmask
        // changes this thread's mask only, and the old mask is put back right after the spawn.
        let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        }
        let spawned = std::thread::Builder::new()
            .name("nprdma-helper".into())
            .spawn(move || crate::remote::helper_loop(weak));
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
        if spawned.is_err() {
            self.helper_started.store(false, Ordering::Release);
            self.note("could not start the helper thread: peers cannot reach unpinned memory");
        }
    }

    /// In a child made by `fork()`, from the fork handler (crate::fork), with the child's only
    /// thread: the parent's helper thread does not exist here, so the next registration with
    /// remote access starts one; the status page becomes a private copy.
    pub(crate) fn after_fork_in_child(&self) {
        self.helper_started.store(false, Ordering::Release);
        let reason = if self.status.privatize_after_fork() {
            "forked child: its status page is a private copy (nprdma doctor does not list it); regions of the parent are not served here"
        } else {
            "forked child: its status page could not be made private and is shared with the parent"
        };
        // Recorded, not logged: a child that runs another program next (fork and exec) must
        // not print a line.
        self.status.page().add_reason(reason);
    }

    // ---------------------------------------------------------------- contexts

    /// Called after the provider opened `ctx`: saves and wraps its data-path operations.
    ///
    /// # Safety
    /// `ctx` is a context the provider just returned, not yet used by the application.
    pub(crate) unsafe fn on_open(self: &Arc<Self>, ctx: *mut ibv_context) {
        if ctx.is_null() || self.cfg.mode == Mode::Off {
            return;
        }
        let mut attr = ibv_device_attr::zeroed();
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: live context; `attr` is writable.
            unsafe { (self.real.query_device)(ctx, &mut attr) }
        };
        let caps = if rc == 0 {
            DevCaps {
                max_sge: attr.max_sge.max(1) as u32,
                max_qp_wr: attr.max_qp_wr.max(1) as u32,
                max_cqe: attr.max_cqe.max(1) as u32,
                atomics: attr.atomic_cap != IBV_ATOMIC_NONE,
            }
        } else {
            DevCaps {
                max_sge: 1,
                max_qp_wr: 1,
                max_cqe: 1,
                atomics: false,
            }
        };
        // SAFETY: live context.
        let c = unsafe { &mut *ctx };
        let orig = c.ops;
        let (vctx, orig_create_qp_ex, orig_create_cq_ex) = if c.abi_compat == VERBS_ABI_IS_EXTENDED
        {
            let off = core::mem::offset_of!(verbs_context, context);
            // SAFETY: an extended context is the last field of its verbs_context (verbs.h
            // verbs_get_ctx), so the verbs_context starts `off` bytes before it.
            let v = unsafe { &mut *(ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
            // verbs.h verbs_get_ctx_op: a field exists if `sz` reaches back to it.
            let has = |field_off: usize| v.sz >= core::mem::size_of::<verbs_context>() - field_off;
            let qp_ex = if has(core::mem::offset_of!(verbs_context, create_qp_ex)) {
                v.create_qp_ex
            } else {
                None
            };
            let cq_ex = if has(core::mem::offset_of!(verbs_context, create_cq_ex)) {
                v.create_cq_ex
            } else {
                None
            };
            if qp_ex.is_some() || cq_ex.is_some() {
                (v as *mut verbs_context as usize, qp_ex, cq_ex)
            } else {
                (0, None, None)
            }
        } else {
            (0, None, None)
        };
        let rec = Arc::new(CtxRec {
            engine: self.clone(),
            ctx: ctx as usize,
            orig,
            orig_create_qp_ex,
            orig_create_cq_ex,
            vctx,
            caps,
            passthrough: std::sync::OnceLock::new(),
        });
        if !caps.atomics {
            self.note("device has no atomics: regions with remote access are registered in pass-through (pinned)");
        }
        registry::add_ctx(rec);
        c.ops.post_send = Some(crate::ops::wrapped_post_send);
        c.ops.post_recv = Some(crate::ops::wrapped_post_recv);
        c.ops.poll_cq = Some(crate::ops::wrapped_poll_cq);
        c.ops.post_srq_recv = orig
            .post_srq_recv
            .map(|_| crate::ops::wrapped_post_srq_recv as PostSrqRecvFn);
        if vctx != 0 && orig_create_qp_ex.is_some() {
            // SAFETY: checked above that the verbs_context is large enough to hold this field.
            unsafe {
                (*(vctx as *mut verbs_context)).create_qp_ex =
                    Some(crate::ops::wrapped_create_qp_ex);
            }
        }
        if vctx != 0 && orig_create_cq_ex.is_some() {
            // SAFETY: as above.
            unsafe {
                (*(vctx as *mut verbs_context)).create_cq_ex =
                    Some(crate::cq_ex::wrapped_create_cq_ex);
            }
        }
    }

    /// Called before the provider closes `ctx`: forgets what the application left open in it,
    /// then restores its operations.
    ///
    /// Closing a context with QPs and MRs still open is allowed (the kernel destroys them
    /// with it), but the library's records of them must go first, while the context is alive:
    /// a later eviction would otherwise deregister a window of a freed context, and their pins
    /// would stay counted against the budget.
    ///
    /// # Safety
    /// `ctx` is a live context about to be closed.
    pub(crate) unsafe fn on_close(&self, ctx: *mut ibv_context) {
        let c = ctx as usize;
        for q in registry::qps_of(self)
            .into_iter()
            .filter(|q| q.ctx.ctx == c)
        {
            self.on_destroy_qp(q.qp as *mut ibv_qp);
        }
        for s in registry::srqs_of(self).into_iter().filter(|s| s.ctx == c) {
            let windows = s.track.lock().drain();
            self.release(&windows);
        }
        let (regions, passthrough): (Vec<usize>, Vec<usize>) = {
            let st = lock(&self.state);
            (
                st.by_mr
                    .iter()
                    .filter(|(_, id)| st.regions.get(id).is_some_and(|r| r.ctx == c))
                    .map(|(mr, _)| *mr)
                    .collect(),
                st.passthrough_mrs.keys().copied().collect(),
            )
        };
        for mr in regions {
            // SAFETY: a live MR of the live context (the application registered it there and
            // has not deregistered it).
            if unsafe { self.dereg_mr(mr as *mut ibv_mr) } != 0 {
                self.forget_region_of_mr(mr);
            }
        }
        for mr in passthrough {
            // SAFETY: pass-through MRs in the map are live (removed at their deregistration).
            if unsafe { (*(mr as *mut ibv_mr)).context } as usize == c
                && let Some(len) = lock(&self.state).passthrough_mrs.remove(&mr)
            {
                // Left to the kernel's cleanup at close, like the application's other objects.
                self.counters()
                    .passthrough_bytes
                    .fetch_sub(len, Ordering::Relaxed);
            }
        }
        if let Some(rec) = registry::remove_ctx(c) {
            // SAFETY: still live (closed after this returns).
            unsafe {
                (*ctx).ops = rec.orig;
                if rec.vctx != 0 {
                    let v = rec.vctx as *mut verbs_context;
                    if rec.orig_create_qp_ex.is_some() {
                        (*v).create_qp_ex = rec.orig_create_qp_ex;
                    }
                    if rec.orig_create_cq_ex.is_some() {
                        (*v).create_cq_ex = rec.orig_create_cq_ex;
                    }
                }
            }
        }
        // A helper batch that may still use this context's objects has ended once the gate
        // is free: the provider's close comes after it.
        drop(lock(&self.helper_gate));
    }

    // ---------------------------------------------------------------- registration

    /// `ibv_reg_mr*` for a context we manage. Returns the MR the application sees, or NULL
    /// with errno set.
    ///
    /// # Safety
    /// `pd` is a live PD of a context opened through the library.
    pub(crate) unsafe fn reg_mr(
        self: &Arc<Self>,
        rec: &CtxRec,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        iova: u64,
        access: u32,
    ) -> *mut ibv_mr {
        let passthrough = |why: &str| -> *mut ibv_mr {
            self.note(why);
            // SAFETY: forwarded unchanged.
            unsafe { self.real_reg(pd, addr, len, iova, access) }
        };
        if let Some(why) = rec.passthrough() {
            return passthrough(why);
        }
        if access & IBV_ACCESS_ON_DEMAND != 0 {
            return passthrough(
                "ODP region (IBV_ACCESS_ON_DEMAND) is already unpinned: pass-through",
            );
        }
        if access & IBV_ACCESS_MW_BIND != 0 {
            return passthrough(
                "region with IBV_ACCESS_MW_BIND: memory windows need the real MR: pass-through",
            );
        }
        if access & IBV_ACCESS_ZERO_BASED != 0 {
            return passthrough("zero-based region (IBV_ACCESS_ZERO_BASED): pass-through");
        }
        if crate::transport::pd_passes_through(pd as usize, access) {
            return passthrough(
                "region with remote access in a PD with a UC QP: pass-through (transport.rs)",
            );
        }
        let exported = access
            & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)
            != 0;
        if exported && !rec.caps.atomics {
            return passthrough(
                "device has no atomics: regions with remote access are registered in pass-through (pinned)",
            );
        }
        // The checks plain verbs makes (ibv_reg_mr(3)): remote write/atomic need local write.
        if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
            && access & IBV_ACCESS_LOCAL_WRITE == 0
        {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        let va = addr as u64;
        let len64 = len as u64;
        if len == 0 || va.checked_add(len64).is_none() || iova.checked_add(len64).is_none() {
            set_errno(libc::EINVAL);
            return core::ptr::null_mut();
        }
        if !range_is_mapped(va, len64, access & IBV_ACCESS_LOCAL_WRITE != 0) {
            set_errno(libc::EFAULT);
            return core::ptr::null_mut();
        }

        // Window size: the configured one, or larger so that the directory stays bounded.
        let mut shift = self.cfg.window.trailing_zeros();
        while len64.div_ceil(1 << shift) + 1 > MAX_WINDOWS_PER_REGION {
            shift += 1;
        }
        let geom = Geometry {
            iova,
            len: len64,
            window_shift: shift,
        };
        let mut header = DirHeader::for_region(
            exported,
            iova,
            len64,
            shift as u8,
            geom.window_count() as u32,
        );
        header.instance = random_u64();
        if iova < header.dir_len.next_multiple_of(4096) {
            return passthrough(
                "region whose IOVA range overlaps the directory at IOVA 0: pass-through",
            );
        }
        let Some(dir) = DmaBuf::new(header.dir_len as usize) else {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        };
        // Peers aim out-of-region accesses at `dir_len`: it must be the registered length.
        header.dir_len = dir.len() as u64;
        dir.write(0, &header.encode());
        let ring_pinned = {
            let start = header.ticket_off() / 4096 * 4096;
            let end = (header.ticket_off() + header.ring_len()).next_multiple_of(4096);
            if header.ring_len() == 0 {
                0
            } else {
                end - start
            }
        };
        let dir_pinned = dir.len() as u64 + ring_pinned;

        let mut st = lock(&self.state);
        {
            let State { regions, cache, .. } = &mut *st;
            let mut prov = Provider {
                real: &self.real,
                regions,
            };
            if cache.charge_fixed(dir_pinned, &mut prov).is_err() {
                set_errno(libc::ENOMEM);
                return core::ptr::null_mut();
            }
        }
        // The directory is read-only to peers; only the ring MR below may be written (and its
        // ticket word incremented) remotely.
        let dir_access = if exported {
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
        } else {
            IBV_ACCESS_LOCAL_WRITE
        };
        let mr = {
            let _g = RealCall::enter();
            // SAFETY: `dir` is our own mapping of `dir.len()` bytes; registered at IOVA 0.
            unsafe { (self.real.reg_mr_iova2)(pd, dir.as_ptr().cast(), dir.len(), 0, dir_access) }
        };
        if mr.is_null() {
            let e = errno();
            st.cache.uncharge_fixed(dir_pinned);
            set_errno(if e == 0 { libc::ENOMEM } else { e });
            return core::ptr::null_mut();
        }
        let mut ring_mr: *mut ibv_mr = core::ptr::null_mut();
        if exported {
            ring_mr = {
                let _g = RealCall::enter();
                // SAFETY: the ring lies inside our own mapping `dir`; registered at IOVA = its
                // offset, so peers address it with the directory's offsets.
                unsafe {
                    (self.real.reg_mr_iova2)(
                        pd,
                        dir.as_ptr().add(header.ticket_off() as usize).cast(),
                        header.ring_len() as usize,
                        header.ticket_off(),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC,
                    )
                }
            };
            if ring_mr.is_null() {
                let e = errno();
                {
                    let _g = RealCall::enter();
                    // SAFETY: the directory MR just registered, not yet known to anyone.
                    unsafe { (self.real.dereg_mr)(mr) };
                }
                st.cache.uncharge_fixed(dir_pinned);
                set_errno(if e == 0 { libc::ENOMEM } else { e });
                return core::ptr::null_mut();
            }
            // SAFETY: the provider returned a valid MR.
            header.ring_rkey = unsafe { (*ring_mr).rkey };
            dir.write(0, &header.encode());
        }
        // SAFETY: the provider returned a valid MR; the application sees its addr/length as the
        // region's (restored before the real deregistration, which reads them).
        let lkey = unsafe {
            (*mr).addr = addr;
            (*mr).length = len;
            (*mr).lkey
        };
        let id = st.next_region;
        st.next_region += 1;
        st.regions.insert(
            id,
            Region {
                id,
                ctx: rec.ctx,
                pd: pd as usize,
                va,
                len: len64,
                iova,
                access,
                geom,
                header,
                dir,
                dir_mr: mr as usize,
                ring_mr: ring_mr as usize,
                dir_pinned,
                leases: LeaseBook::new(usize::from(header.lease_cap)),
                generation: 0,
                stall_since: None,
                served: 0,
                owner_pid: crate::fork::pid(),
            },
        );
        st.by_mr.insert(mr as usize, id);
        st.by_lkey.insert((rec.ctx, lkey), id);
        self.counters()
            .registered_bytes
            .fetch_add(len64, Ordering::Relaxed);
        self.publish(&st);
        drop(st);
        if exported {
            self.ensure_helper();
        }
        mr
    }

    /// Registers in pass-through, counting the bytes.
    ///
    /// # Safety
    /// As `ibv_reg_mr_iova2`.
    pub(crate) unsafe fn real_reg(
        &self,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        iova: u64,
        access: u32,
    ) -> *mut ibv_mr {
        let mr = {
            let _g = RealCall::enter();
            // SAFETY: forwarded unchanged.
            unsafe { (self.real.reg_mr_iova2)(pd, addr, len, iova, access) }
        };
        if !mr.is_null() {
            self.counters()
                .passthrough_bytes
                .fetch_add(len as u64, Ordering::Relaxed);
            lock(&self.state)
                .passthrough_mrs
                .insert(mr as usize, len as u64);
        }
        mr
    }

    /// Whether `mr` is a virtual region of this engine.
    pub(crate) fn owns_mr(&self, mr: *mut ibv_mr) -> bool {
        lock(&self.state).by_mr.contains_key(&(mr as usize))
    }

    /// `ibv_dereg_mr`.
    ///
    /// # Safety
    /// `mr` is an MR returned by a registration of this engine (virtual or pass-through).
    pub(crate) unsafe fn dereg_mr(&self, mr: *mut ibv_mr) -> c_int {
        self.before_dereg(mr);
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.get(&(mr as usize)).copied() else {
            let len = st.passthrough_mrs.remove(&(mr as usize));
            drop(st);
            let _g = RealCall::enter();
            // SAFETY: a pass-through MR, forwarded.
            let rc = unsafe { (self.real.dereg_mr)(mr) };
            if rc == 0
                && let Some(len) = len
            {
                self.counters()
                    .passthrough_bytes
                    .fetch_sub(len, Ordering::Relaxed);
            }
            return rc;
        };
        // Also when the deregistration below fails: the windows are gone either way.
        self.drop_region_windows(&mut st, id);
        let Some(region) = st.regions.get(&id) else {
            return libc::EINVAL;
        };
        let (va, len, dir_ptr, dir_len, lkey, ctx) = (
            region.va,
            region.len,
            region.dir.as_ptr(),
            region.dir.len(),
            // SAFETY: the directory MR is live until the real deregistration below.
            unsafe { (*mr).lkey },
            region.ctx,
        );
        // SAFETY: restore what the provider registered, so libibverbs' dofork bookkeeping in
        // ibv_dereg_mr sees the directory's range, not the application's.
        unsafe {
            (*mr).addr = dir_ptr.cast();
            (*mr).length = dir_len;
        }
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: the directory MR, registered by us.
            unsafe { (self.real.dereg_mr)(mr) }
        };
        if rc != 0 {
            // Still registered (e.g. EBUSY: memory windows bound): keep the region usable.
            // SAFETY: the MR is still live.
            unsafe {
                (*mr).addr = va as *mut c_void;
                (*mr).length = len as usize;
            }
            return rc;
        }
        if let Some(r) = st.regions.remove(&id) {
            if r.ring_mr != 0 {
                let _g = RealCall::enter();
                // SAFETY: the region's ring MR, registered by us, deregistered once; its
                // memory (`r.dir`) is unmapped only when `r` is dropped below.
                unsafe { (self.real.dereg_mr)(r.ring_mr as *mut ibv_mr) };
            }
            st.cache.uncharge_fixed(r.dir_pinned);
        }
        st.by_mr.remove(&(mr as usize));
        st.by_lkey.remove(&(ctx, lkey));
        self.counters()
            .registered_bytes
            .fetch_sub(len, Ordering::Relaxed);
        self.publish(&st);
        0
    }

    /// Forgets the region of `mr` whose deregistration failed while its context closes (the
    /// kernel destroys it with the context): its directory pin, keys and bytes are no longer
    /// counted. Its windows went in the failed [`dereg_mr`](Self::dereg_mr).
    fn forget_region_of_mr(&self, mr: usize) {
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.remove(&mr) else {
            return;
        };
        st.by_lkey.retain(|_, r| *r != id);
        if let Some(r) = st.regions.remove(&id) {
            st.cache.uncharge_fixed(r.dir_pinned);
            self.counters()
                .registered_bytes
                .fetch_sub(r.len, Ordering::Relaxed);
        }
        self.publish(&st);
    }

    /// `ibv_rereg_mr` on a virtual region.
    ///
    /// # Safety
    /// `mr` is a virtual region of this engine; `pd`/`addr` as in `ibv_rereg_mr`.
    pub(crate) unsafe fn rereg_mr(
        &self,
        mr: *mut ibv_mr,
        flags: c_int,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        access: c_int,
    ) -> c_int {
        let supported =
            IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
        if flags == 0 || flags & !supported != 0 {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        let mut st = lock(&self.state);
        let Some(id) = st.by_mr.get(&(mr as usize)).copied() else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        let Some(r) = st.regions.get(&id) else {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        };
        let new_access = if flags & IBV_REREG_MR_CHANGE_ACCESS != 0 {
            access as u32
        } else {
            r.access
        };
        let (new_va, new_len) = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            (addr as u64, len as u64)
        } else {
            (r.va, r.len)
        };
        if new_len == 0
            || new_va.checked_add(new_len).is_none()
            || (new_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
                && new_access & IBV_ACCESS_LOCAL_WRITE == 0)
        {
            set_errno(libc::EINVAL);
            return IBV_REREG_MR_ERR_INPUT;
        }
        if !range_is_mapped(new_va, new_len, new_access & IBV_ACCESS_LOCAL_WRITE != 0) {
            set_errno(libc::EFAULT);
            return IBV_REREG_MR_ERR_INPUT;
        }
        let exported = new_access
            & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)
            != 0;
        // A new translation keeps the IOVA the region had (ibv_rereg_mr(3) sets iova = addr).
        let new_iova = if flags & IBV_REREG_MR_CHANGE_TRANSLATION != 0 {
            new_va
        } else {
            r.iova
        };
        let geom = Geometry {
            iova: new_iova,
            len: new_len,
            window_shift: r.geom.window_shift,
        };
        let mut header = DirHeader::for_region(
            exported,
            new_iova,
            new_len,
            r.header.window_shift,
            geom.window_count() as u32,
        );
        header.instance = random_u64();
        // The directory cannot grow (the application holds its MR): refuse what does not fit,
        // and a directory that was registered without remote rights cannot gain them.
        if header.dir_len > r.dir.len() as u64
            || (exported && !r.header.exported)
            || new_iova < (r.dir.len() as u64)
        {
            set_errno(libc::EOPNOTSUPP);
            return IBV_REREG_MR_ERR_INPUT;
        }
        header.dir_len = r.dir.len() as u64;
        let region_ctx = r.ctx;
        let ring_mr = r.ring_mr;
        if flags & IBV_REREG_MR_CHANGE_PD != 0 {
            // SAFETY: the directory MR, live.
            let old_lkey = unsafe { (*mr).lkey };
            let rc = {
                let _g = RealCall::enter();
                // SAFETY: our directory MR; only the PD changes.
                unsafe {
                    (self.real.rereg_mr)(
                        mr,
                        IBV_REREG_MR_CHANGE_PD,
                        pd,
                        core::ptr::null_mut(),
                        0,
                        0,
                    )
                }
            };
            if rc != 0 {
                return rc;
            }
            if ring_mr != 0 {
                let rc = {
                    let _g = RealCall::enter();
                    // SAFETY: the region's ring MR; only the PD changes, as for the directory.
                    unsafe {
                        (self.real.rereg_mr)(
                            ring_mr as *mut ibv_mr,
                            IBV_REREG_MR_CHANGE_PD,
                            pd,
                            core::ptr::null_mut(),
                            0,
                            0,
                        )
                    }
                };
                if rc != 0 {
                    return rc;
                }
            }
            // The provider may have given the MR new keys (ibv_rereg_mr(3); mlx5 can): SGEs
            // carry the new lkey from now on.
            // SAFETY: as above.
            let new_lkey = unsafe { (*mr).lkey };
            if new_lkey != old_lkey {
                st.by_lkey.remove(&(region_ctx, old_lkey));
                st.by_lkey.insert((region_ctx, new_lkey), id);
            }
        }
        // The region stays, with new windows; its lease book is renewed below.
        self.drop_region_windows(&mut st, id);
        let old_len;
        {
            let Some(r) = st.regions.get_mut(&id) else {
                return IBV_REREG_MR_ERR_CMD;
            };
            old_len = r.len;
            if flags & IBV_REREG_MR_CHANGE_PD != 0 {
                r.pd = pd as usize;
            }
            r.va = new_va;
            r.len = new_len;
            r.iova = new_iova;
            r.access = new_access;
            r.geom = geom;
            r.header = header;
            r.leases = LeaseBook::new(usize::from(header.lease_cap));
            r.generation += 1;
            // Clear the ring and entries (tickets and the served count restart at 0), then
            // publish the new header.
            r.served = 0;
            r.stall_since = None;
            if exported && r.ring_mr != 0 {
                // SAFETY: the ring MR is live (its keys may have changed with its PD).
                header.ring_rkey = unsafe { (*(r.ring_mr as *mut ibv_mr)).rkey };
                r.header = header;
            }
            r.dir.write(0, &vec![0u8; r.dir.len()]);
            r.dir.write(0, &header.encode());
            // SAFETY: the directory MR is live; the application sees the new range.
            unsafe {
                (*mr).addr = new_va as *mut c_void;
                (*mr).length = new_len as usize;
            }
        }
        let c = self.counters();
        c.registered_bytes.fetch_sub(old_len, Ordering::Relaxed);
        c.registered_bytes.fetch_add(new_len, Ordering::Relaxed);
        self.publish(&st);
        0
    }

    // ---------------------------------------------------------------- QPs

    /// Widens a QP's requested capabilities for splits and the library's own WRs.
    pub(crate) fn widen_caps(rec: &CtxRec, cap: &mut ibv_qp_cap) {
        let c = rec.caps;
        cap.max_send_wr = cap
            .max_send_wr
            .saturating_add(cap.max_send_wr / 2 + SQ_RESERVE)
            .min(c.max_qp_wr.max(cap.max_send_wr));
        cap.max_send_sge = Self::widen_sge(rec, cap.max_send_sge);
        cap.max_recv_sge = Self::widen_sge(rec, cap.max_recv_sge);
    }

    /// An SGE limit of `n` widened for splits (each application SGE may cross a window
    /// boundary), within the device's limit.
    pub(crate) fn widen_sge(rec: &CtxRec, n: u32) -> u32 {
        n.max(1)
            .saturating_mul(2)
            .max(n.saturating_add(2))
            .min(rec.caps.max_sge.max(n))
    }

    /// Records a QP the provider created.
    ///
    /// # Safety
    /// `qp` is a live QP just created on a context of `rec`.
    pub(crate) unsafe fn on_create_qp(
        self: &Arc<Self>,
        rec: &Arc<CtxRec>,
        qp: *mut ibv_qp,
        real_cap: ibv_qp_cap,
        app_cap: ibv_qp_cap,
        sq_sig_all: bool,
        with_ex: bool,
    ) {
        // SAFETY: live QP.
        let q = unsafe { &*qp };
        let qpx = if with_ex {
            // SAFETY: live QP created with send ops flags.
            unsafe { (self.real.qp_to_qp_ex)(qp) }
        } else {
            core::ptr::null_mut()
        };
        // The provider's own builder, saved before wrap_qp_ex replaces it in `qpx`.
        let provider = if qpx.is_null() {
            None
        } else {
            // SAFETY: the provider's ibv_qp_ex of this live QP.
            unsafe { crate::ops::ProviderBuilder::of(qpx) }
        };
        let ctl = Arc::new(QpCtl {
            engine: self.clone(),
            ctx: rec.clone(),
            qp: qp as usize,
            qp_num: q.qp_num,
            qp_type: q.qp_type,
            sq_sig_all,
            send_cq: q.send_cq as usize,
            recv_cq: q.recv_cq as usize,
            srq: q.srq as usize,
            pd: q.pd as usize,
            max_send_sge: real_cap.max_send_sge.max(1) as usize,
            max_recv_sge: real_cap.max_recv_sge.max(1) as usize,
            max_inline_data: real_cap.max_inline_data,
            signal_every: (real_cap.max_send_wr / 2).clamp(1, 64),
            held_off: u64::from(q.qp_type != IBV_QPT_RC || rec.orig.post_send.is_none()),
            held_post: rec.orig.post_send.unwrap_or(no_post_send),
            dest_qpn: AtomicU32::new(0),
            send: SpinLock::new(SendSide::default()),
            builder: crate::ops::BatchCell::new(provider),
            track: TrackLock::new(Trackers {
                send: SendTracker::with_tag(random_u64()),
                recv: RecvTracker::with_tag(random_u64()),
            }),
            internal_done: Mutex::new(FastMap::default()),
            next_token: AtomicU64::new(1),
            app_view: Mutex::new(AppView {
                cap: app_cap,
                access: None,
                max_rd_atomic: None,
                max_dest_rd_atomic: None,
            }),
        });
        // The template's SGE pointer is set once, now that the record has its final place.
        {
            let mut side = ctl.send.lock();
            let held = &mut side.held;
            held.wr.sg_list = &mut held.sge;
        }
        registry::add_qp(ctl);
        // SAFETY: the QP's send CQ, live while the QP is.
        unsafe {
            crate::cq_room::add_qp(self, rec, qp as usize, q.send_cq, real_cap.max_send_wr);
        }
        self.on_transport(q.pd as usize, q.qp_type);
        if !qpx.is_null() {
            // SAFETY: the provider's ibv_qp_ex of this QP; the application has not used it.
            unsafe { crate::ops::wrap_qp_ex(qpx) };
        }
    }

    /// `ibv_modify_qp` for a managed QP: keeps what the library needs (remote read, write and
    /// atomic rights on RC, at least one outstanding read) and notes the peer's QP number.
    ///
    /// # Safety
    /// As `ibv_modify_qp`.
    pub(crate) unsafe fn modify_qp(
        &self,
        ctl: &QpCtl,
        qp: *mut ibv_qp,
        attr: *mut ibv_qp_attr,
        mask: c_int,
    ) -> c_int {
        if attr.is_null() {
            let _g = RealCall::enter();
            // SAFETY: forwarded unchanged; the provider reports the error.
            return unsafe { (self.real.modify_qp)(qp, attr, mask) };
        }
        // SAFETY: the application passed a valid attribute struct.
        let app = unsafe { *attr };
        let mut a = app;
        if ctl.qp_type == IBV_QPT_RC {
            if mask & IBV_QP_ACCESS_FLAGS != 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
                if ctl.ctx.caps.atomics {
                    a.qp_access_flags |= IBV_ACCESS_REMOTE_ATOMIC;
                }
            }
            if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 && a.max_dest_rd_atomic == 0 {
                a.max_dest_rd_atomic = 1;
            }
            if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 && a.max_rd_atomic == 0 {
                a.max_rd_atomic = 1;
            }
        }
        if mask & IBV_QP_DEST_QPN != 0 {
            ctl.dest_qpn.store(a.dest_qp_num, Ordering::Release);
        }
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: `a` is a valid copy of the application's attributes.
            unsafe { (self.real.modify_qp)(qp, &mut a, mask) }
        };
        if rc == 0 {
            let mut view = lock(&ctl.app_view);
            if mask & IBV_QP_ACCESS_FLAGS != 0 {
                view.access = Some(app.qp_access_flags);
            }
            if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
                view.max_rd_atomic = Some(app.max_rd_atomic);
            }
            if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
                view.max_dest_rd_atomic = Some(app.max_dest_rd_atomic);
            }
        }
        if rc == 0
            && mask & IBV_QP_STATE != 0
            && (a.qp_state == IBV_QPS_ERR || a.qp_state == IBV_QPS_RESET)
        {
            self.drop_lessee(ctl.ctx.ctx, ctl.qp_num);
        }
        if rc == 0 && mask & IBV_QP_STATE != 0 && a.qp_state == IBV_QPS_RESET {
            // RESET discards the queued work requests without completions: the NIC touches
            // none of their buffers again, so their windows go. The records stay, for
            // completions already in the CQ (as when the QP is destroyed).
            // The peers' ends of this QP's connection ended its leases when it went to error
            // or reset (and the QP may be connected to another peer next): what it knew of
            // their regions (window keys, lease mirrors) is stale, so it is found out again
            // on next use.
            let windows = {
                let mut side = ctl.send.lock();
                side.remote.clear();
                side.hot_remote = None;
                ctl.track.lock().take_all_windows()
            };
            self.release(&windows);
        }
        rc
    }

    /// Ends every lease held through local QP `qp_num` (the connection is gone).
    pub(crate) fn drop_lessee(&self, ctx: usize, qp_num: u32) {
        let mut st = lock(&self.state);
        let State {
            regions,
            cache,
            leased_bytes,
            ..
        } = &mut *st;
        for r in regions.values_mut() {
            if r.ctx != ctx {
                continue;
            }
            for w in r.leases.drop_lessee(qp_num) {
                let id = WindowId {
                    region: r.id,
                    index: w,
                };
                let bytes = cache.spec(id).map_or(0, |s| s.pinned_bytes());
                cache.remove_lease(id);
                if cache.refs(id).is_some_and(|(_, l)| l == 0) {
                    *leased_bytes = leased_bytes.saturating_sub(bytes);
                }
            }
        }
    }

    /// Forgets a QP before the provider destroys it.
    /// Destroys the library's side of `qp` at once (a context being closed: the kernel
    /// destroys the QP with it).
    pub(crate) fn on_destroy_qp(&self, qp: *mut ibv_qp) {
        if let Some(ctl) = self.begin_destroy_qp(qp) {
            self.finish_destroy_qp(ctl);
        }
    }

    /// First half of `ibv_destroy_qp`, before the provider's: the data path no longer finds
    /// the QP. Its windows stay pinned until [`finish_destroy_qp`](Self::finish_destroy_qp):
    /// the NIC may still be executing its work requests.
    pub(crate) fn begin_destroy_qp(&self, qp: *mut ibv_qp) -> Option<Arc<QpCtl>> {
        registry::remove_qp(qp as usize)
    }

    /// The provider refused to destroy the QP (e.g. `EBUSY`): it is alive, and managed again.
    pub(crate) fn abort_destroy_qp(&self, ctl: Arc<QpCtl>) {
        registry::add_qp(ctl);
    }

    /// Second half of `ibv_destroy_qp`, once the provider has destroyed the QP: its leases,
    /// batch, windows, hold and scratch buffer go.
    pub(crate) fn finish_destroy_qp(&self, ctl: Arc<QpCtl>) {
        // SAFETY: the QP is destroyed; its send CQ cannot have been destroyed before it.
        unsafe { crate::cq_room::remove_qp(self, ctl.qp) };
        {
            // CQs remember the QP of their last completion: forget it (its number may be reused).
            for cq in [ctl.send_cq, ctl.recv_cq] {
                if let Some(c) = registry::cq(cq) {
                    let mut inner = c.stash.lock();
                    if inner
                        .last_qp
                        .as_ref()
                        .is_some_and(|(n, _)| *n == ctl.qp_num)
                    {
                        inner.last_qp = None;
                    }
                }
            }
            self.drop_lessee(ctl.ctx.ctx, ctl.qp_num);
            if ctl.builder.is_open() {
                // Destroyed between ibv_wr_start and ibv_wr_complete (the application's
                // error): end the batch so that its lock is not held forever.
                crate::ops::close_batch(&ctl);
            }
            // Under the posting side's lock: a thread revoking holds that got it first has
            // finished (its marker and barrier are in the tracker now); one that comes later
            // finds the QP unregistered and leaves it alone.
            let (mut windows, settled, scratch, hold) = {
                let mut side = ctl.send.lock();
                let mut t = ctl.track.lock();
                let windows = t.take_all_windows();
                (
                    windows,
                    t.is_settled(),
                    side.scratch.take(),
                    side.hold.take(),
                )
            };
            if settled {
                registry::forget_gone_qp(&ctl);
            }
            if let Some(h) = hold {
                let mut st = lock(&self.state);
                st.held_bytes = st.held_bytes.saturating_sub(h.bytes);
                // Released only if still the same registration (WindowCache::release).
                windows.push(h.used);
            }
            self.release(&windows);
            if let Some(s) = scratch {
                self.free_scratch(s);
            }
        }
    }
}

/// The library's pinned buffer for a QP's own work requests (directory reads, requests).
pub(crate) struct Scratch {
    pub buf: DmaBuf,
    pub mr: usize,
    pub lkey: u32,
}

impl Engine {
    /// Registers a scratch buffer in `pd`.
    pub(crate) fn alloc_scratch(&self, pd: usize) -> Option<Scratch> {
        let buf = DmaBuf::new(4096)?;
        let mut st = lock(&self.state);
        {
            let State { regions, cache, .. } = &mut *st;
            let mut prov = Provider {
                real: &self.real,
                regions,
            };
            cache.charge_fixed(4096, &mut prov).ok()?;
        }
        let mr = {
            let _g = RealCall::enter();
            // SAFETY: our own page, registered in the QP's live PD.
            unsafe {
                (self.real.reg_mr_iova2)(
                    pd as *mut ibv_pd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    buf.as_ptr() as u64,
                    IBV_ACCESS_LOCAL_WRITE,
                )
            }
        };
        if mr.is_null() {
            st.cache.uncharge_fixed(4096);
            return None;
        }
        self.publish(&st);
        // SAFETY: valid MR.
        let lkey = unsafe { (*mr).lkey };
        Some(Scratch {
            buf,
            mr: mr as usize,
            lkey,
        })
    }

    fn free_scratch(&self, s: Scratch) {
        {
            let _g = RealCall::enter();
            // SAFETY: the scratch MR registered in `alloc_scratch`.
            unsafe {
                (self.real.dereg_mr)(s.mr as *mut ibv_mr);
            }
        }
        let mut st = lock(&self.state);
        st.cache.uncharge_fixed(4096);
        self.publish(&st);
    }
}

/// Send and receive trackers of a QP.
pub(crate) struct Trackers {
    pub send: SendTracker,
    pub recv: RecvTracker,
}

impl Trackers {
    /// Takes every window of the records, keeping the records ([`SendTracker::take_windows`]).
    fn take_all_windows(&mut self) -> WinList {
        let mut w = self.send.take_windows();
        w.extend(self.recv.take_windows());
        w
    }

    /// Whether no recorded WR can complete any more.
    pub(crate) fn is_settled(&self) -> bool {
        self.send.outstanding() == 0 && self.recv.outstanding() == 0
    }
}

/// A QP's trackers behind their lock, with a hint readable without it: how many send records
/// were outstanding when the lock was last released.
///
/// Completions of WRs the library did not record pass through unchanged, and a QP used only
/// that way has no send records: its completions then need no lock. A hint of zero is exact
/// for any completion the poller holds: a recorded WR's record (and a nonzero hint) is made
/// before the WR is posted and is removed only by that WR's own completion (or by a refused
/// post, when there is no completion), and the completion cannot be read before the provider
/// has it, which happens after the post.
pub(crate) struct TrackLock {
    lock: SpinLock<Trackers>,
    recorded_sends: AtomicUsize,
}

impl TrackLock {
    pub(crate) fn new(trackers: Trackers) -> Self {
        Self {
            recorded_sends: AtomicUsize::new(trackers.send.outstanding()),
            lock: SpinLock::new(trackers),
        }
    }

    /// Locks the trackers; the guard updates the hint and unlocks.
    #[inline]
    pub(crate) fn lock(&self) -> TrackGuard<'_> {
        TrackGuard {
            guard: self.lock.lock(),
            hint: &self.recorded_sends,
        }
    }

    /// Whether any send record may be outstanding (see the type's documentation).
    #[inline]
    pub(crate) fn has_recorded_sends(&self) -> bool {
        self.recorded_sends.load(Ordering::Acquire) != 0
    }
}

/// The lock of a [`TrackLock`].
pub(crate) struct TrackGuard<'a> {
    guard: crate::spin::SpinGuard<'a, Trackers>,
    hint: &'a AtomicUsize,
}

impl core::ops::Deref for TrackGuard<'_> {
    type Target = Trackers;
    fn deref(&self) -> &Trackers {
        &self.guard
    }
}

impl core::ops::DerefMut for TrackGuard<'_> {
    fn deref_mut(&mut self) -> &mut Trackers {
        &mut self.guard
    }
}

impl Drop for TrackGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Still under the lock (the inner guard unlocks after this).
        self.hint
            .store(self.guard.send.outstanding(), Ordering::Release);
    }
}

/// The last remote window the warm path translated to: the application's `rkey`, the
/// window's address range `[lo, hi)` and the peer's key for it.
#[derive(Clone, Copy)]
pub(crate) struct HotRemote {
    rkey: u32,
    lo: u64,
    hi: u64,
    wkey: u32,
}

/// A local window an RC QP keeps registered for its warm path by holding one in-flight count
/// of its own on it: a warm WR whose SGE lies in it pins nothing and needs no record, so it is
/// posted with the application's `wr_id` and its completion passes through untouched.
///
/// A hold ends when the QP's warm path moves to another window, when [`Engine::hold_epoch`]
/// moves on (a region was deregistered, or the budget needs held windows back), or when the
/// QP is destroyed. Its window may still be in use by WRs posted before then, so it is not
/// released at once: it is retired into the send tracker ([`SendTracker::retire`]) and
/// released when a WR posted afterwards completes, the send queue completing in order
/// (IBA vol. 1, 10.8.6). docs/connectx.md §3.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalHold {
    /// The application's lkey.
    lkey: u32,
    /// The window's range `[lo, hi)` in the region's address space.
    lo: u64,
    hi: u64,
    /// The window's own lkey.
    wlkey: u32,
    /// The window and the registration its in-flight count was taken on.
    used: WindowUse,
    bytes: u64,
    /// [`Engine::hold_epoch`] when taken.
    epoch: u64,
}

/// State used only while posting on a QP (under its `send` lock).
#[derive(Default)]
pub(crate) struct SendSide {
    pub batch: Batch,
    /// What this QP knows of its peers' regions. Whoever changes it clears `hot_remote`.
    pub remote: FastMap<u32, RemoteRegion>,
    /// One-entry cache in front of `remote` for the warm path (most WRs of a QP target the
    /// same peer window as the previous one).
    pub hot_remote: Option<HotRemote>,
    pub scratch: Option<Scratch>,
    /// Unsignaled recorded WRs since the last signaled one.
    pub signals: SignalRun,
    /// The local window this QP holds for its warm path, if any.
    pub hold: Option<LocalHold>,
    /// The WR that [`QpCtl::try_post_held`] hands to the provider.
    pub held: HeldWr,
}

/// All ones if `a < b`, else zero (the borrow of `a - b`, computed without a comparison, so
/// that or-ing several of them leaves one branch; see [`QpCtl::try_post_held`]).
#[inline(always)]
fn miss_below(a: u64, b: u64) -> u64 {
    ((u128::from(a).wrapping_sub(u128::from(b))) >> 64) as u64
}

/// Opcodes of the held-window path with a remote range (a bit per `ibv_wr_opcode`).
const HELD_REMOTE_OPS: u32 =
    1 << IBV_WR_RDMA_WRITE | 1 << IBV_WR_RDMA_WRITE_WITH_IMM | 1 << IBV_WR_RDMA_READ;
/// Opcodes of the held-window path without one.
const HELD_LOCAL_OPS: u32 = 1 << IBV_WR_SEND | 1 << IBV_WR_SEND_WITH_IMM;

/// A QP's template for the held-window path: a WR whose fields outside those the path writes
/// stay zero, and its one SGE.
pub(crate) struct HeldWr {
    wr: ibv_send_wr,
    sge: ibv_sge,
}

impl Default for HeldWr {
    fn default() -> Self {
        let mut wr = ibv_send_wr::zeroed();
        wr.num_sge = 1;
        Self {
            wr,
            sge: ibv_sge::default(),
        }
    }
}

// SAFETY: the batch's WRs hold pointers only into its own SGE vector, and the held template's
// `sg_list` only into the template itself (rewritten before every post, so a stale value after
// a move is never used); SendSide is only used under its QP's lock.
unsafe impl Send for SendSide {}

impl SendSide {
    /// The peer's key for `[raddr, raddr + len)` of the region the application calls `rkey`,
    /// if it lies in one window this QP already holds a key for (the warm path); `None`
    /// otherwise (the general path decides, asking the peer if needed).
    #[inline(always)]
    pub(crate) fn remote_window_key(&mut self, rkey: u32, raddr: u64, len: u64) -> Option<u32> {
        let end = raddr.checked_add(len)?;
        if let Some(h) = self.hot_remote
            && h.rkey == rkey
            && raddr >= h.lo
            && end <= h.hi
        {
            return Some(h.wkey);
        }
        self.remote_window_key_known(rkey, raddr, len, end)
    }

    /// [`remote_window_key`](Self::remote_window_key) past the one-entry cache.
    #[inline(never)]
    fn remote_window_key_known(
        &mut self,
        rkey: u32,
        raddr: u64,
        len: u64,
        end: u64,
    ) -> Option<u32> {
        let Some(RemoteRegion::Library(l)) = self.remote.get(&rkey) else {
            return None;
        };
        if !l.header.exported || !l.geom.contains(raddr, len) {
            return None;
        }
        let index = l.geom.window_of(raddr);
        if l.geom.window_of(end - 1) != index {
            return None;
        }
        let wkey = l.rkeys.get(&index).copied()?;
        let (lo, hi) = l.geom.window_range(index);
        self.hot_remote = Some(HotRemote { rkey, lo, hi, wkey });
        Some(wkey)
    }
}

/// [`QpCtl::held_post`] of a provider without `post_send` (never called: `held_off` is set).
unsafe extern "C" fn no_post_send(
    _qp: *mut ibv_qp,
    _wr: *mut ibv_send_wr,
    _bad: *mut *mut ibv_send_wr,
) -> c_int {
    libc::EOPNOTSUPP
}

/// A managed QP.
pub(crate) struct QpCtl {
    pub engine: Arc<Engine>,
    pub ctx: Arc<CtxRec>,
    pub qp: usize,
    pub qp_num: u32,
    pub qp_type: u32,
    pub sq_sig_all: bool,
    pub send_cq: usize,
    pub recv_cq: usize,
    pub srq: usize,
    pub pd: usize,
    pub max_send_sge: usize,
    pub max_recv_sge: usize,
    /// The provider's inline limit for this QP (longer inline data fails in the provider).
    pub max_inline_data: u32,
    pub signal_every: u32,
    /// Zero when the held path ([`try_post_held`](Self::try_post_held)) may post on this QP:
    /// an RC QP whose provider has a `post_send`.
    held_off: u64,
    /// The provider's `post_send` for the held path (a stub where there is none).
    held_post: PostSendFn,
    pub dest_qpn: AtomicU32,
    /// Posting state; also held by an open `ibv_wr_*` batch from `wr_start` to
    /// `wr_complete`/`wr_abort`, as providers hold their QP lock.
    pub send: SpinLock<SendSide>,
    /// The `ibv_wr_*` batch between `ibv_wr_start` and `ibv_wr_complete`/`abort`.
    pub builder: crate::ops::BatchCell,
    pub track: TrackLock,
    pub internal_done: Mutex<FastMap<u64, u32>>,
    pub next_token: AtomicU64,
    /// What `ibv_query_qp` shows the application instead of what the library asked of the
    /// provider for itself ([`AppView`]).
    pub app_view: Mutex<AppView>,
}

/// A QP's attributes as the application set them, where the library asked the provider for
/// more: the capabilities it asked for (the library's room for split and internal work
/// requests is the library's), its own access flags (the library adds remote rights on RC)
/// and its outstanding-read limits (the library raises 0 to 1). `None`: the application has
/// not set the value, the provider's stands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppView {
    pub cap: ibv_qp_cap,
    pub access: Option<u32>,
    pub max_rd_atomic: Option<u8>,
    pub max_dest_rd_atomic: Option<u8>,
}

impl AppView {
    /// Overwrites, in what the provider reported, what the library changed.
    pub fn apply(&self, attr: Option<&mut ibv_qp_attr>, init: Option<&mut ibv_qp_init_attr>) {
        if let Some(a) = attr {
            a.cap = self.cap;
            if let Some(f) = self.access {
                a.qp_access_flags = f;
            }
            if let Some(n) = self.max_rd_atomic {
                a.max_rd_atomic = n;
            }
            if let Some(n) = self.max_dest_rd_atomic {
                a.max_dest_rd_atomic = n;
            }
        }
        if let Some(i) = init {
            i.cap = self.cap;
        }
    }
}

/// A CQ's stash: completions taken from the provider while the library waited for its own
/// work requests, handed to the application first, in order.
pub(crate) struct CqCtl {
    pub cq: usize,
    pub ctx: usize,
    pub orig_poll: PollCqFn,
    /// The provider's functions of an extended CQ (`ibv_create_cq_ex`) the library wrapped.
    pub ex: Option<crate::cq_ex::CqExFns>,
    pub stash: SpinLock<CqInner>,
}

/// What a CQ's lock protects.
#[derive(Default)]
pub(crate) struct CqInner {
    /// Completions taken early, in order.
    pub stash: VecDeque<ibv_wc>,
    /// The QP of the last completion (most CQs serve one QP): saves the registry lookup.
    pub last_qp: Option<(u32, Arc<QpCtl>)>,
    /// An extended CQ's poll session (`ibv_start_poll` .. `ibv_end_poll`).
    pub ex: crate::cq_ex::Session,
}

/// A shared receive queue.
pub(crate) struct SrqCtl {
    pub engine: Arc<Engine>,
    pub ctx: usize,
    pub orig_post: PostSrqRecvFn,
    pub max_sge: usize,
    pub track: SpinLock<RecvTracker>,
}

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

/// Why a work request could not be posted.
#[derive(Debug)]
pub(crate) enum PostFail {
    /// Return this errno; the application WR at this pointer (NULL: the current one) is the
    /// first not posted.
    Errno(c_int, usize),
    /// Complete the current application WR with this status (the library could not carry it
    /// out: its peer directory refused, timed out, or the QP failed under the library's WR).
    Status(u32),
}

/// Provider WRs built but not yet posted.
///
/// The SGEs of all WRs share one vector (`spans` says which belong to which WR); the vectors
/// are kept in the QP between calls, so a warm data path allocates nothing.
#[derive(Default)]
pub(crate) struct Batch {
    pub wrs: Vec<ibv_send_wr>,
    pub sges: Vec<ibv_sge>,
    pub spans: Vec<(usize, usize)>,
    pub app: Vec<usize>,
    pub seqs: Vec<u64>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    fn push(&mut self, wr: ibv_send_wr, sges: &[ibv_sge], app: usize, seq: u64) {
        self.spans.push((self.sges.len(), sges.len()));
        self.sges.extend_from_slice(sges);
        self.wrs.push(wr);
        self.app.push(app);
        self.seqs.push(seq);
    }

    fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.spans.clear();
        self.app.clear();
        self.seqs.clear();
    }
}

/// What the warm path found for a WR: the peer window's key for its remote range and the
/// local window's key (and id) for its SGE.
#[derive(Clone, Copy)]
pub(crate) struct WarmKeys {
    remote: Option<u32>,
    local: Option<(u32, WindowUse)>,
    /// The local key is the QP's hold's: nothing was pinned for this WR.
    held: bool,
}

impl WarmKeys {
    /// Whether the WR may be posted without a record, keeping the application's `wr_id` and
    /// flags (its completion then passes through unchanged): it holds no local window (inline
    /// data, no SGE, or an SGE outside the library's regions), so nothing waits for its
    /// completion, and no recorded unsignaled WR before it waits for a later recorded
    /// completion. Its peer window needs no record either: leases end only at a later lease
    /// grant on this QP, which RC executes after it (docs/connectx.md §5).
    #[inline]
    fn unrecorded(&self, side: &SendSide) -> bool {
        (self.local.is_none() || self.held) && side.signals.is_idle()
    }

    /// The window pinned for this WR alone (released by its record).
    #[inline]
    fn pinned_window(&self) -> Option<WindowUse> {
        if self.held {
            None
        } else {
            self.local.map(|(_, w)| w)
        }
    }
}

fn is_atomic(op: u32) -> bool {
    matches!(op, IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD)
}

/// A provider WR built (and recorded, if it needs a record) by the warm-cache path, not yet
/// posted. Built in place by [`QpCtl::fast_build`] (moving a 128-byte WR around costs a
/// `memcpy` call, which emulators run slowly).
pub(crate) struct FastWr {
    pub(crate) wr: ibv_send_wr,
    pub(crate) sge: ibv_sge,
    pub(crate) has_sge: bool,
    /// Its record's sequence number; 0 when it has none.
    pub(crate) seq: u64,
}

impl FastWr {
    pub(crate) const fn new() -> Self {
        Self {
            wr: ibv_send_wr::zeroed(),
            sge: ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            has_sge: false,
            seq: 0,
        }
    }
}

/// Maps a send opcode to the completion opcode plain verbs reports.
pub(crate) fn wc_opcode_of(op: u32) -> u32 {
    match op {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        IBV_WR_LOCAL_INV => IBV_WC_LOCAL_INV,
        IBV_WR_BIND_MW => IBV_WC_BIND_MW,
        IBV_WR_TSO => IBV_WC_TSO,
        IBV_WR_ATOMIC_WRITE => IBV_WC_ATOMIC_WRITE,
        _ => IBV_WC_SEND,
    }
}

impl QpCtl {
    fn orig_post_send(&self) -> Option<PostSendFn> {
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

    /// How long the library waits for one of its own WRs to complete.
    pub(crate) fn internal_wait(&self) -> Duration {
        Duration::from_millis(
            self.engine
                .cfg
                .remote_timeout_ms
                .max(1000)
                .saturating_mul(6),
        )
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

    /// Whether `wr_id` is that of a receive this QP (or its SRQ) has outstanding.
    fn owns_receive(&self, wr_id: u64) -> bool {
        if self.srq != 0 {
            registry::srq(self.srq).is_some_and(|s| s.track.lock().contains(wr_id))
        } else {
            self.track.lock().recv.contains(wr_id)
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

    /// Turns planned SGEs into provider SGEs, registering their windows (counted in flight).
    /// Waits for completions when the budget is full; fails with ENOMEM if nothing frees up.
    pub(crate) fn local_windows(
        &self,
        side: &mut SendSide,
        planned: &[PlannedSge],
        batch: &mut Batch,
        patient: bool,
    ) -> Result<(Vec<ibv_sge>, WinList), PostFail> {
        let wanted = distinct_windows(planned);
        let deadline = Instant::now() + Duration::from_secs(if patient { 10 } else { 0 });
        // QPs whose held windows were asked back (once per call).
        let mut surrendered: Option<Vec<Arc<QpCtl>>> = None;
        // Whether this QP's send queue was settled (once per call, see below).
        let mut settled = false;
        loop {
            let eng = &self.engine;
            let mut st = lock(&eng.state);
            let mut specs = Vec::with_capacity(wanted.len());
            let mut missing_region = None;
            for id in &wanted {
                match st.regions.get(&id.region) {
                    Some(r) => specs.push((*id, r.window_spec(id.index))),
                    None => missing_region = Some(*id),
                }
            }
            let result = if missing_region.is_some() {
                Err(CacheError::Provider(libc::EINVAL))
            } else {
                let State { regions, cache, .. } = &mut *st;
                let mut prov = Provider {
                    real: &eng.real,
                    regions,
                };
                cache.ensure_all(&specs, &mut prov)
            };
            match result {
                Ok(keys) => {
                    let uses: WinList = wanted
                        .iter()
                        .filter_map(|id| st.cache.add_inflight(*id))
                        .collect();
                    eng.publish(&st);
                    let sges = provider_sges(planned, &wanted, Some(&keys), &st.regions);
                    return Ok((sges, uses));
                }
                Err(CacheError::Provider(_)) => {
                    // The region cannot be registered (unmapped since, or gone): let the NIC
                    // report the protection error, as for an invalid lkey.
                    let sges = provider_sges(planned, &wanted, None, &st.regions);
                    return Ok((sges, WinList::new()));
                }
                Err(CacheError::NoRoom { .. }) => {}
            }
            drop(st);
            self.flush(batch)?;
            let others = surrendered
                .get_or_insert_with(|| self.engine.revoke_holds(Some((self, &mut *side))));
            let mut progress = false;
            for q in others.iter().filter(|q| q.qp != self.qp) {
                progress |= q.poll_for_others();
            }
            if !self.poll_own_cqs() && !progress {
                if patient && !settled {
                    // What holds the room may be this QP's own unsignaled WRs, which complete
                    // only behind a signaled one (the parts of the WR being split right now
                    // are such WRs): put one of the library's behind them and wait, and their
                    // windows come back. Without it the post waited out its deadline and
                    // failed a WR whose first parts had already executed.
                    settled = true;
                    self.settle_send_queue(Duration::from_secs(2));
                    continue;
                }
                if Instant::now() >= deadline {
                    eng.note("pinned-memory budget full of windows in use: post failed with ENOMEM (raise NPRDMA_PIN_BUDGET)");
                    return Err(PostFail::Errno(libc::ENOMEM, 0));
                }
                std::thread::sleep(Duration::from_micros(100));
            }
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

    /// The commonest warm WR in the fewest steps: posted alone, on an RC QP, a SEND or an RDMA
    /// WRITE or READ (with or without immediate) whose one SGE is inline or lies in the QP's
    /// held window, whose remote range (if any) lies in the remembered peer window, with no
    /// recorded unsignaled WR before it. It needs no record (see [`LocalHold`] and
    /// [`WarmKeys::unrecorded`]): the application's fields with the window keys go to the
    /// provider in the QP's template WR ([`HeldWr`]). `None`, having changed nothing, for
    /// anything else
    /// ([`fast_build`](Self::fast_build) and the general path decide those).
    ///
    /// # Safety
    /// `app` is the application's WR at `app_ptr`; `bad` is writable.
    #[inline(always)]
    unsafe fn try_post_held(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        app_ptr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> Option<c_int> {
        // The conditions are folded into a few tests: an emulator ends a translation block at
        // every branch, and this runs once per WR. LLVM splits `a & b` of comparisons back
        // into a branch each on x86, so each condition is an integer that is zero when it
        // holds (see `miss_below`), and the integers are or-ed.
        let op_bit = 1u32.checked_shl(app.opcode).unwrap_or(0);
        let ops_miss = (op_bit & (HELD_REMOTE_OPS | HELD_LOCAL_OPS)).wrapping_sub(1) >> 31;
        let miss = self.held_off
            | app.next as u64
            | u64::from(app.num_sge as u32 ^ 1)
            | u64::from(side.signals.unsignaled())
            | u64::from(ops_miss);
        // (Nothing is queued in `side.batch` between posts: it is taken and put back empty.)
        debug_assert!(side.batch.is_empty());
        if miss != 0 || app.sg_list.is_null() {
            return None;
        }
        // SAFETY: the application's one-entry SGE array (checked non-null above).
        let app_sge = unsafe { *app.sg_list };
        let len = u64::from(app_sge.length);
        let end = app_sge.addr.wrapping_add(len);
        let mut lkey = app_sge.lkey;
        if app.send_flags & IBV_SEND_INLINE == 0 {
            let h = side.hold.as_ref()?;
            let miss = !miss_below(app_sge.addr, end) // empty or wrapping
                | u64::from(h.lkey ^ app_sge.lkey)
                | miss_below(app_sge.addr, h.lo)
                | miss_below(h.hi, end)
                | (h.epoch ^ self.engine.hold_epoch.load(Ordering::Acquire));
            if miss != 0 {
                return None;
            }
            lkey = h.wlkey;
        } else if len == 0 {
            return None;
        }
        let raddr = app.remote_addr();
        let mut rkey = app.rdma_rkey();
        if op_bit & HELD_REMOTE_OPS != 0 {
            let h = side.hot_remote.as_ref()?;
            let rend = raddr.wrapping_add(len);
            let miss = !miss_below(raddr, rend) // empty or wrapping
                | u64::from(h.rkey ^ rkey)
                | miss_below(raddr, h.lo)
                | miss_below(h.hi, rend);
            if miss != 0 {
                return None;
            }
            rkey = h.wkey;
        }
        // The WR goes out from the QP's own template, whose other fields stay zero: only what
        // these opcodes use is written (half the stores of copying the application's WR; the
        // SGE pointer was set when the QP was created, and `num_sge` is always 1).
        let held = &mut side.held;
        held.sge = ibv_sge {
            addr: app_sge.addr,
            length: app_sge.length,
            lkey,
        };
        let wr = &mut held.wr;
        debug_assert!(core::ptr::eq(wr.sg_list, &held.sge) && wr.num_sge == 1);
        wr.wr_id = app.wr_id;
        wr.opcode = app.opcode;
        wr.send_flags = app.send_flags;
        wr.imm_data = app.imm_data;
        wr.wr[0] = raddr;
        wr.wr[1] = u64::from(rkey);
        // The provider reports a failure in the application's `bad` (pointing at the template;
        // corrected below), which saves a local.
        // SAFETY: a live QP and one well-formed WR whose SGE (in the same template, under the
        // send lock) outlives the call; `held_post` is the provider's (`held_off` is zero);
        // `bad` is writable.
        let mut rc = unsafe { (self.held_post)(self.qp as *mut ibv_qp, wr, bad) };
        if rc == libc::ENOMEM {
            // The send queue may be full of the library's own WRs (sq_room.rs).
            let mut waiting = None;
            while rc == libc::ENOMEM && self.wait_for_send_room(&mut waiting) {
                // SAFETY: as above.
                rc = unsafe { (self.held_post)(self.qp as *mut ibv_qp, wr, bad) };
            }
        }
        if rc != 0 {
            // SAFETY: `bad` is writable.
            unsafe { *bad = app_ptr };
        }
        Some(rc)
    }

    /// [`post_send_list`](Self::post_send_list) with a given batch.
    ///
    /// # Safety
    /// As `post_send_list`.
    unsafe fn post_send_list_with(
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

    /// The warm-cache path of [`translate_send`](Self::translate_send): at most one SGE,
    /// inside one registered window, and a remote range inside one window this QP holds a
    /// lease on. One lock of the engine, no allocation. Returns false (having changed nothing)
    /// when the WR needs the general path.
    fn fast_send(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        app_ptr: usize,
        batch: &mut Batch,
    ) -> bool {
        let mut fast = FastWr::new();
        if !self.fast_build(side, app, &mut fast) {
            return false;
        }
        let sges = if fast.has_sge {
            core::slice::from_ref(&fast.sge)
        } else {
            &[]
        };
        batch.push(fast.wr, sges, app_ptr, fast.seq);
        true
    }

    /// Posts one fast-path WR built on the stack (the application posted a single WR).
    ///
    /// # Safety
    /// `app_wr` is the application's WR `fast` was built from; `bad` is writable.
    #[inline]
    unsafe fn post_one(
        &self,
        fast: &mut FastWr,
        app_wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        (fast.wr.sg_list, fast.wr.num_sge) = if fast.has_sge {
            (&mut fast.sge as *mut ibv_sge, 1)
        } else {
            (core::ptr::null_mut(), 0)
        };
        fast.wr.next = core::ptr::null_mut();
        // SAFETY: one well-formed WR whose SGE outlives the call; forwarded contract.
        unsafe { self.post_recorded(&mut fast.wr, fast.seq, app_wr, bad) }
    }

    /// Posts one warm WR, recorded as sequence `seq` (0: not recorded). On a provider error,
    /// forgets its record and releases its window, as [`flush`](Self::flush) does, and points
    /// `*bad` at `app_wr`.
    ///
    /// # Safety
    /// `wr` is one well-formed provider WR (`next` null) whose SGEs outlive the call; `bad` is
    /// writable.
    #[inline]
    unsafe fn post_recorded(
        &self,
        wr: *mut ibv_send_wr,
        seq: u64,
        app_wr: *mut ibv_send_wr,
        bad: *mut *mut ibv_send_wr,
    ) -> c_int {
        let mut waiting = None;
        let rc = loop {
            let rc = match self.orig_post_send() {
                Some(post) => {
                    let mut provider_bad: *mut ibv_send_wr = core::ptr::null_mut();
                    // SAFETY: a live QP and one well-formed WR (the caller's contract).
                    unsafe { post(self.qp as *mut ibv_qp, wr, &mut provider_bad) }
                }
                None => libc::EOPNOTSUPP,
            };
            if rc == 0 {
                return 0;
            }
            // The send queue may be full of the library's own WRs (sq_room.rs).
            if rc != libc::ENOMEM || !self.wait_for_send_room(&mut waiting) {
                break rc;
            }
        };
        if seq != 0 {
            let windows = self.track.lock().send.unrecord_after(seq - 1);
            self.engine.release(&windows);
        }
        // SAFETY: `bad` is writable.
        unsafe { *bad = app_wr };
        rc
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

    /// Builds the provider WR of the warm-cache path and records it (see
    /// [`fast_send`](Self::fast_send)); false, having changed nothing, when the WR needs the
    /// general path.
    #[inline]
    fn fast_build(&self, side: &mut SendSide, app: &ibv_send_wr, out: &mut FastWr) -> bool {
        let Some(keys) = self.warm_keys(side, app) else {
            return false;
        };
        let has_sge = app.num_sge == 1;
        if has_sge {
            // SAFETY: the application's one-entry SGE array (checked by warm_keys).
            out.sge = unsafe { *app.sg_list };
            if let Some((lkey, _)) = keys.local {
                out.sge.lkey = lkey;
            }
        }
        out.has_sge = has_sge;
        // Only the fields these opcodes use (the rest of `out.wr` stays zero).
        let w = &mut out.wr;
        w.opcode = app.opcode;
        w.imm_data = app.imm_data;
        w.qp_type_xrc_remote_srqn = app.qp_type_xrc_remote_srqn;
        w.wr = app.wr;
        if let Some(wkey) = keys.remote {
            if is_atomic(app.opcode) {
                w.set_atomic_rkey(wkey);
            } else {
                w.set_rdma_rkey(wkey);
            }
        }
        (out.seq, out.wr.wr_id, out.wr.send_flags) = if keys.unrecorded(side) {
            (0, app.wr_id, app.send_flags)
        } else {
            self.record_warm(side, app, keys.pinned_window())
        };
        true
    }

    /// The keys of a warm WR (at most one SGE, inside a registered window; a remote range
    /// inside one peer window this QP holds a key for; an opcode the fast path knows): the
    /// peer window's key and the local window's key, whose window is pinned in flight (the
    /// last step). `None`, having changed nothing, when the WR needs the general path.
    #[inline]
    fn warm_keys(&self, side: &mut SendSide, app: &ibv_send_wr) -> Option<WarmKeys> {
        let op = app.opcode;
        let (has_remote, atomic) = match op {
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => (true, false),
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => (true, true),
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM => (false, false),
            _ => return None,
        };
        if app.num_sge < 0 || app.num_sge > 1 || (app.num_sge == 1 && app.sg_list.is_null()) {
            return None;
        }
        let sge = if app.num_sge == 1 {
            // SAFETY: the application's one-entry SGE array.
            Some(unsafe { *app.sg_list })
        } else {
            None
        };
        let mut keys = WarmKeys {
            remote: None,
            local: None,
            held: false,
        };
        if has_remote {
            let rlen = if atomic {
                8
            } else {
                sge.map_or(0, |s| u64::from(s.length))
            };
            if rlen == 0 || self.qp_type != IBV_QPT_RC {
                return None;
            }
            let (raddr, rkey) = if atomic {
                (app.remote_addr(), app.atomic_rkey())
            } else {
                (app.remote_addr(), app.rdma_rkey())
            };
            keys.remote = Some(side.remote_window_key(rkey, raddr, rlen)?);
        }
        if let Some(s) = sge
            && s.length > 0
            && app.send_flags & IBV_SEND_INLINE == 0
        {
            let end = s.addr.checked_add(u64::from(s.length))?;
            if let Some(h) = side.hold
                && h.lkey == s.lkey
                && s.addr >= h.lo
                && end <= h.hi
                && h.epoch == self.engine.hold_epoch.load(Ordering::Acquire)
            {
                keys.local = Some((h.wlkey, h.used));
                keys.held = true;
                return Some(keys);
            }
            let mut st = lock(&self.engine.state);
            if let Some(id) = st.by_lkey.get(&(self.ctx.ctx, s.lkey)).copied() {
                let r = st.regions.get(&id)?;
                if !r.geom.contains(s.addr, u64::from(s.length)) {
                    return None;
                }
                let index = r.geom.window_of(s.addr);
                if r.geom.window_of(end - 1) != index {
                    return None;
                }
                let (lo, hi) = r.geom.window_range(index);
                let wid = WindowId { region: id, index };
                let (k, used) = st.cache.lookup_and_pin(wid)?;
                keys.local = Some((k.lkey, used));
                if self.qp_type == IBV_QPT_RC {
                    self.move_hold(side, &mut st, s.lkey, (lo, hi), k.lkey, wid);
                }
            }
        }
        Some(keys)
    }

    /// Moves this QP's hold to window `wid` (just pinned for a WR about to be recorded, so
    /// the old hold, retired before that record, is released by its completion). Keeps the
    /// old hold if the new one does not fit in the holds' share of the budget, unless the old
    /// one is stale.
    fn move_hold(
        &self,
        side: &mut SendSide,
        st: &mut State,
        lkey: u32,
        (lo, hi): (u64, u64),
        wlkey: u32,
        wid: WindowId,
    ) {
        let epoch = self.engine.hold_epoch.load(Ordering::Acquire);
        let old = side.hold.take();
        let old_bytes = old.map_or(0, |h| h.bytes);
        let bytes = st.cache.spec(wid).map_or(0, |sp| sp.pinned_bytes());
        let fits = st.held_bytes.saturating_sub(old_bytes) + bytes <= st.cache.budget() / 4;
        if fits && let Some(used) = st.cache.add_inflight(wid) {
            if let Some(o) = old {
                self.retire_hold(st, o);
            }
            st.held_bytes += bytes;
            side.hold = Some(LocalHold {
                lkey,
                lo,
                hi,
                wlkey,
                used,
                bytes,
                epoch,
            });
        } else if let Some(o) = old {
            if o.epoch == epoch {
                side.hold = Some(o);
            } else {
                self.retire_hold(st, o);
            }
        }
    }

    /// Ends hold `h` (taken off its QP's side already): its window is released after a WR
    /// posted from now on completes ([`LocalHold`]).
    fn retire_hold(&self, st: &mut State, h: LocalHold) {
        st.held_bytes = st.held_bytes.saturating_sub(h.bytes);
        // A window deregistered since (the region was deregistered or re-registered) took the
        // hold's in-flight count with it.
        if st.cache.use_of(h.used.id) == Some(h.used) {
            let mut w = WinList::new();
            w.push(h.used);
            self.track.lock().send.retire(w);
        }
    }

    /// Ends this QP's hold, if any, and posts a barrier after everything posted so far (a
    /// zero-length RDMA WRITE, which touches no memory and checks no key, IBA vol. 1 C9-88)
    /// whose completion releases the retired windows. Returns whether a barrier was posted.
    pub(crate) fn surrender_hold(&self, side: &mut SendSide) -> bool {
        if let Some(h) = side.hold.take() {
            let mut st = lock(&self.engine.state);
            self.retire_hold(&mut st, h);
        }
        if self.qp_type != IBV_QPT_RC {
            return false;
        }
        // A barrier is needed unless the newest record is one of the library's own WRs (an
        // earlier barrier, say), which are signaled: its completion releases every marker.
        // (Whether an application WR after the markers is signaled is not known for sure: a
        // refused post may have reset the signal run.)
        let needed = {
            let t = self.track.lock();
            t.send.has_retired() && !t.send.newest_is_internal()
        };
        if !needed {
            return false;
        }
        let Some(post) = self.orig_post_send() else {
            return false;
        };
        let mut wr = ibv_send_wr::zeroed();
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        let seq = {
            let mut t = self.track.lock();
            let seq = t
                .send
                .record(Origin::Internal { token: NO_WAITER }, WinList::new());
            wr.wr_id = t.send.wr_id_of(seq);
            seq
        };
        let mut bad = core::ptr::null_mut();
        // SAFETY: live QP; one well-formed WR without SGEs.
        let rc = unsafe { post(self.qp as *mut ibv_qp, &mut wr, &mut bad) };
        if rc != 0 {
            // Not posted (the send queue is full, or the QP was reset): the retired windows
            // wait for the next WR that completes, or for the QP's destruction.
            self.track.lock().send.unrecord_after(seq - 1);
            return false;
        }
        // The barrier is signaled: it ends any unsignaled run before it.
        side.signals.must_signal(true, 1);
        true
    }

    /// Records a warm WR (holding `window` in flight, if any); returns its sequence number, the
    /// provider `wr_id` and the send flags to post it with.
    #[inline]
    fn record_warm(
        &self,
        side: &mut SendSide,
        app: &ibv_send_wr,
        window: Option<WindowUse>,
    ) -> (u64, u64, u32) {
        let mut windows = WinList::new();
        if let Some(w) = window {
            windows.push(w);
        }
        let wants = app.send_flags & IBV_SEND_SIGNALED != 0 || self.sq_sig_all;
        let signal = side.signals.must_signal(wants, self.signal_every);
        let mut t = self.track.lock();
        let flags = if signal {
            app.send_flags | IBV_SEND_SIGNALED
        } else {
            app.send_flags & !IBV_SEND_SIGNALED
        };
        let group = t.send.next_group();
        let seq = t.send.record(
            Origin::App {
                wr_id: app.wr_id,
                group,
                last: true,
                wants_completion: wants,
                byte_len: 0,
            },
            windows,
        );
        (seq, t.send.wr_id_of(seq), flags)
    }

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

/// The budget had no room for a receive's windows: takes back the windows QPs hold for their
/// warm path and tries again while their barriers complete (briefly: receives in flight free
/// nothing until messages arrive).
fn acquire_after_revoking_holds(
    engine: &Arc<Engine>,
    planned: &[PlannedSge],
) -> Option<(Vec<ibv_sge>, WinList)> {
    let qps = engine.revoke_holds(None);
    let deadline = Instant::now() + Duration::from_millis(200);
    while !qps.is_empty() && Instant::now() < deadline {
        let mut progress = false;
        for q in &qps {
            progress |= q.poll_for_others();
        }
        if let Some(got) = acquire_recv_windows(engine, planned) {
            return Some(got);
        }
        if !progress {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    acquire_recv_windows(engine, planned)
}

fn acquire_recv_windows(
    engine: &Engine,
    planned: &[PlannedSge],
) -> Option<(Vec<ibv_sge>, WinList)> {
    let wanted = distinct_windows(planned);
    let mut st = lock(&engine.state);
    let specs: Vec<(WindowId, WindowSpec)> = wanted
        .iter()
        .filter_map(|id| {
            st.regions
                .get(&id.region)
                .map(|r| (*id, r.window_spec(id.index)))
        })
        .collect();
    let result = {
        let State { regions, cache, .. } = &mut *st;
        let mut prov = Provider {
            real: &engine.real,
            regions,
        };
        cache.ensure_all(&specs, &mut prov)
    };
    let keys = match result {
        Ok(k) => k,
        Err(CacheError::NoRoom { .. }) => return None,
        Err(CacheError::Provider(_)) => Vec::new(),
    };
    let ok = keys.len() == specs.len() && specs.len() == wanted.len();
    let uses: WinList = if ok {
        wanted
            .iter()
            .filter_map(|id| st.cache.add_inflight(*id))
            .collect()
    } else {
        WinList::new()
    };
    engine.publish(&st);
    let sges = provider_sges(planned, &wanted, ok.then_some(&keys[..]), &st.regions);
    Some((sges, uses))
}

/// The distinct windows that `planned` uses, in order of first use.
fn distinct_windows(planned: &[PlannedSge]) -> Vec<WindowId> {
    let mut wanted: Vec<WindowId> = Vec::new();
    for p in planned {
        if let PlannedSge::Window { window, .. } = p
            && !wanted.contains(window)
        {
            wanted.push(*window);
        }
    }
    wanted
}

/// Provider SGEs for `planned`: a window piece gets its window's lkey from `keys` (one per
/// entry of `wanted`); without keys it points past its region's directory, so that the NIC
/// reports the protection error plain verbs would for an unusable lkey.
fn provider_sges(
    planned: &[PlannedSge],
    wanted: &[WindowId],
    keys: Option<&[crate::window::Keys]>,
    regions: &FastMap<RegionId, Region>,
) -> Vec<ibv_sge> {
    planned
        .iter()
        .map(|p| match *p {
            PlannedSge::Keep(s) => s,
            PlannedSge::Window { addr, len, window } => {
                let key = keys.and_then(|k| {
                    wanted
                        .iter()
                        .position(|w| *w == window)
                        .and_then(|i| k.get(i))
                });
                match key {
                    Some(k) => ibv_sge {
                        addr,
                        length: len,
                        lkey: k.lkey,
                    },
                    None => ibv_sge {
                        addr: regions.get(&window.region).map_or(0, Region::poison_addr),
                        length: len,
                        lkey: 0,
                    },
                }
            }
        })
        .collect()
}

/// Whether `[va, va + len)` is mapped readable (and writable if `write`), per /proc/self/maps
/// (linux-glue). Registration without pinning must still fail where plain verbs fails.
fn range_is_mapped(va: u64, len: u64, write: bool) -> bool {
    let Some(end) = va.checked_add(len) else {
        return false;
    };
    let Ok(vmas) = linux_glue::vma::maps_in_range(va, end) else {
        // Cannot tell: do not refuse what plain verbs might accept.
        return true;
    };
    let mut at = va;
    for v in vmas {
        let (s, e) = (v.start.as_u64(), v.end.as_u64());
        if s > at {
            return false;
        }
        if !v.readable || (write && !v.writable) {
            return false;
        }
        at = at.max(e);
        if at >= end {
            return true;
        }
    }
    at >= end
}

/// A random u64 (directory instance numbers).
pub(crate) fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        u64::from_le_bytes(b)
    } else {
        // No getrandom (a very old kernel or a seccomp filter): the wall clock's nanoseconds,
        // the process ID and a stack address (ASLR) still tell two instances apart.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let here = &b as *const _ as u64;
        t ^ u64::from(std::process::id()).rotate_left(32) ^ here.rotate_left(17)
    }
}
