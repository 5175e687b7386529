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

fn recv_wr(wr_id: u64, sges: &mut [ibv_sge]) -> ibv_recv_wr {
    ibv_recv_wr {
        wr_id,
        next: core::ptr::null_mut(),
        sg_list: sges.as_mut_ptr(),
        num_sge: sges.len() as i32,
    }
}

fn send_wr(wr_id: u64, sges: &mut [ibv_sge]) -> ibv_send_wr {
    let mut w = ibv_send_wr::zeroed();
    w.wr_id = wr_id;
    w.opcode = IBV_WR_SEND;
    w.send_flags = IBV_SEND_SIGNALED;
    w.sg_list = sges.as_mut_ptr();
    w.num_sge = sges.len() as i32;
    w
}

/// `ibv_rc_pingpong -s 16777216` in small: a receive and a SEND of one SGE each over 20
/// windows, where the QPs take 4 SGEs (2 asked for, widened). Plain verbs accept both; the
/// library pins their ranges as plain verbs would, instead of refusing them with EINVAL, and
/// unpins them at their completions.
#[test]
fn a_receive_and_a_send_over_more_windows_than_sges_are_pinned_not_refused() {
    let (a, b, qa, qb) = connected(
        Host::with_library(1 << 20, 16 * 1024),
        Host::with_library(1 << 20, 16 * 1024),
    );
    let len = 300 * KIB;
    let mut src = Buf::new(512 * KIB);
    let mut dst = Buf::new(512 * KIB);
    fill(&mut src, 9);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(&mut dst, IBV_ACCESS_LOCAL_WRITE);
    let (slkey, _) = keys(smr);
    let (dlkey, _) = keys(dmr);
    let (a_before, b_before) = (a.pinned(), b.pinned());
    let mut rs = [sge(&dst, 10 * KIB, len, dlkey)];
    assert_eq!(post_recv(qb, &mut recv_wr(41, &mut rs)), 0);
    let mut ss = [sge(&src, 3 * KIB, len, slkey)];
    assert_eq!(post_send(qa, &mut send_wr(42, &mut ss)).0, 0);
    let wa = poll(a.cq, 1);
    assert_eq!((wa[0].wr_id, wa[0].status), (42, IBV_WC_SUCCESS));
    let wb = poll(b.cq, 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].byte_len),
        (41, IBV_WC_SUCCESS, len as u32)
    );
    assert_eq!(&dst[10 * KIB..10 * KIB + len], &src[3 * KIB..3 * KIB + len]);
    for h in [&a, &b] {
        let r = h.eng().status().page().report();
        assert_eq!((r.fallback_pins, r.fallback_bytes), (1, 0), "{r:?}");
        assert!(
            r.reasons
                .iter()
                .any(|s| s.contains("pinned as plain verbs"))
        );
    }
    // The pins went with the completions.
    assert_eq!((a.pinned(), b.pinned()), (a_before, b_before));
}

/// A receive pool larger than the budget: posted receives hold their windows until a message
/// arrives, so the receives beyond the budget cannot get windows. Plain verbs accept them (the
/// memory is registered); the library pins them outside the budget instead of failing with
/// ENOMEM, and the budget itself still holds.
#[test]
fn posted_receives_beyond_the_budget_are_pinned_not_refused() {
    let (a, b, qa, qb) = connected(
        Host::with_library(64 * 1024, 16 * 1024),
        Host::with_library(64 * 1024, 16 * 1024),
    );
    let mut buf = Buf::new(1 << 20);
    let mut src = Buf::new(16 * KIB);
    fill(&mut src, 2);
    let bmr = b.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    let amr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let (bl, _) = keys(bmr);
    let (al, _) = keys(amr);
    // Start at a window boundary so that each receive needs exactly one 16 KiB window.
    let base = (buf.as_ptr() as usize).next_multiple_of(16 * KIB) - buf.as_ptr() as usize;
    for i in 0..8usize {
        let mut rs = [sge(&buf, base + i * 64 * KIB, 16 * KIB, bl)];
        assert_eq!(
            post_recv(qb, &mut recv_wr(i as u64, &mut rs)),
            0,
            "receive {i}"
        );
    }
    // 64 KiB budget, a 4 KiB directory: three 16 KiB windows fit; the other five are pinned.
    let r = b.eng().status().page().report();
    assert_eq!(r.fallback_pins, 5, "{r:?}");
    assert_eq!(r.fallback_bytes, 5 * 16 * 1024);
    assert!(r.pinned_peak <= 64 * 1024);
    for i in 0..8u64 {
        let mut ss = [sge(&src, 0, 16 * KIB, al)];
        assert_eq!(post_send(qa, &mut send_wr(100 + i, &mut ss)).0, 0);
    }
    assert_eq!(poll(a.cq, 8).len(), 8);
    let wb = poll(b.cq, 8);
    let ids: Vec<u64> = wb.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..8).collect::<Vec<_>>());
    assert!(wb.iter().all(|w| w.status == IBV_WC_SUCCESS));
    for i in 0..8usize {
        let at = base + i * 64 * KIB;
        assert_eq!(&buf[at..at + 16 * KIB], &src[..], "receive {i}");
    }
    assert_eq!(b.eng().status().page().report().fallback_bytes, 0);
}

