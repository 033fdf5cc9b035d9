//! Well-formed inputs: every frame kind and the handshake survive encode → decode.

mod common;

use common::{Draw, Rng, chunks, sample_frames};
use shoal_wire::{
    Activations, DEFAULT_MAX_FRAME_LEN, DType, Frame, FrameReader, HANDSHAKE_HEADER_LEN,
    HANDSHAKE_V1_BODY_LEN, Handshake, Inputs, Role, SampleJob, SamplingParams, WIRE_VERSION,
    WireError, decode_f16_to_f32, encode_f32_as_f16,
};

#[test]
fn every_frame_kind_roundtrips() {
    let mut rng = Rng::new(1);
    for frame in sample_frames(&mut rng) {
        let bytes = frame.encode().unwrap();
        let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 4, "length prefix counts bytes after it");
        assert_eq!(bytes[4], frame.kind());
        let (decoded, used) = Frame::decode(&bytes, DEFAULT_MAX_FRAME_LEN)
            .unwrap()
            .unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded, frame);
    }
}

#[test]
fn exact_bytes_of_a_ping_and_a_small_activations_frame() {
    let ping = Frame::Ping { nonce: 0x0102 }.encode().unwrap();
    assert_eq!(ping, [9, 0, 0, 0, 4, 2, 1, 0, 0, 0, 0, 0, 0]);

    let a = Activations::from_f32(
        5,
        vec![shoal_wire::ChunkHeader {
            seq_id: 3,
            start_pos: 2,
            len: 1,
            want_logits: true,
            pool: shoal_wire::Pool::None,
            drafted: 0,
        }],
        2,
        &[1.0, -2.0],
        DType::F16,
    )
    .unwrap();
    let bytes = Frame::Activations(a).encode().unwrap();
    #[rustfmt::skip]
    let expected: Vec<u8> = [
        &[45u8, 0, 0, 0, 1][..],           // len = 1 + 44, kind 1
        &5u64.to_le_bytes(), &1u32.to_le_bytes(), // batch_id, n chunks
        &3u64.to_le_bytes(), &2u32.to_le_bytes(), &1u32.to_le_bytes(), &[1], &[0, 0], // chunk
        &[1], &1u32.to_le_bytes(), &2u32.to_le_bytes(), // dtype f16, rows, cols
        &[0x00, 0x3C, 0x00, 0xC0],          // 1.0, -2.0 as f16
    ]
    .concat();
    assert_eq!(bytes, expected);
}

#[test]
fn exact_bytes_of_a_sample_frame() {
    let job = SampleJob {
        seq_id: 9,
        params: SamplingParams {
            temperature: 0.5,
            top_p: 0.25,
            top_k: 7,
            min_p: 0.125,
            repetition_penalty: 1.5,
            frequency_penalty: -1.0,
            presence_penalty: 2.0,
            // Not on the wire: the generator's state travels instead.
            seed: Some(3),
            top_logprobs: 5,
        },
        rng_state: 0xABCD,
        history: vec![4, 5],
        counts: vec![(6, 2)],
        mask: vec![0b1010],
        draft: vec![11],
        draft_masks: vec![vec![3]],
    };
    let bytes = Frame::Sample {
        batch_id: 1,
        jobs: vec![job.clone()],
    }
    .encode()
    .unwrap();
    #[rustfmt::skip]
    let expected: Vec<u8> = [
        &[110u8, 0, 0, 0, 7][..], // len = 1 + 8 + 4 + 65 + 2 * 4 + 1 * 8 + 1 * 4 + 1 * 4 + 8, kind 7
        &1u64.to_le_bytes(), &1u32.to_le_bytes(), // batch_id, n jobs
        &9u64.to_le_bytes(),                      // seq_id
        &0.5f32.to_le_bytes(), &0.25f32.to_le_bytes(), &7u32.to_le_bytes(), &0.125f32.to_le_bytes(),
        &1.5f32.to_le_bytes(), &(-1.0f32).to_le_bytes(), &2.0f32.to_le_bytes(),
        &[5],                                     // top_logprobs
        &0xABCDu64.to_le_bytes(),                 // rng_state
        &2u32.to_le_bytes(), &4u32.to_le_bytes(), &5u32.to_le_bytes(), // history
        &1u32.to_le_bytes(), &6u32.to_le_bytes(), &2u32.to_le_bytes(), // counts
        &1u32.to_le_bytes(), &0b1010u32.to_le_bytes(), // mask
        &1u32.to_le_bytes(), &11u32.to_le_bytes(),       // draft
        &1u32.to_le_bytes(), &1u32.to_le_bytes(), &3u32.to_le_bytes(), // draft masks
    ]
    .concat();
    assert_eq!(bytes, expected);
    let (decoded, used) = Frame::decode(&bytes, DEFAULT_MAX_FRAME_LEN)
        .unwrap()
        .unwrap();
    assert_eq!(used, bytes.len());
    let want = SampleJob {
        params: SamplingParams {
            seed: None,
            ..job.params
        },
        ..job
    };
    assert_eq!(
        decoded,
        Frame::Sample {
            batch_id: 1,
            jobs: vec![want]
        }
    );
}

