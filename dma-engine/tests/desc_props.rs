//! Property tests of the NPE queue entries (docs/dma-engine.md §4): whatever bytes an entry
//! holds, decoding never panics, and an entry that decodes encodes back to exactly the same
//! bytes. The second property is the spec's "reserved fields are zero" and "0 otherwise" rules
//! seen from the decoder: a bit the decoder accepted but did not keep would be a field the
//! engine (or the driver) silently ignores.
//!
//! Random bytes are almost always refused, so the inputs are valid entries with a few bits
//! flipped: every flip lands on a field, a reserved bit or the inline message.

use dma_engine::DmaError;
use dma_engine::npe::desc::{
    CQ_ENTRY, CqEntry, EntryStatus, InlineMsg, MAX_MSG, MIN_MSG, RQ_ENTRY, RqEntry, RqKind,
    SQ_ENTRY, SqEntry, SqOp, VA_MASK, WCQ_ENTRY, WQ_ENTRY, WcqEntry, WqEntry, WqOp,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

const BLOCK_SIZE: u32 = 4096;

fn status() -> impl Strategy<Value = EntryStatus> {
    (0u8..6).prop_map(|c| EntryStatus::from_code(c).expect("codes 0..6 exist"))
}

fn message(min: usize) -> impl Strategy<Value = InlineMsg> {
    prop::collection::vec(any::<u8>(), min..=MAX_MSG)
        .prop_map(|b| InlineMsg::new(&b).expect("at most MAX_MSG bytes"))
}

fn sq_entry() -> impl Strategy<Value = SqEntry> {
    let op = prop_oneof![
        (0..=VA_MASK, 1..=BLOCK_SIZE, 0..=VA_MASK).prop_map(|(src_va, length, dst_va)| {
            SqOp::SendBlock {
                src_va,
                length,
                dst_va,
            }
        }),
        Just(SqOp::SendMsg),
        Just(SqOp::Nop),
    ];
    (
        op,
        any::<bool>(),
        0u16..1 << 14,
        0u32..1 << 22,
        any::<u16>(),
        any::<u64>(),
        message(MIN_MSG),
    )
        .prop_map(|(op, signal, tid14, peer, dst_pdid, cookie, msg)| SqEntry {
            op,
            signal,
            tid14,
            peer,
            dst_pdid,
            cookie,
            msg: if op == SqOp::Nop {
                InlineMsg::EMPTY
            } else {
                msg
            },
        })
}

fn cq_entry() -> impl Strategy<Value = CqEntry> {
    (
        any::<bool>(),
        status(),
        any::<u16>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(phase, status, sq_index, bytes, cookie, fault_addr)| CqEntry {
                phase,
                status,
                sq_index,
                bytes,
                cookie,
                fault_addr,
            },
        )
}

fn rq_entry() -> impl Strategy<Value = RqEntry> {
    let kind = prop_oneof![
        Just(RqKind::Msg),
        (any::<u8>(), any::<u32>()).prop_map(|(slot, length)| RqKind::Block { slot, length }),
    ];
    (
        any::<bool>(),
        kind,
        0u32..1 << 22,
        any::<u16>(),
        0u16..1 << 14,
        message(0),
    )
        .prop_map(|(phase, kind, src, pdid, tid14, msg)| RqEntry {
            phase,
            kind,
            src,
            pdid,
            tid14,
            msg,
        })
}

fn wq_entry() -> impl Strategy<Value = WqEntry> {
    let op = prop_oneof![
        (any::<u16>(), 1..=u32::MAX, 0..=VA_MASK).prop_map(|(pdid, length, dst_va)| {
            WqOp::Commit {
                pdid,
                length,
                dst_va,
            }
        }),
        Just(WqOp::Release),
    ];
    (op, any::<u8>(), any::<u64>()).prop_map(|(op, slot, cookie)| WqEntry { op, slot, cookie })
}

fn wcq_entry() -> impl Strategy<Value = WcqEntry> {
    (
        any::<bool>(),
        status(),
        any::<u8>(),
        any::<u32>(),
        any::<u64>(),
        any::<u64>(),
        2u8..4,
    )
        .prop_map(
            |(phase, status, slot, bytes, cookie, fault_addr, resp)| WcqEntry {
                phase,
                status,
                slot,
                bytes,
                cookie,
                fault_addr,
                axi_resp: if status == EntryStatus::DstFault {
                    resp
                } else {
                    0
                },
            },
        )
}

/// Up to three bit positions to flip in an entry of `len` bytes.
fn flips(len: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0..len * 8, 0..=3)
}

fn flipped<const N: usize>(mut bytes: [u8; N], bits: &[usize]) -> [u8; N] {
    for &bit in bits {
        bytes[bit / 8] ^= 1 << (bit % 8);
    }
    bytes
}

/// The entry's own encoding decodes to it, and its encoding with `bits` flipped either is
/// refused or decodes to an entry that encodes back to exactly those bytes.
fn check_round_trip<T, const N: usize>(
    entry: T,
    bits: &[usize],
    encode: impl Fn(&T) -> [u8; N],
    decode: impl Fn(&[u8; N]) -> Result<T, DmaError>,
) -> Result<(), TestCaseError>
where
    T: PartialEq + core::fmt::Debug,
{
    let clean = encode(&entry);
    prop_assert_eq!(decode(&clean), Ok(entry));
    let bytes = flipped(clean, bits);
    if let Ok(decoded) = decode(&bytes) {
        prop_assert_eq!(encode(&decoded), bytes, "{:?}", decoded);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn a_submission_that_decodes_encodes_back_to_its_bytes(
        entry in sq_entry(),
        bits in flips(SQ_ENTRY),
    ) {
        check_round_trip(entry, &bits, SqEntry::encode, |b| SqEntry::decode(b, BLOCK_SIZE))?;
    }

    #[test]
    fn a_completion_that_decodes_encodes_back_to_its_bytes(
        entry in cq_entry(),
        bits in flips(CQ_ENTRY),
    ) {
        check_round_trip(entry, &bits, CqEntry::encode, CqEntry::decode)?;
    }

    #[test]
    fn a_receive_entry_that_decodes_encodes_back_to_its_bytes(
        entry in rq_entry(),
        bits in flips(RQ_ENTRY),
    ) {
        check_round_trip(entry, &bits, RqEntry::encode, RqEntry::decode)?;
    }

    #[test]
    fn a_write_entry_that_decodes_encodes_back_to_its_bytes(
        entry in wq_entry(),
        bits in flips(WQ_ENTRY),
    ) {
        check_round_trip(entry, &bits, WqEntry::encode, WqEntry::decode)?;
    }

    #[test]
    fn a_write_completion_that_decodes_encodes_back_to_its_bytes(
        entry in wcq_entry(),
        bits in flips(WCQ_ENTRY),
    ) {
        check_round_trip(entry, &bits, WcqEntry::encode, WcqEntry::decode)?;
    }
}
