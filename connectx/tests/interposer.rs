//! The interposer on the fake provider: ops wrapping, virtual registration, translation and
//! splitting, completion rewriting, remote access through directories and leases, pass-through,
//! and plain-verbs error semantics for bad input.

mod common;

use common::*;
use nprdma::fake;
use nprdma::sys::*;

const KIB: usize = 1024;

static OPS_AT_CLOSE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn recording_close(ctx: *mut ibv_context) -> i32 {
    // SAFETY: the live context the library is closing.
    let f = unsafe { (*ctx).ops.post_send.map_or(0, |f| f as usize) };
    OPS_AT_CLOSE.store(f, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: forwarded to the fake.
    unsafe { (fake::real_verbs().close_device)(ctx) }
}

#[test]
fn ops_are_wrapped_at_open_and_restored_before_close() {
    let mut real = fake::real_verbs();
    // SAFETY: a bare fake context, to learn the provider's own function pointers.
    let bare = unsafe { (real.open_device)(fake::device()) };
    // SAFETY: live context.
    let (orig_send, orig_poll) = unsafe {
        (
            (*bare).ops.post_send.map(|f| f as usize),
            (*bare).ops.poll_cq.map(|f| f as usize),
        )
    };
    // SAFETY: closing the bare context.
    unsafe { (real.close_device)(bare) };
    real.close_device = recording_close;
    let cfg = nprdma::Config::for_tests(1 << 20, 64 * 1024);
    let eng = nprdma::Engine::new(real, cfg.clone(), nprdma::status::PageStore::heap(&cfg));
    // SAFETY: the fake device.
    let ctx = unsafe { nprdma::interpose::open_device(&eng, fake::device()) };
    // SAFETY: live context.
    unsafe {
        assert_ne!((*ctx).ops.post_send.map(|f| f as usize), orig_send);
        assert_ne!((*ctx).ops.poll_cq.map(|f| f as usize), orig_poll);
        assert_eq!(nprdma::interpose::close_device(&eng, ctx), 0);
    }
    assert_eq!(
        Some(OPS_AT_CLOSE.load(std::sync::atomic::Ordering::SeqCst)),
        orig_send,
        "the provider gets its own table back"
    );
}

#[test]
fn registration_pins_only_the_directory() {
    let h = Host::with_library(1 << 20, 64 * 1024);
    let mut buf = Buf::new(8 << 20);
    let mr = h.reg(&mut buf, ALL_ACCESS);
    assert!(!mr.is_null());
    // SAFETY: live MR.
    let (addr, len) = unsafe { ((*mr).addr as usize, (*mr).length) };
    assert_eq!((addr, len), (buf.as_ptr() as usize, 8 << 20));
    // 8 MiB / 64 KiB = 128 windows: header 128 B + answers 4 KiB + ring 4 KiB + 64 B + 1 KiB
    // of entries = 3 pages, and the ring's own MR (read-write to peers, the rest is
    // read-only) pins the two pages it spans again, as the kernel counts them.
    assert_eq!(h.pinned(), 5 * 4096);
    assert_eq!(fake::mr_count(h.ctx), 2);
    let r = h.eng().status().page().report();
    assert_eq!(r.registered_bytes, 8 << 20);
    assert_eq!(r.pinned_bytes, 5 * 4096);
    assert_eq!(h.dereg(mr), 0);
    assert_eq!(h.pinned(), 0);
    assert_eq!(fake::mr_count(h.ctx), 0);
    assert_eq!(h.eng().status().page().report().registered_bytes, 0);
}

#[test]
fn local_only_region_has_a_one_page_directory() {
    let h = Host::with_library(1 << 20, 64 * 1024);
    let mut buf = Buf::new(1 << 20);
    let mr = h.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    assert!(!mr.is_null());
    assert_eq!(h.pinned(), 4096);
    assert_eq!(h.dereg(mr), 0);
}

#[test]
fn bad_registrations_fail_like_plain_verbs() {
    let h = Host::with_library(1 << 20, 64 * 1024);
    let mut buf = Buf::new(64 * 1024);
    // Remote write without local write: EINVAL (ibv_reg_mr(3)).
    let mr = h.reg(&mut buf, IBV_ACCESS_REMOTE_WRITE);
    assert!(mr.is_null());
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    // A range with an inaccessible page in the middle: EFAULT, as pinning would report.
    let holed = Buf::new(3 * 4096);
    // SAFETY: changing the protection of our own mapping.
    unsafe { libc::mprotect(holed.as_ptr().add(4096) as *mut _, 4096, libc::PROT_NONE) };
    // SAFETY: registering a partly inaccessible range must fail without touching it.
    let mr = unsafe {
        nprdma::interpose::reg_mr_iova2(
            h.eng(),
            h.pd,
            holed.as_ptr() as *mut _,
            3 * 4096,
            holed.as_ptr() as u64,
            IBV_ACCESS_LOCAL_WRITE,
        )
    };
    assert!(mr.is_null());
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFAULT)
    );
    // A read-only mapping registered for local write: EFAULT.
    let ro = Buf::new(4096);
    // SAFETY: changing the protection of our own mapping.
    unsafe { libc::mprotect(ro.as_ptr() as *mut _, 4096, libc::PROT_READ) };
    // SAFETY: as above.
    let mr = unsafe {
        nprdma::interpose::reg_mr_iova2(
            h.eng(),
            h.pd,
            ro.as_ptr() as *mut _,
            4096,
            ro.as_ptr() as u64,
            IBV_ACCESS_LOCAL_WRITE,
        )
    };
    assert!(mr.is_null());
    assert_eq!(h.pinned(), 0, "nothing stays pinned after failures");
}

/// A host with the library (windows) on a fake device that does on-demand paging: the
/// application's own ODP registrations pass through (the fake's plain device refuses them
/// as a kernel without ODP does).
fn odp_host() -> Host {
    let cfg = nprdma::Config::for_tests(1 << 20, 64 * 1024);
    let store = nprdma::status::PageStore::heap(&cfg);
    Host::on_device(cfg, store, nprdma::fake_odp::device_with_odp())
}

#[test]
fn odp_and_mw_bind_pass_through_and_are_reported() {
    let h = odp_host();
    let mut buf = Buf::new(256 * 1024);
    let mr = h.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    assert!(!mr.is_null());
    assert_eq!(h.pinned(), 0, "registered as is: on demand, nothing pinned");
    let r = h.eng().status().page().report();
    assert_eq!(r.passthrough_bytes, 256 * 1024);
    assert!(
        r.reasons.iter().any(|s| s.contains("ON_DEMAND")),
        "{:?}",
        r.reasons
    );
    assert_eq!(h.dereg(mr), 0);
    assert_eq!(h.eng().status().page().report().passthrough_bytes, 0);
}

#[test]
fn a_pass_through_region_given_a_new_translation_is_counted_at_its_new_size() {
    let h = odp_host();
    let mut buf = Buf::new(256 * 1024);
    let mr = h.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    assert!(!mr.is_null());
    // SAFETY: a live pass-through MR; a smaller translation inside the same buffer.
    let rc = unsafe {
        nprdma::interpose::rereg_mr(
            h.eng(),
            mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            core::ptr::null_mut(),
            buf.as_mut_ptr().add(4096).cast(),
            64 * 1024,
            0,
        )
    };
    assert_eq!(rc, 0);
    let report = h.eng().status().page().report();
    assert_eq!(report.passthrough_bytes, 64 * 1024);
    assert_eq!(h.dereg(mr), 0);
    assert_eq!(h.eng().status().page().report().passthrough_bytes, 0);
}

#[test]
fn nprdma_off_steps_aside() {
    let h = Host::off();
    let real = fake::real_verbs();
    // SAFETY: a bare fake context.
    let bare = unsafe { (real.open_device)(fake::device()) };
    // SAFETY: live contexts.
    unsafe {
        assert_eq!(
            (*h.ctx).ops.post_send.map(|f| f as usize),
            (*bare).ops.post_send.map(|f| f as usize),
            "ops not wrapped"
        );
        (real.close_device)(bare);
    }
    let mut buf = Buf::new(128 * 1024);
    let mr = h.reg(&mut buf, ALL_ACCESS);
    assert_eq!(h.pinned(), 128 * 1024);
    assert_eq!(h.dereg(mr), 0);
}

/// Two hosts with the library, one RC connection, regions on both.
struct Pair {
    a: Host,
    b: Host,
    qa: *mut ibv_qp,
    qb: *mut ibv_qp,
}

fn pair(budget: u64, window: u64) -> Pair {
    connected(
        Host::with_library(budget, window),
        Host::with_library(budget, window),
    )
}

/// One RC QP on each host, connected to each other.
fn connected(a: Host, b: Host) -> Pair {
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    Pair { a, b, qa, qb }
}

#[test]
fn write_across_windows_lands_and_completes_once() {
    let p = pair(1 << 20, 64 * 1024);
    let mut src = Buf::new(1 << 20);
    let mut dst = Buf::new(1 << 20);
    fill(&mut src, 7);
    let smr = p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    // 200 KiB from offset 30 KiB to offset 100 KiB: 4 local and 4 remote windows.
    let mut s = [sge(&src, 30 * KIB, 200 * KIB, slkey)];
    let raddr = dst.as_ptr() as u64 + 100 * 1024;
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 0xfeed, &mut s, raddr, drkey, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (0xfeed, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE)
    );
    assert!(poll_rest(p.a.cq).is_empty(), "exactly one completion");
    assert_eq!(&dst[100 * KIB..300 * KIB], &src[30 * KIB..230 * KIB]);
    assert!(dst[..100 * KIB].iter().all(|b| *b == 0));
    assert!(dst[300 * KIB..].iter().all(|b| *b == 0));
    // Read it back into another place of src.
    let mut s = [sge(&src, 600 * KIB, 200 * KIB, slkey)];
    let mut wr = rdma(IBV_WR_RDMA_READ, 0xbeef, &mut s, raddr, drkey, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (0xbeef, IBV_WC_SUCCESS));
    let (want, got) = (
        src[30 * KIB..230 * KIB].to_vec(),
        src[600 * KIB..800 * KIB].to_vec(),
    );
    assert_eq!(want, got);
    assert!(p.a.peak() <= 1 << 20 && p.b.peak() <= 1 << 20);
    let rb = p.b.eng().status().page().report();
    assert!(rb.leases_granted >= 4, "{rb:?}");
    assert!(p.a.eng().status().page().report().remote_requests >= 5);
}

