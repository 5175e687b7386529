//! `fork()`: handlers registered with `pthread_atfork` for every engine of the process.
//!
//! - **Before** the fork, in the forking thread, each engine's helper gate (`helper_gate`: the
//!   helper thread between two batches of work) and state lock are taken, then the registry's
//!   read lock and the log's lock, so that the child's copy of each is free and consistent:
//!   in the child only the forking thread exists, and a lock another thread held at the fork
//!   would stay held there for good.
//! - **In the parent** they are released; nothing else changes.
//! - **In the child** they are released too, and each engine forgets its helper thread (the
//!   child has none: the next registration with remote access starts one), takes a private
//!   copy of its status page (the parent's shared page must not count the child's work), and
//!   from then on serves only the regions the child itself registers: the parent's regions,
//!   their directories and request rings stay the parent's (the parent's helper serves them).
//!
//! Locks the application itself holds at the fork (a QP's posting side on another thread)
//! stay held in the child, as the provider's own locks do: verbs objects are not usable
//! across `fork()` without the application's care (ibv_fork_init(3)).

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};

use crate::engine::Engine;
use crate::engine::call::lock;

/// The engines of this process (weak: an engine dropped in a test leaves a dead entry).
static ENGINES: Mutex<Vec<Weak<Engine>>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();

thread_local! {
    /// What the prepare handler holds until the parent or child handler, on the same thread.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Adds `engine` to the engines the fork handlers visit, installing them once.
pub(crate) fn register(engine: &Arc<Engine>) {
    INSTALL.call_once(|| {
        // SAFETY: three plain functions with no captured state, called by glibc around fork().
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
        }
    });
    let mut list = lock(&ENGINES);
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(engine));
}

/// One engine's locks, held across the fork. Fields drop in order: the guards first, then
/// the engine they borrow from.
struct EngineLocks {
    _state: MutexGuard<'static, crate::engine::State>,
    _gate: MutexGuard<'static, ()>,
    engine: Arc<Engine>,
}

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(|| {
        let list = lock(&ENGINES);
        let mut held: Vec<Box<dyn Any>> = Vec::new();
        for engine in list.iter().filter_map(Weak::upgrade) {
            // SAFETY: `engine` (an Arc) is stored in the same struct after the guards and
            // dropped after them, so the engine outlives the borrows made here.
            let e: &'static Engine = unsafe { &*Arc::as_ptr(&engine) };
            let gate = lock(&e.helper_gate);
            let state = lock(&e.state);
            held.push(Box::new(EngineLocks {
                _state: state,
                _gate: gate,
                engine,
            }));
        }
        held.push(Box::new(list));
        held.push(crate::registry::hold_for_fork());
        held.push(crate::log::hold_for_fork());
        HELD.with(|h| *h.borrow_mut() = held);
    });
}

/// Releases what `prepare` took, last taken first; returns the engines.
fn release() -> Vec<Arc<Engine>> {
    let mut held = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    let mut engines = Vec::new();
    while let Some(item) = held.pop() {
        match item.downcast::<EngineLocks>() {
            Ok(locks) => {
                let EngineLocks {
                    _state,
                    _gate,
                    engine,
                } = *locks;
                drop(_state);
                drop(_gate);
                engines.push(engine);
            }
            Err(other) => drop(other),
        }
    }
    engines
}

extern "C" fn parent() {
    let _ = std::panic::catch_unwind(|| drop(release()));
}

extern "C" fn child() {
    let _ = std::panic::catch_unwind(|| {
        crate::engine::call::renew_pid();
        for engine in release() {
            engine.after_fork_in_child();
        }
    });
}
