//! Remote access to unpinned memory: the requester's side (discovering a peer's directory,
//! asking it for window leases, all one-sided on the application's own QP) and the owner's
//! side (the helper thread that serves the request rings). Design: docs/connectx.md §5.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::directory::{
    DirHeader, ENTRY_PRESENT, LeaseAnswer, LeaseBook, LeaseRequest, SERVED_OFF, answer_overtaken,
    decode_answer, decode_entry, encode_answer, encode_entry,
};
use crate::engine::call::lock;
use crate::engine::records::{Batch, LibRegion, PostFail, QpCtl, RemoteRegion, SendSide};
use crate::engine::region::{Provider, Region};
use crate::engine::{Engine, State};
use crate::lease_link::PeerPath;
use crate::registry;
use crate::sys::*;
use crate::translate::{Geometry, RemoteClass};
use crate::window::{CacheError, RegionId, WindowId};

// Offsets in a QP's scratch page.
const OFF_HEADER: u64 = 0;
const OFF_ATOMIC: u64 = 128;
const OFF_SERVED: u64 = 136;
const OFF_REQUEST: u64 = 192;
const OFF_ANSWER: u64 = 256;
const OFF_ENTRIES: u64 = 320;

/// How long the owner waits for a drawn ticket's request to be written before skipping it.
const STALL_LIMIT: Duration = Duration::from_secs(2);

impl QpCtl {
    fn scratch_info(&self, side: &mut SendSide) -> Result<(u64, u32), PostFail> {
        if side.scratch.is_none() {
            side.scratch = self.engine.alloc_scratch(self.pd);
        }
        match &side.scratch {
            Some(s) => Ok((s.buf.as_ptr() as u64, s.lkey)),
            None => {
                self.engine.note(
                    "no room for the library's scratch buffer: remote access failed with ENOMEM",
                );
                Err(PostFail::Errno(libc::ENOMEM, 0))
            }
        }
    }

    /// One of the library's own one-sided operations on the peer's directory.
    #[allow(clippy::too_many_arguments)] // one WR's fields, named
    fn dir_op(
        &self,
        side: &mut SendSide,
        opcode: u32,
        rkey: u32,
        raddr: u64,
        local_off: u64,
        len: u32,
        add: u64,
    ) -> Result<(), PostFail> {
        let (base, lkey) = self.scratch_info(side)?;
        let mut wr = ibv_send_wr::zeroed();
        wr.opcode = opcode;
        if opcode == IBV_WR_ATOMIC_FETCH_AND_ADD {
            wr.set_atomic(raddr, add, 0, rkey);
        } else {
            wr.set_rdma(raddr, rkey);
        }
        let sge = ibv_sge {
            addr: base + local_off,
            length: len,
            lkey,
        };
        match self.internal(wr, sge)? {
            IBV_WC_SUCCESS => Ok(()),
            status => Err(PostFail::Status(status)),
        }
    }

    fn scratch_read(side: &SendSide, off: u64, len: usize) -> Vec<u8> {
        side.scratch
            .as_ref()
            .map(|s| s.buf.read(off, len))
            .unwrap_or_default()
    }

    /// Classifies the remote side of a WR; reads the peer's directory on first use of `rkey`.
    pub(crate) fn classify_remote(
        &self,
        side: &mut SendSide,
        rkey: u32,
        raddr: u64,
        len: u64,
        batch: &mut Batch,
    ) -> Result<RemoteClass, PostFail> {
        side.hot_remote = None;
        if !side.remote.contains_key(&rkey) {
            self.flush(batch)?;
            // Asked on the connection's control connection where it has one (§13), else read
            // from the directory at IOVA 0 of the key (§5).
            let info = match self.peer_path() {
                PeerPath::Link(link) => self.lookup_over_link(link, rkey)?,
                PeerPath::NoPeer => {
                    self.engine.note(
                        "a peer without libnprdma (no control connection was made): its keys and addresses are used as they are",
                    );
                    RemoteRegion::Direct
                }
                PeerPath::Directory => self.discover(side, rkey)?,
            };
            side.remote.insert(rkey, info);
        }
        Ok(match side.remote.get(&rkey) {
            Some(RemoteRegion::Library(l)) => {
                if l.header.exported && l.geom.contains(raddr, len) {
                    RemoteClass::Virtual {
                        addr: raddr,
                        len,
                        geom: l.geom,
                    }
                } else {
                    // Outside the peer's region, or a region without remote rights: aim past
                    // its directory so that the peer's NIC refuses it as plain verbs would.
                    RemoteClass::Keep {
                        addr: l.header.dir_len,
                        rkey,
                    }
                }
            }
            _ => RemoteClass::Keep { addr: raddr, rkey },
        })
    }

