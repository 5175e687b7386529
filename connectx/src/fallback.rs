//! Pinning as plain verbs would, when windows cannot serve a work request
//! (docs/connectx.md §3, "Fallback pins").
//!
//! A receive's or SEND's SGEs are cut at window boundaries (a SEND is one message, never
//! split); one that spans more windows than the queue's SGE limit cannot be posted through
//! windows at all (`ibv_rc_pingpong -s 16777216` over 1 MiB windows needs 17 SGEs). And when the budget is full of windows in flight (posted
//! receives keep theirs until a message arrives), a further receive has no window to get.
//! Plain verbs would have accepted both, the memory being registered, so instead of refusing
//! them the library registers exactly the WR's ranges (one provider MR per application
//! SGE, with the region's access flags and IOVA, so the SGE keeps its address), outside the
//! budget, as `ibv_reg_mr` would have pinned them, and deregisters them when the WR's record
//! ends (its completion, a reset, the QP's destruction).
//!
//! Such a pin travels in the record's window list as a [`WindowUse`] of the reserved region
//! [`FALLBACK_REGION`], whose index names the pin; [`Engine::release`] hands it here.

use core::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::completion::WinList;
use crate::engine::Engine;
use crate::engine::call::{RealCall, lock};
use crate::fasthash::FastMap;
use crate::sys::*;
use crate::window::{RegionId, WindowId, WindowUse, pinned_bytes};

/// The region id of fallback pins (regions are numbered from 1 upwards).
pub(crate) const FALLBACK_REGION: RegionId = RegionId::MAX;

/// A live fallback pin: the provider MR, the bytes it pins, its engine (which deregisters it
/// and counts them), what it covers, and how many records use it.
struct Pin {
    mr: usize,
    bytes: u64,
    engine: Arc<Engine>,
    range: Range,
    uses: u64,
}

/// What a pin covers: PD, address, IOVA, length and access. WRs over the same range share one
/// pin (`ibv_rc_pingpong` posts 500 receives into one buffer: one registration, as plain
/// verbs have, instead of 500).
type Range = (usize, u64, u64, u32, u32);

/// The live pins, by id and by range.
#[derive(Default)]
struct Pins {
    by_id: FastMap<u64, Pin>,
    by_range: FastMap<Range, u64>,
}

static PINS: Mutex<Option<Pins>> = Mutex::new(None);
static NEXT_PIN: AtomicU64 = AtomicU64::new(1);

fn pins() -> MutexGuard<'static, Option<Pins>> {
    lock(&PINS)
}

/// Whether `w` is a fallback pin rather than a window.
#[inline]
pub(crate) fn is_pin(w: &WindowUse) -> bool {
    w.id.region == FALLBACK_REGION
}

/// Deregisters the fallback pins among `windows`.
pub(crate) fn unpin(windows: &WinList) {
    let gone: Vec<Pin> = {
        let mut g = pins();
        let Some(p) = g.as_mut() else {
            return;
        };
        let mut gone = Vec::new();
        for w in windows.iter().filter(is_pin) {
            let Some(pin) = p.by_id.get_mut(&w.id.index) else {
                continue;
            };
            pin.uses -= 1;
            if pin.uses == 0
                && let Some(pin) = p.by_id.remove(&w.id.index)
            {
                p.by_range.remove(&pin.range);
                gone.push(pin);
            }
        }
        gone
    };
    for p in gone {
        let _g = RealCall::enter();
        // SAFETY: an MR this module registered and has not deregistered (removed from the
        // map above, so exactly once).
        unsafe { (p.engine.real.dereg_mr)(p.mr as *mut ibv_mr) };
        p.engine
            .counters()
            .fallback_bytes
            .fetch_sub(p.bytes, Ordering::Relaxed);
    }
}

/// What one application SGE of a receive becomes.
enum Piece {
    /// Inside a region: registered on its own.
    Pin {
        pd: usize,
        va: u64,
        iova: u64,
        len: u32,
        access: u32,
        lkey: u32,
        poison: u64,
    },
    /// Anything else: as the window path would post it.
    Keep(ibv_sge),
}

