//! SMMUv3 driver (IHI0070), as QEMU 7.2's `virt` SMMUv3 needs it and as silicon would: stage-1
//! streams with one context descriptor each, a linear stream table, a polled command queue
//! and an event queue consumer that feeds the shared fault path.
//!
//! What it does, and the sources it follows (register detail in [`regs`]):
//!
//! - **Probe** ([`Smmuv3::probe`]): IDR0/1/3/5 and AIDR into [`Capabilities`], refusing an SMMU
//!   without stage 1, AArch64 tables, the 4 KiB granule or little-endian walks, or with
//!   preset table/queue bases. Per stream, [`Smmuv3::attach`] refuses what the stall model
//!   forbids (stall where IDR0.STALL_MODEL is terminate-only, terminate where it is
//!   stall-forced), stalling a stream that is not stall-tolerant, ASIDs beyond IDR0.ASID16
//!   and StreamIDs beyond the table.
//! - **Reset** ([`Smmuv3::new`]): the order of Linux `arm_smmu_device_reset`:
//!   disable (GBPA.ABORT while doing so), every STE set to abort, CR1/CR2, stream table
//!   base, command queue, CMDQEN, CMD_CFGI_ALL + CMD_TLBI_NSNH_ALL + CMD_SYNC, event queue,
//!   EVENTQEN, IRQ_CTRL = 0 (the driver polls), stale global errors acknowledged, SMMUEN.
//!   Every CR0 / IRQ_CTRL write waits for its ACK register.
//! - **STE and CD** ([`StreamTableEntry`], [`ContextDescriptor`]; §5.2, §5.4): CD.R = 1 (QEMU
//!   drops fault events with R = 0, `decode_cd`), CD.A = 1 (required with TERM_MODEL = 1),
//!   CD.S as the stream asks and the stall model allows, STE.S1STALLD only where it is legal
//!   ([`Capabilities::s1stalld_for`]). A stream goes live as Linux does it (§3.21.3): the
//!   CD first, then STE dwords 1-7 with the STE still aborting, CMD_CFGI_STE + CMD_SYNC, then
//!   dword 0 in one 64-bit store, CMD_CFGI_STE + CMD_SYNC.
//! - **Commands** ([`Command`]; chapter 4): written to the queue, published with a store
//!   barrier (`DmaMemory::sync_for_device`), then CMDQ_PROD. [`Smmuv3::sync`] appends a
//!   CMD_SYNC and polls CMDQ_CONS until the queue is empty, with a timeout
//!   ([`SmmuError::CommandSyncTimeout`]).
//! - **TLB maintenance** ([`AsidTlb`], implementing [`TlbMaintenance`]): one CMD_TLBI_NH_VA
//!   per changed entry (Leaf as reported), or range TLBIs with the TTL level hint when
//!   IDR3.RIL = 1 (§4.4.1.1), or CMD_TLBI_NH_ASID when the list overflowed or would need
//!   more than [`MAX_TLBI_COMMANDS`] commands; then CMD_SYNC.
//! - **Global errors** ([`Smmuv3::handle_global_errors`]; §7.1, §7.5): an error is active
//!   while GERROR\[x\] != GERRORN\[x\]. CMDQ_ERR: the command at CMDQ_CONS.RD is replaced by a
//!   CMD_SYNC (what Linux `arm_smmu_cmdq_skip_err` does), the error is acknowledged by
//!   toggling GERRORN.CMDQ_ERR, which restarts consumption; the caller of the next sync gets
//!   [`SmmuError::CommandRejected`]. EVENTQ_ABT_ERR (which QEMU 7.2 toggles when the event
//!   queue is full and drops a record, `smmuv3_record_event`) and EVENTQ_PROD.OVFLG (the
//!   architectural overflow flag, §7.4) both mean "records were lost": the next
//!   [`DrainSummary::overflow`] says so, and the caller must treat every transfer in flight
//!   as suspect.
//! - **Events** ([`Smmuv3::drain_events`]; §7.3): records are decoded into [`Event`]s (faults
//!   become the shared [`FaultRecord`]); an unknown or malformed record is a typed error
//!   handed to the caller and counted, and the queue moves on.
//! - **Faults** ([`Smmuv3::service_fault`]): the shared [`FaultHandler`] decides; a stalled
//!   transaction that will not be resumed is terminated first (CMD_RESUME abort), the page is
//!   mapped, its invalidations issued and synced, then CMD_RESUME retry or "retransmit".
//!   On QEMU nothing stalls (IDR0.STALL_MODEL = 0b01): every fault ends in a retransmission.
//!
//! Files: this one holds the driver's state, probe, reset and shutdown; `cmdq` the command
//! queue and global errors, `tlb` TLB maintenance, `stream_table` streams, STEs and CDs,
//! `eventq` the event queue, `fault_path` stalls and the fault service; `cmd`, `event`, `ste`
//! the records, `regs` the registers, `caps` the ID registers, `queue` the rings.

