//! Command queue entries (IHI0070 chapter 4): 16 bytes, opcode in dword 0 bits \[7:0\].
//!
//! Each dword layout is a `bitfield` view: [`CmdHeader`] (what every command has),
//! [`StreamCmd0`] and [`CfgiCmd1`] (configuration commands and CMD_STALL_TERM),
//! [`TlbiCmd0`] and [`TlbiCmd1`], [`ResumeCmd0`] and [`ResumeCmd1`], [`SyncCmd0`].
//! [`Command::encode`] builds the dwords with them. Field positions from IHI0070
//! §4.1-§4.7, cross-checked against Linux `arm_smmu_cmdq_build_cmd` (`CMDQ_*` masks in
//! arm-smmu-v3.h) and FreeBSD `smmureg.h`. The encoder shares no constants with the tests,
//! which write the expected dwords out bit by bit.

use bitfield::bitfield;
use hal::Iova;

use crate::fault::StreamId;
use crate::{Result, SmmuError};

bitfield! {
    /// Dword 0 fields every command has (IHI0070 §4.1.1, and each command's layout in
    /// §4.2-§4.7).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct CmdHeader(pub u64);
    impl Debug;
    /// Opcode, bits \[7:0\] (IHI0070 §4.1.1): which command ([`opcode`]).
    pub u8, opcode, set_opcode: 7, 0;
    /// SSec, bit 10 (IHI0070 §4.1.1): a Secure stream; must be 0 on the Non-secure
    /// command queue.
    pub ssec, set_ssec: 10;
}

bitfield! {
    /// Dword 0 of the commands that name a stream: CMD_PREFETCH_CONFIG (IHI0070 §4.2.1),
    /// CMD_CFGI_STE and CMD_CFGI_STE_RANGE (§4.3.1, §4.3.2), CMD_CFGI_CD and
    /// CMD_CFGI_CD_ALL (§4.3.3, §4.3.4), CMD_STALL_TERM (§4.7.2). Opcode and SSec are in
    /// [`CmdHeader`].
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct StreamCmd0(pub u64);
    impl Debug;
    /// SubstreamID, bits \[31:12\] (IHI0070 §4.3.3 CMD_CFGI_CD): the CD's substream.
    pub u32, substream_id, set_substream_id: 31, 12;
    /// StreamID, bits \[63:32\] (IHI0070 §4.2.1, §4.3.1-§4.3.4, §4.7.2).
    pub u32, stream_id, set_stream_id: 63, 32;
}

bitfield! {
    /// Dword 1 of the configuration invalidations (IHI0070 §4.3.1-§4.3.3).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct CfgiCmd1(pub u64);
    impl Debug;
    /// Leaf, bit 0 (IHI0070 §4.3.1 CMD_CFGI_STE, §4.3.3 CMD_CFGI_CD): only the STE or CD
    /// itself, not a level-1 table descriptor on the way to it.
    pub leaf, set_leaf: 0;
    /// Range, bits \[4:0\] (IHI0070 §4.3.2 CMD_CFGI_STE_RANGE): 2^(Range + 1) StreamIDs
    /// from StreamID with its low Range + 1 bits cleared; 31 is every StreamID
    /// (CMD_CFGI_ALL).
    pub u8, range, set_range: 4, 0;
}

bitfield! {
    /// Dword 0 of the stage-1 TLB invalidations CMD_TLBI_NH_ASID, CMD_TLBI_NH_VA and
    /// CMD_TLBI_NH_VAA (IHI0070 §4.4.2; range fields §4.4.1.1). Opcode and SSec are in
    /// [`CmdHeader`].
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct TlbiCmd0(pub u64);
    impl Debug;
    /// NUM, bits \[16:12\] (IHI0070 §4.4.1.1): the range covers (NUM + 1) << SCALE
    /// granules; RES0 without IDR3.RIL.
    pub u8, num, set_num: 16, 12;
    /// SCALE, bits \[24:20\] (IHI0070 §4.4.1.1); RES0 without IDR3.RIL.
    pub u8, scale, set_scale: 24, 20;
    /// VMID, bits \[47:32\] (IHI0070 §4.4.2): 0 without stage 2.
    pub u16, vmid, set_vmid: 47, 32;
    /// ASID, bits \[63:48\] (IHI0070 §4.4.2; not used by CMD_TLBI_NH_VAA).
    pub u16, asid, set_asid: 63, 48;
}

