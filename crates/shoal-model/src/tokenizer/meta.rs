//! Typed reads of the `tokenizer.ggml.*` GGUF metadata keys: every wrong shape is a
//! [`TokenizerError`], never a panic.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::TokenType;
use super::error::TokenizerError;
use super::index::TextIndex;

pub(crate) type Metadata = HashMap<String, Value>;

pub(crate) fn wrong(key: &'static str, expected: &'static str) -> TokenizerError {
    TokenizerError::WrongType { key, expected }
}

/// A required string key.
pub(crate) fn str_key<'a>(md: &'a Metadata, key: &'static str) -> Result<&'a str, TokenizerError> {
    opt_str_key(md, key)?.ok_or(TokenizerError::MissingKey { key })
}

/// An optional string key.
pub(crate) fn opt_str_key<'a>(
    md: &'a Metadata,
    key: &'static str,
) -> Result<Option<&'a str>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(key, "string")),
    }
}

/// An optional bool key.
pub(crate) fn opt_bool_key(
    md: &Metadata,
    key: &'static str,
) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong(key, "bool")),
    }
}

/// A required array of strings (the vocabulary, the merges).
pub(crate) fn str_array(md: &Metadata, key: &'static str) -> Result<Vec<String>, TokenizerError> {
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

/// `tokenizer.ggml.tokens`, indexed without one allocation per token.
pub(crate) fn token_texts(md: &Metadata) -> Result<TextIndex, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.tokens";
    let arr = md
        .get(KEY)
        .ok_or(TokenizerError::MissingKey { key: KEY })?
        .to_vec()
        .map_err(|_| wrong(KEY, "array of strings"))?;
    let texts = arr
        .iter()
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(wrong(KEY, "array of strings")),
        })
        .collect::<Result<Vec<&str>, _>>()?;
    Ok(TextIndex::new(texts))
}

/// The optional array at `key`, checked to have one entry per token.
fn per_token<'a>(
    md: &'a Metadata,
    key: &'static str,
    n_tokens: usize,
    expected: &'static str,
) -> Result<Option<&'a Vec<Value>>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let arr = v.to_vec().map_err(|_| wrong(key, expected))?;
    if arr.len() != n_tokens {
        return Err(TokenizerError::LengthMismatch {
            key,
            found: arr.len(),
            expected: n_tokens,
        });
    }
    Ok(Some(arr))
}

/// `tokenizer.ggml.token_type`; every token is normal when the key is missing.
pub(crate) fn token_types(
    md: &Metadata,
    n_tokens: usize,
) -> Result<Vec<TokenType>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.token_type";
    let Some(arr) = per_token(md, KEY, n_tokens, "array of i32")? else {
        return Ok(vec![TokenType::Normal; n_tokens]);
    };
    arr.iter()
        .map(|v| as_i64(v).map(|t| TokenType::from_i32(t as i32)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| wrong(KEY, "array of i32"))
}

/// `tokenizer.ggml.scores` (f32, or i32 as llama.cpp also accepts); all 0 when the key is missing.
pub(crate) fn scores(md: &Metadata, n_tokens: usize) -> Result<Vec<f32>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.scores";
    let Some(arr) = per_token(md, KEY, n_tokens, "array of f32")? else {
        return Ok(vec![0.0; n_tokens]);
    };
    arr.iter()
        .map(|v| match v {
            Value::F32(x) => Some(*x),
            Value::I32(x) => Some(*x as f32),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| wrong(KEY, "array of f32"))
}

pub(crate) fn as_i64(v: &Value) -> Option<i64> {
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
pub(crate) fn token_id(
    md: &Metadata,
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
