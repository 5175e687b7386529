//! A QP's `ibv_wr_*` batch ("new post send" API): the builder state between `ibv_wr_start` and
//! `ibv_wr_complete`, the provider's own builder functions saved before the library's were
//! installed, and the cell that holds both in the QP's record. The functions the library
//! installs, which use them, are in crate::ops.

use core::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::sys::*;

/// Where a recorded WR's data is: a span of `sges`, or a span of inline `pieces`.
#[derive(Clone, Copy, Default)]
pub(crate) struct ExSpan {
    inline: bool,
    start: usize,
    pub(crate) len: usize,
}

/// Most batches hold one WR (perftest's always do), so the builder keeps a batch's first WR
/// in a fixed place, with its SGE or a copy of its inline data, and posts it from there
/// without building vectors; a second WR, or anything the one-WR form cannot hold, moves the
/// batch to the general form (`spill`).
const FIRST_INLINE_WORDS: usize = 32;

/// Where the first WR's data is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstData {
    None,
    Sge,
    Inline(usize),
}

/// The batch's first WR in its one-WR form.
pub(crate) struct FirstWr {
    /// Whether the batch is in the one-WR form with its WR begun.
    pub(crate) active: bool,
    /// Opcode, application `wr_id` and flags, immediate, remote fields; `sg_list`, `num_sge`
    /// and `next` are set when it is posted.
    pub(crate) wr: ibv_send_wr,
    pub(crate) data: FirstData,
    pub(crate) sge: ibv_sge,
    /// Copy of the inline payload (the API copies at the call).
    pub(crate) inline: [u64; FIRST_INLINE_WORDS],
}

impl Default for FirstWr {
    fn default() -> Self {
        Self {
            active: false,
            wr: ibv_send_wr::zeroed(),
            data: FirstData::None,
            sge: ibv_sge::default(),
            inline: [0; FIRST_INLINE_WORDS],
        }
    }
}

/// The builder state of a QP between `wr_start` and `wr_complete`: the one-WR form, or flat
/// vectors that the QP keeps between batches (a warm builder path allocates nothing).
#[derive(Default)]
pub(crate) struct ExBuilder {
    pub(crate) first: FirstWr,
    /// The provider's own batch is begun (`wr_start` called): WRs handed to it are in it.
    pub(crate) provider_open: bool,
    /// The last WR begun was handed to the provider (its data setter was the handover).
    pub(crate) last_forwarded: bool,
    /// The last WR begun went to the provider at its opcode call, before its data setter
    /// ([`forward_early`](crate::ops)); `first.wr` still holds the application's fields.
    pub(crate) early: bool,
    /// The QP's `wr_set_inline_data` is the provider's own (see [`forward_early`](crate::ops)).
    pub(crate) inline_swapped: bool,
    /// The general form is in use (the vectors below hold the batch).
    pub(crate) spilled: bool,
    pub(crate) wrs: Vec<ibv_send_wr>,
    pub(crate) spans: Vec<ExSpan>,
    sges: Vec<ibv_sge>,
    /// Inline pieces: (offset in `data`, length).
    pieces: Vec<(usize, usize)>,
    /// Copies of inline data (the API copies at the call).
    data: Vec<u8>,
    pub(crate) out_sges: Vec<ibv_sge>,
    pub(crate) out_spans: Vec<(usize, usize)>,
    pub(crate) unsupported: Option<&'static str>,
}

impl ExBuilder {
    pub(crate) fn clear(&mut self) {
        self.first.active = false;
        self.last_forwarded = false;
        self.early = false;
        if self.spilled {
            self.spilled = false;
            self.wrs.clear();
            self.spans.clear();
            self.sges.clear();
            self.pieces.clear();
            self.data.clear();
        }
        self.unsupported = None;
    }

    /// Starts a WR with `opcode`, the application's `wr_id` and `flags`; `setup` fills its
    /// opcode-specific fields.
    #[inline]
    pub(crate) fn begin(
        &mut self,
        wr_id: u64,
        flags: u32,
        opcode: u32,
        setup: impl FnOnce(&mut ibv_send_wr),
    ) {
        self.last_forwarded = false;
        self.early = false;
        if !self.spilled && !self.first.active {
            let f = &mut self.first;
            f.active = true;
            f.data = FirstData::None;
            let w = &mut f.wr;
            w.wr_id = wr_id;
            w.send_flags = flags;
            w.opcode = opcode;
            w.imm_data = 0;
            w.qp_type_xrc_remote_srqn = 0;
            w.wr = [0; 4];
            setup(w);
            return;
        }
        self.spill();
        let mut wr = ibv_send_wr::zeroed();
        wr.wr_id = wr_id;
        wr.send_flags = flags;
        wr.opcode = opcode;
        setup(&mut wr);
        self.wrs.push(wr);
        self.spans.push(ExSpan::default());
    }

