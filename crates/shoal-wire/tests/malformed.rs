//! Hostile inputs: garbage, truncation, oversized and lying lengths, wrong shapes. Every case
//! must be an error (never a panic, never a huge allocation).

mod common;

use common::{Draw, Rng, chunks, sample_frames};
use shoal_wire::{
    Activations, DEFAULT_MAX_FRAME_LEN, DType, Frame, FrameReader, Handshake, Role, WireError, kind,
};

fn frame_bytes(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = ((payload.len() + 1) as u32).to_le_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

fn decode_err(bytes: &[u8]) -> WireError {
    let mut r = FrameReader::default();
    r.push(bytes);
    r.next_frame().unwrap_err()
}

#[test]
fn four_gib_length_prefix_is_rejected_without_allocating() {
    let mut r = FrameReader::default();
    r.push(&u32::MAX.to_le_bytes());
    let err = r.next_frame().unwrap_err();
    assert_eq!(
        err,
        WireError::FrameTooLarge {
            len: u32::MAX as u64,
            max: DEFAULT_MAX_FRAME_LEN
        }
    );
    assert_eq!(err.error_type(), "frame_too_large");
    // Poisoned: same error again, later bytes ignored, nothing buffered.
    r.push(&Frame::Ping { nonce: 1 }.encode().unwrap());
    assert_eq!(r.next_frame().unwrap_err(), err);
    assert_eq!(r.buffered(), 0);
    assert_eq!(r.error(), Some(&err));

    assert_eq!(
        Frame::decode(&u32::MAX.to_le_bytes(), DEFAULT_MAX_FRAME_LEN).unwrap_err(),
        err
    );
}

#[test]
fn configured_max_is_enforced_on_both_sides() {
    let frame = Frame::Release {
        seq_ids: vec![0; 100],
    };
    let bytes = frame.encode().unwrap();
    let len = (bytes.len() - 4) as u32;
    let mut r = FrameReader::new(len - 1);
    r.push(&bytes[..4]);
    assert_eq!(
        r.next_frame().unwrap_err(),
        WireError::FrameTooLarge {
            len: len as u64,
            max: len - 1
        }
    );
    let mut r = FrameReader::new(len);
    r.push(&bytes);
    assert_eq!(r.next_frame().unwrap(), Some(frame.clone()));

    let mut out = vec![0xAA];
    assert_eq!(
        frame.encode_into(&mut out, len - 1).unwrap_err(),
        WireError::FrameTooLarge {
            len: len as u64,
            max: len - 1
        }
    );
    assert_eq!(out, [0xAA], "failed encode leaves the buffer alone");
}

#[test]
fn empty_and_unknown_kinds() {
    assert_eq!(decode_err(&[0, 0, 0, 0]), WireError::EmptyFrame);
    assert_eq!(decode_err(&frame_bytes(0, &[])), WireError::UnknownKind(0));
    assert_eq!(
        decode_err(&frame_bytes(12, &[1, 2])),
        WireError::UnknownKind(12)
    );
    // A lane offer is exactly a port and a 32-byte token.
    assert!(matches!(
        decode_err(&frame_bytes(kind::LANE, &[1, 2])),
        WireError::Truncated { .. }
    ));
    assert_eq!(
        decode_err(&frame_bytes(kind::LANE, &[0; 35])),
        WireError::TrailingBytes { extra: 1 }
    );
    assert_eq!(
        decode_err(&frame_bytes(255, &[])),
        WireError::UnknownKind(255)
    );
}

#[test]
fn sample_and_prefix_frames_reject_lies() {
    // A sample frame claiming a billion jobs in 4 bytes.
    let mut p = 1u64.to_le_bytes().to_vec();
    p.extend(1_000_000_000u32.to_le_bytes());
    p.extend([0; 4]);
    assert!(matches!(
        decode_err(&frame_bytes(kind::SAMPLE, &p)),
        WireError::Truncated { .. }
    ));
    // A prefix frame with an unknown action.
    let mut p = vec![9u8];
    p.extend([0; 20]);
    assert_eq!(
        decode_err(&frame_bytes(kind::PREFIX, &p)),
        WireError::UnknownPrefixAction(9)
    );
}

#[test]
fn lying_counts_and_lengths() {
    // Release claiming 2^32-1 ids with 8 bytes present: rejected before Vec::with_capacity.
    let mut p = u32::MAX.to_le_bytes().to_vec();
    p.extend(1u64.to_le_bytes());
    assert_eq!(
        decode_err(&frame_bytes(kind::RELEASE, &p)),
        WireError::Truncated {
            needed: u32::MAX as u64 * 8,
            got: 8
        }
    );
    // Tokens claiming more items than present.
    let mut p = 1u64.to_le_bytes().to_vec();
    p.extend(3u32.to_le_bytes());
    p.extend([0; 17 * 2]);
    assert!(matches!(
        decode_err(&frame_bytes(kind::TOKENS, &p)),
        WireError::Truncated { .. }
    ));
    // Ping with a short and a long payload.
    assert!(matches!(
        decode_err(&frame_bytes(kind::PING, &[1, 2, 3])),
        WireError::Truncated { needed: 8, got: 3 }
    ));
    assert_eq!(
        decode_err(&frame_bytes(kind::PONG, &[0; 9])),
        WireError::TrailingBytes { extra: 1 }
    );
    // Release with a count smaller than the bytes sent.
    let mut p = 1u32.to_le_bytes().to_vec();
    p.extend([0; 16]);
    assert_eq!(
        decode_err(&frame_bytes(kind::RELEASE, &p)),
        WireError::TrailingBytes { extra: 8 }
    );
    // A token item announcing 3 alternatives with the bytes of 1.
    let mut p = 1u64.to_le_bytes().to_vec();
    p.extend(1u32.to_le_bytes());
    p.extend([0; 16]);
    p.push(3);
    p.extend([0; 8]);
    assert!(matches!(
        decode_err(&frame_bytes(kind::TOKENS, &p)),
        WireError::Truncated { .. }
    ));
    // Pooled rows whose values do not fill them, and a count larger than the bytes.
    let pooled = |n: u32, cols: u32, ids: usize, values: usize| {
        let mut p = 1u64.to_le_bytes().to_vec();
        p.extend(n.to_le_bytes());
        p.extend(cols.to_le_bytes());
        p.extend(vec![0u8; 8 * ids + 4 * values]);
        frame_bytes(kind::POOLED, &p)
    };
    assert!(matches!(
        Frame::decode(&pooled(2, 3, 2, 6), u32::MAX),
        Ok(Some((Frame::Pooled(_), _)))
    ));
    assert_eq!(
        decode_err(&pooled(2, 3, 2, 5)),
        WireError::DataLength {
            expected: 24,
            got: 20
        }
    );
    assert_eq!(
        decode_err(&pooled(2, u32::MAX, 2, 0)),
        WireError::DataLength {
            expected: 2 * u32::MAX as u64 * 4,
            got: 0
        }
    );
    assert!(matches!(
        decode_err(&pooled(u32::MAX, 1, 1, 0)),
        WireError::Truncated { .. }
    ));
    // Error frame with invalid UTF-8.
    assert_eq!(
        decode_err(&frame_bytes(kind::ERROR, &[1, 0, 0xFF, 0xFE])),
        WireError::InvalidUtf8
    );
}

fn activations_payload(rows: u32, cols: u32, dtype: u8, flags: u8, data_len: usize) -> Vec<u8> {
    drafted_payload(rows, cols, dtype, (flags, 0), data_len)
}

/// [`activations_payload`] whose chunk says it ends with `drafted` tokens to verify.
fn drafted_payload(
    rows: u32,
    cols: u32,
    dtype: u8,
    (flags, drafted): (u8, u16),
    data_len: usize,
) -> Vec<u8> {
    let mut p = 1u64.to_le_bytes().to_vec();
    p.extend(1u32.to_le_bytes());
    p.extend(7u64.to_le_bytes());
    p.extend(0u32.to_le_bytes());
    p.extend(2u32.to_le_bytes()); // one chunk of 2 rows
    p.push(flags);
    p.extend(drafted.to_le_bytes());
    p.push(dtype);
    p.extend(rows.to_le_bytes());
    p.extend(cols.to_le_bytes());
    p.extend(vec![0u8; data_len]);
    p
}

#[test]
fn wrong_shapes_and_dtypes_are_rejected() {
    let ok = activations_payload(2, 3, 1, 1, 12);
    assert!(matches!(
        Frame::decode_body(&[&[kind::ACTIVATIONS][..], &ok].concat()),
        Ok(Frame::Activations(_))
    ));
    // A 2-token chunk verifying its last token: the decoder keeps the count.
    let drafted = drafted_payload(2, 3, 1, (1, 1), 12);
    match Frame::decode_body(&[&[kind::ACTIVATIONS][..], &drafted].concat()) {
        Ok(Frame::Activations(a)) => assert_eq!(a.chunks[0].drafted, 1),
        other => panic!("{other:?}"),
    }
    let cases = [
        (
            activations_payload(3, 3, 1, 0, 18),
            WireError::ShapeMismatch {
                rows: 3,
                chunk_rows: 2,
            },
        ),
        (
            activations_payload(2, 3, 1, 0, 13),
            WireError::DataLength {
                expected: 12,
                got: 13,
            },
        ),
        (
            activations_payload(2, 3, 0, 0, 12),
            WireError::DataLength {
                expected: 24,
                got: 12,
            },
        ),
        (
            activations_payload(2, u32::MAX, 0, 0, 0),
            WireError::DataLength {
                expected: 2 * u32::MAX as u64 * 4,
                got: 0,
            },
        ),
        (
            activations_payload(2, 3, 2, 0, 12),
            WireError::UnknownDType(2),
        ),
        (
            activations_payload(2, 3, 1, 8, 12),
            WireError::ReservedFlags(8),
        ),
        (
            activations_payload(2, 3, 1, 0x81, 12),
            WireError::ReservedFlags(0x81),
        ),
        // Drafted tokens on a chunk wanting no logits, or as many as the chunk's 2 tokens.
        (
            drafted_payload(2, 3, 1, (0, 1), 12),
            WireError::BadDraft { drafted: 1, len: 2 },
        ),
        (
            drafted_payload(2, 3, 1, (1, 2), 12),
            WireError::BadDraft { drafted: 2, len: 2 },
        ),
    ];
    for (payload, want) in cases {
        assert_eq!(decode_err(&frame_bytes(kind::ACTIVATIONS, &payload)), want);
    }
}

#[test]
fn invalid_activations_are_refused_by_the_encoder_too() {
    let mut a = Activations::from_f32(1, chunks(), 2, &[0.0; 8], DType::F16).unwrap();
    a.shape[0] = 5;
    assert!(matches!(
        Frame::Activations(a.clone()).encode(),
        Err(WireError::ShapeMismatch { .. })
    ));
    a.shape[0] = 4;
    a.data.pop();
    assert!(matches!(
        Frame::Activations(a).encode(),
        Err(WireError::DataLength { .. })
    ));
    assert!(matches!(
        Activations::from_f32(1, chunks(), 2, &[0.0; 7], DType::F32),
        Err(WireError::DataLength { .. })
    ));
}

#[test]
fn every_truncation_of_every_frame_is_incomplete_or_an_error() {
    let mut rng = Rng::new(10);
    for frame in sample_frames(&mut rng) {
        let bytes = frame.encode().unwrap();
        for cut in 0..bytes.len() {
            // As a stream prefix: simply not complete yet.
            let mut r = FrameReader::default();
            r.push(&bytes[..cut]);
            assert_eq!(r.next_frame().unwrap(), None);
            // With the length prefix patched to match the cut: a decode error, not a panic.
            if cut > 4 {
                let mut lying = bytes[..cut].to_vec();
                lying[..4].copy_from_slice(&((cut - 4) as u32).to_le_bytes());
                // An Error frame cut inside its message can still be a valid, shorter message.
                let valid_prefix = cut >= 7 && matches!(frame, Frame::Error { .. });
                if !valid_prefix {
                    assert!(Frame::decode(&lying, DEFAULT_MAX_FRAME_LEN).is_err());
                }
            }
        }
    }
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = Rng::new(0x5EED);
    let templates: Vec<Vec<u8>> = sample_frames(&mut rng)
        .iter()
        .map(|f| f.encode().unwrap())
        .collect();
    let mut frames = 0usize;
    let mut errors = 0usize;
    for i in 0..5000 {
        let input = match i % 3 {
            // Pure noise.
            0 => {
                let n = rng.below(200) as usize;
                rng.bytes(n)
            }
            // Noise behind a plausible small length prefix and a valid kind.
            1 => {
                let n = 1 + rng.below(120) as usize;
                let body = rng.bytes(n);
                let mut v = (body.len() as u32).to_le_bytes().to_vec();
                v.extend(body);
                v[4] = 1 + (rng.below(6) as u8);
                v
            }
            // A valid frame with a few bytes flipped (length prefix included).
            _ => {
                let t = rng.below(templates.len() as u64) as usize;
                let mut v = templates[t].clone();
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(v.len() as u64) as usize;
                    let bit = rng.below(8);
                    v[at] ^= 1 << bit;
                }
                v
            }
        };
        let mut r = FrameReader::new(1 << 16);
        r.push(&input);
        loop {
            match r.next_frame() {
                Ok(Some(f)) => {
                    frames += 1;
                    // Whatever decodes must re-encode to a frame that decodes to itself.
                    let again = f.encode().unwrap();
                    let (back, _) = Frame::decode(&again, DEFAULT_MAX_FRAME_LEN)
                        .unwrap()
                        .unwrap();
                    assert!(back == f || has_nan(&f));
                }
                Ok(None) => break,
                Err(_) => {
                    errors += 1;
                    assert!(r.next_frame().is_err(), "reader stays poisoned");
                    break;
                }
            }
        }
        // Handshake decoding on the same garbage must not panic either.
        let _ = Handshake::decode(&input);
        let _ = Handshake::wire_len(&input);
    }
    assert!(errors > 1000, "garbage mostly rejected: {errors} errors");
    assert!(
        frames > 0,
        "bit flips in data still decode: {frames} frames"
    );
}