#[test]
fn activations_encoded_straight_from_f32_equal_the_frame_encoding() {
    let mut rng = Rng::new(5);
    let values: Vec<f32> = (0..4 * 576).map(|_| rng.f32_in(-4.0, 4.0)).collect();
    for dtype in [DType::F32, DType::F16] {
        let direct = Activations::encode_f32(7, &chunks(), 576, &values, dtype).unwrap();
        let framed =
            Frame::Activations(Activations::from_f32(7, chunks(), 576, &values, dtype).unwrap())
                .encode()
                .unwrap();
        assert_eq!(direct, framed, "{dtype:?}");
        let empty = Activations::encode_f32(8, &[], 576, &[], dtype).unwrap();
        let framed = Frame::Activations(Activations::from_f32(8, vec![], 576, &[], dtype).unwrap())
            .encode()
            .unwrap();
        assert_eq!(empty, framed);
        // The same refusal for values that do not fill the shape.
        assert_eq!(
            Activations::encode_f32(7, &chunks(), 576, &values[1..], dtype),
            Activations::from_f32(7, chunks(), 576, &values[1..], dtype).map(|_| Vec::new())
        );
    }
    // Too large for a frame: refused, as the frame encoder refuses it.
    let big = vec![0f32; (DEFAULT_MAX_FRAME_LEN / 4) as usize];
    let one = [shoal_wire::ChunkHeader {
        seq_id: 1,
        start_pos: 0,
        len: 1,
        want_logits: false,
        pool: shoal_wire::Pool::None,
        drafted: 0,
    }];
    assert!(matches!(
        Activations::encode_f32(1, &one, big.len() as u32, &big, DType::F32),
        Err(WireError::FrameTooLarge { .. })
    ));
}

#[test]
fn activations_appended_after_another_frame_read_back_as_two_frames() {
    let mut rng = Rng::new(6);
    let values: Vec<f32> = (0..4 * 576).map(|_| rng.f32_in(-4.0, 4.0)).collect();
    let release = Frame::Release { seq_ids: vec![3] };
    let mut bytes = release.encode().unwrap();
    let head = bytes.clone();
    Activations::encode_f32_into(&mut bytes, 7, &chunks(), 576, &values, DType::F16).unwrap();
    let alone = Activations::encode_f32(7, &chunks(), 576, &values, DType::F16).unwrap();
    assert_eq!(bytes[head.len()..], alone[..]);
    let mut r = FrameReader::default();
    r.push(&bytes);
    assert_eq!(r.next_frame().unwrap(), Some(release));
    match r.next_frame().unwrap() {
        Some(Frame::Activations(a)) => assert_eq!((a.batch_id, a.shape), (7, [4, 576])),
        other => panic!("expected activations, got {other:?}"),
    }
    assert_eq!(r.next_frame().unwrap(), None);
    // A refused encoding leaves what was there.
    assert!(
        Activations::encode_f32_into(&mut bytes, 8, &chunks(), 576, &values[1..], DType::F16)
            .is_err()
    );
    assert_eq!(bytes.len(), head.len() + alone.len());
}

