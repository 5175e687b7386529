//! The per-region directory: the small pinned memory that the application's keys really name.
//!
//! When the application registers memory, the library registers only this directory, at IOVA
//! 0 (`ibv_reg_mr_iova`), and hands its `lkey`/`rkey` to the application as the region's keys.
//! A peer's library finds it with nothing but the application's rkey: it reads IOVA 0 of that
//! rkey. A peer *without* the library that uses the rkey at the application's addresses (user
//! virtual addresses, never below `vm.mmap_min_addr` = 64 KiB) falls outside the directory and
//! gets a remote access error, never someone else's bytes (docs/connectx.md §6).
//!
//! Two registrations cover this memory, so that peers can write only what they must:
//!
//! - the **directory MR** (the application's keys) over the whole directory, at IOVA 0, with
//!   `REMOTE_READ` only: the header, the answers and the window entries are read-only to
//!   every peer, so no peer can rewrite what another reads;
//! - the **ring MR** over the request ring alone (the ticket word and the request slots), at
//!   IOVA = its offset in the directory, with `REMOTE_WRITE | REMOTE_ATOMIC`; its rkey is in
//!   the header. Whatever a peer writes there is only ever parsed (CRC-checked envelopes) by
//!   the owner, never read back by other peers as data.
//!
//! Layout (little-endian; offsets in bytes):
//!
//! | offset | size | field | written by |
//! |---|---|---|---|
//! | 0 | 8 | magic `NPRDMADR` | owner |
//! | 8 | 2 | layout version (2) | owner |
//! | 10 | 2 | header length (128) | owner |
//! | 12 | 4 | flags (bit 0: remote access allowed) | owner |
//! | 16 | 8 | region IOVA | owner |
//! | 24 | 8 | region length | owner |
//! | 32 | 1 | log2 window size | owner |
//! | 33 | 1 | log2 ring slots | owner |
//! | 34 | 2 | lease cap per lessee | owner |
//! | 36 | 4 | number of windows | owner |
//! | 40 | 4 | ring offset | owner |
//! | 44 | 4 | entries offset | owner |
//! | 56 | 8 | requests served | owner |
//! | 64 | 8 | instance (random, new for every registration) | owner |
//! | 72 | 8 | directory length | owner |
//! | 80 | 4 | ring MR rkey | owner |
//! | 128 | slots × 64 | answers (FAULT_IN_ACK, one per slot) | owner |
//! | ring offset | 64 | ticket counter | peers' RDMA FETCH_ADD only (ring MR) |
//! | ring offset + 64 | slots × 64 | requests (FAULT_IN_REQ, one per slot) | peers (ring MR) |
//! | entries offset | windows × 8 | window entries: rkey (bits 31:0), state (39:32) | owner |
//!
//! A request slot holds a FAULT_IN_REQ envelope of the `protocol` crate (56 bytes, written by
//! the requester with one RDMA WRITE); the answer slot of the same ticket the owner's
//! FAULT_IN_ACK envelope (48 bytes). Both carry CRC-32C, which is how either side tells a
//! complete record from one whose bytes have not all landed yet. The CPU never modifies the
//! ticket counter while the ring is live, so the peers' NIC atomics never race with CPU writes
//! (HCA atomics are only atomic among themselves, `IBV_ATOMIC_HCA` in verbs.h).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use protocol::wire::{FaultInAck, FaultInRequest};
use protocol::{Access, BlockRange, Envelope, Generation, Message, RequestStatus, TransferId};

/// `NPRDMADR` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NPRDMADR");
/// Layout version.
pub const VERSION: u16 = 2;
/// Header length.
pub const HEADER_LEN: usize = 128;
/// Offset of the served counter.
pub const SERVED_OFF: u64 = 56;
/// Bytes per answer slot and per request slot.
pub const SLOT_LEN: u64 = 64;
/// Bytes before the first request slot in the ring (the ticket counter).
pub const RING_HEAD: u64 = 64;
/// log2 of the ring slots of every directory.
pub const RING_SLOTS_LOG2: u8 = 6;
/// Offset of the answers.
pub const ANSWERS_OFF: u64 = HEADER_LEN as u64;
/// Largest number of windows one request may cover (and the smallest lease cap).
pub const MAX_REQUEST_WINDOWS: u64 = 16;

