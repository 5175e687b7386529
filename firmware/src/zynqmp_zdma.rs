//! The ZynqMP program's part for a machine without an MMU-500: deciding from the SMMU's ID
//! registers whether one is there at all, and, when none is, zDMA copies between physical
//! buffers on GDMA channels 0 and 1 with every byte checked, plus transfers to an address
//! nothing decodes. Portable (tested on the host against the `sim` ZynqMP); the
//! `zynqmp-smmu-faults` program runs it through MMIO.
//!
//! # Is there an SMMU?
//! QEMU's `xlnx-zcu102` machine models no MMU-500: nothing is mapped at 0xFD80_0000, and the
//! machine sets `ignore_memory_transaction_failures` (QEMU `hw/arm/xlnx-zcu102.c`), so a CPU
//! read there returns 0 instead of aborting. On a board whose SMMU is powered down or
//! isolated, the read may instead get an error response (an external abort). So the program
//! reads IDR0, IDR1, IDR2 and IDR7 with `rt::probe_read32`, which survives an abort, and
//! [`decide`] calls the SMMU present only if the values make sense for an SMMUv2 (IHI0062,
//! `SMMU_IDR0`/`IDR1`/`IDR2`): a translation stage, context banks, stream-match groups if
//! stream matching is implemented, a register space that fits the window, address sizes with
//! defined encodings. All zeroes (nothing decodes) and all ones (a floating bus) are absent.
//! The ZynqMP's own value of IDR1 is 0x3000_0F10 (UG1087 `SMMU_SIDR1`); a plausible SMMU
//! with another value is still present, and is said to differ.
//!
//! # zDMA without an SMMU
//! [`run_copies`] moves data between two 2 MiB DMA buffers with `dma_engine::zdma` in simple
//! mode, on both channels, over the sizes and byte offsets of [`COPIES`] (1 byte to 1 MiB,
//! unaligned starts and ends, page crossings). Before each copy the destination holds the
//! complement of what must arrive and [`GUARD`] bytes of [`SENTINEL`] on either side; after
//! it every byte must be the source's, both guards intact, and TOTAL_BYTE must count the
//! length.
//!
//! Then the bus-error path: channel 0 reads [`UNDECODED`] bytes from an address nothing
//! decodes, channel 1 writes there. Silicon answers such an access with an error response,
//! which the channel reports as ISR.AXI_RD_DATA / AXI_WR_DATA (`DmaError::AxiRead` /
//! `AxiWrite`). QEMU's model (`hw/dma/xlnx-zdma.c`) ignores the result of its
//! `address_space_read`/`write` calls and finishes with DMA_DONE. Both are accepted and
//! reported ([`BusErrorOutcome`]); what must not happen is a hang, another error, or a
//! channel that is unusable afterwards: each channel copies once more, checked, after it.

use core::fmt;

use dma_engine::DmaError;
use dma_engine::zdma::{Transfer, ZdmaChannel};
use hal::delay::DelayNs;
use hal::dma::{DMA_PAGE, DmaDirection, DmaMemory, DmaRegion};
use hal::regs::RegisterBus;

use crate::exception::ProbeFault;
use crate::{FirmwareError, Result, Verdict};

/// The SMMU ID registers read, with their offsets in the MMU-500's global register page
/// (IHI0062 `SMMU_IDR0`-`IDR2`, `IDR7`; UG1087 `SMMU_SIDRn`).
pub const SMMU_ID_REGISTERS: [(&str, u64); 4] = [
    ("IDR0", 0x20),
    ("IDR1", 0x24),
    ("IDR2", 0x28),
    ("IDR7", 0x3c),
];

/// IDR1 of the ZynqMP's MMU-500 (UG1087 `SMMU_SIDR1` reset value: 16 context banks, 16
/// global pages of 4 KiB).
pub const ZYNQMP_IDR1: u32 = 0x3000_0f10;

/// The ID register values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmmuIds {
    /// IDR0.
    pub idr0: u32,
    /// IDR1.
    pub idr1: u32,
    /// IDR2.
    pub idr2: u32,
    /// IDR7 (implementation revision: MAJOR 7:4, MINOR 3:0).
    pub idr7: u32,
}

impl SmmuIds {
    fn all(&self) -> [u32; 4] {
        [self.idr0, self.idr1, self.idr2, self.idr7]
    }
}

/// Why the SMMU is taken to be absent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Absence {
    /// Reading an ID register raised an abort (or left an SError pending).
    ReadFault {
        /// The register.
        register: &'static str,
        /// What the read did.
        fault: ProbeFault,
    },
    /// Every ID register reads 0: nothing answers at the window (QEMU `xlnx-zcu102`).
    ReadsZero,
    /// Every ID register reads all ones: a floating or unclocked bus.
    ReadsOnes,
    /// The values are not an SMMUv2's.
    Implausible {
        /// The first rule broken.
        what: &'static str,
        /// The values read.
        ids: SmmuIds,
    },
}

impl Absence {
    /// A few words for the verdict line, which has room for 200 bytes; the console line
    /// before it has the whole story ([`fmt::Display`]).
    pub fn brief(&self) -> &'static str {
        match self {
            Absence::ReadFault {
                fault: ProbeFault::Abort { .. },
                ..
            } => "an ID register read aborted",
            Absence::ReadFault {
                fault: ProbeFault::SErrorPending,
                ..
            } => "an ID register read left an SError pending",
            Absence::ReadsZero => "IDR0/1/2/7 read 0",
            Absence::ReadsOnes => "IDR0/1/2/7 read all ones",
            Absence::Implausible { .. } => "implausible ID registers",
        }
    }
}

