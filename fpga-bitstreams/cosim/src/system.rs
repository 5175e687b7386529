//! Verilated engines, their memories and SMMUs, the links between them, and the register seam.
//!
//! [`System`] clocks every engine together. Each engine's queue port reaches its node's DRAM,
//! its data port goes through the node's SMMU ([`AxiSlave`]); its link streams are connected
//! through a FIFO per direction and virtual channel to the engine whose coordinate the packet
//! header names (node *n* is coordinate *n*). A register access ([`CosimBus`], the
//! `hal::RegisterBus` the NPE driver is generic over) is an AXI4-Lite transaction that clocks
//! the whole system until the engine answers, as a CPU's load waits on the interconnect.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use hal::barrier::Barrier;
use hal::dma::HostDma;
use hal::regs::{AccessWidth, RegisterBus};
use sim::axi::AxiTranslate;
use sim::des::ModelTime;

use crate::axi_slave::{AxiSlave, PortStats, WriteOrder};
use crate::ffi::{Io, Stream, Verilated};

/// Link FIFO depth in flits, per direction and virtual channel (a packet is at most 18).
const LINK_FIFO: usize = 64;
/// Clock period: the PL clock of docs/dma-engine.md §10 (250 MHz).
const CLOCK_NS: u64 = 4;
/// Clocks a register access may take before the engine is declared hung.
const ACCESS_TIMEOUT: u64 = 100_000;

/// A flit on a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flit {
    /// 128 bits, little-endian words.
    pub data: [u64; 2],
    /// TLAST (the packet's footer).
    pub last: bool,
}

/// A hook that may change a flit on its way (a test corrupting a packet); called with the
/// sending node, the virtual channel (0 data, 1 control) and the flit.
pub type LinkHook = Box<dyn FnMut(usize, usize, &mut Flit) + Send>;

/// The stream IDs of one engine's two AXI masters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortStreams {
    /// The data port's stream of AXI ID 0 (the burst's AXI ID is or-ed in).
    pub data: u32,
    /// The queue port's stream (its AXI ID is always 0) when it goes through the SMMU too;
    /// `None`: straight to the DRAM.
    pub queue: Option<u32>,
}

/// One node: an engine, its DRAM and its SMMU.
pub struct Node {
    model: Verilated,
    io: Io,
    q: AxiSlave,
    d: AxiSlave,
    dram: Arc<HostDma>,
    smmu: Box<dyn AxiTranslate + Send>,
    /// Arriving flits per virtual channel.
    rx: [VecDeque<Flit>; 2],
    /// Destination node of the packet being sent on each virtual channel.
    tx_dst: [Option<usize>; 2],
    /// Flits the engine has taken per virtual channel.
    taken: [u64; 2],
    /// Until this clock the engine's link inputs show no flit (`hold_rx`).
    rx_hold_until: u64,
    irq: bool,
}

/// The engines and their surroundings (see the module documentation).
pub struct System {
    nodes: Vec<Node>,
    cycle: u64,
    hook: Option<LinkHook>,
    /// Flits that named a node that does not exist (must stay 0: the engine checks routes).
    pub misrouted: u64,
    handshakes: u64,
}

impl System {
    /// `nodes` engines, node *i* with `drams[i]` and `smmus[i]`; every engine's data port has
    /// stream IDs `stream_base | AXI ID`. Held in reset for a few clocks, then released.
    pub fn new(
        drams: Vec<Arc<HostDma>>,
        smmus: Vec<Box<dyn AxiTranslate + Send>>,
        stream_base: u32,
        seed: u64,
    ) -> Self {
        let streams = vec![
            PortStreams {
                data: stream_base,
                queue: None,
            };
            drams.len()
        ];
        Self::with_streams(drams, smmus, &streams, seed)
    }

    /// [`new`](Self::new) with each engine's streams (`streams[i]`: engine *i*'s ports, as a
    /// board puts each master on a PL port of its own). Two nodes may share one DRAM and one
    /// SMMU (two engines of one MPSoC).
    pub fn with_streams(
        drams: Vec<Arc<HostDma>>,
        smmus: Vec<Box<dyn AxiTranslate + Send>>,
        streams: &[PortStreams],
        seed: u64,
    ) -> Self {
        let count = drams.len();
        let nodes = drams
            .into_iter()
            .zip(smmus)
            .zip(streams.iter().copied())
            .enumerate()
            .map(|(i, ((dram, smmu), streams))| Node {
                model: Verilated::new(),
                io: Io {
                    route_limit: count as u32,
                    ..Io::default()
                },
                q: AxiSlave::new(
                    streams.queue.is_some(),
                    streams.queue.unwrap_or(0),
                    seed ^ (i as u64 * 0x9E37_79B9),
                ),
                d: AxiSlave::new(true, streams.data, seed ^ (i as u64 * 0x85EB_CA6B + 7)),
                dram,
                smmu,
                rx: [VecDeque::new(), VecDeque::new()],
                tx_dst: [None, None],
                taken: [0, 0],
                rx_hold_until: 0,
                irq: false,
            })
            .collect();
        let mut sys = Self {
            nodes,
            cycle: 0,
            hook: None,
            misrouted: 0,
            handshakes: 0,
        };
        sys.run(4);
        for n in &mut sys.nodes {
            n.io.rst_n = 1;
        }
        sys.run(2);
        sys
    }