#[test]
fn completions_keep_order_and_wr_ids_and_skip_unsignaled() {
    let p = pair(1 << 20, 16 * 1024);
    let mut src = Buf::new(256 * 1024);
    let mut dst = Buf::new(256 * 1024);
    fill(&mut src, 3);
    let smr = p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    let mut expected = Vec::new();
    let mut covered = vec![false; 256 * KIB];
    let mut seed = 99u64;
    for i in 0..200u64 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 1 + (seed >> 33) as usize % (40 * KIB);
        let off = (seed >> 12) as usize % (256 * KIB - len);
        let signaled = (seed >> 60) & 1 == 1 || i == 199;
        let mut s = [sge(&src, off, len, slkey)];
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            1000 + i,
            &mut s,
            dst.as_ptr() as u64 + off as u64,
            drkey,
            signaled,
        );
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
        if signaled {
            expected.push(1000 + i);
        }
        covered[off..off + len].fill(true);
        if i % 16 == 15 {
            // Poll now and then, as applications do.
            let got: Vec<u64> = poll(p.a.cq, 0).iter().map(|w| w.wr_id).collect();
            assert!(got.is_empty() || expected.starts_with(&got));
        }
    }
    let wcs = poll(p.a.cq, expected.len());
    let got: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(got, expected);
    assert!(wcs.iter().all(|w| w.status == IBV_WC_SUCCESS));
    assert!(poll_rest(p.a.cq).is_empty());
    // Every write copied src[off..] to dst[off..]: written bytes equal, the rest stayed zero.
    let ok = (0..256 * KIB).all(|i| {
        if covered[i] {
            dst[i] == src[i]
        } else {
            dst[i] == 0
        }
    });
    assert!(ok, "a byte differs from what the writes put there");
}

#[test]
fn send_recv_and_write_with_imm_split() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a_buf = Buf::new(128 * 1024);
    let mut b_buf = Buf::new(128 * 1024);
    fill(&mut a_buf, 11);
    let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
    let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
    let (alkey, _) = keys(amr);
    let (blkey, brkey) = keys(bmr);
    // B posts two receives: one into a range that crosses a window, one for the immediate.
    let mut rs = [sge(&b_buf, 10 * KIB, 20 * KIB, blkey)];
    let mut rwr = ibv_recv_wr {
        wr_id: 77,
        next: core::ptr::null_mut(),
        sg_list: rs.as_mut_ptr(),
        num_sge: 1,
    };
    assert_eq!(post_recv(p.qb, &mut rwr), 0);
    let mut rwr2 = ibv_recv_wr {
        wr_id: 78,
        next: core::ptr::null_mut(),
        sg_list: core::ptr::null_mut(),
        num_sge: 0,
    };
    assert_eq!(post_recv(p.qb, &mut rwr2), 0);
    // SEND 20 KiB.
    let mut s = [sge(&a_buf, 0, 20 * KIB, alkey)];
    let mut wr = ibv_send_wr::zeroed();
    wr.wr_id = 5;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = s.as_mut_ptr();
    wr.num_sge = 1;
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    // WRITE_WITH_IMM of 40 KiB across three 16 KiB windows of B.
    let mut s2 = [sge(&a_buf, 50 * KIB, 40 * KIB, alkey)];
    let mut wr2 = rdma(
        IBV_WR_RDMA_WRITE_WITH_IMM,
        6,
        &mut s2,
        b_buf.as_ptr() as u64 + 60 * 1024,
        brkey,
        true,
    );
    wr2.imm_data = 0x1234_5678;
    assert_eq!(post_send(p.qa, &mut wr2).0, 0);
    let sa = poll(p.a.cq, 2);
    assert_eq!(sa.iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![5, 6]);
    let rb = poll(p.b.cq, 2);
    assert_eq!(rb.len(), 2, "one receive completion per message");
    assert_eq!(
        (rb[0].wr_id, rb[0].opcode, rb[0].byte_len),
        (77, IBV_WC_RECV, 20 * 1024)
    );
    assert_eq!(
        (rb[1].wr_id, rb[1].opcode, rb[1].imm_data),
        (78, IBV_WC_RECV_RDMA_WITH_IMM, 0x1234_5678)
    );
    assert!(poll_rest(p.b.cq).is_empty());
    assert_eq!(&b_buf[10 * KIB..30 * KIB], &a_buf[..20 * KIB]);
    assert_eq!(&b_buf[60 * KIB..100 * KIB], &a_buf[50 * KIB..90 * KIB]);
}

#[test]
fn atomics_execute_exactly_once() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a_buf = Buf::new(64 * 1024);
    let mut b_buf = Buf::new(64 * 1024);
    let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
    let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
    let (alkey, _) = keys(amr);
    let (_, brkey) = keys(bmr);
    let target = b_buf.as_ptr() as u64 + 40 * 1024;
    for i in 0..10u64 {
        let mut s = [sge(&a_buf, 8 * i as usize, 8, alkey)];
        let mut wr = atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, i, &mut s, target, 3, 0, brkey);
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
    }
    let wcs = poll(p.a.cq, 10);
    assert_eq!(wcs.len(), 10);
    let remote = u64::from_le_bytes(b_buf[40 * KIB..40 * KIB + 8].try_into().unwrap());
    assert_eq!(remote, 30, "ten fetch-and-adds of 3, each applied once");
    for i in 0..10usize {
        let old = u64::from_le_bytes(a_buf[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(old, 3 * i as u64);
    }
    // Compare-and-swap.
    let mut s = [sge(&a_buf, 200, 8, alkey)];
    let mut wr = atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 50, &mut s, target, 30, 99, brkey);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    assert_eq!(poll(p.a.cq, 1)[0].status, IBV_WC_SUCCESS);
    assert_eq!(
        u64::from_le_bytes(b_buf[40 * KIB..40 * KIB + 8].try_into().unwrap()),
        99
    );
}

/// A fetch-and-add whose SGE is longer than the 8 bytes it moves, aimed at the last 8 bytes of
/// the peer's region: the remote range is those 8 bytes (the library planned the SGE's 16
/// past the region's end, and `ibv_post_send` never returned). The result is plain verbs'.
#[test]
fn an_atomic_with_a_long_sge_at_the_end_of_the_region_behaves_as_plain_verbs() {
    let run = |p: Pair| {
        let mut a_buf = Buf::new(64 * 1024);
        let mut b_buf = Buf::new(64 * 1024);
        b_buf[64 * KIB - 8..].copy_from_slice(&5u64.to_le_bytes());
        let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
        let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
        let mut s = [sge(&a_buf, 0, 16, keys(amr).0)];
        let target = b_buf.as_ptr() as u64 + 64 * 1024 - 8;
        let mut wr = atomic(
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            3,
            &mut s,
            target,
            1,
            0,
            keys(bmr).1,
        );
        let rc = post_send(p.qa, &mut wr).0;
        let status = if rc == 0 {
            poll(p.a.cq, 1).first().map(|w| w.status)
        } else {
            None
        };
        let remote = u64::from_le_bytes(b_buf[64 * KIB - 8..].try_into().unwrap());
        (rc, status, remote)
    };
    let plain = run(connected(Host::plain(), Host::plain()));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let got = run(pair(1 << 20, 16 * 1024));
        let _ = tx.send(got);
    });
    let with_library = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("ibv_post_send returned");
    assert_eq!(with_library, plain);
}

#[test]
fn invalid_lkey_and_sge_outside_region_give_local_protection_error() {
    for case in 0..3 {
        let p = pair(1 << 20, 16 * 1024);
        let mut a_buf = Buf::new(64 * 1024);
        let mut b_buf = Buf::new(64 * 1024);
        let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
        let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
        let (alkey, _) = keys(amr);
        let (_, brkey) = keys(bmr);
        let mut s = match case {
            0 => [sge(&a_buf, 0, 100, 0xdead_0000)],
            // Starts inside, ends 1 byte past the region.
            1 => [sge(&a_buf, 64 * KIB - 50, 51, alkey)],
            // Inside the directory's IOVA range (a low address with the region's key).
            _ => [ibv_sge {
                addr: 16,
                length: 8,
                lkey: alkey,
            }],
        };
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            42,
            &mut s,
            b_buf.as_ptr() as u64,
            brkey,
            false,
        );
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
        let mut ok = [sge(&a_buf, 0, 8, alkey)];
        let mut wr2 = rdma(
            IBV_WR_RDMA_WRITE,
            43,
            &mut ok,
            b_buf.as_ptr() as u64,
            brkey,
            true,
        );
        assert_eq!(post_send(p.qa, &mut wr2).0, 0);
        let wcs = poll(p.a.cq, 2);
        assert_eq!(
            wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
            vec![(42, IBV_WC_LOC_PROT_ERR), (43, IBV_WC_WR_FLUSH_ERR)],
            "case {case}: the unsignaled WR still reports its error, then the QP flushes"
        );
        assert_eq!(qp_state(p.qa), IBV_QPS_ERR);
        assert!(b_buf.iter().all(|b| *b == 0), "nothing landed");
    }
}

#[test]
fn a_context_put_in_pass_through_passes_warm_writes_through_unchanged() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a_buf = Buf::new(64 * 1024);
    let mut b_buf = Buf::new(64 * 1024);
    fill(&mut a_buf, 3);
    let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
    let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
    let (alkey, _) = keys(amr);
    let (_, brkey) = keys(bmr);
    let raddr = b_buf.as_ptr() as u64;
    // Warm: the QP holds its local window and remembers the peer's after the first WRITE.
    for id in 1..=3u64 {
        let mut s = [sge(&a_buf, 64 * id as usize, 64, alkey)];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, raddr + 64 * id, brkey, true);
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
        let wc = poll(p.a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (id, IBV_WC_SUCCESS));
    }
    assert_eq!(&b_buf[64..256], &a_buf[64..256]);
    // Direct verbs from now on: the library no longer translates, so the application's own
    // keys reach the provider, which refuses them (they name the pinned directory).
    nprdma::interpose::enter_passthrough(p.a.ctx, "test: direct verbs");
    let mut s = [sge(&a_buf, 1024, 64, alkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 9, &mut s, raddr + 1024, brkey, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, IBV_WC_LOC_PROT_ERR));
    assert!(b_buf[1024..1088].iter().all(|b| *b == 0), "nothing landed");
}

#[test]
fn invalid_rkey_and_remote_range_outside_give_remote_access_error() {
    for case in 0..2 {
        let p = pair(1 << 20, 16 * 1024);
        let mut a_buf = Buf::new(64 * 1024);
        let mut b_buf = Buf::new(64 * 1024);
        let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
        let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
        let (alkey, _) = keys(amr);
        let (_, brkey) = keys(bmr);
        let (raddr, rkey) = match case {
            0 => (b_buf.as_ptr() as u64, 0x0bad_0001),
            _ => (b_buf.as_ptr() as u64 + 64 * 1024 - 4, brkey),
        };
        let mut s = [sge(&a_buf, 0, 8, alkey)];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, 9, &mut s, raddr, rkey, true);
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
        let wcs = poll(p.a.cq, 1);
        assert_eq!(
            (wcs[0].wr_id, wcs[0].status),
            (9, IBV_WC_REM_ACCESS_ERR),
            "case {case}"
        );
        assert!(poll_rest(p.a.cq).is_empty());
        assert_eq!(qp_state(p.qa), IBV_QPS_ERR);
        assert!(b_buf.iter().all(|b| *b == 0));
    }
}

#[test]
fn remote_access_without_the_right_is_refused() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a_buf = Buf::new(64 * 1024);
    let mut b_buf = Buf::new(64 * 1024);
    let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
    // Remote read only: a write must fail with a remote access error.
    let bmr =
        p.b.reg(&mut b_buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    let (alkey, _) = keys(amr);
    let (_, brkey) = keys(bmr);
    let mut s = [sge(&a_buf, 0, 64, alkey)];
    let mut wr = rdma(
        IBV_WR_RDMA_READ,
        1,
        &mut s,
        b_buf.as_ptr() as u64,
        brkey,
        true,
    );
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    assert_eq!(poll(p.a.cq, 1)[0].status, IBV_WC_SUCCESS);
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        2,
        &mut s,
        b_buf.as_ptr() as u64,
        brkey,
        true,
    );
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    assert_eq!(poll(p.a.cq, 1)[0].status, IBV_WC_REM_ACCESS_ERR);
}

