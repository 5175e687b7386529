//! Declarations of the rdma-core (libibverbs) ABI that the interposer touches.
//!
//! Hand-written `repr(C)` mirrors of `<infiniband/verbs.h>` (rdma-core 44, Debian bookworm),
//! restricted to the structs and fields the library reads or writes. Every struct's size and
//! the offset of every field we use are checked at compile time against [`layout`], which
//! tools/gen-layout.sh generates from the installed headers; tests/layout.rs re-runs that probe,
//! so a mismatching rdma-core fails the tests instead of corrupting memory. We chose this over
//! bindgen because bindgen needs libclang (about 150 MB of LLVM on every build machine) for
//! about twenty structs whose layout is a stable ABI: rdma-core only appends to its public
//! structs (`verbs_context` grows downwards, `ibv_qp_ex` at its end), because existing binaries
//! depend on the offsets.
//!
//! Unions are declared as plain words with accessors (x86_64 is little-endian, which the asserts
//! pin down), so reading them needs no `unsafe`.
#![allow(non_camel_case_types, missing_docs)]

pub mod layout;
pub mod rdmacm;

use core::ffi::{c_int, c_uint, c_void};
use core::mem::{offset_of, size_of};

/// Opaque `struct ibv_device`.
#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

/// Opaque `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    _opaque: [u8; 0],
}

/// Opaque `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    _opaque: [u8; 0],
}

/// Opaque `struct ibv_xrcd`.
#[repr(C)]
pub struct ibv_xrcd {
    _opaque: [u8; 0],
}

/// `struct ibv_cq_ex`: the extended CQ (`ibv_create_cq_ex`), polled with `ibv_start_poll`,
/// `ibv_next_poll`, `ibv_end_poll` and the `ibv_wc_read_*` functions, all inline functions of
/// verbs.h that call through these pointers. Its head is a `struct ibv_cq`
/// (`ibv_cq_ex_to_cq` is a cast).
#[repr(C)]
pub struct ibv_cq_ex {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
    pub comp_mask: u32,
    /// The current completion's status (set by `start_poll`/`next_poll`).
    pub status: c_uint,
    /// The current completion's `wr_id`.
    pub wr_id: u64,
    pub start_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut ibv_poll_cq_attr) -> c_int>,
    pub next_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> c_int>,
    pub end_poll: Option<unsafe extern "C" fn(*mut ibv_cq_ex)>,
    pub read_opcode: Option<CqExReadU32>,
    pub read_vendor_err: Option<CqExReadU32>,
    pub read_byte_len: Option<CqExReadU32>,
    pub read_imm_data: Option<CqExReadU32>,
    pub read_qp_num: Option<CqExReadU32>,
    pub read_src_qp: Option<CqExReadU32>,
    pub read_wc_flags: Option<CqExReadU32>,
    pub read_slid: Option<CqExReadU32>,
    pub read_sl: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_dlid_path_bits: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u8>,
    pub read_completion_ts: Option<CqExReadU64>,
    pub read_cvlan: Option<unsafe extern "C" fn(*mut ibv_cq_ex) -> u16>,
    pub read_flow_tag: Option<CqExReadU32>,
    pub read_tm_info: Option<unsafe extern "C" fn(*mut ibv_cq_ex, *mut c_void)>,
    pub read_completion_wallclock_ns: Option<CqExReadU64>,
}

/// An `ibv_cq_ex` reader returning a 32-bit value (opcode, lengths, numbers, flags).
pub type CqExReadU32 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u32;
/// An `ibv_cq_ex` reader returning a 64-bit value (timestamps).
pub type CqExReadU64 = unsafe extern "C" fn(*mut ibv_cq_ex) -> u64;