/// Window entry state: not registered.
pub const ENTRY_ABSENT: u8 = 0;
/// Window entry state: registered, rkey valid.
pub const ENTRY_PRESENT: u8 = 1;

const FLAG_EXPORTED: u32 = 1;

/// The directory header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirHeader {
    /// Whether peers may access the region (any `REMOTE_*` access flag).
    pub exported: bool,
    /// Region IOVA.
    pub iova: u64,
    /// Region length.
    pub len: u64,
    /// log2 window size.
    pub window_shift: u8,
    /// log2 ring slots (0 if not exported).
    pub ring_slots_log2: u8,
    /// Windows one lessee may hold.
    pub lease_cap: u16,
    /// Number of windows (0 if not exported).
    pub windows: u32,
    /// Ring offset (the ticket counter, then the request slots).
    pub ring_off: u32,
    /// Entries offset.
    pub entries_off: u32,
    /// Random instance number.
    pub instance: u64,
    /// Directory length (bytes registered at IOVA 0).
    pub dir_len: u64,
    /// The ring MR's rkey (0 if not exported).
    pub ring_rkey: u32,
}

/// Why a header is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Not a directory (a peer without the library, or garbage).
    BadMagic,
    /// A layout version we do not speak.
    Version(u16),
    /// Fields that contradict each other.
    Inconsistent(&'static str),
}

impl DirHeader {
    /// A header for a region; computes the offsets and the directory length.
    pub fn for_region(exported: bool, iova: u64, len: u64, window_shift: u8, windows: u32) -> Self {
        let (ring_slots_log2, windows, lease_cap) = if exported {
            (RING_SLOTS_LOG2, windows, MAX_REQUEST_WINDOWS as u16 * 4)
        } else {
            (0, 0, 0)
        };
        let (answers_len, ring_len) = if exported {
            (
                SLOT_LEN << ring_slots_log2,
                RING_HEAD + (SLOT_LEN << ring_slots_log2),
            )
        } else {
            (0, 0)
        };
        let ring_off = (ANSWERS_OFF + answers_len) as u32;
        let entries_off = (u64::from(ring_off) + ring_len) as u32;
        let dir_len = u64::from(entries_off) + 8 * u64::from(windows);
        Self {
            exported,
            iova,
            len,
            window_shift,
            ring_slots_log2,
            lease_cap,
            windows,
            ring_off,
            entries_off,
            instance: 0,
            dir_len,
            ring_rkey: 0,
        }
    }

    /// Number of ring slots.
    pub fn slots(&self) -> u64 {
        if self.exported {
            1 << self.ring_slots_log2
        } else {
            0
        }
    }

    /// Offset of the ticket counter (in the ring MR).
    pub fn ticket_off(&self) -> u64 {
        u64::from(self.ring_off)
    }

    /// Bytes of the ring MR (ticket counter and request slots; 0 if not exported).
    pub fn ring_len(&self) -> u64 {
        if self.exported {
            RING_HEAD + SLOT_LEN * self.slots()
        } else {
            0
        }
    }

    /// Offset of the request slot of `ticket` (in the ring MR).
    pub fn request_off(&self, ticket: u64) -> u64 {
        u64::from(self.ring_off)
            + RING_HEAD
            + (ticket & (self.slots().saturating_sub(1))) * SLOT_LEN
    }

    /// Offset of the answer slot of `ticket` (read-only to peers).
    pub fn answer_off(&self, ticket: u64) -> u64 {
        ANSWERS_OFF + (ticket & (self.slots().saturating_sub(1))) * SLOT_LEN
    }