#[test]
fn f16_halves_the_payload_and_roundtrips_within_precision() {
    let mut rng = Rng::new(2);
    let cols = 576u32;
    let values: Vec<f32> = (0..4 * cols).map(|_| rng.f32_in(-4.0, 4.0)).collect();
    let f32_frame =
        Frame::Activations(Activations::from_f32(1, chunks(), cols, &values, DType::F32).unwrap());
    let f16_frame =
        Frame::Activations(Activations::from_f32(1, chunks(), cols, &values, DType::F16).unwrap());
    let (Frame::Activations(a32), Frame::Activations(a16)) = (&f32_frame, &f16_frame) else {
        unreachable!()
    };
    assert_eq!(a32.data.len(), values.len() * 4);
    assert_eq!(a16.data.len(), a32.data.len() / 2);
    let (b32, b16) = (f32_frame.encode().unwrap(), f16_frame.encode().unwrap());
    let header = b32.len() - a32.data.len();
    assert_eq!(b16.len(), header + a32.data.len() / 2);

    let (decoded, _) = Frame::decode(&b16, DEFAULT_MAX_FRAME_LEN).unwrap().unwrap();
    let Frame::Activations(d) = decoded else {
        panic!("wrong kind")
    };
    let back = d.to_f32().unwrap();
    assert_eq!(back.len(), values.len());
    for (x, y) in values.iter().zip(&back) {
        // f16 has an 11-bit significand: relative error ≤ 2^-11, plus subnormal slack near 0.
        assert!((x - y).abs() <= x.abs() * 4.9e-4 + 6e-8, "{x} vs {y}");
    }
    let (decoded32, _) = Frame::decode(&b32, DEFAULT_MAX_FRAME_LEN).unwrap().unwrap();
    let Frame::Activations(d32) = decoded32 else {
        panic!("wrong kind")
    };
    assert_eq!(d32.to_f32().unwrap(), values, "f32 is lossless");
    assert_eq!(
        decode_f16_to_f32(&encode_f32_as_f16(&values)).unwrap(),
        back
    );
}

#[test]
fn frames_split_at_every_byte_boundary_decode_the_same() {
    let mut rng = Rng::new(3);
    let frames = sample_frames(&mut rng);
    let mut stream = Vec::new();
    for f in &frames {
        stream.extend(f.encode().unwrap());
    }
    for split in 0..=stream.len() {
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        for part in [&stream[..split], &stream[split..]] {
            r.push(part);
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames, "split at {split}");
        assert_eq!(r.buffered(), 0);
    }
    // One byte at a time, and random chunk sizes.
    for seed in 0..20 {
        let mut rng = Rng::new(seed);
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        let mut rest = &stream[..];
        while !rest.is_empty() {
            let n = if seed == 0 {
                1
            } else {
                1 + rng.below(64) as usize
            };
            let (head, tail) = rest.split_at(n.min(rest.len()));
            r.push(head);
            rest = tail;
            while let Some(f) = r.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames, "seed {seed}");
    }
}

#[test]
fn reader_handles_many_frames_and_compacts() {
    let mut r = FrameReader::default();
    let ping = Frame::Ping { nonce: 1 }.encode().unwrap();
    for i in 0..50_000u64 {
        r.push(&Frame::Ping { nonce: i }.encode().unwrap());
        assert_eq!(r.next_frame().unwrap(), Some(Frame::Ping { nonce: i }));
    }
    r.push(&ping[..3]);
    assert_eq!(r.next_frame().unwrap(), None);
    assert_eq!(r.buffered(), 3);
}

fn stage() -> Role {
    Role::Stage {
        instance_id: 42,
        stage_index: 1,
        layer_start: 15,
        layer_end: 30,
    }
}

