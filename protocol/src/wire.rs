//! Messages and their versioned wire encoding.
//!
//! Every message is `header (12 bytes) | body (fixed size per type) | CRC-32C (4 bytes)`, all
//! integers little-endian. The byte tables are in `docs/protocol.md` §4. Decoding checks, in
//! this order: header present, magic, version, declared length (oversized, too short),
//! truncation, checksum, type code, length for that type, then every field. Integrity is
//! checked before interpretation so a corrupted type byte reports a checksum error, and an
//! unknown type is reported only for an intact message. Nothing here can panic on any input.

use crate::crc::crc32c;
use crate::types::{
    AbortReason, Access, BlockRange, FaultReason, Generation, RequestStatus, TransferId,
};
use crate::{ProtocolError, Result};

/// Magic number of every message: the bytes `N P R M` ("nprdma message"), read as a
/// little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"NPRM");
/// The protocol version this implementation speaks.
pub const VERSION: u8 = 1;
/// Lowest version this implementation accepts.
pub const MIN_VERSION: u8 = 1;
/// Bytes before the body.
pub const HEADER_LEN: usize = 12;
/// Bytes after the body (the CRC).
pub const TRAILER_LEN: usize = 4;
/// Smallest possible message (empty body).
pub const MIN_MESSAGE_LEN: usize = HEADER_LEN + TRAILER_LEN;
/// Largest length a decoder accepts in a header; anything longer is `Oversized` and is
/// rejected before waiting for (or reading) its bytes.
pub const MAX_MESSAGE_LEN: usize = 256;
/// Largest body of any version-1 message type.
const MAX_BODY_LEN: usize = 40;
/// Largest encoded version-1 message.
pub const MAX_ENCODED_LEN: usize = HEADER_LEN + MAX_BODY_LEN + TRAILER_LEN;

/// Message type codes (byte 5 of the header). Stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// [`Hello`].
    Hello = 1,
    /// [`BlockHeader`].
    Block = 2,
    /// [`Ack`].
    Ack = 3,
    /// [`Nack`].
    Nack = 4,
    /// [`Resolved`].
    Resolved = 5,
    /// [`FaultInRequest`].
    FaultInRequest = 6,
    /// [`FaultInAck`].
    FaultInAck = 7,
    /// [`StateLookupRequest`].
    StateLookupRequest = 8,
    /// [`StateLookupResponse`].
    StateLookupResponse = 9,
    /// [`Abort`].
    Abort = 10,
    /// [`AbortAck`].
    AbortAck = 11,
}

impl MessageType {
    /// All types, by code.
    pub const ALL: [MessageType; 11] = [
        MessageType::Hello,
        MessageType::Block,
        MessageType::Ack,
        MessageType::Nack,
        MessageType::Resolved,
        MessageType::FaultInRequest,
        MessageType::FaultInAck,
        MessageType::StateLookupRequest,
        MessageType::StateLookupResponse,
        MessageType::Abort,
        MessageType::AbortAck,
    ];

    /// The type with wire code `code`.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(MessageType::Hello),
            2 => Some(MessageType::Block),
            3 => Some(MessageType::Ack),
            4 => Some(MessageType::Nack),
            5 => Some(MessageType::Resolved),
            6 => Some(MessageType::FaultInRequest),
            7 => Some(MessageType::FaultInAck),
            8 => Some(MessageType::StateLookupRequest),
            9 => Some(MessageType::StateLookupResponse),
            10 => Some(MessageType::Abort),
            11 => Some(MessageType::AbortAck),
            _ => None,
        }
    }

    /// Body length of this type in version 1.
    pub const fn body_len(self) -> usize {
        match self {
            MessageType::Hello => 16,
            MessageType::Block => 40,
            MessageType::Ack => 16,
            MessageType::Nack => 16,
            MessageType::Resolved => 24,
            MessageType::FaultInRequest => 40,
            MessageType::FaultInAck => 32,
            MessageType::StateLookupRequest => 16,
            MessageType::StateLookupResponse => 40,
            MessageType::Abort => 16,
            MessageType::AbortAck => 8,
        }
    }

    /// Total encoded length of this type in version 1.
    pub const fn wire_len(self) -> usize {
        HEADER_LEN + self.body_len() + TRAILER_LEN
    }
}

