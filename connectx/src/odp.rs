//! The ODP mode (docs/connectx.md §9a): where a device does on-demand paging correctly, an
//! application's registration becomes a provider MR with `IBV_ACCESS_ON_DEMAND` added to the
//! application's access flags. No directory, no windows: the MR is the provider's own, its
//! keys are never translated (the rest of the library treats it as a pass-through MR), and
//! peers without the library reach it with its rkey as with plain verbs.
//!
//! Per device, once per process (the first registration that could use it decides), the
//! library asks `ibv_query_device_ex` for the device's ODP capabilities and, where they allow
//! it, runs the self-test ([`crate::odp_selftest`]). `NPRDMA_MODE` ([`RegMode`]) then
//! chooses:
//!
//! | setting | capability bits missing | self-test passed | self-test failed | self-test could not run |
//! |---|---|---|---|---|
//! | `auto` | windows | ODP | windows | windows |
//! | `odp` | windows | ODP | windows, logged loudly | ODP (the bits are trusted) |
//! | `windows`, `off` | not asked | | | |
//!
//! and per MR, ODP only when the device's RC capabilities cover every operation the MR's
//! access flags allow (`needed_rc_caps`); otherwise that MR gets windows. The choice per
//! device and the mode of every MR are in the status page (crate::status_modes). The
//! decisions themselves are plain functions in crate::odp_choice.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use core::ffi::c_void;

use crate::config::RegMode;
use crate::engine::Engine;
use crate::engine::call::{RealCall, errno, lock, pid, set_errno};
use crate::engine::records::CtxRec;
use crate::odp_choice::{DeviceChoice, Entry, cap_names, decide, needed_rc_caps};
use crate::status_modes::{MrMode, SelfTest};
use crate::sys::*;

/// How long a thread waits for another thread's self-test on the same device before it
/// decides for itself (the test's transfers have deadlines of their own, well below this).
const WAIT_FOR_OTHER_TEST: Duration = Duration::from_secs(20);

/// The device's ODP capabilities (`ibv_query_device_ex`, through the context's extended
/// operations as verbs.h's inline function calls it), and its port count.
///
/// # Safety
/// `rec` is a live context of the library.
unsafe fn query_odp(rec: &CtxRec) -> Option<(ibv_odp_caps, u8)> {
    let ctx = rec.ctx as *mut ibv_context;
    // SAFETY: a live context.
    if unsafe { (*ctx).abi_compat } != VERBS_ABI_IS_EXTENDED {
        return None;
    }
    let off = core::mem::offset_of!(verbs_context, context);
    // SAFETY: an extended context is the last field of its verbs_context (verbs.h
    // verbs_get_ctx), so the verbs_context starts `off` bytes before it.
    let v = unsafe { &*(ctx.cast::<u8>().sub(off).cast::<verbs_context>()) };
    // verbs.h verbs_get_ctx_op: a field exists if `sz` reaches back to it.
    if v.sz
        < core::mem::size_of::<verbs_context>()
            - core::mem::offset_of!(verbs_context, query_device_ex)
    {
        return None;
    }
    let f = v.query_device_ex?;
    let mut attr = ibv_device_attr_ex::zeroed();
    let _g = RealCall::enter();
    // SAFETY: the provider's function on its live context, with a zeroed struct of the
    // header's size (as verbs.h's ibv_query_device_ex passes it) and no input.
    let rc = unsafe {
        f(
            ctx,
            core::ptr::null(),
            &mut attr,
            core::mem::size_of::<ibv_device_attr_ex>(),
        )
    };
    (rc == 0).then_some((attr.odp_caps, attr.orig_attr.phys_port_cnt))
}