impl Engine {
    /// Registers the ranges of a WR's SGEs (`app_sges`, of context `ctx`) as plain verbs
    /// would have, for a receive or SEND that windows cannot serve (`why`, said in the log
    /// once). Returns the provider SGEs (one per application SGE) and the pins to release with
    /// the WR's record. An SGE outside its region, or one whose range cannot be registered,
    /// gets the region's key at an address outside its directory: the NIC then reports the
    /// local protection error plain verbs would report.
    pub(crate) fn pin_sges(
        self: &Arc<Self>,
        ctx: usize,
        app_sges: &[ibv_sge],
        why: &str,
    ) -> (Vec<ibv_sge>, WinList) {
        self.note(why);
        let pieces: Vec<Piece> = {
            let st = lock(&self.state);
            app_sges
                .iter()
                .map(|s| {
                    match st
                        .by_lkey
                        .get(&(ctx, s.lkey))
                        .and_then(|id| st.regions.get(id))
                    {
                        Some(r) if s.length > 0 && r.geom.contains(s.addr, u64::from(s.length)) => {
                            Piece::Pin {
                                pd: r.pd,
                                va: r.va.wrapping_add(s.addr - r.iova),
                                iova: s.addr,
                                len: s.length,
                                access: r.access,
                                lkey: s.lkey,
                                poison: r.poison_addr(),
                            }
                        }
                        Some(r) if s.length > 0 => Piece::Keep(ibv_sge {
                            addr: r.poison_addr(),
                            length: s.length,
                            lkey: s.lkey,
                        }),
                        _ => Piece::Keep(*s),
                    }
                })
                .collect()
        };
        let mut sges = Vec::with_capacity(pieces.len());
        let mut uses = WinList::new();
        for p in pieces {
            match p {
                Piece::Keep(s) => sges.push(s),
                Piece::Pin {
                    pd,
                    va,
                    iova,
                    len,
                    access,
                    lkey,
                    poison,
                } => {
                    let range = (pd, va, iova, len, access);
                    let shared = pins().as_mut().and_then(|p| {
                        let id = *p.by_range.get(&range)?;
                        let pin = p.by_id.get_mut(&id)?;
                        pin.uses += 1;
                        // SAFETY: a live MR of this module (it has a use, so it stays).
                        Some((id, unsafe { (*(pin.mr as *mut ibv_mr)).lkey }))
                    });
                    let (id, lkey) = match shared {
                        Some(found) => found,
                        None => match self.register_pin(range) {
                            Some(new) => new,
                            None => {
                                sges.push(ibv_sge {
                                    addr: poison,
                                    length: len,
                                    lkey,
                                });
                                continue;
                            }
                        },
                    };
                    self.counters()
                        .fallback_pins
                        .fetch_add(1, Ordering::Relaxed);
                    sges.push(ibv_sge {
                        addr: iova,
                        length: len,
                        lkey,
                    });
                    uses.push(WindowUse {
                        id: WindowId {
                            region: FALLBACK_REGION,
                            index: id,
                        },
                        serial: 0,
                    });
                }
            }
        }
        (sges, uses)
    }

    /// Registers `len` bytes at `va` in `pd` with the provider, outside the window budget:
    /// what plain verbs would do with the range (null: the provider refused it).
    ///
    /// # Safety
    /// `pd` is a live PD of this process and `va..va+len` lies in memory the application
    /// keeps mapped while the registration lives.
    pub(crate) unsafe fn register_whole(
        &self,
        pd: usize,
        va: u64,
        len: u64,
        iova: u64,
        access: u32,
    ) -> *mut ibv_mr {
        let _g = RealCall::enter();
        // SAFETY: the caller's contract.
        unsafe {
            (self.real.reg_mr_iova2)(
                pd as *mut ibv_pd,
                va as *mut c_void,
                len as usize,
                iova,
                access,
            )
        }
    }

    /// Registers a new pin over `range`; returns its id and lkey (`None`: the provider
    /// refused it).
    fn register_pin(self: &Arc<Self>, range: Range) -> Option<(u64, u32)> {
        let (pd, va, iova, len, access) = range;
        // SAFETY: `pd` is the live PD of the application's region, and the range lies inside
        // that region, which the application keeps mapped while it is registered.
        let mr = unsafe { self.register_whole(pd, va, u64::from(len), iova, access) };
        if mr.is_null() {
            return None;
        }
        let bytes = pinned_bytes(va, u64::from(len));
        let id = NEXT_PIN.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the provider returned a valid MR.
        let lkey = unsafe { (*mr).lkey };
        let mut g = pins();
        let p = g.get_or_insert_with(Pins::default);
        p.by_id.insert(
            id,
            Pin {
                mr: mr as usize,
                bytes,
                engine: self.clone(),
                range,
                uses: 1,
            },
        );
        p.by_range.insert(range, id);
        self.counters()
            .fallback_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        Some((id, lkey))
    }
}