mod caps;
pub mod cmd;
mod cmdq;
pub mod event;
mod eventq;
mod fault_path;
#[cfg(any(test, feature = "model"))]
pub mod model;
mod queue;
pub mod regs;
mod ste;
mod stream_table;
#[cfg(test)]
mod tests;
mod tlb;

use core::ops::Deref;

use hal::PhysAddr;
use hal::barrier::Barrier;
use hal::delay::DelayNs;
use hal::dma::{DmaDirection, DmaMemory};
use hal::regs::RegisterBus;
use tock_registers::interfaces::{Readable, Writeable};

pub use caps::{Capabilities, IdRegisters, StallModel, ips_encoding, oas_bits};
pub use cmd::{Command, ResumeAction, SyncSignal, TlbiRange};
pub use event::{EVENT_BYTES, Event, TlbConflict, tlb_conflict};
pub use queue::{AlignedDma, Ring};
pub use ste::{
    CdConfig, CdDword0, CdDword1, ContextDescriptor, STRUCT_BYTES, SteDword0, SteDword1,
    StreamMode, StreamTableEntry, WalkAttributes,
};
pub use tlb::AsidTlb;

use crate::fault::{
    FaultControl, FaultHandler, FaultOutcome, FaultPolicy, FaultRecord, FaultResolver, FaultSource,
    SmmuFlavour, SmmuId, StallTag, StreamFaultConfig, StreamId, TakenFault,
};
use crate::pagetable::{Invalidations, PageTable, STANDARD_MAIR, TlbMaintenance};
use crate::{Result, SmmuError};
use regs::{CR0, CR1, CR2, GBPA, GERROR, QUEUE_BASE, STRTAB_BASE, STRTAB_BASE_CFG, Smmuv3Regs};

/// Bytes per command.
pub const CMD_BYTES: usize = 16;
/// Most streams one driver instance attaches.
pub const MAX_STREAMS: usize = 8;
/// Above this many CMD_TLBI_NH_VA for one invalidation list, one CMD_TLBI_NH_ASID is used
/// instead.
pub const MAX_TLBI_COMMANDS: u64 = 32;
/// GERROR bits the driver knows (CMDQ_ERR, EVENTQ/PRIQ_ABT_ERR, the MSI aborts, SFM_ERR).
const GERROR_KNOWN: u32 = 0x1fd;

/// Driver settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Smmuv3Config {
    /// log2 of the number of STEs in the linear stream table (StreamIDs at or above `1 <<
    /// stream_table_log2` are refused by `attach` and get C_BAD_STREAMID on the SMMU).
    pub stream_table_log2: u8,
    /// log2 of the command queue entries (1..=IDR1.CMDQS).
    pub cmdq_log2: u8,
    /// log2 of the event queue entries (0..=IDR1.EVENTQS). QEMU writes one record per
    /// 4 bytes of a faulting DMA (docs/smmu-driver.md, "QEMU 7.2 behaviour"), so size it
    /// generously (>= 11).
    pub eventq_log2: u8,
    /// How long a CMD_SYNC (or a full queue) may take.
    pub sync_timeout_us: u64,
    /// How long CR0ACK / IRQ_CTRLACK may take.
    pub ack_timeout_us: u64,
    /// Polling interval.
    pub poll_interval_us: u32,
    /// Instance number reported in fault records.
    pub instance: u8,
}

