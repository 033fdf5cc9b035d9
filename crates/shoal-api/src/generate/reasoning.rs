//! Reasoning separated from the answer, once for every API: a model that thinks first (Qwen3, QwQ,
//! DeepSeek R1 and its distills, GLM-4.5+, and any family whose template writes `<think>`) writes its
//! thoughts between `<think>` and `</think>`, then the answer. [`Splitter`] reads the answer's text as it
//! streams and hands back each piece as reasoning or content, holding back only what could still be the
//! start of a tag; the same splitter reads a whole answer ([`split`]), so streamed and non-streamed
//! answers agree. Each API renders the two parts its own way (OpenAI chat's `reasoning_content`, the
//! Responses API's `reasoning` item, Anthropic's `thinking` block, Ollama's `thinking`); the tool-call
//! parser and the client's stop strings see only the content.
//!
//! Where the thoughts start:
//! - the prompt already opened them (DeepSeek R1's template ends the generation prompt with `<think>\n`;
//!   [`Syntax::Think`] with `inside: true`, see [`prompt_opens_thinking`]): everything up to `</think>` is
//!   reasoning;
//! - otherwise the answer may open them itself: an answer whose first non-blank text is `<think>` is
//!   reasoning until `</think>`; any other answer is all content (a prompt that closed an empty block —
//!   Qwen3 with `enable_thinking: false` — or a model that does not think).
//!
//! As llama.cpp's `deepseek` reasoning format: the blank text after `<think>` and before and after
//! `</think>` belongs to neither part; an answer cut inside its thoughts is all reasoning.
//!
//! gpt-oss writes OpenAI's harmony format instead (channels, not tags: [`super::harmony`]); which
//! [`Syntax`] a model's answers have is decided by its template ([`syntax`]), and [`Splitter`] reads
//! either.

/// The tag that opens a model's thoughts.
pub const OPEN: &str = "<think>";
/// The tag that closes them.
pub const CLOSE: &str = "</think>";

/// What one piece of the answer's text turned out to be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parts {
    pub reasoning: String,
    pub content: String,
}

impl Parts {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// How a model's answers hold its thoughts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syntax {
    /// `<think>` … `</think>`; `inside`: the prompt opened the block.
    Think { inside: bool },
    /// gpt-oss's harmony channels; `analysis`: the prompt left an analysis message open; `calls`: the
    /// request offered tools (call messages go to the tool-call parser, else they are dropped).
    Harmony { analysis: bool, calls: bool },
}

