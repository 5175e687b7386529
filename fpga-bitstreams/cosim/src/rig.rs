//! Two engines and their memories behind one interface, built either from the Rust model
//! (`sim::npe::NpeModel`) or from the Verilated RTL ([`System`]), so one test program runs on
//! both and their results can be compared.

use std::sync::Arc;

use hal::PhysAddr;
use hal::dma::HostDma;
use hal::model::RegisterModel;
use hal::regs::AccessWidth;
use sim::axi::AxiTranslate;
use sim::des::ModelTime;
use sim::npe::{EngineCtx, Frame, NpeModel, NpeModelParams};

use crate::node_smmu::{CountingPort, NodeSmmu, Window};
use crate::system::System;

/// Channels of the RTL's default build (`CHANNELS`), and so of the model in comparisons.
pub const CHANNELS: u8 = 4;
/// log2 receive slots of the Verilated build (`build.rs` sets `SLOTS_LOG2`; the model's
/// default): enough that a test round never waits for a slot, so which frames are staged
/// does not depend on timing.
pub const SLOTS_LOG2: u8 = 6;
/// Where tests put source buffers.
pub const SRC_AT: u64 = 0x10_0000;
/// Bytes of the source window the rigs map.
pub const SRC_SPAN: u64 = 0x10_0000;
/// Where tests put destination buffers.
pub const DST_AT: u64 = 0x20_0000;
/// Bytes of the destination window the rigs map.
pub const DST_SPAN: u64 = 0x10_0000;
/// Stream ID of AXI ID 0 on the data port: that of the board description's first engine
/// (HP0), as in `sim`'s NPE model, so both rigs see the same streams.
pub const STREAM_BASE: u32 = boards::zynqmp::pl::ZCU102_PL.npes[0].stream_base().0;

/// Two engines, their DRAM and an MMU-500 per node ([`NodeSmmu`]).
pub trait Rig {
    /// A register write of `node`'s engine.
    fn write(&mut self, node: usize, offset: usize, width: AccessWidth, value: u64);
    /// A register read.
    fn read(&mut self, node: usize, offset: usize, width: AccessWidth) -> u64;
    /// `node`'s DRAM.
    fn dram(&self, node: usize) -> &HostDma;
    /// `node`'s MMU-500.
    fn smmu(&mut self, node: usize) -> &mut NodeSmmu;
    /// `node`'s MMU-500, to look at.
    fn smmu_ref(&self, node: usize) -> &NodeSmmu;
    /// Lets the engines run until nothing moves (or a bound on time).
    fn settle(&mut self);
    /// Corrupts the next packet sent on virtual channel `vc` (0 data, 1 control).
    fn link_corrupt_next(&mut self, vc: usize);
    /// A name for messages.
    fn name(&self) -> &'static str;
}

fn drams(pages: usize) -> Vec<Arc<HostDma>> {
    (0..2)
        .map(|_| Arc::new(HostDma::new(PhysAddr::new(0), pages).expect("host memory")))
        .collect()
}

/// The windows every node maps: sources read-only, destinations read-write.
pub const WINDOWS: [Window; 2] = [
    Window {
        base: SRC_AT,
        len: SRC_SPAN,
        writable: false,
    },
    Window {
        base: DST_AT,
        len: DST_SPAN,
        writable: true,
    },
];

fn smmus(drams: &[Arc<HostDma>]) -> Vec<NodeSmmu> {
    drams
        .iter()
        .map(|d| NodeSmmu::new(d, STREAM_BASE, &WINDOWS).expect("the node's MMU-500"))
        .collect()
}

/// The Rust model rig.
pub struct ModelRig {
    engines: Vec<NpeModel>,
    drams: Vec<Arc<HostDma>>,
    smmus: Vec<NodeSmmu>,
    ports: Vec<CountingPort>,
    now: ModelTime,
    corrupt: [u32; 2],
}

impl ModelRig {
    /// Two model engines with `pages` pages of DRAM each.
    pub fn new(pages: usize) -> Self {
        let engines = (0..2)
            .map(|n| {
                let mut p = NpeModelParams::new(n, 2);
                p.channels = CHANNELS;
                p.rx_slots_log2 = SLOTS_LOG2;
                p.stream_base = STREAM_BASE;
                NpeModel::new(p)
            })
            .collect();
        let drams = drams(pages);
        let smmus = smmus(&drams);
        let ports = smmus.iter().map(NodeSmmu::port).collect();
        Self {
            engines,
            drams,
            smmus,
            ports,
            now: ModelTime::ZERO,
            corrupt: [0; 2],
        }
    }
}

impl Rig for ModelRig {
    fn write(&mut self, node: usize, offset: usize, width: AccessWidth, value: u64) {
        // The test writes its rings before each register write: publish them (dsb st).
        self.engines[node].barrier(hal::barrier::Barrier::DsbSt);
        self.engines[node].write(offset, width, value);
    }

