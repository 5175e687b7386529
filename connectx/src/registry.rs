//! Process-wide maps from provider objects (contexts, QPs, CQs, SRQs) to the library's records.
//!
//! The wrapped data-path functions receive only the provider's pointers, so they find their
//! engine and state here. Keys are the objects' addresses; records are removed when the
//! application destroys the object, before the provider frees it.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ops::Deref;
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

type Cached<T> = Cell<Option<(u64, usize, Arc<T>)>>;

thread_local! {
    // The data path looks up the same QP and CQ again and again: remember the last ones.
    static LAST_QP: Cached<QpCtl> = const { Cell::new(None) };
    static LAST_CQ: Cached<CqCtl> = const { Cell::new(None) };
}

/// A record lent by a thread's one-entry cache. A hit moves the `Arc` out of the cache and
/// [`Drop`] moves it back, so the warm data path pays no reference-count atomics. A nested
/// lookup on the same thread (the slot is empty meanwhile) simply misses and asks the map.
pub(crate) struct Hot<T: 'static> {
    cache: &'static LocalKey<Cached<T>>,
    generation: u64,
    key: usize,
    rec: ManuallyDrop<Arc<T>>,
}

impl<T> Deref for Hot<T> {
    type Target = Arc<T>;
    fn deref(&self) -> &Arc<T> {
        &self.rec
    }
}

impl<T> Drop for Hot<T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: `rec` is taken exactly once, here, and never used afterwards.
        let rec = unsafe { ManuallyDrop::take(&mut self.rec) };
        let entry = Some((self.generation, self.key, rec));
        // At thread exit the slot may be gone: then the Arc is simply dropped.
        let old = self.cache.try_with(|c| c.replace(entry));
        // Whatever was displaced is dropped outside the cell (it may be the last reference).
        drop(old);
    }
}

#[inline]
fn cached<T>(
    cache: &'static LocalKey<Cached<T>>,
    key: usize,
    fetch: impl FnOnce() -> Option<Arc<T>>,
) -> Option<Hot<T>> {
    let generation = GENERATION.load(Ordering::Acquire);
    let taken = cache.try_with(|c| c.take()).ok().flatten();
    let rec = match taken {
        Some((g, k, v)) if g == generation && k == key => v,
        stale => {
            drop(stale);
            fetch()?
        }
    };
    Some(Hot {
        cache,
        generation,
        key,
        rec: ManuallyDrop::new(rec),
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
