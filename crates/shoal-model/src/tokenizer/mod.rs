//! Byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp token for token.
//!
//! - [`Tokenizer`] is the whole vocabulary: [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*`,
//!   [`Tokenizer::encode`] turns text into ids, [`Tokenizer::decode`] turns ids back into text.
//! - [`StreamDecoder`] detokenizes one id at a time and only yields complete UTF-8.
//! - [`TokenizerError`] says what is wrong with the metadata; nothing here panics on a bad file.
//!
//! Encoding runs in three steps, as in llama.cpp's `llama_vocab::tokenize`:
//! 1. special-token partition: occurrences of control tokens (only with `parse_special`) and
//!    user-defined tokens (always) become their ids, longest token text first;
//! 2. the text between them is split into words by the [`pretok::PreTokenizer`] chosen by
//!    `tokenizer.ggml.pre` (SmolLM2's `smollm`: every digit alone, then the GPT-2 regex, **no**
//!    prefix space — candle's `from_gguf` gets this wrong);
//! 3. each word is mapped through GPT-2's byte↔unicode table and merged in rank order (the
//!    private `bpe` module).
//!
//! `encode` never adds BOS. Whether a prompt needs one is [`Tokenizer::add_bos`]
//! (`tokenizer.ggml.add_bos_token`); [`Tokenizer::encode_prompt`] applies it. SmolLM2 has
//! `add_bos_token = false`, and llama.cpp's golden counts confirm no BOS is added to raw or chat
//! prompts (its BOS id 1 is `<|im_start|>`, which the chat template already writes itself).

mod bpe;
pub mod pretok;
mod stream;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

pub use pretok::{PreTokenizer, PreTokenizerKind};
pub use stream::StreamDecoder;

/// What can be wrong with a GGUF's tokenizer metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{key}`")]
    MissingKey { key: &'static str },
    #[error("GGUF key `{key}` has the wrong type: expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error("tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`)")]
    UnsupportedModel { model: String },
    #[error("merge #{index} `{line}` is not of the form `left right`")]
    BadMerge { index: usize, line: String },
    #[error("`{key}` has {found} entries but the vocabulary has {expected}")]
    LengthMismatch {
        key: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("`{key}` = {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenIdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },
    #[error("the vocabulary is empty")]
    EmptyVocab,
    #[error("pre-tokenizer regex `{pattern}` does not compile: {source}")]
    Regex {
        pattern: String,
        #[source]
        source: Box<fancy_regex::Error>,
    },
}

/// llama.cpp's `llama_token_type` (GGUF `tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_i32(v: i32) -> Self {
        match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Token texts that end a generation when present (llama.cpp's `special_eog_ids` heuristics).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "</s>",
];

/// A byte-level BPE vocabulary with its merges, special tokens and pre-tokenizer.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Raw bytes of every token, flattened: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    bpe: bpe::Bpe,
    pre: PreTokenizer,
    /// Control / user-defined / unknown tokens, longest text first (llama.cpp's
    /// `cache_special_tokens`).
    specials: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    eog: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        let md = &content.metadata;
        let model = get_str(md, "tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_owned(),
            });
        }
        let tokens = get_str_array(md, "tokenizer.ggml.tokens")?;
        if tokens.is_empty() {
            return Err(TokenizerError::EmptyVocab);
        }
        let types = match md.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; tokens.len()],
            Some(v) => {
                let key = "tokenizer.ggml.token_type";
                let arr = v.to_vec().map_err(|_| wrong(key, "array of i32"))?;
                if arr.len() != tokens.len() {
                    return Err(TokenizerError::LengthMismatch {
                        key,
                        found: arr.len(),
                        expected: tokens.len(),
                    });
                }
                arr.iter()
                    .map(|v| as_i64(v).map(|t| TokenType::from_i32(t as i32)))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| wrong(key, "array of i32"))?
            }
        };
        let merges = match md.get("tokenizer.ggml.merges") {
            Some(_) => get_str_array(md, "tokenizer.ggml.merges")?,
            None => Vec::new(),
        };
        let pre_name = match md.get("tokenizer.ggml.pre") {
            Some(_) => Some(get_str(md, "tokenizer.ggml.pre")?),
            None => None,
        };
        let pre = PreTokenizer::for_gguf_name(pre_name)?;
        let bpe = bpe::Bpe::new(&tokens, &merges)?;
        let n = tokens.len();
        let bos = get_token_id(md, "tokenizer.ggml.bos_token_id", n)?;
        let eos = get_token_id(md, "tokenizer.ggml.eos_token_id", n)?;
        let unk = get_token_id(md, "tokenizer.ggml.unknown_token_id", n)?;
        let pad = get_token_id(md, "tokenizer.ggml.padding_token_id", n)?;
        let eot = get_token_id(md, "tokenizer.ggml.eot_token_id", n)?;
        let eom = get_token_id(md, "tokenizer.ggml.eom_token_id", n)?;
        let add_bos = match md.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(wrong("tokenizer.ggml.add_bos_token", "bool")),
            // llama.cpp's default for BPE vocabularies without the key: only Llama 3 adds BOS.
            None => pre.kind() == PreTokenizerKind::Llama3,
        };

        let unicode_to_byte = bpe::unicode_to_byte();
        let mut bytes = Vec::with_capacity(tokens.iter().map(String::len).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (text, ty) in tokens.iter().zip(&types) {
            append_token_bytes(text, *ty, &unicode_to_byte, &mut bytes);
            offsets.push(bytes.len());
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                let ty = types[id as usize];
                let special = matches!(
                    ty,
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                );
                special && !tokens[id as usize].is_empty()
            })
            .collect();
        specials.sort_by(|&a, &b| {
            let (ta, tb) = (&tokens[a as usize], &tokens[b as usize]);
            tb.len().cmp(&ta.len()).then(a.cmp(&b))
        });

        let mut eog: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(id) = bpe.token_id(text) {
                eog.push(id);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Self {
            tokens,
            types,
            bytes,
            offsets,
            bpe,
            pre,
            specials,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            eog,
        })
    }

    /// Encodes `text` into token ids, never adding BOS/EOS.
    ///
    /// With `parse_special`, control-token texts in `text` (such as `<|im_start|>`) become their ids;
    /// without it they are tokenized as plain text. User-defined tokens (type 4) are always matched,
    /// as in llama.cpp and HF `tokenizers`. Special tokens are matched longest text first: each token
    /// in turn splits every stretch of plain text that is left.
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        enum Frag<'t> {
            Text(&'t str),
            Token(u32),
        }
        let mut frags = vec![Frag::Text(text)];
        for &id in &self.specials {
            let ty = self.types[id as usize];
            if !parse_special && ty != TokenType::UserDefined {
                continue;
            }
            let needle = self.tokens[id as usize].as_str();
            if !frags
                .iter()
                .any(|f| matches!(f, Frag::Text(t) if t.contains(needle)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for frag in frags {
                let Frag::Text(mut rest) = frag else {
                    next.push(frag);
                    continue;
                };
                while let Some(pos) = rest.find(needle) {
                    if pos > 0 {
                        next.push(Frag::Text(&rest[..pos]));
                    }
                    next.push(Frag::Token(id));
                    rest = &rest[pos + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Frag::Text(rest));
                }
            }
            frags = next;
        }

        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut scratch = String::new();
        let ignore_merges = self.pre.kind().ignore_merges();
        for frag in frags {
            match frag {
                Frag::Token(id) => out.push(id),
                Frag::Text(t) => {
                    for word in self.pre.split(t) {
                        self.bpe
                            .encode_word(word, ignore_merges, &mut scratch, &mut out);
                    }
                }
            }
        }
        out
    }

    /// Encodes a prompt the way llama.cpp's server does: special tokens parsed, BOS prepended when
    /// the model asks for it ([`Tokenizer::add_bos`]).
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, true));
        ids
    }

    /// Decodes ids into text; invalid UTF-8 becomes U+FFFD, control tokens appear as their text
    /// (llama.cpp's `detokenize` with `unparse_special`). Unknown ids are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            buf.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Raw bytes of one token (empty for an id outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&start), Some(&end)) => &self.bytes[start..end],
            _ => &[],
        }
    }

    /// The token's text as stored in the vocabulary (GPT-2 alphabet for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.bpe.token_id(text)
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// End of generation: EOS, EOT/EOM ids if given, and any of `<|im_end|>`, `<|endoftext|>`,
    /// `<|eot_id|>`, `<|end|>`, `<end_of_turn>`, `</s>`, `<|eom_id|>` present in the vocabulary.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn pre_tokenizer(&self) -> PreTokenizerKind {
        self.pre.kind()
    }
}

