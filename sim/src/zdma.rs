//! A ZynqMP zDMA channel model, simple (register) mode.
//!
//! Registers, reset values and access types follow QEMU's `hw/dma/xlnx-zdma.c` (which
//! encodes UG1087's register database: ISR and TOTAL_BYTE W1C, IMR read-only behind IEN/IDS,
//! IRQ_*_ACCT clear on read, CTRL0 reset 0x80, DATA_ATTR reset 0x0483_D20F, 32-bit accesses
//! only, a decode error sets ISR.INV_APB); offsets also match Linux `zynqmp_dma.c`. STATUS
//! follows Xilinx's own driver instead, where QEMU differs (see [`state`]).
//!
//! Unlike QEMU's model, which ignores the result of its memory accesses, this one reports
//! an error response as silicon does: a failed data read sets ISR.AXI_RD_DATA, a failed write
//! ISR.AXI_WR_DATA, and the channel stops (STATUS = error, CTRL2.EN clear). Its memory
//! traffic goes through a [`MasterPort`] with the channel's stream ID, page-bounded bursts of
//! (ARLEN + 1) beats of the bus width (16 x 16 bytes on the GDMA), one burst outstanding. A
//! stalled burst holds the channel (STATUS busy) until the SMMU retries or terminates it.
//!
//! [`ZdmaModel::ignore_bus_errors`] makes it behave like QEMU's model instead: a burst that
//! got an error response reads as zeros or is dropped, and the transfer completes with
//! DMA_DONE. A driver cannot tell such a transfer from a good one by the channel alone.
//!
//! Not modelled: scatter-gather mode and the write-only/read-only modes (starting the channel
//! in them sets ISR.INV_APB and does nothing), rate control, pausing, FIXED bursts, several
//! outstanding bursts, and time.

use hal::model::RegisterModel;
use hal::regs::AccessWidth;

use crate::bus::{Access, AccessResult, DmaMaster, MasterPort, Progress, StallState, StallTicket};

const ISR: usize = 0x100;
const IMR: usize = 0x104;
const IEN: usize = 0x108;
const IDS: usize = 0x10c;
const CTRL0: usize = 0x110;
const CTRL1: usize = 0x114;
const FCI: usize = 0x118;
const STATUS: usize = 0x11c;
const DATA_ATTR: usize = 0x120;
const DSCR_ATTR: usize = 0x124;
const SRC_DSCR: usize = 0x128;
const DST_DSCR: usize = 0x138;
const WR_ONLY: usize = 0x148;
const SRC_START: usize = 0x158;
const DST_START: usize = 0x160;
const SRC_CUR_PYLD: usize = 0x168;
const DST_CUR_PYLD: usize = 0x170;
const SRC_CUR_DSCR: usize = 0x178;
const DST_CUR_DSCR: usize = 0x180;
const TOTAL_BYTE: usize = 0x188;
const RATE_CNTL: usize = 0x18c;
const IRQ_SRC_ACCT: usize = 0x190;
const IRQ_DST_ACCT: usize = 0x194;
const DBG0: usize = 0x198;
const DBG1: usize = 0x19c;
const CTRL2: usize = 0x200;

/// ISR bits (QEMU `ZDMA_CH_ISR` fields).
pub mod isr {
    /// Invalid APB access.
    pub const INV_APB: u32 = 1 << 0;
    /// A source descriptor with INTR finished.
    pub const SRC_DSCR_DONE: u32 = 1 << 1;
    /// A destination descriptor with INTR finished.
    pub const DST_DSCR_DONE: u32 = 1 << 2;
    /// TOTAL_BYTE wrapped (QEMU `BYTE_CNT_OVRFL`).
    pub const BYTE_CNT_OVRFL: u32 = 1 << 3;
    /// IRQ_SRC_ACCT wrapped past 0xff (QEMU `IRQ_SRC_ACCT_ERR`).
    pub const IRQ_SRC_ACCT_ERR: u32 = 1 << 4;
    /// IRQ_DST_ACCT wrapped past 0xff (QEMU `IRQ_DST_ACCT_ERR`).
    pub const IRQ_DST_ACCT_ERR: u32 = 1 << 5;
    /// Error response on a data read.
    pub const AXI_RD_DATA: u32 = 1 << 8;
    /// Error response on a data write.
    pub const AXI_WR_DATA: u32 = 1 << 9;
    /// Transfer done.
    pub const DMA_DONE: u32 = 1 << 10;
    /// Every implemented bit.
    pub const ALL: u32 = 0xfff;
}