/// Whether a float in `f` is NaN (so the frame cannot equal itself).
fn has_nan(f: &Frame) -> bool {
    match f {
        Frame::Tokens { items, .. } => items
            .iter()
            .any(|t| t.logprob.is_nan() || t.top.iter().any(|(_, l)| l.is_nan())),
        Frame::Pooled(p) => p.values.iter().any(|v| v.is_nan()),
        Frame::Sample { jobs, .. } => jobs.iter().any(|j| {
            let p = &j.params;
            [
                p.temperature,
                p.top_p,
                p.min_p,
                p.repetition_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            ]
            .iter()
            .any(|v| v.is_nan())
        }),
        _ => false,
    }
}

#[test]
fn corrupted_handshakes_are_errors() {
    let hs = Handshake::new(
        [1; 32],
        [2; 32],
        Role::Stage {
            instance_id: 1,
            stage_index: 0,
            layer_start: 0,
            layer_end: 15,
        },
    );
    let good = hs.encode();
    for cut in 0..good.len() {
        assert!(matches!(
            Handshake::decode(&good[..cut]),
            Err(WireError::Truncated { .. })
        ));
    }
    let mut bad = good.clone();
    bad[6] = 84;
    assert!(matches!(
        Handshake::decode(&bad),
        Err(WireError::HandshakeLength { got: 84, .. })
    ));
    let mut bad = good.clone();
    bad[72] = 9;
    assert_eq!(Handshake::decode(&bad), Err(WireError::UnknownRole(9)));
    let mut bad = good.clone();
    bad[83..87].copy_from_slice(&20u32.to_le_bytes());
    assert_eq!(
        Handshake::decode(&bad),
        Err(WireError::LayerRange { start: 20, end: 15 })
    );
    // Regression (the handshake fuzz target): an owner's handshake with stage fields decoded, and then
    // encoded to other bytes; they must be zero.
    let owner = Handshake::new([1; 32], [2; 32], Role::Owner { instance_id: 7 }).encode();
    let mut bad = owner.clone();
    bad[81] = 3;
    assert_eq!(
        Handshake::decode(&bad),
        Err(WireError::OwnerStageFields {
            stage: 3,
            start: 0,
            end: 0
        })
    );
    assert!(Handshake::decode(&owner).is_ok());
}
