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
//! the forced signals of §3 ensure for the library's recorded WRs. How long a post waits
//! without progress depends on what the queue holds ([`room_patience`]): with recorded WRs of
//! the library outstanding, their completions are certain to come (RC completes or flushes
//! every WR), only slowly when the queue is full of large parts (under TCG rxe moves a few
//! MB/s, so `ib_write_bw -a` at 8 MiB, five WRs of nine parts each, went more than 2 s without
//! a completion and failed with ENOMEM): it waits as long as the library waits for its own
//! WRs. With none, the application filled its own queue, and after [`ROOM_PATIENCE`] ENOMEM is
//! returned, as plain verbs would return it.

use std::time::{Duration, Instant};

use crate::engine::records::QpCtl;

/// How long a post waits for its send queue to make progress before it gives up, when the
/// queue holds none of the library's recorded WRs.
pub(crate) const ROOM_PATIENCE: Duration = Duration::from_secs(2);

/// How long a post waits without progress: [`ROOM_PATIENCE`] when nothing recorded is
/// outstanding on the send queue, else `internal_wait` (how long the library waits for one of
/// its own WRs), never less than [`ROOM_PATIENCE`].
pub(crate) fn room_patience(recorded_outstanding: bool, internal_wait: Duration) -> Duration {
    if recorded_outstanding {
        internal_wait.max(ROOM_PATIENCE)
    } else {
        ROOM_PATIENCE
    }
}

impl QpCtl {
    /// The provider refused a post with ENOMEM (its send queue is full): waits until one of
    /// the QP's CQs makes progress (its completions go to the stashes). Returns false when
    /// nothing completed within [`room_patience`] of `*since` (set at the first wait of a
    /// post, moved on at every progress), true when the post should be tried again.
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
                let recorded = self.track.lock().send.outstanding() > 0;
                if start.elapsed() >= room_patience(recorded, self.internal_wait()) {
                    return false;
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outstanding_library_wrs_are_waited_for_as_long_as_the_library_waits_for_its_own() {
        let internal = Duration::from_secs(30);
        // A queue full of slow split parts (8 MiB WRITEs under TCG) completes after more than
        // 2 s: that must not turn into ENOMEM.
        assert_eq!(room_patience(true, internal), internal);
        assert!(room_patience(true, internal) > Duration::from_secs(9));
        // The application's own WRs only: as plain verbs, ENOMEM after a short wait.
        assert_eq!(room_patience(false, internal), ROOM_PATIENCE);
        // Never shorter than the plain patience.
        assert_eq!(room_patience(true, Duration::from_millis(1)), ROOM_PATIENCE);
    }
}
