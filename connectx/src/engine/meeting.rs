//! Meeting the peer's library when an application connection reaches RTR
//! (docs/connectx.md §13): the pair from the QP's attributes, the quick half of the meeting in
//! `ibv_modify_qp`, the waiting half on a thread of its own, and the end of the control
//! connection with the application's.

use core::ffi::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::ctl::pair::Endpoint;
use crate::ctl::peers::{NoPeer, Outcome};
use crate::engine::call::{RealCall, lock, spawn_quiet};
use crate::engine::records::QpCtl;
use crate::engine::region::Provider;
use crate::engine::{Engine, State};
use crate::sys::*;

/// How long the waiting half may take: twice `NPRDMA_REMOTE_TIMEOUT_MS` (a peer may reach
/// RTR a while after this side). A requester waits for the meeting's outcome (a second longer
/// than this, `QpCtl::peer_path`), so a peer without the library costs a WR posted right
/// after RTR that much once, then its keys pass through.
fn meeting_time(remote_timeout_ms: u64) -> Duration {
    Duration::from_millis(remote_timeout_ms.saturating_mul(2))
}

/// One fixed text per reason: the status page keeps a few reasons, one per connection or
/// error number would crowd out the others.
fn reason_text(r: &NoPeer) -> &'static str {
    match r {
        NoPeer::NoGrh => {
            "an RC connection without a GRH (InfiniBand LID addressing) has no control connection: its peer's keys are used as they are"
        }
        NoPeer::NoLocalGid => {
            "ibv_query_gid failed for an RC connection's GID index: no control connection, its peer's keys are used as they are"
        }
        NoPeer::Pair(_) => {
            "an RC connection whose GIDs carry no IP address (RoCE v1) or that is connected to itself has no control connection: its peer's keys are used as they are"
        }
        _ => {
            "no control connection with an RC connection's peer (a peer without libnprdma, no librdmacm, or unreachable): its keys are used as they are"
        }
    }
}

impl Engine {
    /// Notes why a connection has no control connection (log once, doctor).
    pub(crate) fn note_no_peer(&self, r: &NoPeer) {
        self.note(reason_text(r));
    }

    /// At RTR of a managed RC QP: starts meeting the peer's library. Never waits for the peer:
    /// only the listener's bind happens here, the rest on a thread of its own.
    pub(crate) fn meet_peer(&self, ctl: &QpCtl, a: &ibv_qp_attr, mask: c_int) {
        if ctl.qp_type != IBV_QPT_RC {
            return;
        }
        if mask & IBV_QP_AV == 0 || a.ah_attr.is_global == 0 {
            self.note_no_peer(&NoPeer::NoGrh);
            return;
        }
        let port = if a.ah_attr.port_num == 0 {
            1
        } else {
            a.ah_attr.port_num
        };
        let mut gid = [0u8; 16];
        let rc = {
            let _g = RealCall::enter();
            // SAFETY: the QP's live context and a 16-byte GID buffer.
            unsafe {
                (self.real.query_gid)(
                    ctl.ctx.ctx as *mut ibv_context,
                    port,
                    c_int::from(a.ah_attr.grh.sgid_index),
                    &mut gid,
                )
            }
        };
        if rc != 0 {
            self.note_no_peer(&NoPeer::NoLocalGid);
            return;
        }
        let dest_qpn = if mask & IBV_QP_DEST_QPN != 0 {
            a.dest_qp_num
        } else {
            ctl.dest_qpn.load(std::sync::atomic::Ordering::Acquire)
        };
        let local = Endpoint {
            gid,
            qpn: ctl.qp_num,
        };
        let remote = Endpoint {
            gid: a.ah_attr.grh.dgid,
            qpn: dest_qpn,
        };
        let (pair, starting) = match self.peers.start(local, remote, ctl.qp) {
            Ok(s) => s,
            Err(r) => {
                self.note_no_peer(&r);
                return;
            }
        };
        *lock(&ctl.peer) = Some(pair);
        // The helper thread answers the peer's requests on the connection.
        ctl.engine.ensure_helper();
        let Some(starting) = starting else {
            return;
        };
        // The link's message buffers are pinned: counted in the budget from now until the
        // pair is forgotten or found to have no peer.
        let cost = self.peers.pinned_per_link();
        if !self.charge_link(cost) {
            self.peers.forget(&pair);
            *lock(&ctl.peer) = None;
            self.note(
                "no room in the budget for a control connection's page: its peer's keys are used as they are",
            );
            return;
        }
        let peers = self.peers.clone();
        let engine = Arc::downgrade(&ctl.engine);
        let deadline = Instant::now() + meeting_time(self.cfg.remote_timeout_ms);
        let spawned = spawn_quiet("nprdma-meet", move || {
            peers.finish(pair, starting, deadline, |r| {
                if let Some(e) = engine.upgrade() {
                    e.uncharge_link(cost);
                    e.note_no_peer(r);
                }
            });
        });
        if spawned.is_err() {
            // The listener (if any) was dropped with the closure: nobody meets this pair.
            if self.peers.forget(&pair) {
                self.uncharge_link(cost);
            }
            *lock(&ctl.peer) = None;
            self.note(
                "could not start a thread to meet a peer's library: its keys are used as they are",
            );
        }
    }

    /// Counts a link's pinned bytes in the budget (making room as for any pin).
    fn charge_link(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut st = lock(&self.state);
        let ok = {
            let State { regions, cache, .. } = &mut *st;
            let mut prov = Provider {
                real: &self.real,
                regions,
            };
            cache.charge_fixed(bytes, &mut prov).is_ok()
        };
        if ok {
            self.publish(&st);
        }
        ok
    }

    fn uncharge_link(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut st = lock(&self.state);
        st.cache.uncharge_fixed(bytes);
        self.publish(&st);
    }

    /// Ends the QP's control connection (its connection went to error, reset or away).
    pub(crate) fn forget_peer(&self, ctl: &QpCtl) {
        if let Some(p) = lock(&ctl.peer).take()
            && self.peers.forget(&p)
        {
            self.uncharge_link(self.peers.pinned_per_link());
        }
    }

    /// The state of `qp`'s control connection, waiting up to `wait` while it is being made
    /// (`None`: the QP is not managed or never reached RTR with a GRH).
    pub fn control_connection(&self, qp: *mut ibv_qp, wait: Duration) -> Option<Outcome> {
        let ctl = crate::registry::qp(qp as usize)?;
        let pair = (*lock(&ctl.peer))?;
        self.peers.wait(&pair, Instant::now() + wait)
    }
}
