//! The engine's construction (registered with the `fork()` handlers, crate::fork) and the
//! helper thread that serves peers' lease requests (crate::remote).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::ctl::link::{CmMeet, Meet};
use crate::ctl::peers::Peers;
use crate::engine::call::spawn_quiet;
use crate::engine::{Engine, State};
use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::status::PageStore;
use crate::window::WindowCache;

impl Engine {
    /// An engine over `real` with configuration `cfg`, counting into `status`.
    pub fn new(real: RealVerbs, cfg: Config, status: PageStore) -> Arc<Self> {
        Self::with_meet(real, cfg, status, Arc::new(CmMeet::default()))
    }

    /// An engine whose control connections are made by `meet` (the tests' in-process one,
    /// `ctl::local::LocalMeet`, where two engines of one process meet).
    pub fn with_meet(
        real: RealVerbs,
        cfg: Config,
        status: PageStore,
        meet: Arc<dyn Meet>,
    ) -> Arc<Self> {
        let engine = Arc::new(Self {
            real,
            peers: Arc::new(Peers::new(meet)),
            state: Mutex::new(State {
                regions: FastMap::default(),
                by_mr: FastMap::default(),
                by_lkey: FastMap::default(),
                passthrough_mrs: FastMap::default(),
                cache: WindowCache::new(cfg.budget),
                next_region: 1,
                leased_bytes: 0,
                held_bytes: 0,
                odp: Default::default(),
            }),
            cfg,
            status,
            helper_started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            hold_epoch: AtomicU64::new(1),
            holds_wanted: AtomicBool::new(false),
            helper_gate: Mutex::new(()),
        });
        crate::fork::register(&engine);
        engine
    }

    /// Starts the helper thread that serves peers' lease requests (once).
    pub(crate) fn ensure_helper(self: &Arc<Self>) {
        if self.helper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        // The helper is born with every signal blocked (`spawn_quiet`).
        let spawned = spawn_quiet("nprdma-helper", move || crate::remote::helper_loop(weak));
        if spawned.is_err() {
            self.helper_started.store(false, Ordering::Release);
            self.note("could not start the helper thread: peers cannot reach unpinned memory");
        }
    }
}
