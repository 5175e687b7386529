//! The lease protocol's messages on the control connection (docs/connectx.md §5, §13): pure
//! encoding and decoding of fixed 64-byte messages, no I/O.
//!
//! Two requests and their answers:
//!
//! - [`Msg::Lookup`] (what is the region behind this application rkey?) answered by
//!   [`Msg::Directory`] (a region of the library, with its geometry), [`Msg::Plain`] (a key the
//!   library passes through: use it as is) or [`Msg::Unknown`] (no region of the owner's has
//!   that key);
//! - [`Msg::Lease`] (lease windows `[first, first + count)` of the region behind an rkey, in
//!   a lease epoch) answered by [`Msg::Grant`] (the window rkeys of the first windows of the
//!   range, as many as fit in one message: [`GRANT_KEYS`]), [`Msg::Busy`] (no room now) or
//!   [`Msg::OutOfRegion`] (never grantable).
//!
//! Every message carries the requester's sequence number, which its answer echoes; an answer
//! also echoes what it answers (the rkey, and for leases the epoch and first window), so a
//! requester takes only the answer to its own outstanding request.
//!
//! Layout (little-endian): magic `NPCL` (4), version (1), kind (1), two reserved zero bytes,
//! sequence number (4), a body of [`BODY_LEN`] bytes (zero past the kind's fields), CRC-32C of
//! bytes 0..60 (4). The `protocol` crate's envelope (`FAULT_IN_REQ`/`FAULT_IN_ACK`) does not
//! fit these messages: its acknowledgement has no room for window keys and it has no lookup,
//! so only its CRC-32C is shared (`protocol::crc32c`).

use protocol::crc32c;

/// The size of every control message.
pub const MSG_LEN: usize = 64;

/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"NPCL";

/// The message format's version.
pub const VERSION: u8 = 1;

const HEAD_LEN: usize = 12;
/// Bytes of a message's body.
pub const BODY_LEN: usize = MSG_LEN - HEAD_LEN - 4;

/// Window keys one [`Msg::Grant`] carries at most.
pub const GRANT_KEYS: usize = 8;

/// Windows one [`Msg::Lease`] may ask for at most (the lease book's largest range).
pub const MAX_LEASE_WINDOWS: u8 = crate::directory::MAX_REQUEST_WINDOWS as u8;

/// Remote rights of a region, as its registration gave them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rights {
    /// `IBV_ACCESS_REMOTE_READ`.
    pub read: bool,
    /// `IBV_ACCESS_REMOTE_WRITE`.
    pub write: bool,
    /// `IBV_ACCESS_REMOTE_ATOMIC`.
    pub atomic: bool,
}

impl Rights {
    fn bits(self) -> u8 {
        u8::from(self.read) | u8::from(self.write) << 1 | u8::from(self.atomic) << 2
    }

    fn from_bits(b: u8) -> Option<Self> {
        (b & !7 == 0).then_some(Self {
            read: b & 1 != 0,
            write: b & 2 != 0,
            atomic: b & 4 != 0,
        })
    }

    /// Whether any remote right is given (the region is exported).
    pub fn any(self) -> bool {
        self.read || self.write || self.atomic
    }
}

/// What a [`Msg::Directory`] answer tells of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionInfo {
    /// The region's first IOVA (the application's address unless registered with an IOVA).
    pub iova: u64,
    /// Its length in bytes.
    pub len: u64,
    /// log2 of its window size.
    pub window_shift: u8,
    /// Windows one connection may hold leased in it at once.
    pub lease_cap: u16,
    /// Its remote rights (none: not exported, every remote access is refused).
    pub rights: Rights,
    /// The length of its directory at IOVA 0 (an address there or past it with the
    /// application's key is refused by the owner's NIC).
    pub dir_len: u64,
}