#[test]
fn deregistered_region_in_use_gives_protection_error() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a_buf = Buf::new(64 * 1024);
    let mut b_buf = Buf::new(64 * 1024);
    let amr = p.a.reg(&mut a_buf, ALL_ACCESS);
    let bmr = p.b.reg(&mut b_buf, ALL_ACCESS);
    let (alkey, _) = keys(amr);
    let (_, brkey) = keys(bmr);
    assert_eq!(p.a.dereg(amr), 0);
    let mut s = [sge(&a_buf, 0, 64, alkey)];
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        3,
        &mut s,
        b_buf.as_ptr() as u64,
        brkey,
        true,
    );
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    assert_eq!(poll(p.a.cq, 1)[0].status, IBV_WC_LOC_PROT_ERR);
}

#[test]
fn peer_without_the_library_gets_remote_access_error_never_our_bytes() {
    // The peer (plain verbs) writes to our region with the rkey and address we advertised.
    let lib = Host::with_library(1 << 20, 16 * 1024);
    let plain = Host::plain();
    let ql = lib.create_qp(false);
    let qp = plain.create_qp(false);
    connect(&lib, ql, &plain, qp);
    let mut ours = Buf::new(64 * 1024);
    let mut theirs = Buf::new(64 * 1024);
    fill(&mut theirs, 5);
    let omr = lib.reg(&mut ours, ALL_ACCESS);
    let tmr = plain.reg(&mut theirs, ALL_ACCESS);
    let (_, orkey) = keys(omr);
    let (tlkey, trkey) = keys(tmr);
    let mut s = [sge(&theirs, 0, 4096, tlkey)];
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        1,
        &mut s,
        ours.as_ptr() as u64,
        orkey,
        true,
    );
    assert_eq!(post_send(qp, &mut wr).0, 0);
    let wcs = poll(plain.cq, 1);
    assert_eq!(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
    assert!(ours.iter().all(|b| *b == 0), "no byte of ours changed");
    // And we, with the library, write to the plain peer (a fresh connection: the first one is
    // in the error state now): its rkey has no directory at IOVA 0.
    let ql = lib.create_qp(false);
    let qp = plain.create_qp(false);
    connect(&lib, ql, &plain, qp);
    let (ol, _) = keys(omr);
    let mut s = [sge(&ours, 0, 64, ol)];
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        2,
        &mut s,
        theirs.as_ptr() as u64,
        trkey,
        true,
    );
    assert_eq!(post_send(ql, &mut wr).0, 0);
    let wcs = poll(lib.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, IBV_WC_REM_ACCESS_ERR));
    let r = lib.eng().status().page().report();
    assert!(
        r.reasons.iter().any(|s| s.contains("without libnprdma")),
        "{:?}",
        r.reasons
    );
}

#[test]
fn peer_without_the_library_whose_region_starts_at_iova_zero_passes_through() {
    let lib = Host::with_library(1 << 20, 16 * 1024);
    let plain = Host::plain();
    let ql = lib.create_qp(false);
    let qp = plain.create_qp(false);
    connect(&lib, ql, &plain, qp);
    let mut ours = Buf::new(64 * 1024);
    let mut theirs = Buf::new(64 * 1024);
    fill(&mut ours, 9);
    let omr = lib.reg(&mut ours, ALL_ACCESS);
    // A zero-based plain region: IOVA 0 holds application bytes, not a directory.
    let tmr = plain.reg_iova(&mut theirs, 0, ALL_ACCESS);
    let (ol, _) = keys(omr);
    let (_, trkey) = keys(tmr);
    let mut s = [sge(&ours, 100, 3000, ol)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 4, &mut s, 8192, trkey, true);
    assert_eq!(post_send(ql, &mut wr).0, 0);
    assert_eq!(poll(lib.cq, 1)[0].status, IBV_WC_SUCCESS);
    assert_eq!(&theirs[8192..8192 + 3000], &ours[100..3100]);
}

#[test]
fn new_post_send_api_is_translated() {
    let p = BuilderPair::new(21);
    let (a, qpx, sl, dr) = (&p.a, p.qpx, p.sl, p.dr);
    let (src, dst) = (&p.src, &p.dst);
    // SAFETY: what ibv_wr_start / ibv_wr_rdma_write / ibv_wr_set_sge / ibv_wr_complete do.
    unsafe {
        let q = &mut *qpx;
        (q.wr_start.unwrap())(qpx);
        q.wr_id = 0xaa;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, dr, dst.as_ptr() as u64 + 10_000);
        (q.wr_set_sge.unwrap())(qpx, sl, src.as_ptr() as u64 + 1000, 30_000);
        q.wr_id = 0xab;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, dr, dst.as_ptr() as u64 + 50_000);
        let mut inline = *b"inline bytes";
        (q.wr_set_inline_data.unwrap())(qpx, inline.as_mut_ptr().cast(), inline.len());
        inline.fill(0); // the API copies at the call
        assert_eq!((q.wr_complete.unwrap())(qpx), 0);
    }
    let wcs = poll(a.cq, 2);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        vec![(0xaa, 0), (0xab, 0)]
    );
    assert_eq!(&dst[10_000..40_000], &src[1000..31_000]);
    assert_eq!(&dst[50_000..50_012], b"inline bytes");
}

#[test]
fn new_post_send_api_batches_abort_restart_interleave_and_change_threads() {
    let a = Host::with_library(1 << 20, 16 * 1024);
    let b = Host::with_library(1 << 20, 16 * 1024);
    let (q1, q2) = (a.create_qp_ex(), a.create_qp_ex());
    let (p1, p2) = (b.create_qp(false), b.create_qp(false));
    connect(&a, q1, &b, p1);
    connect(&a, q2, &b, p2);
    let mut dst = Buf::new(64 * 1024);
    let dmr = b.reg(&mut dst, ALL_ACCESS);
    let (_, dr) = keys(dmr);
    let base = dst.as_ptr() as u64;
    let (x1, x2) = (q1.cast::<ibv_qp_ex>(), q2.cast::<ibv_qp_ex>());
    // SAFETY: what the ibv_wr_* inline functions do, on live QPs of `a`.
    let write = |qpx: *mut ibv_qp_ex, wr_id: u64, off: u64, bytes: &[u8]| unsafe {
        let q = &mut *qpx;
        q.wr_id = wr_id;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, dr, base + off);
        (q.wr_set_inline_data.unwrap())(qpx, bytes.as_ptr() as *mut _, bytes.len());
    };
    // SAFETY: as above.
    unsafe {
        // An aborted batch posts nothing; a second start restarts the batch.
        ((*x1).wr_start.unwrap())(x1);
        write(x1, 1, 0, b"aborted");
        ((*x1).wr_abort.unwrap())(x1);
        ((*x1).wr_start.unwrap())(x1);
        write(x1, 2, 0, b"dropped");
        ((*x1).wr_start.unwrap())(x1);
        write(x1, 3, 100, b"restarted");
        assert_eq!(((*x1).wr_complete.unwrap())(x1), 0);
        // Two QPs' batches open at once on one thread.
        ((*x1).wr_start.unwrap())(x1);
        ((*x2).wr_start.unwrap())(x2);
        write(x2, 20, 300, b"second qp");
        write(x1, 10, 200, b"first qp");
        assert_eq!(((*x2).wr_complete.unwrap())(x2), 0);
        assert_eq!(((*x1).wr_complete.unwrap())(x1), 0);
        // A batch handed to another thread (the application serializes it).
        ((*x1).wr_start.unwrap())(x1);
        write(x1, 11, 400, b"started here");
    }
    let x1_addr = x1 as usize;
    std::thread::spawn(move || {
        let x1 = x1_addr as *mut ibv_qp_ex;
        // SAFETY: the batch opened above; the main thread waits for this one.
        unsafe {
            let q = &mut *x1;
            q.wr_id = 12;
            q.wr_flags = IBV_SEND_SIGNALED;
            (q.wr_rdma_write.unwrap())(x1, dr, base + 500);
            let bytes = b"finished there";
            (q.wr_set_inline_data.unwrap())(x1, bytes.as_ptr() as *mut _, bytes.len());
            assert_eq!((q.wr_complete.unwrap())(x1), 0);
        }
    })
    .join()
    .unwrap();
    let mut wcs = poll(a.cq, 5);
    wcs.extend(poll_rest(a.cq));
    let mut got: Vec<(u64, u32)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    got.sort();
    assert_eq!(
        got,
        vec![(3, 0), (10, 0), (11, 0), (12, 0), (20, 0)],
        "one completion per posted WR, none for the aborted or restarted ones"
    );
    assert_eq!(&dst[0..7], &[0u8; 7][..]);
    assert_eq!(&dst[100..109], b"restarted");
    assert_eq!(&dst[200..208], b"first qp");
    assert_eq!(&dst[300..309], b"second qp");
    assert_eq!(&dst[400..412], b"started here");
    assert_eq!(&dst[500..514], b"finished there");
}

/// Two hosts with the library, an RC QP pair, `a`'s CQ an extended one (created without
/// `IBV_WC_EX_WITH_QP_NUM`), a filled source region on `a` and a target on `b`.
struct CqExPair {
    a: Host,
    b: Host,
    cqx: *mut ibv_cq_ex,
    qa: *mut ibv_qp,
    src: Buf,
    dst: Buf,
    sl: u32,
    dr: u32,
}