impl Default for Smmuv3Config {
    fn default() -> Self {
        Self {
            stream_table_log2: 6,
            cmdq_log2: 8,
            eventq_log2: 12,
            sync_timeout_us: 1_000_000,
            ack_timeout_us: 100_000,
            poll_interval_us: 1,
            instance: 0,
        }
    }
}

/// A stage-1 context for one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// ASID.
    pub asid: u16,
    /// Table root (`PageTable::root()`).
    pub ttb0: PhysAddr,
    /// Input address bits of the table (48 for `PageTable`).
    pub input_bits: u8,
    /// Output address bits of the table; the CD gets min(this, IDR5.OAS).
    pub output_bits: u8,
    /// MAIR matching the table's AttrIndx values.
    pub mair: u64,
    /// Stall faulting transactions (CD.S); refused where the stall model forbids it.
    pub stall_on_fault: bool,
    /// The master tolerates stalls. PCIe never does (IHI0070 §3.12.1): then STE.S1STALLD is
    /// set where the SMMU would otherwise let a CD stall.
    pub stall_tolerant: bool,
    /// How long a stall of this stream may last (ns): the fault policy resumes only faults
    /// expected to resolve within it. Ignored unless `stall_tolerant`.
    pub stall_budget_ns: u64,
}

impl ContextConfig {
    /// The fault configuration the stream declares with this context.
    pub fn fault_config(&self) -> StreamFaultConfig {
        if self.stall_tolerant {
            StreamFaultConfig::stall_tolerant(self.stall_budget_ns)
        } else {
            StreamFaultConfig::NEVER_STALL
        }
    }

    /// A terminate-model context for `table` with [`STANDARD_MAIR`], for a stream that must
    /// not stall (PCIe).
    pub fn for_table<T: Deref<Target: DmaMemory>>(asid: u16, table: &PageTable<T>) -> Self {
        let walk = table.walk_config();
        ContextConfig {
            asid,
            ttb0: table.root(),
            input_bits: walk.input_bits(),
            output_bits: walk.output_bits(),
            mair: STANDARD_MAIR,
            stall_on_fault: false,
            stall_tolerant: false,
            stall_budget_ns: 0,
        }
    }
}

/// Counters for logs and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Smmuv3Stats {
    /// Commands written (CMD_SYNC included).
    pub commands: u64,
    /// CMD_SYNCs waited for.
    pub syncs: u64,
    /// CMD_TLBI_NH_VA commands.
    pub tlbi_va: u64,
    /// CMD_TLBI_NH_ASID commands.
    pub tlbi_asid: u64,
    /// Commands the SMMU rejected (CMDQ_ERR recoveries).
    pub cmdq_errors: u64,
    /// Event records consumed.
    pub events: u64,
    /// Records decoded into fault records.
    pub fault_events: u64,
    /// Configuration and implementation-defined records.
    pub other_events: u64,
    /// Records with an unknown EventID.
    pub unknown_events: u64,
    /// Records whose fields made no sense.
    pub malformed_events: u64,
    /// Event-queue overflows seen (GERROR.EVENTQ_ABT_ERR or EVENTQ_PROD.OVFLG).
    pub overflows: u64,
    /// Other global errors acknowledged (MSI aborts, SFM).
    pub other_global_errors: u64,
}

/// What one [`Smmuv3::drain_events`] call consumed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainSummary {
    /// Records consumed.
    pub records: u32,
    /// Of those, fault records.
    pub faults: u32,
    /// Of those, unknown or malformed ones (handed to the caller as errors).
    pub rejected: u32,
    /// Records were lost since the last drain: every transfer in flight is suspect.
    pub overflow: bool,
}

/// Global errors found active (and acknowledged) by [`Smmuv3::handle_global_errors`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GlobalErrors {
    /// The GERROR bits that were active.
    pub active: u32,
    /// The rejected command, for CMDQ_ERR.
    pub command: Option<SmmuError>,
    /// Event records were lost (EVENTQ_ABT_ERR).
    pub events_lost: bool,
}

