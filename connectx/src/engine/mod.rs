//! The library's state and everything that happens between an application's verbs call and the
//! provider: virtual registrations, the window cache, QP and CQ records, work-request
//! translation and completion rewriting. The design is docs/connectx.md.
//!
//! Locking order (never taken in the other direction): a QP's `send` lock → a CQ's lock → the
//! engine's `state` lock → a queue's tracker lock (a deregistration forgets its region in the
//! trackers under `state`) → the registry.
//!
//! One concern per file. Listed from the bottom: each file uses only the files before it and,
//! outside this directory, modules below it (docs/connectx.md §2, "The code: one-way
//! modules"; `cargo xtask test` checks that the crate's imports form no cycle):
//!
//! - `call`: calls into libibverbs (the re-entry guard, `errno`), the lock helper, the
//!   process id, the calling thread;
//! - `cq_session`: an extended CQ's records (the provider's functions, the poll session);
//! - `wr_batch`: a QP's `ibv_wr_*` batch (builder state, the provider's own builder);
//! - `region`: a virtual region and the provider side of the window cache;
//! - this file: the [`Engine`] and the [`State`] behind its lock, its status page, what a
//!   child made by `fork()` changes;
//! - `records`: the per-object records (context, QP with its posting state, trackers and held
//!   window, CQ, SRQ, what a QP knows of its peers' regions);
//! - `meeting`: meeting the peer's library when a connection reaches RTR (crate::ctl);
//! - `poll`: polling CQs and the completion rules applied to each provider completion;
//! - `send_queue`: posting built WRs, the library's own WRs, synthesized completions;
//! - `warm`: the warm path of a send (held windows, one-lookup translation);
//! - `windows`: windows in use: acquiring them within the budget, releasing them, holds
//!   taken back, scratch pages;
//! - `post_send`: the general send path (planning, splitting, leases through crate::remote);
//! - `post_recv`: receives;
//! - `lifecycle`: the engine's construction and its helper thread;
//! - `registration`: `ibv_reg_mr`, `ibv_dereg_mr`, `ibv_rereg_mr`;
//! - `qp`: a QP's life (capabilities, creation, `ibv_modify_qp`, destruction) and the
//!   `create_qp_ex` entry of a context;
//! - `contexts`: opening and closing a device context (installs the data-path functions of
//!   crate::ops and crate::cq_ex).

pub(crate) mod call;
mod contexts;
pub(crate) mod cq_session;
mod lifecycle;
mod meeting;
pub(crate) mod poll;
pub(crate) mod post_recv;
mod post_send;
pub(crate) mod qp;
pub(crate) mod records;
pub(crate) mod region;
mod registration;
mod send_queue;
mod warm;
pub(crate) mod windows;
pub(crate) mod wr_batch;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::ctl::peers::Peers;
use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::status::{Counters, PageStore};
use crate::window::{RegionId, WindowCache};
use call::lock;
use region::Region;

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
    /// Bytes of windows QPs hold for their warm path ([`LocalHold`](records::LocalHold)); at most a quarter of
    /// the budget.
    pub held_bytes: u64,
    /// The ODP mode's choice per device and its MRs (crate::odp).
    pub odp: crate::odp_choice::Devices,
}

/// The library instance: one per process in the preloaded library, one per test otherwise.
pub struct Engine {
    pub(crate) real: RealVerbs,
    pub(crate) cfg: Config,
    pub(crate) state: Mutex<State>,
    pub(crate) status: PageStore,
    helper_started: AtomicBool,
    pub(crate) stop: AtomicBool,
    /// Moves on when local holds must no longer be used ([`LocalHold`](records::LocalHold)): a region was
    /// deregistered or re-registered, or the budget needs the held windows back.
    pub(crate) hold_epoch: AtomicU64,
    /// A peer's lease was refused for want of room while windows were held: the helper
    /// thread takes the holds back.
    pub(crate) holds_wanted: AtomicBool,
    /// Held by the helper thread for a batch of work, by context tear-down (so that the
    /// provider never closes a context while a batch may still use its objects) and across
    /// `fork()` (crate::fork).
    pub(crate) helper_gate: Mutex<()>,
    /// The control connections of the application's RC connections (docs/connectx.md §13).
    pub(crate) peers: Arc<Peers>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cfg", &self.cfg).finish()
    }
}

impl Engine {
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

    /// In a child made by `fork()`, from the fork handler (crate::fork), with the child's only
    /// thread: the parent's helper thread does not exist here, so the next registration with
    /// remote access starts one; the status page becomes a private copy.
    pub(crate) fn after_fork_in_child(&self) {
        self.helper_started.store(false, Ordering::Release);
        // The parent's control connections are the parent's: the child never touches them.
        self.peers.abandon_after_fork();
        let reason = if self.status.privatize_after_fork() {
            "forked child: its status page is a private copy (nprdma doctor does not list it); regions of the parent are not served here"
        } else {
            "forked child: its status page could not be made private and is shared with the parent"
        };
        // Recorded, not logged: a child that runs another program next (fork and exec) must
        // not print a line.
        self.status.page().add_reason(reason);
    }
}