/// Connection set-up: each side announces what it speaks and what it can hold.
///
/// Always framed with header version 1 and never extended, so any implementation can read a
/// peer's Hello and explain a version mismatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hello {
    /// Lowest protocol version the sender of the Hello speaks (≥ 1).
    pub min_version: u8,
    /// Highest protocol version it speaks (≥ `min_version`).
    pub max_version: u8,
    /// Block size in bytes (must be equal on both sides).
    pub block_size: u32,
    /// Most blocks per transfer it can track.
    pub max_blocks: u32,
    /// Most open transfers it can track (the receive window).
    pub window: u32,
}

/// The parameters two peers agreed on (see [`negotiate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Agreed {
    /// The protocol version both speak (the highest common one).
    pub version: u8,
    /// The block size.
    pub block_size: u32,
    /// The smaller of the two block limits.
    pub max_blocks: u32,
    /// The smaller of the two windows: the sender never has more transfers open.
    pub window: u32,
}

/// Agrees on a version and parameters from our Hello and the peer's.
///
/// Picks the highest version in both ranges; fails with `NoCommonVersion` if the ranges do not
/// overlap and with `ParameterMismatch` if the block sizes differ.
pub fn negotiate(ours: &Hello, peer: &Hello) -> Result<Agreed> {
    let low = ours.min_version.max(peer.min_version);
    let high = ours.max_version.min(peer.max_version);
    if low > high {
        return Err(ProtocolError::NoCommonVersion {
            local_min: ours.min_version,
            local_max: ours.max_version,
            peer_min: peer.min_version,
            peer_max: peer.max_version,
        });
    }
    if ours.block_size != peer.block_size {
        return Err(ProtocolError::ParameterMismatch {
            field: "block_size",
        });
    }
    Ok(Agreed {
        version: high,
        block_size: ours.block_size,
        max_blocks: ours.max_blocks.min(peer.max_blocks),
        window: ours.window.min(peer.window),
    })
}

/// One data block on its way to the receiver. The payload (`len` bytes) travels with it:
/// after the encoded header on a byte stream, or as the engine's packet payload on the SoC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockHeader {
    /// The transfer.
    pub tid: TransferId,
    /// Index of this block in the transfer.
    pub block: u32,
    /// Blocks in the transfer (equal in every block of it).
    pub block_count: u32,
    /// Per-block send sequence: 1 for the first send, +1 for every re-send.
    pub attempt: u16,
    /// The sender's oldest transfer that is still open: every id before it is finished at the
    /// sender (completed or aborted). Lets the receiver retire transfers whose Abort was lost.
    pub oldest_open: TransferId,
    /// Payload bytes (the block size, except possibly in the last block).
    pub len: u32,
    /// The destination region's key (protection domain, rkey...); opaque to the protocol.
    pub key: u32,
    /// Destination address of the block's first byte.
    pub dest: u64,
}

/// Blocks written successfully at the receiver (per-block ACK).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ack {
    /// The transfer.
    pub tid: TransferId,
    /// The blocks.
    pub blocks: BlockRange,
    /// The attempt that the receiver saw (any attempt of a written block acknowledges it).
    pub attempt: u16,
}

/// Blocks the receiver could not write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Nack {
    /// The transfer.
    pub tid: TransferId,
    /// The blocks.
    pub blocks: BlockRange,
    /// The attempt that faulted; a NACK for an older attempt than the sender's latest is stale.
    pub attempt: u16,
    /// Why the write failed.
    pub reason: FaultReason,
    /// The receiver will never accept these blocks: the sender aborts the transfer.
    pub fatal: bool,
}

/// The receiver resolved the faults of earlier NACKs: the sender may re-send now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Resolved {
    /// The transfer.
    pub tid: TransferId,
    /// The blocks whose pages are present again.
    pub blocks: BlockRange,
    /// The receiver's page-state generation after the resolution.
    pub generation: Generation,
}