impl fmt::Display for Absence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Absence::ReadFault { register, fault } => write!(f, "reading {register}: {fault}"),
            Absence::ReadsZero => f.write_str("IDR0/1/2/7 read 0"),
            Absence::ReadsOnes => f.write_str("IDR0/1/2/7 read all ones"),
            Absence::Implausible { what, ids } => write!(
                f,
                "{what} (IDR0 {:#x}, IDR1 {:#x}, IDR2 {:#x}, IDR7 {:#x})",
                ids.idr0, ids.idr1, ids.idr2, ids.idr7
            ),
        }
    }
}

/// The same text as [`fmt::Display`]'s, for defmt.
#[cfg(target_os = "none")]
impl defmt::Format for Absence {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            Absence::ReadFault { register, fault } => {
                defmt::write!(f, "reading {=str}: {}", register, fault)
            }
            Absence::ReadsZero => defmt::write!(f, "IDR0/1/2/7 read 0"),
            Absence::ReadsOnes => defmt::write!(f, "IDR0/1/2/7 read all ones"),
            Absence::Implausible { what, ids } => defmt::write!(
                f,
                "{=str} (IDR0 {=u32:#x}, IDR1 {=u32:#x}, IDR2 {=u32:#x}, IDR7 {=u32:#x})",
                what,
                ids.idr0,
                ids.idr1,
                ids.idr2,
                ids.idr7
            ),
        }
    }
}

/// What the ID registers say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmmuPresence {
    /// An SMMUv2 answers.
    Present {
        /// The values read.
        ids: SmmuIds,
        /// Whether IDR1 is the ZynqMP's [`ZYNQMP_IDR1`].
        matches_zynqmp: bool,
    },
    /// No SMMU answers.
    Absent(Absence),
}

/// Decides from the ID registers whether an SMMUv2 answers in a register window of
/// `window` bytes (see the module docs for the rules).
pub fn decide(ids: SmmuIds, window: u64) -> SmmuPresence {
    if ids.all() == [0; 4] {
        return SmmuPresence::Absent(Absence::ReadsZero);
    }
    if ids.all() == [u32::MAX; 4] {
        return SmmuPresence::Absent(Absence::ReadsOnes);
    }
    let bits = |v: u32, lsb: u32, width: u32| (v >> lsb) & ((1 << width) - 1);
    let s1ts = bits(ids.idr0, 30, 1) == 1;
    let s2ts = bits(ids.idr0, 29, 1) == 1;
    let sms = bits(ids.idr0, 27, 1) == 1;
    let numsmrg = bits(ids.idr0, 0, 8);
    let numcb = bits(ids.idr1, 0, 8);
    let nums2cb = bits(ids.idr1, 16, 8);
    let numpage = 1u64 << (bits(ids.idr1, 28, 3) + 1);
    let pagesize: u64 = if bits(ids.idr1, 31, 1) == 1 {
        0x1_0000
    } else {
        0x1000
    };
    let ias = bits(ids.idr2, 0, 4);
    let oas = bits(ids.idr2, 4, 4);
    let rule = if !s1ts && !s2ts {
        Some("no translation stage (IDR0.S1TS and S2TS clear)")
    } else if sms && numsmrg == 0 {
        Some("stream matching without stream-match groups (IDR0.NUMSMRG 0)")
    } else if numcb == 0 {
        Some("no context banks (IDR1.NUMCB 0)")
    } else if nums2cb > numcb {
        Some("more stage-2 context banks than context banks")
    } else if u64::from(numcb) > numpage {
        Some("more context banks than context bank pages")
    } else if 2 * numpage * pagesize > window {
        Some("register space larger than the window")
    } else if ias > 5 || oas > 5 {
        Some("reserved address size encoding (IDR2.IAS/OAS)")
    } else {
        None
    };
    match rule {
        Some(what) => SmmuPresence::Absent(Absence::Implausible { what, ids }),
        None => SmmuPresence::Present {
            ids,
            matches_zynqmp: ids.idr1 == ZYNQMP_IDR1,
        },
    }
}

/// Reads the ID registers of the SMMU at `base` with `read` (a survivable read such as
/// `rt::probe_read32`) and decides. The first read that faults makes the SMMU absent; no
/// further register is read.
pub fn probe_smmu(
    base: u64,
    window: u64,
    mut read: impl FnMut(u64) -> core::result::Result<u32, ProbeFault>,
) -> SmmuPresence {
    let mut values = [0u32; 4];
    for ((register, offset), value) in SMMU_ID_REGISTERS.iter().zip(values.iter_mut()) {
        match read(base + offset) {
            Ok(v) => *value = v,
            Err(fault) => return SmmuPresence::Absent(Absence::ReadFault { register, fault }),
        }
    }
    let [idr0, idr1, idr2, idr7] = values;
    decide(
        SmmuIds {
            idr0,
            idr1,
            idr2,
            idr7,
        },
        window,
    )
}

/// One checked copy: `len` bytes on GDMA channel `channel`, from `src_offset` into the
/// source buffer to `dst_offset` into the destination buffer (both past the leading guard).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyCase {
    /// Channel index (0 or 1).
    pub channel: u8,
    /// Bytes.
    pub len: u32,
    /// Offset of the first source byte.
    pub src_offset: u32,
    /// Offset of the first destination byte.
    pub dst_offset: u32,
}

const fn case(channel: u8, len: u32, src_offset: u32, dst_offset: u32) -> CopyCase {
    CopyCase {
        channel,
        len,
        src_offset,
        dst_offset,
    }
}

