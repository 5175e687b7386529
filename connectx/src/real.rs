//! The functions of libibverbs that the library calls "for real".
//!
//! In the preloaded library they are resolved once with `dlvsym(RTLD_NEXT, name, version)`:
//! libibverbs exports most symbols twice (`@IBVERBS_1.0` compat and `@@IBVERBS_1.1` default,
//! Debian's libibverbs1.symbols), and plain `dlsym` is not guaranteed to pick the default
//! version (rust-anchors.md §4.4, after libibprof's `ibprof_ibv.c`). In tests the table points
//! at the fake provider (`crate::fake`, in test builds only).

use core::ffi::{c_int, c_uint, c_void};

use crate::error::{ConnectxError, Result};
use crate::sys::*;

/// `ibv_open_device`.
pub type OpenDeviceFn = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
/// `ibv_close_device`.
pub type CloseDeviceFn = unsafe extern "C" fn(*mut ibv_context) -> c_int;
/// `ibv_query_device`.
pub type QueryDeviceFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
/// `ibv_reg_mr`.
pub type RegMrFn = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
/// `ibv_reg_mr_iova`.
pub type RegMrIovaFn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
/// `ibv_reg_mr_iova2`.
pub type RegMrIova2Fn =
    unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
/// `ibv_reg_dmabuf_mr`.
pub type RegDmabufMrFn =
    unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
/// `ibv_rereg_mr`.
pub type ReregMrFn =
    unsafe extern "C" fn(*mut ibv_mr, c_int, *mut ibv_pd, *mut c_void, usize, c_int) -> c_int;