/// STATUS.STATE values, as silicon reports them (Xilinx embeddedsw `xzdma_hw.h`
/// `XZDMA_STS_*`; QEMU's `xlnx-zdma` reports a running channel as 1, its paused code).
pub mod state {
    /// Idle / done.
    pub const IDLE: u32 = 0;
    /// Paused (not modelled: no descriptor command pauses a simple-mode transfer).
    pub const PAUSED: u32 = 1;
    /// Running.
    pub const BUSY: u32 = 2;
    /// Done with an error.
    pub const ERROR: u32 = 3;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Read,
    ReadWait(StallTicket),
    Write,
    WriteWait(StallTicket),
}

#[derive(Clone, Debug)]
struct Job {
    src: u64,
    dst: u64,
    remaining: u32,
    chunk: usize,
    buf: Vec<u8>,
    phase: Phase,
}

/// Counters of the channel model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZdmaStats {
    /// Transfers started.
    pub started: u64,
    /// Transfers completed.
    pub completed: u64,
    /// Transfers stopped by an error response.
    pub failed: u64,
    /// Bursts that were stalled by the SMMU.
    pub stalled_bursts: u64,
    /// Bursts retried after a stall.
    pub retried_bursts: u64,
    /// Register accesses the channel rejected (ISR.INV_APB).
    pub invalid_accesses: u64,
    /// Bursts that got an error response the channel did not report
    /// ([`ZdmaModel::ignore_bus_errors`]).
    pub ignored_errors: u64,
}

/// One zDMA channel.
#[derive(Clone, Debug)]
pub struct ZdmaModel {
    stream: u32,
    bus_bytes: usize,
    err_ctrl: u32,
    isr: u32,
    imr: u32,
    ctrl0: u32,
    ctrl1: u32,
    state: u32,
    data_attr: u32,
    dscr_attr: u32,
    src_dscr: [u32; 4],
    dst_dscr: [u32; 4],
    wr_only: [u32; 4],
    src_start: [u32; 2],
    dst_start: [u32; 2],
    total_byte: u32,
    rate_cntl: u32,
    irq_src_acct: u32,
    irq_dst_acct: u32,
    ctrl2: u32,
    job: Option<Job>,
    reports_bus_errors: bool,
    stats: ZdmaStats,
}

impl ZdmaModel {
    /// A channel in its reset state, mastering with `stream`, with a data bus of
    /// `bus_bits` (128 for GDMA, 64 for ADMA).
    pub fn new(stream: u32, bus_bits: usize) -> Self {
        ZdmaModel {
            stream,
            bus_bytes: (bus_bits / 8).max(1),
            err_ctrl: 0,
            isr: 0,
            imr: isr::ALL,
            ctrl0: 0x80,
            ctrl1: 0x3ff,
            state: state::IDLE,
            data_attr: 0x0483_d20f,
            dscr_attr: 0,
            src_dscr: [0; 4],
            dst_dscr: [0; 4],
            wr_only: [0; 4],
            src_start: [0; 2],
            dst_start: [0; 2],
            total_byte: 0,
            rate_cntl: 0,
            irq_src_acct: 0,
            irq_dst_acct: 0,
            ctrl2: 0,
            job: None,
            reports_bus_errors: true,
            stats: ZdmaStats::default(),
        }
    }

    /// Makes the channel ignore error responses as QEMU's `hw/dma/xlnx-zdma.c` does: a read
    /// that failed returns zeros, a write that failed is dropped, and the transfer goes on
    /// to DMA_DONE (see the module docs).
    pub fn ignore_bus_errors(&mut self) {
        self.reports_bus_errors = false;
    }

    /// The stream ID of the channel's AXI master.
    pub fn stream(&self) -> u32 {
        self.stream
    }

    /// The counters.
    pub fn stats(&self) -> &ZdmaStats {
        &self.stats
    }

    /// The interrupt output: ISR & !IMR.
    pub fn interrupt(&self) -> bool {
        self.isr & !self.imr & isr::ALL != 0
    }

    /// Whether a transfer is in progress.
    pub fn busy(&self) -> bool {
        self.job.is_some()
    }

    /// Whether the transfer in progress waits on a stalled SMMU transaction.
    pub fn held_by_smmu(&self) -> bool {
        matches!(
            self.job.as_ref().map(|j| j.phase),
            Some(Phase::ReadWait(_) | Phase::WriteWait(_))
        )
    }

    /// The raw ISR (for tests).
    pub fn isr(&self) -> u32 {
        self.isr
    }

    fn burst_bytes(&self) -> usize {
        let arlen = ((self.data_attr >> 14) & 0xf) as usize;
        (arlen + 1) * self.bus_bytes
    }

