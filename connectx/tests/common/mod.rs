//! Test harness: "hosts" (an engine over the fake provider, or the bare fake for a peer without
//! the library) and the inline verbs calls as verbs.h defines them (through `ctx->ops`).
#![allow(dead_code)]

use std::sync::Arc;

use nprdma::config::{Config, Mode};
use nprdma::status::PageStore;
use nprdma::sys::*;
use nprdma::{Engine, fake, interpose as ip};

/// One side: a context, a PD and a CQ, with or without the library.
pub struct Host {
    pub eng: Option<Arc<Engine>>,
    pub ctx: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub cq: *mut ibv_cq,
}

impl Host {
    /// A host running the library with this budget and window size.
    pub fn with_library(budget: u64, window: u64) -> Self {
        let cfg = Config::for_tests(budget, window);
        Self::with_config(cfg)
    }

    pub fn with_config(cfg: Config) -> Self {
        let store = PageStore::heap(&cfg);
        Self::with_store(cfg, store)
    }

    /// A host running the library, counting into `store`.
    pub fn with_store(cfg: Config, store: PageStore) -> Self {
        Self::on_device(cfg, store, fake::device())
    }

    /// A host running the library on the fake device `dev`, counting into `store`.
    pub fn on_device(cfg: Config, store: PageStore, dev: *mut ibv_device) -> Self {
        // Engines of one test process meet each other's control connections in-process.
        let eng = Engine::with_meet(
            fake::real_verbs(),
            cfg,
            store,
            Arc::new(nprdma::ctl::local::LocalMeet),
        );
        // SAFETY: a fake device handle.
        let ctx = unsafe { ip::open_device(&eng, dev) };
        assert!(!ctx.is_null());
        Self {
            pd: fake::alloc_pd(ctx),
            cq: fake::create_cq(ctx),
            ctx,
            eng: Some(eng),
        }
    }