/// A QP of `qp_type` on `h` (64 WRs, 2 SGEs each way).
fn create_qp_of(h: &Host, qp_type: u32) -> *mut ibv_qp {
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
        qp_type,
        sq_sig_all: 0,
    };
    // SAFETY: a live PD and attributes.
    let qp = unsafe {
        match &h.eng {
            Some(e) => nprdma::interpose::create_qp(e, h.pd, &mut attr),
            None => (nprdma::fake::real_verbs().create_qp)(h.pd, &mut attr),
        }
    };
    assert!(!qp.is_null());
    qp
}

/// `ib_write_lat -c UC`: both sides register their buffer, then create a UC QP, then tell the
/// peer `mr->rkey`. The peer protocol needs RC, so the library passes UC through: the regions
/// of a PD with a UC QP are registered whole and the application's MR shows the whole
/// registration's keys. Before, the WRITE went to the directory's rkey and, on a real UC QP,
/// landed nowhere (both sides hung).
#[test]
fn rdma_write_on_a_uc_qp_reaches_the_peers_memory() {
    let a = Host::with_library(1 << 20, 16 * 1024);
    let b = Host::with_library(1 << 20, 16 * 1024);
    let mut src = Buf::new(256 * KIB);
    let mut dst = Buf::new(256 * KIB);
    fill(&mut src, 4);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let dir_rkey = keys(dmr).1;
    let qa = create_qp_of(&a, IBV_QPT_UC);
    let qb = create_qp_of(&b, IBV_QPT_UC);
    connect(&a, qa, &b, qb);
    // Read after the QPs exist, as perftest does.
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    assert_ne!(
        drkey, dir_rkey,
        "the MR shows the whole registration's rkey"
    );
    let len = 100 * KIB;
    let mut s = [sge(&src, 5 * KIB, len, slkey)];
    let raddr = dst.as_ptr() as u64 + 20 * KIB as u64;
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 7, &mut s, raddr, drkey, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (7, IBV_WC_SUCCESS));
    assert_eq!(&dst[20 * KIB..20 * KIB + len], &src[5 * KIB..5 * KIB + len]);
    // A region registered later in that PD is passed through.
    let mut more = Buf::new(64 * KIB);
    let mmr = b.reg(&mut more, ALL_ACCESS);
    let r = b.eng().status().page().report();
    assert!(r.reasons.iter().any(|s| s.contains("UC QP")), "{r:?}");
    assert_eq!(r.passthrough_bytes, (256 + 64) as u64 * 1024);
    // Deregistration gives the whole registrations back.
    assert_eq!(b.dereg(dmr), 0);
    assert_eq!(b.dereg(mmr), 0);
    assert_eq!(b.eng().status().page().report().passthrough_bytes, 0);
}

/// A READ split over the peer's windows completes once, and its `byte_len` counts the whole
/// READ as on plain verbs (ibv_poll_cq(3): relevant for RDMA READ), not its last part.
#[test]
fn a_split_read_reports_the_whole_byte_len() {
    let (a, b, qa, _qb) = connected(
        Host::with_library(1 << 20, 16 * 1024),
        Host::with_library(1 << 20, 16 * 1024),
    );
    let mut local = Buf::new(256 * KIB);
    let mut remote = Buf::new(256 * KIB);
    fill(&mut remote, 6);
    let lmr = a.reg(&mut local, IBV_ACCESS_LOCAL_WRITE);
    let rmr = b.reg(&mut remote, ALL_ACCESS);
    let len = 100 * KIB + 123;
    let mut s = [sge(&local, 0, len, keys(lmr).0)];
    let raddr = remote.as_ptr() as u64 + 7 * KIB as u64;
    let mut wr = rdma(IBV_WR_RDMA_READ, 9, &mut s, raddr, keys(rmr).1, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode, wc[0].byte_len),
        (9, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, len as u32)
    );
    assert_eq!(&local[..len], &remote[7 * KIB..7 * KIB + len]);
}
