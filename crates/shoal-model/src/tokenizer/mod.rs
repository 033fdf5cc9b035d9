//! Tokenizers built from GGUF metadata, matching llama.cpp token for token: byte-level BPE
//! (`tokenizer.ggml.model = "gpt2"`: SmolLM2, Llama 3, Qwen 2/3) and SentencePiece
//! (`"llama"`: Gemma 3, Llama 2, Mistral v1, Phi-3).
//!
//! - [`Tokenizer`] is the whole vocabulary: [`Tokenizer::from_gguf`] reads `tokenizer.ggml.*`,
//!   [`Tokenizer::encode`] turns text into ids, [`Tokenizer::decode`] turns ids back into text. Which
//!   algorithm runs inside is its [`VocabType`]; the API is the same for both.
//! - [`StreamDecoder`] detokenizes one id at a time and only yields complete UTF-8.
//! - [`TokenizerError`] says what is wrong with the metadata; nothing here panics on a bad file.
//!
//! Loading keeps the vocabulary's texts in one arena with an open-addressing index (private `index`:
//! Gemma 3's 262,144 tokens build in ~40 ms) and first applies llama.cpp's text heuristics to the
//! token types (private `heuristics`: tokens named like end-of-turn or fill-in-the-middle tokens are
//! control tokens, and which ids end a generation).
//!
//! Encoding runs in steps, as in llama.cpp's `llama_vocab::tokenize`:
//! 1. the special-token partition (the private `special` module, one for both types): occurrences of
//!    control tokens (only with `parse_special`) and user-defined tokens (always) become their ids,
//!    longest token text first;
//! 2. BPE: the text between them is split into words by the [`pretok::PreTokenizer`] chosen by
//!    `tokenizer.ggml.pre` (SmolLM2's `smollm`: every digit alone, then the GPT-2 regex, **no**
//!    prefix space — candle's `from_gguf` gets this wrong); each word is mapped through GPT-2's
//!    byte↔unicode table and merged in rank order (the private `bpe` module);
//! 3. SentencePiece: each stretch of text has its spaces escaped to `▁` and is merged by token score,
//!    with byte-token fallback for characters outside the vocabulary (the private `spm` module).
//!
//! `encode` never adds BOS. Whether a prompt needs one is [`Tokenizer::add_bos`]
//! (`tokenizer.ggml.add_bos_token`; llama.cpp's default when missing: yes for SentencePiece and Llama 3,
//! no otherwise; GLM's pre-tokenizers have no BOS at all, as llama.cpp clears theirs); [`Tokenizer::encode_prompt`] applies it. SmolLM2 has `add_bos_token = false`, and
//! llama.cpp's golden counts confirm no BOS is added to raw or chat prompts (its BOS id 1 is
//! `<|im_start|>`, which the chat template already writes itself); Gemma 3 has `true` (`<bos>` = 2).
//!
//! Decoding concatenates each token's bytes ([`Tokenizer::token_bytes`], llama.cpp's
//! `token_to_piece` with `special = true`): normal tokens through the GPT-2 table (BPE) or with `▁` as
//! a space (SentencePiece), byte tokens `<0xXX>` as that byte, control and user-defined tokens as their
//! text, unused tokens as nothing. A SentencePiece vocabulary with `add_space_prefix` drops the space
//! its first token starts with in [`Tokenizer::decode`] (llama.cpp's `detokenize`), never in a stream.

mod bpe;
mod error;
mod heuristics;
mod index;
mod meta;
pub mod pretok;
mod special;
mod spm;
mod stream;

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Content;

pub use error::TokenizerError;
pub use pretok::{PreTokenizer, PreTokenizerKind};
pub use stream::StreamDecoder;

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

/// The encoding algorithm of a vocabulary (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabType {
    /// Byte-level BPE with ranked merges (`gpt2`).
    Bpe,
    /// SentencePiece-style, merged by score with byte fallback (`llama`).
    Spm,
}

/// The algorithm-specific half of a tokenizer.
#[derive(Debug)]
enum Model {
    /// Both boxed: their byte tables are a few KB.
    Bpe {
        bpe: Box<bpe::Bpe>,
        pre: PreTokenizer,
    },
    Spm(Box<spm::Spm>),
}

