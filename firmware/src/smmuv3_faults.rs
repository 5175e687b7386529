//! The `smmuv3-faults` program: QEMU's `edu` device doing DMA into unpinned, pageable memory
//! behind the SMMUv3, with every fault detected through the event queue, resolved by a pager
//! and retransmitted.
//!
//! # The setting
//! - edu (stream = its PCI requester ID, 0x10 at `addr=2`) sits behind the SMMUv3 with its own
//!   stream table entry and context descriptor (ASID [`ASID`]), translating a 4 MiB IOVA
//!   window at [`WINDOW_BASE`] (below edu's 28-bit `dma_mask`, QEMU `hw/misc/edu.c`).
//! - A [`Pager`] owns a pool of frames and a backing store holding every page of the window.
//!   Pages are mapped only while resident; eviction is "unmap, TLBI + CMD_SYNC, save the
//!   frame to the backing store, free the frame", in that order, so a DMA write that raced
//!   the unmap is either in the saved copy or faulted. The pager implements the shared
//!   [`FaultResolver`]: resolving a page takes a free frame and fills it from the backing
//!   store.
//! - edu has one 4 KiB buffer and copies between it and memory. One *copy* is two DMA
//!   transfers in flight together: memory -> edu buffer (a read of IOVA range A), then edu
//!   buffer -> memory (a write of IOVA range B). A reference copy of the window gets the
//!   same copy done by the CPU.
//!
//! # Detecting and handling faults (QEMU 7.2 facts: docs/smmu-driver.md, "QEMU 7.2 behaviour")
//! edu never reports a failed DMA: a faulting read delivers zeros into its buffer, a faulting
//! write is dropped, completion looks the same (`edu_dma_timer`). The event queue is the only signal,
//! and QEMU writes one record per faulting 4-byte piece. After both transfers complete the
//! program issues CMD_SYNC (on silicon that makes the events of terminated transactions
//! visible, §4.7.3) and drains the queue: records with RnW = 1 inside A mean the read
//! failed, RnW = 0 inside B the write. Each faulting page is serviced once through
//! [`Smmuv3::service_fault`] (the shared [`FaultHandler`] with
//! [`StandardPolicy::RetransmitOnly`]: the SMMU cannot stall), which has the pager make it
//! present and maps it. Then the failed transfers are retransmitted: both if the read
//! failed (the buffer holds zeros), only the write otherwise.
//!
//! If the drain reports an overflow (QEMU drops records and toggles GERROR.EVENTQ_ABT_ERR
//! when the queue is full) or a record that does not decode, records may be missing: both
//! transfers in flight are suspect. Every page of A and B is re-validated (made present if
//! it is not) and both are retransmitted.
//!
//! # Scenarios
//! - [`Scenario::MAIN`]: 600 copies (1200 transfers) over the window with 256 of 1024 pages
//!   resident at the start, 384 frames, random evictions between copies.
//! - [`Scenario::TINY_EVENT_QUEUE`]: an 8-entry event queue, so nearly every faulting copy
//!   overflows it.
//! - [`run_stale_tlb_probe`]: evicting a page *without* the TLB invalidation lets the SMMU keep
//!   using the old frame (QEMU caches translations, `smmuv3_translate`); the final comparison
//!   must catch the resulting corruption, and the same sequence with the invalidation must
//!   come out exact.

use core::fmt;
use core::ops::Deref;

use boards::pager::{Fill, Store};
use hal::Iova;
use hal::barrier::Barrier;
use hal::delay::DelayNs;
use hal::dma::DmaMemory;
use hal::regs::RegisterBus;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    AccessKind, FaultDecision, FaultHandler, FaultRecord, InFlightAccess, StandardPolicy, StreamId,
};
use smmu_driver::pagetable::{PageTable, PageTableConfig, TlbMaintenance};
use smmu_driver::v3::{ContextConfig, Event, Smmuv3, Smmuv3Config};
use tock_registers::interfaces::{Readable, Writeable};

use crate::edu::EduRegs;
use crate::error::{FirmwareError, Result};

/// Page size of the window.
pub const PAGE: usize = 4096;
/// First IOVA of the window (2 MiB aligned, below edu's 28-bit DMA mask).
pub const WINDOW_BASE: u64 = 0x40_0000;
/// Pages in the window (4 MiB).
pub const WINDOW_PAGES: usize = 1024;
/// Bytes in the window.
pub const WINDOW_BYTES: usize = WINDOW_PAGES * PAGE;
/// Most frames a pager manages.
pub const MAX_FRAMES: usize = 1024;
/// The ASID of edu's context.
pub const ASID: u16 = 1;
/// edu's DMA buffer, as the device addresses it.
pub const EDU_BUFFER: u64 = 0x4_0000;
/// A transfer must end strictly inside edu's 4 KiB buffer: QEMU 7.2's range check is off by
/// one and aborts QEMU otherwise (`edu_check_range`, seen in our runs). So offset + length <= 0xfff.
pub const EDU_BUFFER_LIMIT: u64 = 0xfff;
/// edu's default DMA mask (28 bits).
pub const EDU_DMA_MASK: u64 = 0x0fff_ffff;
/// Longest transfer the scenarios use.
pub const MAX_TRANSFER: usize = 0xff0;
/// Attempts per copy before giving up.
pub const MAX_ATTEMPTS: u32 = 8;
/// edu's DMA-completion interrupt status bit.
const DMA_IRQ: u32 = 0x100;
/// How long one edu DMA may take before it counts as lost: edu completes a DMA 100 ms of QEMU
/// virtual time after it starts (`hw/misc/edu.c`, `dma_rw` arms `dma_timer` at +100 ms).
pub const DMA_DEADLINE_MS: u64 = 2_000;
/// Longest single sleep between completion polls: a lost interrupt costs at most this.
pub const DMA_POLL_MS: u64 = 10;

