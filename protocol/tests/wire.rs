//! Wire encoding: byte layout per docs/protocol.md §4, round trips, and every class of
//! malformed input rejected with its typed error.

use proptest::prelude::*;
use protocol::wire::{
    self, Abort, AbortAck, Ack, BlockHeader, FaultInAck, FaultInRequest, Hello, MAX_MESSAGE_LEN,
    Nack, Resolved, StateLookupRequest, StateLookupResponse,
};
use protocol::{
    AbortReason, Access, BlockRange, Envelope, FaultReason, Generation, Message, MessageType,
    ProtocolError, RequestStatus, TransferId, crc32c,
};

/// Replaces the CRC trailer so that a deliberately altered message is intact again.
fn reseal(bytes: &mut [u8]) {
    let n = bytes.len();
    let crc = crc32c(&bytes[..n - 4]);
    bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn sample_ack() -> Envelope {
    Envelope::new(
        0xA1B2_C3D4,
        Message::Ack(Ack {
            tid: TransferId(0x0102_0304),
            blocks: BlockRange::new(5, 3).unwrap(),
            attempt: 2,
        }),
    )
}

#[test]
fn ack_byte_layout_matches_the_spec_table() {
    // docs/protocol.md §4.1 (header) and §4.4 (ACK), written out by hand.
    let mut expected = vec![
        b'N', b'P', b'R', b'M', // magic
        1,    // version
        3,    // type: ACK
        32, 0, // length: 12 + 16 + 4
        0xD4, 0xC3, 0xB2, 0xA1, // session
        0x04, 0x03, 0x02, 0x01, // tid
        5, 0, 0, 0, // first block
        3, 0, 0, 0, // count
        2, 0, // attempt
        0, 0, // reserved
        0, 0, 0, 0, // CRC, filled below
    ];
    reseal(&mut expected);
    let encoded = sample_ack().to_bytes();
    assert_eq!(encoded.as_slice(), expected.as_slice());
    assert_eq!(wire::MAGIC, 0x4D52_504E);
}

#[test]
fn block_header_byte_layout_matches_the_spec_table() {
    let header = BlockHeader {
        tid: TransferId(7),
        block: 2,
        block_count: 9,
        attempt: 3,
        oldest_open: TransferId(6),
        len: 4096,
        key: 0x55,
        dest: 0x0000_1234_5678_9000,
    };
    let bytes = Envelope::new(1, Message::Block(header)).to_bytes();
    assert_eq!(bytes.len(), 56);
    assert_eq!(bytes[5], 2, "type code of BLOCK");
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 56);
    let body = &bytes[12..52];
    assert_eq!(&body[0..4], &7u32.to_le_bytes());
    assert_eq!(&body[4..8], &2u32.to_le_bytes());
    assert_eq!(&body[8..12], &9u32.to_le_bytes());
    assert_eq!(&body[12..14], &3u16.to_le_bytes());
    assert_eq!(&body[14..16], &[0, 0]);
    assert_eq!(&body[16..20], &6u32.to_le_bytes());
    assert_eq!(&body[20..24], &4096u32.to_le_bytes());
    assert_eq!(&body[24..28], &0x55u32.to_le_bytes());
    assert_eq!(&body[28..32], &[0, 0, 0, 0]);
    assert_eq!(&body[32..40], &0x0000_1234_5678_9000u64.to_le_bytes());
    assert_eq!(&bytes[52..56], &crc32c(&bytes[..52]).to_le_bytes());
}

#[test]
fn wire_lengths_per_type() {
    // Body sizes from docs/protocol.md §4.
    let expected = [
        (MessageType::Hello, 16),
        (MessageType::Block, 40),
        (MessageType::Ack, 16),
        (MessageType::Nack, 16),
        (MessageType::Resolved, 24),
        (MessageType::FaultInRequest, 40),
        (MessageType::FaultInAck, 32),
        (MessageType::StateLookupRequest, 16),
        (MessageType::StateLookupResponse, 40),
        (MessageType::Abort, 16),
        (MessageType::AbortAck, 8),
    ];
    for (code, (ty, body)) in (1u8..).zip(expected) {
        assert_eq!(ty as u8, code);
        assert_eq!(MessageType::from_code(code), Some(ty));
        assert_eq!(ty.wire_len(), 12 + body + 4);
    }
    assert_eq!(MessageType::from_code(0), None);
    assert_eq!(MessageType::from_code(12), None);
}