    fn read(&mut self, node: usize, offset: usize, width: AccessWidth) -> u64 {
        self.engines[node].read(offset, width)
    }

    fn dram(&self, node: usize) -> &HostDma {
        &self.drams[node]
    }

    fn smmu(&mut self, node: usize) -> &mut NodeSmmu {
        &mut self.smmus[node]
    }

    fn smmu_ref(&self, node: usize) -> &NodeSmmu {
        &self.smmus[node]
    }

    fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let mut frames: Vec<Frame> = Vec::new();
            let mut next: Option<ModelTime> = None;
            for n in 0..2 {
                let mut out = Vec::new();
                let mut ctx = EngineCtx {
                    now: self.now,
                    dram: &self.drams[n],
                    axi: &mut self.ports[n] as &mut dyn AxiTranslate,
                    out: &mut out,
                };
                let adv = self.engines[n].advance(&mut ctx);
                frames.append(&mut out);
                if let Some(t) = adv.next {
                    next = Some(next.map_or(t, |b: ModelTime| b.min(t)));
                }
            }
            let moved = !frames.is_empty();
            for mut f in frames {
                let vc = usize::from(f.payload.is_none());
                if self.corrupt[vc] > 0 {
                    self.corrupt[vc] -= 1;
                    f.crc_error = true;
                }
                let dst = f.dst;
                if let Some(e) = self.engines.get_mut(dst) {
                    e.deliver(f);
                }
            }
            if moved {
                continue;
            }
            match next {
                Some(t) if t > self.now => self.now = t,
                Some(_) => {}
                None => return,
            }
        }
    }

    fn link_corrupt_next(&mut self, vc: usize) {
        self.corrupt[vc] += 1;
    }

    fn name(&self) -> &'static str {
        "model"
    }
}

/// The RTL rig.
pub struct RtlRig {
    sys: System,
    drams: Vec<Arc<HostDma>>,
    smmus: Vec<NodeSmmu>,
    corrupt: Arc<std::sync::Mutex<[u32; 2]>>,
    /// Clocks a settle may take at most.
    pub settle_limit: u64,
}

impl RtlRig {
    /// Two Verilated engines with `pages` pages of DRAM each; `backpressure`: percentage of
    /// clocks the memory side holds each handshake.
    pub fn new(pages: usize, backpressure: u32, seed: u64) -> Self {
        let drams = drams(pages);
        let smmus = smmus(&drams);
        let boxed: Vec<Box<dyn AxiTranslate + Send>> = smmus
            .iter()
            .map(|s| Box::new(s.port()) as Box<dyn AxiTranslate + Send>)
            .collect();
        let mut sys = System::new(drams.clone(), boxed, STREAM_BASE, seed);
        sys.set_backpressure(backpressure);
        let corrupt = Arc::new(std::sync::Mutex::new([0u32; 2]));
        let c = corrupt.clone();
        // Corrupts one payload byte of the next packet's second flit on the chosen VC.
        let mut flit_no = [0u32; 2];
        sys.set_link_hook(Box::new(move |_dst, vc, flit| {
            flit_no[vc] += 1;
            let mut c = c.lock().unwrap_or_else(|e| e.into_inner());
            if c[vc] > 0 && flit_no[vc] == 2 {
                flit.data[0] ^= 0x100;
                c[vc] -= 1;
            }
            if flit.last {
                flit_no[vc] = 0;
            }
        }));
        Self {
            sys,
            drams,
            smmus,
            corrupt,
            settle_limit: 20_000_000,
        }
    }

    /// The system.
    pub fn system(&mut self) -> &mut System {
        &mut self.sys
    }
}

impl Rig for RtlRig {
    fn write(&mut self, node: usize, offset: usize, width: AccessWidth, value: u64) {
        self.sys.write(node, offset, width, value);
    }

    fn read(&mut self, node: usize, offset: usize, width: AccessWidth) -> u64 {
        self.sys.read(node, offset, width)
    }

    fn dram(&self, node: usize) -> &HostDma {
        &self.drams[node]
    }

    fn smmu(&mut self, node: usize) -> &mut NodeSmmu {
        &mut self.smmus[node]
    }

    fn smmu_ref(&self, node: usize) -> &NodeSmmu {
        &self.smmus[node]
    }

    fn settle(&mut self) {
        let mut quiet = 0;
        let start = self.sys.cycles();
        // Quiet: no handshake anywhere for 256 clocks (a stalled access holds the RTL's one
        // burst and everything queued behind it, links included, without being busy).
        while quiet < 256 && self.sys.cycles() - start < self.settle_limit {
            let before = self.sys.handshakes();
            self.sys.run(16);
            if self.sys.handshakes() != before {
                quiet = 0;
            } else {
                quiet += 16;
            }
        }
    }

    fn link_corrupt_next(&mut self, vc: usize) {
        self.corrupt.lock().unwrap_or_else(|e| e.into_inner())[vc] += 1;
    }

    fn name(&self) -> &'static str {
        "rtl"
    }
}
