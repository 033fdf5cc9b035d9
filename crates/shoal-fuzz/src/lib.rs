//! shoal-fuzz: the bodies of shoal's fuzz targets, one function per target, each taking the fuzzer's
//! bytes and panicking only on a real defect (a panic inside shoal, or a broken property such as a
//! decoded frame that does not encode back to the same bytes).
//!
//! Two callers share them, so a target is written once:
//! - `fuzz/` at the repository root, the cargo-fuzz harness (nightly, libFuzzer): `scripts/fuzz` runs each
//!   target for a set time, minimises the corpus into `fuzz/corpus/<target>/`, and a crash found is fixed
//!   and kept under `fuzz/artifacts/<target>/`;
//! - this crate's `tests/replay.rs` (stable, in the test command), which runs every committed corpus and
//!   crash input through the same function.
//!
//! The targets, by what they attack:
//! - [`wire::frame`], [`wire::handshake`]: the data plane's frame reader (bytes pushed in fuzzer-chosen
//!   pieces) and handshake decoder;
//! - [`gguf::gguf`]: the GGUF reader on a hostile file, then what reads its metadata (the model's
//!   configuration, footprint, tokenizer and chat template) and every tensor's bytes;
//! - [`text::tokenizer`]: encode / decode of arbitrary text with every synthetic family's real vocabulary;
//! - [`text::chat_template`]: every family's real chat template rendering hostile messages and tool calls;
//! - [`invite::invite`]: invite tokens and the enrolment request and reply parsers, against a real invite book;
//! - [`api::api`]: any body posted to every JSON route of the three APIs through the real router and a
//!   real engine on a tiny synthetic model — the answer is never a 5xx and an error is in the API's own shape.
//!
//! Targets that need fixtures (vocabularies, templates, a model) load them once per process.

pub mod api;
pub mod gguf;
pub mod invite;
pub mod seeds;
pub mod text;
pub mod wire;

use std::path::PathBuf;

/// The names of the targets, as `fuzz/fuzz_targets/<name>.rs` and the corpus folders spell them.
pub const TARGETS: &[&str] = &[
    "frame",
    "handshake",
    "gguf",
    "tokenizer",
    "chat_template",
    "invite",
    "api",
];

/// Runs target `name` on `data`; `false` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "frame" => wire::frame(data),
        "handshake" => wire::handshake(data),
        "gguf" => gguf::gguf(data),
        "tokenizer" => text::tokenizer(data),
        "chat_template" => text::chat_template(data),
        "invite" => invite::invite(data),
        "api" => api::api(data),
        _ => return false,
    }
    true
}

/// The synthetic model fixtures (crates/shoal-model/tests/fixtures/synth).
pub fn synth_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shoal-model/tests/fixtures/synth")
}

/// The small synthetic models of every family (tier `s`, F16), whose vocabularies and templates the text
/// targets use.
pub fn synth_models() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(synth_dir())
        .unwrap_or_else(|e| panic!("{}: {e}", synth_dir().display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with("-s-f16.gguf"))
        })
        .collect();
    paths.sort();
    assert!(
        !paths.is_empty(),
        "no synthetic models in {}",
        synth_dir().display()
    );
    paths
}

/// The fuzzer's bytes cut into pieces: each piece is announced by one byte giving its length (0..=255), so
/// a mutation that changes one length byte moves every later boundary. What is left at the end is the
/// last piece.
pub fn pieces(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let n = (len as usize).min(tail.len());
        out.push(&tail[..n]);
        rest = &tail[n..];
    }
    out
}
