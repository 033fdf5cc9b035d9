//! [`Guides`]: the node's constrained-decoding state per model, and [`Guides::plan`], what an API
//! handler calls to turn a chat request's tools and response format into a [`ChatPlan`].
//!
//! A [`ModelGuide`] holds llguidance's `ParserFactory` for one model: its token trie and the
//! per-vocabulary precomputation that makes masks fast. Building one takes a while (tens of
//! milliseconds for SmolLM2's 49k tokens, more for larger vocabularies), so [`Guides`] builds it the
//! first time a request of that model needs a constraint and keeps it while the model's tokenizer
//! lives (keyed by the tokenizer's `Arc`, so a reloaded model gets a fresh one). Requests without a
//! constraint never build one.

use std::sync::{Arc, Mutex, Weak};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use shoal_engine::{ChatMessage, EngineHandle, LogitsProcessor};
use shoal_model::chat::{ChatTemplate, ToolCaps};
use shoal_model::tokenizer::{TokenType, Tokenizer};

use crate::error::GuideError;
use crate::grammar::{
    ResponseFormat, harmony_answer_lark, response_schema, tool_call_lark, with_json_options,
};
use crate::processor::GuidedProcessor;
use crate::tokens::tok_env;
use crate::tools::parse::{CallIds, parse};
use crate::tools::stream::ToolCallStream;
use crate::tools::{FunctionTool, ToolChoice, ToolFormat, prepare_messages};

/// A chat request's tools and answer format, in API-neutral terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatGuidance {
    pub tools: Vec<FunctionTool>,
    pub tool_choice: ToolChoice,
    /// Whether a forced call may be several calls.
    pub parallel_tool_calls: bool,
    pub response_format: ResponseFormat,
}

/// What a handler renders, submits and parses for one chat request.
#[derive(Debug)]
pub struct ChatPlan {
    /// The messages to render (tool history written out where the template cannot print it).
    pub messages: Vec<ChatMessage>,
    /// The `tools` to hand the template (`Engines::render_chat_tools`).
    pub tools: Vec<Value>,
    /// The constraint, for `GenerateRequest::logits_processor`.
    pub processor: Option<Box<dyn LogitsProcessor>>,
    /// Present when the output may hold tool calls.
    pub tool_parser: Option<ToolCallParser>,
}

/// Splits one answer into content and calls, whole or streaming.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolFormat,
    ids: CallIds,
    /// The one function a forced call can name (a forced named function, or `required` with one
    /// tool): a call the budget cut before its name was written whole still names it.
    forced: Option<String>,
}

/// The call an answer was writing when its token budget ran out ([`crate::tools::cut`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutToolCall {
    /// Its place among the answer's calls (after the finished ones).
    pub index: usize,
    pub id: String,
    /// The function's name, when it was written whole.
    pub name: Option<String>,
    /// The arguments as written so far: JSON text, usually unfinished.
    pub arguments: String,
}

impl CutToolCall {
    /// The arguments as far as they parse (an object; `{}` when nothing does): what an API that
    /// wants an object, not text, reports.
    pub fn input(&self) -> Value {
        crate::tools::cut::arguments_so_far(&self.arguments)
    }
}

/// A finished answer split into content and calls, the one cut short by the token budget included.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedAnswer {
    pub content: String,
    pub calls: Vec<ToolCallOut>,
    /// The call the answer was writing when its token budget ran out.
    pub cut: Option<CutToolCall>,
}

/// One call of an answer, with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallOut {
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

impl ToolCallParser {
    /// A parser for `format`; call ids derive from `id_seed` (the request's id).
    pub fn new(format: ToolFormat, id_seed: u64) -> Self {
        Self {
            format,
            ids: CallIds::new(id_seed, format),
            forced: None,
        }
    }

    /// The same parser for answers forced to call `name`.
    pub fn forcing(mut self, name: Option<String>) -> Self {
        self.forced = name;
        self
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Content and calls of a finished answer.
    pub fn parse(&self, text: &str) -> (String, Vec<ToolCallOut>) {
        let parsed = parse(self.format, text);
        (parsed.content, self.with_ids(parsed.calls))
    }

    /// Calls in answer order, each with its id.
    fn with_ids(&self, calls: Vec<crate::tools::parse::ParsedCall>) -> Vec<ToolCallOut> {
        calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| ToolCallOut {
                id: self.ids.id(i),
                name: c.name,
                arguments: c.arguments,
            })
            .collect()
    }

    /// Content and calls of a finished answer; `cut_off`: it ended at its token budget, so a call it
    /// was writing then is [`ParsedAnswer::cut`] — never text in the family's call format.
    pub fn parse_ended(&self, text: &str, cut_off: bool) -> ParsedAnswer {
        let cut = cut_off
            .then(|| crate::tools::cut::cut_calls(self.format, text))
            .flatten();
        let Some(cut) = cut else {
            let (content, calls) = self.parse(text);
            return ParsedAnswer {
                content,
                calls,
                cut: None,
            };
        };
        let calls = self.with_ids(cut.calls);
        let index = calls.len();
        ParsedAnswer {
            content: cut.content,
            cut: Some(CutToolCall {
                index,
                id: self.ids.id(index),
                name: cut.cut.name.or_else(|| self.forced.clone()),
                arguments: cut.cut.arguments,
            }),
            calls,
        }
    }