#[test]
fn error_codes_are_stable() {
    let cases = [
        (ProtocolError::Truncated { needed: 1, got: 0 }, 1),
        (ProtocolError::BadMagic { found: 0 }, 2),
        (ProtocolError::UnsupportedVersion { found: 2 }, 3),
        (
            ProtocolError::BadLength {
                declared: 0,
                expected: 16,
            },
            4,
        ),
        (
            ProtocolError::Oversized {
                declared: 300,
                max: 256,
            },
            5,
        ),
        (
            ProtocolError::BadChecksum {
                stored: 0,
                computed: 1,
            },
            6,
        ),
        (ProtocolError::UnknownType { code: 99 }, 7),
        (ProtocolError::BadField { offset: 12 }, 8),
        (ProtocolError::WindowFull { open: 4 }, 30),
        (ProtocolError::UnknownTransfer { tid: 1 }, 31),
    ];
    for (error, code) in cases {
        assert_eq!(error.code(), code, "{error}");
    }
}

#[test]
fn truncated_at_every_length() {
    let bytes = sample_ack().to_bytes();
    for cut in 0..bytes.len() {
        let needed = if cut < 12 { 12 } else { bytes.len() };
        assert_eq!(
            Envelope::decode(&bytes[..cut]),
            Err(ProtocolError::Truncated { needed, got: cut }),
            "cut at {cut}"
        );
    }
    assert_eq!(Envelope::decode(&bytes).unwrap(), (sample_ack(), 32));
}

#[test]
fn bad_magic_is_foreign() {
    let mut bytes = sample_ack().to_bytes();
    bytes[0] = b'X';
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadMagic {
            found: u32::from_le_bytes([b'X', b'P', b'R', b'M'])
        })
    );
    // An ExaNet-looking or HTTP-looking frame is foreign too.
    assert!(matches!(
        Envelope::decode(b"GET / HTTP/1.1\r\n\r\n"),
        Err(ProtocolError::BadMagic { .. })
    ));
}

#[test]
fn bad_version_is_rejected_even_when_intact() {
    for version in [0u8, 2, 255] {
        let mut bytes = sample_ack().to_bytes();
        bytes[4] = version;
        reseal(&mut bytes);
        assert_eq!(
            Envelope::decode(&bytes),
            Err(ProtocolError::UnsupportedVersion { found: version })
        );
    }
}

#[test]
fn bad_lengths() {
    // Shorter than header + trailer.
    let mut bytes = sample_ack().to_bytes();
    bytes[6] = 15;
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadLength {
            declared: 15,
            expected: 16
        })
    );

    // Intact, but not the ACK length: a 36-byte "ACK" with 4 extra body bytes.
    let mut long = sample_ack().to_bytes().to_vec();
    long.truncate(28);
    long.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    long[6] = 36;
    reseal(&mut long);
    assert_eq!(
        Envelope::decode(&long),
        Err(ProtocolError::BadLength {
            declared: 36,
            expected: 32
        })
    );
}

#[test]
fn oversized_is_rejected_before_reading_the_body() {
    let mut bytes = sample_ack().to_bytes();
    bytes[6..8].copy_from_slice(&300u16.to_le_bytes());
    // Only the header is present: the decoder must not ask for 300 bytes first.
    assert_eq!(
        Envelope::decode(&bytes[..12]),
        Err(ProtocolError::Oversized {
            declared: 300,
            max: MAX_MESSAGE_LEN
        })
    );
}

#[test]
fn bad_checksum_for_any_flipped_body_or_trailer_bit() {
    let good = sample_ack().to_bytes();
    for byte in 8..good.len() {
        for bit in 0..8 {
            let mut bytes = good.clone();
            bytes[byte] ^= 1 << bit;
            assert!(
                matches!(
                    Envelope::decode(&bytes),
                    Err(ProtocolError::BadChecksum { .. })
                ),
                "flip of byte {byte} bit {bit} not caught"
            );
        }
    }
    // A corrupted type byte is a checksum error, not an unknown type.
    let mut bytes = good.clone();
    bytes[5] = 99;
    assert!(matches!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadChecksum { .. })
    ));
}

#[test]
fn unknown_type_when_intact() {
    for code in [0u8, 12, 200] {
        let mut bytes = sample_ack().to_bytes();
        bytes[5] = code;
        reseal(&mut bytes);
        assert_eq!(
            Envelope::decode(&bytes),
            Err(ProtocolError::UnknownType { code })
        );
    }
}

