//! Which provider work request belongs to which application work request, and what the
//! application sees when a provider completion arrives.
//!
//! Every provider WR the library records carries a sequence number of its queue, mixed with
//! the queue's random 64-bit tag, as its `wr_id`. WRs the library does not record (warm WRs
//! that hold no local window, see `docs/connectx.md` §3) keep the application's own `wr_id`
//! and their completions pass through unchanged: a completion whose `wr_id` does not decode to
//! an outstanding record is not the library's. (An application `wr_id` that happens to equal
//! the tagged number of a record outstanding at that moment would be taken for it; with a
//! random tag the chance is about one in 2^64 per outstanding record.) The send queue
//! completes in posting order (InfiniBand Architecture Specification
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
use crate::sys::{
    IBV_WC_ATOMIC_WRITE, IBV_WC_BIND_MW, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD, IBV_WC_LOCAL_INV,
    IBV_WC_RDMA_READ, IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_SUCCESS, IBV_WC_TSO,
    IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_WRITE, IBV_WR_BIND_MW,
    IBV_WR_LOCAL_INV, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_TSO,
};
use crate::window::{RegionId, WindowId, WindowUse};

/// A short list of windows: up to two inline (the common case: one local window per WR), more
/// on the heap. Keeps the data path free of allocations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WinList {
    n: u8,
    inline: [WindowUse; 2],
    spill: Vec<WindowUse>,
}

impl WinList {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            n: 0,
            inline: [WindowUse {
                id: WindowId {
                    region: 0,
                    index: 0,
                },
                serial: 0,
            }; 2],
            spill: Vec::new(),
        }
    }

    /// Appends a window.
    #[inline]
    pub fn push(&mut self, w: WindowUse) {
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
    pub fn iter(&self) -> impl Iterator<Item = WindowUse> + '_ {
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

    /// Keeps only the windows for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(WindowUse) -> bool) {
        if self.iter().all(&mut keep) {
            return;
        }
        let kept: WinList = self.iter().filter(|w| keep(*w)).collect();
        *self = kept;
    }
}

impl From<Vec<WindowUse>> for WinList {
    fn from(v: Vec<WindowUse>) -> Self {
        let mut l = WinList::new();
        for w in v {
            l.push(w);
        }
        l
    }
}

impl FromIterator<WindowUse> for WinList {
    fn from_iter<I: IntoIterator<Item = WindowUse>>(it: I) -> Self {
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
        /// On the last part of a split RDMA READ: the bytes of the whole application WR,
        /// which its completion reports (the provider's `byte_len` counts the last part
        /// only). 0: the provider's value stands.
        byte_len: u32,
    },
    /// The library's own WR; `token` identifies the waiter ([`NO_WAITER`]: nobody waits).
    Internal {
        /// The waiter's token.
        token: u64,
    },
    /// Not a WR: windows whose QP-level hold ended ([`SendTracker::retire`]), released when a
    /// WR posted after it completes.
    Retired,
}

/// The token of an internal WR nobody waits for (its completion only releases windows).
pub const NO_WAITER: u64 = 0;

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
    /// Mixed into every sequence number to make the provider `wr_id` (0 in unit tests).
    tag: u64,
    next_seq: u64,
    next_group: u64,
    entries: VecDeque<SendEntry>,
    /// How many of `entries` are [`Origin::Retired`] markers (not posted WRs).
    markers: usize,
    last_reported_group: Option<u64>,
    /// The `byte_len` the last delivered success must show (0: the provider's).
    delivered_len: u32,
}

impl SendTracker {
    /// An empty tracker whose `wr_id`s are the plain sequence numbers.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty tracker that mixes `tag` into its `wr_id`s.
    pub fn with_tag(tag: u64) -> Self {
        Self {
            tag,
            ..Self::default()
        }
    }

    /// The provider `wr_id` of record `seq`.
    #[inline]
    pub fn wr_id_of(&self, seq: u64) -> u64 {
        seq ^ self.tag
    }

    /// A new application WR number (for [`Origin::App::group`]).
    #[inline]
    pub fn next_group(&mut self) -> u64 {
        self.next_group += 1;
        self.next_group
    }

    /// Records a provider WR about to be posted; returns its sequence number (post it with
    /// [`wr_id_of`](Self::wr_id_of) of it).
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