/// `struct ibv_poll_cq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_poll_cq_attr {
    pub comp_mask: u32,
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_cq_init_attr_ex {
    pub cqe: u32,
    pub cq_context: *mut c_void,
    pub channel: *mut ibv_comp_channel,
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*` bits: what the CQ's readers may be asked for.
    pub wc_flags: u64,
    pub comp_mask: u32,
    pub flags: u32,
    pub parent_domain: *mut ibv_pd,
}

/// `IBV_WC_EX_WITH_BYTE_LEN`: `ibv_wc_read_byte_len` works on the CQ.
pub const IBV_WC_EX_WITH_BYTE_LEN: u64 = 1 << 0;
/// `IBV_WC_EX_WITH_IMM`: `ibv_wc_read_imm_data` works on the CQ.
pub const IBV_WC_EX_WITH_IMM: u64 = 1 << 1;
/// `IBV_WC_EX_WITH_QP_NUM`: `ibv_wc_read_qp_num` works on the CQ.
pub const IBV_WC_EX_WITH_QP_NUM: u64 = 1 << 2;

/// `verbs_context::create_cq_ex` (the inline `ibv_create_cq_ex`).
pub type CreateCqExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;

/// `pthread_mutex_t` on x86_64 glibc (40 bytes).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_mutex_t {
    _bytes: [u8; 40],
}

/// `pthread_cond_t` on x86_64 glibc (48 bytes).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct pthread_cond_t {
    _bytes: [u8; 48],
}

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub type PostRecvFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
pub type CreateQpExFn =
    unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;

/// `struct ibv_context_ops`: the data-path entry points that the inline `ibv_post_send` etc.
/// call. Fields we never touch are opaque pointers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_context_ops {
    pub _compat_head: [*mut c_void; 7],
    pub alloc_mw: *mut c_void,
    pub bind_mw: *mut c_void,
    pub dealloc_mw: *mut c_void,
    pub _compat_create_cq: *mut c_void,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    pub _compat_mid: [*mut c_void; 7],
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_qp: [*mut c_void; 4],
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_tail: [*mut c_void; 5],
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` marker of a context embedded in a
/// `verbs_context` (verbs.h: `((void *)UINTPTR_MAX)`).
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// `struct verbs_context`: the extended operations, which sit *before* the `ibv_context` in
/// memory (the context is its last field).
#[repr(C)]
pub struct verbs_context {
    pub _newer_ops: [*mut c_void; 25],
    pub create_cq_ex: Option<CreateCqExFn>,
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: *mut c_void,
    pub abi_placeholder2: *mut c_void,
    pub ibv_create_flow: *mut c_void,
    pub abi_placeholder1: *mut c_void,
    pub open_qp: *mut c_void,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: *mut c_void,
    pub create_srq_ex: *mut c_void,
    pub open_xrcd: *mut c_void,
    pub close_xrcd: *mut c_void,
    pub abi_placeholder3: u64,
    pub sz: usize,
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`. The `wr` union (rdma / atomic / ud) is four words; the trailing
/// `qp_type` and `bind_mw`/`tso` unions are carried verbatim.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (network order) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub qp_type_xrc_remote_srqn: u32,
    pub _pad: u32,
    pub bind_mw_or_tso: [u64; 6],
}

impl ibv_send_wr {
    /// An all-zero WR (null pointers, opcode RDMA_WRITE).
    pub const fn zeroed() -> Self {
        Self {
            wr_id: 0,
            next: core::ptr::null_mut(),
            sg_list: core::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: [0; 4],
            qp_type_xrc_remote_srqn: 0,
            _pad: 0,
            bind_mw_or_tso: [0; 6],
        }
    }
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub fn remote_addr(&self) -> u64 {
        self.wr[0]
    }
    /// Sets `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub fn set_remote_addr(&mut self, addr: u64) {
        self.wr[0] = addr;
    }
    /// `wr.rdma.rkey`.
    pub fn rdma_rkey(&self) -> u32 {
        self.wr[1] as u32
    }
    /// Sets `wr.rdma.rkey` (keeps the padding word's upper half).
    pub fn set_rdma_rkey(&mut self, rkey: u32) {
        self.wr[1] = (self.wr[1] & !0xffff_ffff) | u64::from(rkey);
    }
    /// `wr.atomic.compare_add`.
    pub fn atomic_compare_add(&self) -> u64 {
        self.wr[1]
    }
    /// `wr.atomic.swap`.
    pub fn atomic_swap(&self) -> u64 {
        self.wr[2]
    }
    /// `wr.atomic.rkey`.
    pub fn atomic_rkey(&self) -> u32 {
        self.wr[3] as u32
    }
    /// Sets `wr.atomic.rkey`.
    pub fn set_atomic_rkey(&mut self, rkey: u32) {
        self.wr[3] = (self.wr[3] & !0xffff_ffff) | u64::from(rkey);
    }
    /// Sets the whole `wr.atomic` member.
    pub fn set_atomic(&mut self, remote_addr: u64, compare_add: u64, swap: u64, rkey: u32) {
        self.wr = [remote_addr, compare_add, swap, u64::from(rkey)];
    }
    /// Sets the whole `wr.rdma` member.
    pub fn set_rdma(&mut self, remote_addr: u64, rkey: u32) {
        self.wr = [remote_addr, u64::from(rkey), 0, 0];
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_rx_hash_conf`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_rx_hash_conf {
    pub rx_hash_function: u8,
    pub rx_hash_key_len: u8,
    pub rx_hash_key: *mut u8,
    pub rx_hash_fields_mask: u64,
}

/// `struct ibv_qp_init_attr_ex`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_init_attr_ex {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut ibv_pd,
    pub xrcd: *mut ibv_xrcd,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: ibv_rx_hash_conf,
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

/// `struct ibv_global_route` (8-byte aligned: `union ibv_gid` holds two u64).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_device_attr`. Only the fields we read are named.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [u8; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub _middle: [c_int; 14],
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

impl ibv_device_attr {
    /// An all-zero value for the provider to fill.
    pub const fn zeroed() -> Self {
        Self {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            _middle: [0; 14],
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

/// `struct ibv_data_buf`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_data_buf {
    pub addr: *mut c_void,
    pub length: usize,
}

/// `struct ibv_mw_bind_info` (only passed through).
#[repr(C)]
pub struct ibv_mw_bind_info {
    _opaque: [u8; 0],
}

pub type WrAtomicCmpSwpFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64, u64);
pub type WrAtomicFetchAddFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u64);
pub type WrBindMwFn =
    unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_mw, u32, *const ibv_mw_bind_info);
pub type WrRkeyFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32);
pub type WrRdmaFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64);
pub type WrRdmaImmFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32);
pub type WrQpFn = unsafe extern "C" fn(*mut ibv_qp_ex);
pub type WrImmFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32);
pub type WrSendTsoFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, u16, u16);
pub type WrSetUdAddrFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut ibv_ah, u32, u32);
pub type WrSetInlineFn = unsafe extern "C" fn(*mut ibv_qp_ex, *mut c_void, usize);
pub type WrSetInlineListFn = unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_data_buf);
pub type WrSetSgeFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, u32);
pub type WrSetSgeListFn = unsafe extern "C" fn(*mut ibv_qp_ex, usize, *const ibv_sge);
pub type WrCompleteFn = unsafe extern "C" fn(*mut ibv_qp_ex) -> c_int;
pub type WrAtomicWriteFn = unsafe extern "C" fn(*mut ibv_qp_ex, u32, u64, *const c_void);