bitfield! {
    /// Dword 1 of CMD_TLBI_NH_VA and CMD_TLBI_NH_VAA (IHI0070 §4.4.2; range fields
    /// §4.4.1.1).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct TlbiCmd1(pub u64);
    impl Debug;
    /// Leaf, bit 0 (IHI0070 §4.4.2): only leaf entries, not walk-cache entries.
    pub leaf, set_leaf: 0;
    /// TTL, bits \[9:8\] (IHI0070 §4.4.1.1): the level of the leaf entries (0: any); RES0
    /// without IDR3.RIL.
    pub u8, ttl, set_ttl: 9, 8;
    /// TG, bits \[11:10\] (IHI0070 §4.4.1.1): the granule of a range
    /// ([`TlbiCmd1::TG_4K`]; 0: not a range); RES0 without IDR3.RIL.
    pub u8, tg, set_tg: 11, 10;
    /// Address, bits \[63:12\] (IHI0070 §4.4.2): bits \[63:12\] of the address.
    pub u64, address, set_address: 63, 12;
}

impl TlbiCmd1 {
    /// TG 0b01: a range of 4 KiB granules (IHI0070 §4.4.1.1).
    pub const TG_4K: u8 = 0b01;
}

bitfield! {
    /// Dword 0 of CMD_RESUME (IHI0070 §4.7.1). Opcode and SSec are in [`CmdHeader`].
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct ResumeCmd0(pub u64);
    impl Debug;
    /// Ac, bit 12 (IHI0070 §4.7.1): 1 retries the stalled transaction, 0 terminates it.
    pub ac, set_ac: 12;
    /// Ab, bit 13 (IHI0070 §4.7.1): with Ac = 0, terminate with an abort (1) or RAZ/WI (0).
    pub ab, set_ab: 13;
    /// StreamID, bits \[63:32\] (IHI0070 §4.7.1): the stalled transaction's stream.
    pub u32, stream_id, set_stream_id: 63, 32;
}

bitfield! {
    /// Dword 1 of CMD_RESUME (IHI0070 §4.7.1).
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct ResumeCmd1(pub u64);
    impl Debug;
    /// STAG, bits \[15:0\] (IHI0070 §4.7.1): the tag from the stall's event record.
    pub u16, stag, set_stag: 15, 0;
}

bitfield! {
    /// Dword 0 of CMD_SYNC (IHI0070 §4.7.3). Opcode and SSec are in [`CmdHeader`].
    #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
    pub struct SyncCmd0(pub u64);
    impl Debug;
    /// CS, bits \[13:12\] (IHI0070 §4.7.3): completion signal (0b00 SIG_NONE, 0b01
    /// SIG_IRQ, 0b10 SIG_SEV; 0b11 is reserved).
    pub u8, cs, set_cs: 13, 12;
}

