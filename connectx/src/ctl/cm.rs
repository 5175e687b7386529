//! librdmacm and the few verbs the control connection calls itself, found at run time.
//!
//! librdmacm is loaded with `dlopen` when the first control connection is needed, never
//! linked: a process without it (or a machine without the package) keeps working, with the
//! fallback of docs/connectx.md §13. Every call runs inside [`RealCall`], so that the verbs
//! librdmacm calls on its own behalf (it opens every device, creates the QP of an id) pass
//! through the library's hooks untouched: those objects are the library's, not the
//! application's.

use core::ffi::{c_int, c_void};
use std::ffi::CString;
use std::sync::OnceLock;

use crate::engine::call::RealCall;
use crate::sys::rdmacm::*;
use crate::sys::*;

/// Why the control connection's libraries are unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// `dlopen("librdmacm.so.1")` failed.
    #[error("librdmacm.so.1 cannot be loaded ({0}): no control connections")]
    NoLibrary(String),
    /// A function is missing from librdmacm or libibverbs.
    #[error("{0} is missing: no control connections")]
    MissingSymbol(&'static str),
}

type CreateEventChannel = unsafe extern "C" fn() -> *mut rdma_event_channel;
type DestroyEventChannel = unsafe extern "C" fn(*mut rdma_event_channel);
type CreateId = unsafe extern "C" fn(
    *mut rdma_event_channel,
    *mut *mut rdma_cm_id,
    *mut c_void,
    core::ffi::c_uint,
) -> c_int;
type IdFn = unsafe extern "C" fn(*mut rdma_cm_id) -> c_int;
type BindAddr = unsafe extern "C" fn(*mut rdma_cm_id, *const libc::sockaddr) -> c_int;
type Listen = unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int;
type ResolveAddr = unsafe extern "C" fn(
    *mut rdma_cm_id,
    *const libc::sockaddr,
    *const libc::sockaddr,
    c_int,
) -> c_int;
type ResolveRoute = unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int;
type ConnParamFn = unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
type Reject = unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int;
type GetCmEvent = unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
type AckCmEvent = unsafe extern "C" fn(*mut rdma_cm_event) -> c_int;
type CreateQp = unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut rdma_cm_id);
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd;
type DeallocPd = unsafe extern "C" fn(*mut ibv_pd) -> c_int;
type CreateCq =
    unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut c_void, c_int) -> *mut ibv_cq;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type RegMr = unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;

/// The functions, resolved once per process.
pub struct Cm {
    create_event_channel: CreateEventChannel,
    destroy_event_channel: DestroyEventChannel,
    create_id: CreateId,
    destroy_id: IdFn,
    bind_addr: BindAddr,
    listen: Listen,
    resolve_addr: ResolveAddr,
    resolve_route: ResolveRoute,
    connect: ConnParamFn,
    accept: ConnParamFn,
    reject: Reject,
    disconnect: IdFn,
    get_cm_event: GetCmEvent,
    ack_cm_event: AckCmEvent,
    create_qp: CreateQp,
    destroy_qp: DestroyQp,
    alloc_pd: AllocPd,
    dealloc_pd: DeallocPd,
    create_cq: CreateCq,
    destroy_cq: DestroyCq,
    reg_mr: RegMr,
    dereg_mr: DeregMr,
}

// SAFETY: a table of C function pointers, immutable after loading; the functions themselves
// are thread-safe per rdma_cma.h/verbs.h (ids and channels are used by one thread at a time
// by this crate).
unsafe impl Send for Cm {}
// SAFETY: as above: shared read-only.
unsafe impl Sync for Cm {}

fn sym(handle: *mut c_void, name: &'static str) -> Result<*mut c_void, LoadError> {
    let c = CString::new(name).map_err(|_| LoadError::MissingSymbol(name))?;
    // SAFETY: a valid handle from dlopen (or RTLD_NEXT) and a NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
    if p.is_null() {
        Err(LoadError::MissingSymbol(name))
    } else {
        Ok(p)
    }
}

