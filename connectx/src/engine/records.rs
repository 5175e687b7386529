//! The per-object records: an opened context, a QP (with its posting state, trackers and held
//! window), a CQ, an SRQ, and the batch of provider WRs a post builds.

use core::ffi::c_int;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::completion::{RecvTracker, SendTracker, SignalRun, WinList};
use crate::directory::DmaBuf;
use crate::directory::{DirHeader, LeaseBook};
use crate::engine::Engine;
use crate::engine::cq_session::{CqExFns, Session};
use crate::engine::wr_batch::BatchCell;
use crate::fasthash::FastMap;
use crate::spin::SpinLock;
use crate::sys::*;
use crate::translate::Geometry;
use crate::window::WindowUse;

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

/// The library's pinned buffer for a QP's own work requests (directory reads, requests).
pub(crate) struct Scratch {
    pub buf: DmaBuf,
    pub mr: usize,
    pub lkey: u32,
}

/// Send and receive trackers of a QP.
pub(crate) struct Trackers {
    pub send: SendTracker,
    pub recv: RecvTracker,
}

impl Trackers {
    /// Takes every window of the records, keeping the records ([`SendTracker::take_windows`]).
    pub(super) fn take_all_windows(&mut self) -> WinList {
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
    pub(super) rkey: u32,
    pub(super) lo: u64,
    pub(super) hi: u64,
    pub(super) wkey: u32,
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
    pub(super) lkey: u32,
    /// The window's range `[lo, hi)` in the region's address space.
    pub(super) lo: u64,
    pub(super) hi: u64,
    /// The window's own lkey.
    pub(super) wlkey: u32,
    /// The window and the registration its in-flight count was taken on.
    pub(super) used: WindowUse,
    pub(super) bytes: u64,
    /// [`Engine::hold_epoch`] when taken.
    pub(super) epoch: u64,
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

/// A QP's template for the held-window path: a WR whose fields outside those the path writes
/// stay zero, and its one SGE.
pub(crate) struct HeldWr {
    pub(super) wr: ibv_send_wr,
    pub(super) sge: ibv_sge,
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

/// What a requester knows about a peer's region, by the application's rkey.
pub(crate) enum RemoteRegion {
    /// IOVA 0 of the rkey holds no directory: a peer without the library whose region happens
    /// to start at IOVA 0. Addresses and keys pass through unchanged.
    Direct,
    /// A peer region with a directory.
    Library(Box<LibRegion>),
}

/// A peer region with a directory.
pub(crate) struct LibRegion {
    pub header: DirHeader,
    pub geom: Geometry,
    pub mirror: LeaseBook,
    pub epoch: u32,
    pub rkeys: crate::fasthash::FastMap<u64, u32>,
    pub served_hint: u64,
    /// The control connection the region was learnt on: leases are asked for there
    /// (docs/connectx.md §13); `None`: through the directory's ring (§5).
    pub link: Option<Arc<crate::ctl::conversation::Conversation>>,
}

impl LibRegion {
    pub(crate) fn forget(&mut self, lessee: u32) {
        self.mirror.drop_lessee(lessee);
        self.rkeys.clear();
        self.epoch = self.epoch.wrapping_add(1);
    }
}

/// [`QpCtl::held_post`] of a provider without `post_send` (never called: `held_off` is set).
pub(super) unsafe extern "C" fn no_post_send(
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
    pub(super) held_off: u64,
    /// The provider's `post_send` for the held path (a stub where there is none).
    pub(super) held_post: PostSendFn,
    pub dest_qpn: AtomicU32,
    /// The pair of this QP's connection once it reached RTR with a GRH (its control
    /// connection's key in the engine's `peers`).
    pub peer: Mutex<Option<crate::ctl::pair::Pair>>,
    /// Posting state; also held by an open `ibv_wr_*` batch from `wr_start` to
    /// `wr_complete`/`wr_abort`, as providers hold their QP lock.
    pub send: SpinLock<SendSide>,
    /// The `ibv_wr_*` batch between `ibv_wr_start` and `ibv_wr_complete`/`abort`.
    pub builder: BatchCell,
    pub track: TrackLock,
    pub internal_done: Mutex<FastMap<u64, u32>>,
    pub next_token: AtomicU64,
    /// What `ibv_query_qp` shows the application instead of what the library asked of the
    /// provider for itself ([`AppView`]).
    pub app_view: Mutex<AppView>,
}

impl QpCtl {
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
    pub ex: Option<CqExFns>,
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
    pub ex: Session,
}

/// A shared receive queue.
pub(crate) struct SrqCtl {
    pub engine: Arc<Engine>,
    pub ctx: usize,
    pub orig_post: PostSrqRecvFn,
    pub max_sge: usize,
    pub track: SpinLock<RecvTracker>,
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
    pub(super) fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    pub(super) fn push(&mut self, wr: ibv_send_wr, sges: &[ibv_sge], app: usize, seq: u64) {
        self.spans.push((self.sges.len(), sges.len()));
        self.sges.extend_from_slice(sges);
        self.wrs.push(wr);
        self.app.push(app);
        self.seqs.push(seq);
    }

    pub(super) fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
        self.spans.clear();
        self.app.clear();
        self.seqs.clear();
    }
}