    /// Offset of window `index`'s entry.
    pub fn entry_off(&self, index: u64) -> u64 {
        u64::from(self.entries_off) + 8 * index
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..10].copy_from_slice(&VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
        b[12..16].copy_from_slice(&(if self.exported { FLAG_EXPORTED } else { 0 }).to_le_bytes());
        b[16..24].copy_from_slice(&self.iova.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32] = self.window_shift;
        b[33] = self.ring_slots_log2;
        b[34..36].copy_from_slice(&self.lease_cap.to_le_bytes());
        b[36..40].copy_from_slice(&self.windows.to_le_bytes());
        b[40..44].copy_from_slice(&self.ring_off.to_le_bytes());
        b[44..48].copy_from_slice(&self.entries_off.to_le_bytes());
        b[64..72].copy_from_slice(&self.instance.to_le_bytes());
        b[72..80].copy_from_slice(&self.dir_len.to_le_bytes());
        b[80..84].copy_from_slice(&self.ring_rkey.to_le_bytes());
        b
    }

    /// Decodes and validates a header read from a peer.
    pub fn decode(b: &[u8]) -> Result<Self, HeaderError> {
        let u64_at = |o: usize| -> u64 {
            let mut w = [0u8; 8];
            if let Some(s) = b.get(o..o + 8) {
                w.copy_from_slice(s);
            }
            u64::from_le_bytes(w)
        };
        let u32_at = |o: usize| -> u32 {
            let mut w = [0u8; 4];
            if let Some(s) = b.get(o..o + 4) {
                w.copy_from_slice(s);
            }
            u32::from_le_bytes(w)
        };
        let u16_at = |o: usize| -> u16 {
            let mut w = [0u8; 2];
            if let Some(s) = b.get(o..o + 2) {
                w.copy_from_slice(s);
            }
            u16::from_le_bytes(w)
        };
        if b.len() < HEADER_LEN || u64_at(0) != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16_at(8);
        if version != VERSION {
            return Err(HeaderError::Version(version));
        }
        let h = Self {
            exported: u32_at(12) & FLAG_EXPORTED != 0,
            iova: u64_at(16),
            len: u64_at(24),
            window_shift: b[32],
            ring_slots_log2: b[33],
            lease_cap: u16_at(34),
            windows: u32_at(36),
            ring_off: u32_at(40),
            entries_off: u32_at(44),
            instance: u64_at(64),
            dir_len: u64_at(72),
            ring_rkey: u32_at(80),
        };
        if usize::from(u16_at(10)) != HEADER_LEN {
            return Err(HeaderError::Inconsistent("header length"));
        }
        if !(12..=40).contains(&h.window_shift) {
            return Err(HeaderError::Inconsistent("window size"));
        }
        if h.len == 0 || h.iova.checked_add(h.len).is_none() {
            return Err(HeaderError::Inconsistent("region range"));
        }
        if h.exported {
            if h.ring_slots_log2 > 12 || u64::from(h.lease_cap) < MAX_REQUEST_WINDOWS {
                return Err(HeaderError::Inconsistent("ring or lease cap"));
            }
            let geom_windows =
                ((h.iova + h.len - 1) >> h.window_shift) - (h.iova >> h.window_shift) + 1;
            if u64::from(h.windows) != geom_windows {
                return Err(HeaderError::Inconsistent("window count"));
            }
            let ring_end = u64::from(h.ring_off) + h.ring_len();
            if u64::from(h.ring_off) < ANSWERS_OFF + (SLOT_LEN << h.ring_slots_log2)
                || ring_end > u64::from(h.entries_off)
                || u64::from(h.entries_off) + 8 * u64::from(h.windows) > h.dir_len
            {
                return Err(HeaderError::Inconsistent("offsets"));
            }
        }
        Ok(h)
    }
}

/// Encodes a window entry.
pub fn encode_entry(state: u8, rkey: u32) -> u64 {
    u64::from(rkey) | (u64::from(state) << 32)
}

/// Decodes a window entry into (state, rkey).
pub fn decode_entry(word: u64) -> (u8, u32) {
    ((word >> 32) as u8, word as u32)
}

