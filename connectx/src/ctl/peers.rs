//! What this process knows of its peers' libraries: per application connection (per pair),
//! whether a control connection is up, still being made, or impossible (docs/connectx.md §13).
//!
//! The quick half of meeting a peer runs where the application's QP reaches RTR
//! ([`Peers::start`]: the pair, the role and the listener's bind); the half that waits for the
//! peer runs on a thread of its own ([`Peers::finish`], bounded by a deadline), so the
//! application's `ibv_modify_qp` never waits for the peer. The outcome is kept per pair until
//! the connection ends ([`Peers::forget`]).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::conversation::Conversation;
use super::link::{Meet, Starting};
use super::pair::{Endpoint, Pair, PairError};
use super::rendezvous::CtlError;

/// Why a connection has no control connection: its peer's keys are used as plain MRs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoPeer {
    /// The QP reached RTR without a GRH (InfiniBand addressing by LID): no GID names the peer.
    #[error("the connection has no GRH (InfiniBand LID addressing): no control connection")]
    NoGrh,
    /// The local GID could not be read.
    #[error("ibv_query_gid failed for the connection's GID index: no control connection")]
    NoLocalGid,
    /// The pair cannot have a control connection (no IP address in a GID, a QP connected to
    /// itself).
    #[error("{0}: no control connection")]
    Pair(#[from] PairError),
    /// Meeting the peer failed (no librdmacm, no listener: a peer without the library).
    #[error("meeting the peer's library failed ({0}): its keys pass through unchanged")]
    Meet(CtlError),
}

/// A pair's state.
#[derive(Clone)]
pub enum Outcome {
    /// Being met in the background.
    Pending,
    /// The control connection is up.
    Up(Arc<Conversation>),
    /// No control connection, and why.
    NoPeer(NoPeer),
}

impl core::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Outcome::Pending => f.write_str("Pending"),
            Outcome::Up(_) => f.write_str("Up"),
            Outcome::NoPeer(r) => write!(f, "NoPeer({r})"),
        }
    }
}

/// A pair's entry: its outcome and the caller's tag for the local end (the library keeps
/// its application QP's address there).
struct Entry {
    tag: usize,
    outcome: Outcome,
}

#[derive(Default)]
struct Table {
    by_pair: HashMap<Pair, Entry>,
}

/// The pairs of this process and their control connections.
pub struct Peers {
    meet: Arc<dyn Meet>,
    table: Mutex<Table>,
    changed: Condvar,
}