    /// Moves the batch to the general form (nothing if it is there already).
    fn spill(&mut self) {
        if self.spilled {
            return;
        }
        self.spilled = true;
        if !self.first.active {
            return;
        }
        self.first.active = false;
        self.wrs.push(self.first.wr);
        self.spans.push(ExSpan::default());
        match self.first.data {
            FirstData::None => {}
            FirstData::Sge => {
                let sge = self.first.sge;
                self.set_sges(&[sge]);
            }
            FirstData::Inline(len) => {
                let words = self.first.inline;
                // SAFETY: `len` bytes of the inline copy (at most its size, see set_inline).
                let bytes =
                    unsafe { core::slice::from_raw_parts(words.as_ptr().cast::<u8>(), len) };
                self.set_inline(&[bytes]);
            }
        }
    }

    /// The WR being built (its fields for `set_ud_addr` and the like), in the general form.
    pub(crate) fn last_wr(&mut self) -> Option<&mut ibv_send_wr> {
        self.spill();
        self.wrs.last_mut()
    }

    /// The provider SGE of entry `k` of `span`: the application's SGE, or one pointing at our
    /// copy of an inline piece.
    #[inline]
    pub(crate) fn sge(&self, span: ExSpan, k: usize) -> ibv_sge {
        if span.inline {
            let (off, len) = self.pieces[span.start + k];
            ibv_sge {
                addr: self.data.as_ptr() as u64 + off as u64,
                length: len as u32,
                lkey: 0,
            }
        } else {
            self.sges[span.start + k]
        }
    }

    /// A data setter after the WR it belongs to went to the provider: the provider already
    /// has that WR's data, so a second setter for it (the application's error) fails the
    /// batch rather than being lost.
    #[inline]
    fn setter_after_handover(&mut self) -> bool {
        if self.last_forwarded {
            self.unsupported = Some(
                "a second data setter for one ibv_wr_* work request: wr_complete fails with EOPNOTSUPP",
            );
            return true;
        }
        false
    }

    #[inline]
    pub(crate) fn set_sges(&mut self, list: &[ibv_sge]) {
        if self.setter_after_handover() {
            return;
        }
        if self.first.active && list.len() <= 1 {
            let f = &mut self.first;
            f.wr.send_flags &= !IBV_SEND_INLINE;
            match list.first() {
                Some(s) => {
                    f.sge = *s;
                    f.data = FirstData::Sge;
                }
                None => f.data = FirstData::None,
            }
            return;
        }
        self.spill();
        let start = self.sges.len();
        self.sges.extend_from_slice(list);
        if let Some(span) = self.spans.last_mut() {
            *span = ExSpan {
                inline: false,
                start,
                len: list.len(),
            };
        }
        if let Some(w) = self.wrs.last_mut() {
            w.send_flags &= !IBV_SEND_INLINE;
        }
    }

    /// [`set_inline`](Self::set_inline) of one buffer (`ibv_wr_set_inline_data`).
    #[inline]
    pub(crate) fn set_inline_one(&mut self, data: &[u8]) {
        if self.setter_after_handover() {
            return;
        }
        if self.first.active && data.len() <= FIRST_INLINE_WORDS * 8 {
            let f = &mut self.first;
            // SAFETY: `data` fits the inline copy (checked above).
            unsafe { copy_small(data, f.inline.as_mut_ptr().cast::<u8>()) };
            f.data = if data.is_empty() {
                FirstData::None
            } else {
                FirstData::Inline(data.len())
            };
            f.wr.send_flags |= IBV_SEND_INLINE;
            return;
        }
        self.set_inline(&[data]);
    }

