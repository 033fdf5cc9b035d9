//! The GGUF reader on a hostile file, and everything that reads what it returns.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::Arc;

use shoal_kernels::ThreadPool;
use shoal_model::chat::ChatTemplate;
use shoal_model::decoder::{Pool, SeqChunk, StageInput};
use shoal_model::gguf::GgufFile;
use shoal_model::tokenizer::Tokenizer;
use shoal_model::{DecoderStage, Footprint, LayerRange, ModelConfig, stage_byte_ranges};

thread_local! {
    /// One scratch file per thread, rewritten for every input (the reader works on files).
    static SCRATCH: RefCell<Option<(tempfile::TempDir, PathBuf)>> = const { RefCell::new(None) };
}

/// Writes the input as a GGUF file and opens it. A file the reader accepts then goes through what a
/// node does with a model: its configuration, footprint, tokenizer, chat template, every tensor's bytes,
/// the byte ranges of its stages, and — when it loads as a whole stage — one token through it. Every
/// failure must be an error, never a panic or an allocation the file's size does not back.
pub fn gguf(data: &[u8]) {
    SCRATCH.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (_, path) = cell.get_or_insert_with(|| {
            let dir = tempfile::tempdir().expect("a scratch folder");
            let path = dir.path().join("fuzz.gguf");
            (dir, path)
        });
        std::fs::write(&*path, data).expect("the scratch file is written");
        check(path);
    });
}

fn check(path: &std::path::Path) {
    let Ok(mut file) = GgufFile::open(path) else {
        return;
    };
    let names: Vec<String> = file.tensor_names().map(String::from).collect();
    for name in &names {
        if let Ok(raw) = file.read_raw(name) {
            let declared = file.tensor_bytes(name).expect("a listed tensor has a size");
            assert_eq!(
                raw.data.len() as u64,
                declared,
                "{name}: read what the directory says"
            );
        }
    }
    let _ = Tokenizer::from_gguf(file.content());
    let _ = ChatTemplate::from_gguf(file.content());
    let _ = Footprint::from_gguf(&file);
    let Ok(config) = ModelConfig::from_gguf(&file) else {
        return;
    };
    let n = config.n_layers;
    if n == 0 || n > 64 {
        return;
    }
    let _ = stage_byte_ranges(&file, 0, n, n);
    let _ = stage_byte_ranges(&file, n / 2, n, n);
    let pool = Arc::new(ThreadPool::new(1));
    let Ok(stage) = DecoderStage::load(&mut file, LayerRange::full(n), &pool) else {
        return;
    };
    let mut kv = stage.new_kv_cache();
    let token = [0u32];
    let mut seqs = [SeqChunk {
        kv: &mut kv,
        len: 1,
        want_logits: true,
        pool: Pool::None,
    }];
    let _ = stage.run(StageInput::Tokens(&token), &mut seqs);
}
