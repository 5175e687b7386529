//! The seams between the lease protocol and the connection it runs on (docs/connectx.md §13):
//! a [`Link`] carries 64-byte messages both ways, a [`Meet`] makes links from pairs.
//!
//! In the library they are the control connection over rdma_cm ([`Channel`], [`CmMeet`]); the
//! host tests use in-process ones (`ctl::local`, test builds only), so the protocol's code runs
//! unchanged on the fake provider.

use std::time::Instant;

use super::msg::MSG_LEN;
use super::pair::{Endpoint, Pair, Role};
use super::rendezvous::{Channel, CtlError, Listening, Settings, connect};

/// A connection that carries fixed-size messages in order, both ways, to one peer.
pub trait Link: Send {
    /// Sends one message; returns once the peer's side has it (or at `deadline`).
    fn send(&mut self, msg: &[u8; MSG_LEN], deadline: Instant) -> Result<(), CtlError>;
    /// The next message from the peer if one has arrived, without waiting.
    /// [`CtlError::Closed`] (or another error) once the connection is gone.
    fn try_recv(&mut self) -> Result<Option<[u8; MSG_LEN]>, CtlError>;
}

impl Link for Channel {
    fn send(&mut self, msg: &[u8; MSG_LEN], deadline: Instant) -> Result<(), CtlError> {
        Channel::send(self, msg, deadline)
    }

    fn try_recv(&mut self) -> Result<Option<[u8; MSG_LEN]>, CtlError> {
        Channel::try_recv(self)
    }
}

/// A bound listener that waits for its pair's connector.
pub trait Accept: Send {
    /// Waits for the pair's connector until `deadline`.
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn Link>, CtlError>;
}

impl Accept for Listening {
    fn accept(self: Box<Self>, deadline: Instant) -> Result<Box<dyn Link>, CtlError> {
        Ok(Box::new(Listening::accept(*self, deadline)?))
    }
}

/// How the two sides of a pair find each other.
pub trait Meet: Send + Sync {
    /// Binds the pair's listener (quick: no waiting for the peer).
    fn listen(&self, pair: Pair) -> Result<Box<dyn Accept>, CtlError>;
    /// Connects to the pair's listener, trying until `deadline`.
    fn connect(&self, pair: Pair, deadline: Instant) -> Result<Box<dyn Link>, CtlError>;
    /// Bytes one link pins (its registered message buffers), which the library counts in its
    /// budget while the link exists or is being made.
    fn pinned_per_link(&self) -> u64;
}

/// The control connection over rdma_cm ([`super::rendezvous`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct CmMeet(pub Settings);

impl Meet for CmMeet {
    fn listen(&self, pair: Pair) -> Result<Box<dyn Accept>, CtlError> {
        Ok(Box::new(Listening::open(pair, &self.0)?))
    }

    fn connect(&self, pair: Pair, deadline: Instant) -> Result<Box<dyn Link>, CtlError> {
        Ok(Box::new(connect(pair, &self.0, deadline)?))
    }

    fn pinned_per_link(&self) -> u64 {
        super::rendezvous::PINNED_PER_CHANNEL
    }
}

/// The first half of meeting a peer: what is quick (the pair, this side's role and, for the
/// listener, its bound port), done where the application's connection reaches RTR.
pub enum Starting {
    /// This side listens: accept on it.
    Listening(Box<dyn Accept>),
    /// This side connects to the pair.
    Connecting(Pair),
}

impl Starting {
    /// Computes the pair of `local` and `remote` and binds the listener if this side listens.
    pub fn new(meet: &dyn Meet, local: Endpoint, remote: Endpoint) -> Result<Starting, CtlError> {
        let (pair, role) = Pair::new(local, remote)?;
        Ok(match role {
            Role::Listen => Starting::Listening(meet.listen(pair)?),
            Role::Connect => Starting::Connecting(pair),
        })
    }

    /// The second half, which waits for the peer (until `deadline`): run it in the background.
    pub fn finish(self, meet: &dyn Meet, deadline: Instant) -> Result<Box<dyn Link>, CtlError> {
        match self {
            Starting::Listening(a) => a.accept(deadline),
            Starting::Connecting(pair) => meet.connect(pair, deadline),
        }
    }
}