/// The copies, both channels alike with the offsets swapped: single bytes, odd lengths,
/// lengths one short of, at and one past a 4 KiB page, unaligned starts, 64 KiB and 1 MiB.
pub const COPIES: [CopyCase; 22] = [
    case(0, 1, 0, 0),
    case(0, 7, 1, 3),
    case(0, 64, 0, 0),
    case(0, 100, 3, 5),
    case(0, 4095, 1, 2),
    case(0, 4096, 0, 0),
    case(0, 4097, 4095, 1),
    case(0, 65_536, 0, 0),
    case(0, 65_553, 13, 7),
    case(0, 300_000, 8, 24),
    case(0, 1 << 20, 0, 0),
    case(1, 1, 0, 0),
    case(1, 7, 3, 1),
    case(1, 64, 0, 0),
    case(1, 100, 5, 3),
    case(1, 4095, 2, 1),
    case(1, 4096, 0, 0),
    case(1, 4097, 1, 4095),
    case(1, 65_536, 0, 0),
    case(1, 65_553, 7, 13),
    case(1, 300_000, 24, 8),
    case(1, 1 << 20, 0, 0),
];

/// Bytes before and after every destination that a copy must leave alone.
pub const GUARD: usize = 64;
/// What the guards hold.
pub const SENTINEL: u8 = 0xa5;
/// Size of each of the two DMA buffers (source and destination).
pub const BUFFER_BYTES: usize = 2 << 20;
/// Bytes of each bus-error transfer.
pub const UNDECODED: u32 = 256;
/// Bytes of the copy each channel makes after its bus-error transfer.
pub const RECOVERY_LEN: u32 = 4096;

/// Which side of a bus-error transfer is at the undecoded address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The channel reads from it.
    Read,
    /// The channel writes to it.
    Write,
}

/// What a channel did with a transfer to an address nothing decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BusErrorOutcome {
    /// It stopped with an AXI error (silicon: the interconnect's decode error response).
    Reported(DmaError),
    /// It finished without an error (QEMU's zDMA model ignores failed accesses).
    NotReported {
        /// Bytes TOTAL_BYTE counted.
        bytes: u32,
    },
}

/// One bus-error transfer and its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusErrorProbe {
    /// Channel index.
    pub channel: u8,
    /// Which side was undecoded.
    pub side: Side,
    /// The undecoded address.
    pub addr: u64,
    /// What happened.
    pub outcome: BusErrorOutcome,
    /// For a read: how many of the destination's bytes changed (its sentinel was
    /// overwritten); `None` for a write.
    pub written: Option<u32>,
}

/// A line of [`run_copies`]: one per transfer. The target logs it through defmt
/// (`defmt::Format`); its [`fmt::Display`] is the same line as text, for host tests. Keep the
/// two wordings alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZdmaLine {
    /// A checked copy came out exact with its guards intact.
    Copied {
        /// Its number (1 for the first copy of the run).
        number: u32,
        /// What was copied.
        case: CopyCase,
    },
    /// A transfer to the undecoded address ended.
    BusError(BusErrorProbe),
}

impl fmt::Display for ZdmaLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZdmaLine::Copied { number, case: c } => write!(
                f,
                "zDMA GDMA{} copy {number}: {} bytes, source +{}, destination +{}: exact, \
                 guards intact",
                c.channel, c.len, c.src_offset, c.dst_offset
            ),
            ZdmaLine::BusError(probe) => write!(f, "zDMA GDMA{} {probe}", probe.channel),
        }
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for ZdmaLine {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            ZdmaLine::Copied { number, case: c } => defmt::write!(
                f,
                "zDMA GDMA{=u8} copy {=u32}: {=u32} bytes, source +{=u32}, destination +{=u32}: \
                 exact, guards intact",
                c.channel,
                number,
                c.len,
                c.src_offset,
                c.dst_offset
            ),
            ZdmaLine::BusError(probe) => {
                defmt::write!(f, "zDMA GDMA{=u8} {}", probe.channel, probe)
            }
        }
    }
}

/// What [`run_copies`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZdmaReport {
    /// Checked copies per channel (including the one after the bus-error transfer).
    pub copies: [u32; 2],
    /// Bytes compared with their source, all copies.
    pub bytes: u64,
    /// The bus-error transfers (channel 0 reads, channel 1 writes).
    pub bus_errors: [Option<BusErrorProbe>; 2],
}

impl ZdmaReport {
    /// Checked copies on both channels.
    pub fn transfers(&self) -> u32 {
        self.copies[0] + self.copies[1]
    }
}

/// The byte `i` of the source of copy `seed`: a multiplicative hash, so neighbouring bytes,
/// pages and copies differ.
pub fn pattern(seed: u32, i: usize) -> u8 {
    ((i as u32 ^ seed.wrapping_mul(0x0100_0193)).wrapping_mul(0x9e37_79b1) >> 24) as u8
}

/// The two DMA buffers and the channels.
struct Rig<'a, B, D, M: DmaMemory> {
    channels: &'a mut [ZdmaChannel<B, D>; 2],
    dma: &'a M,
    src: DmaRegion,
    dst: DmaRegion,
}

/// Copies the chunks of `len` bytes at `offset` in `region` through `fill(i)`.
fn fill_region(
    region: &DmaRegion,
    offset: usize,
    len: usize,
    fill: impl Fn(usize) -> u8,
) -> Result<()> {
    let mut chunk = [0u8; 256];
    let mut done = 0;
    while done < len {
        let n = chunk.len().min(len - done);
        for (k, b) in chunk[..n].iter_mut().enumerate() {
            *b = fill(done + k);
        }
        region.write_bytes(offset + done, &chunk[..n])?;
        done += n;
    }
    Ok(())
}