/// A request to make a range of the peer's memory present (the requester detected the fault
/// itself, e.g. by a failed version check on the server path).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultInRequest {
    /// Request sequence number, echoed in the [`FaultInAck`].
    pub req_seq: u32,
    /// The transfer the request serves.
    pub tid: TransferId,
    /// Its blocks the range covers.
    pub blocks: BlockRange,
    /// The region's key.
    pub key: u32,
    /// The access that must be possible afterwards.
    pub access: Access,
    /// First byte of the range (the destination address space).
    pub addr: u64,
    /// Length of the range in bytes (≥ 1).
    pub len: u64,
}

/// The answer to a [`FaultInRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultInAck {
    /// The request's sequence number.
    pub req_seq: u32,
    /// The transfer.
    pub tid: TransferId,
    /// The blocks.
    pub blocks: BlockRange,
    /// Whether the range is present now.
    pub status: RequestStatus,
    /// The responder's page-state generation after the fault-in.
    pub generation: Generation,
}

/// Asks for the state of up to 64 pages of a peer's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateLookupRequest {
    /// Request sequence number, echoed in the response.
    pub req_seq: u32,
    /// The region's key.
    pub key: u32,
    /// Byte offset into the region of the first page of interest.
    pub offset: u64,
}

/// The state of up to 64 consecutive pages of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StateLookupResponse {
    /// The request's sequence number.
    pub req_seq: u32,
    /// The region's key.
    pub key: u32,
    /// `Ok`, or why no state is given (e.g. `OutOfRegion`).
    pub status: RequestStatus,
    /// log2 of the table's page size (12 for 4 KiB entries).
    pub page_shift: u8,
    /// Number of pages described (0..=64).
    pub pages: u8,
    /// Byte offset of the first page described (the request's offset rounded down to a page).
    pub offset: u64,
    /// The table's generation when the state was read.
    pub generation: Generation,
    /// Bit `i` set: page `i` is present. Bits at and above `pages` are zero.
    pub present: u64,
}

/// The sender gave up on a transfer (repeated until acknowledged or out of attempts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Abort {
    /// The transfer.
    pub tid: TransferId,
    /// As in [`BlockHeader::oldest_open`]. It may lie before `tid` (an older transfer is
    /// still active) or after it.
    pub oldest_open: TransferId,
    /// Why.
    pub reason: AbortReason,
}

/// The receiver has retired an aborted transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AbortAck {
    /// The transfer.
    pub tid: TransferId,
}

/// Every message of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Message {
    /// Connection set-up.
    Hello(Hello),
    /// A data block's header.
    Block(BlockHeader),
    /// Blocks written.
    Ack(Ack),
    /// Blocks not written.
    Nack(Nack),
    /// Faults behind earlier NACKs resolved.
    Resolved(Resolved),
    /// Make a remote range present.
    FaultInRequest(FaultInRequest),
    /// Answer to a fault-in request.
    FaultInAck(FaultInAck),
    /// Ask for page state.
    StateLookupRequest(StateLookupRequest),
    /// Page state.
    StateLookupResponse(StateLookupResponse),
    /// A transfer was aborted.
    Abort(Abort),
    /// An abort was seen.
    AbortAck(AbortAck),
}

impl Message {
    /// The message's type.
    pub const fn message_type(&self) -> MessageType {
        match self {
            Message::Hello(_) => MessageType::Hello,
            Message::Block(_) => MessageType::Block,
            Message::Ack(_) => MessageType::Ack,
            Message::Nack(_) => MessageType::Nack,
            Message::Resolved(_) => MessageType::Resolved,
            Message::FaultInRequest(_) => MessageType::FaultInRequest,
            Message::FaultInAck(_) => MessageType::FaultInAck,
            Message::StateLookupRequest(_) => MessageType::StateLookupRequest,
            Message::StateLookupResponse(_) => MessageType::StateLookupResponse,
            Message::Abort(_) => MessageType::Abort,
            Message::AbortAck(_) => MessageType::AbortAck,
        }
    }

