//! The library's log: one line per event on stderr, prefixed `nprdma[pid]:`, each distinct
//! reason at most once per process (applications must not be flooded from a data path).

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static ENABLED: AtomicBool = AtomicBool::new(true);
static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Turns logging on or off (from `NPRDMA_LOG`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Logs `message`.
pub fn line(message: &str) {
    if ENABLED.load(Ordering::Relaxed) {
        let text = format!("nprdma[{}]: {message}\n", std::process::id());
        // A failed write to stderr is not the application's problem: dropped, never a panic.
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    }
}

/// The log's lock, held across `fork()` by the fork handlers (crate::fork).
pub(crate) fn hold_for_fork() -> Box<dyn std::any::Any> {
    match SEEN.lock() {
        Ok(g) => Box::new(g),
        Err(poisoned) => Box::new(poisoned.into_inner()),
    }
}

/// Logs `message` unless the same text was logged before; returns whether it was new.
pub fn once(message: &str) -> bool {
    let new = match SEEN.lock() {
        Ok(mut guard) => guard
            .get_or_insert_with(HashSet::new)
            .insert(message.to_string()),
        Err(_) => true,
    };
    if new {
        line(message);
    }
    new
}