    /// An incremental parser for a streamed answer (same ids as [`ToolCallParser::parse`]).
    pub fn stream(&self) -> ToolCallStream {
        ToolCallStream::new(self.format, self.ids).forcing(self.forced.clone())
    }
}

/// llguidance's per-model state.
pub struct ModelGuide {
    factory: ParserFactory,
    tokenizer: Arc<Tokenizer>,
}

impl std::fmt::Debug for ModelGuide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGuide")
            .field("vocab_size", &self.tokenizer.vocab_size())
            .finish_non_exhaustive()
    }
}

impl ModelGuide {
    /// Builds the token trie and llguidance's factory for `tokenizer` (the slow part: do it once).
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, GuideError> {
        let env = tok_env(tokenizer.clone())?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GuideError::Vocabulary {
            message: e.to_string(),
        })?;
        factory.quiet();
        Ok(Self { factory, tokenizer })
    }

    /// A processor for a grammar; `error` makes a failure the client's (a bad schema) or ours.
    fn compile(
        &self,
        grammar: TopLevelGrammar,
        error: impl Fn(String) -> GuideError,
    ) -> Result<GuidedProcessor, GuideError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| error(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(error(e));
        }
        Ok(GuidedProcessor::new(matcher, self.tokenizer.vocab_size()))
    }

    /// A processor for a JSON schema (errors name `response_format`).
    pub fn json_schema(&self, schema: Value) -> Result<GuidedProcessor, GuideError> {
        self.compile(TopLevelGrammar::from_json_schema(schema), |message| {
            GuideError::Schema { message }
        })
    }

    /// A processor for a response format (`None` for free text).
    pub fn response_format(
        &self,
        format: &ResponseFormat,
    ) -> Result<Option<GuidedProcessor>, GuideError> {
        response_schema(format)?
            .map(|schema| self.json_schema(schema))
            .transpose()
    }

    /// A processor for a response format as a model of `format` writes its answer: harmony's on its
    /// final channel, every other family's as the bare JSON (`None` for free text).
    pub fn response_format_for(
        &self,
        response: &ResponseFormat,
        format: ToolFormat,
    ) -> Result<Option<GuidedProcessor>, GuideError> {
        if format != ToolFormat::Harmony {
            return self.response_format(response);
        }
        let Some(schema) = response_schema(response)? else {
            return Ok(None);
        };
        // The schema alone first, so a bad one is the client's error.
        self.json_schema(schema.clone())?;
        let control = |text: &str| self.marker_token(format, text);
        let lark = harmony_answer_lark(&schema, &control);
        self.compile(TopLevelGrammar::from_lark(lark), |message| {
            GuideError::Schema { message }
        })
        .map(Some)
    }

    /// The token a grammar writes a marker of `format` as: its control token, or for harmony (whose
    /// `<|channel|>`, `<|message|>` and `<|constrain|>` are user-defined, as llama.cpp types them)
    /// its special token of either kind.
    fn marker_token(&self, format: ToolFormat, text: &str) -> Option<u32> {
        let id = self.tokenizer.token_id(text)?;
        match self.tokenizer.token_type(id) {
            Some(TokenType::Control) => Some(id),
            Some(TokenType::UserDefined) if format == ToolFormat::Harmony => Some(id),
            _ => None,
        }
    }

    /// A processor that forces a call to one of `tools` in `format`. Each tool's parameters schema
    /// is compiled alone first, so a bad one is reported by its tool's name.
    pub fn forced_call(
        &self,
        format: ToolFormat,
        tools: &[&FunctionTool],
        parallel: bool,
    ) -> Result<GuidedProcessor, GuideError> {
        for tool in tools {
            let schema =
                with_json_options(&tool.parameters).map_err(|message| GuideError::ToolSchema {
                    name: tool.name.clone(),
                    message,
                })?;
            self.compile(TopLevelGrammar::from_json_schema(schema), |message| {
                GuideError::ToolSchema {
                    name: tool.name.clone(),
                    message,
                }
            })?;
        }
        let control = |text: &str| self.marker_token(format, text);
        let lark = tool_call_lark(format, tools, parallel, &control)?;
        self.compile(TopLevelGrammar::from_lark(lark), |message| {
            GuideError::Internal { message }
        })
    }
}

/// One cached guide.
struct Entry {
    tokenizer: Weak<Tokenizer>,
    guide: Arc<ModelGuide>,
}