/// `struct ibv_qp_ex`: the QP followed by the builder ("new post send") vtable.
#[repr(C)]
pub struct ibv_qp_ex {
    pub qp_base: ibv_qp,
    pub comp_mask: u64,
    pub wr_id: u64,
    pub wr_flags: c_uint,
    pub wr_atomic_cmp_swp: Option<WrAtomicCmpSwpFn>,
    pub wr_atomic_fetch_add: Option<WrAtomicFetchAddFn>,
    pub wr_bind_mw: Option<WrBindMwFn>,
    pub wr_local_inv: Option<WrRkeyFn>,
    pub wr_rdma_read: Option<WrRdmaFn>,
    pub wr_rdma_write: Option<WrRdmaFn>,
    pub wr_rdma_write_imm: Option<WrRdmaImmFn>,
    pub wr_send: Option<WrQpFn>,
    pub wr_send_imm: Option<WrImmFn>,
    pub wr_send_inv: Option<WrRkeyFn>,
    pub wr_send_tso: Option<WrSendTsoFn>,
    pub wr_set_ud_addr: Option<WrSetUdAddrFn>,
    pub wr_set_xrc_srqn: Option<WrRkeyFn>,
    pub wr_set_inline_data: Option<WrSetInlineFn>,
    pub wr_set_inline_data_list: Option<WrSetInlineListFn>,
    pub wr_set_sge: Option<WrSetSgeFn>,
    pub wr_set_sge_list: Option<WrSetSgeListFn>,
    pub wr_start: Option<WrQpFn>,
    pub wr_complete: Option<WrCompleteFn>,
    pub wr_abort: Option<WrQpFn>,
    pub wr_atomic_write: Option<WrAtomicWriteFn>,
}

// Enumerations (verbs.h). Plain constants: the C enums are `unsigned int` on this ABI.

/// `IBV_WC_SUCCESS`.
pub const IBV_WC_SUCCESS: u32 = 0;
/// `IBV_WC_LOC_LEN_ERR`.
pub const IBV_WC_LOC_LEN_ERR: u32 = 1;
/// `IBV_WC_LOC_QP_OP_ERR`.
pub const IBV_WC_LOC_QP_OP_ERR: u32 = 2;
/// `IBV_WC_LOC_PROT_ERR`.
pub const IBV_WC_LOC_PROT_ERR: u32 = 4;
/// `IBV_WC_WR_FLUSH_ERR`.
pub const IBV_WC_WR_FLUSH_ERR: u32 = 5;
/// `IBV_WC_LOC_ACCESS_ERR`.
pub const IBV_WC_LOC_ACCESS_ERR: u32 = 8;
/// `IBV_WC_RNR_RETRY_EXC_ERR`.
pub const IBV_WC_RNR_RETRY_EXC_ERR: u32 = 13;
/// `IBV_WC_REM_INV_REQ_ERR`.
pub const IBV_WC_REM_INV_REQ_ERR: u32 = 9;
/// `IBV_WC_REM_ACCESS_ERR`.
pub const IBV_WC_REM_ACCESS_ERR: u32 = 10;
/// `IBV_WC_REM_OP_ERR`.
pub const IBV_WC_REM_OP_ERR: u32 = 11;
/// `IBV_WC_RETRY_EXC_ERR`.
pub const IBV_WC_RETRY_EXC_ERR: u32 = 12;
/// `IBV_WC_GENERAL_ERR`.
pub const IBV_WC_GENERAL_ERR: u32 = 21;

/// `IBV_WC_SEND`.
pub const IBV_WC_SEND: u32 = 0;
/// `IBV_WC_RDMA_WRITE`.
pub const IBV_WC_RDMA_WRITE: u32 = 1;
/// `IBV_WC_RDMA_READ`.
pub const IBV_WC_RDMA_READ: u32 = 2;
/// `IBV_WC_COMP_SWAP`.
pub const IBV_WC_COMP_SWAP: u32 = 3;
/// `IBV_WC_FETCH_ADD`.
pub const IBV_WC_FETCH_ADD: u32 = 4;
/// `IBV_WC_BIND_MW`.
pub const IBV_WC_BIND_MW: u32 = 5;
/// `IBV_WC_LOCAL_INV`.
pub const IBV_WC_LOCAL_INV: u32 = 6;
/// `IBV_WC_TSO`.
pub const IBV_WC_TSO: u32 = 7;
/// `IBV_WC_ATOMIC_WRITE`.
pub const IBV_WC_ATOMIC_WRITE: u32 = 9;
/// `IBV_WC_RECV`; receive opcodes have this bit set.
pub const IBV_WC_RECV: u32 = 1 << 7;
/// `IBV_WC_RECV_RDMA_WITH_IMM`.
pub const IBV_WC_RECV_RDMA_WITH_IMM: u32 = IBV_WC_RECV + 1;