#[derive(Debug)]
struct Attached {
    stream: StreamId,
    asid: u16,
    /// What the context translates with (TTB0, input and output sizes, MAIR): streams may
    /// share an ASID only when these agree.
    translation: (PhysAddr, u8, u8, u64),
    cd: AlignedDma,
    /// Its CD asks to stall faulting transactions (CD.S).
    stalls: bool,
    /// What the stream declared about faults.
    fault: StreamFaultConfig,
}

/// An SMMUv3 with its stream table and queues.
///
/// Dropping it without [`shutdown`](Self::shutdown) leaves the SMMU running and its memory
/// allocated (never freed under the SMMU's feet).
pub struct Smmuv3<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> {
    regs: Smmuv3Regs<'a, B>,
    dma: M,
    delay: D,
    caps: Capabilities,
    config: Smmuv3Config,
    strtab: AlignedDma,
    cmdq: AlignedDma,
    cmdq_ring: Ring,
    cmdq_prod: u32,
    cmdq_cons: u32,
    eventq: AlignedDma,
    eventq_ring: Ring,
    eventq_cons: u32,
    overflow_ack: u32,
    gerrorn: u32,
    events_lost: bool,
    command_error: Option<SmmuError>,
    streams: [Option<Attached>; MAX_STREAMS],
    stats: Smmuv3Stats,
}

impl<B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> core::fmt::Debug
    for Smmuv3<'_, B, M, D>
{
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Smmuv3")
            .field("caps", &self.caps)
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish()
    }
}

impl<'a, B: RegisterBus + ?Sized, M: Deref<Target: DmaMemory>, D: DelayNs> Smmuv3<'a, B, M, D> {
    /// Reads and decodes the identification registers of the SMMU on `bus`.
    pub fn probe(bus: &'a B) -> Result<Capabilities> {
        let regs = Smmuv3Regs::new(bus, 0)?;
        Capabilities::decode(IdRegisters {
            idr0: regs.idr0().get(),
            idr1: regs.idr1().get(),
            idr3: regs.idr3().get(),
            idr5: regs.idr5().get(),
            aidr: regs.aidr().get(),
        })
    }

    /// Probes, allocates the stream table and queues from `dma`, resets and enables the SMMU
    /// (every stream aborting until [`attach`](Self::attach)).
    pub fn new(bus: &'a B, dma: M, delay: D, config: Smmuv3Config) -> Result<Self> {
        let caps = Self::probe(bus)?;
        let regs = Smmuv3Regs::new(bus, 0)?;
        if config.stream_table_log2 > caps.sid_bits.min(16) {
            return Err(SmmuError::InvalidConfig {
                what: "stream table larger than IDR1.SIDSIZE (or 2^16 STEs)",
            });
        }
        if config.cmdq_log2 == 0 || config.cmdq_log2 > caps.cmdq_log2_max {
            return Err(SmmuError::InvalidConfig {
                what: "command queue size must be 2..=2^IDR1.CMDQS entries",
            });
        }
        if config.eventq_log2 > caps.eventq_log2_max {
            return Err(SmmuError::InvalidConfig {
                what: "event queue larger than 2^IDR1.EVENTQS entries",
            });
        }
        let cmdq_ring = Ring::new(config.cmdq_log2)?;
        let eventq_ring = Ring::new(config.eventq_log2)?;
        let strtab_bytes = STRUCT_BYTES << config.stream_table_log2;
        // Queues: aligned to their size, at least 32 bytes (§6.3.26); QEMU masks bits [5:0]
        // of the base (its `SMMU_BASE_ADDR_MASK`), so 64.
        let cmdq_bytes = CMD_BYTES << config.cmdq_log2;
        let eventq_bytes = EVENT_BYTES << config.eventq_log2;
        let strtab = AlignedDma::new(&dma, strtab_bytes, strtab_bytes, DmaDirection::ToDevice)?;
        let cmdq =
            match AlignedDma::new(&dma, cmdq_bytes, cmdq_bytes.max(64), DmaDirection::ToDevice) {
                Ok(q) => q,
                Err(e) => {
                    let _ = strtab.free(&dma);
                    return Err(e);
                }
            };
        let eventq = match AlignedDma::new(
            &dma,
            eventq_bytes,
            eventq_bytes.max(64),
            DmaDirection::FromDevice,
        ) {
            Ok(q) => q,
            Err(e) => {
                let _ = strtab.free(&dma);
                let _ = cmdq.free(&dma);
                return Err(e);
            }
        };
        let mut smmu = Smmuv3 {
            regs,
            dma,
            delay,
            caps,
            config,
            strtab,
            cmdq,
            cmdq_ring,
            cmdq_prod: 0,
            cmdq_cons: 0,
            eventq,
            eventq_ring,
            eventq_cons: 0,
            overflow_ack: 0,
            gerrorn: 0,
            events_lost: false,
            command_error: None,
            streams: [const { None }; MAX_STREAMS],
            stats: Smmuv3Stats::default(),
        };
        if let Err(e) = smmu.reset() {
            // Best effort: leave it disabled before giving the memory back.
            let _ = smmu.shutdown();
            return Err(e);
        }
        Ok(smmu)
    }

