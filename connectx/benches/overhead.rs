//! Per-work-request cost of the library on the fake provider: the same ping (a signaled
//! 8-byte RDMA WRITE, then polling for its completion) through the fake alone and through the
//! library at a warm cache. The difference is the library's CPU cost per WR (the fake's own
//! cost is in both). Printed, not asserted: `cargo bench -p connectx --bench overhead`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use nprdma::sys::*;

fn measure(a: &Host, qa: *mut ibv_qp, src: &mut Buf, b: &Host, dst: &mut Buf, n: u64) -> f64 {
    let smr = a.reg(src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(dst, ALL_ACCESS);
    let (sl, _) = keys(smr);
    let (_, dr) = keys(dmr);
    let run = |count: u64| {
        let t = Instant::now();
        for i in 0..count {
            let mut s = [sge(src, 64, 8, sl)];
            let mut wr = rdma(
                IBV_WR_RDMA_WRITE,
                i,
                &mut s,
                dst.as_ptr() as u64 + 128,
                dr,
                true,
            );
            let mut bad = core::ptr::null_mut();
            // SAFETY: the inline ibv_post_send.
            let rc = unsafe { ((*(*qa).context).ops.post_send.unwrap())(qa, &mut wr, &mut bad) };
            assert_eq!(rc, 0);
            let mut wc = ibv_wc::default();
            loop {
                // SAFETY: the inline ibv_poll_cq.
                let k = unsafe {
                    ((*a.cq).context.as_ref().unwrap().ops.poll_cq.unwrap())(a.cq, 1, &mut wc)
                };
                if k == 1 {
                    break;
                }
            }
            assert_eq!((wc.wr_id, wc.status), (i, IBV_WC_SUCCESS));
        }
        t.elapsed().as_nanos() as f64 / count as f64
    };
    run(1000); // warm: windows registered, leases held
    run(n)
}

fn main() {
    let n = std::env::var("NPRDMA_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let (pa, pb) = (Host::plain(), Host::plain());
    let (qa, qb) = (pa.create_qp(false), pb.create_qp(false));
    connect(&pa, qa, &pb, qb);
    let (mut s1, mut d1) = (Buf::new(1 << 20), Buf::new(1 << 20));
    let plain = measure(&pa, qa, &mut s1, &pb, &mut d1, n);

    let (la, lb) = (
        Host::with_library(64 << 20, 1 << 20),
        Host::with_library(64 << 20, 1 << 20),
    );
    let (qa, qb) = (la.create_qp(false), lb.create_qp(false));
    connect(&la, qa, &lb, qb);
    let (mut s2, mut d2) = (Buf::new(1 << 20), Buf::new(1 << 20));
    let lib = measure(&la, qa, &mut s2, &lb, &mut d2, n);
    println!("fake provider alone : {plain:8.0} ns per WRITE + completion");
    println!("through the library : {lib:8.0} ns per WRITE + completion");
    println!(
        "library cost        : {:8.0} ns per work request ({:.2}x)",
        lib - plain,
        lib / plain
    );
}