    fn discover(&self, side: &mut SendSide, rkey: u32) -> Result<RemoteRegion, PostFail> {
        self.engine
            .counters()
            .remote_requests
            .fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.dir_op(side, IBV_WR_RDMA_READ, rkey, 0, OFF_HEADER, 128, 0) {
            if let PostFail::Status(_) = e {
                // One fixed text: the status page keeps a few reasons, and one per key would
                // crowd out every other reason after a dozen bad keys.
                self.engine.note(
                    "reading the directory of a remote key failed: an invalid key, or a peer without libnprdma; the work request fails with that status",
                );
            }
            return Err(e);
        }
        let bytes = Self::scratch_read(side, OFF_HEADER, 128);
        match DirHeader::decode(&bytes) {
            Ok(header) => {
                let geom = Geometry {
                    iova: header.iova,
                    len: header.len,
                    window_shift: u32::from(header.window_shift),
                };
                Ok(RemoteRegion::Library(Box::new(LibRegion {
                    header,
                    geom,
                    mirror: LeaseBook::new(usize::from(header.lease_cap)),
                    epoch: 1,
                    rkeys: crate::fasthash::FastMap::default(),
                    served_hint: 0,
                    link: None,
                })))
            }
            Err(_) => {
                self.engine.note(
                    "a peer region has no nprdma directory (peer without libnprdma): its keys and addresses pass through",
                );
                Ok(RemoteRegion::Direct)
            }
        }
    }