/// `IBV_WC_WITH_IMM`.
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: u32 = 0;
/// `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
/// `IBV_WR_SEND`.
pub const IBV_WR_SEND: u32 = 2;
/// `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: u32 = 3;
/// `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: u32 = 4;
/// `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
/// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
/// `IBV_WR_LOCAL_INV`.
pub const IBV_WR_LOCAL_INV: u32 = 7;
/// `IBV_WR_BIND_MW`.
pub const IBV_WR_BIND_MW: u32 = 8;
/// `IBV_WR_SEND_WITH_INV`.
pub const IBV_WR_SEND_WITH_INV: u32 = 9;
/// `IBV_WR_TSO`.
pub const IBV_WR_TSO: u32 = 10;
/// `IBV_WR_ATOMIC_WRITE`.
pub const IBV_WR_ATOMIC_WRITE: u32 = 15;

/// `IBV_SEND_FENCE`.
pub const IBV_SEND_FENCE: u32 = 1 << 0;
/// `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
/// `IBV_SEND_SOLICITED`.
pub const IBV_SEND_SOLICITED: u32 = 1 << 2;
/// `IBV_SEND_INLINE`.
pub const IBV_SEND_INLINE: u32 = 1 << 3;

/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const IBV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;
/// `IBV_ACCESS_MW_BIND`.
pub const IBV_ACCESS_MW_BIND: u32 = 1 << 4;
/// `IBV_ACCESS_ZERO_BASED`.
pub const IBV_ACCESS_ZERO_BASED: u32 = 1 << 5;
/// `IBV_ACCESS_ON_DEMAND`.
pub const IBV_ACCESS_ON_DEMAND: u32 = 1 << 6;
/// `IBV_ACCESS_HUGETLB`.
pub const IBV_ACCESS_HUGETLB: u32 = 1 << 7;
/// `IBV_ACCESS_OPTIONAL_FIRST`: flags at or above it may be ignored by a provider.
pub const IBV_ACCESS_OPTIONAL_FIRST: u32 = 1 << 20;

/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: u32 = 2;
/// `IBV_QPT_UC`.
pub const IBV_QPT_UC: u32 = 3;
/// `IBV_QPT_UD`.
pub const IBV_QPT_UD: u32 = 4;

/// `IBV_QPS_RESET`.
pub const IBV_QPS_RESET: u32 = 0;
/// `IBV_QPS_INIT`.
pub const IBV_QPS_INIT: u32 = 1;
/// `IBV_QPS_RTR`.
pub const IBV_QPS_RTR: u32 = 2;
/// `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: u32 = 3;
/// `IBV_QPS_ERR`.
pub const IBV_QPS_ERR: u32 = 6;

/// `IBV_QP_STATE`.
pub const IBV_QP_STATE: c_int = 1 << 0;
/// `IBV_QP_ACCESS_FLAGS`.
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
/// `IBV_QP_MAX_QP_RD_ATOMIC`.
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
/// `IBV_QP_MAX_DEST_RD_ATOMIC`.
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
/// `IBV_QP_CAP`.
pub const IBV_QP_CAP: c_int = 1 << 19;
/// `IBV_QP_DEST_QPN`.
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

/// `IBV_ATOMIC_NONE`.
pub const IBV_ATOMIC_NONE: u32 = 0;

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1 << 0;
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub const IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: u32 = 1 << 6;

/// `IBV_REREG_MR_CHANGE_TRANSLATION`.
pub const IBV_REREG_MR_CHANGE_TRANSLATION: c_int = 1 << 0;
/// `IBV_REREG_MR_CHANGE_PD`.
pub const IBV_REREG_MR_CHANGE_PD: c_int = 1 << 1;
/// `IBV_REREG_MR_CHANGE_ACCESS`.
pub const IBV_REREG_MR_CHANGE_ACCESS: c_int = 1 << 2;
/// `IBV_REREG_MR_ERR_INPUT`: old MR still valid, bad input.
pub const IBV_REREG_MR_ERR_INPUT: c_int = -1;
/// `IBV_REREG_MR_ERR_CMD`: the command failed.
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

// ---- layout checks against the generated header numbers ----

/// Compile-time checks of a struct against the C headers' numbers (src/sys/layout.rs): its
/// size, then each listed field's offset.
macro_rules! check_layout {
    ($t:ty $(= $size:path)? { $($f:ident: $c:path),* $(,)? }) => {
        $(const _: () = assert!(size_of::<$t>() == $size);)?
        $(const _: () = assert!(offset_of!($t, $f) == $c);)*
    };
}

use layout as l;

