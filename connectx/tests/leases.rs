//! The library at its limits: the owner's count of leased bytes (docs/connectx.md §5.5: leases
//! may hold at most three quarters of the budget, so that local work always finds room) across
//! re-registration of a leased region; a split WR whose later remote window is refused, or
//! whose later part needs the windows of its own earlier parts; a QP reset and reconnected
//! after its leases ended; more simultaneous first touches than the request ring has slots.

mod common;

use common::*;
use nprdma::sys::*;

const KIB: usize = 1024;
const W: usize = 64 * KIB;

fn host(budget: u64, window: u64, timeout_ms: u64) -> Host {
    let mut cfg = nprdma::Config::for_tests(budget, window);
    cfg.remote_timeout_ms = timeout_ms;
    Host::with_config(cfg)
}

/// A signaled 8-byte WRITE from `src` to `raddr`, polled to its completion.
fn write8(
    a: &Host,
    qa: *mut ibv_qp,
    src: &Buf,
    smr: *mut ibv_mr,
    raddr: u64,
    rkey: u32,
    id: u64,
) -> ibv_wc {
    let mut s = [sge(src, 0, 8, keys(smr).0)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, raddr, rkey, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!(wc.len(), 1, "no completion for {id}");
    wc[0]
}

#[test]
fn rereg_of_a_leased_region_gives_its_lease_bytes_back() {
    let a = host(4 << 20, W as u64, 300);
    let b = host(1 << 20, W as u64, 300);
    let qa1 = a.create_qp(false);
    let qb1 = b.create_qp(false);
    connect(&a, qa1, &b, qb1);
    let mut src = Buf::new(64 * KIB);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let mut dst = Buf::new(1 << 20);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let a0 = (dst.as_ptr() as u64).next_multiple_of(W as u64);
    // Twelve windows leased: three quarters of B's budget, the most leases may hold.
    for k in 0..12u64 {
        let wc = write8(&a, qa1, &src, smr, a0 + k * W as u64, rkey, k);
        assert_eq!(wc.status, IBV_WC_SUCCESS);
    }
    // SAFETY: live MR; same access.
    let rc = unsafe {
        nprdma::interpose::rereg_mr(
            b.eng(),
            dmr,
            IBV_REREG_MR_CHANGE_ACCESS,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            0,
            ALL_ACCESS as i32,
        )
    };
    assert_eq!(rc, 0);
    // A fresh region and a fresh connection.
    let qa2 = a.create_qp(false);
    let qb2 = b.create_qp(false);
    connect(&a, qa2, &b, qb2);
    let mut dst2 = Buf::new(64 * KIB);
    let dmr2 = b.reg(&mut dst2, ALL_ACCESS);
    let wc = write8(&a, qa2, &src, smr, dst2.as_ptr() as u64, keys(dmr2).1, 999);
    assert_eq!(
        wc.status, IBV_WC_SUCCESS,
        "B has room, yet the lease is refused"
    );
}

/// A split WRITE whose second remote window is refused (Busy until the timeout) after the
/// first part already completed: the application should see one error completion.
#[test]
fn a_split_write_whose_later_lease_is_refused_completes_once_in_error() {
    let a = host(4 << 20, W as u64, 300);
    let b = host(1 << 20, W as u64, 300);
    let qa1 = a.create_qp(false);
    let qb1 = b.create_qp(false);
    let qa2 = a.create_qp(false);
    let qb2 = b.create_qp(false);
    connect(&a, qa1, &b, qb1);
    connect(&a, qa2, &b, qb2);
    let mut src = Buf::new(64 * KIB);
    fill(&mut src, 1);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let mut dst = Buf::new(1 << 20);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let base = dst.as_ptr() as u64;
    let a0 = base.next_multiple_of(W as u64);
    // Connection 2 leases windows 0..11 = 768 KiB = 3/4 of B's budget.
    for k in 0..12u64 {
        let wc = write8(&a, qa2, &src, smr, a0 + k * W as u64, rkey, 100 + k);
        assert_eq!(wc.status, IBV_WC_SUCCESS, "setup lease {k}");
    }
    // Connection 1 shares window 11 (no new bytes).
    let wc = write8(&a, qa1, &src, smr, a0 + 11 * W as u64, rkey, 200);
    assert_eq!(wc.status, IBV_WC_SUCCESS);
    // A signaled 64-byte WRITE from window 11 into window 12 (not leased by anyone).
    let mut s = [sge(&src, 0, 64, keys(smr).0)];
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        0x77,
        &mut s,
        a0 + 12 * W as u64 - 32,
        rkey,
        true,
    );
    let (rc, _) = post_send(qa1, &mut wr);
    // The first part (window 11) went out and completed before the lease of window 12 was
    // refused: the WR was posted (0), and it completes exactly once, in error, on a QP in
    // error, as a responder's refusal would on plain verbs.
    assert_eq!(rc, 0);
    let wcs = poll(a.cq, 1);
    let seen: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(seen, [(0x77, IBV_WC_REM_OP_ERR)]);
    assert_eq!(qp_state(qa1), IBV_QPS_ERR);
    assert!(poll_rest(a.cq).is_empty(), "reported twice");
}