/// Opcodes (IHI0070 §4.1.1 table, §4.3-§4.7).
pub mod opcode {
    /// CMD_PREFETCH_CONFIG (§4.2.1).
    pub const PREFETCH_CONFIG: u8 = 0x01;
    /// CMD_CFGI_STE (§4.3.1).
    pub const CFGI_STE: u8 = 0x03;
    /// CMD_CFGI_STE_RANGE (§4.3.2); Range = 31 is CMD_CFGI_ALL.
    pub const CFGI_STE_RANGE: u8 = 0x04;
    /// CMD_CFGI_CD (§4.3.3).
    pub const CFGI_CD: u8 = 0x05;
    /// CMD_CFGI_CD_ALL (§4.3.4).
    pub const CFGI_CD_ALL: u8 = 0x06;
    /// CMD_TLBI_NH_ALL (§4.4.2).
    pub const TLBI_NH_ALL: u8 = 0x10;
    /// CMD_TLBI_NH_ASID (§4.4.2).
    pub const TLBI_NH_ASID: u8 = 0x11;
    /// CMD_TLBI_NH_VA (§4.4.2).
    pub const TLBI_NH_VA: u8 = 0x12;
    /// CMD_TLBI_NH_VAA (§4.4.2).
    pub const TLBI_NH_VAA: u8 = 0x13;
    /// CMD_TLBI_NSNH_ALL (§4.4.4).
    pub const TLBI_NSNH_ALL: u8 = 0x30;
    /// CMD_RESUME (§4.7.1).
    pub const RESUME: u8 = 0x44;
    /// CMD_STALL_TERM (§4.7.2).
    pub const STALL_TERM: u8 = 0x45;
    /// CMD_SYNC (§4.7.3).
    pub const SYNC: u8 = 0x46;
}

/// How CMD_SYNC signals completion (CS, dword 0 bits \[13:12\], §4.7.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncSignal {
    /// SIG_NONE: software polls CMDQ_CONS.
    None,
    /// SIG_IRQ: the cmdq-sync interrupt (QEMU `virt`: INTID 108) or an MSI.
    Irq,
    /// SIG_SEV: a WFE wake-up event (only with IDR0.SEV).
    Sev,
}

/// What CMD_RESUME does with a stalled transaction (dword 0 bits 12 Ac and 13 Ab, §4.7.1;
/// Linux `CMDQ_RESUME_0_RESP_{TERM,RETRY,ABORT}` = 0, 1, 2 in bits \[13:12\]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResumeAction {
    /// Ac = 1: retry the transaction as if it had just arrived.
    Retry,
    /// Ac = 0, Ab = 0: terminate with RAZ/WI semantics (abort anyway when TERM_MODEL = 1).
    TerminateSilently,
    /// Ac = 0, Ab = 1: terminate with an abort to the client.
    Abort,
}

/// The range and level hint of a TLBI (TG, TTL, NUM, SCALE; §4.4.1.1). Only valid when
/// IDR3.RIL = 1. The translation granule is always 4 KiB here (the tables are 4 KiB-granule),
/// so the command invalidates `(num + 1) << scale` 4 KiB pages from its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlbiRange {
    num: u8,
    scale: u8,
    ttl: u8,
}

impl TlbiRange {
    /// `(num + 1) << scale` pages (num, scale 0..=31; SCALE is 5 bits wide without
    /// IDR5.DS), leaf level hint `ttl` (0 = any level, 1..=3 = that level).
    pub const fn new(num: u8, scale: u8, ttl: u8) -> Result<TlbiRange> {
        if num > 31 || scale > 31 || ttl > 3 {
            return Err(SmmuError::InvalidConfig {
                what: "TLBI range: NUM and SCALE 0..=31, TTL 0..=3",
            });
        }
        Ok(TlbiRange { num, scale, ttl })
    }

    /// Pages covered.
    pub const fn pages(&self) -> u64 {
        (self.num as u64 + 1) << self.scale
    }

    /// NUM.
    pub const fn num(&self) -> u8 {
        self.num
    }

    /// SCALE.
    pub const fn scale(&self) -> u8 {
        self.scale
    }

    /// TTL.
    pub const fn ttl(&self) -> u8 {
        self.ttl
    }
}

