//! In-process [`Link`]s and [`Meet`] for the host tests (test builds only): two engines of one
//! test process, each on the fake provider, meet by pair exactly as two processes meet over
//! rdma_cm, and exchange the same messages.
//!
//! A link holds at most [`DEPTH`] undelivered messages per direction, as the control
//! connection keeps that many receives posted: a sender beyond that waits (the RC sender's
//! receiver-not-ready retries) until its deadline.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::link::{Accept, Link, Meet};
use super::msg::MSG_LEN;
use super::pair::Pair;
use super::rendezvous::CtlError;

/// Messages one direction holds undelivered.
pub const DEPTH: usize = 16;

#[derive(Default)]
struct Pipe {
    q: VecDeque<[u8; MSG_LEN]>,
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// One end of an in-process link.
pub struct LocalLink {
    rx: Arc<Mutex<Pipe>>,
    tx: Arc<Mutex<Pipe>>,
}

/// Two connected ends.
pub fn link_pair() -> (LocalLink, LocalLink) {
    let a = Arc::new(Mutex::new(Pipe::default()));
    let b = Arc::new(Mutex::new(Pipe::default()));
    (
        LocalLink {
            rx: a.clone(),
            tx: b.clone(),
        },
        LocalLink { rx: b, tx: a },
    )
}

impl Link for LocalLink {
    fn send(&mut self, msg: &[u8; MSG_LEN], deadline: Instant) -> Result<(), CtlError> {
        loop {
            {
                let mut p = lock(&self.tx);
                if p.closed {
                    return Err(CtlError::Closed);
                }
                if p.q.len() < DEPTH {
                    p.q.push_back(*msg);
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(CtlError::Timeout("a control message's send completion"));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    fn try_recv(&mut self) -> Result<Option<[u8; MSG_LEN]>, CtlError> {
        let mut p = lock(&self.rx);
        match p.q.pop_front() {
            Some(m) => Ok(Some(m)),
            None if p.closed => Err(CtlError::Closed),
            None => Ok(None),
        }
    }
}

impl Drop for LocalLink {
    fn drop(&mut self) {
        lock(&self.rx).closed = true;
        lock(&self.tx).closed = true;
    }
}

enum Spot {
    /// A listener is bound and waits.
    Waiting,
    /// Its connector came: the listener's end.
    Met(LocalLink),
}

/// The pairs listening in this process.
static SPOTS: Mutex<Option<HashMap<Pair, Spot>>> = Mutex::new(None);
static CHANGED: Condvar = Condvar::new();

fn spots() -> MutexGuard<'static, Option<HashMap<Pair, Spot>>> {
    lock(&SPOTS)
}

/// Waits on [`CHANGED`] until `deadline`; `None` once it has passed.
fn wait_until<'a>(
    g: MutexGuard<'a, Option<HashMap<Pair, Spot>>>,
    deadline: Instant,
) -> Option<MutexGuard<'a, Option<HashMap<Pair, Spot>>>> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return None;
    }
    Some(match CHANGED.wait_timeout(g, left) {
        Ok((g, _)) => g,
        Err(p) => p.into_inner().0,
    })
}

/// Pairs meet in this process's table.
#[derive(Clone, Copy, Debug, Default)]
pub struct LocalMeet;

struct LocalAccept {
    pair: Pair,
    done: bool,
}

impl Meet for LocalMeet {
    fn listen(&self, pair: Pair) -> Result<Box<dyn Accept>, CtlError> {
        let mut g = spots();
        let table = g.get_or_insert_with(HashMap::new);
        if table.contains_key(&pair) {
            // Two listeners of one pair in one process: the second finds the port taken.
            return Err(CtlError::NoPort(1));
        }
        table.insert(pair, Spot::Waiting);
        CHANGED.notify_all();
        Ok(Box::new(LocalAccept { pair, done: false }))
    }

    fn connect(&self, pair: Pair, deadline: Instant) -> Result<Box<dyn Link>, CtlError> {
        let mut g = spots();
        let mut rounds = 1;
        loop {
            let table = g.get_or_insert_with(HashMap::new);
            if let Some(spot @ Spot::Waiting) = table.get_mut(&pair) {
                let (mine, theirs) = link_pair();
                *spot = Spot::Met(theirs);
                CHANGED.notify_all();
                return Ok(Box::new(mine));
            }
            rounds += 1;
            g = wait_until(g, deadline).ok_or(CtlError::NoListener { ports: 1, rounds })?;
        }
    }