#[test]
fn a_qp_reset_and_reconnected_asks_for_its_leases_again() {
    let a = host(4 << 20, W as u64, 300);
    let b = host(256 * 1024, W as u64, 300);
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let mut src = Buf::new(64 * KIB);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let mut dst = Buf::new(128 * KIB);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let a0 = (dst.as_ptr() as u64).next_multiple_of(W as u64);
    let wc = write8(&a, qa, &src, smr, a0, rkey, 1);
    assert_eq!(wc.status, IBV_WC_SUCCESS);
    // Both ends reset and reconnect (same QPs, same numbers): B ends A's leases.
    let mut reset = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(b.modify(qb, &mut reset, IBV_QP_STATE), 0);
    let mut reset = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(a.modify(qa, &mut reset, IBV_QP_STATE), 0);
    connect(&a, qa, &b, qb);
    // A's old window key for `a0` died with the lease the reset ended (B may evict the idle
    // window at any time): the WRITE must ask B for a lease again, not use the stale key.
    let granted = || b.eng().status().page().report().leases_granted;
    let before = granted();
    let wc = write8(&a, qa, &src, smr, a0, rkey, 2);
    assert_eq!(wc.status, IBV_WC_SUCCESS);
    assert_eq!(granted(), before + 1, "the WRITE used the ended lease");
}

/// A QP pointer handed to a thread (the fake and the library are thread-safe).
struct SendPtr(*mut ibv_qp);
// SAFETY: verbs objects may be used from any thread; the test joins every thread before the
// QPs go away.
unsafe impl Send for SendPtr {}
// SAFETY: as for Send.
unsafe impl Sync for SendPtr {}

