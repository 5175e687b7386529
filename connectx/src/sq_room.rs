//! Waiting for send-queue room (docs/connectx.md §3, "Send-queue room").
//!
//! The library posts more provider WRs than the application does: the parts of a split WR,
//! its own barriers and probes. The send queue is widened at creation, but no fixed widening
//! covers every split (a 4 MiB WRITE over 1 MiB windows is five WRs; perftest keeps its whole
//! `tx_depth` of them in flight), so a provider may refuse a post with ENOMEM that the
//! application, within its own queue depth, would never have seen. Plain verbs would have
//! accepted that WR, so the library does not pass the error on: it polls the QP's CQs (into
//! their stashes, which keeps the application's completions in order) until the provider has
//! room, and posts the rest. The queue empties as long as something in it is signaled, which
//! the forced signals of §3 ensure for the library's recorded WRs; only when nothing completes
//! for [`ROOM_PATIENCE`] is ENOMEM returned, as plain verbs would return it to an application
//! that overfills its own queue.

use std::time::{Duration, Instant};

use crate::engine::QpCtl;

/// How long a post waits for its send queue to make progress before it gives up.
pub(crate) const ROOM_PATIENCE: Duration = Duration::from_secs(2);

impl QpCtl {
    /// The provider refused a post with ENOMEM (its send queue is full): waits until one of
    /// the QP's CQs makes progress (its completions go to the stashes). Returns false when
    /// nothing completed within [`ROOM_PATIENCE`] of `*since` (set at the first wait of a
    /// post), true when the post should be tried again.
    pub(crate) fn wait_for_send_room(&self, since: &mut Option<Instant>) -> bool {
        let start = *since.get_or_insert_with(|| {
            self.engine.note(
                "send queue full of split WRs: a post waited for room instead of failing with ENOMEM",
            );
            Instant::now()
        });
        let mut spins = 0u32;
        loop {
            if self.poll_own_cqs() {
                *since = Some(Instant::now());
                return true;
            }
            if start.elapsed() >= ROOM_PATIENCE {
                return false;
            }
            spins += 1;
            if spins > 64 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