/// Which way an edu DMA goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Memory -> edu buffer: the SMMU sees reads.
    ToDevice,
    /// edu buffer -> memory: the SMMU sees writes.
    ToMemory,
}

/// edu's DMA engine (register map: `edu_mmio_read`/`edu_mmio_write` in QEMU `hw/misc/edu.c`).
pub struct EduDma<'a, B: RegisterBus + ?Sized> {
    regs: EduRegs<'a, B>,
}

impl<B: RegisterBus + ?Sized> fmt::Debug for EduDma<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EduDma")
            .field("base", &self.regs.base())
            .finish()
    }
}

impl<'a, B: RegisterBus + ?Sized> EduDma<'a, B> {
    /// The engine behind `regs`.
    pub fn new(regs: EduRegs<'a, B>) -> Self {
        Self { regs }
    }

    /// Runs one DMA of `len` bytes between IOVA `iova` and offset `offset` of the buffer, and
    /// waits for it: `wait` sleeps between completion polls (a `wfi` on the target, woken by
    /// edu's interrupt or a timer) and ends the DMA as lost when its time is up. Raises edu's
    /// completion interrupt and acknowledges it.
    pub fn transfer(
        &self,
        direction: Direction,
        iova: u64,
        offset: u64,
        len: u64,
        wait: &mut dyn DmaWait,
    ) -> Result<()> {
        let range = FirmwareError::EduDmaRange { offset, len, iova };
        let buffer_end = offset.checked_add(len).ok_or(range)?;
        let memory_end = iova.checked_add(len).ok_or(range)?;
        if len == 0 || buffer_end > EDU_BUFFER_LIMIT || memory_end - 1 > EDU_DMA_MASK {
            return Err(range);
        }
        if self.regs.dma_command().get() & 1 != 0 {
            return Err(FirmwareError::EduBusy);
        }
        let (source, destination, to_memory) = match direction {
            Direction::ToDevice => (iova, EDU_BUFFER + offset, 0),
            Direction::ToMemory => (EDU_BUFFER + offset, iova, 1),
        };
        self.regs.dma_source().set(source);
        self.regs.dma_destination().set(destination);
        self.regs.dma_count().set(len);
        // What the CPU wrote to the frames must be visible before edu reads them.
        self.regs.barrier(Barrier::DsbSt);
        // Command: bit 0 start, bit 1 direction (1 = to memory), bit 2 interrupt when done.
        self.regs.dma_command().set(1 | (to_memory << 1) | 4);
        wait.start();
        loop {
            if self.regs.dma_command().get() & 1 == 0 {
                self.regs.interrupt_ack().set(DMA_IRQ);
                // edu's writes must be visible before the CPU reads the frames.
                self.regs.barrier(Barrier::DsbLd);
                return Ok(());
            }
            if !wait.wait() {
                return Err(FirmwareError::EduDmaTimeout);
            }
        }
    }
}

/// How the CPU spends the time between edu completion polls, and when it gives up on a DMA.
pub trait DmaWait {
    /// A DMA was just started.
    fn start(&mut self);
    /// Sleeps until something may have changed (edu's interrupt, or a backstop, so that a lost
    /// interrupt cannot hang the run). Returns false, without sleeping, once the DMA has had
    /// its time.
    fn wait(&mut self) -> bool;
}

/// A [`DmaWait`] with a deadline on a free-running counter: a DMA may take `budget` ticks from
/// [`start`](DmaWait::start), and each wait sleeps at most `slice` of them (`sleep(ticks)`
/// returns early on an interrupt). On the target, `now` is the generic timer's counter and
/// `sleep` a `wfi` with the virtual timer as backstop
/// ([`crate::timer::wait_for_interrupt_at_most`]).
pub struct CounterWait<N, S> {
    now: N,
    sleep: S,
    budget: u64,
    slice: u64,
    deadline: u64,
}

impl<N: FnMut() -> u64, S: FnMut(u64)> CounterWait<N, S> {
    /// A wait on a counter of `hz` ticks per second: [`DMA_DEADLINE_MS`] per DMA, sleeps of at
    /// most [`DMA_POLL_MS`].
    pub fn new(hz: u64, now: N, sleep: S) -> Self {
        let per_ms = hz.div_ceil(1000).max(1);
        let budget = per_ms.saturating_mul(DMA_DEADLINE_MS);
        Self {
            now,
            sleep,
            budget,
            slice: per_ms.saturating_mul(DMA_POLL_MS),
            deadline: 0,
        }
    }
}

impl<N: FnMut() -> u64, S: FnMut(u64)> DmaWait for CounterWait<N, S> {
    fn start(&mut self) {
        self.deadline = (self.now)().saturating_add(self.budget);
    }

    fn wait(&mut self) -> bool {
        let now = (self.now)();
        if now >= self.deadline {
            return false;
        }
        (self.sleep)(self.slice.min(self.deadline - now));
        true
    }
}