/// `ibv_dereg_mr`.
pub type DeregMrFn = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
/// `ibv_create_qp`.
pub type CreateQpFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
/// `ibv_destroy_qp`.
pub type DestroyQpFn = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
/// `ibv_modify_qp`.
pub type ModifyQpFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
/// `ibv_query_qp`.
pub type QueryQpFn =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
/// `ibv_resize_cq`.
pub type ResizeCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ibv_destroy_cq`.
pub type DestroyCqFn = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
/// `ibv_destroy_srq`.
pub type DestroySrqFn = unsafe extern "C" fn(*mut ibv_srq) -> c_int;
/// `ibv_create_srq`.
pub type CreateSrqFn = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
/// `ibv_query_srq`.
pub type QuerySrqFn = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int;
/// `ibv_alloc_pd`.
pub type AllocPdFn = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
/// `ibv_dealloc_pd`.
pub type DeallocPdFn = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
/// `ibv_create_cq` (context, cqe, cq_context, channel, comp_vector).
pub type CreateCqFn =
    unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
/// `ibv_query_port` (the exported function, which verbs.h's inline `ibv_query_port` calls
/// with a zeroed `struct ibv_port_attr` when the context has no `query_port` of its own).
pub type QueryPortFn = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
/// `ibv_query_gid`.
pub type QueryGidFn = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int;
/// `ibv_get_device_name`.
pub type GetDeviceNameFn = unsafe extern "C" fn(*mut ibv_device) -> *const core::ffi::c_char;
/// `ibv_qp_to_qp_ex`.
pub type QpToQpExFn = unsafe extern "C" fn(*mut ibv_qp) -> *mut ibv_qp_ex;

/// The table.
#[derive(Clone, Copy, Debug)]
pub struct RealVerbs {
    /// `ibv_open_device`.
    pub open_device: OpenDeviceFn,
    /// `ibv_close_device`.
    pub close_device: CloseDeviceFn,
    /// `ibv_query_device`.
    pub query_device: QueryDeviceFn,
    /// `ibv_reg_mr`.
    pub reg_mr: RegMrFn,
    /// `ibv_reg_mr_iova`.
    pub reg_mr_iova: RegMrIovaFn,
    /// `ibv_reg_mr_iova2`.
    pub reg_mr_iova2: RegMrIova2Fn,
    /// `ibv_reg_dmabuf_mr` (absent before rdma-core 34).
    pub reg_dmabuf_mr: Option<RegDmabufMrFn>,
    /// `ibv_rereg_mr`.
    pub rereg_mr: ReregMrFn,
    /// `ibv_dereg_mr`.
    pub dereg_mr: DeregMrFn,
    /// `ibv_create_qp`.
    pub create_qp: CreateQpFn,
    /// `ibv_destroy_qp`.
    pub destroy_qp: DestroyQpFn,
    /// `ibv_modify_qp`.
    pub modify_qp: ModifyQpFn,
    /// `ibv_query_qp`.
    pub query_qp: QueryQpFn,
    /// `ibv_resize_cq`.
    pub resize_cq: ResizeCqFn,
    /// `ibv_destroy_cq`.
    pub destroy_cq: DestroyCqFn,
    /// `ibv_destroy_srq`.
    pub destroy_srq: DestroySrqFn,
    /// `ibv_create_srq`.
    pub create_srq: CreateSrqFn,
    /// `ibv_query_srq`.
    pub query_srq: QuerySrqFn,
    /// `ibv_qp_to_qp_ex`.
    pub qp_to_qp_ex: QpToQpExFn,
    /// `ibv_alloc_pd` (the ODP self-test's own objects, crate::odp).
    pub alloc_pd: AllocPdFn,
    /// `ibv_dealloc_pd`.
    pub dealloc_pd: DeallocPdFn,
    /// `ibv_create_cq`.
    pub create_cq: CreateCqFn,
    /// `ibv_query_port`.
    pub query_port: QueryPortFn,
    /// `ibv_query_gid`.
    pub query_gid: QueryGidFn,
    /// `ibv_get_device_name` (the device's name in the log and doctor).
    pub get_device_name: GetDeviceNameFn,
}

fn lookup(name: &'static str, version: &'static str) -> Option<*mut c_void> {
    let cname = std::ffi::CString::new(name).ok()?;
    let cver = std::ffi::CString::new(version).ok()?;
    // SAFETY: both strings are NUL-terminated and live across the call; RTLD_NEXT is a valid
    // pseudo-handle for a shared object that has a "next" object in the search order.
    let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, cname.as_ptr(), cver.as_ptr()) };
    (!p.is_null()).then_some(p)
}

macro_rules! resolve {
    ($name:literal, $ver:literal, $ty:ty) => {{
        let p = lookup($name, $ver).ok_or(ConnectxError::MissingSymbol {
            symbol: concat!($name, "@", $ver),
        })?;
        // SAFETY: the symbol of that name and version in libibverbs has exactly this C
        // signature (verbs.h); a data pointer and a function pointer have the same size here.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

impl RealVerbs {
    /// Resolves every function in the next object after this library (libibverbs).
    pub fn resolve() -> Result<Self> {
        Ok(Self {
            open_device: resolve!("ibv_open_device", "IBVERBS_1.1", OpenDeviceFn),
            close_device: resolve!("ibv_close_device", "IBVERBS_1.1", CloseDeviceFn),
            query_device: resolve!("ibv_query_device", "IBVERBS_1.1", QueryDeviceFn),
            reg_mr: resolve!("ibv_reg_mr", "IBVERBS_1.1", RegMrFn),
            reg_mr_iova: resolve!("ibv_reg_mr_iova", "IBVERBS_1.7", RegMrIovaFn),
            reg_mr_iova2: resolve!("ibv_reg_mr_iova2", "IBVERBS_1.8", RegMrIova2Fn),
            reg_dmabuf_mr: lookup("ibv_reg_dmabuf_mr", "IBVERBS_1.12").map(|p| {
                // SAFETY: as in `resolve!`: the IBVERBS_1.12 symbol has this signature.
                unsafe { core::mem::transmute::<*mut c_void, RegDmabufMrFn>(p) }
            }),
            rereg_mr: resolve!("ibv_rereg_mr", "IBVERBS_1.1", ReregMrFn),
            dereg_mr: resolve!("ibv_dereg_mr", "IBVERBS_1.1", DeregMrFn),
            create_qp: resolve!("ibv_create_qp", "IBVERBS_1.1", CreateQpFn),
            destroy_qp: resolve!("ibv_destroy_qp", "IBVERBS_1.1", DestroyQpFn),
            modify_qp: resolve!("ibv_modify_qp", "IBVERBS_1.1", ModifyQpFn),
            query_qp: resolve!("ibv_query_qp", "IBVERBS_1.1", QueryQpFn),
            resize_cq: resolve!("ibv_resize_cq", "IBVERBS_1.1", ResizeCqFn),
            destroy_cq: resolve!("ibv_destroy_cq", "IBVERBS_1.1", DestroyCqFn),
            destroy_srq: resolve!("ibv_destroy_srq", "IBVERBS_1.1", DestroySrqFn),
            create_srq: resolve!("ibv_create_srq", "IBVERBS_1.1", CreateSrqFn),
            query_srq: resolve!("ibv_query_srq", "IBVERBS_1.1", QuerySrqFn),
            qp_to_qp_ex: resolve!("ibv_qp_to_qp_ex", "IBVERBS_1.6", QpToQpExFn),
            alloc_pd: resolve!("ibv_alloc_pd", "IBVERBS_1.1", AllocPdFn),
            dealloc_pd: resolve!("ibv_dealloc_pd", "IBVERBS_1.1", DeallocPdFn),
            create_cq: resolve!("ibv_create_cq", "IBVERBS_1.1", CreateCqFn),
            query_port: resolve!("ibv_query_port", "IBVERBS_1.1", QueryPortFn),
            query_gid: resolve!("ibv_query_gid", "IBVERBS_1.1", QueryGidFn),
            get_device_name: resolve!("ibv_get_device_name", "IBVERBS_1.1", GetDeviceNameFn),
        })
    }
}
