//! Chat templates: turning a list of [`ChatMessage`]s into the prompt text a model was trained on.
//!
//! [`ChatTemplate`] compiles the Jinja template stored in a GGUF (`tokenizer.chat_template`) once,
//! into a minijinja environment configured like Hugging Face's (`trim_blocks`, `lstrip_blocks`,
//! Python string/dict/list methods such as `.strip()` through `minijinja_contrib::pycompat`, and a
//! `raise_exception` function). [`ChatTemplate::render`] fills in `messages`, `add_generation_prompt`,
//! `bos_token` and `eos_token`. Failures are [`ChatTemplateError`]s, never panics.
//!
//! The rendered text contains special tokens such as `<|im_start|>` as plain text: tokenize it with
//! `parse_special = true`, and add BOS only if the tokenizer says so (SmolLM2: no BOS).

use std::collections::BTreeMap;

use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// Name under which the template is stored in the environment (no extension: no auto-escaping).
const TEMPLATE_NAME: &str = "chat";

/// One turn of a conversation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// What can go wrong building or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("GGUF metadata has no `{key}`")]
    MissingKey { key: &'static str },
    #[error("GGUF key `{key}` has the wrong type: expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    #[error("chat template does not compile: {source}")]
    Compile {
        #[source]
        source: Error,
    },
    #[error("chat template raised an exception: {message}")]
    Raised { message: String },
    #[error("chat template failed to render: {source}")]
    Render {
        #[source]
        source: Error,
    },
}

/// Prefix that marks errors coming from the template's own `raise_exception(...)`.
const RAISED_PREFIX: &str = "raise_exception: ";

/// A compiled chat template plus the BOS/EOS token texts it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source` (Jinja, as found in HF `tokenizer_config.json` or GGUF metadata).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        // HF renders with `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|source| ChatTemplateError::Compile { source })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|source| ChatTemplateError::Compile { source })?;
        Ok(Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Reads `tokenizer.chat_template` and the BOS/EOS token texts from GGUF metadata.
    pub fn from_gguf(content: &Content) -> Result<Self, ChatTemplateError> {
        let md = &content.metadata;
        let key = "tokenizer.chat_template";
        let source = match md.get(key) {
            None => return Err(ChatTemplateError::MissingKey { key }),
            Some(GgufValue::String(s)) => s,
            Some(_) => {
                return Err(ChatTemplateError::WrongType {
                    key,
                    expected: "string",
                });
            }
        };
        let bos = token_text(content, "tokenizer.ggml.bos_token_id").unwrap_or_default();
        let eos = token_text(content, "tokenizer.ggml.eos_token_id").unwrap_or_default();
        Self::new(source, &bos, &eos)
    }

    /// Renders the conversation; with `add_generation_prompt` the text ends with the opening of an
    /// assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role".to_owned(), Value::from(m.role.as_str()));
                map.insert("content".to_owned(), Value::from(m.content.as_str()));
                Value::from_object(map)
            })
            .collect();
        let ctx = minijinja::context! {
            messages => Value::from(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|source| ChatTemplateError::Render { source })?;
        tmpl.render(ctx).map_err(classify)
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// `raise_exception(message)` as HF defines it: abort rendering with that message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

fn classify(source: Error) -> ChatTemplateError {
    if source.kind() == ErrorKind::InvalidOperation
        && let Some(message) = source.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX))
    {
        return ChatTemplateError::Raised {
            message: message.to_owned(),
        };
    }
    ChatTemplateError::Render { source }
}

/// Text of the token whose id is stored under `key`, if both exist.
fn token_text(content: &Content, key: &str) -> Option<String> {
    let md = &content.metadata;
    let id = match md.get(key)? {
        GgufValue::U32(v) => usize::try_from(*v).ok()?,
        GgufValue::I32(v) => usize::try_from(*v).ok()?,
        GgufValue::U64(v) => usize::try_from(*v).ok()?,
        GgufValue::I64(v) => usize::try_from(*v).ok()?,
        _ => return None,
    };
    match md.get("tokenizer.ggml.tokens")?.to_vec().ok()?.get(id)? {
        GgufValue::String(s) => Some(s.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pycompat_methods_and_whitespace_control() {
        let src = "{% for m in messages %}\n  [{{ m.role.upper() }}] {{ m['content'].strip() }}\n{% endfor %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        let out = t
            .render(&[ChatMessage::new("user", "  hi  ")], false)
            .expect("renders");
        assert_eq!(out, "  [USER] hi\n");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('need a system turn') }}{% endif %}";
        let t = ChatTemplate::new(src, "", "").expect("compiles");
        let err = t
            .render(&[ChatMessage::new("user", "x")], true)
            .expect_err("must fail");
        match err {
            ChatTemplateError::Raised { message } => assert_eq!(message, "need a system turn"),
            other => panic!("wrong error: {other}"),
        }
    }

    #[test]
    fn syntax_error_is_an_error() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(ChatTemplateError::Compile { .. })
        ));
    }

    #[test]
    fn bos_and_generation_prompt_are_available() {
        let src = "{{ bos_token }}{% if add_generation_prompt %}A:{% endif %}{{ eos_token }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
        assert_eq!(t.render(&[], true).expect("renders"), "<s>A:</s>");
        assert_eq!(t.render(&[], false).expect("renders"), "<s></s>");
    }
}
