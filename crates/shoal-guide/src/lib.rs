//! shoal-guide: constrain what a model generates (JSON objects, JSON schemas, forced tool calls)
//! and read tool calls back out of what it wrote, for every API that speaks tools.
//!
//! Main types:
//! - [`Guides`] — the node's per-model constrained-decoding state (llguidance's `ParserFactory` over
//!   the model's token trie, [`tokens::tok_env`]), built once per model on first need; and
//!   [`Guides::plan`], the one call an API handler makes: [`ChatGuidance`] (tools, `tool_choice`,
//!   parallel calls, [`ResponseFormat`]) in, [`ChatPlan`] out.
//! - [`ChatPlan`] — the messages and `tools` to render with the model's chat template
//!   (`Engines::render_chat_tools`), the [`GuidedProcessor`] to put on the `GenerateRequest`, and a
//!   [`ToolCallParser`] for the answer.
//! - [`GuidedProcessor`] — the engine's `LogitsProcessor` over an llguidance `Matcher`: the engine's
//!   `TokenMask` of tokens allowed next ([`GuidedProcessor::mask`]), advanced by each token taken.
//! - [`tools`] — [`FunctionTool`], [`ToolChoice`], each family's [`ToolFormat`] (detected from the
//!   chat template), the generic-format system prompt and history for templates without tools, and
//!   the parsers ([`tools::parse`], [`tools::stream`]).
//!
//! Data flow: handler → [`Guides::plan`] (validates `tool_choice`, prepares messages, compiles the
//! grammar: a bad schema is a [`GuideError`] naming the request field) → render + submit with the
//! processor → the engine calls `allowed` (mask) and `accept` (advance) per token → the handler runs
//! the text through the [`ToolCallParser`] (whole, or streaming with [`tools::stream::ToolEvent`]s).

mod error;
mod grammar;
mod guide;
mod processor;
pub mod tokens;
pub mod tools;

pub use error::GuideError;
pub use grammar::ResponseFormat;
pub use guide::{
    ChatGuidance, ChatPlan, CutToolCall, Guides, ModelGuide, ParsedAnswer, ToolCallOut,
    ToolCallParser, plan_with,
};
pub use processor::GuidedProcessor;
/// A call an assistant message carries (shoal-model's, re-exported for API modules).
pub use shoal_model::chat::ToolCall;
pub use tools::stream::{ToolCallStream, ToolEvent};
pub use tools::{FunctionTool, ToolChoice, ToolFormat};
