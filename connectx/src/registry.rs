//! Process-wide maps from provider objects (contexts, QPs, CQs, SRQs) to the library's records.
//!
//! The wrapped data-path functions receive only the provider's pointers, so they find their
//! engine and state here. Keys are the objects' addresses; records are removed when the
//! application destroys the object, before the provider frees it.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, RwLock};
use std::thread::LocalKey;

use crate::engine::{CqCtl, CtxRec, QpCtl, SrqCtl};

#[derive(Default)]
struct Maps {
    ctxs: crate::fasthash::FastMap<usize, Arc<CtxRec>>,
    qps: crate::fasthash::FastMap<usize, Arc<QpCtl>>,
    qpns: crate::fasthash::FastMap<(usize, u32), Arc<QpCtl>>,
    cqs: crate::fasthash::FastMap<usize, Arc<CqCtl>>,
    srqs: crate::fasthash::FastMap<usize, Arc<SrqCtl>>,
}

static MAPS: LazyLock<RwLock<Maps>> = LazyLock::new(|| RwLock::new(Maps::default()));

/// Moves on whenever a record is removed: the per-thread caches below are valid only for the
/// generation they were filled in (a destroyed object's address may be reused).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A thread's last lookup: (generation, key, record). Plain `Copy` data, so a hit is one
/// thread-local read (in a shared library every thread-local access is a call to
/// `__tls_get_addr`, and emulators make calls expensive).
type Cached<T> = Cell<(u64, usize, *const T)>;

thread_local! {
    // The data path looks up the same QP and CQ again and again: remember the last ones.
    static LAST_QP: Cached<QpCtl> = const { Cell::new((u64::MAX, 0, std::ptr::null())) };
    static LAST_CQ: Cached<CqCtl> = const { Cell::new((u64::MAX, 0, std::ptr::null())) };
}

/// A record found through a thread's cache, borrowed without touching its reference count.
///
/// The maps own the records; a record leaves them only when the application destroys its
/// object (or closes its device), which verbs forbids while the object is in use, so a
/// record stays alive while a call on its object runs. A removal moves [`GENERATION`] on,
/// which empties every thread's cache before the record could be freed and its address reused.
pub(crate) struct Hot<T: 'static> {
    rec: NonNull<T>,
    // Not Send: a borrow for the duration of one call on this thread.
    _call: PhantomData<*const T>,
}

impl<T> Deref for Hot<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: see the type's documentation: alive for the duration of the call.
        unsafe { self.rec.as_ref() }
    }
}

impl<T> Hot<T> {
    /// A borrow of the record at `rec`.
    ///
    /// # Safety
    /// `rec` is a record the maps hold, found in the current [`generation`], used on behalf
    /// of a call on its object.
    #[inline]
    pub(crate) unsafe fn from_ptr(rec: *const T) -> Self {
        Hot {
            // SAFETY: per the contract, not null.
            rec: unsafe { NonNull::new_unchecked(rec.cast_mut()) },
            _call: PhantomData,
        }
    }
}

/// The current generation of the maps (moves on at every removal).
#[inline]
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

#[inline]
fn cached<T>(
    cache: &'static LocalKey<Cached<T>>,
    key: usize,
    fetch: impl FnOnce() -> Option<Arc<T>>,
) -> Option<Hot<T>> {
    let generation = GENERATION.load(Ordering::Acquire);
    let (g, k, p) = cache.try_with(|c| c.get()).ok()?;
    if g == generation && k == key && !p.is_null() {
        return Some(Hot {
            rec: NonNull::new(p.cast_mut())?,
            _call: PhantomData,
        });
    }
    let rec = fetch()?;
    let ptr = Arc::as_ptr(&rec);
    // The maps keep `rec` alive; this Arc is only the fetch's own reference.
    drop(rec);
    let _ = cache.try_with(|c| c.set((generation, key, ptr)));
    Some(Hot {
        rec: NonNull::new(ptr.cast_mut())?,
        _call: PhantomData,
    })
}

fn invalidate() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

fn read<T>(f: impl FnOnce(&Maps) -> T) -> T {
    match MAPS.read() {
        Ok(g) => f(&g),
        Err(poisoned) => f(&poisoned.into_inner()),
    }
}