/// Raw bytes of one token, as llama.cpp's `token_to_piece(special = true)` renders it.
fn append_token_bytes(
    text: &str,
    ty: TokenType,
    unicode_to_byte: &HashMap<char, u8>,
    out: &mut Vec<u8>,
) {
    match ty {
        TokenType::Normal => {
            for c in text.chars() {
                match unicode_to_byte.get(&c) {
                    Some(&b) => out.push(b),
                    // Not in GPT-2's alphabet: keep the character itself.
                    None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
                }
            }
        }
        TokenType::Control | TokenType::UserDefined | TokenType::Unknown => {
            out.extend_from_slice(text.as_bytes())
        }
        TokenType::Byte => {
            // `<0xAB>`
            let hex = text.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'));
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
        TokenType::Unused | TokenType::Undefined => {}
    }
}

fn wrong(key: &'static str, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType { key, expected }
}

fn get_str<'a>(
    md: &'a HashMap<String, Value>,
    key: &'static str,
) -> Result<&'a str, TokenizerError> {
    match md.get(key) {
        None => Err(TokenizerError::MissingKey { key }),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(wrong(key, "string")),
    }
}

fn get_str_array(
    md: &HashMap<String, Value>,
    key: &'static str,
) -> Result<Vec<String>, TokenizerError> {
    let arr = md
        .get(key)
        .ok_or(TokenizerError::MissingKey { key })?
        .to_vec()
        .map_err(|_| wrong(key, "array of strings"))?;
    arr.iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.clone()),
            _ => Err(wrong(key, "array of strings")),
        })
        .collect()
}

fn as_i64(v: &Value) -> Option<i64> {
    Some(match v {
        Value::U8(x) => i64::from(*x),
        Value::I8(x) => i64::from(*x),
        Value::U16(x) => i64::from(*x),
        Value::I16(x) => i64::from(*x),
        Value::U32(x) => i64::from(*x),
        Value::I32(x) => i64::from(*x),
        Value::U64(x) => i64::try_from(*x).ok()?,
        Value::I64(x) => *x,
        _ => return None,
    })
}

/// An optional token id key. Missing → `None`; present but outside the vocabulary → error, except
/// the conventional "none" markers (-1 / u32::MAX) → `None`.
fn get_token_id(
    md: &HashMap<String, Value>,
    key: &'static str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let id = as_i64(v).ok_or_else(|| wrong(key, "integer"))?;
    if id < 0 || id == i64::from(u32::MAX) {
        return Ok(None);
    }
    if id as u64 >= vocab_size as u64 {
        return Err(TokenizerError::TokenIdOutOfRange {
            key,
            id: id as u64,
            vocab_size,
        });
    }
    Ok(Some(id as u32))
}
