//! ZynqMP zDMA channel driver, simple (register) mode.
//!
//! One channel moves `len` bytes from a source bus address to a destination bus address. The
//! addresses are what the channel puts on its AXI master port: physical addresses when the
//! SMMU bypasses its stream, IOVAs when a context bank translates them (GDMA channel n has
//! stream ID 0x14E8 + n, ADMA 0x868 + n; zynqmp.dtsi `iommus`).
//!
//! Sequence (UG1085 "DMA Controller", simple mode; Linux `zynqmp_dma_config_simple_desc` and
//! `zynqmp_dma_start`):
//!
//! 1. [`ZdmaChannel::init`]: mask every interrupt (IDS), clear ISR by writing back the bits
//!    read, CTRL0 = simple mode (POINT_TYPE = 0) read/write (MODE = 0), the AXI cache
//!    attributes in DATA_ATTR and DSCR_ATTR (coherent or not, [`ZdmaConfig::coherent`]), clear
//!    the IRQ_*_ACCT counters by reading them.
//! 2. [`ZdmaChannel::start`]: SRC_DSCR_WORD0..3 (address low, high, size, control), DST_DSCR_WORD0..3
//!    (with INTR so DST_DSCR_DONE is raised), a store barrier so the buffer contents and
//!    descriptor words are visible, then CTRL2.EN.
//! 3. [`ZdmaChannel::poll`]: ISR.DMA_DONE means done; AXI_RD_DATA / AXI_WR_DATA mean the
//!    channel got an error response and stopped (this is how an SMMU terminate shows up on
//!    silicon). Either way the bits read are acknowledged by writing exactly them back (W1C).
//!
//! Byte counts come from TOTAL_BYTE relative to its value at `start`, so it does not matter
//! whether the register is write-1-to-clear (QEMU's model) or plain read/write.

pub mod regs;

use hal::barrier::Barrier;
use hal::delay::DelayNs;
use hal::regs::RegisterBus;
use tock_registers::interfaces::{ReadWriteable, Readable, Writeable};

use crate::{DmaError, Result};
use regs::{CTRL0, CTRL2, DATA_ATTR, DSCR_ATTR, DSCR_CTRL, DSCR_SIZE, INT, STATUS, ZdmaRegs};

/// Largest simple-mode transfer: the 30-bit SIZE field (Linux limits descriptors to 1 GiB).
pub const MAX_TRANSFER: u32 = (1 << 30) - 1;
/// Channel addresses are 49 bits (32 in WORD0, 17 in WORD1).
pub const ADDRESS_BITS: u32 = 49;

const ERROR_BITS: u32 = INT::AXI_RD_DATA::SET.value
    | INT::AXI_WR_DATA::SET.value
    | INT::AXI_RD_SRC_DSCR::SET.value
    | INT::AXI_RD_DST_DSCR::SET.value
    | INT::INV_APB::SET.value;
/// Every interrupt bit (Linux `ZYNQMP_DMA_IDS_DEFAULT_MASK` is 0xFFF).
const ALL_INTERRUPTS: u32 = 0xfff;
/// AxCACHE of coherent traffic: write-back, read- and write-allocate (Linux
/// `ZYNQMP_DMA_AXCACHE_VAL`, written when the channel is `dma-coherent`).
pub const AXCACHE_COHERENT: u32 = 0b1111;
/// AxCACHE of non-coherent data traffic: normal non-cacheable, the UG1087 reset value of
/// DATA_ATTR.ARCACHE/AWCACHE (0x0483_D20F).
pub const AXCACHE_NON_COHERENT: u32 = 0b0010;

/// Channel settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZdmaConfig {
    /// Coherent (snooping) AXI traffic, as Linux does for a `dma-coherent` channel: only with
    /// a coherent interconnect path (CCI snooping) set up. [`ZdmaChannel::init`] programs
    /// DATA_ATTR.ARCACHE/AWCACHE = [`AXCACHE_COHERENT`] and DSCR_ATTR = AXCOHRNT |
    /// AXCACHE [`AXCACHE_COHERENT`]; `start` sets WORD3.COHRNT in both descriptors. Without
    /// it `init` writes the non-coherent reset attributes ([`AXCACHE_NON_COHERENT`],
    /// DSCR_ATTR = 0), whatever an earlier owner left there.
    pub coherent: bool,
    /// How long [`ZdmaChannel::wait`] waits, in microseconds.
    pub timeout_us: u64,
    /// Poll interval in microseconds.
    pub poll_interval_us: u32,
}

impl ZdmaConfig {
    /// Non-coherent, 1 s timeout, 1 us polls.
    pub const DEFAULT: ZdmaConfig = ZdmaConfig {
        coherent: false,
        timeout_us: 1_000_000,
        poll_interval_us: 1,
    };
}

impl Default for ZdmaConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// One simple-mode copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transfer {
    /// Source bus address (IOVA when translated).
    pub src: u64,
    /// Destination bus address.
    pub dst: u64,
    /// Bytes, 1..=[`MAX_TRANSFER`].
    pub len: u32,
}

