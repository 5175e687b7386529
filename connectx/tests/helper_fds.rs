//! The helper thread's private descriptor table (docs/connectx.md §5, `fdtable.rs`) where the
//! process's table is not what it expects: a device opened by a thread with a table of its own,
//! and a helper that finds the contexts' descriptors gone from the process's table.

mod common;

use common::*;
use nprdma::sys::*;

/// Gives the calling thread a descriptor table of its own holding only `keep`.
fn private_table_keeping(keep: &[i32]) {
    // SAFETY: unshare(2) and close_range(2) change only this thread's table.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_FILES), 0);
        let mut from = 0u32;
        let mut keep: Vec<u32> = keep.iter().map(|&k| k as u32).collect();
        keep.sort_unstable();
        for k in keep {
            if k > from {
                libc::syscall(libc::SYS_close_range, from, k - 1, 0u32);
            }
            from = k + 1;
        }
        libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32);
    }
}

#[test]
fn a_device_opened_by_a_thread_with_its_own_table_is_in_pass_through() {
    std::thread::spawn(|| {
        private_table_keeping(&[]);
        let h = Host::with_library(1 << 20, 64 * 1024);
        let mut buf = Buf::new(256 * 1024);
        let mr = h.reg(&mut buf, ALL_ACCESS);
        assert!(!mr.is_null());
        let r = h.eng().status().page().report();
        assert_eq!((r.registered_bytes, r.passthrough_bytes), (0, 256 * 1024));
        assert!(
            r.reasons
                .iter()
                .any(|w| w.contains("is not the first thread's")),
            "{:?}",
            r.reasons
        );
        assert_eq!(h.dereg(mr), 0);
    })
    .join()
    .unwrap();
}

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
fn a_helper_that_cannot_borrow_stops_and_the_next_one_shares_the_table() {
    std::thread::spawn(|| {
        let host = || {
            let mut cfg = nprdma::Config::for_tests(1 << 20, 64 * 1024);
            cfg.remote_timeout_ms = 300;
            Host::with_config(cfg)
        };
        let a = host();
        let b = host();
        // B's command descriptor at a high number, which no other descriptor of this process
        // will take while the test runs (numbers are handed out lowest first).
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is writable.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        let high = (limit.rlim_cur.min(4096) - 1) as i32;
        // SAFETY: b's live context; `high` is free.
        assert_eq!(unsafe { nprdma::fake::move_cmd_fd(b.ctx, high) }, high);
        // SAFETY: live contexts.
        let a_fd = unsafe { (*a.ctx).cmd_fd };
        let mut src = Buf::new(4096);
        let smr = a.reg(&mut src, ALL_ACCESS);
        let lkey = keys(smr).0;
        // B's helper starts here, while this thread still uses the process's table, and
        // leaves it.
        let mut dst = Buf::new(64 * 1024);
        let dmr = b.reg(&mut dst, ALL_ACCESS);
        let rkey = keys(dmr).1;
        let (qa, qb) = (a.create_qp(false), b.create_qp(false));
        connect(&a, qa, &b, qb);
        // Now this thread keeps both contexts' descriptors in a table of its own, and B's
        // leaves the process's table, where B's helper borrows from: it finds nothing.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let closer = std::thread::spawn(move || {
            wait.recv().unwrap();
            // SAFETY: closes B's descriptor in the process's table only.
            unsafe { libc::close(high) };
        });
        private_table_keeping(&[a_fd, high]);
        go.send(()).unwrap();
        closer.join().unwrap();

        // The lease request reaches B's helper, which cannot register the window: it stops,
        // the request is not answered, and A's WR fails after its timeout.
        let status = write8(&a, qa, &src, lkey, dst.as_ptr() as u64, rkey, 1);
        assert_ne!(status, IBV_WC_SUCCESS);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let reasons = b.eng().status().page().report().reasons;
            if reasons
                .iter()
                .any(|r| r.starts_with("helper thread stopped"))
            {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{reasons:?}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The next registration with remote access starts a helper that shares this thread's
        // table, where B's descriptor is: a WRITE on a fresh connection lands.
        let mut dst2 = Buf::new(64 * 1024);
        let dmr2 = b.reg(&mut dst2, ALL_ACCESS);
        let rkey2 = keys(dmr2).1;
        let (qa2, qb2) = (a.create_qp(false), b.create_qp(false));
        connect(&a, qa2, &b, qb2);
        fill(&mut src, 5);
        let status = write8(&a, qa2, &src, lkey, dst2.as_ptr() as u64 + 64, rkey2, 2);
        assert_eq!(status, IBV_WC_SUCCESS);
        assert_eq!(&dst2[64..72], &src[..8]);
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
