//! The library's hidden completions (forced signals on unsignaled runs, its own work requests)
//! must find room in a CQ the application sized for its own completions only (module
//! `cq_room`, docs/connectx.md "What the application sees"). The fake provider's CQs hold
//! exactly the entries asked for and overrun, losing the CQ, one completion beyond.

mod common;

use common::*;
use nprdma::fake;
use nprdma::interpose as ip;
use nprdma::sys::*;

const KIB: usize = 1024;
/// The application's send-queue depth.
const DEPTH: u32 = 16;

fn create_qp(h: &Host, max_send_wr: u32) -> *mut ibv_qp {
    let mut attr = ibv_qp_init_attr {
        qp_context: core::ptr::null_mut(),
        send_cq: h.cq,
        recv_cq: h.cq,
        srq: core::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
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
    qp
}

/// Rounds of `DEPTH` WRITEs, each over two 64 KiB windows, only the last of a round signaled,
/// on a CQ of one entry: plain verbs queue one completion per round, which the CQ holds. The
/// library's parts (32 per round) pass its forced-signal threshold, so it queues a hidden
/// completion too.
fn rounds(mut a: Host, b: Host) -> Host {
    a.cq = fake::create_cq_with(a.ctx, 1);
    let qa = create_qp(&a, DEPTH);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let len = 100 * KIB;
    let mut src = Buf::new(256 * KIB);
    let mut dst = Buf::new(256 * KIB);
    fill(&mut src, 9);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    for round in 0..4u64 {
        for i in 0..u64::from(DEPTH) {
            let signaled = i == u64::from(DEPTH) - 1;
            // Starts at 32 KiB: every WRITE crosses a 64 KiB window boundary.
            let off = 32 * KIB;
            let mut s = [sge(&src, off, len, slkey)];
            let raddr = dst.as_ptr() as u64 + off as u64;
            let id = round * 100 + i;
            let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, raddr, drkey, signaled);
            let (rc, _) = post_send(qa, &mut wr);
            assert_eq!(rc, 0, "post {id} refused with errno {rc}");
        }
        assert!(!fake::cq_overran(a.cq), "round {round}: the CQ overran");
        let wcs = poll(a.cq, 1);
        assert_eq!(wcs.len(), 1);
        assert_eq!(wcs[0].wr_id, round * 100 + u64::from(DEPTH) - 1);
        assert_eq!(wcs[0].status, IBV_WC_SUCCESS);
    }
    assert!(poll_rest(a.cq).is_empty());
    assert_eq!(
        &dst[32 * KIB..32 * KIB + len],
        &src[32 * KIB..32 * KIB + len]
    );
    a
}

#[test]
fn a_cq_sized_for_the_application_does_not_overrun() {
    let a = rounds(
        Host::with_library(16 << 20, 64 * 1024),
        Host::with_library(16 << 20, 64 * 1024),
    );
    // SAFETY: a live CQ.
    let cqe = unsafe { (*a.cq).cqe };
    assert!(cqe > 1, "the CQ was given room: {cqe}");
}

#[test]
fn the_same_rounds_work_without_the_library() {
    rounds(Host::plain(), Host::plain());
}

#[test]
fn the_room_goes_with_the_qp() {
    let mut a = Host::with_library(16 << 20, 64 * 1024);
    a.cq = fake::create_cq_with(a.ctx, 8);
    let qp = create_qp(&a, DEPTH);
    // SAFETY: a live CQ.
    let grown = unsafe { (*a.cq).cqe };
    assert!(grown >= 8 + DEPTH as i32, "{grown}");
    // The application's own resize keeps the room.
    // SAFETY: a live CQ of this host.
    assert_eq!(unsafe { ip::resize_cq(a.eng(), a.cq, 10) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { (*a.cq).cqe }, grown + 2);
    assert_eq!(a.destroy_qp(qp), 0);
    // SAFETY: as above.
    assert_eq!(unsafe { (*a.cq).cqe }, 10);
}

#[test]
fn a_rounding_provider_does_not_double_the_cq_per_qp() {
    // rxe sizes a CQ to 2^n - 1 entries: growing the rounded size by each QP's room would
    // double the CQ with every QP (16 QPs: from 1023 entries to the device's limit).
    let mut a = Host::with_library(16 << 20, 64 * 1024);
    fake::round_cq_sizes(a.ctx);
    a.cq = fake::create_cq_with(a.ctx, 516);
    // SAFETY: a live CQ.
    assert_eq!(unsafe { (*a.cq).cqe }, 1023);
    let qps: Vec<_> = (0..16).map(|_| create_qp(&a, 1)).collect();
    // Each QP's granted depth (1 + 16 for the library) is its room: 1023 + 16 * 17 fits in
    // the next size.
    // SAFETY: as above.
    assert_eq!(unsafe { (*a.cq).cqe }, 2047);
    for qp in qps {
        assert_eq!(a.destroy_qp(qp), 0);
    }
    // SAFETY: as above.
    assert_eq!(unsafe { (*a.cq).cqe }, 1023);
}
