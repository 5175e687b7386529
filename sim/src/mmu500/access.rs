//! Register accesses: the global spaces GR0 and GR1 and the context banks, decoded from the
//! window offset (IHI 0062 "Register address map").

use super::*;

impl Mmu500 {
    fn unknown(&mut self, offset: usize, write: bool) -> u64 {
        self.stats.unknown_accesses += 1;
        // The first ones only: a driver polling an unimplemented register must not grow
        // this without bound (the count goes on in the stats).
        if self.unknown.len() < MAX_UNKNOWN_LOGGED {
            self.unknown.push((offset, write));
        }
        0
    }

    fn read_gr0(&mut self, offset: usize, width: AccessWidth) -> u64 {
        let groups = self.config.stream_match_groups;
        let v = match offset {
            SCR0 => self.scr0,
            SACR => self.sacr,
            IDR0 => self.config.idr0(),
            IDR1 => self.config.idr1(),
            IDR2 => self.config.idr2(),
            IDR3..=IDR6 => 0,
            IDR7 => self.config.idr7(),
            SGFAR if width == AccessWidth::U64 => return self.sgfar,
            SGFAR => self.sgfar as u32,
            0x044 => (self.sgfar >> 32) as u32,
            SGFSR => self.sgfsr,
            SGFSYNR0 => self.sgfsynr[0],
            SGFSYNR1 => self.sgfsynr[1],
            SGFSYNR2 => self.sgfsynr[2],
            STLBGSTATUS => {
                if self.global_sync_reads > 0 {
                    self.global_sync_reads -= 1;
                    SYNC_ACTIVE
                } else {
                    // Seen idle: only now is the sync complete.
                    self.complete_global_sync();
                    0
                }
            }
            o if (SMR0..SMR0 + 4 * groups).contains(&o) => self.smr[(o - SMR0) / 4],
            o if (S2CR0..S2CR0 + 4 * groups).contains(&o) => self.s2cr[(o - S2CR0) / 4],
            o => return self.unknown(o, false),
        };
        u64::from(v)
    }

    /// Whether VMIDs are 16 bits wide: sCR0.VMID16EN, which IDR2.VMID16 makes writable.
    fn vmid16(&self) -> bool {
        self.config.idr2() & IDR2_VMID16 != 0 && self.scr0 & SCR0_VMID16EN != 0
    }

    /// The VMID that tags a bank's TLB entries: CBA2R.VMID16 with 16-bit VMIDs, else CBAR.VMID
    /// (IHI0062D CBAR, CBA2R). Stage-1 banks with stage 2 bypass carry one too.
    pub(super) fn bank_vmid(&self, bank: usize) -> u16 {
        let b = &self.banks[bank];
        if self.vmid16() {
            (b.cba2r >> CBA2R_VMID16_SHIFT) as u16
        } else {
            (b.cbar & CBAR_VMID_MASK) as u16
        }
    }

    /// The bits of an ASID that count in a bank: all 16 with TCR2.AS, else the low 8.
    pub(super) fn asid_mask(&self, bank: usize) -> u16 {
        if self.banks[bank].tcr2 & TCR2_AS != 0 {
            0xffff
        } else {
            0xff
        }
    }

    fn write_gr0(&mut self, offset: usize, value: u64) {
        let v = value as u32;
        let groups = self.config.stream_match_groups;
        let id_mask = self.stream_mask();
        match offset {
            SCR0 => self.scr0 = v,
            SACR => self.sacr = v,
            SGFSR => self.sgfsr &= !v,
            SGFSRRESTORE => self.sgfsr = v,
            TLBIVMID => {
                let vmid = if self.vmid16() {
                    v as u16
                } else {
                    v as u8 as u16
                };
                let doomed = self.tlb.select_vmid(vmid);
                self.global_pending.extend(doomed);
                self.stats.tlbi_ops += 1;
            }
            TLBIALLNSNH => {
                let doomed = self.tlb.select_all();
                self.global_pending.extend(doomed);
                self.stats.tlbi_ops += 1;
            }
            // No hypervisor entries are ever cached.
            TLBIALLH => self.stats.tlbi_ops += 1,
            STLBGSYNC => {
                let pending = std::mem::take(&mut self.global_pending);
                self.global_syncing.extend(pending);
                self.global_sync_reads = self.config.sync_latency_reads;
                self.stats.syncs += 1;
            }
            o if (SMR0..SMR0 + 4 * groups).contains(&o) => {
                self.smr[(o - SMR0) / 4] = v & (SMR_VALID | id_mask << 16 | id_mask);
            }
            o if (S2CR0..S2CR0 + 4 * groups).contains(&o) => {
                self.s2cr[(o - S2CR0) / 4] = v & S2CR_WRITABLE;
            }
            o => {
                self.unknown(o, true);
            }
        }
    }