/// Index of the page holding `iova` in the window.
pub fn page_of(iova: u64) -> Option<usize> {
    let off = iova.checked_sub(WINDOW_BASE)?;
    let page = usize::try_from(off / PAGE as u64).ok()?;
    (page < WINDOW_PAGES).then_some(page)
}

/// IOVA of page `page`.
pub const fn iova_of(page: usize) -> u64 {
    WINDOW_BASE + (page * PAGE) as u64
}

/// A small xorshift64* generator (the runs must be reproducible, not cryptographic).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero value).
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The initial content of the 8 bytes at byte `at` (a multiple of 8) of the window.
fn pattern_word(seed: u64, at: usize) -> u64 {
    ((at as u64 / 8) ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The initial content of byte `offset` of page `page`.
pub fn pattern(seed: u64, page: usize, offset: usize) -> u8 {
    let at = page * PAGE + offset;
    pattern_word(seed, at & !7).to_le_bytes()[at % 8]
}

/// `bytes` as little-endian 64-bit words, if it is 8-byte aligned and a multiple of 8 long.
/// (Word-at-a-time loops keep the unoptimised firmware build fast enough.)
fn as_words_mut(bytes: &mut [u8]) -> Option<&mut [u64]> {
    // SAFETY: every bit pattern is a valid u64 and a valid u8, so viewing the aligned middle
    // of the byte slice as words is sound; the unaligned head and tail are checked empty.
    let (head, words, tail) = unsafe { bytes.align_to_mut::<u64>() };
    (head.is_empty() && tail.is_empty()).then_some(words)
}

/// Fills `window` with [`pattern`].
fn fill_pattern(seed: u64, window: &mut [u8]) {
    match as_words_mut(window) {
        Some(words) => {
            for (i, w) in words.iter_mut().enumerate() {
                *w = u64::from_le(pattern_word(seed, i * 8));
            }
        }
        None => {
            for (i, b) in window.iter_mut().enumerate() {
                *b = pattern(seed, i / PAGE, i % PAGE);
            }
        }
    }
}

/// A scenario of random copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// Name for the log.
    pub name: &'static str,
    /// Copies (each is two DMA transfers).
    pub copies: u32,
    /// Pages resident (mapped) at the start.
    pub resident_at_start: usize,
    /// Frames the pager owns.
    pub frames: usize,
    /// log2 of the event queue entries.
    pub eventq_log2: u8,
    /// Most random evictions between two copies.
    pub max_evictions: u32,
    /// Longest copy in bytes (<= [`MAX_TRANSFER`]).
    pub max_len: usize,
    /// Random seed.
    pub seed: u64,
    /// Also prove command-queue error recovery (an illegal command, then CMD_SYNC).
    pub check_command_error: bool,
}

impl Scenario {
    /// 1200 transfers, a quarter of the window resident at the start, 384 frames, a
    /// 4096-entry event queue (a 0xff0-byte copy can produce 2 x 1020 records).
    pub const MAIN: Scenario = Scenario {
        name: "main",
        copies: 600,
        resident_at_start: 256,
        frames: 384,
        eventq_log2: 12,
        max_evictions: 3,
        max_len: MAX_TRANSFER,
        seed: 0x5eed_0001,
        check_command_error: true,
    };

    /// An 8-entry event queue: nearly every faulting copy loses records.
    pub const TINY_EVENT_QUEUE: Scenario = Scenario {
        name: "tiny-eventq",
        copies: 100,
        resident_at_start: 128,
        frames: 256,
        eventq_log2: 3,
        max_evictions: 3,
        max_len: MAX_TRANSFER,
        seed: 0x5eed_0002,
        check_command_error: false,
    };
}

/// What a scenario did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Scenario name.
    pub name: &'static str,
    /// Copies done.
    pub copies: u32,
    /// DMA transfers asked for (two per copy), not counting retransmissions.
    pub transfers: u64,
    /// Transfers issued again after a fault or an overflow.
    pub retransmissions: u64,
    /// Pages mapped because a transfer faulted on them.
    pub faults: u64,
    /// Fault records drained (QEMU writes one per faulting 4-byte piece).
    pub fault_records: u64,
    /// Event records drained in total.
    pub events: u64,
    /// Records that did not decode (unknown or malformed).
    pub rejected_events: u64,
    /// Drains that reported lost records.
    pub overflow_recoveries: u64,
    /// Pages made present by re-validation after an overflow.
    pub revalidated_pages: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Command-queue errors recovered from.
    pub cmdq_recoveries: u64,
    /// TLB invalidation commands sent (by VA or range; by ASID).
    pub tlbi: (u64, u64),
    /// CMD_SYNCs.
    pub syncs: u64,
    /// Pages whose final content differs from the reference.
    pub mismatched_pages: u64,
    /// Bytes that differ.
    pub mismatched_bytes: u64,
}

impl Report {
    /// Whether every byte matched the reference.
    pub fn exact(&self) -> bool {
        self.mismatched_bytes == 0 && self.mismatched_pages == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} transfers ({} copies), {} faults, {} retransmissions, {} events ({} fault \
             records, {} rejected), {} overflow recoveries ({} pages re-validated), {} \
             evictions, {} cmdq recoveries, TLBI {} by VA / {} by ASID, {} syncs, {} bytes \
             differ in {} pages",
            self.name,
            self.transfers,
            self.copies,
            self.faults,
            self.retransmissions,
            self.events,
            self.fault_records,
            self.rejected_events,
            self.overflow_recoveries,
            self.revalidated_pages,
            self.evictions,
            self.cmdq_recoveries,
            self.tlbi.0,
            self.tlbi.1,
            self.syncs,
            self.mismatched_bytes,
            self.mismatched_pages
        )
    }
}