    /// The transfer the message is about, if any.
    pub const fn transfer(&self) -> Option<TransferId> {
        match self {
            Message::Block(m) => Some(m.tid),
            Message::Ack(m) => Some(m.tid),
            Message::Nack(m) => Some(m.tid),
            Message::Resolved(m) => Some(m.tid),
            Message::FaultInRequest(m) => Some(m.tid),
            Message::FaultInAck(m) => Some(m.tid),
            Message::Abort(m) => Some(m.tid),
            Message::AbortAck(m) => Some(m.tid),
            Message::Hello(_)
            | Message::StateLookupRequest(_)
            | Message::StateLookupResponse(_) => None,
        }
    }
}

/// A message with the session (connection incarnation) it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Envelope {
    /// Chosen by the connection's initiator; a restarted peer picks a new one so that stale
    /// messages of the old incarnation are refused.
    pub session: u32,
    /// The message.
    pub message: Message,
}

impl Envelope {
    /// Wraps a message.
    pub const fn new(session: u32, message: Message) -> Self {
        Self { session, message }
    }

    /// The message, if it belongs to `session`.
    pub fn expect_session(self, session: u32) -> Result<Message> {
        if self.session != session {
            return Err(ProtocolError::WrongSession {
                expected: session,
                found: self.session,
            });
        }
        Ok(self.message)
    }

    /// Encoded length.
    pub const fn wire_len(&self) -> usize {
        self.message.message_type().wire_len()
    }

    /// Encodes into `out`, returning the number of bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize> {
        let bytes = self.to_bytes();
        let got = out.len();
        let dst = out
            .get_mut(..bytes.len())
            .ok_or(ProtocolError::BufferTooSmall {
                needed: bytes.len(),
                got,
            })?;
        dst.copy_from_slice(&bytes);
        Ok(bytes.len())
    }

    /// Encodes into a fixed-capacity buffer.
    pub fn to_bytes(&self) -> heapless::Vec<u8, MAX_ENCODED_LEN> {
        let ty = self.message.message_type();
        let mut w = Writer::default();
        w.u32(MAGIC);
        w.u8(VERSION);
        w.u8(ty as u8);
        // Every version-1 message is at most MAX_ENCODED_LEN (56) bytes, so this fits u16.
        w.u16(ty.wire_len() as u16);
        w.u32(self.session);
        encode_body(&self.message, &mut w);
        let crc = crc32c(w.as_slice());
        w.u32(crc);
        w.into_vec()
    }

    /// Decodes one message from the front of `buf`; returns it and the bytes it used (bytes
    /// after it are left alone, so a byte stream can be decoded message by message).
    pub fn decode(buf: &[u8]) -> Result<(Envelope, usize)> {
        let header = buf.get(..HEADER_LEN).ok_or(ProtocolError::Truncated {
            needed: HEADER_LEN,
            got: buf.len(),
        })?;
        let mut r = Reader::new(header, 0);
        let magic = r.u32()?;
        if magic != MAGIC {
            return Err(ProtocolError::BadMagic { found: magic });
        }
        let version = r.u8()?;
        if version != VERSION {
            return Err(ProtocolError::UnsupportedVersion { found: version });
        }
        let type_code = r.u8()?;
        let declared = usize::from(r.u16()?);
        let session = r.u32()?;
        if declared > MAX_MESSAGE_LEN {
            return Err(ProtocolError::Oversized {
                declared,
                max: MAX_MESSAGE_LEN,
            });
        }
        if declared < MIN_MESSAGE_LEN {
            return Err(ProtocolError::BadLength {
                declared,
                expected: MIN_MESSAGE_LEN,
            });
        }
        let whole = buf.get(..declared).ok_or(ProtocolError::Truncated {
            needed: declared,
            got: buf.len(),
        })?;
        let (covered, trailer) = whole.split_at(declared - TRAILER_LEN);
        let stored = Reader::new(trailer, declared - TRAILER_LEN).u32()?;
        let computed = crc32c(covered);
        if stored != computed {
            return Err(ProtocolError::BadChecksum { stored, computed });
        }
        let ty = MessageType::from_code(type_code)
            .ok_or(ProtocolError::UnknownType { code: type_code })?;
        if declared != ty.wire_len() {
            return Err(ProtocolError::BadLength {
                declared,
                expected: ty.wire_len(),
            });
        }
        let body = covered.get(HEADER_LEN..).unwrap_or(&[]);
        let message = decode_body(ty, &mut Reader::new(body, HEADER_LEN))?;
        Ok((Envelope { session, message }, declared))
    }
}

