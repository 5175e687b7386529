//! Windows in use: acquiring a WR's windows within the budget (waiting for completions, taking
//! back held windows), releasing them, forgetting a region's, and the scratch pages of the
//! library's own WRs.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::completion::WinList;
use crate::directory::DmaBuf;
use crate::engine::call::{RealCall, lock};
use crate::engine::records::{Batch, PostFail, QpCtl, Scratch, SendSide};
use crate::engine::region::{Provider, Region};
use crate::engine::{Engine, State};
use crate::fasthash::FastMap;
use crate::registry;
use crate::sys::*;
use crate::translate::PlannedSge;
use crate::window::{CacheError, RegionId, WindowId, WindowSpec};

impl Engine {
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
    pub(super) fn drop_region_windows(&self, st: &mut State, id: RegionId) {
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

    /// Takes back the windows QPs hold for their warm path ([`LocalHold`](crate::engine::records::LocalHold)) when the budget
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

    pub(super) fn free_scratch(&self, s: Scratch) {
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

impl QpCtl {
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
}

/// The budget had no room for a receive's windows: takes back the windows QPs hold for their
/// warm path and tries again while their barriers complete (briefly: receives in flight free
/// nothing until messages arrive).
pub(super) fn acquire_after_revoking_holds(
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

pub(super) fn acquire_recv_windows(
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