    /// The capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The settings.
    pub fn config(&self) -> &Smmuv3Config {
        &self.config
    }

    /// The counters.
    pub fn stats(&self) -> &Smmuv3Stats {
        &self.stats
    }

    /// Bus address of the stream table.
    pub fn stream_table(&self) -> PhysAddr {
        self.strtab.bus()
    }

    /// The identity this driver puts in its fault records.
    pub fn smmu_id(&self) -> SmmuId {
        SmmuId {
            flavour: SmmuFlavour::V3,
            instance: self.config.instance,
        }
    }

    /// What `stream` declared about faults when it was attached
    /// ([`StreamFaultConfig::NEVER_STALL`] for a stream that is not attached).
    pub fn stream_fault_config(&self, stream: StreamId) -> StreamFaultConfig {
        self.streams
            .iter()
            .flatten()
            .find(|a| a.stream == stream)
            .map_or(StreamFaultConfig::NEVER_STALL, |a| a.fault)
    }

    /// The ASID `stream` was attached with.
    pub fn asid_of(&self, stream: StreamId) -> Result<u16> {
        self.streams
            .iter()
            .flatten()
            .find(|a| a.stream == stream)
            .map(|a| a.asid)
            .ok_or(SmmuError::StreamNotAttached { stream: stream.0 })
    }

    fn write_cr0(&mut self, value: u32) -> Result<()> {
        self.regs.cr0().set(value);
        let regs = self.regs;
        self.wait_for("CR0ACK", || regs.cr0ack().get() == value)
    }

    fn write_irq_ctrl(&mut self, value: u32) -> Result<()> {
        self.regs.irq_ctrl().set(value);
        let regs = self.regs;
        self.wait_for("IRQ_CTRLACK", || regs.irq_ctrlack().get() == value)
    }

    fn wait_for(&mut self, register: &'static str, mut done: impl FnMut() -> bool) -> Result<()> {
        let mut waited = 0u64;
        loop {
            if done() {
                return Ok(());
            }
            if waited >= self.config.ack_timeout_us {
                return Err(SmmuError::AckTimeout { register });
            }
            self.delay.delay_us(self.config.poll_interval_us.max(1));
            waited += u64::from(self.config.poll_interval_us.max(1));
        }
    }

    fn write_ste(
        &self,
        stream: u32,
        ste: &StreamTableEntry,
        dwords: core::ops::Range<usize>,
    ) -> Result<()> {
        let base = stream as usize * STRUCT_BYTES;
        for i in dwords {
            let value = ste.0.get(i).copied().unwrap_or(0);
            self.strtab.write_u64(base + i * 8, value)?;
        }
        Ok(())
    }

