//! Queue entries of the NPE (docs/dma-engine.md §4), with their little-endian encodings.
//!
//! Each 64-bit word with packed fields is a `bitfield` view; whole-word fields (addresses,
//! cookies) are plain `u64`s. `encode` produces the bytes the ring holds; `decode` checks every
//! rule the spec gives (opcode, ranges, reserved bits) and returns a typed error, never panics.
//! The engine model decodes submissions with the same functions, so the spec's bit positions
//! are pinned by the tests at the end of this file, which use values worked out by hand from
//! the spec tables.

use bitfield::bitfield;

use crate::error::DmaError;

/// Bytes of a submission entry.
pub const SQ_ENTRY: usize = 128;
/// Bytes of a channel completion entry.
pub const CQ_ENTRY: usize = 32;
/// Bytes of a receive entry.
pub const RQ_ENTRY: usize = 128;
/// Bytes of a write entry.
pub const WQ_ENTRY: usize = 32;
/// Bytes of a write-completion entry.
pub const WCQ_ENTRY: usize = 32;
/// Most bytes of an inline protocol message.
pub const MAX_MSG: usize = 64;
/// Fewest bytes of an inline protocol message (header and trailer of the protocol's framing).
pub const MIN_MSG: usize = 16;
/// Virtual addresses are 49 bits (ZynqMP PL AXI addresses into the PS, UG1085).
pub const VA_MASK: u64 = (1 << 49) - 1;
/// Node coordinates are 22 bits (ExaNet header).
pub const COORD_MASK: u32 = (1 << 22) - 1;

bitfield! {
    /// SQ word 0.
    #[derive(Clone, Copy)]
    struct SqWord0(u64);
    u8;
    opcode, set_opcode: 7, 0;
    signal, set_signal: 8;
    u8;
    reserved_a, _: 15, 9;
    u16;
    tid14, set_tid14: 29, 16;
    u8;
    reserved_b, _: 31, 30;
    u32;
    length, set_length: 63, 32;
}

bitfield! {
    /// SQ word 2.
    #[derive(Clone, Copy)]
    struct SqWord2(u64);
    u32;
    peer, set_peer: 21, 0;
    u16;
    dst_pdid, set_dst_pdid: 37, 22;
    u8;
    msg_len, set_msg_len: 45, 38;
    u32;
    reserved, _: 63, 46;
}

bitfield! {
    /// Word 0 of CQ and WCQ entries.
    #[derive(Clone, Copy)]
    struct CompletionWord0(u64);
    phase, set_phase: 0;
    u8;
    status, set_status: 15, 8;
    u16;
    index, set_index: 31, 16;
    u32;
    bytes, set_bytes: 63, 32;
}

bitfield! {
    /// RQ word 0.
    #[derive(Clone, Copy)]
    struct RqWord0(u64);
    phase, set_phase: 0;
    u8;
    kind, set_kind: 3, 1;
    u8;
    slot, set_slot: 15, 8;
    u32;
    length, set_length: 63, 32;
}

bitfield! {
    /// RQ word 1.
    #[derive(Clone, Copy)]
    struct RqWord1(u64);
    u32;
    src, set_src: 21, 0;
    u16;
    pdid, set_pdid: 37, 22;
    u16;
    tid14, set_tid14: 51, 38;
}

bitfield! {
    /// WQ word 0.
    #[derive(Clone, Copy)]
    struct WqWord0(u64);
    u8;
    op, set_op: 7, 0;
    u8;
    slot, set_slot: 15, 8;
    u16;
    pdid, set_pdid: 31, 16;
    u32;
    length, set_length: 63, 32;
}

bitfield! {
    /// WCQ word 3.
    #[derive(Clone, Copy)]
    struct WcqWord3(u64);
    u8;
    resp, set_resp: 1, 0;
    write, set_write: 2;
    valid, set_valid: 3;
}