/// A command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Prefetch a stream's configuration.
    PrefetchConfig {
        /// The stream.
        stream: StreamId,
    },
    /// Invalidate the cached STE of a stream (and CDs cached through it; §4.3.1).
    CfgiSte {
        /// The stream.
        stream: StreamId,
        /// Only the STE itself, not the level-1 descriptor of a two-level table.
        leaf: bool,
    },
    /// Invalidate every cached STE and CD (CMD_CFGI_ALL = CFGI_STE_RANGE with Range 31).
    CfgiAll,
    /// Invalidate a cached CD.
    CfgiCd {
        /// The stream.
        stream: StreamId,
        /// SubstreamID (0 without substreams).
        substream: u32,
        /// Only the CD, not a level-1 CD descriptor.
        leaf: bool,
    },
    /// Invalidate every cached CD of a stream.
    CfgiCdAll {
        /// The stream.
        stream: StreamId,
    },
    /// Invalidate every non-hyp stage-1 TLB entry (VMID 0).
    TlbiNhAll,
    /// Invalidate every TLB entry of an ASID.
    TlbiNhAsid {
        /// The ASID.
        asid: u16,
    },
    /// Invalidate the TLB entries of an ASID that translate `address` (or a range from it).
    TlbiNhVa {
        /// The ASID.
        asid: u16,
        /// The address (bits \[11:0\] are dropped).
        address: Iova,
        /// Only leaf entries (no walk-cache entries).
        leaf: bool,
        /// Range and level hint (IDR3.RIL), or a single address without a hint.
        range: Option<TlbiRange>,
    },
    /// Invalidate every non-secure non-hyp TLB entry, any VMID.
    TlbiNsnhAll,
    /// Answer a stalled transaction (only with a stall model: §4.7.1).
    Resume {
        /// The stream.
        stream: StreamId,
        /// The STAG from the stall event record.
        stag: u16,
        /// Retry or terminate.
        action: ResumeAction,
    },
    /// Mark every stalled transaction of a stream for termination.
    StallTerm {
        /// The stream.
        stream: StreamId,
    },
    /// Wait for every earlier command (and make events of terminated transactions visible).
    Sync {
        /// Completion signal.
        signal: SyncSignal,
    },
}

/// Dword 0 of a command naming `stream` (and `substream`).
fn stream_dword0(stream: StreamId, substream: u32) -> u64 {
    let mut dw0 = StreamCmd0(0);
    dw0.set_substream_id(substream);
    dw0.set_stream_id(stream.0);
    dw0.0
}

/// Dword 1 of a CMD_CFGI_STE or CMD_CFGI_CD.
fn cfgi_leaf(leaf: bool) -> u64 {
    let mut dw1 = CfgiCmd1(0);
    dw1.set_leaf(leaf);
    dw1.0
}

impl Command {
    /// The opcode.
    pub const fn opcode(&self) -> u8 {
        match self {
            Command::PrefetchConfig { .. } => opcode::PREFETCH_CONFIG,
            Command::CfgiSte { .. } => opcode::CFGI_STE,
            Command::CfgiAll => opcode::CFGI_STE_RANGE,
            Command::CfgiCd { .. } => opcode::CFGI_CD,
            Command::CfgiCdAll { .. } => opcode::CFGI_CD_ALL,
            Command::TlbiNhAll => opcode::TLBI_NH_ALL,
            Command::TlbiNhAsid { .. } => opcode::TLBI_NH_ASID,
            Command::TlbiNhVa { .. } => opcode::TLBI_NH_VA,
            Command::TlbiNsnhAll => opcode::TLBI_NSNH_ALL,
            Command::Resume { .. } => opcode::RESUME,
            Command::StallTerm { .. } => opcode::STALL_TERM,
            Command::Sync { .. } => opcode::SYNC,
        }
    }