    /// Keeps `windows` (whose QP-level hold just ended: WRs posted before now may still use
    /// them) until a WR posted after this call completes, which the send queue's in-order
    /// completion makes the proof that every earlier WR is done. Nothing is posted for it.
    pub fn retire(&mut self, windows: WinList) {
        if windows.is_empty() {
            return;
        }
        self.next_seq += 1;
        self.entries.push_back(SendEntry {
            seq: self.next_seq,
            origin: Origin::Retired,
            windows,
        });
        self.markers += 1;
    }

    /// Whether retired windows wait for a later completion.
    pub fn has_retired(&self) -> bool {
        self.markers > 0
    }

    /// Whether the newest entry is one of the library's own WRs (always posted signaled): its
    /// completion releases every marker before it.
    pub fn newest_is_internal(&self) -> bool {
        self.entries
            .back()
            .is_some_and(|e| matches!(e.origin, Origin::Internal { .. }))
    }

    fn pop_front(&mut self) -> Option<SendEntry> {
        let e = self.entries.pop_front()?;
        if e.origin == Origin::Retired {
            self.markers -= 1;
        }
        Some(e)
    }

    /// Forgets the most recent records (the provider refused to post them); returns their
    /// windows. Their sequence numbers are used again (never posted, so no completion carries
    /// them), keeping the outstanding records' numbers contiguous.
    ///
    /// Retired-window markers among them are not work requests: they stay, moved behind the
    /// remaining records, because the WRs posted before them (unrecorded warm WRs among them)
    /// may still use their windows.
    pub fn unrecord_after(&mut self, seq: u64) -> WinList {
        let mut windows = WinList::new();
        let mut markers: Vec<WinList> = Vec::new();
        while self.entries.back().is_some_and(|e| e.seq > seq) {
            if let Some(e) = self.entries.pop_back() {
                if e.origin == Origin::Retired {
                    self.markers -= 1;
                    markers.push(e.windows);
                } else {
                    windows.extend(e.windows);
                }
            }
        }
        self.next_seq = self
            .next_seq
            .min(seq.max(self.entries.back().map_or(0, |e| e.seq)));
        for m in markers.into_iter().rev() {
            self.retire(m);
        }
        windows
    }

    /// Drops every window of `region` from the records (the region was deregistered or
    /// registered again: its windows' in-flight counts went with the old registration, and a
    /// later release must not touch a new registration of the same window).
    pub fn forget_region(&mut self, region: RegionId) {
        for e in &mut self.entries {
            e.windows.retain(|w| w.id.region != region);
        }
    }

    /// Sequence number of the last record (0 if none yet).
    pub fn last_seq(&self) -> u64 {
        self.next_seq
    }

    /// Provider WRs posted and not yet known complete (retired-window markers are not WRs).
    pub fn outstanding(&self) -> usize {
        self.entries.len() - self.markers
    }

