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
    let pinned = |h: &Host| h.eng().status().page().report().pinned_bytes;
    let before = pinned(&a);
    connect_roce(&a, qa, &b, qb);
    // The control connection's page of message buffers is pinned on a real device: counted
    // in the budget while the connection lives.
    assert_eq!(pinned(&a), before + 4096);
    let wait = Duration::from_secs(5);
    let Some(Outcome::Up(ca)) = a.eng().control_connection(qa, wait) else {
        panic!("{:?}", a.eng().control_connection(qa, wait))
    };
    let Some(Outcome::Up(cb)) = b.eng().control_connection(qb, wait) else {
        panic!("{:?}", b.eng().control_connection(qb, wait))
    };
    // The two ends are one link, and B's helper thread answers what A asks on it: a key no
    // region of B has is unknown there.
    let deadline = std::time::Instant::now() + wait;
    let got = ca.ask(|seq| Msg::Lookup { seq, rkey: 0xdead }, deadline);
    assert!(
        matches!(got, Ok(Msg::Unknown { rkey: 0xdead, .. })),
        "{got:?}"
    );
    assert_eq!(cb.counts().answered, 1);
    drop(ca);
    // The application's connection ends on one side: so does the control connection.
    assert_eq!(a.destroy_qp(qa), 0);
    assert!(a.eng().control_connection(qa, wait).is_none());
    assert_eq!(pinned(&a), before);
    assert_eq!(cb.next_request(), Err(CtlError::Closed));
    assert_eq!(b.destroy_qp(qb), 0);
}

