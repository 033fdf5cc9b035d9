//! Damaged and hostile GGUF files: every one is a clear error from `GgufFile::open` (or `read_raw`), never a
//! panic or an allocation the size of a declared length. The files are built here by a tiny writer
//! (`gguf_writer`) and then corrupted field by field.

use crate::gguf_writer::{
    self, Built, IQ4_XS, MXFP4, T_ARRAY, T_U8, TQ2_0, TempDir, tensor, tiny, v_array, v_u32,
};
use shoal_model::ModelError;
use shoal_model::gguf::GgufFile;
use shoal_testkit::rng::{Draw, SplitMix64};

/// Writes `bytes` to a temp file and opens it.
fn open(bytes: &[u8]) -> Result<GgufFile, ModelError> {
    let dir = TempDir::new();
    let path = dir.write("m.gguf", bytes);
    GgufFile::open(&path)
}

/// The message of the `InvalidGguf` error opening `bytes` gives; fails the test on anything else.
fn invalid(bytes: &[u8]) -> String {
    match open(bytes) {
        Err(ModelError::InvalidGguf { path, message }) => {
            assert!(path.ends_with("m.gguf"), "error names the file: {path}");
            message
        }
        Err(other) => panic!("expected InvalidGguf, got {other:?}"),
        Ok(_) => panic!("a corrupt file opened"),
    }
}

fn assert_has(message: &str, parts: &[&str]) {
    for p in parts {
        assert!(
            message.contains(p),
            "message {message:?} should contain {p:?}"
        );
    }
}

#[test]
fn the_tiny_file_reads_back_what_was_written() {
    let built = tiny().build();
    let mut g = open(&built.bytes).expect("valid file opens");
    assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(g.get_u32("general.alignment").unwrap(), 32);
    let tokens = g.value("tokenizer.ggml.tokens").unwrap().to_vec().unwrap();
    let tokens: Vec<&str> = tokens
        .iter()
        .map(|t| t.to_string().unwrap().as_str())
        .collect();
    assert_eq!(tokens, ["<s>", "a", "b"]);
    assert!(g.value("shoal.test.flag").unwrap().to_bool().unwrap());
    let nested = g.value("shoal.test.nested").unwrap().to_vec().unwrap();
    assert_eq!(nested.len(), 2);
    assert_eq!(nested[0].to_vec().unwrap()[1].to_u8().unwrap(), 2);
    let mut names: Vec<&str> = g.tensor_names().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "blk.0.attn_q.weight",
            "output_norm.weight",
            "token_embd.weight"
        ]
    );
    assert_eq!(g.tensor_bytes("blk.0.attn_q.weight"), Some(68));
    assert_eq!(g.content().tensor_data_offset, built.data_start as u64);
    let q = g.read_raw("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dims, [2, 32]);
    assert_eq!(q.data, (0..68).map(|i| i as u8).collect::<Vec<_>>());
    let e = g.read_raw("token_embd.weight").unwrap();
    assert_eq!(e.dims, [3, 8]);
    assert_eq!(
        g.read_f32_vec("output_norm.weight").unwrap(),
        [1., 2., 3., 4., 5., 6., 7., 8.]
    );
    assert!(matches!(
        g.read_raw("nope"),
        Err(ModelError::MissingTensor { .. })
    ));
}

#[test]
fn a_file_cut_anywhere_is_an_error() {
    let built = tiny().build();
    let len = built.bytes.len();
    for cut in 0..len {
        let m = invalid(&built.bytes[..cut]);
        if cut < built.data_start {
            assert!(
                ["truncated?", "run past the end", "bytes left in the file"]
                    .iter()
                    .any(|p| m.contains(p)),
                "cut at {cut}: {m}"
            );
        } else {
            assert_has(&m, &["run past the end of the file"]);
        }
    }
}

#[test]
fn wrong_magic_and_versions_are_named() {
    let built = tiny().build();
    let mut b = built.bytes.clone();
    b[..4].copy_from_slice(b"GGML");
    assert_has(&invalid(&b), &["not a GGUF file"]);
    b[..4].copy_from_slice(b"FUGG");
    assert_has(&invalid(&b), &["big-endian"]);
    for v in [1u32, 99, 0] {
        let mut g = tiny();
        g.version = v;
        assert_has(
            &invalid(&g.build().bytes),
            &[&format!("GGUF version {v} is not supported")],
        );
    }
    let mut g = tiny();
    g.version = 2;
    assert!(open(&g.build().bytes).is_ok(), "version 2 is read");
}