fn cq_ex_pair(seed: u64) -> CqExPair {
    let mut a = Host::with_library(1 << 20, 16 * 1024);
    let cqx = a.use_cq_ex(0);
    let Pair { a, b, qa, .. } = connected(a, Host::with_library(1 << 20, 16 * 1024));
    let mut src = Buf::new(64 * 1024);
    let mut dst = Buf::new(64 * 1024);
    fill(&mut src, seed);
    let (sl, _) = keys(a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (_, dr) = keys(b.reg(&mut dst, ALL_ACCESS));
    CqExPair {
        a,
        b,
        cqx,
        qa,
        src,
        dst,
        sl,
        dr,
    }
}

#[test]
fn extended_cq_shows_stashed_then_provider_completions_with_the_applications_wr_ids() {
    // The application does not ask for QP numbers: the library needs them and asks itself.
    let CqExPair {
        a,
        b: _b,
        cqx,
        qa,
        src,
        dst,
        sl,
        dr,
    } = cq_ex_pair(5);
    let base = dst.as_ptr() as u64;
    // Every remote window is touched for the first time: the library reads the peer's
    // directory and asks for a lease on this QP, waiting for those completions on this CQ,
    // and stashes the application's completions it meets meanwhile.
    for (i, window) in [0u64, 1, 2, 3].iter().enumerate() {
        let off = window * 16 * 1024 + 100;
        let mut s = [sge(&src, off as usize, 1000, sl)];
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            0x100 + i as u64,
            &mut s,
            base + off,
            dr,
            true,
        );
        assert_eq!(post_send(qa, &mut wr).0, 0);
    }
    let got = poll_ex(cqx);
    // SAFETY: a live QP of `a`.
    let qpn = unsafe { (*qa).qp_num };
    assert_eq!(
        got.iter()
            .map(|e| (e.wr_id, e.status, e.opcode))
            .collect::<Vec<_>>(),
        (0..4)
            .map(|i| (0x100 + i, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE))
            .collect::<Vec<_>>(),
        "exactly the application's completions, in order: {got:x?}"
    );
    // The library asked for QP numbers on the application's behalf (for every completion,
    // the stashed ones answered from the stored ibv_wc).
    assert!(got.iter().all(|e| e.qp_num == qpn), "{got:x?}");
    let stats = a.eng().status().page().report();
    assert!(stats.remote_requests >= 4, "{stats:?}");
    assert!(poll_ex(cqx).is_empty());
    // A warm WR: straight from the provider, with the provider's timestamp.
    let mut s = [sge(&src, 100, 8, sl)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 0x200, &mut s, base + 100, dr, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let got = poll_ex(cqx);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].status), (0x200, IBV_WC_SUCCESS));
    assert_eq!(
        got[0].ts,
        0x7500_0000_0000 | u64::from(qpn) << 8 | u64::from(IBV_WC_RDMA_WRITE)
    );
    // ibv_poll_cq on the same CQ still works, with the same rules.
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 0x201, &mut s, base + 100, dr, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wc = poll(a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (0x201, IBV_WC_SUCCESS));
    for window in 0..4usize {
        let off = window * 16 * 1024 + 100;
        assert_eq!(&dst[off..off + 1000], &src[off..off + 1000]);
    }
}

#[test]
fn a_first_touch_waits_out_another_threads_extended_cq_session() {
    // Both hosts stay alive to the end of the test (bound, not dropped).
    let CqExPair {
        a: _a,
        b: _b,
        cqx,
        qa,
        src,
        dst,
        sl,
        dr,
    } = cq_ex_pair(9);
    let base = dst.as_ptr() as u64;
    let mut s = [sge(&src, 100, 1000, sl)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 1, &mut s, base + 100, dr, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let blocked_before = nprdma::fake::poll_cq_blocked();
    // This thread opens a poll session (which holds the provider's CQ lock) and keeps it
    // while another thread's WR touches a new remote window: the library must wait for its
    // own completions without polling the provider under the session.
    // SAFETY: the CQ's own functions, as the inline ibv_start_poll calls them.
    let first = unsafe {
        let mut attr = ibv_poll_cq_attr::default();
        assert_eq!(((*cqx).start_poll.unwrap())(cqx, &mut attr), 0);
        (*cqx).wr_id
    };
    assert_eq!(first, 1);
    let (qa_addr, src_addr) = (qa as usize, src.as_ptr() as u64);
    let poster = std::thread::spawn(move || {
        let mut s = [ibv_sge {
            addr: src_addr + 20_000,
            length: 1000,
            lkey: sl,
        }];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, 2, &mut s, base + 20_000, dr, true);
        post_send(qa_addr as *mut ibv_qp, &mut wr).0
    });
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: as above; the session is still open.
    let mut seen = unsafe {
        let mut seen = Vec::new();
        while ((*cqx).next_poll.unwrap())(cqx) == 0 {
            seen.push((*cqx).wr_id);
        }
        ((*cqx).end_poll.unwrap())(cqx);
        seen
    };
    assert_eq!(poster.join().unwrap(), 0, "the WR was posted");
    seen.extend(poll_ex(cqx).iter().map(|e| e.wr_id));
    assert_eq!(
        seen,
        vec![2],
        "the second WR's completion, none of the library's"
    );
    assert_eq!(
        nprdma::fake::poll_cq_blocked(),
        blocked_before,
        "nobody polled the provider during the session"
    );
    assert_eq!(&dst[20_000..21_000], &src[20_000..21_000]);
}

#[test]
fn posting_from_inside_an_extended_cq_session_keeps_the_current_completion() {
    let CqExPair {
        a: _a,
        b: _b,
        cqx,
        qa,
        src,
        dst,
        sl,
        dr,
    } = cq_ex_pair(13);
    let blocked_before = nprdma::fake::poll_cq_blocked();
    let base = dst.as_ptr() as u64;
    let write = |wr_id: u64, off: u64| {
        let mut s = [ibv_sge {
            addr: src.as_ptr() as u64 + off,
            length: 1000,
            lkey: sl,
        }];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, wr_id, &mut s, base + off, dr, true);
        post_send(qa, &mut wr).0
    };
    assert_eq!(write(1, 100), 0);
    assert_eq!(write(2, 200), 0);
    // SAFETY: the CQ's own functions, as the inline functions call them; this thread holds
    // the session (and, in a real provider, the CQ's lock) while it posts.
    unsafe {
        let mut attr = ibv_poll_cq_attr::default();
        assert_eq!(((*cqx).start_poll.unwrap())(cqx, &mut attr), 0);
        let first = ((*cqx).wr_id, ((*cqx).read_completion_ts.unwrap())(cqx));
        assert_eq!(first.0, 1);
        // A first touch of another remote window from inside the poll loop: the library
        // needs its own completions from this very session.
        let t = std::time::Instant::now();
        assert_eq!(write(3, 40_000), 0);
        // Normally a few milliseconds; the library's bounded waits are 2 s, so anything
        // below that (with room for a loaded machine) shows none of them ran out.
        assert!(
            t.elapsed() < std::time::Duration::from_millis(1500),
            "no timeout-bound wait"
        );
        // What the application was looking at has not changed.
        assert_eq!((*cqx).wr_id, 1);
        assert_eq!((*cqx).status, IBV_WC_SUCCESS);
        assert_eq!(((*cqx).read_completion_ts.unwrap())(cqx), first.1);
        assert_eq!(((*cqx).read_opcode.unwrap())(cqx), IBV_WC_RDMA_WRITE);
        let mut rest = Vec::new();
        while ((*cqx).next_poll.unwrap())(cqx) == 0 {
            rest.push((*cqx).wr_id);
        }
        ((*cqx).end_poll.unwrap())(cqx);
        rest.extend(poll_ex(cqx).iter().map(|e| e.wr_id));
        assert_eq!(
            rest,
            vec![2, 3],
            "the rest, in order, none of the library's"
        );
    }
    assert_eq!(nprdma::fake::poll_cq_blocked(), blocked_before);
    assert_eq!(&dst[40_000..41_000], &src[40_000..41_000]);
}

