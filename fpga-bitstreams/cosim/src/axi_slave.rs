//! The memory side of one of the engine's AXI4 master ports.
//!
//! The queue port reaches the node's DRAM by bus address (rings are pinned kernel memory,
//! docs/dma-engine.md §3); the data port goes through an SMMU ([`AxiTranslate`]) with the
//! stream `stream_base | AXI ID`. Per burst (a burst never crosses a 4 KiB page): translated
//! → data (or DECERR if nothing is at the physical address); terminated → SLVERR; stalled →
//! no response until software answers the stall (retry: translate again; terminate: SLVERR).
//! Every channel may be held back (`ready`/`valid` low) on a seeded pseudo-random pattern, so
//! the RTL's handshakes are exercised under back-pressure. The write address and write data
//! channels are independent (Arm IHI 0022, A3.3.1): per burst, on the [`WriteOrder`] drawn
//! from the seed, the slave takes the address first, the data first (AWREADY held until
//! WVALID is seen, which deadlocks a master that waits for AWREADY before WVALID), or either.

use std::collections::VecDeque;

use hal::dma::HostDma;
use hal::{Iova, PhysAddr};
use sim::axi::{AxiOutcome, AxiTranslate, StallResolution, StallToken};
use sim::des::ModelTime;
use smmu_driver::fault::{AccessKind, StreamId};

use crate::ffi::AxiPort;

const OKAY: u8 = 0;
const SLVERR: u8 = 2;
const DECERR: u8 = 3;

/// Where a burst stands with the SMMU.
#[derive(Clone, Copy, Debug)]
enum Xlate {
    /// Not asked yet.
    Pending,
    /// Held by the SMMU.
    Stalled(StallToken),
    /// Answered: a physical address, or an error response.
    Done(Result<PhysAddr, u8>),
}

#[derive(Debug)]
struct ReadBurst {
    id: u8,
    addr: u64,
    beats: u32,
    sent: u32,
    xlate: Xlate,
    /// The burst's bytes, read once translated.
    data: Vec<u8>,
    resp: u8,
}

/// One write burst, opened by whichever of its address and its first data beat came first.
#[derive(Debug)]
struct WriteBurst {
    /// `(AWID, AWADDR, beats)` once the address was accepted.
    addr: Option<(u8, u64, u32)>,
    data: Vec<([u8; 16], u16)>,
    /// WLAST seen.
    data_done: bool,
    xlate: Xlate,
    resp: Option<u8>,
}

/// Which of a write burst's address and data the slave accepts first (all legal for a slave,
/// Arm IHI 0022 A3.3.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WriteOrder {
    /// WREADY only once the burst's address was accepted.
    AddressFirst,
    /// AWREADY only once WVALID is seen for the burst.
    DataFirst,
    /// Either channel whenever there is room.
    Independent,
    /// One of the three above, drawn from the seed per burst.
    Mixed,
}

/// Counters of one port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Read bursts served.
    pub reads: u64,
    /// Write bursts served.
    pub writes: u64,
    /// Bursts answered with SLVERR or DECERR.
    pub errors: u64,
    /// Clocks a burst spent held by a stall.
    pub stalled_cycles: u64,
}

/// One AXI slave (see the module documentation).
#[derive(Debug)]
pub struct AxiSlave {
    translated: bool,
    stream_base: u32,
    rd: Option<ReadBurst>,
    wr: VecDeque<WriteBurst>,
    rng: u64,
    /// Percentage of clocks each ready/valid is held low (0: never).
    pub hold_percent: u32,
    /// The write channels' ordering.
    pub write_order: WriteOrder,
    /// The ordering of the current burst (`write_order`, or the draw for it when `Mixed`).
    burst_order: WriteOrder,
    stats: PortStats,
}