/// One control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Msg {
    /// Request: what is the owner's region behind `rkey`?
    Lookup {
        /// Request sequence number.
        seq: u32,
        /// The application's rkey.
        rkey: u32,
    },
    /// Answer: a region of the library.
    Directory {
        /// The request's sequence number.
        seq: u32,
        /// The rkey asked about.
        rkey: u32,
        /// The region.
        info: RegionInfo,
    },
    /// Answer: a key the owner's library passes through (a plain MR: ODP, dmabuf, memory
    /// windows, pinned fallbacks); the requester uses it and its addresses unchanged.
    Plain {
        /// The request's sequence number.
        seq: u32,
        /// The rkey asked about.
        rkey: u32,
    },
    /// Answer: no region or MR of the owner has that key (the requester passes it through,
    /// and the owner's NIC refuses it as plain verbs would).
    Unknown {
        /// The request's sequence number.
        seq: u32,
        /// The rkey asked about.
        rkey: u32,
    },
    /// Request: lease windows `[first, first + count)` of the region behind `rkey`.
    Lease {
        /// Request sequence number.
        seq: u32,
        /// The region's application rkey.
        rkey: u32,
        /// The requester's lease epoch for that region (a new one gives back every lease).
        epoch: u32,
        /// The first window.
        first: u32,
        /// How many windows (1..=[`MAX_LEASE_WINDOWS`]).
        count: u8,
        /// Whether the requester will write (informational: windows carry the region's rights).
        write: bool,
    },
    /// Answer: windows `[first, first + keys.len())` are leased to this connection.
    Grant {
        /// The request's sequence number.
        seq: u32,
        /// The region's application rkey.
        rkey: u32,
        /// The epoch the grant was made in.
        epoch: u32,
        /// The first window.
        first: u32,
        /// How many of `keys` are valid (1..=[`GRANT_KEYS`]).
        count: u8,
        /// The windows' rkeys, in order.
        keys: [u32; GRANT_KEYS],
    },
    /// Answer: no room now (the owner's budget is full of busy windows); ask again later.
    Busy {
        /// The request's sequence number.
        seq: u32,
        /// The region's application rkey.
        rkey: u32,
    },
    /// Answer: the range is outside the region (or the key is no region): never grantable.
    OutOfRegion {
        /// The request's sequence number.
        seq: u32,
        /// The region's application rkey.
        rkey: u32,
    },
}

/// Why bytes are not a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
    /// Not [`MSG_LEN`] bytes.
    #[error("a control message is {MSG_LEN} bytes, not {0}")]
    Length(usize),
    /// The first four bytes are not [`MAGIC`].
    #[error("not a control message (bad magic)")]
    Magic,
    /// Another version of the format.
    #[error("control message version {0}, this library speaks {VERSION}")]
    Version(u8),
    /// The CRC does not match (damaged, or not written by a library).
    #[error("control message CRC mismatch")]
    Crc,
    /// A kind this version does not know.
    #[error("unknown control message kind {0}")]
    Kind(u8),
    /// A field out of its range (reserved bytes set, a count of zero or too many, unknown
    /// rights).
    #[error("control message field out of range: {0}")]
    Field(&'static str),
}

const K_LOOKUP: u8 = 1;
const K_DIRECTORY: u8 = 2;
const K_PLAIN: u8 = 3;
const K_UNKNOWN: u8 = 4;
const K_LEASE: u8 = 5;
const K_GRANT: u8 = 6;
const K_BUSY: u8 = 7;
const K_OUT_OF_REGION: u8 = 8;

/// A little-endian writer over a body.
struct W<'a>(&'a mut [u8], usize);

impl W<'_> {
    fn put(&mut self, b: &[u8]) {
        self.0[self.1..self.1 + b.len()].copy_from_slice(b);
        self.1 += b.len();
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
}

/// A little-endian reader over a body (always in bounds: the body is fixed-size and every
/// kind's fields fit in it).
struct R<'a>(&'a [u8], usize);

impl R<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        b.copy_from_slice(&self.0[self.1..self.1 + N]);
        self.1 += N;
        b
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    /// The rest of the body must be zero.
    fn end(&self) -> Result<(), MsgError> {
        if self.0[self.1..].iter().all(|&b| b == 0) {
            Ok(())
        } else {
            Err(MsgError::Field("bytes past the kind's fields"))
        }
    }
}

impl Msg {
    /// The sequence number the message carries.
    pub fn seq(&self) -> u32 {
        match *self {
            Msg::Lookup { seq, .. }
            | Msg::Directory { seq, .. }
            | Msg::Plain { seq, .. }
            | Msg::Unknown { seq, .. }
            | Msg::Lease { seq, .. }
            | Msg::Grant { seq, .. }
            | Msg::Busy { seq, .. }
            | Msg::OutOfRegion { seq, .. } => seq,
        }
    }