/// The first byte `i` in `0..len` at `offset` in `region` that is not `expected(i)`, as
/// `(i, expected, found)`.
fn first_difference(
    region: &DmaRegion,
    offset: usize,
    len: usize,
    expected: impl Fn(usize) -> u8,
) -> Result<Option<(usize, u8, u8)>> {
    let mut chunk = [0u8; 256];
    let mut done = 0;
    while done < len {
        let n = chunk.len().min(len - done);
        region.read_bytes(offset + done, &mut chunk[..n])?;
        for (k, &found) in chunk[..n].iter().enumerate() {
            let want = expected(done + k);
            if found != want {
                return Ok(Some((done + k, want, found)));
            }
        }
        done += n;
    }
    Ok(None)
}

impl<B: RegisterBus, D: DelayNs, M: DmaMemory> Rig<'_, B, D, M> {
    /// Runs one checked copy; returns the bytes compared.
    fn copy(&mut self, number: u32, c: &CopyCase, log: &mut dyn FnMut(ZdmaLine)) -> Result<u64> {
        let len = c.len as usize;
        let src_at = GUARD + c.src_offset as usize;
        let dst_at = GUARD + c.dst_offset as usize;
        if src_at + len + GUARD > self.src.len() || dst_at + len + GUARD > self.dst.len() {
            return Err(FirmwareError::BadScenario {
                what: "a zDMA copy does not fit its buffers",
            });
        }
        let seed = number;
        fill_region(&self.src, src_at, len, |i| pattern(seed, i))?;
        fill_region(&self.dst, dst_at - GUARD, GUARD, |_| SENTINEL)?;
        fill_region(&self.dst, dst_at, len, |i| !pattern(seed, i))?;
        fill_region(&self.dst, dst_at + len, GUARD, |_| SENTINEL)?;
        self.dma.sync_for_device(&self.src);
        self.dma.sync_for_device(&self.dst);
        let transfer = Transfer {
            src: self.src.bus_addr().as_u64() + src_at as u64,
            dst: self.dst.bus_addr().as_u64() + dst_at as u64,
            len: c.len,
        };
        let channel = usize::from(c.channel);
        let completion = self
            .channels
            .get_mut(channel)
            .ok_or(FirmwareError::BadScenario {
                what: "zDMA channel index",
            })?
            .transfer(&transfer)?;
        self.dma.sync_for_cpu(&self.dst);
        let mismatch = |offset: i64, expected: u8, found: u8| FirmwareError::ZdmaMismatch {
            channel: c.channel,
            copy: number,
            offset,
            expected,
            found,
        };
        if let Some((i, want, found)) =
            first_difference(&self.dst, dst_at, len, |i| pattern(seed, i))?
        {
            return Err(mismatch(i as i64, want, found));
        }
        if let Some((i, want, found)) =
            first_difference(&self.dst, dst_at - GUARD, GUARD, |_| SENTINEL)?
        {
            return Err(mismatch(i as i64 - GUARD as i64, want, found));
        }
        if let Some((i, want, found)) =
            first_difference(&self.dst, dst_at + len, GUARD, |_| SENTINEL)?
        {
            return Err(mismatch((len + i) as i64, want, found));
        }
        if completion.bytes != c.len {
            return Err(FirmwareError::ZdmaByteCount {
                channel: c.channel,
                copy: number,
                expected: c.len,
                counted: completion.bytes,
            });
        }
        log(ZdmaLine::Copied { number, case: *c });
        Ok(u64::from(c.len))
    }

    /// A transfer with one side at `addr`, which nothing decodes.
    fn bus_error(
        &mut self,
        channel: u8,
        side: Side,
        addr: u64,
        log: &mut dyn FnMut(ZdmaLine),
    ) -> Result<BusErrorProbe> {
        let len = UNDECODED as usize;
        let seed = 0xbad;
        fill_region(&self.src, GUARD, len, |i| pattern(seed, i))?;
        fill_region(&self.dst, 0, len + 2 * GUARD, |_| SENTINEL)?;
        self.dma.sync_for_device(&self.src);
        self.dma.sync_for_device(&self.dst);
        let (src, dst) = match side {
            Side::Read => (addr, self.dst.bus_addr().as_u64() + GUARD as u64),
            Side::Write => (self.src.bus_addr().as_u64() + GUARD as u64, addr),
        };
        let ch = self
            .channels
            .get_mut(usize::from(channel))
            .ok_or(FirmwareError::BadScenario {
                what: "zDMA channel index",
            })?;
        let outcome = match ch.transfer(&Transfer {
            src,
            dst,
            len: UNDECODED,
        }) {
            Ok(done) => BusErrorOutcome::NotReported { bytes: done.bytes },
            Err(e @ (DmaError::AxiRead { .. } | DmaError::AxiWrite { .. })) => {
                // The channel stopped; make it ready for the next transfer.
                ch.init()?;
                BusErrorOutcome::Reported(e)
            }
            Err(e) => return Err(e.into()),
        };
        self.dma.sync_for_cpu(&self.dst);
        let written = match side {
            Side::Read => {
                let mut changed = 0;
                let mut chunk = [0u8; UNDECODED as usize];
                self.dst.read_bytes(GUARD, &mut chunk)?;
                for b in chunk {
                    changed += u32::from(b != SENTINEL);
                }
                if let Some((i, want, found)) = first_difference(&self.dst, 0, GUARD, |_| SENTINEL)?
                    .or(first_difference(&self.dst, GUARD + len, GUARD, |_| {
                        SENTINEL
                    })?)
                {
                    return Err(FirmwareError::ZdmaMismatch {
                        channel,
                        copy: 0,
                        offset: i as i64,
                        expected: want,
                        found,
                    });
                }
                Some(changed)
            }
            Side::Write => None,
        };
        let probe = BusErrorProbe {
            channel,
            side,
            addr,
            outcome,
            written,
        };
        log(ZdmaLine::BusError(probe));
        Ok(probe)
    }
}

