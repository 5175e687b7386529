//! The engine's construction (registered with the `fork()` handlers, crate::fork) and the
//! helper thread that serves peers' lease requests (crate::remote).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Config;
use crate::engine::{Engine, State};
use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::status::PageStore;
use crate::window::WindowCache;

impl Engine {
    /// An engine over `real` with configuration `cfg`, counting into `status`.
    pub fn new(real: RealVerbs, cfg: Config, status: PageStore) -> Arc<Self> {
        let engine = Arc::new(Self {
            real,
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
        // The helper is born with every signal blocked (a thread inherits its creator's
        // mask): signals sent to the process are for the application's threads, whose
        // handlers must not run on the library's. Faults of the helper itself are still
        // delivered.
        // SAFETY: all-zero is a valid sigset_t, which sigfillset fills; pthread_sigmask
        // changes this thread's mask only, and the old mask is put back right after the spawn.
        let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        unsafe {
            let mut all: libc::sigset_t = core::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        }
        let spawned = std::thread::Builder::new()
            .name("nprdma-helper".into())
            .spawn(move || crate::remote::helper_loop(weak));
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
        if spawned.is_err() {
            self.helper_started.store(false, Ordering::Release);
            self.note("could not start the helper thread: peers cannot reach unpinned memory");
        }
    }
}
