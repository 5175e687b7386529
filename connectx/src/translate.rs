//! Planning how one application work request becomes provider work requests.
//!
//! The application's SGEs name virtual regions (their lkey is the region's directory key). A
//! provider WR may only use registered windows, so every SGE is cut at window boundaries and
//! each piece gets its window's key. On the remote side, a WRITE or READ whose remote range
//! crosses windows of the peer's region is split into one provider WR per remote window, each
//! with the bytes that land in that window; a part also splits when it would carry more SGEs
//! than the queue pair allows. SEND and atomics are never split (a SEND is one message, an
//! atomic is 8 aligned bytes that never cross a window).
//!
//! Pure functions over plain data: the engine classifies the SGEs and the remote address,
//! calls [`plan`], then resolves the window references (registering windows, acquiring remote
//! leases) part by part.

use crate::sys::ibv_sge;
use crate::window::{RegionId, WindowId};

/// The IOVA geometry of a virtual region (ours or a peer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// First IOVA of the region.
    pub iova: u64,
    /// Length in bytes (≥ 1).
    pub len: u64,
    /// log2 of the window size.
    pub window_shift: u32,
}

impl Geometry {
    /// The window size.
    pub fn window_size(&self) -> u64 {
        1u64 << self.window_shift
    }

    /// One past the last IOVA.
    pub fn end(&self) -> u64 {
        self.iova.saturating_add(self.len)
    }

    /// Whether `[addr, addr + len)` lies inside the region (`len` ≥ 1).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match addr.checked_add(len) {
            Some(end) => len > 0 && addr >= self.iova && end <= self.end(),
            None => false,
        }
    }

    /// Index of the window holding `addr` (which must be inside the region).
    pub fn window_of(&self, addr: u64) -> u64 {
        (addr >> self.window_shift) - (self.iova >> self.window_shift)
    }

    /// Number of windows.
    pub fn window_count(&self) -> u64 {
        if self.len == 0 {
            return 0;
        }
        self.window_of(self.end() - 1) + 1
    }

    /// IOVA range `[start, end)` of window `index`, clipped to the region.
    pub fn window_range(&self, index: u64) -> (u64, u64) {
        let aligned = ((self.iova >> self.window_shift) + index) << self.window_shift;
        let start = aligned.max(self.iova);
        let end = aligned.saturating_add(self.window_size()).min(self.end());
        (start, end)
    }
}

/// An application SGE, classified by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SgeClass {
    /// Used as it is: an lkey we do not manage, inline data, a zero-length SGE, or a
    /// deliberately invalid address (an SGE outside its region is pointed past the region's
    /// directory so that the NIC reports the protection error plain verbs would).
    Keep(ibv_sge),
    /// Inside virtual region `region`.
    Virtual {
        /// IOVA.
        addr: u64,
        /// Length (≥ 1).
        len: u32,
        /// The region.
        region: RegionId,
        /// Its geometry.
        geom: Geometry,
    },
}

impl SgeClass {
    fn len(&self) -> u64 {
        match self {
            SgeClass::Keep(s) => u64::from(s.length),
            SgeClass::Virtual { len, .. } => u64::from(*len),
        }
    }
}

/// The remote side of an application WR, classified by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteClass {
    /// The opcode has no remote address (SEND, RECV-side, LOCAL_INV...).
    None,
    /// Used as it is (a peer without the library when explicitly allowed, zero length, or a
    /// deliberately invalid address for an out-of-range access).
    Keep {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Inside the peer's virtual region with this geometry.
    Virtual {
        /// Remote IOVA.
        addr: u64,
        /// Bytes of the peer's region the WR touches, which the classifier found inside it:
        /// the SGE total for RDMA, 8 for an atomic (whatever its SGE says).
        len: u64,
        /// The peer region's geometry.
        geom: Geometry,
    },
}

/// One SGE of a planned provider WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedSge {
    /// As given.
    Keep(ibv_sge),
    /// A piece inside one local window; its lkey is the window's.
    Window {
        /// IOVA.
        addr: u64,
        /// Length.
        len: u32,
        /// The window.
        window: WindowId,
    },
}