check_layout!(
    ibv_context_ops = l::SIZE_IBV_CONTEXT_OPS {
        poll_cq: l::OFF_IBV_CONTEXT_OPS_POLL_CQ,
        req_notify_cq: l::OFF_IBV_CONTEXT_OPS_REQ_NOTIFY_CQ,
        post_srq_recv: l::OFF_IBV_CONTEXT_OPS_POST_SRQ_RECV,
        post_send: l::OFF_IBV_CONTEXT_OPS_POST_SEND,
        post_recv: l::OFF_IBV_CONTEXT_OPS_POST_RECV,
        bind_mw: l::OFF_IBV_CONTEXT_OPS_BIND_MW,
    }
);
check_layout!(
    ibv_context = l::SIZE_IBV_CONTEXT {
        device: l::OFF_IBV_CONTEXT_DEVICE,
        ops: l::OFF_IBV_CONTEXT_OPS,
        cmd_fd: l::OFF_IBV_CONTEXT_CMD_FD,
        async_fd: l::OFF_IBV_CONTEXT_ASYNC_FD,
        num_comp_vectors: l::OFF_IBV_CONTEXT_NUM_COMP_VECTORS,
        mutex: l::OFF_IBV_CONTEXT_MUTEX,
        abi_compat: l::OFF_IBV_CONTEXT_ABI_COMPAT,
    }
);
check_layout!(
    verbs_context = l::SIZE_VERBS_CONTEXT {
        create_cq_ex: l::OFF_VERBS_CONTEXT_CREATE_CQ_EX,
        create_qp_ex: l::OFF_VERBS_CONTEXT_CREATE_QP_EX,
        query_device_ex: l::OFF_VERBS_CONTEXT_QUERY_DEVICE_EX,
        sz: l::OFF_VERBS_CONTEXT_SZ,
        context: l::OFF_VERBS_CONTEXT_CONTEXT,
    }
);
check_layout!(
    ibv_cq_ex = l::SIZE_IBV_CQ_EX {
        context: l::OFF_IBV_CQ_EX_CONTEXT,
        cqe: l::OFF_IBV_CQ_EX_CQE,
        comp_mask: l::OFF_IBV_CQ_EX_COMP_MASK,
        status: l::OFF_IBV_CQ_EX_STATUS,
        wr_id: l::OFF_IBV_CQ_EX_WR_ID,
        start_poll: l::OFF_IBV_CQ_EX_START_POLL,
        read_opcode: l::OFF_IBV_CQ_EX_READ_OPCODE,
        read_qp_num: l::OFF_IBV_CQ_EX_READ_QP_NUM,
        read_completion_ts: l::OFF_IBV_CQ_EX_READ_COMPLETION_TS,
        read_completion_wallclock_ns: l::OFF_IBV_CQ_EX_READ_COMPLETION_WALLCLOCK_NS,
    }
);
check_layout!(
    ibv_cq_init_attr_ex = l::SIZE_IBV_CQ_INIT_ATTR_EX {
        wc_flags: l::OFF_IBV_CQ_INIT_ATTR_EX_WC_FLAGS,
        parent_domain: l::OFF_IBV_CQ_INIT_ATTR_EX_PARENT_DOMAIN,
    }
);
check_layout!(
    ibv_pd = l::SIZE_IBV_PD {
        context: l::OFF_IBV_PD_CONTEXT,
        handle: l::OFF_IBV_PD_HANDLE,
    }
);
check_layout!(
    ibv_mr = l::SIZE_IBV_MR {
        context: l::OFF_IBV_MR_CONTEXT,
        pd: l::OFF_IBV_MR_PD,
        addr: l::OFF_IBV_MR_ADDR,
        length: l::OFF_IBV_MR_LENGTH,
        handle: l::OFF_IBV_MR_HANDLE,
        lkey: l::OFF_IBV_MR_LKEY,
        rkey: l::OFF_IBV_MR_RKEY,
    }
);
check_layout!(
    ibv_cq = l::SIZE_IBV_CQ {
        context: l::OFF_IBV_CQ_CONTEXT,
        channel: l::OFF_IBV_CQ_CHANNEL,
        cq_context: l::OFF_IBV_CQ_CQ_CONTEXT,
        handle: l::OFF_IBV_CQ_HANDLE,
        cqe: l::OFF_IBV_CQ_CQE,
        mutex: l::OFF_IBV_CQ_MUTEX,
        cond: l::OFF_IBV_CQ_COND,
        comp_events_completed: l::OFF_IBV_CQ_COMP_EVENTS_COMPLETED,
        async_events_completed: l::OFF_IBV_CQ_ASYNC_EVENTS_COMPLETED,
    }
);
check_layout!(
    ibv_srq = l::SIZE_IBV_SRQ {
        context: l::OFF_IBV_SRQ_CONTEXT,
        pd: l::OFF_IBV_SRQ_PD,
        handle: l::OFF_IBV_SRQ_HANDLE,
    }
);
check_layout!(
    ibv_qp = l::SIZE_IBV_QP {
        context: l::OFF_IBV_QP_CONTEXT,
        qp_context: l::OFF_IBV_QP_QP_CONTEXT,
        pd: l::OFF_IBV_QP_PD,
        send_cq: l::OFF_IBV_QP_SEND_CQ,
        recv_cq: l::OFF_IBV_QP_RECV_CQ,
        srq: l::OFF_IBV_QP_SRQ,
        handle: l::OFF_IBV_QP_HANDLE,
        qp_num: l::OFF_IBV_QP_QP_NUM,
        state: l::OFF_IBV_QP_STATE,
        qp_type: l::OFF_IBV_QP_QP_TYPE,
        mutex: l::OFF_IBV_QP_MUTEX,
        cond: l::OFF_IBV_QP_COND,
        events_completed: l::OFF_IBV_QP_EVENTS_COMPLETED,
    }
);
check_layout!(
    ibv_sge = l::SIZE_IBV_SGE {
        addr: l::OFF_IBV_SGE_ADDR,
        length: l::OFF_IBV_SGE_LENGTH,
        lkey: l::OFF_IBV_SGE_LKEY,
    }
);
check_layout!(
    ibv_send_wr = l::SIZE_IBV_SEND_WR {
        wr_id: l::OFF_IBV_SEND_WR_WR_ID,
        next: l::OFF_IBV_SEND_WR_NEXT,
        sg_list: l::OFF_IBV_SEND_WR_SG_LIST,
        num_sge: l::OFF_IBV_SEND_WR_NUM_SGE,
        opcode: l::OFF_IBV_SEND_WR_OPCODE,
        send_flags: l::OFF_IBV_SEND_WR_SEND_FLAGS,
        imm_data: l::OFF_IBV_SEND_WR_IMM_DATA,
        wr: l::OFF_IBV_SEND_WR_WR,
        qp_type_xrc_remote_srqn: l::OFF_IBV_SEND_WR_QP_TYPE,
        bind_mw_or_tso: l::OFF_IBV_SEND_WR_BIND_MW,
    }
);
check_layout!(
    ibv_recv_wr = l::SIZE_IBV_RECV_WR {
        wr_id: l::OFF_IBV_RECV_WR_WR_ID,
        next: l::OFF_IBV_RECV_WR_NEXT,
        sg_list: l::OFF_IBV_RECV_WR_SG_LIST,
        num_sge: l::OFF_IBV_RECV_WR_NUM_SGE,
    }
);
check_layout!(
    ibv_wc = l::SIZE_IBV_WC {
        wr_id: l::OFF_IBV_WC_WR_ID,
        status: l::OFF_IBV_WC_STATUS,
        opcode: l::OFF_IBV_WC_OPCODE,
        vendor_err: l::OFF_IBV_WC_VENDOR_ERR,
        byte_len: l::OFF_IBV_WC_BYTE_LEN,
        imm_data: l::OFF_IBV_WC_IMM_DATA,
        qp_num: l::OFF_IBV_WC_QP_NUM,
        src_qp: l::OFF_IBV_WC_SRC_QP,
        wc_flags: l::OFF_IBV_WC_WC_FLAGS,
        pkey_index: l::OFF_IBV_WC_PKEY_INDEX,
        slid: l::OFF_IBV_WC_SLID,
        sl: l::OFF_IBV_WC_SL,
        dlid_path_bits: l::OFF_IBV_WC_DLID_PATH_BITS,
    }
);
check_layout!(
    ibv_qp_cap = l::SIZE_IBV_QP_CAP {
        max_send_wr: l::OFF_IBV_QP_CAP_MAX_SEND_WR,
        max_recv_wr: l::OFF_IBV_QP_CAP_MAX_RECV_WR,
        max_send_sge: l::OFF_IBV_QP_CAP_MAX_SEND_SGE,
        max_recv_sge: l::OFF_IBV_QP_CAP_MAX_RECV_SGE,
        max_inline_data: l::OFF_IBV_QP_CAP_MAX_INLINE_DATA,
    }
);
check_layout!(
    ibv_srq_attr = l::SIZE_IBV_SRQ_ATTR {
        max_wr: l::OFF_IBV_SRQ_ATTR_MAX_WR,
        max_sge: l::OFF_IBV_SRQ_ATTR_MAX_SGE,
        srq_limit: l::OFF_IBV_SRQ_ATTR_SRQ_LIMIT,
    }
);
check_layout!(
    ibv_srq_init_attr = l::SIZE_IBV_SRQ_INIT_ATTR {
        srq_context: l::OFF_IBV_SRQ_INIT_ATTR_SRQ_CONTEXT,
        attr: l::OFF_IBV_SRQ_INIT_ATTR_ATTR,
    }
);
check_layout!(
    ibv_qp_init_attr = l::SIZE_IBV_QP_INIT_ATTR {
        qp_context: l::OFF_IBV_QP_INIT_ATTR_QP_CONTEXT,
        send_cq: l::OFF_IBV_QP_INIT_ATTR_SEND_CQ,
        recv_cq: l::OFF_IBV_QP_INIT_ATTR_RECV_CQ,
        srq: l::OFF_IBV_QP_INIT_ATTR_SRQ,
        cap: l::OFF_IBV_QP_INIT_ATTR_CAP,
        qp_type: l::OFF_IBV_QP_INIT_ATTR_QP_TYPE,
        sq_sig_all: l::OFF_IBV_QP_INIT_ATTR_SQ_SIG_ALL,
    }
);
check_layout!(
    ibv_qp_init_attr_ex = l::SIZE_IBV_QP_INIT_ATTR_EX {
        cap: l::OFF_IBV_QP_INIT_ATTR_EX_CAP,
        qp_type: l::OFF_IBV_QP_INIT_ATTR_EX_QP_TYPE,
        sq_sig_all: l::OFF_IBV_QP_INIT_ATTR_EX_SQ_SIG_ALL,
        comp_mask: l::OFF_IBV_QP_INIT_ATTR_EX_COMP_MASK,
        pd: l::OFF_IBV_QP_INIT_ATTR_EX_PD,
        xrcd: l::OFF_IBV_QP_INIT_ATTR_EX_XRCD,
        create_flags: l::OFF_IBV_QP_INIT_ATTR_EX_CREATE_FLAGS,
        max_tso_header: l::OFF_IBV_QP_INIT_ATTR_EX_MAX_TSO_HEADER,
        rwq_ind_tbl: l::OFF_IBV_QP_INIT_ATTR_EX_RWQ_IND_TBL,
        rx_hash_conf: l::OFF_IBV_QP_INIT_ATTR_EX_RX_HASH_CONF,
        source_qpn: l::OFF_IBV_QP_INIT_ATTR_EX_SOURCE_QPN,
        send_ops_flags: l::OFF_IBV_QP_INIT_ATTR_EX_SEND_OPS_FLAGS,
    }
);
check_layout!(ibv_rx_hash_conf = l::SIZE_IBV_RX_HASH_CONF {});
check_layout!(ibv_ah_attr = l::SIZE_IBV_AH_ATTR {});
check_layout!(ibv_global_route = l::SIZE_IBV_GLOBAL_ROUTE {});
check_layout!(
    ibv_qp_attr = l::SIZE_IBV_QP_ATTR {
        qp_state: l::OFF_IBV_QP_ATTR_QP_STATE,
        cur_qp_state: l::OFF_IBV_QP_ATTR_CUR_QP_STATE,
        path_mtu: l::OFF_IBV_QP_ATTR_PATH_MTU,
        qkey: l::OFF_IBV_QP_ATTR_QKEY,
        rq_psn: l::OFF_IBV_QP_ATTR_RQ_PSN,
        sq_psn: l::OFF_IBV_QP_ATTR_SQ_PSN,
        dest_qp_num: l::OFF_IBV_QP_ATTR_DEST_QP_NUM,
        qp_access_flags: l::OFF_IBV_QP_ATTR_QP_ACCESS_FLAGS,
        cap: l::OFF_IBV_QP_ATTR_CAP,
        ah_attr: l::OFF_IBV_QP_ATTR_AH_ATTR,
        alt_ah_attr: l::OFF_IBV_QP_ATTR_ALT_AH_ATTR,
        pkey_index: l::OFF_IBV_QP_ATTR_PKEY_INDEX,
        max_rd_atomic: l::OFF_IBV_QP_ATTR_MAX_RD_ATOMIC,
        max_dest_rd_atomic: l::OFF_IBV_QP_ATTR_MAX_DEST_RD_ATOMIC,
        min_rnr_timer: l::OFF_IBV_QP_ATTR_MIN_RNR_TIMER,
        port_num: l::OFF_IBV_QP_ATTR_PORT_NUM,
        timeout: l::OFF_IBV_QP_ATTR_TIMEOUT,
        retry_cnt: l::OFF_IBV_QP_ATTR_RETRY_CNT,
        rnr_retry: l::OFF_IBV_QP_ATTR_RNR_RETRY,
        alt_port_num: l::OFF_IBV_QP_ATTR_ALT_PORT_NUM,
        alt_timeout: l::OFF_IBV_QP_ATTR_ALT_TIMEOUT,
        rate_limit: l::OFF_IBV_QP_ATTR_RATE_LIMIT,
    }
);
check_layout!(
    ibv_device_attr = l::SIZE_IBV_DEVICE_ATTR {
        max_mr_size: l::OFF_IBV_DEVICE_ATTR_MAX_MR_SIZE,
        max_qp_wr: l::OFF_IBV_DEVICE_ATTR_MAX_QP_WR,
        max_sge: l::OFF_IBV_DEVICE_ATTR_MAX_SGE,
        max_qp_rd_atom: l::OFF_IBV_DEVICE_ATTR_MAX_QP_RD_ATOM,
        atomic_cap: l::OFF_IBV_DEVICE_ATTR_ATOMIC_CAP,
        max_pkeys: l::OFF_IBV_DEVICE_ATTR_MAX_PKEYS,
        phys_port_cnt: l::OFF_IBV_DEVICE_ATTR_PHYS_PORT_CNT,
    }
);
check_layout!(
    ibv_qp_ex = l::SIZE_IBV_QP_EX {
        comp_mask: l::OFF_IBV_QP_EX_COMP_MASK,
        wr_id: l::OFF_IBV_QP_EX_WR_ID,
        wr_flags: l::OFF_IBV_QP_EX_WR_FLAGS,
        wr_atomic_cmp_swp: l::OFF_IBV_QP_EX_WR_ATOMIC_CMP_SWP,
        wr_rdma_write: l::OFF_IBV_QP_EX_WR_RDMA_WRITE,
        wr_send: l::OFF_IBV_QP_EX_WR_SEND,
        wr_set_ud_addr: l::OFF_IBV_QP_EX_WR_SET_UD_ADDR,
        wr_set_sge: l::OFF_IBV_QP_EX_WR_SET_SGE,
        wr_set_sge_list: l::OFF_IBV_QP_EX_WR_SET_SGE_LIST,
        wr_start: l::OFF_IBV_QP_EX_WR_START,
        wr_complete: l::OFF_IBV_QP_EX_WR_COMPLETE,
        wr_abort: l::OFF_IBV_QP_EX_WR_ABORT,
        wr_atomic_write: l::OFF_IBV_QP_EX_WR_ATOMIC_WRITE,
    }
);
check_layout!(ibv_data_buf = l::SIZE_IBV_DATA_BUF {});
check_layout!(
    ibv_comp_channel = l::SIZE_IBV_COMP_CHANNEL {
        fd: l::OFF_IBV_COMP_CHANNEL_FD,
    }
);