    fn read_gr1(&mut self, offset: usize) -> u64 {
        let n = self.banks.len();
        let v = match offset {
            o if (CBAR0..CBAR0 + 4 * n).contains(&o) => self.banks[(o - CBAR0) / 4].cbar,
            o if (CBFRSYNRA0..CBFRSYNRA0 + 4 * n).contains(&o) => {
                self.banks[(o - CBFRSYNRA0) / 4].cbfrsynra
            }
            o if (CBA2R0..CBA2R0 + 4 * n).contains(&o) => self.banks[(o - CBA2R0) / 4].cba2r,
            o => return self.unknown(o + self.config.page_size(), false),
        };
        u64::from(v)
    }

    fn write_gr1(&mut self, offset: usize, value: u64) {
        let v = value as u32;
        let n = self.banks.len();
        match offset {
            o if (CBAR0..CBAR0 + 4 * n).contains(&o) => {
                self.banks[(o - CBAR0) / 4].cbar = v & CBAR_WRITABLE
            }
            o if (CBA2R0..CBA2R0 + 4 * n).contains(&o) => {
                self.banks[(o - CBA2R0) / 4].cba2r = v & 0xffff_0003
            }
            o => {
                self.unknown(o + self.config.page_size(), true);
            }
        }
    }

    fn read_bank(&mut self, bank: usize, offset: usize, width: AccessWidth) -> u64 {
        let wide = width == AccessWidth::U64;
        if offset == CB_TLBSTATUS && self.banks[bank].sync_reads == 0 {
            // Seen idle: only now is the sync complete.
            self.complete_context_sync(bank);
            return 0;
        }
        let b = &mut self.banks[bank];
        let half = |v: u64, high: bool| if high { v >> 32 } else { v & 0xffff_ffff };
        let v: u64 = match offset {
            CB_SCTLR => b.sctlr.into(),
            CB_ACTLR => b.actlr.into(),
            CB_TCR2 => b.tcr2.into(),
            CB_TTBR0 if wide => b.ttbr0,
            CB_TTBR0 => half(b.ttbr0, false),
            0x024 => half(b.ttbr0, true),
            CB_TTBR1 if wide => b.ttbr1,
            CB_TTBR1 => half(b.ttbr1, false),
            0x02c => half(b.ttbr1, true),
            CB_TCR => b.tcr.into(),
            CB_CONTEXTIDR => b.contextidr.into(),
            CB_MAIR0 => b.mair0.into(),
            CB_MAIR1 => b.mair1.into(),
            CB_PAR if wide => b.par,
            CB_PAR => half(b.par, false),
            0x054 => half(b.par, true),
            CB_FSR => b.fsr.into(),
            CB_FAR if wide => b.far,
            CB_FAR => half(b.far, false),
            0x064 => half(b.far, true),
            CB_FSYNR0 => b.fsynr0.into(),
            CB_FSYNR1 => b.fsynr1.into(),
            CB_TLBSTATUS => {
                if b.sync_reads > 0 {
                    b.sync_reads -= 1;
                    SYNC_ACTIVE.into()
                } else {
                    0
                }
            }
            o => {
                let page = (self.config.global_pages() + bank) * self.config.page_size();
                return self.unknown(page + o, false);
            }
        };
        v
    }