impl Transfer {
    fn validate(&self) -> Result<()> {
        if self.len == 0 || self.len > MAX_TRANSFER {
            return Err(DmaError::InvalidTransfer {
                what: "length must be 1..=2^30-1 bytes",
            });
        }
        let limit = 1u64 << ADDRESS_BITS;
        for start in [self.src, self.dst] {
            if start
                .checked_add(u64::from(self.len))
                .is_none_or(|end| end > limit)
            {
                return Err(DmaError::InvalidTransfer {
                    what: "addresses must fit 49 bits",
                });
            }
        }
        Ok(())
    }
}

/// A finished transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Completion {
    /// Bytes the channel counted (TOTAL_BYTE since `start`).
    pub bytes: u32,
}

/// Where a channel is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChannelStatus {
    /// No transfer started since the last completion.
    Idle,
    /// Running (or held by a stalled SMMU transaction).
    Busy,
    /// Just finished.
    Done(Completion),
}

/// A zDMA channel: owns its register window `B` and a delay `D` for bounded waits.
#[derive(Debug)]
pub struct ZdmaChannel<B, D> {
    bus: B,
    delay: D,
    config: ZdmaConfig,
    running: bool,
    baseline: u32,
}

impl<B: RegisterBus, D: DelayNs> ZdmaChannel<B, D> {
    /// A channel on `bus` (its 4 KiB register window). Call [`init`](Self::init) next.
    pub fn new(bus: B, delay: D, config: ZdmaConfig) -> Result<Self> {
        ZdmaRegs::new(&bus, 0)?;
        Ok(ZdmaChannel {
            bus,
            delay,
            config,
            running: false,
            baseline: 0,
        })
    }

    fn regs(&self) -> Result<ZdmaRegs<'_, B>> {
        Ok(ZdmaRegs::new(&self.bus, 0)?)
    }

    /// The register bus.
    pub fn bus(&self) -> &B {
        &self.bus
    }

    /// Puts the channel in simple mode with interrupts masked and status cleared. Fails with
    /// [`DmaError::Busy`] if the channel is running.
    pub fn init(&mut self) -> Result<()> {
        let regs = self.regs()?;
        if channel_active(&regs) {
            return Err(DmaError::Busy);
        }
        regs.ids().set(ALL_INTERRUPTS);
        let isr = regs.isr().get();
        regs.isr().set(isr);
        regs.ctrl0()
            .write(CTRL0::POINT_TYPE::Simple + CTRL0::MODE::ReadWrite);
        // AXI cache attributes of data and descriptor traffic (UG1087 ZDMA_CH_DATA_ATTR,
        // ZDMA_CH_DSCR_ATTR; Linux `zynqmp_dma_init`). DATA_ATTR is a plain control register
        // (burst type and length, QoS kept: a read-modify-write); QoS stays as it is, 0 for
        // descriptors, as in Linux.
        let (data_cache, descriptors) = if self.config.coherent {
            (
                AXCACHE_COHERENT,
                DSCR_ATTR::AXCOHRNT::SET + DSCR_ATTR::AXCACHE.val(AXCACHE_COHERENT),
            )
        } else {
            // The reset value: not coherent, AxCACHE 0.
            (
                AXCACHE_NON_COHERENT,
                DSCR_ATTR::AXCOHRNT::CLEAR + DSCR_ATTR::AXCACHE.val(0),
            )
        };
        regs.data_attr()
            .modify(DATA_ATTR::ARCACHE.val(data_cache) + DATA_ATTR::AWCACHE.val(data_cache));
        regs.dscr_attr()
            .write(descriptors + DSCR_ATTR::AXQOS.val(0));
        regs.ctrl2().write(CTRL2::EN::CLEAR);
        // Clear-on-read counters.
        let _ = regs.irq_src_acct().get();
        let _ = regs.irq_dst_acct().get();
        self.running = false;
        Ok(())
    }

    /// Unmasks (or masks) the completion and error interrupts (IEN/IDS), for callers that wait
    /// on the channel's SPI instead of polling.
    pub fn set_interrupts(&mut self, enabled: bool) -> Result<()> {
        let regs = self.regs()?;
        let bits = INT::DMA_DONE::SET.value | ERROR_BITS;
        if enabled {
            regs.ien().set(bits);
        } else {
            regs.ids().set(bits);
        }
        Ok(())
    }

    /// Whether the channel's interrupt output is asserted (ISR & !IMR).
    pub fn interrupt_pending(&self) -> Result<bool> {
        let regs = self.regs()?;
        Ok(regs.isr().get() & !regs.imr().get() & ALL_INTERRUPTS != 0)
    }

    /// Starts a copy. The caller must have made the source data visible to the device
    /// (`DmaMemory::sync_for_device` on non-coherent systems); the driver adds the store
    /// barrier before CTRL2.EN.
    pub fn start(&mut self, transfer: &Transfer) -> Result<()> {
        transfer.validate()?;
        let regs = self.regs()?;
        if self.running || channel_active(&regs) {
            return Err(DmaError::Busy);
        }
        let isr = regs.isr().get();
        if isr != 0 {
            regs.isr().set(isr);
        }
        let baseline = regs.total_byte().get();
        let coherent = if self.config.coherent {
            DSCR_CTRL::COHRNT::SET
        } else {
            DSCR_CTRL::COHRNT::CLEAR
        };
        regs.src_word0().set(transfer.src as u32);
        regs.src_word1().set((transfer.src >> 32) as u32);
        regs.src_word2().write(DSCR_SIZE::SIZE.val(transfer.len));
        regs.src_word3().write(coherent);
        regs.dst_word0().set(transfer.dst as u32);
        regs.dst_word1().set((transfer.dst >> 32) as u32);
        regs.dst_word2().write(DSCR_SIZE::SIZE.val(transfer.len));
        regs.dst_word3().write(coherent + DSCR_CTRL::INTR::SET);
        regs.barrier(Barrier::DsbSt);
        regs.ctrl2().write(CTRL2::EN::SET);
        self.baseline = baseline;
        self.running = true;
        Ok(())
    }

    /// Bytes transferred since the last `start`.
    pub fn bytes_transferred(&self) -> Result<u32> {
        Ok(self.regs()?.total_byte().get().wrapping_sub(self.baseline))
    }

    /// Checks the channel without waiting. A finished transfer is reported once
    /// ([`ChannelStatus::Done`]); an AXI error is returned as an error (retransmittable for
    /// data errors). Both acknowledge exactly the ISR bits read.
    pub fn poll(&mut self) -> Result<ChannelStatus> {
        poll_channel(&self.bus, &mut self.running, self.baseline)
    }

    /// Polls until the transfer finishes, fails, or the timeout expires
    /// ([`DmaError::Timeout`], e.g. while an SMMU stall is never resumed).
    pub fn wait(&mut self) -> Result<Completion> {
        let ZdmaChannel {
            bus,
            delay,
            config,
            running,
            baseline,
        } = self;
        let mut outcome = None;
        let waited =
            hal::delay::poll_until(delay, config.timeout_us, config.poll_interval_us, || {
                match poll_channel(bus, running, *baseline) {
                    Ok(ChannelStatus::Busy) => false,
                    Ok(ChannelStatus::Done(c)) => {
                        outcome = Some(Ok(c));
                        true
                    }
                    Ok(ChannelStatus::Idle) => {
                        outcome = Some(Err(DmaError::InvalidTransfer {
                            what: "no transfer was started",
                        }));
                        true
                    }
                    Err(e) => {
                        outcome = Some(Err(e));
                        true
                    }
                }
            });
        match (outcome, waited) {
            (Some(result), _) => result,
            (None, Err(hal::HalError::Timeout { waited_us })) => Err(DmaError::Timeout {
                waited_us,
                bytes: self.bytes_transferred()?,
            }),
            (None, Err(e)) => Err(e.into()),
            (None, Ok(waited_us)) => Err(DmaError::Timeout {
                waited_us,
                bytes: self.bytes_transferred()?,
            }),
        }
    }

    /// [`start`](Self::start) then [`wait`](Self::wait).
    pub fn transfer(&mut self, transfer: &Transfer) -> Result<Completion> {
        self.start(transfer)?;
        self.wait()
    }

    /// Whether a started transfer has not been reported yet.
    pub fn is_running(&self) -> bool {
        self.running
    }
}

