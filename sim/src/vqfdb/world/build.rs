//! Building a run: nodes, their memory, SMMUs and engines, the fabric and the pairs.

use super::*;

impl<'p> World<'p> {
    pub(crate) fn build(
        cfg: &SimConfig,
        progress: Box<dyn FnMut(u64, u64) + 'p>,
    ) -> VqResult<Self> {
        let topo = Topology::new(cfg.nodes)?;
        let pair_list = cfg.workload.pairs(cfg.nodes);
        let slot_bytes = u64::from(cfg.transfer_size).div_ceil(PAGE) * PAGE;
        let buffer_bytes = slot_bytes * cfg.slots as u64;
        // Per node: a send buffer per outgoing pair, a receive buffer per incoming pair.
        let mut out_pairs = vec![Vec::new(); cfg.nodes];
        let mut in_pairs = vec![Vec::new(); cfg.nodes];
        for (i, &(s, d)) in pair_list.iter().enumerate() {
            out_pairs[s].push(i);
            in_pairs[d].push(i);
        }
        let quota_base = cfg.transfers / pair_list.len() as u64;
        let extra = cfg.transfers % pair_list.len() as u64;
        let mut pairs = Vec::new();
        for (i, &(s, d)) in pair_list.iter().enumerate() {
            let out_index = out_pairs[s].iter().position(|&p| p == i).unwrap_or(0);
            let in_index = in_pairs[d].iter().position(|&p| p == i).unwrap_or(0);
            let src_base = VA_BASE + out_index as u64 * buffer_bytes;
            let dst_base = VA_BASE + (out_pairs[d].len() + in_index) as u64 * buffer_bytes;
            // Stacks: the last element is used first (most recently freed = most recently
            // touched, so reuse has locality).
            let slots: Vec<u32> = (0..cfg.slots as u32).rev().collect();
            pairs.push(Pair {
                src: s,
                dst: d,
                channel: out_index as u8,
                peer_slot: in_index as u8,
                quota: quota_base + u64::from((i as u64) < extra),
                submitted: 0,
                finished: 0,
                inflight: 0,
                free_src: slots.clone(),
                free_dst: slots,
                src_base,
                dst_base,
                waiting: None,
                intents: VecDeque::new(),
                next_arrival: ModelTime::ZERO,
                arrived: 0,
                arrival_rng: SplitMix64::derive(cfg.seed ^ 0xA441_7A15, i as u64),
                src_class: vec![FaultClass::None; cfg.slots],
                dst_class: vec![FaultClass::None; cfg.slots],
                next_completion: 0,
                next_delivery: 0,
                completions: Vec::new(),
                deliveries: Vec::new(),
                dst_used: vec![ModelTime::ZERO; cfg.slots],
            });
        }
        // Every node's buffers are real memory of this process (its simulated DRAM): refuse
        // a configuration that would need more than the host is asked to give, with a line
        // that says so, rather than abort on a failed allocation.
        let modelled: u64 = (0..cfg.nodes)
            .map(|n| (out_pairs[n].len() + in_pairs[n].len()) as u64 * buffer_bytes)
            .sum();
        if modelled > MAX_MODELLED_BYTES {
            return Err(SimError::Config(format!(
                "the buffers of this run need {} MiB of host memory (nodes x peers x slots x size); at most {} MiB: lower --slots, --size or --nodes",
                modelled >> 20,
                MAX_MODELLED_BYTES >> 20
            )));
        }
        let node_costs: Vec<NodeCosts> = (0..cfg.nodes)
            .map(|n| {
                let senders = in_pairs[n].len();
                let hops = if senders == 0 {
                    1.0
                } else {
                    in_pairs[n]
                        .iter()
                        .map(|&p| topo.hops(pair_list[p].0, n) as f64)
                        .sum::<f64>()
                        / senders as f64
                };
                NodeCosts::new(cfg, hops, senders, out_pairs[n].len())
            })
            .collect();
        let mut nodes = Vec::with_capacity(cfg.nodes);
        for n in 0..cfg.nodes {
            let buffers = out_pairs[n].len() + in_pairs[n].len();
            let pages = (buffers as u64 * buffer_bytes / PAGE) as usize;
            let footprint = pages as u64 * PAGE;
            let limit_bytes = match cfg.memory_limit {
                MemoryLimit::Bytes(b) => b,
                MemoryLimit::Fraction(f) => (footprint as f64 * f) as u64,
            };
            // A limit above the node's footprint puts no pressure on it: its frames are the
            // footprint, however generous the limit (it is not memory to reserve).
            let limit = usize::try_from(limit_bytes / PAGE)
                .unwrap_or(usize::MAX)
                .clamp(1, pages.max(1));
            // Every transfer in flight needs its pages resident at some point (the CPU writes
            // the source, the engine reads it, the peer writes the destination), so a limit
            // below that working set cannot make progress: refuse it as a configuration error.
            let in_flight = if cfg.overpost { cfg.slots } else { cfg.depth };
            let working_set = (slot_bytes / PAGE) as usize * in_flight.max(1) * buffers;
            if limit < working_set.min(pages) {
                return Err(SimError::Config(format!(
                    "--memory-limit gives node {n} {} KiB, below its in-flight working set of {} KiB \
                     ({} buffers x depth {} x {} KiB per transfer); raise --memory-limit or lower --depth",
                    limit as u64 * PAGE / 1024,
                    working_set as u64 * PAGE / 1024,
                    buffers,
                    cfg.depth,
                    slot_bytes / 1024
                )));
            }
            let frames = pages.max(1);
            let dram = Arc::new(HostDma::new(
                PhysAddr::new(DRAM_BASE),
                frames + DRAM_EXTRA_PAGES,
            )?);
            let frames_region = dram.allocate(frames, DmaDirection::Bidirectional)?;
            let params = NpeModelParams::new(n, cfg.nodes);
            let read_stream = params.stream_of(PDID, false);
            let write_stream = params.stream_of(PDID, true);
            let mem = NodeMemory::new(
                dram.clone(),
                frames_region.bus_addr(),
                frames,
                VA_BASE,
                pages.max(1),
                limit,
                cfg.swap,
                [read_stream, write_stream],
                cfg.costs.minor_service().as_ns(),
            )?;
            let table = PageTable::new(dram.clone(), PageTableConfig::default())?;
            let pstate = PageStateTable::new(
                VirtAddr::new(VA_BASE),
                pages.max(1) as u64 * PAGE,
                vec![PageEntry::ABSENT; pages.max(1)],
            )?;
            // The fault policy, and which of the two streams may stall. The fixed rules put
            // both on stall-mode contexts (stall-only, pin-all) or neither (retransmit-only);
            // the cost-based hybrid (and pre-fault's residual faults) only a stream where a
            // stall can pay: the cheapest resolution it can get, a minor fault on an idle
            // fault CPU, costs no more stalled than retransmitted.
            let (policy, stall, budgets) = match cfg.strategy {
                Strategy::StallOnly => (
                    NodePolicy::Standard(StandardPolicy::StallOnly),
                    [true, true],
                    [u64::MAX, u64::MAX],
                ),
                Strategy::RetransmitOnly => (
                    NodePolicy::Standard(StandardPolicy::RetransmitOnly),
                    [false, false],
                    [0, 0],
                ),
                Strategy::HybridFixed | Strategy::PinAll => (
                    NodePolicy::Standard(StandardPolicy::Hybrid),
                    [true, true],
                    [
                        cfg.costs.stall_budget.as_ns(),
                        cfg.costs.write_stall_budget.as_ns(),
                    ],
                ),
                Strategy::Hybrid | Strategy::PreFault => {
                    let costs = &node_costs[n];
                    let swap =
                        ModelTime::transfer(PAGE, cfg.swap.bandwidth_bps).after(cfg.swap.latency);
                    let policy = costs.policy(&cfg.costs, swap);
                    // The cheapest fault: a minor one, as the resolver estimates it, and as
                    // each fault's decision sees it (with the fault CPU's queue added).
                    let cheapest = mem.estimate_minor();
                    let stall = [
                        policy.stall_pays(smmu_driver::fault::AccessKind::Read, &cheapest),
                        policy.stall_pays(smmu_driver::fault::AccessKind::Write, &cheapest),
                    ];
                    // The NPE tolerates stalls of any length (CAPS.STALL_TOLERANT): the
                    // costs decide, not a budget.
                    (NodePolicy::Cost(policy), stall, [u64::MAX, u64::MAX])
                }
            };
            let smmu = match cfg.smmu {
                SmmuModel::Walker => {
                    let mut walker = WalkerSmmu::new(dram.clone());
                    // Both streams of the PDID share one context (one set of tables).
                    for (stream, stall) in [read_stream, write_stream].into_iter().zip(stall) {
                        walker.attach(
                            stream,
                            ContextConfig {
                                root: table.root(),
                                stall,
                            },
                        );
                    }
                    NodeSmmu::Walker(walker)
                }
                SmmuModel::Mmu500 => NodeSmmu::mmu500(
                    Memory::new(dram.clone()),
                    table.root(),
                    &table.walk_config(),
                    stall,
                    [
                        (read_stream, StreamFaultConfig::stall_tolerant(budgets[0])),
                        (write_stream, StreamFaultConfig::stall_tolerant(budgets[1])),
                    ],
                )?,
            };
            let bus = ModelBus::new(NpeModel::new(params));
            let mut driver = Box::new(Driver::new(
                bus,
                &*dram,
                NpeConfig::new(n as u32, CONTROL_CHANNEL),
            )?);
            for &p in &out_pairs[n] {
                let pair = &pairs[p];
                driver.open_channel(
                    &*dram,
                    pair.channel,
                    ChannelConfig {
                        peer: pair.dst as u32,
                        pdid: PDID,
                        peer_key: u32::from(PDID),
                        session: session(pair.src, pair.dst),
                    },
                )?;
            }
            for &p in &in_pairs[n] {
                let pair = &pairs[p];
                driver.open_peer(
                    pair.peer_slot,
                    PeerConfig {
                        peer: pair.src as u32,
                        session: session(pair.src, pair.dst),
                        pdid: PDID,
                    },
                )?;
            }
            nodes.push(Node {
                dram,
                _frames: frames_region,
                driver,
                mm: Mm {
                    mem,
                    table,
                    pstate,
                    invalidated_at: vec![0; pages.max(1)],
                    smmu,
                    read_stream,
                    write_stream,
                    pdid: PDID,
                },
                faults: FaultService::new(policy, budgets[0], budgets[1]),
                costs: node_costs[n],
                driver_free_at: ModelTime::ZERO,
                driver_at: None,
                engine_at: None,
                app_free_at: ModelTime::ZERO,
                app_busy: false,
                out_pairs: out_pairs[n].clone(),
                in_pairs: in_pairs[n].clone(),
                next_pair: 0,
                requests: Vec::new(),
                lose_requests: false,
                arrival_wake: None,
                stalling: stall,
            });
        }
        let total = pairs.iter().map(|p| p.quota).sum();
        Ok(Self {
            cfg: cfg.clone(),
            q: EventQueue::new(),
            fabric: Fabric::new(topo, cfg.link),
            nodes,
            pairs,
            ledger: HashMap::new(),
            rng: SplitMix64::derive(cfg.seed, 0),
            latencies: Vec::new(),
            back_pressure: 0,
            latency: Histogram::default(),
            latency_by_class: Default::default(),
            bytes: 0,
            first_post: None,
            last_completion: ModelTime::ZERO,
            finished: 0,
            total,
            setup: ModelTime::ZERO,
            data: Vec::new(),
            progress,
            manual: false,
            seams: Seams::default(),
            integrity: Integrity::default(),
        })
    }

