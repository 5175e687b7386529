//! libibverbs reached through `dlsym` at run time, shared by the verbs programs in `src/bin/`:
//! never link-time symbols, so that a preloaded library (libnprdma.so) is the one that
//! interposes. Each program keeps its own table of the functions it calls and fills it with
//! [`load!`] after [`open_libibverbs`].

// Each program uses part of these signatures.
#![allow(dead_code)]

use std::ffi::{CString, c_char, c_int, c_void};

use nprdma::sys::*;

pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device;
pub type GetDeviceName = unsafe extern "C" fn(*mut ibv_device) -> *const c_char;
pub type OpenDevice = unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context;
pub type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
pub type CreateCq =
    unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
pub type CreateQp = unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
pub type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
pub type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
pub type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut [u8; 16]) -> c_int;
pub type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
pub type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
pub type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
pub type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
pub type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, u32);

/// Loads libibverbs into the global scope (kept for the process's lifetime).
pub fn open_libibverbs() -> Result<(), String> {
    // SAFETY: a NUL-terminated library name; the handle is never closed.
    let h = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    };
    if h.is_null() {
        return Err("cannot load libibverbs.so.1".into());
    }
    Ok(())
}

/// Looks `name` up in the global scope: a preloaded library first, then libibverbs. Plain
/// `dlsym`, not `dlvsym`: glibc's `dlvsym` never matches an unversioned definition (it looks
/// up "hidden" versions), so it would skip the preloaded library's symbols.
pub fn sym(name: &str) -> Result<*mut c_void, String> {
    let n = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated string; RTLD_DEFAULT searches the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, n.as_ptr()) };
    if p.is_null() {
        Err(format!("libibverbs has no {name}"))
    } else {
        Ok(p)
    }
}

/// The function `$name` as the C signature `$ty` (a `?` on a missing symbol).
macro_rules! load {
    ($name:literal, $ty:ty) => {{
        let p = $crate::dlverbs::sym($name)?;
        // SAFETY: the libibverbs symbol has this C signature (verbs.h).
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, $ty>(p) }
    }};
}
pub(crate) use load;

/// Takes an RC QP from RESET through INIT (with `access`) and RTR (towards `peer_qpn` at
/// `peer_gid`, path MTU `mtu` as `enum ibv_mtu`) to RTS, through `modify` (the program's
/// `ibv_modify_qp` on its QP, which names the step in its error). The attribute masks are
/// verbs.h's `IBV_QP_*` bits.
pub fn rc_to_rts(
    modify: impl Fn(&mut ibv_qp_attr, c_int, &str) -> Result<(), String>,
    access: u32,
    mtu: u32,
    peer_qpn: u32,
    peer_gid: [u8; 16],
    gid_index: i32,
) -> Result<(), String> {
    let mut init = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        qp_access_flags: access,
        port_num: 1,
        ..Default::default()
    };
    // STATE | ACCESS_FLAGS | PKEY_INDEX | PORT
    modify(
        &mut init,
        IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | (1 << 4) | (1 << 5),
        "INIT",
    )?;
    let mut rtr = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: mtu,
        dest_qp_num: peer_qpn,
        rq_psn: 0,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ..Default::default()
    };
    rtr.ah_attr.is_global = 1;
    rtr.ah_attr.grh.dgid = peer_gid;
    rtr.ah_attr.grh.sgid_index = gid_index as u8;
    rtr.ah_attr.grh.hop_limit = 1;
    rtr.ah_attr.port_num = 1;
    // STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
    modify(
        &mut rtr,
        IBV_QP_STATE
            | (1 << 7)
            | (1 << 8)
            | IBV_QP_DEST_QPN
            | (1 << 12)
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | (1 << 15),
        "RTR",
    )?;
    let mut rts = ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0,
        max_rd_atomic: 1,
        ..Default::default()
    };
    // STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
    modify(
        &mut rts,
        IBV_QP_STATE | (1 << 9) | (1 << 10) | (1 << 11) | (1 << 16) | IBV_QP_MAX_QP_RD_ATOMIC,
        "RTS",
    )
}
