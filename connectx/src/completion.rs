//! Which provider work request belongs to which application work request, and what the
//! application sees when a provider completion arrives.
//!
//! Every provider WR the library posts carries a sequence number of its queue pair as its
//! `wr_id`. The send queue completes in posting order (InfiniBand Architecture Specification
//! vol. 1, §10.8.6 "work requests ... complete in the order they were submitted" for a send
//! queue), so a completion for sequence `n` also retires every earlier, unsignaled entry: their
//! windows are released. The rules that give the application exactly one completion per
//! signaled WR, in order, with its own `wr_id`:
//!
//! - a successful completion is shown only for the *last* part of an application WR, and only if
//!   the application asked for it (signaled, or `sq_sig_all`);
//! - the library's own WRs (directory reads, lease requests) and the signals it forces on
//!   unsignaled runs are never shown;
//! - an error completion is shown once per application WR (the first failing part), whether or
//!   not it was signaled, as the provider does for plain WRs; the flushes of its later parts are
//!   not shown.

use std::collections::VecDeque;

use crate::fasthash::FastMap;
use crate::sys::IBV_WC_SUCCESS;
use crate::window::WindowId;

/// A short list of windows: up to two inline (the common case: one local window per WR), more
/// on the heap. Keeps the data path free of allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WinList {
    n: u8,
    inline: [WindowId; 2],
    spill: Vec<WindowId>,
}

impl WinList {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            n: 0,
            inline: [WindowId {
                region: 0,
                index: 0,
            }; 2],
            spill: Vec::new(),
        }
    }

    /// Appends a window.
    #[inline]
    pub fn push(&mut self, w: WindowId) {
        if usize::from(self.n) < self.inline.len() {
            self.inline[usize::from(self.n)] = w;
            self.n += 1;
        } else {
            self.spill.push(w);
        }
    }

    /// Appends all of `other`.
    pub fn extend(&mut self, other: WinList) {
        for w in other.iter() {
            self.push(w);
        }
    }

    /// The windows.
    pub fn iter(&self) -> impl Iterator<Item = WindowId> + '_ {
        self.inline[..usize::from(self.n)]
            .iter()
            .chain(self.spill.iter())
            .copied()
    }

    /// Number of windows.
    pub fn len(&self) -> usize {
        usize::from(self.n) + self.spill.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl From<Vec<WindowId>> for WinList {
    fn from(v: Vec<WindowId>) -> Self {
        let mut l = WinList::new();
        for w in v {
            l.push(w);
        }
        l
    }
}

impl FromIterator<WindowId> for WinList {
    fn from_iter<I: IntoIterator<Item = WindowId>>(it: I) -> Self {
        let mut l = WinList::new();
        for w in it {
            l.push(w);
        }
        l
    }
}

/// Who posted a provider WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A part of an application WR.
    App {
        /// The application's `wr_id`.
        wr_id: u64,
        /// Number of the application WR on this QP (all its parts share it).
        group: u64,
        /// Whether this is its last part.
        last: bool,
        /// Whether the application wants a completion on success.
        wants_completion: bool,
        /// The opcode the application posted (reported in synthesized completions).
        app_opcode: u32,
    },
    /// The library's own WR; `token` identifies the waiter.
    Internal {
        /// The waiter's token.
        token: u64,
    },
}

/// What to do with a provider completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Show it to the application with this `wr_id`.
    Deliver {
        /// The application's `wr_id`.
        wr_id: u64,
    },
    /// The library's WR `token` finished with `status`.
    Internal {
        /// Its token.
        token: u64,
        /// The provider status.
        status: u32,
    },
    /// Drop it.
    Suppress,
    /// Not a sequence number of ours: pass it on unchanged.
    Unknown,
}

#[derive(Debug)]
struct SendEntry {
    seq: u64,
    origin: Origin,
    windows: WinList,
}

/// The send queue side of a QP.
#[derive(Debug, Default)]
pub struct SendTracker {
    next_seq: u64,
    next_group: u64,
    entries: VecDeque<SendEntry>,
    last_reported_group: Option<u64>,
    unsignaled_run: u32,
}

