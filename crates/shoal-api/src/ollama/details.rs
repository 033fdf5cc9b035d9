//! What Ollama clients are told about a model file: [`GgufFacts`] read from its GGUF header (no tensor
//! data is read) → `details` (`family`, `parameter_size`, `quantization_level`), `model_info` (every
//! metadata key as JSON, the tokenizer's long arrays left empty unless `verbose`) and the chat template.
//!
//! `parameter_size` counts the elements of every tensor (`general.parameter_count` when the file does not
//! say) and is written the way Ollama writes it (`134.52M`, `8.0B`); `quantization_level` is the name of
//! `general.file_type` (llama.cpp's file types).

use std::path::Path;

use candle_core::quantized::gguf_file::Value as GgufValue;
use serde_json::{Map, Number, Value};
use shoal_model::ModelError;
use shoal_model::gguf::GgufFile;

use super::types::ModelDetails;

/// Arrays longer than this are sent empty in `model_info` unless `verbose` (the tokenizer's tokens,
/// merges, scores and types would make an answer of megabytes).
const SHORT_ARRAY: usize = 16;

/// The metadata key holding the chat template (sent as `template`, not in `model_info`).
const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// What a GGUF header says about a model.
#[derive(Debug, Clone, Default)]
pub struct GgufFacts {
    /// `general.architecture` (`llama`, `gemma3`, …).
    pub arch: String,
    /// Elements of all tensors.
    pub parameter_count: u64,
    /// `general.file_type`, when set.
    pub file_type: Option<u32>,
    /// `tokenizer.chat_template` (Jinja), empty when the model has none.
    pub template: String,
    /// Every metadata key but the template, as JSON.
    pub model_info: Map<String, Value>,
}

impl GgufFacts {
    /// Reads the header of `path`; with `verbose` the long arrays are kept in full.
    pub fn read(path: &Path, verbose: bool) -> Result<Self, ModelError> {
        let gguf = GgufFile::open(path)?;
        let content = gguf.content();
        // Every tensor of the file, those of types candle does not know (IQ, MXFP4) included.
        let parameter_count = gguf
            .tensors()
            .values()
            .map(|t| {
                t.dims
                    .iter()
                    .map(|&d| d as u64)
                    .fold(1u64, u64::saturating_mul)
            })
            .fold(0u64, u64::saturating_add);
        let mut model_info = Map::new();
        let mut keys: Vec<&String> = content.metadata.keys().collect();
        keys.sort();
        for key in keys {
            if key == TEMPLATE_KEY {
                continue;
            }
            if let Some(value) = content.metadata.get(key) {
                model_info.insert(key.clone(), to_json(value, verbose));
            }
        }
        model_info
            .entry("general.parameter_count")
            .or_insert_with(|| Value::from(parameter_count));
        let text = |key: &str| match content.metadata.get(key) {
            Some(GgufValue::String(s)) => s.clone(),
            _ => String::new(),
        };
        Ok(GgufFacts {
            arch: text("general.architecture"),
            parameter_count,
            file_type: gguf.get_u32("general.file_type").ok(),
            template: text(TEMPLATE_KEY),
            model_info,
        })
    }

    /// Ollama's `details` of this file.
    pub fn details(&self) -> ModelDetails {
        ModelDetails {
            parent_model: String::new(),
            format: "gguf".into(),
            family: self.arch.clone(),
            families: (!self.arch.is_empty()).then(|| vec![self.arch.clone()]),
            parameter_size: human_number(self.parameter_count),
            quantization_level: self
                .file_type
                .and_then(file_type_name)
                .unwrap_or_default()
                .to_string(),
        }
    }

    /// `<arch>.context_length`, when the file says.
    pub fn context_length(&self) -> Option<u64> {
        self.model_info
            .get(&format!("{}.context_length", self.arch))
            .and_then(Value::as_u64)
    }
}