impl PlannedSge {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            PlannedSge::Keep(s) => u64::from(s.length),
            PlannedSge::Window { len, .. } => u64::from(*len),
        }
    }

    /// Whether it carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn slice(&self, from: u64, len: u64) -> PlannedSge {
        // `from + len` never exceeds the piece's length, which fits u32.
        let len32 = len as u32;
        match *self {
            PlannedSge::Keep(s) => PlannedSge::Keep(ibv_sge {
                addr: s.addr.wrapping_add(from),
                length: len32,
                lkey: s.lkey,
            }),
            PlannedSge::Window { addr, window, .. } => PlannedSge::Window {
                addr: addr + from,
                len: len32,
                window,
            },
        }
    }
}

/// The remote target of a planned provider WR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannedRemote {
    /// As given.
    Keep {
        /// Remote address.
        addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Inside window `index` of the peer's region.
    Window {
        /// Remote IOVA.
        addr: u64,
        /// Window index in the peer's region.
        index: u64,
    },
}

/// One provider WR of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedPart {
    /// Its SGEs.
    pub sges: Vec<PlannedSge>,
    /// Its remote target.
    pub remote: Option<PlannedRemote>,
    /// Bytes it moves.
    pub len: u64,
}

/// Why a WR cannot be planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// An unsplittable WR (SEND, atomic) needs more SGEs than the QP allows once its SGEs are
    /// cut at window boundaries.
    TooManySges {
        /// SGEs needed.
        needed: usize,
        /// SGEs allowed.
        max: usize,
    },
    /// An unsplittable WR's remote range crosses a window of the peer's region.
    CrossesRemoteWindow,
    /// The remote range is not inside the peer's region, or an RDMA WR's remote length is not
    /// its SGE total (the classifier's mistake: refused rather than planned past the region).
    RemoteOutsideRegion,
}

/// Plans one application WR.
///
/// `splittable` says whether the opcode may become several provider WRs (RDMA WRITE,
/// WRITE_WITH_IMM and READ). `max_sge` is the QP's real SGE limit (≥ 1).
pub fn plan(
    sges: &[SgeClass],
    remote: RemoteClass,
    splittable: bool,
    max_sge: usize,
) -> Result<Vec<PlannedPart>, PlanError> {
    let max_sge = max_sge.max(1);
    let pieces = cut_local(sges);
    let total: u64 = sges.iter().map(SgeClass::len).sum();

    // Remote segments: byte ranges of the stream and their remote targets.
    let segments: Vec<(u64, u64, Option<PlannedRemote>)> = match remote {
        RemoteClass::None => vec![(0, total, None)],
        RemoteClass::Keep { addr, rkey } => {
            vec![(0, total, Some(PlannedRemote::Keep { addr, rkey }))]
        }
        RemoteClass::Virtual { addr, len, geom } => {
            let inside = if len == 0 {
                addr >= geom.iova && addr < geom.end()
            } else {
                geom.contains(addr, len)
            };
            if !inside || (splittable && len != total) {
                return Err(PlanError::RemoteOutsideRegion);
            }
            let first = geom.window_of(addr);
            if !splittable || total == 0 {
                // One WR: its remote bytes (an atomic's 8, not its SGE's length) must lie in
                // one window.
                if len > 0 && geom.window_of(addr + len - 1) != first {
                    return Err(PlanError::CrossesRemoteWindow);
                }
                vec![(0, total, Some(PlannedRemote::Window { addr, index: first }))]
            } else {
                let mut segs = Vec::new();
                let mut off = 0u64;
                while off < total {
                    let at = addr + off;
                    let index = geom.window_of(at);
                    let (_, wend) = geom.window_range(index);
                    // Inside the region (checked above), so every window has bytes left.
                    let seg = wend.saturating_sub(at).min(total - off);
                    if seg == 0 {
                        return Err(PlanError::RemoteOutsideRegion);
                    }
                    segs.push((off, seg, Some(PlannedRemote::Window { addr: at, index })));
                    off += seg;
                }
                segs
            }
        }
    };

    let mut parts = Vec::new();
    for (start, len, target) in segments {
        let sub = slice_pieces(&pieces, start, len);
        if sub.len() <= max_sge {
            parts.push(PlannedPart {
                sges: sub,
                remote: target,
                len,
            });
            continue;
        }
        if !splittable {
            return Err(PlanError::TooManySges {
                needed: sub.len(),
                max: max_sge,
            });
        }
        let mut moved = 0u64;
        for chunk in sub.chunks(max_sge) {
            let chunk_len: u64 = chunk.iter().map(PlannedSge::len).sum();
            let remote = target.map(|t| match t {
                PlannedRemote::Keep { addr, rkey } => PlannedRemote::Keep {
                    addr: addr.wrapping_add(moved),
                    rkey,
                },
                PlannedRemote::Window { addr, index } => PlannedRemote::Window {
                    addr: addr + moved,
                    index,
                },
            });
            parts.push(PlannedPart {
                sges: chunk.to_vec(),
                remote,
                len: chunk_len,
            });
            moved += chunk_len;
        }
    }
    Ok(parts)
}

