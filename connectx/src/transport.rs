//! Transports the peer protocol does not serve (docs/connectx.md §5, "Other transports").
//!
//! A peer reaches a virtual region through its directory, with READs and lease requests over
//! the RC connection its WRs travel on. A UC QP has no READ and no acknowledgement: an RDMA
//! WRITE aimed at a region through the directory's rkey lands nowhere, silently, and both
//! ends of `ib_write_lat -c UC` wait forever. So the library passes UC through as plain verbs
//! have it: when a UC QP is created in a PD, every region of that PD that peers may access
//! (remote read, write or atomic rights) is registered whole, pinned, and the keys in the
//! application's `ibv_mr` become the whole registration's; regions registered in that PD from
//! then on are registered in pass-through. Applications read `mr->rkey` when they tell a peer
//! about a region, which perftest and rdma-core's examples do after creating their QPs. SGEs
//! with the directory's old lkey keep working through windows; SGEs with the new lkey reach
//! the whole registration directly.
//!
//! Such a region's new rkey is not a directory, so a peer running the library over RC cannot
//! reach it through the peer protocol (as for any pass-through region).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};

use crate::engine::Engine;
use crate::engine::call::{RealCall, lock};
use crate::fasthash::FastMap;
use crate::sys::*;

/// A region registered whole: its directory MR's own keys and the whole registration.
struct Whole {
    dir_keys: (u32, u32),
    mr: usize,
    bytes: u64,
}

/// PDs that have had a UC QP, and the regions registered whole (by directory MR).
#[derive(Default)]
struct Table {
    pds: FastMap<usize, ()>,
    whole: FastMap<usize, Whole>,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn table() -> MutexGuard<'static, Option<Table>> {
    lock(&TABLE)
}

/// Remote access rights: what makes a region reachable by peers.
const REMOTE: u32 = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

/// Whether regions with remote rights registered in `pd` go to pass-through (a UC QP was
/// created in it).
pub(crate) fn pd_passes_through(pd: usize, access: u32) -> bool {
    access & REMOTE != 0 && table().as_ref().is_some_and(|t| t.pds.contains_key(&pd))
}

impl Engine {
    /// A QP of type `qp_type` was created in `pd`: for UC, register the PD's regions with
    /// remote rights whole and give the application their keys (see the module's text).
    pub(crate) fn on_transport(&self, pd: usize, qp_type: u32) {
        if qp_type != IBV_QPT_UC {
            return;
        }
        {
            let mut t = table();
            let t = t.get_or_insert_with(Table::default);
            if t.pds.insert(pd, ()).is_some() {
                return;
            }
        }
        self.note("UC QP: the peer protocol needs RC, so regions of its PD with remote access are registered whole (pinned) and their keys passed through");
        let regions: Vec<(usize, u64, u64, u64, u32)> = {
            let st = lock(&self.state);
            st.regions
                .values()
                .filter(|r| r.pd == pd && r.access & REMOTE != 0)
                .map(|r| (r.dir_mr, r.va, r.len, r.iova, r.access))
                .collect()
        };
        for (dir_mr, va, len, iova, access) in regions {
            // SAFETY: the region's live PD and range, which the application keeps mapped
            // while it is registered.
            let mr = unsafe { self.register_whole(pd, va, len, iova, access) };
            if mr.is_null() {
                self.note("UC QP: a region could not be registered whole; it stays behind its directory (UC RDMA to it fails)");
                continue;
            }
            let d = dir_mr as *mut ibv_mr;
            // SAFETY: the directory MR is live (the region is registered), and `mr` is the
            // provider's fresh MR; the application reads the keys from `d`.
            let dir_keys = unsafe {
                let keys = ((*d).lkey, (*d).rkey);
                (*d).lkey = (*mr).lkey;
                (*d).rkey = (*mr).rkey;
                keys
            };
            self.counters()
                .passthrough_bytes
                .fetch_add(len, Ordering::Relaxed);
            let modes = &self.status().page().modes;
            modes.set_mr_mode(dir_mr, crate::status::MrMode::PinnedFallback);
            table().get_or_insert_with(Table::default).whole.insert(
                dir_mr,
                Whole {
                    dir_keys,
                    mr: mr as usize,
                    bytes: len,
                },
            );
        }
    }

    /// Before the directory MR `mr` is deregistered: if its region was registered whole,
    /// give the MR its own keys back and deregister the whole registration.
    pub(crate) fn before_dereg(&self, mr: *mut ibv_mr) {
        let Some(w) = table()
            .as_mut()
            .and_then(|t| t.whole.remove(&(mr as usize)))
        else {
            return;
        };
        // SAFETY: the application's live MR (it is deregistering it), the directory's.
        unsafe {
            (*mr).lkey = w.dir_keys.0;
            (*mr).rkey = w.dir_keys.1;
        }
        let _g = RealCall::enter();
        // SAFETY: the whole registration made in `on_transport`, deregistered once (removed
        // from the table above).
        unsafe { (self.real.dereg_mr)(w.mr as *mut ibv_mr) };
        self.counters()
            .passthrough_bytes
            .fetch_sub(w.bytes, Ordering::Relaxed);
    }
}
