//! Two RTL engines on one ZynqMP, driven by the unchanged NPE driver (`dma_engine::npe::Npe`)
//! over [`CosimBus`], their data ports behind sim's MMU-500 model that the SMMUv2 driver
//! programs, faults answered by the shared fault service (`FaultHandler::service_pending`).
//!
//! The board is `boards::zynqmp::pl::ZCU102_PL`: engine *i* is `npes[i]`, its data port's
//! streams are `npes[i].stream_of(pdid, write)` (its PL port's stream base, AXI ID = PDID,
//! bit 5 for writes: docs/dma-engine.md §3). Both engines share the MPSoC's DRAM and its one
//! MMU-500, and their link streams are connected to each other (node *i* is coordinate *i*).
//! Each engine's queue master has a PL port of its own (`npes[i].queue_port`); its one stream
//! goes through the MMU-500 too, matched to a bypass: rings are pinned kernel memory.
//!
//! - **Memory.** One process address space: one stage-1 table (`PageTable`) in the DRAM,
//!   four context banks over it (each engine's read streams, each engine's write streams:
//!   a stalled read and a stalled write never wait for each other's RESUME), stall or
//!   terminate per bank as [`FaultModes`] says. User buffers are regions of the board's
//!   pager (`boards::pager::Pager`, the bare-metal programs' pager) registered for the stream
//!   that reaches them; a page starts absent (a DMA fault on it is major), resident but
//!   unmapped (minor) or mapped. Nothing is mapped that a fault did not ask for.
//! - **Faults.** The SMMU records them in its context banks; [`Board::poll`] takes and
//!   services them with `FaultHandler::service_pending` (policy `StandardPolicy::Hybrid`:
//!   a stalled minor fault within the stream's budget is resumed, anything else terminated
//!   and its page made present; outside every region, aborted). The NPE driver learns of a
//!   terminated access from its engine and asks the node ([`NpeHost`]) for a resolution;
//!   the node answers from the page table once the fault service has run, and resolves the
//!   page through the same fault path itself (`FaultHandler::resolve_range`) when the SMMU
//!   lost the record (FSR.MULTI).
//! - **Time** is the engines' clock (4 ns); the drivers are polled every
//!   [`POLL_EVERY`] clocks, and every register access they make clocks the engines.

use std::sync::{Arc, Mutex, MutexGuard};

use boards::pager::{Fill, Pager, Store};
use boards::zynqmp::pl::{NpeInstance, ZCU102_PL};
use dma_engine::npe::regmap::{DRIVER_DESIGN, DesignId};
use dma_engine::npe::{ChannelConfig, Npe, NpeConfig, PeerConfig, SenderTiming};
use hal::delay::NoDelay;
use hal::dma::HostDma;
use hal::{Iova, PageSize, PhysAddr};
use protocol::{Access, Completion, Delivery, Generation, TransferDesc, TransferId};
use sim::axi::AxiTranslate;
use sim::memory::Memory;
use smmu_driver::SmmuError;
use smmu_driver::fault::{
    FaultHandler, InFlightAccess, SmmuFlavour, SmmuId, StandardPolicy, StreamFaultConfig,
};
use smmu_driver::pagetable::{PageTable, PageTableConfig, TlbMaintenance};
use smmu_driver::v2::{
    ContextBank, ContextConfig, DriverConfig, FaultModel, SmmuV2, StreamMatch, StreamRoute,
};

mod host;

use host::{AllBanks, Host, Request, Tally, Versions, reason_of};

use crate::error::{CosimError, Result};
use crate::mmu500::SharedMmu500;
use crate::system::{CosimBus, PortStreams, System};

/// Hardware channels of the Verilated build (`CAPS.CHANNELS`).
pub const CH: usize = 4;
/// The channel each driver keeps for protocol messages.
pub const CONTROL_CHANNEL: u8 = CH as u8 - 1;
/// Peer slots per driver (slot *i* receives from engine *i*).
pub const PEERS: usize = 2;
/// Transfers open per connection.
pub const WINDOW: usize = 8;
/// Blocks per transfer (transfers up to 32 KiB).
pub const MAX_BLOCKS: usize = 8;
/// Virtual pages the pager can hold (every region of a test).
pub const PAGES: usize = 128;
/// Frames of the pager.
pub const FRAMES: usize = 128;
/// DRAM of the board model, in 4 KiB pages: rings, tables, the pager's store and frames.
pub const DRAM_PAGES: usize = 1024;
/// Clocks between two polls of the drivers.
pub const POLL_EVERY: u64 = 256;
/// Stall budget each engine stream declares (ns): a minor fault (the pager estimates
/// [`MINOR_NS`]) fits, so the Hybrid policy resumes it.
pub const STALL_BUDGET_NS: u64 = 100_000;
/// What the pager estimates a minor fault costs (ns).
pub const MINOR_NS: u64 = 2_000;
/// Clock period (ns).
const CLOCK_NS: u64 = 4;
const PAGE: u64 = 4096;