#[test]
fn a_connection_without_a_grh_has_no_control_connection_and_says_so() {
    let a = Host::with_library(64 << 20, 1 << 20);
    let b = Host::with_library(64 << 20, 1 << 20);
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    a.connect(qa, qp_num(qb), access);
    b.connect(qb, qp_num(qa), access);
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
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    // Whichever side listens, nobody of the peer's ever meets this side: RTR returns at
    // once (the meeting goes on in the background) ...
    a.connect_to(qa, qp_num(qb), Some(b.gid()), access);
    b.connect_to(qb, qp_num(qa), Some(a.gid()), access);
    assert!(matches!(
        a.eng().control_connection(qa, Duration::ZERO),
        Some(Outcome::Pending)
    ));
    // The link's page is counted while it is being made.
    assert_eq!(a.eng().status().page().report().pinned_bytes, 4096);
    // A WRITE posted now waits for the meeting's end; the peer's keys are then plain MRs,
    // used as they are, and it lands as with plain verbs (the directory read at IOVA 0 would
    // have failed and put the QP in error).
    let mut remote = Buf::new(64 << 10);
    let rmr = b.reg(
        &mut remote,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    );
    let mut src = Buf::new(16 << 10);
    fill(&mut src, 5);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    rdma_op(
        &a,
        qa,
        IBV_WR_RDMA_WRITE,
        &src,
        smr,
        remote.as_ptr() as u64 + 4096,
        keys(rmr).1,
    );
    assert_eq!(&remote[4096..4096 + (16 << 10)], &src[..]);
    // ... the meeting ended with "no peer" at its deadline (twice the remote timeout), when
    // the page its link would have pinned stopped being counted.
    let o = a.eng().control_connection(qa, Duration::from_secs(5));
    assert!(matches!(o, Some(Outcome::NoPeer(NoPeer::Meet(_)))), "{o:?}");
    assert_eq!(a.dereg(smr), 0);
    assert_eq!(a.destroy_qp(qa), 0);
    assert_eq!(a.eng().status().page().report().pinned_bytes, 0);
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

/// A signaled WRITE or READ of `len` bytes between `buf` and `raddr`, polled to completion.
fn rdma_op(h: &Host, q: *mut ibv_qp, op: u32, buf: &Buf, mr: *mut ibv_mr, raddr: u64, rkey: u32) {
    let mut s = [sge(buf, 0, buf.len(), keys(mr).0)];
    let mut wr = rdma(op, 1, &mut s, raddr, rkey, true);
    assert_eq!(post_send(q, &mut wr).0, 0);
    let wc = poll(h.cq, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, IBV_WC_SUCCESS, "{:?}", wc[0].status);
}

const RW: u32 = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

#[test]
fn leases_are_asked_for_on_the_control_connection_and_data_moves() {
    let a = Host::with_library(64 << 20, 64 << 10);
    let b = Host::with_library(64 << 20, 64 << 10);
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect_roce(&a, qa, &b, qb);
    let mut remote = Buf::new(256 << 10);
    let rmr = b.reg(&mut remote, RW);
    let (_, rkey) = keys(rmr);
    let mut src = Buf::new(192 << 10);
    fill(&mut src, 7);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    // 192 KiB from 32 KiB into the region: four of its 64 KiB windows.
    let raddr = remote.as_ptr() as u64 + (32 << 10);
    rdma_op(&a, qa, IBV_WR_RDMA_WRITE, &src, smr, raddr, rkey);
    assert_eq!(&remote[32 << 10..224 << 10], &src[..]);
    let mut back = Buf::new(192 << 10);
    let bmr = a.reg(&mut back, IBV_ACCESS_LOCAL_WRITE);
    rdma_op(&a, qa, IBV_WR_RDMA_READ, &back, bmr, raddr, rkey);
    assert_eq!(&back[..], &src[..]);
    // One lookup and one lease per window, all on the control connection; the owner leased
    // the four windows to this connection.
    let Some(Outcome::Up(ca)) = a.eng().control_connection(qa, Duration::from_secs(1)) else {
        panic!()
    };
    assert_eq!(ca.counts().asked, 1 + 4);
    assert_eq!(b.eng().leased_windows(qb), 4);
    // The connection ends: so do its leases.
    let mut r = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(b.modify(qb, &mut r, IBV_QP_STATE), 0);
    assert_eq!(b.eng().leased_windows(qb), 0);
}

#[test]
fn a_peer_can_only_touch_the_leases_of_its_own_connection() {
    let a = Host::with_library(64 << 20, 64 << 10);
    let b = Host::with_library(64 << 20, 64 << 10);
    let (qa1, qb1) = (a.create_qp(false), b.create_qp(false));
    let (qa2, qb2) = (a.create_qp(false), b.create_qp(false));
    connect_roce(&a, qa1, &b, qb1);
    connect_roce(&a, qa2, &b, qb2);
    let mut remote = Buf::new(256 << 10);
    let rmr = b.reg(&mut remote, RW);
    let (_, rkey) = keys(rmr);
    let mut src = Buf::new(128 << 10);
    fill(&mut src, 3);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    rdma_op(
        &a,
        qa1,
        IBV_WR_RDMA_WRITE,
        &src,
        smr,
        remote.as_ptr() as u64,
        rkey,
    );
    // 128 KiB at a page-aligned address: two or three windows of 64 KiB.
    let n1 = b.eng().leased_windows(qb1);
    assert!((2..=3).contains(&n1), "{n1}");
    // The second connection's peer plays hostile on its own control connection: leases in
    // epoch after epoch (each new epoch ends the leases of the last), a lease past the
    // region, a key of no region. A LEASE names no lessee: whatever it asks is for its own
    // connection.
    let wait = Duration::from_secs(5);
    let Some(Outcome::Up(c2)) = a.eng().control_connection(qa2, wait) else {
        panic!()
    };
    let deadline = std::time::Instant::now() + wait;
    let lease = |epoch, first| {
        c2.ask(
            |seq| Msg::Lease {
                seq,
                rkey,
                epoch,
                first,
                count: 1,
                write: true,
            },
            deadline,
        )
        .unwrap()
    };
    for epoch in 1..20 {
        assert!(matches!(lease(epoch, 0), Msg::Grant { count: 1, .. }));
        assert!(matches!(lease(epoch, 1), Msg::Grant { count: 1, .. }));
        assert_eq!(
            b.eng().leased_windows(qb2),
            2,
            "a new epoch ended the last one's"
        );
        assert_eq!(b.eng().leased_windows(qb1), n1, "untouched");
    }
    assert!(matches!(lease(19, 1000), Msg::OutOfRegion { .. }));
    let other = c2
        .ask(
            |seq| Msg::Lookup {
                seq,
                rkey: rkey ^ 0x5a5a,
            },
            deadline,
        )
        .unwrap();
    assert!(matches!(other, Msg::Unknown { .. }), "{other:?}");
    assert_eq!(b.eng().leased_windows(qb2), 2);
    assert_eq!(b.eng().leased_windows(qb1), n1, "untouched");
    // The first connection still writes through its leases, asking for nothing more.
    let Some(Outcome::Up(c1)) = a.eng().control_connection(qa1, wait) else {
        panic!()
    };
    let asked = c1.counts().asked;
    fill(&mut src, 4);
    rdma_op(
        &a,
        qa1,
        IBV_WR_RDMA_WRITE,
        &src,
        smr,
        remote.as_ptr() as u64,
        rkey,
    );
    assert_eq!(&remote[..128 << 10], &src[..]);
    assert_eq!(c1.counts().asked, asked);
    // The hostile connection goes: its leases with it, the other's stay.
    assert_eq!(a.destroy_qp(qa2), 0);
    assert_eq!(b.destroy_qp(qb2), 0);
    assert_eq!(b.eng().leased_windows(qb1), n1);
}
