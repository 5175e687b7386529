//! The ODP mode (docs/connectx.md §9a) on the fake provider: devices that report on-demand
//! paging and move its data right, devices that report it and move it wrong (as Soft-RoCE of
//! Linux 7.2/7.3 does), devices that lack it, and each `NPRDMA_MODE`.

mod common;

use common::*;
use nprdma::config::{Config, Mode, RegMode};
use nprdma::doctor::Report;
use nprdma::fake_odp;
use nprdma::status::{MrMode, PageStore, SelfTest};
use nprdma::sys::*;
use nprdma::{fake, interpose as ip};

const MIB: usize = 1 << 20;

/// A host with the library in `mode` on the fake device `dev`.
fn host(dev: *mut ibv_device, mode: RegMode) -> Host {
    let mut cfg = Config::for_tests(16 << 20, 1 << 20);
    cfg.reg_mode = mode;
    if mode == RegMode::Off {
        cfg.mode = Mode::Off;
    }
    let store = PageStore::heap(&cfg);
    Host::on_device(cfg, store, dev)
}

fn report(h: &Host) -> Report {
    h.eng().status().page().report()
}

/// The mode doctor shows for `mr`.
fn mode_of(h: &Host, mr: *mut ibv_mr) -> MrMode {
    let (lkey, _) = keys(mr);
    let r = report(h);
    let found: Vec<_> = r.mrs.iter().filter(|m| m.lkey == lkey).collect();
    assert_eq!(found.len(), 1, "{:?}", r.mrs);
    found[0].mode
}

/// A SEND of `len` bytes from `src` (key `lkey`) on `qs`, received into `dst` (key `rkey_l`,
/// the receiver's lkey) on `qr`; both completions must succeed.
#[allow(clippy::too_many_arguments)]
fn send_recv(
    s: &Host,
    qs: *mut ibv_qp,
    src: &[u8],
    lkey: u32,
    r: &Host,
    qr: *mut ibv_qp,
    dst: &[u8],
    rlkey: u32,
    len: usize,
) {
    let mut rs = [sge(dst, 0, len, rlkey)];
    let mut rwr = ibv_recv_wr {
        wr_id: 77,
        next: core::ptr::null_mut(),
        sg_list: rs.as_mut_ptr(),
        num_sge: 1,
    };
    assert_eq!(post_recv(qr, &mut rwr), 0);
    let mut ss = [sge(src, 0, len, lkey)];
    let mut wr = ibv_send_wr::zeroed();
    wr.wr_id = 78;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = ss.as_mut_ptr();
    wr.num_sge = 1;
    assert_eq!(post_send(qs, &mut wr).0, 0);
    let w = poll(s.cq, 1);
    assert_eq!((w.len(), w[0].status, w[0].wr_id), (1, IBV_WC_SUCCESS, 78));
    let w = poll(r.cq, 1);
    assert_eq!((w.len(), w[0].status, w[0].wr_id), (1, IBV_WC_SUCCESS, 77));
    assert_eq!(&dst[..len], &src[..len]);
}

#[test]
fn auto_keeps_windows_for_regions_peers_may_reach_and_odp_forced_gives_them_odp() {
    // A peer running the library over a connection without a control connection looks up a
    // key at its IOVA 0 (docs/connectx.md §5), which an ODP MR lacks: auto keeps windows for
    // every region with a remote right.
    let a = host(fake_odp::device_with_odp(), RegMode::Auto);
    for right in [
        IBV_ACCESS_REMOTE_READ,
        IBV_ACCESS_REMOTE_WRITE,
        IBV_ACCESS_REMOTE_ATOMIC,
    ] {
        let mut buf = Buf::new(MIB);
        let mr = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE | right);
        assert_eq!(mode_of(&a, mr), MrMode::Windows, "right {right:#x}");
        assert_eq!(a.dereg(mr), 0);
    }
    let mut local = Buf::new(MIB);
    let mr = a.reg(&mut local, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(mode_of(&a, mr), MrMode::Odp);
    assert!(
        report(&a)
            .reasons
            .iter()
            .any(|r| r.contains("regions with remote rights keep windows"))
    );
}