/// The NPE driver over the co-simulation's register seam.
pub type Driver = Npe<CosimBus, CH, PEERS, WINDOW, MAX_BLOCKS>;
/// The board's pager.
pub type BoardPager<'d> = Pager<'d, 'static, HostDma, PAGES, FRAMES>;
type Smmu = SmmuV2<SharedMmu500, NoDelay>;

/// Sender timing for the co-simulation: the link is a few clocks long, so an ACK that has
/// not come in 200 µs (50,000 clocks) is lost; the rest as [`SenderTiming::DEFAULT`].
pub const TIMING: SenderTiming = SenderTiming {
    ack_timeout: 200_000,
    backoff_initial: 20_000,
    backoff_max: 200_000,
    ..SenderTiming::DEFAULT
};

/// How the context banks treat faults: stall (`SCTLR.CFCFG` = 1) or terminate, for the
/// engines' reads (source) and writes (destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultModes {
    /// Source reads.
    pub read: FaultModel,
    /// Destination writes.
    pub write: FaultModel,
}

impl FaultModes {
    /// Every fault terminated: the engine sees SLVERR, the protocol re-sends.
    pub const TERMINATE: FaultModes = FaultModes {
        read: FaultModel::Terminate,
        write: FaultModel::Terminate,
    };
}

/// A region of user memory as one engine reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// The engine.
    pub engine: usize,
    /// Its protection domain.
    pub pdid: u16,
    /// Reached by the engine's writes (a receive buffer) rather than its reads (a source):
    /// which of its streams the region is registered for.
    pub write: bool,
    /// The fault path may map it writable.
    pub writable: bool,
    /// First byte (page aligned).
    pub base: u64,
    /// Pages.
    pub pages: usize,
}

/// What the fault service did, by decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceCounts {
    /// Records taken from the SMMU.
    pub records: u64,
    /// Stalled transactions resumed after their page was mapped.
    pub resumed: u64,
    /// Transactions terminated (or found terminated) whose page was made present.
    pub retransmit: u64,
    /// Records refused (outside every region, a write to a read-only region).
    pub aborted: u64,
    /// Faults the SMMU reported without a record (FSR.MULTI).
    pub lost: u64,
    /// Driver requests for a page no serviced record had mapped, resolved through
    /// `FaultHandler::resolve_range`.
    pub range_resolutions: u64,
    /// Driver requests answered `page_resolved`.
    pub resolved: u64,
    /// Driver requests answered `page_unresolvable`.
    pub unresolvable: u64,
}

/// The two engines, their drivers, the SMMU and the memory (module documentation).
pub struct Board<'d> {
    sys: Arc<Mutex<System>>,
    dram: &'d HostDma,
    mmu: SharedMmu500,
    smmu: Smmu,
    /// Context banks: engine 0 read, engine 0 write, engine 1 read, engine 1 write.
    banks: [ContextBank; 4],
    table: PageTable<Arc<HostDma>>,
    pager: BoardPager<'d>,
    handler: FaultHandler<StandardPolicy>,
    drivers: Vec<Driver>,
    requests: Vec<Request>,
    versions: Versions,
    completions: [Vec<(u8, Completion)>; 2],
    deliveries: [Vec<(u8, Delivery)>; 2],
    open_peers: [Vec<u8>; 2],
    open_channels: [Vec<u8>; 2],
    counts: ServiceCounts,
}

impl<'d> Board<'d> {
    /// The board on `dram` (at least [`DRAM_PAGES`] pages), with `modes` in every engine's
    /// banks and the memory side holding each handshake on `backpressure` % of the clocks.
    pub fn new(
        dram: &'d Arc<HostDma>,
        modes: FaultModes,
        backpressure: u32,
        seed: u64,
    ) -> Result<Self> {
        Self::with_design(dram, modes, backpressure, seed, DRIVER_DESIGN)
    }