// ---- the device and port queries of the ODP mode (crate::odp) ----

/// `struct ibv_odp_caps`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_odp_caps {
    /// `IBV_ODP_SUPPORT`, `IBV_ODP_SUPPORT_IMPLICIT`.
    pub general_caps: u64,
    /// `per_transport_caps.rc_odp_caps` (`IBV_ODP_SUPPORT_SEND` ...).
    pub rc_odp_caps: u32,
    /// `per_transport_caps.uc_odp_caps`.
    pub uc_odp_caps: u32,
    /// `per_transport_caps.ud_odp_caps`.
    pub ud_odp_caps: u32,
}

/// `struct ibv_device_attr_ex`: the fields the library reads, the rest kept as bytes so
/// that the provider may fill the whole struct.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr_ex {
    pub orig_attr: ibv_device_attr,
    pub comp_mask: u32,
    pub odp_caps: ibv_odp_caps,
    pub _rest:
        [u8; l::SIZE_IBV_DEVICE_ATTR_EX - l::OFF_IBV_DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK],
}

impl ibv_device_attr_ex {
    /// An all-zero value for the provider to fill.
    pub const fn zeroed() -> Self {
        Self {
            orig_attr: ibv_device_attr::zeroed(),
            comp_mask: 0,
            odp_caps: ibv_odp_caps {
                general_caps: 0,
                rc_odp_caps: 0,
                uc_odp_caps: 0,
                ud_odp_caps: 0,
            },
            _rest: [0; l::SIZE_IBV_DEVICE_ATTR_EX
                - l::OFF_IBV_DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK],
        }
    }
}