#[test]
fn bad_fields_report_their_offset() {
    let nack = Envelope::new(
        9,
        Message::Nack(Nack {
            tid: TransferId(1),
            blocks: BlockRange::single(0),
            attempt: 1,
            reason: FaultReason::NotPresent,
            fatal: false,
        }),
    );
    // Reason code 9 at body offset 14 (message offset 26).
    let mut bytes = nack.to_bytes();
    bytes[26] = 9;
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 26 })
    );
    // Flags other than "fatal" at message offset 27.
    let mut bytes = nack.to_bytes();
    bytes[27] = 2;
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 27 })
    );
    // Block count 0 at message offset 20.
    let mut bytes = nack.to_bytes();
    bytes[20..24].copy_from_slice(&0u32.to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 20 })
    );
    // Attempt 0 at message offset 24.
    let mut bytes = nack.to_bytes();
    bytes[24..26].copy_from_slice(&0u16.to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 24 })
    );

    // Reserved bytes of an ACK (message offset 26) must be zero.
    let mut bytes = sample_ack().to_bytes();
    bytes[26] = 1;
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 26 })
    );

    // A block index at or beyond the block count (message offset 16).
    let block = Envelope::new(
        0,
        Message::Block(BlockHeader {
            tid: TransferId(3),
            block: 1,
            block_count: 2,
            attempt: 1,
            oldest_open: TransferId(3),
            len: 1,
            key: 0,
            dest: 0,
        }),
    );
    let mut bytes = block.to_bytes();
    bytes[16..20].copy_from_slice(&2u32.to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 16 })
    );
    // oldest_open after the block's own transfer (message offset 28).
    let mut bytes = block.to_bytes();
    bytes[28..32].copy_from_slice(&4u32.to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(
        Envelope::decode(&bytes),
        Err(ProtocolError::BadField { offset: 28 })
    );
}

#[test]
fn session_mismatch_is_typed() {
    let envelope = sample_ack();
    assert_eq!(
        envelope.expect_session(7),
        Err(ProtocolError::WrongSession {
            expected: 7,
            found: 0xA1B2_C3D4
        })
    );
    assert!(envelope.expect_session(0xA1B2_C3D4).is_ok());
}

#[test]
fn messages_decode_one_after_another_from_a_stream() {
    let first = sample_ack();
    let second = Envelope::new(2, Message::AbortAck(AbortAck { tid: TransferId(4) }));
    let mut stream = first.to_bytes().to_vec();
    stream.extend_from_slice(&second.to_bytes());
    let (a, used) = Envelope::decode(&stream).unwrap();
    let (b, used_b) = Envelope::decode(&stream[used..]).unwrap();
    assert_eq!((a, b), (first, second));
    assert_eq!(used + used_b, stream.len());
}

#[test]
fn encode_into_small_buffer_fails_without_writing() {
    let mut small = [0xEEu8; 31];
    assert_eq!(
        sample_ack().encode(&mut small),
        Err(ProtocolError::BufferTooSmall {
            needed: 32,
            got: 31
        })
    );
    assert!(small.iter().all(|&b| b == 0xEE));
    let mut exact = [0u8; 32];
    assert_eq!(sample_ack().encode(&mut exact), Ok(32));
}

#[test]
fn version_negotiation() {
    let ours = Hello {
        min_version: 1,
        max_version: 1,
        block_size: 4096,
        max_blocks: 256,
        window: 16,
    };
    let newer = Hello {
        min_version: 1,
        max_version: 3,
        block_size: 4096,
        max_blocks: 64,
        window: 32,
    };
    let agreed = wire::negotiate(&ours, &newer).unwrap();
    assert_eq!(
        (agreed.version, agreed.max_blocks, agreed.window),
        (1, 64, 16)
    );
    let future_only = Hello {
        min_version: 2,
        max_version: 3,
        ..newer
    };
    assert_eq!(
        wire::negotiate(&ours, &future_only),
        Err(ProtocolError::NoCommonVersion {
            local_min: 1,
            local_max: 1,
            peer_min: 2,
            peer_max: 3
        })
    );
    let other_block = Hello {
        block_size: 2048,
        ..ours
    };
    assert_eq!(
        wire::negotiate(&ours, &other_block),
        Err(ProtocolError::ParameterMismatch {
            field: "block_size"
        })
    );
}