    /// [`new`](Self::new) for a bitstream whose manifest declares `design`: each driver's
    /// probe (`Npe::new`) reads its engine's `ID` and refuses a design that is not its own.
    pub fn with_design(
        dram: &'d Arc<HostDma>,
        modes: FaultModes,
        backpressure: u32,
        seed: u64,
        design: DesignId,
    ) -> Result<Self> {
        let table = PageTable::new(dram.clone(), PageTableConfig::default())?;
        let mmu = SharedMmu500::zynqmp()?;
        let config = DriverConfig {
            implementation: boards::zynqmp::SMMU.implementation,
            ..DriverConfig::DEFAULT
        };
        let mut smmu = SmmuV2::probe(mmu.clone(), NoDelay::default(), config)?;
        smmu.reset()?;
        let mut banks = Vec::with_capacity(4);
        for npe in ZCU102_PL.npes {
            for (write, model) in [(false, modes.read), (true, modes.write)] {
                let cb = smmu.alloc_context(&ContextConfig::new(
                    table.root(),
                    &table.walk_config(),
                    model,
                ))?;
                // Every PDID of the engine's reads (or writes): AXI ID bits 4:0 are ignored.
                let id = u16::try_from(npe.stream_of(0, write).0).map_err(|_| {
                    SmmuError::InvalidConfig {
                        what: "an engine stream wider than 16 bits",
                    }
                })?;
                smmu.attach(
                    StreamMatch { id, mask: 0x1f },
                    StreamRoute::Translate(cb),
                    StreamFaultConfig::stall_tolerant(STALL_BUDGET_NS),
                )?;
                banks.push(cb);
            }
            // The queue master's one stream: rings are pinned kernel memory, reached by bus
            // address (docs/dma-engine.md §3).
            let queue =
                u16::try_from(npe.queue_stream().0).map_err(|_| SmmuError::InvalidConfig {
                    what: "a queue stream wider than 16 bits",
                })?;
            smmu.attach(
                StreamMatch::exact(queue),
                StreamRoute::Bypass,
                StreamFaultConfig::NEVER_STALL,
            )?;
        }
        let banks: [ContextBank; 4] = banks.try_into().map_err(|_| SmmuError::InvalidConfig {
            what: "four context banks",
        })?;
        let ports: Vec<Box<dyn AxiTranslate + Send>> = (0..2)
            .map(|_| Box::new(mmu.port(Memory::new(dram.clone()))) as Box<dyn AxiTranslate + Send>)
            .collect();
        let streams: Vec<PortStreams> = ZCU102_PL
            .npes
            .iter()
            .map(|n| PortStreams {
                data: n.stream_base().0,
                queue: Some(n.queue_stream().0),
            })
            .collect();
        let mut sys = System::with_streams(vec![dram.clone(), dram.clone()], ports, &streams, seed);
        sys.set_backpressure(backpressure);
        let sys = Arc::new(Mutex::new(sys));
        let pager = Pager::new(&**dram, FRAMES, MINOR_NS, Store::Dma)?;
        let mut drivers = Vec::with_capacity(2);
        for node in 0..2u32 {
            let mut cfg = NpeConfig::new(node, CONTROL_CHANNEL);
            cfg.timing = TIMING;
            cfg.design = design;
            drivers.push(Driver::new(
                CosimBus::new(sys.clone(), node as usize),
                &**dram,
                cfg,
            )?);
        }
        Ok(Self {
            sys,
            dram,
            mmu,
            smmu,
            banks,
            table,
            pager,
            handler: FaultHandler::new(StandardPolicy::Hybrid),
            drivers,
            requests: Vec::new(),
            versions: Versions::default(),
            completions: [Vec::new(), Vec::new()],
            deliveries: [Vec::new(), Vec::new()],
            open_peers: [Vec::new(), Vec::new()],
            open_channels: [Vec::new(), Vec::new()],
            counts: ServiceCounts::default(),
        })
    }

    /// Engine `engine`'s place on the board.
    pub fn npe(engine: usize) -> Result<NpeInstance> {
        ZCU102_PL
            .npes
            .get(engine)
            .copied()
            .ok_or(CosimError::NoSuchEngine { engine })
    }

    fn driver_mut(&mut self, engine: usize) -> Result<&mut Driver> {
        self.drivers
            .get_mut(engine)
            .ok_or(CosimError::NoSuchEngine { engine })
    }