    /// Holds every AXI ready/valid of the memory side low on `percent` % of the clocks.
    pub fn set_backpressure(&mut self, percent: u32) {
        for n in &mut self.nodes {
            n.q.hold_percent = percent;
            n.d.hold_percent = percent;
        }
    }

    /// How every memory port orders a write burst's address and data
    /// ([`WriteOrder::Mixed`] unless set).
    pub fn set_write_order(&mut self, order: WriteOrder) {
        for n in &mut self.nodes {
            n.q.write_order = order;
            n.d.write_order = order;
        }
    }

    /// Installs a link hook.
    pub fn set_link_hook(&mut self, hook: LinkHook) {
        self.hook = Some(hook);
    }

    /// Clocks so far.
    pub fn cycles(&self) -> u64 {
        self.cycle
    }

    /// Model time of the current clock.
    pub fn now(&self) -> ModelTime {
        ModelTime::from_ns(self.cycle * CLOCK_NS)
    }

    /// The SMMU of `node` (to answer stalls, inspect records).
    pub fn smmu(&mut self, node: usize) -> &mut (dyn AxiTranslate + Send) {
        self.nodes[node].smmu.as_mut()
    }

    /// Whether `node`'s interrupt line is asserted.
    pub fn irq(&self, node: usize) -> bool {
        self.nodes[node].irq
    }

    /// Counters of `node`'s queue and data ports.
    pub fn port_stats(&self, node: usize) -> (PortStats, PortStats) {
        (self.nodes[node].q.stats(), self.nodes[node].d.stats())
    }

    /// Handshakes so far (AXI beats and addresses, stream flits, of every engine): when it
    /// stops growing, nothing moves (an SMMU stall can hold everything behind it).
    pub fn handshakes(&self) -> u64 {
        self.handshakes
    }

    /// Flits `node`'s engine has taken from the link on virtual channel `vc` (0 data, 1
    /// control) so far.
    pub fn flits_taken(&self, node: usize, vc: usize) -> u64 {
        self.nodes[node].taken[vc]
    }

    /// Shows `node`'s engine no arriving flit until clock `until` (they wait in its FIFOs):
    /// a test places a frame's flits at a chosen clock this way. Set it while no flit is
    /// shown to the engine (AXI4-Stream: TVALID, once high, stays high until TREADY).
    pub fn hold_rx(&mut self, node: usize, until: u64) {
        self.nodes[node].rx_hold_until = until;
    }

    /// Whether anything is still moving: a burst in flight or a flit on a link.
    pub fn busy(&self) -> bool {
        self.nodes.iter().any(|n| {
            n.q.busy()
                || n.d.busy()
                || n.rx.iter().any(|f| !f.is_empty())
                || n.io.tx_data.valid != 0
                || n.io.tx_ctrl.valid != 0
        })
    }

    /// Runs `cycles` clocks.
    pub fn run(&mut self, cycles: u64) {
        for _ in 0..cycles {
            self.step();
        }
    }

