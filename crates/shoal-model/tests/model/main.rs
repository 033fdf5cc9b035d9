//! shoal-model's integration tests, one test binary: each file directly under `tests/` would be a binary
//! of its own (~70 MB each, the whole dependency tree statically linked), so the test files are modules
//! here, beside the helpers they share (`common`: decoding and golden comparisons; `gguf_writer`: tiny GGUF
//! files; `tokenizer_common`: vocabulary checks). Their data stays in `tests/fixtures` and
//! `tests/templates`, found through `CARGO_MANIFEST_DIR`.

mod common;
mod gguf_writer;
mod tokenizer_common;

mod chat_families;
mod chat_golden;
mod chat_tools;
mod decoder_stages;
mod footprint;
mod gemma3;
mod gguf_corrupt;
mod gguf_real;
mod gpu_iq;
mod gpu_moe;
mod gpu_stage;
mod kv_reuse;
mod model_load_errors;
mod moe;
mod mtp;
mod split;
mod split_moe;
mod stage_ranges;
mod synthetic;
mod tokenizer_gemma;
mod tokenizer_golden;
mod tokenizer_llama_vocabs;
mod tokenizer_pretok;