    /// The peer's rkey for window `index` of the region the application names `rkey`,
    /// acquiring a lease if this QP does not hold one.
    pub(crate) fn ensure_lease(
        &self,
        side: &mut SendSide,
        rkey: u32,
        index: u64,
        write: bool,
        batch: &mut Batch,
    ) -> Result<u32, PostFail> {
        side.hot_remote = None;
        let lessee = self.dest_qpn.load(Ordering::Acquire);
        {
            let Some(RemoteRegion::Library(l)) = side.remote.get(&rkey) else {
                return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
            };
            if l.mirror.holds(lessee, index)
                && let Some(k) = l.rkeys.get(&index)
            {
                return Ok(*k);
            }
        }
        if lessee == 0 {
            self.engine.note("a QP without a known destination QP number cannot lease peer windows: the work request fails");
            return Err(PostFail::Status(IBV_WC_REM_OP_ERR));
        }
        self.flush(batch)?;
        if matches!(side.remote.get(&rkey), Some(RemoteRegion::Library(l)) if l.link.is_some()) {
            return self.lease_over_link(side, rkey, index, write, lessee);
        }
        let timeout = Duration::from_millis(self.engine.cfg.remote_timeout_ms);
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_micros(20);
        'request: loop {
            let (header, epoch, served_hint) = match side.remote.get(&rkey) {
                Some(RemoteRegion::Library(l)) => (l.header, l.epoch, l.served_hint),
                _ => return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR)),
            };
            let give_up = |side: &mut SendSide| {
                Err(self.lease_timed_out(side, rkey, lessee, timeout, "directory"))
            };
            if Instant::now() >= deadline {
                return give_up(side);
            }
            self.engine
                .counters()
                .remote_requests
                .fetch_add(1, Ordering::Relaxed);
            // Draw a ticket (in the ring MR: the directory itself is read-only to peers).
            self.dir_op(
                side,
                IBV_WR_ATOMIC_FETCH_AND_ADD,
                header.ring_rkey,
                header.ticket_off(),
                OFF_ATOMIC,
                8,
                1,
            )?;
            let ticket = u64::from_le_bytes(
                Self::scratch_read(side, OFF_ATOMIC, 8)
                    .try_into()
                    .unwrap_or([0; 8]),
            );
            // Wait for the ring to have room for it.
            let mut served = served_hint;
            // `served` is read from the peer's memory: saturating, so a corrupt value cannot
            // overflow.
            while ticket >= served.saturating_add(header.slots()) {
                self.dir_op(side, IBV_WR_RDMA_READ, rkey, SERVED_OFF, OFF_SERVED, 8, 0)?;
                served = u64::from_le_bytes(
                    Self::scratch_read(side, OFF_SERVED, 8)
                        .try_into()
                        .unwrap_or([0; 8]),
                );
                if ticket >= served.saturating_add(header.slots()) {
                    if Instant::now() >= deadline {
                        return give_up(side);
                    }
                    std::thread::sleep(backoff);
                }
            }
            if let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey) {
                l.served_hint = served;
            }
            let (wstart, wend) = Geometry {
                iova: header.iova,
                len: header.len,
                window_shift: u32::from(header.window_shift),
            }
            .window_range(index);
            let request = LeaseRequest {
                ticket,
                lessee,
                epoch,
                rkey,
                addr: wstart,
                len: wend - wstart,
                write,
            }
            .encode();
            if let Some(s) = &side.scratch {
                s.buf.write(OFF_REQUEST, &request);
            }
            self.dir_op(
                side,
                IBV_WR_RDMA_WRITE,
                header.ring_rkey,
                header.request_off(ticket),
                OFF_REQUEST,
                request.len() as u32,
                0,
            )?;
            // Poll the answer.
            let answer = loop {
                self.dir_op(
                    side,
                    IBV_WR_RDMA_READ,
                    rkey,
                    header.answer_off(ticket),
                    OFF_ANSWER,
                    64,
                    0,
                )?;
                let bytes = Self::scratch_read(side, OFF_ANSWER, 64);
                if let Some(a) = decode_answer(&bytes, lessee, ticket) {
                    break Some(a);
                }
                if answer_overtaken(&bytes, ticket) {
                    // Our request was served, but its answer was overwritten before we read
                    // it: we cannot know which of our leases the grant ended. Give them all
                    // back (a new epoch, which the owner applies before serving our next
                    // request) and ask again.
                    if let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey) {
                        l.forget(lessee);
                    }
                    continue 'request;
                }
                if Instant::now() >= deadline {
                    break None;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(1));
            };
            match answer {
                None => return give_up(side),
                Some(LeaseAnswer::OutOfRegion) => {
                    return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
                }
                Some(LeaseAnswer::Busy) => {
                    // The owner's budget is full. If our own leases take part of it, give them
                    // all back: forgetting moves us to a new epoch, and the owner ends every
                    // lease of an old epoch before serving the next request (safe: our earlier
                    // WRs executed before that request, RC order). Otherwise others hold the
                    // room: wait.
                    if let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey)
                        && !l.mirror.held(lessee).is_empty()
                    {
                        l.forget(lessee);
                        continue;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(1));
                    continue;
                }
                Some(LeaseAnswer::Granted) => {
                    self.dir_op(
                        side,
                        IBV_WR_RDMA_READ,
                        rkey,
                        header.entry_off(index),
                        OFF_ENTRIES,
                        8,
                        0,
                    )?;
                    let word = u64::from_le_bytes(
                        Self::scratch_read(side, OFF_ENTRIES, 8)
                            .try_into()
                            .unwrap_or([0; 8]),
                    );
                    let (state, wrkey) = decode_entry(word);
                    let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey) else {
                        return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
                    };
                    let change = l.mirror.grant(lessee, l.epoch, index, 1);
                    for d in change.dropped {
                        l.rkeys.remove(&d);
                    }
                    if state != ENTRY_PRESENT {
                        // The owner broke its word: forget everything and ask again.
                        l.forget(lessee);
                        continue;
                    }
                    l.rkeys.insert(index, wrkey);
                    return Ok(wrkey);
                }
            }
        }
    }
}

/// The request in `r`'s ring slot of the next ticket to serve, if one has landed whole.
fn next_request(r: &Region) -> Option<LeaseRequest> {
    LeaseRequest::decode(&r.dir.read(r.header.request_off(r.served), 56), r.served)
}