impl AxiSlave {
    /// A port; `translated` for the data port (through the SMMU).
    pub fn new(translated: bool, stream_base: u32, seed: u64) -> Self {
        Self {
            translated,
            stream_base,
            rd: None,
            wr: VecDeque::new(),
            rng: seed | 1,
            hold_percent: 0,
            write_order: WriteOrder::Mixed,
            burst_order: WriteOrder::DataFirst,
            stats: PortStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> PortStats {
        self.stats
    }

    /// Whether a burst is in flight and not held by a stall.
    pub fn busy(&self) -> bool {
        let held = |x: &Xlate| matches!(x, Xlate::Stalled(_));
        self.rd.as_ref().is_some_and(|r| !held(&r.xlate)) || self.wr.iter().any(|w| !held(&w.xlate))
    }

    fn go(&mut self) -> bool {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        (self.rng % 100) as u32 >= self.hold_percent
    }

    /// Draws the ordering of the next write burst.
    fn next_order(&mut self) {
        self.burst_order = match self.write_order {
            WriteOrder::Mixed => {
                self.go();
                match self.rng % 3 {
                    0 => WriteOrder::AddressFirst,
                    1 => WriteOrder::DataFirst,
                    _ => WriteOrder::Independent,
                }
            }
            fixed => fixed,
        };
    }

    fn translate(
        &mut self,
        xlate: Xlate,
        now: ModelTime,
        id: u8,
        addr: u64,
        write: bool,
        smmu: &mut dyn AxiTranslate,
    ) -> Xlate {
        if !self.translated {
            return Xlate::Done(Ok(PhysAddr::new(addr)));
        }
        let stream = StreamId(self.stream_base | u32::from(id & 0x3f));
        let access = if write {
            AccessKind::Write
        } else {
            AccessKind::Read
        };
        let ask = |smmu: &mut dyn AxiTranslate| match smmu.translate(
            now,
            stream,
            Iova::new(addr),
            access,
        ) {
            AxiOutcome::Ok(pa) => Xlate::Done(Ok(pa)),
            AxiOutcome::Terminated => Xlate::Done(Err(SLVERR)),
            AxiOutcome::Stalled(t) => Xlate::Stalled(t),
        };
        match xlate {
            Xlate::Pending => ask(smmu),
            Xlate::Stalled(token) => {
                self.stats.stalled_cycles += 1;
                match smmu.stall_outcome(token) {
                    None => Xlate::Stalled(token),
                    Some(StallResolution::Retry) => ask(smmu),
                    Some(StallResolution::Terminate) => Xlate::Done(Err(SLVERR)),
                }
            }
            done => done,
        }
    }

    /// Sets this clock's inputs of the port from its state and the engine's outputs `out`.
    pub fn drive(
        &mut self,
        p: &mut AxiPort,
        now: ModelTime,
        dram: &HostDma,
        smmu: &mut dyn AxiTranslate,
    ) {
        // Read: translate, fetch, then present beats.
        if let Some(mut rd) = self.rd.take() {
            if !matches!(rd.xlate, Xlate::Done(_)) {
                rd.xlate = self.translate(rd.xlate, now, rd.id, rd.addr, false, smmu);
                if let Xlate::Done(result) = rd.xlate {
                    rd.data = vec![0; rd.beats as usize * 16];
                    rd.resp = match result {
                        Ok(pa) => match dram.read_phys(pa, &mut rd.data) {
                            Ok(()) => OKAY,
                            Err(_) => DECERR,
                        },
                        Err(resp) => resp,
                    };
                    if rd.resp != OKAY {
                        self.stats.errors += 1;
                    }
                }
            }
            self.rd = Some(rd);
        }
        let go_r = self.go();
        let go_ar = self.go();
        p.rvalid = 0;
        if let Some(rd) = &self.rd
            && matches!(rd.xlate, Xlate::Done(_))
            && go_r
        {
            let at = rd.sent as usize * 16;
            let beat = &rd.data[at..at + 16];
            p.rdata = [
                u64::from_le_bytes(beat[..8].try_into().unwrap_or([0; 8])),
                u64::from_le_bytes(beat[8..].try_into().unwrap_or([0; 8])),
            ];
            p.rresp = rd.resp;
            p.rid = rd.id;
            p.rlast = u8::from(rd.sent + 1 == rd.beats);
            p.rvalid = 1;
        }
        p.arready = u8::from(self.rd.is_none() && go_ar);

        // Write: the oldest complete burst is translated and written, then answered.
        if let Some(wr) = self.wr.front()
            && let Some((id, addr, _)) = wr.addr
            && wr.data_done
            && wr.resp.is_none()
        {
            let xlate = self.translate(wr.xlate, now, id, addr, true, smmu);
            if let Some(wr) = self.wr.front_mut() {
                wr.xlate = xlate;
                if let Xlate::Done(result) = xlate {
                    let resp = match result {
                        Ok(pa) => write_beats(dram, pa, addr, &wr.data),
                        Err(resp) => resp,
                    };
                    if resp != OKAY {
                        self.stats.errors += 1;
                    }
                    wr.resp = Some(resp);
                }
            }
        }
        let go_b = self.go();
        let go_aw = self.go();
        let go_w = self.go();
        p.bvalid = 0;
        if let Some(WriteBurst {
            resp: Some(resp),
            addr: Some((id, _, _)),
            ..
        }) = self.wr.front()
            && go_b
        {
            p.bvalid = 1;
            p.bresp = *resp;
            p.bid = *id;
        }
        let room = self.wr.len() < 2;
        // The first burst still waiting for its address, and the first still taking data.
        let addr_slot = self.wr.iter().find(|w| w.addr.is_none());
        let data_slot = self.wr.iter().find(|w| !w.data_done);
        let w_ok = match self.burst_order {
            WriteOrder::AddressFirst => data_slot.is_some_and(|w| w.addr.is_some()),
            _ => data_slot.is_some() || room,
        };
        p.wready = u8::from(w_ok && go_w);
        let aw_ok = match self.burst_order {
            // The burst's data has begun, or its first beat is taken in this clock.
            WriteOrder::DataFirst => {
                addr_slot.is_some()
                    || (room && data_slot.is_none() && p.wvalid != 0 && p.wready != 0)
            }
            _ => addr_slot.is_some() || room,
        };
        p.awready = u8::from(aw_ok && go_aw);
    }

    /// The handshakes of the clock that just ended (`p`: the engine's outputs during it and
    /// the inputs driven); returns how many there were.
    pub fn commit(&mut self, p: &AxiPort) -> u64 {
        let moved = [
            p.arvalid & p.arready,
            p.rvalid & p.rready,
            p.awvalid & p.awready,
            p.wvalid & p.wready,
            p.bvalid & p.bready,
        ]
        .iter()
        .map(|&h| u64::from(h != 0))
        .sum();
        if p.arvalid != 0 && p.arready != 0 {
            self.rd = Some(ReadBurst {
                id: p.arid,
                addr: p.araddr,
                beats: u32::from(p.arlen) + 1,
                sent: 0,
                xlate: Xlate::Pending,
                data: Vec::new(),
                resp: OKAY,
            });
            self.stats.reads += 1;
        }
        if p.rvalid != 0 && p.rready != 0 {
            let done = self.rd.as_mut().is_some_and(|rd| {
                rd.sent += 1;
                rd.sent == rd.beats
            });
            if done {
                self.rd = None;
            }
        }
        if p.awvalid != 0 && p.awready != 0 {
            let addr = Some((p.awid, p.awaddr, u32::from(p.awlen) + 1));
            match self.wr.iter_mut().find(|w| w.addr.is_none()) {
                Some(w) => w.addr = addr,
                None => self.wr.push_back(WriteBurst {
                    addr,
                    ..WriteBurst::empty()
                }),
            }
            self.stats.writes += 1;
            self.next_order();
        }
        if p.wvalid != 0 && p.wready != 0 {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&p.wdata[0].to_le_bytes());
            bytes[8..].copy_from_slice(&p.wdata[1].to_le_bytes());
            let beat = (bytes, u16::from(p.wstrb_lo) | u16::from(p.wstrb_hi) << 8);
            if !self.wr.iter().any(|w| !w.data_done) {
                self.wr.push_back(WriteBurst::empty());
            }
            if let Some(w) = self.wr.iter_mut().find(|w| !w.data_done) {
                w.data.push(beat);
                w.data_done = p.wlast != 0;
            }
        }
        if p.bvalid != 0 && p.bready != 0 {
            self.wr.pop_front();
        }
        moved
    }
}

impl WriteBurst {
    fn empty() -> Self {
        Self {
            addr: None,
            data: Vec::new(),
            data_done: false,
            xlate: Xlate::Pending,
            resp: None,
        }
    }
}

/// Writes the strobed bytes of a burst at `pa` (the burst's address `addr` translated).
fn write_beats(dram: &HostDma, pa: PhysAddr, addr: u64, beats: &[([u8; 16], u16)]) -> u8 {
    let base = pa.as_u64() - (addr & 0xf);
    for (k, (data, strb)) in beats.iter().enumerate() {
        let at = PhysAddr::new(base + 16 * k as u64);
        let mut old = [0u8; 16];
        if dram.read_phys(at, &mut old).is_err() {
            return DECERR;
        }
        for (i, b) in old.iter_mut().enumerate() {
            if strb & (1 << i) != 0 {
                *b = data[i];
            }
        }
        if dram.write_phys(at, &old).is_err() {
            return DECERR;
        }
    }
    OKAY
}
