//! The front half of every chat-like request (OpenAI chat, Responses, Anthropic Messages, Ollama
//! chat): each API turns its body into one validated [`Chat`] — the model, the conversation, the tools
//! and answer format as shoal-guide's [`ChatGuidance`], the sampling parameters and budget — and
//! [`start`] does the rest the same way for all of them:
//!
//! 1. the engine handle of the model;
//! 2. the request's id, allocated up front (a [`Ticket`]: 96 random bits — the suffix of every id the
//!    client sees and the seed of the tool-call ids, so two requests never share a call id);
//! 3. the guide plan ([`plan`]: the messages and tools the template sees, the constraint, the tool-call
//!    parser), always built on the blocking pool — a model's first constrained request builds its
//!    token tables, which must not stall an async worker — and rendered with the model's template;
//! 4. one submit of the request's `n` choices ([`submit`]), each held as a [`LiveRequest`] under the
//!    ticket.
//!
//! What comes back ([`Started`]) is what every output format needs: the choices to read, the ticket
//! for the response id, and the parser that splits the answer into text and calls.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use shoal_engine::{
    ChatMessage, EngineHandle, GenerateRequest, LogitsProcessor, Prompt, SamplingParams, Thinking,
};
use shoal_guide::{ChatGuidance, GuideError, ToolCallParser};

use crate::ApiState;
use crate::cancel::{LiveRequest, Owner, Ticket};
use crate::error::ApiError;

/// One chat-like request, validated by its API.
pub struct Chat {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Tools, `tool_choice`, parallel calls and the answer's format.
    pub guidance: ChatGuidance,
    /// Text the answer starts with, appended to the rendered prompt (Anthropic's assistant prefill).
    pub prefill: Option<String>,
    /// What the request asks of the model's thinking (`enable_thinking`, `reasoning_effort`).
    pub thinking: Thinking,
    pub sampling: SamplingParams,
    pub max_tokens: Option<NonZeroU32>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub timeout: Option<Duration>,
    /// Choices from one prefill (1 but for OpenAI chat's `n`).
    pub n: usize,
    /// Speculative decoding (`None`: the server's default).
    pub speculative: Option<shoal_engine::Speculation>,
    /// The request field a problem with the prompt is reported against.
    pub prompt_param: &'static str,
    /// A shoal-guide error in the API's own words (its field names).
    pub guide_error: fn(GuideError) -> ApiError,
}

/// A submitted chat request.
pub struct Started {
    /// Its choices, in `index` order.
    pub choices: Vec<LiveRequest>,
    /// Its id (`ticket.token()` ends every id the client sees for it).
    pub ticket: Arc<Ticket>,
    /// Present when the answer may hold tool calls.
    pub parser: Option<ToolCallParser>,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
    /// Present when the answer may hold the model's thoughts: read it with
    /// [`super::reasoning::Splitter::new`] (its syntax: `<think>` blocks or harmony channels).
    pub reasoning: Option<super::reasoning::Syntax>,
}

/// Plans, renders and submits `chat` for `caller` (see the module doc).
pub async fn start(state: &ApiState, caller: Owner, chat: Chat) -> Result<Started, ApiError> {
    let engine = state
        .engine
        .get(&chat.model)
        .map_err(|e| ApiError::from_engine(e, chat.prompt_param))?;
    let ticket = Ticket::new(caller)?;
    let planned = plan(state, &engine, ticket.seed(), &chat).await?;
    let request = GenerateRequest {
        model: chat.model,
        prompt: Prompt::Text(planned.prompt),
        sampling: chat.sampling,
        max_tokens: chat.max_tokens,
        stop: chat.stop,
        // The render cut the template's own BOS where the tokenizer adds one.
        add_bos: true,
        ignore_eos: chat.ignore_eos,
        timeout: chat.timeout,
        logits_processor: planned.processor,
        speculative: chat.speculative,
    };
    let choices = submit(state, request, chat.n, chat.prompt_param, &ticket)?;
    let prompt_tokens = choices.first().map_or(0, |c| c.prompt_tokens());
    Ok(Started {
        choices,
        ticket,
        parser: planned.parser,
        prompt_tokens,
        reasoning: planned.reasoning,
    })
}

/// A chat request planned by shoal-guide and rendered.
pub struct Planned {
    /// The rendered conversation (prefill appended), ready to submit with `add_bos`.
    pub prompt: String,
    /// The constraint of a forced call or an answer format.
    pub processor: Option<Box<dyn LogitsProcessor>>,
    /// Present when the answer may hold tool calls.
    pub parser: Option<ToolCallParser>,
    /// Present when the answer may hold the model's thoughts (see [`Started::reasoning`]).
    pub reasoning: Option<super::reasoning::Syntax>,
}

/// Plans `chat`'s conversation and tools ([`shoal_guide::Guides::plan`], on the blocking pool) with
/// tool-call ids from `seed`, and renders it with `engine`'s chat template.
pub async fn plan(
    state: &ApiState,
    engine: &EngineHandle,
    seed: u64,
    chat: &Chat,
) -> Result<Planned, ApiError> {
    let (guides, plan_engine) = (state.guides.clone(), engine.clone());
    let (messages, guidance) = (chat.messages.clone(), chat.guidance.clone());
    // The first constrained request of a model builds its token tables: off the async workers.
    let plan =
        tokio::task::spawn_blocking(move || guides.plan(&plan_engine, messages, &guidance, seed))
            .await
            .map_err(|e| ApiError::Internal(format!("planning the request failed: {e}")))?
            .map_err(chat.guide_error)?;
    // A constrained answer (a schema, a forced call) is constrained from its first token: no thoughts.
    let constrained = plan.processor.is_some();
    let thinking = super::reasoning::thinking_for(&chat.thinking, constrained);
    let mut prompt = engine
        .render_chat_thinking(&plan.messages, &plan.tools, &thinking)
        .map_err(|e| ApiError::from_engine(e, chat.prompt_param))?;
    if let Some(prefill) = &chat.prefill {
        prompt.push_str(prefill);
    }
    let calls = plan.tool_parser.is_some();
    let reasoning = super::reasoning::syntax(engine.chat_template(), &prompt, constrained, calls);
    // A budget for the thoughts is the processor of an answer that may think (never a constrained one).
    let processor = match (plan.processor, reasoning, thinking.budget) {
        (None, Some(syntax), Some(budget)) => Some(Box::new(super::budget::ThinkingBudget::new(
            engine.tokenizer().clone(),
            syntax,
            budget,
        )) as Box<dyn LogitsProcessor>),
        (processor, ..) => processor,
    };
    Ok(Planned {
        prompt,
        processor,
        parser: plan.tool_parser,
        reasoning,
    })
}

/// Submits the `n` choices of `request` (`n` ≤ [`shoal_engine::request::MAX_CHOICES`]) and holds them
/// under `ticket`, in `index` order; a problem with the prompt is reported against `prompt_param`.
pub fn submit(
    state: &ApiState,
    request: GenerateRequest,
    n: usize,
    prompt_param: &str,
    ticket: &Arc<Ticket>,
) -> Result<Vec<LiveRequest>, ApiError> {
    let streams = state
        .engine
        .submit_n(request, n)
        .map_err(|e| ApiError::from_engine(e, prompt_param))?;
    Ok(streams
        .into_iter()
        .map(|s| state.track_ticket(s, ticket))
        .collect())
}