impl fmt::Display for BusErrorProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.side {
            Side::Read => "read from",
            Side::Write => "write to",
        };
        write!(f, "{what} undecoded {:#x}: ", self.addr)?;
        match self.outcome {
            BusErrorOutcome::Reported(e) => write!(f, "bus error reported ({e})")?,
            BusErrorOutcome::NotReported { bytes } => write!(
                f,
                "completed, no bus error reported ({bytes} bytes counted)"
            )?,
        }
        if let Some(n) = self.written {
            write!(f, ", {n} of {UNDECODED} destination bytes changed")?;
        }
        Ok(())
    }
}

/// The same text as [`fmt::Display`]'s, for defmt.
#[cfg(target_os = "none")]
impl defmt::Format for BusErrorProbe {
    fn format(&self, f: defmt::Formatter<'_>) {
        let what = match self.side {
            Side::Read => "read from",
            Side::Write => "write to",
        };
        match self.written {
            Some(n) => defmt::write!(
                f,
                "{=str} undecoded {=u64:#x}: {}, {=u32} of {=u32} destination bytes changed",
                what,
                self.addr,
                self.outcome,
                n,
                UNDECODED
            ),
            None => defmt::write!(
                f,
                "{=str} undecoded {=u64:#x}: {}",
                what,
                self.addr,
                self.outcome
            ),
        }
    }
}

#[cfg(target_os = "none")]
impl defmt::Format for BusErrorOutcome {
    fn format(&self, f: defmt::Formatter<'_>) {
        match self {
            // The two errors a bus-error transfer can report, in Display's words; anything
            // else by its code, which keeps DmaError's derived Format (and ProtocolError's and
            // HalError's under it) out of the image.
            BusErrorOutcome::Reported(DmaError::AxiRead { bytes }) => defmt::write!(
                f,
                "bus error reported (AXI read error after {=u32} bytes)",
                bytes
            ),
            BusErrorOutcome::Reported(DmaError::AxiWrite { bytes }) => defmt::write!(
                f,
                "bus error reported (AXI write error after {=u32} bytes)",
                bytes
            ),
            BusErrorOutcome::Reported(e) => {
                defmt::write!(f, "bus error reported (DmaError code {=u32})", e.code())
            }
            BusErrorOutcome::NotReported { bytes } => defmt::write!(
                f,
                "completed, no bus error reported ({=u32} bytes counted)",
                bytes
            ),
        }
    }
}

/// Runs [`COPIES`], then the bus-error transfers at `undecoded` (channel 0 reads from it,
/// channel 1 writes to it) and one more checked copy per channel, on `channels` (GDMA 0 and
/// 1, initialised here) with buffers from `dma`. Reports one [`ZdmaLine`] per transfer to `log`
/// (defmt on the target; see `firmware::logger::info`).
pub fn run_copies<B: RegisterBus, D: DelayNs, M: DmaMemory>(
    channels: &mut [ZdmaChannel<B, D>; 2],
    dma: &M,
    undecoded: u64,
    log: &mut dyn FnMut(ZdmaLine),
) -> Result<ZdmaReport> {
    for ch in channels.iter_mut() {
        ch.init()?;
    }
    let pages = BUFFER_BYTES / DMA_PAGE;
    let src = dma.allocate(pages, DmaDirection::ToDevice)?;
    let dst = match dma.allocate(pages, DmaDirection::FromDevice) {
        Ok(dst) => dst,
        Err(e) => {
            let _ = dma.free(src);
            return Err(e.into());
        }
    };
    let mut rig = Rig {
        channels,
        dma,
        src,
        dst,
    };
    let result = run_on(&mut rig, undecoded, log);
    let Rig { src, dst, .. } = rig;
    // A refused free leaks the region; nothing else is lost (the pool is the program's).
    let freed = dma.free(src).is_ok() & dma.free(dst).is_ok();
    let report = result?;
    if !freed {
        return Err(FirmwareError::BadScenario {
            what: "the DMA pool refused a zDMA buffer back",
        });
    }
    Ok(report)
}

fn run_on<B: RegisterBus, D: DelayNs, M: DmaMemory>(
    rig: &mut Rig<'_, B, D, M>,
    undecoded: u64,
    log: &mut dyn FnMut(ZdmaLine),
) -> Result<ZdmaReport> {
    let mut report = ZdmaReport::default();
    let mut number = 0;
    for c in &COPIES {
        number += 1;
        report.bytes += rig.copy(number, c, log)?;
        report.copies[usize::from(c.channel)] += 1;
    }
    for (channel, side) in [(0u8, Side::Read), (1u8, Side::Write)] {
        let probe = rig.bus_error(channel, side, undecoded, log)?;
        report.bus_errors[usize::from(channel)] = Some(probe);
        number += 1;
        let again = case(channel, RECOVERY_LEN, 5, 9);
        report.bytes += rig.copy(number, &again, log)?;
        report.copies[usize::from(channel)] += 1;
    }
    Ok(report)
}

