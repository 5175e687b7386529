//! Per-work-request cost of the library on the fake provider: the same ping (a signaled
//! 8-byte RDMA WRITE, then polling for its completion) through the fake alone and through the
//! library at a warm cache. The difference is the library's CPU cost per WR (the fake's own
//! cost is in both), three ways: `ibv_post_send` with an SGE, `ibv_post_send` with an inline
//! payload (`ib_write_lat --use_old_post_send`), and the `ibv_wr_*` builder API with an inline
//! payload (how perftest 4.5's `ib_write_lat` posts by default). Printed, not asserted:
//! `cargo bench -p connectx --bench overhead`. With `NPRDMA_BENCH_NULL=1` the two
//! `ibv_post_send` pings run on the fake's null data path (see [`null_provider`]).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::*;
use nprdma::sys::*;

/// With `NPRDMA_BENCH_SYSCALL` set, enters the kernel once per iteration (a cheap system
/// call), as a real provider's post does (rxe rings its doorbell with a `write`): where the
/// kernel switches page tables on entry (page-table isolation) or an emulator flushes its
/// translation cache then, every page the data path touches must be looked up again.
fn enter_kernel() {
    static ON: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| std::env::var_os("NPRDMA_BENCH_SYSCALL").is_some());
    if *ON {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
}

/// Polls `a`'s CQ (the inline ibv_poll_cq) until one completion arrives; checks it is WR `i`'s
/// success.
fn await_completion(a: &Host, i: u64) {
    let mut wc = ibv_wc::default();
    loop {
        // SAFETY: the inline ibv_poll_cq.
        let k =
            unsafe { ((*a.cq).context.as_ref().unwrap().ops.poll_cq.unwrap())(a.cq, 1, &mut wc) };
        if k == 1 {
            break;
        }
    }
    assert_eq!((wc.wr_id, wc.status), (i, IBV_WC_SUCCESS));
}