#[test]
fn huge_string_lengths_are_refused_before_allocating() {
    for len in [1u64 << 60, u64::MAX, 1 << 20] {
        let mut built = tiny().build();
        let at = built.value_at["general.architecture"];
        built.put_u64(at, len);
        assert_has(
            &invalid(&built.bytes),
            &[
                "metadata 'general.architecture'",
                &format!("a string of {len} bytes"),
            ],
        );
    }
    // A key's length, too.
    let mut built = tiny().build();
    built.put_u64(24, 1 << 62);
    assert_has(&invalid(&built.bytes), &["the key of metadata entry 0"]);
}

#[test]
fn huge_array_lengths_are_refused_before_allocating() {
    for len in [1u64 << 60, u64::MAX, 1000] {
        let mut built = tiny().build();
        let at = built.value_at["tokenizer.ggml.tokens"] + 4;
        built.put_u64(at, len);
        assert_has(
            &invalid(&built.bytes),
            &[
                "metadata 'tokenizer.ggml.tokens'",
                &format!("declares {len} String elements"),
            ],
        );
    }
    let mut built = tiny().build();
    let at = built.value_at["tokenizer.ggml.scores"] + 4;
    built.put_u64(at, u64::MAX / 2);
    assert_has(
        &invalid(&built.bytes),
        &["tokenizer.ggml.scores", "F32 elements"],
    );
}

#[test]
fn huge_tensor_and_metadata_counts_are_refused() {
    for (at, n) in [
        (8, 1u64 << 40),
        (8, u64::MAX),
        (16, 1 << 40),
        (16, u64::MAX),
    ] {
        let mut built = tiny().build();
        built.put_u64(at, n);
        assert_has(
            &invalid(&built.bytes),
            &["the header declares", &n.to_string()],
        );
    }
    // Slightly too many tensors: the directory runs into the data and fails on a field.
    let mut built = tiny().build();
    built.put_u64(8, 4);
    invalid(&built.bytes);
}

#[test]
fn dimension_counts_outside_1_to_4_are_refused() {
    for dims in [vec![], vec![1u64; 9], vec![1u64; 5]] {
        let mut g = tiny();
        g.tensors[2].dims = dims.clone();
        let m = invalid(&g.build().bytes);
        assert_has(
            &m,
            &[&format!(
                "tensor output_norm.weight has {} dimensions (1 to 4 allowed)",
                dims.len()
            )],
        );
    }
}

#[test]
fn zero_and_overflowing_dims_are_refused() {
    let mut g = tiny();
    g.tensors[0].dims = vec![8, 0];
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor token_embd.weight", "include a zero"],
    );
    for dims in [
        vec![1u64 << 32, 1 << 32, 2],
        vec![u64::MAX, 2],
        vec![1 << 51],
    ] {
        let mut g = tiny();
        g.tensors[0].dims = dims;
        assert_has(
            &invalid(&g.build().bytes),
            &["tensor token_embd.weight", "more than 2^50 elements"],
        );
    }
    // Within the element bound but far larger than the file.
    let mut g = tiny();
    g.tensors[0].dims = vec![1 << 20, 1 << 20];
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor token_embd.weight", "run past the end"],
    );
}

#[test]
fn unknown_and_unloadable_tensor_types_are_named() {
    let mut g = tiny();
    g.tensors[1].type_id = 99;
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor blk.0.attn_q.weight", "unknown ggml type id 99"],
    );
    let mut g = tiny();
    g.tensors.push(tensor(
        "blk.0.ffn_up.weight",
        &[256, 2],
        TQ2_0,
        vec![0; 132],
    ));
    match open(&g.build().bytes) {
        Err(e @ ModelError::UnsupportedTensorType { .. }) => {
            let ModelError::UnsupportedTensorType { name, dtype } = &e else {
                unreachable!()
            };
            assert_eq!(name, "blk.0.ffn_up.weight");
            assert_eq!(dtype, "TQ2_0 (id 35)");
            assert_has(&e.to_string(), &["blk.0.ffn_up.weight", "TQ2_0 (id 35)"]);
        }
        other => panic!("expected UnsupportedTensorType, got {:?}", other.err()),
    }
    // A type ggml has removed is named too.
    let mut g = tiny();
    g.tensors[1].type_id = 4;
    assert!(matches!(
        open(&g.build().bytes),
        Err(ModelError::UnsupportedTensorType { dtype, .. }) if dtype == "Q4_2 (id 4)"
    ));
}

