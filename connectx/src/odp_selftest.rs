//! The ODP self-test (docs/connectx.md §9a): before the library registers an application's
//! memory with on-demand paging on a device, it checks once per device and process that the
//! device's ODP data path moves bytes exactly.
//!
//! On objects of its own (a PD, a CQ, two RC QPs of the device connected to each other, a
//! pinned MR and an ODP MR over a fresh anonymous mapping whose pages nobody touched), never
//! visible to the application and all destroyed after:
//!
//! 1. RDMA WRITE from the pinned buffer into the ODP MR (the responder faults pages in);
//! 2. RDMA READ out of those ODP bytes into the pinned buffer (the responder reads ODP);
//! 3. RDMA READ from the pinned buffer into untouched pages of the ODP MR (the requester
//!    writes ODP).
//!
//! Each moves 64 KiB plus an unaligned tail of 1000 bytes from an address 1000 bytes into a
//! page, at the smallest path MTU (256 bytes), so that most packets start inside a page:
//! where Soft-RoCE of Linux 7.2/7.3 goes wrong (docs/connectx.md §11). Every byte is
//! compared with what was sent, and the bytes around the target must stay zero. Each
//! transfer has a deadline ([`OP_DEADLINE`]); the test never waits longer.

use core::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use crate::engine::call::{RealCall, errno};
use crate::engine::records::CtxRec;
pub use crate::odp_choice::Outcome;
use crate::real::RealVerbs;
use crate::sys::*;

/// Bytes each transfer moves.
pub const TEST_LEN: usize = (64 << 10) + 1000;
/// Where the first transfer's target starts in its page.
const HEAD: usize = 1000;
/// How long one transfer may take.
pub const OP_DEADLINE: Duration = Duration::from_secs(3);

/// The test byte at `i`: never zero, so an untouched page never passes for data.
fn pattern(i: usize) -> u8 {
    ((i * 131 + 7) % 251) as u8 + 1
}

/// Wrong bytes of `got` against the pattern, and the first one's offset.
fn wrong_bytes(got: &[u8]) -> (usize, Option<usize>) {
    let mut n = 0;
    let mut first = None;
    for (i, b) in got.iter().enumerate() {
        if *b != pattern(i) {
            n += 1;
            first.get_or_insert(i);
        }
    }
    (n, first)
}

/// The objects of one test, released on drop in dependency order.
struct Objects<'a> {
    real: &'a RealVerbs,
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    qps: [*mut ibv_qp; 2],
    mrs: [*mut ibv_mr; 2],
    map: *mut u8,
    map_len: usize,
}

impl Drop for Objects<'_> {
    fn drop(&mut self) {
        let _g = RealCall::enter();
        // SAFETY: each object was created by this test and is released once; QPs go before
        // the CQ and the MRs they use, the MRs before the PD and the memory they cover.
        unsafe {
            for qp in self.qps {
                if !qp.is_null() {
                    (self.real.destroy_qp)(qp);
                }
            }
            if !self.cq.is_null() {
                (self.real.destroy_cq)(self.cq);
            }
            for mr in self.mrs {
                if !mr.is_null() {
                    (self.real.dereg_mr)(mr);
                }
            }
            if !self.pd.is_null() {
                (self.real.dealloc_pd)(self.pd);
            }
            if !self.map.is_null() {
                libc::munmap(self.map.cast(), self.map_len);
            }
        }
    }
}

/// Where the test reaches its peer: a port with its address.
struct Path {
    port: u8,
    /// `Some(gid index, gid)` on RoCE (or a routed fabric), else the LID.
    gid: Option<(u8, [u8; 16])>,
    lid: u16,
}

/// The first active port of the device and its address.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn find_path(real: &RealVerbs, ctx: *mut ibv_context, ports: u8) -> Result<Path, String> {
    for port in 1..=ports.clamp(1, 4) {
        let mut attr = ibv_port_attr::default();
        // SAFETY: a live context and a zeroed, writable struct of the header's size (what
        // verbs.h's inline ibv_query_port passes to this function).
        if unsafe { (real.query_port)(ctx, port, &mut attr) } != 0 || attr.state != IBV_PORT_ACTIVE
        {
            continue;
        }
        let lid = attr.lid;
        if attr.link_layer != IBV_LINK_LAYER_ETHERNET && lid != 0 {
            return Ok(Path {
                port,
                gid: None,
                lid,
            });
        }
        // An IPv4-mapped GID (RoCE v2 over IPv4) if there is one, else the first non-zero.
        let mut found: Option<(u8, [u8; 16])> = None;
        for index in 0..attr.gid_tbl_len.clamp(0, 16) {
            let mut gid = [0u8; 16];
            // SAFETY: a live context and 16 writable bytes.
            if unsafe { (real.query_gid)(ctx, port, index, &mut gid) } != 0 || gid == [0u8; 16] {
                continue;
            }
            let v4 = gid[..10] == [0u8; 10] && gid[10..12] == [0xff, 0xff];
            if v4 || found.is_none() {
                found = Some((index as u8, gid));
            }
            if v4 {
                break;
            }
        }
        if let Some(gid) = found {
            return Ok(Path {
                port,
                gid: Some(gid),
                lid,
            });
        }
    }
    Err("no active port with an address".into())
}

