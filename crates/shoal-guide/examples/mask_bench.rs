//! How fast shoal-guide is on a real vocabulary: building a model's tables once, compiling a grammar
//! per request, and the per-token mask (what the engine waits for before each constrained sample).
//!
//! Usage: `cargo run --release -p shoal-guide --example mask_bench [GGUF]` (default: `SHOAL_TEST_MODEL`,
//! else the test model). Walks each grammar along a fixed valid document token by token, timing
//! `allowed` (the mask) and `accept`; prints median, mean and p99 per token.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Content;
use serde_json::json;
use shoal_engine::LogitsProcessor;
use shoal_guide::{FunctionTool, Guides, ResponseFormat, ToolFormat};
use shoal_model::tokenizer::Tokenizer;

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let n = v.len().max(1);
    let mean = v.iter().sum::<Duration>() / n as u32;
    let at = |q: f64| {
        v.get(((n as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or_default()
    };
    format!(
        "median {:?}, mean {:?}, p99 {:?}, max {:?} over {n} tokens",
        at(0.5),
        mean,
        at(0.99),
        at(1.0)
    )
}

fn walk(name: &str, mut p: Box<dyn LogitsProcessor>, tokens: &[u32]) {
    let (mut masks, mut accepts) = (Vec::new(), Vec::new());
    for &t in tokens {
        let start = Instant::now();
        let mask = p.allowed(&[]).expect("mask").expect("constrained");
        masks.push(start.elapsed());
        assert!(mask.allows(t), "{name}: token {t} not allowed");
        let start = Instant::now();
        p.accept(t).expect("accepted");
        accepts.push(start.elapsed());
    }
    println!("{name}: mask {}", stats(masks));
    println!("{name}: accept {}", stats(accepts));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(shoal_testkit::fixtures::model_path);
    let mut file = std::fs::File::open(&path)?;
    let content = Content::read(&mut file)?;
    let tokenizer = Arc::new(Tokenizer::from_gguf(&content)?);
    println!("{}: {} tokens", path.display(), tokenizer.vocab_size());
    let guides = Guides::default();
    let start = Instant::now();
    let guide = guides.for_tokenizer(&tokenizer)?;
    println!(
        "model tables (trie + llguidance factory), once per model: {:?}",
        start.elapsed()
    );

    let doc = r#"{"name": "Ann Smith", "age": 31, "hobbies": ["chess", "running", "reading books"], "address": {"city": "Paris", "zip": "75001"}}"#;
    let tokens = tokenizer.encode(doc, false);
    let start = Instant::now();
    let p = guide
        .response_format(&ResponseFormat::JsonObject)?
        .expect("constraint");
    println!("json_object compile: {:?}", start.elapsed());
    walk("json_object", Box::new(p), &tokens);

    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"}, "age": {"type": "integer"},
            "hobbies": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]}
        },
        "required": ["name", "age", "hobbies", "address"]
    });
    let start = Instant::now();
    let p = guide.json_schema(schema)?;
    println!("json_schema compile: {:?}", start.elapsed());
    walk("json_schema", Box::new(p), &tokens);

    let tool = FunctionTool::new(
        "get_weather",
        None,
        Some(
            json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}),
        ),
    )?;
    let call = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]}"#;
    let start = Instant::now();
    let p = guide.forced_call(ToolFormat::Generic, &[&tool], false)?;
    println!("forced call compile: {:?}", start.elapsed());
    walk("forced call", Box::new(p), &tokenizer.encode(call, false));
    Ok(())
}