/// `verbs_context::query_device_ex` (the inline `ibv_query_device_ex` calls it with the
/// size of the caller's struct).
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut ibv_device_attr_ex, usize) -> c_int;

/// `IBV_ODP_SUPPORT` (`enum ibv_odp_general_caps`).
pub const IBV_ODP_SUPPORT: u64 = 1 << 0;
/// `IBV_ODP_SUPPORT_SEND` (`enum ibv_odp_transport_cap_bits`).
pub const IBV_ODP_SUPPORT_SEND: u32 = 1 << 0;
/// `IBV_ODP_SUPPORT_RECV`.
pub const IBV_ODP_SUPPORT_RECV: u32 = 1 << 1;
/// `IBV_ODP_SUPPORT_WRITE`.
pub const IBV_ODP_SUPPORT_WRITE: u32 = 1 << 2;
/// `IBV_ODP_SUPPORT_READ`.
pub const IBV_ODP_SUPPORT_READ: u32 = 1 << 3;
/// `IBV_ODP_SUPPORT_ATOMIC`.
pub const IBV_ODP_SUPPORT_ATOMIC: u32 = 1 << 4;
/// `IBV_ODP_SUPPORT_SRQ_RECV`.
pub const IBV_ODP_SUPPORT_SRQ_RECV: u32 = 1 << 5;

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `IBV_PORT_ACTIVE` (`enum ibv_port_state`).
pub const IBV_PORT_ACTIVE: u32 = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
/// `IBV_MTU_256` (`enum ibv_mtu`), the smallest path MTU.
pub const IBV_MTU_256: u32 = 1;