/// The verdict of a run without an SMMU: `absence` is why the SMMU was taken to be absent,
/// `abort_check` what a read outside the identity map did (it must have faulted and been
/// survived: the absence decision relies on surviving aborts), `result` what
/// [`run_copies`] returned.
///
/// PASS needs the abort check to have faulted, every copy exact on both channels, and both
/// bus-error transfers to have ended (reported or not) with the channel copying correctly
/// afterwards.
pub fn verdict(
    absence: &Absence,
    abort_check: &core::result::Result<ProbeFault, u32>,
    result: &Result<ZdmaReport>,
) -> Verdict {
    if let Err(value) = abort_check {
        return Verdict::fail(format_args!(
            "a read outside the identity map returned {value:#x} instead of aborting: SMMU \
             probing cannot survive an abort"
        ));
    }
    let report = match result {
        Ok(report) => report,
        Err(e) => {
            return Verdict::fail(format_args!(
                "SMMU absent ({}); zDMA: code {}: {e}",
                absence.brief(),
                e.code()
            ));
        }
    };
    if report.copies.contains(&0) || report.bytes == 0 {
        return Verdict::fail(format_args!(
            "SMMU absent ({}); zDMA: copies per channel {:?}, {} bytes",
            absence.brief(),
            report.copies,
            report.bytes
        ));
    }
    let Some(errors) = report
        .bus_errors
        .iter()
        .copied()
        .collect::<Option<heapless::Vec<BusErrorProbe, 2>>>()
    else {
        return Verdict::fail(format_args!(
            "SMMU absent ({}); zDMA: a bus-error transfer did not run",
            absence.brief()
        ));
    };
    let reported = errors
        .iter()
        .filter(|e| matches!(e.outcome, BusErrorOutcome::Reported(_)))
        .count();
    let bus = match reported {
        0 => "none reported by the engine",
        n if n == errors.len() => "both reported",
        _ => "one reported",
    };
    Verdict::pass(format_args!(
        "SMMU absent ({}); zDMA: {} transfers, {} bytes verified on GDMA 0 and 1; bus errors \
         at {:#x}: {bus}",
        absence.brief(),
        report.transfers(),
        report.bytes,
        errors[0].addr
    ))
}

#[cfg(test)]
mod tests {
    use dma_engine::zdma::ZdmaConfig;
    use hal::delay::NoDelay;
    use hal::regs::AccessWidth;
    use sim::soc::{Soc, Window};

    use super::*;
    use crate::verdict::Outcome;

    /// IDR values of the `sim` MMU-500 model of the ZynqMP, read through its window.
    fn model_ids() -> SmmuIds {
        let soc = Soc::zynqmp().unwrap();
        let smmu = soc.smmu_window().unwrap();
        let read = |offset: u64| smmu.read(offset as usize, AccessWidth::U32) as u32;
        SmmuIds {
            idr0: read(0x20),
            idr1: read(0x24),
            idr2: read(0x28),
            idr7: read(0x3c),
        }
    }

    const WINDOW: u64 = 0x2_0000;

    #[test]
    fn the_zynqmp_mmu500_model_is_present_and_matches_ug1087() {
        let ids = model_ids();
        assert_eq!(ids.idr1, ZYNQMP_IDR1);
        assert_eq!(
            decide(ids, WINDOW),
            SmmuPresence::Present {
                ids,
                matches_zynqmp: true
            }
        );
        // Through the probe, with a read that never faults.
        let soc = Soc::zynqmp().unwrap();
        let smmu = soc.smmu_window().unwrap();
        let presence = probe_smmu(0xfd80_0000, WINDOW, |addr| {
            Ok(smmu.read((addr - 0xfd80_0000) as usize, AccessWidth::U32) as u32)
        });
        assert!(matches!(
            presence,
            SmmuPresence::Present {
                matches_zynqmp: true,
                ..
            }
        ));
    }

    #[test]
    fn zeroes_ones_and_faults_are_absent() {
        assert_eq!(
            decide(SmmuIds::default(), WINDOW),
            SmmuPresence::Absent(Absence::ReadsZero)
        );
        let ones = SmmuIds {
            idr0: !0,
            idr1: !0,
            idr2: !0,
            idr7: !0,
        };
        assert_eq!(
            decide(ones, WINDOW),
            SmmuPresence::Absent(Absence::ReadsOnes)
        );
        // QEMU xlnx-zcu102: every read returns 0.
        let mut reads = 0;
        let presence = probe_smmu(0xfd80_0000, WINDOW, |_| {
            reads += 1;
            Ok(0)
        });
        assert_eq!(presence, SmmuPresence::Absent(Absence::ReadsZero));
        assert_eq!(reads, 4);
        assert_eq!(
            Absence::ReadsZero.to_string(),
            "IDR0/1/2/7 read 0",
            "the console and verdict wording"
        );
        // A board where the read gets an external abort: the first fault decides, and no
        // further register is read.
        let fault = ProbeFault::Abort {
            esr: 0x9600_0010,
            far: 0xfd80_0020,
        };
        let mut reads = 0;
        let presence = probe_smmu(0xfd80_0000, WINDOW, |_| {
            reads += 1;
            Err(fault)
        });
        assert_eq!(
            presence,
            SmmuPresence::Absent(Absence::ReadFault {
                register: "IDR0",
                fault
            })
        );
        assert_eq!(reads, 1);
        // An SError pending after the second read.
        let presence = probe_smmu(0xfd80_0000, WINDOW, |addr| {
            if addr == 0xfd80_0024 {
                Err(ProbeFault::SErrorPending)
            } else {
                Ok(model_ids().idr0)
            }
        });
        assert_eq!(
            presence,
            SmmuPresence::Absent(Absence::ReadFault {
                register: "IDR1",
                fault: ProbeFault::SErrorPending
            })
        );
    }