    /// The two dwords of the queue entry. SSec (dword 0 bit 10) is always 0: the driver
    /// uses the Non-secure queue.
    pub fn encode(&self) -> [u64; 2] {
        let (dw0, dw1) = match *self {
            Command::PrefetchConfig { stream }
            | Command::CfgiCdAll { stream }
            | Command::StallTerm { stream } => (stream_dword0(stream, 0), 0),
            Command::CfgiSte { stream, leaf } => (stream_dword0(stream, 0), cfgi_leaf(leaf)),
            Command::CfgiAll => {
                // Range = 31: all StreamIDs (§4.3.2).
                let mut dw1 = CfgiCmd1(0);
                dw1.set_range(31);
                (0, dw1.0)
            }
            Command::CfgiCd {
                stream,
                substream,
                leaf,
            } => (stream_dword0(stream, substream), cfgi_leaf(leaf)),
            Command::TlbiNhAll | Command::TlbiNsnhAll => (0, 0),
            Command::TlbiNhAsid { asid } => {
                let mut dw0 = TlbiCmd0(0);
                dw0.set_asid(asid);
                (dw0.0, 0)
            }
            Command::TlbiNhVa {
                asid,
                address,
                leaf,
                range,
            } => {
                let mut dw0 = TlbiCmd0(0);
                dw0.set_asid(asid);
                let mut dw1 = TlbiCmd1(0);
                dw1.set_address(address.as_u64() >> 12);
                dw1.set_leaf(leaf);
                if let Some(r) = range {
                    dw0.set_num(r.num);
                    dw0.set_scale(r.scale);
                    dw1.set_tg(TlbiCmd1::TG_4K);
                    dw1.set_ttl(r.ttl);
                }
                (dw0.0, dw1.0)
            }
            Command::Resume {
                stream,
                stag,
                action,
            } => {
                let mut dw0 = ResumeCmd0(0);
                dw0.set_ac(action == ResumeAction::Retry);
                dw0.set_ab(action == ResumeAction::Abort);
                dw0.set_stream_id(stream.0);
                let mut dw1 = ResumeCmd1(0);
                dw1.set_stag(stag);
                (dw0.0, dw1.0)
            }
            Command::Sync { signal } => {
                let mut dw0 = SyncCmd0(0);
                dw0.set_cs(match signal {
                    SyncSignal::None => 0b00,
                    SyncSignal::Irq => 0b01,
                    SyncSignal::Sev => 0b10,
                });
                (dw0.0, 0)
            }
        };
        let mut header = CmdHeader(dw0);
        header.set_opcode(self.opcode());
        header.set_ssec(false);
        [header.0, dw1]
    }
}

/// Splits `pages` 4 KiB pages from `start` into range TLBIs: each covers `(NUM + 1) <<
/// SCALE` pages. Each step takes the top five significant bits of what is left, so the
/// remainder shrinks by at least five bits per command: at most four commands for a run of
/// fewer than 2^20 pages, one more per further five bits. `ttl` is the leaf level hint for every command.
pub fn range_commands(
    asid: u16,
    start: Iova,
    pages: u64,
    leaf: bool,
    ttl: u8,
    mut emit: impl FnMut(Command) -> Result<()>,
) -> Result<()> {
    let mut left = pages;
    let mut address = start.as_u64();
    while left > 0 {
        let (multiple, scale) = next_range(left);
        let range = TlbiRange::new((multiple - 1) as u8, scale as u8, ttl)?;
        emit(Command::TlbiNhVa {
            asid,
            address: Iova::new(address),
            leaf,
            range: Some(range),
        })?;
        let covered = range.pages();
        left -= covered;
        address = address
            .checked_add(covered << 12)
            .ok_or(SmmuError::InvalidConfig {
                what: "TLBI range overflows the address space",
            })?;
    }
    Ok(())
}

/// How many commands [`range_commands`] emits for `pages` pages.
pub fn range_command_count(pages: u64) -> u64 {
    let mut left = pages;
    let mut count = 0;
    while left > 0 {
        let (multiple, scale) = next_range(left);
        left -= multiple << scale;
        count += 1;
    }
    count
}

