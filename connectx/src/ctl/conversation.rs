//! Requests and answers both ways over one [`Link`] (docs/connectx.md §13): this side's
//! requester asks (`ask`) while its server answers the peer's requests (`next_request`,
//! `reply`), on two threads, over one connection.
//!
//! One reader at a time: whoever holds the conversation's lock reads the next message and files
//! it where it belongs: a peer's request in the request queue (for the server), an answer to
//! an outstanding `ask` in the answer queue (for that asker). So neither side waits for the
//! other to read, and a requester waiting for its answer never keeps the peer's requests from
//! being served. Nothing the peer sends can reach further than this conversation: garbage is
//! counted and dropped, an answer to nothing outstanding (a stale or forged one) is dropped,
//! requests beyond [`MAX_QUEUED`] are dropped (the peer's own requests then time out), and a
//! peer that never answers makes only this side's `ask` on this link time out.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::link::Link;
use super::msg::{Msg, MsgError};
use super::rendezvous::CtlError;

/// Peer requests kept waiting for the server at most (a well-behaved peer has one
/// outstanding per application QP sending on the connection, usually one).
pub const MAX_QUEUED: usize = 64;

/// What a conversation did, and what it has seen of its peer's misbehaviour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests this side sent.
    pub asked: u64,
    /// Answers this side sent.
    pub answered: u64,
    /// Messages that did not decode.
    pub malformed: u64,
    /// The last decode error.
    pub last_error: Option<MsgError>,
    /// Answers to nothing this side asked (stale after a timeout, or forged).
    pub unasked: u64,
    /// Requests dropped because [`MAX_QUEUED`] were waiting.
    pub overflow: u64,
}

struct Inner {
    link: Box<dyn Link>,
    next_seq: u32,
    outstanding: Vec<Msg>,
    requests: VecDeque<Msg>,
    answers: Vec<Msg>,
    counts: Counts,
    /// Set once the link failed: every later call gets it.
    gone: Option<CtlError>,
}

impl Inner {
    /// Reads at most one message from the link and files it; `false` if none was there.
    fn pump(&mut self) -> Result<bool, CtlError> {
        if let Some(e) = &self.gone {
            return Err(e.clone());
        }
        let bytes = match self.link.try_recv() {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(false),
            Err(e) => {
                self.gone = Some(e.clone());
                return Err(e);
            }
        };
        match Msg::decode(&bytes) {
            Err(e) => {
                self.counts.malformed += 1;
                self.counts.last_error = Some(e);
            }
            Ok(m) if m.is_request() => {
                if self.requests.len() < MAX_QUEUED {
                    self.requests.push_back(m);
                } else {
                    self.counts.overflow += 1;
                }
            }
            Ok(m) => {
                if self.outstanding.iter().any(|r| m.answers(r))
                    && !self.answers.iter().any(|a| a.seq() == m.seq())
                {
                    self.answers.push(m);
                } else {
                    self.counts.unasked += 1;
                }
            }
        }
        Ok(true)
    }
}

/// One control connection's conversation.
pub struct Conversation {
    inner: Mutex<Inner>,
}

fn pause(spins: &mut u32) {
    *spins += 1;
    if *spins > 64 {
        std::thread::sleep(Duration::from_micros(50));
    } else {
        std::thread::yield_now();
    }
}