fn word(bytes: &[u8], index: usize) -> u64 {
    let mut w = [0u8; 8];
    if let Some(src) = bytes.get(index * 8..index * 8 + 8) {
        w.copy_from_slice(src);
    }
    u64::from_le_bytes(w)
}

fn put(bytes: &mut [u8], index: usize, value: u64) {
    if let Some(dst) = bytes.get_mut(index * 8..index * 8 + 8) {
        dst.copy_from_slice(&value.to_le_bytes());
    }
}

/// Status of a finished descriptor (docs/dma-engine.md §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryStatus {
    /// Done.
    Ok,
    /// The source read was terminated and software skipped the descriptor.
    SrcFault,
    /// The destination write was terminated.
    DstFault,
    /// The descriptor broke a rule of §4.
    BadDescriptor,
    /// The peer is unreachable.
    LinkError,
    /// The channel was disabled or reset first.
    Flushed,
}

impl EntryStatus {
    /// The code in the entry.
    pub const fn code(self) -> u8 {
        match self {
            EntryStatus::Ok => 0,
            EntryStatus::SrcFault => 1,
            EntryStatus::DstFault => 2,
            EntryStatus::BadDescriptor => 3,
            EntryStatus::LinkError => 4,
            EntryStatus::Flushed => 5,
        }
    }

    /// From an entry's code.
    pub const fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0 => EntryStatus::Ok,
            1 => EntryStatus::SrcFault,
            2 => EntryStatus::DstFault,
            3 => EntryStatus::BadDescriptor,
            4 => EntryStatus::LinkError,
            5 => EntryStatus::Flushed,
            _ => return None,
        })
    }
}

/// An inline protocol message (opaque to the engine).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct InlineMsg {
    len: u8,
    bytes: [u8; MAX_MSG],
}

impl core::fmt::Debug for InlineMsg {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("InlineMsg").field("len", &self.len).finish()
    }
}

impl InlineMsg {
    /// No message.
    pub const EMPTY: InlineMsg = InlineMsg {
        len: 0,
        bytes: [0; MAX_MSG],
    };

    /// Wraps `bytes` (at most 64).
    pub fn new(bytes: &[u8]) -> Result<Self, DmaError> {
        if bytes.len() > MAX_MSG {
            return Err(DmaError::MessageTooLong { len: bytes.len() });
        }
        let mut out = Self::EMPTY;
        out.bytes
            .get_mut(..bytes.len())
            .ok_or(DmaError::MessageTooLong { len: bytes.len() })?
            .copy_from_slice(bytes);
        out.len = bytes.len() as u8;
        Ok(out)
    }

    /// The message bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there is no message.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn read(entry: &[u8], len: u8) -> Result<Self, DmaError> {
        let len_usize = usize::from(len);
        if len_usize > MAX_MSG {
            return Err(DmaError::BadEntry {
                what: "message length",
            });
        }
        let area = entry
            .get(64..64 + MAX_MSG)
            .ok_or(DmaError::BadEntry { what: "entry size" })?;
        // Bytes beyond the message must be zero (§4.1).
        if area
            .get(len_usize..)
            .is_some_and(|rest| rest.iter().any(|&b| b != 0))
        {
            return Err(DmaError::BadEntry {
                what: "bytes after the message",
            });
        }
        let mut out = Self::EMPTY;
        out.bytes.copy_from_slice(area);
        out.len = len;
        Ok(out)
    }

    fn write(&self, entry: &mut [u8]) {
        if let Some(area) = entry.get_mut(64..64 + MAX_MSG) {
            area.copy_from_slice(&self.bytes);
        }
    }
}

/// What a submission entry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SqOp {
    /// Read `length` bytes at `src_va` and send them with the inline block header.
    SendBlock {
        /// Source virtual address.
        src_va: u64,
        /// Payload bytes (1 ..= block size).
        length: u32,
        /// Destination VA for the ExaNet header (informational).
        dst_va: u64,
    },
    /// Send the inline message.
    SendMsg,
    /// Nothing.
    Nop,
}