fn encode_body(message: &Message, w: &mut Writer) {
    match message {
        Message::Hello(m) => {
            w.u8(m.min_version);
            w.u8(m.max_version);
            w.u16(0);
            w.u32(m.block_size);
            w.u32(m.max_blocks);
            w.u32(m.window);
        }
        Message::Block(m) => {
            w.u32(m.tid.0);
            w.u32(m.block);
            w.u32(m.block_count);
            w.u16(m.attempt);
            w.u16(0);
            w.u32(m.oldest_open.0);
            w.u32(m.len);
            w.u32(m.key);
            w.u32(0);
            w.u64(m.dest);
        }
        Message::Ack(m) => {
            w.u32(m.tid.0);
            w.range(m.blocks);
            w.u16(m.attempt);
            w.u16(0);
        }
        Message::Nack(m) => {
            w.u32(m.tid.0);
            w.range(m.blocks);
            w.u16(m.attempt);
            w.u8(m.reason.code());
            w.u8(u8::from(m.fatal));
        }
        Message::Resolved(m) => {
            w.u32(m.tid.0);
            w.range(m.blocks);
            w.u32(0);
            w.u64(m.generation.0);
        }
        Message::FaultInRequest(m) => {
            w.u32(m.req_seq);
            w.u32(m.tid.0);
            w.range(m.blocks);
            w.u32(m.key);
            w.u8(m.access.code());
            w.u8(0);
            w.u16(0);
            w.u64(m.addr);
            w.u64(m.len);
        }
        Message::FaultInAck(m) => {
            w.u32(m.req_seq);
            w.u32(m.tid.0);
            w.range(m.blocks);
            w.u8(m.status.code());
            w.u8(0);
            w.u16(0);
            w.u32(0);
            w.u64(m.generation.0);
        }
        Message::StateLookupRequest(m) => {
            w.u32(m.req_seq);
            w.u32(m.key);
            w.u64(m.offset);
        }
        Message::StateLookupResponse(m) => {
            w.u32(m.req_seq);
            w.u32(m.key);
            w.u8(m.status.code());
            w.u8(m.page_shift);
            w.u8(m.pages);
            w.u8(0);
            w.u32(0);
            w.u64(m.offset);
            w.u64(m.generation.0);
            w.u64(m.present);
        }
        Message::Abort(m) => {
            let (code, fault, block) = m.reason.to_wire();
            w.u32(m.tid.0);
            w.u32(m.oldest_open.0);
            w.u8(code);
            w.u8(fault);
            w.u16(0);
            w.u32(block);
        }
        Message::AbortAck(m) => {
            w.u32(m.tid.0);
            w.u32(0);
        }
    }
}

