//! A hand-driven virtual QFDB for tests and experiments: no workload, explicit transfers,
//! explicit page evictions, and a hook over every frame on the wire.

use dma_engine::npe::{DmaError, NpeStats};
use protocol::{Completion, Delivery, ReceiverStats, SenderStats, TransferDesc, TransferId};

use super::world::{Ev, World};
use super::{MemoryLimit, SimConfig, SimError, Strategy, VqResult, Workload};
use crate::axi::SmmuStats;
use crate::des::ModelTime;
use crate::node_memory::{PAGE, PageState};
use crate::npe::{EngineStats, Frame};

/// A virtual QFDB under a test's control. Every node pair of an all-to-all workload has a
/// connection; nothing is sent until the test submits it.
pub struct Rig {
    world: World<'static>,
}

/// How a page is taken away by [`Rig::evict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Unmapped, data kept in memory: the next access is a minor fault.
    Minor,
    /// Written to swap: the next access is a major fault.
    Major,
}

impl Rig {
    /// A rig of `nodes` nodes with every buffer page resident. `slots` slots of
    /// `slot_size` bytes per pair and direction.
    pub fn new(nodes: usize, strategy: Strategy, slots: usize, slot_size: u32) -> VqResult<Self> {
        let cfg = SimConfig {
            nodes,
            workload: Workload::AllToAll,
            strategy,
            fault_rate: 0.0,
            memory_limit: MemoryLimit::Fraction(2.0),
            transfers: 1,
            transfer_size: slot_size,
            depth: 1,
            slots,
            ..SimConfig::default()
        };
        let mut world = World::build(&cfg, Box::new(|_, _| {}))?;
        world.manual = true;
        world.setup()?;
        Ok(Self { world })
    }

    fn pair(&self, src: usize, dst: usize) -> VqResult<usize> {
        self.world
            .pairs
            .iter()
            .position(|p| p.src == src && p.dst == dst)
            .ok_or_else(|| SimError::Config(format!("no connection from node {src} to {dst}")))
    }

    /// Virtual address of `offset` in the send buffer of `src` towards `dst`.
    pub fn src_va(&self, src: usize, dst: usize, offset: u64) -> VqResult<u64> {
        let base = self.world.pairs[self.pair(src, dst)?].src_base;
        base.checked_add(offset).ok_or_else(|| {
            SimError::Config(format!("offset {offset:#x} is past the address space"))
        })
    }

    /// Virtual address of `offset` in `dst`'s receive buffer for `src`.
    pub fn dst_va(&self, src: usize, dst: usize, offset: u64) -> VqResult<u64> {
        let base = self.world.pairs[self.pair(src, dst)?].dst_base;
        base.checked_add(offset).ok_or_else(|| {
            SimError::Config(format!("offset {offset:#x} is past the address space"))
        })
    }

    /// The application on `src` writes `data` at `offset` of its send buffer towards `dst`.
    pub fn write_source(
        &mut self,
        src: usize,
        dst: usize,
        offset: u64,
        data: &[u8],
    ) -> VqResult<()> {
        let va = self.src_va(src, dst, offset)?;
        let now = self.world.q.now();
        let mm = &mut self.world.nodes[src].mm;
        let end = va
            .checked_add(data.len() as u64)
            .ok_or_else(|| SimError::Config(format!("{va:#x} + {} bytes overflows", data.len())))?;
        let mut page = va & !(PAGE - 1);
        while page < end {
            mm.cpu_touch(page, now, false)?;
            page += PAGE;
        }
        mm.mem.write_resident(va, data)
    }

    /// Reads `len` bytes at `offset` of `dst`'s receive buffer for `src` (wherever they are).
    pub fn read_dest(&self, src: usize, dst: usize, offset: u64, len: usize) -> VqResult<Vec<u8>> {
        let va = self.dst_va(src, dst, offset)?;
        let mut out = vec![0u8; len];
        self.world.nodes[dst].mm.mem.peek(va, &mut out)?;
        Ok(out)
    }

    /// Makes the fault service of `node` lose (`true`) or serve (`false`) its faults from now
    /// on (the driver's requests and the SMMU's records): a fault nobody resolves, which the
    /// protocol's timeouts must end.
    pub fn lose_fault_requests(&mut self, node: usize, lose: bool) {
        if let Some(n) = self.world.nodes.get_mut(node) {
            n.lose_requests = lose;
        }
    }

    /// Takes the page holding `va` away from `node`, so that its next access is a minor
    /// (`Eviction::Minor`) or major fault. A page already in that state is left as it is;
    /// anything else that cannot be done is an error rather than a silent no-op (an address
    /// outside every buffer, a pinned page, a page never touched, a swapped page asked to
    /// become minor), so a test that evicts the wrong page fails.
    pub fn evict(&mut self, node: usize, va: u64, how: Eviction) -> VqResult<()> {
        let now = self.world.q.now();
        let mm = &mut self
            .world
            .nodes
            .get_mut(node)
            .ok_or_else(|| SimError::Config(format!("no node {node}")))?
            .mm;
        let refuse = |why: &str| {
            Err(SimError::Config(format!(
                "cannot evict {va:#x} on node {node}: {why}"
            )))
        };
        match mm.mem.state(va) {
            None => return refuse("it is in no buffer"),
            Some(_) if mm.mem.is_pinned(va) => return refuse("it is pinned"),
            Some(PageState::Fresh) => return refuse("it was never touched"),
            Some(PageState::Swapped { .. }) if how == Eviction::Minor => {
                return refuse("it is already swapped out");
            }
            Some(PageState::Resident { .. }) => mm.deactivate(va)?,
            Some(PageState::Cached { .. } | PageState::Swapped { .. }) => {}
        }
        if how == Eviction::Major
            && let Some(PageState::Cached { .. }) = mm.mem.state(va)
        {
            mm.mem.evict(va & !(PAGE - 1), now)?;
        }
        Ok(())
    }