/// A submission entry (§4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SqEntry {
    /// The operation.
    pub op: SqOp,
    /// Write a CQ entry on success too.
    pub signal: bool,
    /// Transfer id mod 2^14.
    pub tid14: u16,
    /// Destination node.
    pub peer: u32,
    /// Protection domain at the peer.
    pub dst_pdid: u16,
    /// Returned in the completion.
    pub cookie: u64,
    /// The inline message (for `SendBlock`: the protocol BLOCK message).
    pub msg: InlineMsg,
}

impl SqEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; SQ_ENTRY] {
        let mut out = [0u8; SQ_ENTRY];
        let mut w0 = SqWord0(0);
        let (opcode, src, length, dst) = match self.op {
            SqOp::SendBlock {
                src_va,
                length,
                dst_va,
            } => (1, src_va & VA_MASK, length, dst_va & VA_MASK),
            SqOp::SendMsg => (2, 0, 0, 0),
            SqOp::Nop => (3, 0, 0, 0),
        };
        w0.set_opcode(opcode);
        w0.set_signal(self.signal);
        w0.set_tid14(self.tid14 & 0x3fff);
        w0.set_length(length);
        let mut w2 = SqWord2(0);
        w2.set_peer(self.peer & COORD_MASK);
        w2.set_dst_pdid(self.dst_pdid);
        w2.set_msg_len(self.msg.len);
        put(&mut out, 0, w0.0);
        put(&mut out, 1, src);
        put(&mut out, 2, w2.0);
        put(&mut out, 3, dst);
        put(&mut out, 4, self.cookie);
        self.msg.write(&mut out);
        out
    }

    /// Decodes and validates an entry; `block_size` bounds `SendBlock` lengths.
    pub fn decode(bytes: &[u8; SQ_ENTRY], block_size: u32) -> Result<Self, DmaError> {
        let w0 = SqWord0(word(bytes, 0));
        let w2 = SqWord2(word(bytes, 2));
        let bad = |what| DmaError::BadEntry { what };
        if w0.reserved_a() != 0 || w0.reserved_b() != 0 || w2.reserved() != 0 {
            return Err(bad("reserved bits"));
        }
        if (5..8).any(|i| word(bytes, i) != 0) {
            return Err(bad("reserved words"));
        }
        let src = word(bytes, 1);
        let dst = word(bytes, 3);
        if src & !VA_MASK != 0 || dst & !VA_MASK != 0 {
            return Err(bad("address beyond 49 bits"));
        }
        let msg_len = w2.msg_len();
        let msg = InlineMsg::read(bytes, msg_len)?;
        let op = match w0.opcode() {
            1 => {
                let length = w0.length();
                if length == 0 || length > block_size {
                    return Err(bad("block length"));
                }
                if usize::from(msg_len) < MIN_MSG {
                    return Err(bad("message length"));
                }
                SqOp::SendBlock {
                    src_va: src,
                    length,
                    dst_va: dst,
                }
            }
            2 => {
                if w0.length() != 0 || src != 0 || dst != 0 {
                    return Err(bad("fields unused by SEND_MSG"));
                }
                if usize::from(msg_len) < MIN_MSG {
                    return Err(bad("message length"));
                }
                SqOp::SendMsg
            }
            3 => {
                // LENGTH and SRC_VA are "0 otherwise" (§4.1); DST_VA means nothing without a
                // block either. A NOP's message is not sent, so its length is not bounded below.
                if w0.length() != 0 || src != 0 || dst != 0 {
                    return Err(bad("fields unused by NOP"));
                }
                SqOp::Nop
            }
            _ => return Err(bad("opcode")),
        };
        Ok(SqEntry {
            op,
            signal: w0.signal(),
            tid14: w0.tid14(),
            peer: w2.peer(),
            dst_pdid: w2.dst_pdid(),
            cookie: word(bytes, 4),
            msg,
        })
    }
}

