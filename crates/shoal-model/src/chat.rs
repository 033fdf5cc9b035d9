//! Chat templates: turning a list of [`ChatMessage`]s into the prompt text a model was trained on,
//! byte for byte as llama.cpp renders it (`--jinja`).
//!
//! [`ChatTemplate`] compiles the Jinja template stored in a GGUF (`tokenizer.chat_template`) once,
//! into a minijinja environment configured like llama.cpp's engine and Hugging Face's (`trim_blocks`,
//! `lstrip_blocks`, Python string/dict/list methods such as `.strip()` through
//! `minijinja_contrib::pycompat`, `raise_exception`, and llama.cpp's `tojson`: [`tojson`]). At build
//! time it probes the template as llama.cpp does: whether it reads a system message's content (if not,
//! a leading system message is merged into the next message) and whether `enable_thinking` changes
//! its output (if so, thinking is on).
//!
//! [`ChatTemplate::render`] fills in `messages` (role `developer` read as `system`), `bos_token`,
//! `eos_token`, `add_generation_prompt`, `enable_thinking`, llama.cpp's `date_string` and `datetime`
//! and a `strftime_now(format)` function (both UTC: [`clock`]). [`ChatTemplate::apply`] then cuts off
//! a BOS/EOS text that the tokenizer adds by itself ([`AddedSpecials`]), giving llama.cpp's prompt
//! exactly. Failures are [`ChatTemplateError`]s, never panics.
//!
//! Tools: a message can carry `tool_calls` ([`ToolCall`]: an assistant turn calling functions) or
//! answer one (`tool_call_id`, `name`: role `tool`), and [`ChatTemplate::render_tools_at`] /
//! [`ChatTemplate::apply_tools`] give the template a `tools` list (OpenAI's JSON function
//! definitions) as HF and llama.cpp do; without tools, `tools` stays undefined and the output is what
//! it always was. [`ChatTemplate::tool_caps`] says what the template does with them ([`ToolCaps`],
//! probed at build time).
//!
//! The rendered text contains special tokens such as `<|im_start|>` as plain text: tokenize it with
//! `parse_special = true`. `render`'s text keeps the template's BOS (add none: SmolLM2 has none and
//! wants none); `apply`'s is for a tokenizer that adds BOS when the model asks for it.

mod clock;
mod tojson;
mod tools;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use candle_core::quantized::gguf_file::{Content, Value as GgufValue};
use minijinja::syntax::SyntaxConfig;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use clock::Utc;
use tools::message_values;
pub use tools::{ToolCall, ToolCaps};

/// Name under which the template is stored in the environment (no extension: no auto-escaping).
const TEMPLATE_NAME: &str = "chat";

/// One turn of a conversation.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// Functions an assistant turn calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The call a `tool` message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function whose result a `tool` message carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An earlier assistant turn's thoughts, sent back by the client (OpenAI's `reasoning_content`,
    /// Ollama's `thinking`): templates read them as `reasoning_content`, and gpt-oss's as `thinking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }

    /// An assistant turn that calls `calls` (with `content` before them, often empty).
    pub fn assistant_tool_calls(content: impl Into<String>, calls: Vec<ToolCall>) -> Self {
        Self {
            tool_calls: calls,
            ..Self::new("assistant", content)
        }
    }

    /// A `tool` message: the result of call `id` to function `name`.
    pub fn tool_result(
        id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        Self {
            tool_call_id: Some(id.into()),
            name: Some(name.into()),
            ..Self::new("tool", content)
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

/// Special tokens the tokenizer adds around a prompt by itself (`tokenizer.ggml.add_bos_token`,
/// `add_eos_token`): [`ChatTemplate::apply`] cuts them off the rendered text, as llama.cpp does, so
/// that they are not there twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddedSpecials {
    pub bos: bool,
    pub eos: bool,
}

/// A compiled chat template plus the BOS/EOS token texts it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The template reads a system message's content (llama.cpp's `supports_system_role` probe).
    supports_system_role: bool,
    /// Value of `enable_thinking`: true where the template's output depends on it.
    enable_thinking: bool,
    /// Role `developer` is read as `system` (everywhere but GPT-OSS's channel templates, as llama.cpp).
    developer_is_system: bool,
    /// What the template does with tools and tool calls.
    tool_caps: ToolCaps,
    /// The Jinja source (tool-call formats are recognised by what it writes).
    source: String,
}

/// What a request asks of the model's thinking, for the templates that read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Thinking {
    /// `enable_thinking` (Qwen3, GLM-4.5+, DeepSeek V3.1, …); `None` keeps the template's default (on
    /// where its output depends on it, as llama.cpp).
    pub enable: Option<bool>,
    /// `reasoning_effort` (gpt-oss's `low`, `medium`, `high`); `None` leaves it undefined.
    pub effort: Option<String>,
    /// The most tokens the thoughts may take (Anthropic's `thinking.budget_tokens`): not the template's
    /// to read — the generation path closes the thoughts when they are spent.
    pub budget: Option<u32>,
}