#[test]
fn poll_session_misuse_is_refused_or_repaired_without_hanging_the_provider() {
    let CqExPair {
        a: _a,
        b: _b,
        cqx,
        qa,
        src,
        dst,
        sl,
        dr,
    } = cq_ex_pair(17);
    // SAFETY: the CQ's own functions, as the inline functions call them.
    unsafe {
        assert_eq!(
            ((*cqx).next_poll.unwrap())(cqx),
            libc::EINVAL,
            "before any session"
        );
        let mut attr = ibv_poll_cq_attr::default();
        assert_eq!(((*cqx).start_poll.unwrap())(cqx, &mut attr), libc::ENOENT);
        assert_eq!(
            ((*cqx).next_poll.unwrap())(cqx),
            libc::EINVAL,
            "after ENOENT"
        );
    }
    let mut s = [sge(&src, 0, 64, sl)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 7, &mut s, dst.as_ptr() as u64, dr, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let got = poll_ex(cqx);
    assert_eq!(got.iter().map(|e| e.wr_id).collect::<Vec<_>>(), vec![7]);
    // SAFETY: as above; the session ended in poll_ex.
    unsafe {
        assert_eq!(
            ((*cqx).next_poll.unwrap())(cqx),
            libc::EINVAL,
            "after end_poll"
        );
    }
    // A second start_poll without end_poll ends the first session instead of hanging.
    for id in [8, 9] {
        let mut wr = rdma(IBV_WR_RDMA_WRITE, id, &mut s, dst.as_ptr() as u64, dr, true);
        assert_eq!(post_send(qa, &mut wr).0, 0);
    }
    // SAFETY: as above.
    unsafe {
        let mut attr = ibv_poll_cq_attr::default();
        assert_eq!(((*cqx).start_poll.unwrap())(cqx, &mut attr), 0);
        assert_eq!((*cqx).wr_id, 8);
    }
    let got = poll_ex(cqx);
    assert_eq!(got.iter().map(|e| e.wr_id).collect::<Vec<_>>(), vec![9]);
}

/// Host B receives one SEND through an SRQ made by `make_srq` into a buffer that crosses a
/// window boundary (two windows, so two SGEs after the split); the bytes and the
/// application's `wr_id` must arrive.
fn srq_receive_across_windows(make_srq: impl FnOnce(&Host) -> *mut ibv_srq) {
    let a = Host::with_library(1 << 20, 16 * 1024);
    let b = Host::with_library(1 << 20, 16 * 1024);
    let srq = make_srq(&b);
    assert!(!srq.is_null());
    let qa = a.create_qp(false);
    let mut attr = ibv_qp_init_attr {
        qp_context: core::ptr::null_mut(),
        send_cq: b.cq,
        recv_cq: b.cq,
        srq,
        cap: ibv_qp_cap {
            max_send_wr: 8,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 0,
    };
    // SAFETY: live PD and attributes.
    let qb = unsafe { nprdma::interpose::create_qp(b.eng(), b.pd, &mut attr) };
    connect(&a, qa, &b, qb);
    let mut abuf = Buf::new(64 * 1024);
    let mut bbuf = Buf::new(64 * 1024);
    fill(&mut abuf, 1);
    let amr = a.reg(&mut abuf, IBV_ACCESS_LOCAL_WRITE);
    let bmr = b.reg(&mut bbuf, IBV_ACCESS_LOCAL_WRITE);
    // 1 KiB before a window boundary (windows are aligned to their size in the address
    // space), 4 KiB long.
    let at =
        (bbuf.as_ptr() as usize).next_multiple_of(16 * KIB) - bbuf.as_ptr() as usize + 15 * KIB;
    let mut rs = [sge(&bbuf, at, 4 * KIB, keys(bmr).0)];
    let mut rwr = ibv_recv_wr {
        wr_id: 123,
        next: core::ptr::null_mut(),
        sg_list: rs.as_mut_ptr(),
        num_sge: 1,
    };
    let mut bad = core::ptr::null_mut();
    // SAFETY: the inline ibv_post_srq_recv.
    let rc = unsafe { ((*b.ctx).ops.post_srq_recv.unwrap())(srq, &mut rwr, &mut bad) };
    assert_eq!(rc, 0);
    let mut s = [sge(&abuf, 0, 4 * KIB, keys(amr).0)];
    let mut wr = ibv_send_wr::zeroed();
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = s.as_mut_ptr();
    wr.num_sge = 1;
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let wcs = poll(b.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (123, IBV_WC_SUCCESS));
    assert_eq!(&bbuf[at..at + 4 * KIB], &abuf[..4 * KIB]);
}

#[test]
fn srq_receives_are_translated() {
    // SAFETY: a live PD of the fake.
    srq_receive_across_windows(|b| unsafe { fake::create_srq(b.pd) });
}

#[test]
fn an_srq_created_for_one_sge_takes_a_receive_split_across_windows() {
    // One SGE per receive, as applications often ask: the library creates the SRQ with room
    // for the split, and shows the application the limit it asked for.
    srq_receive_across_windows(|b| {
        let mut init = ibv_srq_init_attr {
            srq_context: core::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: a live PD of the fake and valid attributes.
        let srq = unsafe { nprdma::interpose::create_srq(b.eng(), b.pd, &mut init) };
        assert_eq!(init.attr.max_sge, 1);
        srq
    });
}

#[test]
fn budget_holds_under_many_random_operations_and_data_is_exact() {
    // 4 MiB regions, 256 KiB budget per side, 16 KiB windows: most operations miss.
    let budget = 256 * 1024;
    let p = pair(budget, 16 * 1024);
    let size = 4 << 20;
    let mut a = Buf::new(size);
    let mut b = Buf::new(size);
    fill(&mut a, 1);
    fill(&mut b, 2);
    let mut model_a = a.to_vec();
    let mut model_b = b.to_vec();
    let amr = p.a.reg(&mut a, ALL_ACCESS);
    let bmr = p.b.reg(&mut b, ALL_ACCESS);
    let (al, _) = keys(amr);
    let (_, br) = keys(bmr);
    let mut seed = 0x5eed_u64;
    for i in 0..300u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = 1 + (seed % (48 * 1024)) as usize;
        let lo = ((seed >> 20) as usize) % (size - len);
        let ro = ((seed >> 40) as usize) % (size - len);
        let op = if (seed >> 62) & 1 == 0 {
            IBV_WR_RDMA_WRITE
        } else {
            IBV_WR_RDMA_READ
        };
        let mut s = [sge(&a, lo, len, al)];
        let mut wr = rdma(op, i, &mut s, b.as_ptr() as u64 + ro as u64, br, true);
        assert_eq!(post_send(p.qa, &mut wr).0, 0, "op {i}");
        let wc = poll(p.a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (i, IBV_WC_SUCCESS), "op {i}");
        if op == IBV_WR_RDMA_WRITE {
            let src = model_a[lo..lo + len].to_vec();
            model_b[ro..ro + len].copy_from_slice(&src);
        } else {
            let src = model_b[ro..ro + len].to_vec();
            model_a[lo..lo + len].copy_from_slice(&src);
        }
        assert!(p.a.pinned() <= budget && p.b.pinned() <= budget);
    }
    assert!(
        a[..] == model_a[..],
        "requester bytes differ from the model"
    );
    assert!(
        b[..] == model_b[..],
        "responder bytes differ from the model"
    );
    assert!(p.a.peak() <= budget, "fake saw {} pinned", p.a.peak());
    assert!(p.b.peak() <= budget, "fake saw {} pinned", p.b.peak());
    let ra = p.a.eng().status().page().report();
    assert!(ra.pinned_peak <= budget && ra.evictions > 0, "{ra:?}");
    let rb = p.b.eng().status().page().report();
    assert!(rb.leases_granted > 16, "leases were recycled: {rb:?}");
}

#[test]
fn a_reset_gives_back_the_windows_of_the_receives_it_discarded() {
    let p = pair(64 * 1024, 16 * 1024);
    let mut b = Buf::new(1 << 20);
    let bmr = p.b.reg(&mut b, IBV_ACCESS_LOCAL_WRITE);
    let (bl, _) = keys(bmr);
    let base = (b.as_ptr() as usize).next_multiple_of(16 * KIB) - b.as_ptr() as usize;
    let post = |i: usize| {
        let mut rs = [sge(&b, base + i * 64 * KIB, 16 * KIB, bl)];
        let mut r = ibv_recv_wr {
            wr_id: i as u64,
            next: core::ptr::null_mut(),
            sg_list: rs.as_mut_ptr(),
            num_sge: 1,
        };
        post_recv(p.qb, &mut r)
    };
    let fallback_pins = || p.b.eng().status().page().report().fallback_pins;
    // Three receives fill the 64 KiB budget (a 4 KiB directory, three 16 KiB windows); the
    // fourth finds no room and is pinned as plain verbs would pin it.
    assert_eq!([post(0), post(1), post(2)], [0, 0, 0]);
    assert_eq!(fallback_pins(), 0);
    assert_eq!(post(3), 0);
    assert_eq!(fallback_pins(), 1);
    // RESET discards them without completions, so their windows are free again: receives
    // elsewhere in the buffer fit once the QP is connected anew.
    let mut reset = ibv_qp_attr {
        qp_state: IBV_QPS_RESET,
        ..Default::default()
    };
    assert_eq!(p.b.modify(p.qb, &mut reset, IBV_QP_STATE), 0);
    p.b.connect(p.qb, qp_num(p.qa), ALL_ACCESS);
    assert_eq!([post(4), post(5), post(6)], [0, 0, 0]);
    assert_eq!(fallback_pins(), 1, "the three fit in windows again");
    assert_eq!(p.b.eng().status().page().report().fallback_bytes, 0);
    assert!(p.b.eng().status().page().report().pinned_peak <= 64 * 1024);
}

/// Posts `count` signaled RDMA WRITEs of `len` bytes from A to B on the pair's QP, the i-th
/// from `i * stride` of A's buffer to `i * stride` of B's (each side's own stride), and waits
/// for their completions.
fn write_each(
    p: &Pair,
    (src, smr, src_stride): (&Buf, *mut ibv_mr, usize),
    (dst, dmr, dst_stride): (&Buf, *mut ibv_mr, usize),
    count: usize,
    len: usize,
) {
    for i in 0..count {
        let mut s = [sge(src, i * src_stride, len, keys(smr).0)];
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            i as u64,
            &mut s,
            dst.as_ptr() as u64 + (i * dst_stride) as u64,
            keys(dmr).1,
            true,
        );
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
    }
    assert_eq!(poll(p.a.cq, count).len(), count);
}

#[test]
fn destroying_a_qp_releases_its_leases() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a = Buf::new(64 * 1024);
    let mut b = Buf::new(1 << 20);
    let amr = p.a.reg(&mut a, ALL_ACCESS);
    let bmr = p.b.reg(&mut b, ALL_ACCESS);
    // 48 windows of 16 KiB leased through B's QP: the leases' whole share (three quarters of
    // B's 1 MiB budget).
    write_each(&p, (&a, amr, 0), (&b, bmr, 16 * KIB), 48, 64);
    assert!(p.b.pinned() >= 48 * 16 * 1024);
    // Receives of one window each on another connection: 16 of them (256 KiB) need more
    // than the quarter the leases leave beside the directories, so the last ones fit only
    // once B's end of the first connection is gone and its leased windows became idle.
    let mut l = Buf::new(256 * KIB);
    let lmr = p.b.reg(&mut l, IBV_ACCESS_LOCAL_WRITE);
    let qa2 = p.a.create_qp(false);
    let qb2 = p.b.create_qp(false);
    connect(&p.a, qa2, &p.b, qb2);
    let recv = |i: usize| {
        let mut rs = [sge(&l, i * 16 * KIB, 16 * KIB, keys(lmr).0)];
        let mut r = ibv_recv_wr {
            wr_id: i as u64,
            next: core::ptr::null_mut(),
            sg_list: rs.as_mut_ptr(),
            num_sge: 1,
        };
        post_recv(qb2, &mut r)
    };
    // A receive that finds no room is pinned as plain verbs would pin it (a fallback pin).
    let fallback_pins = || p.b.eng().status().page().report().fallback_pins;
    let mut posted = 0;
    while posted < 16 {
        assert_eq!(recv(posted), 0);
        posted += 1;
        if fallback_pins() > 0 {
            break;
        }
    }
    assert_eq!(
        fallback_pins(),
        1,
        "the leases still hold: no room for all 16"
    );
    assert_eq!(p.b.destroy_qp(p.qb), 0);
    for i in posted..16 {
        assert_eq!(recv(i), 0);
    }
    assert_eq!(
        fallback_pins(),
        1,
        "the leases ended with the QP: the rest fit in windows"
    );
}

#[test]
fn a_qp_the_provider_refuses_to_destroy_stays_managed() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a = Buf::new(64 * 1024);
    let mut b = Buf::new(64 * 1024);
    fill(&mut a, 3);
    let amr = p.a.reg(&mut a, ALL_ACCESS);
    let bmr = p.b.reg(&mut b, ALL_ACCESS);
    let write = |wr_id: u64, at: usize| {
        let mut s = [sge(&a, at, 4 * KIB, keys(amr).0)];
        let mut wr = rdma(
            IBV_WR_RDMA_WRITE,
            wr_id,
            &mut s,
            b.as_ptr() as u64 + at as u64,
            keys(bmr).1,
            true,
        );
        assert_eq!(post_send(p.qa, &mut wr).0, 0);
        let wc = poll(p.a.cq, 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (wr_id, IBV_WC_SUCCESS));
    };
    write(1, 0);
    // EBUSY (e.g. still attached to a multicast group): the QP lives on, so the library
    // must go on translating its work requests and keep its windows.
    fake::fail_next_destroy(p.qa, libc::EBUSY);
    assert_eq!(p.a.destroy_qp(p.qa), libc::EBUSY);
    write(2, 32 * KIB);
    assert_eq!(&b[32 * KIB..36 * KIB], &a[32 * KIB..36 * KIB]);
    assert_eq!(p.a.destroy_qp(p.qa), 0);
}

#[test]
fn closing_a_context_with_everything_still_open_releases_every_pin() {
    let p = pair(1 << 20, 16 * 1024);
    let mut a = Buf::new(256 * 1024);
    let mut b = Buf::new(256 * 1024);
    let amr = p.a.reg(&mut a, ALL_ACCESS);
    let bmr = p.b.reg(&mut b, ALL_ACCESS);
    let mut ro = Buf::new(16 * KIB);
    let through =
        p.a.reg(&mut ro, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    assert!(!through.is_null());
    write_each(&p, (&a, amr, 64 * KIB), (&b, bmr, 64 * KIB), 4, 4 * KIB);
    let open = p.a.eng().status().page().report();
    assert!(
        open.pinned_bytes > 0 && open.registered_bytes > 0,
        "{open:?}"
    );
    // Neither the MRs nor the QP are destroyed first: the kernel would clean them up with
    // the context, and the library must forget them (and their pins) before that.
    let closed = {
        // SAFETY: the live context of host A, closed once.
        unsafe { nprdma::interpose::close_device(p.a.eng(), p.a.ctx) }
    };
    assert_eq!(closed, 0);
    let closed = p.a.eng().status().page().report();
    assert_eq!(
        (
            closed.pinned_bytes,
            closed.registered_bytes,
            closed.passthrough_bytes
        ),
        (0, 0, 0),
        "{closed:?}"
    );
}

#[test]
fn a_pd_change_that_gives_the_mr_new_keys_keeps_it_translated() {
    let mut a = Host::with_library(1 << 20, 16 * 1024);
    let b = Host::with_library(1 << 20, 16 * 1024);
    let mut src = Buf::new(64 * 1024);
    let mut dst = Buf::new(64 * 1024);
    fill(&mut src, 5);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let old = keys(smr).0;
    let pd2 = fake::alloc_pd(a.ctx);
    // SAFETY: a live MR moved to another live PD of its context.
    let rc = unsafe {
        nprdma::interpose::rereg_mr(
            a.eng(),
            smr,
            IBV_REREG_MR_CHANGE_PD,
            pd2,
            core::ptr::null_mut(),
            0,
            0,
        )
    };
    assert_eq!(rc, 0);
    let new = keys(smr).0;
    assert_ne!(new, old, "this provider gives the MR new keys");
    a.pd = pd2;
    let p = connected(a, b);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    let mut s = [sge(&src, 0, 8 * KIB, new)];
    let mut wr = rdma(
        IBV_WR_RDMA_WRITE,
        9,
        &mut s,
        dst.as_ptr() as u64,
        keys(dmr).1,
        true,
    );
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (9, IBV_WC_SUCCESS));
    assert_eq!(&dst[..8 * KIB], &src[..8 * KIB]);
}

