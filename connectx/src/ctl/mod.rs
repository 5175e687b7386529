//! The library's own control connection between two processes that run it, one per
//! application RC connection (docs/connectx.md §13).
//!
//! - [`pair`]: who listens, on which ports, and the private data that names a pair (pure).
//! - [`cm`]: librdmacm and the verbs the connection calls, loaded at run time.
//! - [`rendezvous`]: listening, connecting, and fixed-size messages over the connection.
//! - [`msg`]: the lease protocol's messages (pure).
//! - [`link`]: the seams: a [`link::Link`] carries messages, a [`link::Meet`] makes links from
//!   pairs; `local` has in-process ones for the host tests (test builds only).
//! - [`conversation`]: requests and answers both ways over one link, one reader at a time.
//! - [`peers`]: per application connection (pair), its control connection's state.
//!
//! The lease protocol runs on it wherever an application connection has one
//! (crate::lease_link); connections without one still use the directory's ring
//! (docs/connectx.md §5). `nprdma-ctl-check` exercises the rendezvous on Soft-RoCE.

pub mod cm;
pub mod conversation;
pub mod link;
#[cfg(any(test, feature = "fake"))]
pub mod local;
pub mod msg;
pub mod pair;
pub mod peers;
pub mod rendezvous;