/// `(NUM + 1, SCALE)` of the next range command for `left` (> 0) pages.
fn next_range(left: u64) -> (u64, u32) {
    let bits = u64::BITS - left.leading_zeros();
    let scale = bits.saturating_sub(5).min(31);
    ((left >> scale).min(32), scale)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    // Every expected value below is written out from IHI0070 chapter 4 field positions
    // (opcode dword 0 [7:0]; StreamID [63:32]; SubstreamID [31:12]; ASID [63:48]; NUM [16:12];
    // SCALE [24:20]; dword 1: Leaf bit 0, TTL [9:8], TG [11:10], Address [63:12]; RESUME
    // Ac bit 12, Ab bit 13, STAG dword 1 [15:0]; SYNC CS [13:12]).

    #[test]
    fn configuration_invalidations() {
        assert_eq!(
            Command::CfgiSte {
                stream: StreamId(0x10),
                leaf: true
            }
            .encode(),
            [0x0000_0010_0000_0003, 1]
        );
        // CFGI_ALL = CFGI_STE_RANGE (0x04) with Range = 31 in dword 1 [4:0].
        assert_eq!(Command::CfgiAll.encode(), [0x04, 31]);
        // SSID 0x12345 << 12 = 0x1234_5000.
        assert_eq!(
            Command::CfgiCd {
                stream: StreamId(0x10),
                substream: 0x12345,
                leaf: true
            }
            .encode(),
            [0x0000_0010_1234_5005, 1]
        );
        assert_eq!(
            Command::CfgiCdAll {
                stream: StreamId(3)
            }
            .encode(),
            [0x0000_0003_0000_0006, 0]
        );
        assert_eq!(
            Command::PrefetchConfig {
                stream: StreamId(7)
            }
            .encode(),
            [0x0000_0007_0000_0001, 0]
        );
    }

    #[test]
    fn tlb_invalidations() {
        assert_eq!(Command::TlbiNhAll.encode(), [0x10, 0]);
        assert_eq!(Command::TlbiNsnhAll.encode(), [0x30, 0]);
        assert_eq!(
            Command::TlbiNhAsid { asid: 0x0123 }.encode(),
            [0x0123_0000_0000_0011, 0]
        );
        // Address 0x40_1234: bits [11:0] dropped -> 0x40_1000; Leaf -> | 1.
        let va = Command::TlbiNhVa {
            asid: 1,
            address: Iova::new(0x40_1234),
            leaf: true,
            range: None,
        };
        assert_eq!(va.encode(), [0x0001_0000_0000_0012, 0x40_1001]);
        // NUM = 3 -> 0x3000, SCALE = 2 -> 0x20_0000; TG = 0b01 -> 0x400, TTL = 3 -> 0x300.
        let ranged = Command::TlbiNhVa {
            asid: 1,
            address: Iova::new(0x40_1000),
            leaf: false,
            range: Some(TlbiRange::new(3, 2, 3).unwrap()),
        };
        assert_eq!(ranged.encode(), [0x0001_0000_0020_3012, 0x40_1700]);
        assert_eq!(TlbiRange::new(3, 2, 3).unwrap().pages(), 16, "(3 + 1) << 2");
        assert!(TlbiRange::new(32, 0, 0).is_err());
        assert!(TlbiRange::new(0, 32, 0).is_err());
        assert!(TlbiRange::new(0, 0, 4).is_err());
    }

    #[test]
    fn stall_and_sync_commands() {
        let resume = |action| {
            Command::Resume {
                stream: StreamId(0x4d0),
                stag: 0xbeef,
                action,
            }
            .encode()
        };
        assert_eq!(resume(ResumeAction::Retry), [0x0000_04d0_0000_1044, 0xbeef]);
        assert_eq!(resume(ResumeAction::Abort), [0x0000_04d0_0000_2044, 0xbeef]);
        assert_eq!(
            resume(ResumeAction::TerminateSilently),
            [0x0000_04d0_0000_0044, 0xbeef]
        );
        assert_eq!(
            Command::StallTerm {
                stream: StreamId(5)
            }
            .encode(),
            [0x0000_0005_0000_0045, 0]
        );
        let sync = |signal| Command::Sync { signal }.encode();
        assert_eq!(sync(SyncSignal::None), [0x46, 0]);
        assert_eq!(sync(SyncSignal::Irq), [0x1046, 0]);
        assert_eq!(sync(SyncSignal::Sev), [0x2046, 0]);
    }

    #[test]
    fn the_widest_values_fill_their_fields_exactly() {
        // StreamID [63:32] all ones; Leaf clear leaves dword 1 at 0.
        let sid = StreamId(0xffff_ffff);
        assert_eq!(
            Command::CfgiSte {
                stream: sid,
                leaf: false
            }
            .encode(),
            [0xffff_ffff_0000_0003, 0]
        );
        // SubstreamID is 20 bits [31:12]: 0xffff_ffff keeps 0xf_ffff -> 0xffff_f000.
        assert_eq!(
            Command::CfgiCd {
                stream: sid,
                substream: 0xffff_ffff,
                leaf: true
            }
            .encode(),
            [0xffff_ffff_ffff_f005, 1]
        );
        // ASID 0xffff [63:48]; NUM 31 [16:12] -> 0x1_f000, SCALE 31 [24:20] -> 0x1f0_0000;
        // Address [63:12] all ones, TG 0b01 -> 0x400, TTL 3 -> 0x300, Leaf.
        assert_eq!(
            Command::TlbiNhVa {
                asid: 0xffff,
                address: Iova::new(!0),
                leaf: true,
                range: Some(TlbiRange::new(31, 31, 3).unwrap()),
            }
            .encode(),
            [0xffff_0000_01f1_f012, 0xffff_ffff_ffff_f701]
        );
        // STAG [15:0] all ones, Ab (bit 13).
        assert_eq!(
            Command::Resume {
                stream: sid,
                stag: 0xffff,
                action: ResumeAction::Abort
            }
            .encode(),
            [0xffff_ffff_0000_2044, 0xffff]
        );
    }

    #[test]
    fn range_splitting_examples() {
        let collect = |pages| {
            let mut v = Vec::new();
            range_commands(9, Iova::new(0x10_0000), pages, true, 3, |c| {
                v.push(c);
                Ok(())
            })
            .unwrap();
            v
        };
        // 1025 pages: 16 << 6 = 1024 pages (NUM 15, SCALE 6), then 1 page at +4 MiB.
        let v = collect(1025);
        let expect = [
            Command::TlbiNhVa {
                asid: 9,
                address: Iova::new(0x10_0000),
                leaf: true,
                range: Some(TlbiRange::new(15, 6, 3).unwrap()),
            },
            Command::TlbiNhVa {
                asid: 9,
                address: Iova::new(0x10_0000 + (1024 << 12)),
                leaf: true,
                range: Some(TlbiRange::new(0, 0, 3).unwrap()),
            },
        ];
        assert_eq!(v, expect);
        // 96 = 24 << 2: one command.
        assert_eq!(collect(96).len(), 1);
        assert_eq!(range_command_count(1025), 2);
        assert!(collect(0).is_empty());
    }

    proptest! {
        #[test]
        fn ranges_cover_exactly_the_run(pages in 1u64..(1 << 20), start in 0u64..(1 << 30)) {
            let start = start << 12;
            let mut next = start;
            let mut count = 0;
            range_commands(1, Iova::new(start), pages, true, 3, |c| {
                let Command::TlbiNhVa { address, range: Some(r), .. } = c else {
                    panic!("not a range TLBI");
                };
                assert_eq!(address.as_u64(), next, "contiguous");
                next += r.pages() << 12;
                count += 1;
                Ok(())
            }).unwrap();
            prop_assert_eq!(next - start, pages << 12);
            prop_assert!(count <= 4, "{} commands for {} pages", count, pages);
            prop_assert_eq!(count, range_command_count(pages));
        }
    }
}