    /// Whether this is a request (the peer asks this side), not an answer.
    pub fn is_request(&self) -> bool {
        matches!(self, Msg::Lookup { .. } | Msg::Lease { .. })
    }

    /// Whether `self` is the answer to `request`: same sequence number, an answer kind that
    /// fits it, and the fields it echoes equal.
    pub fn answers(&self, request: &Msg) -> bool {
        match (*request, *self) {
            (
                Msg::Lookup { seq, rkey },
                Msg::Directory {
                    seq: s, rkey: k, ..
                }
                | Msg::Plain { seq: s, rkey: k }
                | Msg::Unknown { seq: s, rkey: k },
            ) => s == seq && k == rkey,
            (
                Msg::Lease {
                    seq,
                    rkey,
                    epoch,
                    first,
                    count,
                    ..
                },
                Msg::Grant {
                    seq: s,
                    rkey: k,
                    epoch: e,
                    first: f,
                    count: c,
                    ..
                },
            ) => s == seq && k == rkey && e == epoch && f == first && c <= count,
            (
                Msg::Lease { seq, rkey, .. },
                Msg::Busy { seq: s, rkey: k } | Msg::OutOfRegion { seq: s, rkey: k },
            ) => s == seq && k == rkey,
            _ => false,
        }
    }

    /// The message's 64 bytes.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut out = [0u8; MSG_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[8..12].copy_from_slice(&self.seq().to_le_bytes());
        let (head, rest) = out.split_at_mut(HEAD_LEN);
        let mut w = W(&mut rest[..BODY_LEN], 0);
        head[5] = match *self {
            Msg::Lookup { rkey, .. } => {
                w.u32(rkey);
                K_LOOKUP
            }
            Msg::Directory { rkey, info, .. } => {
                w.u32(rkey);
                w.u64(info.iova);
                w.u64(info.len);
                w.u64(info.dir_len);
                w.u16(info.lease_cap);
                w.u8(info.window_shift);
                w.u8(info.rights.bits());
                K_DIRECTORY
            }
            Msg::Plain { rkey, .. } => {
                w.u32(rkey);
                K_PLAIN
            }
            Msg::Unknown { rkey, .. } => {
                w.u32(rkey);
                K_UNKNOWN
            }
            Msg::Lease {
                rkey,
                epoch,
                first,
                count,
                write,
                ..
            } => {
                w.u32(rkey);
                w.u32(epoch);
                w.u32(first);
                w.u8(count);
                w.u8(u8::from(write));
                K_LEASE
            }
            Msg::Grant {
                rkey,
                epoch,
                first,
                count,
                keys,
                ..
            } => {
                w.u32(rkey);
                w.u32(epoch);
                w.u32(first);
                w.u8(count);
                w.put(&[0; 3]);
                for (i, k) in keys.iter().enumerate() {
                    // Keys past `count` are sent as zero, so a message has one encoding.
                    w.u32(if i < usize::from(count) { *k } else { 0 });
                }
                K_GRANT
            }
            Msg::Busy { rkey, .. } => {
                w.u32(rkey);
                K_BUSY
            }
            Msg::OutOfRegion { rkey, .. } => {
                w.u32(rkey);
                K_OUT_OF_REGION
            }
        };
        let crc = crc32c(&out[..MSG_LEN - 4]);
        out[MSG_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes a message; anything but an intact message of this version is a typed error.
    pub fn decode(b: &[u8]) -> Result<Msg, MsgError> {
        if b.len() != MSG_LEN {
            return Err(MsgError::Length(b.len()));
        }
        if b[0..4] != MAGIC {
            return Err(MsgError::Magic);
        }
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&b[MSG_LEN - 4..]);
        if crc32c(&b[..MSG_LEN - 4]) != u32::from_le_bytes(crc) {
            return Err(MsgError::Crc);
        }
        if b[4] != VERSION {
            return Err(MsgError::Version(b[4]));
        }
        if b[6] != 0 || b[7] != 0 {
            return Err(MsgError::Field("reserved header bytes"));
        }
        let mut s = [0u8; 4];
        s.copy_from_slice(&b[8..12]);
        let seq = u32::from_le_bytes(s);
        let mut r = R(&b[HEAD_LEN..HEAD_LEN + BODY_LEN], 0);
        let rkey = r.u32();
        let m = match b[5] {
            K_LOOKUP => Msg::Lookup { seq, rkey },
            K_DIRECTORY => {
                let iova = r.u64();
                let len = r.u64();
                let dir_len = r.u64();
                let lease_cap = r.u16();
                let window_shift = r.u8();
                let rights =
                    Rights::from_bits(r.u8()).ok_or(MsgError::Field("unknown rights bits"))?;
                if window_shift > 63 || iova.checked_add(len).is_none() {
                    return Err(MsgError::Field("region geometry"));
                }
                Msg::Directory {
                    seq,
                    rkey,
                    info: RegionInfo {
                        iova,
                        len,
                        window_shift,
                        lease_cap,
                        rights,
                        dir_len,
                    },
                }
            }
            K_PLAIN => Msg::Plain { seq, rkey },
            K_UNKNOWN => Msg::Unknown { seq, rkey },
            K_LEASE => {
                let epoch = r.u32();
                let first = r.u32();
                let count = r.u8();
                let write = match r.u8() {
                    0 => false,
                    1 => true,
                    _ => return Err(MsgError::Field("write flag")),
                };
                if count == 0 || count > MAX_LEASE_WINDOWS {
                    return Err(MsgError::Field("lease window count"));
                }
                Msg::Lease {
                    seq,
                    rkey,
                    epoch,
                    first,
                    count,
                    write,
                }
            }
            K_GRANT => {
                let epoch = r.u32();
                let first = r.u32();
                let count = r.u8();
                if r.take::<3>() != [0; 3] {
                    return Err(MsgError::Field("reserved grant bytes"));
                }
                if count == 0 || usize::from(count) > GRANT_KEYS {
                    return Err(MsgError::Field("grant key count"));
                }
                let mut keys = [0u32; GRANT_KEYS];
                for (i, k) in keys.iter_mut().enumerate() {
                    *k = r.u32();
                    if i >= usize::from(count) && *k != 0 {
                        return Err(MsgError::Field("grant keys past the count"));
                    }
                }
                Msg::Grant {
                    seq,
                    rkey,
                    epoch,
                    first,
                    count,
                    keys,
                }
            }
            K_BUSY => Msg::Busy { seq, rkey },
            K_OUT_OF_REGION => Msg::OutOfRegion { seq, rkey },
            k => return Err(MsgError::Kind(k)),
        };
        r.end()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rights() -> impl Strategy<Value = Rights> {
        (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(read, write, atomic)| Rights {
            read,
            write,
            atomic,
        })
    }

    fn msg() -> impl Strategy<Value = Msg> {
        let info = (
            any::<u64>(),
            any::<u64>(),
            0u8..64,
            any::<u16>(),
            rights(),
            any::<u64>(),
        )
            .prop_map(
                |(iova, len, window_shift, lease_cap, rights, dir_len)| RegionInfo {
                    iova: iova / 2,
                    len: len / 2,
                    window_shift,
                    lease_cap,
                    rights,
                    dir_len,
                },
            );
        prop_oneof![
            (any::<u32>(), any::<u32>()).prop_map(|(seq, rkey)| Msg::Lookup { seq, rkey }),
            (any::<u32>(), any::<u32>(), info).prop_map(|(seq, rkey, info)| Msg::Directory {
                seq,
                rkey,
                info
            }),
            (any::<u32>(), any::<u32>()).prop_map(|(seq, rkey)| Msg::Plain { seq, rkey }),
            (any::<u32>(), any::<u32>()).prop_map(|(seq, rkey)| Msg::Unknown { seq, rkey }),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                1u8..=MAX_LEASE_WINDOWS,
                any::<bool>()
            )
                .prop_map(|(seq, rkey, epoch, first, count, write)| Msg::Lease {
                    seq,
                    rkey,
                    epoch,
                    first,
                    count,
                    write
                }),
            (
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                any::<u32>(),
                1u8..=GRANT_KEYS as u8,
                any::<[u32; GRANT_KEYS]>()
            )
                .prop_map(|(seq, rkey, epoch, first, count, mut keys)| {
                    for k in &mut keys[usize::from(count)..] {
                        *k = 0;
                    }
                    Msg::Grant {
                        seq,
                        rkey,
                        epoch,
                        first,
                        count,
                        keys,
                    }
                }),
            (any::<u32>(), any::<u32>()).prop_map(|(seq, rkey)| Msg::Busy { seq, rkey }),
            (any::<u32>(), any::<u32>()).prop_map(|(seq, rkey)| Msg::OutOfRegion { seq, rkey }),
        ]
    }