    /// Replaces the host's CQ by an extended one made through `ibv_create_cq_ex` (the inline
    /// function: `vctx->create_cq_ex`), asking for `wc_flags`; returns it.
    pub fn use_cq_ex(&mut self, wc_flags: u64) -> *mut ibv_cq_ex {
        let off = core::mem::offset_of!(verbs_context, context);
        // SAFETY: the fake's contexts are extended; verbs.h's verbs_get_ctx arithmetic.
        let vctx = unsafe { &*(self.ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
        let mut attr = ibv_cq_init_attr_ex {
            cqe: 4096,
            cq_context: core::ptr::null_mut(),
            channel: core::ptr::null_mut(),
            comp_vector: 0,
            wc_flags,
            comp_mask: 0,
            flags: 0,
            parent_domain: core::ptr::null_mut(),
        };
        // SAFETY: the context's create_cq_ex, as the inline ibv_create_cq_ex calls it.
        let cq = unsafe { (vctx.create_cq_ex.unwrap())(self.ctx, &mut attr) };
        assert!(!cq.is_null());
        self.cq = cq.cast();
        cq
    }

    /// A host in pass-through mode (`NPRDMA=off`).
    pub fn off() -> Self {
        let mut cfg = Config::for_tests(1 << 20, 1 << 16);
        cfg.mode = Mode::Off;
        Self::with_config(cfg)
    }

    /// A peer without the library: the bare fake.
    pub fn plain() -> Self {
        let real = fake::real_verbs();
        // SAFETY: the fake device handle.
        let ctx = unsafe { (real.open_device)(fake::device()) };
        Self {
            pd: fake::alloc_pd(ctx),
            cq: fake::create_cq(ctx),
            ctx,
            eng: None,
        }
    }

    pub fn reg(&self, buf: &mut [u8], access: u32) -> *mut ibv_mr {
        self.reg_iova(buf, buf.as_ptr() as u64, access)
    }

    pub fn reg_iova(&self, buf: &mut [u8], iova: u64, access: u32) -> *mut ibv_mr {
        let addr = buf.as_mut_ptr().cast();
        // SAFETY: a live PD and a buffer that outlives the registration in every test.
        unsafe {
            match &self.eng {
                Some(e) => ip::reg_mr_iova2(e, self.pd, addr, buf.len(), iova, access),
                None => (fake::real_verbs().reg_mr_iova2)(self.pd, addr, buf.len(), iova, access),
            }
        }
    }

    pub fn dereg(&self, mr: *mut ibv_mr) -> i32 {
        // SAFETY: an MR of this host.
        unsafe {
            match &self.eng {
                Some(e) => ip::dereg_mr(e, mr),
                None => (fake::real_verbs().dereg_mr)(mr),
            }
        }
    }

    pub fn create_qp(&self, sq_sig_all: bool) -> *mut ibv_qp {
        let mut attr = ibv_qp_init_attr {
            qp_context: core::ptr::null_mut(),
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: core::ptr::null_mut(),
            cap: ibv_qp_cap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: i32::from(sq_sig_all),
        };
        // SAFETY: live PD and attributes.
        let qp = unsafe {
            match &self.eng {
                Some(e) => ip::create_qp(e, self.pd, &mut attr),
                None => (fake::real_verbs().create_qp)(self.pd, &mut attr),
            }
        };
        assert!(!qp.is_null());
        qp
    }

    /// A QP made through `ibv_create_qp_ex` (the inline function: `vctx->create_qp_ex`) with
    /// the builder ("new post send") operations.
    pub fn create_qp_ex(&self) -> *mut ibv_qp {
        let off = core::mem::offset_of!(verbs_context, context);
        // SAFETY: the fake's contexts are extended (abi_compat set); the same arithmetic as
        // verbs.h's verbs_get_ctx.
        let vctx = unsafe { &*(self.ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
        // SAFETY: a plain C struct of integers and nullable pointers; all-zero is valid.
        let mut attr: ibv_qp_init_attr_ex = unsafe { core::mem::zeroed() };
        attr.send_cq = self.cq;
        attr.recv_cq = self.cq;
        attr.cap = ibv_qp_cap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        attr.qp_type = IBV_QPT_RC;
        attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        attr.pd = self.pd;
        attr.send_ops_flags = 0x1f;
        // SAFETY: the context's create_qp_ex, as the inline ibv_create_qp_ex calls it.
        let qp = unsafe { (vctx.create_qp_ex.unwrap())(self.ctx, &mut attr) };
        assert!(!qp.is_null());
        qp
    }

    pub fn modify(&self, qp: *mut ibv_qp, attr: &mut ibv_qp_attr, mask: i32) -> i32 {
        // SAFETY: a live QP of this host.
        unsafe {
            match &self.eng {
                Some(e) => ip::modify_qp(e, qp, attr, mask),
                None => (fake::real_verbs().modify_qp)(qp, attr, mask),
            }
        }
    }

    /// Brings `qp` to RTS towards `dest_qpn` with the given remote access rights.
    pub fn connect(&self, qp: *mut ibv_qp, dest_qpn: u32, access: u32) {
        self.connect_to(qp, dest_qpn, None, access);
    }

    /// This host's IPv4-mapped GID (port 1, index 1).
    pub fn gid(&self) -> [u8; 16] {
        fake::gid(self.ctx)
    }

    /// Brings `qp` to RTS towards `dest_qpn`, addressed with a GRH to `dgid` when given (as on
    /// RoCE), without one otherwise (InfiniBand LID addressing).
    pub fn connect_to(&self, qp: *mut ibv_qp, dest_qpn: u32, dgid: Option<[u8; 16]>, access: u32) {
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            qp_access_flags: access,
            ..Default::default()
        };
        assert_eq!(
            self.modify(qp, &mut a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS),
            0
        );
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            dest_qp_num: dest_qpn,
            max_dest_rd_atomic: 0,
            ..Default::default()
        };
        let mut mask = IBV_QP_STATE | IBV_QP_DEST_QPN | IBV_QP_MAX_DEST_RD_ATOMIC;
        if let Some(dgid) = dgid {
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.ah_attr.grh.dgid = dgid;
            // Index 1: the IPv4-mapped GID (index 0 is link-local, as on rxe).
            a.ah_attr.grh.sgid_index = 1;
            a.ah_attr.grh.hop_limit = 1;
            mask |= IBV_QP_AV;
        }
        assert_eq!(self.modify(qp, &mut a, mask), 0);
        let mut a = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            max_rd_atomic: 0,
            ..Default::default()
        };
        assert_eq!(
            self.modify(qp, &mut a, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC),
            0
        );
    }

    pub fn destroy_qp(&self, qp: *mut ibv_qp) -> i32 {
        // SAFETY: a live QP of this host.
        unsafe {
            match &self.eng {
                Some(e) => ip::destroy_qp(e, qp),
                None => (fake::real_verbs().destroy_qp)(qp),
            }
        }
    }

    /// Bytes the fake provider has pinned for this context now / at most.
    pub fn pinned(&self) -> u64 {
        fake::pinned(self.ctx)
    }

    pub fn peak(&self) -> u64 {
        fake::peak(self.ctx)
    }

    pub fn eng(&self) -> &Arc<Engine> {
        self.eng.as_ref().unwrap()
    }
}

/// Connects two QPs of two hosts as on RoCE (a GRH with each other's GID), so that their
/// libraries meet over a control connection (remote read, write and atomic rights on both).
pub fn connect_roce(a: &Host, qa: *mut ibv_qp, b: &Host, qb: *mut ibv_qp) {
    let access = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    a.connect_to(qa, qp_num(qb), Some(b.gid()), access);
    b.connect_to(qb, qp_num(qa), Some(a.gid()), access);
}

/// Connects two QPs of two hosts (remote read, write and atomic rights on both): as on RoCE
/// (`connect_roce`) when both run the library, so that the lease protocol runs on their
/// control connection; without a GRH when one side is a plain peer (whose connections never
/// meet: `tests/control_connection.rs` covers that meeting's end).
pub fn connect(a: &Host, qa: *mut ibv_qp, b: &Host, qb: *mut ibv_qp) {
    if a.eng.is_some() && b.eng.is_some() {
        return connect_roce(a, qa, b, qb);
    }
    let access = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC;
    a.connect(qa, qp_num(qb), access);
    b.connect(qb, qp_num(qa), access);
}

pub fn qp_num(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP.
    unsafe { (*qp).qp_num }
}

pub fn qp_state(qp: *mut ibv_qp) -> u32 {
    // SAFETY: a live QP.
    unsafe { (*qp).state }
}

pub fn keys(mr: *mut ibv_mr) -> (u32, u32) {
    // SAFETY: a live MR.
    unsafe { ((*mr).lkey, (*mr).rkey) }
}

/// The inline `ibv_post_send`.
pub fn post_send(qp: *mut ibv_qp, wr: &mut ibv_send_wr) -> (i32, *mut ibv_send_wr) {
    let mut bad = core::ptr::null_mut();
    // SAFETY: what verbs.h's ibv_post_send does.
    let rc = unsafe { ((*(*qp).context).ops.post_send.unwrap())(qp, wr, &mut bad) };
    (rc, bad)
}

/// The inline `ibv_post_recv`.
pub fn post_recv(qp: *mut ibv_qp, wr: &mut ibv_recv_wr) -> i32 {
    let mut bad = core::ptr::null_mut();
    // SAFETY: what verbs.h's ibv_post_recv does.
    unsafe { ((*(*qp).context).ops.post_recv.unwrap())(qp, wr, &mut bad) }
}

/// The inline `ibv_poll_cq`, polled until `n` completions arrived or 5 s passed.
pub fn poll(cq: *mut ibv_cq, n: usize) -> Vec<ibv_wc> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while out.len() < n && std::time::Instant::now() < deadline {
        let mut wc = [ibv_wc::default(); 8];
        // SAFETY: what verbs.h's ibv_poll_cq does.
        let k = unsafe { ((*(*cq).context).ops.poll_cq.unwrap())(cq, 8, wc.as_mut_ptr()) };
        assert!(k >= 0, "poll_cq failed: {k}");
        out.extend_from_slice(&wc[..k as usize]);
        if k == 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    out
}

/// Polls whatever is there now (after a short wait), for "no more completions" checks.
pub fn poll_rest(cq: *mut ibv_cq) -> Vec<ibv_wc> {
    std::thread::sleep(std::time::Duration::from_millis(20));
    let mut out = Vec::new();
    loop {
        let mut wc = [ibv_wc::default(); 8];
        // SAFETY: as in `poll`.
        let k = unsafe { ((*(*cq).context).ops.poll_cq.unwrap())(cq, 8, wc.as_mut_ptr()) };
        if k <= 0 {
            return out;
        }
        out.extend_from_slice(&wc[..k as usize]);
    }
}

pub fn sge(buf: &[u8], off: usize, len: usize, lkey: u32) -> ibv_sge {
    ibv_sge {
        addr: buf.as_ptr() as u64 + off as u64,
        length: len as u32,
        lkey,
    }
}

/// An RDMA WRITE/READ work request.
pub fn rdma(
    opcode: u32,
    wr_id: u64,
    sges: &mut [ibv_sge],
    raddr: u64,
    rkey: u32,
    signaled: bool,
) -> ibv_send_wr {
    let mut w = ibv_send_wr::zeroed();
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.sg_list = sges.as_mut_ptr();
    w.num_sge = sges.len() as i32;
    w.send_flags = if signaled { IBV_SEND_SIGNALED } else { 0 };
    w.set_rdma(raddr, rkey);
    w
}

/// A signaled atomic work request (`compare_add`, then `swap` for a compare-and-swap).
pub fn atomic(
    opcode: u32,
    wr_id: u64,
    sges: &mut [ibv_sge],
    raddr: u64,
    compare_add: u64,
    swap: u64,
    rkey: u32,
) -> ibv_send_wr {
    let mut w = ibv_send_wr::zeroed();
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.sg_list = sges.as_mut_ptr();
    w.num_sge = sges.len() as i32;
    w.send_flags = IBV_SEND_SIGNALED;
    w.set_atomic(raddr, compare_add, swap, rkey);
    w
}

/// Page-aligned zeroed memory (a Vec<u8> view over an mmap), freed on drop.
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

impl Buf {
    pub fn new(len: usize) -> Self {
        // SAFETY: anonymous private mapping; checked.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Self { ptr: p.cast(), len }
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping of `len` bytes.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping of `len` bytes, uniquely borrowed.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping created in `new`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Fills with a pattern derived from `seed`.
pub fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for b in buf.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

pub const ALL_ACCESS: u32 = IBV_ACCESS_LOCAL_WRITE
    | IBV_ACCESS_REMOTE_WRITE
    | IBV_ACCESS_REMOTE_READ
    | IBV_ACCESS_REMOTE_ATOMIC;

/// What one entry of an extended CQ's poll session showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExEntry {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub qp_num: u32,
    pub ts: u64,
}

/// Drains an extended CQ through one `ibv_start_poll` .. `ibv_end_poll` session, as the inline
/// functions of verbs.h do (`read_qp_num` only if the CQ has it).
pub fn poll_ex(cq: *mut ibv_cq_ex) -> Vec<ExEntry> {
    let mut out = Vec::new();
    // SAFETY: the CQ's own function pointers, called as the inline functions do.
    unsafe {
        let c = &*cq;
        let mut attr = ibv_poll_cq_attr::default();
        let mut rc = (c.start_poll.unwrap())(cq, &mut attr);
        if rc == libc::ENOENT {
            return out;
        }
        assert_eq!(rc, 0, "start_poll");
        while rc == 0 {
            let c = &*cq;
            out.push(ExEntry {
                wr_id: c.wr_id,
                status: c.status,
                opcode: (c.read_opcode.unwrap())(cq),
                qp_num: c.read_qp_num.map_or(u32::MAX, |f| f(cq)),
                ts: c.read_completion_ts.map_or(0, |f| f(cq)),
            });
            rc = (c.next_poll.unwrap())(cq);
        }
        assert_eq!(rc, libc::ENOENT, "next_poll");
        ((*cq).end_poll.unwrap())(cq);
    }
    out
}