/// The same line as [`fmt::Display`]'s, for defmt.
#[cfg(target_os = "none")]
impl defmt::Format for Report {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "{=str}: {=u64} transfers ({=u32} copies), {=u64} faults, {=u64} retransmissions, \
             {=u64} events ({=u64} fault records, {=u64} rejected), {=u64} overflow recoveries \
             ({=u64} pages re-validated), {=u64} evictions, {=u64} cmdq recoveries, TLBI {=u64} \
             by VA / {=u64} by ASID, {=u64} syncs, {=u64} bytes differ in {=u64} pages",
            self.name,
            self.transfers,
            self.copies,
            self.faults,
            self.retransmissions,
            self.events,
            self.fault_records,
            self.rejected_events,
            self.overflow_recoveries,
            self.revalidated_pages,
            self.evictions,
            self.cmdq_recoveries,
            self.tlbi.0,
            self.tlbi.1,
            self.syncs,
            self.mismatched_bytes,
            self.mismatched_pages
        )
    }
}

/// What the program runs against.
pub struct Hardware<'h, B: RegisterBus + ?Sized, E: RegisterBus + ?Sized, M, D> {
    /// The SMMUv3 register frame.
    pub smmu: &'h B,
    /// edu's DMA engine.
    pub edu: EduDma<'h, E>,
    /// edu's StreamID (its requester ID).
    pub stream: StreamId,
    /// DMA memory for the SMMU's tables and queues, the page tables and the frames.
    pub dma: M,
    /// The delay the SMMU driver polls with.
    pub delay: D,
    /// How to wait for a DMA (the target executes `wfi`, with a timer as backstop).
    pub wait: &'h mut dyn DmaWait,
}

/// CPU-only memory of a run: the backing store and the reference ([`WINDOW_BYTES`] each).
pub struct Buffers<'w> {
    /// The pager's backing store.
    pub backing: &'w mut [u8],
    /// What the window must hold at the end.
    pub reference: &'w mut [u8],
}

/// One faulting page of the transfers in flight, with the record that reported it.
#[derive(Clone, Copy, Debug)]
struct PageFault {
    page: usize,
    record: FaultRecord,
}

type PageFaults = heapless::Vec<PageFault, 8>;

fn pages(iova: u64, len: usize) -> core::ops::Range<usize> {
    let first = page_of(iova).unwrap_or(0);
    let last = page_of(iova + len as u64 - 1).unwrap_or(first);
    first..last + 1
}

/// The IOVAs of the pages `len` bytes at `iova` touch.
fn page_span(iova: u64, len: usize) -> core::ops::Range<u64> {
    let pages = pages(iova, len);
    iova_of(pages.start)..iova_of(pages.end)
}

/// The window's pager: 1024 pages in one region, up to 1024 frames, the store in plain memory
/// the caller lends (the CPU fills and compares it fast).
type Pager<'m, 'w, M> = boards::pager::Pager<'m, 'w, M, WINDOW_PAGES, MAX_FRAMES>;

/// The TLB maintenance of the stale-TLB probe's deliberate mistake: an eviction whose
/// invalidation never reaches the SMMU.
struct NoInvalidation;

impl TlbMaintenance for NoInvalidation {
    fn invalidate_now(
        &mut self,
        _: &smmu_driver::pagetable::Invalidations,
    ) -> smmu_driver::Result<()> {
        Ok(())
    }
}

/// A run in progress: the SMMU driver, the table, the pager and the reference.
struct Session<'s, 'h, 'w, B, E, M, D>
where
    B: RegisterBus + ?Sized,
    E: RegisterBus + ?Sized,
    M: Deref<Target: DmaMemory> + Clone,
    D: DelayNs,
{
    smmu: Smmuv3<'h, B, M, D>,
    table: PageTable<M>,
    pager: Pager<'s, 'w, <M as Deref>::Target>,
    handler: FaultHandler<StandardPolicy>,
    reference: &'w mut [u8],
    edu: &'s EduDma<'h, E>,
    wait: &'s mut (dyn DmaWait + 'h),
    stream: StreamId,
    rng: Rng,
    report: Report,
    /// The first pages [`Session::verify`] found different.
    mismatched: heapless::Vec<usize, 16>,
}

/// A page buffer aligned for word-at-a-time copies.
#[repr(align(8))]
struct PageBuf([u8; PAGE]);