/// The IQ formats and MXFP4, which candle lacks, load with their kernel formats and sizes.
#[test]
fn iq_and_mxfp4_tensors_load() {
    use shoal_kernels::{PackedMatrix, QType};
    let mut g = tiny();
    let iq: Vec<u8> = (0..272u32).map(|i| (i * 7 % 251) as u8).collect();
    let mx: Vec<u8> = (0..17 * 16u32).map(|i| (i * 5 % 247) as u8).collect();
    g.tensors
        .push(tensor("blk.0.ffn_up.weight", &[256, 2], IQ4_XS, iq.clone()));
    g.tensors
        .push(tensor("blk.0.ffn_down.weight", &[64, 8], MXFP4, mx.clone()));
    let mut f = open(&g.build().bytes).expect("IQ4_XS and MXFP4 load");
    assert_eq!(f.tensor_bytes("blk.0.ffn_up.weight"), Some(272));
    assert_eq!(f.tensor_bytes("blk.0.ffn_down.weight"), Some(272));
    for (name, qtype, data, dims) in [
        ("blk.0.ffn_up.weight", QType::IQ4_XS, &iq, [2, 256]),
        ("blk.0.ffn_down.weight", QType::MXFP4, &mx, [8, 64]),
    ] {
        let raw = f.read_raw(name).expect("read");
        assert_eq!(
            (raw.ty.name, &raw.data, raw.dims.as_slice()),
            (qtype.name(), data, &dims[..])
        );
        let q = shoal_model::linear::kernel_qtype(name, raw.ty).expect("a kernel format");
        assert_eq!(q, qtype);
        let m = PackedMatrix::from_rows(q, dims[0], dims[1], raw.data).expect("a matrix");
        let mut row = vec![0f32; dims[1]];
        m.dequantize_row(1, &mut row).expect("row");
        assert!(row.iter().any(|v| *v != 0.0), "{name} decodes to zeros");
    }
    // Candle's directory lists only the types candle knows; shoal's lists every tensor.
    assert!(!f.content().tensor_infos.contains_key("blk.0.ffn_up.weight"));
    assert_eq!(f.tensors().len(), f.content().tensor_infos.len() + 2);
}

#[test]
fn rows_must_be_whole_blocks() {
    let mut g = tiny();
    g.tensors[1].dims = vec![16, 4];
    assert_has(
        &invalid(&g.build().bytes),
        &["blk.0.attn_q.weight", "not whole Q8_0 blocks of 32"],
    );
}

#[test]
fn misaligned_and_out_of_file_offsets_are_refused() {
    let mut g = tiny();
    g.tensors[1].offset = Some(100);
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor blk.0.attn_q.weight: data offset 100 is not a multiple of the alignment 32"],
    );
    let len = tiny().build().bytes.len() as u64;
    for offset in [len.next_multiple_of(32), 1 << 40, u64::MAX - 31] {
        let mut g = tiny();
        g.tensors[0].offset = Some(offset);
        assert_has(
            &invalid(&g.build().bytes),
            &["tensor token_embd.weight", "run past the end of the file"],
        );
    }
    // In-bounds start, but the bytes run out: the last tensor claims a larger shape.
    let mut g = tiny();
    g.tensors[2].dims = vec![16];
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor output_norm.weight: its 64 bytes"],
    );
}

#[test]
fn alignment_must_be_a_power_of_two_and_is_honoured() {
    for bad in [0u32, 3, 48] {
        let mut g = tiny();
        g.metadata[1].1 = v_u32(bad);
        assert_has(
            &invalid(&g.build().bytes),
            &["general.alignment", "not a power of two"],
        );
    }
    let mut g = tiny();
    g.metadata[1].1 = gguf_writer::v_str("32");
    assert_has(
        &invalid(&g.build().bytes),
        &["general.alignment must be an integer"],
    );
    // A 64-byte alignment: tensors at multiples of 64 open, 32 is misaligned.
    let mut g = tiny();
    g.metadata[1].1 = v_u32(64);
    g.alignment = 64;
    let mut f = open(&g.build().bytes).expect("64-aligned file opens");
    assert_eq!(f.read_f32_vec("output_norm.weight").unwrap()[7], 8.0);
    g.tensors[1].offset = Some(32);
    assert_has(
        &invalid(&g.build().bytes),
        &["not a multiple of the alignment 64"],
    );
}

#[test]
fn duplicate_tensor_names_and_metadata_keys_are_refused() {
    let mut g = tiny();
    g.tensors[2].name = "token_embd.weight".into();
    g.tensors[2].dims = vec![8, 3];
    g.tensors[2].data = vec![0; 96];
    assert_has(
        &invalid(&g.build().bytes),
        &["tensor token_embd.weight appears twice"],
    );
    let mut g = tiny();
    g.metadata[2].0 = "general.architecture".into();
    assert_has(
        &invalid(&g.build().bytes),
        &["metadata key 'general.architecture' appears twice"],
    );
}