#[test]
fn more_first_touches_at_once_than_ring_slots_all_get_their_leases() {
    // 120 connections first-touch one region at the same moment: tickets run past the ring's
    // 64 slots, so a requester asleep between polls can find its slot holding a later
    // ticket's answer. It must ask again, not time out and fail its WR.
    let n = 120;
    let a = host(64 << 20, W as u64, 3000);
    let b = host(64 << 20, W as u64, 3000);
    let qas: Vec<SendPtr> = (0..n)
        .map(|_| {
            let qa = a.create_qp(false);
            let qb = b.create_qp(false);
            connect(&a, qa, &b, qb);
            SendPtr(qa)
        })
        .collect();
    let mut src = Buf::new(64 * KIB);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let mut dst = Buf::new(8 << 20);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let d0 = (dst.as_ptr() as u64).next_multiple_of(W as u64);
    let lkey = keys(smr).0;
    let sp = src.as_ptr() as u64;
    let barrier = std::sync::Barrier::new(n);
    let posted: Vec<i32> = std::thread::scope(|s| {
        let threads: Vec<_> = qas
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut sg = [ibv_sge {
                        addr: sp,
                        length: 8,
                        lkey,
                    }];
                    let raddr = d0 + (i * W) as u64;
                    let mut wr = rdma(IBV_WR_RDMA_WRITE, i as u64, &mut sg, raddr, rkey, true);
                    barrier.wait();
                    post_send(q.0, &mut wr).0
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(posted.iter().all(|rc| *rc == 0), "{posted:?}");
    let wcs = poll(a.cq, n);
    assert_eq!(wcs.len(), n);
    let failed: Vec<_> = wcs
        .iter()
        .filter(|w| w.status != IBV_WC_SUCCESS)
        .map(|w| (w.wr_id, w.status))
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
fn a_split_write_waits_for_its_own_earlier_parts_to_free_room() {
    let a = host(4 * W as u64 + 8 * KIB as u64, W as u64, 300);
    let b = host(8 << 20, W as u64, 300);
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let mut src = Buf::new(1 << 20);
    fill(&mut src, 1);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let mut dst = Buf::new(1 << 20);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let so = (src.as_ptr() as usize).next_multiple_of(W) - src.as_ptr() as usize;
    let d0 = (dst.as_ptr() as u64).next_multiple_of(W as u64);
    let sp = src.as_ptr() as u64 + so as u64;
    let post3 = |id: u64| {
        let mut s = [ibv_sge {
            addr: sp,
            length: (3 * W) as u32,
            lkey: keys(smr).0,
        }];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, d0, rkey, true);
        post_send(qa, &mut wr).0
    };
    // First pass: leases are taken one by one (each request retires the parts before it).
    assert_eq!(post3(1), 0);
    let wc = poll(a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, IBV_WC_SUCCESS));
    // Two receives keep two of A's four windows.
    for i in 0..2usize {
        let mut rs = [ibv_sge {
            addr: sp + ((4 + i) * W) as u64,
            length: W as u32,
            lkey: keys(smr).0,
        }];
        let mut r = ibv_recv_wr {
            wr_id: 50 + i as u64,
            next: core::ptr::null_mut(),
            sg_list: rs.as_mut_ptr(),
            num_sge: 1,
        };
        assert_eq!(post_recv(qa, &mut r), 0);
    }
    // New data, same WR.
    fill(&mut src, 2);
    let want = src[so..so + 3 * W].to_vec();
    // Two windows free for a WR of three: the third part needs a window the first parts still
    // use, and those are unsignaled. The post must get them back (a signaled WR of the
    // library's behind them) and carry out the whole WR, not wait 10 s and fail it half done.
    let t = std::time::Instant::now();
    let rc = post3(2);
    let waited = t.elapsed();
    let landed = (0..3)
        .map(|k| {
            let off = (d0 - dst.as_ptr() as u64) as usize + k * W;
            dst[off..off + W] == want[k * W..(k + 1) * W]
        })
        .collect::<Vec<_>>();
    assert_eq!(rc, 0, "after {waited:?}");
    assert!(waited < std::time::Duration::from_secs(5), "{waited:?}");
    assert_eq!(landed, [true, true, true]);
    let wcs = poll(a.cq, 1);
    let seen: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(seen, [(2, IBV_WC_SUCCESS)]);
}

/// A hostile peer (no library, holding the region's rkey) on a connection of its own.
struct Hostile {
    p: Host,
    buf: Buf,
    mr: *mut ibv_mr,
}

impl Hostile {
    fn new() -> Self {
        let p = Host::plain();
        let mut buf = Buf::new(4096);
        let mr = p.reg(&mut buf, ALL_ACCESS);
        Self { p, buf, mr }
    }

    /// One RDMA operation of `len` bytes from/to its buffer at offset 0, on a fresh
    /// connection to `b` (an access error puts the connection in error); its status.
    fn op(&mut self, b: &Host, opcode: u32, raddr: u64, rkey: u32, len: usize) -> u32 {
        let qp = self.p.create_qp(false);
        let qb = b.create_qp(false);
        connect(&self.p, qp, b, qb);
        let mut s = [sge(&self.buf, 0, len, keys(self.mr).0)];
        let mut wr = rdma(opcode, 1, &mut s, raddr, rkey, true);
        assert_eq!(post_send(qp, &mut wr).0, 0);
        poll(self.p.cq, 1)[0].status
    }
}

/// The directory is read-only to peers (docs/connectx.md §5, "Who can read and write
/// what"): a peer holding the region's rkey cannot rewrite the SERVED word, a window entry, an
/// answer or the header, of a region with every remote right or of a read-only one; it may
/// write only the request ring, where garbage is ignored. Honest requesters go on unaffected.
#[test]
fn a_hostile_peer_cannot_rewrite_the_directory_and_its_garbage_hurts_no_one() {
    let a = host(4 << 20, W as u64, 300);
    let b = host(1 << 20, W as u64, 300);
    let mut evil = Hostile::new();
    let mut dst = Buf::new(256 * KIB);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let rkey = keys(dmr).1;
    let mut ro = Buf::new(256 * KIB);
    fill(&mut ro, 9);
    let romr = b.reg(&mut ro, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    let ro_rkey = keys(romr).1;

    // An honest first touch, so that a window entry and an answer exist.
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let mut src = Buf::new(64 * KIB);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let d0 = dst.as_ptr() as u64;
    assert_eq!(
        write8(&a, qa, &src, smr, d0, rkey, 1).status,
        IBV_WC_SUCCESS
    );

    // The header, read as any peer may.
    assert_eq!(evil.op(&b, IBV_WR_RDMA_READ, 0, rkey, 128), IBV_WC_SUCCESS);
    let header = nprdma::directory::DirHeader::decode(&evil.buf[..128]).unwrap();
    // Every attempt to write the directory is refused by the NIC: the SERVED word (56), the
    // header's ring key (80), the first answer, the first window entry; also for the
    // read-only region's directory.
    evil.buf[..8].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    for (what, off) in [
        ("served word", 56),
        ("ring key", 80),
        ("answer", header.answer_off(0)),
        ("window entry", header.entry_off(0)),
    ] {
        assert_eq!(
            evil.op(&b, IBV_WR_RDMA_WRITE, off, rkey, 8),
            IBV_WC_REM_ACCESS_ERR,
            "the peer wrote the {what}"
        );
        assert_eq!(
            evil.op(&b, IBV_WR_RDMA_WRITE, off, ro_rkey, 8),
            IBV_WC_REM_ACCESS_ERR,
            "the peer wrote the read-only region's {what}"
        );
    }
    // It may write the request ring (the ring MR): garbage in every slot is ignored.
    evil.buf.fill(0xa5);
    for t in 0..header.slots() {
        assert_eq!(
            evil.op(
                &b,
                IBV_WR_RDMA_WRITE,
                header.request_off(t),
                header.ring_rkey,
                64
            ),
            IBV_WC_SUCCESS
        );
    }

    // Honest requesters: more first touches, and a READ of the read-only region, all served
    // with the owner's bytes.
    for k in 1..3u64 {
        let raddr = d0 + k * W as u64;
        let wc = write8(&a, qa, &src, smr, raddr, rkey, 10 + k);
        assert_eq!(wc.status, IBV_WC_SUCCESS, "first touch {k}");
    }
    let mut s = [sge(&src, 0, 4096, keys(smr).0)];
    let mut wr = rdma(
        IBV_WR_RDMA_READ,
        20,
        &mut s,
        ro.as_ptr() as u64,
        ro_rkey,
        true,
    );
    assert_eq!(post_send(qa, &mut wr).0, 0);
    assert_eq!(poll(a.cq, 1)[0].status, IBV_WC_SUCCESS);
    assert_eq!(src[..4096], ro[..4096]);
}
