//! The fake provider's null data path, which the overhead bench measures the library against.
//! Its own test binary: the switch is process-wide, and the interposer tests run in parallel.

mod common;

use common::*;
use nprdma::sys::*;

#[test]
fn the_null_data_path_completes_signaled_wrs_at_once_and_moves_nothing() {
    let (a, b) = (Host::plain(), Host::plain());
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect(&a, qa, &b, qb);
    let (mut src, mut dst) = (Buf::new(4096), Buf::new(4096));
    fill(&mut src, 1);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let (sl, _) = keys(smr);
    let (_, dr) = keys(dmr);

    nprdma::fake::set_null_data_path(true);
    for (wr_id, signaled) in [(1, false), (2, true), (3, true)] {
        let mut s = [sge(&src, 0, 64, sl)];
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            wr_id,
            &mut s,
            dst.as_ptr() as u64,
            dr,
            signaled,
        );
        assert_eq!(post_send(qa, &mut wr).0, 0);
    }
    // SAFETY: a live QP.
    let cq = unsafe { (*qa).send_cq };
    let got = poll(cq, 2);
    nprdma::fake::set_null_data_path(false);

    let ids: Vec<(u64, u32, u32)> = got.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        ids,
        vec![
            (2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE),
            (3, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
        ]
    );
    assert!(got.iter().all(|w| w.qp_num == qp_num(qa)));
    assert!(
        poll_rest(cq).is_empty(),
        "the unsignaled WR completes nothing"
    );
    assert!(dst.iter().all(|&x| x == 0), "no data moved");
}
