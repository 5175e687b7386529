//! `fork()` (docs/connectx.md §10): a child forked after the library started its helper
//! thread starts a helper of its own when it registers memory peers lease from, and counts
//! into a private copy of its status page, never into its parent's; the parent goes on
//! serving leases after the fork. One test in this file: the fork happens with as few
//! threads around as a test binary has.

mod common;

use common::*;
use nprdma::status::{PageStore, read_file};
use nprdma::sys::*;

const W: usize = 64 * 1024;

/// A signaled 8-byte WRITE from `src` to `raddr`, polled to its completion; its status.
fn write8(a: &Host, qa: *mut ibv_qp, src: &Buf, smr: *mut ibv_mr, raddr: u64, rkey: u32) -> u32 {
    let mut s = [sge(src, 0, 8, keys(smr).0)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 7, &mut s, raddr, rkey, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!(wc.len(), 1, "no completion");
    wc[0].status
}

/// What the child checks; a panic is its failure.
fn in_child(a: &Host, b: &Host, src: &Buf, smr: *mut ibv_mr, parent_page: &std::path::Path) {
    let parent = read_file(parent_page).unwrap();
    // A new connection and a new region with remote access, registered in the child: the
    // parent's helper thread does not exist here, so only a helper of the child's own can
    // grant this lease (with the parent's "started" flag the request times out).
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(a, qa, b, qb);
    let mut dst = Buf::new(2 * W);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let status = write8(a, qa, src, smr, dst.as_ptr() as u64, keys(dmr).1);
    assert_eq!(status, IBV_WC_SUCCESS, "the child's lease was not served");
    // The child's counters are its own: the parent's page did not see its region.
    let now = read_file(parent_page).unwrap();
    assert_eq!(now.pid, parent.pid);
    assert_eq!(
        now.regions, parent.regions,
        "the child counted into its parent's page"
    );
    let own = b.eng().status().page().report();
    // SAFETY: getpid has no preconditions.
    assert_eq!(own.pid, unsafe { libc::getpid() } as u32);
    assert_eq!(own.regions, parent.regions + 1);
    assert!(
        b.eng().status().path().is_none(),
        "the child claims its parent's file"
    );
    assert!(own.reasons.iter().any(|r| r.contains("forked child")));
}

#[test]
fn a_forked_child_serves_its_own_leases_and_keeps_its_counters_to_itself() {
    let dir = std::env::temp_dir().join(format!("nprdma-fork-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = nprdma::Config::for_tests(4 << 20, W as u64);
    cfg.status_dir = dir.clone();
    cfg.remote_timeout_ms = 1000;
    let b = Host::with_store(cfg.clone(), PageStore::file(&cfg).unwrap());
    let parent_page = b.eng().status().path().unwrap().to_path_buf();
    let a = Host::with_library(4 << 20, W as u64);
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let mut src = Buf::new(W);
    let smr = a.reg(&mut src, ALL_ACCESS);
    let mut dst = Buf::new(4 * W);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let base = dst.as_ptr() as u64;
    // The parent's helper serves a lease: it runs when the process forks.
    assert_eq!(write8(&a, qa, &src, smr, base, keys(dmr).1), IBV_WC_SUCCESS);

    // SAFETY: fork(2); the child runs only the checks below and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_child(&a, &b, &src, smr, &parent_page)
        }))
        .is_ok();
        // SAFETY: ends the child without running the parent's exit handlers or destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut wstatus = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(pid, &mut wstatus, 0) }, pid);
    assert!(
        libc::WIFEXITED(wstatus) && libc::WEXITSTATUS(wstatus) == 0,
        "the child's checks failed (status {wstatus:#x})"
    );
    // The parent's page is still its own, and its helper still serves after the fork (the
    // fork handlers gave back the locks they held across it).
    let mine = read_file(&parent_page).unwrap();
    assert_eq!(mine.pid, std::process::id());
    assert!(mine.alive);
    assert_eq!(
        write8(&a, qa, &src, smr, base + 2 * W as u64, keys(dmr).1),
        IBV_WC_SUCCESS
    );
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