/// A request: make windows `[first, first + count)` present and lease them to `lessee`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseRequest {
    /// The ticket (request number) the requester drew.
    pub ticket: u64,
    /// The lessee: the owner's local QP number of the connection.
    pub lessee: u32,
    /// The requester's lease epoch: it moves on whenever the requester forgot its leases (a
    /// request whose answer it never saw), and tells the owner to end the old ones first.
    pub epoch: u32,
    /// The directory's rkey as the requester used it (checked by the owner).
    pub rkey: u32,
    /// First IOVA of the range.
    pub addr: u64,
    /// Length of the range.
    pub len: u64,
    /// Whether the requester will write.
    pub write: bool,
}

impl LeaseRequest {
    /// Encodes as a FAULT_IN_REQ envelope (`protocol` crate): `session` = lessee, `req_seq` =
    /// ticket (low 32 bits), `tid` = lease epoch, `key` = rkey.
    pub fn encode(&self) -> Vec<u8> {
        let m = FaultInRequest {
            req_seq: self.ticket as u32,
            tid: TransferId(self.epoch),
            blocks: BlockRange::single(0),
            key: self.rkey,
            access: if self.write {
                Access::Write
            } else {
                Access::Read
            },
            addr: self.addr,
            len: self.len,
        };
        Envelope::new(self.lessee, Message::FaultInRequest(m))
            .to_bytes()
            .to_vec()
    }

    /// Decodes a request; `None` for anything but an intact FAULT_IN_REQ whose ticket matches
    /// `expected` (a slot still being written, an old request, garbage).
    pub fn decode(bytes: &[u8], expected: u64) -> Option<Self> {
        let (env, _) = Envelope::decode(bytes).ok()?;
        let Message::FaultInRequest(m) = env.message else {
            return None;
        };
        if m.req_seq != expected as u32 || m.len == 0 {
            return None;
        }
        Some(Self {
            ticket: expected,
            lessee: env.session,
            epoch: m.tid.0,
            rkey: m.key,
            addr: m.addr,
            len: m.len,
            write: m.access == Access::Write,
        })
    }
}

/// The owner's answer to a [`LeaseRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Granted: the windows are registered and leased; read their entries.
    Granted,
    /// No room now (the owner's budget is full of busy windows): try again later.
    Busy,
    /// The range is outside the region: never grantable.
    OutOfRegion,
}

/// Encodes an answer as a FAULT_IN_ACK envelope; `generation` is the owner's change counter.
pub fn encode_answer(lessee: u32, ticket: u64, answer: LeaseAnswer, generation: u64) -> Vec<u8> {
    let status = match answer {
        LeaseAnswer::Granted => RequestStatus::Ok,
        LeaseAnswer::Busy => RequestStatus::Failed(protocol::FaultReason::NotPresent),
        LeaseAnswer::OutOfRegion => RequestStatus::Failed(protocol::FaultReason::OutOfRegion),
    };
    let m = FaultInAck {
        req_seq: ticket as u32,
        tid: TransferId(0),
        blocks: BlockRange::single(0),
        status,
        generation: Generation(generation),
    };
    Envelope::new(lessee, Message::FaultInAck(m))
        .to_bytes()
        .to_vec()
}

/// Decodes an answer for `ticket`; `None` if the slot holds no intact answer to it.
pub fn decode_answer(bytes: &[u8], lessee: u32, ticket: u64) -> Option<LeaseAnswer> {
    let (env, _) = Envelope::decode(bytes).ok()?;
    let Message::FaultInAck(m) = env.message else {
        return None;
    };
    if env.session != lessee || m.req_seq != ticket as u32 {
        return None;
    }
    Some(match m.status {
        RequestStatus::Ok => LeaseAnswer::Granted,
        RequestStatus::Failed(protocol::FaultReason::OutOfRegion) => LeaseAnswer::OutOfRegion,
        RequestStatus::Failed(_) => LeaseAnswer::Busy,
    })
}