fn decode_body(ty: MessageType, r: &mut Reader<'_>) -> Result<Message> {
    Ok(match ty {
        MessageType::Hello => {
            let (at, min_version) = r.field_u8()?;
            let max_version = r.u8()?;
            r.reserved_u16()?;
            if min_version < MIN_VERSION || max_version < min_version {
                return Err(ProtocolError::BadField { offset: at });
            }
            Message::Hello(Hello {
                min_version,
                max_version,
                block_size: r.nonzero_u32()?,
                max_blocks: r.nonzero_u32()?,
                window: r.nonzero_u32()?,
            })
        }
        MessageType::Block => {
            let tid = TransferId(r.u32()?);
            let (at_block, block) = r.field_u32()?;
            let block_count = r.nonzero_u32()?;
            if block >= block_count {
                return Err(ProtocolError::BadField { offset: at_block });
            }
            let attempt = r.nonzero_u16()?;
            r.reserved_u16()?;
            let (at_oldest, oldest_open) = r.field_u32()?;
            let oldest_open = TransferId(oldest_open);
            if tid.offset_from(oldest_open) < 0 {
                return Err(ProtocolError::BadField { offset: at_oldest });
            }
            let len = r.nonzero_u32()?;
            let key = r.u32()?;
            r.reserved_u32()?;
            let dest = r.u64()?;
            Message::Block(BlockHeader {
                tid,
                block,
                block_count,
                attempt,
                oldest_open,
                len,
                key,
                dest,
            })
        }
        MessageType::Ack => {
            let tid = TransferId(r.u32()?);
            let blocks = r.range()?;
            let attempt = r.nonzero_u16()?;
            r.reserved_u16()?;
            Message::Ack(Ack {
                tid,
                blocks,
                attempt,
            })
        }
        MessageType::Nack => {
            let tid = TransferId(r.u32()?);
            let blocks = r.range()?;
            let attempt = r.nonzero_u16()?;
            let (at_reason, reason) = r.field_u8()?;
            let reason = FaultReason::from_code(reason)
                .ok_or(ProtocolError::BadField { offset: at_reason })?;
            let (at_flags, flags) = r.field_u8()?;
            let fatal = match flags {
                0 => false,
                1 => true,
                _ => return Err(ProtocolError::BadField { offset: at_flags }),
            };
            Message::Nack(Nack {
                tid,
                blocks,
                attempt,
                reason,
                fatal,
            })
        }
        MessageType::Resolved => {
            let tid = TransferId(r.u32()?);
            let blocks = r.range()?;
            r.reserved_u32()?;
            let generation = Generation(r.u64()?);
            Message::Resolved(Resolved {
                tid,
                blocks,
                generation,
            })
        }
        MessageType::FaultInRequest => {
            let req_seq = r.u32()?;
            let tid = TransferId(r.u32()?);
            let blocks = r.range()?;
            let key = r.u32()?;
            let (at_access, access) = r.field_u8()?;
            let access =
                Access::from_code(access).ok_or(ProtocolError::BadField { offset: at_access })?;
            r.reserved_u8()?;
            r.reserved_u16()?;
            let addr = r.u64()?;
            let (at_len, len) = r.field_u64()?;
            if len == 0 || addr.checked_add(len - 1).is_none() {
                return Err(ProtocolError::BadField { offset: at_len });
            }
            Message::FaultInRequest(FaultInRequest {
                req_seq,
                tid,
                blocks,
                key,
                access,
                addr,
                len,
            })
        }
        MessageType::FaultInAck => {
            let req_seq = r.u32()?;
            let tid = TransferId(r.u32()?);
            let blocks = r.range()?;
            let status = r.status()?;
            r.reserved_u8()?;
            r.reserved_u16()?;
            r.reserved_u32()?;
            let generation = Generation(r.u64()?);
            Message::FaultInAck(FaultInAck {
                req_seq,
                tid,
                blocks,
                status,
                generation,
            })
        }
        MessageType::StateLookupRequest => Message::StateLookupRequest(StateLookupRequest {
            req_seq: r.u32()?,
            key: r.u32()?,
            offset: r.u64()?,
        }),
        MessageType::StateLookupResponse => {
            let req_seq = r.u32()?;
            let key = r.u32()?;
            let status = r.status()?;
            let (at_shift, page_shift) = r.field_u8()?;
            if !(12..=30).contains(&page_shift) {
                return Err(ProtocolError::BadField { offset: at_shift });
            }
            let (at_pages, pages) = r.field_u8()?;
            if pages > 64 {
                return Err(ProtocolError::BadField { offset: at_pages });
            }
            r.reserved_u8()?;
            r.reserved_u32()?;
            let offset = r.u64()?;
            let generation = Generation(r.u64()?);
            let (at_present, present) = r.field_u64()?;
            if pages < 64 && present >> pages != 0 {
                return Err(ProtocolError::BadField { offset: at_present });
            }
            Message::StateLookupResponse(StateLookupResponse {
                req_seq,
                key,
                status,
                page_shift,
                pages,
                offset,
                generation,
                present,
            })
        }
        MessageType::Abort => {
            let tid = TransferId(r.u32()?);
            let oldest_open = TransferId(r.u32()?);
            let (at_code, code) = r.field_u8()?;
            let fault = r.u8()?;
            r.reserved_u16()?;
            let block = r.u32()?;
            let reason = AbortReason::from_wire(code, fault, block)
                .ok_or(ProtocolError::BadField { offset: at_code })?;
            Message::Abort(Abort {
                tid,
                oldest_open,
                reason,
            })
        }
        MessageType::AbortAck => {
            let tid = TransferId(r.u32()?);
            r.reserved_u32()?;
            Message::AbortAck(AbortAck { tid })
        }
    })
}