    fn write_bank(&mut self, bank: usize, offset: usize, width: AccessWidth, value: u64) {
        let wide = width == AccessWidth::U64;
        let v = value as u32;
        let set_half = |reg: &mut u64, high: bool, v: u32| {
            if high {
                *reg = (*reg & 0xffff_ffff) | u64::from(v) << 32;
            } else {
                *reg = (*reg & !0xffff_ffff) | u64::from(v);
            }
        };
        let tlbi =
            |value: u64| -> (u64, u16) { ((value & ((1 << 44) - 1)) << 12, (value >> 48) as u16) };
        // An invalidation names the entries cached now; they go when its sync completes. It
        // names them by the bank's VMID (and the ASID it carries), so it also reaches entries
        // that another bank with the same tags filled.
        let vmid = self.bank_vmid(bank);
        let asid_mask = self.asid_mask(bank);
        let doomed = match offset {
            CB_TLBIVA | CB_TLBIVAL if wide => {
                let (va, asid) = tlbi(value);
                Some(self.tlb.select_va(vmid, va, Some(asid & asid_mask)))
            }
            CB_TLBIVAA | CB_TLBIVAAL if wide => {
                let (va, _) = tlbi(value);
                Some(self.tlb.select_va(vmid, va, None))
            }
            CB_TLBIASID => Some(self.tlb.select_asid(vmid, v as u16 & asid_mask)),
            CB_TLBIALL => Some(self.tlb.select_vmid(vmid)),
            _ => None,
        };
        if let Some(doomed) = doomed {
            self.banks[bank].pending.extend(doomed);
            self.stats.tlbi_ops += 1;
            return;
        }
        let b = &mut self.banks[bank];
        match offset {
            CB_SCTLR => b.sctlr = v,
            // Locked on r2p0+ until sACR.CACHE_LOCK is cleared.
            CB_ACTLR if self.sacr & SACR_CACHE_LOCK != 0 => {}
            CB_ACTLR => b.actlr = v,
            CB_RESUME => self.resume(bank, v),
            CB_TCR2 => b.tcr2 = v,
            CB_TTBR0 if wide => b.ttbr0 = value,
            CB_TTBR0 => set_half(&mut b.ttbr0, false, v),
            0x024 => set_half(&mut b.ttbr0, true, v),
            CB_TTBR1 if wide => b.ttbr1 = value,
            CB_TTBR1 => set_half(&mut b.ttbr1, false, v),
            0x02c => set_half(&mut b.ttbr1, true, v),
            CB_TCR => b.tcr = v,
            CB_CONTEXTIDR => b.contextidr = v,
            CB_MAIR0 => b.mair0 = v,
            CB_MAIR1 => b.mair1 = v,
            // W1C for the fault bits and MULTI; SS only clears through RESUME.
            CB_FSR => {
                b.fsr &= !(v & (FSR_FAULTS | FSR_MULTI));
                if b.fsr & (FSR_FAULTS | FSR_MULTI) == 0 {
                    b.fsr &= !FSR_FORMAT_AARCH64;
                }
            }
            CB_FSRRESTORE => {
                let restored = v & (FSR_FAULTS | FSR_MULTI);
                let format = if restored != 0 { FSR_FORMAT_AARCH64 } else { 0 };
                b.fsr = (b.fsr & FSR_SS) | restored | format;
            }
            CB_TLBSYNC => {
                let pending = std::mem::take(&mut b.pending);
                b.syncing.extend(pending);
                b.sync_reads = self.config.sync_latency_reads;
                self.stats.syncs += 1;
            }
            o => {
                // Includes 32-bit writes to the 64-bit TLBI registers (AArch32 formats are not
                // modelled): the invalidation is lost, as a wrong-width access would be.
                let page = (self.config.global_pages() + bank) * self.config.page_size();
                self.unknown(page + o, true);
            }
        }
    }

    fn decode(&self, offset: usize) -> Option<(Space, usize)> {
        let page_size = self.config.page_size();
        let page = offset / page_size;
        let within = offset % page_size;
        let global = self.config.global_pages();
        match page {
            0 => Some((Space::Gr0, within)),
            1 => Some((Space::Gr1, within)),
            p if p >= global && p - global < self.banks.len() => {
                Some((Space::Bank(p - global), within))
            }
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Space {
    Gr0,
    Gr1,
    Bank(usize),
}

impl Mmu500 {
    /// Whether `offset` (decoded) is one of the 64-bit registers, the only ones that take a
    /// 64-bit access (IHI0062): sGFAR, and per bank TTBR0/1, PAR, FAR and the
    /// address-based TLBIs. A 64-bit access anywhere else would also touch the next 32-bit
    /// register, which the model does not guess at: it is recorded as unsupported.
    fn wide_register(&self, offset: usize) -> bool {
        match self.decode(offset) {
            Some((Space::Gr0, o)) => o == SGFAR,
            Some((Space::Bank(_), o)) => matches!(
                o,
                CB_TTBR0
                    | CB_TTBR1
                    | CB_PAR
                    | CB_FAR
                    | CB_TLBIVA
                    | CB_TLBIVAA
                    | CB_TLBIVAL
                    | CB_TLBIVAAL
            ),
            _ => false,
        }
    }
}

impl RegisterModel for Mmu500 {
    fn size(&self) -> usize {
        self.config.window_size()
    }

    fn read(&mut self, offset: usize, width: AccessWidth) -> u64 {
        // Registers are 32-bit; the 64-bit ones also take 64-bit accesses. Anything else
        // (8/16-bit, misaligned) is ignored, as we assume MMU-500 does with non-word accesses
        // (docs/mmu500.md §8).
        if !matches!(width, AccessWidth::U32 | AccessWidth::U64)
            || !offset.is_multiple_of(width.bytes())
            || (width == AccessWidth::U64 && !self.wide_register(offset))
        {
            return self.unknown(offset, false);
        }
        match self.decode(offset) {
            Some((Space::Gr0, o)) => self.read_gr0(o, width),
            Some((Space::Gr1, o)) => self.read_gr1(o),
            Some((Space::Bank(b), o)) => self.read_bank(b, o, width),
            None => self.unknown(offset, false),
        }
    }

    fn write(&mut self, offset: usize, width: AccessWidth, value: u64) {
        if !matches!(width, AccessWidth::U32 | AccessWidth::U64)
            || !offset.is_multiple_of(width.bytes())
            || (width == AccessWidth::U64 && !self.wide_register(offset))
        {
            self.unknown(offset, true);
            return;
        }
        match self.decode(offset) {
            Some((Space::Gr0, o)) => self.write_gr0(o, value),
            Some((Space::Gr1, o)) => self.write_gr1(o, value),
            Some((Space::Bank(b), o)) => self.write_bank(b, o, width, value),
            None => {
                self.unknown(offset, true);
            }
        }
    }
}