    fn start(&mut self) {
        if self.job.is_some() {
            return;
        }
        let simple = self.ctrl0 & (1 << 6) == 0;
        let read_write = (self.ctrl0 >> 4) & 3 == 0;
        if !simple || !read_write {
            self.stats.invalid_accesses += 1;
            self.isr |= isr::INV_APB;
            self.ctrl2 = 0;
            return;
        }
        let addr = |w: &[u32; 4]| u64::from(w[0]) | u64::from(w[1] & 0x1_ffff) << 32;
        let len = self.src_dscr[2] & 0x3fff_ffff;
        self.stats.started += 1;
        self.state = state::BUSY;
        self.ctrl2 = 1;
        let chunk = self.burst_bytes();
        self.job = Some(Job {
            src: addr(&self.src_dscr),
            dst: addr(&self.dst_dscr),
            remaining: len,
            chunk,
            buf: vec![0; chunk],
            phase: Phase::Read,
        });
        if len == 0 {
            self.complete();
        }
    }

    fn complete(&mut self) {
        self.job = None;
        self.isr |= isr::DMA_DONE;
        // The 8-bit interrupt accounting counters flag their overflow (QEMU zdma_src_done /
        // zdma_dst_done).
        if self.src_dscr[3] & (1 << 2) != 0 {
            self.isr |= isr::SRC_DSCR_DONE;
            if self.irq_src_acct == 0xff {
                self.isr |= isr::IRQ_SRC_ACCT_ERR;
            }
            self.irq_src_acct = (self.irq_src_acct + 1) & 0xff;
        }
        if self.dst_dscr[3] & (1 << 2) != 0 {
            self.isr |= isr::DST_DSCR_DONE;
            if self.irq_dst_acct == 0xff {
                self.isr |= isr::IRQ_DST_ACCT_ERR;
            }
            self.irq_dst_acct = (self.irq_dst_acct + 1) & 0xff;
        }
        self.ctrl2 = 0;
        self.state = state::IDLE;
        self.stats.completed += 1;
    }

    fn fail(&mut self, bit: u32) {
        self.job = None;
        self.isr |= bit;
        self.ctrl2 = 0;
        self.state = state::ERROR;
        self.stats.failed += 1;
    }

    fn reject(&mut self) -> u64 {
        self.stats.invalid_accesses += 1;
        self.isr |= isr::INV_APB;
        0
    }
}

fn page_room(addr: u64) -> usize {
    (0x1000 - (addr & 0xfff)) as usize
}

impl DmaMaster for ZdmaModel {
    fn step(&mut self, port: &mut dyn MasterPort) -> Progress {
        let stream = self.stream;
        let Some(job) = self.job.as_mut() else {
            return Progress::Idle;
        };
        let len = (job.remaining as usize)
            .min(job.chunk)
            .min(page_room(job.src))
            .min(page_room(job.dst));
        let access = |address, write| Access {
            stream,
            address,
            len,
            write,
            privileged: false,
            instruction: false,
        };
        match job.phase {
            Phase::Read => match port.read(&access(job.src, false), &mut job.buf[..len]) {
                AccessResult::Ok => job.phase = Phase::Write,
                AccessResult::Stalled(t) => {
                    job.phase = Phase::ReadWait(t);
                    self.stats.stalled_bursts += 1;
                    return Progress::Blocked;
                }
                AccessResult::Err(_) => self.read_failed(len),
            },
            Phase::ReadWait(t) => match port.stall_state(t) {
                StallState::Held => return Progress::Blocked,
                StallState::Retry => {
                    job.phase = Phase::Read;
                    self.stats.retried_bursts += 1;
                }
                StallState::TerminatedSilently => {
                    job.buf[..len].fill(0);
                    job.phase = Phase::Write;
                }
                StallState::Terminated(_) | StallState::Unknown => self.read_failed(len),
            },
            Phase::Write => match port.write(&access(job.dst, true), &job.buf[..len]) {
                AccessResult::Ok => self.burst_written(len),
                AccessResult::Stalled(t) => {
                    job.phase = Phase::WriteWait(t);
                    self.stats.stalled_bursts += 1;
                    return Progress::Blocked;
                }
                AccessResult::Err(_) => self.write_failed(len),
            },
            Phase::WriteWait(t) => match port.stall_state(t) {
                StallState::Held => return Progress::Blocked,
                StallState::Retry => {
                    job.phase = Phase::Write;
                    self.stats.retried_bursts += 1;
                }
                StallState::TerminatedSilently => self.burst_written(len),
                StallState::Terminated(_) | StallState::Unknown => self.write_failed(len),
            },
        }
        Progress::Advanced
    }
}

impl ZdmaModel {
    /// A data read got an error response.
    fn read_failed(&mut self, len: usize) {
        if self.reports_bus_errors {
            return self.fail(isr::AXI_RD_DATA);
        }
        self.stats.ignored_errors += 1;
        if let Some(job) = self.job.as_mut() {
            job.buf[..len].fill(0);
            job.phase = Phase::Write;
        }
    }

    /// A data write got an error response.
    fn write_failed(&mut self, len: usize) {
        if self.reports_bus_errors {
            return self.fail(isr::AXI_WR_DATA);
        }
        self.stats.ignored_errors += 1;
        self.burst_written(len);
    }

