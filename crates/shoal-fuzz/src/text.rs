//! Text in and out of a model: tokenizers encoding and decoding arbitrary text, chat templates rendering
//! hostile conversations. Both use the real vocabularies and templates of every synthetic family (byte-level
//! BPE and SentencePiece vocabularies; Llama 3, Qwen, Gemma, Phi-3, Mistral and ChatML templates).

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use shoal_model::chat::{ChatMessage, ChatTemplate, ToolCall};
use shoal_model::gguf::GgufFile;
use shoal_model::tokenizer::{Tokenizer, VocabType};

struct Family {
    name: String,
    tokenizer: Tokenizer,
    /// `None` for a family fixture written without one.
    template: Option<ChatTemplate>,
}

fn families() -> &'static [Family] {
    static FAMILIES: OnceLock<Vec<Family>> = OnceLock::new();
    FAMILIES.get_or_init(|| {
        crate::synth_models()
            .into_iter()
            .map(|path| {
                let file =
                    GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                Family {
                    tokenizer: Tokenizer::from_gguf(file.content())
                        .unwrap_or_else(|e| panic!("{name}: tokenizer: {e}")),
                    template: file
                        .value("tokenizer.chat_template")
                        .map(|_| ChatTemplate::from_gguf(file.content()))
                        .transpose()
                        .unwrap_or_else(|e| panic!("{name}: template: {e}")),
                    name,
                }
            })
            .collect()
    })
}

/// The first byte picks the vocabulary and whether special tokens are parsed; the rest is the text
/// (invalid UTF-8 replaced, as a server receives it). Every id is in the vocabulary; with special tokens
/// not parsed, a byte-level BPE vocabulary decodes its own encoding back to the exact text; any ids at
/// all (the input read as u32s) decode without a panic.
pub fn tokenizer(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let fams = families();
    let fam = &fams[pick as usize % fams.len()];
    let tok = &fam.tokenizer;
    let text = String::from_utf8_lossy(rest);
    let parse_special = pick & 0x80 != 0;
    let ids = tok.encode(&text, parse_special);
    let vocab = tok.vocab_size();
    assert!(
        ids.iter().all(|&id| (id as usize) < vocab),
        "{}: id out of the vocabulary",
        fam.name
    );
    let back = tok.decode(&ids);
    if !parse_special && tok.vocab_type() == VocabType::Bpe {
        assert_eq!(back, text, "{}: decode(encode(text)) is the text", fam.name);
    }
    let _ = tok.encode_prompt(&text);
    let raw: Vec<u32> = rest
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) % vocab as u32)
        .collect();
    let _ = tok.decode(&raw);
}

/// Roles a fuzzed message may take (the last slot: a role the input spells itself).
const ROLES: [&str; 6] = ["system", "user", "assistant", "tool", "developer", ""];

/// The input as [`crate::pieces`]: the first piece picks the template and flags; then each message is a
/// role byte and a content piece (an assistant message may carry a tool call: name and arguments, any
/// text); a piece that parses as a JSON object is also offered as a tool definition. Rendering must
/// return (text or a template error) without a panic, for every template, in bounded time.
pub fn chat_template(data: &[u8]) {
    let mut pieces = crate::pieces(data).into_iter();
    let Some(head) = pieces.next() else {
        return;
    };
    let pick = head.first().copied().unwrap_or(0);
    let fams: Vec<&Family> = families().iter().filter(|f| f.template.is_some()).collect();
    let fam = fams[pick as usize % fams.len()];
    let template = fam.template.as_ref().expect("filtered");
    let mut messages = Vec::new();
    let mut tools = Vec::new();
    while let (Some(role), Some(content)) = (pieces.next(), pieces.next()) {
        let r = role.first().copied().unwrap_or(0);
        let content = String::from_utf8_lossy(content).into_owned();
        if let Ok(v @ serde_json::Value::Object(_)) = serde_json::from_str(&content) {
            tools.push(v);
        }
        let role = match ROLES[r as usize % ROLES.len()] {
            "" => String::from_utf8_lossy(role.get(1..).unwrap_or_default()).into_owned(),
            named => named.to_string(),
        };
        let mut message = ChatMessage::new(role, content);
        if r & 0x40 != 0 {
            let name = pieces.next().unwrap_or_default();
            let args = pieces.next().unwrap_or_default();
            message.tool_calls.push(ToolCall {
                id: format!("call_{}", messages.len()),
                name: String::from_utf8_lossy(name).into_owned(),
                arguments: String::from_utf8_lossy(args).into_owned(),
            });
        }
        if r & 0x20 != 0 {
            message.tool_call_id = Some(format!("call_{}", messages.len().saturating_sub(1)));
        }
        messages.push(message);
    }
    let now = UNIX_EPOCH + Duration::from_secs(1_750_000_000);
    let _ = template.render_at(&messages, pick & 1 == 0, now);
    if !tools.is_empty() {
        let _ = template.render_tools_at(&messages, &tools, true, now);
    }
}