/// Sequential little-endian writer into a fixed buffer big enough for any message.
#[derive(Default)]
struct Writer {
    buf: heapless::Vec<u8, MAX_ENCODED_LEN>,
}

impl Writer {
    fn bytes(&mut self, bytes: &[u8]) {
        // Capacity is the largest message; message layouts are fixed, so this never fails.
        let pushed = self.buf.extend_from_slice(bytes);
        debug_assert!(pushed.is_ok(), "message layout exceeds MAX_ENCODED_LEN");
    }
    fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn range(&mut self, r: BlockRange) {
        self.u32(r.first());
        self.u32(r.count());
    }
    fn as_slice(&self) -> &[u8] {
        &self.buf
    }
    fn into_vec(self) -> heapless::Vec<u8, MAX_ENCODED_LEN> {
        self.buf
    }
}

/// Sequential little-endian reader; `base` is the offset of `buf` in the message, for errors.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], base: usize) -> Self {
        Self { buf, pos: 0, base }
    }

    fn take<const N: usize>(&mut self) -> Result<(usize, [u8; N])> {
        let at = self.base + self.pos;
        let bytes = self
            .buf
            .get(self.pos..self.pos + N)
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(ProtocolError::Truncated {
                needed: at + N,
                got: self.base + self.buf.len(),
            })?;
        self.pos += N;
        Ok((at, bytes))
    }
    fn field_u8(&mut self) -> Result<(usize, u8)> {
        self.take::<1>().map(|(at, b)| (at, u8::from_le_bytes(b)))
    }
    fn field_u16(&mut self) -> Result<(usize, u16)> {
        self.take::<2>().map(|(at, b)| (at, u16::from_le_bytes(b)))
    }
    fn field_u32(&mut self) -> Result<(usize, u32)> {
        self.take::<4>().map(|(at, b)| (at, u32::from_le_bytes(b)))
    }
    fn field_u64(&mut self) -> Result<(usize, u64)> {
        self.take::<8>().map(|(at, b)| (at, u64::from_le_bytes(b)))
    }
    fn u8(&mut self) -> Result<u8> {
        self.field_u8().map(|(_, v)| v)
    }
    fn u16(&mut self) -> Result<u16> {
        self.field_u16().map(|(_, v)| v)
    }
    fn u32(&mut self) -> Result<u32> {
        self.field_u32().map(|(_, v)| v)
    }
    fn u64(&mut self) -> Result<u64> {
        self.field_u64().map(|(_, v)| v)
    }
    fn nonzero_u16(&mut self) -> Result<u16> {
        match self.field_u16()? {
            (at, 0) => Err(ProtocolError::BadField { offset: at }),
            (_, v) => Ok(v),
        }
    }
    fn nonzero_u32(&mut self) -> Result<u32> {
        match self.field_u32()? {
            (at, 0) => Err(ProtocolError::BadField { offset: at }),
            (_, v) => Ok(v),
        }
    }
    fn reserved_u8(&mut self) -> Result<()> {
        match self.field_u8()? {
            (_, 0) => Ok(()),
            (at, _) => Err(ProtocolError::BadField { offset: at }),
        }
    }
    fn reserved_u16(&mut self) -> Result<()> {
        match self.field_u16()? {
            (_, 0) => Ok(()),
            (at, _) => Err(ProtocolError::BadField { offset: at }),
        }
    }
    fn reserved_u32(&mut self) -> Result<()> {
        match self.field_u32()? {
            (_, 0) => Ok(()),
            (at, _) => Err(ProtocolError::BadField { offset: at }),
        }
    }
    fn range(&mut self) -> Result<BlockRange> {
        let first = self.u32()?;
        let (at, count) = self.field_u32()?;
        BlockRange::new(first, count).ok_or(ProtocolError::BadField { offset: at })
    }
    fn status(&mut self) -> Result<RequestStatus> {
        let (at, code) = self.field_u8()?;
        RequestStatus::from_code(code).ok_or(ProtocolError::BadField { offset: at })
    }
}