    #[test]
    fn implausible_values_are_absent_with_the_rule_they_break() {
        let good = model_ids();
        let rule = |ids: SmmuIds, window: u64| match decide(ids, window) {
            SmmuPresence::Absent(Absence::Implausible { what, .. }) => what,
            other => panic!("{ids:x?} decided {other:?}"),
        };
        // A register that reads some unrelated device's value: no translation stage.
        let stranger = SmmuIds {
            idr0: 0x1234,
            ..good
        };
        assert!(rule(stranger, WINDOW).starts_with("no translation stage"));
        let no_smr = SmmuIds {
            idr0: good.idr0 & !0xff,
            ..good
        };
        assert!(rule(no_smr, WINDOW).starts_with("stream matching without"));
        let no_banks = SmmuIds {
            idr1: good.idr1 & !0xff,
            ..good
        };
        assert!(rule(no_banks, WINDOW).starts_with("no context banks"));
        let s2 = SmmuIds {
            idr1: good.idr1 | 0x20 << 16,
            ..good
        };
        assert!(rule(s2, WINDOW).starts_with("more stage-2"));
        // 64 KiB pages: the register space (2 MiB) does not fit the ZynqMP's 128 KiB window.
        let big = SmmuIds {
            idr1: good.idr1 | 1 << 31,
            ..good
        };
        assert_eq!(rule(big, WINDOW), "register space larger than the window");
        assert!(matches!(
            decide(big, 2 << 20),
            SmmuPresence::Present {
                matches_zynqmp: false,
                ..
            }
        ));
        let banks = SmmuIds {
            idr1: (good.idr1 & !0xff) | 0x20,
            ..good
        };
        assert_eq!(
            rule(banks, WINDOW),
            "more context banks than context bank pages"
        );
        let ias = SmmuIds {
            idr2: (good.idr2 & !0xf) | 7,
            ..good
        };
        assert!(rule(ias, WINDOW).starts_with("reserved address size"));
    }

    fn gdma(soc: &Soc) -> [ZdmaChannel<Window, NoDelay>; 2] {
        let config = ZdmaConfig {
            timeout_us: 1000,
            ..ZdmaConfig::DEFAULT
        };
        [0, 1].map(|n| {
            ZdmaChannel::new(soc.gdma_window(n).unwrap(), NoDelay::default(), config).unwrap()
        })
    }

    /// An address outside the simulated DRAM: the model answers with an error response, as
    /// silicon's interconnect does for an address nothing decodes.
    const UNDECODED_ADDR: u64 = 0xf000_0000;

    /// What reading past the identity map gives: a translation fault, level 0.
    const OUTSIDE_MAP: ProbeFault = ProbeFault::Abort {
        esr: 0x9600_0004,
        far: 0x80_0000_0000,
    };

    #[test]
    fn copies_are_exact_on_both_channels_and_bus_errors_are_reported_by_the_model() {
        // The SMMU model starts in its reset state (sCR0.CLIENTPD: every stream bypasses).
        let soc = Soc::zynqmp().unwrap();
        let mut channels = gdma(&soc);
        let mut out = String::new();
        let mut log = |line: ZdmaLine| out.push_str(&format!("{line}\n"));
        let report = run_copies(&mut channels, &**soc.dram(), UNDECODED_ADDR, &mut log).unwrap();
        let per_channel: u32 = COPIES.len() as u32 / 2 + 1;
        assert_eq!(report.copies, [per_channel, per_channel]);
        let bytes: u64 =
            COPIES.iter().map(|c| u64::from(c.len)).sum::<u64>() + 2 * u64::from(RECOVERY_LEN);
        assert_eq!(report.bytes, bytes);
        let [Some(read), Some(write)] = report.bus_errors else {
            panic!("{report:?}");
        };
        assert!(
            matches!(
                read.outcome,
                BusErrorOutcome::Reported(DmaError::AxiRead { .. })
            ),
            "{read:?}"
        );
        assert_eq!(
            read.written,
            Some(0),
            "nothing arrived from the failed read"
        );
        assert!(
            matches!(
                write.outcome,
                BusErrorOutcome::Reported(DmaError::AxiWrite { .. })
            ),
            "{write:?}"
        );
        assert_eq!(out.lines().count(), COPIES.len() + 4, "{out}");
        assert!(out.contains("GDMA0 read from undecoded 0xf0000000: bus error reported"));
        let v = verdict(&Absence::ReadsZero, &Ok(OUTSIDE_MAP), &Ok(report));
        assert_eq!(v.outcome, Outcome::Pass, "{}", v.message);
        assert!(
            v.message
                .as_str()
                .ends_with("bus errors at 0xf0000000: both reported"),
            "{}",
            v.message
        );
    }

    /// A GDMA window whose destination address register loses its low 4 bits: copies land
    /// up to 15 bytes early, as a broken engine or a driver writing the wrong word would.
    struct Skewed(Window);

    impl RegisterBus for Skewed {
        fn read(&self, offset: usize, width: AccessWidth) -> u64 {
            self.0.read(offset, width)
        }
        fn write(&self, offset: usize, width: AccessWidth, value: u64) {
            // DST_DSCR_WORD0 (dma_engine::zdma::regs).
            let value = if offset == 0x138 { value & !0xf } else { value };
            self.0.write(offset, width, value)
        }
        fn size(&self) -> usize {
            self.0.size()
        }
    }