fn any_range() -> impl Strategy<Value = BlockRange> {
    (any::<u32>(), 1u32..=1024).prop_filter_map("range end must fit", |(first, count)| {
        BlockRange::new(first, count)
    })
}

fn any_fault() -> impl Strategy<Value = FaultReason> {
    prop_oneof![
        Just(FaultReason::NotPresent),
        Just(FaultReason::Permission),
        Just(FaultReason::OutOfRegion),
        Just(FaultReason::PageChanged),
    ]
}

fn any_status() -> impl Strategy<Value = RequestStatus> {
    prop_oneof![
        Just(RequestStatus::Ok),
        any_fault().prop_map(RequestStatus::Failed)
    ]
}

fn any_abort_reason() -> impl Strategy<Value = AbortReason> {
    prop_oneof![
        Just(AbortReason::Cancelled),
        any::<u32>().prop_map(|block| AbortReason::RetriesExhausted { block }),
        any::<u32>().prop_map(|block| AbortReason::SourceFaultTimeout { block }),
        (any::<u32>(), any_fault())
            .prop_map(|(block, reason)| AbortReason::SourceFault { block, reason }),
        (any::<u32>(), any_fault())
            .prop_map(|(block, reason)| AbortReason::RemoteRejected { block, reason }),
    ]
}