/// Whether the slot holds an intact answer to a later ticket than `ticket` (of any lessee):
/// the ring went round while the requester of `ticket` slept between polls, and its own answer
/// was overwritten unread.
pub fn answer_overtaken(bytes: &[u8], ticket: u64) -> bool {
    let Ok((env, _)) = Envelope::decode(bytes) else {
        return false;
    };
    let Message::FaultInAck(m) = env.message else {
        return false;
    };
    // Sequence numbers are the low 32 bits of the tickets: compare them as a wrapping window.
    let ahead = m.req_seq.wrapping_sub(ticket as u32);
    ahead != 0 && ahead < 1 << 31
}

/// Leases per lessee, first in first out with a cap.
///
/// The owner keeps one book per region; the requester keeps a mirror for its connection. Both
/// apply the same deterministic rule when a request is granted, so the requester knows which of
/// its leases the grant ended without another message: the range's windows move to the back in
/// ascending order (those already held too, which renews them), and while the lessee holds
/// more than `cap` windows its oldest lease ends. A range never covers more than
/// [`MAX_REQUEST_WINDOWS`] ≤ `cap` windows, so a grant never ends a lease of its own range.
/// Ending a lease at grant time is safe because the requester posts nothing while it waits for
/// the answer and RC executes its earlier work requests before the request itself
/// (docs/connectx.md §5).
///
/// A requester that did not see the answer to a request cannot know what it changed; it
/// forgets all its leases and moves to a new *epoch*. The owner ends all of a lessee's leases
/// when a request comes with an epoch other than the lessee's last one, so the requester's
/// mirror never holds a lease the owner has ended (property test `mirror_is_always_a_subset`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseBook {
    cap: usize,
    by_lessee: HashMap<u32, (u32, VecDeque<u64>)>,
}

/// What a grant changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrantChange {
    /// Windows newly leased.
    pub added: Vec<u64>,
    /// Windows whose lease ended.
    pub dropped: Vec<u64>,
}