#[test]
fn a_good_odp_device_registers_on_demand_without_directory_or_windows() {
    // `odp`, so that the region with every right is an ODP MR too (auto keeps windows for it,
    // test above); the device test, the MR and the data path are those of auto.
    let a = host(fake_odp::device_with_odp(), RegMode::Odp);
    let b = Host::plain();
    let mut buf = Buf::new(4 * MIB);
    let mr = a.reg(&mut buf, ALL_ACCESS);
    assert!(!mr.is_null());
    // The provider's own MR over the application's range: nothing pinned, no directory
    // (the self-test's objects are gone: this is the context's only MR).
    // SAFETY: a live MR.
    let range = unsafe { ((*mr).addr as u64, (*mr).length) };
    assert_eq!(range, (buf.as_ptr() as u64, 4 * MIB));
    assert_eq!(fake::pinned(a.ctx), 0);
    assert_eq!(fake::mr_count(a.ctx), 1);
    let r = report(&a);
    assert_eq!(r.reg_mode, "odp");
    assert_eq!((r.regions, r.registered_bytes), (0, 0));
    assert_eq!((r.odp_mrs, r.odp_bytes), (1, 4 * MIB as u64));
    assert_eq!(r.devices.len(), 1);
    let d = &r.devices[0];
    assert_eq!(
        (d.name.as_str(), d.odp, d.self_test),
        ("fake_odp0", true, SelfTest::Passed)
    );
    assert_eq!(d.odp_general_caps & IBV_ODP_SUPPORT, IBV_ODP_SUPPORT);
    assert_eq!(mode_of(&a, mr), MrMode::Odp);

    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    // A peer without the library reaches the region with its rkey, as with plain verbs
    // (through windows it would get IBV_WC_REM_ACCESS_ERR, docs/connectx.md §8).
    let mut src = Buf::new(64 << 10);
    fill(&mut src, 3);
    let smr = b.reg(&mut src, ALL_ACCESS);
    let (_, rkey) = keys(mr);
    let raddr = buf.as_ptr() as u64 + 3 * MIB as u64 + 1000;
    let mut s = [sge(&src, 0, 60_000, keys(smr).0)];
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 5, &mut s, raddr, rkey, true);
    assert_eq!(post_send(qb, &mut wr).0, 0);
    let w = poll(b.cq, 1);
    assert_eq!(w[0].status, IBV_WC_SUCCESS);
    let off = 3 * MIB + 1000;
    assert_eq!(&buf[off..off + 60_000], &src[..60_000]);
    // The library's side posts with the MR's own key, untranslated, both ways.
    let mut back = Buf::new(64 << 10);
    let bmr = b.reg(&mut back, ALL_ACCESS);
    send_recv(
        &a,
        qa,
        &buf[off..],
        keys(mr).0,
        &b,
        qb,
        &back,
        keys(bmr).0,
        60_000,
    );
    send_recv(&b, qb, &src, keys(smr).0, &a, qa, &buf, keys(mr).0, 40_000);
    let r = report(&a);
    assert_eq!((r.windows, r.window_registrations), (0, 0));
    assert_eq!(fake::pinned(a.ctx), 0);

    // A second registration on the device does not run the test again, and
    // deregistration forgets the MR.
    let mut more = Buf::new(MIB);
    let mr2 = a.reg(&mut more, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(mode_of(&a, mr2), MrMode::Odp);
    assert_eq!(report(&a).devices.len(), 1);
    assert_eq!(a.dereg(mr2), 0);
    assert_eq!(a.dereg(mr), 0);
    let r = report(&a);
    assert_eq!((r.odp_mrs, r.odp_bytes), (0, 0));
    assert!(r.mrs.iter().all(|m| m.mode != MrMode::Odp));
}

