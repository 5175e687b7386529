//! Driver mistakes, made on the bus: a [`RegisterBus`] wrapper over an MMU-500 window that
//! turns a correct driver's register traffic into the traffic of a driver with a known bug,
//! so tests can show that the models (and the scenario's checks) catch that bug, without any
//! test-only switch inside the driver.
//!
//! - [`Mistake::SkipTlbInvalidation`]: context-bank TLB invalidations (TLBIVA, TLBIVAA,
//!   TLBIASID, TLBIALL, TLBIVAL, TLBIVAAL; IHI 0062 "SMMU_CBn_TLBI*") are dropped; the
//!   TLBSYNC that follows still happens, so the driver believes the TLB is clean.
//! - [`Mistake::ResumeBeforeFsrClear`]: a write to a bank's FSR while that bank has a stalled
//!   transaction (FSR.SS) is held back and made only after the bank's next RESUME write, as a
//!   driver that writes RESUME first would do; meanwhile the driver reads FSR as if its write
//!   had been made (it believes it has cleared it). MMU-500 ignores that RESUME while FSR holds
//!   any bit other than SS (docs/mmu500.md §2.1), so the stall is not released. Writes still
//!   held when the mistake is switched off are made at the next access.
//!
//! Mistakes are switched on and off through a [`MistakeSwitch`] shared with the test, since
//! the wrapper itself is moved into the driver.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hal::barrier::Barrier;
use hal::regs::{AccessWidth, RegisterBus};

/// Offsets within a context bank (IHI 0062 "Translation context bank address space").
const CB_RESUME: usize = 0x008;
const CB_FSR: usize = 0x058;
const CB_TLBI: [usize; 6] = [0x600, 0x608, 0x610, 0x618, 0x620, 0x628];
/// FSR.SS.
const FSR_SS: u64 = 1 << 30;
/// FSR's write-one-to-clear bits: the fault bits 8:1 and MULTI (IHI 0062 SMMU_CBn_FSR).
const FSR_W1C: u64 = 0x1fe | 1 << 31;

/// A driver bug the wrapper imitates (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mistake {
    /// Context-bank TLB invalidations never reach the SMMU.
    SkipTlbInvalidation,
    /// RESUME is written before the FSR of a stalled bank is cleared.
    ResumeBeforeFsrClear,
}

impl Mistake {
    const fn bit(self) -> u32 {
        match self {
            Mistake::SkipTlbInvalidation => 1,
            Mistake::ResumeBeforeFsrClear => 2,
        }
    }
}

/// Switches a [`MistakenBus`]'s mistakes on and off, and counts what they did.
#[derive(Clone, Debug, Default)]
pub struct MistakeSwitch {
    on: Arc<AtomicU32>,
    dropped_tlbi: Arc<AtomicU64>,
    reordered_fsr: Arc<AtomicU64>,
}

impl MistakeSwitch {
    /// Turns `mistake` on or off.
    pub fn set(&self, mistake: Mistake, on: bool) {
        if on {
            self.on.fetch_or(mistake.bit(), Ordering::Relaxed);
        } else {
            self.on.fetch_and(!mistake.bit(), Ordering::Relaxed);
        }
    }

    /// Whether `mistake` is on.
    pub fn is_on(&self, mistake: Mistake) -> bool {
        self.on.load(Ordering::Relaxed) & mistake.bit() != 0
    }

    /// TLB invalidation writes dropped so far.
    pub fn dropped_tlbi(&self) -> u64 {
        self.dropped_tlbi.load(Ordering::Relaxed)
    }

    /// FSR writes made after the following RESUME instead of before it.
    pub fn reordered_fsr(&self) -> u64 {
        self.reordered_fsr.load(Ordering::Relaxed)
    }
}

/// An MMU-500 register window that makes the driver's mistakes (see the module docs).
#[derive(Debug)]
pub struct MistakenBus<B> {
    inner: B,
    /// First byte of context bank 0 and the size of one bank (IDR1: NUMPAGE and PAGESIZE).
    banks: (usize, usize),
    switch: MistakeSwitch,
    /// FSR writes held back until their bank's next RESUME: (offset, width, value).
    held: Mutex<Vec<(usize, AccessWidth, u64)>>,
}

impl<B: RegisterBus> MistakenBus<B> {
    /// Wraps `inner`, an MMU-500 window whose context banks start at `bank0` and are
    /// `bank_size` bytes each (ZynqMP: 0x1_0000 and 0x1000), with mistakes switched by
    /// `switch`.
    pub fn new(inner: B, bank0: usize, bank_size: usize, switch: MistakeSwitch) -> Self {
        MistakenBus {
            inner,
            banks: (bank0, bank_size.max(1)),
            switch,
            held: Mutex::new(Vec::new()),
        }
    }

    /// The offset within its context bank, for an offset in the context bank space.
    fn bank_register(&self, offset: usize) -> Option<usize> {
        let (bank0, size) = self.banks;
        Some(offset.checked_sub(bank0)? % size)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Vec<(usize, AccessWidth, u64)>> {
        // A panic while holding it cannot leave the list inconsistent (pushes and drains).
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the held FSR writes at `fsr` (every one with `None`).
    fn release(&self, fsr: Option<usize>) {
        let mut held = self.held();
        let (now, later): (Vec<_>, Vec<_>) = held
            .drain(..)
            .partition(|&(o, ..)| fsr.is_none_or(|f| f == o));
        *held = later;
        drop(held);
        for (o, w, v) in now {
            self.inner.write(o, w, v);
        }
    }

    /// Once the mistake is off, what it held back is written.
    fn settle(&self) {
        if !self.switch.is_on(Mistake::ResumeBeforeFsrClear) && !self.held().is_empty() {
            self.release(None);
        }
    }
}

impl<B: RegisterBus> RegisterBus for MistakenBus<B> {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        self.settle();
        let value = self.inner.read(offset, width);
        if self.bank_register(offset) != Some(CB_FSR) {
            return value;
        }
        // What the driver believes: its held write-one-to-clear already made.
        let cleared = self
            .held()
            .iter()
            .filter(|&&(o, ..)| o == offset)
            .fold(0, |bits, &(_, _, v)| bits | (v & FSR_W1C));
        value & !cleared
    }

    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        self.settle();
        let Some(register) = self.bank_register(offset) else {
            return self.inner.write(offset, width, value);
        };
        if CB_TLBI.contains(&register) && self.switch.is_on(Mistake::SkipTlbInvalidation) {
            self.switch.dropped_tlbi.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if register == CB_FSR
            && self.switch.is_on(Mistake::ResumeBeforeFsrClear)
            && self.inner.read(offset, AccessWidth::U32) & FSR_SS != 0
        {
            self.switch.reordered_fsr.fetch_add(1, Ordering::Relaxed);
            self.held().push((offset, width, value));
            return;
        }
        self.inner.write(offset, width, value);
        if register == CB_RESUME {
            self.release(Some(offset - CB_RESUME + CB_FSR));
        }
    }

    fn size(&self) -> usize {
        self.inner.size()
    }

    fn barrier(&self, kind: Barrier) {
        self.inner.barrier(kind)
    }
}
