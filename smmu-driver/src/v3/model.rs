//! A small SMMUv3 register model for host tests and benchmarks (`model` feature, or this
//! crate's own tests). It is not the project's register-accurate simulator (that is `sim`);
//! it models what the driver's correctness depends on, the way the architecture and QEMU 7.2
//! do it:
//!
//! - registers: IDRs (QEMU 7.2 values by default), CR0/CR0ACK, IRQ_CTRL/ACK, GERROR/GERRORN,
//!   the table and queue bases, PROD/CONS; page 1 aliases page 0 (QEMU masks offset bit 16);
//!   64-bit accesses only to the three base registers (anything else reads 0, as QEMU).
//! - the command queue, consumed synchronously when CMDQ_PROD, CR0 or GERRORN is written
//!   (as QEMU does): CFGI_*, TLBI_NH_ALL/ASID/VA/VAA (with RIL ranges and TTL),
//!   TLBI_NSNH_ALL, SYNC, PREFETCH; RESUME/STALL_TERM are CERROR_ILL on a terminate-only
//!   SMMU (IHI0070 §4.7.1; QEMU accepts them silently), unknown opcodes, SSec = 1 and
//!   CMD_SYNC CS = 0b11 are CERROR_ILL. A command error stops consumption with CONS at the
//!   bad command until GERRORN acknowledges it (§7.1).
//! - translation: STE/CD read from memory and cached until CFGI (never cached on failure),
//!   the walk done by [`crate::walk`], successful translations cached per ASID until TLBI
//!   (so a missing TLBI leaves a stale translation, as on QEMU and silicon), write
//!   permission rechecked on a hit.
//! - events: one record per faulting access; [`Smmuv3Model::dma_read`]/[`dma_write`] split
//!   a faulting access into <= 4-byte pieces and record one event per piece, like QEMU's
//!   unassigned-memory path (QEMU `memory_access_size`). When the queue is full the record is lost
//!   and either GERROR.EVENTQ_ABT_ERR (QEMU) or EVENTQ_PROD.OVFLG (architecture) is toggled.
//!
//! [`dma_write`]: Smmuv3Model::dma_write

use std::sync::Arc;
use std::vec::Vec;

use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::model::RegisterModel;
use hal::regs::AccessWidth;
use hal::{Iova, PhysAddr};

use super::caps::{IdRegisters, oas_bits};
use super::regs::offset;
use crate::walk::{self, AccessRequest, WalkConfig, WalkFault};

/// How the model signals a lost event record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverflowSignal {
    /// Toggle GERROR.EVENTQ_ABT_ERR (QEMU 7.2 `smmuv3_record_event`).
    QemuGerror,
    /// Toggle EVENTQ_PROD.OVFLG (IHI0070 §7.4).
    Architectural,
}