/// A channel completion entry (§4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqEntry {
    /// Phase bit.
    pub phase: bool,
    /// How the descriptor ended.
    pub status: EntryStatus,
    /// SQ index mod 2^16.
    pub sq_index: u16,
    /// Payload bytes sent.
    pub bytes: u32,
    /// The descriptor's cookie.
    pub cookie: u64,
    /// Address of the terminated read (SRC_FAULT).
    pub fault_addr: u64,
}

impl CqEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; CQ_ENTRY] {
        let mut out = [0u8; CQ_ENTRY];
        let mut w0 = CompletionWord0(0);
        w0.set_phase(self.phase);
        w0.set_status(self.status.code());
        w0.set_index(self.sq_index);
        w0.set_bytes(self.bytes);
        put(&mut out, 0, w0.0);
        put(&mut out, 1, self.cookie);
        put(&mut out, 2, self.fault_addr);
        out
    }

    /// Decodes an entry.
    pub fn decode(bytes: &[u8; CQ_ENTRY]) -> Result<Self, DmaError> {
        let w0 = CompletionWord0(word(bytes, 0));
        if w0.0 & 0xfe != 0 || word(bytes, 3) != 0 {
            return Err(DmaError::BadEntry {
                what: "reserved bits",
            });
        }
        Ok(CqEntry {
            phase: w0.phase(),
            status: EntryStatus::from_code(w0.status())
                .ok_or(DmaError::BadEntry { what: "status" })?,
            sq_index: w0.index(),
            bytes: w0.bytes(),
            cookie: word(bytes, 1),
            fault_addr: word(bytes, 2),
        })
    }

    /// The phase bit of an entry's bytes, without decoding the rest.
    pub fn phase_of(bytes: &[u8]) -> bool {
        bytes.first().is_some_and(|b| b & 1 != 0)
    }
}

/// What a receive entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RqKind {
    /// A protocol message.
    Msg,
    /// A staged block in `slot` with `length` payload bytes.
    Block {
        /// Receive slot.
        slot: u8,
        /// Payload bytes.
        length: u32,
    },
}

/// A receive entry (§4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RqEntry {
    /// Phase bit.
    pub phase: bool,
    /// Message or block.
    pub kind: RqKind,
    /// The sender's node coordinate.
    pub src: u32,
    /// PDID from the packet header.
    pub pdid: u16,
    /// TID from the footer.
    pub tid14: u16,
    /// The inline message (for a block: its header area).
    pub msg: InlineMsg,
}

impl RqEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; RQ_ENTRY] {
        let mut out = [0u8; RQ_ENTRY];
        let mut w0 = RqWord0(0);
        w0.set_phase(self.phase);
        match self.kind {
            RqKind::Msg => w0.set_kind(1),
            RqKind::Block { slot, length } => {
                w0.set_kind(2);
                w0.set_slot(slot);
                w0.set_length(length);
            }
        }
        let mut w1 = RqWord1(0);
        w1.set_src(self.src & COORD_MASK);
        w1.set_pdid(self.pdid);
        w1.set_tid14(self.tid14 & 0x3fff);
        put(&mut out, 0, w0.0);
        put(&mut out, 1, w1.0);
        put(&mut out, 2, u64::from(self.msg.len));
        self.msg.write(&mut out);
        out
    }

    /// The receive slot an entry holds if its word 0 says BLOCK (KIND 2), whatever else is
    /// wrong with it: the slot must be released even when the entry cannot be decoded.
    pub fn block_slot(bytes: &[u8; RQ_ENTRY]) -> Option<u8> {
        let w0 = RqWord0(word(bytes, 0));
        (w0.kind() == 2).then(|| w0.slot())
    }

    /// Decodes an entry; reserved bits, an unknown KIND or a malformed message are errors.
    pub fn decode(bytes: &[u8; RQ_ENTRY]) -> Result<Self, DmaError> {
        let w0 = RqWord0(word(bytes, 0));
        let w1 = RqWord1(word(bytes, 1));
        let w2 = word(bytes, 2);
        let bad = |what| DmaError::BadEntry { what };
        // Word 0 bits 7:4 and 31:16 are not fields of §4.3.
        const W0_RESERVED: u64 = 0xffff_00f0;
        if w0.0 & W0_RESERVED != 0
            || w2 > 0xff
            || w1.0 >> 52 != 0
            || (3..8).any(|i| word(bytes, i) != 0)
        {
            return Err(bad("reserved bits"));
        }
        let kind = match w0.kind() {
            1 if w0.slot() == 0 && w0.length() == 0 => RqKind::Msg,
            2 => RqKind::Block {
                slot: w0.slot(),
                length: w0.length(),
            },
            _ => return Err(bad("kind")),
        };
        Ok(RqEntry {
            phase: w0.phase(),
            kind,
            src: w1.src(),
            pdid: w1.pdid(),
            tid14: w1.tid14(),
            msg: InlineMsg::read(bytes, w2 as u8)?,
        })
    }
}

