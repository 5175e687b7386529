//! The lease protocol over the control connection (docs/connectx.md §5, §13): the
//! requester's side (a remote key classified by LOOKUP, windows leased by LEASE, both asked on
//! the QP's own control connection) and the owner's (the helper thread answers the requests
//! of every connection that is up).
//!
//! The lessee of a lease asked for on a control connection is the owner's application QP of
//! that connection: the connection it arrived on names it, the message cannot. A peer can
//! therefore only take, renew or end leases of its own connection, and they end when that
//! connection does (its QP to ERR or RESET, or destroyed: `Engine::drop_lessee`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::ctl::conversation::Conversation;
use crate::ctl::msg::{GRANT_KEYS, Msg, RegionInfo, Rights};
use crate::ctl::peers::{NoPeer, Outcome};
use crate::directory::{DirHeader, LeaseAnswer, LeaseBook, LeaseRequest};
use crate::engine::call::lock;
use crate::engine::records::{LibRegion, PostFail, QpCtl, RemoteRegion, SendSide};
use crate::engine::{Engine, State};
use crate::registry;
use crate::sys::*;
use crate::translate::Geometry;
use crate::window::RegionId;

/// What a requester can use to learn about a peer's keys.
pub(crate) enum PeerPath {
    /// The connection's control connection is up.
    Link(Arc<Conversation>),
    /// The connection was met and has no peer library (a peer without the library): its
    /// keys are plain MRs, used as they are.
    NoPeer,
    /// No control connection to speak of (no GRH, not met yet within the wait, or gone):
    /// the directory at IOVA 0 of the key (docs/connectx.md §5).
    Directory,
}

impl QpCtl {
    /// How this QP learns about its peer's keys, waiting for its control connection while it
    /// is being made: until the meeting's own deadline has passed (twice
    /// `NPRDMA_REMOTE_TIMEOUT_MS` after RTR, `engine::meeting`) and a second more, so that a
    /// peer without the library is known as such rather than still pending.
    pub(crate) fn peer_path(&self) -> PeerPath {
        let Some(pair) = *lock(&self.peer) else {
            return PeerPath::Directory;
        };
        let wait = Duration::from_millis(self.engine.cfg.remote_timeout_ms.saturating_mul(2))
            + Duration::from_secs(1);
        match self.engine.peers.wait(&pair, Instant::now() + wait) {
            Some(Outcome::Up(c)) if !c.is_gone() => PeerPath::Link(c),
            Some(Outcome::NoPeer(NoPeer::Meet(_))) => PeerPath::NoPeer,
            _ => PeerPath::Directory,
        }
    }

    /// What the peer's region behind `rkey` is, asked on the control connection.
    pub(crate) fn lookup_over_link(
        &self,
        link: Arc<Conversation>,
        rkey: u32,
    ) -> Result<RemoteRegion, PostFail> {
        self.engine
            .counters()
            .remote_requests
            .fetch_add(1, Ordering::Relaxed);
        let timeout = Duration::from_millis(self.engine.cfg.remote_timeout_ms);
        match link.ask(|seq| Msg::Lookup { seq, rkey }, Instant::now() + timeout) {
            Ok(Msg::Directory { info, .. }) => {
                Ok(RemoteRegion::Library(Box::new(lib_region(&info, link))))
            }
            Ok(Msg::Plain { .. }) => {
                self.engine.note(
                    "a peer's key is a plain MR of its library (ODP, dmabuf, memory windows, pinned fallbacks): used as it is",
                );
                Ok(RemoteRegion::Direct)
            }
            // Unknown to the peer's library: used as it is, and the peer's NIC refuses it (or
            // accepts it) exactly as without the library.
            Ok(_) => Ok(RemoteRegion::Direct),
            Err(_) => {
                self.engine.note(
                    "the peer's library did not answer a key lookup within NPRDMA_REMOTE_TIMEOUT_MS: the work request fails with IBV_WC_REM_OP_ERR",
                );
                Err(PostFail::Status(IBV_WC_REM_OP_ERR))
            }
        }
    }