#[test]
fn rereg_access_and_translation() {
    let h = Host::with_library(1 << 20, 16 * 1024);
    let mut buf = Buf::new(256 * 1024);
    let mr = h.reg(&mut buf, ALL_ACCESS);
    let (lkey, _) = keys(mr);
    // SAFETY: live MR; a smaller translation inside the same buffer.
    let rc = unsafe {
        nprdma::interpose::rereg_mr(
            h.eng(),
            mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            core::ptr::null_mut(),
            buf.as_mut_ptr().add(4096).cast(),
            64 * 1024,
            0,
        )
    };
    assert_eq!(rc, 0);
    // SAFETY: live MR.
    unsafe {
        assert_eq!((*mr).addr as usize, buf.as_ptr() as usize + 4096);
        assert_eq!((*mr).length, 64 * 1024);
    }
    assert_eq!(keys(mr).0, lkey, "keys stay");
    // Growing beyond what the directory can describe is refused, the region stays as it was.
    // SAFETY: as above.
    let rc = unsafe {
        nprdma::interpose::rereg_mr(
            h.eng(),
            mr,
            IBV_REREG_MR_CHANGE_TRANSLATION,
            core::ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            64 << 20,
            0,
        )
    };
    assert_eq!(rc, IBV_REREG_MR_ERR_INPUT);
    assert_eq!(h.dereg(mr), 0);
    assert_eq!(h.pinned(), 0);
}

#[test]
fn a_refused_single_warm_wr_reports_the_provider_error_and_leaves_no_trace() {
    // A lone WR inside warm windows is posted straight from the stack (docs/connectx.md §3);
    // when the provider refuses it, the application must see plain verbs' answer: the errno,
    // `bad_wr` at its WR, no completion, no bytes moved, and the QP usable afterwards.
    let p = pair(1 << 20, 64 * 1024);
    let mut src = Buf::new(64 * KIB);
    let mut dst = Buf::new(64 * KIB);
    fill(&mut src, 5);
    let smr = p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let dmr = p.b.reg(&mut dst, ALL_ACCESS);
    let (slkey, _) = keys(smr);
    let (_, drkey) = keys(dmr);
    let base = dst.as_ptr() as u64;
    // Warm: local window registered, remote window leased.
    let mut s = [sge(&src, 0, 64, slkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 1, &mut s, base, drkey, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, IBV_WC_SUCCESS));
    // A QP outside RTS/ERR refuses posts with EINVAL (the fake lets the test move it back to
    // RTR and then to RTS again).
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        ..Default::default()
    };
    assert_eq!(p.a.modify(p.qa, &mut attr, IBV_QP_STATE), 0);
    let mut s = [sge(&src, 64, 64, slkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 2, &mut s, base + 64, drkey, true);
    let (rc, bad) = post_send(p.qa, &mut wr);
    assert_eq!(rc, libc::EINVAL);
    assert_eq!(bad, &mut wr as *mut ibv_send_wr);
    assert!(poll_rest(p.a.cq).is_empty());
    assert!(dst[64..128].iter().all(|b| *b == 0));
    attr.qp_state = IBV_QPS_RTS;
    assert_eq!(p.a.modify(p.qa, &mut attr, IBV_QP_STATE), 0);
    let mut s = [sge(&src, 128, 64, slkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 3, &mut s, base + 128, drkey, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (3, IBV_WC_SUCCESS));
    assert!(poll_rest(p.a.cq).is_empty(), "nothing of the refused WR");
    assert_eq!(&dst[128..192], &src[128..192]);
    assert!(dst[64..128].iter().all(|b| *b == 0));
}

/// The `ibv_wr_*` calls of `write_inline` for one WR: `wr_id`, signaled, an inline RDMA WRITE
/// of `bytes` to `raddr` with `rkey`.
///
/// # Safety
/// `qpx` is a live QP's `ibv_qp_ex` inside an open batch.
unsafe fn wr_write_inline(qpx: *mut ibv_qp_ex, wr_id: u64, rkey: u32, raddr: u64, bytes: &[u8]) {
    // SAFETY: per the contract.
    unsafe {
        let q = &mut *qpx;
        q.wr_id = wr_id;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, rkey, raddr);
        (q.wr_set_inline_data.unwrap())(qpx, bytes.as_ptr() as *mut _, bytes.len());
    }
}

/// Two hosts with the library, 16 KiB windows: an extended QP on `a` (the `ibv_wr_*` side)
/// connected to a plain QP on `b`, a source buffer on `a` (filled from `seed`) and a
/// destination on `b`, with their keys.
struct BuilderPair {
    a: Host,
    _b: Host,
    qa: *mut ibv_qp,
    qpx: *mut ibv_qp_ex,
    src: Buf,
    dst: Buf,
    /// `src`'s lkey.
    sl: u32,
    /// `dst`'s rkey.
    dr: u32,
    /// `dst`'s address.
    base: u64,
}

impl BuilderPair {
    fn new(seed: u64) -> Self {
        let a = Host::with_library(1 << 20, 16 * 1024);
        let b = Host::with_library(1 << 20, 16 * 1024);
        let qa = a.create_qp_ex();
        let qb = b.create_qp(false);
        connect(&a, qa, &b, qb);
        let mut src = Buf::new(64 * 1024);
        let mut dst = Buf::new(64 * 1024);
        fill(&mut src, seed);
        let (sl, _) = keys(a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
        let (_, dr) = keys(b.reg(&mut dst, ALL_ACCESS));
        let base = dst.as_ptr() as u64;
        Self {
            a,
            _b: b,
            qa,
            qpx: qa.cast::<ibv_qp_ex>(),
            src,
            dst,
            sl,
            dr,
            base,
        }
    }
}

#[test]
fn warm_inline_builder_wrs_go_to_the_providers_builder_unrecorded_and_in_order() {
    let p = BuilderPair::new(5);
    let (a, qa, qpx, sl, dr, base) = (&p.a, p.qa, p.qpx, p.sl, p.dr, p.base);
    let (src, dst) = (&p.src, &p.dst);
    // SAFETY: ibv_wr_start on the live QP's ibv_qp_ex.
    let start = |q: *mut ibv_qp_ex| unsafe { ((*q).wr_start.unwrap())(q) };
    // SAFETY: ibv_wr_complete on the live QP's ibv_qp_ex.
    let complete = |q: *mut ibv_qp_ex| unsafe { ((*q).wr_complete.unwrap())(q) };
    // Cold: the first touch of the peer's window needs the library (lease, key).
    start(qpx);
    // SAFETY: inside the open batch.
    unsafe { wr_write_inline(qpx, 1, dr, base, b"cold") };
    assert_eq!(complete(qpx), 0);
    assert_eq!(fake::builder_posts(qa), 0, "a cold WR is the library's");
    // Warm: the same window; the provider builds it, with the application's wr_id.
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 2, dr, base + 8, b"warm") };
    assert_eq!(complete(qpx), 0);
    assert_eq!(fake::builder_posts(qa), 1);
    // A batch mixing kinds keeps its order: warm (provider), an SGE WRITE (library: it pins a
    // local window), then a warm inline one that must stay behind it (library too).
    start(qpx);
    // SAFETY: as above.
    unsafe {
        wr_write_inline(qpx, 3, dr, base + 16, b"first");
        let q = &mut *qpx;
        q.wr_id = 4;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, dr, base + 32);
        (q.wr_set_sge.unwrap())(qpx, sl, src.as_ptr() as u64 + 100, 16);
        wr_write_inline(qpx, 5, dr, base + 16, b"third");
    }
    assert_eq!(complete(qpx), 0);
    assert_eq!(
        fake::builder_posts(qa),
        2,
        "only the leading warm WR went to the provider"
    );
    let ids: Vec<(u64, u32)> = poll(a.cq, 5).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ids, vec![(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)]);
    assert_eq!(&dst[0..4], b"cold");
    assert_eq!(&dst[8..12], b"warm");
    assert_eq!(&dst[16..21], b"third", "the later WRITE landed last");
    assert_eq!(&dst[32..48], &src[100..116]);
    // Aborted or restarted after a hand-over: the provider's batch is dropped too.
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 6, dr, base + 64, b"aborted") };
    // SAFETY: the open batch.
    unsafe { ((*qpx).wr_abort.unwrap())(qpx) };
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 7, dr, base + 80, b"dropped") };
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 8, dr, base + 96, b"restarted") };
    assert_eq!(complete(qpx), 0);
    assert_eq!(poll(a.cq, 1)[0].wr_id, 8);
    assert_eq!(&dst[64..71], &[0u8; 7]);
    assert_eq!(&dst[80..87], &[0u8; 7]);
    assert_eq!(&dst[96..105], b"restarted");
    // A second data setter for a WR handed over at its opcode call (the peer window covers
    // the QP's whole inline limit from there) goes to the provider too, whose rule applies as
    // without the library (the fake's: the last one wins).
    start(qpx);
    // SAFETY: as above.
    unsafe {
        wr_write_inline(qpx, 9, dr, base + 128, b"once");
        let again = b"twice";
        ((*qpx).wr_set_inline_data.unwrap())(qpx, again.as_ptr() as *mut _, again.len());
    }
    assert_eq!(complete(qpx), 0);
    assert_eq!(poll(a.cq, 1)[0].wr_id, 9);
    assert_eq!(&dst[128..133], b"twice");
    // One handed over at its data setter instead (its remote address is 8 bytes before the
    // end of the peer window, which the QP's 64-byte inline limit would cross): a second data
    // setter is refused, and nothing of the batch posts.
    let edge = (base | (16 * 1024 - 1)) + 1 - 8;
    let before = fake::builder_posts(qa);
    start(qpx);
    // SAFETY: as above.
    unsafe {
        wr_write_inline(qpx, 12, dr, edge, b"once");
        let again = b"twice";
        ((*qpx).wr_set_inline_data.unwrap())(qpx, again.as_ptr() as *mut _, again.len());
    }
    assert_eq!(complete(qpx), libc::EOPNOTSUPP);
    assert_eq!(fake::builder_posts(qa), before);
    assert!(poll_rest(a.cq).is_empty());
    let at = (edge - base) as usize;
    assert_eq!(&dst[at..at + 4], &[0u8; 4]);
    // An inline payload larger than the QP takes fails in the provider, as without the
    // library, and posts nothing.
    let big = vec![7u8; 65];
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 10, dr, base + 256, &big) };
    assert_ne!(complete(qpx), 0);
    assert!(poll_rest(a.cq).is_empty());
    // The QP still works.
    start(qpx);
    // SAFETY: as above.
    unsafe { wr_write_inline(qpx, 11, dr, base + 512, b"still fine") };
    assert_eq!(complete(qpx), 0);
    assert_eq!(poll(a.cq, 1)[0].wr_id, 11);
}