impl<'s, 'h, 'w, B, E, M, D> Session<'s, 'h, 'w, B, E, M, D>
where
    B: RegisterBus + ?Sized,
    E: RegisterBus + ?Sized,
    M: Deref<Target: DmaMemory> + Clone,
    D: DelayNs + Copy,
{
    fn new(
        hw: &'s mut Hardware<'h, B, E, M, D>,
        bufs: &'w mut Buffers<'_>,
        frames: usize,
        eventq_log2: u8,
        seed: u64,
        name: &'static str,
    ) -> Result<Self> {
        if bufs.reference.len() != WINDOW_BYTES || frames == 0 || frames > MAX_FRAMES {
            return Err(FirmwareError::BadScenario {
                what: "4 MiB reference and 1..=1024 frames",
            });
        }
        let config = Smmuv3Config {
            eventq_log2,
            ..Smmuv3Config::default()
        };
        let mut smmu = Smmuv3::new(hw.smmu, hw.dma.clone(), hw.delay, config)?;
        let output_bits = smmu.capabilities().output_bits.clamp(32, 48);
        let table = PageTable::new(
            hw.dma.clone(),
            PageTableConfig {
                output_bits,
                chunk_pages: 16,
                max_chunks: 4,
            },
        )?;
        smmu.attach(hw.stream, &ContextConfig::for_table(ASID, &table))?;
        // Split borrows: the backing store goes to the pager, the reference stays here.
        let backing: &'w mut [u8] = &mut *bufs.backing;
        let reference: &'w mut [u8] = &mut *bufs.reference;
        fill_pattern(seed, backing);
        reference.copy_from_slice(backing);
        let dma: &'s <M as Deref>::Target = &hw.dma;
        let mut pager = Pager::new(dma, frames, 500, Store::Memory(backing))?;
        pager.add_region(
            hw.stream,
            Iova::new(WINDOW_BASE),
            WINDOW_PAGES,
            true,
            Fill::Unchanged,
        )?;
        Ok(Self {
            smmu,
            table,
            pager,
            handler: FaultHandler::new(StandardPolicy::RetransmitOnly),
            reference,
            edu: &hw.edu,
            wait: &mut *hw.wait,
            stream: hw.stream,
            rng: Rng::new(seed),
            report: Report {
                name,
                ..Report::default()
            },
            mismatched: heapless::Vec::new(),
        })
    }

    /// Detaches edu, disables the SMMU and returns the memory.
    fn finish(self, dma: &M) -> Result<Report> {
        let Session {
            smmu,
            table,
            pager,
            mut report,
            ..
        } = self;
        let stats = *smmu.stats();
        report.tlbi = (stats.tlbi_va, stats.tlbi_asid);
        report.syncs = stats.syncs;
        report.evictions = u64::from(pager.stats().evictions);
        smmu.shutdown()?;
        drop(table);
        pager.release()?;
        let _ = dma;
        Ok(report)
    }

    fn dma(&mut self, direction: Direction, iova: u64, len: usize, again: bool) -> Result<()> {
        self.edu
            .transfer(direction, iova, 0, len as u64, &mut *self.wait)?;
        if again {
            self.report.retransmissions += 1;
        }
        Ok(())
    }

    /// Drains the event queue and sorts the fault records of the copy in flight by page.
    /// Returns the faulting pages and whether records may have been lost.
    fn collect_faults(&mut self, a: u64, b: u64, len: usize) -> Result<(PageFaults, bool)> {
        let stream = self.stream;
        let mut set = PageFaults::new();
        let mut lost = false;
        let mut foreign: Option<(u8, u64)> = None;
        let mut records = 0u64;
        let mut rejected = 0u64;
        let summary = self.smmu.drain_events(|e| match e {
            Ok(Event::Fault(r)) if r.stream == stream => {
                records += 1;
                let iova = r.iova.as_u64();
                let in_a = iova >= a && iova - a < len as u64 && r.access == AccessKind::Read;
                let in_b = iova >= b && iova - b < len as u64 && r.access == AccessKind::Write;
                let page = page_of(iova);
                match (in_a || in_b, page) {
                    (true, Some(page)) => {
                        if !set.iter().any(|f| f.page == page)
                            && set.push(PageFault { page, record: r }).is_err()
                        {
                            lost = true;
                        }
                    }
                    _ => {
                        foreign.get_or_insert((Event::Fault(r).id(), iova));
                    }
                }
            }
            Ok(other) => {
                let iova = match other {
                    Event::Fault(r) => r.iova.as_u64(),
                    _ => 0,
                };
                foreign.get_or_insert((other.id(), iova));
            }
            // A record that does not decode may have been ours: treat it as lost.
            Err(_) => {
                rejected += 1;
                lost = true;
            }
        })?;
        self.report.events += u64::from(summary.records);
        self.report.fault_records += records;
        self.report.rejected_events += rejected;
        if let Some((id, iova)) = foreign {
            return Err(FirmwareError::UnexpectedEvent { id, iova });
        }
        Ok((set, lost || summary.overflow))
    }

    /// Makes every page of `set` present through the shared fault path.
    fn service(&mut self, set: &PageFaults, pinned: &[core::ops::Range<u64>]) -> Result<u64> {
        let asid = ASID;
        let (rng, frames) = (&mut self.rng, self.pager.frame_count() as u64);
        self.pager.ensure_free(
            set.len(),
            || rng.below(frames) as usize,
            pinned,
            &mut self.table,
            &mut self.smmu.tlb(asid),
        )?;
        let mut mapped = 0;
        for f in set {
            let outcome = self.smmu.service_fault(
                &f.record,
                &mut self.handler,
                &mut self.pager,
                &mut self.table,
            )?;
            match outcome.decision {
                FaultDecision::TerminateAndRetransmit | FaultDecision::Resume => {
                    if outcome.mapped.is_some() {
                        mapped += 1;
                    }
                }
                FaultDecision::Abort(e) => return Err(e.into()),
            }
        }
        Ok(mapped)
    }

    /// Makes every page of `ranges` present through the fault path
    /// ([`FaultHandler::resolve_range`]: each missing page is decided and fixed as a fault
    /// would be), after evicting enough other pages to have the frames. Returns the pages
    /// mapped.
    fn revalidate(
        &mut self,
        ranges: &[(u64, usize, AccessKind)],
        pinned: &[core::ops::Range<u64>],
    ) -> Result<u64> {
        let mut missing = 0;
        for &(iova, len, _) in ranges {
            missing += pages(iova, len)
                .filter(|&p| self.pager.frame_of(Iova::new(iova_of(p))).is_none())
                .count();
        }
        let (rng, frames) = (&mut self.rng, self.pager.frame_count() as u64);
        self.pager.ensure_free(
            missing,
            || rng.below(frames) as usize,
            pinned,
            &mut self.table,
            &mut self.smmu.tlb(ASID),
        )?;
        let smmu = self.smmu.smmu_id();
        let mut mapped = 0;
        for &(start, len, access) in ranges {
            let range = InFlightAccess {
                stream: self.stream,
                start: Iova::new(start),
                len: len as u64,
            };
            let config = self.smmu.stream_fault_config(self.stream);
            let done = self.handler.resolve_range(
                smmu,
                &range,
                access,
                &config,
                &mut self.pager,
                &mut self.table,
                &mut self.smmu.tlb(ASID),
            )?;
            if let Some(e) = done.abort {
                return Err(e.into());
            }
            mapped += u64::from(done.mapped);
        }
        Ok(mapped)
    }

    /// One copy A -> edu buffer -> B, retransmitting until neither transfer faults.
    fn copy(&mut self, a: u64, b: u64, len: usize) -> Result<()> {
        let pinned = [page_span(a, len), page_span(b, len)];
        let mut need_read = true;
        self.report.transfers += 2;
        for attempt in 0..MAX_ATTEMPTS {
            let again = attempt > 0;
            if need_read {
                self.dma(Direction::ToDevice, a, len, again)?;
            }
            self.dma(Direction::ToMemory, b, len, again)?;
            // On silicon this makes the records of terminated transactions visible (§4.7.3).
            self.smmu.sync()?;
            let (faults, lost) = self.collect_faults(a, b, len)?;
            if lost {
                // Records are missing: both transfers are suspect. Fix what the records
                // named, re-validate every page of both, retransmit both.
                self.report.overflow_recoveries += 1;
                self.report.faults += self.service(&faults, &pinned)?;
                let both = [(a, len, AccessKind::Read), (b, len, AccessKind::Write)];
                self.report.revalidated_pages += self.revalidate(&both, &pinned)?;
                need_read = true;
                continue;
            }
            if faults.is_empty() {
                return Ok(());
            }
            need_read = faults.iter().any(|f| f.record.access == AccessKind::Read);
            self.report.faults += self.service(&faults, &pinned)?;
        }
        Err(FirmwareError::RetransmitLimit {
            iova: b,
            attempts: MAX_ATTEMPTS,
        })
    }

    /// The CPU's copy of the same operation.
    fn reference_copy(&mut self, a: u64, b: u64, len: usize) {
        let from = (a - WINDOW_BASE) as usize;
        let to = (b - WINDOW_BASE) as usize;
        self.reference.copy_within(from..from + len, to);
    }

    /// Compares every page with the reference.
    fn verify(&mut self) -> Result<()> {
        let mut buf = PageBuf([0; PAGE]);
        let buf = &mut buf.0;
        for page in 0..WINDOW_PAGES {
            self.pager.read(Iova::new(iova_of(page)), buf)?;
            let want = self
                .reference
                .get(page * PAGE..(page + 1) * PAGE)
                .ok_or(FirmwareError::PagerExhausted)?;
            // Whole-page comparison first (memcmp); count bytes only on a mismatch.
            if buf[..] != *want {
                let differ = buf.iter().zip(want).filter(|(x, y)| x != y).count() as u64;
                self.report.mismatched_pages += 1;
                self.report.mismatched_bytes += differ;
                let _ = self.mismatched.push(page);
            }
        }
        Ok(())
    }

    fn make_resident(&mut self, page: usize) -> Result<()> {
        let tlb = &mut self.smmu.tlb(ASID);
        self.pager
            .map_now(Iova::new(iova_of(page)), &mut self.table, tlb)?;
        Ok(())
    }

    /// Two disjoint random ranges of `len` bytes in the window.
    fn pick_ranges(&mut self, len: usize) -> (u64, u64) {
        let span = (WINDOW_BYTES - len) as u64 + 1;
        let a = WINDOW_BASE + self.rng.below(span);
        loop {
            let b = WINDOW_BASE + self.rng.below(span);
            if b + len as u64 <= a || a + len as u64 <= b {
                return (a, b);
            }
        }
    }
}