/// The helper thread: serves the request rings of the engine's exported regions until the
/// engine is dropped. It shares the descriptor table of the thread that started it and uses
/// the process's verbs objects as any thread does.
/// It runs with every signal blocked (see [`Engine::ensure_helper`]).
pub(crate) fn helper_loop(engine: Weak<Engine>) {
    let mut idle = 0u32;
    loop {
        let Some(eng) = engine.upgrade() else {
            return;
        };
        if eng.stop.load(Ordering::Acquire) {
            return;
        }
        let served = eng.helper_batch();
        drop(eng);
        // Fast while requests come (first touches arrive in bursts), then slower and slower:
        // every wake-up takes the application's CPU for two context switches when both share
        // one (an application pinned with taskset, as perftest advises, shares it with this
        // thread), which under emulation cost ib_write_lat about 4% with a 1 ms idle phase
        // (measured in one boot, alternating runs). After a burst the sleep doubles from 20 us
        // to 20 ms (about a dozen wake-ups in the first 40 ms), then stays at 20 ms, the
        // longest a request after a quiet spell waits.
        if served > 0 {
            idle = 0;
            std::thread::sleep(Duration::from_micros(10));
        } else {
            let us = (20u64 << idle.min(10)).min(20_000);
            idle = idle.saturating_add(1);
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

impl Engine {
    /// One wake-up of the helper: if a ring has a request (or held windows are wanted back),
    /// does the work. Returns the requests answered.
    pub(crate) fn helper_batch(self: &Arc<Self>) -> usize {
        let links = self.peers.any_up();
        if !self.holds_wanted.load(Ordering::Acquire) && !links && !self.rings_pending() {
            return 0;
        }
        let _gate = lock(&self.helper_gate);
        let mut served = self.serve_rings();
        if links {
            served += self.serve_links();
        }
        if self.holds_wanted.swap(false, Ordering::AcqRel) {
            for q in self.revoke_holds(None) {
                q.poll_for_others();
            }
        }
        served
    }

    /// Whether a ring of an exported region has a drawn ticket not served yet (a request, or
    /// one still being written, which [`serve_rings`](Self::serve_rings) times out).
    fn rings_pending(&self) -> bool {
        let st = lock(&self.state);
        st.regions.values().any(|r| {
            r.served_here()
                && (r.dir.load(r.header.ticket_off()) != r.served || next_request(r).is_some())
        })
    }

    /// Serves pending requests of every exported region; returns how many were answered.
    pub(crate) fn serve_rings(&self) -> usize {
        let mut st = lock(&self.state);
        let ids: Vec<RegionId> = st
            .regions
            .values()
            .filter(|r| r.served_here())
            .map(|r| r.id)
            .collect();
        let mut answered = 0;
        for id in ids {
            for _ in 0..16 {
                let Some(r) = st.regions.get_mut(&id) else {
                    break;
                };
                let t = r.served;
                let off = r.header.answer_off(t);
                let Some(req) = next_request(r) else {
                    // Nothing, or a drawn ticket whose request has not landed yet. A requester
                    // that died between drawing and writing must not block the ring forever.
                    if r.dir.load(r.header.ticket_off()) > t {
                        let since = *r.stall_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > STALL_LIMIT {
                            r.stall_since = None;
                            r.served = t.wrapping_add(1);
                            r.dir.store(SERVED_OFF, r.served);
                            continue;
                        }
                    }
                    break;
                };
                r.stall_since = None;
                let (answer, _) = self.grant(&mut st, id, &req);
                let Some(r) = st.regions.get_mut(&id) else {
                    break;
                };
                let bytes = encode_answer(req.lessee, t, answer, r.generation);
                r.dir.write(off, &bytes);
                r.served = t.wrapping_add(1);
                r.dir.store(SERVED_OFF, r.served);
                answered += 1;
            }
        }
        if answered > 0 {
            self.publish(&st);
        }
        answered
    }

    /// Ends one lease on a window (the lessee's book entry is already gone).
    fn end_lease(st: &mut State, wid: WindowId) {
        st.cache.remove_lease(wid);
        if st.cache.refs(wid).is_some_and(|(_, l)| l == 0) {
            let bytes = st.cache.spec(wid).map_or(0, |s| s.pinned_bytes());
            st.leased_bytes = st.leased_bytes.saturating_sub(bytes);
        }
    }

    /// Grants `req` (on the ring, or a LEASE message of a control connection with the lessee
    /// its connection's local QP number); with the granted windows' rkeys.
    pub(crate) fn grant(
        &self,
        st: &mut State,
        id: RegionId,
        req: &LeaseRequest,
    ) -> (LeaseAnswer, Vec<u32>) {
        let Some(r) = st.regions.get(&id) else {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        };
        // SAFETY: the directory MR is live while its region is registered.
        let dir_rkey = unsafe { (*(r.dir_mr as *mut ibv_mr)).rkey };
        if req.rkey != dir_rkey || !r.geom.contains(req.addr, req.len) {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        }
        let first = r.geom.window_of(req.addr);
        let last = r.geom.window_of(req.addr + req.len - 1);
        let count = last - first + 1;
        if count > crate::directory::MAX_REQUEST_WINDOWS {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        }
        // The lessee must be one of our QPs (the requester names our end of its connection).
        if req.lessee == 0 || !registry::is_live_qp_num(r.ctx, req.lessee) {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        }
        // A lessee in a new epoch gave its old leases back: end them before counting room.
        let ended = match st.regions.get_mut(&id) {
            Some(r) => r.leases.enter_epoch(req.lessee, req.epoch),
            None => Vec::new(),
        };
        for w in ended {
            Self::end_lease(
                st,
                WindowId {
                    region: id,
                    index: w,
                },
            );
        }
        let Some(r) = st.regions.get(&id) else {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        };
        let specs: Vec<_> = (first..=last)
            .map(|i| {
                (
                    WindowId {
                        region: id,
                        index: i,
                    },
                    r.window_spec(i),
                )
            })
            .collect();
        let new_lease_bytes: u64 = specs
            .iter()
            .filter(|(w, _)| st.cache.refs(*w).is_none_or(|(_, l)| l == 0))
            .map(|(_, s)| s.pinned_bytes())
            .sum();
        // Leases may hold at most three quarters of the budget, so that local work always
        // finds room.
        if st.leased_bytes + new_lease_bytes > st.cache.budget() / 4 * 3 {
            return (LeaseAnswer::Busy, Vec::new());
        }
        let keys = {
            let State { regions, cache, .. } = &mut *st;
            let mut prov = Provider {
                real: &self.real,
                regions,
            };
            match cache.ensure_all(&specs, &mut prov) {
                Ok(k) => k,
                Err(CacheError::NoRoom { .. }) => {
                    // Windows this process's QPs hold for their warm path may be what fills
                    // the budget: the helper asks for them back.
                    if st.held_bytes > 0 {
                        self.holds_wanted.store(true, Ordering::Release);
                    }
                    return (LeaseAnswer::Busy, Vec::new());
                }
                Err(CacheError::Provider(_)) => return (LeaseAnswer::OutOfRegion, Vec::new()),
            }
        };
        let State {
            regions,
            cache,
            leased_bytes,
            ..
        } = &mut *st;
        let Some(r) = regions.get_mut(&id) else {
            return (LeaseAnswer::OutOfRegion, Vec::new());
        };
        let change = r.leases.grant(req.lessee, req.epoch, first, count);
        for w in &change.added {
            let wid = WindowId {
                region: id,
                index: *w,
            };
            if cache.refs(wid).is_some_and(|(_, l)| l == 0) {
                *leased_bytes += cache.spec(wid).map_or(0, |s| s.pinned_bytes());
            }
            cache.add_lease(wid);
        }
        for (i, k) in (first..=last).zip(keys.iter()) {
            r.dir
                .store(r.header.entry_off(i), encode_entry(ENTRY_PRESENT, k.rkey));
        }
        r.generation += 1;
        for w in change.dropped.iter().copied() {
            Self::end_lease(
                st,
                WindowId {
                    region: id,
                    index: w,
                },
            );
        }
        self.counters()
            .leases_granted
            .fetch_add(change.added.len() as u64, Ordering::Relaxed);
        (LeaseAnswer::Granted, keys.iter().map(|k| k.rkey).collect())
    }
}