/// Takes `qp` to RTS towards `peer` over `path`.
///
/// # Safety
/// `qp` is a live RC QP in RESET.
unsafe fn connect(real: &RealVerbs, qp: *mut ibv_qp, peer: u32, path: &Path) -> Result<(), String> {
    let modify = |attr: &mut ibv_qp_attr, mask: c_int, step: &str| {
        // SAFETY: a live QP and a valid attribute struct.
        match unsafe { (real.modify_qp)(qp, attr, mask) } {
            0 => Ok(()),
            e => Err(format!("modify_qp to {step}: errno {e}")),
        }
    };
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        qp_access_flags: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        port_num: path.port,
        ..Default::default()
    };
    modify(
        &mut a,
        IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT,
        "INIT",
    )?;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: IBV_MTU_256,
        dest_qp_num: peer,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..Default::default()
    };
    a.ah_attr.port_num = path.port;
    a.ah_attr.dlid = path.lid;
    if let Some((index, gid)) = path.gid {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = gid;
        a.ah_attr.grh.sgid_index = index;
        a.ah_attr.grh.hop_limit = 1;
    }
    modify(
        &mut a,
        IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
        "RTR",
    )?;
    let mut a = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..Default::default()
    };
    modify(
        &mut a,
        IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC,
        "RTS",
    )
}