    pub(crate) fn set_inline(&mut self, bufs: &[&[u8]]) {
        if self.setter_after_handover() {
            return;
        }
        if self.first.active {
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            if total <= FIRST_INLINE_WORDS * 8 {
                let f = &mut self.first;
                let out = f.inline.as_mut_ptr().cast::<u8>();
                let mut at = 0;
                for b in bufs {
                    // SAFETY: `at + b.len() <= total` fits the inline copy (checked above).
                    unsafe { copy_small(b, out.add(at)) };
                    at += b.len();
                }
                f.data = if total == 0 {
                    FirstData::None
                } else {
                    FirstData::Inline(total)
                };
                f.wr.send_flags |= IBV_SEND_INLINE;
                return;
            }
        }
        self.spill();
        let start = self.pieces.len();
        for b in bufs {
            self.pieces.push((self.data.len(), b.len()));
            append_bytes(&mut self.data, b);
        }
        if let Some(span) = self.spans.last_mut() {
            *span = ExSpan {
                inline: true,
                start,
                len: bufs.len(),
            };
        }
        if let Some(w) = self.wrs.last_mut() {
            w.send_flags |= IBV_SEND_INLINE;
        }
    }
}

/// Copies a small `src` (an inline payload: a few to a few hundred bytes) to `dst` without a
/// `memcpy` call (see [`append_bytes`]): up to 16 bytes as two overlapping moves, more as a
/// word loop. The compiler fence in the loop keeps the compiler from turning the loop back
/// into a `memcpy` call; it emits no instruction.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[inline]
unsafe fn copy_small(src: &[u8], dst: *mut u8) {
    use core::ptr::{read_unaligned as rd, write_unaligned as wr};
    let n = src.len();
    let s = src.as_ptr();
    // SAFETY: every read is inside `src` and every write inside `dst`'s `n` bytes (the
    // offsets below are at most `n - 8`, `n - 4` or `n - 1` in their branches).
    unsafe {
        if n >= 8 {
            if n <= 16 {
                wr(dst.cast::<u64>(), rd(s.cast::<u64>()));
                wr(dst.add(n - 8).cast::<u64>(), rd(s.add(n - 8).cast::<u64>()));
                return;
            }
            let words = n / 8;
            for i in 0..words {
                wr(dst.add(i * 8).cast::<u64>(), rd(s.add(i * 8).cast::<u64>()));
                core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
            }
            wr(dst.add(n - 8).cast::<u64>(), rd(s.add(n - 8).cast::<u64>()));
        } else if n >= 4 {
            wr(dst.cast::<u32>(), rd(s.cast::<u32>()));
            wr(dst.add(n - 4).cast::<u32>(), rd(s.add(n - 4).cast::<u32>()));
        } else if n > 0 {
            *dst = *s;
            *dst.add(n / 2) = *s.add(n / 2);
            *dst.add(n - 1) = *s.add(n - 1);
        }
    }
}

/// Appends `src` to `dst`. Inline payloads are small (a few to a few hundred bytes); a plain
/// word loop avoids a `memcpy` call per WR, which matters where the library runs under an
/// emulator (glibc's vectorized `memcpy` is slow under QEMU's TCG).
#[inline]
fn append_bytes(dst: &mut Vec<u8>, src: &[u8]) {
    if src.len() > 256 {
        dst.extend_from_slice(src);
        return;
    }
    dst.reserve(src.len());
    let start = dst.len();
    // SAFETY: `reserve` made room for `src.len()` bytes after `start`; `set_len` covers
    // exactly the bytes written.
    unsafe {
        copy_small(src, dst.as_mut_ptr().add(start));
        dst.set_len(start + src.len());
    }
}

/// The provider's own `ibv_wr_*` functions, saved before the library puts its own into the
/// QP's `ibv_qp_ex`: a WR that needs nothing of the library (see [`forward_inline`](crate::ops)) is built
/// by the provider itself, as without the library.
#[derive(Clone, Copy)]
pub(crate) struct ProviderBuilder {
    pub(crate) start: WrQpFn,
    pub(crate) complete: WrCompleteFn,
    pub(crate) abort: WrQpFn,
    pub(crate) set_inline_data: WrSetInlineFn,
    rdma_write: Option<WrRdmaFn>,
    rdma_write_imm: Option<WrRdmaImmFn>,
    send: Option<WrQpFn>,
    send_imm: Option<WrImmFn>,
    /// The opcodes the functions above can start, a bit per `ibv_wr_opcode`.
    pub(crate) ops: u32,
}