    #[test]
    fn a_misplaced_copy_fails_with_where_it_differs() {
        let soc = Soc::zynqmp().unwrap();
        let config = ZdmaConfig {
            timeout_us: 1000,
            ..ZdmaConfig::DEFAULT
        };
        let mut channels = [0, 1].map(|n| {
            ZdmaChannel::new(
                Skewed(soc.gdma_window(n).unwrap()),
                NoDelay::default(),
                config,
            )
            .unwrap()
        });
        // The first copy (1 byte at +0) lands 0 bytes early (the destination is 64-aligned
        // plus 64): exact. The second (7 bytes at +3) lands 3 bytes early, into the guard.
        let mut out = String::new();
        let mut log = |line: ZdmaLine| out.push_str(&format!("{line}\n"));
        let err = run_copies(&mut channels, &**soc.dram(), UNDECODED_ADDR, &mut log).unwrap_err();
        assert!(
            matches!(
                err,
                FirmwareError::ZdmaMismatch {
                    channel: 0,
                    copy: 2,
                    offset: 0,
                    expected,
                    ..
                } if expected == pattern(2, 0)
            ),
            "{err:?}"
        );
        assert_eq!(out.lines().count(), 1, "{out}");
        // The verdict names the firmware code.
        let v = verdict(&Absence::ReadsZero, &Ok(OUTSIDE_MAP), &Err(err));
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(
            v.message
                .as_str()
                .starts_with("SMMU absent (IDR0/1/2/7 read 0); zDMA: code 91"),
            "{}",
            v.message
        );
        // The pool got both buffers back: a second run can allocate them again.
        let mut fine = gdma(&soc);
        run_copies(&mut fine, &**soc.dram(), UNDECODED_ADDR, &mut |_| {}).unwrap();
    }

    fn qemu_like_report() -> ZdmaReport {
        let probe = |channel, side| BusErrorProbe {
            channel,
            side,
            addr: UNDECODED_ADDR,
            outcome: BusErrorOutcome::NotReported { bytes: UNDECODED },
            written: (side == Side::Read).then_some(UNDECODED),
        };
        ZdmaReport {
            copies: [12, 12],
            bytes: 2_988_446,
            bus_errors: [Some(probe(0, Side::Read)), Some(probe(1, Side::Write))],
        }
    }

    #[test]
    fn an_engine_that_reports_no_bus_error_still_passes_and_says_so() {
        let report = qemu_like_report();
        let v = verdict(&Absence::ReadsZero, &Ok(OUTSIDE_MAP), &Ok(report));
        assert_eq!(v.outcome, Outcome::Pass);
        assert_eq!(
            v.message.as_str(),
            "SMMU absent (IDR0/1/2/7 read 0); zDMA: 24 transfers, 2988446 bytes verified on \
             GDMA 0 and 1; bus errors at 0xf0000000: none reported by the engine"
        );
        assert!(!v.message.is_truncated());
        assert_eq!(
            report.bus_errors[0].unwrap().to_string(),
            "read from undecoded 0xf0000000: completed, no bus error reported (256 bytes \
             counted), 256 of 256 destination bytes changed"
        );
    }

    #[test]
    fn the_verdict_fits_its_line_whatever_the_absence() {
        let ids = model_ids();
        for absence in [
            Absence::ReadsZero,
            Absence::ReadsOnes,
            Absence::ReadFault {
                register: "IDR0",
                fault: ProbeFault::Abort {
                    esr: 0x9600_0410,
                    far: u64::MAX,
                },
            },
            Absence::ReadFault {
                register: "IDR7",
                fault: ProbeFault::SErrorPending,
            },
            Absence::Implausible {
                what: "more stage-2 context banks than context banks",
                ids: SmmuIds {
                    idr0: u32::MAX,
                    ..ids
                },
            },
        ] {
            let mut report = qemu_like_report();
            report.bytes = u64::MAX;
            let v = verdict(&absence, &Ok(OUTSIDE_MAP), &Ok(report));
            assert_eq!(v.outcome, Outcome::Pass);
            assert!(!v.message.is_truncated(), "{absence:?}: {}", v.message);
            assert!(v.message.as_str().contains(absence.brief()));
        }
    }

    #[test]
    fn no_pass_without_a_survived_abort_both_channels_or_the_bus_error_transfers() {
        let absent = Absence::ReadsZero;
        let fault = Ok(OUTSIDE_MAP);
        let v = verdict(&absent, &Err(0x1234), &Ok(qemu_like_report()));
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(
            v.message.as_str().contains("returned 0x1234"),
            "{}",
            v.message
        );

        let mut one_channel = qemu_like_report();
        one_channel.copies[1] = 0;
        assert_eq!(
            verdict(&absent, &fault, &Ok(one_channel)).outcome,
            Outcome::Fail
        );

        let mut no_error_path = qemu_like_report();
        no_error_path.bus_errors[1] = None;
        assert_eq!(
            verdict(&absent, &fault, &Ok(no_error_path)).outcome,
            Outcome::Fail
        );

        let timeout = FirmwareError::Dma(DmaError::Timeout {
            waited_us: 1_000_000,
            bytes: 0,
        });
        let v = verdict(&absent, &fault, &Err(timeout));
        assert_eq!(v.outcome, Outcome::Fail);
        assert!(
            v.message.as_str().contains("did not finish"),
            "{}",
            v.message
        );
    }

    #[test]
    fn the_pattern_differs_between_neighbours_pages_and_copies() {
        assert_ne!(pattern(1, 0), pattern(1, 1));
        assert_ne!(
            (0..4096).map(|i| pattern(1, i)).collect::<Vec<_>>(),
            (4096..8192).map(|i| pattern(1, i)).collect::<Vec<_>>()
        );
        assert_ne!(
            (0..64).map(|i| pattern(1, i)).collect::<Vec<_>>(),
            (0..64).map(|i| pattern(2, i)).collect::<Vec<_>>()
        );
        // Every copy fits its buffers with both guards.
        for c in COPIES {
            let end = GUARD + c.src_offset.max(c.dst_offset) as usize + c.len as usize + GUARD;
            assert!(end <= BUFFER_BYTES, "{c:?}");
        }
    }
}
