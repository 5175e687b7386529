//! Process-wide maps from provider objects (contexts, QPs, CQs, SRQs) to the library's records.
//!
//! The wrapped data-path functions receive only the provider's pointers, so they find their
//! engine and state here. Keys are the objects' addresses; records are removed when the
//! application destroys the object, before the provider frees it.

use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, RwLock};

use crate::engine::records::{CqCtl, CtxRec, QpCtl, SrqCtl};

#[derive(Default)]
struct Maps {
    ctxs: crate::fasthash::FastMap<usize, Arc<CtxRec>>,
    qps: crate::fasthash::FastMap<usize, Arc<QpCtl>>,
    qpns: crate::fasthash::FastMap<(usize, u32), Arc<QpCtl>>,
    cqs: crate::fasthash::FastMap<usize, Arc<CqCtl>>,
    srqs: crate::fasthash::FastMap<usize, Arc<SrqCtl>>,
    /// QPs destroyed with recorded WRs outstanding, oldest first (at most [`GONE_QPS`]).
    gone: std::collections::VecDeque<Arc<QpCtl>>,
}

/// How many destroyed QPs' records are kept for completions still in their CQs.
const GONE_QPS: usize = 64;

static MAPS: LazyLock<RwLock<Maps>> = LazyLock::new(|| RwLock::new(Maps::default()));

/// Moves on whenever a record is removed: the caches below are valid only for the generation
/// they were filled in (a destroyed object's address may be reused).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A small direct-mapped cache in front of a map, shared by all threads: the data path looks
/// up the same few QPs and CQs again and again. A hit is a handful of plain loads: no lock, no
/// atomic read-modify-write, no thread-local (in a shared library every thread-local access
/// is a call to `__tls_get_addr`, and emulators make calls expensive).
///
/// Each slot is a sequence lock: a writer makes `seq` odd, writes, makes it even again; a
/// reader that sees the same even `seq` before and after its loads got a consistent entry. An
/// entry holds the registry generation it was filled in and is only used while that
/// generation is current, so it never hands out a removed record.
pub(crate) struct HotCache<T> {
    slots: [Slot; HOT_SLOTS],
    _records: PhantomData<*const T>,
}

// SAFETY: the slots are atomics; the pointers they hold are only turned into references under
// the generation rule above.
unsafe impl<T> Sync for HotCache<T> {}

const HOT_SLOTS: usize = 64;

struct Slot {
    seq: AtomicU64,
    key: AtomicUsize,
    generation: AtomicU64,
    rec: AtomicPtr<()>,
}

impl Slot {
    const fn empty() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            key: AtomicUsize::new(0),
            generation: AtomicU64::new(u64::MAX),
            rec: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

impl<T> HotCache<T> {
    const fn new() -> Self {
        Self {
            slots: [const { Slot::empty() }; HOT_SLOTS],
            _records: PhantomData,
        }
    }

    #[inline]
    fn slot(&self, key: usize) -> &Slot {
        // Objects are at least 16-byte aligned and usually a few hundred bytes apart.
        &self.slots[((key >> 4) ^ (key >> 10)) % HOT_SLOTS]
    }

    /// The record cached for `key` in generation `generation`, if any.
    #[inline]
    fn get(&self, key: usize, generation: u64) -> Option<*const T> {
        let s = self.slot(key);
        let before = s.seq.load(Ordering::Acquire);
        let k = s.key.load(Ordering::Relaxed);
        let g = s.generation.load(Ordering::Relaxed);
        let p = s.rec.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        let after = s.seq.load(Ordering::Relaxed);
        // One test, not five branches (an emulator ends a translation block at every branch,
        // and this runs on every data-path call): zero exactly when the slot is stable, holds
        // `key` in `generation` and a record.
        let miss = (before & 1)
            | (before ^ after)
            | (k ^ key) as u64
            | (g ^ generation)
            | u64::from(p.is_null());
        (miss == 0).then_some(p.cast::<T>().cast_const())
    }

