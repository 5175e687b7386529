//! A virtual region (one application registration) and the provider side of the window cache:
//! registering and deregistering a region's windows.

use core::ffi::c_void;
use std::time::Instant;

use crate::directory::{DirHeader, DmaBuf, LeaseBook};
use crate::engine::call::{RealCall, errno, set_errno};
use crate::fasthash::FastMap;
use crate::real::RealVerbs;
use crate::sys::*;
use crate::translate::Geometry;
use crate::window::{Keys, RegionId, Registrar, WindowId, WindowSpec};

/// A virtual region: one application registration.
pub(crate) struct Region {
    pub id: RegionId,
    pub ctx: usize,
    pub pd: usize,
    pub va: u64,
    pub len: u64,
    pub iova: u64,
    pub access: u32,
    pub geom: Geometry,
    pub header: DirHeader,
    pub dir: DmaBuf,
    pub dir_mr: usize,
    /// The ring MR (crate::directory: the ticket word and request slots, the only part of the
    /// directory peers may write); 0 for a region without remote rights.
    pub ring_mr: usize,
    /// Pinned bytes of the directory and its ring MR (which pins its pages a second time,
    /// as the kernel counts them).
    pub dir_pinned: u64,
    pub leases: LeaseBook,
    pub generation: u64,
    pub stall_since: Option<Instant>,
    /// The next lease-ring ticket to serve. Kept here and only published to the directory's
    /// SERVED word (read-only to peers; the owner never takes its position from peer memory).
    pub served: u64,
    /// The process that registered the region: a child made by `fork()` does not serve its
    /// parent's regions (crate::fork).
    pub owner_pid: u32,
}

impl Region {
    /// Where window `index` lies.
    pub(crate) fn window_spec(&self, index: u64) -> WindowSpec {
        let (start, end) = self.geom.window_range(index);
        WindowSpec {
            va: self.va.wrapping_add(start - self.iova),
            iova: start,
            len: end - start,
        }
    }

    /// An address past the directory: an SGE or remote address pointed here with the region's
    /// key fails the NIC's bounds check, exactly like an out-of-region access on plain verbs.
    pub(crate) fn poison_addr(&self) -> u64 {
        self.dir.len() as u64
    }

    /// Whether this process's helper serves the region's request ring.
    pub(crate) fn served_here(&self) -> bool {
        self.header.exported && self.owner_pid == crate::engine::call::pid()
    }
}

/// The provider side of the window cache.
pub(crate) struct Provider<'a> {
    pub real: &'a RealVerbs,
    pub regions: &'a FastMap<RegionId, Region>,
}

impl Registrar for Provider<'_> {
    fn register(&mut self, id: WindowId, spec: &WindowSpec) -> Result<Keys, i32> {
        let r = self.regions.get(&id.region).ok_or(libc::EINVAL)?;
        let _g = RealCall::enter();
        set_errno(0);
        // SAFETY: `r.pd` is the live PD the application registered the region in; the window
        // lies inside the region, which the application keeps mapped while it is registered.
        let mr = unsafe {
            (self.real.reg_mr_iova2)(
                r.pd as *mut ibv_pd,
                spec.va as *mut c_void,
                spec.len as usize,
                spec.iova,
                r.access,
            )
        };
        if mr.is_null() {
            let e = errno();
            return Err(if e == 0 { libc::ENOMEM } else { e });
        }
        // SAFETY: the provider returned a valid MR.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Keys {
            lkey,
            rkey,
            handle: mr as usize,
        })
    }

    fn deregister(&mut self, _id: WindowId, keys: &Keys) {
        let _g = RealCall::enter();
        // SAFETY: `handle` is an MR this cache registered and has not deregistered.
        unsafe {
            (self.real.dereg_mr)(keys.handle as *mut ibv_mr);
        }
    }

    fn evicting(&mut self, id: WindowId) {
        if let Some(r) = self.regions.get(&id.region)
            && r.header.exported
        {
            r.dir.store(r.header.entry_off(id.index), 0);
        }
    }
}