    #[test]
    fn answers_match_only_their_request() {
        let lease = Msg::Lease {
            seq: 7,
            rkey: 0x100,
            epoch: 2,
            first: 4,
            count: 3,
            write: true,
        };
        let grant = |seq, rkey, epoch, first, count| Msg::Grant {
            seq,
            rkey,
            epoch,
            first,
            count,
            keys: [0; GRANT_KEYS],
        };
        assert!(grant(7, 0x100, 2, 4, 3).answers(&lease));
        assert!(grant(7, 0x100, 2, 4, 1).answers(&lease), "a partial grant");
        assert!(!grant(8, 0x100, 2, 4, 3).answers(&lease), "another seq");
        assert!(!grant(7, 0x101, 2, 4, 3).answers(&lease), "another key");
        assert!(!grant(7, 0x100, 1, 4, 3).answers(&lease), "an old epoch");
        assert!(!grant(7, 0x100, 2, 5, 3).answers(&lease), "another range");
        assert!(!grant(7, 0x100, 2, 4, 4).answers(&lease), "more than asked");
        assert!(
            Msg::Busy {
                seq: 7,
                rkey: 0x100
            }
            .answers(&lease)
        );
        let lookup = Msg::Lookup {
            seq: 7,
            rkey: 0x100,
        };
        assert!(!grant(7, 0x100, 2, 4, 3).answers(&lookup));
        assert!(
            Msg::Plain {
                seq: 7,
                rkey: 0x100
            }
            .answers(&lookup)
        );
        assert!(!lookup.answers(&lookup), "a request answers nothing");
        assert!(lookup.is_request() && lease.is_request());
        assert!(!grant(7, 0x100, 2, 4, 3).is_request());
    }