/// Proves command-queue error recovery: an illegal opcode must come back as
/// [`SmmuError::CommandRejected`] and the queue must work afterwards.
fn check_command_error<B, M, D>(smmu: &mut Smmuv3<'_, B, M, D>) -> Result<u64>
where
    B: RegisterBus + ?Sized,
    M: Deref<Target: DmaMemory>,
    D: DelayNs,
{
    // 0x99 is no architected opcode (IHI0070 §4.1.1): CERROR_ILL.
    smmu.submit_raw([0x99, 0])?;
    let recovered = match smmu.sync() {
        Err(SmmuError::CommandRejected { opcode: 0x99, .. }) => 1,
        Err(e) => return Err(e.into()),
        Ok(()) => 0,
    };
    smmu.sync()?;
    Ok(recovered)
}

/// A progress line of [`run_scenario`]. The target logs it through defmt (`defmt::Format`);
/// its [`fmt::Display`] is the same line as text, for host tests. Keep the two wordings alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScenarioLine {
    /// The SMMU is up and the window's table initialised.
    Up {
        /// Scenario name.
        scenario: &'static str,
    },
    /// The pages resident at the start are in place.
    Resident {
        /// Scenario name.
        scenario: &'static str,
        /// Pages made resident.
        pages: usize,
        /// Frames left free.
        free_frames: usize,
    },
    /// Every 200 copies.
    Progress {
        /// Scenario name.
        scenario: &'static str,
        /// Copies done.
        copies: u32,
        /// Faults so far.
        faults: u64,
        /// Event records so far.
        events: u64,
    },
    /// The copies are done; the window is compared with the reference.
    Verifying {
        /// Scenario name.
        scenario: &'static str,
    },
}