impl Peers {
    /// No pairs yet; links are made by `meet`.
    pub fn new(meet: Arc<dyn Meet>) -> Self {
        Self {
            meet,
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        match self.table.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The quick half of meeting the peer of `local`–`remote`: the pair, and the listener's
    /// bind when this side listens. `Ok(Some(..))` is the waiting half to run with
    /// [`finish`](Self::finish); `Ok(None)` if the pair is already up or being met. An error
    /// is recorded as the pair's outcome when the pair could be computed.
    pub fn start(
        &self,
        local: Endpoint,
        remote: Endpoint,
        tag: usize,
    ) -> Result<(Pair, Option<Starting>), NoPeer> {
        let (pair, _) = Pair::new(local, remote)?;
        {
            let mut t = self.lock();
            if let Some(e) = t.by_pair.get_mut(&pair)
                && matches!(e.outcome, Outcome::Pending | Outcome::Up(_))
            {
                e.tag = tag;
                return Ok((pair, None));
            }
            t.by_pair.insert(
                pair,
                Entry {
                    tag,
                    outcome: Outcome::Pending,
                },
            );
        }
        match Starting::new(&*self.meet, local, remote) {
            Ok(s) => Ok((pair, Some(s))),
            Err(e) => {
                let why = NoPeer::Meet(e);
                self.settle(pair, Outcome::NoPeer(why.clone()), |_| {});
                Err(why)
            }
        }
    }

    /// Bytes one link pins ([`Meet::pinned_per_link`]).
    pub fn pinned_per_link(&self) -> u64 {
        self.meet.pinned_per_link()
    }

    /// The waiting half: meets the peer until `deadline` and records the outcome (unless the
    /// pair was forgotten meanwhile: then the new link is closed at once). When the outcome is
    /// "no peer" and was recorded, `no_peer` is told why, before anyone can see it. Blocks:
    /// run it on a thread of its own.
    pub fn finish(
        &self,
        pair: Pair,
        starting: Starting,
        deadline: Instant,
        no_peer: impl FnOnce(&NoPeer),
    ) -> Outcome {
        let outcome = match starting.finish(&*self.meet, deadline) {
            Ok(link) => Outcome::Up(Arc::new(Conversation::new(link))),
            Err(e) => Outcome::NoPeer(NoPeer::Meet(e)),
        };
        self.settle(pair, outcome.clone(), no_peer);
        outcome
    }

    fn settle(&self, pair: Pair, outcome: Outcome, no_peer: impl FnOnce(&NoPeer)) {
        let mut t = self.lock();
        if let Some(e) = t.by_pair.get_mut(&pair)
            && matches!(e.outcome, Outcome::Pending)
        {
            if let Outcome::NoPeer(why) = &outcome {
                no_peer(why);
            }
            e.outcome = outcome;
        }
        self.changed.notify_all();
    }

    /// The pair's outcome now.
    pub fn outcome(&self, pair: &Pair) -> Option<Outcome> {
        self.lock().by_pair.get(pair).map(|e| e.outcome.clone())
    }

    /// The pair's outcome, waiting while it is pending (until `deadline`: then `Pending`).
    pub fn wait(&self, pair: &Pair, deadline: Instant) -> Option<Outcome> {
        let mut t = self.lock();
        loop {
            match t.by_pair.get(pair).map(|e| &e.outcome) {
                Some(Outcome::Pending) => {}
                other => return other.cloned(),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Some(Outcome::Pending);
            }
            t = match self.changed.wait_timeout(t, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }

    /// Ends the pair's control connection (its application connection ended); a meeting
    /// still in progress is closed when it finishes. Returns whether the pair was up or being
    /// met (what its link pins is then free).
    pub fn forget(&self, pair: &Pair) -> bool {
        let gone = self.lock().by_pair.remove(pair);
        let live = matches!(
            gone.as_ref().map(|e| &e.outcome),
            Some(Outcome::Pending | Outcome::Up(_))
        );
        // The conversation (and its link) is dropped here, outside the lock, if no requester
        // still holds it.
        drop(gone);
        live
    }

    /// In a child made by `fork()`: the table's connections are the parent's (the rdma_cm
    /// objects and QPs behind them live in the parent), so the child forgets them without
    /// closing anything (closing would disconnect the parent's connections).
    pub fn abandon_after_fork(&self) {
        let old = core::mem::take(&mut self.lock().by_pair);
        core::mem::forget(old);
    }

    /// Every pair whose control connection is up, with its tag.
    pub fn up(&self) -> Vec<(Pair, usize, Arc<Conversation>)> {
        self.lock()
            .by_pair
            .iter()
            .filter_map(|(p, e)| match &e.outcome {
                Outcome::Up(c) => Some((*p, e.tag, c.clone())),
                _ => None,
            })
            .collect()
    }

    /// Whether any pair's control connection is up.
    pub fn any_up(&self) -> bool {
        self.lock()
            .by_pair
            .values()
            .any(|e| matches!(e.outcome, Outcome::Up(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::local::LocalMeet;
    use super::super::msg::Msg;
    use super::*;
    use std::time::Duration;

    fn ep(last: u8, qpn: u32) -> Endpoint {
        Endpoint::ipv4(std::net::Ipv4Addr::from([198, 51, 100, last]), qpn)
    }

    #[test]
    fn two_processes_meet_in_the_background_and_talk() {
        let (a, b) = (ep(1, 0x51), ep(2, 0x52));
        let pa = Arc::new(Peers::new(Arc::new(LocalMeet)));
        let pb = Arc::new(Peers::new(Arc::new(LocalMeet)));
        let (pair, sa) = pa.start(a, b, 1).unwrap();
        let (pair_b, sb) = pb.start(b, a, 2).unwrap();
        assert_eq!(pair, pair_b);
        assert!(matches!(pa.outcome(&pair), Some(Outcome::Pending)));
        // A second RTR of the same connection starts nothing more.
        assert!(pa.start(a, b, 1).unwrap().1.is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        let ta = {
            let pa = pa.clone();
            let s = sa.unwrap();
            std::thread::spawn(move || pa.finish(pair, s, deadline, |_| {}))
        };
        let tb = {
            let pb = pb.clone();
            let s = sb.unwrap();
            std::thread::spawn(move || pb.finish(pair, s, deadline, |_| {}))
        };
        let Some(Outcome::Up(ca)) = pa.wait(&pair, deadline) else {
            panic!("a: {:?}", pa.outcome(&pair))
        };
        let Some(Outcome::Up(cb)) = pb.wait(&pair, deadline) else {
            panic!("b: {:?}", pb.outcome(&pair))
        };
        ta.join().unwrap();
        tb.join().unwrap();
        assert_eq!(pa.up().len(), 1);
        let server = std::thread::spawn(move || {
            loop {
                if let Some(Msg::Lookup { seq, rkey }) = cb.next_request().unwrap() {
                    cb.reply(&Msg::Unknown { seq, rkey }, deadline).unwrap();
                    return;
                }
            }
        });
        let got = ca.ask(|seq| Msg::Lookup { seq, rkey: 42 }, deadline);
        assert!(matches!(got, Ok(Msg::Unknown { rkey: 42, .. })));
        server.join().unwrap();
        pa.forget(&pair);
        assert!(pa.outcome(&pair).is_none());
        drop(ca);
        // The link is closed once the last holder lets go: the peer sees it.
        let Some(Outcome::Up(cb)) = pb.outcome(&pair) else {
            panic!()
        };
        assert!(matches!(cb.next_request(), Err(CtlError::Closed)));
    }

    #[test]
    fn a_peer_without_the_library_is_no_peer_at_the_deadline() {
        let (a, b) = (ep(3, 0x53), ep(4, 0x54));
        let p = Peers::new(Arc::new(LocalMeet));
        let (pair, s) = p.start(b, a, 3).unwrap();
        let mut told = None;
        let o = p.finish(
            pair,
            s.unwrap(),
            Instant::now() + Duration::from_millis(30),
            |r| told = Some(r.clone()),
        );
        assert!(matches!(told, Some(NoPeer::Meet(_))));
        assert!(matches!(o, Outcome::NoPeer(NoPeer::Meet(_))), "{o:?}");
        assert!(matches!(
            p.outcome(&pair),
            Some(Outcome::NoPeer(NoPeer::Meet(_)))
        ));
        // A link-local (RoCE v1 / InfiniBand) GID has no IP address.
        let mut v1 = ep(5, 0x55);
        v1.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        assert!(matches!(
            p.start(v1, a, 4),
            Err(NoPeer::Pair(PairError::NoIpAddress(_)))
        ));
    }
}