impl LeaseBook {
    /// A book with the given cap (at least [`MAX_REQUEST_WINDOWS`]).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(MAX_REQUEST_WINDOWS as usize),
            by_lessee: HashMap::new(),
        }
    }

    /// Applies a grant of windows `[first, first + count)` to `lessee` in `epoch`.
    pub fn grant(&mut self, lessee: u32, epoch: u32, first: u64, count: u64) -> GrantChange {
        let (held_epoch, q) = self
            .by_lessee
            .entry(lessee)
            .or_insert_with(|| (epoch, VecDeque::new()));
        let mut change = GrantChange::default();
        if *held_epoch != epoch {
            change.dropped.extend(q.drain(..));
            *held_epoch = epoch;
        }
        // The range's windows go to the back, those already held included, so that the
        // evictions below only end leases outside it (the range is at most the cap).
        for w in first..first.saturating_add(count.min(MAX_REQUEST_WINDOWS)) {
            match q.iter().position(|&held| held == w) {
                Some(at) => {
                    q.remove(at);
                }
                None => change.added.push(w),
            }
            q.push_back(w);
        }
        while q.len() > self.cap
            && let Some(old) = q.pop_front()
        {
            change.dropped.push(old);
        }
        change
    }

    /// Ends `lessee`'s leases if `epoch` is not its current one (the requester forgot them);
    /// returns the windows whose lease ended. `grant` does the same; calling this first lets
    /// the owner count the freed room before deciding.
    pub fn enter_epoch(&mut self, lessee: u32, epoch: u32) -> Vec<u64> {
        match self.by_lessee.get_mut(&lessee) {
            Some((held_epoch, q)) if *held_epoch != epoch => {
                *held_epoch = epoch;
                q.drain(..).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Whether `lessee` holds window `w`.
    pub fn holds(&self, lessee: u32, w: u64) -> bool {
        self.by_lessee
            .get(&lessee)
            .is_some_and(|(_, q)| q.contains(&w))
    }

    /// Ends every lease of `lessee`; returns the windows.
    pub fn drop_lessee(&mut self, lessee: u32) -> Vec<u64> {
        self.by_lessee
            .remove(&lessee)
            .map(|(_, q)| Vec::from(q))
            .unwrap_or_default()
    }

    /// Every lessee and its windows.
    pub fn lessees(&self) -> Vec<u32> {
        self.by_lessee.keys().copied().collect()
    }

    /// Windows `lessee` holds, oldest first.
    pub fn held(&self, lessee: u32) -> Vec<u64> {
        self.by_lessee
            .get(&lessee)
            .map(|(_, q)| q.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Page-aligned, zeroed memory for a directory (or any library-owned buffer the NIC reads and
/// writes), with word access that tolerates concurrent DMA.
#[derive(Debug)]
pub struct DmaBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; all accesses go through volatile or
// atomic operations, so sharing it between threads is no different from sharing it with a NIC.
unsafe impl Send for DmaBuf {}
// SAFETY: as above; `&DmaBuf` only allows volatile/atomic accesses.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    /// Maps `len` bytes (rounded up to pages) of anonymous memory.
    pub fn new(len: usize) -> Option<Self> {
        let len = len.max(1).div_ceil(4096) * 4096;
        // SAFETY: anonymous private mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// First byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (at least one page).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn word(&self, off: u64) -> Option<&AtomicU64> {
        let off = usize::try_from(off).ok()?;
        if off % 8 != 0 || off.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned (the mapping is page-aligned); AtomicU64 has the
        // size and alignment of u64, and every access to this memory is atomic or volatile.
        Some(unsafe { &*self.ptr.add(off).cast::<AtomicU64>() })
    }

    /// Loads the word at `off` (acquire); 0 outside the buffer.
    pub fn load(&self, off: u64) -> u64 {
        self.word(off).map_or(0, |w| w.load(Ordering::Acquire))
    }

    /// Stores the word at `off` (release); ignored outside the buffer.
    pub fn store(&self, off: u64, value: u64) {
        if let Some(w) = self.word(off) {
            w.store(value, Ordering::Release);
        }
    }

    /// Copies bytes out (word by word where aligned, so a concurrent DMA write is seen per
    /// word); short if the range leaves the buffer.
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let Ok(start) = usize::try_from(off) else {
            return Vec::new();
        };
        let end = start.saturating_add(len).min(self.len);
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        for i in start..end {
            // SAFETY: `i < self.len`, inside the mapping; volatile because a NIC may write it.
            out.push(unsafe { self.ptr.add(i).read_volatile() });
        }
        out
    }

    /// Copies bytes in; ignored beyond the buffer.
    pub fn write(&self, off: u64, bytes: &[u8]) {
        let Ok(start) = usize::try_from(off) else {
            return;
        };
        for (i, b) in bytes.iter().enumerate() {
            let at = start.saturating_add(i);
            if at >= self.len {
                break;
            }
            // SAFETY: `at < self.len`, inside the mapping; volatile because a NIC may read it.
            unsafe { self.ptr.add(at).write_volatile(*b) };
        }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping created in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trip_and_layout() {
        // 1 GiB starting 4 KiB into a 256 KiB window touches 4097 windows.
        let mut h = DirHeader::for_region(true, 0x7f00_0000_1000, 1 << 30, 18, 4097);
        h.instance = 0x1234;
        h.ring_rkey = 0xabcd;
        // Header, 64 answers of 64 bytes, the ring (ticket word, 64 requests), the entries.
        assert_eq!(h.ring_off, 128 + 64 * 64);
        assert_eq!(h.ring_len(), 64 + 64 * 64);
        assert_eq!(h.entries_off, 4224 + 4160);
        assert_eq!(h.dir_len, 8384 + 8 * 4097);
        assert_eq!(h.answer_off(65), 128 + 64);
        assert_eq!(h.request_off(65), 4224 + 64 + 64);
        assert_eq!(h.ticket_off(), 4224);
        assert_eq!(h.entry_off(3), 8384 + 24);
        let b = h.encode();
        assert_eq!(&b[0..8], b"NPRDMADR");
        assert_eq!(DirHeader::decode(&b), Ok(h));
        let local = DirHeader::for_region(false, 0x1000, 100, 12, 1);
        assert_eq!((local.windows, local.slots(), local.dir_len), (0, 0, 128));
        assert_eq!(DirHeader::decode(&local.encode()), Ok(local));
    }

    #[test]
    fn bad_headers_are_refused() {
        let h = DirHeader::for_region(true, 0x10_0000, 1 << 20, 16, 16);
        let mut b = h.encode();
        b[0] ^= 1;
        assert_eq!(DirHeader::decode(&b), Err(HeaderError::BadMagic));
        let mut b = h.encode();
        b[8] = 9;
        assert_eq!(DirHeader::decode(&b), Err(HeaderError::Version(9)));
        let mut b = h.encode();
        b[36] = 17; // window count does not match the geometry
        assert!(matches!(
            DirHeader::decode(&b),
            Err(HeaderError::Inconsistent(_))
        ));
        let mut b = h.encode();
        b[72..80].copy_from_slice(&100u64.to_le_bytes()); // entries beyond the directory
        assert!(matches!(
            DirHeader::decode(&b),
            Err(HeaderError::Inconsistent(_))
        ));
        assert_eq!(DirHeader::decode(&[0u8; 10]), Err(HeaderError::BadMagic));
    }

    #[test]
    fn an_answer_to_a_later_ticket_in_the_slot_means_ours_was_overwritten() {
        // The ring has 64 slots: ticket 7's slot next holds ticket 71's answer, of any lessee.
        let later = encode_answer(0x22, 71, LeaseAnswer::Busy, 3);
        assert!(answer_overtaken(&later, 7));
        // Our own answer, an earlier ticket's (not yet overwritten by our request's), a torn
        // or empty slot: not overtaken.
        assert!(!answer_overtaken(
            &encode_answer(0x11, 7, LeaseAnswer::Granted, 3),
            7
        ));
        assert!(!answer_overtaken(
            &encode_answer(0x11, 71, LeaseAnswer::Granted, 0),
            7 + 128
        ));
        assert!(!answer_overtaken(&later[..later.len() / 2], 7));
        assert!(!answer_overtaken(&[0u8; 64], 7));
        // Tickets wrap at 32 bits in the answer.
        let wrapped = encode_answer(0x22, (1 << 32) + 20, LeaseAnswer::Granted, 0);
        assert!(answer_overtaken(&wrapped, (1 << 32) - 44));
    }

    #[test]
    fn requests_and_answers_round_trip_and_reject_stale_ones() {
        let r = LeaseRequest {
            ticket: 70,
            lessee: 0x11,
            epoch: 3,
            rkey: 0xabcd,
            addr: 0x7f00_0000_2000,
            len: 8192,
            write: true,
        };
        let bytes = r.encode();
        assert_eq!(bytes.len(), 56);
        assert_eq!(LeaseRequest::decode(&bytes, 70), Some(r));
        assert_eq!(LeaseRequest::decode(&bytes, 6), None, "other ticket");
        let mut torn = bytes.clone();
        torn[40] ^= 0xff; // a byte not landed yet
        assert_eq!(LeaseRequest::decode(&torn, 70), None);
        let a = encode_answer(0x11, 70, LeaseAnswer::Busy, 5);
        assert_eq!(decode_answer(&a, 0x11, 70), Some(LeaseAnswer::Busy));
        assert_eq!(decode_answer(&a, 0x12, 70), None, "other lessee");
        assert_eq!(decode_answer(&a, 0x11, 71), None, "other ticket");
        let g = encode_answer(1, 2, LeaseAnswer::Granted, 0);
        assert_eq!(decode_answer(&g, 1, 2), Some(LeaseAnswer::Granted));
        let o = encode_answer(1, 2, LeaseAnswer::OutOfRegion, 0);
        assert_eq!(decode_answer(&o, 1, 2), Some(LeaseAnswer::OutOfRegion));
    }

    #[test]
    fn entries() {
        assert_eq!(
            decode_entry(encode_entry(ENTRY_PRESENT, 0xdead_beef)),
            (1, 0xdead_beef)
        );
        assert_eq!(decode_entry(0), (ENTRY_ABSENT, 0));
    }

    #[test]
    fn grant_drops_the_oldest_beyond_the_cap() {
        let mut b = LeaseBook::new(16);
        let c = b.grant(1, 0, 0, 16);
        assert_eq!(c.added.len(), 16);
        assert!(c.dropped.is_empty());
        let c = b.grant(1, 0, 15, 3); // 15 held; 16, 17 new
        assert_eq!(c.added, vec![16, 17]);
        assert_eq!(c.dropped, vec![0, 1]);
        assert!(!b.holds(1, 0) && b.holds(1, 17));
        assert!(
            b.grant(2, 0, 0, 1).dropped.is_empty(),
            "lessees are independent"
        );
        // A new epoch ends all of the lessee's old leases first.
        assert!(b.enter_epoch(2, 0).is_empty(), "same epoch: nothing ends");
        assert_eq!(b.enter_epoch(1, 1).len(), 16);
        assert!(b.held(1).is_empty());
        b.grant(1, 1, 3, 1);
        let c = b.grant(1, 2, 40, 1);
        assert_eq!(c.dropped, vec![3]);
        assert_eq!(b.held(1), vec![40]);
        assert_eq!(b.drop_lessee(1), vec![40]);
        assert!(!b.holds(1, 40));
    }

    #[test]
    fn a_grant_never_ends_a_lease_of_its_own_range() {
        let mut b = LeaseBook::new(16);
        b.grant(1, 0, 5, 16); // holds 5..=20, 5 the oldest
        let c = b.grant(1, 0, 4, 2); // 4 new, 5 held: 5 must survive
        assert_eq!(c.added, vec![4]);
        assert_eq!(c.dropped, vec![6]);
        assert!(b.holds(1, 4) && b.holds(1, 5));
    }

    proptest! {
        /// The requester's mirror, updated only from answered grants, always holds a subset of
        /// what the owner's book holds, even when the requester forgets everything after a
        /// lost answer (the rule in `grant`).
        #[test]
        fn mirror_is_always_a_subset(ops in proptest::collection::vec((0u64..60, 1u64..17, any::<bool>()), 1..100)) {
            let mut owner = LeaseBook::new(16);
            let mut mirror = LeaseBook::new(16);
            let mut epoch = 0u32;
            let mut owner_epoch = epoch;
            for (first, count, answered) in ops {
                let change = owner.grant(7, epoch, first, count);
                let range = first..first + count.min(MAX_REQUEST_WINDOWS);
                for w in range.clone() {
                    prop_assert!(owner.holds(7, w), "the grant of {:?} does not hold {}", range, w);
                }
                if owner_epoch == epoch {
                    // (A new epoch ends every old lease first, those of the range too.)
                    prop_assert!(change.dropped.iter().all(|w| !range.contains(w)));
                }
                owner_epoch = epoch;
                if answered {
                    mirror.grant(7, epoch, first, count);
                } else {
                    mirror.drop_lessee(7);
                    epoch += 1;
                }
                for w in mirror.held(7) {
                    prop_assert!(owner.holds(7, w), "mirror holds {} the owner dropped", w);
                }
            }
        }
    }

    #[test]
    fn dma_buf_words_and_bytes() {
        let d = DmaBuf::new(100).unwrap();
        assert_eq!(d.len(), 4096);
        d.store(8, 0x0102_0304_0506_0708);
        assert_eq!(d.load(8), 0x0102_0304_0506_0708);
        assert_eq!(d.read(8, 2), vec![8, 7]);
        d.write(4094, &[1, 2, 3, 4]);
        assert_eq!(d.read(4094, 10), vec![1, 2]);
        assert_eq!(d.load(4093), 0, "unaligned");
        assert_eq!(d.load(4096), 0, "outside");
    }
}