    /// Opens data channel `channel` of engine `from` towards engine `to`: source buffers of
    /// protection domain `pdid`, destination buffers of the peer's domain `key`. Engine `to`
    /// accepts the connection in peer slot `from`.
    pub fn connect(
        &mut self,
        from: usize,
        channel: u8,
        pdid: u16,
        to: usize,
        key: u16,
        session: u32,
    ) -> Result<()> {
        Self::npe(to)?;
        let dram = self.dram;
        self.driver_mut(from)?.open_channel(
            dram,
            channel,
            ChannelConfig {
                peer: to as u32,
                pdid,
                peer_key: u32::from(key),
                session,
            },
        )?;
        self.driver_mut(to)?.open_peer(
            from as u8,
            PeerConfig {
                peer: from as u32,
                session,
                pdid: key,
            },
        )?;
        self.open_channels[from].push(channel);
        self.open_peers[to].push(from as u8);
        Ok(())
    }

    /// Registers a region of user memory, filled as `fill` says; its pages start absent.
    pub fn add_region(&mut self, region: &Region, fill: Fill) -> Result<()> {
        let stream = Self::npe(region.engine)?.stream_of(region.pdid, region.write);
        self.pager.add_region(
            stream,
            Iova::new(region.base),
            region.pages,
            region.writable,
            fill,
        )?;
        Ok(())
    }

    /// Writes user memory as the CPU does (whatever the page's residency).
    pub fn write(&mut self, iova: u64, data: &[u8]) -> Result<()> {
        Ok(self.pager.write(Iova::new(iova), data)?)
    }