#[test]
fn bad_metadata_values_are_named() {
    // Unknown value type.
    let mut built = tiny().build();
    let at = built.value_at["general.name"] - 4;
    built.put_u32(at, 13);
    assert_has(
        &invalid(&built.bytes),
        &["metadata 'general.name' has unknown value type 13"],
    );
    // Unknown array element type.
    let mut built = tiny().build();
    let at = built.value_at["tokenizer.ggml.scores"];
    built.put_u32(at, 77);
    assert_has(
        &invalid(&built.bytes),
        &["the element type of metadata 'tokenizer.ggml.scores'", "77"],
    );
    // A bool that is neither 0 nor 1.
    let mut g = tiny();
    g.metadata[5].1 = gguf_writer::v_bool(2);
    assert_has(
        &invalid(&g.build().bytes),
        &["metadata 'shoal.test.flag' is a bool stored as 2"],
    );
    // Invalid UTF-8 in a value and in a tensor name.
    let mut g = tiny();
    g.metadata[2].1 = [
        8u32.to_le_bytes().to_vec(),
        gguf_writer::string(&[b't', 0xff, b'x']),
    ]
    .concat();
    assert_has(
        &invalid(&g.build().bytes),
        &["metadata 'general.name' is not valid UTF-8 (bad byte at 1)"],
    );
    let mut g = tiny();
    g.tensors[0].name = "emb".into();
    let mut built = g.build();
    let name_at = built.bytes.windows(3).position(|w| w == b"emb").unwrap();
    built.bytes[name_at + 1] = 0xc3;
    assert_has(
        &invalid(&built.bytes),
        &["the name of tensor 0 is not valid UTF-8"],
    );
}

#[test]
fn deeply_nested_arrays_are_refused() {
    // 8 levels of arrays (the limit) open; 9 do not.
    let nest = |levels: usize| {
        let mut v = v_array(T_U8, &[vec![7]]);
        for _ in 1..levels {
            v = v_array(T_ARRAY, &[v[4..].to_vec()]);
        }
        v
    };
    let mut g = tiny();
    g.metadata.push(("deep".into(), nest(8)));
    assert!(open(&g.build().bytes).is_ok(), "8 levels");
    let mut g = tiny();
    g.metadata.push(("deep".into(), nest(9)));
    assert_has(
        &invalid(&g.build().bytes),
        &["nests arrays more than 8 deep"],
    );
}

#[test]
fn read_raw_refuses_a_tensor_the_file_no_longer_holds() {
    let built = tiny().build();
    let dir = TempDir::new();
    let path = dir.write("m.gguf", &built.bytes);
    let mut g = GgufFile::open(&path).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(built.data_start as u64 + 100).unwrap();
    assert!(
        g.read_raw("token_embd.weight").is_ok(),
        "still inside the file"
    );
    match g.read_raw("output_norm.weight") {
        Err(ModelError::InvalidGguf { message, .. }) => assert_has(
            &message,
            &[
                "tensor output_norm.weight",
                "has it shrunk since it was opened?",
            ],
        ),
        other => panic!("expected InvalidGguf, got {:?}", other.map(|t| t.dims)),
    }
}

/// Random byte flips all over a valid file: opening either fails with an error or succeeds, and then every
/// tensor reads; never a panic. (A regression net for checks the targeted tests above miss.)
#[test]
fn random_corruption_never_panics() {
    let built: Built = tiny().build();
    let mut rng = SplitMix64::new(12);
    let dir = TempDir::new();
    let path = dir.path().join("m.gguf");
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..2000 {
        let mut b = built.bytes.clone();
        for _ in 0..rng.range(1, 4) {
            let at = rng.below(built.data_start as u64) as usize;
            b[at] = if rng.chance(50) {
                rng.next_u64() as u8
            } else {
                0xff
            };
        }
        std::fs::write(&path, &b).unwrap();
        match GgufFile::open(&path) {
            Ok(mut g) => {
                opened += 1;
                let names: Vec<String> = g.tensor_names().map(String::from).collect();
                for n in names {
                    g.read_raw(&n)
                        .expect("a tensor of a file that opened reads");
                }
            }
            Err(_) => refused += 1,
        }
    }
    assert!(
        refused > 500 && opened > 10,
        "opened {opened}, refused {refused}"
    );
}