    /// Handles a provider completion carrying `wr_id` with `status`; returns the windows
    /// released (its record's and every earlier one's) and what to do
    /// ([`Outcome::Unknown`] when `wr_id` is not an outstanding record's).
    #[inline]
    pub fn complete(&mut self, wr_id: u64, status: u32) -> (WinList, Outcome) {
        let seq = wr_id ^ self.tag;
        // Most completions are either the oldest record's or not the library's at all (an
        // unrecorded WR's): both are decided here without a search.
        let Some(front) = self.entries.front() else {
            return (WinList::new(), Outcome::Unknown);
        };
        if seq < front.seq || seq > self.next_seq {
            return (WinList::new(), Outcome::Unknown);
        }
        // The usual case: the oldest entry completes (every WR signaled, or the signaled one
        // at the end of an unsignaled run already retired the others).
        if front.seq == seq
            && let Some(e) = self.pop_front()
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
            Origin::Retired => Outcome::Suppress,
            Origin::App {
                wr_id,
                group,
                last,
                wants_completion,
                byte_len,
            } => {
                if status == IBV_WC_SUCCESS {
                    if last && wants_completion {
                        self.delivered_len = byte_len;
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
        while let Some(e) = self.pop_front() {
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

    /// Takes the windows of every entry (the QP is being destroyed, and the provider touches
    /// none of them afterwards); the entries stay, so that completions still in the CQ are
    /// still recognised.
    pub fn take_windows(&mut self) -> WinList {
        let mut w = WinList::new();
        for e in &mut self.entries {
            w.extend(std::mem::take(&mut e.windows));
        }
        w
    }

    /// The `byte_len` the success just delivered by [`complete`](Self::complete) must show
    /// (the whole split READ's), or 0 when the provider's value stands; reads it once.
    pub fn take_delivered_len(&mut self) -> u32 {
        core::mem::take(&mut self.delivered_len)
    }

    /// Whether an error of application WR `group` was already delivered (through one of its
    /// parts).
    pub fn reported(&self, group: u64) -> bool {
        self.last_reported_group == Some(group)
    }
}

/// The run of unsignaled WRs a QP's library has recorded since its last signaled one. Kept
/// with the posting side (not the tracker) so that posting can tell, without the tracker's
/// lock, whether a WR may go unrecorded: only when no recorded unsignaled WR waits for a later
/// recorded completion to release its windows.
#[derive(Debug, Default)]
pub struct SignalRun {
    unsignaled: u32,
}

impl SignalRun {
    /// Whether the next recorded WR must be signaled: the application (or the library) wants
    /// it, or `threshold` unsignaled WRs in a row are outstanding (their windows are released
    /// only by a later completion, so an endless unsignaled run would hold the budget).
    #[inline]
    pub fn must_signal(&mut self, wanted: bool, threshold: u32) -> bool {
        if wanted || self.unsignaled + 1 >= threshold.max(1) {
            self.unsignaled = 0;
            true
        } else {
            self.unsignaled += 1;
            false
        }
    }

    /// Whether every recorded WR so far was signaled (or followed by a signaled one).
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.unsignaled == 0
    }

    /// How many unsignaled WRs the run holds: zero exactly when [`is_idle`](Self::is_idle).
    #[inline]
    pub fn unsignaled(&self) -> u32 {
        self.unsignaled
    }
}

/// A receive queue (a QP's or a shared one): receives complete in any order with an SRQ, so
/// this is a map.
#[derive(Debug, Default)]
pub struct RecvTracker {
    /// Mixed into every sequence number to make the provider `wr_id` (0 in unit tests).
    tag: u64,
    next_seq: u64,
    entries: FastMap<u64, (u64, WinList)>,
}

impl RecvTracker {
    /// An empty tracker whose `wr_id`s are the plain sequence numbers.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty tracker that mixes `tag` into its `wr_id`s.
    pub fn with_tag(tag: u64) -> Self {
        Self {
            tag,
            ..Self::default()
        }
    }

    /// The provider `wr_id` of record `seq`.
    #[inline]
    pub fn wr_id_of(&self, seq: u64) -> u64 {
        seq ^ self.tag
    }

    /// Records a posted receive; returns its sequence number (post it with
    /// [`wr_id_of`](Self::wr_id_of) of it).
    pub fn record(&mut self, wr_id: u64, windows: WinList) -> u64 {
        self.next_seq += 1;
        self.entries.insert(self.next_seq, (wr_id, windows));
        self.next_seq
    }

    /// Whether a completion carrying `wr_id` is an outstanding receive's.
    pub fn contains(&self, wr_id: u64) -> bool {
        self.entries.contains_key(&(wr_id ^ self.tag))
    }

    /// Forgets a record (the provider refused it); returns its windows.
    pub fn unrecord(&mut self, seq: u64) -> WinList {
        self.entries
            .remove(&seq)
            .map(|(_, w)| w)
            .unwrap_or_default()
    }

    /// Handles a receive completion carrying `wr_id`: the application's `wr_id` and the windows
    /// released; `None` if it is not an outstanding record's.
    pub fn complete(&mut self, wr_id: u64) -> Option<(u64, WinList)> {
        self.entries.remove(&(wr_id ^ self.tag))
    }

    /// Receives posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// Drops every window of `region` from the records ([`SendTracker::forget_region`]).
    pub fn forget_region(&mut self, region: RegionId) {
        for (_, ws) in self.entries.values_mut() {
            ws.retain(|w| w.id.region != region);
        }
    }

    /// Takes the windows of every entry, keeping the entries
    /// ([`SendTracker::take_windows`]).
    pub fn take_windows(&mut self) -> WinList {
        let mut w = WinList::new();
        for (_, ws) in self.entries.values_mut() {
            w.extend(std::mem::take(ws));
        }
        w
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

/// Maps a send opcode to the completion opcode plain verbs reports.
pub(crate) fn wc_opcode_of(op: u32) -> u32 {
    match op {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        IBV_WR_LOCAL_INV => IBV_WC_LOCAL_INV,
        IBV_WR_BIND_MW => IBV_WC_BIND_MW,
        IBV_WR_TSO => IBV_WC_TSO,
        IBV_WR_ATOMIC_WRITE => IBV_WC_ATOMIC_WRITE,
        _ => IBV_WC_SEND,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{IBV_WC_LOC_PROT_ERR, IBV_WC_WR_FLUSH_ERR};

    fn w(i: u64) -> WindowUse {
        WindowUse {
            id: WindowId {
                region: 1,
                index: i,
            },
            serial: 1,
        }
    }

    fn app(wr_id: u64, group: u64, last: bool, wants: bool) -> Origin {
        Origin::App {
            wr_id,
            group,
            last,
            wants_completion: wants,
            byte_len: 0,
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
        let mut t = SignalRun::default();
        assert!(t.is_idle());
        let pattern: Vec<bool> = (0..8).map(|_| t.must_signal(false, 4)).collect();
        assert_eq!(
            pattern,
            vec![false, false, false, true, false, false, false, true]
        );
        assert!(t.is_idle());
        assert!(!t.must_signal(false, 4));
        assert!(!t.is_idle());
        assert!(t.must_signal(true, 4));
        assert!(t.is_idle());
    }

    #[test]
    fn tagged_wr_ids_are_recognised_and_foreign_ones_pass_through() {
        let tag = 0x9e37_79b9_7f4a_7c15;
        let mut t = SendTracker::with_tag(tag);
        let g = t.next_group();
        let a = t.record(app(7, g, true, true), vec![w(0)].into());
        let id = t.wr_id_of(a);
        assert_ne!(id, a);
        // The application's own wr_ids (unrecorded WRs), small or large, are not ours.
        for foreign in [0, 1, a, 7, u64::MAX, 1 << 63] {
            assert_eq!(t.complete(foreign, IBV_WC_SUCCESS).1, Outcome::Unknown);
        }
        assert_eq!(t.outstanding(), 1, "a foreign completion retires nothing");
        let (rel, out) = t.complete(id, IBV_WC_SUCCESS);
        assert_eq!(out, Outcome::Deliver { wr_id: 7 });
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(0)]);
        let mut r = RecvTracker::with_tag(!tag);
        let s = r.record(70, vec![w(1)].into());
        assert_eq!(r.complete(s), None);
        assert_eq!(r.complete(t.wr_id_of(s)), None);
        assert_eq!(r.complete(r.wr_id_of(s)).map(|(id, _)| id), Some(70));
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
    fn refused_posts_leave_contiguous_numbers_for_a_later_run() {
        // A refused post between an unsignaled run and its signaled end: the signaled WR's
        // completion must still find its record (and retire the run before it).
        let mut t = SendTracker::new();
        let g = t.next_group();
        let a = t.record(app(1, g, true, false), vec![w(0)].into());
        let g = t.next_group();
        let refused = t.record(app(2, g, true, true), vec![w(1)].into());
        assert_eq!(
            t.unrecord_after(refused - 1).iter().collect::<Vec<_>>(),
            vec![w(1)]
        );
        let g = t.next_group();
        let b = t.record(app(3, g, true, true), vec![w(2)].into());
        assert_eq!(b, refused, "the refused number is used again");
        let (rel, out) = t.complete(b, IBV_WC_SUCCESS);
        assert_eq!(out, Outcome::Deliver { wr_id: 3 });
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(0), w(2)]);
        assert!(a < b);
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn retired_windows_wait_for_a_later_completion_and_are_not_work_requests() {
        let mut t = SendTracker::new();
        let g = t.next_group();
        let before = t.record(app(1, g, true, true), vec![w(0)].into());
        t.retire(vec![w(7)].into());
        t.retire(WinList::new());
        assert!(t.has_retired());
        assert!(!t.newest_is_internal(), "a barrier is needed");
        assert_eq!(t.outstanding(), 1, "a marker is not a posted WR");
        // The WR posted before the marker completing does not release it.
        let (rel, out) = t.complete(before, IBV_WC_SUCCESS);
        assert_eq!(out, Outcome::Deliver { wr_id: 1 });
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(0)]);
        assert_eq!(t.outstanding(), 0);
        assert!(t.has_retired());
        // A refused post after the marker leaves it in place.
        let g = t.next_group();
        let refused = t.record(app(2, g, true, true), vec![w(1)].into());
        assert_eq!(
            t.unrecord_after(refused - 1).iter().collect::<Vec<_>>(),
            vec![w(1)]
        );
        assert!(t.has_retired());
        // The next WR's completion proves the marker's windows idle.
        let after = t.record(Origin::Internal { token: NO_WAITER }, WinList::new());
        assert!(t.newest_is_internal(), "no further barrier is needed");
        let (rel, out) = t.complete(after, IBV_WC_WR_FLUSH_ERR);
        assert_eq!(
            out,
            Outcome::Internal {
                token: NO_WAITER,
                status: IBV_WC_WR_FLUSH_ERR
            }
        );
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(7)]);
        assert!(!t.has_retired());
        t.retire(vec![w(8)].into());
        let last = t.record(Origin::Internal { token: NO_WAITER }, vec![w(9)].into());
        assert_eq!(
            t.take_windows().iter().collect::<Vec<_>>(),
            vec![w(8), w(9)]
        );
        // A completion arriving after the QP's destruction is still the library's.
        let (rel, out) = t.complete(last, IBV_WC_WR_FLUSH_ERR);
        assert!(rel.is_empty());
        assert_eq!(
            out,
            Outcome::Internal {
                token: NO_WAITER,
                status: IBV_WC_WR_FLUSH_ERR
            }
        );
        assert!(!t.has_retired());
    }

    #[test]
    fn a_refused_batch_keeps_the_markers_retired_inside_it() {
        // Batch [R, B]: posting B moved the QP's hold, retiring w(7) between them; the
        // provider refuses R. Unrecorded WRs posted before the marker may still use w(7).
        let mut t = SendTracker::new();
        let g = t.next_group();
        let before = t.record(app(1, g, true, true), vec![w(0)].into());
        let g = t.next_group();
        let r = t.record(app(2, g, true, true), vec![w(1)].into());
        t.retire(vec![w(7)].into());
        let g = t.next_group();
        t.record(app(3, g, true, true), vec![w(2)].into());
        let mut back: Vec<_> = t.unrecord_after(r - 1).iter().collect();
        back.sort();
        assert_eq!(
            back,
            vec![w(1), w(2)],
            "only the refused WRs' windows come back"
        );
        assert!(t.has_retired());
        assert_eq!(t.outstanding(), 1);
        // The marker now follows `before`: its completion does not release w(7) ...
        let (rel, _) = t.complete(before, IBV_WC_SUCCESS);
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(0)]);
        assert!(t.has_retired());
        // ... and the numbers stay contiguous: the next record completes and releases it.
        let g = t.next_group();
        let next = t.record(app(4, g, true, true), vec![w(3)].into());
        assert_eq!(next, r + 1, "the marker took the refused WR's number");
        let (rel, out) = t.complete(next, IBV_WC_SUCCESS);
        assert_eq!(out, Outcome::Deliver { wr_id: 4 });
        assert_eq!(rel.iter().collect::<Vec<_>>(), vec![w(7), w(3)]);
        assert!(!t.has_retired());
    }