    /// Caches `rec` for `key` (skipped if another thread is writing the slot).
    fn put(&self, key: usize, generation: u64, rec: *const T) {
        let s = self.slot(key);
        let seq = s.seq.load(Ordering::Relaxed);
        if seq & 1 != 0
            || s.seq
                .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        s.key.store(key, Ordering::Relaxed);
        s.generation.store(generation, Ordering::Relaxed);
        s.rec.store(rec.cast_mut().cast(), Ordering::Relaxed);
        s.seq.store(seq + 2, Ordering::Release);
    }
}

static HOT_QPS: HotCache<QpCtl> = HotCache::new();
static HOT_CQS: HotCache<CqCtl> = HotCache::new();

/// A record found through a [`HotCache`], borrowed without touching its reference count.
///
/// The maps own the records; a record leaves them only when the application destroys its
/// object (or closes its device), which verbs forbids while the object is in use, so a
/// record stays alive while a call on its object runs. A removal moves [`GENERATION`] on,
/// which invalidates every cache entry before the record could be freed and its address reused.
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

/// The record for `key`: from `cache` (inlined into every data-path call), or from `fetch`
/// (out of line).
#[inline(always)]
fn cached<T>(
    cache: &'static HotCache<T>,
    key: usize,
    fetch: impl FnOnce() -> Option<Arc<T>>,
) -> Option<Hot<T>> {
    let generation = GENERATION.load(Ordering::Acquire);
    if let Some(p) = cache.get(key, generation) {
        // SAFETY: a record of the current generation (see `HotCache`).
        return Some(unsafe { Hot::from_ptr(p) });
    }
    fill(cache, key, generation, fetch)
}

/// [`cached`] on a miss: fetches the record and caches it.
#[cold]
#[inline(never)]
fn fill<T>(
    cache: &'static HotCache<T>,
    key: usize,
    generation: u64,
    fetch: impl FnOnce() -> Option<Arc<T>>,
) -> Option<Hot<T>> {
    let rec = fetch()?;
    let ptr = Arc::as_ptr(&rec);
    // The maps keep `rec` alive; this Arc is only the fetch's own reference.
    drop(rec);
    cache.put(key, generation, ptr);
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

/// The registry's read lock, held across `fork()` by the fork handlers (crate::fork) so
/// that the child's copy is not left write-locked by another thread.
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    match MAPS.read() {
        Ok(g) => Box::new(g),
        Err(poisoned) => Box::new(poisoned.into_inner()),
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
        m.gone.retain(|q| q.ctx.ctx != ctx);
        let r = m.ctxs.remove(&ctx);
        invalidate();
        r
    })
}

/// The record of a QP.
#[inline]
pub(crate) fn qp(qp: usize) -> Option<Hot<QpCtl>> {
    cached(&HOT_QPS, qp, || read(|m| m.qps.get(&qp).cloned()))
}

/// What a QP number names.
pub(crate) enum QpByNum {
    /// A QP the library manages.
    Live(Arc<QpCtl>),
    /// A QP destroyed with recorded WRs outstanding (see [`remove_qp`]).
    Destroyed(Arc<QpCtl>),
    /// Neither.
    Unknown,
}

/// The record of the QP with number `qp_num` on context `ctx` (one lookup for both kinds).
pub(crate) fn qp_by_num(ctx: usize, qp_num: u32) -> QpByNum {
    read(|m| {
        if let Some(q) = m.qpns.get(&(ctx, qp_num)) {
            return QpByNum::Live(q.clone());
        }
        m.gone
            .iter()
            .rev()
            .find(|q| (q.ctx.ctx, q.qp_num) == (ctx, qp_num))
            .map_or(QpByNum::Unknown, |q| QpByNum::Destroyed(q.clone()))
    })
}

/// Whether a live QP has number `qp_num` on `ctx`.
pub(crate) fn is_live_qp_num(ctx: usize, qp_num: u32) -> bool {
    read(|m| m.qpns.contains_key(&(ctx, qp_num)))
}

/// The records of every QP `engine` manages.
pub(crate) fn qps_of(engine: &crate::engine::Engine) -> Vec<Arc<QpCtl>> {
    read(|m| {
        m.qps
            .values()
            .filter(|q| std::ptr::eq(Arc::as_ptr(&q.engine), engine))
            .cloned()
            .collect()
    })
}