impl SendTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new application WR number (for [`Origin::App::group`]).
    #[inline]
    pub fn next_group(&mut self) -> u64 {
        self.next_group += 1;
        self.next_group
    }

    /// Records a provider WR about to be posted; returns its sequence number (its `wr_id`).
    #[inline]
    pub fn record(&mut self, origin: Origin, windows: WinList) -> u64 {
        self.next_seq += 1;
        let seq = self.next_seq;
        self.entries.push_back(SendEntry {
            seq,
            origin,
            windows,
        });
        seq
    }

    /// Forgets the most recent records (the provider refused to post them); returns their
    /// windows.
    pub fn unrecord_after(&mut self, seq: u64) -> WinList {
        let mut windows = WinList::new();
        while self.entries.back().is_some_and(|e| e.seq > seq) {
            if let Some(e) = self.entries.pop_back() {
                windows.extend(e.windows);
            }
        }
        windows
    }

    /// Sequence number of the last record (0 if none yet).
    pub fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// Provider WRs posted and not yet known complete.
    pub fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// Whether the next provider WR must be signaled: the application (or the library) wants
    /// it, or `threshold` unsignaled WRs in a row are outstanding (their windows are released
    /// only by a later completion, so an endless unsignaled run would hold the budget).
    #[inline]
    pub fn must_signal(&mut self, wanted: bool, threshold: u32) -> bool {
        if wanted || self.unsignaled_run + 1 >= threshold.max(1) {
            self.unsignaled_run = 0;
            true
        } else {
            self.unsignaled_run += 1;
            false
        }
    }

    /// Handles the provider completion of sequence `seq` with `status`; returns the windows
    /// released (this entry's and every earlier one's) and what to do.
    #[inline]
    pub fn complete(&mut self, seq: u64, status: u32) -> (WinList, Outcome) {
        // The usual case: the oldest entry completes (every WR signaled, or the signaled one
        // at the end of an unsignaled run already retired the others).
        if self.entries.front().is_some_and(|f| f.seq == seq)
            && let Some(e) = self.entries.pop_front()
        {
            let outcome = self.outcome(e.origin, status);
            return (e.windows, outcome);
        }
        self.complete_later(seq, status)
    }

    /// What the application sees of a completion of `origin` with `status`.
    #[inline]
    fn outcome(&mut self, origin: Origin, status: u32) -> Outcome {
        match origin {
            Origin::Internal { token } => Outcome::Internal { token, status },
            Origin::App {
                wr_id,
                group,
                last,
                wants_completion,
                ..
            } => {
                if status == IBV_WC_SUCCESS {
                    if last && wants_completion {
                        Outcome::Deliver { wr_id }
                    } else {
                        Outcome::Suppress
                    }
                } else if self.last_reported_group == Some(group) {
                    Outcome::Suppress
                } else {
                    self.last_reported_group = Some(group);
                    Outcome::Deliver { wr_id }
                }
            }
        }
    }

    /// [`complete`](Self::complete) for an entry behind the front (retires the earlier ones).
    fn complete_later(&mut self, seq: u64, status: u32) -> (WinList, Outcome) {
        // Entries are in sequence order: the wanted one is at most `seq - front` from the front.
        let present = match self.entries.front() {
            Some(f) if seq >= f.seq => self
                .entries
                .get((seq - f.seq) as usize)
                .is_some_and(|e| e.seq == seq),
            _ => false,
        };
        if !present {
            return (WinList::new(), Outcome::Unknown);
        }
        let mut released = WinList::new();
        while let Some(e) = self.entries.pop_front() {
            // Usually only the completed entry is retired: take its list as is.
            if released.is_empty() {
                released = e.windows;
            } else {
                released.extend(e.windows);
            }
            if e.seq != seq {
                continue;
            }
            let outcome = self.outcome(e.origin, status);
            return (released, outcome);
        }
        (released, Outcome::Unknown)
    }

    /// Forgets every entry (the QP is being destroyed); returns all their windows.
    pub fn drain(&mut self) -> WinList {
        let mut w = WinList::new();
        for e in self.entries.drain(..) {
            w.extend(e.windows);
        }
        w
    }

    /// The application WRs with at least one part still outstanding, oldest first, and
    /// whether each was already reported; used when the library must fail the rest of a queue.
    pub fn pending_app_groups(&self) -> Vec<(u64, u64, u32)> {
        let mut out: Vec<(u64, u64, u32)> = Vec::new();
        for e in &self.entries {
            if let Origin::App {
                wr_id,
                group,
                app_opcode,
                ..
            } = e.origin
                && out.last().map(|g| g.0) != Some(group)
                && self.last_reported_group != Some(group)
            {
                out.push((group, wr_id, app_opcode));
            }
        }
        out
    }
}

/// A receive queue (a QP's or a shared one): receives complete in any order with an SRQ, so
/// this is a map.
#[derive(Debug, Default)]
pub struct RecvTracker {
    next_seq: u64,
    entries: FastMap<u64, (u64, WinList)>,
}

impl RecvTracker {
    /// An empty tracker.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a posted receive; returns its sequence number (its `wr_id`).
    pub fn record(&mut self, wr_id: u64, windows: WinList) -> u64 {
        self.next_seq += 1;
        self.entries.insert(self.next_seq, (wr_id, windows));
        self.next_seq
    }

    /// Forgets a record (the provider refused it); returns its windows.
    pub fn unrecord(&mut self, seq: u64) -> WinList {
        self.entries
            .remove(&seq)
            .map(|(_, w)| w)
            .unwrap_or_default()
    }