impl fmt::Display for ScenarioLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScenarioLine::Up { scenario } => {
                write!(f, "  {scenario}: SMMU up, window initialised")
            }
            ScenarioLine::Resident {
                scenario,
                pages,
                free_frames,
            } => write!(
                f,
                "  {scenario}: {pages} pages resident, {free_frames} frames free"
            ),
            ScenarioLine::Progress {
                scenario,
                copies,
                faults,
                events,
            } => write!(
                f,
                "  {scenario}: {copies} copies, {faults} faults, {events} events so far"
            ),
            ScenarioLine::Verifying { scenario } => {
                write!(f, "  {scenario}: copies done, verifying")
            }
        }
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for ScenarioLine {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            ScenarioLine::Up { scenario } => {
                defmt::write!(f, "  {=str}: SMMU up, window initialised", scenario)
            }
            ScenarioLine::Resident {
                scenario,
                pages,
                free_frames,
            } => defmt::write!(
                f,
                "  {=str}: {=usize} pages resident, {=usize} frames free",
                scenario,
                pages,
                free_frames
            ),
            ScenarioLine::Progress {
                scenario,
                copies,
                faults,
                events,
            } => defmt::write!(
                f,
                "  {=str}: {=u32} copies, {=u64} faults, {=u64} events so far",
                scenario,
                copies,
                faults,
                events
            ),
            ScenarioLine::Verifying { scenario } => {
                defmt::write!(f, "  {=str}: copies done, verifying", scenario)
            }
        }
    }
}

/// Runs a scenario of random copies on `hw`, reporting progress to `log` one
/// [`ScenarioLine`] at a time (defmt on the target; see `firmware::logger::info`).
pub fn run_scenario<B, E, M, D>(
    hw: &mut Hardware<'_, B, E, M, D>,
    bufs: &mut Buffers<'_>,
    scenario: &Scenario,
    log: &mut dyn FnMut(ScenarioLine),
) -> Result<Report>
where
    B: RegisterBus + ?Sized,
    E: RegisterBus + ?Sized,
    M: Deref<Target: DmaMemory> + Clone,
    D: DelayNs + Copy,
{
    if scenario.max_len == 0
        || scenario.max_len > MAX_TRANSFER
        || scenario.resident_at_start > scenario.frames
    {
        return Err(FirmwareError::BadScenario {
            what: "max_len 1..=0xff0 and no more resident pages than frames",
        });
    }
    let dma = hw.dma.clone();
    let mut s = Session::new(
        hw,
        bufs,
        scenario.frames,
        scenario.eventq_log2,
        scenario.seed,
        scenario.name,
    )?;
    log(ScenarioLine::Up {
        scenario: scenario.name,
    });
    if scenario.check_command_error {
        s.report.cmdq_recoveries = check_command_error(&mut s.smmu)?;
    }
    let mut placed = 0;
    while placed < scenario.resident_at_start {
        let page = s.rng.below(WINDOW_PAGES as u64) as usize;
        if s.pager.frame_of(Iova::new(iova_of(page))).is_none() {
            s.make_resident(page)?;
            placed += 1;
        }
    }
    log(ScenarioLine::Resident {
        scenario: scenario.name,
        pages: scenario.resident_at_start,
        free_frames: s.pager.free_frames(),
    });
    for copy in 0..scenario.copies {
        let evictions = s.rng.below(u64::from(scenario.max_evictions) + 1);
        for _ in 0..evictions {
            let tlb = &mut s.smmu.tlb(ASID);
            let start = s.rng.below(s.pager.frame_count() as u64) as usize;
            s.pager.evict_any(start, &[], &mut s.table, tlb)?;
        }
        let len = 1 + s.rng.below(scenario.max_len as u64) as usize;
        let (a, b) = s.pick_ranges(len);
        s.copy(a, b, len)?;
        s.reference_copy(a, b, len);
        s.report.copies += 1;
        if (copy + 1) % 200 == 0 {
            log(ScenarioLine::Progress {
                scenario: scenario.name,
                copies: copy + 1,
                faults: s.report.faults,
                events: s.report.events,
            });
        }
    }
    log(ScenarioLine::Verifying {
        scenario: scenario.name,
    });
    s.verify()?;
    s.finish(&dma)
}