    /// Posts an RDMA write of `len` bytes from `src`'s send buffer at `src_offset` to `dst`'s
    /// receive buffer at `dst_offset`. Back-pressure comes back as `Ok(Err(QueueFull))`.
    pub fn submit(
        &mut self,
        src: usize,
        dst: usize,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> VqResult<Result<TransferId, DmaError>> {
        let p = self.pair(src, dst)?;
        let desc = TransferDesc {
            src: self.src_va(src, dst, src_offset)?,
            dest: self.dst_va(src, dst, dst_offset)?,
            len,
            key: 1,
            tag: 0,
        };
        let channel = self.world.pairs[p].channel;
        let result = self.world.nodes[src].driver.submit(channel, desc);
        if result.is_ok() {
            let now = self.world.q.now();
            self.world.request_driver(src, now);
        }
        Ok(result)
    }

    /// Runs the simulation until nothing is left to do or model time `until` is reached.
    pub fn run_until(&mut self, until: ModelTime) -> VqResult<()> {
        self.world.run_until(until)
    }

    /// Runs until nothing is left to do (at most 1 model second).
    pub fn run(&mut self) -> VqResult<()> {
        self.world.run_until(ModelTime::from_us(1e6))
    }

    /// The current model time.
    pub fn now(&self) -> ModelTime {
        self.world.q.now()
    }

    /// Completions taken so far at `src` for `dst`, in the order the driver gave them.
    pub fn completions(&self, src: usize, dst: usize) -> VqResult<Vec<Completion>> {
        Ok(self.world.pairs[self.pair(src, dst)?]
            .completions
            .iter()
            .map(|(_, c)| *c)
            .collect())
    }

    /// Deliveries taken so far at `dst` from `src`, in order.
    pub fn deliveries(&self, src: usize, dst: usize) -> VqResult<Vec<Delivery>> {
        Ok(self.world.pairs[self.pair(src, dst)?]
            .deliveries
            .iter()
            .map(|(_, d)| *d)
            .collect())
    }

    /// Installs a hook over every frame an engine sends.
    pub fn set_frame_hook(&mut self, hook: Box<dyn FnMut(Frame) -> Vec<Frame>>) {
        self.world.seams.frames = Some(hook);
    }

    /// Delivers `frame` to its destination engine at the current time, as if it came off the
    /// link.
    pub fn inject(&mut self, frame: Frame) -> VqResult<()> {
        let now = self.world.q.now();
        let dst = frame.dst;
        if dst >= self.world.nodes.len() {
            return Err(SimError::Config(format!(
                "no node {dst} to inject a frame into"
            )));
        }
        self.world.q.schedule(now, Ev::Inject(dst, Box::new(frame)));
        Ok(())
    }

    /// The driver counters of `node`.
    pub fn driver_stats(&self, node: usize) -> NpeStats {
        *self.world.nodes[node].driver.stats()
    }

    /// The sender counters of `src`'s connection to `dst`.
    pub fn sender_stats(&self, src: usize, dst: usize) -> VqResult<SenderStats> {
        let channel = self.world.pairs[self.pair(src, dst)?].channel;
        Ok(*self.world.nodes[src].driver.sender_stats(channel)?)
    }

    /// The receiver counters of `dst` for data from `src`.
    pub fn receiver_stats(&self, src: usize, dst: usize) -> VqResult<ReceiverStats> {
        let slot = self.world.pairs[self.pair(src, dst)?].peer_slot;
        Ok(*self.world.nodes[dst].driver.receiver_stats(slot)?)
    }

    /// The engine model counters of `node`.
    pub fn engine_stats(&self, node: usize) -> EngineStats {
        *self.world.nodes[node].driver.bus().lock().stats()
    }

    /// Whether `node`'s engine asserts its interrupt line now (§9: a level interrupt, high
    /// until the driver acknowledges every cause).
    pub fn engine_irq(&self, node: usize) -> bool {
        self.world
            .nodes
            .get(node)
            .is_some_and(|n| n.driver.bus().lock().irq_asserted())
    }

    /// The SMMU counters of `node`.
    pub fn smmu_stats(&self, node: usize) -> SmmuStats {
        self.world.nodes[node].mm.smmu.stats()
    }

    /// The fault handler counters of `node` (minor, major, resumed, retransmitted...).
    pub fn fault_stats(&self, node: usize) -> smmu_driver::fault::FaultStats {
        *self.world.nodes[node].faults.handler.stats()
    }

    /// The session of the connection from `src` to `dst` (for forging messages).
    pub fn session(&self, src: usize, dst: usize) -> u32 {
        super::world::session(src, dst)
    }
}
