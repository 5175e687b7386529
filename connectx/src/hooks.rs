//! The exported symbols of libnprdma.so: the libibverbs registration and object entry points
//! (and three mlx5 direct-verbs entry points, only to notice them), each forwarding to
//! [`crate::interpose`] with the process's engine.
//!
//! The engine is created on the first call (never in a constructor: reading the environment,
//! resolving symbols and creating the status file are not safe before the program runs). When a
//! hook is entered from inside a real libibverbs call it forwards unchanged. A panic never
//! crosses the boundary: it is logged once and the call fails the C way (NULL + errno, or an
//! errno), or is forwarded when forwarding is possible.

use core::ffi::{c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};

use crate::config::{Config, Mode};
use crate::engine::Engine;
use crate::engine::call::{RealCall, set_errno};
use crate::interpose as ip;
use crate::real::RealVerbs;
use crate::status::PageStore;
use crate::sys::*;

static GLOBAL: OnceLock<Option<Arc<Engine>>> = OnceLock::new();
/// The status file and the process that created it: a child made by `fork()` inherits the
/// exit handler, and must not delete its parent's file when it exits.
static STATUS_PATH: OnceLock<(u32, std::path::PathBuf)> = OnceLock::new();

extern "C" fn remove_status_file() {
    if let Some((owner, p)) = STATUS_PATH.get()
        && *owner == std::process::id()
    {
        let _ = std::fs::remove_file(p);
    }
}

/// The process's engine, created on first use; `None` if libibverbs cannot be resolved.
pub fn global() -> Option<&'static Arc<Engine>> {
    GLOBAL
        .get_or_init(|| {
            let cfg = match Config::from_env() {
                Ok(c) => c,
                Err(e) => {
                    crate::log::line(&format!("{e}; stepping aside (pass-through)"));
                    Config::pass_through_from_env()
                }
            };
            crate::log::set_enabled(cfg.log);
            let real = match RealVerbs::resolve() {
                Ok(r) => r,
                Err(e) => {
                    crate::log::line(&format!("{e}: the library cannot work"));
                    return None;
                }
            };
            let (status, status_refused) = PageStore::file_or_heap(&cfg);
            if let Some(p) = status.path() {
                let _ = STATUS_PATH.set((std::process::id(), p.to_path_buf()));
                // SAFETY: registering a plain function with no captured state.
                unsafe {
                    libc::atexit(remove_status_file);
                }
            }
            crate::log::line(&format!(
                "mode {}, NPRDMA_MODE={}, pinned-memory budget {} bytes ({}), window {} bytes",
                match cfg.mode {
                    Mode::Unpinned => "unpinned",
                    Mode::Off => "off (pass-through)",
                },
                cfg.reg_mode.as_str(),
                cfg.budget,
                cfg.budget_source,
                cfg.window
            ));
            let off = cfg.mode == Mode::Off;
            let mode_error = cfg.reg_mode_error.clone();
            let eng = Engine::new(real, cfg, status);
            if let Some(e) = mode_error {
                eng.note(&format!("{e}; using the default, auto"));
            }
            if off {
                eng.note("NPRDMA=off: every call passes through to libibverbs");
            }
            if let Some(why) = status_refused {
                eng.note(&why);
            }
            Some(eng)
        })
        .as_ref()
}

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            crate::log::once("internal error (panic) in an interposed verbs call; the call failed");
            fallback
        }
    }
}

macro_rules! engine_or {
    ($fail:expr) => {
        match global() {
            Some(e) => e,
            None => {
                set_errno(libc::ENOSYS);
                return $fail;
            }
        }
    };
}

/// Interposed `ibv_open_device`.
///
/// # Safety
/// As `ibv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.open_device)(dev) };
    }
    // SAFETY: the application's arguments.
    guard(core::ptr::null_mut(), || unsafe {
        ip::open_device(eng, dev)
    })
}

/// Interposed `ibv_close_device`.
///
/// # Safety
/// As `ibv_close_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.close_device)(ctx) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::close_device(eng, ctx) })
}

/// Interposed `ibv_reg_mr`.
///
/// # Safety
/// As `ibv_reg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.reg_mr)(pd, addr, len, access) };
    }
    guard(core::ptr::null_mut(), || {
        // SAFETY: the application's arguments; ibv_reg_mr registers at iova = addr.
        unsafe { ip::reg_mr_iova2(eng, pd, addr, len, addr as u64, access as c_uint) }
    })
}