/// What the model counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Commands consumed.
    pub commands: u64,
    /// CMD_SYNCs consumed.
    pub syncs: u64,
    /// TLB invalidation commands consumed.
    pub tlbi: u64,
    /// Configuration invalidations consumed.
    pub cfgi: u64,
    /// Commands rejected with a CERROR.
    pub rejected: u64,
    /// Translations asked for.
    pub translations: u64,
    /// Of those, TLB hits.
    pub tlb_hits: u64,
    /// Event records written.
    pub events_written: u64,
    /// Event records lost to a full queue.
    pub events_lost: u64,
    /// CMDQ_PROD writes without a store barrier since the previous one: the command memory
    /// might not have been visible (a driver bug on silicon).
    pub unordered_doorbells: u64,
    /// The last CMD_RESUME consumed: StreamID, STAG, and dword 0 bits \[13:12\] (Ab, Ac).
    pub last_resume: Option<(u32, u16, u8)>,
    /// CMD_STALL_TERMs consumed.
    pub stall_terms: u32,
    /// The StreamID of the last CMD_STALL_TERM consumed.
    pub last_stall_term: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StreamState {
    Abort,
    Bypass,
    Stage1 {
        asid: u16,
        ttb0: u64,
        walk: WalkConfig,
        record: bool,
        access_flag_faults: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TlbEntry {
    asid: u16,
    base: u64,
    size: u64,
    output: u64,
    writable: bool,
    level: u8,
}

/// The result of a DMA through the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaOutcome {
    /// Bytes that reached memory.
    pub transferred: usize,
    /// Pieces that faulted (reads got zeros, writes were dropped).
    pub faulted_pieces: usize,
}

/// The model. Memory (tables, queues, DMA buffers) is a [`HostDma`] arena.
#[derive(Debug)]
pub struct Smmuv3Model {
    mem: Arc<HostDma>,
    idr: IdRegisters,
    /// How a lost event record is signalled.
    pub overflow_signal: OverflowSignal,
    /// Stop consuming commands (to test timeouts).
    pub frozen: bool,
    /// Freeze (see `frozen`) when this many commands have been consumed: a failure in the
    /// middle of a driver's command sequence.
    pub freeze_after: Option<u64>,
    /// Reject (CERROR_ILL) the command fetched when this many have been consumed, once.
    pub reject_after: Option<u64>,
    cr0: u32,
    cr1: u32,
    cr2: u32,
    irq_ctrl: u32,
    gerror: u32,
    gerrorn: u32,
    strtab_base: u64,
    strtab_cfg: u32,
    cmdq_base: u64,
    cmdq_prod: u32,
    cmdq_cons: u32,
    eventq_base: u64,
    eventq_prod: u32,
    eventq_cons: u32,
    configs: Vec<(u32, StreamState)>,
    tlb: Vec<TlbEntry>,
    barrier_since_doorbell: bool,
    /// Counters.
    pub stats: ModelStats,
}

const CR0_SMMUEN: u32 = 1 << 0;
const CR0_EVENTQEN: u32 = 1 << 2;
const CR0_CMDQEN: u32 = 1 << 3;
const GERROR_CMDQ_ERR: u32 = 1 << 0;
const GERROR_EVENTQ_ABT_ERR: u32 = 1 << 2;
const CERROR_ILL: u32 = 1;

fn queue_log2(base: u64, max: u32) -> u32 {
    ((base & 0x1f) as u32).min(max)
}

fn queue_addr(base: u64, log2: u32, entry: u64) -> u64 {
    let size = entry << log2;
    // ADDR [55:5], aligned by the SMMU to the queue size (at least 64 bytes in QEMU).
    (base & 0x00ff_ffff_ffff_ffe0) & !(size.max(64) - 1)
}

impl Smmuv3Model {
    /// A model with `idr` values over `mem`.
    pub fn new(mem: Arc<HostDma>, idr: IdRegisters) -> Self {
        Self {
            mem,
            idr,
            overflow_signal: OverflowSignal::QemuGerror,
            frozen: false,
            freeze_after: None,
            reject_after: None,
            cr0: 0,
            cr1: 0,
            cr2: 0,
            irq_ctrl: 0,
            gerror: 0,
            gerrorn: 0,
            strtab_base: 0,
            strtab_cfg: 0,
            cmdq_base: 0,
            cmdq_prod: 0,
            cmdq_cons: 0,
            eventq_base: 0,
            eventq_prod: 0,
            eventq_cons: 0,
            configs: Vec::new(),
            tlb: Vec::new(),
            barrier_since_doorbell: false,
            stats: ModelStats::default(),
        }
    }

    /// QEMU 7.2's `virt` SMMUv3.
    pub fn qemu(mem: Arc<HostDma>) -> Self {
        Self::new(mem, IdRegisters::QEMU_7_2)
    }

    /// The memory.
    pub fn memory(&self) -> &Arc<HostDma> {
        &self.mem
    }

    /// CR0 as last written.
    pub fn cr0(&self) -> u32 {
        self.cr0
    }

    /// GERROR and GERRORN.
    pub fn global_errors(&self) -> (u32, u32) {
        (self.gerror, self.gerrorn)
    }

    /// CMDQ_CONS including its ERR field.
    pub fn cmdq_cons(&self) -> u32 {
        self.cmdq_cons
    }

    /// Cached translations.
    pub fn tlb_entries(&self) -> usize {
        self.tlb.len()
    }

    /// Cached stream configurations.
    pub fn cached_streams(&self) -> usize {
        self.configs.len()
    }

    fn idr1_field(&self, shift: u32) -> u32 {
        (self.idr.idr1 >> shift) & 0x1f
    }

    fn stall_model(&self) -> u32 {
        (self.idr.idr0 >> 24) & 0b11
    }

    // ---- commands ----

    fn cmdq_error_active(&self) -> bool {
        (self.gerror ^ self.gerrorn) & GERROR_CMDQ_ERR != 0
    }

    fn process_commands(&mut self) {
        if self.cr0 & CR0_CMDQEN == 0 || self.cmdq_error_active() || self.frozen {
            return;
        }
        let log2 = queue_log2(self.cmdq_base, self.idr1_field(21));
        let mask = (1u32 << (log2 + 1)) - 1;
        let base = queue_addr(self.cmdq_base, log2, 16);
        while (self.cmdq_cons & mask) != (self.cmdq_prod & mask) {
            if self.freeze_after == Some(self.stats.commands) {
                self.frozen = true;
                return;
            }
            let index = u64::from(self.cmdq_cons & ((1 << log2) - 1));
            let at = PhysAddr::new(base + index * 16);
            let dw0 = self.mem.read_phys_u64(at).unwrap_or(0);
            let dw1 = self
                .mem
                .read_phys_u64(PhysAddr::new(at.as_u64() + 8))
                .unwrap_or(0);
            let rejected = if self.reject_after == Some(self.stats.commands) {
                self.reject_after = None;
                Err(CERROR_ILL)
            } else {
                self.execute(dw0, dw1)
            };
            if let Err(code) = rejected {
                self.cmdq_cons = (self.cmdq_cons & mask) | (code << 24);
                self.gerror ^= GERROR_CMDQ_ERR;
                self.stats.rejected += 1;
                return;
            }
            self.stats.commands += 1;
            let next = (self.cmdq_cons & mask).wrapping_add(1) & mask;
            self.cmdq_cons = (self.cmdq_cons & !mask) | next;
        }
    }

    fn execute(&mut self, dw0: u64, dw1: u64) -> Result<(), u32> {
        let op = (dw0 & 0xff) as u8;
        let sid = (dw0 >> 32) as u32;
        if dw0 & (1 << 10) != 0 {
            // SSec = 1 on the Non-secure queue.
            return Err(CERROR_ILL);
        }
        let ril = self.idr.idr3 & (1 << 10) != 0;
        match op {
            0x01 => {}
            0x03 | 0x05 | 0x06 => {
                self.stats.cfgi += 1;
                self.configs.retain(|(s, _)| *s != sid);
            }
            0x04 => {
                self.stats.cfgi += 1;
                let range = (dw1 & 0x1f) as u32;
                if range >= 31 {
                    self.configs.clear();
                } else {
                    let span = range + 1;
                    self.configs.retain(|(s, _)| (s >> span) != (sid >> span));
                }
            }
            0x10 | 0x30 => {
                self.stats.tlbi += 1;
                self.tlb.clear();
            }
            0x11 => {
                self.stats.tlbi += 1;
                let asid = (dw0 >> 48) as u16;
                self.tlb.retain(|e| e.asid != asid);
            }
            0x12 | 0x13 => {
                self.stats.tlbi += 1;
                let by_asid = op == 0x12;
                let asid = (dw0 >> 48) as u16;
                let address = dw1 & !0xfff;
                let tg = (dw1 >> 10) & 0b11;
                let ttl = ((dw1 >> 8) & 0b11) as u8;
                let num = (dw0 >> 12) & 0x1f;
                let scale = (dw0 >> 20) & 0x1f;
                if !ril && (tg != 0 || ttl != 0 || num != 0 || scale != 0) {
                    // Range fields are RES0 without IDR3.RIL.
                    return Err(CERROR_ILL);
                }
                let (len, level) = match tg {
                    0 => (1, 0),
                    1 => (((num + 1) << scale) << 12, ttl),
                    // Other granules: nothing of ours matches (the tables are 4 KiB).
                    _ => (0, 0),
                };
                let end = address.saturating_add(len);
                self.tlb.retain(|e| {
                    let hit = (!by_asid || e.asid == asid)
                        && e.base < end
                        && address < e.base + e.size
                        && (level == 0 || e.level == level);
                    !hit
                });
            }
            0x44 | 0x45 => {
                // §4.7.1/§4.7.2: CERROR_ILL when STALL_MODEL = 0b01. (QEMU ignores them.)
                if self.stall_model() == 1 {
                    return Err(CERROR_ILL);
                }
                if op == 0x44 {
                    self.stats.last_resume =
                        Some((sid, (dw1 & 0xffff) as u16, ((dw0 >> 12) & 0b11) as u8));
                } else {
                    self.stats.stall_terms += 1;
                    self.stats.last_stall_term = Some(sid);
                }
            }
            0x46 => {
                if (dw0 >> 12) & 0b11 == 0b11 {
                    return Err(CERROR_ILL);
                }
                self.stats.syncs += 1;
            }
            _ => return Err(CERROR_ILL),
        }
        Ok(())
    }

    // ---- events ----

    /// Writes `raw` into the event queue as the SMMU would (for tests of the consumer).
    pub fn inject_event(&mut self, raw: [u64; 4]) {
        self.record(raw);
    }

    fn record(&mut self, raw: [u64; 4]) {
        if self.cr0 & CR0_EVENTQEN == 0 {
            return;
        }
        let log2 = queue_log2(self.eventq_base, self.idr1_field(16));
        let entries = 1u32 << log2;
        let mask = (entries << 1) - 1;
        let prod = self.eventq_prod & mask;
        let cons = self.eventq_cons & mask;
        let full = (prod & (entries - 1)) == (cons & (entries - 1)) && prod != cons;
        if full {
            self.stats.events_lost += 1;
            match self.overflow_signal {
                OverflowSignal::QemuGerror => {
                    if (self.gerror ^ self.gerrorn) & GERROR_EVENTQ_ABT_ERR == 0 {
                        self.gerror ^= GERROR_EVENTQ_ABT_ERR;
                    }
                }
                OverflowSignal::Architectural => {
                    // Toggle OVFLG once per overflow: only if the last one was acknowledged.
                    if (self.eventq_prod >> 31) == (self.eventq_cons >> 31) {
                        self.eventq_prod ^= 1 << 31;
                    }
                }
            }
            return;
        }
        let base = queue_addr(self.eventq_base, log2, 32);
        let at = base + u64::from(prod & (entries - 1)) * 32;
        for (i, dword) in raw.iter().enumerate() {
            let _ = self
                .mem
                .write_phys_u64(PhysAddr::new(at + i as u64 * 8), *dword);
        }
        let next = prod.wrapping_add(1) & mask;
        self.eventq_prod = (self.eventq_prod & (1 << 31)) | next;
        self.stats.events_written += 1;
    }

    fn fault_event(&mut self, id: u64, sid: u32, iova: u64, write: bool) {
        // dw0: EventID | StreamID << 32; dw1: RnW (bit 35, 1 = read) | CLASS = IN (0b10,
        // bits 41:40); dw2: InputAddr (IHI0070 §7.3).
        let dw1 = (u64::from(!write) << 35) | (0b10 << 40);
        self.record([id | (u64::from(sid) << 32), dw1, iova, 0]);
    }

    // ---- translation ----

    fn stream_state(&mut self, sid: u32) -> Result<StreamState, u64> {
        if let Some((_, s)) = self.configs.iter().find(|(s, _)| *s == sid) {
            return Ok(*s);
        }
        let read = |mem: &HostDma, pa: u64| mem.read_phys_u64(PhysAddr::new(pa)).unwrap_or(0);
        let ste_at = (self.strtab_base & 0x00ff_ffff_ffff_ffc0) + u64::from(sid) * 64;
        let ste0 = read(&self.mem, ste_at);
        let ste1 = read(&self.mem, ste_at + 8);
        if ste0 & 1 == 0 {
            return Err(0x04);
        }
        let state = match (ste0 >> 1) & 0b111 {
            0b000..=0b011 => StreamState::Abort,
            0b100 => StreamState::Bypass,
            0b101 => {
                let s1stalld = ste1 & (1 << 27) != 0;
                if (ste0 >> 59) != 0 || (s1stalld && self.stall_model() != 0) {
                    return Err(0x04);
                }
                let cd_at = ste0 & 0x000f_ffff_ffff_ffc0;
                let cd0 = read(&self.mem, cd_at);
                let cd1 = read(&self.mem, cd_at + 8);
                let t0sz = (cd0 & 0x3f) as u8;
                let tg0 = (cd0 >> 6) & 0b11;
                let epd0 = cd0 & (1 << 14) != 0;
                let valid = cd0 & (1 << 31) != 0;
                let aa64 = cd0 & (1 << 41) != 0;
                let stall = cd0 & (1 << 44) != 0;
                let record = cd0 & (1 << 45) != 0;
                let abort = cd0 & (1 << 46) != 0;
                let affd = cd0 & (1 << 35) != 0;
                let abort_only = self.idr.idr0 & (1 << 26) != 0;
                let ips = oas_bits(((cd0 >> 32) & 0b111) as u32).unwrap_or(0);
                let oas = oas_bits(self.idr.idr5 & 0b111).unwrap_or(32);
                let walk = WalkConfig::from_t0sz(t0sz, ips.min(oas).clamp(32, 48));
                let illegal = !valid
                    || !aa64
                    || epd0
                    || tg0 != 0
                    || !(16..=39).contains(&t0sz)
                    || (stall && self.stall_model() == 1)
                    || (!stall && self.stall_model() == 2)
                    || (!abort && abort_only);
                match walk {
                    Ok(walk) if !illegal => StreamState::Stage1 {
                        asid: (cd0 >> 48) as u16,
                        ttb0: cd1 & 0x000f_ffff_ffff_fff0,
                        walk,
                        record,
                        access_flag_faults: !affd,
                    },
                    _ => return Err(0x0a),
                }
            }
            _ => return Err(0x04),
        };
        self.configs.push((sid, state));
        Ok(state)
    }

    /// Translates one access of stream `sid` at `iova`, recording an event on a fault.
    /// `None` if the access faulted or was aborted.
    pub fn translate(&mut self, sid: u32, iova: u64, write: bool) -> Option<u64> {
        self.stats.translations += 1;
        if self.cr0 & CR0_SMMUEN == 0 {
            return Some(iova);
        }
        let log2 = (self.strtab_cfg & 0x3f).min(16);
        if u64::from(sid) >> log2 != 0 {
            if self.cr2 & (1 << 1) != 0 {
                self.record([0x02 | (u64::from(sid) << 32), 0, 0, 0]);
            }
            return None;
        }
        let state = match self.stream_state(sid) {
            Ok(s) => s,
            Err(id) => {
                self.record([id | (u64::from(sid) << 32), 0, 0, 0]);
                return None;
            }
        };
        let StreamState::Stage1 {
            asid,
            ttb0,
            walk,
            record,
            access_flag_faults,
        } = state
        else {
            return (state == StreamState::Bypass).then_some(iova);
        };
        if let Some(e) = self
            .tlb
            .iter()
            .find(|e| e.asid == asid && iova >= e.base && iova - e.base < e.size)
            .copied()
        {
            self.stats.tlb_hits += 1;
            if write && !e.writable {
                if record {
                    self.fault_event(0x13, sid, iova, write);
                }
                return None;
            }
            return Some(e.output + (iova - e.base));
        }
        let mem = self.mem.clone();
        let leaf = walk::walk(PhysAddr::new(ttb0), Iova::new(iova), &walk, |pa| {
            mem.read_phys_u64(pa)
        });
        let request = if write {
            AccessRequest::WRITE
        } else {
            AccessRequest::READ
        };
        let checked = leaf.and_then(|leaf| {
            walk::check_access(&leaf, &request, access_flag_faults).map(|()| leaf)
        });
        match checked {
            Ok(leaf) => {
                self.tlb.push(TlbEntry {
                    asid,
                    base: leaf.base.as_u64(),
                    size: leaf.size.bytes(),
                    output: leaf.output.as_u64(),
                    writable: leaf.writable() && !leaf.restrictions.no_write,
                    level: leaf.level,
                });
                Some(leaf.phys(Iova::new(iova)).as_u64())
            }
            Err(fault) => {
                let id = match fault {
                    WalkFault::Translation { .. } => 0x10,
                    WalkFault::AddressSize { .. } => 0x11,
                    WalkFault::AccessFlag { .. } => 0x12,
                    WalkFault::Permission { .. } => 0x13,
                    WalkFault::External { .. } => 0x0b,
                };
                // Walk aborts are recorded whatever CD.R says (QEMU `smmuv3_translate`).
                if record || id == 0x0b {
                    self.fault_event(id, sid, iova, write);
                }
                None
            }
        }
    }

    fn dma(
        &mut self,
        sid: u32,
        iova: u64,
        len: usize,
        write: bool,
        mut copy: impl FnMut(&HostDma, u64, usize, usize) -> bool,
        mut fault: impl FnMut(usize, usize),
    ) -> DmaOutcome {
        let mut out = DmaOutcome::default();
        let mut done = 0usize;
        while done < len {
            let addr = iova + done as u64;
            match self.translate(sid, addr, write) {
                Some(pa) => {
                    let to_page_end = 0x1000 - (addr & 0xfff) as usize;
                    let n = (len - done).min(to_page_end);
                    if copy(&self.mem, pa, done, n) {
                        out.transferred += n;
                    }
                    done += n;
                }
                None => {
                    // The unassigned-memory path: pieces of at most 4 bytes, aligned.
                    let n = (len - done).min(4 - (addr & 3) as usize);
                    fault(done, n);
                    out.faulted_pieces += 1;
                    done += n;
                }
            }
        }
        out
    }

    /// A device read of `buf.len()` bytes at `iova` (memory -> device). Faulting pieces read
    /// as zeros.
    pub fn dma_read(&mut self, sid: u32, iova: u64, buf: &mut [u8]) -> DmaOutcome {
        let len = buf.len();
        let cell = core::cell::RefCell::new(buf);
        self.dma(
            sid,
            iova,
            len,
            false,
            |mem, pa, at, n| {
                let mut b = cell.borrow_mut();
                b.get_mut(at..at + n)
                    .is_some_and(|dst| mem.read_phys(PhysAddr::new(pa), dst).is_ok())
            },
            |at, n| {
                if let Some(dst) = cell.borrow_mut().get_mut(at..at + n) {
                    dst.fill(0);
                }
            },
        )
    }

    /// A device write of `data` at `iova` (device -> memory). Faulting pieces are dropped.
    pub fn dma_write(&mut self, sid: u32, iova: u64, data: &[u8]) -> DmaOutcome {
        self.dma(
            sid,
            iova,
            data.len(),
            true,
            |mem, pa, at, n| {
                data.get(at..at + n)
                    .is_some_and(|src| mem.write_phys(PhysAddr::new(pa), src).is_ok())
            },
            |_, _| {},
        )
    }

    fn write64_half(reg: &mut u64, offset: usize, value: u64) {
        if offset & 4 == 0 {
            *reg = (*reg & !0xffff_ffff) | (value & 0xffff_ffff);
        } else {
            *reg = (*reg & 0xffff_ffff) | (value << 32);
        }
    }
}

impl RegisterModel for Smmuv3Model {
    fn size(&self) -> usize {
        offset::FRAME_SIZE
    }

    fn read(&mut self, at: usize, width: AccessWidth) -> u64 {
        let off = at & !0x1_0000;
        let base64 = matches!(off & !7, 0x80 | 0x90 | 0xa0);
        if width == AccessWidth::U64 && !(base64 && off & 7 == 0) {
            return 0;
        }
        let half = |reg: u64| {
            if width == AccessWidth::U64 {
                reg
            } else if off & 4 == 0 {
                reg & 0xffff_ffff
            } else {
                reg >> 32
            }
        };
        u64::from(match off {
            offset::IDR0 => self.idr.idr0,
            offset::IDR1 => self.idr.idr1,
            offset::IDR3 => self.idr.idr3,
            offset::IDR5 => self.idr.idr5,
            offset::AIDR => self.idr.aidr,
            offset::CR0 | offset::CR0ACK => self.cr0,
            offset::CR1 => self.cr1,
            offset::CR2 => self.cr2,
            offset::IRQ_CTRL | offset::IRQ_CTRLACK => self.irq_ctrl,
            offset::GERROR => self.gerror,
            offset::GERRORN => self.gerrorn,
            0x80 | 0x84 => return half(self.strtab_base),
            offset::STRTAB_BASE_CFG => self.strtab_cfg,
            0x90 | 0x94 => return half(self.cmdq_base),
            offset::CMDQ_PROD => self.cmdq_prod,
            offset::CMDQ_CONS => self.cmdq_cons,
            0xa0 | 0xa4 => return half(self.eventq_base),
            0xa8 => self.eventq_prod,
            0xac => self.eventq_cons,
            _ => 0,
        })
    }

    fn write(&mut self, at: usize, width: AccessWidth, value: u64) {
        let off = at & !0x1_0000;
        let base64 = matches!(off & !7, 0x80 | 0x90 | 0xa0);
        if width == AccessWidth::U64 && !(base64 && off & 7 == 0) {
            return;
        }
        let v = value as u32;
        match off {
            offset::CR0 => {
                self.cr0 = v & 0x1df;
                if self.cr0 & CR0_SMMUEN == 0 {
                    self.configs.clear();
                }
                self.process_commands();
            }
            offset::CR1 => self.cr1 = v,
            offset::CR2 => self.cr2 = v,
            offset::IRQ_CTRL => self.irq_ctrl = v & 0b111,
            offset::GERRORN => {
                self.gerrorn = v;
                self.process_commands();
            }
            0x80 | 0x84 if width == AccessWidth::U64 => self.strtab_base = value,
            0x80 | 0x84 => Self::write64_half(&mut self.strtab_base, off, value),
            offset::STRTAB_BASE_CFG => self.strtab_cfg = v,
            0x90 | 0x94 if width == AccessWidth::U64 => self.cmdq_base = value,
            0x90 | 0x94 => Self::write64_half(&mut self.cmdq_base, off, value),
            offset::CMDQ_PROD => {
                // A doorbell that publishes commands must follow a store barrier.
                let publishes = v & 0xf_ffff != self.cmdq_prod;
                if publishes && !self.barrier_since_doorbell {
                    self.stats.unordered_doorbells += 1;
                }
                self.barrier_since_doorbell = false;
                self.cmdq_prod = v & 0xf_ffff;
                self.process_commands();
            }
            offset::CMDQ_CONS => self.cmdq_cons = v,
            0xa0 | 0xa4 if width == AccessWidth::U64 => self.eventq_base = value,
            0xa0 | 0xa4 => Self::write64_half(&mut self.eventq_base, off, value),
            0xa8 => self.eventq_prod = v,
            0xac => self.eventq_cons = v,
            _ => {}
        }
    }

    fn barrier(&mut self, kind: Barrier) {
        if matches!(
            kind,
            Barrier::DsbSt | Barrier::DsbSy | Barrier::DsbIshSt | Barrier::DsbIsh
        ) {
            self.barrier_since_doorbell = true;
        }
    }
}
