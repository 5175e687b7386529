//! The receiver's completion of a WRITE_WITH_IMM reports the whole length, as with plain verbs
//! (docs/connectx.md §6): a WRITE_WITH_IMM over more local windows than the QP's SGE limit is
//! posted as one WR over its pinned ranges, not split into WRITEs and a last WRITE_WITH_IMM
//! whose length alone the responder would report.

mod common;

use common::*;
use nprdma::sys::*;

const KIB: usize = 1024;

/// A 300 KiB WRITE_WITH_IMM from one SGE starting 10 KiB into a 64 KiB window: five local
/// windows, more than the QP's (widened) limit of four SGEs.
fn write_imm(a: Host, b: Host) -> (Host, ibv_wc) {
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let len = 300 * KIB;
    let mut src = Buf::new(512 * KIB);
    let mut dst = Buf::new(512 * KIB);
    fill(&mut src, 3);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    // Zero-based (IOVA 0 holds the receiver's bytes): a peer without the library whose
    // region is at its virtual address is not reached yet (docs/connectx.md §12).
    let dmr = b.reg_iova(&mut dst, 0, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    let mut none: [ibv_sge; 0] = [];
    let mut r = ibv_recv_wr {
        wr_id: 77,
        next: core::ptr::null_mut(),
        sg_list: none.as_mut_ptr(),
        num_sge: 0,
    };
    assert_eq!(post_recv(qb, &mut r), 0);
    let off = 10 * KIB;
    let mut s = [sge(&src, off, len, slkey)];
    let raddr = off as u64;
    let mut wr = rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 5, &mut s, raddr, drkey, true);
    wr.imm_data = 0x1234_5678;
    let (rc, _) = post_send(qa, &mut wr);
    assert_eq!(rc, 0);
    let sent = poll(a.cq, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (5, IBV_WC_SUCCESS));
    let got = poll(b.cq, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(&dst[off..off + len], &src[off..off + len]);
    (a, got[0])
}

#[test]
fn the_receiver_sees_the_whole_length_from_a_library_sender() {
    let (a, wc) = write_imm(Host::with_library(16 << 20, 64 * 1024), Host::plain());
    assert_eq!(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(wc.imm_data, 0x1234_5678);
    assert_eq!(wc.byte_len, 300 * KIB as u32, "byte_len of the whole WRITE");
    let reasons = a.eng().status().page().reasons();
    assert!(
        reasons.iter().any(|r| r.contains("WRITE_WITH_IMM")),
        "the fallback is said: {reasons:?}"
    );
}

#[test]
fn plain_verbs_report_the_whole_length() {
    let (_, wc) = write_imm(Host::plain(), Host::plain());
    assert_eq!(wc.byte_len, 300 * KIB as u32);
}