/// Interposed `ibv_reg_mr_iova`.
///
/// # Safety
/// As `ibv_reg_mr_iova`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.reg_mr_iova)(pd, addr, len, iova, access) };
    }
    guard(core::ptr::null_mut(), || {
        // SAFETY: the application's arguments.
        unsafe { ip::reg_mr_iova2(eng, pd, addr, len, iova, access as c_uint) }
    })
}

/// Interposed `ibv_reg_mr_iova2`.
///
/// # Safety
/// As `ibv_reg_mr_iova2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.reg_mr_iova2)(pd, addr, len, iova, access) };
    }
    guard(core::ptr::null_mut(), || {
        // SAFETY: the application's arguments.
        unsafe { ip::reg_mr_iova2(eng, pd, addr, len, iova, access) }
    })
}

/// Interposed `ibv_reg_dmabuf_mr`.
///
/// # Safety
/// As `ibv_reg_dmabuf_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    let eng = engine_or!(core::ptr::null_mut());
    guard(core::ptr::null_mut(), || {
        // SAFETY: the application's arguments.
        unsafe { ip::reg_dmabuf_mr(eng, pd, offset, len, iova, fd, access) }
    })
}

/// Interposed `ibv_rereg_mr`.
///
/// # Safety
/// As `ibv_rereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> c_int {
    let eng = engine_or!(IBV_REREG_MR_ERR_INPUT);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.rereg_mr)(mr, flags, pd, addr, len, access) };
    }
    guard(IBV_REREG_MR_ERR_INPUT, || {
        // SAFETY: the application's arguments.
        unsafe { ip::rereg_mr(eng, mr, flags, pd, addr, len, access) }
    })
}

/// Interposed `ibv_dereg_mr`.
///
/// # Safety
/// As `ibv_dereg_mr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.dereg_mr)(mr) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::dereg_mr(eng, mr) })
}

/// Interposed `ibv_create_qp`.
///
/// # Safety
/// As `ibv_create_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.create_qp)(pd, attr) };
    }
    // SAFETY: the application's arguments.
    guard(core::ptr::null_mut(), || unsafe {
        ip::create_qp(eng, pd, attr)
    })
}

/// Interposed `ibv_destroy_qp`.
///
/// # Safety
/// As `ibv_destroy_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.destroy_qp)(qp) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::destroy_qp(eng, qp) })
}

/// Interposed `ibv_modify_qp`.
///
/// # Safety
/// As `ibv_modify_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.modify_qp)(qp, attr, mask) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::modify_qp(eng, qp, attr, mask) })
}

/// Interposed `ibv_query_qp`.
///
/// # Safety
/// As `ibv_query_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.query_qp)(qp, attr, mask, init) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe {
        ip::query_qp(eng, qp, attr, mask, init)
    })
}

/// Interposed `ibv_resize_cq`.
///
/// # Safety
/// As `ibv_resize_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.resize_cq)(cq, cqe) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::resize_cq(eng, cq, cqe) })
}

/// Interposed `ibv_destroy_cq`.
///
/// # Safety
/// As `ibv_destroy_cq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.destroy_cq)(cq) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::destroy_cq(eng, cq) })
}

/// Interposed `ibv_create_srq`.
///
/// # Safety
/// As `ibv_create_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let eng = engine_or!(core::ptr::null_mut());
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.create_srq)(pd, attr) };
    }
    // SAFETY: the application's arguments.
    guard(core::ptr::null_mut(), || unsafe {
        ip::create_srq(eng, pd, attr)
    })
}

/// Interposed `ibv_destroy_srq`.
///
/// # Safety
/// As `ibv_destroy_srq`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    let eng = engine_or!(libc::ENOSYS);
    if ip::nested() {
        // SAFETY: forwarded.
        return unsafe { (eng.real.destroy_srq)(srq) };
    }
    // SAFETY: the application's arguments.
    guard(libc::EIO, || unsafe { ip::destroy_srq(eng, srq) })
}

// ---- mlx5 direct verbs: noticed, never changed ----

fn next_symbol(name: &'static str) -> Option<*mut c_void> {
    let cname = std::ffi::CString::new(name).ok()?;
    // SAFETY: a NUL-terminated name; RTLD_NEXT is valid from a shared object.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, cname.as_ptr()) };
    (!p.is_null()).then_some(p)
}

fn note_direct_verbs(what: &str) {
    if let Some(eng) = global() {
        eng.note(what);
    }
}