#[test]
fn auto_with_odp_bits_but_a_failing_self_test_uses_windows() {
    let a = host(fake_odp::device_with_broken_odp(), RegMode::Auto);
    let b = Host::plain();
    let mut buf = Buf::new(4 * MIB);
    let mr = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    assert!(!mr.is_null());
    let r = report(&a);
    assert_eq!((r.regions, r.registered_bytes), (1, 4 * MIB as u64));
    assert_eq!(r.odp_mrs, 0);
    let d = &r.devices[0];
    assert_eq!((d.odp, d.self_test), (false, SelfTest::Failed));
    // The first transfer already fails: every packet after the first starts inside a page.
    assert!(
        d.reason.contains("WRITE into untouched ODP pages"),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("bytes wrong"), "{}", d.reason);
    assert!(
        r.reasons.iter().any(|x| x.contains("self-test FAILED")),
        "{:?}",
        r.reasons
    );
    assert_eq!(mode_of(&a, mr), MrMode::Windows);
    // Windows move the bytes right on that device (they are pinned MRs, not ODP).
    let qa = a.create_qp(false);
    let qb = b.create_qp(false);
    connect(&a, qa, &b, qb);
    let mut src = Buf::new(64 << 10);
    fill(&mut src, 9);
    let smr = b.reg(&mut src, ALL_ACCESS);
    send_recv(&b, qb, &src, keys(smr).0, &a, qa, &buf, keys(mr).0, 50_000);
    assert!(report(&a).window_registrations > 0);
}

#[test]
fn without_odp_capabilities_auto_uses_windows_without_a_self_test() {
    let a = host(fake::device(), RegMode::Auto);
    let mut buf = Buf::new(MIB);
    let mr = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    let r = report(&a);
    assert_eq!(r.regions, 1);
    let d = &r.devices[0];
    assert_eq!((d.odp, d.self_test), (false, SelfTest::NotRun));
    assert!(d.reason.contains("no on-demand paging"), "{}", d.reason);
    assert_eq!(mode_of(&a, mr), MrMode::Windows);

    // Capabilities that lack READ: the self-test cannot run, auto stays on windows.
    let a = host(fake_odp::device_with_odp_without_read(), RegMode::Auto);
    let mr = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    let d = &report(&a).devices[0];
    assert_eq!((d.odp, d.self_test), (false, SelfTest::NotRun));
    assert_eq!(mode_of(&a, mr), MrMode::Windows);
}

#[test]
fn odp_forced_trusts_the_bits_per_mr_but_never_a_failed_self_test() {
    // Without READ the test cannot run: `odp` trusts the bits, per MR.
    let a = host(fake_odp::device_with_odp_without_read(), RegMode::Odp);
    let mut buf = Buf::new(MIB);
    let mut other = Buf::new(MIB);
    let send_only = a.reg(&mut buf, 0);
    let readable = a.reg(&mut other, IBV_ACCESS_REMOTE_READ);
    assert_eq!(mode_of(&a, send_only), MrMode::Odp);
    assert_eq!(mode_of(&a, readable), MrMode::Windows);
    let r = report(&a);
    assert_eq!(r.reg_mode, "odp");
    assert!(r.devices[0].odp);
    assert!(
        r.reasons.iter().any(|x| x.contains("needs RC ODP")),
        "{:?}",
        r.reasons
    );

    // A failed self-test: windows, said loudly.
    let a = host(fake_odp::device_with_broken_odp(), RegMode::Odp);
    let mr = a.reg(&mut buf, ALL_ACCESS);
    let r = report(&a);
    assert_eq!(
        (r.devices[0].odp, r.devices[0].self_test),
        (false, SelfTest::Failed)
    );
    assert!(
        r.reasons
            .iter()
            .any(|x| x.contains("NPRDMA_MODE=odp") && x.contains("FAILED")),
        "{:?}",
        r.reasons
    );
    assert_eq!(mode_of(&a, mr), MrMode::Windows);
    assert_eq!(r.odp_mrs, 0);
}

