//! `ibv_query_qp` and the capabilities `ibv_create_qp` returns show the application what it
//! would see without the library (docs/connectx.md, "What the application sees"): the library
//! widens a QP's send queue and SGE limits for split and internal work requests, adds remote
//! rights to RC QPs and raises outstanding-read limits of 0 to 1, and none of it is the
//! application's.

mod common;

use common::*;
use nprdma::fake;
use nprdma::interpose as ip;
use nprdma::sys::*;

fn query(h: &Host, qp: *mut ibv_qp) -> (ibv_qp_attr, ibv_qp_init_attr) {
    let mut a = ibv_qp_attr::default();
    // SAFETY: plain old data, all-zero is a valid value.
    let mut i: ibv_qp_init_attr = unsafe { core::mem::zeroed() };
    let mask = IBV_QP_STATE | IBV_QP_CAP | IBV_QP_ACCESS_FLAGS;
    // SAFETY: a live QP of this host and the caller's structs.
    let rc = unsafe {
        match &h.eng {
            Some(e) => ip::query_qp(e, qp, &mut a, mask, &mut i),
            None => (fake::real_verbs().query_qp)(qp, &mut a, mask, &mut i),
        }
    };
    assert_eq!(rc, 0);
    (a, i)
}

/// Creates a QP and brings it to RTS with only local write access and no outstanding reads,
/// then returns what ibv_create_qp reported and what ibv_query_qp reports.
fn made_and_queried(h: &Host, peer_qpn: u32) -> (ibv_qp_cap, ibv_qp_attr, ibv_qp_init_attr) {
    let qp = h.create_qp(false);
    // SAFETY: plain old data.
    let created = unsafe { (*qp).qp_num };
    assert_ne!(created, 0);
    h.connect(qp, peer_qpn, IBV_ACCESS_LOCAL_WRITE);
    let (a, i) = query(h, qp);
    // The capabilities ibv_create_qp wrote back, asked again the same way.
    let cap = create_cap(h);
    (cap, a, i)
}

fn create_cap(h: &Host) -> ibv_qp_cap {
    let mut attr = ibv_qp_init_attr {
        qp_context: core::ptr::null_mut(),
        send_cq: h.cq,
        recv_cq: h.cq,
        srq: core::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: live PD and attributes.
    let qp = unsafe {
        match &h.eng {
            Some(e) => ip::create_qp(e, h.pd, &mut attr),
            None => (fake::real_verbs().create_qp)(h.pd, &mut attr),
        }
    };
    assert!(!qp.is_null());
    attr.cap
}

#[test]
fn query_qp_shows_what_plain_verbs_show() {
    let plain = Host::plain();
    let lib = Host::with_library(16 << 20, 64 * 1024);
    let (pcap, pa, pi) = made_and_queried(&plain, 0x7001);
    let (lcap, la, li) = made_and_queried(&lib, 0x7002);

    assert_eq!(lcap, pcap, "ibv_create_qp's returned capabilities");
    assert_eq!(la.cap, pa.cap, "ibv_query_qp's attr.cap");
    assert_eq!(li.cap, pi.cap, "ibv_query_qp's init_attr.cap");
    assert_eq!(la.qp_access_flags, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(la.qp_access_flags, pa.qp_access_flags);
    assert_eq!(la.max_rd_atomic, pa.max_rd_atomic);
    assert_eq!(la.max_dest_rd_atomic, pa.max_dest_rd_atomic);
    assert_eq!(la.qp_state, IBV_QPS_RTS);
}

#[test]
fn the_provider_still_gets_the_widened_qp() {
    // What the library asked for itself is still there underneath: the fake's own query (the
    // provider's view) shows the widened send queue and the remote rights.
    let lib = Host::with_library(16 << 20, 64 * 1024);
    let qp = lib.create_qp(false);
    lib.connect(qp, 0x7003, IBV_ACCESS_LOCAL_WRITE);
    let mut a = ibv_qp_attr::default();
    // SAFETY: plain old data.
    let mut i: ibv_qp_init_attr = unsafe { core::mem::zeroed() };
    // SAFETY: a live QP of the fake.
    let rc = unsafe { (fake::real_verbs().query_qp)(qp, &mut a, IBV_QP_CAP, &mut i) };
    assert_eq!(rc, 0);
    assert!(a.cap.max_send_wr > 64, "{:?}", a.cap);
    assert_ne!(a.qp_access_flags & IBV_ACCESS_REMOTE_WRITE, 0);
}