impl Conversation {
    /// A conversation over `link`.
    pub fn new(link: Box<dyn Link>) -> Self {
        Self {
            inner: Mutex::new(Inner {
                link,
                next_seq: 1,
                outstanding: Vec::new(),
                requests: VecDeque::new(),
                answers: Vec::new(),
                counts: Counts::default(),
                gone: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Sends the request `make(seq)` builds and waits until `deadline` for its answer.
    pub fn ask(&self, make: impl FnOnce(u32) -> Msg, deadline: Instant) -> Result<Msg, CtlError> {
        let req = {
            let mut g = self.lock();
            if let Some(e) = &g.gone {
                return Err(e.clone());
            }
            let seq = g.next_seq;
            g.next_seq = seq.wrapping_add(1).max(1);
            let req = make(seq);
            if let Err(e) = g.link.send(&req.encode(), deadline) {
                if !matches!(e, CtlError::Timeout(_)) {
                    g.gone = Some(e.clone());
                }
                return Err(e);
            }
            g.outstanding.push(req);
            g.counts.asked += 1;
            req
        };
        let mut spins = 0;
        loop {
            let mut g = self.lock();
            if let Some(at) = g.answers.iter().position(|a| a.answers(&req)) {
                let a = g.answers.swap_remove(at);
                g.outstanding.retain(|r| r.seq() != req.seq());
                return Ok(a);
            }
            let done = match g.pump() {
                Ok(true) => continue,
                Ok(false) if Instant::now() < deadline => false,
                Ok(false) => true,
                Err(_) => true,
            };
            if done {
                g.outstanding.retain(|r| r.seq() != req.seq());
                if let Some(e) = &g.gone {
                    return Err(e.clone());
                }
                return Err(CtlError::Timeout("the peer's answer"));
            }
            drop(g);
            pause(&mut spins);
        }
    }

    /// The peer's next request, if one has arrived (never waits).
    pub fn next_request(&self) -> Result<Option<Msg>, CtlError> {
        let mut g = self.lock();
        loop {
            if let Some(m) = g.requests.pop_front() {
                return Ok(Some(m));
            }
            if !g.pump()? {
                return Ok(None);
            }
        }
    }

    /// Sends an answer to the peer.
    pub fn reply(&self, answer: &Msg, deadline: Instant) -> Result<(), CtlError> {
        let mut g = self.lock();
        if let Some(e) = &g.gone {
            return Err(e.clone());
        }
        let r = g.link.send(&answer.encode(), deadline);
        if r.is_ok() {
            g.counts.answered += 1;
        }
        if let Err(e) = &r
            && !matches!(e, CtlError::Timeout(_))
        {
            g.gone = Some(e.clone());
        }
        r
    }

    /// What the peer did wrong so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    /// Whether the link has failed (the peer went away).
    pub fn is_gone(&self) -> bool {
        self.lock().gone.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::super::local::link_pair;
    use super::super::msg::{GRANT_KEYS, MSG_LEN};
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn secs(n: u64) -> Instant {
        Instant::now() + Duration::from_secs(n)
    }

    /// Answers every LOOKUP with Plain, every LEASE with a grant whose keys say who served it.
    fn serve(c: &Conversation, tag: u32, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            match c.next_request() {
                Ok(Some(Msg::Lookup { seq, rkey })) => {
                    c.reply(&Msg::Plain { seq, rkey }, secs(5)).unwrap()
                }
                Ok(Some(Msg::Lease {
                    seq,
                    rkey,
                    epoch,
                    first,
                    ..
                })) => c
                    .reply(
                        &Msg::Grant {
                            seq,
                            rkey,
                            epoch,
                            first,
                            count: 1,
                            keys: [tag ^ first, 0, 0, 0, 0, 0, 0, 0],
                        },
                        secs(5),
                    )
                    .unwrap(),
                Ok(Some(_)) => {}
                Ok(None) => std::thread::yield_now(),
                Err(_) => return,
            }
        }
    }

    #[test]
    fn both_sides_ask_and_serve_at_once_over_one_link() {
        let (a, b) = link_pair();
        let sides = [
            Arc::new(Conversation::new(Box::new(a))),
            Arc::new(Conversation::new(Box::new(b))),
        ];
        let stop = Arc::new(AtomicBool::new(false));
        let mut servers = Vec::new();
        for (i, c) in sides.iter().enumerate() {
            let (c, stop) = (c.clone(), stop.clone());
            servers.push(std::thread::spawn(move || {
                serve(&c, 0x1000 * (i as u32 + 1), &stop)
            }));
        }
        let mut askers = Vec::new();
        for (i, c) in sides.iter().enumerate() {
            let c = c.clone();
            askers.push(std::thread::spawn(move || {
                // Side i is answered by the other side's server.
                let tag = 0x1000 * (2 - i as u32);
                for first in 0..200u32 {
                    let a = c
                        .ask(
                            |seq| Msg::Lease {
                                seq,
                                rkey: 7,
                                epoch: 1,
                                first,
                                count: 1,
                                write: false,
                            },
                            secs(10),
                        )
                        .unwrap();
                    let Msg::Grant { keys, .. } = a else {
                        panic!("{a:?}")
                    };
                    assert_eq!(keys[0], tag ^ first);
                    let l = c.ask(|seq| Msg::Lookup { seq, rkey: first }, secs(10));
                    assert!(matches!(l, Ok(Msg::Plain { rkey, .. }) if rkey == first));
                }
            }));
        }
        for t in askers {
            t.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        for t in servers {
            t.join().unwrap();
        }
        for c in &sides {
            let n = c.counts();
            assert_eq!((n.asked, n.answered), (400, 400));
            assert_eq!((n.malformed, n.unasked, n.overflow), (0, 0, 0));
        }
    }

    #[test]
    fn a_hostile_peer_hurts_only_its_own_requests() {
        let (mine, mut peer) = link_pair();
        let c = Conversation::new(Box::new(mine));
        // Garbage of every kind, answers to nothing asked, and a flood of requests.
        peer.send(&[0xAB; MSG_LEN], secs(1)).unwrap();
        let mut bad_crc = Msg::Lookup { seq: 1, rkey: 1 }.encode();
        bad_crc[13] ^= 4;
        peer.send(&bad_crc, secs(1)).unwrap();
        peer.send(&Msg::Plain { seq: 1, rkey: 9 }.encode(), secs(1))
            .unwrap();
        let flood = std::thread::spawn(move || {
            for seq in 0..(MAX_QUEUED as u32 + 10) {
                peer.send(&Msg::Lookup { seq, rkey: 3 }.encode(), secs(5))
                    .unwrap();
            }
            peer
        });
        // This side's server sees at most MAX_QUEUED of them, in order, and the rest are
        // dropped; nothing panics.
        let mut seen = 0u32;
        let mut last = None;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            match c.next_request().unwrap() {
                Some(Msg::Lookup { seq, .. }) => {
                    assert!(last.is_none_or(|l| seq > l), "in order");
                    last = Some(seq);
                    seen += 1;
                }
                Some(m) => panic!("{m:?}"),
                None if flood.is_finished() => break,
                None => std::thread::yield_now(),
            }
        }
        let mut peer = flood.join().unwrap();
        while c.next_request().unwrap().is_some() {
            seen += 1;
        }
        let counts = c.counts();
        assert_eq!(counts.malformed, 2);
        assert_eq!(counts.unasked, 1);
        assert_eq!(u64::from(seen) + counts.overflow, MAX_QUEUED as u64 + 10);

        // A peer that never answers: this side's ask times out, and only that ask.
        let t = Instant::now();
        let r = c.ask(
            |seq| Msg::Lookup { seq, rkey: 5 },
            Instant::now() + Duration::from_millis(50),
        );
        assert_eq!(r, Err(CtlError::Timeout("the peer's answer")));
        assert!(t.elapsed() >= Duration::from_millis(50));
        // Its late answer, and forged answers for a request that is outstanding (another seq,
        // another key, more windows than asked), are dropped; the true answer is taken.
        let late = Msg::decode(&peer_read(&mut peer)).unwrap();
        let answerer = std::thread::spawn(move || {
            let req = Msg::decode(&peer_read(&mut peer)).unwrap();
            let Msg::Lease {
                seq,
                rkey,
                epoch,
                first,
                ..
            } = req
            else {
                panic!("{req:?}")
            };
            let grant = |seq, rkey, count| Msg::Grant {
                seq,
                rkey,
                epoch,
                first,
                count,
                keys: [0x77; GRANT_KEYS],
            };
            for forged in [
                Msg::Unknown {
                    seq: late.seq(),
                    rkey: 5,
                },
                grant(seq + 1, rkey, 1),
                grant(seq, rkey + 1, 1),
                grant(seq, rkey, 3),
            ] {
                peer.send(&forged.encode(), secs(1)).unwrap();
            }
            peer.send(&grant(seq, rkey, 2).encode(), secs(1)).unwrap();
            peer
        });
        let a = c
            .ask(
                |seq| Msg::Lease {
                    seq,
                    rkey: 6,
                    epoch: 1,
                    first: 0,
                    count: 2,
                    write: true,
                },
                secs(5),
            )
            .unwrap();
        assert!(matches!(a, Msg::Grant { count: 2, .. }), "{a:?}");
        let _peer = answerer.join().unwrap();
        assert_eq!(c.counts().unasked, 1 + 4);
        assert!(!c.is_gone());
    }

    fn peer_read(peer: &mut super::super::local::LocalLink) -> [u8; MSG_LEN] {
        let t = Instant::now();
        loop {
            if let Some(m) = peer.try_recv().unwrap() {
                return m;
            }
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_closed_link_fails_every_call_at_once() {
        let (mine, peer) = link_pair();
        let c = Conversation::new(Box::new(mine));
        drop(peer);
        assert_eq!(c.next_request(), Err(CtlError::Closed));
        assert!(c.is_gone());
        let t = Instant::now();
        assert_eq!(
            c.ask(|seq| Msg::Lookup { seq, rkey: 1 }, secs(5)),
            Err(CtlError::Closed)
        );
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