    /// Reads user memory as the CPU does.
    pub fn read(&self, iova: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0; len];
        self.pager.read(Iova::new(iova), &mut out)?;
        Ok(out)
    }

    /// Brings the page of `iova` into a frame without mapping it (its fault is minor).
    pub fn make_resident(&mut self, iova: u64) -> Result<()> {
        Ok(self.pager.make_resident(Iova::new(iova))?)
    }

    /// Pages in and maps the page of `iova` (no fault will be taken on it).
    pub fn map_now(&mut self, iova: u64) -> Result<()> {
        let mut tlb = AllBanks {
            smmu: &mut self.smmu,
            banks: &self.banks,
        };
        Ok(self
            .pager
            .map_now(Iova::new(iova), &mut self.table, &mut tlb)?)
    }

    /// Takes the page of `iova` away (memory pressure): its version moves on first, then it
    /// is unmapped, invalidated in every bank and written back (protocol §3.4).
    pub fn evict(&mut self, iova: u64) -> Result<()> {
        self.versions.generation += 1;
        self.versions
            .invalidated
            .insert(iova & !(PAGE - 1), self.versions.generation);
        let mut tlb = AllBanks {
            smmu: &mut self.smmu,
            banks: &self.banks,
        };
        Ok(self
            .pager
            .evict(Iova::new(iova), &mut self.table, &mut tlb)?)
    }

    /// Maps the page of `iova` to `pa` directly, outside the pager (a broken mapping, e.g. to
    /// an address where no memory is).
    pub fn map_raw(&mut self, iova: u64, pa: u64, writable: bool) -> Result<()> {
        let mut tlb = AllBanks {
            smmu: &mut self.smmu,
            banks: &self.banks,
        };
        let inv = self.table.map(
            Iova::new(iova & !(PAGE - 1)),
            PhysAddr::new(pa),
            PageSize::Size4K,
            &BoardPager::attributes(writable),
            &mut tlb,
        )?;
        if !inv.is_empty() {
            tlb.invalidate_now(&inv)?;
        }
        Ok(())
    }

    /// Queues a transfer on engine `engine`'s `channel`.
    pub fn submit(&mut self, engine: usize, channel: u8, desc: TransferDesc) -> Result<TransferId> {
        Ok(self.driver_mut(engine)?.submit(channel, desc)?)
    }

    /// One round of software: both drivers polled, the SMMU's faults serviced, the drivers'
    /// resolution requests answered, completions and deliveries collected.
    pub fn poll(&mut self) -> Result<()> {
        let now = self.now_ns();
        for (engine, npe) in ZCU102_PL.npes.into_iter().enumerate() {
            let mut host = Host {
                npe,
                engine,
                pager: &self.pager,
                table: &self.table,
                versions: &self.versions,
                requests: &mut self.requests,
            };
            self.drivers[engine].poll(now, &mut host)?;
            self.collect(engine)?;
        }
        self.service_faults()?;
        self.answer_requests()?;
        for engine in 0..2 {
            self.collect(engine)?;
        }
        Ok(())
    }

    fn collect(&mut self, engine: usize) -> Result<()> {
        let driver = &mut self.drivers[engine];
        for &ch in &self.open_channels[engine] {
            while let Some(c) = driver.poll_completion(ch)? {
                self.completions[engine].push((ch, c));
            }
        }
        for &slot in &self.open_peers[engine] {
            while let Some(d) = driver.poll_delivery(slot)? {
                self.deliveries[engine].push((slot, d));
            }
        }
        Ok(())
    }

    /// The SMMU's context faults, through the one fault service.
    fn service_faults(&mut self) -> Result<()> {
        if let Some(g) = self.smmu.take_global_fault()? {
            return Err(CosimError::GlobalFault {
                gfsr: g.gfsr,
                stream: g.gfsynr1 & 0xffff,
            });
        }
        let mut tally = Tally(&mut self.counts);
        self.handler.service_pending(
            &mut self.smmu,
            &mut self.pager,
            &mut self.table,
            16,
            &mut tally,
        )?;
        Ok(())
    }

    /// The drivers' requests: a page the fault service mapped is resolved; one it did not
    /// see (its record lost to FSR.MULTI) goes through the fault path here.
    fn answer_requests(&mut self) -> Result<()> {
        for req in std::mem::take(&mut self.requests) {
            let write = req.access == Access::Write;
            let stream = Self::npe(req.engine)?.stream_of(req.pdid, write);
            let iova = Iova::new(req.va);
            let mut refused = None;
            if self.table.translate(iova)?.is_none() {
                let bank = self.banks[req.engine * 2 + usize::from(write)];
                let config = self.smmu.stream_fault_config(stream);
                let mut tlb = AllBanks {
                    smmu: &mut self.smmu,
                    banks: &[bank],
                };
                let resolution = self.handler.resolve_range(
                    SmmuId {
                        flavour: SmmuFlavour::V2,
                        instance: 0,
                    },
                    &InFlightAccess {
                        stream,
                        start: iova,
                        len: 1,
                    },
                    if write {
                        smmu_driver::fault::AccessKind::Write
                    } else {
                        smmu_driver::fault::AccessKind::Read
                    },
                    &config,
                    &mut self.pager,
                    &mut self.table,
                    &mut tlb,
                )?;
                self.counts.range_resolutions += 1;
                refused = resolution.abort;
            }
            let generation = Generation(self.versions.generation);
            let driver = self.driver_mut(req.engine)?;
            match refused {
                None => {
                    driver.page_resolved(req.pdid, req.va, generation)?;
                    self.counts.resolved += 1;
                }
                Some(e) => {
                    driver.page_unresolvable(req.pdid, req.va, reason_of(&e))?;
                    self.counts.unresolvable += 1;
                }
            }
        }
        Ok(())
    }

    /// Polls and clocks until `done` holds, at most `max_cycles` clocks.
    pub fn run_until(
        &mut self,
        what: &'static str,
        max_cycles: u64,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<()> {
        let start = self.cycles();
        loop {
            self.poll()?;
            if done(self) {
                return Ok(());
            }
            let cycles = self.cycles() - start;
            if cycles > max_cycles {
                return Err(CosimError::Timeout { what, cycles });
            }
            self.system().run(POLL_EVERY);
        }
    }

    /// Runs until engine `engine` has `count` completions.
    pub fn run_to_completions(
        &mut self,
        engine: usize,
        count: usize,
        max_cycles: u64,
    ) -> Result<()> {
        self.run_until("completions", max_cycles, |b| {
            b.completions(engine).len() >= count
        })
    }

    /// Completions of engine `engine`'s channels so far, in the order taken.
    pub fn completions(&self, engine: usize) -> &[(u8, Completion)] {
        self.completions.get(engine).map_or(&[], |c| c.as_slice())
    }

    /// Transfers engine `engine` received so far, per peer slot, in the order taken.
    pub fn deliveries(&self, engine: usize) -> &[(u8, Delivery)] {
        self.deliveries.get(engine).map_or(&[], |d| d.as_slice())
    }

    /// Engine `engine`'s driver.
    pub fn driver(&self, engine: usize) -> Result<&Driver> {
        self.drivers
            .get(engine)
            .ok_or(CosimError::NoSuchEngine { engine })
    }

    /// What the fault service did.
    pub fn counts(&self) -> ServiceCounts {
        self.counts
    }

    /// The MMU-500 model's counters.
    pub fn smmu_stats(&self) -> sim::mmu500::Mmu500Stats {
        self.mmu.stats()
    }

    /// The pager.
    pub fn pager(&self) -> &BoardPager<'d> {
        &self.pager
    }

    /// The engines (to clock them, install a link hook, read port counters).
    pub fn system(&self) -> MutexGuard<'_, System> {
        self.sys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clocks so far.
    pub fn cycles(&self) -> u64 {
        self.system().cycles()
    }

    fn now_ns(&self) -> u64 {
        self.cycles() * CLOCK_NS
    }
}