    #[test]
    fn a_forgotten_region_releases_nothing_later() {
        let mut t = SendTracker::new();
        let other = WindowUse {
            id: WindowId {
                region: 2,
                index: 0,
            },
            serial: 1,
        };
        let g = t.next_group();
        let a = t.record(app(1, g, true, true), vec![w(0), other].into());
        t.retire(vec![w(7)].into());
        t.forget_region(1);
        let g = t.next_group();
        let b = t.record(app(2, g, true, true), WinList::new());
        assert_eq!(
            t.complete(a, IBV_WC_SUCCESS).0.iter().collect::<Vec<_>>(),
            vec![other]
        );
        assert!(t.complete(b, IBV_WC_SUCCESS).0.is_empty());
        assert_eq!(t.outstanding(), 0);
        let mut r = RecvTracker::new();
        let s = r.record(5, vec![w(3), other].into());
        r.forget_region(1);
        assert_eq!(
            r.complete(r.wr_id_of(s))
                .map(|(_, w)| w.iter().collect::<Vec<_>>()),
            Some(vec![other])
        );
    }

    /// One step of the property test below.
    #[derive(Clone, Debug)]
    enum Step {
        /// An application WR in `parts` provider WRs, each with a window or none; the
        /// application wants a completion or not; the provider is asked to signal the
        /// non-last parts or not (the last part is signaled when the application wants it);
        /// `refused`: the provider refuses the whole WR (it is unrecorded again).
        App {
            parts: Vec<bool>,
            wants: bool,
            signal_all: bool,
            refused: bool,
        },
        /// One of the library's own WRs (always signaled).
        Internal,
        /// Windows whose hold ended.
        Retire(u8),
        /// The next WR the provider executes fails.
        FailNext,
        /// The provider reports its next completion.
        Deliver,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (proptest::collection::vec(any::<bool>(), 1..4), any::<bool>(), any::<bool>(),
                  proptest::bool::weighted(0.1))
                .prop_map(|(parts, wants, signal_all, refused)| Step::App {
                    parts, wants, signal_all, refused
                }),
            1 => Just(Step::Internal),
            1 => (1u8..3).prop_map(Step::Retire),
            1 => Just(Step::FailNext),
            5 => Just(Step::Deliver),
        ]
    }

    /// What the provider knows of a posted WR.
    #[derive(Clone, Copy, Debug)]
    struct Posted {
        seq: u64,
        signaled: bool,
        /// The application WR it is a part of (`None`: the library's own).
        group: Option<u64>,
    }

    use proptest::{prop_assert, prop_assert_eq};

    proptest::proptest! {
        /// Against a model of an RC send queue (in-order execution, completions for signaled
        /// WRs, an error completion for a failed WR whether signaled or not, then a flush
        /// error for every later WR): the application sees exactly one completion per
        /// application WR that it asked for or that failed, in posting order, with its own
        /// `wr_id` and the status of its first failed part; every window is released exactly
        /// once, never before every WR posted up to its record (and, for a retired window, a
        /// later one) has completed.
        #[test]
        fn completions_and_windows_follow_the_send_queue(
            steps in proptest::collection::vec(step(), 1..120),
            tag in proptest::prelude::any::<u64>(),
        ) {
            use std::collections::{BTreeMap, HashSet, VecDeque};
            let mut t = SendTracker::with_tag(tag);
            let mut next_window = 0u64;
            let mut new_windows = |n: usize| -> Vec<WindowUse> {
                (0..n).map(|_| { next_window += 1; w(next_window) }).collect()
            };
            // The provider's queue: posted, not yet executed.
            let mut queue: VecDeque<Posted> = VecDeque::new();
            let mut fail_next = false;
            let mut in_error = false;
            // Completions generated, not yet polled: (seq, status).
            let mut cq: VecDeque<(u64, u32)> = VecDeque::new();
            // Windows: which record holds them, and whether the record is a marker.
            let mut holder: BTreeMap<WindowUse, (u64, bool)> = BTreeMap::new();
            let mut released: HashSet<WindowUse> = HashSet::new();
            // Application WRs: expected (wr_id, status) and what was delivered, by group.
            let mut expected: BTreeMap<u64, (u64, Option<u32>, bool)> = BTreeMap::new();
            let mut delivered: Vec<(u64, u64, u32)> = Vec::new();
            let mut app_wr_id = 0x1000u64;

            let run = |queue: &mut VecDeque<Posted>, cq: &mut VecDeque<(u64, u32)>,
                       fail_next: &mut bool, in_error: &mut bool,
                       expected: &mut BTreeMap<u64, (u64, Option<u32>, bool)>| {
                // The provider executes its whole queue (RC: in order).
                while let Some(p) = queue.pop_front() {
                    let status = if *in_error {
                        Some(IBV_WC_WR_FLUSH_ERR)
                    } else if *fail_next {
                        *fail_next = false;
                        *in_error = true;
                        Some(IBV_WC_LOC_PROT_ERR)
                    } else {
                        None
                    };
                    if let (Some(g), Some(s)) = (p.group, status) {
                        let e = expected.get_mut(&g).unwrap();
                        e.1.get_or_insert(s);
                    }
                    match status {
                        Some(s) => cq.push_back((p.seq, s)),
                        None if p.signaled => cq.push_back((p.seq, IBV_WC_SUCCESS)),
                        None => {}
                    }
                }
            };

            for s in steps {
                match s {
                    Step::App { parts, wants, signal_all, refused } => {
                        app_wr_id += 1;
                        let g = t.next_group();
                        let before = t.last_seq();
                        let n = parts.len();
                        let mut posted = Vec::new();
                        let mut mine = Vec::new();
                        for (i, with_window) in parts.iter().enumerate() {
                            let last = i + 1 == n;
                            let ws = new_windows(usize::from(*with_window));
                            let seq = t.record(app(app_wr_id, g, last, wants), ws.clone().into());
                            for x in ws {
                                holder.insert(x, (seq, false));
                                mine.push(x);
                            }
                            posted.push(Posted {
                                seq,
                                signaled: if last { wants } else { signal_all },
                                group: Some(g),
                            });
                        }
                        if refused {
                            let back: HashSet<WindowUse> = t.unrecord_after(before).iter().collect();
                            prop_assert_eq!(back, mine.iter().copied().collect::<HashSet<_>>());
                            for x in mine {
                                holder.remove(&x);
                            }
                            prop_assert_eq!(t.last_seq(), before);
                        } else {
                            expected.insert(g, (app_wr_id, None, wants));
                            queue.extend(posted);
                        }
                    }
                    Step::Internal => {
                        let ws = new_windows(1);
                        let seq = t.record(Origin::Internal { token: 7 }, ws.clone().into());
                        holder.insert(ws[0], (seq, false));
                        queue.push_back(Posted { seq, signaled: true, group: None });
                    }
                    Step::Retire(k) => {
                        let ws = new_windows(usize::from(k));
                        t.retire(ws.clone().into());
                        let seq = t.last_seq();
                        for x in ws {
                            holder.insert(x, (seq, true));
                        }
                    }
                    Step::FailNext => fail_next = true,
                    Step::Deliver => {
                        run(&mut queue, &mut cq, &mut fail_next, &mut in_error, &mut expected);
                        let Some((seq, status)) = cq.pop_front() else { continue };
                        let (windows, outcome) = t.complete(t.wr_id_of(seq), status);
                        for x in windows.iter() {
                            prop_assert!(released.insert(x), "{:?} released twice", x);
                            let (at, marker) = holder[&x];
                            if marker {
                                prop_assert!(at < seq, "retired {:?} released by an earlier WR", x);
                            } else {
                                prop_assert!(at <= seq, "{:?} released before its WR", x);
                            }
                        }
                        match outcome {
                            Outcome::Deliver { wr_id } => {
                                let g = expected.iter()
                                    .find(|(_, e)| e.0 == wr_id)
                                    .map(|(g, _)| *g);
                                prop_assert!(g.is_some(), "unknown wr_id {:#x}", wr_id);
                                delivered.push((g.unwrap(), wr_id, status));
                            }
                            Outcome::Internal { token, .. } => prop_assert_eq!(token, 7),
                            Outcome::Suppress => {}
                            Outcome::Unknown => prop_assert!(false, "seq {} unknown", seq),
                        }
                    }
                }
            }
            // Drain.
            run(&mut queue, &mut cq, &mut fail_next, &mut in_error, &mut expected);
            while let Some((seq, status)) = cq.pop_front() {
                let (windows, outcome) = t.complete(t.wr_id_of(seq), status);
                for x in windows.iter() {
                    prop_assert!(released.insert(x), "{:?} released twice", x);
                }
                if let Outcome::Deliver { wr_id } = outcome {
                    let g = expected.iter().find(|(_, e)| e.0 == wr_id).map(|(g, _)| *g).unwrap();
                    delivered.push((g, wr_id, status));
                }
            }
            for x in t.take_windows().iter() {
                prop_assert!(released.insert(x), "{:?} released twice", x);
            }
            let all: HashSet<WindowUse> = holder.keys().copied().collect();
            prop_assert_eq!(released, all, "every window comes back once");
            let want: Vec<(u64, u64, u32)> = expected.iter()
                .filter_map(|(g, (wr_id, err, wants))| match err {
                    Some(s) => Some((*g, *wr_id, *s)),
                    None if *wants => Some((*g, *wr_id, IBV_WC_SUCCESS)),
                    None => None,
                })
                .collect();
            prop_assert_eq!(delivered, want);
        }
    }
}