/// `IBV_QP_PKEY_INDEX` (`enum ibv_qp_attr_mask`).
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
/// `IBV_QP_PORT`.
pub const IBV_QP_PORT: c_int = 1 << 5;
/// `IBV_QP_AV`.
pub const IBV_QP_AV: c_int = 1 << 7;
/// `IBV_QP_PATH_MTU`.
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
/// `IBV_QP_TIMEOUT`.
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
/// `IBV_QP_RETRY_CNT`.
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
/// `IBV_QP_RNR_RETRY`.
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
/// `IBV_QP_RQ_PSN`.
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
/// `IBV_QP_MIN_RNR_TIMER`.
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
/// `IBV_QP_SQ_PSN`.
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;

check_layout!(
    ibv_odp_caps = l::SIZE_IBV_ODP_CAPS {
        general_caps: l::OFF_IBV_ODP_CAPS_GENERAL_CAPS,
        rc_odp_caps: l::OFF_IBV_ODP_CAPS_PER_TRANSPORT_CAPS_RC_ODP_CAPS,
        uc_odp_caps: l::OFF_IBV_ODP_CAPS_PER_TRANSPORT_CAPS_UC_ODP_CAPS,
        ud_odp_caps: l::OFF_IBV_ODP_CAPS_PER_TRANSPORT_CAPS_UD_ODP_CAPS,
    }
);
check_layout!(
    ibv_device_attr_ex = l::SIZE_IBV_DEVICE_ATTR_EX {
        orig_attr: l::OFF_IBV_DEVICE_ATTR_EX_ORIG_ATTR,
        comp_mask: l::OFF_IBV_DEVICE_ATTR_EX_COMP_MASK,
        odp_caps: l::OFF_IBV_DEVICE_ATTR_EX_ODP_CAPS,
        _rest: l::OFF_IBV_DEVICE_ATTR_EX_COMPLETION_TIMESTAMP_MASK,
    }
);
check_layout!(
    ibv_port_attr = l::SIZE_IBV_PORT_ATTR {
        state: l::OFF_IBV_PORT_ATTR_STATE,
        active_mtu: l::OFF_IBV_PORT_ATTR_ACTIVE_MTU,
        gid_tbl_len: l::OFF_IBV_PORT_ATTR_GID_TBL_LEN,
        lid: l::OFF_IBV_PORT_ATTR_LID,
        link_layer: l::OFF_IBV_PORT_ATTR_LINK_LAYER,
        port_cap_flags2: l::OFF_IBV_PORT_ATTR_PORT_CAP_FLAGS2,
    }
);