/// The syntax of the answer to `prompt` (rendered with `template`): harmony for a template that
/// writes channels, constrained or not (a forced call or an answer format is written on a channel
/// too); `<think>` blocks where the template writes them and the answer is not constrained (it has no
/// room for thoughts); else none. `calls`: the request offered tools.
pub fn syntax(
    template: Option<&shoal_model::chat::ChatTemplate>,
    prompt: &str,
    constrained: bool,
    calls: bool,
) -> Option<Syntax> {
    let template = template?;
    if template.writes_channels() {
        return Some(Syntax::Harmony {
            analysis: super::harmony::prompt_opens_analysis(prompt),
            calls,
        });
    }
    (!constrained && template.writes_thinking()).then(|| Syntax::Think {
        inside: prompt_opens_thinking(prompt),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but blank text yet: the answer may still open its thoughts.
    Start,
    /// Inside the thoughts; `held` is blank text, or what may begin `</think>`, not yet given out.
    Thinking,
    /// Just after `</think>`: blank text is dropped.
    Closed,
    /// The answer proper: everything is content.
    Content,
}

/// The streaming reader of one answer (one per choice), in its model's [`Syntax`].
#[derive(Debug, Clone)]
pub enum Splitter {
    Think(Think),
    Harmony(super::harmony::Reader),
}

impl Splitter {
    pub fn new(syntax: Syntax) -> Self {
        match syntax {
            Syntax::Think { inside } => Splitter::Think(Think::new(inside)),
            Syntax::Harmony { analysis, calls } => {
                Splitter::Harmony(super::harmony::Reader::new(analysis, calls))
            }
        }
    }

    /// The parts of the next piece of text.
    pub fn push(&mut self, text: &str) -> Parts {
        match self {
            Splitter::Think(t) => t.push(text),
            Splitter::Harmony(h) => h.push(text),
        }
    }

    /// What is still held when the answer ended.
    pub fn finish(&mut self) -> Parts {
        match self {
            Splitter::Think(t) => t.finish(),
            Splitter::Harmony(h) => h.finish(),
        }
    }

    /// Whether the text read so far leaves the answer inside its thoughts.
    pub fn in_thoughts(&self) -> bool {
        match self {
            Splitter::Think(t) => t.state == State::Thinking,
            Splitter::Harmony(h) => h.in_analysis(),
        }
    }

    /// Whether the answer proper (or a call) has begun.
    pub fn answering(&self) -> bool {
        match self {
            Splitter::Think(t) => matches!(t.state, State::Closed | State::Content),
            Splitter::Harmony(h) => h.answering(),
        }
    }
}

/// The streaming reader of a `<think>` answer.
#[derive(Debug, Clone)]
pub struct Think {
    state: State,
    /// Text read but not given out yet.
    held: String,
    /// Whether any reasoning was given out (the blank text before the first is dropped).
    started: bool,
}

impl Think {
    /// A reader of an answer whose prompt opened the thoughts (`inside`) or did not.
    pub fn new(inside: bool) -> Self {
        Self {
            state: if inside {
                State::Thinking
            } else {
                State::Start
            },
            held: String::new(),
            started: false,
        }
    }

    /// The parts of the next piece of text.
    pub fn push(&mut self, text: &str) -> Parts {
        let mut out = Parts::default();
        self.held.push_str(text);
        loop {
            match self.state {
                State::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(trimmed) {
                        // Blank, or a beginning of `<think>`: wait for more.
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        let rest = self.held[at + CLOSE.len()..].to_owned();
                        self.held.truncate(at);
                        self.give_reasoning(&mut out, true);
                        self.held = rest;
                        self.state = State::Closed;
                        continue;
                    }
                    self.give_reasoning(&mut out, false);
                    return out;
                }
                State::Closed => {
                    let trimmed = self.held.trim_start();
                    if trimmed.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = trimmed.to_owned();
                    self.state = State::Content;
                }
                State::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// What is still held when the answer ended.
    pub fn finish(&mut self) -> Parts {
        let mut out = Parts::default();
        match self.state {
            State::Start => out.content = std::mem::take(&mut self.held),
            State::Thinking => self.give_reasoning(&mut out, true),
            State::Closed => {}
            State::Content => out.content = std::mem::take(&mut self.held),
        }
        self.held.clear();
        out
    }

    /// Gives out the held reasoning but for what may still begin `</think>` or be blank text before it
    /// (everything when `all`, less the blank text at its end).
    fn give_reasoning(&mut self, out: &mut Parts, all: bool) {
        if !self.started {
            let trimmed = self.held.trim_start();
            if trimmed.len() != self.held.len() {
                self.held = trimmed.to_owned();
            }
        }
        // Held back: what may begin `</think>` (nothing when `all`), and the blank text before it.
        let tag = if all {
            0
        } else {
            partial_tag(&self.held, CLOSE)
        };
        let body = &self.held[..self.held.len() - tag];
        let keep = tag + (body.len() - body.trim_end().len());
        let give = self.held.len() - keep;
        if give > 0 {
            out.reasoning.push_str(&self.held[..give]);
            self.started = true;
            self.held.drain(..give);
        }
        if all {
            self.held.clear();
        }
    }
}

/// The length of the longest end of `text` that is a proper beginning of `tag`.
fn partial_tag(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            text.len() >= n
                && text.is_char_boundary(text.len() - n)
                && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// The parts of a whole answer.
pub fn split(text: &str, syntax: Syntax) -> Parts {
    let mut s = Splitter::new(syntax);
    let mut parts = s.push(text);
    let rest = s.finish();
    parts.reasoning.push_str(&rest.reasoning);
    parts.content.push_str(&rest.content);
    parts
}

/// The parts of a whole answer as an API reads it: split where the model may think (`reasoning`: the
/// request's [`super::Started::reasoning`]), else all content.
pub fn answer(text: String, reasoning: Option<Syntax>) -> Parts {
    match reasoning {
        Some(syntax) => split(&text, syntax),
        None => Parts {
            reasoning: String::new(),
            content: text,
        },
    }
}

/// The parts of the next streamed piece: through the answer's splitter where the model may think, else
/// all content.
pub fn piece(splitter: Option<&mut Splitter>, text: &str) -> Parts {
    match splitter {
        Some(splitter) => splitter.push(text),
        None => Parts {
            reasoning: String::new(),
            content: text.to_string(),
        },
    }
}

/// What the template is told of thinking: the request's ask, but off for a constrained answer (a schema,
/// a forced call), which is constrained from its first token and so has no room for thoughts.
pub fn thinking_for(asked: &shoal_engine::Thinking, constrained: bool) -> shoal_engine::Thinking {
    match constrained {
        true => shoal_engine::Thinking {
            enable: Some(false),
            ..asked.clone()
        },
        false => asked.clone(),
    }
}

/// Whether a rendered prompt leaves the thoughts open: its last `<think>` has no `</think>` after it
/// (DeepSeek R1's generation prompt; a Qwen3 prompt whose thinking is off closes an empty block).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    match prompt.rfind(OPEN) {
        Some(at) => !prompt[at..].contains(CLOSE),
        None => false,
    }
}

/// Test help shared by the splitters' tests.
#[cfg(test)]
pub(crate) mod check {
    use super::*;

    /// Every way of cutting `text` into two pieces, and into pieces of one character, reads as the whole.
    pub(crate) fn streamed_agrees(text: &str, syntax: Syntax) -> Parts {
        let whole = split(text, syntax);
        let mut cuts: Vec<Vec<&str>> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .map(|i| vec![&text[..i], &text[i..]])
            .collect();
        let mut chars = Vec::new();
        let mut start = 0;
        for (i, _) in text.char_indices().skip(1) {
            chars.push(&text[start..i]);
            start = i;
        }
        chars.push(&text[start..]);
        cuts.push(chars);
        for pieces in cuts {
            let mut s = Splitter::new(syntax);
            let mut got = Parts::default();
            for p in pieces.iter().chain(std::iter::once(&"")) {
                let part = s.push(p);
                got.reasoning.push_str(&part.reasoning);
                got.content.push_str(&part.content);
            }
            let rest = s.finish();
            got.reasoning.push_str(&rest.reasoning);
            got.content.push_str(&rest.content);
            assert_eq!(got, whole, "{pieces:?}");
        }
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::check::streamed_agrees;
    use super::*;

    /// A Qwen3 answer as the model writes it (thinking on: it opens the block itself).
    const QWEN3: &str =
        "<think>\nOkay, the user asks for 7*8. That is 56.\n</think>\n\n7 × 8 = **56**.";
    /// DeepSeek R1: the prompt opened the block, so the answer starts inside it.
    const R1: &str = "Alright, 7 times 8... 56.\n</think>\n\nThe answer is 56.";

    fn think(inside: bool) -> Syntax {
        Syntax::Think { inside }
    }

    fn parts(reasoning: &str, content: &str) -> Parts {
        Parts {
            reasoning: reasoning.into(),
            content: content.into(),
        }
    }

    #[test]
    fn qwen3_opens_its_thoughts_itself() {
        assert_eq!(
            split(QWEN3, think(false)),
            parts(
                "Okay, the user asks for 7*8. That is 56.",
                "7 × 8 = **56**."
            )
        );
        streamed_agrees(QWEN3, think(false));
    }

    #[test]
    fn r1_starts_inside_the_thoughts_its_prompt_opened() {
        assert_eq!(
            split(R1, think(true)),
            parts("Alright, 7 times 8... 56.", "The answer is 56.")
        );
        streamed_agrees(R1, think(true));
        assert!(prompt_opens_thinking("<｜Assistant｜><think>\n"));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
    }

    #[test]
    fn answers_without_thoughts_are_content() {
        for text in [
            "Hello!",
            "  <thinking> is not the tag",
            "56 <think>late</think>",
            "<",
        ] {
            assert_eq!(split(text, think(false)), parts("", text), "{text}");
            streamed_agrees(text, think(false));
        }
    }

    #[test]
    fn an_answer_cut_inside_its_thoughts_is_reasoning() {
        let text = "<think>\nLet me count: 1, 2, 3 </th";
        assert_eq!(
            split(text, think(false)),
            parts("Let me count: 1, 2, 3 </th", "")
        );
        streamed_agrees(text, think(false));
        // A tag cut short stays held until the end, then is reasoning.
        let mut s = Think::new(true);
        assert_eq!(s.push("a </thi"), parts("a", ""));
        assert_eq!(s.finish(), parts(" </thi", ""));
    }

    #[test]
    fn empty_thoughts_and_tool_calls_after_them() {
        let text = "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            split(text, think(false)),
            parts(
                "",
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>"
            )
        );
        streamed_agrees(text, think(false));
    }
}