/// What a write entry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WqOp {
    /// Write `length` bytes of the slot at `dst_va` in `pdid`'s context.
    Commit {
        /// Protection domain of the destination.
        pdid: u16,
        /// Bytes to write.
        length: u32,
        /// Destination virtual address.
        dst_va: u64,
    },
    /// Discard the slot.
    Release,
}

/// A write entry (§4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WqEntry {
    /// Commit or release.
    pub op: WqOp,
    /// Receive slot.
    pub slot: u8,
    /// Returned in the WCQ entry.
    pub cookie: u64,
}

impl WqEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; WQ_ENTRY] {
        let mut out = [0u8; WQ_ENTRY];
        let mut w0 = WqWord0(0);
        w0.set_slot(self.slot);
        let dst = match self.op {
            WqOp::Commit {
                pdid,
                length,
                dst_va,
            } => {
                w0.set_op(1);
                w0.set_pdid(pdid);
                w0.set_length(length);
                dst_va & VA_MASK
            }
            WqOp::Release => {
                w0.set_op(2);
                0
            }
        };
        put(&mut out, 0, w0.0);
        put(&mut out, 1, dst);
        put(&mut out, 2, self.cookie);
        out
    }

    /// Decodes and validates an entry.
    pub fn decode(bytes: &[u8; WQ_ENTRY]) -> Result<Self, DmaError> {
        let w0 = WqWord0(word(bytes, 0));
        let dst = word(bytes, 1);
        let bad = |what| DmaError::BadEntry { what };
        if word(bytes, 3) != 0 || dst & !VA_MASK != 0 {
            return Err(bad("reserved bits"));
        }
        let op = match w0.op() {
            1 if w0.length() > 0 => WqOp::Commit {
                pdid: w0.pdid(),
                length: w0.length(),
                dst_va: dst,
            },
            2 if w0.pdid() == 0 && w0.length() == 0 && dst == 0 => WqOp::Release,
            _ => return Err(bad("op")),
        };
        Ok(WqEntry {
            op,
            slot: w0.slot(),
            cookie: word(bytes, 2),
        })
    }
}

/// A write-completion entry (§4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WcqEntry {
    /// Phase bit.
    pub phase: bool,
    /// OK, DST_FAULT or BAD_DESCRIPTOR.
    pub status: EntryStatus,
    /// The slot written from.
    pub slot: u8,
    /// Bytes written before a fault.
    pub bytes: u32,
    /// The commit's cookie.
    pub cookie: u64,
    /// Address of the terminated write.
    pub fault_addr: u64,
    /// AXI response of the fault (2 SLVERR, 3 DECERR); 0 without a fault.
    pub axi_resp: u8,
}