#[test]
fn windows_and_off_never_use_odp_nor_run_the_self_test() {
    let mut buf = Buf::new(MIB);
    let a = host(fake_odp::device_with_odp(), RegMode::Windows);
    let mr = a.reg(&mut buf, ALL_ACCESS);
    let r = report(&a);
    assert!(r.devices.is_empty());
    assert_eq!((r.regions, r.odp_mrs), (1, 0));
    assert_eq!(mode_of(&a, mr), MrMode::Windows);

    let a = host(fake_odp::device_with_odp(), RegMode::Off);
    let mr = a.reg(&mut buf, ALL_ACCESS);
    let r = report(&a);
    assert!(r.devices.is_empty());
    assert_eq!((r.regions, r.odp_mrs, r.reg_mode), (0, 0, "off"));
    assert_eq!(mode_of(&a, mr), MrMode::PassThrough);
    // Pinned, as plain verbs pins it.
    assert_eq!(fake::pinned(a.ctx), MIB as u64);
    assert_eq!(a.dereg(mr), 0);
    assert!(report(&a).mrs.is_empty());
}

#[test]
fn an_application_odp_region_stays_pass_through_and_a_rereg_keeps_the_mode() {
    let a = host(fake_odp::device_with_odp(), RegMode::Auto);
    let mut buf = Buf::new(MIB);
    let own = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
    assert_eq!(mode_of(&a, own), MrMode::PassThrough);
    let mr = a.reg(&mut buf, IBV_ACCESS_LOCAL_WRITE);
    assert_eq!(mode_of(&a, mr), MrMode::Odp);
    // Changing the access keeps on-demand paging (no pin appears).
    // SAFETY: a live MR of this host's engine.
    let rc = unsafe {
        ip::rereg_mr(
            a.eng(),
            mr,
            IBV_REREG_MR_CHANGE_ACCESS,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            0,
            (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) as i32,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(fake::pinned(a.ctx), 0);
}

#[test]
fn a_peer_running_the_library_reaches_an_odp_forced_region_over_the_control_connection() {
    // With a control connection (docs/connectx.md §13) the peer's library asks what a key is
    // instead of reading at its IOVA 0: an ODP MR is a plain key, used as it is.
    let a = Host::with_library(16 << 20, 1 << 20);
    let b = host(fake_odp::device_with_odp(), RegMode::Odp);
    let (qa, qb) = (a.create_qp(false), b.create_qp(false));
    connect_roce(&a, qa, &b, qb);
    let mut remote = Buf::new(MIB);
    let rmr = b.reg(
        &mut remote,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    );
    assert_eq!(mode_of(&b, rmr), MrMode::Odp);
    let mut src = Buf::new(64 << 10);
    fill(&mut src, 9);
    let smr = a.reg(&mut src, IBV_ACCESS_LOCAL_WRITE);
    let mut s = [sge(&src, 0, src.len(), keys(smr).0)];
    let raddr = remote.as_ptr() as u64 + 4096;
    let mut wr = rdma(IBV_WR_RDMA_WRITE, 5, &mut s, raddr, keys(rmr).1, true);
    assert_eq!(post_send(qa, &mut wr).0, 0);
    let w = poll(a.cq, 1);
    assert_eq!((w.len(), w[0].status), (1, IBV_WC_SUCCESS));
    assert_eq!(&remote[4096..4096 + src.len()], &src[..]);
    // One LOOKUP (answered "plain"), no lease.
    let Some(nprdma::ctl::peers::Outcome::Up(c)) = a
        .eng()
        .control_connection(qa, std::time::Duration::from_secs(1))
    else {
        panic!()
    };
    assert_eq!(c.counts().asked, 1);
    assert_eq!(b.eng().leased_windows(qb), 0);
}