/// A versioned libibverbs function, looked up in libibverbs itself (a handle of that object,
/// not the global scope: the preloaded library's hooks of the same names must not be found).
fn verbs_sym(
    verbs: *mut c_void,
    name: &'static str,
    version: &'static str,
) -> Result<*mut c_void, LoadError> {
    let c = CString::new(name).map_err(|_| LoadError::MissingSymbol(name))?;
    let v = CString::new(version).map_err(|_| LoadError::MissingSymbol(name))?;
    // SAFETY: a handle from dlopen and NUL-terminated strings.
    let p = unsafe { libc::dlvsym(verbs, c.as_ptr(), v.as_ptr()) };
    if p.is_null() {
        Err(LoadError::MissingSymbol(name))
    } else {
        Ok(p)
    }
}

macro_rules! f {
    ($p:expr, $ty:ty) => {{
        let p = $p?;
        // SAFETY: the symbol of this name has exactly this C signature (rdma_cma.h, verbs.h);
        // data and function pointers have the same size on this target.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

static CM: OnceLock<Result<Cm, LoadError>> = OnceLock::new();

impl Cm {
    /// The table, loading librdmacm on first use.
    pub fn get() -> Result<&'static Cm, LoadError> {
        CM.get_or_init(Self::load).as_ref().map_err(Clone::clone)
    }

    fn load() -> Result<Cm, LoadError> {
        let _g = RealCall::enter();
        // SAFETY: a NUL-terminated library name; the handle is kept for the process's life.
        let h = unsafe { libc::dlopen(c"librdmacm.so.1".as_ptr(), libc::RTLD_NOW) };
        // SAFETY: as above; librdmacm has loaded libibverbs already, so this only finds it.
        let v = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_NOW) };
        if h.is_null() || v.is_null() {
            // SAFETY: dlerror returns a NUL-terminated string or NULL.
            let why = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    "unknown".to_string()
                } else {
                    std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            return Err(LoadError::NoLibrary(why));
        }
        Ok(Cm {
            create_event_channel: f!(sym(h, "rdma_create_event_channel"), CreateEventChannel),
            destroy_event_channel: f!(sym(h, "rdma_destroy_event_channel"), DestroyEventChannel),
            create_id: f!(sym(h, "rdma_create_id"), CreateId),
            destroy_id: f!(sym(h, "rdma_destroy_id"), IdFn),
            bind_addr: f!(sym(h, "rdma_bind_addr"), BindAddr),
            listen: f!(sym(h, "rdma_listen"), Listen),
            resolve_addr: f!(sym(h, "rdma_resolve_addr"), ResolveAddr),
            resolve_route: f!(sym(h, "rdma_resolve_route"), ResolveRoute),
            connect: f!(sym(h, "rdma_connect"), ConnParamFn),
            accept: f!(sym(h, "rdma_accept"), ConnParamFn),
            reject: f!(sym(h, "rdma_reject"), Reject),
            disconnect: f!(sym(h, "rdma_disconnect"), IdFn),
            get_cm_event: f!(sym(h, "rdma_get_cm_event"), GetCmEvent),
            ack_cm_event: f!(sym(h, "rdma_ack_cm_event"), AckCmEvent),
            create_qp: f!(sym(h, "rdma_create_qp"), CreateQp),
            destroy_qp: f!(sym(h, "rdma_destroy_qp"), DestroyQp),
            alloc_pd: f!(verbs_sym(v, "ibv_alloc_pd", "IBVERBS_1.1"), AllocPd),
            dealloc_pd: f!(verbs_sym(v, "ibv_dealloc_pd", "IBVERBS_1.1"), DeallocPd),
            create_cq: f!(verbs_sym(v, "ibv_create_cq", "IBVERBS_1.1"), CreateCq),
            destroy_cq: f!(verbs_sym(v, "ibv_destroy_cq", "IBVERBS_1.1"), DestroyCq),
            reg_mr: f!(verbs_sym(v, "ibv_reg_mr", "IBVERBS_1.1"), RegMr),
            dereg_mr: f!(verbs_sym(v, "ibv_dereg_mr", "IBVERBS_1.1"), DeregMr),
        })
    }
}