fn any_message() -> impl Strategy<Value = Message> {
    let tid = any::<u32>().prop_map(TransferId);
    prop_oneof![
        (1u8..=255, 0u8..=254, 1u32.., 1u32.., 1u32..).prop_map(
            |(min, extra, block_size, max_blocks, window)| {
                Message::Hello(Hello {
                    min_version: min,
                    max_version: min.saturating_add(extra),
                    block_size,
                    max_blocks,
                    window,
                })
            }
        ),
        (
            tid.clone(),
            1u32..,
            0u32..1_000_000,
            1u16..,
            1u32..,
            any::<u32>(),
            any::<u64>()
        )
            .prop_flat_map(|(tid, block_count, behind, attempt, len, key, dest)| (0
                ..block_count)
                .prop_map(move |block| {
                    Message::Block(BlockHeader {
                        tid,
                        block,
                        block_count,
                        attempt,
                        oldest_open: TransferId(tid.0.wrapping_sub(behind)),
                        len,
                        key,
                        dest,
                    })
                })),
        (tid.clone(), any_range(), 1u16..).prop_map(|(tid, blocks, attempt)| Message::Ack(Ack {
            tid,
            blocks,
            attempt
        })),
        (tid.clone(), any_range(), 1u16.., any_fault(), any::<bool>()).prop_map(
            |(tid, blocks, attempt, reason, fatal)| {
                Message::Nack(Nack {
                    tid,
                    blocks,
                    attempt,
                    reason,
                    fatal,
                })
            }
        ),
        (tid.clone(), any_range(), any::<u64>()).prop_map(|(tid, blocks, g)| Message::Resolved(
            Resolved {
                tid,
                blocks,
                generation: Generation(g)
            }
        )),
        (
            any::<u32>(),
            tid.clone(),
            any_range(),
            any::<u32>(),
            any::<bool>(),
            0u64..u64::MAX / 2,
            1u64..u64::MAX / 2
        )
            .prop_map(|(req_seq, tid, blocks, key, write, addr, len)| {
                let access = if write { Access::Write } else { Access::Read };
                Message::FaultInRequest(FaultInRequest {
                    req_seq,
                    tid,
                    blocks,
                    key,
                    access,
                    addr,
                    len,
                })
            }),
        (
            any::<u32>(),
            tid.clone(),
            any_range(),
            any_status(),
            any::<u64>()
        )
            .prop_map(|(req_seq, tid, blocks, status, g)| {
                Message::FaultInAck(FaultInAck {
                    req_seq,
                    tid,
                    blocks,
                    status,
                    generation: Generation(g),
                })
            }),
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(req_seq, key, offset)| {
            Message::StateLookupRequest(StateLookupRequest {
                req_seq,
                key,
                offset,
            })
        }),
        (
            any::<u32>(),
            any::<u32>(),
            any_status(),
            12u8..=30,
            0u8..=64,
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(
                |(req_seq, key, status, page_shift, pages, offset, g, bits)| {
                    let present = if pages == 64 {
                        bits
                    } else {
                        bits & ((1u64 << pages) - 1)
                    };
                    Message::StateLookupResponse(StateLookupResponse {
                        req_seq,
                        key,
                        status,
                        page_shift,
                        pages,
                        offset,
                        generation: Generation(g),
                        present,
                    })
                }
            ),
        (tid.clone(), any::<u32>(), any_abort_reason()).prop_map(|(tid, oldest, reason)| {
            Message::Abort(Abort {
                tid,
                oldest_open: TransferId(oldest),
                reason,
            })
        }),
        tid.prop_map(|tid| Message::AbortAck(AbortAck { tid })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn round_trip(session in any::<u32>(), message in any_message()) {
        let envelope = Envelope::new(session, message);
        let bytes = envelope.to_bytes();
        prop_assert_eq!(bytes.len(), envelope.wire_len());
        let mut out = [0u8; 64];
        prop_assert_eq!(envelope.encode(&mut out), Ok(bytes.len()));
        prop_assert_eq!(&out[..bytes.len()], bytes.as_slice());
        prop_assert_eq!(Envelope::decode(&bytes), Ok((envelope, bytes.len())));
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        // No panic, and whatever decodes consumed bytes that were there and re-encodes to
        // exactly them.
        if let Ok((envelope, used)) = Envelope::decode(&bytes) {
            prop_assert!(used <= bytes.len());
            let mut out = vec![0u8; used];
            prop_assert_eq!(envelope.encode(&mut out), Ok(used));
            prop_assert_eq!(&out[..], &bytes[..used]);
        }
    }

    /// Random bytes almost never start with the magic, so the property above mostly tests
    /// the magic check. Here the magic is right and everything after it is arbitrary: any
    /// version, type code, length field (including ones longer or shorter than the input),
    /// session and tail. The header checks and the CRC must refuse without a panic; what
    /// decodes must re-encode to exactly the bytes it consumed.
    #[test]
    fn arbitrary_headers_behind_the_magic_never_panic(
        version in 0u8..4,
        code in any::<u8>(),
        len in 0u16..400,
        session in any::<u32>(),
        tail in proptest::collection::vec(any::<u8>(), 0..300),
        seal in any::<bool>(),
    ) {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&wire::MAGIC.to_le_bytes());
        bytes.push(version);
        bytes.push(code);
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&session.to_le_bytes());
        bytes.extend_from_slice(&tail);
        if seal && usize::from(len) <= bytes.len() && usize::from(len) >= 16 {
            // A correct CRC over the claimed length, so the body checks are reached.
            bytes.truncate(usize::from(len));
            reseal(&mut bytes);
        }
        if let Ok((envelope, used)) = Envelope::decode(&bytes) {
            prop_assert!(used <= bytes.len());
            let mut out = vec![0u8; used];
            prop_assert_eq!(envelope.encode(&mut out), Ok(used));
            prop_assert_eq!(&out[..], &bytes[..used]);
        }
    }

    /// Arbitrary bodies behind a valid header and CRC reach the field checks: they must
    /// decode to a message that re-encodes to the same bytes, or fail with BadField.
    #[test]
    fn arbitrary_intact_bodies_decode_canonically_or_fail_with_bad_field(
        code in 1u8..=11,
        session in any::<u32>(),
        body in proptest::collection::vec(any::<u8>(), 40),
    ) {
        let ty = MessageType::from_code(code).unwrap();
        let len = ty.wire_len();
        let mut bytes = Vec::with_capacity(len);
        bytes.extend_from_slice(&wire::MAGIC.to_le_bytes());
        bytes.push(1);
        bytes.push(code);
        bytes.extend_from_slice(&(len as u16).to_le_bytes());
        bytes.extend_from_slice(&session.to_le_bytes());
        bytes.extend_from_slice(&body[..ty.body_len()]);
        bytes.extend_from_slice(&[0; 4]);
        reseal(&mut bytes);
        match Envelope::decode(&bytes) {
            Ok((envelope, used)) => {
                prop_assert_eq!(used, len);
                let again = envelope.to_bytes();
                prop_assert_eq!(again.as_slice(), bytes.as_slice());
            }
            Err(ProtocolError::BadField { offset }) => prop_assert!((12..len - 4).contains(&offset)),
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
        }
    }

    /// Any single corruption of a valid message is detected (never decoded as a message).
    #[test]
    fn single_byte_corruption_is_detected(message in any_message(), at in any::<prop::sample::Index>(), xor in 1u8..) {
        let mut bytes = Envelope::new(5, message).to_bytes();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        prop_assert!(Envelope::decode(&bytes).is_err());
    }
}