    fn reset(&mut self) -> Result<()> {
        let cr0 = self.regs.cr0().get();
        if cr0 & CR0::SMMUEN::SET.value != 0 {
            // Abort incoming traffic while the SMMU is reconfigured (Linux does the same).
            // GBPA is not modelled by QEMU 7.2 (it reads 0, so UPDATE is "done" at once).
            self.regs.gbpa().write(GBPA::ABORT::SET + GBPA::UPDATE::SET);
            let regs = self.regs;
            self.wait_for("GBPA", || !regs.gbpa().is_set(GBPA::UPDATE))?;
        }
        self.write_cr0(0)?;

        let abort = StreamTableEntry::abort();
        for stream in 0..(1u32 << self.config.stream_table_log2) {
            self.write_ste(stream, &abort, 0..8)?;
        }
        self.dma.sync_for_device(self.strtab.region());

        // The same attributes as the STEs' CD fetches and the CDs' table walks.
        let walk = WalkAttributes::new(self.caps.coherent);
        let (cache, shareable) = (walk.cache as u32, walk.shareability as u32);
        self.regs.cr1().write(
            CR1::QUEUE_IC.val(cache)
                + CR1::QUEUE_OC.val(cache)
                + CR1::QUEUE_SH.val(shareable)
                + CR1::TABLE_IC.val(cache)
                + CR1::TABLE_OC.val(cache)
                + CR1::TABLE_SH.val(shareable),
        );
        self.regs.cr2().write(CR2::RECINVSID::SET + CR2::PTM::SET);
        self.regs
            .strtab_base()
            .write(STRTAB_BASE::RA::SET + STRTAB_BASE::ADDR.val(self.strtab.bus().as_u64() >> 6));
        self.regs.strtab_base_cfg().write(
            STRTAB_BASE_CFG::FMT::Linear
                + STRTAB_BASE_CFG::LOG2SIZE.val(u32::from(self.config.stream_table_log2)),
        );
        self.regs.cmdq_base().write(
            QUEUE_BASE::ALLOCATE::SET
                + QUEUE_BASE::ADDR.val(self.cmdq.bus().as_u64() >> 5)
                + QUEUE_BASE::LOG2SIZE.val(u64::from(self.config.cmdq_log2)),
        );
        self.regs.cmdq_prod().set(0);
        self.regs.cmdq_cons().set(0);
        self.cmdq_prod = 0;
        self.cmdq_cons = 0;
        self.write_cr0(CR0::CMDQEN::SET.value)?;

        // Nothing cached from before may survive (§3.21: configuration and TLB caches).
        self.push(Command::CfgiAll.encode())?;
        self.push(Command::TlbiNsnhAll.encode())?;
        self.sync()?;

        self.regs.eventq_base().write(
            QUEUE_BASE::ALLOCATE::SET
                + QUEUE_BASE::ADDR.val(self.eventq.bus().as_u64() >> 5)
                + QUEUE_BASE::LOG2SIZE.val(u64::from(self.config.eventq_log2)),
        );
        self.regs.eventq_prod().set(0);
        self.regs.eventq_cons().set(0);
        self.eventq_cons = 0;
        self.overflow_ack = 0;
        self.write_cr0(CR0::CMDQEN::SET.value | CR0::EVENTQEN::SET.value)?;

        // The driver polls; QEMU only pulses lines whose enable is set (`smmuv3_trigger_irq`).
        self.write_irq_ctrl(0)?;

        // Acknowledge whatever was active before us: toggling GERRORN to GERROR only touches
        // active errors (§6.3.20).
        self.gerrorn = self.regs.gerror().get() & GERROR_KNOWN;
        self.regs.gerrorn().set(self.gerrorn);
        self.events_lost = false;
        self.command_error = None;

        self.write_cr0(CR0::CMDQEN::SET.value | CR0::EVENTQEN::SET.value | CR0::SMMUEN::SET.value)
    }

    /// Disables the SMMU (every transaction then bypasses or aborts per GBPA) and returns the
    /// stream table, queues and CDs to the allocator.
    pub fn shutdown(mut self) -> Result<()> {
        let disabled = self.write_cr0(0);
        if disabled.is_ok() {
            let Smmuv3 {
                dma,
                strtab,
                cmdq,
                eventq,
                streams,
                ..
            } = self;
            strtab.free(&dma)?;
            cmdq.free(&dma)?;
            eventq.free(&dma)?;
            for attached in streams.into_iter().flatten() {
                attached.cd.free(&dma)?;
            }
        }
        disabled
    }
}