/// One transfer: opcode, local address and lkey, remote address and rkey, its name.
type Step = (u32, (u64, u32), (u64, u32), &'static str);

/// One signaled RDMA operation on `qp`, waited for until [`OP_DEADLINE`].
///
/// # Safety
/// Every address and key names live registered memory of the test.
#[allow(clippy::too_many_arguments)] // one WR's fields, named
unsafe fn transfer(
    rec: &CtxRec,
    qp: *mut ibv_qp,
    cq: *mut ibv_cq,
    opcode: u32,
    local: (u64, u32),
    remote: (u64, u32),
    what: &str,
) -> Result<(), String> {
    let (Some(post), Some(poll)) = (rec.orig.post_send, rec.orig.poll_cq) else {
        return Err("the provider has no post_send or poll_cq".into());
    };
    let mut sge = ibv_sge {
        addr: local.0,
        length: TEST_LEN as u32,
        lkey: local.1,
    };
    let mut wr = ibv_send_wr::zeroed();
    wr.wr_id = u64::from_le_bytes(*b"odp-test");
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.set_rdma(remote.0, remote.1);
    let mut bad: *mut ibv_send_wr = core::ptr::null_mut();
    let _g = RealCall::enter();
    // SAFETY: the provider's own post_send on its QP (the library's wrapper is bypassed:
    // the QP is not the application's); the WR and SGE live across the call.
    let rc = unsafe { post(qp, &mut wr, &mut bad) };
    if rc != 0 {
        return Err(format!("{what}: post_send failed with errno {rc}"));
    }
    let start = Instant::now();
    loop {
        let mut wc = ibv_wc::default();
        // SAFETY: the provider's own poll_cq on the test's CQ, one writable completion.
        let n = unsafe { poll(cq, 1, &mut wc) };
        if n < 0 {
            return Err(format!("{what}: poll_cq failed ({n})"));
        }
        if n == 1 {
            return if wc.status == IBV_WC_SUCCESS {
                Ok(())
            } else {
                Err(format!("{what}: completion status {}", wc.status))
            };
        }
        if start.elapsed() > OP_DEADLINE {
            return Err(format!(
                "{what}: no completion within {} s",
                OP_DEADLINE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `Err` with the finding when `got` is not the pattern or the bytes around it (`before`,
/// `after`) are not zero.
fn verify(what: &str, got: &[u8], before: &[u8], after: &[u8]) -> Result<(), String> {
    let (n, first) = wrong_bytes(got);
    if let Some(first) = first {
        return Err(format!(
            "{what}: {n} of {} bytes wrong, the first at offset {first}",
            got.len()
        ));
    }
    if before.iter().chain(after).any(|b| *b != 0) {
        return Err(format!("{what}: bytes written outside the target range"));
    }
    Ok(())
}

/// Runs the test on `rec`'s device.
///
/// # Safety
/// `rec` is a live context of the library (its provider operations saved in `rec.orig`).
pub(crate) unsafe fn run(real: &RealVerbs, rec: &CtxRec, ports: u8) -> Outcome {
    let ctx = rec.ctx as *mut ibv_context;
    let _g = RealCall::enter();
    // SAFETY: a live context.
    let path = match unsafe { find_path(real, ctx, ports) } {
        Ok(p) => p,
        Err(e) => return Outcome::NotRun(e),
    };
    let page = 4096usize;
    // The ODP mapping: target A (page offset HEAD), a gap page, target B (page offset 3000).
    let span = (HEAD + TEST_LEN).next_multiple_of(page) + page;
    let map_len = 2 * span;
    let mut o = Objects {
        real,
        pd: core::ptr::null_mut(),
        cq: core::ptr::null_mut(),
        qps: [core::ptr::null_mut(); 2],
        mrs: [core::ptr::null_mut(); 2],
        map: core::ptr::null_mut(),
        map_len,
    };
    // SAFETY: a fresh private anonymous mapping, checked below; never touched by the CPU
    // before the transfers (so every page is first faulted in by the device).
    let m = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return Outcome::NotRun("mmap of the test buffer failed".into());
    }
    o.map = m.cast();
    let mut pinned: Vec<u8> = (0..2 * TEST_LEN)
        .map(|i| if i < TEST_LEN { pattern(i) } else { 0 })
        .collect();
    let rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    // SAFETY: live context; each created object is recorded in `o` and released by it.
    unsafe {
        o.pd = (real.alloc_pd)(ctx);
        if o.pd.is_null() {
            return Outcome::NotRun(format!("ibv_alloc_pd failed (errno {})", errno()));
        }
        o.cq = (real.create_cq)(ctx, 8, core::ptr::null_mut(), core::ptr::null_mut(), 0);
        if o.cq.is_null() {
            return Outcome::NotRun(format!("ibv_create_cq failed (errno {})", errno()));
        }
        for i in 0..2 {
            let mut init = ibv_qp_init_attr {
                qp_context: core::ptr::null_mut(),
                send_cq: o.cq,
                recv_cq: o.cq,
                srq: core::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: 2,
                    max_recv_wr: 1,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: IBV_QPT_RC,
                sq_sig_all: 0,
            };
            o.qps[i] = (real.create_qp)(o.pd, &mut init);
            if o.qps[i].is_null() {
                return Outcome::NotRun(format!("ibv_create_qp failed (errno {})", errno()));
            }
        }
        let (qa, qb) = ((*o.qps[0]).qp_num, (*o.qps[1]).qp_num);
        for (qp, peer) in [(o.qps[0], qb), (o.qps[1], qa)] {
            if let Err(e) = connect(real, qp, peer, &path) {
                return Outcome::NotRun(e);
            }
        }
        o.mrs[0] = (real.reg_mr_iova2)(
            o.pd,
            pinned.as_mut_ptr().cast::<c_void>(),
            pinned.len(),
            pinned.as_ptr() as u64,
            rw,
        );
        if o.mrs[0].is_null() {
            return Outcome::NotRun(format!("pinned registration failed (errno {})", errno()));
        }
        o.mrs[1] = (real.reg_mr_iova2)(o.pd, m, map_len, m as u64, rw | IBV_ACCESS_ON_DEMAND);
        if o.mrs[1].is_null() {
            // The capability bits said ODP; the provider refused it.
            return Outcome::Failed(format!("ODP registration refused (errno {})", errno()));
        }
    }
    // SAFETY: MRs just registered.
    let (pk, ok) = unsafe {
        (
            ((*o.mrs[0]).lkey, (*o.mrs[0]).rkey),
            ((*o.mrs[1]).lkey, (*o.mrs[1]).rkey),
        )
    };
    let src = pinned.as_ptr() as u64;
    let dst = src + TEST_LEN as u64;
    let a = m as u64 + HEAD as u64;
    let b = m as u64 + span as u64 + 3000;
    let region = |at: u64, len: usize| -> Vec<u8> {
        // SAFETY: inside the test's own mapping; no transfer is in flight when read.
        unsafe { core::slice::from_raw_parts(at as *const u8, len) }.to_vec()
    };
    let around = |at: u64| -> (Vec<u8>, Vec<u8>) {
        let start = at & !(page as u64 - 1);
        let end = (at + TEST_LEN as u64).next_multiple_of(page as u64);
        (
            region(start, (at - start) as usize),
            region(at + TEST_LEN as u64, (end - at - TEST_LEN as u64) as usize),
        )
    };
    let steps: [Step; 3] = [
        (
            IBV_WR_RDMA_WRITE,
            (src, pk.0),
            (a, ok.1),
            "WRITE into untouched ODP pages",
        ),
        (
            IBV_WR_RDMA_READ,
            (dst, pk.0),
            (a, ok.1),
            "READ out of ODP pages",
        ),
        (
            IBV_WR_RDMA_READ,
            (b, ok.0),
            (src, pk.1),
            "READ into untouched ODP pages",
        ),
    ];
    for (i, (op, local, remote, what)) in steps.into_iter().enumerate() {
        // SAFETY: addresses and keys of the test's live MRs, each range inside its MR.
        if let Err(e) = unsafe { transfer(rec, o.qps[0], o.cq, op, local, remote, what) } {
            return Outcome::Failed(e);
        }
        let checked = match i {
            0 => {
                let (before, after) = around(a);
                verify(what, &region(a, TEST_LEN), &before, &after)
            }
            1 => verify(what, &pinned[TEST_LEN..], &[], &[]),
            _ => {
                let (before, after) = around(b);
                verify(what, &region(b, TEST_LEN), &before, &after)
            }
        };
        if let Err(e) = checked {
            return Outcome::Failed(e);
        }
    }
    Outcome::Passed
}