fn write<T>(f: impl FnOnce(&mut Maps) -> T) -> T {
    match MAPS.write() {
        Ok(mut g) => f(&mut g),
        Err(poisoned) => f(&mut poisoned.into_inner()),
    }
}

/// The record of a context.
pub(crate) fn ctx(ctx: usize) -> Option<Arc<CtxRec>> {
    read(|m| m.ctxs.get(&ctx).cloned())
}

/// Adds a context record.
pub(crate) fn add_ctx(rec: Arc<CtxRec>) {
    write(|m| {
        m.ctxs.insert(rec.ctx, rec);
    })
}

/// Removes a context record (and everything that belongs to it).
pub(crate) fn remove_ctx(ctx: usize) -> Option<Arc<CtxRec>> {
    write(|m| {
        m.qps.retain(|_, q| q.ctx.ctx != ctx);
        m.qpns.retain(|(c, _), _| *c != ctx);
        m.cqs.retain(|_, c| c.ctx != ctx);
        m.srqs.retain(|_, s| s.ctx != ctx);
        let r = m.ctxs.remove(&ctx);
        invalidate();
        r
    })
}

/// The record of a QP.
#[inline]
pub(crate) fn qp(qp: usize) -> Option<Hot<QpCtl>> {
    cached(&LAST_QP, qp, || read(|m| m.qps.get(&qp).cloned()))
}

/// The record of the QP with number `qp_num` on context `ctx`.
pub(crate) fn qp_by_num(ctx: usize, qp_num: u32) -> Option<Arc<QpCtl>> {
    read(|m| m.qpns.get(&(ctx, qp_num)).cloned())
}

/// Adds a QP record.
pub(crate) fn add_qp(rec: Arc<QpCtl>) {
    write(|m| {
        m.qpns.insert((rec.ctx.ctx, rec.qp_num), rec.clone());
        m.qps.insert(rec.qp, rec);
    })
}

/// Removes a QP record.
pub(crate) fn remove_qp(qp: usize) -> Option<Arc<QpCtl>> {
    write(|m| {
        let rec = m.qps.remove(&qp)?;
        m.qpns.remove(&(rec.ctx.ctx, rec.qp_num));
        invalidate();
        Some(rec)
    })
}

/// The record of a CQ, if any.
pub(crate) fn cq(cq: usize) -> Option<Arc<CqCtl>> {
    read(|m| m.cqs.get(&cq).cloned())
}

/// The record of a CQ, created with `make` if missing.
pub(crate) fn cq_or_insert(cq: usize, make: impl FnOnce() -> Option<CqCtl>) -> Option<Hot<CqCtl>> {
    cached(&LAST_CQ, cq, || {
        if let Some(c) = read(|m| m.cqs.get(&cq).cloned()) {
            return Some(c);
        }
        let rec = Arc::new(make()?);
        Some(write(|m| m.cqs.entry(cq).or_insert(rec).clone()))
    })
}

/// Removes a CQ record.
pub(crate) fn remove_cq(cq: usize) -> Option<Arc<CqCtl>> {
    let r = write(|m| m.cqs.remove(&cq));
    invalidate();
    r
}

/// The record of an SRQ, created with `make` if missing.
pub(crate) fn srq_or_insert(
    srq: usize,
    make: impl FnOnce() -> Option<SrqCtl>,
) -> Option<Arc<SrqCtl>> {
    if let Some(s) = read(|m| m.srqs.get(&srq).cloned()) {
        return Some(s);
    }
    let rec = Arc::new(make()?);
    Some(write(|m| m.srqs.entry(srq).or_insert(rec).clone()))
}

/// The record of an SRQ, if any.
pub(crate) fn srq(srq: usize) -> Option<Arc<SrqCtl>> {
    read(|m| m.srqs.get(&srq).cloned())
}

/// Removes an SRQ record.
pub(crate) fn remove_srq(srq: usize) -> Option<Arc<SrqCtl>> {
    let r = write(|m| m.srqs.remove(&srq));
    invalidate();
    r
}
