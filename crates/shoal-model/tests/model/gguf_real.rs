//! The real model files (`SHOAL_TEST_MODEL`, `SHOAL_GEMMA_MODEL`) through our GGUF reader: SmolLM2 (Q4_1)
//! and Gemma 3 270M (Q4_K_M, a 262k-token vocabulary) give the same metadata and tensor directory as
//! candle's own reader, and SmolLM2 cut short at many points in its header and its tensor data is an error
//! every time.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::gguf_writer::TempDir;
use candle_core::quantized::gguf_file::Content;
use shoal_model::ModelError;
use shoal_model::gguf::GgufFile;
use shoal_testkit::fixtures::{gemma_path, model_path};

fn assert_same_as_candle(path: &Path) {
    let ours = GgufFile::open(path).expect("our reader opens it");
    let theirs = Content::read(&mut File::open(path).unwrap()).expect("candle reads it");
    let ours = ours.content();
    assert_eq!(format!("{:?}", ours.magic), format!("{:?}", theirs.magic));
    assert_eq!(ours.tensor_data_offset, theirs.tensor_data_offset);
    let keys = |c: &Content| c.metadata.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(keys(ours), keys(&theirs));
    for (k, v) in &theirs.metadata {
        // `Value` has no PartialEq; Debug prints every element (and NaN the same way on both sides).
        assert_eq!(
            format!("{:?}", ours.metadata[k]),
            format!("{v:?}"),
            "metadata {k}"
        );
    }
    let names = |c: &Content| c.tensor_infos.keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!(names(ours), names(&theirs));
    for (n, t) in &theirs.tensor_infos {
        let o = &ours.tensor_infos[n];
        assert_eq!(
            (o.ggml_dtype, o.shape.dims(), o.offset),
            (t.ggml_dtype, t.shape.dims(), t.offset),
            "tensor {n}"
        );
    }
}

#[test]
fn smollm2_reads_as_candle_reads_it() {
    assert_same_as_candle(&model_path());
}

#[test]
fn gemma3_reads_as_candle_reads_it() {
    let path = gemma_path();
    assert_same_as_candle(&path);
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.get_str("general.architecture").unwrap(), "gemma3");
    let tokens = g.value("tokenizer.ggml.tokens").unwrap().to_vec().unwrap();
    assert_eq!(tokens.len(), 262_144);
}

#[test]
fn smollm2_cut_short_anywhere_is_an_error() {
    let path = model_path();
    let g = GgufFile::open(&path).unwrap();
    let data_start = g.content().tensor_data_offset;
    let data_end = g
        .tensor_names()
        .map(|n| data_start + g.content().tensor_infos[n].offset + g.tensor_bytes(n).unwrap())
        .max()
        .unwrap();
    let mut header = vec![0u8; data_start as usize];
    File::open(&path).unwrap().read_exact(&mut header).unwrap();
    let dir = TempDir::new();
    // 64 cuts through the header (vocabulary, merges, tensor directory) and 16 through the tensor data; a cut
    // in the data is made by extending the header with zeros (a sparse file), as only the size matters there.
    let header_cuts = (0..64).map(|i| data_start * i / 64 + i);
    let data_cuts = (0..16).map(|i| data_start + (data_end - data_start) * i / 16 + 1);
    for cut in header_cuts.chain(data_cuts).chain([data_end - 1]) {
        let p = dir.path().join("cut.gguf");
        let keep = cut.min(data_start) as usize;
        std::fs::write(&p, &header[..keep]).unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(cut)
            .unwrap();
        match GgufFile::open(&p) {
            Err(ModelError::InvalidGguf { message, .. }) => assert!(
                ["truncated?", "run past the end", "bytes left in the file"]
                    .iter()
                    .any(|p| message.contains(p)),
                "cut at {cut}: {message}"
            ),
            Err(e) => panic!("cut at {cut}: expected InvalidGguf, got {e:?}"),
            Ok(_) => panic!("a copy cut at {cut} of {data_end} bytes opened"),
        }
    }
}