/// The node's [`ModelGuide`]s, built on first need. Cheap to clone.
#[derive(Clone, Default)]
pub struct Guides {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Guides {
    /// The guide of `tokenizer`'s model, built now if this is the first request that needs it.
    pub fn for_tokenizer(&self, tokenizer: &Arc<Tokenizer>) -> Result<Arc<ModelGuide>, GuideError> {
        let mut entries = self.entries.lock().map_err(|_| GuideError::Internal {
            message: "the guide cache's lock is poisoned".into(),
        })?;
        entries.retain(|e| e.tokenizer.strong_count() > 0);
        let target = Arc::downgrade(tokenizer);
        if let Some(e) = entries.iter().find(|e| e.tokenizer.ptr_eq(&target)) {
            return Ok(e.guide.clone());
        }
        // Built under the lock: two first requests of one model must not both pay for it.
        let guide = Arc::new(ModelGuide::new(tokenizer.clone())?);
        entries.push(Entry {
            tokenizer: target,
            guide: guide.clone(),
        });
        Ok(guide)
    }

    /// The plan for one chat request to `engine`'s model: messages and tools for its template, the
    /// constraint (a forced call, else the response format), and the tool-call parser when tools
    /// are offered. `id_seed` (the request's id) makes the call ids.
    pub fn plan(
        &self,
        engine: &EngineHandle,
        messages: Vec<ChatMessage>,
        guidance: &ChatGuidance,
        id_seed: u64,
    ) -> Result<ChatPlan, GuideError> {
        plan_with(
            engine.chat_template(),
            || self.for_tokenizer(engine.tokenizer()),
            messages,
            guidance,
            id_seed,
        )
    }
}

/// [`Guides::plan`] for a template, with the model's guide fetched only if a constraint is needed.
pub fn plan_with(
    template: Option<&ChatTemplate>,
    guide: impl FnOnce() -> Result<Arc<ModelGuide>, GuideError>,
    messages: Vec<ChatMessage>,
    guidance: &ChatGuidance,
    id_seed: u64,
) -> Result<ChatPlan, GuideError> {
    let tools = &guidance.tools;
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = tools.iter().find(|t| !seen.insert(t.name.as_str())) {
        return Err(GuideError::Tool {
            message: format!("function '{}' is defined twice", dup.name),
        });
    }
    let forced: Option<Vec<&FunctionTool>> = match &guidance.tool_choice {
        ToolChoice::None | ToolChoice::Auto => None,
        ToolChoice::Required if tools.is_empty() => {
            return Err(GuideError::NoTools {
                choice: "required".into(),
            });
        }
        ToolChoice::Required => Some(tools.iter().collect()),
        ToolChoice::Function(name) => match tools.iter().find(|t| &t.name == name) {
            Some(t) => Some(vec![t]),
            None => {
                return Err(GuideError::UnknownTool { name: name.clone() });
            }
        },
    };
    let caps: ToolCaps = template.map(ChatTemplate::tool_caps).unwrap_or_default();
    let format = ToolFormat::detect(template);
    let prepared = prepare_messages(messages, tools, &guidance.tool_choice, caps);
    // A named function is called once (small models repeat a forced call until their budget runs
    // out otherwise); `required` allows several calls where parallel calls are allowed.
    let parallel = guidance.parallel_tool_calls && guidance.tool_choice == ToolChoice::Required;
    let processor: Option<Box<dyn LogitsProcessor>> = match (&forced, &guidance.response_format) {
        (Some(forced), _) => Some(Box::new(guide()?.forced_call(format, forced, parallel)?)),
        (None, ResponseFormat::Text) => None,
        (None, response) => guide()?
            .response_format_for(response, format)?
            .map(|p| Box::new(p) as Box<dyn LogitsProcessor>),
    };
    let offered = !tools.is_empty() && guidance.tool_choice != ToolChoice::None;
    Ok(ChatPlan {
        messages: prepared.messages,
        tools: prepared.tools,
        processor,
        tool_parser: offered.then(|| {
            let only = match forced.as_deref() {
                Some([one]) => Some(one.name.clone()),
                _ => None,
            };
            ToolCallParser::new(format, id_seed).forcing(only)
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::stream::ToolEvent;

    /// A forced call cut before its name was written whole still names the forced function, whole
    /// and streamed; an unforced one says it does not know.
    #[test]
    fn a_forced_call_cut_before_its_name_names_the_forced_function() {
        let text = "<tool_call>\n{\"name\": \"GetWea";
        let free = ToolCallParser::new(ToolFormat::Hermes, 7);
        let forced = free.clone().forcing(Some("GetWeather".into()));
        assert_eq!(free.parse_ended(text, true).cut.expect("cut").name, None);
        let cut = forced.parse_ended(text, true).cut.expect("cut");
        assert_eq!(cut.name.as_deref(), Some("GetWeather"));
        assert_eq!(cut.arguments, "");
        let mut stream = forced.stream();
        stream.push(text);
        let events = stream.finish_cut();
        let Some(ToolEvent::Cut { name, .. }) = events.last() else {
            panic!("{events:?}");
        };
        assert_eq!(name.as_deref(), Some("GetWeather"));
        // A name the model wrote whole is its own.
        let text = "<tool_call>\n{\"name\": \"GetWeather\", \"arguments\": {\"ci";
        let cut = forced.parse_ended(text, true).cut.expect("cut");
        assert_eq!(cut.name.as_deref(), Some("GetWeather"));
        assert_eq!(cut.arguments, "{\"ci");
    }
}