#[test]
fn handshake_roundtrips_with_documented_layout() {
    let hs = Handshake::new([1; 32], [2; 32], stage());
    let mut bytes = hs.encode();
    assert_eq!(bytes.len(), HANDSHAKE_HEADER_LEN + HANDSHAKE_V1_BODY_LEN);
    assert_eq!(bytes.len(), 91);
    assert_eq!(&bytes[..4], b"SHOL");
    assert_eq!(&bytes[4..8], &[7, 0, 83, 0]);
    assert_eq!(bytes[72], 1);
    assert_eq!(&bytes[73..81], &42u64.to_le_bytes());
    assert_eq!(&bytes[87..91], &30u32.to_le_bytes());
    assert_eq!(Handshake::wire_len(&bytes[..7]).unwrap(), None);
    assert_eq!(Handshake::wire_len(&bytes[..8]).unwrap(), Some(91));
    // The first frame may follow in the same read.
    bytes.extend(Frame::Ping { nonce: 5 }.encode().unwrap());
    let (back, used) = Handshake::decode(&bytes).unwrap();
    assert_eq!(back, hs);
    assert_eq!(used, 91);
    back.check_compatible(&hs).unwrap();

    let owner = Handshake::new([3; 32], [2; 32], Role::Owner { instance_id: 42 });
    let (back, _) = Handshake::decode(&owner.encode()).unwrap();
    assert_eq!(back, owner);
    assert_eq!(back.role.instance_id(), 42);
    back.check_compatible(&hs).unwrap();

    // A group member: its rank and the rank it opens to ride in the layer fields.
    let member = Role::Member {
        instance_id: 42,
        stage_index: 0,
        rank: 1,
        to: 2,
    };
    let bytes = Handshake::new([4; 32], [2; 32], member).encode();
    assert_eq!(bytes[72], 3);
    assert_eq!(&bytes[83..87], &1u32.to_le_bytes());
    assert_eq!(&bytes[87..91], &2u32.to_le_bytes());
    assert_eq!(Handshake::decode(&bytes).unwrap().0.role, member);
    // A rank does not open to itself.
    let mut to_self = bytes.clone();
    to_self[87..91].copy_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        Handshake::decode(&to_self).unwrap_err(),
        WireError::SelfLink { rank: 1 }
    );
}

#[test]
fn inputs_whose_chunks_do_not_cover_the_tokens_are_refused_both_ways() {
    let short = Frame::Inputs(Inputs {
        batch_id: 1,
        chunks: chunks(),
        tokens: vec![1, 2, 3],
    });
    assert!(matches!(
        short.encode().unwrap_err(),
        WireError::ShapeMismatch {
            rows: 3,
            chunk_rows: 4
        }
    ));
    // Written by hand (as a hostile peer would): the decoder refuses it too.
    let good = Frame::Inputs(Inputs {
        batch_id: 1,
        chunks: chunks(),
        tokens: vec![1, 2, 3, 4],
    })
    .encode()
    .unwrap();
    let mut bad = good[..good.len() - 4].to_vec();
    let n = bad.len() - 4 * 3 - 4;
    bad[n..n + 4].copy_from_slice(&3u32.to_le_bytes());
    let len = (bad.len() - 4) as u32;
    bad[..4].copy_from_slice(&len.to_le_bytes());
    assert!(matches!(
        Frame::decode(&bad, DEFAULT_MAX_FRAME_LEN).unwrap_err(),
        WireError::ShapeMismatch {
            rows: 3,
            chunk_rows: 4
        }
    ));
}

#[test]
fn handshake_version_mismatch_names_both_versions() {
    let ours = Handshake::new([1; 32], [2; 32], stage());
    let mut theirs = ours;
    // A node of the previous version (before chunk headers carried their drafted count) is
    // refused, naming both.
    assert_eq!(WIRE_VERSION, 7);
    theirs.version = 6;
    let err = theirs.check_compatible(&ours).unwrap_err();
    assert_eq!(err, WireError::VersionMismatch { ours: 7, theirs: 6 });
    let msg = err.to_string();
    assert!(msg.contains("v6") && msg.contains("v7"), "{msg}");

    // On the wire: rejected before the body is interpreted, even with a foreign body length.
    let mut bytes = theirs.encode();
    bytes[6] = 200;
    assert_eq!(Handshake::decode(&bytes).unwrap_err(), err);
    assert_eq!(Handshake::wire_len(&bytes).unwrap(), Some(208));
}

#[test]
fn handshake_cluster_mismatch_and_bad_magic() {
    let ours = Handshake::new([1; 32], [2; 32], stage());
    let theirs = Handshake::new([9; 32], [3; 32], stage());
    assert_eq!(
        theirs.check_compatible(&ours),
        Err(WireError::ClusterMismatch)
    );
    let mut bytes = ours.encode();
    bytes[..4].copy_from_slice(b"HTTP");
    let bad = WireError::BadMagic { found: *b"HTTP" };
    assert_eq!(Handshake::decode(&bytes).unwrap_err(), bad);
    assert_eq!(Handshake::wire_len(&bytes[..4]).unwrap_err(), bad);
}