/// A metadata value as JSON; floats keep their shortest decimal form (`1e-5`, not `9.99999974e-6`).
fn to_json(value: &GgufValue, verbose: bool) -> Value {
    match value {
        GgufValue::U8(x) => Value::from(*x),
        GgufValue::I8(x) => Value::from(*x),
        GgufValue::U16(x) => Value::from(*x),
        GgufValue::I16(x) => Value::from(*x),
        GgufValue::U32(x) => Value::from(*x),
        GgufValue::I32(x) => Value::from(*x),
        GgufValue::U64(x) => Value::from(*x),
        GgufValue::I64(x) => Value::from(*x),
        GgufValue::F32(x) => x
            .to_string()
            .parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map_or(Value::Null, Value::Number),
        GgufValue::F64(x) => Number::from_f64(*x).map_or(Value::Null, Value::Number),
        GgufValue::Bool(x) => Value::Bool(*x),
        GgufValue::String(s) => Value::String(s.clone()),
        GgufValue::Array(items) if !verbose && items.len() > SHORT_ARRAY => {
            Value::Array(Vec::new())
        }
        GgufValue::Array(items) => {
            Value::Array(items.iter().map(|v| to_json(v, verbose)).collect())
        }
    }
}

/// A parameter count as Ollama writes it: `8B` / `8.0B`-style one decimal, `134.52M` two, `12K`.
pub fn human_number(n: u64) -> String {
    const UNITS: [(f64, &str, usize); 3] = [(1e9, "B", 1), (1e6, "M", 2), (1e3, "K", 0)];
    for (scale, unit, decimals) in UNITS {
        let x = n as f64 / scale;
        if x >= 1.0 {
            if x.fract() == 0.0 || decimals == 0 {
                return format!("{x:.0}{unit}");
            }
            return format!("{x:.decimals$}{unit}");
        }
    }
    n.to_string()
}

/// llama.cpp's name of a `general.file_type` (its `LLAMA_FTYPE_MOSTLY_*` without the prefix).
pub fn file_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_sizes_read_like_ollamas() {
        assert_eq!(human_number(134_515_008), "134.52M");
        assert_eq!(human_number(8_030_261_248), "8.0B");
        assert_eq!(human_number(7_000_000_000), "7B");
        assert_eq!(human_number(268_000_000), "268M");
        assert_eq!(human_number(12_345), "12K");
        assert_eq!(human_number(999), "999");
    }

    #[test]
    fn file_types() {
        assert_eq!(file_type_name(3), Some("Q4_1"));
        assert_eq!(file_type_name(15), Some("Q4_K_M"));
        assert_eq!(file_type_name(4), None);
    }

    #[test]
    fn floats_keep_their_short_form_and_long_arrays_are_cut() {
        assert_eq!(
            to_json(&GgufValue::F32(1e-5), false),
            serde_json::json!(1e-5)
        );
        let long = GgufValue::Array((0..100).map(GgufValue::U32).collect());
        assert_eq!(to_json(&long, false), serde_json::json!([]));
        assert_eq!(to_json(&long, true).as_array().map(Vec::len), Some(100));
        let short = GgufValue::Array(vec![GgufValue::I32(-1), GgufValue::Bool(true)]);
        assert_eq!(to_json(&short, false), serde_json::json!([-1, true]));
    }

    /// A mixture-of-experts file's 3-D expert tensors count every expert's weights.
    #[test]
    fn the_parameter_count_includes_every_expert() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shoal-model/tests/fixtures/synth/qwen3moe-k-q4_k_m.gguf");
        let facts = GgufFacts::read(&path, false).expect("read");
        // n_embd 256, vocab 512 (tied), 2 layers of: norms 256 + 256, Q 256x256, K and V 128x256,
        // O 256x256, Q/K norms 128 each, the router 8x256, and 8 experts of gate, up (128x256) and
        // down (256x128).
        let (d, v) = (256u64, 512u64);
        let layer = 2 * d + 2 * d * d + 2 * 128 * d + 2 * 128 + 8 * d + 8 * 3 * 128 * d;
        assert_eq!(facts.parameter_count, v * d + d + 2 * layer);
        assert_eq!(facts.details().parameter_size, "2.10M");
    }
}