    fn burst_written(&mut self, len: usize) {
        let (total, wrapped) = self.total_byte.overflowing_add(len as u32);
        self.total_byte = total;
        if wrapped {
            self.isr |= isr::BYTE_CNT_OVRFL;
        }
        let Some(job) = self.job.as_mut() else {
            return;
        };
        job.src += len as u64;
        job.dst += len as u64;
        job.remaining -= len as u32;
        job.phase = Phase::Read;
        if job.remaining == 0 {
            self.complete();
        }
    }
}

impl RegisterModel for ZdmaModel {
    fn size(&self) -> usize {
        0x1000
    }

    fn read(&mut self, offset: usize, width: AccessWidth) -> u64 {
        if width != AccessWidth::U32 {
            return self.reject();
        }
        let cur = |addr: u64, high: bool| {
            if high {
                (addr >> 32) as u32
            } else {
                addr as u32
            }
        };
        let (src, dst) = self.job.as_ref().map_or((0, 0), |j| (j.src, j.dst));
        u64::from(match offset {
            0x000 => self.err_ctrl,
            ISR => self.isr,
            IMR => self.imr,
            CTRL0 => self.ctrl0,
            CTRL1 => self.ctrl1,
            FCI => 0,
            STATUS => self.state,
            DATA_ATTR => self.data_attr,
            DSCR_ATTR => self.dscr_attr,
            o if (SRC_DSCR..SRC_DSCR + 16).contains(&o) => self.src_dscr[(o - SRC_DSCR) / 4],
            o if (DST_DSCR..DST_DSCR + 16).contains(&o) => self.dst_dscr[(o - DST_DSCR) / 4],
            o if (WR_ONLY..WR_ONLY + 16).contains(&o) => self.wr_only[(o - WR_ONLY) / 4],
            o if (SRC_START..SRC_START + 8).contains(&o) => self.src_start[(o - SRC_START) / 4],
            o if (DST_START..DST_START + 8).contains(&o) => self.dst_start[(o - DST_START) / 4],
            o if (SRC_CUR_PYLD..SRC_CUR_PYLD + 8).contains(&o) => cur(src, o != SRC_CUR_PYLD),
            o if (DST_CUR_PYLD..DST_CUR_PYLD + 8).contains(&o) => cur(dst, o != DST_CUR_PYLD),
            o if (SRC_CUR_DSCR..DST_CUR_DSCR + 8).contains(&o) => 0,
            TOTAL_BYTE => self.total_byte,
            RATE_CNTL => self.rate_cntl,
            IRQ_SRC_ACCT => std::mem::take(&mut self.irq_src_acct),
            IRQ_DST_ACCT => std::mem::take(&mut self.irq_dst_acct),
            DBG0 | DBG1 => 0,
            CTRL2 => self.ctrl2,
            _ => return self.reject(),
        })
    }

    fn write(&mut self, offset: usize, width: AccessWidth, value: u64) {
        if width != AccessWidth::U32 {
            self.reject();
            return;
        }
        let v = value as u32;
        match offset {
            0x000 => self.err_ctrl = v & 1,
            ISR => self.isr &= !(v & isr::ALL),
            IMR => {}
            IEN => self.imr &= !(v & isr::ALL),
            IDS => self.imr |= v & isr::ALL,
            CTRL0 => self.ctrl0 = v & 0xfe,
            CTRL1 => self.ctrl1 = v & 0x3ff,
            FCI | STATUS => {}
            DATA_ATTR => self.data_attr = v & 0x0fff_ffff,
            DSCR_ATTR => self.dscr_attr = v & 0x1ff,
            o if (SRC_DSCR..SRC_DSCR + 16).contains(&o) => self.src_dscr[(o - SRC_DSCR) / 4] = v,
            o if (DST_DSCR..DST_DSCR + 16).contains(&o) => self.dst_dscr[(o - DST_DSCR) / 4] = v,
            o if (WR_ONLY..WR_ONLY + 16).contains(&o) => self.wr_only[(o - WR_ONLY) / 4] = v,
            o if (SRC_START..SRC_START + 8).contains(&o) => self.src_start[(o - SRC_START) / 4] = v,
            o if (DST_START..DST_START + 8).contains(&o) => self.dst_start[(o - DST_START) / 4] = v,
            o if (SRC_CUR_PYLD..DST_CUR_DSCR + 8).contains(&o) => {}
            TOTAL_BYTE => self.total_byte &= !v,
            RATE_CNTL => self.rate_cntl = v & 0xfff,
            IRQ_SRC_ACCT | IRQ_DST_ACCT | DBG0 | DBG1 => {}
            CTRL2 => {
                if v & 1 != 0 {
                    self.start();
                }
            }
            _ => {
                self.reject();
            }
        }
    }
}