    /// The peer's rkey for window `index` of a region learnt on a control connection,
    /// leasing it there (the caller found no lease of this QP on it).
    pub(crate) fn lease_over_link(
        &self,
        side: &mut SendSide,
        rkey: u32,
        index: u64,
        write: bool,
        lessee: u32,
    ) -> Result<u32, PostFail> {
        let timeout = Duration::from_millis(self.engine.cfg.remote_timeout_ms);
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_micros(20);
        let Ok(first) = u32::try_from(index) else {
            return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
        };
        loop {
            let (link, epoch) = match side.remote.get(&rkey) {
                Some(RemoteRegion::Library(l)) => match &l.link {
                    Some(c) => (c.clone(), l.epoch),
                    None => return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR)),
                },
                _ => return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR)),
            };
            let give_up = |side: &mut SendSide| {
                Err(self.lease_timed_out(side, rkey, lessee, timeout, "library"))
            };
            if Instant::now() >= deadline {
                return give_up(side);
            }
            self.engine
                .counters()
                .remote_requests
                .fetch_add(1, Ordering::Relaxed);
            let ask = |seq| Msg::Lease {
                seq,
                rkey,
                epoch,
                first,
                count: 1,
                write,
            };
            match link.ask(ask, deadline) {
                Ok(Msg::Grant { keys, .. }) => {
                    let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey) else {
                        return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR));
                    };
                    let change = l.mirror.grant(lessee, epoch, index, 1);
                    for d in change.dropped {
                        l.rkeys.remove(&d);
                    }
                    l.rkeys.insert(index, keys[0]);
                    return Ok(keys[0]);
                }
                Ok(Msg::OutOfRegion { .. }) => return Err(PostFail::Status(IBV_WC_REM_ACCESS_ERR)),
                Ok(_) => {
                    // Busy: the owner's budget is full. Give our own leases back if we hold
                    // any (a new epoch; the owner ends the old one's leases before serving the
                    // next request, and our earlier WRs executed before it, RC order), else
                    // wait for others to give theirs.
                    if let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey)
                        && !l.mirror.held(lessee).is_empty()
                    {
                        l.forget(lessee);
                        continue;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(1));
                }
                // No answer (or the connection went): what the request did is unknown.
                Err(_) => return give_up(side),
            }
        }
    }
}

/// A peer region as a LOOKUP described it.
fn lib_region(info: &RegionInfo, link: Arc<Conversation>) -> LibRegion {
    let geom = Geometry {
        iova: info.iova,
        len: info.len,
        window_shift: u32::from(info.window_shift),
    };
    let windows = u32::try_from(geom.window_count()).unwrap_or(u32::MAX);
    let mut header = DirHeader::for_region(
        info.rights.any(),
        info.iova,
        info.len,
        info.window_shift,
        windows,
    );
    header.lease_cap = info.lease_cap;
    header.dir_len = info.dir_len;
    LibRegion {
        header,
        geom,
        mirror: LeaseBook::new(usize::from(info.lease_cap)),
        epoch: 1,
        rkeys: crate::fasthash::FastMap::default(),
        served_hint: 0,
        link: Some(link),
    }
}

/// The remote rights of an access mask.
fn rights(access: u32) -> Rights {
    Rights {
        read: access & IBV_ACCESS_REMOTE_READ != 0,
        write: access & IBV_ACCESS_REMOTE_WRITE != 0,
        atomic: access & IBV_ACCESS_REMOTE_ATOMIC != 0,
    }
}

impl Engine {
    /// Windows leased to peers through `qp`'s connection now (its lessee's windows in every
    /// region of its context).
    pub fn leased_windows(&self, qp: *mut ibv_qp) -> usize {
        let Some(q) = registry::qp(qp as usize) else {
            return 0;
        };
        let st = lock(&self.state);
        st.regions
            .values()
            .filter(|r| r.ctx == q.ctx.ctx)
            .map(|r| r.leases.held(q.qp_num).len())
            .sum()
    }