/// Whether STATUS says the channel is in the middle of a transfer: busy or paused. The two
/// codes are 1 and 2 in either order (silicon and QEMU disagree, see [`STATUS`]); both are
/// "not done", so testing for either keeps the driver right on both.
fn channel_active<B: RegisterBus>(regs: &ZdmaRegs<'_, B>) -> bool {
    matches!(
        regs.status().read_as_enum(STATUS::STATE),
        Some(STATUS::STATE::Value::Busy | STATUS::STATE::Value::Paused)
    )
}

fn poll_channel<B: RegisterBus>(
    bus: &B,
    running: &mut bool,
    baseline: u32,
) -> Result<ChannelStatus> {
    if !*running {
        return Ok(ChannelStatus::Idle);
    }
    let regs = ZdmaRegs::new(bus, 0)?;
    let isr = regs.isr().get();
    if isr & (ERROR_BITS | INT::DMA_DONE::SET.value) == 0 {
        return Ok(ChannelStatus::Busy);
    }
    // W1C: acknowledge exactly what was read.
    regs.isr().set(isr);
    let bytes = regs.total_byte().get().wrapping_sub(baseline);
    *running = false;
    let has = |f: u32| isr & f != 0;
    if has(INT::AXI_RD_DATA::SET.value) {
        Err(DmaError::AxiRead { bytes })
    } else if has(INT::AXI_WR_DATA::SET.value) {
        Err(DmaError::AxiWrite { bytes })
    } else if has(INT::AXI_RD_SRC_DSCR::SET.value | INT::AXI_RD_DST_DSCR::SET.value) {
        Err(DmaError::DescriptorRead { isr })
    } else if has(INT::INV_APB::SET.value) {
        Err(DmaError::InvalidRegisterAccess)
    } else {
        Ok(ChannelStatus::Done(Completion { bytes }))
    }
}

#[cfg(test)]
mod tests;