impl ProviderBuilder {
    /// Calls the provider's opcode function for `w` (one of the four that
    /// [`handover`](crate::ops) accepts) with the peer window's key `key`.
    ///
    /// # Safety
    /// `qpx` is the live QP whose provider batch is begun, serialized by the caller's batch.
    #[inline(always)]
    pub(crate) unsafe fn opcode(&self, qpx: *mut ibv_qp_ex, w: &ibv_send_wr, key: u32) {
        // SAFETY: per the contract.
        unsafe {
            match (
                w.opcode,
                self.rdma_write,
                self.rdma_write_imm,
                self.send,
                self.send_imm,
            ) {
                (IBV_WR_RDMA_WRITE, Some(f), ..) => f(qpx, key, w.remote_addr()),
                (IBV_WR_RDMA_WRITE_WITH_IMM, _, Some(f), ..) => {
                    f(qpx, key, w.remote_addr(), w.imm_data)
                }
                (IBV_WR_SEND, _, _, Some(f), _) => f(qpx),
                (IBV_WR_SEND_WITH_IMM, _, _, _, Some(f)) => f(qpx, w.imm_data),
                _ => {}
            }
        }
    }

    /// The provider's functions in `qpx` (before [`wrap_qp_ex`](crate::ops::wrap_qp_ex)), if it has the ones
    /// forwarding needs.
    ///
    /// # Safety
    /// `qpx` is the provider's `ibv_qp_ex` of a live QP.
    pub(crate) unsafe fn of(qpx: *mut ibv_qp_ex) -> Option<Self> {
        // SAFETY: per the contract.
        let q = unsafe { &*qpx };
        let bit = |has: bool, op: u32| if has { 1u32 << op } else { 0 };
        Some(Self {
            start: q.wr_start?,
            complete: q.wr_complete?,
            abort: q.wr_abort?,
            set_inline_data: q.wr_set_inline_data?,
            rdma_write: q.wr_rdma_write,
            rdma_write_imm: q.wr_rdma_write_imm,
            send: q.wr_send,
            send_imm: q.wr_send_imm,
            ops: bit(q.wr_rdma_write.is_some(), IBV_WR_RDMA_WRITE)
                | bit(q.wr_rdma_write_imm.is_some(), IBV_WR_RDMA_WRITE_WITH_IMM)
                | bit(q.wr_send.is_some(), IBV_WR_SEND)
                | bit(q.wr_send_imm.is_some(), IBV_WR_SEND_WITH_IMM),
        })
    }
}

/// A QP's builder and whether a batch is open.
///
/// Like the providers (mlx5 takes the QP's lock in `wr_start` and drops it in `wr_complete`),
/// a batch holds its QP's send lock from `ibv_wr_start` to `ibv_wr_complete`/`ibv_wr_abort`:
/// the calls in between use the builder without locking (verbs requires the application to
/// serialize a batch's calls, whichever threads make them) and find it through the registry's
/// shared cache. `complete` posts with the lock it already holds.
#[derive(Default)]
pub(crate) struct BatchCell {
    /// Set while a batch holds the send lock.
    pub(crate) open: AtomicBool,
    /// The thread that opened the batch (`pthread_self`), to tell a second `ibv_wr_start` on
    /// the same thread (which restarts the batch) from another thread's (which waits).
    pub(crate) owner: AtomicUsize,
    builder: UnsafeCell<ExBuilder>,
    /// The provider's builder, when WRs may be handed to it.
    pub(crate) provider: Option<ProviderBuilder>,
}

// SAFETY: `builder` is used only by the open batch, which holds its QP's send lock (see the
// type's documentation); the raw pointers in its recorded WRs point only into its own vectors.
unsafe impl Sync for BatchCell {}
// SAFETY: as above.
unsafe impl Send for BatchCell {}

impl BatchCell {
    /// A closed batch; `provider` is the QP's own builder, if WRs may be handed to it.
    pub(crate) fn new(provider: Option<ProviderBuilder>) -> Self {
        Self {
            provider,
            ..Self::default()
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The builder.
    ///
    /// # Safety
    /// The caller's batch is open (or the application serializes the batch's calls, as verbs
    /// requires) and no other reference to the builder is live.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get(&self) -> &mut ExBuilder {
        // SAFETY: per the contract.
        unsafe { &mut *self.builder.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_bytes_copies_every_length() {
        for len in 0..300usize {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let mut dst = vec![0xeeu8; 3];
            append_bytes(&mut dst, &src);
            assert_eq!(&dst[..3], &[0xee; 3]);
            assert_eq!(&dst[3..], &src[..]);
        }
    }
}