/// Interposed `mlx5dv_open_device`: such a context never passes through `ibv_open_device`, so
/// the library does not manage it (its registrations pass through); noted for doctor.
///
/// # Safety
/// As `mlx5dv_open_device`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx5dv_open_device(
    dev: *mut ibv_device,
    attr: *mut c_void,
) -> *mut ibv_context {
    let Some(p) = next_symbol("mlx5dv_open_device") else {
        set_errno(libc::EOPNOTSUPP);
        return core::ptr::null_mut();
    };
    note_direct_verbs(
        "mlx5dv_open_device: direct-verbs context; its registrations pass through (pinned)",
    );
    type F = unsafe extern "C" fn(*mut ibv_device, *mut c_void) -> *mut ibv_context;
    // SAFETY: libmlx5's mlx5dv_open_device has this signature (mlx5dv.h).
    let f = unsafe { core::mem::transmute::<*mut c_void, F>(p) };
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    unsafe { f(dev, attr) }
}

/// Interposed `mlx5dv_create_qp`: a direct-verbs QP's work requests bypass the library, so its
/// context passes through from now on (earlier unpinned regions used in its WQEs fail with a
/// protection error, never silently).
///
/// # Safety
/// As `mlx5dv_create_qp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx5dv_create_qp(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
    mlx5_attr: *mut c_void,
) -> *mut ibv_qp {
    let Some(p) = next_symbol("mlx5dv_create_qp") else {
        set_errno(libc::EOPNOTSUPP);
        return core::ptr::null_mut();
    };
    crate::interpose::enter_passthrough(
        ctx,
        "mlx5dv_create_qp: direct-verbs QP; the context passes through from now on",
    );
    type F = unsafe extern "C" fn(
        *mut ibv_context,
        *mut ibv_qp_init_attr_ex,
        *mut c_void,
    ) -> *mut ibv_qp;
    // SAFETY: libmlx5's mlx5dv_create_qp has this signature (mlx5dv.h).
    let f = unsafe { core::mem::transmute::<*mut c_void, F>(p) };
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    unsafe { f(ctx, attr, mlx5_attr) }
}

/// Interposed `mlx5dv_init_obj`: exposing a QP's or CQ's rings to the application means its
/// work bypasses the library; the context passes through from now on.
///
/// # Safety
/// As `mlx5dv_init_obj`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mlx5dv_init_obj(obj: *mut c_void, obj_type: u64) -> c_int {
    let Some(p) = next_symbol("mlx5dv_init_obj") else {
        return libc::EOPNOTSUPP;
    };
    // `struct mlx5dv_obj` is `{ in, out }` pairs of pointers: qp at offset 0, cq at 16,
    // srq at 32 (mlx5dv.h; MLX5DV_OBJ_QP = 1 << 0, MLX5DV_OBJ_CQ = 1 << 1, MLX5DV_OBJ_SRQ
    // = 1 << 2). An application that reads a CQ's CQEs itself, or fills an SRQ's or QP's
    // rings, bypasses the library (it would see the library's tagged wr_ids and its own
    // completions), and `ibv_qp`, `ibv_cq` and `ibv_srq` all start with their context.
    const OBJECTS: [(u64, usize, &str); 3] = [
        (
            1 << 0,
            0,
            "mlx5dv_init_obj on a QP: direct-verbs data path; the context passes through from now on",
        ),
        (
            1 << 1,
            16,
            "mlx5dv_init_obj on a CQ: direct-verbs completions; the context passes through from now on",
        ),
        (
            1 << 2,
            32,
            "mlx5dv_init_obj on an SRQ: direct-verbs receives; the context passes through from now on",
        ),
    ];
    if !obj.is_null() {
        for (bit, offset, why) in OBJECTS {
            if obj_type & bit == 0 {
                continue;
            }
            // SAFETY: with this bit set, the mlx5dv_obj holds the object's pointer at
            // `offset` (the `in` member of its pair).
            let object =
                unsafe { *(obj.cast::<u8>().add(offset) as *const *const *mut ibv_context) };
            if !object.is_null() {
                // SAFETY: a live verbs object whose first member is its context.
                let ctx = unsafe { *object };
                crate::interpose::enter_passthrough(ctx, why);
            }
        }
    }
    type F = unsafe extern "C" fn(*mut c_void, u64) -> c_int;
    // SAFETY: libmlx5's mlx5dv_init_obj has this signature (mlx5dv.h).
    let f = unsafe { core::mem::transmute::<*mut c_void, F>(p) };
    let _g = RealCall::enter();
    // SAFETY: forwarded.
    unsafe { f(obj, obj_type) }
}

/// The process's engine if it has been created (no side effects).
pub fn active() -> Option<&'static Arc<Engine>> {
    GLOBAL.get().and_then(|e| e.as_ref())
}