/// A vocabulary with its encoding algorithm, special tokens and BOS/EOS policy.
#[derive(Debug)]
pub struct Tokenizer {
    tokens: index::TextIndex,
    types: Vec<TokenType>,
    /// Raw bytes of every token, flattened: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    model: Model,
    specials: special::Specials,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    eog: Vec<u32>,
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's metadata (`tokenizer.ggml.*`).
    pub fn from_gguf(content: &Content) -> Result<Self, TokenizerError> {
        let md = &content.metadata;
        let vocab_type = match meta::str_key(md, "tokenizer.ggml.model")? {
            "gpt2" => VocabType::Bpe,
            "llama" => VocabType::Spm,
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_owned(),
                });
            }
        };
        let tokens = meta::token_texts(md)?;
        if tokens.len() == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        let n = tokens.len();
        let mut types = meta::token_types(md, n)?;
        let id = |key| meta::token_id(md, key, n);
        // llama.cpp's defaults for SentencePiece files without the keys: BOS 1, EOS 2, UNK 0.
        let spm_default = |key, default: u32| -> Result<Option<u32>, TokenizerError> {
            match (id(key)?, md.contains_key(key), vocab_type) {
                (None, false, VocabType::Spm) => Ok(Some(default).filter(|&d| (d as usize) < n)),
                (found, _, _) => Ok(found),
            }
        };
        let pre_name = meta::opt_str_key(md, "tokenizer.ggml.pre")?;
        let bos = spm_default("tokenizer.ggml.bos_token_id", 1)?
            .filter(|_| !pre_name.is_some_and(|n| pretok::NO_BOS.contains(&n)));
        let eos = spm_default("tokenizer.ggml.eos_token_id", 2)?;
        let unk = spm_default("tokenizer.ggml.unknown_token_id", 0)?;
        let pad = id("tokenizer.ggml.padding_token_id")?;
        let eot = id("tokenizer.ggml.eot_token_id")?;
        let eom = id("tokenizer.ggml.eom_token_id")?;
        // Before anything reads the types: forced control tokens render and partition as such.
        let eog = heuristics::apply(&tokens, &mut types, md, [eos, eot, eom]);

        let model = match vocab_type {
            VocabType::Bpe => {
                let merges = match md.get("tokenizer.ggml.merges") {
                    Some(_) => meta::str_array(md, "tokenizer.ggml.merges")?,
                    None => Vec::new(),
                };
                let pre = PreTokenizer::for_gguf_name(pre_name)?;
                let bpe = Box::new(bpe::Bpe::new(&tokens, &merges)?);
                Model::Bpe { bpe, pre }
            }
            VocabType::Spm => {
                let scores = meta::scores(md, n)?;
                let add_space_prefix =
                    meta::opt_bool_key(md, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
                Model::Spm(Box::new(spm::Spm::new(
                    &tokens,
                    scores,
                    unk,
                    add_space_prefix,
                )))
            }
        };
        let add_bos =
            meta::opt_bool_key(md, "tokenizer.ggml.add_bos_token")?.unwrap_or(match &model {
                Model::Spm(_) => true,
                // Only Llama 3 adds BOS among the BPE pre-tokenizers we know.
                Model::Bpe { pre, .. } => pre.kind() == PreTokenizerKind::Llama3,
            });
        let add_eos = meta::opt_bool_key(md, "tokenizer.ggml.add_eos_token")?.unwrap_or(false);

        let unicode_to_byte = bpe::unicode_to_byte();
        let normal = match vocab_type {
            VocabType::Bpe => NormalText::Gpt2Bytes(&unicode_to_byte),
            VocabType::Spm => NormalText::EscapedSpaces,
        };
        let mut bytes = Vec::with_capacity(tokens.iter().map(str::len).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (text, ty) in tokens.iter().zip(&types) {
            append_token_bytes(text, *ty, normal, &mut bytes);
            offsets.push(bytes.len());
        }

        // llama.cpp gives Phi-3's special tokens RSTRIP, by the model's name.
        let name = meta::opt_str_key(md, "general.name")?
            .unwrap_or("")
            .to_lowercase();
        let phi3 = name.contains("phi-3") || name.contains("phi3");
        let specials = special::Specials::new(&tokens, &types, |text| {
            if phi3 {
                special::phi3_strip(text)
            } else {
                special::Strip::default()
            }
        });

        Ok(Self {
            tokens,
            types,
            bytes,
            offsets,
            model,
            specials,
            bos,
            eos,
            unk,
            pad,
            add_bos,
            add_eos,
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
        let frags = self.specials.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &self.model {
            Model::Bpe { bpe, pre } => {
                let mut scratch = String::new();
                for frag in frags {
                    match frag {
                        special::Frag::Token(id) => out.push(id),
                        special::Frag::Text(t) => {
                            for word in pre.split(t) {
                                bpe.encode_word(word, pre.ignore_merges(), &mut scratch, &mut out);
                            }
                        }
                    }
                }
            }
            Model::Spm(spm) => {
                // llama.cpp: a stretch at the start or right after a special token gets the prefix.
                let mut after_special = true;
                for frag in frags {
                    match frag {
                        special::Frag::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        special::Frag::Text(t) => {
                            let prefix = spm.add_space_prefix() && after_special;
                            spm.encode(&self.tokens, t, prefix, &mut out);
                            after_special = false;
                        }
                    }
                }
            }
        }
        out
    }

    /// Encodes a prompt the way llama.cpp's server does: special tokens parsed, BOS prepended when
    /// the model asks for it ([`Tokenizer::add_bos`]), EOS appended when it asks for that
    /// (`tokenizer.ggml.add_eos_token`, rare).
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(bos) = self.bos
        {
            ids.push(bos);
        }
        ids.extend(self.encode(text, true));
        if self.add_eos
            && let Some(eos) = self.eos
        {
            ids.push(eos);
        }
        ids
    }

    /// Decodes ids into text; invalid UTF-8 becomes U+FFFD, control tokens appear as their text
    /// (llama.cpp's `detokenize` with `unparse_special`). Unknown ids are skipped. A SentencePiece
    /// vocabulary with `add_space_prefix` drops one leading space of the first token.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        let strip_first = matches!(&self.model, Model::Spm(spm) if spm.add_space_prefix());
        for (i, &id) in ids.iter().enumerate() {
            let piece = self.token_bytes(id);
            let piece = match piece.strip_prefix(b" ") {
                Some(rest) if i == 0 && strip_first => rest,
                _ => piece,
            };
            buf.extend_from_slice(piece);
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

    /// The token's text as stored in the vocabulary (GPT-2 alphabet for normal BPE tokens, `▁` for
    /// spaces in SentencePiece ones).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.text(id)
    }

    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.model {
            Model::Bpe { bpe, .. } => bpe.token_id(text),
            Model::Spm(_) => self.tokens.get(text),
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The encoding algorithm (`tokenizer.ggml.model`).
    pub fn vocab_type(&self) -> VocabType {
        match self.model {
            Model::Bpe { .. } => VocabType::Bpe,
            Model::Spm(_) => VocabType::Spm,
        }
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

    /// End of generation: EOS, EOT/EOM ids if given, the FIM pad/repo/separator tokens and the tokens
    /// llama.cpp recognises by text (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<|end|>`,
    /// `<end_of_turn>`, `</s>`, `<|eom_id|>`, ...; the private `heuristics` module).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// The BPE pre-tokenizer; SentencePiece vocabularies have none and report llama.cpp's
    /// `default`, as llama.cpp does.
    pub fn pre_tokenizer(&self) -> PreTokenizerKind {
        match &self.model {
            Model::Bpe { pre, .. } => pre.kind(),
            Model::Spm(_) => PreTokenizerKind::Default,
        }
    }
}

/// How a normal token's vocabulary text maps to bytes.
#[derive(Clone, Copy)]
enum NormalText<'a> {
    /// Byte-level BPE: each character is one byte through GPT-2's table.
    Gpt2Bytes(&'a HashMap<char, u8>),
    /// SentencePiece: UTF-8 text with `▁` standing for a space.
    EscapedSpaces,
}

/// Raw bytes of one token, as llama.cpp's `token_to_piece(special = true)` renders it.
fn append_token_bytes(text: &str, ty: TokenType, normal: NormalText<'_>, out: &mut Vec<u8>) {
    let mut buf = [0u8; 4];
    match (ty, normal) {
        (TokenType::Normal, NormalText::Gpt2Bytes(unicode_to_byte)) => {
            for c in text.chars() {
                match unicode_to_byte.get(&c) {
                    Some(&b) => out.push(b),
                    // Not in GPT-2's alphabet: keep the character itself.
                    None => out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
                }
            }
        }
        (TokenType::Normal, NormalText::EscapedSpaces) => {
            let mut rest = text;
            while let Some(pos) = rest.find(spm::SPACE) {
                out.extend_from_slice(&rest.as_bytes()[..pos]);
                out.push(b' ');
                rest = &rest[pos + spm::SPACE.len_utf8()..];
            }
            out.extend_from_slice(rest.as_bytes());
        }
        (TokenType::Control | TokenType::UserDefined | TokenType::Unknown, _) => {
            out.extend_from_slice(text.as_bytes())
        }
        (TokenType::Byte, _) => {
            // `<0xAB>`
            let hex = text.strip_prefix("<0x").and_then(|s| s.strip_suffix('>'));
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
        (TokenType::Unused | TokenType::Undefined, _) => {}
    }
}