    /// Handles the completion of receive `seq`: the application's `wr_id` and the windows
    /// released; `None` if the sequence number is not ours.
    pub fn complete(&mut self, seq: u64) -> Option<(u64, WinList)> {
        self.entries.remove(&seq)
    }

    /// Receives posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// Forgets every entry (the queue is being destroyed); returns all their windows.
    pub fn drain(&mut self) -> WinList {
        let mut w = WinList::new();
        for (_, (_, ws)) in self.entries.drain() {
            w.extend(ws);
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR};

    fn w(i: u64) -> WindowId {
        WindowId {
            region: 1,
            index: i,
        }
    }

    fn app(wr_id: u64, group: u64, last: bool, wants: bool) -> Origin {
        Origin::App {
            wr_id,
            group,
            last,
            wants_completion: wants,
            app_opcode: 0,
        }
    }

    #[test]
    fn split_wr_gives_one_completion_with_the_app_wr_id() {
        let mut t = SendTracker::new();
        let g = t.next_group();
        let a = t.record(app(0xabc, g, false, true), vec![w(0)].into());
        let b = t.record(app(0xabc, g, true, true), vec![w(1)].into());
        assert!(a < b);
        // Only the last part was signaled; its completion retires both.
        let (rel, out) = t.complete(b, IBV_WC_SUCCESS);
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(0), w(1)]);
        assert_eq!(out, Outcome::Deliver { wr_id: 0xabc });
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn unsignaled_and_forced_signals_are_hidden() {
        let mut t = SendTracker::new();
        let g1 = t.next_group();
        let s1 = t.record(app(1, g1, true, false), WinList::new());
        let (_, out) = t.complete(s1, IBV_WC_SUCCESS);
        assert_eq!(out, Outcome::Suppress);
        let s2 = t.record(Origin::Internal { token: 9 }, WinList::new());
        assert_eq!(
            t.complete(s2, IBV_WC_SUCCESS).1,
            Outcome::Internal {
                token: 9,
                status: IBV_WC_SUCCESS
            }
        );
    }

    #[test]
    fn one_error_per_app_wr_even_unsignaled() {
        let mut t = SendTracker::new();
        let g1 = t.next_group();
        let p1 = t.record(app(10, g1, false, false), WinList::new());
        let p2 = t.record(app(10, g1, true, false), WinList::new());
        let g2 = t.next_group();
        let q1 = t.record(app(11, g2, true, true), WinList::new());
        assert_eq!(
            t.complete(p1, IBV_WC_LOC_PROT_ERR).1,
            Outcome::Deliver { wr_id: 10 }
        );
        assert_eq!(t.complete(p2, IBV_WC_WR_FLUSH_ERR).1, Outcome::Suppress);
        assert_eq!(
            t.complete(q1, IBV_WC_WR_FLUSH_ERR).1,
            Outcome::Deliver { wr_id: 11 }
        );
    }

    #[test]
    fn unknown_sequence_numbers_pass_through() {
        let mut t = SendTracker::new();
        assert_eq!(t.complete(42, IBV_WC_SUCCESS).1, Outcome::Unknown);
        let mut r = RecvTracker::new();
        assert_eq!(r.complete(42), None);
    }

    #[test]
    fn forced_signal_every_threshold() {
        let mut t = SendTracker::new();
        let pattern: Vec<bool> = (0..8).map(|_| t.must_signal(false, 4)).collect();
        assert_eq!(
            pattern,
            vec![false, false, false, true, false, false, false, true]
        );
        assert!(t.must_signal(true, 4));
    }

    #[test]
    fn unrecord_returns_windows_of_refused_posts() {
        let mut t = SendTracker::new();
        let g = t.next_group();
        let a = t.record(app(1, g, false, true), vec![w(0)].into());
        t.record(app(1, g, true, true), vec![w(1), w(2), w(4)].into());
        assert_eq!(
            t.unrecord_after(a).iter().collect::<Vec<_>>(),
            vec![w(1), w(2), w(4)]
        );
        assert_eq!(t.outstanding(), 1);
        let mut r = RecvTracker::new();
        let s = r.record(5, vec![w(3)].into());
        assert_eq!(r.unrecord(s).iter().collect::<Vec<_>>(), vec![w(3)]);
        assert_eq!(r.outstanding(), 0);
    }

    #[test]
    fn pending_groups_skip_reported_ones() {
        let mut t = SendTracker::new();
        let g1 = t.next_group();
        let a = t.record(app(1, g1, false, true), WinList::new());
        t.record(app(1, g1, true, true), WinList::new());
        let g2 = t.next_group();
        t.record(app(2, g2, true, false), WinList::new());
        assert_eq!(
            t.complete(a, IBV_WC_LOC_PROT_ERR).1,
            Outcome::Deliver { wr_id: 1 }
        );
        assert_eq!(t.pending_app_groups(), vec![(g2, 2, 0)]);
    }
}