    /// Answers the requests waiting on every control connection that is up (the helper
    /// thread); returns how many were answered.
    pub(crate) fn serve_links(&self) -> usize {
        let mut answered = 0;
        for (_, tag, conv) in self.peers.up() {
            // The connection's application QP: the lessee of what it asks for.
            let Some(q) = registry::qp(tag) else {
                continue;
            };
            for _ in 0..16 {
                match conv.next_request() {
                    Ok(Some(req)) => {
                        let a = self.answer(&q, &req);
                        let deadline =
                            Instant::now() + Duration::from_millis(self.cfg.remote_timeout_ms);
                        // A peer that does not take its answers hurts only its own requests.
                        let _ = conv.reply(&a, deadline);
                        answered += 1;
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }
        if answered > 0 {
            self.publish(&lock(&self.state));
        }
        answered
    }

    /// The region of `q`'s protection domain whose application rkey is `rkey` (a key of
    /// another PD would be refused by the NIC for this connection, as without the library).
    fn region_by_rkey(st: &State, q: &QpCtl, rkey: u32) -> Option<RegionId> {
        st.regions
            .values()
            .find(|r| {
                r.ctx == q.ctx.ctx && r.pd == q.pd && {
                    // SAFETY: the directory MR is live while its region is registered.
                    unsafe { (*(r.dir_mr as *mut ibv_mr)).rkey == rkey }
                }
            })
            .map(|r| r.id)
    }

    fn answer(&self, q: &QpCtl, req: &Msg) -> Msg {
        let mut st = lock(&self.state);
        match *req {
            Msg::Lookup { seq, rkey } => {
                if let Some(r) =
                    Self::region_by_rkey(&st, q, rkey).and_then(|id| st.regions.get(&id))
                {
                    return Msg::Directory {
                        seq,
                        rkey,
                        info: RegionInfo {
                            iova: r.geom.iova,
                            len: r.geom.len,
                            window_shift: r.geom.window_shift as u8,
                            lease_cap: r.header.lease_cap,
                            rights: rights(r.access),
                            dir_len: r.header.dir_len,
                        },
                    };
                }
                let plain = st.passthrough_mrs.keys().any(|&mr| {
                    // SAFETY: pass-through MRs are live while listed (removed under this lock
                    // before they are deregistered).
                    unsafe {
                        let m = &*(mr as *mut ibv_mr);
                        m.rkey == rkey && m.pd as usize == q.pd
                    }
                });
                if plain {
                    Msg::Plain { seq, rkey }
                } else {
                    Msg::Unknown { seq, rkey }
                }
            }
            Msg::Lease {
                seq,
                rkey,
                epoch,
                first,
                count,
                write,
            } => {
                let refused = Msg::OutOfRegion { seq, rkey };
                let Some(id) = Self::region_by_rkey(&st, q, rkey) else {
                    return refused;
                };
                let Some(r) = st.regions.get(&id) else {
                    return refused;
                };
                if count == 0 {
                    return refused;
                }
                let (first64, last) = (u64::from(first), u64::from(first) + u64::from(count) - 1);
                if last >= r.geom.window_count() {
                    return refused;
                }
                let (addr, _) = r.geom.window_range(first64);
                let (_, end) = r.geom.window_range(last);
                let lease = LeaseRequest {
                    ticket: 0,
                    lessee: q.qp_num,
                    epoch,
                    rkey,
                    addr,
                    len: end - addr,
                    write,
                };
                match self.grant(&mut st, id, &lease) {
                    (LeaseAnswer::Granted, k) => {
                        let mut keys = [0u32; GRANT_KEYS];
                        let n = k.len().min(GRANT_KEYS);
                        keys[..n].copy_from_slice(&k[..n]);
                        Msg::Grant {
                            seq,
                            rkey,
                            epoch,
                            first,
                            count: n as u8,
                            keys,
                        }
                    }
                    (LeaseAnswer::Busy, _) => Msg::Busy { seq, rkey },
                    _ => refused,
                }
            }
            // Only requests come here (Conversation::next_request).
            _ => Msg::Unknown {
                seq: req.seq(),
                rkey: 0,
            },
        }
    }
}

impl QpCtl {
    /// A lease request without an answer in time (through the peer's `whose`, its library
    /// or its directory): this QP forgets its leases of that region (a new epoch, as the
    /// owner will when it sees one), says so once, and the WR fails with
    /// `IBV_WC_REM_OP_ERR` (docs/connectx.md §5 item 4).
    pub(crate) fn lease_timed_out(
        &self,
        side: &mut SendSide,
        rkey: u32,
        lessee: u32,
        timeout: Duration,
        whose: &str,
    ) -> PostFail {
        if let Some(RemoteRegion::Library(l)) = side.remote.get_mut(&rkey) {
            l.forget(lessee);
        }
        self.engine.note(&format!(
            "the peer's {whose} did not grant a window within {} ms (NPRDMA_REMOTE_TIMEOUT_MS): the work request fails with IBV_WC_REM_OP_ERR",
            timeout.as_millis()
        ));
        PostFail::Status(IBV_WC_REM_OP_ERR)
    }
}