/// A return code of -1 as the `errno` it set.
fn errno_of(rc: c_int) -> Result<(), i32> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    }
}

// The wrappers below take raw pointers that the caller got from the same table; each says
// what it requires. They are `unsafe fn` because the pointers must be live.
impl Cm {
    /// `rdma_create_event_channel`.
    pub fn create_event_channel(&self) -> Result<*mut rdma_event_channel, i32> {
        let _g = RealCall::enter();
        // SAFETY: no arguments; returns NULL with errno on failure.
        let ch = unsafe { (self.create_event_channel)() };
        if ch.is_null() {
            Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        } else {
            Ok(ch)
        }
    }

    /// `rdma_destroy_event_channel`.
    ///
    /// # Safety
    /// `ch` came from [`Cm::create_event_channel`], has no ids left and is not used again.
    pub unsafe fn destroy_event_channel(&self, ch: *mut rdma_event_channel) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        unsafe { (self.destroy_event_channel)(ch) }
    }

    /// `rdma_create_id` in the TCP port space (reliable connections).
    ///
    /// # Safety
    /// `ch` is a live event channel.
    pub unsafe fn create_id(&self, ch: *mut rdma_event_channel) -> Result<*mut rdma_cm_id, i32> {
        let _g = RealCall::enter();
        let mut id = core::ptr::null_mut();
        // SAFETY: a live channel, a valid out pointer, no context.
        errno_of(unsafe { (self.create_id)(ch, &mut id, core::ptr::null_mut(), RDMA_PS_TCP) })?;
        Ok(id)
    }

    /// `rdma_destroy_id`.
    ///
    /// # Safety
    /// `id` is live, has no QP, and its events are acknowledged; it is not used again.
    pub unsafe fn destroy_id(&self, id: *mut rdma_cm_id) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.destroy_id)(id) };
    }

    /// `rdma_bind_addr`.
    ///
    /// # Safety
    /// `id` is live; `addr` points to a socket address of its family's size.
    pub unsafe fn bind_addr(
        &self,
        id: *mut rdma_cm_id,
        addr: *const libc::sockaddr,
    ) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.bind_addr)(id, addr) })
    }

    /// `rdma_listen`.
    ///
    /// # Safety
    /// `id` is live and bound.
    pub unsafe fn listen(&self, id: *mut rdma_cm_id, backlog: c_int) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.listen)(id, backlog) })
    }

    /// `rdma_resolve_addr` with no source address.
    ///
    /// # Safety
    /// `id` is live; `dst` points to a socket address of its family's size.
    pub unsafe fn resolve_addr(
        &self,
        id: *mut rdma_cm_id,
        dst: *const libc::sockaddr,
        timeout_ms: c_int,
    ) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise; a NULL source lets the routing table choose.
        errno_of(unsafe { (self.resolve_addr)(id, core::ptr::null(), dst, timeout_ms) })
    }

    /// `rdma_resolve_route`.
    ///
    /// # Safety
    /// `id` is live with its address resolved.
    pub unsafe fn resolve_route(&self, id: *mut rdma_cm_id, timeout_ms: c_int) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.resolve_route)(id, timeout_ms) })
    }

    /// `rdma_connect`.
    ///
    /// # Safety
    /// `id` is live with a resolved route and a QP; `param`'s private data lives across the call.
    pub unsafe fn connect(
        &self,
        id: *mut rdma_cm_id,
        param: &mut rdma_conn_param,
    ) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.connect)(id, param) })
    }

    /// `rdma_accept`.
    ///
    /// # Safety
    /// `id` is a live id from a CONNECT_REQUEST with a QP; `param`'s private data lives across
    /// the call.
    pub unsafe fn accept(
        &self,
        id: *mut rdma_cm_id,
        param: &mut rdma_conn_param,
    ) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.accept)(id, param) })
    }

    /// `rdma_reject` with `data` as private data.
    ///
    /// # Safety
    /// `id` is a live id from a CONNECT_REQUEST.
    pub unsafe fn reject(&self, id: *mut rdma_cm_id, data: &[u8]) -> Result<(), i32> {
        let _g = RealCall::enter();
        let len = u8::try_from(data.len()).unwrap_or(u8::MAX);
        // SAFETY: the caller's promise; `data` lives across the call and `len` is within it.
        errno_of(unsafe { (self.reject)(id, data.as_ptr().cast(), len) })
    }

    /// `rdma_disconnect`.
    ///
    /// # Safety
    /// `id` is live.
    pub unsafe fn disconnect(&self, id: *mut rdma_cm_id) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.disconnect)(id) };
    }

    /// `rdma_get_cm_event`: the next event; blocks unless the channel's descriptor is
    /// non-blocking (callers poll the descriptor first).
    ///
    /// # Safety
    /// `ch` is live.
    pub unsafe fn get_cm_event(
        &self,
        ch: *mut rdma_event_channel,
    ) -> Result<*mut rdma_cm_event, i32> {
        let _g = RealCall::enter();
        let mut ev = core::ptr::null_mut();
        // SAFETY: the caller's promise; a valid out pointer.
        errno_of(unsafe { (self.get_cm_event)(ch, &mut ev) })?;
        Ok(ev)
    }

    /// `rdma_ack_cm_event`.
    ///
    /// # Safety
    /// `ev` came from [`Cm::get_cm_event`] and is not used again.
    pub unsafe fn ack_cm_event(&self, ev: *mut rdma_cm_event) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.ack_cm_event)(ev) };
    }

    /// `rdma_create_qp` on `id`, in `pd`.
    ///
    /// # Safety
    /// `id` is live and bound to the device of `pd`; `attr`'s CQs belong to that device.
    pub unsafe fn create_qp(
        &self,
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        attr: &mut ibv_qp_init_attr,
    ) -> Result<(), i32> {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        errno_of(unsafe { (self.create_qp)(id, pd, attr) })
    }

    /// `rdma_destroy_qp`.
    ///
    /// # Safety
    /// `id` is live and has a QP that is not used again.
    pub unsafe fn destroy_qp(&self, id: *mut rdma_cm_id) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        unsafe { (self.destroy_qp)(id) }
    }

    /// `ibv_alloc_pd`.
    ///
    /// # Safety
    /// `ctx` is a live verbs context.
    pub unsafe fn alloc_pd(&self, ctx: *mut ibv_context) -> *mut ibv_pd {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        unsafe { (self.alloc_pd)(ctx) }
    }

    /// `ibv_dealloc_pd`.
    ///
    /// # Safety
    /// `pd` is live, empty, and not used again.
    pub unsafe fn dealloc_pd(&self, pd: *mut ibv_pd) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.dealloc_pd)(pd) };
    }

    /// `ibv_create_cq` without a channel.
    ///
    /// # Safety
    /// `ctx` is a live verbs context.
    pub unsafe fn create_cq(&self, ctx: *mut ibv_context, cqe: c_int) -> *mut ibv_cq {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise; no user context, no channel, vector 0.
        unsafe { (self.create_cq)(ctx, cqe, core::ptr::null_mut(), core::ptr::null_mut(), 0) }
    }

    /// `ibv_destroy_cq`.
    ///
    /// # Safety
    /// `cq` is live, no QP uses it, and it is not used again.
    pub unsafe fn destroy_cq(&self, cq: *mut ibv_cq) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.destroy_cq)(cq) };
    }

    /// `ibv_reg_mr` with local access only.
    ///
    /// # Safety
    /// `pd` is live; `[addr, addr + len)` stays allocated until [`Cm::dereg_mr`].
    pub unsafe fn reg_local_mr(
        &self,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
    ) -> *mut ibv_mr {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise. Local write only: nothing of it is reachable remotely.
        unsafe { (self.reg_mr)(pd, addr, len, IBV_ACCESS_LOCAL_WRITE as c_int) }
    }

    /// `ibv_dereg_mr`.
    ///
    /// # Safety
    /// `mr` is live and no posted work request uses it.
    pub unsafe fn dereg_mr(&self, mr: *mut ibv_mr) {
        let _g = RealCall::enter();
        // SAFETY: the caller's promise.
        let _ = unsafe { (self.dereg_mr)(mr) };
    }
}