#[test]
fn unrecorded_completions_mix_with_recorded_ones_and_errors_reach_the_right_wr() {
    let Pair { a, b, qa, .. } = pair(1 << 20, 16 * 1024);
    let mut src = Buf::new(64 * 1024);
    let mut dst = Buf::new(64 * 1024);
    fill(&mut src, 8);
    let (sl, _) = keys(a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (_, dr) = keys(b.reg(&mut dst, ALL_ACCESS));
    let base = dst.as_ptr() as u64;
    let inline_write = |wr_id: u64, off: u64, data: &[u8; 8], signaled: bool| {
        let mut s = [ibv_sge {
            addr: data.as_ptr() as u64,
            length: data.len() as u32,
            lkey: 0,
        }];
        let mut wr = rdma(IBV_WR_RDMA_WRITE, wr_id, &mut s, base + off, dr, signaled);
        wr.send_flags |= IBV_SEND_INLINE;
        post_send(qa, &mut wr).0
    };
    // Warm the window, then interleave unrecorded (inline) and recorded (SGE) WRs, with
    // application wr_ids that look like anything, including small numbers and bit 63.
    assert_eq!(inline_write(0, 0, b"warm-up!", true), 0);
    let mut expect = vec![0u64];
    for (i, id) in [1u64, 2, 1 << 63, u64::MAX, 3, (1 << 63) | 1]
        .iter()
        .enumerate()
    {
        let off = 64 + 64 * i as u64;
        if i % 2 == 0 {
            assert_eq!(inline_write(*id, off, b"inline..", true), 0);
        } else {
            let mut s = [sge(&src, 64 * i, 32, sl)];
            let mut wr = rdma(IBV_WR_RDMA_WRITE, *id, &mut s, base + off, dr, true);
            assert_eq!(post_send(qa, &mut wr).0, 0);
        }
        expect.push(*id);
    }
    // An unsignaled unrecorded WR completes silently, as without the library.
    assert_eq!(inline_write(77, 1024, b"silent..", false), 0);
    let got: Vec<u64> = poll(a.cq, expect.len()).iter().map(|w| w.wr_id).collect();
    assert_eq!(got, expect);
    assert!(poll_rest(a.cq).is_empty());
    assert_eq!(&dst[1024..1032], b"silent..");
    // An unrecorded WR that fails at the responder (outside the peer's window range is not
    // warm, so use a bad key: the same region's key plus one is nobody's) reports its own
    // wr_id with bit 63 set, not taken for a receive; later WRs flush with theirs.
    let mut s = [sge(&src, 0, 8, sl)];
    let mut bad = rdma(
        IBV_WR_RDMA_WRITE,
        (1 << 63) | 5,
        &mut s,
        base,
        dr ^ 0x55,
        true,
    );
    bad.send_flags |= IBV_SEND_INLINE;
    assert_eq!(post_send(qa, &mut bad).0, 0);
    assert_eq!(inline_write(6, 0, b"flushed.", true), 0);
    let wcs = poll(a.cq, 2);
    assert_eq!(wcs[0].wr_id, (1 << 63) | 5);
    assert_ne!(wcs[0].status, IBV_WC_SUCCESS);
    assert_eq!((wcs[1].wr_id, wcs[1].status), (6, IBV_WC_WR_FLUSH_ERR));
}

#[test]
fn extended_cq_receive_completions_carry_the_applications_wr_ids() {
    // A receiver that polls an extended CQ: the library tells its receives from its sends by
    // the opcode, which it must read itself (the session shows only wr_id and status).
    let mut a = Host::with_library(1 << 20, 16 * 1024);
    let cqx = a.use_cq_ex(0);
    let Pair { a, b, qa, qb } = connected(a, Host::with_library(1 << 20, 16 * 1024));
    let mut rbuf = Buf::new(64 * 1024);
    let mut sbuf = Buf::new(64 * 1024);
    fill(&mut sbuf, 21);
    let (rl, _) = keys(a.reg(&mut rbuf, IBV_ACCESS_LOCAL_WRITE));
    let (sl, _) = keys(b.reg(&mut sbuf, IBV_ACCESS_LOCAL_WRITE));
    // wr_id 0 (as many applications use), one across a window edge, one without an SGE, and
    // one left outstanding for the flush.
    let mut r0 = [sge(&rbuf, 100, 4 * KIB, rl)];
    let mut r1 = [sge(&rbuf, 14 * KIB, 4 * KIB, rl)];
    let mut r3 = [sge(&rbuf, 40 * KIB, 4 * KIB, rl)];
    for (wr_id, s) in [
        (0u64, r0.as_mut_ptr()),
        (0x77, r1.as_mut_ptr()),
        (0x78, core::ptr::null_mut()),
        (0x79, r3.as_mut_ptr()),
    ] {
        let mut rwr = ibv_recv_wr {
            wr_id,
            next: core::ptr::null_mut(),
            sg_list: s,
            num_sge: i32::from(!s.is_null()),
        };
        assert_eq!(post_recv(qa, &mut rwr), 0);
    }
    for (i, (off, len)) in [(0usize, 4 * KIB), (8 * KIB, 4 * KIB), (0, 0)]
        .into_iter()
        .enumerate()
    {
        let mut s = [sge(&sbuf, off, len, sl)];
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = 0x500 + i as u64;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        if len > 0 {
            wr.sg_list = s.as_mut_ptr();
            wr.num_sge = 1;
        }
        assert_eq!(post_send(qb, &mut wr).0, 0);
    }
    let sent = poll(b.cq, 3);
    assert!(sent.iter().all(|w| w.status == IBV_WC_SUCCESS), "{sent:x?}");
    let mut got = Vec::new();
    while got.len() < 3 {
        got.extend(poll_ex(cqx));
    }
    assert_eq!(
        got.iter()
            .map(|e| (e.wr_id, e.status, e.opcode))
            .collect::<Vec<_>>(),
        [0u64, 0x77, 0x78]
            .map(|id| (id, IBV_WC_SUCCESS, IBV_WC_RECV))
            .to_vec(),
        "{got:x?}"
    );
    assert_eq!(&rbuf[100..100 + 4 * KIB], &sbuf[..4 * KIB]);
    assert_eq!(&rbuf[14 * KIB..18 * KIB], &sbuf[8 * KIB..12 * KIB]);
    // The outstanding receive is flushed with its own wr_id (an error completion's opcode is
    // undefined: the library goes by the wr_id).
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    assert_eq!(a.modify(qa, &mut attr, IBV_QP_STATE), 0);
    let mut flushed = Vec::new();
    for _ in 0..1000 {
        flushed.extend(poll_ex(cqx));
        if !flushed.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        flushed
            .iter()
            .map(|e| (e.wr_id, e.status))
            .collect::<Vec<_>>(),
        vec![(0x79, IBV_WC_WR_FLUSH_ERR)],
        "{flushed:x?}"
    );
}

/// Posts one signaled 64-byte-or-so RDMA WRITE on `qp` and waits for its completion on `cq`;
/// returns the `wr_id` the provider saw.
#[allow(clippy::too_many_arguments)]
fn write_and_wait(
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    src: &Buf,
    off: usize,
    len: usize,
    lkey: u32,
    raddr: u64,
    rkey: u32,
    wr_id: u64,
) -> (u32, u64) {
    let mut s = [sge(src, off, len, lkey)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, wr_id, &mut s, raddr, rkey, true);
    let rc = post_send(qp, &mut wr).0;
    assert_eq!(rc, 0);
    let wc = poll(cq, 1);
    assert_eq!(wc.len(), 1, "one completion: {wc:x?}");
    assert_eq!(wc[0].wr_id, wr_id, "{wc:x?}");
    (wc[0].status, fake::last_wr_id(qp))
}

#[test]
fn warm_sges_in_a_held_window_go_unrecorded_until_the_qp_moves_on() {
    let p = pair(1 << 20, 16 * 1024);
    let mut src = Buf::new(64 * KIB);
    let mut dst = Buf::new(64 * KIB);
    fill(&mut src, 31);
    let (sl, _) = keys(p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (_, dr) = keys(p.b.reg(&mut dst, ALL_ACCESS));
    let base = dst.as_ptr() as u64;
    let write = |wr_id: u64, off: usize| {
        let (status, seen) = write_and_wait(
            p.qa,
            p.a.cq,
            &src,
            off,
            64,
            sl,
            base + off as u64,
            dr,
            wr_id,
        );
        assert_eq!(status, IBV_WC_SUCCESS, "WR {wr_id}");
        seen
    };
    // A first touch (of the peer's window) takes the general path; the first warm WR takes
    // the hold (it pins the window for itself and is recorded); later WRs inside the window
    // are posted as the application's own.
    write(1, 100);
    assert_ne!(write(2, 200), 2, "the WR that takes the hold is recorded");
    for i in 3..10u64 {
        assert_eq!(write(i, 100 * i as usize), i, "a WR in the held window");
    }
    // Another window (a first touch again, then warm): the hold moves there (that WR
    // recorded, the next one not).
    write(20, 20 * KIB);
    assert_ne!(write(21, 20 * KIB + 100), 21);
    assert_eq!(write(22, 20 * KIB + 200), 22);
    // Back in the first window: moved again.
    assert_ne!(write(23, 1000), 23);
    assert_eq!(write(24, 1100), 24);
    for off in [
        100,
        200,
        300,
        900,
        1000,
        1100,
        20 * KIB,
        20 * KIB + 100,
        20 * KIB + 200,
    ] {
        assert_eq!(&dst[off..off + 64], &src[off..off + 64], "offset {off}");
    }
    // Nothing stays pinned for the moved holds beyond the one held window and the budget.
    assert!(p.a.pinned() <= 1 << 20);
}

#[test]
fn held_windows_come_back_when_the_budget_needs_them() {
    // `q1` holds a window and goes quiet; `q2` fills the budget with posted receives (which
    // keep their windows until a message arrives) and asks for one window more: only the
    // held one can make room.
    let budget = 256 * 1024u64;
    let win = 16 * KIB;
    let a = Host::with_library(budget, win as u64);
    let b = Host::with_library(8 << 20, win as u64);
    let (q1, q2) = (a.create_qp(false), a.create_qp(false));
    let (r1, r2) = (b.create_qp(false), b.create_qp(false));
    connect(&a, q1, &b, r1);
    connect(&a, q2, &b, r2);
    let mut src = Buf::new(1 << 20);
    let mut dst = Buf::new(64 * KIB);
    fill(&mut src, 41);
    let (sl, _) = keys(a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (_, dr) = keys(b.reg(&mut dst, ALL_ACCESS));
    let base = dst.as_ptr() as u64;
    // Windows are aligned in the region's address space: offsets of whole windows.
    let first = (win - src.as_ptr() as usize % win) % win;
    let at = |w: usize| first + w * win;
    for (i, off) in [100usize, 200, 300].into_iter().enumerate() {
        let (status, seen) = write_and_wait(
            q1,
            a.cq,
            &src,
            at(0) + off,
            64,
            sl,
            base + off as u64,
            dr,
            i as u64,
        );
        assert_eq!(status, IBV_WC_SUCCESS);
        if i == 2 {
            assert_eq!(seen, 2, "q1 holds a window");
        }
    }
    let pinned = || a.eng().status().page().report().pinned_bytes;
    let receive = |wr_id: u64, w: usize| {
        let mut rs = [sge(&src, at(w), win, sl)];
        let mut rwr = ibv_recv_wr {
            wr_id,
            next: core::ptr::null_mut(),
            sg_list: rs.as_mut_ptr(),
            num_sge: 1,
        };
        post_recv(q2, &mut rwr)
    };
    let mut window = 1usize;
    while pinned() + win as u64 <= budget {
        assert_eq!(
            receive(0x1000 + window as u64, window),
            0,
            "receive {window}"
        );
        window += 1;
    }
    assert!(window > 2, "the budget took some receives");
    assert_eq!(
        receive(0x2000, window),
        0,
        "the held window was taken back for the receive"
    );
    assert!(pinned() <= budget);
    // The barrier that released the hold stays hidden.
    assert!(poll_rest(a.cq).is_empty());
    // With the receives gone, q1 works on with its own wr_ids.
    assert_eq!(a.destroy_qp(q2), 0);
    let (status, _) = write_and_wait(q1, a.cq, &src, at(0) + 400, 64, sl, base + 400, dr, 77);
    assert_eq!(status, IBV_WC_SUCCESS);
    assert!(poll_rest(a.cq).is_empty());
    for off in [100, 200, 300, 400] {
        assert_eq!(&dst[off..off + 64], &src[at(0) + off..at(0) + off + 64]);
    }
}

#[test]
fn a_held_window_of_a_deregistered_region_is_not_used() {
    let p = pair(1 << 20, 16 * 1024);
    let mut src = Buf::new(64 * KIB);
    let mut dst = Buf::new(64 * KIB);
    fill(&mut src, 51);
    let smr = p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let (sl, _) = keys(smr);
    let (_, dr) = keys(p.b.reg(&mut dst, ALL_ACCESS));
    let base = dst.as_ptr() as u64;
    for i in 0..3u64 {
        let (status, _) = write_and_wait(p.qa, p.a.cq, &src, 64, 64, sl, base, dr, i);
        assert_eq!(status, IBV_WC_SUCCESS);
    }
    assert_eq!(p.a.dereg(smr), 0);
    // The same region registered again (a new lkey); the old one must fail as on plain verbs.
    let (sl2, _) = keys(p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (status, _) = write_and_wait(p.qa, p.a.cq, &src, 64, 64, sl, base, dr, 9);
    assert_eq!(status, IBV_WC_LOC_PROT_ERR);
    // The QP is in error now, as on plain verbs; a new one works with the new key.
    let qa2 = p.a.create_qp(false);
    let qb2 = p.b.create_qp(false);
    connect(&p.a, qa2, &p.b, qb2);
    for i in 10..13u64 {
        let (status, _) = write_and_wait(qa2, p.a.cq, &src, 128, 64, sl2, base + 128, dr, i);
        assert_eq!(status, IBV_WC_SUCCESS);
    }
    assert_eq!(&dst[128..192], &src[128..192]);
}

#[test]
fn completions_left_in_the_cq_by_a_destroyed_qp_carry_the_applications_wr_ids() {
    let p = pair(1 << 20, 16 * 1024);
    let mut src = Buf::new(64 * KIB);
    let mut dst = Buf::new(64 * KIB);
    fill(&mut src, 61);
    let (sl, _) = keys(p.a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE));
    let (_, dr) = keys(p.b.reg(&mut dst, ALL_ACCESS));
    let base = dst.as_ptr() as u64;
    // Warm both windows on both sides, then post a WR split across them without polling.
    let (status, _) = write_and_wait(p.qa, p.a.cq, &src, 0, 32 * 1024, sl, base, dr, 1);
    assert_eq!(status, IBV_WC_SUCCESS);
    let mut s = [sge(&src, 8 * 1024, 16 * 1024, sl)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 0xdead, &mut s, base + 8192, dr, true);
    assert_eq!(post_send(p.qa, &mut wr).0, 0);
    // The fake, like rxe, leaves a destroyed QP's completions in its CQ.
    assert_eq!(p.a.destroy_qp(p.qa), 0);
    let wc = poll(p.a.cq, 1);
    assert_eq!(wc.len(), 1, "{wc:x?}");
    assert_eq!((wc[0].wr_id, wc[0].status), (0xdead, IBV_WC_SUCCESS));
    assert!(
        poll_rest(p.a.cq).is_empty(),
        "the library's parts stay hidden"
    );
    assert_eq!(&dst[8 * KIB..24 * KIB], &src[8 * KIB..24 * KIB]);
}

#[test]
fn a_builder_wr_handed_over_at_its_opcode_is_taken_back_for_an_sge() {
    let p = BuilderPair::new(9);
    let (a, qa, qpx, sl, dr, base) = (&p.a, p.qa, p.qpx, p.sl, p.dr, p.base);
    let (src, dst) = (&p.src, &p.dst);
    // The address of the QP's current `wr_set_inline_data`.
    let inline_setter = |q: *mut ibv_qp_ex| {
        // SAFETY: the live QP's ibv_qp_ex.
        unsafe { (*q).wr_set_inline_data }.map_or(0, |f| f as usize)
    };
    let setter = inline_setter(qpx);
    // SAFETY: ibv_wr_start / ibv_wr_complete on the live QP's ibv_qp_ex.
    let start = |q: *mut ibv_qp_ex| unsafe { ((*q).wr_start.unwrap())(q) };
    // SAFETY: as above.
    let complete = |q: *mut ibv_qp_ex| unsafe { ((*q).wr_complete.unwrap())(q) };
    // Warm the peer window (the first touch is the library's).
    start(qpx);
    // SAFETY: inside the open batch.
    unsafe { wr_write_inline(qpx, 1, dr, base, b"warm") };
    assert_eq!(complete(qpx), 0);
    assert_eq!(poll(a.cq, 1)[0].wr_id, 1);
    assert_eq!(inline_setter(qpx), setter, "restored after the batch");
    // A warm WRITE goes to the provider at its opcode call; an SGE setter then takes it back:
    // the provider's batch is aborted and the library posts the WR, with its local window.
    let posts = fake::builder_posts(qa);
    start(qpx);
    // SAFETY: inside the open batch (the QP's fields through its pointer only).
    unsafe {
        (*qpx).wr_id = 2;
        (*qpx).wr_flags = IBV_SEND_SIGNALED;
        ((*qpx).wr_rdma_write.unwrap())(qpx, dr, base + 64);
    }
    assert_ne!(
        inline_setter(qpx),
        setter,
        "the provider's inline setter meanwhile"
    );
    // SAFETY: as above.
    unsafe { ((*qpx).wr_set_sge.unwrap())(qpx, sl, src.as_ptr() as u64 + 512, 32) };
    assert_eq!(inline_setter(qpx), setter);
    assert_eq!(complete(qpx), 0);
    assert_eq!(
        fake::builder_posts(qa),
        posts,
        "the aborted WR did not post"
    );
    let wcs = poll(a.cq, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, IBV_WC_SUCCESS));
    assert_eq!(&dst[64..96], &src[512..544]);
    assert!(poll_rest(a.cq).is_empty(), "exactly one completion");
    // A setter that moves the batch to its general form while the WR is the provider's
    // (`ibv_wr_set_xrc_srqn`, meaningless on RC), then an SGE setter and a second WR: both
    // WRs post, in order.
    start(qpx);
    // SAFETY: inside the open batch (the QP's fields through its pointer only).
    unsafe {
        (*qpx).wr_id = 4;
        (*qpx).wr_flags = IBV_SEND_SIGNALED;
        ((*qpx).wr_rdma_write.unwrap())(qpx, dr, base + 256);
        ((*qpx).wr_set_xrc_srqn.unwrap())(qpx, 7);
        ((*qpx).wr_set_sge.unwrap())(qpx, sl, src.as_ptr() as u64 + 1024, 16);
        wr_write_inline(qpx, 5, dr, base + 512, b"second");
    }
    assert_eq!(complete(qpx), 0);
    let ids: Vec<(u64, u32)> = poll(a.cq, 2).iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(ids, vec![(4, IBV_WC_SUCCESS), (5, IBV_WC_SUCCESS)]);
    assert_eq!(&dst[256..272], &src[1024..1040]);
    assert_eq!(&dst[512..518], b"second");
    // An abort right after a hand-over drops it and restores the setter.
    start(qpx);
    // SAFETY: inside the open batch.
    unsafe {
        let q = &mut *qpx;
        q.wr_id = 3;
        q.wr_flags = IBV_SEND_SIGNALED;
        (q.wr_rdma_write.unwrap())(qpx, dr, base + 128);
        (q.wr_abort.unwrap())(qpx);
    }
    assert_eq!(inline_setter(qpx), setter);
    assert!(poll_rest(a.cq).is_empty());
    assert_eq!(fake::builder_posts(qa), posts);
}

/// One SGE at the end of a page followed by an inaccessible page: reading a second entry of
/// the list faults.
fn sge_before_guard_page(s: ibv_sge) -> *mut ibv_sge {
    // SAFETY: a private mapping of two pages this test owns; the second is made inaccessible
    // and the SGE is written at the very end of the first.
    unsafe {
        let p = libc::mmap(
            core::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        assert_eq!(
            libc::mprotect(p.cast::<u8>().add(4096).cast(), 4096, libc::PROT_NONE),
            0
        );
        let at = p
            .cast::<u8>()
            .add(4096 - core::mem::size_of::<ibv_sge>())
            .cast::<ibv_sge>();
        at.write(s);
        at
    }
}

#[test]
fn a_num_sge_above_the_limit_is_refused_before_the_list_is_read() {
    let h = Host::with_library(1 << 20, 64 * 1024);
    let qp = h.create_qp(false);
    let mut buf = Buf::new(64 * 1024);
    let mr = h.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    let list = sge_before_guard_page(sge(&buf, 0, 64, keys(mr).0));
    // A receive claiming 2^20 entries: EINVAL, no read past the one real entry.
    let mut wr = ibv_recv_wr {
        wr_id: 1,
        next: core::ptr::null_mut(),
        sg_list: list,
        num_sge: 1 << 20,
    };
    assert_eq!(post_recv(qp, &mut wr), libc::EINVAL);
    // A send claiming 100 entries.
    let mut wr = ibv_send_wr::zeroed();
    wr.opcode = IBV_WR_SEND;
    wr.sg_list = list;
    wr.num_sge = 100;
    let (rc, bad) = post_send(qp, &mut wr);
    assert_eq!((rc, bad), (libc::EINVAL, &mut wr as *mut ibv_send_wr));
}