/// Cuts every virtual SGE at its region's window boundaries.
fn cut_local(sges: &[SgeClass]) -> Vec<PlannedSge> {
    let mut out = Vec::with_capacity(sges.len());
    for sge in sges {
        match *sge {
            SgeClass::Keep(s) => out.push(PlannedSge::Keep(s)),
            SgeClass::Virtual {
                addr,
                len,
                region,
                geom,
            } => {
                let end = addr + u64::from(len);
                let mut at = addr;
                while at < end {
                    let index = geom.window_of(at);
                    let (_, wend) = geom.window_range(index);
                    let piece = wend.min(end) - at;
                    out.push(PlannedSge::Window {
                        addr: at,
                        len: piece as u32,
                        window: WindowId { region, index },
                    });
                    at += piece;
                }
            }
        }
    }
    out
}

/// The pieces covering bytes `[start, start + len)` of the stream. Zero-length pieces are
/// kept only for a zero-length stream (so that a zero-length WR keeps its SGEs).
fn slice_pieces(pieces: &[PlannedSge], start: u64, len: u64) -> Vec<PlannedSge> {
    if len == 0 {
        return pieces.iter().filter(|p| p.is_empty()).copied().collect();
    }
    let end = start + len;
    let mut out = Vec::new();
    let mut pos = 0u64;
    for p in pieces {
        let plen = p.len();
        let (pstart, pend) = (pos, pos + plen);
        pos = pend;
        if plen == 0 || pend <= start || pstart >= end {
            continue;
        }
        let from = start.max(pstart) - pstart;
        let to = end.min(pend) - pstart;
        out.push(p.slice(from, to - from));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const G: Geometry = Geometry {
        iova: 0x10_0800,
        len: 5 * 4096,
        window_shift: 12,
    };

    #[test]
    fn window_ranges_are_clipped_to_the_region() {
        // G starts 0x800 into a page and is 5 pages long: 6 windows, the ends partial.
        assert_eq!(G.window_range(0), (0x10_0800, 0x10_1000));
        assert_eq!(G.window_range(1), (0x10_1000, 0x10_2000));
        assert_eq!(G.window_range(5), (0x10_5000, 0x10_5800));
        for addr in [G.iova, G.iova + 0x7ff, G.iova + 0x800, G.end() - 1] {
            let (lo, hi) = G.window_range(G.window_of(addr));
            assert!(
                lo <= addr && addr < hi,
                "{addr:#x} not in [{lo:#x}, {hi:#x})"
            );
        }
    }

    fn virt(addr: u64, len: u32) -> SgeClass {
        SgeClass::Virtual {
            addr,
            len,
            region: 7,
            geom: G,
        }
    }

    #[test]
    fn geometry_of_an_unaligned_region() {
        // 0x100800..0x105800: windows 0x100800-0x101000, ..., 0x105000-0x105800.
        assert_eq!(G.window_count(), 6);
        assert_eq!(G.window_range(0), (0x10_0800, 0x10_1000));
        assert_eq!(G.window_range(5), (0x10_5000, 0x10_5800));
        assert_eq!(G.window_of(0x10_0fff), 0);
        assert_eq!(G.window_of(0x10_1000), 1);
        assert!(G.contains(0x10_0800, 5 * 4096));
        assert!(!G.contains(0x10_0800, 5 * 4096 + 1));
        assert!(!G.contains(0x10_07ff, 1));
        assert!(!G.contains(u64::MAX, 2));
    }

    #[test]
    fn an_sge_across_windows_becomes_one_sge_per_window() {
        let parts = plan(&[virt(0x10_0f00, 0x300)], RemoteClass::None, false, 4).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(
            parts[0].sges,
            vec![
                PlannedSge::Window {
                    addr: 0x10_0f00,
                    len: 0x100,
                    window: WindowId {
                        region: 7,
                        index: 0
                    }
                },
                PlannedSge::Window {
                    addr: 0x10_1000,
                    len: 0x200,
                    window: WindowId {
                        region: 7,
                        index: 1
                    }
                },
            ]
        );
    }

    #[test]
    fn a_write_across_remote_windows_is_split_per_remote_window() {
        let remote = RemoteClass::Virtual {
            addr: 0x20_0f80,
            len: 0x100,
            geom: Geometry {
                iova: 0x20_0000,
                len: 1 << 20,
                window_shift: 12,
            },
        };
        let parts = plan(&[virt(0x10_1000, 0x100)], remote, true, 4).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(
            parts[0].remote,
            Some(PlannedRemote::Window {
                addr: 0x20_0f80,
                index: 0
            })
        );
        assert_eq!(parts[0].len, 0x80);
        assert_eq!(
            parts[1].remote,
            Some(PlannedRemote::Window {
                addr: 0x20_1000,
                index: 1
            })
        );
        assert_eq!(
            parts[1].sges,
            vec![PlannedSge::Window {
                addr: 0x10_1080,
                len: 0x80,
                window: WindowId {
                    region: 7,
                    index: 1
                }
            }]
        );
        assert_eq!(
            plan(&[virt(0x10_1000, 0x100)], remote, false, 4),
            Err(PlanError::CrossesRemoteWindow)
        );
    }

    #[test]
    fn too_many_sges_split_or_fail() {
        let sges = [virt(0x10_0800, 3 * 4096)]; // 4 pieces
        let parts = plan(
            &sges,
            RemoteClass::Keep {
                addr: 0x9000,
                rkey: 5,
            },
            true,
            3,
        )
        .unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].sges.len(), 3);
        assert_eq!(
            parts[1].remote,
            Some(PlannedRemote::Keep {
                addr: 0x9000 + 0x800 + 2 * 4096,
                rkey: 5
            })
        );
        assert_eq!(
            plan(&sges, RemoteClass::None, false, 3),
            Err(PlanError::TooManySges { needed: 4, max: 3 })
        );
    }

    #[test]
    fn an_atomic_plans_its_8_remote_bytes_not_its_sge_length() {
        let geom = Geometry {
            iova: 0x10_0000,
            len: 0x1_0000,
            window_shift: 12,
        };
        let local = virt(0x10_0800, 16);
        let at_end = RemoteClass::Virtual {
            addr: geom.iova + geom.len - 8,
            len: 8,
            geom,
        };
        let parts = plan(&[local], at_end, false, 1).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].len, 16);
        assert_eq!(
            parts[0].remote,
            Some(PlannedRemote::Window {
                addr: geom.iova + geom.len - 8,
                index: 15
            })
        );
        // Remote ranges the classifier should not have let through are refused, not planned.
        let past = RemoteClass::Virtual {
            addr: geom.iova + geom.len - 8,
            len: 16,
            geom,
        };
        assert_eq!(
            plan(&[local], past, true, 1),
            Err(PlanError::RemoteOutsideRegion)
        );
        let short = RemoteClass::Virtual {
            addr: geom.iova,
            len: 8,
            geom,
        };
        assert_eq!(
            plan(&[local], short, true, 1),
            Err(PlanError::RemoteOutsideRegion)
        );
    }

    #[test]
    fn zero_length_wr_keeps_one_part() {
        let keep = SgeClass::Keep(ibv_sge {
            addr: 1,
            length: 0,
            lkey: 9,
        });
        let parts = plan(&[keep], RemoteClass::Keep { addr: 5, rkey: 6 }, true, 1).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].len, 0);
        assert_eq!(parts[0].sges.len(), 1);
        let parts = plan(&[], RemoteClass::None, false, 1).unwrap();
        assert_eq!(parts.len(), 1);
        assert!(parts[0].sges.is_empty());
    }

    fn stream_of(parts: &[PlannedPart]) -> Vec<u64> {
        // Each byte of the plan, as (local address), in order.
        let mut v = Vec::new();
        for p in parts {
            for s in &p.sges {
                let (addr, len) = match s {
                    PlannedSge::Keep(k) => (k.addr, u64::from(k.length)),
                    PlannedSge::Window { addr, len, .. } => (*addr, u64::from(*len)),
                };
                v.extend(addr..addr + len);
            }
        }
        v
    }

    proptest! {
        /// The plan moves exactly the application's bytes, in order; every window SGE is
        /// inside its window; remote targets are contiguous from the application's address,
        /// each inside one remote window; no part exceeds the SGE limit.
        #[test]
        fn plan_preserves_bytes_and_order(
            shift in 12u32..15,
            base_off in 0u64..8192,
            raw in proptest::collection::vec((0u64..60000, 1u32..20000), 1..5),
            rshift in 12u32..15,
            roff in 0u64..70000,
            max_sge in 1usize..6,
        ) {
            let geom = Geometry { iova: 0x40_0000 + base_off, len: 1 << 17, window_shift: shift };
            let sges: Vec<SgeClass> = raw.iter().map(|(o, l)| {
                let len = (*l).min(((1u64 << 17) - *o.min(&((1 << 17) - 1))) as u32).max(1);
                let addr = geom.iova + (*o).min((1 << 17) - u64::from(len));
                SgeClass::Virtual { addr, len, region: 1, geom }
            }).collect();
            let total: u64 = sges.iter().map(SgeClass::len).sum();
            let rgeom = Geometry { iova: 0x80_0000, len: 1 << 18, window_shift: rshift };
            let raddr = rgeom.iova + roff.min(rgeom.len - total.min(rgeom.len));
            prop_assume!(rgeom.contains(raddr, total));
            let parts = plan(&sges, RemoteClass::Virtual { addr: raddr, len: total, geom: rgeom }, true, max_sge).unwrap();
            let want: Vec<u64> = sges.iter().flat_map(|s| match s {
                SgeClass::Virtual { addr, len, .. } => *addr..*addr + u64::from(*len),
                SgeClass::Keep(_) => 0..0,
            }).collect();
            prop_assert_eq!(stream_of(&parts), want);
            let mut expect_remote = raddr;
            for p in &parts {
                prop_assert!(p.sges.len() <= max_sge);
                prop_assert_eq!(p.len, p.sges.iter().map(PlannedSge::len).sum::<u64>());
                for s in &p.sges {
                    if let PlannedSge::Window { addr, len, window } = s {
                        let (ws, we) = geom.window_range(window.index);
                        prop_assert!(*addr >= ws && addr + u64::from(*len) <= we);
                    }
                }
                match p.remote {
                    Some(PlannedRemote::Window { addr, index }) => {
                        prop_assert_eq!(addr, expect_remote);
                        let (ws, we) = rgeom.window_range(index);
                        prop_assert!(addr >= ws && addr + p.len <= we);
                        expect_remote += p.len;
                    }
                    other => prop_assert!(false, "unexpected remote {:?}", other),
                }
            }
            prop_assert_eq!(expect_remote, raddr + total);
        }

        /// The same with the engine's other inputs: SGEs kept as they are (any length, zero
        /// included) mixed with virtual ones, a remote side that is absent, kept or virtual,
        /// and unsplittable opcodes. An unsplittable plan is one part or the documented
        /// refusal, and a refusal for too many SGEs is exactly what splitting would fix.
        #[test]
        fn plan_with_kept_sges_and_every_remote_kind(
            shift in 12u32..15,
            raw in proptest::collection::vec(
                (proptest::bool::weighted(0.3), 0u64..60000, 0u32..20000), 1..6),
            remote_kind in 0u8..3,
            roff in 0u64..70000,
            splittable in proptest::prelude::any::<bool>(),
            max_sge in 1usize..5,
        ) {
            let geom = Geometry { iova: 0x40_0000, len: 1 << 17, window_shift: shift };
            let sges: Vec<SgeClass> = raw.iter().map(|&(kept, o, l)| {
                if kept {
                    SgeClass::Keep(ibv_sge { addr: 0x7000_0000 + o, length: l, lkey: 3 })
                } else {
                    let len = l.clamp(1, ((1u64 << 17) - o.min((1 << 17) - 1)) as u32);
                    let addr = geom.iova + o.min((1 << 17) - u64::from(len));
                    SgeClass::Virtual { addr, len, region: 1, geom }
                }
            }).collect();
            let total: u64 = sges.iter().map(SgeClass::len).sum();
            let rgeom = Geometry { iova: 0x80_0000, len: 1 << 18, window_shift: shift };
            let raddr = rgeom.iova + roff.min(rgeom.len - total.min(rgeom.len));
            let remote = match remote_kind {
                0 => RemoteClass::None,
                1 => RemoteClass::Keep { addr: 0x9000_0000 + roff, rkey: 8 },
                _ => {
                    prop_assume!(rgeom.contains(raddr, total));
                    RemoteClass::Virtual { addr: raddr, len: total, geom: rgeom }
                }
            };
            let want: Vec<u64> = sges.iter().flat_map(|s| match s {
                SgeClass::Virtual { addr, len, .. } => *addr..*addr + u64::from(*len),
                SgeClass::Keep(k) => k.addr..k.addr + u64::from(k.length),
            }).collect();
            let remote_windows = match remote {
                RemoteClass::Virtual { addr, .. } if total > 0 => {
                    rgeom.window_of(addr + total - 1) - rgeom.window_of(addr) + 1
                }
                _ => 1,
            };
            match plan(&sges, remote, splittable, max_sge) {
                Err(PlanError::CrossesRemoteWindow) => {
                    prop_assert!(!splittable && remote_windows > 1);
                }
                Err(PlanError::RemoteOutsideRegion) => {
                    prop_assert!(false, "an inside remote range was refused");
                }
                Err(PlanError::TooManySges { needed, max }) => {
                    prop_assert!(!splittable && remote_windows == 1);
                    prop_assert_eq!(max, max_sge);
                    prop_assert!(needed > max);
                    let split = plan(&sges, remote, true, max_sge).unwrap();
                    prop_assert!(split.iter().all(|p| p.sges.len() <= max_sge));
                    prop_assert_eq!(split.iter().map(|p| p.sges.len()).sum::<usize>(), needed);
                }
                Ok(parts) => {
                    prop_assert!(!parts.is_empty());
                    if !splittable {
                        prop_assert_eq!(parts.len(), 1);
                        prop_assert_eq!(remote_windows, 1);
                    }
                    prop_assert_eq!(stream_of(&parts), want);
                    prop_assert_eq!(parts.iter().map(|p| p.len).sum::<u64>(), total);
                    let mut moved = 0u64;
                    for p in &parts {
                        prop_assert!(p.sges.len() <= max_sge);
                        prop_assert_eq!(p.len, p.sges.iter().map(PlannedSge::len).sum::<u64>());
                        for s in &p.sges {
                            if let PlannedSge::Window { addr, len, window } = s {
                                let (ws, we) = geom.window_range(window.index);
                                prop_assert!(*addr >= ws && addr + u64::from(*len) <= we);
                            }
                        }
                        match (remote, p.remote) {
                            (RemoteClass::None, None) => {}
                            (RemoteClass::Keep { addr, rkey }, Some(PlannedRemote::Keep { addr: a, rkey: k })) => {
                                prop_assert_eq!((a, k), (addr + moved, rkey));
                            }
                            (RemoteClass::Virtual { addr, .. }, Some(PlannedRemote::Window { addr: a, index })) => {
                                prop_assert_eq!(a, addr + moved);
                                let (ws, we) = rgeom.window_range(index);
                                prop_assert!(a >= ws && a + p.len <= we.max(ws));
                            }
                            (r, got) => prop_assert!(false, "remote {:?} planned as {:?}", r, got),
                        }
                        moved += p.len;
                    }
                }
            }
        }
    }
}