    #[test]
    fn malformed_messages_get_typed_errors() {
        let good = Msg::Lookup { seq: 1, rkey: 2 }.encode();
        assert_eq!(Msg::decode(&good[..63]), Err(MsgError::Length(63)));
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Msg::decode(&b), Err(MsgError::Magic));
        let mut b = good;
        b[20] ^= 1;
        assert_eq!(Msg::decode(&b), Err(MsgError::Crc));
        let reseal = |mut b: [u8; MSG_LEN]| {
            let crc = crc32c(&b[..MSG_LEN - 4]);
            b[MSG_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
            b
        };
        let mut b = good;
        b[4] = 9;
        assert_eq!(Msg::decode(&reseal(b)), Err(MsgError::Version(9)));
        let mut b = good;
        b[5] = 200;
        assert_eq!(Msg::decode(&reseal(b)), Err(MsgError::Kind(200)));
        let mut b = good;
        b[40] = 1;
        assert!(matches!(Msg::decode(&reseal(b)), Err(MsgError::Field(_))));
        let lease = |count| Msg::Lease {
            seq: 1,
            rkey: 2,
            epoch: 3,
            first: 4,
            count,
            write: false,
        };
        assert!(matches!(
            Msg::decode(&lease(0).encode()),
            Err(MsgError::Field(_))
        ));
        assert!(matches!(
            Msg::decode(&lease(MAX_LEASE_WINDOWS + 1).encode()),
            Err(MsgError::Field(_))
        ));
    }

    proptest! {
        #[test]
        fn every_message_round_trips(m in msg()) {
            prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
        }

        #[test]
        fn any_flipped_bit_is_caught(m in msg(), byte in 0usize..MSG_LEN, bit in 0u8..8) {
            let mut b = m.encode();
            b[byte] ^= 1 << bit;
            prop_assert!(Msg::decode(&b).is_err());
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Msg::decode(&b);
        }

        #[test]
        fn sealed_garbage_never_panics(body in any::<[u8; MSG_LEN - 4]>()) {
            // Bytes with a valid CRC reach the field checks: they decode or fail, never panic,
            // and whatever decodes encodes back to the same bytes (one encoding per message).
            let mut b = [0u8; MSG_LEN];
            b[..MSG_LEN - 4].copy_from_slice(&body);
            b[0..4].copy_from_slice(&MAGIC);
            b[4] = VERSION;
            let crc = crc32c(&b[..MSG_LEN - 4]);
            b[MSG_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
            if let Ok(m) = Msg::decode(&b) {
                prop_assert_eq!(m.encode(), b);
            }
        }
    }
}