fn measure(
    a: &Host,
    qa: *mut ibv_qp,
    src: &mut Buf,
    b: &Host,
    dst: &mut Buf,
    n: u64,
    inline: bool,
) -> f64 {
    let smr = a.reg(src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = b.reg(dst, ALL_ACCESS);
    let (sl, _) = keys(smr);
    let (_, dr) = keys(dmr);
    let run = |count: u64| {
        let t = Instant::now();
        for i in 0..count {
            enter_kernel();
            let mut s = [sge(src, 64, 8, sl)];
            let mut wr = rdma(
                IBV_WR_RDMA_WRITE,
                i,
                &mut s,
                dst.as_ptr() as u64 + 128,
                dr,
                true,
            );
            if inline {
                wr.send_flags |= IBV_SEND_INLINE;
            }
            let mut bad = core::ptr::null_mut();
            // SAFETY: the inline ibv_post_send.
            let rc = unsafe { ((*(*qa).context).ops.post_send.unwrap())(qa, &mut wr, &mut bad) };
            assert_eq!(rc, 0);
            await_completion(a, i);
        }
        t.elapsed().as_nanos() as f64 / count as f64
    };
    run(1000); // warm: windows registered, leases held
    if null_provider() {
        nprdma::fake::set_null_data_path(true);
    }
    let t = run(n);
    nprdma::fake::set_null_data_path(false);
    t
}

/// With `NPRDMA_BENCH_NULL` set, the measured loop runs on the fake's null data path (after the
/// warm-up on the full fake): the provider then costs next to nothing, and the difference with
/// and without the library is the library's own cost, with less noise.
fn null_provider() -> bool {
    std::env::var_os("NPRDMA_BENCH_NULL").is_some()
}

/// The same ping through the `ibv_wr_*` builder API (what perftest 4.5 uses by default), with
/// the payload inline as `ib_write_lat` sends it: start, rdma_write, set_inline_data, complete.
fn measure_wr_api(a: &Host, qa: *mut ibv_qp, src: &Buf, b: &Host, dst: &mut Buf, n: u64) -> f64 {
    let dmr = b.reg(dst, ALL_ACCESS);
    let (_, dr) = keys(dmr);
    let qpx = qa.cast::<ibv_qp_ex>();
    let run = |count: u64| {
        let t = Instant::now();
        for i in 0..count {
            enter_kernel();
            // SAFETY: what ibv_wr_start / ibv_wr_rdma_write / ibv_wr_set_inline_data /
            // ibv_wr_complete do with the QP's ibv_qp_ex.
            let rc = unsafe {
                let q = &mut *qpx;
                (q.wr_start.unwrap())(qpx);
                q.wr_id = i;
                q.wr_flags = IBV_SEND_SIGNALED;
                (q.wr_rdma_write.unwrap())(qpx, dr, dst.as_ptr() as u64 + 128);
                (q.wr_set_inline_data.unwrap())(qpx, src.as_ptr().add(64) as *mut _, 8);
                (q.wr_complete.unwrap())(qpx)
            };
            assert_eq!(rc, 0);
            await_completion(a, i);
        }
        t.elapsed().as_nanos() as f64 / count as f64
    };
    run(1000);
    run(n)
}

fn main() {
    let n = std::env::var("NPRDMA_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // NPRDMA_BENCH_ONLY=plain|lib|plain-inline|lib-inline|plain-wr|wr runs one configuration (for
    // instruction counts under callgrind, where the others would only add to the profile).
    let only = std::env::var("NPRDMA_BENCH_ONLY").unwrap_or_default();
    let want = |k: &str| only.is_empty() || only == k;
    let legacy = |library: bool, inline: bool| {
        let (a, b) = if library {
            (
                Host::with_library(64 << 20, 1 << 20),
                Host::with_library(64 << 20, 1 << 20),
            )
        } else {
            (Host::plain(), Host::plain())
        };
        let (qa, qb) = (a.create_qp(false), b.create_qp(false));
        connect(&a, qa, &b, qb);
        let (mut s, mut d) = (Buf::new(1 << 20), Buf::new(1 << 20));
        measure(&a, qa, &mut s, &b, &mut d, n, inline)
    };
    let pairs = [
        ("an SGE", "plain", "lib", false),
        ("an inline payload", "plain-inline", "lib-inline", true),
    ];
    for (what, plain_key, lib_key, inline) in pairs {
        let plain = want(plain_key).then(|| legacy(false, inline));
        let lib = want(lib_key).then(|| legacy(true, inline));
        if let Some(p) = plain {
            println!(
                "ibv_post_send, {what:17}: {} {p:6.0} ns per WRITE + completion",
                if null_provider() {
                    "null provider alone"
                } else {
                    "fake provider alone"
                }
            );
        }
        if let Some(l) = lib {
            println!(
                "ibv_post_send, {what:17}: through the library  {l:6.0} ns per WRITE + completion"
            );
        }
        if let (Some(p), Some(l)) = (plain, lib) {
            println!(
                "ibv_post_send, {what:17}: library cost         {:6.0} ns per work request ({:.2}x)",
                l - p,
                l / p
            );
        }
    }
    let builder = |library: bool| {
        let (xa, xb) = if library {
            (
                Host::with_library(64 << 20, 1 << 20),
                Host::with_library(64 << 20, 1 << 20),
            )
        } else {
            (Host::plain(), Host::plain())
        };
        let (qa, qb) = (xa.create_qp_ex(), xb.create_qp(false));
        connect(&xa, qa, &xb, qb);
        let (s3, mut d3) = (Buf::new(1 << 20), Buf::new(1 << 20));
        measure_wr_api(&xa, qa, &s3, &xb, &mut d3, n)
    };
    let plain = want("plain-wr").then(|| builder(false));
    let lib = want("wr").then(|| builder(true));
    let what = "ibv_wr_*, an inline payload";
    if let Some(p) = plain {
        println!("{what:32}: fake provider alone {p:6.0} ns per WRITE + completion");
    }
    if let Some(l) = lib {
        println!("{what:32}: through the library  {l:6.0} ns per WRITE + completion");
    }
    if let (Some(p), Some(l)) = (plain, lib) {
        println!(
            "{what:32}: library cost         {:6.0} ns per work request ({:.2}x)",
            l - p,
            l / p
        );
    }
}