    /// As much as the rdma_cm channel pins (its page of message buffers), so that the tests
    /// count what the library counts on a real device.
    fn pinned_per_link(&self) -> u64 {
        super::rendezvous::PINNED_PER_CHANNEL
    }
}

impl Accept for LocalAccept {
    fn accept(mut self: Box<Self>, deadline: Instant) -> Result<Box<dyn Link>, CtlError> {
        let mut g = spots();
        loop {
            let table = g.get_or_insert_with(HashMap::new);
            if let Some(Spot::Met(_)) = table.get(&self.pair)
                && let Some(Spot::Met(link)) = table.remove(&self.pair)
            {
                self.done = true;
                return Ok(Box::new(link));
            }
            g = wait_until(g, deadline).ok_or(CtlError::Timeout("an rdma_cm event"))?;
        }
    }
}

impl Drop for LocalAccept {
    fn drop(&mut self) {
        if !self.done {
            // The port is free again, as a listener's is once it returns.
            if let Some(t) = spots().as_mut() {
                t.remove(&self.pair);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::link::Starting;
    use super::super::pair::Endpoint;
    use super::*;

    fn ep(last: u8, qpn: u32) -> Endpoint {
        Endpoint::ipv4(std::net::Ipv4Addr::from([192, 0, 2, last]), qpn)
    }

    #[test]
    fn two_sides_meet_by_pair_and_exchange_messages_in_order() {
        let (a, b) = (ep(1, 0x11), ep(2, 0x22));
        let deadline = Instant::now() + Duration::from_secs(5);
        let side_b = std::thread::spawn(move || {
            let s = Starting::new(&LocalMeet, b, a).unwrap();
            let mut l = s.finish(&LocalMeet, deadline).unwrap();
            let mut got = Vec::new();
            while got.len() < 3 {
                if let Some(m) = l.try_recv().unwrap() {
                    got.push(m[0]);
                }
            }
            l.send(&[9; MSG_LEN], deadline).unwrap();
            got
        });
        let s = Starting::new(&LocalMeet, a, b).unwrap();
        let mut l = s.finish(&LocalMeet, deadline).unwrap();
        for i in 0..3 {
            l.send(&[i; MSG_LEN], deadline).unwrap();
        }
        assert_eq!(side_b.join().unwrap(), vec![0, 1, 2]);
        let reply = loop {
            if let Some(m) = l.try_recv().unwrap() {
                break m;
            }
        };
        assert_eq!(reply, [9; MSG_LEN]);
        // The other end is gone: the link says so.
        assert_eq!(l.try_recv().err(), Some(CtlError::Closed));
        assert_eq!(
            l.send(&[0; MSG_LEN], deadline).err(),
            Some(CtlError::Closed)
        );
    }

    #[test]
    fn a_connector_without_a_listener_gives_up_at_its_deadline() {
        let (a, b) = (ep(3, 0x33), ep(4, 0x44));
        let (pair, _) = Pair::new(a, b).unwrap();
        let t = Instant::now();
        let r = LocalMeet.connect(pair, t + Duration::from_millis(50));
        assert!(matches!(r.err(), Some(CtlError::NoListener { .. })));
        assert!(t.elapsed() >= Duration::from_millis(50));
        // A listener that gives up frees its pair for a later one.
        let acc = LocalMeet.listen(pair).unwrap();
        assert!(matches!(
            LocalMeet.listen(pair).err(),
            Some(CtlError::NoPort(1))
        ));
        assert!(matches!(
            acc.accept(Instant::now() + Duration::from_millis(10)).err(),
            Some(CtlError::Timeout(_))
        ));
        drop(LocalMeet.listen(pair).unwrap());
    }

    #[test]
    fn a_full_link_makes_its_sender_wait_until_its_deadline() {
        let (mut a, mut b) = link_pair();
        let soon = Instant::now() + Duration::from_millis(20);
        for _ in 0..DEPTH {
            a.send(&[1; MSG_LEN], soon).unwrap();
        }
        assert!(matches!(
            a.send(&[1; MSG_LEN], soon).err(),
            Some(CtlError::Timeout(_))
        ));
        assert!(b.try_recv().unwrap().is_some());
        a.send(&[2; MSG_LEN], Instant::now()).unwrap();
    }
}
