//! [`TokenizerError`]: what can be wrong with a GGUF's tokenizer metadata.

/// What can be wrong with a GGUF's tokenizer metadata; nothing in the tokenizer panics on a bad file.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("GGUF metadata has no `{key}`")]
    MissingKey { key: &'static str },
    #[error("GGUF key `{key}` has the wrong type: expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error(
        "tokenizer model `{model}` is not supported (byte-level BPE `gpt2` and SentencePiece `llama` are)"
    )]
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