/// The records of the QPs `engine` managed that were destroyed with WRs outstanding.
pub(crate) fn gone_qps_of(engine: &crate::engine::Engine) -> Vec<Arc<QpCtl>> {
    read(|m| {
        m.gone
            .iter()
            .filter(|q| std::ptr::eq(Arc::as_ptr(&q.engine), engine))
            .cloned()
            .collect()
    })
}

/// The records of every SRQ `engine` manages.
pub(crate) fn srqs_of(engine: &crate::engine::Engine) -> Vec<Arc<SrqCtl>> {
    read(|m| {
        m.srqs
            .values()
            .filter(|s| std::ptr::eq(Arc::as_ptr(&s.engine), engine))
            .cloned()
            .collect()
    })
}

/// Adds a QP record (a destroyed QP's record with the same number is forgotten).
pub(crate) fn add_qp(rec: Arc<QpCtl>) {
    write(|m| {
        m.gone
            .retain(|q| (q.ctx.ctx, q.qp_num) != (rec.ctx.ctx, rec.qp_num));
        m.qpns.insert((rec.ctx.ctx, rec.qp_num), rec.clone());
        m.qps.insert(rec.qp, rec);
    })
}

/// Removes a QP record. It is kept among the destroyed QPs (in the same step, so that no
/// completion finds neither) until [`forget_gone_qp`].
pub(crate) fn remove_qp(qp: usize) -> Option<Arc<QpCtl>> {
    write(|m| {
        let rec = m.qps.remove(&qp)?;
        m.qpns.remove(&(rec.ctx.ctx, rec.qp_num));
        if m.gone.len() >= GONE_QPS {
            m.gone.pop_front();
        }
        m.gone.push_back(rec.clone());
        invalidate();
        Some(rec)
    })
}

/// Forgets a destroyed QP's record (no completion of its recorded WRs can come any more).
pub(crate) fn forget_gone_qp(rec: &Arc<QpCtl>) {
    write(|m| m.gone.retain(|q| !Arc::ptr_eq(q, rec)));
}

/// The record of a CQ, if any.
pub(crate) fn cq(cq: usize) -> Option<Arc<CqCtl>> {
    read(|m| m.cqs.get(&cq).cloned())
}

/// The record of a CQ, created with `make` if missing.
pub(crate) fn cq_or_insert(cq: usize, make: impl FnOnce() -> Option<CqCtl>) -> Option<Hot<CqCtl>> {
    cached(&HOT_CQS, cq, || {
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

/// Puts back a CQ record [`remove_cq`] took, when the destroy it was taken for failed.
pub(crate) fn restore_cq(cq: usize, rec: Arc<CqCtl>) {
    write(|m| {
        m.cqs.entry(cq).or_insert(rec);
    });
    invalidate();
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

/// Puts back an SRQ record [`remove_srq`] took, when the destroy it was taken for failed.
pub(crate) fn restore_srq(srq: usize, rec: Arc<SrqCtl>) {
    write(|m| {
        m.srqs.entry(srq).or_insert(rec);
    });
    invalidate();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_cache_never_returns_a_torn_or_stale_entry() {
        static CACHE: HotCache<u8> = HotCache::new();
        // Keys that share slots, each with its own fake record address (never dereferenced).
        let keys: Vec<usize> = (1..=256).map(|i| i * 4096).collect();
        let rec_of = |k: usize| (k * 2) as *const u8;
        std::thread::scope(|s| {
            for t in 0..3 {
                let keys = &keys;
                s.spawn(move || {
                    for round in 0..20_000usize {
                        let k = keys[(round * 7 + t * 13) % keys.len()];
                        if round % 3 == 0 {
                            CACHE.put(k, 5, rec_of(k));
                        } else if let Some(p) = CACHE.get(k, 5) {
                            assert_eq!(p, rec_of(k), "a hit returns its own key's record");
                        }
                    }
                });
            }
        });
        let k = keys[0];
        CACHE.put(k, 5, rec_of(k));
        assert_eq!(CACHE.get(k, 5), Some(rec_of(k)));
        assert_eq!(CACHE.get(k, 6), None, "another generation misses");
        assert_eq!(CACHE.get(k + 1, 5), None, "another key misses");
    }
}