impl ChatTemplate {
    /// Compiles `source` (Jinja, as found in HF `tokenizer_config.json` or GGUF metadata) and probes
    /// what it supports.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        // llama.cpp and HF render with `trim_blocks` and `lstrip_blocks`.
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|source| ChatTemplateError::Compile { source })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|source| ChatTemplateError::Compile { source })?;
        let mut template = Self {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            supports_system_role: true,
            enable_thinking: false,
            developer_is_system: !source.contains("<|channel|>"),
            tool_caps: ToolCaps::default(),
            source: source.to_owned(),
        };
        template.supports_system_role = template.probe_system_role();
        template.enable_thinking = template.probe_thinking();
        template.tool_caps = ToolCaps::probe(|messages, tools, object_arguments| {
            let messages = template.prepare(messages);
            let mut ctx = template.context(&messages, UNIX_EPOCH, object_arguments);
            ctx.insert("tools", tools::json_list(tools));
            ctx.insert("add_generation_prompt", Value::from(true));
            template.execute(ctx)
        });
        Ok(template)
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

    /// Renders the conversation as of now; with `add_generation_prompt` the text ends with the opening
    /// of an assistant turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_at(messages, add_generation_prompt, SystemTime::now())
    }

    /// [`ChatTemplate::render`] with the clock at `now` (what `strftime_now` and `date_string` see).
    pub fn render_at(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        now: SystemTime,
    ) -> Result<String, ChatTemplateError> {
        self.render_tools_at(messages, &[], add_generation_prompt, now)
    }

    /// [`ChatTemplate::render_at`] with `tools` (OpenAI's `{"type": "function", "function": {...}}`
    /// definitions) for the template to describe; none leaves `tools` undefined.
    pub fn render_tools_at(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        now: SystemTime,
    ) -> Result<String, ChatTemplateError> {
        self.render_thinking_at(
            messages,
            tools,
            add_generation_prompt,
            now,
            &Thinking::default(),
        )
    }

    /// [`ChatTemplate::render_tools_at`] with what the request asks of the model's thinking.
    pub fn render_thinking_at(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        now: SystemTime,
        thinking: &Thinking,
    ) -> Result<String, ChatTemplateError> {
        let messages = self.prepare(messages);
        let mut ctx = self.context(&messages, now, self.tool_caps.object_arguments);
        if let Some(enable) = thinking.enable {
            ctx.insert("enable_thinking", Value::from(enable));
        }
        if let Some(effort) = &thinking.effort {
            ctx.insert("reasoning_effort", Value::from(effort.as_str()));
        }
        if !tools.is_empty() {
            ctx.insert("tools", tools::json_list(tools));
        }
        // llama.cpp leaves it undefined rather than false.
        if add_generation_prompt {
            ctx.insert("add_generation_prompt", Value::from(true));
        }
        self.execute(ctx).map_err(classify)
    }

    /// The prompt exactly as llama.cpp makes it (`/apply-template`): [`ChatTemplate::render`], less a
    /// leading BOS text when the tokenizer adds BOS and a trailing EOS text when it adds EOS.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        added: AddedSpecials,
    ) -> Result<String, ChatTemplateError> {
        self.apply_at(messages, add_generation_prompt, added, SystemTime::now())
    }

    /// [`ChatTemplate::apply`] with the clock at `now`.
    pub fn apply_at(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        added: AddedSpecials,
        now: SystemTime,
    ) -> Result<String, ChatTemplateError> {
        self.apply_tools_at(messages, &[], add_generation_prompt, added, now)
    }

    /// [`ChatTemplate::apply`] with `tools` for the template to describe
    /// ([`ChatTemplate::render_tools_at`]).
    pub fn apply_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        added: AddedSpecials,
    ) -> Result<String, ChatTemplateError> {
        self.apply_tools_at(
            messages,
            tools,
            add_generation_prompt,
            added,
            SystemTime::now(),
        )
    }

    /// [`ChatTemplate::apply_tools`] with the clock at `now`.
    pub fn apply_tools_at(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        added: AddedSpecials,
        now: SystemTime,
    ) -> Result<String, ChatTemplateError> {
        self.apply_thinking_at(
            messages,
            tools,
            add_generation_prompt,
            added,
            now,
            &Thinking::default(),
        )
    }

    /// [`ChatTemplate::apply_tools_at`] with what the request asks of the model's thinking.
    pub fn apply_thinking_at(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
        added: AddedSpecials,
        now: SystemTime,
        thinking: &Thinking,
    ) -> Result<String, ChatTemplateError> {
        let mut text =
            self.render_thinking_at(messages, tools, add_generation_prompt, now, thinking)?;
        if added.bos && text.starts_with(&self.bos_token) {
            text.drain(..self.bos_token.len());
        }
        if added.eos && text.ends_with(&self.eos_token) {
            text.truncate(text.len() - self.eos_token.len());
        }
        Ok(text)
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Whether the template reads a system message (else one is merged into the next message).
    pub fn supports_system_role(&self) -> bool {
        self.supports_system_role
    }

    /// The `enable_thinking` the template sees: true where its output depends on it.
    pub fn enable_thinking(&self) -> bool {
        self.enable_thinking
    }

    /// Whether the model thinks in `<think>` blocks: its template writes them (Qwen3, QwQ, DeepSeek R1
    /// and its distills, GLM-4.5+), so an answer may start with its thoughts.
    pub fn writes_thinking(&self) -> bool {
        self.source.contains("<think>")
    }

    /// Whether the model writes OpenAI's harmony format (gpt-oss): its template writes `<|channel|>`
    /// headers, so an answer is messages on the `analysis`, `commentary` and `final` channels.
    /// Decided once, when the template is compiled.
    pub fn writes_channels(&self) -> bool {
        !self.developer_is_system
    }

    /// What the template does with tools and tool calls.
    pub fn tool_caps(&self) -> ToolCaps {
        self.tool_caps
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// llama.cpp's changes to the messages before rendering: role `developer` becomes `system`, and a
    /// leading system message the template ignores is put in front of the next message's content
    /// (dropped when it is the only one).
    fn prepare(&self, messages: &[ChatMessage]) -> Vec<ChatMessage> {
        let mut messages = messages.to_vec();
        if self.developer_is_system {
            for m in &mut messages {
                if m.role == "developer" {
                    m.role = "system".to_owned();
                }
            }
        } else {
            // gpt-oss's template refuses a call turn with both text and thoughts: the thoughts stay
            // (as llama.cpp keeps them).
            for m in &mut messages {
                if m.reasoning.is_some() && !m.tool_calls.is_empty() {
                    m.content.clear();
                }
            }
        }
        if !self.supports_system_role && messages.first().is_some_and(|m| m.role == "system") {
            let system = messages.remove(0);
            if let Some(next) = messages.first_mut() {
                next.content = format!("{}\n{}", system.content, next.content);
            }
        }
        messages
    }

    /// The variables llama.cpp gives every render (`add_generation_prompt` aside).
    fn context(
        &self,
        messages: &[ChatMessage],
        now: SystemTime,
        object_arguments: bool,
    ) -> BTreeMap<&'static str, Value> {
        let unix = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => i64::try_from(e.duration().as_secs()).map_or(i64::MIN, |s| -s),
        };
        let utc = Utc::from_unix(unix);
        let strftime_now = move |format: String| -> Result<String, Error> {
            let text = utc.strftime(&format);
            // C's strftime into llama.cpp's 100-byte buffer fails on empty or longer results.
            if text.is_empty() || text.len() >= 100 {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "strftime_now: failed to format time",
                ));
            }
            Ok(text)
        };
        BTreeMap::from([
            (
                "messages",
                message_values(messages, None, object_arguments, self.writes_channels()),
            ),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
            ("enable_thinking", Value::from(self.enable_thinking)),
            ("datetime", Value::from(utc.strftime("%b %d %Y"))),
            ("date_string", Value::from(utc.strftime("%d %b %Y"))),
            ("strftime_now", Value::from_function(strftime_now)),
        ])
    }

    fn execute(&self, ctx: BTreeMap<&'static str, Value>) -> Result<String, Error> {
        self.env.get_template(TEMPLATE_NAME)?.render(ctx)
    }

    /// llama.cpp's probe: render a system and a user message (empty BOS/EOS, `tools = []`, generation
    /// prompt on) and see whether the system message's content was read. Errors count as "not read".
    fn probe_system_role(&self) -> bool {
        let read = Arc::new(AtomicBool::new(false));
        let messages = [
            ChatMessage::new("system", "System message"),
            ChatMessage::new("user", "User message"),
        ];
        // `strftime_now` is one of llama.cpp's globals, there in its probe too: gpt-oss's template
        // formats the date before it reads the system message.
        let strftime_now = self.context(&messages, UNIX_EPOCH, false)["strftime_now"].clone();
        let ctx = BTreeMap::from([
            (
                "messages",
                message_values(&messages, Some(&read), false, self.writes_channels()),
            ),
            ("tools", Value::from(Vec::<Value>::new())),
            ("bos_token", Value::from("")),
            ("eos_token", Value::from("")),
            ("add_generation_prompt", Value::from(true)),
            ("strftime_now", strftime_now),
        ]);
        let _ = self.execute(ctx);
        read.load(Ordering::Relaxed)
    }

    /// Whether `enable_thinking` true and false render one user message differently (llama.cpp turns
    /// thinking on for templates that support it).
    fn probe_thinking(&self) -> bool {
        let messages = [ChatMessage::new("user", "test")];
        let render = |enable: bool| {
            let mut ctx = self.context(&messages, UNIX_EPOCH, false);
            ctx.insert("enable_thinking", Value::from(enable));
            ctx.insert("add_generation_prompt", Value::from(true));
            self.execute(ctx).ok()
        };
        matches!((render(true), render(false)), (Some(on), Some(off)) if on != off)
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