/// The result of [`run_stale_tlb_probe`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaleTlbReport {
    /// With the TLB invalidation: of its two pages (P, Q), how many differ at the end
    /// (must be 0).
    pub control_mismatched_pages: u64,
    /// With the invalidation: write faults the second copy into the evicted page took
    /// (must be > 0: the SMMU saw the page unmapped).
    pub control_write_faults: u64,
    /// Without the invalidation: of its two pages, how many differ at the end (must be > 0:
    /// detected).
    pub stale_mismatched_pages: u64,
    /// Without the invalidation: write faults of the second copy (0: the SMMU used the
    /// stale translation and nothing reported it).
    pub stale_write_faults: u64,
    /// Without the invalidation: the page faulted in after the eviction got the evicted
    /// page's frame (what makes the stale write land in another page's data).
    pub frame_reused: bool,
    /// Pages other than the four that differ (must be 0).
    pub other_mismatched_pages: u64,
}

impl StaleTlbReport {
    /// The control run is exact and the run without invalidation was caught by the check.
    pub fn detected(&self) -> bool {
        self.control_mismatched_pages == 0
            && self.control_write_faults > 0
            && self.stale_mismatched_pages > 0
            && self.stale_write_faults == 0
            && self.frame_reused
            && self.other_mismatched_pages == 0
    }
}

impl fmt::Display for StaleTlbReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "with TLBI: {} of 2 pages differ, {} write faults; without TLBI: {} of 2 pages \
             differ, {} write faults, frame reused: {}; other pages differing: {}",
            self.control_mismatched_pages,
            self.control_write_faults,
            self.stale_mismatched_pages,
            self.stale_write_faults,
            self.frame_reused,
            self.other_mismatched_pages
        )
    }
}

/// The same line as [`fmt::Display`]'s, for defmt.
#[cfg(target_os = "none")]
impl defmt::Format for StaleTlbReport {
    fn format(&self, f: defmt::Formatter<'_>) {
        defmt::write!(
            f,
            "with TLBI: {=u64} of 2 pages differ, {=u64} write faults; without TLBI: {=u64} of 2 \
             pages differ, {=u64} write faults, frame reused: {=bool}; other pages differing: \
             {=u64}",
            self.control_mismatched_pages,
            self.control_write_faults,
            self.stale_mismatched_pages,
            self.stale_write_faults,
            self.frame_reused,
            self.other_mismatched_pages
        )
    }
}

/// Page P is written by DMA (so the SMMU caches its translation), evicted, its frame handed
/// to page Q, and written again by DMA. With the TLB invalidation the second write faults,
/// P is brought back and the data is exact; without it the SMMU writes through its stale
/// translation into Q's frame, no event says so, and the final comparison must find P's new
/// data missing and Q corrupted. Both variants run in one session on different pages.
pub fn run_stale_tlb_probe<B, E, M, D>(
    hw: &mut Hardware<'_, B, E, M, D>,
    bufs: &mut Buffers<'_>,
) -> Result<StaleTlbReport>
where
    B: RegisterBus + ?Sized,
    E: RegisterBus + ?Sized,
    M: Deref<Target: DmaMemory> + Clone,
    D: DelayNs + Copy,
{
    const SOURCES: [usize; 2] = [300, 301];
    const LEN: usize = MAX_TRANSFER;
    // (P, Q, invalidate on eviction)
    const RUNS: [(usize, usize, bool); 2] = [(100, 200, true), (110, 210, false)];
    let dma = hw.dma.clone();
    let mut report = StaleTlbReport::default();
    let mut s = Session::new(hw, bufs, 16, 12, 0x5eed_0003, "stale-tlb")?;
    for page in SOURCES {
        s.make_resident(page)?;
    }
    for (p, q, invalidate) in RUNS {
        // 1. Write P by DMA: it faults in, and the retransmitted write is cached.
        s.copy(iova_of(SOURCES[0]), iova_of(p), LEN)?;
        s.reference_copy(iova_of(SOURCES[0]), iova_of(p), LEN);
        let frame_of_p = s.pager.frame_of(Iova::new(iova_of(p)));
        // 2. Evict P, with or without the invalidation (the probe's deliberate mistake is a
        //    TLB maintenance that does nothing).
        if invalidate {
            let tlb = &mut s.smmu.tlb(ASID);
            s.pager.evict(Iova::new(iova_of(p)), &mut s.table, tlb)?;
        } else {
            s.pager
                .evict(Iova::new(iova_of(p)), &mut s.table, &mut NoInvalidation)?;
        }
        // 3. Q faults in and gets P's old frame (the free list is a stack).
        s.revalidate(&[(iova_of(q), PAGE, AccessKind::Write)], &[])?;
        let reused = frame_of_p.is_some() && s.pager.frame_of(Iova::new(iova_of(q))) == frame_of_p;
        // 4. Write P again by DMA.
        let before = s.report.fault_records;
        s.copy(iova_of(SOURCES[1]), iova_of(p), LEN)?;
        s.reference_copy(iova_of(SOURCES[1]), iova_of(p), LEN);
        let write_faults = s.report.fault_records - before;
        if invalidate {
            report.control_write_faults = write_faults;
        } else {
            report.stale_write_faults = write_faults;
            report.frame_reused = reused;
        }
    }
    // 5. The check.
    s.verify()?;
    for page in s.mismatched.iter() {
        match RUNS.iter().find(|(p, q, _)| p == page || q == page) {
            Some((_, _, true)) => report.control_mismatched_pages += 1,
            Some((_, _, false)) => report.stale_mismatched_pages += 1,
            None => report.other_mismatched_pages += 1,
        }
    }
    s.finish(&dma)?;
    Ok(report)
}

#[cfg(test)]
mod tests;