impl Engine {
    /// The choice for `rec`'s device: decided once per device and process, the self-test
    /// run by the first thread that asks (others wait for it).
    fn device_choice(&self, rec: &CtxRec) -> Arc<DeviceChoice> {
        // SAFETY: a live context of the library.
        let dev = unsafe { (*(rec.ctx as *mut ibv_context)).device };
        let key = dev as usize;
        let me = pid();
        let asked = Instant::now();
        loop {
            {
                let mut st = lock(&self.state);
                match st.odp.by_device.get(&key) {
                    Some(Entry::Done(c)) => return c.clone(),
                    // Another thread of this process decides: wait for it.
                    Some(Entry::Deciding { pid })
                        if *pid == me && asked.elapsed() < WAIT_FOR_OTHER_TEST => {}
                    // Nobody, a parent process's thread (this is a forked child) or a test
                    // that took too long: decide here.
                    _ => {
                        st.odp.by_device.insert(key, Entry::Deciding { pid: me });
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let name = {
            let _g = RealCall::enter();
            // SAFETY: the live context's device; the name is a NUL-terminated string that
            // lives as long as the device.
            let p = unsafe { (self.real.get_device_name)(dev) };
            if p.is_null() {
                "?".to_string()
            } else {
                // SAFETY: as above.
                unsafe { core::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        // SAFETY: a live context of the library.
        let queried = unsafe { query_odp(rec) };
        let started = Instant::now();
        let choice = decide(self.cfg.reg_mode, &name, queried.map(|q| q.0), || {
            // SAFETY: a live context of the library.
            unsafe { crate::odp_selftest::run(&self.real, rec, queried.map_or(1, |q| q.1)) }
        });
        let took = started.elapsed();
        let c = Arc::new(choice);
        lock(&self.state)
            .odp
            .by_device
            .insert(key, Entry::Done(c.clone()));
        let text = format!(
            "device {name}: {} (NPRDMA_MODE={}{})",
            c.why,
            self.cfg.reg_mode.as_str(),
            if c.test == SelfTest::NotRun {
                String::new()
            } else {
                format!(", self-test took {:.0} ms", took.as_secs_f64() * 1e3)
            }
        );
        self.note(&text);
        self.status.page().modes.set_device(
            key as u64,
            &name,
            c.odp,
            c.caps.general_caps,
            c.caps.rc_odp_caps,
            c.test,
            &c.why,
        );
        c
    }

    /// `ibv_reg_mr*` in the ODP mode: the provider's MR with `IBV_ACCESS_ON_DEMAND` added,
    /// or `None` when this registration gets windows (the setting, the device's choice or
    /// its capabilities for this MR's access, or a provider that refuses it; errno is left
    /// as it was).
    ///
    /// # Safety
    /// `pd` is a live PD of `rec`'s context; the rest as in `ibv_reg_mr_iova2`.
    pub(crate) unsafe fn register_odp(
        &self,
        rec: &CtxRec,
        pd: *mut ibv_pd,
        addr: *mut c_void,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Option<*mut ibv_mr> {
        if !matches!(self.cfg.reg_mode, RegMode::Auto | RegMode::Odp) {
            return None;
        }
        // What plain verbs refuses, the windows path refuses the same way.
        if len == 0
            || (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
                && access & IBV_ACCESS_LOCAL_WRITE == 0)
        {
            return None;
        }
        // A peer that runs the library tells a directory from a plain key by reading IOVA 0
        // of the key (docs/connectx.md §5); an ODP MR at the application's addresses has no
        // IOVA 0, so that READ would put the peer's QP in error. Until the lookup goes over
        // the control connection (§13), `auto` keeps windows for regions peers may reach;
        // `odp` gives them ODP for peers without the library, as the user asked.
        let remote =
            access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
        if remote != 0 && self.cfg.reg_mode == RegMode::Auto {
            self.note(
                "NPRDMA_MODE=auto: regions with remote rights keep windows (a peer running libnprdma reaches an ODP key only over a control connection); NPRDMA_MODE=odp gives them ODP",
            );
            return None;
        }
        let choice = self.device_choice(rec);
        if !choice.odp {
            return None;
        }
        if remote != 0 {
            self.note(
                "NPRDMA_MODE=odp: regions with remote rights are ODP MRs: peers without libnprdma reach them, and peers running libnprdma over a control connection; a peer running it without one (no GRH, no IP in the GID) cannot",
            );
        }
        let need = needed_rc_caps(access, rec.caps.atomics);
        if choice.caps.rc_odp_caps & need != need {
            self.note(&format!(
                "device {}: a region's access needs RC ODP {} but the device reports {}: windows for it",
                choice.name,
                cap_names(need),
                cap_names(choice.caps.rc_odp_caps)
            ));
            return None;
        }
        let saved = errno();
        // SAFETY: the caller's contract; the registration is the provider's own.
        let mr = unsafe { self.real_reg(pd, addr, len, iova, access | IBV_ACCESS_ON_DEMAND) };
        if mr.is_null() {
            self.note(&format!(
                "device {}: the provider refused an ODP registration (errno {}): windows for it",
                choice.name,
                errno()
            ));
            set_errno(saved);
            return None;
        }
        let page = self.status.page();
        page.modes.set_mr_mode(mr as usize, MrMode::Odp);
        page.counters.odp_mrs.fetch_add(1, Ordering::Relaxed);
        page.counters
            .odp_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        lock(&self.state).odp.mrs.insert(mr as usize, len as u64);
        Some(mr)
    }

    /// Whether `mr` is an ODP-mode MR (its `ibv_rereg_mr` keeps `IBV_ACCESS_ON_DEMAND`).
    pub(crate) fn is_odp_mr(&self, mr: *mut ibv_mr) -> bool {
        lock(&self.state).odp.mrs.contains_key(&(mr as usize))
    }

    /// `mr` is being deregistered (or forgotten with its context): its records go.
    pub(crate) fn forget_mr(&self, mr: *mut ibv_mr) {
        self.status.page().modes.remove_mr(mr as usize);
        if let Some(len) = lock(&self.state).odp.mrs.remove(&(mr as usize)) {
            let c = &self.status.page().counters;
            c.odp_mrs.fetch_sub(1, Ordering::Relaxed);
            c.odp_bytes.fetch_sub(len, Ordering::Relaxed);
        }
    }
}