impl WcqEntry {
    /// The entry's bytes.
    pub fn encode(&self) -> [u8; WCQ_ENTRY] {
        let mut out = [0u8; WCQ_ENTRY];
        let mut w0 = CompletionWord0(0);
        w0.set_phase(self.phase);
        w0.set_status(self.status.code());
        // The slot sits in bits 23:16, the low byte of the index field.
        w0.set_index(u16::from(self.slot));
        w0.set_bytes(self.bytes);
        let mut w3 = WcqWord3(0);
        if self.status == EntryStatus::DstFault {
            w3.set_resp(self.axi_resp & 3);
            w3.set_write(true);
            w3.set_valid(true);
        }
        put(&mut out, 0, w0.0);
        put(&mut out, 1, self.cookie);
        put(&mut out, 2, self.fault_addr);
        put(&mut out, 3, w3.0);
        out
    }

    /// Decodes an entry.
    pub fn decode(bytes: &[u8; WCQ_ENTRY]) -> Result<Self, DmaError> {
        let w0 = CompletionWord0(word(bytes, 0));
        let w3 = WcqWord3(word(bytes, 3));
        let bad = |what| DmaError::BadEntry { what };
        if w0.0 & 0xfe != 0 || w0.index() > 0xff || w3.0 >> 4 != 0 {
            return Err(bad("reserved bits"));
        }
        let status = EntryStatus::from_code(w0.status()).ok_or(bad("status"))?;
        // The syndrome belongs to a DST_FAULT entry, whose terminated access is a write: VALID
        // and WRITE are set together there and nowhere else, with no response bits alone.
        let syndrome = status == EntryStatus::DstFault;
        if w3.valid() != syndrome || w3.write() != syndrome || (!syndrome && w3.resp() != 0) {
            return Err(bad("fault syndrome"));
        }
        Ok(WcqEntry {
            phase: w0.phase(),
            status,
            slot: w0.index() as u8,
            bytes: w0.bytes(),
            cookie: word(bytes, 1),
            fault_addr: word(bytes, 2),
            axi_resp: if w3.valid() { w3.resp() } else { 0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_block_word_layout_matches_the_spec() {
        let entry = SqEntry {
            op: SqOp::SendBlock {
                src_va: 0x1_2345_6000,
                length: 4096,
                dst_va: 0x7_0000_1000,
            },
            signal: true,
            tid14: 0x2abc,
            peer: 3,
            dst_pdid: 0x0102,
            cookie: 0xdead_beef,
            msg: InlineMsg::new(&[0xaa; 56]).unwrap(),
        };
        let b = entry.encode();
        // word 0: opcode 1, SIGNAL bit 8, TID14 at 29:16, LENGTH at 63:32.
        assert_eq!(word(&b, 0), 1 | 1 << 8 | 0x2abc << 16 | 4096 << 32);
        assert_eq!(word(&b, 1), 0x1_2345_6000);
        // word 2: PEER 21:0, DST_PDID 37:22, MSG_LEN 45:38.
        assert_eq!(word(&b, 2), 3 | 0x0102 << 22 | 56 << 38);
        assert_eq!(word(&b, 3), 0x7_0000_1000);
        assert_eq!(word(&b, 4), 0xdead_beef);
        assert_eq!(&b[64..120], &[0xaa; 56]);
        assert!(b[120..].iter().all(|&x| x == 0));
        assert_eq!(SqEntry::decode(&b, 4096).unwrap(), entry);
    }

    #[test]
    fn bad_submissions_are_rejected_with_a_reason() {
        let good = SqEntry {
            op: SqOp::SendMsg,
            signal: false,
            tid14: 0,
            peer: 1,
            dst_pdid: 0,
            cookie: 0,
            msg: InlineMsg::new(&[1; 32]).unwrap(),
        }
        .encode();
        assert!(SqEntry::decode(&good, 4096).is_ok());
        let mut opcode = good;
        opcode[0] = 9;
        assert_eq!(
            SqEntry::decode(&opcode, 4096),
            Err(DmaError::BadEntry { what: "opcode" })
        );
        let mut reserved = good;
        reserved[5 * 8] = 1;
        assert!(SqEntry::decode(&reserved, 4096).is_err());
        let mut tail = good;
        tail[64 + 40] = 7; // beyond MSG_LEN = 32
        assert!(SqEntry::decode(&tail, 4096).is_err());
        let long = SqEntry {
            op: SqOp::SendBlock {
                src_va: 0,
                length: 4097,
                dst_va: 0,
            },
            ..SqEntry::decode(&good, 4096).unwrap()
        }
        .encode();
        assert_eq!(
            SqEntry::decode(&long, 4096),
            Err(DmaError::BadEntry {
                what: "block length"
            })
        );
    }

    #[test]
    fn completion_entries_round_trip_with_spec_positions() {
        let cq = CqEntry {
            phase: true,
            status: EntryStatus::SrcFault,
            sq_index: 0x1234,
            bytes: 0,
            cookie: 9,
            fault_addr: 0x4000,
        };
        let b = cq.encode();
        assert_eq!(word(&b, 0), 1 | 1 << 8 | 0x1234 << 16);
        assert_eq!(CqEntry::decode(&b).unwrap(), cq);
        let wcq = WcqEntry {
            phase: false,
            status: EntryStatus::DstFault,
            slot: 63,
            bytes: 1024,
            cookie: 5,
            fault_addr: 0x9000,
            axi_resp: 2,
        };
        let b = wcq.encode();
        assert_eq!(word(&b, 0), 2 << 8 | 63 << 16 | 1024 << 32);
        // resp 2 (SLVERR), WRITE, VALID.
        assert_eq!(word(&b, 3), 0b1110);
        assert_eq!(WcqEntry::decode(&b).unwrap(), wcq);
    }

    #[test]
    fn receive_and_write_entries_round_trip() {
        let rq = RqEntry {
            phase: true,
            kind: RqKind::Block {
                slot: 7,
                length: 4096,
            },
            src: 0x3f_ffff,
            pdid: 0xffff,
            tid14: 0x3fff,
            msg: InlineMsg::new(&[3; 56]).unwrap(),
        };
        let b = rq.encode();
        assert_eq!(word(&b, 0), 1 | 2 << 1 | 7 << 8 | 4096 << 32);
        assert_eq!(word(&b, 1), 0x3f_ffff | 0xffff << 22 | 0x3fff << 38);
        assert_eq!(RqEntry::decode(&b).unwrap(), rq);
        assert_eq!(RqEntry::block_slot(&b), Some(7));
        // A BLOCK entry with a reserved bit set does not decode, but still names its slot.
        let mut broken = b;
        broken[8 * 3] = 1;
        assert!(RqEntry::decode(&broken).is_err());
        assert_eq!(RqEntry::block_slot(&broken), Some(7));
        // A MSG entry holds no slot.
        let msg = RqEntry {
            kind: RqKind::Msg,
            ..rq
        };
        assert_eq!(RqEntry::block_slot(&msg.encode()), None);
        let wq = WqEntry {
            op: WqOp::Commit {
                pdid: 1,
                length: 4096,
                dst_va: 0x20_0000,
            },
            slot: 2,
            cookie: 77,
        };
        let b = wq.encode();
        assert_eq!(word(&b, 0), 1 | 2 << 8 | 1 << 16 | 4096 << 32);
        assert_eq!(WqEntry::decode(&b).unwrap(), wq);
        let rel = WqEntry {
            op: WqOp::Release,
            slot: 4,
            cookie: 0,
        };
        assert_eq!(WqEntry::decode(&rel.encode()).unwrap(), rel);
        let mut bad = rel.encode();
        bad[0] = 3;
        assert!(WqEntry::decode(&bad).is_err());
    }
}
