//! The helper thread: it works for a device opened by any thread, and it keeps the signals
//! meant for the application's threads off itself.

mod common;

use common::*;
use nprdma::sys::*;

/// A WRITE of 8 bytes into `b`'s region at `raddr`, polled to its completion on `a`.
fn write8(a: &Host, qa: *mut ibv_qp, src: &Buf, lkey: u32, raddr: u64, rkey: u32, id: u64) -> u32 {
    let mut s = [sge(src, 0, 8, lkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, raddr, rkey, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].wr_id, id);
    wc[0].status
}

#[test]
fn a_device_opened_by_a_thread_with_its_own_descriptor_table_is_managed() {
    // A thread that left the process's descriptor table (unshare(CLONE_FILES)) opens the
    // device and registers: the library manages the region (no pinning fallback) and the
    // helper serves a peer's WRITE into it.
    std::thread::spawn(|| {
        // SAFETY: unshare(2) changes only this thread's descriptor table.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_FILES) }, 0);
        let a = Host::with_library(1 << 20, 64 * 1024);
        let b = Host::with_library(1 << 20, 64 * 1024);
        let mut src = Buf::new(4096);
        fill(&mut src, 3);
        let smr = a.reg(&mut src, ALL_ACCESS);
        let lkey = keys(smr).0;
        let mut dst = Buf::new(256 * 1024);
        let dmr = b.reg(&mut dst, ALL_ACCESS);
        assert!(!dmr.is_null());
        let rkey = keys(dmr).1;
        let r = b.eng().status().page().report();
        assert_eq!((r.registered_bytes, r.passthrough_bytes), (256 * 1024, 0));
        let (qa, qb) = (a.create_qp(false), b.create_qp(false));
        connect(&a, qa, &b, qb);
        let status = write8(
            &a,
            qa,
            &src,
            lkey,
            dst.as_ptr() as u64 + 128 * 1024,
            rkey,
            1,
        );
        assert_eq!(status, IBV_WC_SUCCESS);
        assert_eq!(&dst[128 * 1024..128 * 1024 + 8], &src[..8]);
    })
    .join()
    .unwrap();
}

#[test]
fn the_helper_thread_blocks_the_signals_meant_for_the_application() {
    let b = Host::with_library(1 << 20, 64 * 1024);
    let mut dst = Buf::new(64 * 1024);
    let mr = b.reg(&mut dst, ALL_ACCESS);
    assert!(!mr.is_null());
    // The registration with remote access started the helper; find it by its name.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let blocked = loop {
        let found: Vec<u64> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim() == "nprdma-helper")
            })
            .filter_map(|t| {
                let status = std::fs::read_to_string(t.path().join("status")).ok()?;
                let line = status.lines().find(|l| l.starts_with("SigBlk:"))?;
                u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).ok()
            })
            .collect();
        if !found.is_empty() {
            break found;
        }
        assert!(std::time::Instant::now() < deadline, "no helper thread");
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    for mask in blocked {
        for sig in [
            libc::SIGTERM,
            libc::SIGCHLD,
            libc::SIGALRM,
            libc::SIGUSR1,
            libc::SIGIO,
        ] {
            assert_ne!(
                mask & (1 << (sig - 1)),
                0,
                "signal {sig} not blocked: {mask:#x}"
            );
        }
    }
    assert_eq!(b.dereg(mr), 0);
}
