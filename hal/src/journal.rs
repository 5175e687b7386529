//! A per-thread journal of register accesses, barriers and system-register accesses
//! (host only, `std` feature).
//!
//! Recording is off until a test calls [`start`]; long simulations pay nothing. Because the
//! journal is per thread, tests running in parallel do not see each other's events, and a
//! driver running on the test's thread is recorded in program order.

use std::cell::RefCell;
use std::vec::Vec;

use crate::barrier::Barrier;
use crate::regs::AccessWidth;

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A register read through a [`RecordingBus`](crate::model::RecordingBus).
    Read {
        /// Label of the bus (which device).
        bus: &'static str,
        /// Offset in the bus window.
        offset: usize,
        /// Access width.
        width: AccessWidth,
        /// The value read.
        value: u64,
    },
    /// A register write through a [`RecordingBus`](crate::model::RecordingBus).
    Write {
        /// Label of the bus.
        bus: &'static str,
        /// Offset in the bus window.
        offset: usize,
        /// Access width.
        width: AccessWidth,
        /// The value written.
        value: u64,
    },
    /// A barrier.
    Barrier(Barrier),
    /// A system-register write (through [`crate::sysreg`]).
    SysRegWrite {
        /// Register name.
        name: &'static str,
        /// Value written.
        value: u64,
    },
}

thread_local! {
    static JOURNAL: RefCell<Option<Vec<Event>>> = const { RefCell::new(None) };
}

/// Starts (or restarts, discarding old events) recording on this thread.
pub fn start() {
    JOURNAL.with(|j| *j.borrow_mut() = Some(Vec::new()));
}

/// Stops recording and returns what was recorded.
pub fn stop() -> Vec<Event> {
    JOURNAL.with(|j| j.borrow_mut().take().unwrap_or_default())
}

/// Returns the events so far and keeps recording.
pub fn take() -> Vec<Event> {
    JOURNAL.with(|j| {
        j.borrow_mut()
            .as_mut()
            .map(core::mem::take)
            .unwrap_or_default()
    })
}

/// Appends an event if recording is on.
pub fn record(event: Event) {
    JOURNAL.with(|j| {
        if let Ok(mut j) = j.try_borrow_mut()
            && let Some(events) = j.as_mut()
        {
            events.push(event);
        }
    });
}