    /// One clock of every engine.
    pub fn step(&mut self) {
        let now = self.now();
        let count = self.nodes.len();
        // Room in each destination's FIFOs, as of the start of the clock.
        let room: Vec<[bool; 2]> = self
            .nodes
            .iter()
            .map(|n| [n.rx[0].len() < LINK_FIFO, n.rx[1].len() < LINK_FIFO])
            .collect();
        let mut sent: Vec<(usize, usize, Flit)> = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            // Inputs of this clock, from the outputs of the last edge.
            let Node {
                io,
                q,
                d,
                dram,
                smmu,
                ..
            } = node;
            q.drive(&mut io.q, now, dram, smmu.as_mut());
            d.drive(&mut io.d, now, dram, smmu.as_mut());
            for (vc, dst_now) in node.tx_dst.iter().enumerate() {
                let dst = dst_now.or_else(|| {
                    let s = if vc == 0 {
                        &node.io.tx_data
                    } else {
                        &node.io.tx_ctrl
                    };
                    Some((s.data[0] & 0x3f_ffff) as usize)
                });
                let ready = dst.is_some_and(|d| d < count && room[d][vc]) || dst >= Some(count);
                if vc == 0 {
                    node.io.tx_data.ready = u8::from(ready);
                } else {
                    node.io.tx_ctrl.ready = u8::from(ready);
                }
            }
            for vc in 0..2 {
                let front = node.rx[vc]
                    .front()
                    .copied()
                    .filter(|_| self.cycle >= node.rx_hold_until);
                let s: &mut Stream = if vc == 0 {
                    &mut node.io.rx_data
                } else {
                    &mut node.io.rx_ctrl
                };
                s.valid = u8::from(front.is_some());
                if let Some(f) = front {
                    s.data = f.data;
                    s.last = u8::from(f.last);
                }
            }
            let before = node.io;
            node.model.cycle(&mut node.io);
            node.irq = node.io.irq != 0;
            // Handshakes of the edge.
            self.handshakes += node.q.commit(&before.q) + node.d.commit(&before.d);
            for vc in 0..2 {
                let (tx, rx) = if vc == 0 {
                    (before.tx_data, before.rx_data)
                } else {
                    (before.tx_ctrl, before.rx_ctrl)
                };
                if tx.valid != 0 && tx.ready != 0 {
                    let dst = node.tx_dst[vc].unwrap_or((tx.data[0] & 0x3f_ffff) as usize);
                    node.tx_dst[vc] = if tx.last != 0 { None } else { Some(dst) };
                    self.handshakes += 1;
                    sent.push((
                        dst,
                        vc,
                        Flit {
                            data: tx.data,
                            last: tx.last != 0,
                        },
                    ));
                    let _ = i;
                }
                if rx.valid != 0 && rx.ready != 0 {
                    node.rx[vc].pop_front();
                    node.taken[vc] += 1;
                    self.handshakes += 1;
                }
            }
        }
        for (dst, vc, mut flit) in sent {
            if let Some(hook) = self.hook.as_mut() {
                hook(dst, vc, &mut flit);
            }
            match self.nodes.get_mut(dst) {
                Some(n) => n.rx[vc].push_back(flit),
                None => self.misrouted += 1,
            }
        }
        self.cycle += 1;
    }

    /// An AXI4-Lite write of `node`'s register window (64-bit lanes; `strb` selects bytes).
    fn lite_write(&mut self, node: usize, offset: usize, value: u64, strb: u8) {
        {
            let io = &mut self.nodes[node].io;
            io.awaddr = offset as u16;
            io.awvalid = 1;
            io.wdata = value;
            io.wstrb = strb;
            io.wvalid = 1;
            io.bready = 1;
        }
        for _ in 0..ACCESS_TIMEOUT {
            let before = self.nodes[node].io;
            self.step();
            let io = &mut self.nodes[node].io;
            if before.awvalid != 0 && before.awready != 0 {
                io.awvalid = 0;
            }
            if before.wvalid != 0 && before.wready != 0 {
                io.wvalid = 0;
            }
            if before.bvalid != 0 && before.bready != 0 {
                io.bready = 0;
                return;
            }
        }
        panic!("NPE {node}: register write at {offset:#x} got no response");
    }

    /// An AXI4-Lite read of the 64-bit lane holding `offset`.
    fn lite_read(&mut self, node: usize, offset: usize) -> u64 {
        {
            let io = &mut self.nodes[node].io;
            io.araddr = offset as u16;
            io.arvalid = 1;
            io.rready = 1;
        }
        for _ in 0..ACCESS_TIMEOUT {
            let before = self.nodes[node].io;
            self.step();
            let io = &mut self.nodes[node].io;
            if before.arvalid != 0 && before.arready != 0 {
                io.arvalid = 0;
            }
            if before.rvalid != 0 && before.rready != 0 {
                io.rready = 0;
                return before.rdata;
            }
        }
        panic!("NPE {node}: register read at {offset:#x} got no response");
    }

    /// A register read as the CPU does it (`width` bits at `offset`).
    pub fn read(&mut self, node: usize, offset: usize, width: AccessWidth) -> u64 {
        let lane = self.lite_read(node, offset & !7);
        match width {
            AccessWidth::U64 => lane,
            _ if offset & 4 != 0 => lane >> 32,
            _ => lane & 0xffff_ffff,
        }
    }

    /// A register write as the CPU does it.
    pub fn write(&mut self, node: usize, offset: usize, width: AccessWidth, value: u64) {
        match width {
            AccessWidth::U64 => self.lite_write(node, offset & !7, value, 0xff),
            _ if offset & 4 != 0 => self.lite_write(node, offset & !7, value << 32, 0xf0),
            _ => self.lite_write(node, offset & !7, value & 0xffff_ffff, 0x0f),
        }
    }
}

/// `node`'s register window on the shared system: the NPE driver's `RegisterBus`.
#[derive(Clone)]
pub struct CosimBus {
    sys: Arc<Mutex<System>>,
    node: usize,
}

impl CosimBus {
    /// The window of `node`.
    pub fn new(sys: Arc<Mutex<System>>, node: usize) -> Self {
        Self { sys, node }
    }

    /// The system, locked.
    pub fn lock(&self) -> MutexGuard<'_, System> {
        self.sys.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl RegisterBus for CosimBus {
    fn read(&self, offset: usize, width: AccessWidth) -> u64 {
        self.lock().read(self.node, offset, width)
    }

    fn write(&self, offset: usize, width: AccessWidth, value: u64) {
        self.lock().write(self.node, offset, width, value)
    }

    fn size(&self) -> usize {
        dma_engine::npe::regs::WINDOW_SIZE
    }

    fn barrier(&self, _kind: Barrier) {
        // The engine's AXI reads see the simulated DRAM as it is: stores are already visible.
    }
}
