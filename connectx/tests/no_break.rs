//! "Never break a program that works without the library" (docs/connectx.md §3 and §4): what
//! plain verbs accept, the library accepts too, on the fake provider, whose send queue refuses
//! a post with ENOMEM when full as rxe's and mlx5's do.

mod common;

use common::*;
use nprdma::sys::*;

const KIB: usize = 1024;

/// One RC QP on each host, connected.
fn connected(a: Host, b: Host) -> (Host, Host, *mut ibv_qp, *mut ibv_qp) {
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    (a, b, qa, qb)
}

/// perftest's `ib_write_bw` pattern: the application's whole send queue (64 WRs, as
/// `create_qp` asks for) in flight, every 16th signaled, each WRITE 260 KiB over 64 KiB
/// windows (five parts). Plain verbs accept every post; with the library the parts fill the
/// widened queue (64 + 32 + 16 entries) long before, and the posts must wait for room instead
/// of failing with ENOMEM.
fn write_whole_queue(a: &Host, b: &Host, qa: *mut ibv_qp) {
    let len = 260 * KIB;
    let mut src = Buf::new(512 * KIB);
    let mut dst = Buf::new(512 * KIB);
    fill(&mut src, 5);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    let mut expected = Vec::new();
    for round in 0..3u64 {
        for i in 0..64u64 {
            let signaled = i % 16 == 15;
            let off = (i as usize * 4 * KIB) % (200 * KIB);
            let mut s = [sge(&src, off, len, slkey)];
            let raddr = dst.as_ptr() as u64 + off as u64;
            let id = round * 64 + i;
            let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, raddr, drkey, signaled);
            let (rc, _) = post_send(qa, &mut wr);
            assert_eq!(rc, 0, "post {id} refused with errno {rc}");
            if signaled {
                expected.push(id);
            }
        }
        // The whole depth was in flight: collect its four completions before the next round.
        let wcs = poll(a.cq, 4);
        let got: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
        assert_eq!(got, expected[expected.len() - 4..]);
        assert!(wcs.iter().all(|w| w.status == IBV_WC_SUCCESS));
    }
    assert!(poll_rest(a.cq).is_empty());
    let end = 63 * 4 * KIB % (200 * KIB) + len;
    assert_eq!(&dst[..end], &src[..end]);
}

#[test]
fn split_writes_filling_the_send_queue_wait_for_room() {
    let (a, b, qa, _qb) = connected(
        Host::with_library(16 << 20, 64 * 1024),
        Host::with_library(16 << 20, 64 * 1024),
    );
    write_whole_queue(&a, &b, qa);
    let reasons = a.eng().status().page().reasons();
    assert!(
        reasons.iter().any(|r| r.contains("send queue full")),
        "the wait is said in the log and the status page: {reasons:?}"
    );
}

#[test]
fn the_same_posts_work_without_the_library() {
    let (a, b, qa, _qb) = connected(Host::plain(), Host::plain());
    write_whole_queue(&a, &b, qa);
}
