//! The control connection of docs/connectx.md §13 on the fake provider: two engines of this
//! process meet in-process (ctl::local) when their connection reaches RTR with a GRH, as two
//! processes meet over rdma_cm.

mod common;

use std::time::Duration;

use common::*;
use nprdma::config::Config;
use nprdma::ctl::msg::Msg;
use nprdma::ctl::peers::{NoPeer, Outcome};
use nprdma::ctl::rendezvous::CtlError;
use nprdma::sys::*;

#[test]
fn a_roce_connection_meets_the_peers_library_and_ends_with_it() {
    let a = Host::with_library(64 << 20, 1 << 20);
    let b = Host::with_library(64 << 20, 1 << 20);
    assert_ne!(a.gid(), b.gid());
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect_roce(&a, qa, &b, qb);
    let wait = Duration::from_secs(5);
    let Some(Outcome::Up(ca)) = a.eng().control_connection(qa, wait) else {
        panic!("{:?}", a.eng().control_connection(qa, wait))
    };
    let Some(Outcome::Up(cb)) = b.eng().control_connection(qb, wait) else {
        panic!("{:?}", b.eng().control_connection(qb, wait))
    };
    // The two ends are one link.
    let deadline = std::time::Instant::now() + wait;
    let server = std::thread::spawn(move || {
        loop {
            if let Some(Msg::Lookup { seq, rkey }) = cb.next_request().unwrap() {
                cb.reply(&Msg::Unknown { seq, rkey }, deadline).unwrap();
                return cb;
            }
        }
    });
    let got = ca.ask(|seq| Msg::Lookup { seq, rkey: 7 }, deadline);
    assert!(matches!(got, Ok(Msg::Unknown { rkey: 7, .. })), "{got:?}");
    let cb = server.join().unwrap();
    drop(ca);
    // The application's connection ends on one side: so does the control connection.
    assert_eq!(a.destroy_qp(qa), 0);
    assert!(a.eng().control_connection(qa, wait).is_none());
    assert_eq!(cb.next_request(), Err(CtlError::Closed));
    assert_eq!(b.destroy_qp(qb), 0);
}

#[test]
fn a_connection_without_a_grh_has_no_control_connection_and_says_so() {
    let a = Host::with_library(64 << 20, 1 << 20);
    let b = Host::with_library(64 << 20, 1 << 20);
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect(&a, qa, &b, qb);
    assert!(
        a.eng()
            .control_connection(qa, Duration::from_millis(10))
            .is_none()
    );
    let reasons = a.eng().status().page().reasons();
    assert!(
        reasons.iter().any(|r| r.contains("without a GRH")),
        "{reasons:?}"
    );
}

#[test]
fn a_peer_without_the_library_is_no_peer_after_the_deadline_and_rtr_never_waits_for_it() {
    let mut cfg = Config::for_tests(64 << 20, 1 << 20);
    cfg.remote_timeout_ms = 20;
    let a = Host::with_config(cfg);
    let b = Host::plain();
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    // Whichever side listens, nobody of the peer's ever meets this side: RTR returns at
    // once (the meeting goes on in the background) ...
    a.connect_to(qa, qp_num(qb), Some(b.gid()), access);
    b.connect_to(qb, qp_num(qa), Some(a.gid()), access);
    assert!(matches!(
        a.eng().control_connection(qa, Duration::ZERO),
        Some(Outcome::Pending)
    ));
    // ... and ends with "no peer" at its deadline (6 x the remote timeout).
    let o = a.eng().control_connection(qa, Duration::from_secs(5));
    assert!(matches!(o, Some(Outcome::NoPeer(NoPeer::Meet(_)))), "{o:?}");
    let reasons = a.eng().status().page().reasons();
    assert!(
        reasons.iter().any(|r| r.contains("no control connection")),
        "{reasons:?}"
    );
}

#[test]
fn a_qp_moved_to_reset_and_connected_again_meets_again() {
    let a = Host::with_library(64 << 20, 1 << 20);
    let b = Host::with_library(64 << 20, 1 << 20);
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect_roce(&a, qa, &b, qb);
    let wait = Duration::from_secs(5);
    assert!(matches!(
        a.eng().control_connection(qa, wait),
        Some(Outcome::Up(_))
    ));
    for (h, q) in [(&a, qa), (&b, qb)] {
        let mut r = ibv_qp_attr {
            qp_state: IBV_QPS_RESET,
            ..Default::default()
        };
        assert_eq!(h.modify(q, &mut r, IBV_QP_STATE), 0);
        assert!(h.eng().control_connection(q, Duration::ZERO).is_none());
    }
    connect_roce(&a, qa, &b, qb);
    let Some(Outcome::Up(ca)) = a.eng().control_connection(qa, wait) else {
        panic!()
    };
    assert!(matches!(
        b.eng().control_connection(qb, wait),
        Some(Outcome::Up(_))
    ));
    assert!(!ca.is_gone());
}