    pub(crate) fn slot_bytes(&self) -> u64 {
        u64::from(self.cfg.transfer_size).div_ceil(PAGE) * PAGE
    }

    /// Initial memory: pinned (pin-all) or initialised by the application, oldest slots
    /// first so that the slots used first are the ones still resident.
    pub(crate) fn setup(&mut self) -> VqResult<()> {
        let slot_bytes = self.slot_bytes();
        for n in 0..self.nodes.len() {
            let mut cost = ModelTime::ZERO;
            let mut vas = Vec::new();
            for slot in (0..self.cfg.slots as u64).rev() {
                for &p in self.nodes[n]
                    .out_pairs
                    .iter()
                    .chain(self.nodes[n].in_pairs.iter())
                {
                    let pair = &self.pairs[p];
                    let base = if pair.src == n {
                        pair.src_base
                    } else {
                        pair.dst_base
                    };
                    let slot_va = base + slot * slot_bytes;
                    for page in 0..slot_bytes / PAGE {
                        vas.push(slot_va + page * PAGE);
                    }
                }
            }
            let pin = self.cfg.strategy == Strategy::PinAll;
            let node = &mut self.nodes[n];
            for va in vas {
                node.mm.cpu_touch(va, ModelTime::ZERO, pin)?;
                if pin {
                    cost = cost
                        .after(self.cfg.costs.pin_page)
                        .after(self.cfg.costs.cpu_minor_fault);
                }
            }
            self.setup = self.setup.max(cost);
            node.mm.mem.begin_run();
        }
        // Setup happens before time starts; the application starts after the longest setup.
        // Closed loop: every window slot is free then, so that is when the first transfers
        // are meant to go. Open loop: the first arrivals follow.
        if !self.manual {
            let depth = if self.cfg.overpost {
                self.cfg.slots
            } else {
                self.cfg.depth
            };
            for p in 0..self.pairs.len() {
                if self.cfg.offered_load_gbps.is_some() {
                    let gap = self.arrival_gap(p);
                    self.pairs[p].next_arrival = self.setup.after(gap);
                } else {
                    self.pairs[p].intents = std::iter::repeat_n(self.setup, depth).collect();
                }
            }
            for n in 0..self.nodes.len() {
                self.q.schedule(self.setup, Ev::AppRun(n));
            }
        }
        Ok(())
    }
}
